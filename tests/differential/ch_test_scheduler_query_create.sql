-- tests/integration/test_scheduler_query/test.py::test_create
CREATE RESOURCE query (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 20;
CREATE WORKLOAD admin IN all SETTINGS priority = 0;
CREATE WORKLOAD main IN all SETTINGS priority = 1, max_concurrent_queries = 10;
CREATE WORKLOAD production IN main SETTINGS weight = 9;
CREATE WORKLOAD development IN main SETTINGS weight = 1, max_concurrent_queries = 5;

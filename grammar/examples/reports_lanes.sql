-- The reports DBA's fast and slow lanes on query slots.
CREATE RESOURCE query (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8;
CREATE WORKLOAD fast IN all SETTINGS priority = 0, max_waiting_queries = 100;
CREATE WORKLOAD slow IN all SETTINGS priority = 1, max_concurrent_queries = 2;
CREATE WORKLOAD adhoc IN all SETTINGS priority = 1, weight = 2, max_concurrent_queries = 1;

-- tests/integration/test_scheduler_memory/test.py: allocation_limit under /all, queues under leaves
CREATE RESOURCE memory (MEMORY RESERVATION);
CREATE WORKLOAD all SETTINGS max_memory = '1G';
CREATE WORKLOAD high IN all SETTINGS precedence = -1;
CREATE WORKLOAD normal IN all SETTINGS precedence = 0, weight = 3;
CREATE WORKLOAD normal2 IN all SETTINGS precedence = 0, max_memory = '128Mi';
CREATE WORKLOAD low IN all SETTINGS precedence = 1, max_waiting_queries = 2;

-- One tree, every kind of resource: each gets its own copy of the workload tree.
CREATE RESOURCE io (READ DISK s3, WRITE DISK s3);
CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
CREATE RESOURCE q (QUERY);
CREATE RESOURCE mem (MEMORY RESERVATION);
CREATE WORKLOAD all SETTINGS max_io_requests = 10, max_concurrent_threads = 8, max_concurrent_queries = 4, max_memory = '1Gi';
CREATE WORKLOAD prod IN all SETTINGS priority = -1, precedence = -1, weight = 3;
CREATE WORKLOAD dev IN all SETTINGS priority = 1, precedence = 1;
CREATE WORKLOAD batch IN all SETTINGS priority = 1, precedence = 1, weight = 2;

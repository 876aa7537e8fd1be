-- MEMORY: allocation_limit from max_memory / max_memory_ratio, allocation_queue at leaves.
CREATE RESOURCE mem (MEMORY RESERVATION);
CREATE WORKLOAD all SETTINGS max_memory_ratio = 0.5;
CREATE WORKLOAD a IN all SETTINGS max_memory = '1Gi';
CREATE WORKLOAD b IN all SETTINGS max_memory = 0;
CREATE WORKLOAD c IN all SETTINGS max_memory = 1, max_memory_ratio = 0.9;
CREATE WORKLOAD d IN all SETTINGS max_waiting_queries = 3, weight = 4;
CREATE WORKLOAD e IN all SETTINGS max_io_requests = 1, max_concurrent_queries = 1, max_speed = 5;

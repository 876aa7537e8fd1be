-- QUERY: semaphore from max_concurrent_queries, throttler from max_queries_per_second with burst.
CREATE RESOURCE query (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8;
CREATE WORKLOAD a IN all SETTINGS max_queries_per_second = 5;
CREATE WORKLOAD b IN all SETTINGS max_queries_per_second = 5, max_burst_queries = 1;
CREATE WORKLOAD c IN all SETTINGS max_burst_queries = 7;
CREATE WORKLOAD d IN all SETTINGS max_concurrent_queries = 1, max_waiting_queries = 1;
CREATE WORKLOAD e IN all SETTINGS max_concurrent_queries = 2, max_queries_per_second = 0.5;
CREATE WORKLOAD f IN all SETTINGS max_waiting_queries = 0;

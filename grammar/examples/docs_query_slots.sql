-- ClickHouse docs: query slot scheduling with concurrency, rate and waiting limits.
CREATE RESOURCE query (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 100, max_queries_per_second = 10, max_burst_queries = 20;
CREATE WORKLOAD production IN all SETTINGS weight = 3, max_waiting_queries = 50;
CREATE WORKLOAD development IN all SETTINGS max_concurrent_queries = 5, max_queries_per_second = 2;

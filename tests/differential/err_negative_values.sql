-- Negative values are rejected for every limit, integer or float, literal or string.
CREATE WORKLOAD all;
CREATE WORKLOAD a IN all SETTINGS weight = -1;
CREATE WORKLOAD a IN all SETTINGS max_speed = -1;
CREATE WORKLOAD a IN all SETTINGS max_bytes_inflight = -1;
CREATE WORKLOAD a IN all SETTINGS max_io_requests = -1;
CREATE WORKLOAD a IN all SETTINGS max_concurrent_threads = -5;
CREATE WORKLOAD a IN all SETTINGS max_concurrent_queries = -1;
CREATE WORKLOAD a IN all SETTINGS max_waiting_queries = -1;
CREATE WORKLOAD a IN all SETTINGS max_memory = -1;
CREATE WORKLOAD a IN all SETTINGS max_memory = '-5';
CREATE WORKLOAD a IN all SETTINGS max_memory_ratio = -0.5;
CREATE WORKLOAD a IN all SETTINGS max_burst = -1.5;
CREATE WORKLOAD a IN all SETTINGS max_requests = -2;
CREATE WORKLOAD a IN all SETTINGS max_cost = -3;
CREATE WORKLOAD a IN all SETTINGS priority = -100, precedence = -100;

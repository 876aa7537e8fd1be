-- IO: semaphore from max_io_requests / max_bytes_inflight, throttler from max_bytes_per_second.
CREATE RESOURCE io (READ DISK s3, WRITE DISK s3);
CREATE WORKLOAD all SETTINGS max_io_requests = 100;
CREATE WORKLOAD a IN all SETTINGS max_bytes_inflight = 1000000;
CREATE WORKLOAD b IN all SETTINGS max_bytes_per_second = 1000;
CREATE WORKLOAD c IN all SETTINGS max_bytes_per_second = 1000, max_burst_bytes = 5000, max_io_requests = 2;
CREATE WORKLOAD d IN all SETTINGS max_burst_bytes = 5000;
CREATE WORKLOAD e IN all SETTINGS max_requests = 3, max_cost = 4, max_speed = 5, max_burst = 6;
CREATE WORKLOAD f IN all SETTINGS max_io_requests = 0, max_bytes_per_second = 0;
CREATE WORKLOAD g IN all SETTINGS max_concurrent_queries = 3, max_memory = 100, max_concurrent_threads = 2;

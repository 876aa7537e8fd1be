-- The 24.10 names (max_requests, max_cost, max_speed, max_burst) are aliases; a later change wins.
CREATE RESOURCE io (WRITE ANY DISK);
CREATE WORKLOAD all SETTINGS max_requests = 10, max_io_requests = 20;
CREATE WORKLOAD a IN all SETTINGS max_cost = 100, max_bytes_inflight = 200;
CREATE WORKLOAD b IN all SETTINGS max_bytes_per_second = 300, max_speed = 400;
CREATE WORKLOAD c IN all SETTINGS max_speed = 500, max_burst_bytes = 600, max_burst = 700;
CREATE WORKLOAD d IN all SETTINGS max_io_requests = 5, max_requests = 0;

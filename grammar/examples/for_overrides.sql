-- FOR binds one setting to one resource; a FOR value beats the unqualified one whatever the order.
CREATE RESOURCE r1 (READ DISK d);
CREATE RESOURCE r2 (WRITE DISK d);
CREATE RESOURCE q (QUERY);
CREATE WORKLOAD all SETTINGS max_bytes_inflight = 1000000, max_bytes_inflight = 2000000 FOR r2;
CREATE WORKLOAD a IN all SETTINGS max_io_requests = 5 FOR r1, max_io_requests = 7;
CREATE WORKLOAD b IN all SETTINGS weight = 3 FOR r1, weight = 5 FOR q, weight = 2;
CREATE WORKLOAD c IN all SETTINGS max_speed = 100 FOR r1, max_burst = 500;
CREATE WORKLOAD d IN all SETTINGS max_speed = 100, max_burst = 50 FOR r2;
CREATE WORKLOAD e IN all SETTINGS max_concurrent_queries = 0 FOR q, max_concurrent_queries = 3;
CREATE WORKLOAD f IN all SETTINGS max_io_requests = 4 FOR r1, max_io_requests = 6 FOR r1;
CREATE WORKLOAD g IN all SETTINGS priority = 1 FOR r1, priority = 2 FOR r2, priority = 3 FOR q;

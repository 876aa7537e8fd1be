-- A deep chain and a wide level; constraints at every depth.
CREATE RESOURCE q (QUERY);
CREATE RESOURCE io (READ DISK d);
CREATE WORKLOAD l0 SETTINGS max_concurrent_queries = 100;
CREATE WORKLOAD l1 IN l0 SETTINGS max_concurrent_queries = 50, max_io_requests = 9;
CREATE WORKLOAD l2 IN l1 SETTINGS max_queries_per_second = 20;
CREATE WORKLOAD l3 IN l2 SETTINGS weight = 2;
CREATE WORKLOAD l4 IN l3 SETTINGS max_concurrent_queries = 1;
CREATE WORKLOAD l5 IN l4;
CREATE WORKLOAD w1 IN l2 SETTINGS priority = 1;
CREATE WORKLOAD w2 IN l2 SETTINGS priority = 1;
CREATE WORKLOAD w3 IN l2 SETTINGS priority = 2;
CREATE WORKLOAD w4 IN l5;
CREATE WORKLOAD w5 IN l5;

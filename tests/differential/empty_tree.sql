-- Resources without workloads have no scheduler nodes; workloads without resources have none either.
CREATE RESOURCE io (READ DISK d);
CREATE RESOURCE q (QUERY);
DROP RESOURCE io;
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 2;
DROP WORKLOAD all;

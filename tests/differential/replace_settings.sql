-- CREATE OR REPLACE adds, changes and removes constraints; a replaced resource keeps its workloads.
CREATE RESOURCE io (READ DISK d);
CREATE RESOURCE q (QUERY);
CREATE WORKLOAD all SETTINGS max_io_requests = 10 FOR io;
CREATE WORKLOAD a IN all SETTINGS max_concurrent_queries = 1;
CREATE OR REPLACE WORKLOAD a IN all SETTINGS max_queries_per_second = 3;
CREATE OR REPLACE WORKLOAD all SETTINGS max_io_requests = 20 FOR io, max_concurrent_queries = 4;
CREATE OR REPLACE WORKLOAD a IN all;
CREATE OR REPLACE RESOURCE io (WRITE DISK e, READ DISK f);
CREATE OR REPLACE WORKLOAD all;
DROP RESOURCE io;

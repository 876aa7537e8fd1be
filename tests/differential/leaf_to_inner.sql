-- A leaf that gains children loses its queue; removing the last child gives it back.
CREATE RESOURCE q (QUERY);
CREATE RESOURCE m (MEMORY RESERVATION);
CREATE WORKLOAD all;
CREATE WORKLOAD leaf IN all SETTINGS max_concurrent_queries = 2, max_memory = 10, max_waiting_queries = 4;
CREATE WORKLOAD kid IN leaf;
CREATE WORKLOAD kid2 IN leaf SETTINGS weight = 2;
DROP WORKLOAD kid;
CREATE WORKLOAD other IN all;
DROP WORKLOAD kid2;

-- Prod and prod are two workloads; ordering of names is byte-wise.
CREATE WORKLOAD root;
CREATE WORKLOAD Prod IN root;
CREATE WORKLOAD prod IN root;
CREATE WORKLOAD PROD IN root;
CREATE WORKLOAD _prod IN root;
CREATE WORKLOAD `9prod` IN root;
CREATE RESOURCE Q (QUERY);
CREATE RESOURCE m (MEMORY RESERVATION);

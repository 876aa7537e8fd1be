-- "Concurrency 1, reserved 0": one report at a time, in arrival order (plain FIFO: a fast
-- report waits behind whatever slow one arrived first). The baseline the lanes improve on.
CREATE RESOURCE report_slots (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
CREATE WORKLOAD reports IN all;

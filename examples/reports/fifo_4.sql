-- Four reports at once in arrival order: the FIFO baseline for lanes_4_reserved_1.sql.
CREATE RESOURCE report_slots (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 4;
CREATE WORKLOAD reports IN all;

-- The platform team: production, development and admin with CPU shares, caps, memory and IO.
CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
CREATE RESOURCE memory (MEMORY RESERVATION);
CREATE RESOURCE disk_read (READ DISK local);
CREATE RESOURCE disk_write (WRITE DISK local);
CREATE WORKLOAD all SETTINGS max_concurrent_threads = 32, max_memory = '16Gi', max_bytes_per_second = '200Mi' FOR disk_read, max_bytes_per_second = '100Mi' FOR disk_write;
CREATE WORKLOAD admin IN all SETTINGS priority = -1, precedence = -1;
CREATE WORKLOAD production IN all SETTINGS weight = 3, precedence = 0, max_memory = '12Gi';
CREATE WORKLOAD development IN all SETTINGS weight = 1, precedence = 1, max_cpu_share = 0.25, max_memory = '4Gi', max_waiting_queries = 20;
CREATE WORKLOAD prod_reports IN production SETTINGS max_concurrent_threads = 16;
CREATE WORKLOAD prod_etl IN production SETTINGS weight = 2, max_bytes_inflight = '64Mi' FOR disk_write;

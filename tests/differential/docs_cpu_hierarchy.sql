-- ClickHouse docs, workload-scheduling.md: CPU scheduling with threads, caps and shares.
CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
CREATE WORKLOAD all SETTINGS max_concurrent_threads = 100;
CREATE WORKLOAD admin IN all SETTINGS priority = -1;
CREATE WORKLOAD production IN all SETTINGS weight = 4;
CREATE WORKLOAD analytics IN production SETTINGS max_concurrent_threads_ratio_to_cores = 2, weight = 9;
CREATE WORKLOAD ingestion IN production SETTINGS max_cpus = 2.5, max_burst_cpu_seconds = 0.5;
CREATE WORKLOAD development IN all SETTINGS max_cpu_share = 0.5;

-- CPU: threads semaphore (exact and ratio to cores), CPU throttler (max_cpus, max_cpu_share, burst).
CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
CREATE WORKLOAD all SETTINGS max_concurrent_threads_ratio_to_cores = 2;
CREATE WORKLOAD a IN all SETTINGS max_concurrent_threads = 3;
CREATE WORKLOAD b IN all SETTINGS max_concurrent_threads = 3, max_concurrent_threads_ratio_to_cores = 1;
CREATE WORKLOAD c IN all SETTINGS max_concurrent_threads = 1, max_concurrent_threads_ratio_to_cores = 4;
CREATE WORKLOAD d IN all SETTINGS max_cpus = 1.5;
CREATE WORKLOAD e IN all SETTINGS max_cpu_share = 0.25;
CREATE WORKLOAD f IN all SETTINGS max_cpus = 1, max_cpu_share = 1;
CREATE WORKLOAD g IN all SETTINGS max_cpus = 4, max_cpu_share = 0.5, max_burst_cpu_seconds = 2;
CREATE WORKLOAD h IN all SETTINGS max_burst_cpu_seconds = 3;
CREATE WORKLOAD i IN all SETTINGS max_concurrent_threads = 0;
CREATE WORKLOAD j IN all SETTINGS max_concurrent_threads_ratio_to_cores = 0.1;

-- ClickHouse tests/queries/0_stateless/04082_workload_negative_float64_settings.sql
CREATE RESOURCE io04082 (READ DISK d, WRITE DISK d);
CREATE WORKLOAD 04082_all;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_bytes_per_second = -100.5;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_burst_bytes = -50.5;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_cpus = -2.5;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_cpu_share = -0.5;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_burst_cpu_seconds = -1.5;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_queries_per_second = -3.14;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_burst_queries = -7.7;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_concurrent_threads_ratio_to_cores = -0.1;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_bytes_per_second = -1;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_io_requests = -1;
CREATE WORKLOAD 04082_a IN 04082_all SETTINGS max_bytes_per_second = 100.5;

-- Literals as ClickHouse types and prints them in create_query.
CREATE RESOURCE io (READ DISK d);
CREATE WORKLOAD all SETTINGS max_bytes_per_second = 1e19, max_burst_bytes = 1e20;
CREATE WORKLOAD a IN all SETTINGS weight = 0.000001, max_speed = 1e21;
CREATE WORKLOAD b IN all SETTINGS weight = 1e-7, max_speed = 1e22;
CREATE WORKLOAD c IN all SETTINGS weight = 123456789012345678901234.0;
CREATE WORKLOAD d IN all SETTINGS weight = 100000000000000000000, max_io_requests = 0, max_bytes_inflight = 18446744073709551615;
CREATE WORKLOAD e IN all SETTINGS max_io_requests = 0x10, max_speed = +5, max_burst = 1_000;
CREATE WORKLOAD f IN all SETTINGS weight = 2.0, max_speed = 2.5e3, max_burst = .5;
CREATE WORKLOAD g IN all SETTINGS weight = 1.5, weight = 2.5, weight = 3;
CREATE WORKLOAD h IN all SETTINGS max_speed = -0.0;
CREATE WORKLOAD i IN all SETTINGS max_io_requests = 9223372036854775807;
CREATE WORKLOAD j IN all SETTINGS max_io_requests = 9223372036854775806, max_bytes_inflight = 1;
CREATE WORKLOAD k IN all SETTINGS weight = 0.1, max_speed = 0.3;
CREATE WORKLOAD l IN all SETTINGS weight = 1e-6, max_speed = 1e16;

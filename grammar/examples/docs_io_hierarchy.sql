-- ClickHouse docs, workload-scheduling.md: IO resources, an `all` root with admin/production/development.
CREATE RESOURCE network_write (WRITE DISK s3);
CREATE RESOURCE network_read (READ DISK s3);
CREATE WORKLOAD all SETTINGS max_io_requests = 100, max_bytes_per_second = 1000000 FOR network_read, max_bytes_per_second = 2000000 FOR network_write;
CREATE WORKLOAD development IN all;
CREATE WORKLOAD production IN all SETTINGS weight = 3;
CREATE WORKLOAD admin IN all SETTINGS priority = -1;

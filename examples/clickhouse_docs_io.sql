-- ClickHouse's documentation example: IO resources and an admin/production/development tree.
-- Disk bandwidth takes effect with [disks] (not yet); the trees and system tables are complete.
-- Run: sluice local examples/clickhouse_docs_io.sql
CREATE RESOURCE network_write (WRITE DISK s3);
CREATE RESOURCE network_read (READ DISK s3);
CREATE WORKLOAD all SETTINGS max_io_requests = 100, max_bytes_per_second = 1000000 FOR network_read, max_bytes_per_second = 2000000 FOR network_write;
CREATE WORKLOAD development IN all;
CREATE WORKLOAD production IN all SETTINGS weight = 3;
CREATE WORKLOAD admin IN all SETTINGS priority = -1;
SELECT * FROM system.resources ORDER BY name;
SELECT resource, path, type, weight, priority, max_requests, max_speed, max_burst FROM system.scheduler ORDER BY resource, path;

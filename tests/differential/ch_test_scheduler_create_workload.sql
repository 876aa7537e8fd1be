-- tests/integration/test_scheduler/test.py::test_create_workload
CREATE RESOURCE IF NOT EXISTS network_read (READ DISK s3_no_resource);
CREATE RESOURCE IF NOT EXISTS network_write (WRITE DISK s3_no_resource);
CREATE WORKLOAD IF NOT EXISTS all SETTINGS max_bytes_inflight = 1000000 FOR network_read, max_bytes_inflight = 2000000 FOR network_write;
CREATE WORKLOAD IF NOT EXISTS admin IN all SETTINGS priority = 0;
CREATE WORKLOAD IF NOT EXISTS production IN all SETTINGS priority = 1, weight = 9;
CREATE WORKLOAD IF NOT EXISTS development IN all SETTINGS priority = 1, weight = 1;

-- tests/integration/test_scheduler/test.py::test_throw_on_unknown_workload (DDL part)
CREATE RESOURCE io (WRITE ANY DISK, READ ANY DISK);
CREATE WORKLOAD all SETTINGS max_bytes_inflight = 1000000;

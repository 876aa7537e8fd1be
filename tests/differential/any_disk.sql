-- ANY DISK shows as 'ANY'; operation order and duplicates are kept.
CREATE RESOURCE io (WRITE ANY DISK, READ ANY DISK);
CREATE RESOURCE io2 (READ DISK a, READ DISK b, WRITE DISK a, READ DISK a);
CREATE RESOURCE io3 (READ ANY DISK, READ DISK x);
CREATE RESOURCE io4 (WRITE DISK `with space`);
CREATE WORKLOAD all SETTINGS max_io_requests = 1 FOR io, max_io_requests = 2 FOR io2;

-- The cleanup half of 03232_workloads_and_resources: children first, then the root, then resources.
create resource 03232_write (write disk 03232_fake_disk);
create resource 03232_read (read disk 03232_fake_disk);
create workload all settings max_io_requests = 100 for 03232_write, max_io_requests = 200 for 03232_read;
create workload admin in all settings priority = 0;
create workload production in all settings priority = 1, weight = 9;
create workload development in all settings priority = 1, weight = 1;
drop resource 03232_write;
drop workload if exists production;
drop workload if exists development;
drop workload if exists admin;
drop workload if exists all;
drop resource if exists 03232_write;
drop resource if exists 03232_read;

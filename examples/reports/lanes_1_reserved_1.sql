-- "Concurrency 1, reserved 1": one report at a time, fast reports first. A report still
-- running after 20 s is demoted to slow_reports (not restarted) and remembered as slow, so
-- its next run waits in slow_reports until no fast report is waiting; once a slow report
-- runs, it blocks the worker until it is done.
CREATE RESOURCE report_slots (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
CREATE WORKLOAD slow_reports IN all SETTINGS priority = 1;
CREATE WORKLOAD reports IN all SETTINGS priority = 0, demote_after = '20s', demote_to = 'slow_reports';

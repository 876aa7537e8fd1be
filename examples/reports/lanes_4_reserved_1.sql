-- "Concurrency 4, 1 reserved for fast": four reports at once, at most three of them slow, so
-- one worker is always free for fast reports. A report still running after 20 s moves, with
-- its slot, to slow_reports; it may take slow_reports over its 3 for a while, and no new slow
-- report starts until it is back under. Learned slow reports start in slow_reports.
CREATE RESOURCE report_slots (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 4;
CREATE WORKLOAD slow_reports IN all SETTINGS priority = 1, max_concurrent_queries = 3;
CREATE WORKLOAD reports IN all SETTINGS priority = 0, demote_after = '20s', demote_to = 'slow_reports';

-- The reports DBA: fast reports keep flowing while slow ones queue in their own lane.
-- Run: sluice local examples/reports_lanes.sql
CREATE RESOURCE query (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8;
CREATE WORKLOAD fast IN all SETTINGS priority = 0, max_waiting_queries = 100;
CREATE WORKLOAD slow IN all SETTINGS priority = 1, max_concurrent_queries = 2;

CREATE TABLE loans AS SELECT generate_series AS id, generate_series % 7 AS branch FROM generate_series(1, 1000);
SELECT branch, count(*) AS loans FROM loans GROUP BY branch ORDER BY branch SETTINGS workload = 'fast';
SELECT count(*) AS overdue FROM loans WHERE id % 13 = 0 SETTINGS workload = 'slow';

SELECT path, type, max_requests, dequeued_requests, inflight_requests
FROM system.scheduler ORDER BY path;

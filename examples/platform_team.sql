-- The platform team: production, development and admin sharing one server.
-- Run: sluice local examples/platform_team.sql
CREATE RESOURCE query (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 32, max_queries_per_second = 200, max_burst_queries = 50;
CREATE WORKLOAD admin IN all SETTINGS priority = -1;
CREATE WORKLOAD production IN all SETTINGS weight = 3;
CREATE WORKLOAD development IN all SETTINGS weight = 1, max_concurrent_queries = 4, max_waiting_queries = 20;

SELECT 'prod' AS lane SETTINGS workload = 'production';
SELECT 'dev' AS lane SETTINGS workload = 'development';

SELECT name, parent, create_query FROM system.workloads ORDER BY name;
SELECT path, type, weight, priority, max_requests, max_speed, max_burst, dequeued_requests
FROM system.scheduler ORDER BY path;

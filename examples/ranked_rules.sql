-- The operator ranking work by rules: statements are placed by who sends them and what they
-- say, not by every client remembering a setting; ad-hoc work is outranked but never starved.
-- Run: sluice local examples/ranked_rules.sql
CREATE RESOURCE query (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8;
CREATE WORKLOAD etl IN all SETTINGS priority = 0;
CREATE WORKLOAD dashboards IN all SETTINGS priority = 1;
CREATE WORKLOAD adhoc IN all SETTINGS priority = 2, outranked_share = 0.1;
CREATE WORKLOAD default IN all SETTINGS priority = 2;

-- Tried by rank, highest first; the first that matches places the statement.
CREATE CLASSIFIER loaders WORKLOAD etl WHEN user IN ('etl', 'airflow') RANK 30;
CREATE CLASSIFIER grafana WORKLOAD dashboards WHEN application_name ILIKE 'grafana%' RANK 20;
CREATE CLASSIFIER adhoc_team WORKLOAD adhoc WHEN tag('team') = 'analysts' OR query ~ '(?i)^explain' RANK 10;
-- A rule on trial: counts what it would place, places nothing.
CREATE CLASSIFIER big_scans WORKLOAD adhoc WHEN query ILIKE '%from events%' AND statement_kind = 'select' RANK 40 DRY RUN;

SELECT 'an analyst''s query' AS what /* team='analysts' */;
SELECT 'a query nobody ranked' AS what;
SELECT 'named its own workload' AS what SETTINGS workload = 'etl';

SELECT name, workload, rank, dry_run, matches, predicate FROM system.classifiers;
SELECT workload, query FROM system.query_log WHERE query LIKE 'SELECT ''%' ORDER BY query_id;
SELECT * FROM system.workload_shares WHERE resource = 'query' ORDER BY workload;

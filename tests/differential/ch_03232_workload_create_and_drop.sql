-- ClickHouse tests/queries/0_stateless/03232_workload_create_and_drop.sql
CREATE OR REPLACE WORKLOAD all;
CREATE WORKLOAD IF NOT EXISTS production IN all;
CREATE WORKLOAD development IN all;
DROP WORKLOAD IF EXISTS production;
DROP WORKLOAD development;
CREATE WORKLOAD IF NOT EXISTS production IN all;

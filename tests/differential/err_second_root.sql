-- Only one workload may have no parent; the root can be replaced but not given a parent.
CREATE WORKLOAD all;
CREATE WORKLOAD another_root;
CREATE WORKLOAD child IN all;
CREATE OR REPLACE WORKLOAD all SETTINGS weight = 2;
CREATE OR REPLACE WORKLOAD all IN child;
CREATE OR REPLACE WORKLOAD child;
DROP WORKLOAD child;
DROP WORKLOAD all;
CREATE WORKLOAD new_root;
CREATE WORKLOAD child IN new_root;

-- Re-parent and then restore the original shape.
CREATE RESOURCE q (QUERY);
CREATE WORKLOAD all;
CREATE WORKLOAD admin IN all SETTINGS priority = 0;
CREATE WORKLOAD production IN all SETTINGS priority = 1, weight = 9;
CREATE WORKLOAD development IN all SETTINGS priority = 1, weight = 1;
CREATE OR REPLACE WORKLOAD development IN production SETTINGS priority = 1;
CREATE OR REPLACE WORKLOAD development IN admin SETTINGS priority = 1;
CREATE OR REPLACE WORKLOAD development IN all SETTINGS priority = 1;

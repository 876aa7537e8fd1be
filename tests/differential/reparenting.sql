-- Moving workloads around: a leaf becomes inner and back, and subtrees move with their parent.
CREATE RESOURCE q (QUERY);
CREATE RESOURCE mem (MEMORY RESERVATION);
CREATE WORKLOAD all;
CREATE WORKLOAD admin IN all SETTINGS priority = 0;
CREATE WORKLOAD production IN all SETTINGS priority = 1, weight = 9;
CREATE WORKLOAD development IN all SETTINGS priority = 1, weight = 1;
CREATE OR REPLACE WORKLOAD development IN production SETTINGS priority = 1;
CREATE WORKLOAD sub IN development SETTINGS weight = 5;
CREATE OR REPLACE WORKLOAD development IN admin;
CREATE OR REPLACE WORKLOAD production IN admin SETTINGS priority = 3;

-- Priorities: distinct values get a prio node; equal values share a p<N>_fair node.
CREATE RESOURCE q (QUERY);
CREATE RESOURCE io (READ DISK d);
CREATE WORKLOAD all;
CREATE WORKLOAD a IN all SETTINGS priority = -1;
CREATE WORKLOAD b IN all SETTINGS priority = -1, weight = 2;
CREATE WORKLOAD c IN all SETTINGS priority = 0;
CREATE WORKLOAD d IN all SETTINGS priority = 1;
CREATE WORKLOAD e IN all SETTINGS priority = 1;
CREATE WORKLOAD f IN all SETTINGS priority = 1;
CREATE WORKLOAD g IN all SETTINGS priority = 10;
CREATE WORKLOAD h IN all SETTINGS priority = -5 FOR q;
CREATE WORKLOAD i IN all SETTINGS priority = 2 FOR io, priority = -1;

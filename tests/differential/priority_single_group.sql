-- One child hangs directly; two at one priority share a fair node; no prio node without a second priority.
CREATE RESOURCE q (QUERY);
CREATE WORKLOAD all;
CREATE WORKLOAD only IN all SETTINGS priority = 5;
CREATE WORKLOAD mid;
CREATE WORKLOAD mid IN all SETTINGS priority = 5;
CREATE WORKLOAD x IN only;
CREATE WORKLOAD y IN only;
CREATE WORKLOAD z IN mid SETTINGS priority = 3, weight = 7;

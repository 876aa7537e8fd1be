-- tests/integration/test_scheduler_cpu: independent pools per workload, weights 3:1
CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
CREATE WORKLOAD all;
CREATE WORKLOAD pool15 IN all SETTINGS max_concurrent_threads = 15;
CREATE WORKLOAD pool10 IN all SETTINGS max_concurrent_threads = 10;
CREATE WORKLOAD pool5 IN all SETTINGS max_concurrent_threads = 5;
CREATE WORKLOAD fair IN all SETTINGS max_concurrent_threads = 4;
CREATE WORKLOAD heavy IN fair SETTINGS weight = 3;
CREATE WORKLOAD light IN fair SETTINGS weight = 1;

-- Memory groups children by precedence; time-shared resources ignore it.
CREATE RESOURCE mem (MEMORY RESERVATION);
CREATE RESOURCE q (QUERY);
CREATE WORKLOAD all;
CREATE WORKLOAD a IN all SETTINGS precedence = -1;
CREATE WORKLOAD b IN all SETTINGS precedence = 2, weight = 3;
CREATE WORKLOAD c IN all SETTINGS precedence = 2;
CREATE WORKLOAD d IN all SETTINGS precedence = 0, priority = 7;
CREATE WORKLOAD e IN all SETTINGS priority = 7;
CREATE WORKLOAD f IN all SETTINGS precedence = 5 FOR mem;

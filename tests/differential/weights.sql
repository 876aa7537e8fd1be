-- Weights are per resource; fractional and huge weights; workload rows carry priority and precedence everywhere.
CREATE RESOURCE q (QUERY);
CREATE RESOURCE m (MEMORY RESERVATION);
CREATE WORKLOAD all SETTINGS weight = 7;
CREATE WORKLOAD a IN all SETTINGS weight = 0.5, priority = 2, precedence = -3;
CREATE WORKLOAD b IN all SETTINGS weight = 1e10, priority = 2, precedence = -3;
CREATE WORKLOAD c IN all SETTINGS weight = 3 FOR m, weight = 4 FOR q;

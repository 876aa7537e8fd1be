-- ClickHouse docs: memory reservation with precedence.
CREATE RESOURCE memory (MEMORY RESERVATION);
CREATE WORKLOAD all SETTINGS max_memory = '10Gi';
CREATE WORKLOAD production IN all SETTINGS precedence = -1;
CREATE WORKLOAD development IN all SETTINGS precedence = 1, max_memory = '2Gi';
CREATE WORKLOAD admin IN all SETTINGS precedence = -1, weight = 2;
CREATE WORKLOAD etl IN production SETTINGS max_waiting_queries = 10;
CREATE WORKLOAD reports IN production SETTINGS weight = 2;

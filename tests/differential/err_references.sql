-- Parents must exist and be workloads; FOR must name an existing resource.
CREATE RESOURCE q (QUERY);
CREATE WORKLOAD all;
CREATE WORKLOAD a IN nonexistent;
CREATE WORKLOAD a IN q;
CREATE WORKLOAD a IN all SETTINGS weight = 2 FOR nonexistent;
CREATE WORKLOAD a IN all SETTINGS weight = 2 FOR all;
CREATE WORKLOAD self_ref IN self_ref;
CREATE WORKLOAD b IN all SETTINGS unknown = 1 FOR nonexistent;
CREATE WORKLOAD b IN all SETTINGS unknown = 1 FOR q;
CREATE WORKLOAD b IN nonexistent SETTINGS unknown = 1;
CREATE WORKLOAD b IN all SETTINGS weight = -1 FOR q;
CREATE WORKLOAD b IN all SETTINGS weight = -1 FOR other, weight = 1 FOR q;
CREATE WORKLOAD c IN all SETTINGS weight = 2 FOR q, priority = 1 FOR q, max_concurrent_queries = 3 FOR q;

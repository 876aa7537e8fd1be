-- Keywords in any case; comments anywhere; statements across lines.
create resource q (query);
Create Or Replace Workload all /* root */ Settings max_concurrent_queries = 3;
CREATE
  WORKLOAD   a   -- first child
  IN all
  SETTINGS weight = 2,   -- heavier
           priority = 1;
cReAtE wOrKlOaD b iN all sEtTiNgS PRIORITY = 1;
create workload c in all settings priority = 2 for Q;
create workload c in all settings priority = 2 for q;
drop workload if exists b;

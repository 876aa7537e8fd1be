"""psycopg 3 on connect and reading the catalog, as tools do: prints what it saw, one line per
fact, so the output against PostgreSQL and against sluice can be compared.

    python catalog.py DSN
"""
import sys

import psycopg
from psycopg.types import TypeInfo

with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    # Drivers parse the version they are told; a number, not its text, is what they compare.
    print("server_version major:", conn.info.server_version // 10000)
    with conn.cursor() as cur:
        cur.execute("SELECT id, name, score, at, amount FROM t ORDER BY id")
        print("description:", [(c.name, c.type_code) for c in cur.description])
        print("rows:", cur.fetchall())
        cur.execute(
            "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull "
            "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON a.attrelid = c.oid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = 't' AND n.nspname = 'public' AND a.attnum > 0 ORDER BY a.attnum"
        )
        print("columns:", cur.fetchall())
        cur.execute(
            "SELECT table_name, column_name, ordinal_position FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = 't' ORDER BY ordinal_position"
        )
        print("information_schema:", cur.fetchall())
        cur.execute("SELECT current_schema(), 't'::regclass::oid = (SELECT oid FROM pg_class WHERE relname = 't')")
        print("schema, regclass:", cur.fetchone())
        # A list parameter (psycopg sends it typed, as int2[] or text[]).
        cur.execute("SELECT id, name FROM t WHERE id = ANY(%s) ORDER BY id", ([1, 2],))
        print("any int:", cur.fetchall())
        cur.execute("SELECT id FROM t WHERE name = ANY(%s)", (["one", "two"],))
        print("any text:", cur.fetchall())
        # Orderings against a list, in text and in binary.
        cur.execute("SELECT id FROM t WHERE id < ANY(%s) AND id > ALL(%s)", ([0, 2], [-1, 0]))
        print("< any, > all:", cur.fetchall())
        cur.execute("SELECT id FROM t WHERE id <= ALL(%b)", ([1, 5],))
        print("<= all, binary:", cur.fetchall())
    # psycopg's own catalog query (pg_type by name), as an adapter registration makes it.
    for name in ("text", "int4", "numeric", "timestamp", "bool"):
        info = TypeInfo.fetch(conn, name)
        print("type:", name, info.oid, info.array_oid)

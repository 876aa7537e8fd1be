"""The same conversation through psycopg 3 and asyncpg, printed line by line.

Run against PostgreSQL and against sluice (tests/drivers.rs compares the two outputs):

    python tests/drivers/drivers.py postgresql://user@127.0.0.1:PORT/db
"""
import asyncio
import datetime
import decimal
import sys

import asyncpg
import psycopg

DSN = sys.argv[1]


def show(label, value):
    print(f"{label}: {value!r}", flush=True)


ROWS = [
    # ints of every width psycopg picks (int2, int4, int8) into INT and BIGINT columns
    (1, 2, "one", datetime.date(2024, 1, 2), 1.5, decimal.Decimal("1.250")),
    (300, 3_000_000_000, "two", datetime.date(1999, 12, 31), -0.25, decimal.Decimal("-7.500")),
    (70000, -9_000_000_000_000, None, None, None, None),
    (-5, 0, "quote's; -- not a comment", datetime.date(2000, 2, 29), 1e10, decimal.Decimal("123456789.123")),
]


def psycopg_part():
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS drv")
        conn.execute(
            "CREATE TABLE drv (k INT, b BIGINT, t TEXT, d DATE, f DOUBLE PRECISION, n NUMERIC(12,3))"
        )
        cur = conn.cursor()
        cur.execute("INSERT INTO drv VALUES (%s, %s, %s, %s, %s, %s)", ROWS[0])
        show("psycopg insert", (cur.statusmessage, cur.rowcount))
        cur.executemany("INSERT INTO drv VALUES (%s, %s, %s, %s, %s, %s)", ROWS[1:])
        show("psycopg executemany", cur.rowcount)
        for binary in (False, True):
            cur = conn.cursor(binary=binary)
            cur.execute("SELECT k, b, t, d, f, n FROM drv ORDER BY k")
            show(f"psycopg rows binary={binary}", cur.fetchall())
            cur.execute("SELECT t FROM drv WHERE k = %s AND b > %s ORDER BY t", (300, 1))
            show(f"psycopg filter binary={binary}", cur.fetchall())
            cur.execute("SELECT k FROM drv WHERE t = %s", ("one",))
            show(f"psycopg text param binary={binary}", cur.fetchall())
            cur.execute("SELECT k FROM drv WHERE d = %s", (datetime.date(2000, 2, 29),))
            show(f"psycopg date param binary={binary}", cur.fetchall())
            cur.execute("SELECT count(*) FROM drv WHERE t IS NULL AND n IS NULL")
            show(f"psycopg nulls binary={binary}", cur.fetchall())
            cur.execute("SELECT sum(k), max(b), min(f) FROM drv")
            show(f"psycopg aggregates binary={binary}", cur.fetchall())
        cur = conn.cursor()
        cur.execute("UPDATE drv SET t = %s WHERE k = %s", ("uno", 1))
        show("psycopg update", (cur.statusmessage, cur.rowcount))
        cur.execute("DELETE FROM drv WHERE k = %s", (-5,))
        show("psycopg delete", (cur.statusmessage, cur.rowcount))
        try:
            cur.execute("SELECT 1 / 0")
        except psycopg.Error as e:
            show("psycopg error", e.sqlstate)
    # COPY … TO STDOUT, text and CSV.
    with psycopg.connect(DSN, autocommit=True) as conn:
        cur = conn.cursor()
        for sql in (
            "COPY (SELECT k, t, d, n FROM drv ORDER BY k) TO STDOUT",
            "COPY (SELECT k, t, f FROM drv ORDER BY k) TO STDOUT WITH (FORMAT csv, HEADER)",
        ):
            with cur.copy(sql) as copy:
                show("psycopg copy out", b"".join(bytes(block) for block in copy))
    # A named (server-side) cursor: DECLARE, FETCH FORWARD n, CLOSE, inside a transaction.
    with psycopg.connect(DSN) as conn:
        with conn.cursor(name="drv_cursor") as cur:
            cur.itersize = 2
            cur.execute("SELECT k, t FROM drv WHERE k > %s ORDER BY k", (0,))
            show("psycopg named cursor description", [c.name for c in cur.description])
            show("psycopg named cursor first", cur.fetchone())
            show("psycopg named cursor many", cur.fetchmany(2))
            show("psycopg named cursor rest", cur.fetchall())
            show("psycopg named cursor iterated", list(cur))
        conn.commit()


async def asyncpg_part():
    conn = await asyncpg.connect(DSN)
    await conn.executemany(
        "INSERT INTO drv VALUES ($1, $2, $3, $4, $5, $6)",
        [(7, 7_000_000_000, "seven", datetime.date(2020, 7, 7), 7.25, decimal.Decimal("7.125")),
         (8, -8, None, None, None, None)],
    )
    rows = await conn.fetch("SELECT k, b, t, d, f, n FROM drv WHERE k > $1 ORDER BY k", 0)
    show("asyncpg rows", [tuple(r) for r in rows])
    stmt = await conn.prepare("SELECT t FROM drv WHERE b = $1")
    show("asyncpg prepared", [tuple(r) for r in await stmt.fetch(7_000_000_000)])
    show("asyncpg prepared again", [tuple(r) for r in await stmt.fetch(-8)])
    show("asyncpg fetchval", await conn.fetchval("SELECT count(*) FROM drv WHERE d >= $1", datetime.date(2000, 1, 1)))
    status = await conn.execute("DELETE FROM drv WHERE k = $1", 8)
    show("asyncpg delete", status)
    try:
        await conn.fetch("SELECT k FROM drv WHERE k = $1", "not a number")
    except (asyncpg.PostgresError, asyncpg.DataError) as e:
        show("asyncpg bad parameter", type(e).__name__)
    await conn.close()


psycopg_part()
asyncio.run(asyncpg_part())

//! A DBA's own tools against `sluice serve` on the embedded engine (the binary, as a process):
//! psql's catalog commands print what they print against the machine's PostgreSQL for the
//! same tables (names normalized: the owner, the database), and psycopg and node-postgres
//! connect, describe results and read the catalog as they do against PostgreSQL, and so does
//! the PostgreSQL JDBC driver (pgjdbc), which GUI tools over JDBC use.

mod common;

use std::ffi::OsStr;
use std::path::Path;

use common::{free_port, psql_at, required_env, run_script, start};
use sluice_testpg::{Auth, Postgres};

/// The tables both sides get (sluice has no indexes, constraints or defaults, so none here).
const SCHEMA: &str = "CREATE TABLE t (id int NOT NULL, name text, score double precision, \
                      at timestamp, amount numeric(10,2));
                      INSERT INTO t VALUES (1, 'one', 1.5, '2026-01-02 03:04:05', 12.34);
                      CREATE TABLE other (x bigint, flag boolean);
                      CREATE VIEW v AS SELECT id, name FROM t";

fn psql(port: u16, user: &str, database: &str, commands: &[&str]) -> String {
    psql_at(port, user, database, None, commands)
}

/// The machine's PostgreSQL and `sluice serve`, both holding [`SCHEMA`] (user `dba`): the
/// server, sluice's port, and what keeps them running.
fn both(dir: &Path) -> (Postgres, u16, common::Server) {
    let pg_dir = dir.join("pgroot");
    std::fs::create_dir(&pg_dir).expect("pg dir");
    let pg = Postgres::start(&pg_dir, "dba", Auth::Trust);
    let port = free_port();
    let server = start(dir, &["--listen", &format!("127.0.0.1:{port}")]);
    psql(pg.port, "dba", "postgres", &[SCHEMA]);
    psql(port, "dba", "any", &[SCHEMA]);
    (pg, port, server)
}

/// psql's output with the owner's name as `OWNER`, padded columns closed up (names of other
/// lengths change column widths).
fn normalized(text: &str, owner: &str) -> String {
    text.lines()
        .map(|line| {
            let line = if owner.is_empty() {
                line.to_string()
            } else {
                line.replace(owner, "OWNER")
            };
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let joined = cells.join("|");
            // Rule lines (`---+---`) and titles depend on widths only.
            if joined.chars().all(|c| c == '-' || c == '+' || c == '|') {
                "---".to_string()
            } else {
                joined.trim().to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn psql_describes_sluice_tables_as_postgres_describes_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pg, port, _server) = both(dir.path());
    // sluice's `system` schema, as PostgreSQL lists a schema of the same name.
    psql(pg.port, "dba", "postgres", &["CREATE SCHEMA system"]);

    for command in [
        "\\dt",
        "\\d",
        "\\d t",
        "\\d+ t",
        "\\d other",
        "\\dv",
        "\\d v",
        "\\dp",
        "\\dD",
        "\\dn",
        "\\df",
        "\\di",
        "\\du",
    ] {
        let direct = normalized(&psql(pg.port, "dba", "postgres", &[command]), "dba");
        let sluice = normalized(&psql(port, "dba", "any", &[command]), "sluice");
        assert_eq!(
            sluice, direct,
            "{command}: sluice (left) vs PostgreSQL (right)"
        );
    }
    // `\d+ v`: the same, but the view's query is as it was written (PostgreSQL prints its own
    // deparse of it: `SELECT t.id,` / `t.name` / `FROM t;`).
    let direct = normalized(&psql(pg.port, "dba", "postgres", &["\\d+ v"]), "dba");
    let sluice = normalized(&psql(port, "dba", "any", &["\\d+ v"]), "sluice");
    let (sluice_columns, definition) = sluice.split_once("View definition:").expect("a definition");
    assert_eq!(
        sluice_columns,
        direct
            .split_once("View definition:")
            .expect("a definition")
            .0,
        "\\d+ v: sluice (left) vs PostgreSQL (right)"
    );
    assert_eq!(definition.trim(), "SELECT id, name FROM t;\n---");
    // `\l`: sluice has one database of its own; the listing has Postgres's shape.
    let direct = psql(pg.port, "dba", "postgres", &["\\l"]);
    let sluice = psql(port, "dba", "any", &["\\l"]);
    let header = |s: &str| {
        normalized(
            s.lines().take(3).collect::<Vec<_>>().join("\n").as_str(),
            "",
        )
    };
    assert_eq!(header(&sluice), header(&direct), "\\l header");
    assert!(sluice.contains(" sluice "), "{sluice}");
    // Commands whose figures sluice does not have (sizes) or whose lists differ: they run.
    for command in ["\\dt+", "\\dT", "\\dx", "\\dS pg_class"] {
        psql(port, "dba", "any", &[command]);
    }
    // The system tables are in the catalog too (not on the search path, as in Postgres).
    let system = psql(port, "dba", "any", &["\\dt system.*"]);
    assert!(system.contains("system | workloads"), "{system}");
    // What drivers check first.
    let version = psql(
        port,
        "dba",
        "any",
        &["SELECT version()", "SHOW server_version"],
    );
    assert!(version.contains("PostgreSQL 15.0 (sluice"), "{version}");
    assert!(version.contains("Apache DataFusion"), "{version}");
    assert_eq!(
        psql(
            port,
            "dba",
            "any",
            &["SELECT current_database(), current_schema()"]
        )
        .lines()
        .nth(2)
        .map(normalized_row),
        Some("sluice|public".to_string())
    );
}

fn normalized_row(line: &str) -> String {
    line.split('|').map(str::trim).collect::<Vec<_>>().join("|")
}

/// A driver's script run against PostgreSQL and against sluice (`url(port, database)` says how
/// that driver is pointed at each): the outputs must be the same, and at least `lines` long.
fn same_against_both(
    driver: &str,
    program: &OsStr,
    script: &str,
    envs: &[(&str, &OsStr)],
    url: impl Fn(u16, &str) -> String,
    lines: usize,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pg, port, _server) = both(dir.path());
    let direct = run_script(program, script, &url(pg.port, "postgres"), envs);
    let sluice = run_script(program, script, &url(port, "any"), envs);
    assert!(direct.lines().count() >= lines, "{direct}");
    assert_eq!(
        sluice, direct,
        "{driver}: sluice (left) vs PostgreSQL (right)"
    );
}

fn postgresql_url(port: u16, database: &str) -> String {
    format!("postgresql://dba@127.0.0.1:{port}/{database}")
}

#[test]
fn psycopg_reads_sluice_catalog_as_it_reads_postgres() {
    let python = required_env("SLUICE_DRIVERS_PYTHON", "a python with psycopg");
    same_against_both(
        "psycopg",
        &python,
        "drivers/catalog.py",
        &[],
        postgresql_url,
        10,
    );
}

#[test]
fn node_postgres_reads_sluice_catalog_as_it_reads_postgres() {
    let modules = required_env("SLUICE_NODE_MODULES", "a node_modules with pg");
    same_against_both(
        "node-postgres",
        OsStr::new("node"),
        "drivers/node_catalog.js",
        &[("NODE_PATH", &modules)],
        postgresql_url,
        6,
    );
}

#[test]
fn jdbc_reads_sluice_catalog_as_it_reads_postgres() {
    let jar = required_env("SLUICE_JDBC_JAR", "the PostgreSQL JDBC driver's jar");
    same_against_both(
        "JDBC",
        OsStr::new("java"),
        "drivers/JdbcCatalog.java",
        &[("CLASSPATH", &jar)],
        |port, database| format!("jdbc:postgresql://127.0.0.1:{port}/{database}?user=dba"),
        10,
    );
}

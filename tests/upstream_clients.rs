//! Real clients through `sluice serve --upstream` (the binary, as a process) in front of a
//! real PostgreSQL started here: psql's catalog commands and pgbench print what they print
//! going direct.

mod common;

use std::process::Command;

use common::{free_port, psql_at, start};
use sluice_testpg::{Auth, Postgres};

/// Runs psql against `port` as `user` on `shop`, one command per `-c`; returns stdout.
fn psql(port: u16, user: &str, commands: &[&str]) -> String {
    psql_at(port, user, "shop", Some("owner-pw"), commands)
}

fn pgbench(port: u16, args: &[&str]) -> String {
    let out = Command::new("pgbench")
        .args(["-h", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["-U", "owner"])
        .args(args)
        .arg("shop")
        .env("PGPASSWORD", "owner-pw")
        .output()
        .expect("pgbench runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "pgbench {args:?}: {text}");
    text
}

#[test]
fn psql_and_pgbench_through_sluice_see_what_they_see_direct() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pg_dir = dir.path().join("pgroot");
    std::fs::create_dir(&pg_dir).expect("pg dir");
    let pg = Postgres::start(&pg_dir, "owner", Auth::Password("owner-pw".into()));
    pg.psql("CREATE DATABASE shop OWNER owner");
    let port = free_port();
    let upstream = format!("postgres://owner:owner-pw@127.0.0.1:{}/shop", pg.port);
    let _server = start(
        dir.path(),
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            &upstream,
        ],
    );
    psql(
        pg.port,
        "owner",
        &["CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL DEFAULT 'x', price numeric(10,2) CHECK (price > 0));
           CREATE INDEX items_name ON items (name);
           COMMENT ON TABLE items IS 'what we sell';
           CREATE SCHEMA archive; CREATE VIEW cheap AS SELECT * FROM items WHERE price < 10"],
    );
    // psql's catalog commands: the same text either way.
    for command in [
        "\\echo :SERVER_VERSION_NAME :SERVER_VERSION_NUM",
        "\\dt",
        "\\d items",
        "\\d+ items",
        "\\dn",
        "\\dv",
        "\\di",
        "\\l shop",
    ] {
        assert_eq!(
            psql(port, "owner", &[command]),
            psql(pg.port, "owner", &[command]),
            "{command}"
        );
    }
    // pgbench: initialised through sluice, then each query mode; the upstream's tables end as
    // a direct run leaves them (every transaction committed, the sums balanced).
    pgbench(port, &["-i", "-s", "1", "-q"]);
    for mode in ["simple", "extended", "prepared"] {
        // The first run vacuums and empties pgbench_history as pgbench does; the others keep
        // it (-n), so it holds every run's transactions.
        let vacuum = if mode == "simple" { "-M" } else { "-nM" };
        let out = pgbench(port, &[vacuum, mode, "-c", "4", "-j", "2", "-t", "50"]);
        assert!(
            out.contains("number of transactions actually processed: 200/200"),
            "{mode}: {out}"
        );
        assert!(
            out.contains("number of failed transactions: 0"),
            "{mode}: {out}"
        );
    }
    let balanced = psql(
        pg.port,
        "owner",
        &["SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(delta) FROM pgbench_history), (SELECT count(*) FROM pgbench_history)"],
    );
    assert!(balanced.contains(" t        |   600"), "{balanced}");
}

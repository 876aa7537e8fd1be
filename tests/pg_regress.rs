//! A regression-diff harness: PostgreSQL's own regression scripts (the list and their source in
//! `tests/pg_regress/scripts.txt`), each run with `psql -X -a -q` once directly against a
//! PostgreSQL started here and once through `sluice serve --upstream` in front of it, with
//! the environment pg_regress gives them (`PGTZ=PST8PDT`, `PGDATESTYLE='Postgres, MDY'`, the
//! regression database's C locale settings). The two outputs must be identical, byte for
//! byte: what a client sees through the gateway is what it sees going direct.
//!
//! The scripts are PostgreSQL's, not ours: `.ci/run` fetches them from Debian's source
//! package (`tests/pg_regress/fetch.sh`) and sets `SLUICE_PG_REGRESS_DIR`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{free_port, required_env, start};
use sluice_testpg::{Auth, Postgres};

/// The scripts named in `tests/pg_regress/scripts.txt`.
fn scripts() -> Vec<String> {
    let list = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pg_regress/scripts.txt"),
    )
    .expect("scripts.txt");
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// A fresh `regression` database, set up as pg_regress sets up its own.
fn fresh_database(pg: &Postgres) {
    pg.psql("DROP DATABASE IF EXISTS regression WITH (FORCE)");
    pg.psql(
        "CREATE DATABASE regression TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'",
    );
    pg.psql(
        "ALTER DATABASE regression SET lc_messages TO 'C';
         ALTER DATABASE regression SET lc_monetary TO 'C';
         ALTER DATABASE regression SET lc_numeric TO 'C';
         ALTER DATABASE regression SET lc_time TO 'C';
         ALTER DATABASE regression SET bytea_output TO 'hex';
         ALTER DATABASE regression SET timezone_abbreviations TO 'Default'",
    );
}

/// What `psql -X -a -q` prints (stdout and stderr, as pg_regress keeps them) for `script`
/// at `port`.
fn run(script: &Path, port: u16, test: &str) -> String {
    let input = std::fs::File::open(script).expect("the script");
    let out = Command::new("sh")
        .arg("-c")
        .arg("exec psql -X -a -q \"$0\" 2>&1")
        .arg(format!(
            "host=127.0.0.1 port={port} user=regress dbname=regression"
        ))
        .stdin(Stdio::from(input))
        .env("PGTZ", "PST8PDT")
        .env("PGDATESTYLE", "Postgres, MDY")
        .env("PGAPPNAME", format!("pg_regress/{test}"))
        .env("LC_ALL", "C")
        .env_remove("PGOPTIONS")
        .output()
        .expect("psql runs (the machine's PostgreSQL client)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn postgres_regression_scripts_print_the_same_through_sluice() {
    let dir = required_env(
        "SLUICE_PG_REGRESS_DIR",
        "the directory of PostgreSQL 15.18's src/test/regress/sql (tests/pg_regress/fetch.sh)",
    );
    let sql = Path::new(&dir);
    let scripts = scripts();
    assert!(
        scripts.len() >= 20,
        "at least 20 scripts ({})",
        scripts.len()
    );

    let root = tempfile::tempdir().expect("tempdir");
    let pg_dir = root.path().join("pgroot");
    std::fs::create_dir(&pg_dir).expect("pg dir");
    let pg = Postgres::start(&pg_dir, "regress", Auth::Trust);
    fresh_database(&pg);
    let port = free_port();
    let upstream = format!("postgres://regress@127.0.0.1:{}/regression", pg.port);
    let _sluice = start(
        root.path(),
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            &upstream,
        ],
    );

    let mut differ = Vec::new();
    for test in &scripts {
        let script = sql.join(format!("{test}.sql"));
        assert!(
            script.exists(),
            "{} (SLUICE_PG_REGRESS_DIR)",
            script.display()
        );
        fresh_database(&pg);
        let direct = run(&script, pg.port, test);
        fresh_database(&pg);
        let through = run(&script, port, test);
        assert!(
            direct.lines().count() > 20,
            "{test}: psql printed almost nothing going direct:\n{direct}"
        );
        if direct != through {
            let (d, t): (Vec<&str>, Vec<&str>) =
                (direct.lines().collect(), through.lines().collect());
            let at = d
                .iter()
                .zip(&t)
                .position(|(a, b)| a != b)
                .unwrap_or(d.len().min(t.len()));
            differ.push(format!(
                "{test}: first difference at line {} of {}:\n  direct:  {}\n  through: {}",
                at + 1,
                d.len(),
                d.get(at).unwrap_or(&"<end>"),
                t.get(at).unwrap_or(&"<end>"),
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} scripts differ:\n{}",
        differ.len(),
        scripts.len(),
        differ.join("\n")
    );
}

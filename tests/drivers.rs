//! The most used Python drivers, psycopg 3 and asyncpg, through one script
//! (`tests/drivers/drivers.py`: text and binary formats, integers of every width into `INT` and
//! `BIGINT`, text, dates, floats, numerics, NULLs, `executemany`, prepared statements, errors)
//! run against the machine's PostgreSQL and against `sluice serve`: the two outputs must be
//! identical. `.ci/run` makes the venv and sets `SLUICE_DRIVERS_PYTHON`; without it the test
//! fails, saying how to get it.

mod common;

use common::{free_port, required_env, run_script, start};
use sluice_testpg::{Auth, Postgres};

#[test]
fn psycopg_and_asyncpg_see_sluice_as_they_see_postgres() {
    let python = required_env("SLUICE_DRIVERS_PYTHON", "a python with psycopg and asyncpg");
    let dir = tempfile::tempdir().expect("tempdir");
    let pg_dir = dir.path().join("postgres");
    std::fs::create_dir(&pg_dir).expect("dir");
    let postgres = Postgres::start(&pg_dir, "drivers", Auth::Trust);
    let expected = run_script(
        &python,
        "drivers/drivers.py",
        &format!("postgresql://drivers@127.0.0.1:{}/postgres", postgres.port),
        &[],
    );
    let port = free_port();
    let _sluice = start(dir.path(), &["--listen", &format!("127.0.0.1:{port}")]);
    let got = run_script(
        &python,
        "drivers/drivers.py",
        &format!("postgresql://drivers@127.0.0.1:{port}/any"),
        &[],
    );
    assert!(expected.lines().count() > 20, "{expected}");
    if got != expected {
        let diff: Vec<String> = expected
            .lines()
            .zip(got.lines())
            .filter(|(e, g)| e != g)
            .map(|(e, g)| format!("postgres: {e}\nsluice:   {g}"))
            .collect();
        panic!(
            "sluice answers differently from PostgreSQL:\n{}\n(full sluice output:\n{got})",
            diff.join("\n")
        );
    }
}

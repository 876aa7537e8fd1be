//! The most used Python drivers, psycopg 3 and asyncpg, through one script
//! (`tests/drivers/drivers.py`: text and binary formats, integers of every width into `INT` and
//! `BIGINT`, text, dates, floats, numerics, NULLs, `executemany`, prepared statements, errors)
//! run against the machine's PostgreSQL and against `sluice serve`: the two outputs must be
//! identical. `.ci/run` makes the venv and sets `SLUICE_DRIVERS_PYTHON`; without it the test
//! says so and passes, except under CI, where it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{free_port, start};

/// A PostgreSQL cluster of the machine's binaries in a temp dir, stopped on drop.
struct Postgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

fn postgres_bin() -> PathBuf {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    candidates.push("/usr/local/bin".into());
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev());
    }
    candidates
        .into_iter()
        .find(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
        .expect("PostgreSQL's initdb and pg_ctl (the machine's server binaries)")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs a PostgreSQL tool; as root, as the `postgres` user (initdb refuses root).
fn pg_tool(bin: &Path, tool: &str, args: &[&str]) -> std::process::Output {
    let program = bin.join(tool);
    let output = if is_root() {
        let line = std::iter::once(program.display().to_string())
            .chain(args.iter().map(|a| format!("'{a}'")))
            .collect::<Vec<_>>()
            .join(" ");
        Command::new("su")
            .args(["postgres", "-s", "/bin/sh", "-c", &line])
            .output()
    } else {
        Command::new(&program).args(args).output()
    };
    output.unwrap_or_else(|e| panic!("{tool}: {e}"))
}

impl Postgres {
    fn start(dir: &Path) -> Postgres {
        let bin = postgres_bin();
        if is_root() {
            let exists = Command::new("id")
                .arg("postgres")
                .output()
                .is_ok_and(|o| o.status.success());
            if !exists {
                let made = Command::new("useradd")
                    .args(["--system", "--no-create-home", "postgres"])
                    .status()
                    .expect("useradd");
                assert!(made.success(), "cannot create the postgres user");
            }
            let chown = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir)
                .status()
                .expect("chown");
            assert!(chown.success());
        }
        let data = dir.join("pg");
        let data = data.to_str().expect("utf-8 path");
        let out = pg_tool(
            &bin,
            "initdb",
            &["-D", data, "-A", "trust", "-U", "drivers"],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1",
            dir.display()
        );
        let log = dir.join("pg.log");
        let out = pg_tool(
            &bin,
            "pg_ctl",
            &[
                "-D",
                data,
                "-l",
                log.to_str().expect("utf-8"),
                "-w",
                "-o",
                &options,
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Postgres {
            dir: dir.to_path_buf(),
            bin,
            port,
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.join("pg");
        pg_tool(
            &self.bin,
            "pg_ctl",
            &["-D", data.to_str().unwrap_or(""), "-m", "immediate", "stop"],
        );
    }
}

fn run_script(python: &str, dsn: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/drivers/drivers.py");
    let out = Command::new(python)
        .arg(script)
        .arg(dsn)
        .output()
        .expect("runs the driver script");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{dsn}: the script failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn psycopg_and_asyncpg_see_sluice_as_they_see_postgres() {
    let Some(python) = std::env::var_os("SLUICE_DRIVERS_PYTHON") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "SLUICE_DRIVERS_PYTHON is not set (.ci/run makes the venv)"
        );
        eprintln!("skipped: set SLUICE_DRIVERS_PYTHON to a python with psycopg and asyncpg");
        return;
    };
    let python = python.to_str().expect("utf-8 path").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let pg_dir = dir.path().join("postgres");
    std::fs::create_dir(&pg_dir).expect("dir");
    let postgres = Postgres::start(&pg_dir);
    let expected = run_script(
        &python,
        &format!("postgresql://drivers@127.0.0.1:{}/postgres", postgres.port),
    );
    let port = free_port();
    let _sluice = start(dir.path(), &["--listen", &format!("127.0.0.1:{port}")]);
    let got = run_script(
        &python,
        &format!("postgresql://drivers@127.0.0.1:{port}/any"),
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

//! A real PostgreSQL for tests: a cluster of the machine's server binaries (`initdb`, `pg_ctl`,
//! found on `PATH` or under `/usr/lib/postgresql/*/bin`) initialised in a directory the test
//! owns, listening on a free loopback port, stopped (`-m immediate`) when dropped. Tests of the
//! drivers and of upstream mode compare sluice against it and put sluice in front of it.
//!
//! As root (CI runs as root), the tools run as the `postgres` user, created if missing:
//! `initdb` refuses to run as root.
//!
//! Only a dev-dependency: nothing here ships in the binary.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// How clients authenticate over TCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// `trust`: no password.
    Trust,
    /// `md5` for TCP — PostgreSQL then uses SCRAM for a password stored as SCRAM, which the
    /// superuser's is, and MD5 for one stored as MD5 (a role made after `SET
    /// password_encryption = 'md5'` through [`Postgres::psql`]) — with this password for the
    /// superuser. Unix-socket connections stay `trust`, for set-up.
    Password(String),
}

/// A running PostgreSQL cluster.
#[derive(Debug)]
pub struct Postgres {
    dir: PathBuf,
    bin: PathBuf,
    /// The loopback TCP port it listens on.
    pub port: u16,
    /// Its superuser.
    pub user: String,
}

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The directory with the machine's PostgreSQL server binaries.
pub fn postgres_bin() -> PathBuf {
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

/// Runs a PostgreSQL tool; as root, as the `postgres` user.
fn pg_tool(program: &Path, args: &[&str]) -> Output {
    let output = if is_root() {
        let line = std::iter::once(program.display().to_string())
            .chain(
                args.iter()
                    .map(|a| format!("'{}'", a.replace('\'', "'\\''"))),
            )
            .collect::<Vec<_>>()
            .join(" ");
        Command::new("su")
            .args(["postgres", "-s", "/bin/sh", "-c", &line])
            .output()
    } else {
        Command::new(program).args(args).output()
    };
    output.unwrap_or_else(|e| panic!("{}: {e}", program.display()))
}

fn check(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Postgres {
    /// Initialises a cluster under `dir` (which must exist and be empty of a `pg` directory)
    /// with superuser `user`, and starts it.
    pub fn start(dir: &Path, user: &str, auth: Auth) -> Postgres {
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
        let mut args = vec!["-D", data, "-U", user];
        let pwfile = dir.join("pwfile");
        let pwfile_arg;
        match &auth {
            Auth::Trust => args.extend(["-A", "trust"]),
            Auth::Password(password) => {
                std::fs::write(&pwfile, password).expect("pwfile");
                if is_root() {
                    let _ = Command::new("chown").arg("postgres").arg(&pwfile).status();
                }
                pwfile_arg = format!("--pwfile={}", pwfile.display());
                args.extend(["--auth-host=md5", "--auth-local=trust", &pwfile_arg]);
            }
        }
        check("initdb", &pg_tool(&bin.join("initdb"), &args));
        let port = free_port();
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1",
            dir.display()
        );
        let log = dir.join("pg.log");
        let log = log.to_str().expect("utf-8");
        check(
            "pg_ctl start",
            &pg_tool(
                &bin.join("pg_ctl"),
                &["-D", data, "-l", log, "-w", "-o", &options, "start"],
            ),
        );
        let postgres = Postgres {
            dir: dir.to_path_buf(),
            bin,
            port,
            user: user.to_string(),
        };
        if let Auth::Password(password) = &auth {
            // initdb stores the password as MD5 when the method is md5: store it as SCRAM,
            // so that the superuser authenticates with SCRAM and roles made with
            // `password_encryption = 'md5'` with MD5.
            postgres.psql(&format!(
                "SET password_encryption = 'scram-sha-256'; ALTER ROLE \"{}\" PASSWORD '{}'",
                user.replace('"', "\"\""),
                password.replace('\'', "''")
            ));
        }
        postgres
    }

    /// Runs `sql` with the server's `psql` as the superuser over the Unix socket (trusted),
    /// for set-up; panics on failure, returns what it printed (unaligned, tuples only).
    /// The cluster's data directory (where `server.crt` and `server.key` go for TLS).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("pg")
    }

    pub fn psql(&self, sql: &str) -> String {
        // The server's directory may hold only the server's tools (a symlink farm).
        let psql = Some(self.bin.join("psql"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("psql"));
        let dir = self.dir.display().to_string();
        let port = self.port.to_string();
        let out = pg_tool(
            &psql,
            &[
                "-h",
                &dir,
                "-p",
                &port,
                "-U",
                &self.user,
                "-d",
                "postgres",
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
        );
        check("psql", &out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops the server at once, as a crash would (`pg_ctl stop -m immediate`).
    pub fn kill(&self) {
        let data = self.dir.join("pg");
        pg_tool(
            &self.bin.join("pg_ctl"),
            &["-D", data.to_str().unwrap_or(""), "-m", "immediate", "stop"],
        );
    }

    /// Starts it again on the same port after [`Postgres::kill`].
    pub fn restart(&self) {
        let data = self.dir.join("pg");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("pg.log");
        check(
            "pg_ctl start",
            &pg_tool(
                &self.bin.join("pg_ctl"),
                &[
                    "-D",
                    data.to_str().unwrap_or(""),
                    "-l",
                    log.to_str().unwrap_or(""),
                    "-w",
                    "-o",
                    &options,
                    "start",
                ],
            ),
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.kill();
    }
}

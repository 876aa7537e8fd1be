//! What the process-level tests share: `sluice serve` started as a process on a free port.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `sluice serve`, with the lines of its stderr that report a panic (read as they
/// come: a panic that ends only a connection's task leaves the server up, and is still a bug).
pub struct Server(pub Child, Arc<Mutex<Vec<String>>>);

impl Server {
    /// What the server has said of panics so far ("thread '…' panicked at …" and the line
    /// after it, which holds the message).
    pub fn panics(&self) -> Vec<String> {
        self.1.lock().expect("panic lines").clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A self-signed certificate for `localhost` and its key, made by openssl in `dir` (valid a
/// day): `(cert.pem, key.pem)`, for a server's `[tls]`.
pub fn test_certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let openssl = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl makes a test certificate");
    assert!(openssl.status.success(), "{openssl:?}");
    (cert, key)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Starts `sluice serve` with `args` (plus a fresh data dir) and waits until it listens.
pub fn start(dir: &std::path::Path, args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .args(args)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts sluice serve");
    let stderr = child.stderr.take().expect("stderr");
    let server = Server(child, Arc::default());
    // Ready when it says it listens (bounded).
    let started = Instant::now();
    let mut lines = BufReader::new(stderr).lines();
    let mut said = Vec::new();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "sluice did not start:\n{}",
            said.join("\n")
        );
        match lines.next() {
            Some(Ok(line)) if line.contains("listening on") => break,
            Some(Ok(line)) => said.push(line),
            _ => panic!("sluice exited before listening:\n{}", said.join("\n")),
        }
    }
    // Keep reading so the server never blocks on a full pipe; keep what reports a panic.
    // SLUICE_SERVER_STDERR=1 shows all the server says (a panic's backtrace, with
    // RUST_BACKTRACE=1).
    let panics = Arc::clone(&server.1);
    let echo = std::env::var_os("SLUICE_SERVER_STDERR").is_some();
    std::thread::spawn(move || {
        let mut after_panic = false;
        for line in lines.map_while(Result::ok) {
            if echo {
                eprintln!("[sluice] {line}");
            }
            let panic = line.contains("panicked at");
            if panic || after_panic {
                panics.lock().expect("panic lines").push(line);
            }
            after_panic = panic;
        }
    });
    server
}

/// A tokio-postgres client for `conninfo` (no TLS), its connection driven in the background.
pub async fn client(conninfo: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connects ({conninfo}): {e}"));
    tokio::spawn(connection);
    client
}

/// Runs psql against `port` as `user` on `database` (with `password`, if any), one command
/// per `-c`, stopping at the first error; returns what it printed (panics on failure).
pub fn psql_at(
    port: u16,
    user: &str,
    database: &str,
    password: Option<&str>,
    commands: &[&str],
) -> String {
    let mut cmd = Command::new("psql");
    cmd.args(["-X", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["-U", user, "-d", database]);
    if let Some(password) = password {
        cmd.env("PGPASSWORD", password);
    }
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.output().expect("psql runs (install postgresql-client)");
    assert!(
        out.status.success(),
        "psql {commands:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of `var`, which `.ci/run` sets (`what` says to what) after installing what the
/// test needs. A test whose dependency is missing fails, saying how to get it: it never
/// passes having run nothing.
pub fn required_env(var: &str, what: &str) -> std::ffi::OsString {
    std::env::var_os(var).unwrap_or_else(|| {
        panic!(
            "{var} is not set: it names {what}. Run the tests with `bash .ci/run`, which \
             installs it and sets {var}, or set it yourself"
        )
    })
}

/// Runs `program tests/<script> dsn` (a Python, Node.js or single-file Java driver script) with `envs`; returns
/// what it printed (panics when it fails).
pub fn run_script(
    program: &std::ffi::OsStr,
    script: &str,
    dsn: &str,
    envs: &[(&str, &std::ffi::OsStr)],
) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = Command::new(program)
        .arg(&script)
        .arg(dsn)
        .envs(envs.iter().copied())
        .output()
        .expect("runs the script");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{dsn}: {} failed:\n{text}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// VmRSS or VmHWM of `pid`, in MB.
pub fn status_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .map(|kb| kb / 1024.0)
        .expect("a memory figure")
}

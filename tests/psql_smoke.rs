//! psql, the client people actually type into, against `sluice serve` started as a process.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn psql_talks_to_sluice_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts sluice serve");
    let stderr = child.stderr.take().expect("stderr");
    let server = Server(child);
    // Ready when it says it listens (bounded).
    let started = Instant::now();
    let mut lines = BufReader::new(stderr).lines();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "sluice did not start"
        );
        match lines.next() {
            Some(Ok(line)) if line.contains("listening on") => break,
            Some(Ok(_)) => continue,
            _ => panic!("sluice exited before listening"),
        }
    }
    let psql = Command::new("psql")
        .args([
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "smoke",
            "-d",
            "any",
            "-A",
            "-t",
        ])
        .args(["-c", "CREATE RESOURCE q (QUERY)"])
        .args([
            "-c",
            "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 2",
        ])
        .args([
            "-c",
            "SELECT name || '|' || create_query FROM system.workloads",
        ])
        .args(["-c", "SELECT 40 + 2 SETTINGS workload = 'all'"])
        .output()
        .expect("psql runs (install postgresql-client)");
    let out = String::from_utf8_lossy(&psql.stdout);
    assert!(
        psql.status.success(),
        "psql failed: {out}{}",
        String::from_utf8_lossy(&psql.stderr)
    );
    assert!(
        out.contains("all|CREATE WORKLOAD `all` SETTINGS max_concurrent_queries = 2"),
        "{out}"
    );
    assert!(out.contains("\n42\n") || out.ends_with("42\n"), "{out}");
    drop(server);
}

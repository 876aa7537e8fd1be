//! psql, the client people actually type into, against `sluice serve` started as a process.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, start};

#[test]
fn psql_talks_to_sluice_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let server = start(dir.path(), &["--listen", &format!("127.0.0.1:{port}")]);
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

fn sluice_passwd(password: &str) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("passwd")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sluice passwd");
    std::io::Write::write_all(
        child.stdin.as_mut().expect("stdin"),
        format!("{password}\n").as_bytes(),
    )
    .expect("write password");
    let out = child.wait_with_output().expect("passwd output");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string()
}

/// psql over TLS with a SCRAM password; admin-only DDL; SIGTERM stops the server cleanly.
#[test]
fn psql_over_tls_with_scram_users() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = common::test_certificate(dir.path());
    let admin = sluice_passwd("s3cret pass");
    assert!(admin.starts_with("SCRAM-SHA-256$4096:"), "{admin}");
    assert!(!admin.contains("s3cret"));
    let viewer = sluice_passwd("viewer");
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[[users]]\nname = \"ops\"\nscram = \"{admin}\"\nadmin = true\n\n\
             [[users]]\nname = \"viewer\"\nscram = \"{viewer}\"\n\n\
             [tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        ),
    )
    .expect("config");
    let port = free_port();
    let server = start(
        dir.path(),
        &[
            "--config",
            config.to_str().expect("path"),
            "--listen",
            &format!("127.0.0.1:{port}"),
        ],
    );
    let psql_with = |ssl: &str, user: &str, password: &str, sql: &str| {
        Command::new("psql")
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .arg(format!(
                "host=127.0.0.1 port={port} user={user} dbname=x {ssl}"
            ))
            .args(["-c", sql])
            .env("PGPASSWORD", password)
            .output()
            .expect("psql runs")
    };
    // channel_binding=require: the login must use SCRAM-SHA-256-PLUS, bound to the TLS
    // certificate.
    let psql = |user: &str, password: &str, sql: &str| {
        psql_with(
            "sslmode=require channel_binding=require",
            user,
            password,
            sql,
        )
    };
    let out = psql(
        "ops",
        "s3cret pass",
        "CREATE RESOURCE q (QUERY); SELECT 'tls ' || count(*) FROM system.resources",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("tls 1"), "{text}");
    // Without TLS the same user logs in with plain SCRAM-SHA-256 (no binding to offer).
    let plain = psql_with("sslmode=disable", "ops", "s3cret pass", "SELECT 'plain'");
    assert!(
        String::from_utf8_lossy(&plain.stdout).contains("plain"),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let out = psql("ops", "wrong", "SELECT 1");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("password authentication failed for user \"ops\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = psql("viewer", "viewer", "DROP RESOURCE q");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ACCESS_DENIED"));
    // SIGTERM: the server drains and exits 0.
    let mut server = server;
    let pid = server.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let started = Instant::now();
    loop {
        if let Some(status) = server.0.try_wait().expect("wait") {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn without_users_sluice_listens_on_loopback_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without [[users]]"),
        "{err}"
    );
}

//! The fleet (issue 37, its first part: membership): three `sluice serve` processes with
//! `[cluster]` on a three-member etcd cluster (the machine's `etcd`, on loopback). Each lists
//! all three in `system.nodes`; a node killed with SIGKILL leaves the list once its lease
//! expires; one stopped with SIGTERM leaves at once; a node started under the name of a live
//! node refuses to start, saying why.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_testetcd::Etcd;

fn config(dir: &Path, etcd: &Etcd, node: &str, lease_ttl: u64) -> PathBuf {
    let endpoints: Vec<String> = etcd.endpoints().iter().map(|e| format!("{e:?}")).collect();
    let path = dir.join(format!("{node}.toml"));
    std::fs::write(
        &path,
        format!(
            "[cluster]\netcd = [{}]\nprefix = \"/fleet-test\"\nnode = \"{node}\"\nlease_ttl = {lease_ttl}\n",
            endpoints.join(", ")
        ),
    )
    .expect("config");
    path
}

fn start(dir: &Path, etcd: &Etcd, node: &str, lease_ttl: u64) -> (common::Server, u16) {
    let port = common::free_port();
    let home = dir.join(node);
    std::fs::create_dir_all(&home).expect("node dir");
    let config = config(dir, etcd, node, lease_ttl);
    let server = common::start(
        &home,
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "--listen",
            &format!("127.0.0.1:{port}"),
        ],
    );
    (server, port)
}

/// The names `system.nodes` lists on the node at `port`.
fn nodes(port: u16) -> Vec<String> {
    let out = Command::new("psql")
        .args(["-X", "-A", "-t", "-h", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["-U", "fleet", "-d", "fleet", "-c"])
        .arg("SELECT name || '@' || address FROM system.nodes ORDER BY name")
        .output()
        .expect("psql runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split('@').next())
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect()
}

/// Waits (60 s at most) until the node at `port` lists exactly `names`.
fn lists(port: u16, names: &[&str]) {
    let started = Instant::now();
    loop {
        let seen = nodes(port);
        if seen == names {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the node on {port} lists {seen:?}, not {names:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn nodes_of_a_fleet_see_each_other_come_and_go() {
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = Etcd::start(dir.path(), 3);
    let (_n1, p1) = start(dir.path(), &etcd, "n1", 2);
    let (mut n2, p2) = start(dir.path(), &etcd, "n2", 2);
    // n3 has a long lease: it is gone at once only if it leaves.
    let (mut n3, p3) = start(dir.path(), &etcd, "n3", 120);
    for port in [p1, p2, p3] {
        lists(port, &["n1", "n2", "n3"]);
    }

    // A second node named n2 while n2 lives: refused, and it says why.
    let twin_dir = dir.path().join("twin");
    std::fs::create_dir_all(&twin_dir).expect("dir");
    let twin = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .arg("--config")
        .arg(config(&twin_dir, &etcd, "n2", 2))
        .args(["--listen", &format!("127.0.0.1:{}", common::free_port())])
        .arg("--data-dir")
        .arg(twin_dir.join("data"))
        .stdout(Stdio::null())
        .output()
        .expect("runs");
    assert!(!twin.status.success());
    let said = String::from_utf8_lossy(&twin.stderr);
    assert!(said.contains("held by a live node"), "{said}");

    // SIGTERM: n3 leaves the fleet as it stops (its 120 s lease revoked: `lists` gives up
    // after 60 s, so only a leave passes).
    Command::new("kill")
        .args(["-TERM", &n3.0.id().to_string()])
        .status()
        .expect("kill");
    let _ = n3.0.wait();
    lists(p1, &["n1", "n2"]);

    // SIGKILL: n2 leaves once its 2 s lease expires.
    n2.0.kill().expect("kill -9");
    let _ = n2.0.wait();
    lists(p1, &["n1"]);
}

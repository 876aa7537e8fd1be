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

/// Waits (60 s at most) until the node at `port` lists exactly `names` in `system.nodes`.
fn lists(port: u16, names: &[&str]) {
    says(
        port,
        "SELECT string_agg(name, ',' ORDER BY name) FROM system.nodes",
        &names.join(","),
    );
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

/// Runs `sql` on the node at `port`: its output, or its error.
fn run(port: u16, sql: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .args([
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
        ])
        .arg(port.to_string())
        .args(["-U", "fleet", "-d", "fleet", "-c", sql])
        .output()
        .expect("psql runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Waits (60 s at most) until `sql` on the node at `port` says `expected`.
fn says(port: u16, sql: &str, expected: &str) {
    let started = Instant::now();
    loop {
        let now = run(port, sql);
        if now.as_deref() == Ok(expected) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the node on {port} says {now:?} to {sql}, not {expected:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 37's second part: one catalog for the fleet. DDL on any node is stored in etcd and
/// reaches every node; two nodes racing conflicting DDL: one wins, the other is refused as if
/// it had come second on one node, and every node ends with the same catalog; a node that
/// joins later starts with it.
#[test]
fn ddl_on_one_node_reaches_every_node_and_a_race_has_one_winner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = Etcd::start(dir.path(), 3);
    let (_n1, p1) = start(dir.path(), &etcd, "n1", 5);
    let (_n2, p2) = start(dir.path(), &etcd, "n2", 5);
    let (_n3, p3) = start(dir.path(), &etcd, "n3", 5);
    let names = "SELECT string_agg(name, ',' ORDER BY name) FROM system.workloads";
    run(p1, "CREATE WORKLOAD all").expect("create all");
    // Answered once it holds on the node that ran it.
    assert_eq!(run(p1, names).as_deref(), Ok("all"));
    run(p1, "CREATE WORKLOAD prod IN all SETTINGS weight = 3").expect("create prod");
    for port in [p2, p3] {
        says(port, names, "all,prod");
    }

    // Races: the same name, three definitions, on the three nodes at once; five rounds.
    for round in 0..5 {
        let racers: Vec<_> = [p1, p2, p3]
            .into_iter()
            .enumerate()
            .map(|(i, port)| {
                std::thread::spawn(move || {
                    run(
                        port,
                        &format!("CREATE WORKLOAD dev{round} IN all SETTINGS priority = {i}"),
                    )
                })
            })
            .collect();
        let results: Vec<_> = racers
            .into_iter()
            .map(|r| r.join().expect("racer"))
            .collect();
        let won = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "round {round}: {results:?}");
        for refused in results.iter().filter_map(|r| r.clone().err()) {
            assert!(
                refused.contains(&format!("'dev{round}' already exists")),
                "{refused}"
            );
        }
    }
    let all = "all,dev0,dev1,dev2,dev3,dev4,prod";
    let catalog = "SELECT string_agg(create_query, '; ' ORDER BY name) FROM system.workloads";
    let on_n1 = {
        says(p1, names, all);
        run(p1, catalog).expect("catalog")
    };
    for port in [p2, p3] {
        says(port, catalog, &on_n1);
    }

    // A node that joins later starts with the fleet's catalog; a DROP reaches it.
    let (_n4, p4) = start(dir.path(), &etcd, "n4", 5);
    says(p4, catalog, &on_n1);
    run(p3, "DROP WORKLOAD dev0").expect("drop");
    for port in [p1, p2, p4] {
        says(port, names, "all,dev1,dev2,dev3,dev4,prod");
    }
}

//! Crash safety of the catalog on disk: `sluice apply` runs a long stream of DDL against a data
//! dir and is killed with SIGKILL at random moments, many times. Every time, the data dir must
//! load, and equal the state after some prefix of the stream — at least every statement the
//! process acknowledged (printed `OK` for), at most one more (persisted, not yet acknowledged).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_catalog::{Catalog, DiskStorage};
use sluice_sql::parse_statement;

/// xorshift64*: deterministic, dependency-free randomness for the stream and the kill times.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Canonical text of a catalog's state: every entity's create_query, by name.
fn state(c: &Catalog) -> Vec<String> {
    c.entities().map(|s| s.entity.create_query()).collect()
}

/// A stream of statements that all succeed in order, mixing creates, replaces (settings and
/// parents change) and drops, with the state after each prefix.
fn stream(rng: &mut Rng, len: usize) -> (Vec<String>, Vec<Vec<String>>) {
    let mut catalog = Catalog::new();
    let mut statements = Vec::new();
    let mut states = vec![state(&catalog)];
    let push = |sql: String, catalog: &mut Catalog, out: &mut Vec<String>| -> bool {
        let Ok(stmt) = parse_statement(&sql) else {
            return false;
        };
        match catalog.apply(&stmt) {
            Ok((next, Some(_))) => {
                *catalog = next;
                out.push(sql);
                true
            }
            _ => false,
        }
    };
    for sql in [
        "CREATE RESOURCE io (READ DISK d, WRITE DISK d)",
        "CREATE RESOURCE q (QUERY)",
        "CREATE RESOURCE mem (MEMORY RESERVATION)",
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 10",
    ] {
        assert!(
            push(sql.to_string(), &mut catalog, &mut statements),
            "{sql}"
        );
        states.push(state(&catalog));
    }
    let settings = [
        "weight = 2",
        "priority = 1",
        "priority = -1, weight = 3",
        "max_concurrent_queries = 4",
        "max_io_requests = 7 FOR io",
        "max_memory = '1Gi', precedence = 2",
        "max_queries_per_second = 5, max_burst_queries = 9",
    ];
    let mut next_id = 0;
    while statements.len() < len {
        let workloads: Vec<String> = catalog.workloads().map(|w| w.name.clone()).collect();
        let pick = |rng: &mut Rng| workloads[rng.below(workloads.len() as u64) as usize].clone();
        let setting = settings[rng.below(settings.len() as u64) as usize];
        let sql = match rng.below(10) {
            0..=3 => {
                next_id += 1;
                format!(
                    "CREATE WORKLOAD w{next_id} IN {} SETTINGS {setting}",
                    pick(rng)
                )
            }
            4..=6 => format!(
                "CREATE OR REPLACE WORKLOAD {} IN {} SETTINGS {setting}",
                pick(rng),
                pick(rng)
            ),
            7 | 8 => format!("DROP WORKLOAD {}", pick(rng)),
            _ => {
                next_id += 1;
                if rng.below(2) == 0 {
                    format!("CREATE RESOURCE r{next_id} (WRITE DISK d{next_id})")
                } else {
                    let r = catalog
                        .resources()
                        .map(|r| r.name.clone())
                        .find(|n| n.starts_with('r'));
                    format!("DROP RESOURCE {}", r.unwrap_or_else(|| "none".into()))
                }
            }
        };
        if push(sql, &mut catalog, &mut statements) {
            states.push(state(&catalog));
        }
    }
    (statements, states)
}

fn loaded_state(dir: &Path) -> Vec<String> {
    let storage = DiskStorage::open(dir).expect("open data dir");
    match storage.load(Catalog::new()) {
        Ok(c) => state(&c),
        Err(e) => panic!("data dir does not load after a crash: {e}"),
    }
}

fn run_apply(dir: &Path, script: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("apply")
        .arg("--data-dir")
        .arg(dir)
        .arg(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sluice apply")
}

#[test]
fn sigkill_during_ddl_leaves_a_prefix_state() {
    let mut rng = Rng(0x5EED_CAFE_F00D_0001);
    let (statements, states) = stream(&mut rng, 400);
    let work = tempfile::tempdir().expect("tempdir");
    let script = work.path().join("stream.sql");
    std::fs::write(&script, statements.join(";\n") + ";\n").expect("write stream");

    // One undisturbed run tells how long the stream takes on this machine.
    let full = work.path().join("full");
    let started = Instant::now();
    let status = run_apply(&full, &script).wait().expect("wait");
    let duration = started.elapsed();
    assert!(status.success());
    assert_eq!(loaded_state(&full), states[states.len() - 1]);

    let rounds = 40;
    let mut interrupted = 0;
    for round in 0..rounds {
        let dir = work.path().join(format!("round{round}"));
        let mut child = run_apply(&dir, &script);
        let delay = Duration::from_micros(rng.below(duration.as_micros() as u64 + 1));
        std::thread::sleep(delay);
        child.kill().ok(); // SIGKILL
        child.wait().expect("wait");
        let mut out = String::new();
        child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut out)
            .expect("read stdout");
        let acked = out.lines().filter(|l| *l == "OK").count();
        if acked < statements.len() {
            interrupted += 1;
        }
        if !dir.join("workloads").exists() {
            assert_eq!(acked, 0);
            continue;
        }
        let got = loaded_state(&dir);
        let k = states.iter().position(|s| *s == got).unwrap_or_else(|| {
            panic!("round {round}: the loaded state is no prefix state:\n{got:#?}")
        });
        // States can repeat (a drop undoing a create); accept any matching k in the window.
        let in_window = (acked..=(acked + 1).min(statements.len())).any(|j| states[j] == got);
        assert!(in_window, "round {round}: {acked} statements acknowledged, but the data dir holds the state after {k}");
    }
    eprintln!(
        "{interrupted} of {rounds} kills landed mid-stream ({} statements, full run {duration:?})",
        statements.len()
    );
    // The kill times must actually land mid-stream for the test to mean anything.
    assert!(
        interrupted >= rounds / 4,
        "only {interrupted} of {rounds} rounds interrupted the stream"
    );
}

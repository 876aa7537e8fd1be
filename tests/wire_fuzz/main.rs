//! Wire-protocol fuzzing against a live server (issue 38), in both modes: `sluice serve` on
//! the embedded engine, and in front of a real PostgreSQL. Each case is a seed from
//! `seeds/` changed at random (`mutate.rs`): frontend message sequences — startup, the SCRAM
//! exchange, Query, Parse/Bind/Describe/Execute/Sync, CopyData, CancelRequest — with messages
//! bent, lied about, cut or repeated and the connection ended at any point. The upstream
//! mode's server offers TLS: cases that begin by asking for it run inside it, or send a
//! ClientHello cut short or bent (the embedded server refuses TLS, so the same cases go on
//! in the clear there). After every case:
//!
//! - the server process is alive and has reported no panic (no crash, not even one that
//!   ends only its connection's task);
//! - nothing is left in flight: `system.scheduler` shows no request holding or waiting for a
//!   slot, and `system.processes` no statement of the fuzzing user, within 15 s (the user's
//!   `max_execution_time` is 5 s, so a slow statement a case left behind ends by then);
//! - a fresh client logs in and gets `SELECT 1` answered (no hang).
//!
//! The server's RSS is sampled after the first cases and at the end: it must stay flat.
//!
//! Knobs: `SLUICE_WIRE_FUZZ_SECS` (each mode; default 30), `SLUICE_WIRE_FUZZ_SEED` (the
//! run's seed; default from the clock, printed; with `CI=true` a fixed one), `SLUICE_WIRE_FUZZ_REPLAY=FILE` (runs one
//! case as written, e.g. a failure's, over and over for the run's time). A failing case is written to
//! `$CARGO_TARGET_TMPDIR/wire-fuzz/` as text `case.rs` reads. The long runs (10 minutes each)
//! are in BENCHMARKS.md, "Wire fuzzing".

#[path = "../common/mod.rs"]
mod common;

mod case;
mod client;
mod mutate;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use case::Case;
use client::Target;
use mutate::Rng;
use sluice_testpg::{Auth, Postgres};

/// The catalog both servers run: a QUERY resource, a small tree whose limits bind (two
/// statements at a time for the fuzzing user's workload, a rate and one slot for another).
const CATALOG: &str = "
CREATE RESOURCE query (QUERY);
CREATE WORKLOAD all SETTINGS max_concurrent_queries = 4;
CREATE WORKLOAD fuzz IN all SETTINGS max_concurrent_queries = 2, max_waiting_queries = 4;
CREATE WORKLOAD fuzz_fast IN all SETTINGS priority = -1;
CREATE WORKLOAD fuzz_slow IN all SETTINGS max_concurrent_queries = 1, max_queries_per_second = 50, max_burst_queries = 5;
";

/// Cases after which the server's RSS is taken as its level (the caches warm).
const WARM_CASES: u64 = 100;

const FUZZ_PASSWORD: &str = "fuzz-pw";
const ADMIN_PASSWORD: &str = "admin-pw";

fn seeds() -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/wire_fuzz/seeds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the seed corpus")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seed"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).expect("a seed");
            Case::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        })
        .collect()
}

fn sluice(args: &[&str], stdin: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("runs sluice");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("writes");
    let out = child.wait_with_output().expect("sluice ends");
    assert!(out.status.success(), "sluice {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The server's config: the fuzzing user (a workload of its own, statements stopped after
/// 5 s) and an admin who watches; with `tls`, a certificate of its own (made here), so that
/// an SSLRequest is accepted.
fn config(
    dir: &Path,
    port: u16,
    fuzz_scram: &str,
    admin_scram: &str,
    upstream: Option<&str>,
    tls: bool,
) -> PathBuf {
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n\
         [[users]]\nname = \"fuzz\"\nscram = \"{fuzz_scram}\"\ndefault_workload = \"fuzz\"\nmax_execution_time = 5\n\n\
         [[users]]\nname = \"admin\"\nscram = \"{admin_scram}\"\nadmin = true\n"
    );
    if let Some(url) = upstream {
        text.push_str(&format!("\n[upstream]\nurl = \"{url}\"\n"));
    }
    if tls {
        let (cert, key) = common::test_certificate(dir);
        text.push_str(&format!(
            "\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        ));
    }
    let path = dir.join("sluice.toml");
    std::fs::write(&path, text).expect("writes the config");
    let data = dir.join("data");
    sluice(
        &["apply", "--data-dir", data.to_str().expect("utf-8"), "-"],
        CATALOG,
    );
    path
}

/// Where failing cases (and ones that took much memory) are written.
fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wire-fuzz");
    std::fs::create_dir_all(&dir).expect("artifact dir");
    dir
}

/// A case's text with each line cut to 160 characters (a huge statement shows its start).
fn shortened(case: &Case) -> String {
    case.text()
        .lines()
        .map(|l| format!("{}\n", &l[..l.len().min(160)]))
        .collect()
}

/// Waits (≤ 15 s) until nothing is in flight; Err names what stayed.
async fn settled(watcher: &tokio_postgres::Client) -> Result<(), String> {
    let began = Instant::now();
    loop {
        let left = watcher
            .query(
                "SELECT path, inflight_requests, queue_length FROM system.scheduler \
                 WHERE inflight_requests > 0 OR queue_length > 0",
                &[],
            )
            .await
            .map_err(|e| format!("the watcher's query of system.scheduler failed: {e}"))?;
        let running = watcher
            .query(
                "SELECT query FROM system.processes WHERE user = 'fuzz'",
                &[],
            )
            .await
            .map_err(|e| format!("the watcher's query of system.processes failed: {e}"))?;
        if left.is_empty() && running.is_empty() {
            return Ok(());
        }
        if began.elapsed() > Duration::from_secs(15) {
            let slots: Vec<String> = left
                .iter()
                .map(|r| {
                    format!(
                        "{} in flight {:?} queued {:?}",
                        r.get::<_, String>(0),
                        r.get::<_, Option<i64>>(1),
                        r.get::<_, Option<i64>>(2)
                    )
                })
                .collect();
            let statements: Vec<String> = running.iter().map(|r| r.get::<_, String>(0)).collect();
            return Err(format!(
                "15 s after the case: {slots:?}, statements {statements:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Fuzzes the server listening on `port` (process `server`) for the configured time.
/// The seed of the CI run (see `fuzz`).
const CI_SEED: u64 = 20_261_206;

async fn fuzz(mode: &str, server: &mut common::Server, port: u16) {
    let addr = format!("127.0.0.1:{port}").parse().expect("address");
    let target = std::sync::Arc::new(Target::new(addr, "fuzz", "fuzz", FUZZ_PASSWORD));
    let watcher = common::client(&format!(
        "host=127.0.0.1 port={port} user=admin password={ADMIN_PASSWORD} dbname=fuzz"
    ))
    .await;
    let secs: u64 = std::env::var("SLUICE_WIRE_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    // CI runs one fixed seed (a run that fails there fails for whoever reruns it; finding
    // new cases is the long runs' job); elsewhere each run explores anew.
    let seed: u64 = std::env::var("SLUICE_WIRE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| match std::env::var("CI").as_deref() {
            Ok("true") => CI_SEED,
            _ => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64),
        });
    let replay = std::env::var_os("SLUICE_WIRE_FUZZ_REPLAY");
    let corpus = match &replay {
        Some(file) => {
            vec![Case::parse(&std::fs::read_to_string(file).expect("the case")).expect("a case")]
        }
        None => seeds(),
    };
    eprintln!("[{mode}] seed {seed}, {secs} s, {} seeds", corpus.len());
    let pid = server.0.id();
    let began = Instant::now();
    let mut warm_rss = None;
    let mut peak_rss: f64 = 0.0;
    let mut cases = 0u64;
    let (mut closed_by_server, mut errors, mut encrypted) = (0u64, 0u64, 0u64);
    while cases == 0 || began.elapsed() < Duration::from_secs(secs) {
        let mut rng = Rng::new(seed ^ cases.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let case = if replay.is_some() {
            corpus[0].clone()
        } else if cases < corpus.len() as u64 {
            corpus[cases as usize].clone()
        } else {
            mutate::case(&corpus, &mut rng)
        };
        let outcome = client::run(&target, &case, &mut rng, Duration::from_millis(250)).await;
        if replay.is_some() && cases == 0 {
            eprintln!("[{mode}] the server answered: {outcome:?}");
        }
        let mut failure = match &outcome {
            Ok(seen) => {
                closed_by_server += u64::from(seen.closed);
                encrypted += u64::from(seen.encrypted);
                errors += seen.errors.len() as u64;
                seen.broken
                    .as_ref()
                    .filter(|_| {
                        !case
                            .steps
                            .iter()
                            .any(|s| case::single_byte_requests(&s.bytes().unwrap_or_default()) > 0)
                    })
                    .map(|b| format!("the server sent bytes that are not a message: {b}"))
            }
            Err(e) => Some(format!("could not connect: {e}")),
        };
        if failure.is_none() {
            if let Ok(Some(status)) = server.0.try_wait() {
                failure = Some(format!("the server exited: {status}"));
            }
        }
        if failure.is_none() {
            // A panic that ends only its connection leaves the server up (and, with
            // RUST_BACKTRACE set, costs a symbolized backtrace's memory): still a crash.
            let panics = server.panics();
            if !panics.is_empty() {
                failure = Some(format!("the server panicked:\n{}", panics.join("\n")));
            }
        }
        if failure.is_none() {
            failure = settled(&watcher).await.err();
        }
        if failure.is_none() {
            failure = client::answers(&target, &mut rng).await.err();
        }
        if let Some(failure) = failure {
            let file = artifacts().join(format!("{mode}-{seed}-{cases}.case"));
            std::fs::write(&file, case.text()).expect("writes the case");
            panic!(
                "[{mode}] case {cases} (seed {seed}): {failure}\nthe case, in {}:\n{}\nreplay: SLUICE_WIRE_FUZZ_REPLAY={} cargo test --test wire_fuzz {mode}",
                file.display(),
                shortened(&case),
                file.display()
            );
        }
        let rss = common::status_mb(pid, "VmRSS:");
        if std::env::var_os("SLUICE_WIRE_FUZZ_TRACE").is_some() {
            let sizes: Vec<usize> = case
                .steps
                .iter()
                .map(|s| s.bytes().map_or(0, |b| b.len()))
                .collect();
            eprintln!(
                "[{mode}] case {cases} at {:.1} s: RSS {rss:.0} MB, bytes {sizes:?}",
                began.elapsed().as_secs_f64()
            );
        }
        if rss > peak_rss + 100.0 && cases > 0 {
            // What took the memory, shortened (a huge statement shows its start).
            let file = artifacts().join(format!("{mode}-{seed}-{cases}-rss.case"));
            std::fs::write(&file, case.text()).expect("writes the case");
            let text = shortened(&case);
            eprintln!(
                "[{mode}] case {cases} took RSS from {peak_rss:.0} to {rss:.0} MB ({}):\n{text}",
                file.display()
            );
        }
        peak_rss = peak_rss.max(rss);
        cases += 1;
        if cases == WARM_CASES {
            warm_rss = Some(rss);
        }
    }
    // Flat: once the last case's memory is given back (within seconds, as after any big
    // statement: tests/memory.rs), RSS is near where it was after the first cases. A leak of
    // a few KB per case over thousands of cases would show; allocator noise and caches stay
    // within the bound.
    let bound = warm_rss.map(|warm| warm * 1.5 + 64.0);
    let ended = Instant::now();
    let mut end_rss = common::status_mb(pid, "VmRSS:");
    while bound.is_some_and(|b| end_rss >= b) && ended.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        end_rss = common::status_mb(pid, "VmRSS:");
    }
    eprintln!(
        "[{mode}] {cases} cases in {:.0} s ({:.0}/s): 0 crashes, 0 hangs, 0 left in flight; {encrypted} inside TLS, {closed_by_server} connections closed by the server, {errors} errors answered; RSS after {WARM_CASES} cases {:.0} MB, peak {peak_rss:.0} MB, at the end {end_rss:.0} MB ({:.1} s after the last case)",
        began.elapsed().as_secs_f64(),
        cases as f64 / began.elapsed().as_secs_f64(),
        warm_rss.unwrap_or(0.0),
        ended.elapsed().as_secs_f64(),
    );
    if let (Some(warm), Some(bound)) = (warm_rss, bound) {
        assert!(
            end_rss < bound,
            "[{mode}] RSS grew from {warm:.0} MB (after {WARM_CASES} cases) to {end_rss:.0} MB over {cases} cases (10 s after the last)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_server_survives_wire_fuzzing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = common::free_port();
    let fuzz_scram = sluice(&["passwd"], FUZZ_PASSWORD);
    let admin_scram = sluice(&["passwd"], ADMIN_PASSWORD);
    // Without TLS: an SSLRequest is refused ('N') and the case goes on in the clear.
    let config = config(dir.path(), port, &fuzz_scram, &admin_scram, None, false);
    let mut server = common::start(dir.path(), &["--config", config.to_str().expect("utf-8")]);
    fuzz("embedded", &mut server, port).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_server_survives_wire_fuzzing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pg_dir = dir.path().join("pgroot");
    std::fs::create_dir(&pg_dir).expect("pg dir");
    let pg = Postgres::start(&pg_dir, "owner", Auth::Password("owner-pw".into()));
    pg.psql(&format!(
        "SET password_encryption = 'scram-sha-256'; CREATE ROLE fuzz LOGIN PASSWORD '{FUZZ_PASSWORD}'; CREATE ROLE admin LOGIN PASSWORD '{ADMIN_PASSWORD}'"
    ));
    pg.psql("CREATE DATABASE fuzz OWNER fuzz");
    // A table for COPY FROM STDIN cases to write into (seed `copy_in`, and the mutator's).
    common::psql_at(
        pg.port,
        "fuzz",
        "fuzz",
        Some(FUZZ_PASSWORD),
        &["CREATE TABLE sink (a int, b text)"],
    );
    // Errors are the point here: PostgreSQL logging each with its statement (8 MB ones
    // among them) would fill the disk over a long run.
    pg.psql("ALTER SYSTEM SET log_min_error_statement = 'panic'");
    pg.psql("ALTER SYSTEM SET log_min_messages = 'fatal'");
    pg.psql("SELECT pg_reload_conf()");
    // sluice's users carry the roles' own verifiers, so it logs in upstream as them.
    let verifier = |role: &str| {
        pg.psql(&format!(
            "SELECT rolpassword FROM pg_authid WHERE rolname = '{role}'"
        ))
        .trim()
        .to_string()
    };
    let port = common::free_port();
    let url = format!("postgres://owner:owner-pw@127.0.0.1:{}/fuzz", pg.port);
    let config = config(
        dir.path(),
        port,
        &verifier("fuzz"),
        &verifier("admin"),
        Some(&url),
        // With TLS: an SSLRequest is accepted, and a case that asks for TLS first runs inside
        // it (or spoils the handshake); one that sends its startup after an accepted
        // SSLRequest gives the TLS layer garbage.
        true,
    );
    let mut server = common::start(dir.path(), &["--config", config.to_str().expect("utf-8")]);
    fuzz("upstream", &mut server, port).await;
}

//! A bounded loopback load test: 200 real clients for 30 s (`SLUICE_LOAD_SECS` to change)
//! against a tree with `max_concurrent_queries = 8`. The server's own registry is sampled
//! continuously (a thread of its own): never more than 8 statements run at once. Every query is answered
//! exactly once (rows, or 57014 for the ones a client cancels on purpose), and afterwards the
//! schedulers hold nothing and queue nothing.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;
use tokio_postgres::NoTls;

const CLIENTS: usize = 200;
const CAP: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_clients_never_exceed_eight_running_and_nothing_leaks() {
    let seconds: u64 = std::env::var("SLUICE_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let (_dir, server, admin) = started_with(
        &format!(
            "CREATE RESOURCE q (QUERY); \
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = {CAP}; \
             CREATE WORKLOAD fast IN all SETTINGS priority = 0; \
             CREATE WORKLOAD slow IN all SETTINGS priority = 1; \
             CREATE WORKLOAD batch IN slow SETTINGS weight = 3; \
             CREATE WORKLOAD adhoc IN slow"
        ),
        false,
    )
    .await;
    let workloads = ["fast", "batch", "adhoc"];

    // The sampler: statements admitted and not finished, straight from the server's registry.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (shared, stop, peak, samples) = (
            server.shared.clone(),
            stop.clone(),
            peak.clone(),
            samples.clone(),
        );
        // A thread of its own, so a busy runtime cannot starve it.
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let running = shared
                    .registry
                    .all()
                    .iter()
                    .filter(|p| p.running && workloads.contains(&&*p.workload))
                    .count();
                peak.fetch_max(running, Ordering::Relaxed);
                samples.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };

    let sent = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicU64::new(0));
    let cancelled = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut clients = Vec::new();
    for id in 0..CLIENTS {
        let (sent, answered, cancelled) = (sent.clone(), answered.clone(), cancelled.clone());
        let port = server.port;
        clients.push(tokio::spawn(async move {
            let client = connect(&format!("host=127.0.0.1 port={port} user=load{id} dbname=x"))
                .await
                .expect("connects");
            let workload = workloads[id % workloads.len()];
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let sql = format!("SELECT {id} AS client, {n} AS n, pg_sleep(0.002) SETTINGS workload = '{workload}'");
                sent.fetch_add(1, Ordering::Relaxed);
                // One client in ten cancels every fifth query of its own, waiting or running.
                // A cancel request races with its query (as in Postgres): one that arrives
                // after the query ended may stop a later statement of the same connection.
                // So these clients accept 57014 on any statement; the others never see it.
                let cancelling = id % 10 == 0;
                let canceller = (cancelling && n % 5 == 0).then(|| {
                    let token = client.cancel_token();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        let _ = token.cancel_query(NoTls).await;
                    })
                });
                let result = client.simple_query(&sql).await;
                if let Some(canceller) = canceller {
                    let _ = canceller.await;
                }
                let rows = match result {
                    Ok(rows) => rows,
                    Err(e) if cancelling && sqlstate(&e) == "57014" => {
                        cancelled.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => panic!("client {id}, query {n}: {e}"),
                };
                let row = rows
                    .iter()
                    .find_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                        _ => None,
                    })
                    .expect("one row");
                // Its own answer, not another query's.
                assert_eq!(row.get(0), Some(id.to_string().as_str()));
                assert_eq!(row.get(1), Some(n.to_string().as_str()));
                answered.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for c in clients {
        c.await.expect("client task");
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");

    let (sent, answered, cancelled) = (
        sent.load(Ordering::Relaxed),
        answered.load(Ordering::Relaxed),
        cancelled.load(Ordering::Relaxed),
    );
    let peak = peak.load(Ordering::Relaxed);
    eprintln!(
        "load: {sent} queries in {seconds} s ({answered} answered, {cancelled} cancelled), \
         peak running {peak}, {} samples",
        samples.load(Ordering::Relaxed)
    );
    assert_eq!(
        answered + cancelled,
        sent,
        "every query answered exactly once"
    );
    assert!(peak <= CAP, "peak concurrency {peak} > {CAP}");
    assert!(
        peak >= CAP / 2,
        "the load never filled the slots (peak {peak})"
    );
    assert!(answered > CLIENTS as u64, "every client got answers");
    assert_nothing_held(&admin).await;
    assert_eq!(
        column(&admin, "SELECT count(*) FROM system.processes").await,
        ["1"],
        "only the probe itself"
    );
    server.stop().await;
}

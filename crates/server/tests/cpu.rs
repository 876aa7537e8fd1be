//! CPU slots over the wire (`MASTER THREAD` / `WORKER THREAD`, reference §4.8): a statement
//! waits for its master thread, takes worker threads only while they are free, and runs at
//! the parallelism it holds; `max_concurrent_threads` is never exceeded; the slots move with
//! the statement and come back when it ends.

mod support;

use std::time::Duration;

use support::*;
use tokio_postgres::SimpleQueryMessage;

/// Held by each test that measures how CPU time is shared or throttled: on a 2-core machine,
/// two such tests running at once (the test harness runs a file's tests in parallel) take
/// each other's cores and skew what both measure.
static MEASURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Slots held under `/all/semaphore` of the CPU tree, as `system.scheduler` shows them.
const HELD: &str = "SELECT inflight_requests FROM system.scheduler \
                    WHERE resource = 'cpu' AND path = '/all/semaphore'";

/// The plan text of `EXPLAIN sql`.
async fn plan(client: &tokio_postgres::Client, sql: &str) -> String {
    let rows = client
        .simple_query(&format!("EXPLAIN {sql}"))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(1).unwrap_or("").to_string()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const GROUPED: &str = "SELECT g, sum(x) FROM t GROUP BY g";

#[tokio::test]
async fn cpu_slots_cap_threads_and_set_each_statements_parallelism() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
         CREATE WORKLOAD all SETTINGS max_concurrent_threads = 3;
         CREATE WORKLOAD w IN all;
         CREATE WORKLOAD other IN all SETTINGS max_concurrent_threads = 3;
         CREATE TABLE t (g INT, x INT);
         INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)",
        false,
    )
    .await;
    // Nothing held: a statement gets every thread it asks for, up to the cap.
    let client = server.client().await;
    let free = plan(
        &client,
        &format!("{GROUPED} SETTINGS workload = 'w', max_threads = 8"),
    )
    .await;
    assert!(
        free.contains("Hash([g@0], 3)"),
        "three slots, three partitions: {free}"
    );
    assert_eq!(column(&admin, HELD).await, ["0"], "given back at the end");

    // A holds its master and one worker (max_threads = 2).
    let a = spawn_query(
        &server,
        "SELECT sluice_barrier('a') SETTINGS workload = 'w', max_threads = 2",
    )
    .await;
    until(&admin, HELD, "2").await;
    assert_eq!(
        column(
            &admin,
            "SELECT threads FROM system.processes WHERE query LIKE '%sluice_barrier(''a'')%'"
        )
        .await,
        ["2"],
        "system.processes shows the slots it holds"
    );
    // One slot is left: a statement asking for eight runs on one, serially.
    let serial = plan(
        &client,
        &format!("{GROUPED} SETTINGS workload = 'w', max_threads = 8"),
    )
    .await;
    assert!(
        !serial.contains("RepartitionExec"),
        "one slot, one partition: {serial}"
    );

    // B takes the last one; C waits for a master thread.
    let b = spawn_query(
        &server,
        "SELECT sluice_barrier('b') SETTINGS workload = 'other', max_threads = 1",
    )
    .await;
    until(&admin, HELD, "3").await;
    let c = spawn_query(
        &server,
        "EXPLAIN SELECT g, sum(x) FROM t GROUP BY g SETTINGS workload = 'w'",
    )
    .await;
    until_waiting(&admin, 1).await;
    assert_eq!(waiting_for(&admin).await, ["cpu"]);
    assert_eq!(column(&admin, HELD).await, ["3"], "the cap holds");
    // ClickHouse's live columns: the full semaphore is unsatisfied and so inactive while C
    // waits below it (its child, with C pending, is active); C's queue holds one request of
    // cost 1 (budget: exact costs, 0); the root has dequeued recently.
    let live = |sql: &'static str| column(&admin, sql);
    assert_eq!(
        live("SELECT is_satisfied || ' ' || is_active || ' ' || active_children FROM system.scheduler WHERE resource = 'cpu' AND path = '/all/semaphore'").await,
        ["0 0 1"]
    );
    assert_eq!(
        live("SELECT queue_cost || ' ' || budget || ' ' || is_active FROM system.scheduler WHERE resource = 'cpu' AND path LIKE '%/w/fifo'").await,
        ["1 0 1"]
    );
    assert_eq!(
        live(
            "SELECT throughput > 0 FROM system.scheduler WHERE resource = 'cpu' AND path = '/all'"
        )
        .await,
        ["t"]
    );

    // use_concurrency_control = 0 bypasses the slots: no wait, its own max_threads.
    let bypass = tokio::time::timeout(
        Duration::from_secs(10),
        plan(
            &client,
            &format!(
                "{GROUPED} SETTINGS workload = 'w', use_concurrency_control = 0, max_threads = 5"
            ),
        ),
    )
    .await
    .expect("does not wait");
    assert!(bypass.contains("Hash([g@0], 5)"), "{bypass}");

    // A moves to `other` with both its slots: `other`'s own cap counts them beside B's, and
    // the shared cap never sees them leave.
    let other = "SELECT inflight_requests FROM system.scheduler \
                 WHERE resource = 'cpu' AND path LIKE '%/other/semaphore'";
    assert_eq!(column(&admin, other).await, ["1"]);
    column(
        &admin,
        "MOVE QUERY WHERE query LIKE '%sluice_barrier(''a'')%' TO WORKLOAD other",
    )
    .await;
    assert_eq!(column(&admin, other).await, ["3"]);
    assert_eq!(column(&admin, HELD).await, ["3"]);

    // A ends: its two slots go to C (master, then the one free worker; it wanted three).
    server.barriers.open("a");
    a.await.expect("task").expect("a");
    let c = c.await.expect("task").expect("c");
    let c_plan: Vec<String> = c
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(1).unwrap_or("").to_string()),
            _ => None,
        })
        .collect();
    assert!(
        c_plan.join("\n").contains("Hash([g@0], 2)"),
        "two slots free when it started: {c_plan:?}"
    );
    server.barriers.open("b");
    b.await.expect("task").expect("b");
    assert_nothing_held(&admin).await;
    server.stop().await;
}

/// Weights 3:1 under one CPU slot: two saturating workloads get their slot grants, and with
/// equal statements their CPU time, 3:1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_weights_share_slot_grants_three_to_one() {
    let _measuring = MEASURING.lock().await;
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
         CREATE WORKLOAD all SETTINGS max_concurrent_threads = 1;
         CREATE WORKLOAD etl IN all SETTINGS weight = 3;
         CREATE WORKLOAD adhoc IN all SETTINGS weight = 1",
        false,
    )
    .await;
    let per_workload = 6;
    let run_for = Duration::from_secs(4);
    let mut tasks = Vec::new();
    for workload in ["etl", "adhoc"] {
        for _ in 0..per_workload {
            let client = server.client().await;
            let sql = format!(
                "SELECT sum(generate_series % 7) FROM generate_series(1, 20000) \
                 SETTINGS workload = '{workload}'"
            );
            tasks.push(tokio::spawn(async move {
                let start = tokio::time::Instant::now();
                let mut done = 0u64;
                while start.elapsed() < run_for {
                    client.simple_query(&sql).await.expect("runs");
                    done += 1;
                }
                (workload, done)
            }));
        }
    }
    // Judged over a window where both are backlogged (not while clients connect or stop).
    let grants = || async {
        let rows = column(
            &admin,
            "SELECT dequeued_requests FROM system.scheduler WHERE resource = 'cpu' \
             AND type = 'fifo' ORDER BY path",
        )
        .await;
        // Paths sort adhoc before etl.
        let n = |i: usize| rows[i].parse::<f64>().expect("number");
        (n(0), n(1))
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (adhoc_before, etl_before) = grants().await;
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let (adhoc_after, etl_after) = grants().await;
    for task in tasks {
        task.await.expect("task");
    }
    let (adhoc, etl) = (adhoc_after - adhoc_before, etl_after - etl_before);
    let grants = [adhoc, etl];
    assert!(adhoc >= 20.0, "enough grants to judge: {grants:?}");
    let ratio = etl / adhoc;
    eprintln!("slot grants etl:adhoc = {etl}:{adhoc} = {ratio:.3}");
    assert!(
        (2.7..=3.3).contains(&ratio),
        "3:1 within 10%: {etl}:{adhoc} = {ratio}"
    );
    assert_nothing_held(&admin).await;
    server.stop().await;
}

/// A server with `cpu_slot_preemption` on (10 ms quanta) and `ddl` applied.
async fn preemptive(ddl: &str) -> (tempfile::TempDir, TestServer, tokio_postgres::Client) {
    preemptive_with(ddl, 1000).await
}

/// The same, with worker slots given up after `timeout_ms` preempted.
async fn preemptive_with(
    ddl: &str,
    timeout_ms: u64,
) -> (tempfile::TempDir, TestServer, tokio_postgres::Client) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_with(sluice_server::ServerOptions {
        cpu_slots: sluice_server::CpuSlotOptions {
            preemption: true,
            quantum_ns: 10_000_000,
            preemption_timeout_ms: timeout_ms,
        },
        ..test_options(dir.path())
    })
    .await;
    let admin = server.client().await;
    admin.batch_execute(ddl).await.expect("ddl");
    (dir, server, admin)
}

/// CPU nanoseconds charged to each leaf's queue so far (renewals cost what the quantum used,
/// measured on the thread CPU clock), in path order.
async fn charged(admin: &tokio_postgres::Client) -> Vec<f64> {
    column(
        admin,
        "SELECT dequeued_cost FROM system.scheduler WHERE resource = 'cpu' AND type = 'fifo' ORDER BY path",
    )
    .await
    .iter()
    .map(|v| v.parse().expect("number"))
    .collect()
}

/// With preemption, one long statement per workload under one CPU slot: the slot changes
/// hands every quantum, so weights 3:1 give CPU time (not statement counts) 3:1 — without it,
/// whoever took the slot first would hold it to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_statements_share_cpu_time_by_weight() {
    let _measuring = MEASURING.lock().await;
    let (_dir, server, admin) = preemptive(
        "CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
         CREATE WORKLOAD all SETTINGS max_concurrent_threads = 1;
         CREATE WORKLOAD etl IN all SETTINGS weight = 3;
         CREATE WORKLOAD adhoc IN all SETTINGS weight = 1",
    )
    .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for workload in ["etl", "adhoc"] {
        let client = server.client().await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let sql = format!(
                "SELECT sum(g % 7) FROM generate_series(1, 10000000) AS t(g) SETTINGS workload = '{workload}'"
            );
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                client.simple_query(&sql).await.expect("runs");
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let before = charged(&admin).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = charged(&admin).await;
    // Paths sort adhoc before etl.
    let (adhoc, etl) = (after[0] - before[0], after[1] - before[1]);
    let ratio = etl / adhoc;
    eprintln!(
        "CPU time etl:adhoc = {:.0} ms : {:.0} ms = {ratio:.3}",
        etl / 1e6,
        adhoc / 1e6
    );
    assert!(adhoc > 50e6, "both ran: {adhoc} ns");
    // Statement boundaries pull the ratio toward 1:1, by design and not by noise: while one
    // workload's next statement is on its way the other has the slot alone, and a statement's
    // last partial quantum is never charged (it ends instead of renewing). With these
    // statements the ratio lands at 2.68–2.82 (8 runs on the 2-core machine, 2026-12-04);
    // without weights it would be 1, without preemption far from 3 either way.
    assert!((2.5..=3.3).contains(&ratio), "3:1 by CPU time: {ratio}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the last statements end")
            .expect("task");
    }
    assert_nothing_held(&admin).await;
    server.stop().await;
}

/// With preemption, `max_cpus` throttles the CPU time a workload consumes: a CPU-bound
/// statement gets a quarter of a core under `max_cpus = 0.25` (a quarter, not a half: the
/// tests beside it load this 2-core machine, and the statement must still want more than the
/// cap for the throttler to show).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_cpus_throttles_cpu_time() {
    let _measuring = MEASURING.lock().await;
    let (_dir, server, admin) = preemptive(
        "CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
         CREATE WORKLOAD all;
         CREATE WORKLOAD capped IN all SETTINGS max_cpus = 0.25, max_burst_cpu_seconds = 0.05",
    )
    .await;
    let client = server.client().await;
    let running = tokio::spawn(async move {
        client
            .simple_query(
                "SELECT sum(g % 7) FROM generate_series(1, 20000000) AS t(g) \
                 SETTINGS workload = 'capped', max_threads = 1",
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = charged(&admin).await[0];
    let window = Duration::from_millis(2500);
    tokio::time::sleep(window).await;
    let after = charged(&admin).await[0];
    let cores = (after - before) / 1e9 / window.as_secs_f64();
    eprintln!("CPU used under max_cpus = 0.25: {cores:.3} cores");
    // The bucket's bound: burst (0.05 s) + 0.25 × T, plus the quantum charged late.
    assert!(cores <= 0.25 + 0.07 / window.as_secs_f64(), "{cores} cores");
    assert!(cores >= 0.05, "it still runs: {cores} cores");
    let throttled = column(
        &admin,
        "SELECT throttling_us > 0 FROM system.scheduler WHERE resource = 'cpu' AND type = 'bandwidth_limit'",
    )
    .await;
    assert_eq!(throttled, ["t"]);
    running.abort();
    server.stop().await;
}

/// With preemption, a worker slot whose renewal waits longer than
/// `cpu_slot_preemption_timeout_ms` is given up (the statement downscales), while its master
/// slot waits as long as it takes: a low-priority statement holding both slots of the tree is
/// starved by two high-priority ones; once they are done it runs on, with one slot, to the
/// right answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_worker_slot_is_given_up_after_the_timeout() {
    let _measuring = MEASURING.lock().await;
    let (_dir, server, admin) = preemptive_with(
        "CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
         CREATE WORKLOAD all SETTINGS max_concurrent_threads = 2;
         CREATE WORKLOAD low IN all SETTINGS priority = 1;
         CREATE WORKLOAD high IN all SETTINGS priority = 0",
        200,
    )
    .await;
    let threads = "SELECT threads FROM system.processes WHERE workload = 'low'";
    // Each partition reads a series of its own. Over one series, the worker partition is fed
    // through a repartition whose input runs under the master's slot: while the master is
    // preempted the worker partition often waits for input, its slot given back idle (parked,
    // not preempted), and asked for again once the urgent statements are gone it is granted
    // at once and kept, by design (ClickHouse gives a parked thread's slot back too). That made
    // this test fail about one run in five (CI, 2026-12-06).
    let long = spawn_query(
        &server,
        "SELECT sum(g % 7) FROM (SELECT * FROM generate_series(1, 50000000) AS a(g) \
         UNION ALL SELECT * FROM generate_series(50000001, 100000000) AS b(g)) \
         SETTINGS workload = 'low', max_threads = 2",
    )
    .await;
    until(&admin, threads, "2").await;
    // The urgent statements run until killed, so the low statement's renewals wait as long
    // as the test says, however fast this machine runs them: fixed-size urgent statements
    // sometimes ended before the worker's renewal had waited 200 ms (CI, 2026-12-06).
    let mut urgent = Vec::new();
    for _ in 0..2 {
        urgent.push(
            spawn_query(
                &server,
                "SELECT sum(g % 7) FROM generate_series(1, 100000000000) AS t(g) \
                 SETTINGS workload = 'high', max_threads = 1",
            )
            .await,
        );
    }
    until(
        &admin,
        "SELECT count(*) FROM system.processes WHERE workload = 'high' AND state = 'running'",
        "2",
    )
    .await;
    // Both slots are theirs from here on (each renewal of theirs outranks the low one's):
    // five times the timeout is well past it on any machine.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let killed = column(&admin, "KILL QUERY WHERE workload = 'high' SYNC").await;
    assert_eq!(killed.len(), 2, "killed: {killed:?}");
    for query in urgent {
        tokio::time::timeout(Duration::from_secs(60), query)
            .await
            .expect("the urgent statements end")
            .expect("task")
            .expect_err("killed");
    }
    // Alone again, the long statement holds its master slot only: the worker slot it was
    // starved of for more than 200 ms is gone for good.
    let mut seen = Vec::new();
    for _ in 0..20 {
        seen.extend(column(&admin, threads).await);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        !seen.is_empty(),
        "the long statement must outlast the urgent ones; make it longer"
    );
    assert!(
        seen.iter().all(|t| t == "0" || t == "1"),
        "threads: {seen:?}"
    );
    assert!(seen.iter().any(|t| t == "1"), "threads: {seen:?}");
    let rows = tokio::time::timeout(Duration::from_secs(300), long)
        .await
        .expect("the long statement ends")
        .expect("task")
        .expect("runs");
    // sum of g % 7 for g in 1..=100,000,000: 14,285,714 full cycles of 21, then 1+2.
    let sum = rows.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    });
    assert_eq!(sum.as_deref(), Some("299999997"));
    assert_nothing_held(&admin).await;
    server.stop().await;
}

/// A statement that waited for its query slot goes on to take its master thread and its
/// worker threads once the slot is its, as one that found the slot free does: admission's
/// later steps follow a wait as they follow a slot taken at once.
#[tokio::test]
async fn a_statement_that_waited_for_its_query_slot_then_takes_its_threads() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE slots (QUERY);
         CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
         CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1, max_concurrent_threads = 4;
         CREATE WORKLOAD w IN all",
        false,
    )
    .await;
    let holder = spawn_query(&server, "SELECT pg_sleep(3) SETTINGS workload = 'w'").await;
    until_running(&admin, 1).await;
    let waiter = spawn_query(
        &server,
        "SELECT pg_sleep(2) SETTINGS workload = 'w', max_threads = 2",
    )
    .await;
    until_waiting(&admin, 1).await;
    assert_eq!(waiting_for(&admin).await, ["slots"]);
    holder.await.expect("task").expect("the holder finishes");
    until_running(&admin, 1).await;
    // Its master thread and one worker.
    until(&admin, HELD, "2").await;
    waiter.await.expect("task").expect("the waiter finishes");
    assert_nothing_held(&admin).await;
}

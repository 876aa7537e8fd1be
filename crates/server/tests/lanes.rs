//! Fast and slow lanes over the wire: a running query demoted at its soft deadline (moved with
//! what it holds, never restarted), the limits of both lanes after the move, the hard limit
//! told apart, learned lanes (kept across a restart, relearned), pins, and the query log.
//! Queries are held running with the test barrier, so what is asserted is the order of events,
//! not how long anything took.

mod support;

use support::*;

const LANES: &str = "CREATE RESOURCE q (QUERY);
     CREATE WORKLOAD all SETTINGS max_concurrent_queries = 4;
     CREATE WORKLOAD slow IN all SETTINGS max_concurrent_queries = 1;
     CREATE WORKLOAD fast IN all SETTINGS max_concurrent_queries = 1, demote_after = '1s', demote_to = 'slow', relearn_after = 2";

const REPORT: &str = "SELECT sluice_barrier('{gate}') AS report SETTINGS workload = 'fast'";

fn report(gate: &str) -> String {
    REPORT.replace("{gate}", gate)
}

/// Runs a report held at gate `gate`, sees it in `system.processes` as `want` (its workload
/// and state), then lets it finish.
async fn runs_in(server: &TestServer, admin: &tokio_postgres::Client, gate: &str, want: &str) {
    let run = spawn_query(server, &report(gate)).await;
    until(
        admin,
        &format!("SELECT workload || ' ' || state {WHERE_REPORT}"),
        want,
    )
    .await;
    server.barriers.open(gate);
    run.await.expect("task").expect("runs");
}

const WHERE_REPORT: &str = "FROM system.processes WHERE query LIKE 'SELECT sluice_barrier%'";

#[tokio::test]
async fn a_report_that_overruns_is_demoted_while_it_runs_and_learned_as_slow() {
    let (dir, server, admin) = started_with(LANES, false).await;
    let first = spawn_query(&server, &report("first")).await;
    // Admitted in fast; past 1 s it is moved to slow, still running, never restarted.
    until(
        &admin,
        &format!("SELECT workload || ' ' || state || ' ' || coalesce(demoted_from, '-') || ' ' || CAST(demoted_at IS NOT NULL AS VARCHAR) {WHERE_REPORT}"),
        "slow running fast true",
    )
    .await;
    assert_eq!(server.barriers.waiting("first"), 1, "the same run goes on");
    // fast's slot is free again; slow's one slot is the demoted query's.
    column(&admin, "SELECT 1 SETTINGS workload = 'fast'").await;
    let behind = spawn_query(&server, "SELECT 2 SETTINGS workload = 'slow'").await;
    until_waiting(&admin, 1).await;
    server.barriers.open("first");
    first
        .await
        .expect("task")
        .expect("the demoted report finishes");
    behind
        .await
        .expect("task")
        .expect("the slow query ran after it");

    // Logged as demoted, and its fingerprint learned.
    until(
        &admin,
        "SELECT initial_workload || ' ' || workload || ' ' || outcome FROM system.query_log WHERE query LIKE 'SELECT sluice_barrier%'",
        "fast slow demoted",
    )
    .await;
    let fingerprint = "SELECT fingerprint || ' ' || lane || ' ' || CAST(demotions AS VARCHAR) || ' ' || CAST(runs AS VARCHAR) FROM system.fingerprints WHERE sample_query LIKE 'SELECT sluice_barrier%'";
    let learned = column(&admin, fingerprint).await;
    let id = learned[0].split(' ').next().unwrap_or_default().to_string();
    assert_eq!(learned, [format!("{id} slow 1 1")]);

    // The next run, with other values, is admitted straight into slow.
    let second = spawn_query(&server, &report("second")).await;
    until(
        &admin,
        &format!(
            "SELECT workload || ' ' || state || ' ' || coalesce(demoted_from, '-') {WHERE_REPORT}"
        ),
        "slow running -",
    )
    .await;
    server.barriers.open("second");
    second.await.expect("task").expect("runs");
    server.stop().await;

    // Across a restart the lane holds.
    let server = TestServer::start(dir.path(), false).await;
    let admin = server.client().await;
    runs_in(&server, &admin, "third", "slow running").await;
    // relearn_after = 2: two runs in a row within the deadline, and it is fast again.
    server.barriers.open("quick");
    for _ in 0..2 {
        column(&admin, &report("quick")).await;
    }
    assert_eq!(
        column(
            &admin,
            "SELECT count(*) FROM system.fingerprints WHERE lane IS NOT NULL"
        )
        .await,
        ["0"]
    );
    runs_in(&server, &admin, "fourth", "fast running").await;

    // An operator pins it, and forgets it.
    admin
        .batch_execute(&format!("PIN FINGERPRINT '{id}' TO WORKLOAD slow"))
        .await
        .expect("pins");
    let pinned = "SELECT lane || ' ' || CAST(pinned AS VARCHAR) FROM system.fingerprints WHERE sample_query LIKE 'SELECT sluice_barrier%'";
    assert_eq!(column(&admin, pinned).await, ["slow true"]);
    let e = admin
        .batch_execute(&format!("PIN FINGERPRINT '{id}' TO WORKLOAD all"))
        .await
        .expect_err("not a leaf");
    assert_eq!(sqlstate(&e), "22023");
    admin
        .batch_execute(&format!("FORGET FINGERPRINT '{id}'"))
        .await
        .expect("forgets");
    // A pinned lane that is dropped is not used: the statement runs where it asked.
    admin
        .batch_execute(&format!(
            "CREATE WORKLOAD spare IN all; PIN FINGERPRINT '{id}' TO WORKLOAD spare; DROP WORKLOAD spare"
        ))
        .await
        .expect("pin, then drop the lane");
    runs_in(&server, &admin, "fifth", "fast running").await;
    admin
        .batch_execute(&format!("FORGET FINGERPRINT '{id}'"))
        .await
        .expect("forgets");
    let e = admin
        .batch_execute(&format!("FORGET FINGERPRINT '{id}'"))
        .await
        .expect_err("nothing left to forget");
    assert!(message(&e).contains("no lane"), "{}", message(&e));
    assert_nothing_held(&admin).await;
    server.stop().await;
}

#[tokio::test]
async fn the_hard_limit_fails_a_demoted_query_and_says_it_is_not_retried() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE q (QUERY);
         CREATE WORKLOAD all;
         CREATE WORKLOAD slow IN all;
         CREATE WORKLOAD fast IN all SETTINGS demote_after = '200ms', demote_to = 'slow', max_execution_time = '1s'",
        false,
    )
    .await;
    let run = spawn_query(&server, &report("never")).await;
    until(
        &admin,
        &format!("SELECT workload || ' ' || demoted_from {WHERE_REPORT}"),
        "slow fast",
    )
    .await;
    // Demoted, it keeps the limit of the workload it asked for: fails at 1 s, once.
    let e = run.await.expect("task").expect_err("times out");
    assert_refused(&e, "57014", "TIMEOUT_EXCEEDED");
    assert_refused(
        &e,
        "57014",
        "max_execution_time is a hard limit: the statement was stopped and is not retried",
    );
    assert_refused(&e, "57014", "it had been demoted from 'fast' to 'slow'");
    until(
        &admin,
        "SELECT outcome || ' ' || CAST(demoted AS VARCHAR) FROM system.query_log WHERE query LIKE 'SELECT sluice_barrier%'",
        "TIMEOUT_EXCEEDED true",
    )
    .await;
    // Never retried: one run, one row.
    assert_eq!(
        column(
            &admin,
            "SELECT count(*) FROM system.query_log WHERE query LIKE 'SELECT sluice_barrier%'"
        )
        .await,
        ["1"]
    );
    server.stop().await;
}

#[tokio::test]
async fn lane_settings_are_checked_when_written() {
    let (_dir, server, admin) = started_with(LANES, false).await;
    for (ddl, says) in [
        (
            "CREATE WORKLOAD x IN all SETTINGS demote_after = 1, demote_to = 'nowhere'",
            "doesn't exist",
        ),
        ("CREATE WORKLOAD under IN slow", "has children"),
        ("DROP WORKLOAD slow", "referenced by: fast"),
        (
            "CREATE OR REPLACE WORKLOAD slow IN all SETTINGS demote_after = 1, demote_to = 'fast'",
            "fast → slow → fast",
        ),
        (
            "CREATE WORKLOAD y IN all SETTINGS demote_after = '5 parsecs', demote_to = 'slow'",
            "'500ms', '20s', '5m', '1h'",
        ),
    ] {
        let e = admin.batch_execute(ddl).await.expect_err(ddl);
        assert!(message(&e).contains(says), "{ddl}: {}", message(&e));
    }
    // Nothing of the refused statements stayed.
    assert_eq!(
        column(&admin, "SELECT count(*) FROM system.workloads").await,
        ["3"]
    );
    server.stop().await;
}

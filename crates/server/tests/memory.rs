//! Memory over the wire (`MEMORY RESERVATION`, reference §4.7): `reserve_memory` makes a
//! statement wait for its bytes instead of failing, eviction kills the victim ClickHouse's rules
//! name with 53200, an admission timeout fails with MEMORY_RESERVATION_ACQUISITION_TIMEOUT, and
//! `max_memory_usage` caps one statement.

mod support;

use std::time::Duration;

use support::*;

const ALLOCATED: &str = "SELECT allocated FROM system.scheduler \
                         WHERE resource = 'mem' AND path = '/all'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_waits_for_memory_and_runs_when_it_frees() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE mem (MEMORY RESERVATION);
         CREATE WORKLOAD all SETTINGS max_memory = '100Mi';
         CREATE WORKLOAD w IN all",
        false,
    )
    .await;
    let holder = spawn_query(
        &server,
        "SELECT sluice_barrier('a') SETTINGS workload = 'w', reserve_memory = '80Mi'",
    )
    .await;
    until(&admin, ALLOCATED, &(80u64 << 20).to_string()).await;
    // 40 Mi more does not fit: it waits, shown as waiting for the memory resource.
    let waiter = spawn_query(
        &server,
        "SELECT 'ran' SETTINGS workload = 'w', reserve_memory = '40Mi'",
    )
    .await;
    until_waiting(&admin, 1).await;
    assert_eq!(waiting_for(&admin).await, ["mem"]);
    assert_eq!(
        column(
            &admin,
            "SELECT pending FROM system.scheduler WHERE resource = 'mem' AND type = 'allocation_queue'"
        )
        .await,
        ["1"]
    );
    // Bounded by the admission timeout: fails without starting, naming what it waited for.
    let client = server.client().await;
    let e = tokio::time::timeout(
        Duration::from_secs(10),
        client.simple_query(
            "SELECT 2 SETTINGS workload = 'w', reserve_memory = '40Mi', workload_admission_timeout_ms = 200",
        ),
    )
    .await
    .expect("ends by itself")
    .expect_err("times out");
    assert_refused(&e, "57014", "workload 'w'");
    assert!(
        message(&e).contains("MEMORY_RESERVATION_ACQUISITION_TIMEOUT"),
        "{}",
        message(&e)
    );
    // More than the limit can ever give: refused at once.
    let e = client
        .simple_query("SELECT 3 SETTINGS workload = 'w', reserve_memory = '200Mi'")
        .await
        .expect_err("too big");
    assert_refused(&e, "53200", "exceeds the limit");
    // The holder ends: the waiter is admitted and runs.
    server.barriers.open("a");
    holder.await.expect("task").expect("holder");
    let rows = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("admitted once memory freed")
        .expect("task")
        .expect("runs");
    assert!(format!("{rows:?}").contains("ran"));
    until(&admin, ALLOCATED, "0").await;
    assert_nothing_held(&admin).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growth_past_the_limit_evicts_lower_precedence_never_higher() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE mem (MEMORY RESERVATION);
         CREATE WORKLOAD all SETTINGS max_memory = '64Mi';
         CREATE WORKLOAD prod IN all SETTINGS precedence = -1;
         CREATE WORKLOAD dev IN all SETTINGS precedence = 1",
        false,
    )
    .await;
    // An aggregate that needs some 30 MiB and cannot spill.
    let grows = "SELECT cardinality(array_agg(g)) FROM generate_series(1, 4000000) AS t(g)";

    // dev holds 50 Mi; prod's sort grows past the limit: dev is the victim (higher precedence
    // value), killed with RESOURCE_LIMIT_EXCEEDED, and prod's statement completes.
    let dev = spawn_query(
        &server,
        "SELECT sluice_barrier('dev') SETTINGS workload = 'dev', reserve_memory = '50Mi'",
    )
    .await;
    until(&admin, ALLOCATED, &(50u64 << 20).to_string()).await;
    let prod = server.client().await;
    let counted = column(
        &prod,
        &format!("{grows} SETTINGS workload = 'prod', max_threads = 1"),
    )
    .await;
    assert_eq!(counted, ["4000000"]);
    let e = tokio::time::timeout(Duration::from_secs(10), dev)
        .await
        .expect("the victim is stopped")
        .expect("task")
        .expect_err("evicted");
    assert_refused(&e, "53200", "limit is hit for resource 'mem'");
    assert!(
        message(&e).contains("RESOURCE_LIMIT_EXCEEDED"),
        "{}",
        message(&e)
    );
    let victims = column(
        &admin,
        "SELECT victims FROM system.scheduler WHERE resource = 'mem' AND path LIKE '%/dev/queue'",
    )
    .await;
    assert_eq!(victims, ["1"]);

    // Now prod holds 50 Mi and dev's sort grows past the limit: lower precedence never evicts
    // higher. The aggregate fails; prod is untouched.
    let holder = spawn_query(
        &server,
        "SELECT sluice_barrier('prod') SETTINGS workload = 'prod', reserve_memory = '50Mi'",
    )
    .await;
    until(&admin, ALLOCATED, &(50u64 << 20).to_string()).await;
    let dev = server.client().await;
    let e = dev
        .simple_query(&format!(
            "{grows} SETTINGS workload = 'dev', max_threads = 1"
        ))
        .await
        .expect_err("dev's aggregate cannot grow past the limit while prod holds its 50 Mi");
    assert_eq!(sqlstate(&e), "53200", "{}", message(&e));
    assert!(
        message(&e).contains("(MEMORY_LIMIT_EXCEEDED)")
            || message(&e).contains("(RESOURCE_LIMIT_EXCEEDED)"),
        "{}",
        message(&e)
    );
    until_running(&admin, 1).await;
    server.barriers.open("prod");
    holder.await.expect("task").expect("prod was not evicted");
    until(&admin, ALLOCATED, "0").await;
    server.stop().await;
}

#[tokio::test]
async fn max_memory_usage_caps_one_statement() {
    let (_dir, server, _admin) = started_with("SELECT 1", false).await;
    let client = server.client().await;
    let e = client
        .simple_query(
            "SELECT cardinality(array_agg(g)) FROM generate_series(1, 3000000) AS t(g) \
             SETTINGS max_memory_usage = '8Mi'",
        )
        .await
        .expect_err("capped");
    assert_refused(&e, "53200", "max_memory_usage");
    assert!(
        message(&e).contains("MEMORY_LIMIT_EXCEEDED"),
        "{}",
        message(&e)
    );
    // The session goes on.
    assert_eq!(column(&client, "SELECT 'still here'").await, ["still here"]);
    server.stop().await;
}

/// `MOVE QUERY` takes a running statement's allocation along with its slots: the bytes leave
/// the old workload and count in the new one, whose new admissions wait until it is back under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_statement_takes_its_memory_along() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE mem (MEMORY RESERVATION);
         CREATE WORKLOAD all SETTINGS max_memory = '100Mi';
         CREATE WORKLOAD fast IN all;
         CREATE WORKLOAD slow IN all SETTINGS max_memory = '60Mi'",
        false,
    )
    .await;
    let in_workload = |w: &str| {
        format!(
            "SELECT allocated FROM system.scheduler WHERE resource = 'mem' \
             AND type = 'workload' AND path LIKE '%/{w}'"
        )
    };
    let holder = spawn_query(
        &server,
        "SELECT sluice_barrier('m') SETTINGS workload = 'fast', reserve_memory = '50Mi'",
    )
    .await;
    until(&admin, &in_workload("fast"), &(50u64 << 20).to_string()).await;
    column(
        &admin,
        "MOVE QUERY WHERE query LIKE '%sluice_barrier(''m'')%' TO WORKLOAD slow",
    )
    .await;
    assert_eq!(column(&admin, &in_workload("fast")).await, ["0"]);
    assert_eq!(
        column(&admin, &in_workload("slow")).await,
        [(50u64 << 20).to_string()]
    );
    // 50 + 20 Mi is past slow's 60: a new reservation there waits for the moved one.
    let waiter = spawn_query(
        &server,
        "SELECT 'ran' SETTINGS workload = 'slow', reserve_memory = '20Mi'",
    )
    .await;
    until_waiting(&admin, 1).await;
    server.barriers.open("m");
    holder.await.expect("task").expect("holder");
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("admitted once the moved one ended")
        .expect("task")
        .expect("runs");
    until(&admin, ALLOCATED, "0").await;
    server.stop().await;
}

/// A window over 2 M rows in an order nothing produces: a real sort of some 16 MiB.
const SORTED: &str =
    "SELECT count(p) FROM (SELECT lag(g) OVER (ORDER BY (g * 7919) % 1000003, g) AS p \
                      FROM generate_series(1, 2000000) AS t(g)) s";

/// A statement past its `max_memory_usage` spills where it can instead of failing: a sort
/// larger than its cap completes. (The cap must leave room for the sort's own merge
/// reservation, `sort_spill_reservation_bytes`, 10 MiB.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sort_past_its_cap_spills_instead_of_failing() {
    let (_dir, server, _admin) = started_with("SELECT 1", false).await;
    let client = server.client().await;
    // It completes under the cap, and its sort's metrics say it spilled to get there.
    let analyzed = client
        .simple_query(&format!(
            "EXPLAIN ANALYZE {SORTED} SETTINGS max_memory_usage = '12Mi', max_threads = 1"
        ))
        .await
        .expect("explains");
    let text = format!("{analyzed:?}");
    let spills: u64 = text
        .split("spill_count=")
        .skip(1)
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(spills > 0, "the sort spilled: {text}");
    server.stop().await;
}

/// Absurd reservations are refused or counted without overflow, and the server goes on.
#[tokio::test]
async fn absurd_reservations_do_not_break_the_tree() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE mem (MEMORY RESERVATION);
         CREATE WORKLOAD all;
         CREATE WORKLOAD w IN all;
         CREATE WORKLOAD capped IN all SETTINGS max_memory = '1Gi'",
        false,
    )
    .await;
    let client = server.client().await;
    // Over a limit: refused at once with its code.
    let e = client
        .simple_query("SELECT 1 SETTINGS workload = 'capped', reserve_memory = '2Gi'")
        .await
        .expect_err("too big");
    assert_refused(&e, "53200", "exceeds the limit");
    // Not a size: refused with BAD_ARGUMENTS.
    let e = client
        .simple_query("SELECT 1 SETTINGS workload = 'w', reserve_memory = 'lots'")
        .await
        .expect_err("not a size");
    assert!(
        message(&e).contains("BAD_ARGUMENTS") || message(&e).contains("CANNOT_PARSE"),
        "{}",
        message(&e)
    );
    // Unlimited workload, but more than the engine may ever hold: refused, naming why.
    let e = client
        .simple_query("SELECT 1 SETTINGS workload = 'w', reserve_memory = 9223372036854775807")
        .await
        .expect_err("more than the engine holds");
    assert_refused(&e, "53200", "server.engine_memory_ratio");
    // And everyone goes on.
    assert_eq!(
        column(
            &client,
            "SELECT 'ran' SETTINGS workload = 'w', reserve_memory = '1Mi'"
        )
        .await,
        ["ran"]
    );
    until(&admin, ALLOCATED, "0").await;
    server.stop().await;
}

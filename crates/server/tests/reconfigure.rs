//! Reshaping the tree while statements wait and run, with query slots, CPU slots and memory
//! attached — the three places ClickHouse crashed: creating a child of an in-use workload
//! (#92207), `CREATE OR REPLACE` under load then cancel (#111236), `DROP WORKLOAD` during a
//! query (#95856). The server must not crash, lose a waiter or leak a slot or a byte.

mod support;

use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshaping_the_tree_under_load_loses_nothing_and_crashes_nothing() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE slots (QUERY);
         CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
         CREATE RESOURCE mem (MEMORY RESERVATION);
         CREATE WORKLOAD all SETTINGS max_concurrent_queries = 4, max_concurrent_threads = 4, max_memory = '256Mi';
         CREATE WORKLOAD busy IN all;
         CREATE WORKLOAD spare IN all;
         CREATE WORKLOAD queued IN all SETTINGS max_concurrent_queries = 1",
        false,
    )
    .await;
    // Twelve clients loop on small statements in `busy` with a reservation each.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..12 {
        let client = server.client().await;
        let stop = stop.clone();
        clients.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let sql = format!(
                    "SELECT sum(g) FROM generate_series(1, {}) AS t(g) \
                     SETTINGS workload = 'busy', reserve_memory = '8Mi'",
                    20_000 + i
                );
                match client.simple_query(&sql).await {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(sqlstate(&e)),
                }
            }
            (ok, failed)
        }));
    }
    // And one long statement holds its slots and memory in `busy` throughout. One thread: the
    // rounds below shrink the tree to two threads, and a long statement holding both would
    // (rightly) leave every other client waiting until it ends.
    let long = spawn_query(
        &server,
        "SELECT sluice_barrier('long') \
         SETTINGS workload = 'busy', reserve_memory = '16Mi', max_threads = 1",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // #111236: CREATE OR REPLACE the in-use workload's parent and the workload, repeatedly.
    for round in 0..5 {
        admin
            .batch_execute(&format!(
                "CREATE OR REPLACE WORKLOAD all SETTINGS max_concurrent_queries = {}, max_concurrent_threads = {}, max_memory = '{}Mi';
                 CREATE OR REPLACE WORKLOAD busy IN all SETTINGS weight = {}",
                2 + round % 3,
                2 + round % 2,
                128 + 32 * round,
                1 + round
            ))
            .await
            .expect("replaced under load");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // …then cancel a waiting statement while the trees change under it: one that certainly
    // waits (its workload's one slot is held at a barrier), seen waiting before the change.
    let holder = spawn_query(
        &server,
        "SELECT sluice_barrier('queued') SETTINGS workload = 'queued'",
    )
    .await;
    until(
        &admin,
        "SELECT count(*) FROM system.processes WHERE workload = 'queued' AND state = 'running'",
        "1",
    )
    .await;
    let cancelled = server.client().await;
    let token = cancelled.cancel_token();
    let waits = tokio::spawn(async move {
        cancelled
            .simple_query("SELECT 'cancel me' SETTINGS workload = 'queued', reserve_memory = '8Mi'")
            .await
    });
    until(
        &admin,
        "SELECT count(*) FROM system.processes WHERE query LIKE '%cancel me%' AND state = 'waiting'",
        "1",
    )
    .await;
    admin
        .batch_execute(
            "CREATE OR REPLACE WORKLOAD busy IN all SETTINGS weight = 2;
             CREATE OR REPLACE WORKLOAD queued IN all SETTINGS max_concurrent_queries = 1, weight = 3",
        )
        .await
        .expect("replaced");
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("the cancel request is delivered");
    let e = tokio::time::timeout(Duration::from_secs(10), waits)
        .await
        .expect("a cancelled statement ends")
        .expect("task")
        .expect_err("cancelled while it waited");
    assert_eq!(sqlstate(&e), "57014", "{}", message(&e));
    server.barriers.open("queued");
    holder
        .await
        .expect("task")
        .expect("the holder ran through the change");

    // #92207: a child for the in-use leaf `spare` (nothing waits there) and one for `busy`:
    // busy's waiters fail with INVALID_SCHEDULER_NODE (as ClickHouse purges the queue), its
    // running statements finish.
    admin
        .batch_execute("CREATE WORKLOAD spare_child IN spare")
        .await
        .expect("child of an idle leaf");
    admin
        .batch_execute("CREATE WORKLOAD busy_child IN busy")
        .await
        .expect("child of an in-use leaf");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // #95856: drop it again while the long statement still runs in `busy`.
    admin
        .batch_execute("DROP WORKLOAD busy_child")
        .await
        .expect("dropped under load");
    tokio::time::sleep(Duration::from_millis(200)).await;

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total_ok = 0;
    for client in clients {
        let (ok, failed) = tokio::time::timeout(Duration::from_secs(20), client)
            .await
            .expect("every client's statement ends")
            .expect("task");
        total_ok += ok;
        // Only INVALID_SCHEDULER_NODE (22023), while `busy` had a child: its waiters were
        // purged and new statements there refused. Nothing else may fail.
        for state in &failed {
            assert_eq!(state, "22023", "unexpected failure");
        }
    }
    assert!(total_ok > 0, "work went on through the changes");
    // The long statement survived every change and ends cleanly.
    server.barriers.open("long");
    long.await
        .expect("task")
        .expect("the long statement ran through");
    // Still serving, and nothing held anywhere: slots, threads, bytes.
    assert_eq!(column(&admin, "SELECT 'alive'").await, ["alive"]);
    assert_nothing_held(&admin).await;
    until(
        &admin,
        "SELECT coalesce(sum(allocated), 0) FROM system.scheduler WHERE resource = 'mem'",
        "0",
    )
    .await;
    // The workload works again after it all.
    assert_eq!(
        column(
            &admin,
            "SELECT 'again' SETTINGS workload = 'busy', reserve_memory = '8Mi'"
        )
        .await,
        ["again"]
    );
    server.stop().await;
}

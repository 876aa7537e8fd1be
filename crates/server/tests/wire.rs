//! The server over the wire, with a real Postgres client (tokio-postgres) against a server the
//! test starts on an ephemeral loopback port. Waiting is observed through `system.processes`,
//! never by sleeping and hoping.

mod support;

use support::*;
use tokio_postgres::NoTls;

#[tokio::test]
async fn queries_run_in_both_protocols_with_postgres_types() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let client = server.client().await;
    // Extended protocol (binary results).
    let row = client
        .query_one("SELECT 1::int AS i, 2::bigint AS b, 1.5::double AS f, 'x' AS t, true AS ok, DATE '2026-11-29' AS d", &[])
        .await
        .expect("query");
    assert_eq!(row.get::<_, i32>("i"), 1);
    assert_eq!(row.get::<_, i64>("b"), 2);
    assert_eq!(row.get::<_, f64>("f"), 1.5);
    assert_eq!(row.get::<_, String>("t"), "x");
    assert!(row.get::<_, bool>("ok"));
    // Simple protocol, several statements in one query, tables shared across connections.
    client
        .batch_execute("CREATE TABLE t (x INT); INSERT INTO t VALUES (1), (2), (3)")
        .await
        .expect("batch");
    let other = server.client().await;
    assert_eq!(column(&other, "SELECT sum(x) FROM t").await, ["6"]);
    assert_eq!(
        column(&other, "SELECT count(*) FROM generate_series(1, 10)").await,
        ["10"]
    );
    // Drivers wrap work in transactions; each statement runs on its own, the tags are right.
    let mut client = client;
    let tx = client.transaction().await.expect("begin");
    assert_eq!(
        tx.query_one("SELECT 5::int", &[])
            .await
            .expect("select")
            .get::<_, i32>(0),
        5
    );
    tx.commit().await.expect("commit");
    let e = client.simple_query("SELEC 1").await.expect_err("syntax");
    assert_eq!(sqlstate(&e), "42601");
    let e = client
        .simple_query("SELECT * FROM nowhere")
        .await
        .expect_err("unknown table");
    assert_eq!(sqlstate(&e), "42P01");
    server.stop().await;
}

#[tokio::test]
async fn bind_parameters_are_typed_and_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let client = server.client().await;
    client
        .batch_execute(
            "CREATE TABLE p (id BIGINT, name TEXT, score DOUBLE); \
             INSERT INTO p VALUES (1, 'ann', 1.5), (2, 'bob', 2.5), (3, 'cy', 3.5)",
        )
        .await
        .expect("table");
    // Types inferred from the columns the placeholders meet.
    let rows = client
        .query(
            "SELECT name FROM p WHERE id >= $1 AND score < $2 ORDER BY id",
            &[&2i64, &3.0f64],
        )
        .await
        .expect("bound query");
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(names, ["bob"]);
    // A prepared statement reused with other values; NULL binds as NULL.
    let stmt = client
        .prepare("SELECT count(*) FROM p WHERE name = $1")
        .await
        .expect("prepare");
    assert_eq!(stmt.params(), [tokio_postgres::types::Type::TEXT]);
    for (name, n) in [("ann", 1i64), ("zed", 0)] {
        let row = client.query_one(&stmt, &[&name]).await.expect("run");
        assert_eq!(row.get::<_, i64>(0), n);
    }
    let none: Option<&str> = None;
    let row = client.query_one(&stmt, &[&none]).await.expect("null");
    assert_eq!(row.get::<_, i64>(0), 0);
    // With the SETTINGS tail too.
    let row = client
        .query_one(
            "SELECT max(score) FROM p WHERE id < $1 SETTINGS max_threads = 1",
            &[&3i64],
        )
        .await
        .expect("settings and parameters");
    assert_eq!(row.get::<_, f64>(0), 2.5);
    // A statement that takes no parameters says so.
    let e = client
        .execute("SET workload = $1", &[&"x"])
        .await
        .expect_err("SET with a parameter");
    assert!(message(&e).contains("bind parameters"), "{}", message(&e));
    server.stop().await;
}

/// A statement's columns, kept by the connection between Describes (a driver describes each
/// statement it runs), follow the table they come from when another session changes it.
#[tokio::test]
async fn described_columns_follow_their_table() {
    use tokio_postgres::types::Type;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let client = server.client().await;
    let other = server.client().await;
    client
        .batch_execute("CREATE TABLE t (a BIGINT); INSERT INTO t VALUES (1)")
        .await
        .expect("table");
    let columns = |s: &tokio_postgres::Statement| -> Vec<(String, Type)> {
        s.columns()
            .iter()
            .map(|c| (c.name().to_string(), c.type_().clone()))
            .collect()
    };
    for _ in 0..3 {
        let s = client.prepare("SELECT * FROM t").await.expect("prepare");
        assert_eq!(columns(&s), [("a".to_string(), Type::INT8)]);
    }
    other
        .batch_execute(
            "DROP TABLE t; CREATE TABLE t (b TEXT, c BIGINT); INSERT INTO t VALUES ('x', 2)",
        )
        .await
        .expect("table made again");
    let s = client.prepare("SELECT * FROM t").await.expect("prepare");
    assert_eq!(
        columns(&s),
        [("b".to_string(), Type::TEXT), ("c".to_string(), Type::INT8)]
    );
    let row = client.query_one(&s, &[]).await.expect("runs");
    assert_eq!(row.get::<_, &str>(0), "x");
    server.stop().await;
}

/// A table function's arguments take parameters as PostgreSQL's do (DataFusion plans a table
/// function with its arguments and took literals only: `generate_series(1, $1)` failed to
/// plan at Parse).
#[tokio::test]
async fn a_table_function_takes_bind_parameters() {
    use tokio_postgres::types::Type;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let client = server.client().await;
    let series = client
        .prepare("SELECT count(*), sum(g) FROM generate_series(1, $1) AS t(g)")
        .await
        .expect("prepare");
    assert_eq!(series.params(), [Type::INT8]);
    assert_eq!(series.columns()[1].type_(), &Type::INT8);
    for (n, count, sum) in [(10i64, 10i64, 55i64), (3, 3, 6), (0, 0, 0)] {
        let row = client.query_one(&series, &[&n]).await.expect("run");
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, Option<i64>>(1)),
            (count, (count > 0).then_some(sum))
        );
    }
    // A NULL bound: no rows, as in PostgreSQL.
    let none: Option<i64> = None;
    let row = client.query_one(&series, &[&none]).await.expect("null");
    assert_eq!(row.get::<_, i64>(0), 0);
    // Both bounds and the step; a negative step; a bound cast to int4 is announced as one.
    let rows = client
        .query(
            "SELECT g FROM generate_series($1, $2, $3) AS t(g) ORDER BY g DESC",
            &[&5i64, &1i64, &-2i64],
        )
        .await
        .expect("three parameters");
    let values: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(values, [5, 3, 1]);
    let cast = client
        .prepare("SELECT count(*) FROM generate_series(1, $1::int4) AS t(g) WHERE g > $2")
        .await
        .expect("prepare cast");
    assert_eq!(cast.params(), [Type::INT4, Type::INT8]);
    let row = client
        .query_one(&cast, &[&7i32, &2i64])
        .await
        .expect("cast run");
    assert_eq!(row.get::<_, i64>(0), 5);
    // Parameters elsewhere in the statement are bound as before; a placeholder used in both
    // places gets the one value.
    let row = client
        .query_one(
            "SELECT max(g) + $1 FROM generate_series(1, $1) AS t(g)",
            &[&4i64],
        )
        .await
        .expect("one parameter twice");
    assert_eq!(row.get::<_, i64>(0), 8);
    // The simple protocol still refuses a placeholder it has no value for.
    let e = client
        .simple_query("SELECT count(*) FROM generate_series(1, $1) AS t(g)")
        .await
        .expect_err("no value");
    assert!(!message(&e).is_empty());
    server.stop().await;
}

#[tokio::test]
async fn ddl_persists_and_system_tables_answer_sql() {
    let (dir, server, client) = started_with(
        "CREATE RESOURCE q (QUERY);
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 4;
             CREATE WORKLOAD prod IN all SETTINGS priority = 0, weight = 3;
             CREATE WORKLOAD dev IN all SETTINGS priority = 1",
        false,
    )
    .await;
    let e = client
        .simple_query("CREATE WORKLOAD all")
        .await
        .expect_err("exists");
    // duplicate_object, as Postgres says it; the ClickHouse code stays BAD_ARGUMENTS.
    assert_eq!(sqlstate(&e), "42710");
    assert!(message(&e).ends_with("(BAD_ARGUMENTS)"), "{}", message(&e));
    let e = client
        .simple_query("CREATE WORKLOAD x IN all SETTINGS weight = 0")
        .await
        .expect_err("zero");
    assert!(message(&e).ends_with("(INVALID_SCHEDULER_NODE)"));
    assert_eq!(
        column(&client, "SELECT w.name FROM system.workloads w JOIN system.scheduler s ON s.path LIKE '%/' || w.name || '/fifo' ORDER BY w.name").await,
        ["dev", "prod"]
    );
    assert_eq!(
        column(&client, "SHOW CREATE WORKLOAD prod").await,
        ["CREATE WORKLOAD prod IN `all` SETTINGS priority = 0, weight = 3"]
    );
    server.stop().await;

    // A new server on the same data dir has the same catalog.
    let server = TestServer::start(dir.path(), false).await;
    let client = server.client().await;
    assert_eq!(
        column(&client, "SELECT name FROM system.workloads ORDER BY name").await,
        ["all", "dev", "prod"]
    );
    assert_eq!(
        column(
            &client,
            "SELECT max_requests FROM system.scheduler WHERE type = 'inflight_limit'"
        )
        .await,
        ["4"]
    );
    server.stop().await;
}

#[tokio::test]
async fn admission_waits_cancels_rejects_and_releases() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE q (QUERY);
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
             CREATE WORKLOAD w IN all SETTINGS max_waiting_queries = 1",
        false,
    )
    .await;

    // One runs, one waits (visible), a third is rejected: SERVER_OVERLOADED, 53000.
    let running = server.client().await;
    let slow = tokio::spawn(async move {
        running
            .simple_query("SELECT sluice_barrier('slow') SETTINGS workload = 'w'")
            .await
            .map(|_| ())
    });
    let waiter = server
        .client_with(&format!(
            "host=127.0.0.1 port={} user=tester options='-c workload=w'",
            server.port
        ))
        .await;
    let cancel = waiter.cancel_token();
    let waiting = tokio::spawn(async move { waiter.simple_query("SELECT 2").await.map(|_| ()) });
    until_waiting(&admin, 1).await;
    assert_eq!(
        column(
            &admin,
            "SELECT workload || ' ' || waiting_for FROM system.processes WHERE state = 'waiting'"
        )
        .await,
        ["w q"]
    );
    let third = server.client().await;
    let e = third
        .simple_query("SELECT 3 SETTINGS workload = 'w'")
        .await
        .expect_err("queue full");
    assert_eq!(sqlstate(&e), "53000");
    assert!(
        message(&e).contains("max_waiting_queries"),
        "{}",
        message(&e)
    );

    // Cancelling the waiting query: 57014, and it leaves the queue.
    cancel.cancel_query(NoTls).await.expect("cancel request");
    let e = waiting.await.expect("task").expect_err("cancelled");
    assert_eq!(sqlstate(&e), "57014");
    server.barriers.open("slow");
    slow.await.expect("task").expect("the slow query finishes");
    assert_nothing_held(&admin).await;
    assert_eq!(
        column(
            &admin,
            "SELECT sum(canceled_requests) FROM system.scheduler"
        )
        .await,
        ["1"]
    );
    assert_eq!(
        column(
            &admin,
            "SELECT sum(rejected_requests) FROM system.scheduler"
        )
        .await,
        ["1"]
    );

    // A client that goes away while waiting releases its place too.
    let holder = server.client().await;
    let hold = tokio::spawn(async move {
        holder
            .simple_query("SELECT sluice_barrier('hold') SETTINGS workload = 'w'")
            .await
            .map(|_| ())
    });
    // Its connection is driven by a task this test owns: aborting both closes the socket (a
    // dropped tokio-postgres `Client` alone leaves its connection task holding it open).
    let (leaver, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={} user=tester", server.port),
        NoTls,
    )
    .await
    .expect("connects");
    let connection = tokio::spawn(connection);
    let leave = tokio::spawn(async move {
        leaver
            .simple_query("SELECT 4 SETTINGS workload = 'w'")
            .await
            .map(|_| ())
    });
    until_waiting(&admin, 1).await;
    leave.abort();
    connection.abort(); // the socket closes mid-wait
    let _ = (leave.await, connection.await);
    // Its place goes while the holder still runs, not when the holder finishes.
    until_waiting(&admin, 0).await;
    assert_eq!(
        column(&admin, "SELECT sum(queue_length) FROM system.scheduler").await,
        ["0"]
    );
    assert_eq!(server.barriers.waiting("hold"), 1, "the holder still runs");
    server.barriers.open("hold");
    hold.await.expect("task").expect("holder finishes");
    assert_nothing_held(&admin).await;
    server.stop().await;
}

#[tokio::test]
async fn waiting_queries_are_served_by_priority() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE q (QUERY);
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
             CREATE WORKLOAD fast IN all SETTINGS priority = 0;
             CREATE WORKLOAD slow IN all SETTINGS priority = 1;
             CREATE TABLE log (who VARCHAR, at BIGINT)",
        false,
    )
    .await;
    let blocker = server.client().await;
    let block = tokio::spawn(async move {
        blocker
            .simple_query("SELECT sluice_barrier('block') SETTINGS workload = 'slow'")
            .await
            .map(|_| ())
    });
    until_waiting(&admin, 0).await;
    let mut tasks = Vec::new();
    for (i, workload) in ["slow", "fast", "slow", "fast"].into_iter().enumerate() {
        let c = server.client().await;
        let sql = format!("INSERT INTO log VALUES ('{workload}{i}', CAST(extract(epoch FROM now()) * 1000000 AS BIGINT)) SETTINGS workload = '{workload}'");
        tasks.push(tokio::spawn(async move {
            c.simple_query(&sql).await.map(|_| ())
        }));
        until_waiting(&admin, i + 1).await;
    }
    server.barriers.open("block");
    block.await.expect("task").expect("blocker");
    for t in tasks {
        t.await.expect("task").expect("insert");
    }
    let order = column(&admin, "SELECT who FROM log ORDER BY at, who").await;
    assert_eq!(
        order.iter().map(|w| &w[..4]).collect::<Vec<_>>(),
        ["fast", "fast", "slow", "slow"],
        "{order:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn unknown_workloads_run_unlimited_or_are_denied() {
    let (_dir, server, client) = started_with(
        "CREATE RESOURCE q (QUERY); CREATE WORKLOAD all; CREATE WORKLOAD leaf IN all",
        true,
    )
    .await;
    let e = client
        .simple_query("SELECT 1 SETTINGS workload = 'nobody'")
        .await
        .expect_err("denied");
    assert!(
        message(&e).ends_with("(RESOURCE_ACCESS_DENIED)"),
        "{}",
        message(&e)
    );
    assert_eq!(sqlstate(&e), "42501");
    client
        .simple_query("SET workload = 'leaf'")
        .await
        .expect("set");
    assert_eq!(column(&client, "SHOW workload").await, ["leaf"]);
    assert_eq!(column(&client, "SELECT 7").await, ["7"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_per_second_are_limited_to_burst_plus_rate() {
    const RATE: f64 = 20.0;
    const BURST: f64 = 4.0;
    const QUERIES: usize = 48;
    let (_dir, server, admin) = started_with(
        &format!(
            "CREATE RESOURCE q (QUERY); \
             CREATE WORKLOAD all SETTINGS max_queries_per_second = {RATE}, max_burst_queries = {BURST}; \
             CREATE WORKLOAD w IN all"
        ),
        false,
    )
    .await;
    let started = std::time::Instant::now();
    let done = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = server.client().await;
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..QUERIES / 8 {
                client
                    .simple_query("SELECT 1 SETTINGS workload = 'w'")
                    .await
                    .expect("admitted");
                done.lock()
                    .expect("lock")
                    .push(started.elapsed().as_secs_f64());
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    assert_eq!(done.lock().expect("lock").len(), QUERIES);
    // The bucket bounds admissions, so they are judged by the server's own admission times
    // (the query log's), not by when the answers reached the clients: a loaded machine that
    // delays some answers would bunch them up without any admission breaking the limit.
    let admitted = column(
        &admin,
        "SELECT CAST(date_part('epoch', admitted) AS DOUBLE) FROM system.query_log \
         WHERE workload = 'w' ORDER BY admitted",
    )
    .await;
    let mut times: Vec<f64> = admitted
        .iter()
        .map(|t| t.parse::<f64>().expect("seconds"))
        .collect();
    times.sort_by(f64::total_cmp);
    let first = times[0];
    for t in &mut times {
        *t -= first;
    }
    assert_eq!(times.len(), QUERIES);
    // In any window [t_i, t_j], no more than burst + 1 + rate·(t_j − t_i) queries start
    // (ClickHouse's token bucket lets burst + 1 go at once; one more of slack for the time a
    // query takes between its start and its answer).
    for i in 0..times.len() {
        for j in i..times.len() {
            let allowed = BURST + 1.0 + RATE * (times[j] - times[i]) + 1.0;
            assert!(
                (j - i + 1) as f64 <= allowed,
                "{} queries in {:.3} s (allowed {allowed:.1})",
                j - i + 1,
                times[j] - times[i]
            );
        }
    }
    // And the limit was what held them: without it 48 trivial queries take milliseconds.
    let expected = (QUERIES as f64 - BURST - 1.0) / RATE;
    assert!(
        times[QUERIES - 1] >= expected * 0.9,
        "done in {:.3} s, a rate of {RATE}/s needs {expected:.3} s",
        times[QUERIES - 1]
    );
    server.stop().await;
}

#[tokio::test]
async fn a_live_limit_change_takes_over_waiting_and_running_queries() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE q (QUERY);
         CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
         CREATE WORKLOAD w IN all",
        false,
    )
    .await;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        tasks.push(
            spawn_query(
                &server,
                "SELECT sluice_barrier('run') SETTINGS workload = 'w'",
            )
            .await,
        );
    }
    until_waiting(&admin, 2).await;
    let running =
        "SELECT count(*) FROM system.processes WHERE state = 'running' AND workload = 'w'";
    assert_eq!(column(&admin, running).await, ["1"]);
    // Raised to 2: one of the two waiting starts, the other keeps waiting (the running query
    // still counts against the new limit).
    admin
        .batch_execute("CREATE OR REPLACE WORKLOAD all SETTINGS max_concurrent_queries = 2")
        .await
        .expect("raise");
    until_waiting(&admin, 1).await;
    assert_eq!(column(&admin, running).await, ["2"]);
    assert_eq!(
        column(
            &admin,
            "SELECT inflight_requests FROM system.scheduler WHERE path = '/all/semaphore'"
        )
        .await,
        ["2"]
    );
    server.barriers.open("run");
    for t in tasks {
        t.await.expect("task").expect("query");
    }
    assert_nothing_held(&admin).await;
    server.stop().await;
}

#[tokio::test]
async fn parameters_are_written_as_their_column_types() {
    use tokio_postgres::types::Type;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let client = server.client().await;
    client
        .batch_execute("CREATE TABLE p (k INT, v TEXT, f DOUBLE PRECISION)")
        .await
        .expect("create");
    // As psycopg 3 sends a small Python int and a float: int2 and int4 where the columns are
    // INT and DOUBLE PRECISION.
    let insert = client
        .prepare_typed(
            "INSERT INTO p VALUES ($1, $2, $3)",
            &[Type::INT2, Type::TEXT, Type::INT4],
        )
        .await
        .expect("prepares");
    for k in [3i16, 1, 2] {
        let n = client
            .execute(&insert, &[&k, &format!("v{k}"), &(k as i32)])
            .await
            .expect("inserts");
        assert_eq!(n, 1, "the command tag counts the row");
    }
    assert_eq!(
        column(
            &client,
            "SELECT DISTINCT arrow_typeof(k) || ' ' || arrow_typeof(f) FROM p"
        )
        .await,
        ["Int32 Float64"]
    );
    // The table reads as one schema: sorting and filtering over it work for everyone.
    assert_eq!(
        column(&client, "SELECT k FROM p ORDER BY k").await,
        ["1", "2", "3"]
    );
    let select = client
        .prepare_typed("SELECT v FROM p WHERE k = $1", &[Type::INT2])
        .await
        .expect("prepares");
    let rows = client.query(&select, &[&2i16]).await.expect("selects");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(0), "v2");
    server.stop().await;
}

#[tokio::test]
async fn an_admitted_query_moves_to_another_workload_without_being_released() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE q (QUERY);
         CREATE WORKLOAD all SETTINGS max_concurrent_queries = 10;
         CREATE WORKLOAD fast IN all SETTINGS max_concurrent_queries = 1;
         CREATE WORKLOAD slow IN all SETTINGS max_concurrent_queries = 1",
        false,
    )
    .await;
    let runner = server.client().await;
    let cancel = runner.cancel_token();
    let running = tokio::spawn(async move {
        runner
            .simple_query("SELECT pg_sleep(60) SETTINGS workload = 'fast'")
            .await
    });
    until_running(&admin, 1).await;
    let waiter = spawn_query(&server, "SELECT 2 SETTINGS workload = 'fast'").await;
    until_waiting(&admin, 1).await;
    let id: u64 = column(
        &admin,
        "SELECT query_id FROM system.processes WHERE query LIKE '%pg_sleep(60)%' AND state = 'running'",
    )
    .await[0]
    .parse()
    .expect("query id");
    let e = server.shared.move_query(id, "all").expect_err("not a leaf");
    assert_eq!(e.code, sluice_sql::ErrorCode::InvalidSchedulerNode);
    server.shared.move_query(id, "slow").expect("moves");
    // fast's slot is free: the waiter runs; the moved query still runs, now in slow.
    waiter.await.expect("task").expect("the waiter ran");
    assert_eq!(
        column(
            &admin,
            &format!("SELECT workload || ' ' || state FROM system.processes WHERE query_id = {id}")
        )
        .await,
        ["slow running"]
    );
    let held = |path: &'static str| {
        let admin = &admin;
        async move {
            column(
                admin,
                &format!("SELECT inflight_requests FROM system.scheduler WHERE path = '{path}'"),
            )
            .await
        }
    };
    assert_eq!(held("/all/semaphore/p0_fair/slow/semaphore").await, ["1"]);
    assert_eq!(held("/all/semaphore/p0_fair/fast/semaphore").await, ["0"]);
    assert_eq!(held("/all/semaphore").await, ["1"]);
    cancel.cancel_query(NoTls).await.expect("cancel");
    let e = running.await.expect("task").expect_err("cancelled");
    assert_eq!(sqlstate(&e), "57014");
    assert_nothing_held(&admin).await;
    server.stop().await;
}

/// Issue 36, defect 3: every query setting sluice honours takes and refuses what ClickHouse
/// 26.9 takes and refuses, with ClickHouse's code (`tests/query_settings/settings.expected`,
/// made by ClickHouse itself with `tests/query_settings/generate.py`), and a Postgres client
/// gets 22023 (a bad value for a parameter) for each refusal.
#[tokio::test]
async fn query_settings_are_read_as_clickhouse_reads_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let client = server.client().await;
    let expected = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/query_settings/settings.expected"
    ))
    .expect("settings.expected");
    let mut differ = Vec::new();
    let mut refusals = 0;
    for line in expected.lines() {
        let (statement, clickhouse) = line.split_once('\t').expect("statement TAB outcome");
        let sluice = match client.simple_query(statement).await {
            Ok(_) => "OK".to_string(),
            Err(e) => {
                refusals += 1;
                let says = message(&e);
                if sqlstate(&e) != "22023" {
                    differ.push(format!("{statement}: SQLSTATE {} ({says})", sqlstate(&e)));
                }
                says.rsplit_once('(')
                    .map(|(_, code)| code.trim_end_matches(')').to_string())
                    .unwrap_or(says)
            }
        };
        if sluice != clickhouse {
            differ.push(format!(
                "{statement}: sluice {sluice}, ClickHouse {clickhouse}"
            ));
        }
    }
    assert!(refusals >= 20, "the file refuses something ({refusals})");
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// `psql -X -A -t` at `port` with `env`: its stdout and its stderr.
async fn psql_with(port: u16, env: &[(&str, &str)], sql: &str) -> (String, String) {
    let conn = format!("host=127.0.0.1 port={port} user=tester dbname=any");
    let out = psql(&conn, env, sql).await;
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 36, defect 1 on the embedded engine: a start-up `TimeZone` (psql's PGTZ, or `-c`) is
/// the session's — timestamptz values are shown in it, with PostgreSQL's offsets — and `SET
/// TimeZone` changes it; an unknown zone refuses the start-up with 22023; a `DateStyle` the
/// engine does not print in is not taken silently (a WARNING says what is shown instead).
#[tokio::test]
async fn the_embedded_engine_takes_the_clients_time_zone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let instant = "SELECT TIMESTAMPTZ '2026-01-02 03:04:05+00' AS t";
    // Without a zone of its own a session is in UTC, and a timestamptz is one.
    let (out, _) = psql_with(server.port, &[], instant).await;
    assert_eq!(out.trim(), "2026-01-02 03:04:05+00");
    let (out, _) = psql_with(server.port, &[("PGTZ", "Asia/Tokyo")], instant).await;
    assert_eq!(out.trim(), "2026-01-02 12:04:05+09");
    let (out, _) = psql_with(server.port, &[("PGTZ", "America/St_Johns")], instant).await;
    assert_eq!(out.trim(), "2026-01-01 23:34:05-03:30");
    let (out, _) = psql_with(server.port, &[("PGTZ", "Asia/Tokyo")], "SHOW TimeZone").await;
    assert_eq!(out.trim(), "Asia/Tokyo");
    let zoned = server
        .client_with(&format!(
            "host=127.0.0.1 port={} user=tester dbname=any options='-c TimeZone=PST8PDT'",
            server.port
        ))
        .await;
    assert_eq!(
        column(&zoned, "SELECT TIMESTAMPTZ '2026-07-01 12:00:00+00'").await,
        ["2026-07-01 05:00:00-07"]
    );
    zoned
        .simple_query("SET TimeZone = 'UTC'")
        .await
        .expect("set");
    assert_eq!(
        column(&zoned, "SELECT TIMESTAMPTZ '2026-07-01 12:00:00+00'").await,
        ["2026-07-01 12:00:00+00"]
    );
    let e = zoned
        .simple_query("SET TimeZone = 'Nowhere/Bogus'")
        .await
        .expect_err("an unknown zone");
    assert_eq!(sqlstate(&e), "22023", "{}", message(&e));
    let (_, refused) = psql_with(server.port, &[("PGTZ", "Nowhere/Bogus")], "SELECT 1").await;
    assert!(
        refused.contains("FATAL") && refused.contains("invalid value for parameter \"TimeZone\""),
        "{refused}"
    );
    let (out, warned) = psql_with(
        server.port,
        &[("PGDATESTYLE", "Postgres, MDY")],
        "SHOW DateStyle",
    )
    .await;
    assert_eq!(out.trim(), "ISO, MDY");
    assert!(
        warned.contains("WARNING") && warned.contains("Postgres, MDY"),
        "{warned}"
    );
}

/// SQL's PREPARE and EXECUTE: an executed statement's columns carry the names PostgreSQL gives
/// the statement prepared (`?column?`, `count`, an alias), described alike over the extended
/// protocol, and its rows come back (slt/prepared.slt has the rest).
#[tokio::test]
async fn an_executed_statement_names_its_columns_as_postgres() {
    use tokio_postgres::SimpleQueryMessage;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let client = server.client().await;
    client
        .batch_execute("PREPARE q(int) AS SELECT $1 + 1, count(*), upper('a') AS shout")
        .await
        .expect("prepare");
    // Simple protocol.
    let messages = client.simple_query("EXECUTE q(41)").await.expect("execute");
    let row = messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .expect("a row");
    let names: Vec<&str> = row.columns().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["?column?", "count", "shout"]);
    assert_eq!(row.get(0), Some("42"));
    assert!(messages
        .iter()
        .any(|m| matches!(m, SimpleQueryMessage::CommandComplete(1))));
    // Extended protocol: described, then run.
    let statement = client.prepare("EXECUTE q(1)").await.expect("describe");
    let names: Vec<&str> = statement.columns().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["?column?", "count", "shout"]);
    let rows = client.query(&statement, &[]).await.expect("execute");
    assert_eq!(rows[0].get::<_, i64>(0), 2);
    // A table function that takes the placeholder: planned again with the value, described
    // and run alike.
    client
        .batch_execute("PREPARE upto(int) AS SELECT count(*), sum(g) AS total FROM generate_series(1, $1) AS t(g)")
        .await
        .expect("prepare a table function's placeholder");
    let statement = client.prepare("EXECUTE upto(4)").await.expect("describe");
    let names: Vec<&str> = statement.columns().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["count", "total"]);
    let row = client.query_one(&statement, &[]).await.expect("execute");
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (4, 10));
}

//! Running sluice for real: users with SCRAM, admin-only DDL, pinned and default workloads;
//! notices to waiting queries; graceful shutdown; Prometheus metrics. Real clients
//! (tokio-postgres) against a server on an ephemeral loopback port.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sluice_server::auth::{make_verifier, User};
use sluice_server::ServerOptions;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::{AsyncMessage, Client, NoTls};

fn user(name: &str, password: &str) -> User {
    User {
        name: name.into(),
        scram: make_verifier(password).expect("verifier"),
        admin: false,
        default_workload: None,
        pinned_workload: None,
        max_execution_time: None,
        admission_timeout: None,
    }
}

fn admin(name: &str, password: &str) -> User {
    User {
        admin: true,
        ..user(name, password)
    }
}

/// A server on a fresh data dir with `users` configured.
async fn with_users(users: Vec<User>) -> (tempfile::TempDir, TestServer) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_with(ServerOptions {
        users,
        ..test_options(dir.path())
    })
    .await;
    (dir, server)
}

async fn login(port: u16, user: &str, password: &str) -> Result<Client, tokio_postgres::Error> {
    connect(&format!(
        "host=127.0.0.1 port={port} user={user} password={password} dbname=x"
    ))
    .await
}

#[tokio::test]
async fn users_authenticate_with_scram_and_only_admins_change_workloads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_with(ServerOptions {
        users: vec![
            admin("root", "r00t"),
            User {
                pinned_workload: Some("prod".into()),
                ..user("app", "app-pw")
            },
            User {
                default_workload: Some("dev".into()),
                ..user("dana", "dana-pw")
            },
        ],
        ..test_options(dir.path())
    })
    .await;
    // The verifier is all that is stored; a wrong password, or an unknown user, is refused.
    let e = login(server.port, "root", "wrong")
        .await
        .expect_err("refused");
    assert_eq!(sqlstate(&e), "28P01", "{e}");
    assert!(message(&e).contains("\"root\""), "names the user: {e}");
    let e = login(server.port, "nobody", "x")
        .await
        .expect_err("refused");
    assert_eq!(sqlstate(&e), "28P01", "{e}");
    assert!(message(&e).contains("\"nobody\""), "names the user: {e}");

    let root = login(server.port, "root", "r00t")
        .await
        .expect("root logs in");
    root.batch_execute(
        "CREATE RESOURCE q (QUERY); CREATE WORKLOAD all; \
         CREATE WORKLOAD prod IN all; CREATE WORKLOAD dev IN all",
    )
    .await
    .expect("admin DDL");

    let app = login(server.port, "app", "app-pw")
        .await
        .expect("app logs in");
    let e = app
        .batch_execute("CREATE WORKLOAD mine IN all")
        .await
        .expect_err("not an admin");
    assert_eq!(sqlstate(&e), "42501");
    assert!(message(&e).contains("ACCESS_DENIED"), "{}", message(&e));
    // Pinned: every query runs in prod; naming another workload is refused.
    assert_eq!(column(&app, "SHOW workload").await, ["prod"]);
    let e = app
        .batch_execute("SET workload = 'dev'")
        .await
        .expect_err("pinned");
    assert_eq!(sqlstate(&e), "42501");
    assert!(
        message(&e).contains("SETTING_CONSTRAINT_VIOLATION"),
        "{}",
        message(&e)
    );
    let e = app
        .simple_query("SELECT 1 SETTINGS workload = 'dev'")
        .await
        .expect_err("pinned");
    assert!(message(&e).contains("SETTING_CONSTRAINT_VIOLATION"));
    assert_eq!(
        column(
            &app,
            "SELECT workload FROM system.processes SETTINGS workload = 'prod'"
        )
        .await,
        ["prod"]
    );
    // A default workload applies until the session picks another.
    let dana = login(server.port, "dana", "dana-pw")
        .await
        .expect("dana logs in");
    assert_eq!(
        column(
            &dana,
            "SELECT user || ' ' || workload FROM system.processes"
        )
        .await,
        ["dana dev"]
    );
    dana.batch_execute("SET workload = 'prod'")
        .await
        .expect("set");
    assert_eq!(column(&dana, "SHOW workload").await, ["prod"]);
    server.stop().await;
}

/// Connects and collects the notices the server sends on this connection.
async fn client_with_notices(port: u16) -> (Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (client, mut connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=tester dbname=x"),
        NoTls,
    )
    .await
    .expect("connects");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notice(n) = message {
                let _ = tx.send(n.message().to_string());
            }
        }
    });
    (client, rx)
}

#[tokio::test]
async fn a_waiting_query_is_told_where_it_waits() {
    let (_dir, server, admin) = one_slot(Duration::from_secs(30)).await;
    let running = spawn_query(
        &server,
        "SELECT sluice_barrier('run') SETTINGS workload = 'w'",
    )
    .await;
    until_running(&admin, 1).await;
    let (waiter, mut notices) = client_with_notices(server.port).await;
    let waiter = Arc::new(waiter);
    let waits = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .simple_query("SELECT 42 SETTINGS workload = 'w'")
                .await
        })
    };
    let notice = notices.recv().await.expect("a notice");
    // The notice comes while the query waits, not with its answer.
    let waiting = column(
        &admin,
        "SELECT count(*) FROM system.processes WHERE state = 'waiting'",
    )
    .await;
    assert_eq!(waiting, ["1"], "the notice arrived while its query waited");
    server.barriers.open("run");
    let rows = waits.await.expect("task").expect("runs after waiting");
    assert_eq!(rows.len(), 3, "row description, one row, command complete");
    assert!(
        notice
            .starts_with("waiting for resource 'q' in workload 'w' (queue /all/semaphore/w/fifo)"),
        "{notice}"
    );
    assert!(notice.contains("query_id"), "{notice}");
    running.await.expect("task").expect("slow query");
    // A query admitted at once gets no notice.
    waiter
        .simple_query("SELECT 1 SETTINGS workload = 'w'")
        .await
        .expect("runs");
    assert!(notices.try_recv().is_err(), "no notice without waiting");
    server.stop().await;
}

/// A server with one query slot in workload `w` and the given grace period.
async fn one_slot(grace: Duration) -> (tempfile::TempDir, TestServer, Client) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_with(ServerOptions {
        shutdown_grace: grace,
        ..test_options(dir.path())
    })
    .await;
    let admin = server.client().await;
    admin
        .batch_execute(
            "CREATE RESOURCE q (QUERY); \
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1; \
             CREATE WORKLOAD w IN all",
        )
        .await
        .expect("ddl");
    (dir, server, admin)
}

#[tokio::test]
async fn shutdown_fails_waiters_lets_running_finish_then_stops_stragglers() {
    // A generous grace: the running query finishes, the waiting one fails with 57P01.
    let (_dir, server, admin) = one_slot(Duration::from_secs(20)).await;
    let running = spawn_query(
        &server,
        "SELECT sluice_barrier('run') SETTINGS workload = 'w'",
    )
    .await;
    until_running(&admin, 1).await;
    let waiting = spawn_query(&server, "SELECT 2 SETTINGS workload = 'w'").await;
    until_waiting(&admin, 1).await;
    let idle = server.client().await;
    let barriers = server.barriers.clone();
    let stopped = server.begin_stop();
    let e = waiting.await.expect("task").expect_err("waiter fails");
    assert_eq!(sqlstate(&e), "57P01", "{e}");
    assert!(message(&e).contains("ABORTED"), "{}", message(&e));
    // No statement starts while draining.
    let e = idle.simple_query("SELECT 3").await.expect_err("draining");
    assert_eq!(sqlstate(&e), "57P01");
    barriers.open("run");
    let rows = running
        .await
        .expect("task")
        .expect("the running query finishes");
    assert_eq!(rows.len(), 3);
    stopped.await.expect("drained");

    // A short grace: the running query is stopped, with 57P01.
    let (_dir, server, admin) = one_slot(Duration::from_millis(200)).await;
    let running = spawn_query(&server, "SELECT pg_sleep(60) SETTINGS workload = 'w'").await;
    until_running(&admin, 1).await;
    server.begin_stop().await.expect("drained");
    let e = running.await.expect("task").expect_err("stopped");
    assert_eq!(sqlstate(&e), "57P01", "{e}");
}

/// Starts the server's HTTP endpoint (metrics and the live page) on a free port.
async fn serve_http(server: &TestServer) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(sluice_server::http::serve_http(
        listener,
        server.shared.clone(),
        std::future::pending(),
    ));
    port
}

async fn scrape(port: u16, request: &str) -> String {
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("metrics connect");
    socket.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    socket.read_to_string(&mut response).await.expect("read");
    response
}

#[tokio::test]
async fn metrics_count_admissions_rejections_and_waits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_with(test_options(dir.path())).await;
    let metrics_port = serve_http(&server).await;
    let admin = server.client().await;
    admin
        .batch_execute(
            "CREATE RESOURCE q (QUERY); \
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1; \
             CREATE WORKLOAD w IN all SETTINGS max_waiting_queries = 1",
        )
        .await
        .expect("ddl");
    for _ in 0..3 {
        admin
            .simple_query("SELECT 1 SETTINGS workload = 'w'")
            .await
            .expect("runs");
    }
    let running = spawn_query(
        &server,
        "SELECT sluice_barrier('run') SETTINGS workload = 'w'",
    )
    .await;
    until_running(&admin, 1).await;
    let waiting = spawn_query(&server, "SELECT 2 SETTINGS workload = 'w'").await;
    until_waiting(&admin, 1).await;
    let during = scrape(metrics_port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(during.starts_with("HTTP/1.1 200 OK"), "{during}");
    let e = admin
        .simple_query("SELECT 3 SETTINGS workload = 'w'")
        .await
        .expect_err("queue full");
    assert_eq!(sqlstate(&e), "53000");
    server.barriers.open("run");
    running.await.expect("task").expect("slow");
    waiting.await.expect("task").expect("waiter");
    let after = scrape(metrics_port, "GET /metrics HTTP/1.1\r\n\r\n").await;
    let series = |text: &str, name: &str| -> String {
        let prefix = format!("{name}{{resource=\"q\",workload=\"w\"");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(series(&during, "sluice_queries_waiting"), "1");
    assert_eq!(series(&during, "sluice_queries_in_flight"), "1");
    assert_eq!(series(&after, "sluice_queries_waiting"), "0");
    assert_eq!(series(&after, "sluice_queries_in_flight"), "0");
    assert_eq!(series(&after, "sluice_queries_admitted_total"), "5");
    assert_eq!(series(&after, "sluice_queries_rejected_total"), "1");
    assert_eq!(series(&after, "sluice_admission_wait_seconds_count"), "5");
    assert!(after.contains("# TYPE sluice_admission_wait_seconds histogram"));
    // The waiter waited at least until the slow query ended: not in the fastest bucket.
    let fastest = after
        .lines()
        .find(|l| {
            l.starts_with(
                "sluice_admission_wait_seconds_bucket{resource=\"q\",workload=\"w\",le=\"0.0005\"}",
            )
        })
        .expect("bucket");
    assert!(!fastest.ends_with(" 5"), "{fastest}");
    let other = scrape(metrics_port, "GET /nothing HTTP/1.1\r\n\r\n").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    // The same port serves the live page, and its figures as JSON.
    let page = scrape(metrics_port, "GET / HTTP/1.1\r\n\r\n").await;
    assert!(
        page.starts_with("HTTP/1.1 200") && page.contains("text/html"),
        "{page}"
    );
    let state = scrape(metrics_port, "GET /state HTTP/1.1\r\n\r\n").await;
    assert!(state.contains("\"path\":\"/all/semaphore/w\""), "{state}");
    server.stop().await;
}

#[tokio::test]
async fn a_rollback_that_cannot_undo_writes_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let (client, mut notices) = client_with_notices(server.port).await;
    client
        .batch_execute("CREATE TABLE r (x INT)")
        .await
        .expect("create");
    // A block that only reads rolls back in silence.
    client
        .batch_execute("BEGIN; SELECT count(*) FROM r; ROLLBACK")
        .await
        .expect("read-only block");
    client
        .batch_execute("BEGIN; INSERT INTO r VALUES (1); ROLLBACK")
        .await
        .expect("block with a write");
    let warning = tokio::time::timeout(Duration::from_secs(5), notices.recv())
        .await
        .expect("a warning arrives")
        .expect("notice");
    assert!(warning.contains("did not undo"), "{warning}");
    assert!(notices.try_recv().is_err(), "one warning only");
    // The write stayed, as the warning says.
    assert_eq!(column(&client, "SELECT count(*) FROM r").await, ["1"]);
    server.stop().await;
}

#[tokio::test]
async fn operators_kill_and_move_statements_and_only_admins_touch_others() {
    let (_dir, server) = with_users(vec![admin("root", "r00t"), user("dana", "dana-pw")]).await;
    let root = login(server.port, "root", "r00t").await.expect("root");
    root.batch_execute(
        "CREATE RESOURCE q (QUERY); CREATE WORKLOAD all SETTINGS max_concurrent_queries = 2; \
         CREATE WORKLOAD fast IN all SETTINGS max_concurrent_queries = 1; \
         CREATE WORKLOAD slow IN all SETTINGS max_concurrent_queries = 1",
    )
    .await
    .expect("ddl");
    let dana = login(server.port, "dana", "dana-pw").await.expect("dana");
    let root_runs = {
        let c = login(server.port, "root", "r00t").await.expect("root");
        tokio::spawn(async move {
            c.simple_query("SELECT sluice_barrier('root') SETTINGS workload = 'fast'")
                .await
        })
    };
    until_running(&root, 1).await;
    // dana's query waits behind root's in fast.
    let dana_waits = {
        let c = login(server.port, "dana", "dana-pw").await.expect("dana");
        tokio::spawn(async move {
            c.simple_query("SELECT sluice_barrier('dana') SETTINGS workload = 'fast'")
                .await
        })
    };
    until_waiting(&root, 1).await;

    // dana may not touch root's statement, and a condition reaching it is refused whole.
    let e = dana
        .simple_query("KILL QUERY WHERE query LIKE '%sluice_barrier%'")
        .await
        .expect_err("not hers");
    assert_refused(&e, "42501", "other users (root)");
    assert_eq!(server.barriers.waiting("root"), 1, "nothing was killed");

    // dana moves her own waiting statement to slow: it leaves fast's queue and runs there.
    let moved = column(
        &dana,
        "MOVE QUERY WHERE user = 'dana' AND state = 'waiting' TO WORKLOAD slow",
    )
    .await;
    assert_eq!(moved, ["moved from fast"]);
    until(&root, "SELECT workload || ' ' || state FROM system.processes WHERE \"user\" = 'dana' AND query LIKE 'SELECT sluice%'", "slow running").await;

    // An admin kills it while it runs, SYNC: gone when answered.
    let killed = column(
        &root,
        "KILL QUERY WHERE \"user\" = 'dana' AND query LIKE 'SELECT sluice%' SYNC",
    )
    .await;
    assert_eq!(killed, ["finished"]);
    let e = dana_waits.await.expect("task").expect_err("killed");
    assert_refused(&e, "57014", "KILL QUERY by user 'root'");

    // A waiting statement is killed too, leaving its queue.
    let waits = {
        let c = login(server.port, "dana", "dana-pw").await.expect("dana");
        tokio::spawn(async move { c.simple_query("SELECT 7 SETTINGS workload = 'fast'").await })
    };
    until_waiting(&root, 1).await;
    assert_eq!(
        column(&dana, "KILL QUERY WHERE state = 'waiting'").await,
        ["waiting"]
    );
    let e = tokio::time::timeout(Duration::from_secs(10), waits)
        .await
        .expect("the kill reaches a waiting statement")
        .expect("task")
        .expect_err("killed waiting");
    assert_eq!(sqlstate(&e), "57014");
    until_waiting(&root, 0).await;

    // pg_cancel_backend by pid, as Postgres tools send it.
    let pid = column(
        &root,
        "SELECT pid FROM system.processes WHERE query LIKE 'SELECT sluice%'",
    )
    .await;
    assert_eq!(pid.len(), 1);
    let e = dana
        .simple_query(&format!("SELECT pg_cancel_backend({})", pid[0]))
        .await
        .expect_err("root's backend");
    assert_eq!(sqlstate(&e), "42501");
    assert_eq!(
        column(&root, &format!("SELECT pg_cancel_backend({})", pid[0])).await,
        ["t"]
    );
    let e = root_runs.await.expect("task").expect_err("cancelled");
    assert_eq!(sqlstate(&e), "57014");
    assert_eq!(
        column(&root, "KILL QUERY WHERE query_id = 0 TEST").await,
        Vec::<String>::new()
    );
    assert_nothing_held(&root).await;
    server.stop().await;
}

#[tokio::test]
async fn a_users_hard_limit_applies_when_the_query_sets_none() {
    let (_dir, server) = with_users(vec![User {
        max_execution_time: Some(Duration::from_millis(300)),
        ..user("tim", "tim-pw")
    }])
    .await;
    let tim = login(server.port, "tim", "tim-pw").await.expect("tim");
    let e = tim
        .simple_query("SELECT sluice_barrier('never')")
        .await
        .expect_err("stopped at 300 ms");
    assert_refused(&e, "57014", "maximum: 0.300");
    // The query's own limit wins.
    let e = tim
        .simple_query("SELECT sluice_barrier('never') SETTINGS max_execution_time = 0.1")
        .await
        .expect_err("stopped at 100 ms");
    assert_refused(&e, "57014", "maximum: 0.100");
    server.stop().await;
}

/// `workload_admission_timeout_ms` bounds how long a statement waits for its query slot, from
/// the query's SETTINGS or the session's SET: past it the statement fails with
/// QUERY_SLOT_ACQUISITION_TIMEOUT (57014) naming the workload, without having started, and
/// leaves the queue; 0 waits as long as it takes.
#[tokio::test]
async fn an_admission_timeout_fails_a_waiting_statement_that_never_started() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE q (QUERY);
         CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
         CREATE WORKLOAD w IN all",
        false,
    )
    .await;
    let holder = spawn_query(
        &server,
        "SELECT sluice_barrier('slot') SETTINGS workload = 'w'",
    )
    .await;
    until_running(&admin, 1).await;
    let client = server.client().await;
    // Bounded, so that a server that ignored the setting fails the test instead of hanging it.
    let e = tokio::time::timeout(
        Duration::from_secs(10),
        client
            .simple_query("SELECT 1 SETTINGS workload = 'w', workload_admission_timeout_ms = 200"),
    )
    .await
    .expect("the statement ends by itself")
    .expect_err("times out");
    assert_refused(&e, "57014", "workload 'w'");
    assert!(
        message(&e).contains("QUERY_SLOT_ACQUISITION_TIMEOUT"),
        "{}",
        message(&e)
    );
    client
        .batch_execute("SET workload = 'w'; SET workload_admission_timeout_ms = 100")
        .await
        .expect("set");
    let e = client
        .simple_query("SELECT 2")
        .await
        .expect_err("times out");
    assert_refused(&e, "57014", "waited 100 ms");
    // 0 is no limit: it waits until the slot frees.
    client
        .batch_execute("SET workload_admission_timeout_ms = 0")
        .await
        .expect("set");
    let waiting = tokio::spawn(async move { client.simple_query("SELECT 3").await });
    until_waiting(&admin, 1).await;
    server.barriers.open("slot");
    holder.await.expect("task").expect("holder");
    waiting
        .await
        .expect("task")
        .expect("ran once the slot was free");
    assert_nothing_held(&admin).await;
    server.stop().await;
}

/// `pg_terminate_backend(pid)` stops the backend's statement and closes its connection, as in
/// PostgreSQL — a connection between statements too.
#[tokio::test]
async fn pg_terminate_backend_closes_the_connection() {
    let (_dir, server, admin) = started_with("CREATE RESOURCE q (QUERY)", false).await;
    let busy = server.client().await;
    let idle = server.client().await;
    // The idle one learns its own pid from its own statement, then goes quiet.
    let idle_pid = column(
        &idle,
        "SELECT pid FROM system.processes WHERE query LIKE 'SELECT pid FROM system.processes WHERE query LIKE%'",
    )
    .await;
    assert_eq!(idle_pid.len(), 1);
    let running = tokio::spawn(async move {
        let result = busy.simple_query("SELECT pg_sleep(20)").await;
        (result, busy)
    });
    until_running(&admin, 1).await;
    let busy_pid = column(
        &admin,
        "SELECT pid FROM system.processes WHERE query = 'SELECT pg_sleep(20)'",
    )
    .await;
    assert_eq!(busy_pid.len(), 1);
    for pid in [&busy_pid[0], &idle_pid[0]] {
        assert_eq!(
            column(&admin, &format!("SELECT pg_terminate_backend({pid})")).await,
            ["t"]
        );
    }
    let (result, busy) = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the statement stops")
        .expect("task");
    let e = result.expect_err("terminated");
    assert!(
        e.to_string().contains("pg_terminate_backend") || sqlstate(&e) == "57P01",
        "{e}"
    );
    for client in [&busy, &idle] {
        for _ in 0..500 {
            if client.is_closed() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(client.is_closed(), "the connection is closed");
        assert!(client.simple_query("SELECT 1").await.is_err());
    }
    // A pid nobody has: false.
    assert_eq!(
        column(&admin, "SELECT pg_terminate_backend(999999)").await,
        ["f"]
    );
    assert_nothing_held(&admin).await;
    server.stop().await;
}

/// The Grafana dashboard (`examples/grafana/sluice.json`) has what an import needs (a title, a
/// uid, a schema version, panels each with a type, a place and Prometheus queries) and names
/// only metrics a running sluice exports.
#[tokio::test]
async fn the_grafana_dashboard_names_only_exported_metrics() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grafana/sluice.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    for key in ["title", "uid"] {
        assert!(dashboard[key].is_string(), "{key}");
    }
    assert!(dashboard["schemaVersion"].is_u64(), "schemaVersion");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 4, "{} panels", panels.len());
    let mut exprs = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for panel in panels {
        assert!(panel["type"].is_string(), "{panel}");
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "duplicate id"
        );
        for key in ["x", "y", "w", "h"] {
            assert!(
                panel["gridPos"][key].is_u64(),
                "gridPos.{key} of {}",
                panel["title"]
            );
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for t in targets {
            exprs.push(t["expr"].as_str().expect("expr").to_string());
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if let Some(q) = var["definition"].as_str() {
            exprs.push(q.to_string());
        }
    }

    // What a running server exports, with a workload that has run a query.
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_with(test_options(dir.path())).await;
    let metrics_port = serve_http(&server).await;
    let admin = server.client().await;
    admin
        .batch_execute("CREATE RESOURCE q (QUERY); CREATE WORKLOAD all; CREATE WORKLOAD w IN all")
        .await
        .expect("ddl");
    admin
        .simple_query("SELECT 1 SETTINGS workload = 'w'")
        .await
        .expect("runs");
    let scraped = scrape(metrics_port, "GET /metrics HTTP/1.1\r\n\r\n").await;
    let exported: std::collections::HashSet<&str> = scraped
        .lines()
        .filter(|l| l.starts_with("sluice_"))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let mut named = 0;
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("sluice_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                exported.contains(name.as_str()),
                "{name} (in {expr}) is not exported:\n{scraped}"
            );
            named += 1;
            rest = &rest[at + name.len()..];
        }
    }
    assert!(
        named >= panels.len(),
        "the panels name sluice's metrics: {exprs:?}"
    );
    server.stop().await;
}

/// Encryption requests are refused as PostgreSQL refuses them: 'N' to an SSLRequest (no TLS
/// here) and to a GSSENCRequest, each once, in either order, then the start-up goes on; the
/// same request again is FATAL 0A000, "unsupported frontend protocol 1234.5679" (PostgreSQL
/// 15's words, checked by hand), and the connection closes. pgwire answered 'N' to every
/// SSLRequest, however often it came.
#[tokio::test]
async fn encryption_requests_are_refused_once_each_as_postgres_refuses_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), false).await;
    let request = |code: u32| {
        let mut r = 8u32.to_be_bytes().to_vec();
        r.extend_from_slice(&code.to_be_bytes());
        r
    };
    let (ssl, gss) = (request(80_877_103), request(80_877_104));
    for (again, version) in [(&ssl, "1234.5679"), (&gss, "1234.5680")] {
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
            .await
            .expect("connects");
        socket.write_all(again).await.expect("first request");
        let mut answer = [0u8; 1];
        socket.read_exact(&mut answer).await.expect("refused");
        assert_eq!(&answer, b"N");
        socket.write_all(again).await.expect("the request again");
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut rest))
            .await
            .expect("the server closes the connection")
            .expect("read");
        assert_eq!(rest.first(), Some(&b'E'), "an error: {rest:?}");
        let length = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        assert_eq!(rest.len(), length + 1, "the error is all: {rest:?}");
        let text = String::from_utf8_lossy(&rest);
        let want = format!("unsupported frontend protocol {version}: server supports 3.0 to 3.0");
        for part in ["SFATAL", "C0A000", &want] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }
    // One of each, either order, then a start-up: served.
    for first in [&ssl, &gss] {
        let second = if first == &ssl { &gss } else { &ssl };
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
            .await
            .expect("connects");
        let mut answers = [0u8; 2];
        socket.write_all(first).await.expect("first request");
        socket.read_exact(&mut answers[..1]).await.expect("refused");
        socket.write_all(second).await.expect("second request");
        socket.read_exact(&mut answers[1..]).await.expect("refused");
        assert_eq!(&answers, b"NN");
        let mut startup = 196608u32.to_be_bytes().to_vec();
        startup.extend_from_slice(b"user\0tester\0database\0x\0\0");
        let mut packet = (startup.len() as u32 + 4).to_be_bytes().to_vec();
        packet.extend_from_slice(&startup);
        socket.write_all(&packet).await.expect("start-up");
        let mut kinds = Vec::new();
        while kinds.last() != Some(&b'Z') {
            let mut head = [0u8; 5];
            socket.read_exact(&mut head).await.expect("a message");
            let mut body =
                vec![0; u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize - 4];
            socket.read_exact(&mut body).await.expect("its body");
            kinds.push(head[0]);
        }
        assert_eq!(
            kinds.first(),
            Some(&b'R'),
            "authentication ok first: {kinds:?}"
        );
        assert!(!kinds.contains(&b'E'), "no error: {kinds:?}");
    }
    server.stop().await;
}

/// What a client sends in place of the SCRAM exchange's first answer ends its login as
/// PostgreSQL ends it: one FATAL 08P01 and the connection closed, no ReadyForQuery after it
/// (a password message where SASLInitialResponse belongs, or one whose data length runs past
/// its end, panicked the connection's thread inside pgwire's decoder; a Query was ignored).
#[tokio::test]
async fn a_message_out_of_place_in_the_login_is_refused_as_postgres_refuses_it() {
    let (_dir, server) = with_users(vec![user("dana", "dana-pw")]).await;
    let frame = |tag: u8, body: &[u8]| {
        let mut f = vec![tag];
        f.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        f.extend_from_slice(body);
        f
    };
    let mut sasl_too_long = b"SCRAM-SHA-256\0".to_vec();
    sasl_too_long.extend_from_slice(&1000i32.to_be_bytes());
    sasl_too_long.extend_from_slice(b"n,,n=,r=abc");
    let cases = [
        (frame(b'p', b"dana-pw\0"), "malformed SASLInitialResponse"),
        (frame(b'p', &sasl_too_long), "malformed SASLInitialResponse"),
        (frame(b'p', b""), "malformed SASLInitialResponse"),
        (
            frame(b'Q', b"SELECT 1\0"),
            "expected SASL response, got message type 81",
        ),
    ];
    for (sent, want) in cases {
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
            .await
            .expect("connects");
        let mut startup = 196608u32.to_be_bytes().to_vec();
        startup.extend_from_slice(b"user\0dana\0database\0x\0\0");
        let mut packet = (startup.len() as u32 + 4).to_be_bytes().to_vec();
        packet.extend_from_slice(&startup);
        socket.write_all(&packet).await.expect("start-up");
        // AuthenticationSASL first; then the message out of place.
        let mut head = [0u8; 5];
        socket.read_exact(&mut head).await.expect("an answer");
        assert_eq!(head[0], b'R', "an authentication request first");
        let mut rest =
            vec![0; u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize - 4];
        socket.read_exact(&mut rest).await.expect("its body");
        socket.write_all(&sent).await.expect("sent");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer))
            .await
            .expect("the server closes the connection")
            .expect("read");
        assert_eq!(answer.first(), Some(&b'E'), "an error: {answer:?}");
        let length = u32::from_be_bytes([answer[1], answer[2], answer[3], answer[4]]) as usize;
        assert_eq!(
            answer.len(),
            length + 1,
            "the error is the last message: {answer:?}"
        );
        let text = String::from_utf8_lossy(&answer);
        for part in ["SFATAL", "C08P01", want] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }
    // The server still logs others in.
    let dana = login(server.port, "dana", "dana-pw")
        .await
        .expect("logs in");
    assert_eq!(column(&dana, "SELECT 1").await, ["1"]);
}

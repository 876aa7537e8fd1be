//! Upstream mode against a real PostgreSQL the test starts (the machine's binaries): what a
//! client gets through sluice is what it gets going direct — rows in text and binary, NULLs,
//! parameters, prepared statements, transactions and rollback, errors with every field,
//! notices, COPY both ways — while sluice answers its own statements, admits the forwarded
//! ones through the workload tree, forwards cancels, and survives the upstream going away.

mod support;

use std::time::Duration;

use sluice_server::upstream::{AdmissionMode, PoolMode, UpstreamOptions, UpstreamUrl};
use sluice_server::ServerOptions;
use sluice_testpg::{Auth, Postgres};
use support::{assert_thread_not_held, column, connect, until, until_waiting, TestServer};
use tokio_postgres::{Client, SimpleQueryMessage};

struct Setup {
    pg: Postgres,
    server: TestServer,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

async fn setup(pool_mode: PoolMode, pool_size: usize) -> Setup {
    setup_with(pool_mode, pool_size, AdmissionMode::Statement, None).await
}

async fn setup_with(
    pool_mode: PoolMode,
    pool_size: usize,
    admission: AdmissionMode,
    server_idle_timeout: Option<Duration>,
) -> Setup {
    setup_on_threads(pool_mode, pool_size, admission, server_idle_timeout, 2).await
}

async fn setup_on_threads(
    pool_mode: PoolMode,
    pool_size: usize,
    admission: AdmissionMode,
    server_idle_timeout: Option<Duration>,
    connection_threads: usize,
) -> Setup {
    let options = |url| UpstreamOptions {
        pool_size,
        pool_mode,
        admission,
        server_idle_timeout,
        ..UpstreamOptions::new(url)
    };
    setup_options(options, connection_threads).await
}

/// A PostgreSQL and a sluice in front of it with the upstream options `options` makes of the
/// URL.
async fn setup_options(
    options: impl FnOnce(UpstreamUrl) -> UpstreamOptions,
    connection_threads: usize,
) -> Setup {
    let pg_dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(pg_dir.path(), "owner", Auth::Password("owner-pw".into()));
    pg.psql("CREATE DATABASE shop OWNER owner");
    let data = tempfile::tempdir().expect("tempdir");
    let url = UpstreamUrl::parse(&format!(
        "postgres://owner:owner-pw@127.0.0.1:{}/shop?connect_timeout=5",
        pg.port
    ))
    .expect("url");
    let server = TestServer::start_with(ServerOptions {
        upstream: Some(options(url)),
        // As `sluice serve` runs by default: connections on threads of their own, with the
        // upstream connections lent to them moved there.
        connection_threads,
        ..support::test_options(data.path())
    })
    .await;
    Setup {
        pg,
        server,
        _dirs: (pg_dir, data),
    }
}

impl Setup {
    async fn direct(&self) -> Client {
        connect(&format!(
            "host=127.0.0.1 port={} user=owner password=owner-pw dbname=shop",
            self.pg.port
        ))
        .await
        .expect("direct")
    }

    /// A client of sluice on the upstream's database (a client's database name selects the
    /// upstream's).
    async fn through(&self) -> Client {
        self.server
            .client_with(&format!(
                "host=127.0.0.1 port={} user=owner dbname=shop",
                self.server.port
            ))
            .await
    }
}

/// How many QUERY slots `all` holds (in the tree [`query_tree`] makes).
const HELD: &str =
    "SELECT inflight_requests FROM system.scheduler WHERE resource = 'q' AND path = '/all/semaphore'";

/// The admission tests' tree: a QUERY resource `q` and a workload `all` of `slots` slots.
async fn query_tree(admin: &Client, slots: usize) {
    admin
        .batch_execute(&format!(
            "CREATE RESOURCE q (QUERY); CREATE WORKLOAD all SETTINGS max_concurrent_queries = {slots}"
        ))
        .await
        .expect("tree");
}

/// Every message of a simple query, as comparable text.
async fn simple(client: &Client, sql: &str) -> Vec<String> {
    match client.simple_query(sql).await {
        Ok(messages) => messages
            .into_iter()
            .map(|m| match m {
                SimpleQueryMessage::Row(r) => format!(
                    "row {:?}",
                    (0..r.len())
                        .map(|i| r.get(i).map(str::to_string))
                        .collect::<Vec<_>>()
                ),
                SimpleQueryMessage::CommandComplete(n) => format!("complete {n}"),
                SimpleQueryMessage::RowDescription(d) => format!(
                    "columns {:?}",
                    d.iter().map(|c| c.name().to_string()).collect::<Vec<_>>()
                ),
                _ => "other".into(),
            })
            .collect(),
        Err(e) => vec![describe_error(&e)],
    }
}

/// An error with every field Postgres sends.
fn describe_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "error {} {} | {:?} | {:?} | {:?} | {:?}",
            db.code().code(),
            db.message(),
            db.detail(),
            db.hint(),
            db.position(),
            db.constraint()
        ),
        None => format!("error {e}"),
    }
}

const SCHEMA: &str = "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), seen timestamptz, tags text[], blob bytea);
     INSERT INTO items VALUES (1, 'apple', 1.50, '2026-01-02 03:04:05+00', '{a,b}', '\\x0102'),
                              (2, NULL, NULL, NULL, NULL, NULL),
                              (3, 'ümlaut ☃', 99999999.99, 'infinity', '{}', '\\x');";

#[tokio::test]
async fn clients_get_what_they_get_going_direct() {
    let s = setup(PoolMode::Session, 4).await;
    let direct = s.direct().await;
    let through = s.through().await;
    direct.batch_execute(SCHEMA).await.expect("schema");

    // Simple protocol: rows, NULLs, several statements in one text, errors with all fields.
    for sql in [
        "SELECT * FROM items ORDER BY id",
        "SELECT 1 AS one; SELECT 'two' AS two, NULL AS nothing",
        "SELECT version() = version()",
        "INSERT INTO items VALUES (1, 'dup')",
        "SELECT nope FROM items",
        "SELECT 1/0",
        "",
    ] {
        assert_eq!(
            simple(&through, sql).await,
            simple(&direct, sql).await,
            "{sql}"
        );
    }
    // Extended protocol with binary results and parameters (tokio-postgres's way).
    let q =
        "SELECT id, name, price::text, seen, tags, blob FROM items WHERE id = ANY($1) ORDER BY id";
    let rows = |rows: Vec<tokio_postgres::Row>| {
        rows.iter()
            .map(|r| {
                format!(
                    "{:?} {:?} {:?} {:?} {:?} {:?}",
                    r.get::<_, i32>(0),
                    r.get::<_, Option<String>>(1),
                    r.get::<_, Option<String>>(2),
                    r.get::<_, Option<String>>(3).is_some(),
                    r.get::<_, Option<Vec<String>>>(4),
                    r.get::<_, Option<Vec<u8>>>(5)
                )
            })
            .collect::<Vec<_>>()
    };
    let ids: Vec<i32> = vec![1, 2, 3];
    let q = q.replace("seen,", "seen::text,");
    assert_eq!(
        rows(through.query(&q, &[&ids]).await.expect("through")),
        rows(direct.query(&q, &[&ids]).await.expect("direct"))
    );
    // A prepared statement used many times; its description as the upstream gives it.
    let stmt = through
        .prepare("SELECT name FROM items WHERE id = $1")
        .await
        .expect("prepare");
    assert_eq!(stmt.params(), &[tokio_postgres::types::Type::INT4]);
    for id in 1..=3 {
        let direct_name: Option<String> = direct
            .query_one("SELECT name FROM items WHERE id = $1", &[&id])
            .await
            .expect("direct")
            .get(0);
        let name: Option<String> = through
            .query_one(&stmt, &[&id])
            .await
            .expect("through")
            .get(0);
        assert_eq!(name, direct_name);
    }
    // An extended-protocol error keeps its fields.
    let through_err = through
        .execute("INSERT INTO items VALUES ($1, 'again')", &[&1i32])
        .await
        .expect_err("duplicate");
    let direct_err = direct
        .execute("INSERT INTO items VALUES ($1, 'again')", &[&1i32])
        .await
        .expect_err("duplicate");
    assert_eq!(describe_error(&through_err), describe_error(&direct_err));
    assert!(describe_error(&through_err).contains("23505"));

    // Transactions: a rollback undoes, a failed transaction says so until it ends.
    through
        .batch_execute("BEGIN; INSERT INTO items VALUES (10, 'gone'); ROLLBACK")
        .await
        .expect("rollback");
    assert_eq!(
        column(&direct, "SELECT count(*) FROM items WHERE id = 10").await,
        ["0"]
    );
    through.batch_execute("BEGIN").await.expect("begin");
    through
        .batch_execute("SELECT 1/0")
        .await
        .expect_err("fails");
    let aborted = through
        .batch_execute("SELECT 1")
        .await
        .expect_err("aborted");
    assert_eq!(
        aborted.as_db_error().map(|e| e.code().code()),
        Some("25P02")
    );
    through.batch_execute("ROLLBACK").await.expect("rollback");
    through
        .batch_execute("BEGIN; INSERT INTO items VALUES (11, 'kept'); COMMIT")
        .await
        .expect("commit");
    assert_eq!(
        column(&direct, "SELECT name FROM items WHERE id = 11").await,
        ["kept"]
    );

    // COPY both ways.
    {
        use futures::SinkExt;
        let sink = through
            .copy_in("COPY items (id, name) FROM STDIN")
            .await
            .expect("copy in");
        futures::pin_mut!(sink);
        sink.send(bytes::Bytes::from_static(b"20\tcopied\n21\t\\N\n"))
            .await
            .expect("data");
        assert_eq!(sink.finish().await.expect("finish"), 2);
    }
    assert_eq!(
        simple(
            &through,
            "COPY (SELECT id, name FROM items WHERE id >= 20 ORDER BY id) TO STDOUT"
        )
        .await,
        simple(
            &direct,
            "COPY (SELECT id, name FROM items WHERE id >= 20 ORDER BY id) TO STDOUT"
        )
        .await
    );
    let copied = {
        use futures::TryStreamExt;
        let out = through
            .copy_out("COPY (SELECT id, name FROM items WHERE id >= 20 ORDER BY id) TO STDOUT")
            .await
            .expect("copy out");
        futures::pin_mut!(out);
        let mut all = Vec::new();
        while let Some(chunk) = out.try_next().await.expect("chunk") {
            all.extend_from_slice(&chunk);
        }
        String::from_utf8(all).expect("utf-8")
    };
    assert_eq!(copied, "20\tcopied\n21\t\\N\n");

    // Notices from the upstream reach the client.
    let (notices_tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let (client, mut connection) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=owner dbname=shop",
            s.server.port
        ),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connects");
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        use futures::StreamExt;
        while let Some(Ok(m)) = messages.next().await {
            let _ = notices_tx.send(match m {
                tokio_postgres::AsyncMessage::Notice(n) => {
                    format!("{} {} {:?}", n.code().code(), n.message(), n.detail())
                }
                tokio_postgres::AsyncMessage::Notification(n) => {
                    format!("notify {} {}", n.channel(), n.payload())
                }
                _ => "other".into(),
            });
        }
    });
    client
        .batch_execute(
            "DO $$ BEGIN RAISE NOTICE 'hello from upstream' USING DETAIL = 'the detail'; END $$",
        )
        .await
        .expect("notice");
    assert_eq!(
        notices.recv().await.expect("a notice"),
        "00000 hello from upstream Some(\"the detail\")"
    );

    // LISTEN in session pooling: a NOTIFY reaches the idle client as it happens.
    client.batch_execute("LISTEN orders").await.expect("listen");
    direct
        .batch_execute("NOTIFY orders, 'order 7'")
        .await
        .expect("notify");
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), notices.recv())
            .await
            .expect("delivered while idle"),
        Some("notify orders order 7".to_string())
    );

    // A text mixing sluice's statements and the upstream's: each answered in turn.
    assert_eq!(
        simple(
            &through,
            "SHOW workload; SELECT 41 + 1 AS answer; SHOW workload"
        )
        .await,
        [
            "columns [\"workload\"]",
            "row [Some(\"default\")]",
            "complete 1",
            "columns [\"answer\"]",
            "row [Some(\"42\")]",
            "complete 1",
            "columns [\"workload\"]",
            "row [Some(\"default\")]",
            "complete 1"
        ]
    );
    // Row limits on Execute: a portal read two rows at a time, inside a transaction.
    {
        let mut through = s.through().await;
        let tx = through.transaction().await.expect("begin");
        let stmt = tx
            .prepare("SELECT generate_series(1, 5)")
            .await
            .expect("prepare");
        let portal = tx.bind(&stmt, &[]).await.expect("bind");
        let mut got = Vec::new();
        loop {
            let rows = tx.query_portal(&portal, 2).await.expect("execute");
            if rows.is_empty() {
                break;
            }
            assert!(rows.len() <= 2);
            got.extend(rows.iter().map(|r| r.get::<_, i32>(0)));
        }
        assert_eq!(got, [1, 2, 3, 4, 5]);
        tx.commit().await.expect("commit");
    }
    // Pipelining: several statements in flight on one connection, answered in order.
    {
        let (a, b, c) = tokio::join!(
            through.query_one("SELECT $1::int + 1", &[&1i32]),
            through.query_one("SELECT $1::text || '!'", &[&"two"]),
            through.query_one("SELECT count(*) FROM items WHERE id < $1", &[&3i32]),
        );
        assert_eq!(a.expect("a").get::<_, i32>(0), 2);
        assert_eq!(b.expect("b").get::<_, String>(0), "two!");
        assert_eq!(c.expect("c").get::<_, i64>(0), 2);
    }
    // A start-up's options that are not sluice's reach the upstream, its workload stays
    // sluice's; in session pooling the upstream sees the client's application name.
    let configured = connect(&format!(
        "host=127.0.0.1 port={} user=owner dbname=shop application_name=stocktake options='-c search_path=archive,public -c workload=reports'",
        s.server.port
    ))
    .await
    .expect("connects");
    let configured_direct = connect(&format!(
        "host=127.0.0.1 port={} user=owner password=owner-pw dbname=shop options='-c search_path=archive,public'",
        s.pg.port
    ))
    .await
    .expect("direct");
    assert_eq!(
        column(&configured, "SHOW search_path").await,
        column(&configured_direct, "SHOW search_path").await
    );
    assert_eq!(column(&configured, "SHOW workload").await, ["reports"]);
    assert_eq!(
        column(
            &configured,
            "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        )
        .await,
        ["stocktake"]
    );

    // sluice's own statements are answered by sluice, the SETTINGS tail is cut.
    assert_eq!(column(&through, "SHOW workload").await, ["default"]);
    through
        .batch_execute("SET workload = 'reports'")
        .await
        .expect("set");
    assert_eq!(column(&through, "SHOW workload").await, ["reports"]);
    assert_eq!(
        column(
            &through,
            "SELECT count(*) FROM items SETTINGS workload = 'adhoc'"
        )
        .await,
        column(&direct, "SELECT count(*) FROM items").await
    );
    assert_eq!(
        column(&through, "SELECT count(*) > 0 FROM system.query_log").await,
        ["t"]
    );
    // A forwarded statement's rows are counted from its CommandComplete, with either protocol.
    column(
        &through,
        "SELECT n AS simple_seven FROM generate_series(1, 7) AS n",
    )
    .await;
    through
        .query(
            "SELECT n AS extended_five FROM generate_series(1, 5) AS n",
            &[],
        )
        .await
        .expect("extended");
    for (marker, rows) in [("simple_seven", "7"), ("extended_five", "5")] {
        assert_eq!(
            column(
                &through,
                &format!("SELECT rows FROM system.query_log WHERE query LIKE '%AS {marker} FROM%'"),
            )
            .await,
            [rows],
            "{marker}"
        );
    }
    // A Postgres setting goes upstream.
    through
        .batch_execute("SET search_path = nowhere, public")
        .await
        .expect("set");
    assert_eq!(
        column(&through, "SHOW search_path").await,
        ["nowhere, public"]
    );
    // The client saw the upstream's version at start-up.
    let version = column(&direct, "SHOW server_version").await;
    assert_eq!(column(&through, "SHOW server_version").await, version);
}

/// A simple Query sent again with new integers is read once (`Shapes`): each run still goes
/// upstream as its own text, is logged as its own text under one fingerprint, and what only
/// looks alike (another kind of statement, sluice's own, a SETTINGS tail) is read anew.
/// A statement of megabytes is read (lexed, split, classified) on a blocking thread, not on
/// the connection thread: another client of the same thread is answered at once while the big
/// text is read. (Read in line, a 16 MB text held the thread — and the other client's answers
/// — for most of the big statement's time: ~1.3 s of ~1.7 in a debug build.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_of_megabytes_holds_no_other_client_of_its_thread() {
    let setup = setup_on_threads(PoolMode::Session, 4, AdmissionMode::Statement, None, 1).await;
    let other = setup.through().await;
    simple(&other, "SELECT 1").await;
    let big_client = setup.through().await;
    // 16 MB, which PostgreSQL refuses at its first word: the big statement's time is
    // sluice's reading of it, nearly all.
    let big = format!("SELEC 1{}", ",1".repeat(8 << 20));
    let started = std::time::Instant::now();
    let big_one = tokio::spawn(async move {
        let refused = big_client.simple_query(&big).await.is_err();
        (refused, started.elapsed())
    });
    // Its bytes are on their way, and being read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let asked = std::time::Instant::now();
        assert_eq!(
            simple(&other, "SELECT 1").await,
            ["columns [\"?column?\"]", "row [Some(\"1\")]", "complete 1"]
        );
        slowest = slowest.max(asked.elapsed());
    }
    let (refused, took) = big_one.await.expect("big client");
    assert!(refused, "the 16 MB text was refused");
    assert_thread_not_held(slowest, took);
    assert_eq!(simple(&other, "SELECT 2").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_repeated_with_new_integers_runs_as_written() {
    let s = setup(PoolMode::Session, 2).await;
    let through = s.through().await;
    for n in [1, 22, 333] {
        assert_eq!(
            simple(&through, &format!("SELECT {n} AS shaped, {n} + 1 AS next;")).await,
            [
                "columns [\"shaped\", \"next\"]".to_string(),
                format!("row [Some(\"{n}\"), Some(\"{}\")]", n + 1),
                "complete 1".to_string(),
            ]
        );
    }
    let logged = column(
        &through,
        "SELECT query || ' ' || fingerprint FROM system.query_log \
         WHERE query LIKE '%AS shaped%' ORDER BY arrived",
    )
    .await;
    let fingerprint = sluice_sql::fingerprint("SELECT 1 AS shaped, 1 + 1 AS next").id;
    assert_eq!(
        logged,
        [1, 22, 333].map(|n| format!("SELECT {n} AS shaped, {n} + 1 AS next {fingerprint}"))
    );
    // The same shape with a SETTINGS tail: the tail is read (and cut) as always.
    query_tree(&through, 1).await;
    assert_eq!(
        column(
            &through,
            "SELECT 4 AS shaped, 4 + 1 AS next SETTINGS workload = 'all'"
        )
        .await,
        ["4"]
    );
    assert_eq!(
        column(
            &through,
            "SELECT workload FROM system.query_log WHERE query LIKE 'SELECT 4 AS shaped%'"
        )
        .await,
        ["all"]
    );
    // A signal is sluice's own by its pid: one too large for a pid goes upstream (which has
    // no pg_cancel_backend(bigint)), a pid is answered by sluice, whatever came before.
    let e = through
        .simple_query("SELECT pg_cancel_backend(99999999999)")
        .await
        .expect_err("refused upstream");
    assert_eq!(e.as_db_error().map(|d| d.code().code()), Some("42883"));
    assert_eq!(column(&through, "SELECT pg_cancel_backend(7)").await, ["f"]);
    assert_eq!(
        column(
            &through,
            "SELECT query FROM system.query_log WHERE query LIKE 'SELECT pg_cancel%'"
        )
        .await,
        ["SELECT pg_cancel_backend(99999999999)"],
        "only the forwarded one is logged"
    );
}

#[tokio::test]
async fn transaction_pooling_shares_connections_and_leaks_nothing() {
    let s = setup(PoolMode::Transaction, 1).await;
    let direct = s.direct().await;
    direct
        .batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2), (3)")
        .await
        .expect("schema");
    let a = s.through().await;
    let b = s.through().await;
    // Both prepare the same statement; each uses it on the one pooled connection in turn.
    let sa = a
        .prepare("SELECT count(*) FROM t WHERE x >= $1")
        .await
        .expect("prepare a");
    let sb = b
        .prepare("SELECT count(*) FROM t WHERE x >= $1")
        .await
        .expect("prepare b");
    let other = b.prepare("SELECT sum(x) FROM t").await.expect("prepare b2");
    for _ in 0..3 {
        let n: i64 = a.query_one(&sa, &[&2i32]).await.expect("a").get(0);
        assert_eq!(n, 2);
        let n: i64 = b.query_one(&sb, &[&1i32]).await.expect("b").get(0);
        assert_eq!(n, 3);
        let n: i64 = b.query_one(&other, &[]).await.expect("b2").get(0);
        assert_eq!(n, 6);
    }
    // A transaction keeps its connection: b waits for a's to end.
    a.batch_execute("BEGIN; INSERT INTO t VALUES (4)")
        .await
        .expect("begin");
    let waiting = {
        let b = s.through().await;
        tokio::spawn(async move { column(&b, "SELECT count(*) FROM t /* b waits */").await })
    };
    // b's statement is admitted (listed) and so at the pool, where it must wait.
    let watcher = s.through().await;
    until(
        &watcher,
        "SELECT count(*) FROM system.processes WHERE query LIKE '%b waits%' AND query NOT LIKE '%system.%'",
        "1",
    )
    .await;
    assert!(
        !waiting.is_finished(),
        "the only connection is a's until its transaction ends"
    );
    a.batch_execute("COMMIT").await.expect("commit");
    assert_eq!(waiting.await.expect("b ran"), ["4"]);
    // A session setting does not follow the connection to another client.
    a.batch_execute("SET search_path = nowhere")
        .await
        .expect("set");
    assert_eq!(column(&b, "SHOW search_path").await, ["\"$user\", public"]);
    // Closing a prepared statement leaves the other client's.
    drop(sa);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let n: i64 = b
        .query_one(&sb, &[&3i32])
        .await
        .expect("b after a closed")
        .get(0);
    assert_eq!(n, 2);
}

/// Transaction pooling keeps at most `max_prepared_statements` prepared on an upstream
/// connection, as PgBouncer does: preparing one more closes the one used longest ago, and a
/// statement closed so is prepared again when a client uses it next. Unbounded, a connection
/// kept every statement its clients ever prepared (2,000 from one psycopg client that held
/// 100 at a time).
#[tokio::test]
async fn transaction_pooling_keeps_a_bounded_number_of_statements_prepared() {
    let options = |url| UpstreamOptions {
        pool_size: 1,
        pool_mode: PoolMode::Transaction,
        server_idle_timeout: None,
        max_prepared_statements: 3,
        ..UpstreamOptions::new(url)
    };
    let s = setup_options(options, 2).await;
    let client = s.through().await;
    let held = "SELECT count(*) FROM pg_prepared_statements";
    let mut statements = Vec::new();
    for i in 0..8i32 {
        let statement = client
            .prepare(&format!("SELECT {i} + $1::int4"))
            .await
            .expect("prepare");
        let n: i32 = client
            .query_one(&statement, &[&1i32])
            .await
            .expect("run")
            .get(0);
        assert_eq!(n, i + 1);
        statements.push(statement);
    }
    // The one upstream connection holds three of the eight.
    assert_eq!(column(&client, held).await, ["3"]);
    // Every one still runs, in the order prepared and back: those closed upstream are
    // prepared again in front of their use.
    for (i, statement) in statements
        .iter()
        .enumerate()
        .chain(statements.iter().enumerate().rev())
    {
        let n: i32 = client
            .query_one(statement, &[&10i32])
            .await
            .expect("run again")
            .get(0);
        assert_eq!(n, i as i32 + 10);
    }
    assert_eq!(column(&client, held).await, ["3"]);

    // A batch the upstream skips after an error: the closes and prepares sluice put in it
    // never happened, the last undone first. Three statements prepared; then, after a
    // failing Execute, a fourth (closing the oldest, s1) and s1 again (closing s2) are
    // skipped: the connection still holds s1, s2 and s3, and s1 runs without being
    // prepared again (which the upstream would refuse: 42P05, it exists).
    use tokio::io::AsyncWriteExt;
    let mut raw = raw_client(s.server.port).await;
    let bind_execute = |statement: &str| {
        let mut bind = format!("\0{statement}\0").into_bytes();
        bind.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        let mut out = message(b'B', &bind);
        out.extend(message(b'E', b"\0\0\0\0\0"));
        out
    };
    let mut batch = Vec::new();
    for i in 1..=3 {
        batch.extend(parse_bind_execute(
            &format!("s{i}"),
            "",
            &format!("SELECT {i}"),
        ));
    }
    batch.extend(message(b'S', b""));
    raw.write_all(&batch).await.expect("three prepared");
    let answered = messages_until_ready(&mut raw).await;
    assert!(answered.iter().all(|(tag, _)| *tag != b'E'), "{answered:?}");
    let mut batch = parse_bind_execute("", "", "SELECT 1 / 0");
    batch.extend(parse_bind_execute("s4", "", "SELECT 4"));
    batch.extend(bind_execute("s1"));
    batch.extend(message(b'S', b""));
    raw.write_all(&batch).await.expect("a failing batch");
    let answered = messages_until_ready(&mut raw).await;
    assert_eq!(
        answered.iter().filter(|(tag, _)| *tag == b'E').count(),
        1,
        "{answered:?}"
    );
    let mut batch = bind_execute("s1");
    batch.extend(bind_execute("s2"));
    batch.extend(message(b'S', b""));
    raw.write_all(&batch).await.expect("s1 and s2 again");
    let answered = messages_until_ready(&mut raw).await;
    assert!(
        answered.iter().all(|(tag, _)| *tag != b'E'),
        "s1 and s2 run as they are: {:?}",
        answered
            .iter()
            .map(|(tag, body)| (*tag as char, String::from_utf8_lossy(body).into_owned()))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn forwarded_statements_are_admitted_and_cancels_reach_the_upstream() {
    let s = setup(PoolMode::Session, 4).await;
    let admin = s.through().await;
    query_tree(&admin, 1).await;
    let holder = s.through().await;
    let cancel = holder.cancel_token();
    let running = tokio::spawn(async move {
        holder
            .simple_query("SELECT pg_sleep(60) SETTINGS workload = 'all'")
            .await
    });
    support::until(&admin, HELD, "1").await;
    // A second statement waits for the slot, visibly.
    let waiter = s.through().await;
    let waiting =
        tokio::spawn(async move { column(&waiter, "SELECT 42 SETTINGS workload = 'all'").await });
    until_waiting(&admin, 1).await;
    assert_eq!(
        column(
            &admin,
            "SELECT waiting_for FROM system.processes WHERE state = 'waiting'"
        )
        .await,
        ["q"]
    );
    // A cancel reaches a forwarded statement still waiting for its slot: it leaves the queue
    // (nothing of it was sent upstream yet).
    let impatient = s.through().await;
    let impatient_cancel = impatient.cancel_token();
    let gave_up = tokio::spawn(async move {
        impatient
            .simple_query("SELECT 43 SETTINGS workload = 'all'")
            .await
    });
    until_waiting(&admin, 2).await;
    impatient_cancel
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("cancel");
    let e = tokio::time::timeout(Duration::from_secs(30), gave_up)
        .await
        .expect("a cancel ends the wait")
        .expect("joined")
        .expect_err("cancelled while waiting");
    assert_eq!(e.as_db_error().map(|d| d.code().code()), Some("57014"));
    until_waiting(&admin, 1).await;
    // A cancel to sluice stops the upstream statement and frees the slot.
    cancel
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("cancel");
    let e = running.await.expect("joined").expect_err("cancelled");
    assert_eq!(e.as_db_error().map(|d| d.code().code()), Some("57014"));
    assert_eq!(waiting.await.expect("ran"), ["42"]);
    assert_eq!(column(&admin, HELD).await, ["0"]);
    // The upstream has nothing running any more.
    let direct = s.direct().await;
    assert_eq!(
        column(
            &direct,
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'"
        )
        .await,
        ["0"]
    );
    // KILL QUERY stops a forwarded statement upstream too.
    let victim = s.through().await;
    let killed = tokio::spawn(async move {
        victim
            .simple_query("SELECT pg_sleep(61) SETTINGS workload = 'all'")
            .await
    });
    support::until(&admin, HELD, "1").await;
    admin
        .batch_execute("KILL QUERY WHERE query LIKE '%pg_sleep(61)%'")
        .await
        .expect("kill");
    let e = killed.await.expect("joined").expect_err("killed");
    assert!(e.as_db_error().is_some(), "{e}");
    assert_eq!(column(&admin, HELD).await, ["0"]);
    // A client that goes away: its upstream statement is cancelled, its slot freed.
    let mut leaver = std::process::Command::new("psql")
        .args(["-X", "-h", "127.0.0.1", "-p"])
        .arg(s.server.port.to_string())
        .args(["-U", "owner", "-d", "shop", "-c"])
        .arg("SELECT pg_sleep(62) SETTINGS workload = 'all'")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("psql");
    support::until(&admin, HELD, "1").await;
    leaver.kill().expect("kill psql");
    let _ = leaver.wait();
    support::until(&admin, HELD, "0").await;
    let running = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(6%'";
    support::until(&direct, running, "0").await;

    // max_execution_time: sluice's own timeout, told apart from the upstream's.
    let e = admin
        .simple_query("SELECT pg_sleep(30) SETTINGS workload = 'all', max_execution_time = 0.3")
        .await
        .expect_err("timed out");
    let db = e.as_db_error().expect("db error");
    assert_eq!(db.code().code(), "57014");
    assert!(
        db.message().contains("TIMEOUT_EXCEEDED"),
        "{}",
        db.message()
    );
    assert_eq!(column(&admin, HELD).await, ["0"]);
}

#[tokio::test]
async fn an_upstream_that_goes_away_fails_fast_and_comes_back() {
    let s = setup(PoolMode::Transaction, 4).await;
    let admin = s.through().await;
    query_tree(&admin, 8).await;
    let direct = s.direct().await;
    direct
        .batch_execute("CREATE TABLE t (x int); INSERT INTO t SELECT generate_series(1, 1000)")
        .await
        .expect("schema");
    // Load: clients running statements in a loop while the upstream is killed.
    let mut load = Vec::new();
    for _ in 0..4 {
        let c = s.through().await;
        load.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            for _ in 0..200 {
                if let Err(e) = c
                    .simple_query("SELECT sum(x) FROM t SETTINGS workload = 'all'")
                    .await
                {
                    errors.push(
                        e.as_db_error()
                            .map(|d| d.code().code().to_string())
                            .unwrap_or_else(|| "closed".into()),
                    );
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            errors
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.pg.kill();
    let mut codes: Vec<String> = Vec::new();
    for l in load {
        codes.extend(l.await.expect("joined"));
    }
    assert!(!codes.is_empty(), "the upstream's loss reached the clients");
    assert!(
        codes
            .iter()
            .all(|c| c == "08006" || c == "57P01" || c == "57P02" || c == "57P03"),
        "{codes:?}"
    );
    // sluice keeps serving its own statements; nothing is held.
    assert_eq!(column(&admin, HELD).await, ["0"]);
    let c = s.through().await;
    let started = std::time::Instant::now();
    let e = c.simple_query("SELECT 1").await.expect_err("down");
    assert_eq!(e.as_db_error().map(|d| d.code().code()), Some("08006"));
    assert!(e
        .as_db_error()
        .is_some_and(|d| d.message().contains(&format!("127.0.0.1:{}", s.pg.port))));
    assert!(started.elapsed() < Duration::from_secs(5), "fails fast");
    // Back up: service resumes (after the pool's backoff).
    s.pg.restart();
    let mut resumed = false;
    for _ in 0..100 {
        if let Ok(rows) = c.simple_query("SELECT count(*) FROM t").await {
            resumed = rows
                .iter()
                .any(|m| matches!(m, SimpleQueryMessage::Row(r) if r.get(0) == Some("1000")));
            if resumed {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(resumed, "service resumed");
    assert_eq!(column(&admin, HELD).await, ["0"]);
}

#[tokio::test]
async fn transaction_admission_holds_the_slot_until_the_transaction_ends() {
    for admission in [AdmissionMode::Transaction, AdmissionMode::Statement] {
        let s = setup_with(PoolMode::Transaction, 4, admission, None).await;
        let admin = s.through().await;
        query_tree(&admin, 1).await;
        let a = s.through().await;
        a.batch_execute("SET workload = 'all'").await.expect("set");
        a.batch_execute("BEGIN").await.expect("begin");
        assert_eq!(column(&a, "SELECT 1").await, ["1"]);
        // Between a's statements, inside its transaction: b's statement in the same workload.
        let b = s.through().await;
        let other =
            tokio::spawn(async move { column(&b, "SELECT 2 SETTINGS workload = 'all'").await });
        if admission == AdmissionMode::Transaction {
            until_waiting(&admin, 1).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(
                !other.is_finished(),
                "the slot is a's until its transaction ends"
            );
            a.batch_execute("COMMIT").await.expect("commit");
            assert_eq!(other.await.expect("b ran"), ["2"]);
        } else {
            // Each statement is admitted on its own: b runs while a's transaction is open.
            assert_eq!(other.await.expect("b ran"), ["2"]);
            a.batch_execute("COMMIT").await.expect("commit");
        }
        assert_eq!(column(&admin, HELD).await, ["0"], "{admission:?}");
    }
}

#[tokio::test]
async fn a_grant_reaches_the_upstream_as_its_settings() {
    let s = setup(PoolMode::Session, 2).await;
    let admin = s.through().await;
    admin
        .batch_execute(
            "CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
             CREATE WORKLOAD all SETTINGS max_concurrent_threads = 3",
        )
        .await
        .expect("tree");
    let c = s.through().await;
    c.batch_execute("SET workload = 'all'").await.expect("set");
    // Master + two workers free: two parallel workers for the statement.
    assert_eq!(
        column(&c, "SHOW max_parallel_workers_per_gather").await,
        ["2"]
    );
    assert_eq!(
        column(
            &c,
            "SHOW max_parallel_workers_per_gather SETTINGS max_threads = 2"
        )
        .await,
        ["1"]
    );
    // reserve_memory becomes the statement's work_mem.
    assert_eq!(
        column(
            &c,
            "SELECT current_setting('work_mem') SETTINGS reserve_memory = '8Mi'"
        )
        .await,
        ["8MB"]
    );
    // The next statement's grant has no reservation: work_mem is the session's again.
    assert_eq!(
        column(&c, "SELECT current_setting('work_mem')").await,
        ["4MB"]
    );
    // Nothing held afterwards.
    assert_eq!(
        column(
            &admin,
            "SELECT inflight_requests FROM system.scheduler WHERE resource = 'cpu' AND type = 'inflight_limit'"
        )
        .await,
        ["0"]
    );
}

/// One frontend message: type byte, length, body.
fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A client on a bare socket, past start-up (trust) and its first ReadyForQuery.
async fn raw_client(port: u16) -> tokio::net::TcpStream {
    let mut socket = send_startup(port, &[("user", "owner"), ("database", "shop")]).await;
    messages_until_ready(&mut socket).await;
    socket
}

/// A bare socket that has sent a start-up packet with `parameters`, nothing read yet.
async fn send_startup(port: u16, parameters: &[(&str, &str)]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connects");
    let mut startup = 196608u32.to_be_bytes().to_vec();
    for (name, value) in parameters {
        startup.extend_from_slice(format!("{name}\0{value}\0").as_bytes());
    }
    startup.push(0);
    let mut packet = ((startup.len() + 4) as u32).to_be_bytes().to_vec();
    packet.extend_from_slice(&startup);
    socket.write_all(&packet).await.expect("startup");
    socket
}

/// The BackendKeyData among start-up messages: (pid, the whole body).
fn backend_key(messages: Vec<(u8, Vec<u8>)>) -> (i32, Vec<u8>) {
    let key = messages
        .into_iter()
        .find(|(tag, _)| *tag == b'K')
        .expect("BackendKeyData")
        .1;
    (i32::from_be_bytes(key[..4].try_into().expect("pid")), key)
}

/// One backend message: its type byte and body.
async fn read_message<R: tokio::io::AsyncRead + Unpin>(socket: &mut R) -> (u8, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 5];
    socket.read_exact(&mut header).await.expect("header");
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    let mut body = vec![0u8; len - 4];
    socket.read_exact(&mut body).await.expect("body");
    (header[0], body)
}

/// Backend messages up to and including ReadyForQuery.
async fn messages_until_ready<R: tokio::io::AsyncRead + Unpin>(
    socket: &mut R,
) -> Vec<(u8, Vec<u8>)> {
    let mut messages = Vec::new();
    loop {
        let message = read_message(socket).await;
        let ready = message.0 == b'Z';
        messages.push(message);
        if ready {
            return messages;
        }
    }
}

#[tokio::test]
async fn a_client_vanishing_mid_copy_leaves_the_table_as_it_was() {
    use tokio::io::AsyncWriteExt;
    let s = setup(PoolMode::Session, 2).await;
    let direct = s.direct().await;
    direct
        .batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        .await
        .expect("schema");
    let mut socket = raw_client(s.server.port).await;
    socket
        .write_all(&message(b'Q', b"COPY t FROM STDIN\0"))
        .await
        .expect("copy");
    assert_eq!(read_message(&mut socket).await.0, b'G', "CopyInResponse");
    socket
        .write_all(&message(b'd', b"2\n3\n"))
        .await
        .expect("data");
    drop(socket);
    // The upstream abandons the COPY: nothing of it lands, nothing stays running.
    support::until(
        &direct,
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COPY t%' AND state <> 'idle'",
        "0",
    )
    .await;
    assert_eq!(column(&direct, "SELECT count(*) FROM t").await, ["1"]);
    let c = s.through().await;
    assert_eq!(column(&c, "SELECT count(*) FROM t").await, ["1"]);
}

#[tokio::test]
async fn a_pipeline_without_sync_is_answered_in_order_and_held_bounded() {
    use tokio::io::AsyncWriteExt;
    let s = setup(PoolMode::Transaction, 2).await;
    let socket = raw_client(s.server.port).await;
    // 1,000 statements, each Parse/Bind/Execute, and one Sync at the very end: far more than
    // sluice holds back, so it sends them on as they come.
    let mut pipeline = Vec::new();
    for i in 0..1000 {
        pipeline.extend(parse_bind_execute("", "", &format!("SELECT {i}")));
    }
    pipeline.extend(message(b'S', b""));
    let (mut read, mut write) = socket.into_split();
    let writer = tokio::spawn(async move {
        write.write_all(&pipeline).await.expect("pipeline");
        write
    });
    let messages = messages_until_ready(&mut read).await;
    let tags: Vec<u8> = messages.iter().map(|(tag, _)| *tag).collect();
    let rows: Vec<i32> = messages
        .iter()
        .filter(|(tag, _)| *tag == b'D')
        .map(|(_, body)| {
            let value = String::from_utf8_lossy(&body[6..]).into_owned();
            value.parse::<i32>().expect("a number")
        })
        .collect();
    let _ = writer.await;
    assert_eq!(
        rows,
        (0..1000).collect::<Vec<_>>(),
        "every answer, in order"
    );
    assert_eq!(tags.iter().filter(|t| **t == b'C').count(), 1000);
    assert_eq!(tags.iter().filter(|t| **t == b'Z').count(), 1);
}

/// Found by the wire fuzzer (tests/wire_fuzz): after an error in an extended-protocol batch
/// without Sync, PostgreSQL discards every message up to Sync — a simple Query too. sluice
/// admitted that Query and sent it upstream, which never answered it: its slot stayed held
/// for good, even after the client left.
#[tokio::test]
async fn after_an_unsynced_error_everything_up_to_sync_is_discarded() {
    use tokio::io::AsyncWriteExt;
    let s = setup(PoolMode::Session, 2).await;
    let admin = s.through().await;
    query_tree(&admin, 1).await;
    let mut socket = raw_client(s.server.port).await;
    // An Execute of a portal nobody bound, no Sync: PostgreSQL's error comes at once.
    let mut execute = b"\0".to_vec();
    execute.extend_from_slice(&0u32.to_be_bytes());
    socket
        .write_all(&message(b'E', &execute))
        .await
        .expect("execute");
    let (tag, body) = tokio::time::timeout(Duration::from_secs(30), read_message(&mut socket))
        .await
        .expect("the error comes without a Sync");
    assert_eq!(tag, b'E', "{}", String::from_utf8_lossy(&body));
    // A Query now is discarded (no answer, no admission), as going direct.
    socket
        .write_all(&message(b'Q', b"SELECT 1 SETTINGS workload = 'all'\0"))
        .await
        .expect("query");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(column(&admin, HELD).await, ["0"]);
    // The Sync ends the skipping: its ReadyForQuery alone; then statements run as before.
    socket.write_all(&message(b'S', b"")).await.expect("sync");
    let ready = tokio::time::timeout(Duration::from_secs(30), tags_until_ready(&mut socket));
    assert_eq!(ready.await.expect("the Sync is answered"), "Z");
    socket
        .write_all(&message(b'Q', b"SELECT 2 SETTINGS workload = 'all'\0"))
        .await
        .expect("query");
    assert_eq!(tags_until_ready(&mut socket).await, "TDCZ");
    assert_eq!(column(&admin, HELD).await, ["0"]);
}

/// A stopped statement (here killed) whose upstream does not answer the cancel — its backend
/// frozen with SIGSTOP — is let go after a grace: the client gets an error saying so, the
/// slot is freed, the connection is closed and never lent again.
#[tokio::test]
async fn a_stopped_statement_whose_upstream_does_not_answer_is_let_go() {
    let s = setup(PoolMode::Session, 2).await;
    let admin = s.through().await;
    query_tree(&admin, 1).await;
    let victim = s.through().await;
    let killed = tokio::spawn(async move {
        victim
            .simple_query("SELECT pg_sleep(63) SETTINGS workload = 'all'")
            .await
    });
    support::until(&admin, HELD, "1").await;
    let direct = s.direct().await;
    let backend = "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(63)%'";
    let pid = loop {
        if let Some(pid) = column(&direct, backend).await.pop() {
            break pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    /// Thaws the backend however the test ends.
    struct Frozen(String);
    impl Drop for Frozen {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &self.0])
                .status();
        }
    }
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .expect("kill");
    assert!(stopped.success());
    let _frozen = Frozen(pid);
    admin
        .batch_execute("KILL QUERY WHERE query LIKE '%pg_sleep(63)%'")
        .await
        .expect("kill");
    let e = tokio::time::timeout(Duration::from_secs(30), killed)
        .await
        .expect("let go within the grace, not when the upstream answers")
        .expect("joined")
        .expect_err("killed");
    let db = e.as_db_error().expect("an error from sluice");
    assert_eq!(db.code().code(), "08006");
    assert!(
        db.message().contains("did not answer within"),
        "{}",
        db.message()
    );
    assert_eq!(column(&admin, HELD).await, ["0"]);
    // The next statement gets a connection that works.
    let next = s.through().await;
    assert_eq!(
        column(&next, "SELECT 7 SETTINGS workload = 'all'").await,
        ["7"]
    );
}

/// Reads messages up to ReadyForQuery; returns their type bytes.
async fn tags_until_ready(socket: &mut tokio::net::TcpStream) -> String {
    messages_until_ready(socket)
        .await
        .iter()
        .map(|(tag, _)| *tag as char)
        .collect()
}

/// Parse of `sql` as `statement`, Bind of it to `portal`, Execute of that portal.
fn parse_bind_execute(statement: &str, portal: &str, sql: &str) -> Vec<u8> {
    let mut parse = format!("{statement}\0{sql}\0").into_bytes();
    parse.extend_from_slice(&0u16.to_be_bytes());
    let mut bind = format!("{portal}\0{statement}\0").into_bytes();
    bind.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    let mut execute = format!("{portal}\0").into_bytes();
    execute.extend_from_slice(&0u32.to_be_bytes());
    let mut out = message(b'P', &parse);
    out.extend(message(b'B', &bind));
    out.extend(message(b'E', &execute));
    out
}

#[tokio::test]
async fn a_batch_mixing_sluice_and_the_upstream_is_answered_in_order() {
    use tokio::io::AsyncWriteExt;
    let s = setup(PoolMode::Session, 2).await;
    let mut socket = raw_client(s.server.port).await;
    // The upstream's statement, then one of sluice's that fails, then Sync.
    let mut batch = parse_bind_execute("", "", "SELECT 1");
    batch.extend(parse_bind_execute(
        "s2",
        "p2",
        "SHOW CREATE WORKLOAD nosuch",
    ));
    batch.extend(message(b'S', b""));
    socket.write_all(&batch).await.expect("batch");
    assert_eq!(tags_until_ready(&mut socket).await, "12DC12EZ");
    // The next batch of sluice's own is answered in full (nothing is left waiting for a Sync).
    let mut batch = parse_bind_execute("", "", "SHOW workload");
    batch.extend(message(b'S', b""));
    socket.write_all(&batch).await.expect("batch");
    assert_eq!(tags_until_ready(&mut socket).await, "12DCZ");
}

/// The Query, Bind, Describe, Execute and Sync a forwarding client sends are read whole, not
/// decoded: one too long by its own length, or too malformed to route, ends that client's
/// connection only.
#[tokio::test]
async fn malformed_messages_read_whole_end_only_their_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = setup(PoolMode::Transaction, 2).await;
    let over_long = [b'B', 0x7f, 0xff, 0xff, 0xff, 0, 0].to_vec();
    let no_names = message(b'B', b"portal-without-its-nul");
    let short = [b'E', 0, 0, 0, 2].to_vec();
    let unterminated_query = message(b'Q', b"SELECT 1");
    let describe_without_name = message(b'D', b"P");
    for bytes in [
        over_long,
        no_names,
        short,
        unterminated_query,
        describe_without_name,
    ] {
        let mut socket = raw_client(s.server.port).await;
        let mut batch = bytes.clone();
        batch.extend(message(b'S', b""));
        socket.write_all(&batch).await.expect("write");
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut rest))
            .await
            .expect("the connection ends");
        // FATAL 08P01 as PostgreSQL says it, then closed; never answered as if it were valid.
        let _ = read;
        let mut tags = String::new();
        let mut at = 0;
        while at + 5 <= rest.len() {
            tags.push(rest[at] as char);
            let len = u32::from_be_bytes([rest[at + 1], rest[at + 2], rest[at + 3], rest[at + 4]]);
            at += 1 + len as usize;
        }
        assert_eq!(tags, "E", "{bytes:?} was answered: {rest:?}");
        let said = String::from_utf8_lossy(&rest);
        assert!(said.contains("FATAL") && said.contains("08P01"), "{said}");
        assert!(
            said.contains("(CANNOT_PARSE_INPUT_ASSERTION_FAILED)"),
            "{said}"
        );
    }
    let c = s.through().await;
    assert_eq!(column(&c, "SELECT 41 + 1").await, ["42"]);
}

/// `psql -X -A -t` at `port` as the shop's owner with `env` (PGTZ, PGDATESTYLE, …): what it
/// printed on stdout, or its error from `FATAL:` on (the part that is the server's).
async fn psql_at(port: u16, env: &[(&str, &str)], sql: &str) -> String {
    let conn = format!("host=127.0.0.1 port={port} user=owner password=owner-pw dbname=shop");
    let out = support::psql(&conn, env, sql).await;
    if out.status.success() {
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        stderr[stderr.find("FATAL").unwrap_or(0)..]
            .trim()
            .to_string()
    }
}

/// A bare start-up with `parameters` (trust): the messages up to ReadyForQuery or an error.
async fn raw_startup(port: u16, parameters: &[(&str, &str)]) -> Vec<(u8, Vec<u8>)> {
    let mut socket = send_startup(port, parameters).await;
    let mut messages = Vec::new();
    loop {
        let message = read_message(&mut socket).await;
        let last = matches!(message.0, b'Z' | b'E');
        messages.push(message);
        if last {
            return messages;
        }
    }
}

/// The last value a start-up's ParameterStatus messages gave `name` (as libpq keeps it).
fn reported(messages: &[(u8, Vec<u8>)], name: &str) -> Option<String> {
    messages
        .iter()
        .rev()
        .filter(|(tag, _)| *tag == b'S')
        .filter_map(|(_, body)| {
            let mut parts = body.split(|&b| b == 0);
            let key = String::from_utf8_lossy(parts.next()?).into_owned();
            let value = String::from_utf8_lossy(parts.next()?).into_owned();
            (key == name).then_some(value)
        })
        .next()
}

/// Issue 36, defect 1: the parameters a client's start-up sets (psql's PGTZ and PGDATESTYLE,
/// `-c` options) reach the session its statements run in, in both pooling modes, and the
/// ParameterStatus values it is told are PostgreSQL's own for them; a value PostgreSQL
/// refuses ends the start-up with PostgreSQL's FATAL.
#[tokio::test]
async fn start_up_parameters_reach_the_upstream_as_going_direct() {
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let s = setup(mode, 2).await;
        let sql = "SELECT current_setting('TimeZone'), current_setting('DateStyle'), \
                   current_setting('extra_float_digits'), current_setting('search_path'), \
                   '2026-01-02 03:04:05+00'::timestamptz, '2026-07-08'::date";
        for env in [
            vec![("PGTZ", "PST8PDT"), ("PGDATESTYLE", "Postgres, MDY")],
            vec![("PGTZ", "Asia/Tokyo"), ("PGDATESTYLE", "german")],
            vec![(
                "PGOPTIONS",
                "-c extra_float_digits=1 -c search_path=pg_catalog,public",
            )],
            vec![],
        ] {
            let direct = psql_at(s.pg.port, &env, sql).await;
            let through = psql_at(s.server.port, &env, sql).await;
            assert_eq!(through, direct, "{mode:?} {env:?}");
        }
        // The comparison compares zones and styles that are set (not two defaults).
        let pst = [("PGTZ", "PST8PDT"), ("PGDATESTYLE", "Postgres, MDY")];
        assert!(
            psql_at(s.pg.port, &pst, sql)
                .await
                .starts_with("PST8PDT|Postgres, MDY|"),
            "{}",
            psql_at(s.pg.port, &pst, sql).await
        );
        // A value PostgreSQL refuses: its FATAL, word for word.
        let bad = [("PGTZ", "Nowhere/Bogus")];
        let refused = psql_at(s.server.port, &bad, "SELECT 1").await;
        assert_eq!(
            refused,
            psql_at(s.pg.port, &bad, "SELECT 1").await,
            "{mode:?}"
        );
        assert!(refused.contains("invalid value for parameter"), "{refused}");

        // What the client is told at start-up: PostgreSQL's spelling of what it asked for.
        let told = raw_startup(
            s.server.port,
            &[
                ("user", "owner"),
                ("database", "shop"),
                ("TimeZone", "Asia/Tokyo"),
                ("datestyle", "german"),
            ],
        )
        .await;
        assert_eq!(reported(&told, "TimeZone").as_deref(), Some("Asia/Tokyo"));
        let german = psql_at(s.pg.port, &[("PGDATESTYLE", "german")], "SHOW DateStyle").await;
        assert_eq!(
            reported(&told, "DateStyle"),
            Some(german.trim().to_string())
        );
        assert_eq!(german.trim(), "German, DMY");
        let refused = raw_startup(
            s.server.port,
            &[
                ("user", "owner"),
                ("database", "shop"),
                ("TimeZone", "Nowhere/Bogus"),
            ],
        )
        .await;
        let (tag, body) = refused.last().expect("an answer");
        assert_eq!(*tag, b'E');
        let text = String::from_utf8_lossy(body);
        assert!(text.contains("FATAL") && text.contains("22023"), "{text}");
    }
}

/// Issue 36, defect 1 in transaction pooling: clients that differ in their names share one
/// upstream connection and each sees its own name on every transaction; clients with other
/// start-up parameters are served by connections opened with them (a `RESET` returns to the
/// client's start-up value, as going direct); a client's `SET` of a reported parameter holds
/// for its later transactions; nothing reaches a client that set nothing. And a database that
/// does not exist is refused as PostgreSQL refuses it (issue 36, defect 4).
#[tokio::test]
async fn clients_sharing_a_pooled_connection_keep_their_own_parameters() {
    let s = setup(PoolMode::Transaction, 1).await;
    let port = s.server.port;
    let named = |name: &str| {
        format!("host=127.0.0.1 port={port} user=owner dbname=shop application_name={name}")
    };
    let zoned = |zone: &str| {
        format!("host=127.0.0.1 port={port} user=owner dbname=shop options='-c TimeZone={zone}'")
    };
    let alpha = s.server.client_with(&named("alpha")).await;
    let beta = s.server.client_with(&named("beta")).await;
    let plain = s.through().await;
    let pst = s.server.client_with(&zoned("PST8PDT")).await;
    let tokyo = s.server.client_with(&zoned("Asia/Tokyo")).await;
    let direct = s.direct().await;
    let default_zone = column(&direct, "SHOW TimeZone").await;
    let name = "SELECT current_setting('application_name')";
    for _ in 0..3 {
        assert_eq!(column(&alpha, name).await, ["alpha"]);
        assert_eq!(column(&beta, name).await, ["beta"]);
        assert_eq!(column(&plain, "SHOW TimeZone").await, default_zone);
        assert_eq!(column(&pst, "SHOW TimeZone").await, ["PST8PDT"]);
        assert_eq!(column(&tokyo, "SHOW TimeZone").await, ["Asia/Tokyo"]);
    }
    // One after the other (with pool_size 1 the other pools' clients take the one connection
    // the pools may keep open between them, closing it here).
    let pid = column(&alpha, "SELECT pg_backend_pid()").await;
    assert_eq!(
        column(&beta, "SELECT pg_backend_pid()").await,
        pid,
        "one connection"
    );
    // The start-up value is the session's own: RESET returns to it, as going direct.
    simple(&pst, "SET TimeZone = 'UTC'").await;
    assert_eq!(column(&pst, "SHOW TimeZone").await, ["UTC"]);
    simple(&pst, "RESET TimeZone").await;
    assert_eq!(column(&pst, "SHOW TimeZone").await, ["PST8PDT"]);
    // A client's own SET of a reported parameter outlives its transaction.
    simple(&plain, "SET DateStyle = 'SQL, DMY'").await;
    assert_eq!(column(&alpha, "SHOW DateStyle").await, ["ISO, MDY"]);
    assert_eq!(column(&plain, "SHOW DateStyle").await, ["SQL, DMY"]);
    assert_eq!(column(&beta, "SHOW DateStyle").await, ["ISO, MDY"]);
    assert_eq!(column(&plain, "SHOW DateStyle").await, ["SQL, DMY"]);

    // No such database: PostgreSQL's refusal, word for word.
    let refused = |e: tokio_postgres::Error| {
        let db = e.as_db_error().expect("a database error").clone();
        (db.code().code().to_string(), db.message().to_string())
    };
    let direct_refusal = connect(&format!(
        "host=127.0.0.1 port={} user=owner password=owner-pw dbname=nosuchdb",
        s.pg.port
    ))
    .await
    .map(|_| ())
    .expect_err("no such database going direct");
    let through_refusal = connect(&format!(
        "host=127.0.0.1 port={port} user=owner dbname=nosuchdb"
    ))
    .await
    .map(|_| ())
    .expect_err("no such database through sluice");
    assert_eq!(refused(through_refusal), refused(direct_refusal));
    // Another database of the upstream's is the client's to choose.
    s.pg.psql("CREATE DATABASE other OWNER owner");
    let other = s
        .server
        .client_with(&format!(
            "host=127.0.0.1 port={port} user=owner dbname=other"
        ))
        .await;
    assert_eq!(column(&other, "SELECT current_database()").await, ["other"]);
    assert_eq!(column(&plain, "SELECT current_database()").await, ["shop"]);
}

/// Issue 36, defect 6: a connection whose first bytes are no start-up packet (a Terminate)
/// is closed without a word, as PostgreSQL closes it; an upstream session that PostgreSQL
/// terminates while its client sits idle ends the client's connection at once, after
/// PostgreSQL's FATAL.
#[tokio::test]
async fn sessions_end_as_postgres_ends_them() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = setup(PoolMode::Session, 2).await;
    for port in [s.pg.port, s.server.port] {
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connects");
        socket.write_all(&message(b'X', b"")).await.expect("writes");
        let mut said = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut said))
            .await
            .expect("closed");
        assert!(
            read.is_ok() && said.is_empty(),
            "port {port} said {said:?}: {read:?}"
        );
    }

    let client = s.through().await;
    let pid = column(&client, "SELECT pg_backend_pid()").await;
    let direct = s.direct().await;
    direct
        .query(
            "SELECT pg_terminate_backend($1::int)",
            &[&pid[0].parse::<i32>().expect("a pid")],
        )
        .await
        .expect("terminates");
    let closed = async {
        while !client.is_closed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), closed)
        .await
        .expect("the client's connection closes when its backend is terminated");
    // Others are served on.
    assert_eq!(column(&s.through().await, "SELECT 1").await, ["1"]);
}

/// Issue 36, defect 4: a client whose `client_encoding` is not UTF-8 (psql with
/// `PGCLIENTENCODING=LATIN9`) gets its bytes through untouched, both ways: `SELECT '€'` in
/// LATIN9 (the byte 0xA4) comes back as 0xA4, as going direct, in both pooling modes.
#[tokio::test]
async fn a_client_encoding_other_than_utf8_passes_untouched() {
    use std::os::unix::ffi::OsStrExt;
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let s = setup(mode, 2).await;
        let run = |port: u16| {
            let mut command = std::process::Command::new("psql");
            command
                .args(["-X", "-A", "-t", "-c"])
                .arg(std::ffi::OsStr::from_bytes(
                    b"SELECT '\xa4' AS euro, length('\xa4\xa4')",
                ))
                .arg(format!(
                    "host=127.0.0.1 port={port} user=owner password=owner-pw dbname=shop"
                ))
                .env("PGCLIENTENCODING", "LATIN9");
            async move {
                tokio::task::spawn_blocking(move || command.output())
                    .await
                    .expect("psql's thread")
                    .expect("psql runs")
            }
        };
        let direct = run(s.pg.port).await;
        let through = run(s.server.port).await;
        assert_eq!(
            direct.stdout,
            b"\xa4|2\n",
            "{:?}",
            String::from_utf8_lossy(&direct.stderr)
        );
        assert_eq!(
            through.stdout,
            direct.stdout,
            "{mode:?}: {}",
            String::from_utf8_lossy(&through.stderr)
        );
    }
}

/// Issue 36, defect 4 in transaction pooling: `DEALLOCATE ALL` (and `DISCARD ALL`) drops the
/// client's prepared statements as PostgreSQL drops them — a statement used after it inside the
/// same transaction fails as it fails going direct (26000, the client's own name), not on
/// sluice's pooled name — and statements prepared afterwards work.
#[tokio::test]
async fn deallocate_all_drops_the_clients_statements_as_going_direct() {
    let s = setup(PoolMode::Transaction, 1).await;
    let direct = s.direct().await;
    let through = s.through().await;
    let mut outcomes = Vec::new();
    for client in [&direct, &through] {
        let sum = client.prepare("SELECT $1::int + 1").await.expect("prepare");
        let n: i32 = client.query_one(&sum, &[&1i32]).await.expect("run").get(0);
        assert_eq!(n, 2);
        client
            .batch_execute("BEGIN; DEALLOCATE ALL")
            .await
            .expect("deallocate");
        let gone = client
            .query_one(&sum, &[&1i32])
            .await
            .map(|_| ())
            .expect_err("deallocated");
        client.batch_execute("ROLLBACK").await.expect("rollback");
        let again = client.prepare("SELECT $1::int + 2").await.expect("again");
        let n: i32 = client
            .query_one(&again, &[&1i32])
            .await
            .expect("rerun")
            .get(0);
        assert_eq!(n, 3);
        client.batch_execute("DISCARD ALL").await.expect("discard");
        let after = client
            .prepare("SELECT $1::int + 3")
            .await
            .expect("after discard");
        let n: i32 = client
            .query_one(&after, &[&1i32])
            .await
            .expect("after")
            .get(0);
        assert_eq!(n, 4);
        // tokio-postgres numbers its statements across clients: the name, without its number.
        let said = describe_error(&gone);
        let unnumbered = match said.split_once("statement \"s") {
            Some((head, rest)) => format!(
                "{head}statement \"s{}",
                rest.trim_start_matches(|c: char| c.is_ascii_digit())
            ),
            None => said.clone(),
        };
        outcomes.push((said, unnumbered));
    }
    assert_eq!(outcomes[1].1, outcomes[0].1);
    let outcomes: Vec<String> = outcomes.into_iter().map(|(said, _)| said).collect();
    assert!(outcomes[0].contains("26000"), "{}", outcomes[0]);
}

/// The pools of one upstream (one per database and start-up parameters) lend from the same
/// `pool_size`: a client that brings start-up parameters of its own waits for a connection
/// like any other, it does not open one past the bound.
#[tokio::test]
async fn pools_of_other_parameters_share_the_pool_size() {
    let s = setup(PoolMode::Transaction, 1).await;
    let port = s.server.port;
    let zoned = |zone: &str| {
        format!("host=127.0.0.1 port={port} user=owner dbname=shop options='-c TimeZone={zone}'")
    };
    let pst = s.server.client_with(&zoned("PST8PDT")).await;
    let tokyo = s.server.client_with(&zoned("Asia/Tokyo")).await;
    pst.batch_execute("BEGIN; SELECT 1").await.expect("begin");
    let mut waiting = tokio::spawn(async move {
        column(
            &tokyo,
            "SELECT current_setting('TimeZone') /* tokyo waits */",
        )
        .await
    });
    // Admitted (listed), so at its pool, where it must wait for pst's transaction.
    let watcher = s.through().await;
    until(
        &watcher,
        "SELECT count(*) FROM system.processes WHERE query LIKE '%tokyo waits%' AND query NOT LIKE '%system.%'",
        "1",
    )
    .await;
    // Still waiting a while later (a statement given a connection of its own would have
    // answered in a millisecond; this can only fail when it is not held back).
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut waiting)
            .await
            .is_err(),
        "the one connection the pool size allows is pst's until its transaction ends"
    );
    pst.batch_execute("COMMIT").await.expect("commit");
    assert_eq!(waiting.await.expect("tokyo ran"), ["Asia/Tokyo"]);
}

/// Clients that each bring a start-up parameter set of their own (one pool each) cannot pile
/// up idle upstream connections: the pools keep `pool_size` open between them, lent or idle
/// (and past 64 pools, those no client holds are dropped with their idle connections).
#[tokio::test]
async fn pools_nobody_holds_do_not_pile_up_connections() {
    let s = setup(PoolMode::Session, 4).await;
    let port = s.server.port;
    for i in 0..80 {
        let client = s
            .server
            .client_with(&format!(
                "host=127.0.0.1 port={port} user=owner dbname=shop options='-c search_path=s{i}'"
            ))
            .await;
        assert_eq!(column(&client, "SHOW search_path").await, [format!("s{i}")]);
    }
    let direct = s.direct().await;
    let open: i64 = direct
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'shop' AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert!(open <= 4, "{open} upstream connections for 80 clients gone");
}

/// A sluice in front of `pg` (its superuser `owner`), with `auth_query` or not.
async fn sluice_for(
    pg: &Postgres,
    url: &str,
    pool_mode: PoolMode,
    auth_query: Option<&str>,
) -> (tempfile::TempDir, TestServer) {
    sluice_sized(pg, url, pool_mode, auth_query, 4).await
}

async fn sluice_sized(
    pg: &Postgres,
    url: &str,
    pool_mode: PoolMode,
    auth_query: Option<&str>,
    pool_size: usize,
) -> (tempfile::TempDir, TestServer) {
    let data = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_with(ServerOptions {
        upstream: Some(UpstreamOptions {
            pool_size,
            pool_mode,
            auth_query: auth_query.map(str::to_string),
            server_idle_timeout: None,
            ..UpstreamOptions::new(
                UpstreamUrl::parse(&format!("{url}?connect_timeout=5")).expect("url"),
            )
        }),
        ..support::test_options(data.path())
    })
    .await;
    let _ = pg;
    (data, server)
}

/// Roles of different rights on one table: `reader` may read it, `writer` write it too.
async fn make_roles(pg: &Postgres, with_passwords: bool) {
    let password = |role: &str| {
        if with_passwords {
            format!(" PASSWORD '{role}-pw'")
        } else {
            String::new()
        }
    };
    pg.psql(&format!(
        "SET password_encryption = 'scram-sha-256';
         CREATE ROLE reader LOGIN{};
         CREATE ROLE writer LOGIN{};",
        password("reader"),
        password("writer")
    ));
    pg.psql("CREATE DATABASE shop OWNER owner");
    let password = if with_passwords {
        " password=owner-pw"
    } else {
        ""
    };
    connect(&format!(
        "host=127.0.0.1 port={} user=owner dbname=shop{password}",
        pg.port
    ))
    .await
    .expect("owner")
    .batch_execute(
        "CREATE TABLE items (id int); GRANT SELECT ON items TO reader, writer;
         GRANT INSERT ON items TO writer;",
    )
    .await
    .expect("table");
}

/// Who a client's statements run as, and what its write gets: (session_user, current_user,
/// the INSERT's outcome).
async fn rights(client: &Client) -> Vec<String> {
    let mut out = simple(client, "SELECT session_user, current_user").await;
    out.extend(simple(client, "INSERT INTO items VALUES (1)").await);
    out.extend(simple(client, "SELECT count(*) > 0 FROM items").await);
    out
}

#[tokio::test]
async fn each_client_runs_upstream_as_its_own_role_with_scram_end_to_end() {
    let pg_dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(pg_dir.path(), "owner", Auth::Password("owner-pw".into()));
    make_roles(&pg, true).await;
    let direct = |role: &str, password: &str| {
        let conn = format!(
            "host=127.0.0.1 port={} user={role} password={password} dbname=shop",
            pg.port
        );
        async move { connect(&conn).await }
    };
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let (_data, sluice) = sluice_for(
            &pg,
            &format!("postgres://owner:owner-pw@127.0.0.1:{}/shop", pg.port),
            mode,
            Some(sluice_server::upstream::DEFAULT_AUTH_QUERY),
        )
        .await;
        let through = |role: &str, password: &str| {
            let conn = format!(
                "host=127.0.0.1 port={} user={role} password={password} dbname=shop",
                sluice.port
            );
            async move { connect(&conn).await }
        };
        // Each role, as directly: its own name upstream, its own rights (the reader's write
        // refused with PostgreSQL's 42501).
        for role in ["reader", "writer"] {
            let password = format!("{role}-pw");
            let want = rights(&direct(role, &password).await.expect("direct")).await;
            let got = rights(&through(role, &password).await.expect("through")).await;
            assert_eq!(got, want, "{role} in {mode:?} pooling");
        }
        let reader = rights(&through("reader", "reader-pw").await.expect("reader")).await;
        assert!(reader[1].contains("reader"), "{reader:?}");
        assert!(
            reader[3].starts_with("error 42501 permission denied for table items"),
            "{reader:?}"
        );
        // Two roles taking turns on the pool: each statement runs as its client's role.
        let (r, w) = (
            through("reader", "reader-pw").await.expect("reader"),
            through("writer", "writer-pw").await.expect("writer"),
        );
        for _ in 0..3 {
            assert_eq!(column(&r, "SELECT current_user").await, ["reader"]);
            assert_eq!(column(&w, "SELECT current_user").await, ["writer"]);
        }
        // A wrong password and an unknown role are refused as PostgreSQL refuses them.
        for (role, password) in [("reader", "wrong"), ("asldkfjsadlfkj", "x")] {
            let want = direct(role, password).await.expect_err("direct refuses");
            let got = through(role, password).await.expect_err("sluice refuses");
            let code =
                |e: &tokio_postgres::Error| e.as_db_error().map(|d| d.code().code().to_string());
            assert_eq!(code(&got), code(&want), "{role}: {got} / {want}");
            assert_eq!(code(&got).as_deref(), Some("28P01"), "{got}");
            let message =
                |e: &tokio_postgres::Error| e.as_db_error().map(|d| d.message().to_string());
            assert_eq!(message(&got), message(&want), "{role}");
        }
    }
}

#[tokio::test]
async fn trusted_clients_run_as_their_own_role_and_an_unknown_one_is_refused() {
    let pg_dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(pg_dir.path(), "owner", Auth::Trust);
    make_roles(&pg, false).await;
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let (_data, sluice) = sluice_for(
            &pg,
            &format!("postgres://owner@127.0.0.1:{}/shop", pg.port),
            mode,
            None,
        )
        .await;
        let at = |port: u16, role: &str| {
            let conn = format!("host=127.0.0.1 port={port} user={role} dbname=shop");
            async move { connect(&conn).await }
        };
        for role in ["reader", "writer"] {
            let want = rights(&at(pg.port, role).await.expect("direct")).await;
            let got = rights(&at(sluice.port, role).await.expect("through")).await;
            assert_eq!(got, want, "{role} in {mode:?} pooling");
        }
        let want = at(pg.port, "asldkfjsadlfkj")
            .await
            .expect_err("direct refuses");
        let got = at(sluice.port, "asldkfjsadlfkj")
            .await
            .expect_err("sluice refuses");
        let db = got.as_db_error().expect("an ErrorResponse");
        assert_eq!(db.code().code(), "28000", "{got}");
        assert_eq!(Some(db.message()), want.as_db_error().map(|d| d.message()));
    }
}

/// A bare client's pid from its start-up (BackendKeyData), and the answer's first value of
/// one simple query on it.
async fn backend_key_pid(port: u16) -> (tokio::net::TcpStream, i32) {
    let mut socket = send_startup(port, &[("user", "owner"), ("database", "shop")]).await;
    let (pid, _) = backend_key(messages_until_ready(&mut socket).await);
    (socket, pid)
}

async fn first_value(socket: &mut tokio::net::TcpStream, sql: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let mut query = sql.as_bytes().to_vec();
    query.push(0);
    socket
        .write_all(&message(b'Q', &query))
        .await
        .expect("query");
    let row = messages_until_ready(socket)
        .await
        .into_iter()
        .find(|(tag, _)| *tag == b'D')
        .expect("a row");
    let len = i32::from_be_bytes(row.1[2..6].try_into().expect("length")) as usize;
    String::from_utf8(row.1[6..6 + len].to_vec()).expect("text")
}

#[tokio::test]
async fn in_session_pooling_a_client_has_one_pid_everywhere() {
    use tokio::io::AsyncWriteExt;
    let s = setup(PoolMode::Session, 4).await;
    // The pid of BackendKeyData is the one pg_backend_pid() says.
    let (mut listener, listener_pid) = backend_key_pid(s.server.port).await;
    assert_eq!(
        first_value(&mut listener, "SELECT pg_backend_pid()").await,
        listener_pid.to_string()
    );
    // A notification's sender is the notifying client's pid.
    let (mut notifier, notifier_pid) = backend_key_pid(s.server.port).await;
    assert_ne!(notifier_pid, listener_pid);
    first_value(&mut listener, "LISTEN news; SELECT 1").await;
    first_value(&mut notifier, "NOTIFY news, 'hi'; SELECT 1").await;
    let (tag, body) = read_message(&mut listener).await;
    assert_eq!(tag, b'A', "a notification");
    assert_eq!(
        i32::from_be_bytes(body[..4].try_into().expect("pid")),
        notifier_pid
    );
    // pg_terminate_backend($1) with that pid, bound as a parameter: the notifier's session
    // ends at once, idle as it is, with PostgreSQL's FATAL and a closed socket.
    let other = s.through().await;
    let terminated: bool = other
        .query_one("SELECT pg_terminate_backend($1)", &[&notifier_pid])
        .await
        .expect("terminate")
        .get(0);
    assert!(terminated);
    let (tag, body) = read_message(&mut notifier).await;
    assert_eq!(tag, b'E');
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("FATAL") && text.contains("57P01"), "{text}");
    let mut rest = Vec::new();
    use tokio::io::AsyncReadExt;
    let n = tokio::time::timeout(Duration::from_secs(30), notifier.read_to_end(&mut rest))
        .await
        .expect("closed")
        .expect("read");
    assert_eq!(n, 0, "nothing after the FATAL, then the close");
    // pg_terminate_backend(pg_backend_pid()): the client is told, and its connection ends.
    let e = other
        .simple_query("SELECT pg_terminate_backend(pg_backend_pid())")
        .await
        .expect_err("terminated itself");
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("57P01"),
        "{e}"
    );
    for _ in 0..100 {
        if other.is_closed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(other.is_closed());
    let _ = listener.shutdown().await;
}

#[tokio::test]
async fn a_pipeline_is_answered_before_its_sync_as_postgres_answers_it() {
    use tokio::io::AsyncWriteExt;
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let s = setup(mode, 2).await;
        s.direct()
            .await
            .batch_execute("CREATE TABLE u (id int PRIMARY KEY)")
            .await
            .expect("table");
        let mut socket = raw_client(s.server.port).await;
        // libpq's pipeline mode: Bind/Execute pairs with no Sync, then the client waits for
        // their answers (PostgreSQL sends them as it reads the messages).
        let mut pipeline = message(b'Q', b"BEGIN\0");
        pipeline.extend(parse_bind_execute(
            "",
            "",
            "INSERT INTO u VALUES (1) RETURNING id",
        ));
        pipeline.extend(parse_bind_execute(
            "",
            "",
            "INSERT INTO u VALUES (1) RETURNING id",
        ));
        pipeline.extend(parse_bind_execute("", "", "SELECT 3"));
        socket.write_all(&pipeline).await.expect("pipeline");
        let mut tags = String::new();
        while !tags.ends_with('E') {
            let (tag, _) = tokio::time::timeout(Duration::from_secs(30), read_message(&mut socket))
                .await
                .unwrap_or_else(|_| panic!("{mode:?}: no answer before the Sync, after {tags:?}"));
            tags.push(tag as char);
        }
        // BEGIN's answer, then the first insert's, then the second's unique violation; the
        // third waits for the Sync, which ends the failed transaction's pipeline.
        assert_eq!(tags, "CZ12DC12E", "{mode:?}");
        socket.write_all(&message(b'S', b"")).await.expect("sync");
        let rest = tags_until_ready(&mut socket).await;
        assert_eq!(rest, "Z", "{mode:?}");
        socket
            .write_all(&message(b'Q', b"ROLLBACK\0"))
            .await
            .expect("rollback");
        assert_eq!(tags_until_ready(&mut socket).await, "CZ", "{mode:?}");
        // Answers held for a pipeline go when the client asks with a Flush.
        socket
            .write_all(&parse_bind_execute("", "", "SELECT 5"))
            .await
            .expect("pipeline");
        // (The client pauses, so sluice runs what came and holds its answers.)
        tokio::time::sleep(Duration::from_millis(100)).await;
        socket.write_all(&message(b'H', b"")).await.expect("flush");
        let mut tags = String::new();
        while !tags.ends_with('C') {
            let (tag, _) = tokio::time::timeout(Duration::from_secs(30), read_message(&mut socket))
                .await
                .unwrap_or_else(|_| panic!("{mode:?}: a Flush gets no answer, after {tags:?}"));
            tags.push(tag as char);
        }
        assert_eq!(tags, "12DC", "{mode:?}");
        socket.write_all(&message(b'S', b"")).await.expect("sync");
        assert_eq!(tags_until_ready(&mut socket).await, "Z", "{mode:?}");
    }
}

#[tokio::test]
async fn a_parse_in_the_clients_encoding_reaches_the_upstream_untouched() {
    use tokio::io::AsyncWriteExt;
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let s = setup(mode, 2).await;
        let mut socket = send_startup(
            s.server.port,
            &[
                ("user", "owner"),
                ("database", "shop"),
                ("client_encoding", "LATIN9"),
            ],
        )
        .await;
        messages_until_ready(&mut socket).await;
        // '€' is one byte in LATIN9 (0xA4): not UTF-8, so read as UTF-8 it would be replaced.
        for statement in ["", "euro"] {
            let mut pipeline =
                parse_bind_execute(statement, "", "SELECT '\u{1}' AS e, length('\u{1}')")
                    .into_iter()
                    .map(|b| if b == 1 { 0xA4 } else { b })
                    .collect::<Vec<u8>>();
            pipeline.extend(message(b'S', b""));
            socket.write_all(&pipeline).await.expect("pipeline");
            let row = messages_until_ready(&mut socket)
                .await
                .into_iter()
                .find(|(tag, _)| *tag == b'D')
                .unwrap_or_else(|| panic!("{mode:?}: a row"));
            // Two columns: the euro sign in LATIN9 as it was sent, and its length, 1.
            assert_eq!(&row.1[2..7], &[0, 0, 0, 1, 0xA4], "{mode:?} {statement:?}");
            assert_eq!(&row.1[7..], &[0, 0, 0, 1, b'1'], "{mode:?} {statement:?}");
        }
    }
}

#[tokio::test]
async fn a_cancel_stops_a_copy_out_that_keeps_streaming() {
    use tokio::io::AsyncWriteExt;
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let s = setup(mode, 2).await;
        let mut socket =
            send_startup(s.server.port, &[("user", "owner"), ("database", "shop")]).await;
        let (_, key) = backend_key(messages_until_ready(&mut socket).await);
        // Far more rows than any buffer between the upstream and the client holds.
        socket
            .write_all(&message(
                b'Q',
                b"COPY (SELECT generate_series(1, 50000000)) TO STDOUT\0",
            ))
            .await
            .expect("copy");
        let mut seen = 0;
        while seen < 1000 {
            if read_message(&mut socket).await.0 == b'd' {
                seen += 1;
            }
        }
        // The client stops reading a while (every buffer on the way fills up), cancels (as
        // psycopg does when its COPY block raises), then reads on.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut cancel = tokio::net::TcpStream::connect(("127.0.0.1", s.server.port))
            .await
            .expect("connects");
        let mut request = 16u32.to_be_bytes().to_vec();
        request.extend_from_slice(&80877102u32.to_be_bytes());
        request.extend_from_slice(&key[..8]);
        cancel.write_all(&request).await.expect("cancel");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut error = None;
        let mut rows = 0u64;
        loop {
            let (tag, body) = read_message(&mut socket).await;
            match tag {
                b'd' => rows += 1,
                b'E' => error = Some(String::from_utf8_lossy(&body).into_owned()),
                b'Z' => break,
                _ => {}
            }
        }
        let error = error.unwrap_or_else(|| panic!("{mode:?}: the COPY ran to its end"));
        assert!(error.contains("57014"), "{mode:?}: {error}");
        assert!(rows < 50_000_000, "{mode:?}");
    }
}

#[tokio::test]
async fn deallocate_of_a_protocol_statement_in_transaction_pooling_is_as_direct() {
    use tokio::io::AsyncWriteExt;
    let s = setup(PoolMode::Transaction, 2).await;
    let mut socket = raw_client(s.server.port).await;
    // A statement prepared with the protocol (its pooled name upstream is sluice's), then
    // dropped with SQL by the client's name, as psycopg and other drivers do.
    let mut parse = b"Stmt1\0SELECT 7\0".to_vec();
    parse.extend_from_slice(&0u16.to_be_bytes());
    let mut exchange = message(b'P', &parse);
    exchange.extend(message(b'S', b""));
    socket.write_all(&exchange).await.expect("parse");
    assert_eq!(tags_until_ready(&mut socket).await, "1Z");
    socket
        .write_all(&message(b'Q', b"DEALLOCATE \"Stmt1\"\0"))
        .await
        .expect("deallocate");
    let answer = messages_until_ready(&mut socket).await;
    assert_eq!(answer[0], (b'C', b"DEALLOCATE\0".to_vec()), "{answer:?}");
    assert_eq!(answer.len(), 2);
    // Gone, as PostgreSQL says it is.
    let mut bind = b"\0Stmt1\0".to_vec();
    bind.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    let mut exchange = message(b'B', &bind);
    exchange.extend(message(b'S', b""));
    socket.write_all(&exchange).await.expect("bind");
    let answer = messages_until_ready(&mut socket).await;
    let error = String::from_utf8_lossy(&answer[0].1).into_owned();
    assert_eq!(answer[0].0, b'E');
    assert!(
        error.contains("26000") && error.contains("Stmt1"),
        "{error}"
    );
    // DEALLOCATE of a name sluice does not pool still goes upstream (and fails there as
    // directly).
    socket
        .write_all(&message(b'Q', b"DEALLOCATE nosuch\0"))
        .await
        .expect("deallocate");
    let answer = messages_until_ready(&mut socket).await;
    assert_eq!(answer[0].0, b'E');
    assert!(String::from_utf8_lossy(&answer[0].1).contains("26000"));
}

#[tokio::test]
async fn a_login_does_not_wait_for_a_pooled_connection() {
    let pg_dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(pg_dir.path(), "owner", Auth::Password("owner-pw".into()));
    make_roles(&pg, true).await;
    // One pooled connection, which the first session-pooled client holds from its start-up.
    let (_data, sluice) = sluice_sized(
        &pg,
        &format!("postgres://owner:owner-pw@127.0.0.1:{}/shop", pg.port),
        PoolMode::Session,
        Some(sluice_server::upstream::DEFAULT_AUTH_QUERY),
        1,
    )
    .await;
    let conn = |role: &str| {
        format!(
            "host=127.0.0.1 port={} user={role} password={role}-pw dbname=shop connect_timeout=30",
            sluice.port
        )
    };
    let reader = connect(&conn("reader")).await.expect("reader");
    assert_eq!(column(&reader, "SELECT current_user").await, ["reader"]);
    // The second login reads its verifier on auth_query's own connection: it is not held up
    // behind the pool (which would fail it after connect_timeout, 5 s here).
    let writer = connect(&conn("writer"))
        .await
        .expect("a login while the pool is full");
    drop(reader);
    assert_eq!(column(&writer, "SELECT current_user").await, ["writer"]);
}

/// A field of an ErrorResponse's body (`C`: the SQLSTATE, `M`: the message).
fn error_field(body: &[u8], field: u8) -> String {
    body.split(|&b| b == 0)
        .find(|f| f.first() == Some(&field))
        .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_prepared_statement_name_in_use_is_refused_as_postgres_refuses_it() {
    use tokio::io::AsyncWriteExt;
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let s = setup(mode, 2).await;
        let mut socket = raw_client(s.server.port).await;
        let sync = || message(b'S', b"");
        let run = |statement: &str| {
            let mut bind = format!("\0{statement}\0").into_bytes();
            bind.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            let mut out = message(b'B', &bind);
            out.extend(message(b'E', b"\0\0\0\0\0"));
            out.extend(message(b'S', b""));
            out
        };
        let mut first = parse_bind_execute("s1", "", "SELECT 1");
        first.extend(sync());
        socket.write_all(&first).await.expect("first");
        assert_eq!(tags_until_ready(&mut socket).await, "12DCZ", "{mode:?}");
        // The name again, with another text: refused (42P05) once the text is parsed, the
        // rest skipped up to Sync; the first statement stays.
        let mut again = parse_bind_execute("s1", "", "SELECT 2");
        again.extend(sync());
        socket.write_all(&again).await.expect("again");
        let answer = messages_until_ready(&mut socket).await;
        assert_eq!(answer.len(), 2, "{mode:?}: {answer:?}");
        assert_eq!(answer[0].0, b'E', "{mode:?}");
        assert_eq!(error_field(&answer[0].1, b'C'), "42P05", "{mode:?}");
        assert_eq!(
            error_field(&answer[0].1, b'M'),
            "prepared statement \"s1\" already exists",
            "{mode:?}"
        );
        socket.write_all(&run("s1")).await.expect("run s1");
        let answer = messages_until_ready(&mut socket).await;
        assert_eq!(answer[1].0, b'D', "{mode:?}: {answer:?}");
        assert!(answer[1].1.ends_with(b"1"), "{mode:?}: the first text runs");
        // A text that does not parse is reported before the name, as PostgreSQL does.
        let mut bad = parse_bind_execute("s1", "", "SELEC 2");
        bad.extend(sync());
        socket.write_all(&bad).await.expect("bad");
        let answer = messages_until_ready(&mut socket).await;
        assert_eq!(error_field(&answer[0].1, b'C'), "42601", "{mode:?}");
        // A Parse that failed defined nothing: the name is free for the next.
        let mut failed = parse_bind_execute("s2", "", "SELEC 3");
        failed.extend(sync());
        socket.write_all(&failed).await.expect("failed");
        let answer = messages_until_ready(&mut socket).await;
        assert_eq!(error_field(&answer[0].1, b'C'), "42601", "{mode:?}");
        let mut fixed = parse_bind_execute("s2", "", "SELECT 3");
        fixed.extend(sync());
        socket.write_all(&fixed).await.expect("fixed");
        assert_eq!(tags_until_ready(&mut socket).await, "12DCZ", "{mode:?}");
        // Closed, the name can be used again.
        let mut close = message(b'C', b"Ss1\0");
        close.extend(parse_bind_execute("s1", "", "SELECT 4"));
        close.extend(sync());
        socket.write_all(&close).await.expect("close");
        assert_eq!(tags_until_ready(&mut socket).await, "312DCZ", "{mode:?}");
        // In a transaction block the refusal fails the transaction, as directly.
        socket
            .write_all(&message(b'Q', b"BEGIN\0"))
            .await
            .expect("begin");
        messages_until_ready(&mut socket).await;
        let mut in_block = parse_bind_execute("s1", "", "SELECT 5");
        in_block.extend(sync());
        socket.write_all(&in_block).await.expect("in block");
        let answer = messages_until_ready(&mut socket).await;
        assert_eq!(error_field(&answer[0].1, b'C'), "42P05", "{mode:?}");
        assert_eq!(answer.last(), Some(&(b'Z', b"E".to_vec())), "{mode:?}");
        socket
            .write_all(&message(b'Q', b"ROLLBACK\0"))
            .await
            .expect("rollback");
        let answer = messages_until_ready(&mut socket).await;
        assert_eq!(answer.last(), Some(&(b'Z', b"I".to_vec())), "{mode:?}");
    }
}

/// `server_idle_timeout`: an upstream connection idle in the pool that long is closed, and the
/// next client gets a new one.
#[tokio::test]
async fn upstream_connections_idle_past_server_idle_timeout_are_closed() {
    let s = setup_with(
        PoolMode::Transaction,
        4,
        AdmissionMode::Statement,
        Some(Duration::from_millis(300)),
    )
    .await;
    let direct = s.direct().await;
    let shop_backends = || async {
        let open: i64 = direct
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = 'shop' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        open
    };
    let client = s
        .server
        .client_with(&format!(
            "host=127.0.0.1 port={} user=owner dbname=shop",
            s.server.port
        ))
        .await;
    assert_eq!(column(&client, "SELECT 'lent'").await, ["lent"]);
    // Given back after the statement; idle past the timeout, it is closed (polled: the
    // sweep runs a few times per timeout, and PostgreSQL notices a closed socket at once).
    let mut open = shop_backends().await;
    for _ in 0..600 {
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        open = shop_backends().await;
    }
    assert_eq!(open, 0, "the idle upstream connection is closed");
    assert_eq!(column(&client, "SELECT 'again'").await, ["again"]);
}

/// A loopback TCP proxy in front of a port: [`Proxy::cut`] drops every connection it carries,
/// as a network that goes away does (nothing from PostgreSQL, the socket just ends).
struct Proxy {
    port: u16,
    links: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(to: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("binds");
        let port = listener.local_addr().expect("address").port();
        let links = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let carried = links.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let link = tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", to)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                carried.lock().expect("links").push(link);
            }
        });
        Proxy {
            port,
            links,
            accept,
        }
    }

    fn cut(&self) {
        for link in self.links.lock().expect("links").drain(..) {
            link.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// Reads what a client gets once its upstream is cut: PostgreSQL's FATAL for a lost
/// connection (08006), then the end of the socket.
async fn ends_with_a_fatal(socket: &mut tokio::net::TcpStream, what: &str) {
    use tokio::io::AsyncReadExt;
    let (tag, body) = tokio::time::timeout(Duration::from_secs(30), read_message(socket))
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing came"));
    assert_eq!(tag, b'E', "{what}: {}", String::from_utf8_lossy(&body));
    assert_eq!(error_field(&body, b'S'), "FATAL", "{what}");
    assert_eq!(error_field(&body, b'C'), "08006", "{what}");
    let mut rest = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(30), socket.read(&mut rest))
        .await
        .unwrap_or_else(|_| panic!("{what}: the socket stays open"));
    assert!(matches!(read, Ok(0) | Err(_)), "{what}: more came");
}

/// The network between sluice and PostgreSQL goes away (no FATAL from PostgreSQL): a
/// session-pooled client, idle, is told at once and its connection closes, as a direct one
/// would lose its; so is a transaction-pooled client inside a transaction (its work is gone
/// with the backend). A transaction-pooled client between transactions goes on, on a new
/// connection.
#[tokio::test]
async fn a_lost_upstream_connection_ends_the_sessions_it_carried() {
    use tokio::io::AsyncWriteExt;
    let pg_dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(pg_dir.path(), "owner", Auth::Password("owner-pw".into()));
    pg.psql("CREATE DATABASE shop OWNER owner");
    let proxy = Proxy::start(pg.port).await;
    let url = format!("postgres://owner:owner-pw@127.0.0.1:{}/shop", proxy.port);
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let (_data, sluice) = sluice_sized(&pg, &url, mode, None, 4).await;
        let mut idle = raw_client(sluice.port).await;
        idle.write_all(&message(b'Q', b"SELECT 1\0"))
            .await
            .expect("query");
        messages_until_ready(&mut idle).await;
        let mut in_block = raw_client(sluice.port).await;
        in_block
            .write_all(&message(b'Q', b"BEGIN\0"))
            .await
            .expect("begin");
        let answer = messages_until_ready(&mut in_block).await;
        assert_eq!(answer.last(), Some(&(b'Z', b"T".to_vec())));
        proxy.cut();
        ends_with_a_fatal(&mut in_block, &format!("{mode:?}, in a transaction")).await;
        match mode {
            PoolMode::Session => ends_with_a_fatal(&mut idle, "Session, idle").await,
            PoolMode::Transaction => {
                idle.write_all(&message(b'Q', b"SELECT 'again'\0"))
                    .await
                    .expect("query");
                let answer = messages_until_ready(&mut idle).await;
                assert_eq!(answer[1].0, b'D', "a new connection serves it: {answer:?}");
            }
        }
    }
}

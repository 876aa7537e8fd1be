//! The embedded engine's behaviour, through the [`Session`] interface the server uses.

use std::time::Duration;

use datafusion::arrow::record_batch::RecordBatch;
use futures::TryStreamExt;

use crate::embedded::EmbeddedSession;
use crate::{Embedded, ExecuteOptions, QueryOutput, Session};

fn engine() -> Embedded {
    Embedded::new(1 << 30).expect("engine runtime starts")
}

/// Runs `sql` to its end: its batches, or its tag.
async fn run(
    s: &EmbeddedSession,
    sql: &str,
) -> Result<Result<Vec<RecordBatch>, (String, Option<usize>)>, sluice_sql::Error> {
    match s.execute(sql, ExecuteOptions::default(), vec![]).await? {
        QueryOutput::Rows { batches, .. } => Ok(Ok(batches.try_collect().await?)),
        QueryOutput::Command { tag, rows } => Ok(Err((tag, rows))),
    }
}

#[tokio::test]
async fn sessions_share_tables_not_settings() {
    let engine = engine();
    let a = engine.embedded_session();
    let b = engine.embedded_session();
    text(&a, "CREATE TABLE t (x INT)").await;
    let out = run(&a, "INSERT INTO t VALUES (1), (2)")
        .await
        .expect("insert");
    assert_eq!(out, Err(("INSERT 0".to_string(), Some(2))));
    let batches = run(&b, "SELECT sum(x) FROM t")
        .await
        .expect("select")
        .expect("rows");
    assert_eq!(batches[0].num_rows(), 1);
    text(&a, "SET datafusion.execution.batch_size = 7").await;
    async fn show(s: &EmbeddedSession) -> String {
        let batches = run(s, "SHOW datafusion.execution.batch_size")
            .await
            .expect("show")
            .expect("rows");
        format!("{:?}", batches[0].column(1))
    }
    assert!(show(&a).await.contains('7'));
    assert!(!show(&b).await.contains("\"7\""));
}

#[tokio::test]
async fn result_columns_are_named_as_postgres_names_them() {
    let s = engine().embedded_session();
    text(&s, "CREATE TABLE n (x INT)").await;
    let names = |sql: &'static str| {
        let s = &s;
        async move {
            let schema = s.describe(sql).await.expect("plans").expect("rows");
            schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        names("SELECT 1, x, count(*) AS c, upper('a') FROM n GROUP BY x").await,
        ["?column?", "x", "c", "upper"]
    );
    assert_eq!(names("SELECT CAST(x AS BIGINT) FROM n").await, ["x"]);
    assert_eq!(names("SELECT count(*) FROM n").await, ["count"]);
    assert_eq!(names("SELECT * FROM n").await, ["x"]);
    let out = s
        .execute("SELECT 1 + 1", ExecuteOptions::default(), vec![])
        .await
        .expect("runs");
    let QueryOutput::Rows { schema, .. } = out else {
        panic!("rows")
    };
    assert_eq!(schema.field(0).name(), "?column?");
}

async fn text(s: &EmbeddedSession, sql: &str) -> String {
    match run(s, sql).await.expect(sql) {
        Ok(batches) => datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .expect("formats")
            .to_string(),
        Err((tag, _)) => tag,
    }
}

/// The plan cache keeps short texts only, and a bounded sum of them. Unbounded, a client's
/// distinct statements of megabytes were each kept, text and plan (40 of 8 MB: 2.1 GB held by
/// one idle connection).
#[tokio::test]
async fn the_plan_cache_keeps_no_long_text_and_a_bounded_sum() {
    let engine = engine();
    let s = engine.embedded_session();
    let long = format!(
        "SELECT length('{}') AS n",
        "a".repeat(crate::cache::CACHED_TEXT_MAX)
    );
    assert!(text(&s, &long).await.contains("65536"));
    assert!(!s.inner.planning.lock().await.cache.contains_key(&long));
    let kept_text = |cache: &std::collections::HashMap<String, crate::cache::CachedPlan>| {
        cache.keys().map(String::len).sum::<usize>()
    };
    for i in 0..80 {
        let q = format!("SELECT length('{}') + {i} AS n", "b".repeat(60 * 1024));
        assert!(text(&s, &q).await.contains(&(60 * 1024 + i).to_string()));
        let planning = s.inner.planning.lock().await;
        // Kept (the cache serves texts this long), and the whole within its budget.
        assert!(planning.cache.contains_key(&q), "statement {i} kept");
        assert!(kept_text(&planning.cache) <= 4 << 20, "statement {i}");
    }
}

#[tokio::test]
async fn cached_plans_never_serve_stale_tables_or_times() {
    let engine = engine();
    let (a, b) = (engine.embedded_session(), engine.embedded_session());
    text(&a, "CREATE TABLE c (x INT)").await;
    text(&a, "INSERT INTO c VALUES (1)").await;
    let q = "SELECT sum(x) AS s FROM c";
    assert!(text(&a, q).await.contains("| 1 "));
    assert!(
        a.inner.planning.lock().await.cache.contains_key(q),
        "cached"
    );
    // New rows, from another session: the cached plan reads the table as it is.
    text(&b, "INSERT INTO c VALUES (41)").await;
    assert!(text(&a, q).await.contains("| 42 "));
    // The table replaced by another with other columns: planned again.
    text(&b, "DROP TABLE c").await;
    text(&b, "CREATE TABLE c (x BIGINT, y INT)").await;
    text(&b, "INSERT INTO c VALUES (7, 0)").await;
    assert!(text(&a, q).await.contains("| 7 "));
    text(&b, "DROP TABLE c").await;
    let e = run(&a, q).await.expect_err("table gone");
    assert!(e.to_string().contains("not found"), "{e}");
    // Time-dependent queries are never cached (the optimizer folds now()).
    let t = "SELECT now() AS t";
    let first = text(&a, t).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_ne!(text(&a, t).await, first);
    assert!(!a.inner.planning.lock().await.cache.contains_key(t));
}

#[tokio::test]
async fn generate_series_returns_rows_named_as_in_postgres() {
    let s = engine().embedded_session();
    async fn shape(s: &EmbeddedSession, sql: &str) -> (Vec<String>, usize) {
        match s
            .execute(sql, ExecuteOptions::default(), vec![])
            .await
            .expect(sql)
        {
            QueryOutput::Rows { schema, batches } => {
                let batches: Vec<RecordBatch> = batches.try_collect().await.expect(sql);
                (
                    schema.fields().iter().map(|f| f.name().clone()).collect(),
                    batches.iter().map(|b| b.num_rows()).sum(),
                )
            }
            QueryOutput::Command { tag, .. } => panic!("{sql}: {tag}"),
        }
    }
    let cases: [(&str, &[&str], usize); 11] = [
        // An int4 bound (pgjdbc's `array_upper(…, 1)`): DataFusion's series takes int8 only.
        (
            "SELECT r FROM generate_series(1, CAST(3 AS INT)) AS s(r)",
            &["r"],
            3,
        ),
        (
            "SELECT * FROM generate_series(TIMESTAMP '2026-01-01', TIMESTAMP '2026-01-03', \
             INTERVAL '1 day')",
            &["generate_series"],
            3,
        ),
        ("SELECT generate_series(1, 3)", &["generate_series"], 3),
        ("SELECT generate_series(1, 10, 4) AS n", &["n"], 3),
        (
            "SELECT 7 AS k, GENERATE_SERIES(1, 2)",
            &["k", "generate_series"],
            2,
        ),
        (
            "SELECT * FROM generate_series(1, 4)",
            &["generate_series"],
            4,
        ),
        ("SELECT g FROM generate_series(1, 2) AS g", &["g"], 2),
        ("SELECT n FROM generate_series(1, 2) AS g(n)", &["n"], 2),
        (
            "WITH w AS (SELECT generate_series(1, 2) AS x) SELECT sum(x) AS s FROM w",
            &["s"],
            1,
        ),
        (
            "SELECT generate_series(1, 2) UNION ALL SELECT generate_series(5, 6)",
            &["generate_series"],
            4,
        ),
        (
            "SELECT count(*) AS n FROM (SELECT * FROM generate_series(1, 5)) AS t",
            &["n"],
            1,
        ),
    ];
    for (sql, columns, rows) in cases {
        let (got_columns, got_rows) = shape(&s, sql).await;
        assert_eq!(got_columns, columns, "{sql}");
        assert_eq!(got_rows, rows, "{sql}");
    }
    text(
        &s,
        "CREATE TABLE gs AS SELECT generate_series AS id FROM generate_series(1, 3)",
    )
    .await;
    text(&s, "INSERT INTO gs SELECT generate_series(4, 6)").await;
    let ids = text(&s, "SELECT count(*) AS n, sum(id) AS s FROM gs").await;
    assert!(ids.contains("| 6 | 21 |"), "{ids}");
    let summed = text(
        &s,
        "SELECT sum(generate_series) AS s FROM generate_series(1, 100)",
    )
    .await;
    assert!(summed.contains("| 5050 |"), "{summed}");
}

#[tokio::test]
async fn kept_physical_plans_run_again_from_the_start() {
    let engine = engine();
    let s = engine.embedded_session();
    // Several partitions, so plans have repartitions and merges to reset.
    text(&s, "SET datafusion.execution.target_partitions = 4").await;
    text(&s, "CREATE TABLE k (g INT, x INT)").await;
    text(
        &s,
        "INSERT INTO k VALUES (1, 1), (1, 2), (2, 3), (3, 4), (3, 5)",
    )
    .await;
    text(&s, "INSERT INTO k VALUES (2, 6), (4, 7)").await;
    let queries = [
        "SELECT 1",
        "SELECT count(*) AS n, sum(generate_series) AS s FROM generate_series(1, 1000)",
        "SELECT g, sum(x) AS s FROM k GROUP BY g ORDER BY g",
        "SELECT x FROM k WHERE x % 2 = 1 ORDER BY x DESC",
        "SELECT g FROM k UNION ALL SELECT x FROM k ORDER BY 1",
        "SELECT count(*) AS n FROM (SELECT x FROM k WHERE g > 1 LIMIT 2)",
    ];
    for q in queries {
        let first = text(&s, q).await;
        let planning = s.inner.planning.lock().await;
        let kept = planning.cache.get(q).and_then(|c| c.physical.as_ref());
        assert!(kept.is_some(), "physical plan kept for {q}");
        drop(planning);
        for _ in 0..3 {
            assert_eq!(text(&s, q).await, first, "{q}");
        }
    }
    // A DML retires the kept plans: the next run reads the new rows.
    text(&s, "INSERT INTO k VALUES (1, 100)").await;
    let grouped = text(&s, queries[2]).await;
    assert!(grouped.contains("| 1 | 103 |"), "{grouped}");
    // Plans that a reset cannot make new again are planned each run: a top-k sort pushes
    // a dynamic filter into its input.
    let topk = "SELECT x FROM k ORDER BY x LIMIT 2";
    text(&s, topk).await;
    let planning = s.inner.planning.lock().await;
    assert!(planning
        .cache
        .get(topk)
        .is_some_and(|c| c.physical.is_none()));
}

#[tokio::test]
async fn constant_answers_are_kept_and_table_answers_are_not() {
    let engine = engine();
    let s = engine.embedded_session();
    text(&s, "CREATE TABLE c (x INT)").await;
    text(&s, "INSERT INTO c VALUES (1)").await;
    let kept_rows = |q: &'static str| {
        let s = &s;
        async move {
            let planning = s.inner.planning.lock().await;
            planning.cache.get(q).is_some_and(|c| c.rows.is_some())
        }
    };
    // A constant answer: planned, run, then served as kept (the same each time).
    for q in ["SELECT 1", "SELECT 1 + 2 AS three, 'a' || 'b' AS ab"] {
        let first = text(&s, q).await;
        for _ in 0..3 {
            assert_eq!(text(&s, q).await, first, "{q}");
        }
        assert!(kept_rows(q).await, "{q}'s rows kept");
    }
    // A table's rows are read each run (its answer changes with the table).
    let q = "SELECT x FROM c ORDER BY x";
    text(&s, q).await;
    text(&s, q).await;
    assert!(!kept_rows(q).await);
    // The optimizer answers `count(*)` from the table's statistics with constant rows: kept
    // for this generation, which a DML ends.
    let n = "SELECT count(*) AS n FROM c";
    assert!(text(&s, n).await.contains("| 1 |"));
    text(&s, "INSERT INTO c VALUES (2)").await;
    assert!(text(&s, q).await.contains("| 2 |"));
    assert!(text(&s, n).await.contains("| 2 |"));
    // A clock is not constant: `now()` is planned anew, never kept.
    let q = "SELECT now() > TIMESTAMP '2000-01-01' AS later";
    text(&s, q).await;
    text(&s, q).await;
    assert!(!kept_rows(q).await);
}

/// A session whose engine runs on the test's own runtime (a paused clock, in a paused test).
fn session_on_this_runtime() -> crate::embedded::EmbeddedSession {
    Embedded::on(tokio::runtime::Handle::current(), 1 << 30)
        .expect("engine starts")
        .embedded_session()
}

#[tokio::test(start_paused = true)]
async fn pg_sleep_sleeps_in_virtual_time() {
    let s = session_on_this_runtime();
    let start = tokio::time::Instant::now();
    let rows = run(&s, "SELECT pg_sleep(2)").await.expect("runs");
    assert!(rows.is_ok());
    assert!(start.elapsed() >= Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn pg_sleep_past_what_a_duration_holds_sleeps_until_stopped() {
    let s = session_on_this_runtime();
    // A year of virtual time passes and it still sleeps (it panicked the engine thread).
    let year = Duration::from_secs(365 * 24 * 3600);
    for seconds in ["99999999999999999999999999.1", "'Infinity'::float8"] {
        let sql = format!("SELECT pg_sleep({seconds})");
        let sleeping = run(&s, &sql);
        assert!(
            tokio::time::timeout(year, sleeping).await.is_err(),
            "pg_sleep({seconds}) returned"
        );
    }
}

#[test]
fn command_tags() {
    use crate::compat::command_tag;
    assert_eq!(
        command_tag("create external table t stored as csv location 'x'"),
        "CREATE TABLE"
    );
    assert_eq!(
        command_tag("CREATE OR REPLACE VIEW v AS SELECT 1"),
        "CREATE VIEW"
    );
}

#[tokio::test]
async fn rows_stream_in_bounded_batches_and_stop_when_dropped() {
    let s = engine().embedded_session();
    // Far more rows than fit in memory were they collected: only the first few batches are
    // produced before the consumer stops, and dropping the stream stops the statement.
    let out = s
        .execute(
            "SELECT * FROM generate_series(1, 10000000000)",
            ExecuteOptions::default(),
            vec![],
        )
        .await
        .expect("starts");
    let QueryOutput::Rows { mut batches, .. } = out else {
        panic!("rows")
    };
    let mut rows = 0;
    for _ in 0..3 {
        rows += batches
            .try_next()
            .await
            .expect("batch")
            .expect("more")
            .num_rows();
    }
    assert!(rows > 0);
    drop(batches);
    // The session is free again at once (the statement's task released its lock).
    assert!(text(&s, "SELECT 41 + 1 AS x").await.contains("42"));
}

#[tokio::test]
async fn parameters_take_the_type_of_their_column() {
    use datafusion::common::ScalarValue;
    let s = engine().embedded_session();
    text(&s, "CREATE TABLE p (k INT, v TEXT, f DOUBLE)").await;
    // What psycopg sends: a smallint for a small Python int, a text for a str.
    let out = s
        .execute(
            "INSERT INTO p VALUES ($1, $2, $3)",
            ExecuteOptions::default(),
            vec![
                ScalarValue::Int16(Some(7)),
                ScalarValue::Utf8(Some("x".into())),
                ScalarValue::Int32(Some(2)),
            ],
        )
        .await
        .expect("insert");
    assert!(
        matches!(&out, QueryOutput::Command { rows: Some(1), .. }),
        "{out:?}"
    );
    let types = text(
        &s,
        "SELECT arrow_typeof(k) AS t, arrow_typeof(f) AS u FROM p",
    )
    .await;
    assert!(
        types.contains("Int32") && types.contains("Float64"),
        "{types}"
    );
    let found = s
        .execute(
            "SELECT v FROM p WHERE k = $1",
            ExecuteOptions::default(),
            vec![ScalarValue::Int16(Some(7))],
        )
        .await
        .expect("select");
    let QueryOutput::Rows { batches, .. } = found else {
        panic!("rows")
    };
    let batches: Vec<RecordBatch> = batches.try_collect().await.expect("rows");
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    // A later scan over the table reads one schema (it failed to concatenate Int16 and Int32).
    assert!(text(&s, "SELECT k FROM p ORDER BY k").await.contains('7'));
}

#[tokio::test]
async fn a_barrier_holds_its_query_until_opened_and_counts_out_a_dropped_one() {
    let barriers = crate::Barriers::default();
    let engine = engine().with_barriers(barriers.clone());
    let s = engine.embedded_session();
    let held = tokio::spawn(async move { run(&s, "SELECT sluice_barrier('g') AS b").await });
    tokio::time::timeout(Duration::from_secs(10), barriers.reached("g", 1))
        .await
        .expect("the query reaches the gate");
    assert!(!held.is_finished());
    barriers.open("g");
    let batches = held.await.expect("task").expect("runs").expect("rows");
    assert_eq!(batches[0].num_rows(), 1);

    // A query dropped at a closed gate is counted out of it.
    barriers.close("g");
    let s = engine.embedded_session();
    let dropped = tokio::spawn(async move { run(&s, "SELECT sluice_barrier('g')").await });
    tokio::time::timeout(Duration::from_secs(10), barriers.reached("g", 1))
        .await
        .expect("waits again");
    dropped.abort();
    let _ = dropped.await;
    for _ in 0..500 {
        if barriers.waiting("g") == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the dropped query still counts at the gate");
}

#[tokio::test]
async fn an_engine_without_barriers_has_no_barrier_function() {
    let s = engine().embedded_session();
    assert!(run(&s, "SELECT sluice_barrier('g')").await.is_err());
}

/// A statement's own parallelism (the CPU threads it was granted) shapes its physical plan,
/// and it still shares the session's cached logical plan.
#[tokio::test]
async fn a_statement_runs_at_its_granted_parallelism_and_keeps_the_session_cache() {
    let engine = engine();
    let s = engine.embedded_session();
    text(&s, "SET datafusion.execution.target_partitions = 4").await;
    text(&s, "CREATE TABLE p (g INT, x INT)").await;
    text(&s, "INSERT INTO p VALUES (1, 1), (1, 2), (2, 3), (3, 4)").await;
    let at = |n: usize| ExecuteOptions {
        target_partitions: Some(n),
        ..ExecuteOptions::default()
    };
    let render = |out: QueryOutput| async move {
        match out {
            QueryOutput::Rows { batches, .. } => {
                let batches: Vec<RecordBatch> = batches.try_collect().await.expect("rows");
                datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                    .expect("formats")
                    .to_string()
            }
            QueryOutput::Command { tag, .. } => tag,
        }
    };
    let explain = "EXPLAIN SELECT g, sum(x) FROM p GROUP BY g";
    let serial = render(s.execute(explain, at(1), vec![]).await.expect("explain")).await;
    assert!(!serial.contains("RepartitionExec"), "{serial}");
    let three = render(s.execute(explain, at(3), vec![]).await.expect("explain")).await;
    assert!(three.contains("Hash([g@0], 3)"), "{three}");
    // The session's own parallelism is untouched.
    let session = text(&s, explain).await;
    assert!(session.contains("Hash([g@0], 4)"), "{session}");
    let q = "SELECT g, sum(x) AS s FROM p GROUP BY g ORDER BY g";
    let one = render(s.execute(q, at(1), vec![]).await.expect("q")).await;
    {
        let planning = s.inner.planning.lock().await;
        let entry = planning
            .cache
            .get(q)
            .expect("logical plan cached from a one-off run");
        assert!(
            entry.physical.is_none(),
            "a one-off physical plan is not kept"
        );
    }
    assert_eq!(text(&s, q).await, one);
    assert_eq!(
        render(s.execute(q, at(2), vec![]).await.expect("q")).await,
        one
    );
    let planning = s.inner.planning.lock().await;
    assert!(planning.cache.get(q).is_some_and(|c| c.physical.is_some()));
}

/// A gate that records what it admitted, and fails once `fail_after` bytes have passed.
#[derive(Debug, Default)]
struct Recorder {
    admitted: std::sync::Mutex<Vec<(std::path::PathBuf, u64, bool)>>,
    fail_after: Option<u64>,
}

#[async_trait::async_trait]
impl crate::IoGate for Recorder {
    async fn admit(
        &self,
        path: &std::path::Path,
        bytes: u64,
        write: bool,
    ) -> sluice_sql::Result<Box<dyn Send>> {
        let mut admitted = self.admitted.lock().expect("lock");
        let so_far: u64 = admitted.iter().map(|(_, b, _)| b).sum();
        if self.fail_after.is_some_and(|limit| so_far >= limit) {
            return Err(sluice_sql::Error::new(
                sluice_sql::ErrorCode::QueryWasCancelled,
                "the gate said no",
            ));
        }
        admitted.push((path.to_path_buf(), bytes, write));
        Ok(Box::new(()))
    }
}

/// Every byte a statement reads from or writes to a file is admitted by its gate first, in
/// chunks of at most `io::CHUNK`; a gate error fails the statement with that error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_reads_and_writes_go_through_the_statements_gate() {
    use std::io::Write;
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("rows.csv");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&csv).expect("create"));
    writeln!(file, "a,b").expect("write");
    for i in 0..200_000 {
        writeln!(file, "{i},row number {i}").expect("write");
    }
    drop(file);
    let size = std::fs::metadata(&csv).expect("meta").len();
    assert!(size > 2 * crate::io::CHUNK, "several chunks: {size}");

    let engine = engine();
    let s = engine.embedded_session();
    text(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE rows (a INT, b VARCHAR) STORED AS CSV LOCATION '{}' \
             OPTIONS ('format.has_header' 'true')",
            csv.display()
        ),
    )
    .await;
    let gate = Arc::new(Recorder::default());
    let options = ExecuteOptions {
        target_partitions: Some(1),
        io: Some(gate.clone()),
        ..ExecuteOptions::default()
    };
    let out = s
        .execute("SELECT count(*) AS n FROM rows", options.clone(), vec![])
        .await
        .expect("runs");
    let QueryOutput::Rows { batches, .. } = out else {
        panic!("rows")
    };
    let batches: Vec<RecordBatch> = batches.try_collect().await.expect("rows");
    let shown = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
        .expect("formats")
        .to_string();
    assert!(shown.contains("200000"), "{shown}");
    let reads = gate.admitted.lock().expect("lock").clone();
    assert!(reads
        .iter()
        .all(|(p, b, w)| p == &csv && *b <= crate::io::CHUNK && !w));
    let read: u64 = reads.iter().map(|(_, b, _)| b).sum();
    assert!(read >= size, "every byte admitted: {read} of {size}");

    // COPY … TO writes through it too.
    let out_path = dir.path().join("copy.csv");
    let out = s
        .execute(
            &format!(
                "COPY (SELECT a FROM rows WHERE a < 1000) TO '{}' STORED AS CSV",
                out_path.display()
            ),
            options.clone(),
            vec![],
        )
        .await
        .expect("copies");
    assert!(matches!(out, QueryOutput::Command { .. }), "{out:?}");
    let written: u64 = gate
        .admitted
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, _, w)| *w)
        .map(|(_, b, _)| b)
        .sum();
    let on_disk = std::fs::metadata(&out_path).expect("written").len();
    assert_eq!(written, on_disk, "every written byte admitted");

    // A gate that refuses fails the statement with its error.
    let refusing = Arc::new(Recorder {
        fail_after: Some(crate::io::CHUNK),
        ..Recorder::default()
    });
    let failed = async {
        let out = s
            .execute(
                "SELECT count(*) AS n FROM rows",
                ExecuteOptions {
                    target_partitions: Some(1),
                    io: Some(refusing.clone()),
                    ..ExecuteOptions::default()
                },
                vec![],
            )
            .await?;
        match out {
            QueryOutput::Rows { batches, .. } => batches.try_collect::<Vec<_>>().await.map(|_| ()),
            QueryOutput::Command { .. } => Ok(()),
        }
    }
    .await
    .expect_err("the gate refused");
    assert!(failed.to_string().contains("the gate said no"), "{failed}");
    // Without a gate nothing is asked.
    let before = gate.admitted.lock().expect("lock").len();
    text(&s, "SELECT count(*) FROM rows").await;
    assert_eq!(gate.admitted.lock().expect("lock").len(), before);
}

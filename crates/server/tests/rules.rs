//! Ranked rules over the wire: classifiers placing statements by user, application name,
//! comment tag, address and kind; explicit choices winning over them; dry runs that only count;
//! outranked work kept alive by `outranked_share`; and a rule replaced while statements wait,
//! every one of them moved to where the new rules send it, in arrival order.
//! Queries are queued behind a statement held at a test barrier, so what is asserted is the
//! order of admissions, not how long anything took.

mod support;

use support::*;

/// Where the statements matching `like` ran, in the order they were admitted (the query log's
/// `admitted`, to the microsecond; one slot admits one at a time).
async fn admitted_in(admin: &tokio_postgres::Client, like: &str) -> Vec<String> {
    column(
        admin,
        &format!("SELECT workload FROM system.query_log WHERE query LIKE '{like}' ORDER BY admitted, query_id"),
    )
    .await
}

#[tokio::test]
async fn classifiers_place_statements_by_who_sends_them_and_what_they_say() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE q (QUERY);
         CREATE WORKLOAD all;
         CREATE WORKLOAD etl IN all;
         CREATE WORKLOAD dashboards IN all;
         CREATE WORKLOAD billing IN all;
         CREATE WORKLOAD writes IN all;
         CREATE WORKLOAD local IN all;
         CREATE WORKLOAD trial IN all;
         CREATE WORKLOAD default IN all;
         CREATE CLASSIFIER by_user WORKLOAD etl WHEN user = 'loader' RANK 30;
         CREATE CLASSIFIER by_app WORKLOAD dashboards WHEN application_name ILIKE 'grafana%' RANK 20;
         CREATE CLASSIFIER by_tag WORKLOAD billing WHEN tag('team') = 'billing' RANK 10;
         CREATE CLASSIFIER by_kind WORKLOAD writes WHEN statement_kind IN ('insert', 'update', 'delete') RANK 5;
         CREATE CLASSIFIER by_addr WORKLOAD local WHEN client_addr = '127.0.0.0/8' AND query ~ '^SELECT 4' RANK 1;
         CREATE CLASSIFIER trying WORKLOAD trial WHEN query LIKE '%try me%' RANK 100 DRY RUN",
        false,
    )
    .await;
    let port = server.port;
    let loader = server
        .client_with(&format!(
            "host=127.0.0.1 port={port} user=loader dbname=any"
        ))
        .await;
    let grafana = server
        .client_with(&format!(
            "host=127.0.0.1 port={port} user=tester dbname=any application_name=Grafana-11"
        ))
        .await;
    column(&loader, "SELECT 1 AS by_user /* team='billing' */").await;
    column(&grafana, "SELECT 2 AS by_app").await;
    column(&admin, "SELECT 3 AS by_tag /*team='billing'*/").await;
    // A string that looks like a tag is not one.
    column(&admin, "SELECT '/* team=''billing'' */' AS no_tag").await;
    admin
        .simple_query("CREATE TABLE t AS SELECT 1 AS x")
        .await
        .expect("create");
    admin
        .simple_query("INSERT INTO t VALUES (2)")
        .await
        .expect("insert");
    column(&admin, "SELECT 4 AS by_addr").await;
    // The dry run matches first, counts, and routes nothing: by_tag places it.
    column(&admin, "SELECT 5 AS try_me /* team='billing' */ -- try me").await;
    // Explicit choices win over every rule.
    column(&loader, "SELECT 6 AS explicit SETTINGS workload = 'trial'").await;
    loader
        .simple_query("SET workload = 'trial'")
        .await
        .expect("set");
    column(&loader, "SELECT 7 AS session_set").await;
    // Issue 36, defect 2: a tag in a comment before the statement, as ORMs that prepend write
    // it, in both protocols; the text shown keeps the comment, as sent.
    column(&admin, "/* team='billing' */ SELECT 8 AS leading_tag").await;
    admin
        .query("/*team='billing'*/\n  SELECT 9 AS leading_extended", &[])
        .await
        .expect("extended");

    let placed = column(
        &admin,
        "SELECT workload || ' ' || query FROM system.query_log WHERE query NOT LIKE '%system.%' ORDER BY query_id",
    )
    .await;
    assert_eq!(
        placed,
        [
            "etl SELECT 1 AS by_user /* team='billing' */",
            "dashboards SELECT 2 AS by_app",
            "billing SELECT 3 AS by_tag /*team='billing'*/",
            "default SELECT '/* team=''billing'' */' AS no_tag",
            "default CREATE TABLE t AS SELECT 1 AS x",
            "writes INSERT INTO t VALUES (2)",
            "local SELECT 4 AS by_addr",
            "billing SELECT 5 AS try_me /* team='billing' */ -- try me",
            "trial SELECT 6 AS explicit",
            "trial SELECT 7 AS session_set",
            "billing /* team='billing' */ SELECT 8 AS leading_tag",
            "billing /*team='billing'*/\n  SELECT 9 AS leading_extended",
        ]
    );
    assert_eq!(
        column(
            &admin,
            "SELECT coalesce(classifier, '-') FROM system.query_log WHERE query NOT LIKE '%system.%' ORDER BY query_id",
        )
        .await,
        [
            "by_user", "by_app", "by_tag", "-", "-", "by_kind", "by_addr", "by_tag", "-", "-", "by_tag",
            "by_tag"
        ],
        "the query log names the rule that placed each"
    );
    assert_eq!(
        column(
            &admin,
            "SELECT name || ' ' || workload || ' ' || CAST(rank AS VARCHAR) || ' ' || CAST(dry_run AS VARCHAR) || ' ' || CAST(matches AS VARCHAR) || ' ' || CAST(last_match IS NOT NULL AS VARCHAR) FROM system.classifiers",
        )
        .await,
        [
            "trying trial 100 true 1 true",
            "by_user etl 30 false 1 true",
            "by_app dashboards 20 false 1 true",
            "by_tag billing 10 false 4 true",
            "by_kind writes 5 false 1 true",
            "by_addr local 1 false 1 true",
        ]
    );
    assert_eq!(
        column(&admin, "SHOW CREATE CLASSIFIER by_app").await,
        ["CREATE CLASSIFIER by_app WORKLOAD dashboards WHEN application_name ILIKE 'grafana%' RANK 20"]
    );
    assert_eq!(
        column(
            &admin,
            "SELECT predicate FROM system.classifiers WHERE name = 'by_kind'"
        )
        .await,
        ["statement_kind IN ('insert', 'update', 'delete')"]
    );

    // The catalog keeps what rules route to.
    let e = admin
        .simple_query("DROP WORKLOAD billing")
        .await
        .expect_err("refused");
    assert_refused(&e, "2BP01", "Classifiers route to it: by_tag");
    let e = admin
        .simple_query("CREATE CLASSIFIER x WORKLOAD all WHEN user = 'a'")
        .await
        .expect_err("refused");
    assert_refused(&e, "22023", "which has children");
    let e = admin
        .simple_query("CREATE CLASSIFIER x WORKLOAD etl WHEN query ~ '(('")
        .await
        .expect_err("refused");
    assert_refused(&e, "22023", "invalid regular expression");
    server.stop().await;
}

/// Three classifier-ranked streams saturate one slot: `etl` (by user) outranks `dashboards`
/// (by application name), which outranks `adhoc` (by comment tag). With
/// `outranked_share = 0.1`, adhoc takes every tenth admission while the others wait, and all
/// of them once they are done; with 0 it starves until they are.
#[tokio::test]
async fn outranked_work_keeps_its_share_and_starves_without_one() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE q (QUERY);
         CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
         CREATE WORKLOAD etl IN all SETTINGS priority = 0;
         CREATE WORKLOAD dashboards IN all SETTINGS priority = 1;
         CREATE WORKLOAD adhoc IN all SETTINGS priority = 2, outranked_share = 0.1;
         CREATE CLASSIFIER etl WORKLOAD etl WHEN user = 'etl' RANK 3;
         CREATE CLASSIFIER dashboards WORKLOAD dashboards WHEN application_name = 'dashboards' RANK 2;
         CREATE CLASSIFIER adhoc WORKLOAD adhoc WHEN tag('team') = 'adhoc' RANK 1",
        false,
    )
    .await;
    for (round, share, etl, adhoc) in [("tenth", "0.1", 36, 24), ("strict", "0", 20, 10)] {
        admin
            .batch_execute(&format!("CREATE OR REPLACE WORKLOAD adhoc IN all SETTINGS priority = 2, outranked_share = {share}"))
            .await
            .expect("share");
        // The slot is held while the streams queue up.
        let holder = spawn_query(
            &server,
            &format!("SELECT sluice_barrier('{round}') SETTINGS workload = 'etl'"),
        )
        .await;
        until_running(&admin, 1).await;
        let port = server.port;
        let mut runs = Vec::new();
        for i in 0..etl.max(adhoc) {
            for (user, app, tag, n) in [
                ("etl", "loader", "", etl),
                ("tester", "dashboards", "", etl),
                ("tester", "psql", "/* team='adhoc' */", adhoc),
            ] {
                if i >= n {
                    continue;
                }
                let client = server
                    .client_with(&format!(
                        "host=127.0.0.1 port={port} user={user} dbname=any application_name={app}"
                    ))
                    .await;
                let sql = format!("SELECT 1 AS {round}_run {tag}");
                runs.push(tokio::spawn(async move { client.simple_query(&sql).await }));
            }
        }
        until_waiting(&admin, 2 * etl + adhoc).await;
        server.barriers.open(round);
        holder.await.expect("task").expect("holder");
        for run in runs {
            run.await.expect("task").expect("runs");
        }
        let order = admitted_in(&admin, &format!("SELECT 1 AS {round}_run%")).await;
        assert_eq!(order.len(), 2 * etl + adhoc);
        let busy = &order[..order.len() - order.iter().rev().take_while(|w| *w == "adhoc").count()];
        let share_while_busy =
            busy.iter().filter(|w| *w == "adhoc").count() as f64 / busy.len() as f64;
        if share == "0" {
            assert_eq!(share_while_busy, 0.0, "{order:?}");
        } else {
            assert!(
                (0.08..=0.12).contains(&share_while_busy),
                "adhoc had {share_while_busy} of {} admissions while outranked: {order:?}",
                busy.len()
            );
        }
        // Strict priority between etl and dashboards all along.
        let first_dashboard = busy.iter().position(|w| w == "dashboards");
        let last_etl = busy.iter().rposition(|w| w == "etl");
        assert!(first_dashboard > last_etl, "{order:?}");
    }
    assert_nothing_held(&admin).await;
    server.stop().await;
}

/// A rule is replaced while 50 statements it placed wait (among 12 that chose their workload):
/// each one moves to the workload the new rules name, where it queues in arrival order among
/// the statements already there; none is lost, none admitted twice. Admitted statements stay
/// where they run.
#[tokio::test]
async fn a_replaced_rule_moves_what_it_placed_keeping_arrival_order() {
    let (_dir, server, admin) = started_with(
        "CREATE RESOURCE q (QUERY);
         CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
         CREATE WORKLOAD reports IN all;
         CREATE WORKLOAD batch IN all;
         CREATE WORKLOAD fast IN all;
         CREATE CLASSIFIER nightly WORKLOAD reports WHEN tag('job') = 'nightly'",
        false,
    )
    .await;
    let holder = spawn_query(&server, "SELECT sluice_barrier('hold') /* job='nightly' */").await;
    until_running(&admin, 1).await;
    // Arrival order: every fifth statement goes to batch itself; the rest the rule places.
    let mut runs = Vec::new();
    let mut expected = Vec::new();
    for i in 0..62 {
        let sql = if i % 5 == 4 {
            format!("SELECT {i} AS n /* job='other' */ SETTINGS workload = 'batch'")
        } else {
            format!("SELECT {i} AS n /* job='nightly' */")
        };
        expected.push(i.to_string());
        let client = server.client().await;
        runs.push(tokio::spawn(async move { client.simple_query(&sql).await }));
        until_waiting(&admin, i + 1).await;
    }
    assert_eq!(
        column(&admin, "SELECT count(*) FROM system.processes WHERE state = 'waiting' AND workload = 'reports'").await,
        ["50"]
    );
    admin
        .batch_execute(
            "CREATE OR REPLACE CLASSIFIER nightly WORKLOAD batch WHEN tag('job') = 'nightly'",
        )
        .await
        .expect("replace");
    until(
        &admin,
        "SELECT workload || ' ' || CAST(count(*) AS VARCHAR) FROM system.processes WHERE state = 'waiting' GROUP BY workload",
        "batch 62",
    )
    .await;
    assert_eq!(
        column(&admin, "SELECT DISTINCT coalesce(classifier, '-') FROM system.processes WHERE state = 'waiting' ORDER BY 1").await,
        ["-", "nightly"],
        "moved by the new version of the rule; the others chose batch themselves"
    );
    assert_eq!(
        column(&admin, "SELECT workload FROM system.processes WHERE state = 'running' AND query LIKE 'SELECT sluice_barrier%'").await,
        ["reports"],
        "the admitted statement stays where it runs"
    );
    server.barriers.open("hold");
    holder.await.expect("task").expect("holder");
    for run in runs {
        run.await.expect("task").expect("every statement runs once");
    }
    let order = column(
        &admin,
        "SELECT CAST(regexp_replace(query, '^SELECT ([0-9]+).*$', '\\1') AS VARCHAR) FROM system.query_log WHERE query LIKE 'SELECT % AS n%' AND query NOT LIKE '%system.%' ORDER BY admitted, query_id",
    )
    .await;
    assert_eq!(order, expected, "admitted in arrival order");
    assert_eq!(
        column(&admin, "SELECT DISTINCT workload FROM system.query_log WHERE query LIKE 'SELECT % AS n%' AND query NOT LIKE '%system.%'").await,
        ["batch"]
    );
    assert_eq!(
        column(&admin, "SELECT CAST(dequeued_requests AS VARCHAR) FROM system.scheduler WHERE path = '/all/semaphore'").await,
        ["63"],
        "admitted once each"
    );
    assert_nothing_held(&admin).await;
    server.stop().await;
}

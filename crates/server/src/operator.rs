//! An operator's hand on running and waiting statements: `KILL QUERY WHERE …`,
//! `MOVE QUERY WHERE … TO WORKLOAD w`, and Postgres tools' `pg_cancel_backend(pid)` /
//! `pg_terminate_backend(pid)`.
//!
//! Which statements a `WHERE` names is decided by the engine, over a fresh `system.processes`:
//! any SQL condition on its columns works. In a fleet, over every live node's (see
//! `fleet_views`): a statement on another node is killed or moved there, by a request
//! through etcd. Users who are not admins may act on their own
//! statements only; a condition that also matches other users' statements is refused whole
//! (nothing is killed or moved), with the users named.

use std::sync::Arc;

use futures::TryStreamExt;
use sluice_engine::datafusion::arrow::array::{Array, StringArray, UInt64Array};
use sluice_engine::datafusion::arrow::datatypes::{DataType, Field, Schema};
use sluice_engine::datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::{ExecuteOptions, QueryOutput, Session};
use sluice_sql::{Error, ErrorCode, KillMode, Result};

use crate::state::Shared;

/// One statement a condition matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub query_id: u64,
    pub user: String,
    pub workload: String,
    pub query: String,
    /// The node it runs on (`system.processes.node`).
    pub node: String,
}

/// The statements of `system.processes` that `predicate` holds for, checked against what
/// `user` may act on.
pub async fn matching(
    shared: &Shared,
    session: &dyn Session,
    user: &str,
    predicate: &str,
) -> Result<Vec<Matched>> {
    crate::system::refresh(shared)?;
    let source = if shared.fleet.get().is_some() {
        "clusterAllReplicas('default', system.processes)"
    } else {
        "system.processes"
    };
    let sql = format!(
        "SELECT query_id, \"user\", workload, query, node FROM {source} WHERE ({predicate}) ORDER BY query_id"
    );
    let sql = crate::fleet_views::prepare(shared, &sql).await?;
    let batches: Vec<RecordBatch> = match session
        .execute(&sql, ExecuteOptions::default(), Vec::new())
        .await?
    {
        QueryOutput::Rows { batches, .. } => batches.try_collect().await?,
        QueryOutput::Command { .. } => Vec::new(),
    };
    let mut out = Vec::new();
    for batch in &batches {
        let ids = batch.column(0).as_any().downcast_ref::<UInt64Array>();
        let text = |i: usize| batch.column(i).as_any().downcast_ref::<StringArray>();
        let (Some(ids), Some(users), Some(workloads), Some(queries), Some(nodes)) =
            (ids, text(1), text(2), text(3), text(4))
        else {
            return Err(Error::new(
                ErrorCode::InternalError,
                "system.processes has unexpected column types",
            ));
        };
        for row in 0..batch.num_rows() {
            out.push(Matched {
                query_id: ids.value(row),
                user: users.value(row).to_string(),
                workload: workloads.value(row).to_string(),
                query: queries.value(row).to_string(),
                node: nodes.value(row).to_string(),
            });
        }
    }
    if !shared.logins.is_admin(user) {
        let mut others: Vec<&str> = out
            .iter()
            .filter(|m| m.user != user)
            .map(|m| m.user.as_str())
            .collect();
        others.sort_unstable();
        others.dedup();
        if !others.is_empty() {
            return Err(Error::new(
                ErrorCode::AccessDenied,
                format!(
                    "{user}: Not enough privileges. The condition matches statements of other users ({}); only admins act on other users' statements. Add AND user = '{user}' to act on your own",
                    others.join(", ")
                ),
            ));
        }
    }
    Ok(out)
}

/// `KILL QUERY`: stops each matched statement (with `SYNC`, waits until they are gone), and
/// answers one row per statement as ClickHouse does: `kill_status`, `query_id`, `user`,
/// `query`. Statements on other nodes of the fleet are stopped there.
pub async fn kill(
    shared: &Shared,
    by: &str,
    matched: Vec<Matched>,
    mode: KillMode,
) -> Result<RecordBatch> {
    let mode_name = match mode {
        KillMode::Async => "async",
        KillMode::Sync => "sync",
        KillMode::Test => "test",
    };
    let status = act(shared, &matched, "kill", &format!("{mode_name}\n{by}")).await?;
    rows("kill_status", status, &matched)
}

/// Stops statements `ids` of this node (`mode` as `KILL QUERY`'s): each one's `kill_status`.
async fn kill_here(shared: &Shared, by: &str, ids: &[u64], mode: &str) -> Vec<String> {
    let mut status = Vec::new();
    for id in ids {
        let s = match mode {
            "test" => "test",
            _ => {
                let killed = shared.registry.kill(
                    *id,
                    Error::new(
                        ErrorCode::QueryWasCancelled,
                        format!("Query was cancelled: KILL QUERY by user '{by}'"),
                    ),
                );
                if killed {
                    "waiting"
                } else {
                    "finished" // it ended on its own meanwhile
                }
            }
        };
        status.push(s.to_string());
    }
    if mode == "sync" {
        for (id, s) in ids.iter().zip(status.iter_mut()) {
            while shared.registry.workload_of_query(*id).is_some() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            *s = "finished".into();
        }
    }
    status
}

/// `MOVE QUERY … TO WORKLOAD w`: moves each matched statement, running (with what it holds) or
/// waiting (it queues again there), on whichever node of the fleet it is. Answers
/// `move_status`, `query_id`, `user`, `query`.
pub async fn move_to(
    shared: &Shared,
    matched: Vec<Matched>,
    workload: &str,
) -> Result<RecordBatch> {
    let snapshot = shared.snapshot();
    if snapshot.catalog.workload(workload).is_none() {
        return Err(Error::bad_arguments(format!(
            "Workload '{workload}' doesn't exist (SHOW WORKLOADS lists them)"
        )));
    }
    if snapshot.catalog.children_of(workload).next().is_some() {
        return Err(Error::new(
            ErrorCode::InvalidSchedulerNode,
            format!("Unable to link to workload '{workload}' that has children; queries run in leaf workloads only"),
        ));
    }
    let status = act(shared, &matched, "move", workload).await?;
    rows("move_status", status, &matched)
}

/// Moves statements `ids` of this node to `workload`: each one's `move_status`.
fn move_here(shared: &Shared, ids: &[u64], from: &[String], workload: &str) -> Vec<String> {
    ids.iter()
        .zip(from)
        .map(|(id, from)| match shared.move_any(*id, workload) {
            Ok(()) => format!("moved from {from}"),
            Err(_) => "finished".to_string(), // it ended meanwhile
        })
        .collect()
}

/// How long a node waits for another to kill or move its statements (a `SYNC` kill waits for
/// them to end).
const ACT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Kills or moves (`what`, with `how`: the kill's mode and user, or the workload) each
/// matched statement where it runs: here, or on its node (asked through etcd). Each one's
/// status, in `matched`'s order.
async fn act(shared: &Shared, matched: &[Matched], what: &str, how: &str) -> Result<Vec<String>> {
    let here = shared.node_name();
    let mut status = vec![String::new(); matched.len()];
    let mut nodes: Vec<&str> = matched.iter().map(|m| m.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    for node in nodes {
        let places: Vec<usize> = (0..matched.len())
            .filter(|i| matched[*i].node == node)
            .collect();
        let ids: Vec<u64> = places.iter().map(|i| matched[*i].query_id).collect();
        let workloads: Vec<String> = places
            .iter()
            .map(|i| matched[*i].workload.clone())
            .collect();
        let answered = if node == here {
            local(shared, what, how, &ids, &workloads).await
        } else {
            let body = format!("{how}\n{}", request_rows(&ids, &workloads));
            let text = crate::fleet_views::ask_node(shared, node, what, &body, ACT_WAIT).await?;
            text.lines().map(str::to_string).collect()
        };
        for (place, s) in places.into_iter().zip(answered) {
            status[place] = s;
        }
    }
    Ok(status)
}

/// The statements of a request: `id<TAB>workload` lines.
fn request_rows(ids: &[u64], workloads: &[String]) -> String {
    ids.iter()
        .zip(workloads)
        .map(|(id, w)| format!("{id}\t{w}\n"))
        .collect()
}

/// Kills or moves statements of this node (see [`act`]).
async fn local(
    shared: &Shared,
    what: &str,
    how: &str,
    ids: &[u64],
    from: &[String],
) -> Vec<String> {
    if what == "kill" {
        let (mode, by) = how.split_once('\n').unwrap_or((how, ""));
        kill_here(shared, by, ids, mode).await
    } else {
        move_here(shared, ids, from, how)
    }
}

/// This node's answer to another node's `kill` or `move` request (see [`act`]): one status
/// line per statement.
pub async fn answer(shared: &Shared, what: &str, body: &str) -> Result<String> {
    // kill: MODE, BY, then rows; move: WORKLOAD, then rows.
    let header_lines = if what == "kill" { 2 } else { 1 };
    let mut lines = body.lines();
    let how: Vec<&str> = lines.by_ref().take(header_lines).collect();
    let (mut ids, mut from) = (Vec::new(), Vec::new());
    for line in lines {
        let (id, workload) = line.split_once('\t').unwrap_or((line, ""));
        ids.push(
            id.parse::<u64>()
                .map_err(|_| Error::bad_arguments(format!("not a query id: {id}")))?,
        );
        from.push(workload.to_string());
    }
    let statuses = local(shared, what, &how.join("\n"), &ids, &from).await;
    Ok(statuses.join("\n"))
}

/// `pg_cancel_backend(pid)` / `pg_terminate_backend(pid)`: stops the statement connection
/// `pid` runs, as Postgres does, and with terminate closes the connection; `true` when there
/// was one.
pub fn signal_backend(shared: &Shared, by: &str, pid: i32, terminate: bool) -> Result<RecordBatch> {
    let mine: Vec<_> = shared
        .registry
        .all()
        .into_iter()
        .filter(|p| p.pid == Some(pid))
        .collect();
    if !shared.logins.is_admin(by) {
        if let Some(p) = mine.iter().find(|p| *p.user != *by) {
            return Err(Error::new(
                ErrorCode::AccessDenied,
                format!(
                    "{by}: Not enough privileges. Backend {pid} belongs to user '{}'; only admins signal other users' backends",
                    p.user
                ),
            ));
        }
    }
    let error = if terminate {
        Error::new(
            ErrorCode::Aborted,
            "terminating the statement due to administrator command (pg_terminate_backend)",
        )
    } else {
        Error::new(
            ErrorCode::QueryWasCancelled,
            "canceling statement due to user request (pg_cancel_backend)",
        )
    };
    let mut any = false;
    for p in &mine {
        any |= shared.registry.kill(p.query_id, error.clone());
    }
    if terminate {
        // Then the connection closes, idle or not, as in PostgreSQL.
        any |= shared.registry.terminate(pid);
    }
    RecordBatch::try_new(
        signal_schema(terminate),
        vec![Arc::new(
            sluice_engine::datafusion::arrow::array::BooleanArray::from(vec![any]),
        )],
    )
    .map_err(|e| Error::new(ErrorCode::InternalError, e.to_string()))
}

/// The columns `KILL QUERY` (`kill_status`) and `MOVE QUERY` (`move_status`) answer with.
pub fn status_schema(status_name: &str) -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new(status_name, DataType::Utf8, false),
        Field::new("query_id", DataType::UInt64, false),
        Field::new("user", DataType::Utf8, false),
        Field::new("query", DataType::Utf8, false),
    ]))
}

/// The column `pg_cancel_backend` / `pg_terminate_backend` answer with.
pub fn signal_schema(terminate: bool) -> Arc<Schema> {
    let name = if terminate {
        "pg_terminate_backend"
    } else {
        "pg_cancel_backend"
    };
    Arc::new(Schema::new(vec![Field::new(
        name,
        DataType::Boolean,
        false,
    )]))
}

fn rows(status_name: &str, status: Vec<String>, matched: &[Matched]) -> Result<RecordBatch> {
    let schema = status_schema(status_name);
    let columns: Vec<Arc<dyn Array>> = vec![
        Arc::new(StringArray::from(status)),
        Arc::new(UInt64Array::from_iter_values(
            matched.iter().map(|m| m.query_id),
        )),
        Arc::new(StringArray::from_iter_values(
            matched.iter().map(|m| m.user.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            matched.iter().map(|m| m.query.as_str()),
        )),
    ];
    RecordBatch::try_new(schema, columns)
        .map_err(|e| Error::new(ErrorCode::InternalError, e.to_string()))
}

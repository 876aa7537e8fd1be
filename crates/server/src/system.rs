//! `system.workloads`, `system.resources`, `system.scheduler`, `system.processes`,
//! `system.fingerprints` (learned lanes), `system.query_log`, `system.classifiers`,
//! `system.workload_shares` and `system.nodes` (the fleet's members): built from
//! the current snapshot and registered as tables of the engine, so any SQL works on them.
//! They are rebuilt when a statement mentions `system.`, so they are always current.

use std::sync::Arc;

use sluice_catalog::resource_disks;
use sluice_engine::datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, ListBuilder, StringArray,
    StringBuilder, TimestampMicrosecondArray, UInt64Array, UInt8Array,
};
use sluice_engine::datafusion::arrow::datatypes::{Field, Schema};
use sluice_engine::datafusion::arrow::record_batch::RecordBatch;
use sluice_sched::NodeState;
use sluice_sql::{Error, ErrorCode, Result};

use crate::state::Shared;

fn batch(columns: Vec<(&str, ArrayRef)>) -> Result<RecordBatch> {
    let schema = Schema::new(
        columns
            .iter()
            .map(|(name, a)| Field::new(*name, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(
        Arc::new(schema),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .map_err(|e| Error::new(ErrorCode::InternalError, e.to_string()))
}

fn strings<S: AsRef<str>, I: IntoIterator<Item = Option<S>>>(values: I) -> ArrayRef {
    Arc::new(StringArray::from_iter(values))
}

fn string_lists<S: AsRef<str>>(values: Vec<Vec<S>>) -> ArrayRef {
    let mut builder = ListBuilder::new(StringBuilder::new());
    for list in values {
        for v in list {
            builder.values().append_value(v.as_ref());
        }
        builder.append(true);
    }
    Arc::new(builder.finish())
}

/// Rebuilds every system table from the current state.
pub fn refresh(shared: &Shared) -> Result<()> {
    tables(shared, &mut |name, b| {
        shared.engine.publish_table("system", name, b)
    })
}

/// Every system table as of now, each handed to `set` by name (the engine publishes them;
/// the live page sends them to browsers).
pub fn tables(shared: &Shared, set: &mut dyn FnMut(&str, RecordBatch) -> Result<()>) -> Result<()> {
    let snapshot = shared.snapshot();
    let catalog = &snapshot.catalog;

    let workloads: Vec<_> = catalog.workloads().collect();
    set(
        "workloads",
        batch(vec![
            (
                "name",
                strings(workloads.iter().map(|w| Some(w.name.clone()))),
            ),
            (
                "parent",
                strings(
                    workloads
                        .iter()
                        .map(|w| Some(w.parent.clone().unwrap_or_default())),
                ),
            ),
            (
                "create_query",
                strings(workloads.iter().map(|w| Some(w.to_string()))),
            ),
        ])?,
    )?;

    let resources: Vec<_> = catalog.resources().collect();
    set(
        "resources",
        batch(vec![
            (
                "name",
                strings(resources.iter().map(|r| Some(r.name.clone()))),
            ),
            (
                "read_disks",
                string_lists(resources.iter().map(|r| resource_disks(r, true)).collect()),
            ),
            (
                "write_disks",
                string_lists(resources.iter().map(|r| resource_disks(r, false)).collect()),
            ),
            (
                "unit",
                strings(resources.iter().map(|r| Some(r.unit().name().to_string()))),
            ),
            (
                "create_query",
                strings(resources.iter().map(|r| Some(r.to_string()))),
            ),
        ])?,
    )?;

    // One row per node; live counters where a scheduler runs the tree.
    let rows = snapshot.trees.rows();
    // Each scheduler's live state, read once (not once per row).
    let states: std::collections::HashMap<&str, std::collections::HashMap<String, NodeState>> =
        snapshot
            .schedulers
            .iter()
            .map(|(resource, s)| {
                (
                    resource.as_str(),
                    s.nodes().into_iter().map(|n| (n.path.clone(), n)).collect(),
                )
            })
            .collect();
    let live: Vec<Option<&NodeState>> = rows
        .iter()
        .map(|row| {
            states
                .get(row.resource)
                .and_then(|nodes| nodes.get(&row.path))
        })
        .collect();
    // The memory trees' live state (space-shared nodes have their own columns).
    let space_states: std::collections::HashMap<
        &str,
        std::collections::HashMap<String, sluice_sched::SpaceNodeState>,
    > = snapshot
        .memory
        .iter()
        .map(|(resource, s)| {
            (
                resource.as_str(),
                s.nodes().into_iter().map(|n| (n.path.clone(), n)).collect(),
            )
        })
        .collect();
    let space: Vec<Option<&sluice_sched::SpaceNodeState>> = rows
        .iter()
        .map(|row| {
            space_states
                .get(row.resource)
                .and_then(|nodes| nodes.get(&row.path))
        })
        .collect();
    let space_u64s = |f: &dyn Fn(&sluice_sched::SpaceNodeState) -> Option<u64>| -> ArrayRef {
        Arc::new(UInt64Array::from_iter(space.iter().map(|n| n.and_then(f))))
    };
    let u64s = |f: &dyn Fn(&NodeState) -> Option<u64>| -> ArrayRef {
        Arc::new(UInt64Array::from_iter(live.iter().map(|n| n.and_then(f))))
    };
    let u8s = |f: &dyn Fn(&NodeState) -> Option<bool>| -> ArrayRef {
        Arc::new(UInt8Array::from_iter(
            live.iter().map(|n| n.and_then(f).map(u8::from)),
        ))
    };
    let i64s = |f: &dyn Fn(&NodeState) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from_iter(live.iter().map(|n| n.and_then(f))))
    };
    let f64s = |f: &dyn Fn(&NodeState) -> Option<f64>| -> ArrayRef {
        Arc::new(Float64Array::from_iter(live.iter().map(|n| n.and_then(f))))
    };
    set(
        "scheduler",
        batch(vec![
            (
                "resource",
                strings(rows.iter().map(|r| Some(r.resource.to_string()))),
            ),
            ("path", strings(rows.iter().map(|r| Some(r.path.clone())))),
            (
                "type",
                strings(
                    rows.iter()
                        .map(|r| Some(r.node.kind.type_name().to_string())),
                ),
            ),
            (
                "weight",
                Arc::new(Float64Array::from_iter_values(
                    rows.iter().map(|r| r.node.weight),
                )),
            ),
            (
                "priority",
                Arc::new(Int64Array::from_iter_values(
                    rows.iter().map(|r| r.node.priority),
                )),
            ),
            (
                "precedence",
                Arc::new(Int64Array::from_iter_values(
                    rows.iter().map(|r| r.node.precedence),
                )),
            ),
            ("is_active", u8s(&|n| Some(n.is_active))),
            ("active_children", u64s(&|n| Some(n.active_children))),
            (
                "dequeued_requests",
                u64s(&|n| Some(n.stats.dequeued_requests)),
            ),
            (
                "canceled_requests",
                u64s(&|n| Some(n.stats.canceled_requests)),
            ),
            (
                "rejected_requests",
                u64s(&|n| Some(n.stats.rejected_requests)),
            ),
            ("dequeued_cost", i64s(&|n| Some(n.stats.dequeued_cost))),
            ("canceled_cost", i64s(&|n| Some(n.stats.canceled_cost))),
            ("rejected_cost", i64s(&|n| Some(n.stats.rejected_cost))),
            ("busy_periods", u64s(&|n| Some(n.stats.busy_periods))),
            ("throughput", f64s(&|n| Some(n.throughput))),
            ("vruntime", f64s(&|n| n.vruntime)),
            ("system_vruntime", f64s(&|n| n.system_vruntime)),
            (
                "queue_length",
                Arc::new(UInt64Array::from_iter(live.iter().zip(&space).map(
                    |(n, m)| n.and_then(|n| n.queue_length).or(m.and_then(|m| m.pending)),
                ))) as ArrayRef,
            ),
            ("queue_cost", i64s(&|n| n.queue_cost)),
            ("budget", i64s(&|n| n.budget)),
            ("is_satisfied", u8s(&|n| n.is_satisfied)),
            ("inflight_requests", i64s(&|n| n.inflight_requests)),
            ("inflight_cost", i64s(&|n| n.inflight_cost)),
            (
                "max_requests",
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.max_requests()))),
            ),
            (
                "max_cost",
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.max_cost()))),
            ),
            (
                "max_speed",
                Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.max_speed()))),
            ),
            (
                "max_burst",
                Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.max_burst()))),
            ),
            (
                "throttling_us",
                i64s(&|n| n.tokens.map(|_| n.stats.throttling.as_micros() as i64)),
            ),
            ("tokens", f64s(&|n| n.tokens)),
            (
                "allocated",
                Arc::new(Int64Array::from_iter(
                    space.iter().map(|n| n.map(|n| n.allocated)),
                )),
            ),
            ("allocations", space_u64s(&|n| Some(n.allocations))),
            (
                "updates",
                space_u64s(&|n| Some(n.stats.increases + n.stats.decreases)),
            ),
            ("increases", space_u64s(&|n| Some(n.stats.increases))),
            ("decreases", space_u64s(&|n| Some(n.stats.decreases))),
            ("admits", space_u64s(&|n| Some(n.stats.admits))),
            ("removes", space_u64s(&|n| Some(n.stats.removes))),
            ("killers", space_u64s(&|n| Some(n.stats.killers))),
            ("victims", space_u64s(&|n| Some(n.stats.victims))),
            (
                "rejects",
                space_u64s(&|n| n.pending.map(|_| n.stats.rejects)),
            ),
            ("pending", space_u64s(&|n| n.pending)),
            // sluice's, after ClickHouse's columns: the node (a fleet's views gather every
            // node's rows).
            (
                "node",
                strings(rows.iter().map(|_| Some(shared.node_name()))),
            ),
        ])?,
    )?;

    let processes = shared.registry.all();
    let demotions: Vec<Option<(String, std::time::SystemTime)>> = processes
        .iter()
        .map(|p| {
            p.grant
                .as_ref()
                .and_then(|g| g.lock().unwrap_or_else(|p| p.into_inner()).demoted.clone())
        })
        .collect();
    // What each running statement holds: its CPU slots and the bytes its memory counts.
    let cpu_resources = [&snapshot.roles.master, &snapshot.roles.worker];
    let holdings: Vec<(Option<u64>, Option<i64>)> = processes
        .iter()
        .map(|p| match &p.grant {
            None => (None, None),
            Some(g) => {
                let g = g.lock().unwrap_or_else(|p| p.into_inner());
                let threads = g
                    .attachments
                    .iter()
                    .filter(|a| {
                        cpu_resources
                            .iter()
                            .any(|r| r.as_deref() == Some(&*a.resource))
                    })
                    .count() as u64;
                (
                    Some(threads),
                    Some(g.memory.as_ref().map_or(0, |m| m.used())),
                )
            }
        })
        .collect();
    // The fleet's members (`[cluster]`), as this node's watch of etcd has them; empty for a
    // node that runs alone.
    let nodes = shared.fleet.get().map(|f| f.nodes()).unwrap_or_default();
    let view = shared
        .fleet_view
        .get()
        .map(|v| v.borrow().clone())
        .unwrap_or_default();
    set(
        "nodes",
        batch(vec![
            ("name", strings(nodes.iter().map(|n| Some(n.name.as_str())))),
            (
                "address",
                strings(nodes.iter().map(|n| Some(n.address.as_str()))),
            ),
            (
                "lease",
                Arc::new(Int64Array::from_iter(nodes.iter().map(|n| Some(n.lease)))),
            ),
            (
                "joined",
                timestamps(nodes.iter().map(|n| {
                    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(n.joined))
                })),
            ),
            (
                "is_local",
                Arc::new(BooleanArray::from_iter(nodes.iter().map(|n| Some(n.this)))),
            ),
            // What each holds: its shares of the fleet's limits, and the demand it published.
            (
                "shares",
                string_lists(
                    nodes
                        .iter()
                        .map(|n| {
                            view.shares
                                .iter()
                                .filter_map(|(key, by)| {
                                    Some(crate::fleet_demand::share_shown(key, *by.get(&n.name)?))
                                })
                                .collect::<Vec<_>>()
                        })
                        .collect(),
                ),
            ),
            (
                "demand",
                string_lists(
                    nodes
                        .iter()
                        .map(|n| {
                            view.demand
                                .get(&n.name)
                                .map(|text| crate::fleet_demand::demand_shown(text))
                                .unwrap_or_default()
                        })
                        .collect(),
                ),
            ),
        ])?,
    )?;

    set(
        "processes",
        batch(vec![
            (
                "query_id",
                Arc::new(UInt64Array::from_iter_values(
                    processes.iter().map(|p| p.query_id),
                )),
            ),
            (
                "user",
                strings(processes.iter().map(|p| Some(p.user.clone()))),
            ),
            (
                "workload",
                strings(processes.iter().map(|p| Some(p.workload.clone()))),
            ),
            (
                "state",
                strings(
                    processes
                        .iter()
                        .map(|p| Some(if p.running { "running" } else { "waiting" }.to_string())),
                ),
            ),
            (
                "waiting_for",
                strings(processes.iter().map(|p| p.waiting_for.clone())),
            ),
            (
                "elapsed_ms",
                Arc::new(UInt64Array::from_iter_values(
                    processes
                        .iter()
                        .map(|p| p.started.elapsed().as_millis() as u64),
                )),
            ),
            (
                "query",
                strings(processes.iter().map(|p| Some(p.query.clone()))),
            ),
            (
                "pid",
                Arc::new(Int32Array::from_iter(processes.iter().map(|p| p.pid))),
            ),
            (
                "threads",
                Arc::new(UInt64Array::from_iter(holdings.iter().map(|h| h.0))),
            ),
            (
                "memory_usage",
                Arc::new(Int64Array::from_iter(holdings.iter().map(|h| h.1))),
            ),
            (
                "demoted_from",
                strings(
                    demotions
                        .iter()
                        .map(|d| d.as_ref().map(|(from, _)| from.clone())),
                ),
            ),
            (
                "demoted_at",
                timestamps(demotions.iter().map(|d| d.as_ref().map(|(_, at)| *at))),
            ),
            (
                "classifier",
                strings(
                    processes
                        .iter()
                        .map(|p| p.classified.as_ref().map(|c| c.rule.name.clone())),
                ),
            ),
            // The node it runs on (a fleet's views gather every node's rows).
            (
                "node",
                strings(processes.iter().map(|_| Some(shared.node_name()))),
            ),
        ])?,
    )?;

    let fingerprints = shared.lanes.entries();
    set(
        "fingerprints",
        batch(vec![
            (
                "fingerprint",
                strings(fingerprints.iter().map(|(id, _)| Some(id.clone()))),
            ),
            (
                "sample_query",
                strings(
                    fingerprints
                        .iter()
                        .map(|(_, e)| Some(e.sample_query.clone())),
                ),
            ),
            (
                "runs",
                Arc::new(UInt64Array::from_iter_values(
                    fingerprints.iter().map(|(_, e)| e.runs),
                )),
            ),
            (
                "demotions",
                Arc::new(UInt64Array::from_iter_values(
                    fingerprints.iter().map(|(_, e)| e.demotions),
                )),
            ),
            (
                "last_ms",
                Arc::new(UInt64Array::from_iter_values(
                    fingerprints.iter().map(|(_, e)| e.last_ms),
                )),
            ),
            (
                "p50_ms",
                Arc::new(UInt64Array::from_iter(
                    fingerprints.iter().map(|(_, e)| e.quantile_ms(0.5)),
                )),
            ),
            (
                "p90_ms",
                Arc::new(UInt64Array::from_iter(
                    fingerprints.iter().map(|(_, e)| e.quantile_ms(0.9)),
                )),
            ),
            (
                "lane",
                strings(fingerprints.iter().map(|(_, e)| e.lane.clone())),
            ),
            (
                "pinned",
                Arc::new(BooleanArray::from_iter(
                    fingerprints.iter().map(|(_, e)| Some(e.pinned)),
                )),
            ),
        ])?,
    )?;

    // Rules in the order they are tried; `matches` counts would-be matches of dry-run rules.
    let rules: Vec<_> = catalog.rules().iter().collect();
    set(
        "classifiers",
        batch(vec![
            ("name", strings(rules.iter().map(|r| Some(r.name.clone())))),
            (
                "workload",
                strings(rules.iter().map(|r| Some(r.workload.clone()))),
            ),
            (
                "rank",
                Arc::new(Int64Array::from_iter_values(rules.iter().map(|r| r.rank))),
            ),
            (
                "dry_run",
                Arc::new(BooleanArray::from_iter(
                    rules.iter().map(|r| Some(r.dry_run)),
                )),
            ),
            (
                "predicate",
                strings(rules.iter().map(|r| Some(r.predicate.clone()))),
            ),
            (
                "matches",
                Arc::new(UInt64Array::from_iter_values(
                    rules.iter().map(|r| r.stats.matches()),
                )),
            ),
            (
                "last_match",
                timestamps(rules.iter().map(|r| r.stats.last_match())),
            ),
            (
                "create_query",
                strings(
                    rules
                        .iter()
                        .map(|r| catalog.classifier(&r.name).map(|c| c.entity.create_query())),
                ),
            ),
        ])?,
    )?;

    // What the settings promise each workload (sluice's own table: see sluice_sched::shares).
    let shares = sluice_sched::shares(catalog, shared.options.machine)?;
    set(
        "workload_shares",
        batch(vec![
            (
                "workload",
                strings(shares.iter().map(|r| Some(r.workload.clone()))),
            ),
            (
                "resource",
                strings(shares.iter().map(|r| Some(r.resource.clone()))),
            ),
            (
                "guaranteed_share",
                Arc::new(Float64Array::from_iter_values(
                    shares.iter().map(|r| r.guaranteed_share),
                )),
            ),
            (
                "guaranteed_by",
                strings(shares.iter().map(|r| Some(r.guaranteed_by.clone()))),
            ),
            (
                "guaranteed_share_outranked",
                Arc::new(Float64Array::from_iter_values(
                    shares.iter().map(|r| r.guaranteed_share_outranked),
                )),
            ),
            (
                "max_share",
                Arc::new(Float64Array::from_iter_values(
                    shares.iter().map(|r| r.max_share),
                )),
            ),
            (
                "max_share_by",
                strings(shares.iter().map(|r| Some(r.max_share_by.clone()))),
            ),
        ])?,
    )?;

    let log = shared.query_log.rows();
    set(
        "query_log",
        batch(vec![
            (
                "query_id",
                Arc::new(UInt64Array::from_iter_values(
                    log.iter().map(|r| r.query_id),
                )),
            ),
            ("user", strings(log.iter().map(|r| Some(r.user.clone())))),
            (
                "workload",
                strings(log.iter().map(|r| Some(r.workload.clone()))),
            ),
            (
                "initial_workload",
                strings(log.iter().map(|r| Some(r.initial_workload.clone()))),
            ),
            (
                "classifier",
                strings(log.iter().map(|r| r.classifier.clone())),
            ),
            (
                "fingerprint",
                strings(log.iter().map(|r| Some(r.fingerprint.as_str()))),
            ),
            ("arrived", timestamps(log.iter().map(|r| Some(r.arrived)))),
            ("admitted", timestamps(log.iter().map(|r| r.admitted))),
            (
                "queued_ms",
                Arc::new(UInt64Array::from_iter_values(
                    log.iter().map(|r| r.queued_ms),
                )),
            ),
            (
                "run_ms",
                Arc::new(UInt64Array::from_iter_values(log.iter().map(|r| r.run_ms))),
            ),
            (
                "outcome",
                strings(log.iter().map(|r| {
                    Some(if r.demoted && r.outcome == crate::query_log::Outcome::Ok {
                        "demoted".to_string()
                    } else {
                        r.outcome.name().to_string()
                    })
                })),
            ),
            (
                "demoted",
                Arc::new(BooleanArray::from_iter(log.iter().map(|r| Some(r.demoted)))),
            ),
            (
                "rows",
                Arc::new(UInt64Array::from_iter_values(log.iter().map(|r| r.rows))),
            ),
            ("query", strings(log.iter().map(|r| Some(r.query.clone())))),
        ])?,
    )?;
    Ok(())
}

/// Wall-clock times as `timestamp` (UTC, microseconds).
fn timestamps<I: IntoIterator<Item = Option<std::time::SystemTime>>>(values: I) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from_iter(
        values.into_iter().map(|t| {
            t.map(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as i64)
            })
        }),
    ))
}

//! Shares you can read: for every workload and resource, the fraction of the root's capacity
//! it is guaranteed and the most it may take, derived from the settings the way ClickHouse's
//! documentation derives them by hand, with the settings each figure comes from
//! (`system.workload_shares`).
//!
//! - **Guaranteed share** (`guaranteed_share`): down the path from the root, a workload's part
//!   among the siblings of its priority (precedence, for memory) is its weight over theirs; the
//!   product of those parts is what it is guaranteed when it has work, *while the siblings of
//!   higher priority on its path are idle* — ClickHouse's docs: "When the admin does not run
//!   queries … at least 80% goes to production", and analytics is guaranteed 0.8 × 0.75 = 60%.
//! - **While outranked** (`guaranteed_share_outranked`): the floor when every workload has work.
//!   Strict priority gives an outranked workload nothing; sluice's `outranked_share` gives its
//!   priority group that fraction of the parent's dequeues, taken from the top group.
//! - **Max share** (`max_share`): the smallest cap on the path, each cap as a fraction of the
//!   root's capacity: `max_cpu_share`, `max_cpus` / cores, thread, query, request and memory
//!   limits over the root's own (a limit under a root without one caps nothing that a share can
//!   say, and is listed only in `max_share_by`).
//!
//! These are the settings' promises, derived without running anything; what a workload really
//! got is in `system.scheduler`'s counters.

use sluice_catalog::{Catalog, WorkloadSettings, UNLIMITED};
use sluice_sql::{format_float, CostUnit, CreateResource, CreateWorkload, Result};

use crate::tree::Machine;

/// One row of `system.workload_shares`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareRow {
    pub workload: String,
    pub resource: String,
    pub guaranteed_share: f64,
    /// Where the guarantee comes from: each level's weight among its peers.
    pub guaranteed_by: String,
    pub guaranteed_share_outranked: f64,
    pub max_share: f64,
    /// The cap that decides `max_share` (empty: none), then caps that are not shares.
    pub max_share_by: String,
}

/// The shares of every workload for every resource, by resource then workload name.
pub fn shares(catalog: &Catalog, machine: Machine) -> Result<Vec<ShareRow>> {
    let mut rows = Vec::new();
    let Some(root) = catalog.root() else {
        return Ok(rows);
    };
    for resource in catalog.resources() {
        let settings = WorkloadSettings::resolve(&root.settings, Some(&resource.name))?;
        let capacity = Capacity::of_root(resource.unit(), &settings, machine);
        let mut walk = Walk {
            catalog,
            resource,
            machine,
            capacity,
            rows: Vec::new(),
        };
        walk.visit(
            root,
            Level {
                guaranteed: 1.0,
                guaranteed_by: Vec::new(),
                outranked: 1.0,
                max: 1.0,
                max_by: String::new(),
                notes: Vec::new(),
            },
        )?;
        walk.rows.sort_by(|a, b| a.workload.cmp(&b.workload));
        rows.extend(walk.rows);
    }
    Ok(rows)
}

/// What one workload has from its path.
#[derive(Debug, Clone)]
struct Level {
    guaranteed: f64,
    guaranteed_by: Vec<String>,
    outranked: f64,
    max: f64,
    max_by: String,
    /// Caps that are not shares of anything (a limit under a root without one).
    notes: Vec<String>,
}

/// The root's capacity in the resource's units, per kind of limit (`None`: unlimited).
#[derive(Debug, Clone, Copy)]
struct Capacity {
    unit: CostUnit,
    threads: Option<f64>,
    queries: Option<f64>,
    queries_per_second: Option<f64>,
    io_requests: Option<f64>,
    bytes_per_second: Option<f64>,
    memory: Option<f64>,
}

fn finite(limit: i64) -> Option<f64> {
    (limit != UNLIMITED).then_some(limit as f64)
}

fn rate(v: f64) -> Option<f64> {
    (v > 0.0).then_some(v)
}

/// `max_concurrent_threads` with `max_concurrent_threads_ratio_to_cores`: the smaller applies
/// (a ratio that floors to 0 is no limit, as in ClickHouse).
fn threads(s: &WorkloadSettings, machine: Machine) -> Option<f64> {
    let ratio = (s.max_concurrent_threads_ratio_to_cores * machine.cores as f64).floor();
    let by_ratio = (ratio >= 1.0).then_some(ratio);
    match (finite(s.max_concurrent_threads), by_ratio) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn memory(s: &WorkloadSettings, machine: Machine) -> Option<f64> {
    let ratio = (s.max_memory_ratio * machine.memory as f64).floor();
    let by_ratio = (ratio >= 1.0).then_some(ratio);
    match (finite(s.max_memory), by_ratio) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Capacity {
    fn of_root(unit: CostUnit, s: &WorkloadSettings, machine: Machine) -> Capacity {
        Capacity {
            unit,
            threads: threads(s, machine),
            queries: finite(s.max_concurrent_queries),
            queries_per_second: rate(s.max_queries_per_second),
            io_requests: finite(s.max_io_requests),
            bytes_per_second: rate(s.max_bytes_per_second),
            // Memory is always finite: the machine's when the root sets no limit.
            memory: Some(memory(s, machine).unwrap_or(machine.memory as f64)),
        }
    }
}

struct Walk<'a> {
    catalog: &'a Catalog,
    resource: &'a CreateResource,
    machine: Machine,
    capacity: Capacity,
    rows: Vec<ShareRow>,
}

impl Walk<'_> {
    fn settings(&self, w: &CreateWorkload) -> Result<WorkloadSettings> {
        WorkloadSettings::resolve(&w.settings, Some(&self.resource.name))
    }

    /// `w`'s own caps as fractions of the root's capacity, each with the setting it is; and
    /// the caps that are no share of anything.
    fn caps(&self, w: &CreateWorkload, s: &WorkloadSettings) -> (Vec<(f64, String)>, Vec<String>) {
        let mut shares = Vec::new();
        let mut notes = Vec::new();
        let name = &w.name;
        let mut cap = |value: Option<f64>, of: Option<f64>, what: String| match (value, of) {
            (Some(v), Some(total)) => {
                shares.push(((v / total).min(1.0), format!("{what} at {name}")))
            }
            (Some(_), None) => notes.push(format!(
                "{what} at {name} (the root sets no such limit to take a share of)"
            )),
            _ => {}
        };
        let c = self.capacity;
        match c.unit {
            CostUnit::CpuNanosecond => {
                cap(
                    threads(s, self.machine),
                    c.threads,
                    if s.max_concurrent_threads != UNLIMITED {
                        format!("max_concurrent_threads = {}", s.max_concurrent_threads)
                    } else {
                        format!(
                            "max_concurrent_threads_ratio_to_cores = {}",
                            format_float(s.max_concurrent_threads_ratio_to_cores)
                        )
                    },
                );
                if s.max_cpu_share > 0.0 {
                    shares.push((
                        s.max_cpu_share.min(1.0),
                        format!(
                            "max_cpu_share = {} at {name}",
                            format_float(s.max_cpu_share)
                        ),
                    ));
                }
                if s.max_cpus > 0.0 {
                    shares.push((
                        (s.max_cpus / self.machine.cores as f64).min(1.0),
                        format!(
                            "max_cpus = {} of {} cores at {name}",
                            format_float(s.max_cpus),
                            self.machine.cores
                        ),
                    ));
                }
            }
            CostUnit::QuerySlot => {
                cap(
                    finite(s.max_concurrent_queries),
                    c.queries,
                    format!("max_concurrent_queries = {}", s.max_concurrent_queries),
                );
                cap(
                    rate(s.max_queries_per_second),
                    c.queries_per_second,
                    format!(
                        "max_queries_per_second = {}",
                        format_float(s.max_queries_per_second)
                    ),
                );
            }
            CostUnit::IoByte => {
                cap(
                    finite(s.max_io_requests),
                    c.io_requests,
                    format!("max_io_requests = {}", s.max_io_requests),
                );
                cap(
                    rate(s.max_bytes_per_second),
                    c.bytes_per_second,
                    format!(
                        "max_bytes_per_second = {}",
                        format_float(s.max_bytes_per_second)
                    ),
                );
            }
            CostUnit::MemoryByte => cap(
                memory(s, self.machine),
                c.memory,
                if s.max_memory != UNLIMITED {
                    format!("max_memory = {}", s.max_memory)
                } else {
                    format!("max_memory_ratio = {}", format_float(s.max_memory_ratio))
                },
            ),
        }
        (shares, notes)
    }

    fn visit(&mut self, w: &CreateWorkload, mut level: Level) -> Result<()> {
        let s = self.settings(w)?;
        let (caps, notes) = self.caps(w, &s);
        for (share, by) in caps {
            if share < level.max {
                level.max = share;
                level.max_by = by;
            }
        }
        level.notes.extend(notes);
        let mut max_share_by = level.max_by.clone();
        for note in &level.notes {
            if !max_share_by.is_empty() {
                max_share_by.push_str("; ");
            }
            max_share_by.push_str(note);
        }
        self.rows.push(ShareRow {
            workload: w.name.clone(),
            resource: self.resource.name.clone(),
            guaranteed_share: level.guaranteed,
            guaranteed_by: if level.guaranteed_by.is_empty() {
                "nothing shares it".to_string()
            } else {
                level.guaranteed_by.join(" × ")
            },
            guaranteed_share_outranked: level.outranked,
            max_share: level.max,
            max_share_by,
        });

        let children: Vec<&CreateWorkload> = self.catalog.children_of(&w.name).collect();
        if children.is_empty() {
            return Ok(());
        }
        let space = self.resource.unit().is_space_shared();
        let mut settings = Vec::with_capacity(children.len());
        for c in &children {
            settings.push(self.settings(c)?);
        }
        let key = |s: &WorkloadSettings| if space { s.precedence } else { s.priority };
        let top = settings.iter().map(key).min().unwrap_or(0);
        // Each priority group's outranked share: the sum of its members', at most 1 (memory
        // has no outranked share: precedence is strict).
        let group_share = |k: i64| -> f64 {
            if space {
                return 0.0;
            }
            settings
                .iter()
                .filter(|s| key(s) == k)
                .map(|s| s.outranked_share)
                .sum::<f64>()
                .min(1.0)
        };
        let mut lower: Vec<i64> = settings.iter().map(key).filter(|k| *k != top).collect();
        lower.sort_unstable();
        lower.dedup();
        let taken_by_lower: f64 = lower.iter().map(|k| group_share(*k)).sum::<f64>().min(1.0);
        for (child, s) in children.iter().zip(&settings) {
            let k = key(s);
            let peers: f64 = settings
                .iter()
                .filter(|p| key(p) == k)
                .map(|p| p.weight)
                .sum();
            let part = s.weight / peers;
            let outranked_part = if k == top {
                part * (1.0 - taken_by_lower)
            } else {
                part * group_share(k)
            };
            let mut by = level.guaranteed_by.clone();
            if k != top {
                let higher: Vec<&str> = children
                    .iter()
                    .zip(&settings)
                    .filter(|(_, p)| key(p) < k)
                    .map(|(c, _)| c.name.as_str())
                    .collect();
                by.push(format!("while {} idle", higher.join(", ")));
            }
            if peers != s.weight {
                by.push(format!(
                    "weight {} of {} at {}",
                    format_float(s.weight),
                    format_float(peers),
                    w.name
                ));
            }
            self.visit(
                child,
                Level {
                    guaranteed: level.guaranteed * part,
                    guaranteed_by: by,
                    outranked: level.outranked * outranked_part,
                    max: level.max,
                    max_by: level.max_by.clone(),
                    notes: level.notes.clone(),
                },
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(sql: &str) -> Catalog {
        let mut c = Catalog::new();
        for item in sluice_sql::parse_script(sql) {
            c.apply_mut(&item.result.expect("parses")).expect("applies");
        }
        c
    }

    const MACHINE: Machine = Machine {
        cores: 8,
        memory: 1 << 36,
    };

    fn table(sql: &str) -> Vec<String> {
        shares(&catalog(sql), MACHINE)
            .expect("shares")
            .into_iter()
            .map(|r| {
                format!(
                    "{} {} {} [{}] {} {} [{}]",
                    r.resource,
                    r.workload,
                    format_float((r.guaranteed_share * 1e6).round() / 1e6),
                    r.guaranteed_by,
                    format_float((r.guaranteed_share_outranked * 1e6).round() / 1e6),
                    format_float((r.max_share * 1e6).round() / 1e6),
                    r.max_share_by
                )
            })
            .collect()
    }

    /// ClickHouse's documentation, "Threads vs. CPUs": "analytics has a guarantee of at least
    /// 0.8 * 0.75 = 60%, and based on max_cpu_share, it has a limit of 70% of total CPU
    /// resources. While ingestion is left with a guarantee of at least 0.8 * 0.25 = 20%".
    #[test]
    fn the_documentations_cpu_example() {
        let rows = table(
            "CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);
             CREATE WORKLOAD all SETTINGS max_concurrent_threads_ratio_to_cores = 2;
             CREATE WORKLOAD admin IN all SETTINGS max_concurrent_threads = 2, priority = -1;
             CREATE WORKLOAD production IN all SETTINGS weight = 4;
             CREATE WORKLOAD analytics IN production SETTINGS max_cpu_share = 0.7, weight = 3;
             CREATE WORKLOAD ingestion IN production;
             CREATE WORKLOAD development IN all SETTINGS max_cpu_share = 0.3",
        );
        assert_eq!(
            rows,
            [
                "cpu admin 1 [nothing shares it] 1 0.125 [max_concurrent_threads = 2 at admin]",
                "cpu all 1 [nothing shares it] 1 1 []",
                "cpu analytics 0.6 [while admin idle × weight 4 of 5 at all × weight 3 of 4 at production] 0 0.7 [max_cpu_share = 0.7 at analytics]",
                "cpu development 0.2 [while admin idle × weight 1 of 5 at all] 0 0.3 [max_cpu_share = 0.3 at development]",
                "cpu ingestion 0.2 [while admin idle × weight 4 of 5 at all × weight 1 of 4 at production] 0 1 []",
                "cpu production 0.8 [while admin idle × weight 4 of 5 at all] 0 1 []",
            ]
        );
    }

    #[test]
    fn the_documentations_query_and_memory_examples() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../grammar/examples");
        let read = |name: &str| std::fs::read_to_string(root.join(name)).expect("example");
        assert_eq!(
            table(&read("docs_query_slots.sql")),
            [
                "query all 1 [nothing shares it] 1 1 []",
                "query development 0.25 [weight 1 of 4 at all] 0.25 0.05 [max_concurrent_queries = 5 at development]",
                "query production 0.75 [weight 3 of 4 at all] 0.75 1 []",
            ]
        );
        assert_eq!(
            table(&read("docs_memory.sql")),
            [
                "memory admin 0.666667 [weight 2 of 3 at all] 0.666667 1 []",
                "memory all 1 [nothing shares it] 1 1 []",
                "memory development 1 [while admin, production idle] 0 0.2 [max_memory = 2147483648 at development]",
                "memory etl 0.111111 [weight 1 of 3 at all × weight 1 of 3 at production] 0.111111 1 []",
                "memory production 0.333333 [weight 1 of 3 at all] 0.333333 1 []",
                "memory reports 0.222222 [weight 1 of 3 at all × weight 2 of 3 at production] 0.222222 1 []",
            ]
        );
    }

    /// sluice's `outranked_share`: the floor while outranked is the share, taken from the top.
    #[test]
    fn outranked_shares_are_floors_taken_from_the_top() {
        let rows = table(
            "CREATE RESOURCE q (QUERY);
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 10;
             CREATE WORKLOAD top IN all SETTINGS priority = 0;
             CREATE WORKLOAD middle IN all SETTINGS priority = 1;
             CREATE WORKLOAD bottom IN all SETTINGS priority = 2, outranked_share = 0.1, max_concurrent_queries = 2",
        );
        assert_eq!(
            rows,
            [
                "q all 1 [nothing shares it] 1 1 []",
                "q bottom 1 [while middle, top idle] 0.1 0.2 [max_concurrent_queries = 2 at bottom]",
                "q middle 1 [while top idle] 0 1 []",
                "q top 1 [nothing shares it] 0.9 1 []",
            ]
        );
    }
}

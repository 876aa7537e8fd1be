//! Compiling a catalog snapshot into one scheduling-node tree per resource, as ClickHouse's
//! `WorkloadResourceManager` builds them (reference §4.6):
//!
//! ```text
//! W                       workload; weight/priority/precedence read by W's parent
//! └─ throttler            bandwidth_limit, if the resolved settings set a rate
//!    └─ semaphore | limit inflight_limit (time-shared) / allocation_limit (memory), if limited
//!       └─ fifo | queue   when W is a leaf
//!          or prio        priority / precedence_allocation, when children differ in priority
//!             ├─ child    alone at its priority
//!             └─ p<N>_fair  fair / fair_allocation, for ≥2 children at priority N
//! ```
//! Time-shared resources group children by `priority`, memory by `precedence`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use sluice_catalog::{Catalog, Change, Entity, WorkloadSettings, UNLIMITED};
use sluice_sql::{CostUnit, CreateResource, CreateWorkload, Result};

/// What the machine offers, for the settings that are ratios of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    /// CPU cores ClickHouse would see (cgroup quota included).
    pub cores: u32,
    /// Memory in bytes ClickHouse would see (cgroup limit included).
    pub memory: u64,
}

/// The kind of a node, with the limits it enforces.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// A workload; its scheduling info is on the [`Node`].
    Workload,
    /// Leaf queue of a time-shared resource. `max_queued` from `max_waiting_queries`.
    Fifo { max_queued: i64 },
    /// Leaf queue of a space-shared resource.
    AllocationQueue { max_queued: i64 },
    /// Concurrency limit: requests and cost in flight.
    InflightLimit { max_requests: i64, max_cost: i64 },
    /// Token bucket: `max_speed` per second, up to `max_burst`.
    BandwidthLimit { max_speed: f64, max_burst: f64 },
    /// Memory limit in bytes.
    AllocationLimit { max_allocated: i64 },
    /// Strict priority among children.
    Priority,
    /// Weighted fair sharing among children of one priority.
    Fair,
    /// Precedence order among children (memory).
    PrecedenceAllocation,
    /// Weighted fair allocation among children of one precedence (memory).
    FairAllocation,
}

impl NodeKind {
    /// The `type` column of `system.scheduler`.
    pub fn type_name(&self) -> &'static str {
        match self {
            NodeKind::Workload => "workload",
            NodeKind::Fifo { .. } => "fifo",
            NodeKind::AllocationQueue { .. } => "allocation_queue",
            NodeKind::InflightLimit { .. } => "inflight_limit",
            NodeKind::BandwidthLimit { .. } => "bandwidth_limit",
            NodeKind::AllocationLimit { .. } => "allocation_limit",
            NodeKind::Priority => "priority",
            NodeKind::Fair => "fair",
            NodeKind::PrecedenceAllocation => "precedence_allocation",
            NodeKind::FairAllocation => "fair_allocation",
        }
    }
}

/// One node of a compiled tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The last component of the node's path (`all`, `semaphore`, `p1_fair`, `fifo`, …).
    pub basename: String,
    pub kind: NodeKind,
    /// Share among siblings of equal priority, read by the parent.
    pub weight: f64,
    /// Lower is served first among siblings (time-shared).
    pub priority: i64,
    /// Lower is admitted first and evicted last among siblings (memory).
    pub precedence: i64,
    /// sluice's `outranked_share`: the fraction of a `priority` parent's dequeues this child
    /// keeps while a sibling of higher priority has work (0: strict priority). A `p<N>_fair`
    /// group keeps the sum of its members' shares, at most 1.
    pub outranked_share: f64,
    pub children: Vec<Arc<Node>>,
}

impl Node {
    fn internal(basename: &str, kind: NodeKind) -> Node {
        Node {
            basename: basename.into(),
            kind,
            weight: 1.0,
            priority: 0,
            precedence: 0,
            outranked_share: 0.0,
            children: Vec::new(),
        }
    }

    /// Depth-first walk with each node's full path.
    pub fn walk<'a>(&'a self, prefix: &str, visit: &mut impl FnMut(&str, &'a Node)) {
        let path = format!("{prefix}/{}", self.basename);
        visit(&path, self);
        for child in &self.children {
            child.walk(&path, visit);
        }
    }
}

/// The tree of one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceTree {
    pub resource: String,
    pub unit: CostUnit,
    /// The root workload's node; `None` while there are no workloads.
    pub root: Option<Arc<Node>>,
    /// Each workload's node (its whole subtree) by name, for [`recompile`] to reuse. A node holds
    /// no path, so a subtree stays valid wherever re-parenting moves it.
    nodes: imbl::HashMap<String, Arc<Node>>,
}

/// Every resource's tree, compiled from one catalog snapshot. Immutable, like the snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerTrees {
    pub catalog_version: u64,
    pub machine: Machine,
    pub trees: Vec<ResourceTree>,
}

/// One row of `system.scheduler` (the columns fixed by the tree's shape).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerRow<'a> {
    pub resource: &'a str,
    pub path: String,
    pub node: &'a Node,
}

impl SchedulerRow<'_> {
    pub fn max_requests(&self) -> Option<i64> {
        match self.node.kind {
            NodeKind::InflightLimit { max_requests, .. } => Some(max_requests),
            _ => None,
        }
    }
    pub fn max_cost(&self) -> Option<i64> {
        match self.node.kind {
            NodeKind::InflightLimit { max_cost, .. } => Some(max_cost),
            _ => None,
        }
    }
    pub fn max_speed(&self) -> Option<f64> {
        match self.node.kind {
            NodeKind::BandwidthLimit { max_speed, .. } => Some(max_speed),
            _ => None,
        }
    }
    pub fn max_burst(&self) -> Option<f64> {
        match self.node.kind {
            NodeKind::BandwidthLimit { max_burst, .. } => Some(max_burst),
            _ => None,
        }
    }
}

impl SchedulerTrees {
    /// All nodes of all trees, ordered by resource, then path (byte-wise).
    pub fn rows(&self) -> Vec<SchedulerRow<'_>> {
        let mut rows = Vec::new();
        for tree in &self.trees {
            if let Some(root) = &tree.root {
                root.walk("", &mut |path, node| {
                    rows.push(SchedulerRow {
                        resource: &tree.resource,
                        path: path.to_string(),
                        node,
                    });
                });
            }
        }
        rows.sort_by(|a, b| (a.resource, a.path.as_str()).cmp(&(b.resource, b.path.as_str())));
        rows
    }

    pub fn tree(&self, resource: &str) -> Option<&ResourceTree> {
        self.trees.iter().find(|t| t.resource == resource)
    }
}

/// `floor(ratio × base)` clamped to the `Int64` range (ClickHouse clamps huge ratios). A ratio
/// that floors to zero sets no limit, like an explicit zero.
fn ratio_limit(ratio: f64, base: f64) -> i64 {
    let v = (ratio * base).floor();
    if v >= i64::MAX as f64 || v < 1.0 {
        UNLIMITED
    } else {
        v as i64
    }
}

/// The smaller of the positive values, or 0 when neither is.
fn min_positive(a: f64, b: f64) -> f64 {
    match (a > 0.0, b > 0.0) {
        (true, true) => a.min(b),
        (true, false) => a,
        (false, true) => b,
        (false, false) => 0.0,
    }
}

/// The constraint nodes a workload gets for a resource, outermost first.
fn constraints(s: &WorkloadSettings, unit: CostUnit, machine: Machine) -> Vec<Node> {
    let mut out = Vec::new();
    let cores = f64::from(machine.cores);
    let throttle = |speed: f64, burst: f64| {
        Node::internal(
            "throttler",
            NodeKind::BandwidthLimit {
                max_speed: speed,
                max_burst: burst,
            },
        )
    };
    let semaphore = |max_requests: i64, max_cost: i64| {
        Node::internal(
            "semaphore",
            NodeKind::InflightLimit {
                max_requests,
                max_cost,
            },
        )
    };
    match unit {
        CostUnit::IoByte => {
            if s.max_bytes_per_second > 0.0 {
                out.push(throttle(s.max_bytes_per_second, s.max_burst_bytes));
            }
            if s.max_io_requests < UNLIMITED || s.max_bytes_inflight < UNLIMITED {
                out.push(semaphore(s.max_io_requests, s.max_bytes_inflight));
            }
        }
        CostUnit::CpuNanosecond => {
            let cpus = min_positive(s.max_cpus, s.max_cpu_share * cores);
            if cpus > 0.0 {
                out.push(throttle(cpus * 1e9, s.max_burst_cpu_seconds * 1e9));
            }
            let mut threads = s.max_concurrent_threads;
            if s.max_concurrent_threads_ratio_to_cores > 0.0 {
                threads = threads.min(ratio_limit(s.max_concurrent_threads_ratio_to_cores, cores));
            }
            if threads < UNLIMITED {
                out.push(semaphore(threads, UNLIMITED));
            }
        }
        CostUnit::QuerySlot => {
            if s.max_queries_per_second > 0.0 {
                out.push(throttle(s.max_queries_per_second, s.max_burst_queries));
            }
            if s.max_concurrent_queries < UNLIMITED {
                out.push(semaphore(s.max_concurrent_queries, UNLIMITED));
            }
        }
        CostUnit::MemoryByte => {
            let mut max = s.max_memory;
            if s.max_memory_ratio > 0.0 {
                max = max.min(ratio_limit(s.max_memory_ratio, machine.memory as f64));
            }
            if max < UNLIMITED {
                out.push(Node::internal(
                    "limit",
                    NodeKind::AllocationLimit { max_allocated: max },
                ));
            }
        }
    }
    out
}

struct Compiler<'a> {
    catalog: &'a Catalog,
    resource: &'a CreateResource,
    unit: CostUnit,
    machine: Machine,
    /// Workloads to build afresh; every other one is taken from `nodes` when it is there.
    dirty: Option<&'a HashSet<&'a str>>,
    nodes: imbl::HashMap<String, Arc<Node>>,
}

impl Compiler<'_> {
    /// The node of workload `w` and its subtree: reused from `nodes` unless `w` is dirty (or
    /// this is a full compilation), built otherwise.
    fn workload(&mut self, w: &CreateWorkload) -> Result<Arc<Node>> {
        if let Some(dirty) = self.dirty {
            if !dirty.contains(w.name.as_str()) {
                if let Some(node) = self.nodes.get(&w.name) {
                    return Ok(node.clone());
                }
            }
        }
        let catalog = self.catalog;
        let mut children = Vec::new();
        for child in catalog.children_of(&w.name) {
            children.push(self.workload(child)?);
        }
        let node = Arc::new(self.build(w, children)?);
        self.nodes.insert(w.name.clone(), node.clone());
        Ok(node)
    }

    fn build(&self, w: &CreateWorkload, children: Vec<Arc<Node>>) -> Result<Node> {
        let s = WorkloadSettings::resolve(&w.settings, Some(&self.resource.name))?;
        let space = self.unit.is_space_shared();
        let mut chain = constraints(&s, self.unit, self.machine);
        let inner = if children.is_empty() {
            // ClickHouse only limits waiting for queries and memory; IO and CPU queue freely.
            let max_queued = match self.unit {
                CostUnit::QuerySlot | CostUnit::MemoryByte => s.max_waiting_queries,
                _ => UNLIMITED,
            };
            if space {
                Node::internal("queue", NodeKind::AllocationQueue { max_queued })
            } else {
                Node::internal("fifo", NodeKind::Fifo { max_queued })
            }
        } else {
            self.children_node(children)
        };
        // Nest: workload ⊃ throttler ⊃ semaphore ⊃ inner.
        let mut node = inner;
        while let Some(mut outer) = chain.pop() {
            outer.children.push(Arc::new(node));
            node = outer;
        }
        Ok(Node {
            basename: w.name.clone(),
            kind: NodeKind::Workload,
            weight: s.weight,
            priority: s.priority,
            precedence: s.precedence,
            outranked_share: s.outranked_share,
            children: vec![Arc::new(node)],
        })
    }

    /// The node under which a workload's children hang, grouped by priority (or precedence).
    fn children_node(&self, children: Vec<Arc<Node>>) -> Node {
        let space = self.unit.is_space_shared();
        let mut groups: BTreeMap<i64, Vec<Arc<Node>>> = BTreeMap::new();
        for node in children {
            let key = if space {
                node.precedence
            } else {
                node.priority
            };
            groups.entry(key).or_default().push(node);
        }
        let mut grouped: Vec<Arc<Node>> = groups
            .into_iter()
            .map(|(key, mut nodes)| {
                if nodes.len() == 1 {
                    nodes.remove(0)
                } else {
                    let kind = if space {
                        NodeKind::FairAllocation
                    } else {
                        NodeKind::Fair
                    };
                    let mut fair = Node::internal(&format!("p{key}_fair"), kind);
                    if space {
                        fair.precedence = key;
                    } else {
                        fair.priority = key;
                        fair.outranked_share = nodes
                            .iter()
                            .map(|n| n.outranked_share)
                            .sum::<f64>()
                            .min(1.0);
                    }
                    fair.children = nodes;
                    Arc::new(fair)
                }
            })
            .collect();
        if grouped.len() == 1 {
            return Arc::unwrap_or_clone(grouped.remove(0));
        }
        let kind = if space {
            NodeKind::PrecedenceAllocation
        } else {
            NodeKind::Priority
        };
        let mut prio = Node::internal("prio", kind);
        prio.children = grouped;
        prio
    }
}

/// Compiles one resource's tree; with `reuse`, only the dirty workloads are built and every
/// other node comes from the previous tree's index.
fn compile_tree(
    catalog: &Catalog,
    resource: &CreateResource,
    machine: Machine,
    reuse: Option<(&ResourceTree, &HashSet<&str>)>,
) -> Result<ResourceTree> {
    let mut compiler = Compiler {
        catalog,
        resource,
        unit: resource.unit(),
        machine,
        dirty: reuse.map(|(_, dirty)| dirty),
        nodes: reuse
            .map(|(tree, _)| tree.nodes.clone())
            .unwrap_or_default(),
    };
    let root = match catalog.root() {
        Some(r) => Some(compiler.workload(r)?),
        None => None,
    };
    Ok(ResourceTree {
        resource: resource.name.clone(),
        unit: resource.unit(),
        root,
        nodes: compiler.nodes,
    })
}

/// Compiles every resource's tree from a catalog snapshot.
pub fn compile(catalog: &Catalog, machine: Machine) -> Result<SchedulerTrees> {
    let trees = catalog
        .resources()
        .map(|r| compile_tree(catalog, r, machine, None))
        .collect::<Result<_>>()?;
    Ok(SchedulerTrees {
        catalog_version: catalog.version(),
        machine,
        trees,
    })
}

/// Compiles the trees of `after`, the snapshot that `change` made from `before`, whose trees are
/// `previous`. The result equals [`compile`]`(after)`; only the work differs. A workload change
/// rebuilds the changed workload and its ancestors before and after the change in every tree and
/// shares every other subtree; a resource change rebuilds that resource's tree and shares the
/// others whole. One change to a catalog of n workloads costs O(depth × fan-out + log n) per
/// resource instead of O(n).
pub fn recompile(
    previous: &SchedulerTrees,
    before: &Catalog,
    after: &Catalog,
    change: &Change,
    machine: Machine,
) -> Result<SchedulerTrees> {
    if previous.machine != machine || previous.catalog_version != before.version() {
        return compile(after, machine);
    }
    let (changed, is_workload) = match change {
        // Classifiers route statements; they are not in any tree.
        Change::Upsert(Entity::Classifier(_))
        | Change::Remove {
            kind: sluice_sql::EntityKind::Classifier,
            ..
        } => {
            return Ok(SchedulerTrees {
                catalog_version: after.version(),
                machine,
                trees: previous.trees.clone(),
            })
        }
        Change::Upsert(Entity::Workload(w)) => (w.name.as_str(), true),
        Change::Upsert(Entity::Resource(r)) => (r.name.as_str(), false),
        Change::Remove { kind, name } => (name.as_str(), *kind == sluice_sql::EntityKind::Workload),
    };
    let mut dirty: HashSet<&str> = HashSet::new();
    if is_workload {
        dirty.insert(changed);
        dirty.extend(before.ancestors(changed));
        dirty.extend(after.ancestors(changed));
    }
    let mut trees = Vec::new();
    for resource in after.resources() {
        let prev = previous.tree(&resource.name);
        let tree = match prev {
            Some(prev) if !is_workload && resource.name != changed => prev.clone(),
            Some(prev) if is_workload => {
                let mut tree = compile_tree(after, resource, machine, Some((prev, &dirty)))?;
                if after.workload(changed).is_none() {
                    tree.nodes.remove(changed);
                }
                tree
            }
            _ => compile_tree(after, resource, machine, None)?,
        };
        trees.push(tree);
    }
    Ok(SchedulerTrees {
        catalog_version: after.version(),
        machine,
        trees,
    })
}

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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sluice_catalog::{Catalog, Stored, WorkloadSettings, UNLIMITED};
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
    /// The resource's definition the tree was compiled from.
    definition: Arc<Stored>,
    /// Each workload's compiled node, with the definition it came from and its number of
    /// children: what [`recompile`] needs to reuse unchanged subtrees.
    compiled: HashMap<String, Compiled>,
}

#[derive(Debug, Clone, PartialEq)]
struct Compiled {
    definition: Arc<Stored>,
    node: Arc<Node>,
    children: usize,
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
    children: &'a BTreeMap<&'a str, Vec<&'a CreateWorkload>>,
    /// The previous compilation of this resource's tree, when it may be reused.
    previous: Option<&'a ResourceTree>,
    compiled: HashMap<String, Compiled>,
}

impl Compiler<'_> {
    /// Compiles workload `w` and its subtree; returns the node and whether it was reused.
    fn workload(&mut self, w: &CreateWorkload) -> Result<(Arc<Node>, bool)> {
        let children = self
            .children
            .get(w.name.as_str())
            .map_or(&[][..], |c| c.as_slice());
        let mut child_nodes = Vec::with_capacity(children.len());
        let mut all_reused = true;
        for child in children {
            let (node, reused) = self.workload(child)?;
            all_reused &= reused;
            child_nodes.push(node);
        }
        let definition = self
            .catalog
            .stored(&w.name)
            .cloned()
            .expect("a catalog workload has a stored definition");
        // Reuse when this workload's definition is the very same, and so is each child's
        // subtree (children keep their parent, so an unchanged count means the same children).
        if let Some(prev) = self.previous.and_then(|p| p.compiled.get(&w.name)) {
            if all_reused
                && prev.children == children.len()
                && Arc::ptr_eq(&prev.definition, &definition)
            {
                let node = prev.node.clone();
                self.compiled.insert(w.name.clone(), prev.clone());
                return Ok((node, true));
            }
        }
        let node = Arc::new(self.build(w, child_nodes)?);
        self.compiled.insert(
            w.name.clone(),
            Compiled {
                definition,
                node: node.clone(),
                children: children.len(),
            },
        );
        Ok((node, false))
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

/// Compiles every resource's tree from a catalog snapshot.
pub fn compile(catalog: &Catalog, machine: Machine) -> Result<SchedulerTrees> {
    recompile(catalog, machine, None)
}

/// Compiles every resource's tree, reusing from `previous` (the trees of an earlier snapshot
/// this one was derived from) every workload subtree that did not change. The result is equal to
/// [`compile`]'s; only the work differs: one change costs a lookup per workload instead of a
/// rebuild of every tree.
pub fn recompile(
    catalog: &Catalog,
    machine: Machine,
    previous: Option<&SchedulerTrees>,
) -> Result<SchedulerTrees> {
    let previous = previous.filter(|p| p.machine == machine);
    let children = catalog.children();
    let mut trees = Vec::new();
    for resource in catalog.resources() {
        let definition = catalog
            .stored(&resource.name)
            .cloned()
            .expect("a catalog resource has a stored definition");
        let prev_tree = previous
            .and_then(|p| p.tree(&resource.name))
            .filter(|t| Arc::ptr_eq(&t.definition, &definition));
        let mut compiler = Compiler {
            catalog,
            resource,
            unit: resource.unit(),
            machine,
            children: &children,
            previous: prev_tree,
            compiled: HashMap::new(),
        };
        let root = match catalog.root() {
            Some(r) => Some(compiler.workload(r)?.0),
            None => None,
        };
        trees.push(ResourceTree {
            resource: resource.name.clone(),
            unit: resource.unit(),
            root,
            definition,
            compiled: compiler.compiled,
        });
    }
    Ok(SchedulerTrees {
        catalog_version: catalog.version(),
        machine,
        trees,
    })
}

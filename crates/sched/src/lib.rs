//! # sluice-sched: scheduler trees
//!
//! Owns compiling a catalog snapshot into one node tree per resource ([`tree::compile`], and
//! [`tree::recompile`] which reuses the unchanged subtrees of an earlier compilation), the
//! shape ClickHouse 26.9 builds and `system.scheduler` shows; and running a tree
//! ([`runtime::ResourceScheduler`]): the time-shared nodes (fifo, fair, priority, inflight_limit,
//! bandwidth_limit), admission futures and RAII permits that can move to another workload or
//! change their cost, and a [`runtime::Clock`] so timing logic runs in virtual time in tests;
//! the space-shared (memory) nodes: allocations admitted, grown, shrunk and evicted
//! ([`space::MemoryScheduler`]); and the shares each workload is promised, read off the settings ([`mod@shares`]).
//! The runtime's behaviour reads as data-driven scripts in `testdata/` (run by
//! `tests/scripts.rs`).
//!
//! Invariants:
//! - Compiling is a pure function of (catalog snapshot, [`tree::Machine`]); the trees are
//!   immutable and a change compiles new ones.
//! - Every workload of the catalog appears once in every resource's tree, under its parent.
//!
//! - Dropping a pending admission removes it from its queue; dropping a permit returns all it
//!   held (see [`runtime`] for the rest).
//!
//! It does no I/O and knows no SQL engine.

pub mod fleet;
pub mod runtime;
pub mod shares;
pub mod space;
pub mod tree;

pub use runtime::{
    Acquire, Clock, Fence, LimitKind, LimitState, NodeState, NodeStats, Permit, ResourceScheduler,
    TokioClock, Wake,
};
pub use shares::{shares, ShareRow};
pub use space::{
    Allocation, KillSwitch, MemoryScheduler, PendingAllocation, SpaceNodeState, SpaceStats,
};

pub use tree::{
    compile, recompile, Machine, Node, NodeKind, ResourceTree, SchedulerRow, SchedulerTrees,
};

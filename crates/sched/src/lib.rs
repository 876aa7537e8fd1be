//! # sluice-sched: scheduler trees
//!
//! Owns compiling a catalog snapshot into one node tree per resource ([`tree::compile`], and
//! [`tree::recompile`] which reuses the unchanged subtrees of an earlier compilation), the
//! shape ClickHouse 26.9 builds and `system.scheduler` shows. The runtime nodes (queues, fair and
//! priority policies, limits, admission futures and permits, a `Clock` for virtual time) grow on
//! these trees.
//!
//! Invariants:
//! - Compiling is a pure function of (catalog snapshot, [`tree::Machine`]); the trees are
//!   immutable and a change compiles new ones.
//! - Every workload of the catalog appears once in every resource's tree, under its parent.
//!
//! It does no I/O and knows no SQL engine.

pub mod tree;

pub use tree::{
    compile, recompile, Machine, Node, NodeKind, ResourceTree, SchedulerRow, SchedulerTrees,
};

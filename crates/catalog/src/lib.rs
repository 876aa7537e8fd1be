//! # sluice-catalog: workloads and resources
//!
//! Owns the entities (and sluice's classifiers, compiled into ranked rules: [`classifiers`]),
//! every validation rule ClickHouse 26.9 enforces on them ([`catalog`]),
//! setting typing, units and per-resource resolution ([`settings`]), sluice's own lane settings
//! (`demote_after`, `demote_to`, `relearn_after`, `max_execution_time`: [`lanes`]), and their storage in the
//! data dir plus the read-only configuration layer ([`storage`]).
//!
//! Invariants:
//! - A [`Catalog`] is an immutable snapshot; [`Catalog::apply`] returns a new one and leaves the
//!   old untouched, so readers never see a half-applied change.
//! - Every snapshot satisfies the rules listed on [`Catalog`]; the compiler may rely on them.
//!   (The one mutable part of a snapshot is its classifiers' match counters: statistics shared
//!   by the snapshots that hold the same rule, never part of a definition.)
//! - On disk, each entity is one file written atomically; a crash leaves each file either the
//!   old or the new definition ([`storage::DiskStorage`]).
//!
//! It schedules nothing.

pub mod catalog;
pub mod classifiers;
pub mod lanes;
pub mod settings;
pub mod storage;
pub mod strict;

pub use catalog::{resource_disks, Catalog, Change, Entity, Origin, Stored, MAX_WORKLOAD_DEPTH};
pub use classifiers::{Facts, OwnedFacts, Rule, Rules};
pub use lanes::{Demotion, Lanes};
pub use settings::{parse_with_size_suffix, Setting, WorkloadSettings, UNLIMITED};
pub use storage::{config_layer, escape_file_name, load_statements, write_atomically, DiskStorage};

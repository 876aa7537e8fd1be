//! # sluice-engine: where queries run
//!
//! Owns the [`Engine`] / [`Session`] interface the server runs statements through, and its
//! first implementation, the embedded Apache DataFusion engine ([`embedded`]): one session per
//! client connection, all sharing one set of catalogs (a table one client creates, the others
//! see) but each with its own settings, so nothing a client `SET`s leaks to another. The
//! upstream database ([`upstream`]) is the other place statements run: it is not behind these
//! traits, which deal in Arrow batches, because upstream mode relays the upstream's messages
//! without decoding rows; the server forwards to it at the message level.
//!
//! Modules: [`embedded`] (the engine, its sessions and its runtime), [`cache`] (the plan cache),
//! [`give_back`] (memory given back after a big statement),
//! [`compat`] (what Postgres clients expect where DataFusion differs), [`functions`]
//! (`pg_sleep`), [`pg_catalog`] (Postgres's `pg_catalog` and `information_schema` made from
//! the engine's catalogs, the functions clients' catalog queries call, and the Postgres type
//! each Arrow type is sent as), [`error`] (the one mapping of DataFusion's errors to sluice's), [`upstream`]
//! (the upstream database's wire, for upstream mode: a Postgres-protocol client that keeps
//! every message as it came).
//!
//! Invariants:
//! - Statements are planned and run on the engine's own threads, never on the caller's runtime
//!   — except a cached statement whose kept plan reads at most a thousand rows already in
//!   memory (`SELECT 1`), which runs where it is asked for: its work is bounded by that input;
//!   a statement's rows arrive as a stream with at most a few batches buffered, and dropping the
//!   stream (or the `execute` future) stops the statement's work and holds nothing.
//! - A panic inside a statement is that statement's error (`LOGICAL_ERROR`, XX000); the engine
//!   and every other session go on.
//! - `target_partitions` given to a statement applies to that statement only.
//! - A bound parameter is cast to the type the plan infers for its placeholder before it is
//!   bound, so rows written through parameters have the table's types.
//! - A cached plan is never used after anything that could change it: each session keeps
//!   optimized plans of plain queries (immutable functions only, no placeholders) tagged with
//!   an engine-wide generation that every DDL, SET, DML and system-table refresh bumps.
//!   A physical plan is kept beside it only when it reads nothing but memory tables (which
//!   change only by DML, so a kept plan is never older than the data) through nodes that
//!   [`reset_plan_states`](datafusion::physical_plan::execution_plan::reset_plan_states)
//!   makes new again; each run executes a reset copy, never the kept plan. Files are
//!   planned, and so listed, on every run. A kept plan that reads no table at all (its
//!   leaves constant rows: `SELECT 1`) gives the same rows at every run of its generation:
//!   its first run's rows are kept and served as they are.
//! - After a statement that ran 100 ms or more, each engine worker gives back what it freed
//!   ([`give_back`]); a shorter one costs a clock read there.
//!
//! It decides no policy: admission and limits are the server's and the scheduler's.

pub mod cache;
pub mod compat;
pub mod cpu;
pub mod embedded;
pub mod error;
pub mod functions;
pub mod give_back;
pub mod io;
pub mod memory;
pub mod pg_catalog;
pub mod upstream;

use std::pin::Pin;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use futures::Stream;
use sluice_sql::Result;

pub use cpu::CpuLease;
pub use datafusion;
pub use embedded::{collected, Embedded, EmbeddedSession};
pub use functions::Barriers;
pub use io::IoGate;
pub use memory::MemoryCharge;

/// A statement's rows, batch by batch, as the engine produces them.
pub type BatchStream = Pin<Box<dyn Stream<Item = Result<RecordBatch>> + Send>>;

/// What a statement produced.
pub enum QueryOutput {
    /// Rows (a query): their columns, then the rows as they come.
    Rows {
        schema: SchemaRef,
        batches: BatchStream,
    },
    /// A command, with the Postgres command tag and the rows it affected when that applies.
    Command { tag: String, rows: Option<usize> },
}

impl std::fmt::Debug for QueryOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryOutput::Rows { schema, .. } => f
                .debug_struct("Rows")
                .field("schema", schema)
                .finish_non_exhaustive(),
            QueryOutput::Command { tag, rows } => f
                .debug_struct("Command")
                .field("tag", tag)
                .field("rows", rows)
                .finish(),
        }
    }
}

/// How one statement is to run.
#[derive(Debug, Clone, Default)]
pub struct ExecuteOptions {
    /// The statement's parallelism (its `max_threads`, or the CPU threads it was granted);
    /// `None`: the session's.
    pub target_partitions: Option<usize>,
    /// Where its file reads and writes wait for their turn (the disks' IO resources); `None`:
    /// they do not wait.
    pub io: Option<std::sync::Arc<dyn io::IoGate>>,
    /// Where its memory is counted besides the engine's pool (its workload's allocation,
    /// `max_memory_usage`); `None`: the engine's pool only.
    pub memory: Option<std::sync::Arc<dyn memory::MemoryCharge>>,
    /// The leases on its CPU slots, each renewed at a batch boundary every quantum of CPU time
    /// its tasks use (`cpu_slot_preemption`); `None`: slots are held until the statement ends.
    pub cpu: Option<std::sync::Arc<dyn cpu::CpuLease>>,
}

/// An engine: where sessions come from, and where the server publishes `system.*`.
pub trait Engine: Send + Sync + std::fmt::Debug {
    /// A new session for one client connection.
    fn session(&self) -> Box<dyn Session>;

    /// Registers (or replaces) table `schema.name` holding `batch`, visible to every session.
    fn publish_table(&self, schema: &str, name: &str, batch: RecordBatch) -> Result<()>;
}

/// One client's session on an engine. A connection runs one statement at a time.
#[async_trait]
pub trait Session: Send + Sync + std::fmt::Debug {
    /// Plans and starts one statement; its rows stream from the returned output.
    async fn execute(
        &self,
        sql: &str,
        options: ExecuteOptions,
        params: Vec<ScalarValue>,
    ) -> Result<QueryOutput> {
        self.execute_shared(&std::sync::Arc::from(sql), options, params)
            .await
    }

    /// [`Session::execute`] of a text the caller shares (a statement's own): the engine's task
    /// takes another reference to it, where a borrowed text is copied for the task (a
    /// statement of megabytes was copied on the connection thread, fresh pages and all). A
    /// statement answered at once (a tiny one) takes none.
    async fn execute_shared(
        &self,
        sql: &std::sync::Arc<str>,
        options: ExecuteOptions,
        params: Vec<ScalarValue>,
    ) -> Result<QueryOutput>;

    /// The result columns of a statement, without running it; `None` for a statement that
    /// returns no rows.
    async fn describe(&self, sql: &str) -> Result<Option<SchemaRef>>;

    /// A count that moves whenever what [`Session::describe`] says of a text may have changed
    /// (a table made, dropped or refreshed, a statement applied, the time zone set), so a
    /// caller may keep its answer while the count stays; `None`: no such count, ask each time.
    fn columns_generation(&self) -> Option<u64> {
        None
    }

    /// The types of a statement's placeholders `$1`, `$2`, … in order, as far as the engine
    /// can infer them (`None`: not inferable, e.g. a bare `SELECT $1`).
    async fn parameter_types(&self, sql: &str) -> Result<Vec<Option<DataType>>>;

    /// The session's time zone (PostgreSQL's `TimeZone`): an IANA name (`PST8PDT`,
    /// `Asia/Tokyo`) or an offset (`+05:30`); `timestamptz` values are read and shown in it.
    /// An unknown zone is refused (22023, as PostgreSQL refuses it) and changes nothing.
    async fn set_time_zone(&self, zone: &str) -> Result<()>;
}

#[cfg(test)]
mod tests;

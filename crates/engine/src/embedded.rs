//! The embedded engine: Apache DataFusion, on threads of its own.
//!
//! Every statement is planned and run as a task on the engine's runtime (big stacks, its own
//! worker threads), never on the runtime that serves sockets: a heavy plan or a CPU-bound
//! query cannot delay another client's `SELECT 1`, a cancel, or the accept loop. Rows come
//! back through a channel of [`BATCHES_IN_FLIGHT`] batches, so a result far larger than memory
//! streams in bounded memory; dropping the stream (cancel, disconnect, the last row sent) aborts
//! the task and with it the statement's work.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionContext;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{LogicalPlan, Statement};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{DataFrame, SessionConfig};
use futures::{Stream, StreamExt};
use sluice_sql::{Error, ErrorCode, Result};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::cache::{cacheable, reusable, tiny, Planning};
use crate::compat::{
    array_placeholders, column_names, command_tag, count, postgres_array_elements, postgres_names,
    postgres_series, TableArguments,
};
use crate::error::{engine_failure, from_datafusion};
use crate::{BatchStream, Engine, ExecuteOptions, QueryOutput, Session};

/// Batches a running statement may have produced ahead of the client.
pub const BATCHES_IN_FLIGHT: usize = 2;

/// Stack of each engine thread. Only the pages a statement touches are committed; planning is
/// bounded in depth by [`sluice_sql::MAX_NESTING`] and DataFusion's own recursion guards, and
/// this leaves room for both with a wide margin.
pub const ENGINE_STACK_BYTES: usize = 64 * 1024 * 1024;

fn df(e: DataFusionError) -> Error {
    from_datafusion(&e)
}

/// Where engine tasks run: a runtime the engine owns (the server's case), or a handle given to
/// it (tests in virtual time).
struct EngineRuntime {
    handle: tokio::runtime::Handle,
    owned: Option<tokio::runtime::Runtime>,
    /// Its worker threads (each collects after a big statement: [`crate::give_back`]).
    workers: usize,
}

impl Drop for EngineRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is not allowed inside another runtime.
        if let Some(runtime) = self.owned.take() {
            runtime.shutdown_background();
        }
    }
}

/// The embedded DataFusion engine: shared catalogs, and a template for sessions.
#[derive(Clone)]
pub struct Embedded {
    base: SessionContext,
    /// Bumped by anything that may change what a statement plans to: DDL, SET, DML in any
    /// session, and system-table refreshes. Cached plans of an older generation are dropped.
    generation: Arc<AtomicU64>,
    runtime: Arc<EngineRuntime>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded").finish_non_exhaustive()
    }
}

impl Embedded {
    /// An engine with a runtime of its own (one worker thread per core) whose queries may
    /// hold at most `memory_limit` bytes together: past it, an allocation fails the query that
    /// asked with MEMORY_LIMIT_EXCEEDED (operators that can spill spill first), and the rest go
    /// on. One query can therefore not take the machine.
    pub fn new(memory_limit: usize) -> std::io::Result<Embedded> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("sluice-engine")
            .thread_stack_size(ENGINE_STACK_BYTES)
            .enable_all()
            .build()?;
        Embedded::with_runtime(
            EngineRuntime {
                handle: runtime.handle().clone(),
                owned: Some(runtime),
                workers: threads,
            },
            memory_limit,
        )
    }

    /// An engine whose tasks run on `handle` (tests that pause time run it on their own
    /// runtime).
    pub fn on(handle: tokio::runtime::Handle, memory_limit: usize) -> std::io::Result<Embedded> {
        Embedded::with_runtime(
            EngineRuntime {
                handle,
                owned: None,
                workers: 1,
            },
            memory_limit,
        )
    }

    fn with_runtime(runtime: EngineRuntime, memory_limit: usize) -> std::io::Result<Embedded> {
        let config = SessionConfig::new()
            // sluice serves information_schema itself, as Postgres names it
            // (crate::pg_catalog); DataFusion's SHOW reads its df_settings there.
            .with_information_schema(false)
            .with_default_catalog_and_schema("datafusion", "public")
            // PostgreSQL's default zone: a `timestamptz` is one (shown with its offset, typed
            // as one), not a timestamp without a zone, until a client sets its `TimeZone`.
            .set_str("datafusion.execution.time_zone", "UTC");
        // One pool for every session: the limit is the engine's, not a query's. Errors name
        // the largest consumers (DataFusion's tracking pool).
        let env = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
            .with_memory_limit(memory_limit, 1.0)
            .build_arc()
            .map_err(|e| std::io::Error::other(format!("the engine's memory pool: {e}")))?;
        let base = SessionContext::new_with_config_rt(config, env);
        crate::functions::register(&base);
        crate::pg_catalog::register(&base)
            .map_err(|e| std::io::Error::other(format!("the engine's pg_catalog: {e}")))?;
        Ok(Embedded {
            base,
            generation: Arc::default(),
            runtime: Arc::new(runtime),
        })
    }

    /// This engine with `sluice_barrier(name)` registered, waiting on `barriers` (tests).
    pub fn with_barriers(self, barriers: crate::functions::Barriers) -> Embedded {
        crate::functions::register_barriers(&self.base, barriers);
        self
    }

    /// A new session of this engine (see [`Engine::session`]), with its concrete type.
    pub fn embedded_session(&self) -> EmbeddedSession {
        let state = SessionStateBuilder::new_from_existing(self.base.state()).build();
        EmbeddedSession {
            inner: Arc::new(SessionInner {
                generation: self.generation.clone(),
                planning: tokio::sync::Mutex::new(Planning::of(&state)),
                ctx: SessionContext::new_with_state(state),
                prepared: std::sync::Mutex::default(),
            }),
            runtime: self.runtime.clone(),
        }
    }
}

impl Engine for Embedded {
    fn session(&self) -> Box<dyn Session> {
        Box::new(self.embedded_session())
    }

    fn publish_table(&self, schema: &str, name: &str, batch: RecordBatch) -> Result<()> {
        use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
        use datafusion::datasource::MemTable;
        let catalog = self.base.catalog("datafusion").ok_or_else(|| {
            Error::new(
                ErrorCode::InternalError,
                "the engine has no default catalog",
            )
        })?;
        let provider = match catalog.schema(schema) {
            Some(p) => p,
            None => {
                let p: Arc<dyn SchemaProvider> = Arc::new(MemorySchemaProvider::new());
                catalog.register_schema(schema, p.clone()).map_err(df)?;
                p
            }
        };
        let table = MemTable::try_new(batch.schema(), vec![vec![batch]]).map_err(df)?;
        provider.deregister_table(name).map_err(df)?;
        provider
            .register_table(name.to_string(), Arc::new(table))
            .map_err(df)?;
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A time zone as the engine reads one: an IANA name or a fixed offset; anything else is
/// PostgreSQL's 22023.
pub fn time_zone(zone: &str) -> Result<datafusion::arrow::array::timezone::Tz> {
    zone.parse().map_err(|_| {
        Error::new(
            ErrorCode::BadArguments,
            format!("invalid value for parameter \"TimeZone\": \"{zone}\""),
        )
        .with_sqlstate("22023")
    })
}

/// One client's session: shares the engine's catalogs (tables), owns its settings.
pub struct EmbeddedSession {
    pub(crate) inner: Arc<SessionInner>,
    runtime: Arc<EngineRuntime>,
}

impl std::fmt::Debug for EmbeddedSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedSession").finish_non_exhaustive()
    }
}

pub(crate) struct SessionInner {
    ctx: SessionContext,
    /// A copy of the session's state kept for planning queries, and the task context derived
    /// from it: `SessionContext::state()` clones every function registry, which was most of
    /// the cost of a small query. Refreshed after any statement that may change the session
    /// (SET, DDL); tables live in the shared catalogs, so new ones are seen without refresh.
    /// A connection runs one statement at a time, so the lock is never contended.
    pub(crate) planning: tokio::sync::Mutex<Planning>,
    generation: Arc<AtomicU64>,
    /// What sluice keeps of each statement SQL's PREPARE made, by name (DataFusion keeps the
    /// plan).
    prepared: std::sync::Mutex<std::collections::HashMap<String, Prepared>>,
}

/// A statement SQL's PREPARE made, as sluice keeps it beside DataFusion's prepared plan.
#[derive(Clone)]
struct Prepared {
    /// Its columns' Postgres names: its EXECUTE is planned from DataFusion's prepared plan,
    /// which keeps DataFusion's names.
    names: Names,
    /// When a table function takes its placeholders: DataFusion's plan has those as ones (it
    /// calls a table function when it plans, with values only), so its EXECUTE plans the
    /// statement again with the values bound.
    replanned: Option<Replanned>,
}

/// A prepared statement its EXECUTE plans again ([`Prepared::replanned`]).
#[derive(Clone)]
struct Replanned {
    /// The statement as written.
    text: String,
    /// The types PREPARE declared, the values are cast to (none: as written).
    types: Vec<DataType>,
    /// How many values an EXECUTE gives: the declared types or the highest placeholder,
    /// whichever is more (as PostgreSQL counts them).
    values: usize,
}

/// The Postgres names of a result's columns (see [`crate::compat::column_names`]).
type Names = Option<Vec<Option<String>>>;

/// A task on the engine runtime, aborted when this is dropped.
struct EngineTask(Option<JoinHandle<()>>);

impl Drop for EngineTask {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

impl EngineTask {
    /// Why a task ended without answering: it panicked (or was stopped with the runtime).
    async fn failure(mut self) -> Error {
        match self.0.take() {
            Some(task) => match task.await {
                Err(e) if e.is_panic() => engine_failure(e.into_panic().as_ref()),
                _ => Error::new(ErrorCode::Aborted, "the engine stopped the statement"),
            },
            None => Error::new(ErrorCode::Aborted, "the engine stopped the statement"),
        }
    }
}

impl EmbeddedSession {
    /// Runs `work` on the engine runtime and waits for its answer; dropping the returned
    /// future aborts it.
    async fn on_engine<T, F>(&self, work: impl FnOnce(Arc<SessionInner>) -> F) -> Result<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let future = work(self.inner.clone());
        let task = EngineTask(Some(self.runtime.handle.spawn(async move {
            let _ = tx.send(future.await);
        })));
        match rx.await {
            Ok(answer) => answer,
            Err(_) => Err(task.failure().await),
        }
    }
}

/// Ends a statement's task: dropped after everything the task held (declared first).
struct AfterStatement {
    handle: tokio::runtime::Handle,
    workers: usize,
    began: std::time::Instant,
}

impl Drop for AfterStatement {
    fn drop(&mut self) {
        crate::give_back::after_statement(&self.handle, self.workers, self.began.elapsed());
    }
}

/// What a started statement gives first: the columns of its rows (which follow on the
/// channel), or its whole outcome.
enum Head {
    Rows(SchemaRef),
    Done(QueryOutput),
}

#[async_trait]
impl Session for EmbeddedSession {
    async fn set_time_zone(&self, zone: &str) -> Result<()> {
        time_zone(zone)?;
        let mut planning = self.inner.planning.lock().await;
        {
            let state = self.inner.ctx.state_ref();
            let mut state = state.write();
            state.config_mut().options_mut().execution.time_zone = Some(zone.to_string());
        }
        // Plans made in the old zone (its `timestamptz` casts) are not reused.
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        *planning = Planning::of(&self.inner.ctx.state());
        Ok(())
    }

    async fn execute_shared(
        &self,
        sql: &Arc<str>,
        options: ExecuteOptions,
        params: Vec<ScalarValue>,
    ) -> Result<QueryOutput> {
        // A tiny statement's parallelism does not matter: it reads a few rows in memory.
        if params.is_empty() {
            if let Some(output) = self.inner.run_tiny(sql)? {
                return Ok(output);
            }
        }
        let (head_tx, head_rx) = oneshot::channel::<Result<Head>>();
        let (batch_tx, batch_rx) = mpsc::channel(BATCHES_IN_FLIGHT);
        let inner = self.inner.clone();
        let sql = sql.clone();
        let (handle, workers) = (self.runtime.handle.clone(), self.runtime.workers);
        let task = EngineTask(Some(self.runtime.handle.spawn(async move {
            // However the statement ends (its client gone: aborted), once what it held is
            // dropped: if it was big, the workers give back what they freed.
            let _after = AfterStatement {
                handle,
                workers,
                began: std::time::Instant::now(),
            };
            match inner.start(&sql, options, params).await {
                Err(e) => {
                    let _ = head_tx.send(Err(e));
                }
                Ok(Started::Done(output)) => {
                    let _ = head_tx.send(Ok(Head::Done(output)));
                }
                Ok(Started::Rows(schema, mut stream)) => {
                    if head_tx.send(Ok(Head::Rows(schema))).is_err() {
                        return;
                    }
                    while let Some(batch) = stream.next().await {
                        let failed = batch.is_err();
                        if batch_tx.send(batch.map_err(df)).await.is_err() || failed {
                            return;
                        }
                    }
                }
            }
        })));
        match head_rx.await {
            Ok(Ok(Head::Rows(schema))) => Ok(QueryOutput::Rows {
                schema,
                batches: Box::pin(Batches {
                    rx: batch_rx,
                    task: Some(task),
                    ending: None,
                }),
            }),
            Ok(Ok(Head::Done(output))) => Ok(output),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(task.failure().await),
        }
    }

    async fn describe(&self, sql: &str) -> Result<Option<SchemaRef>> {
        if let Some(schema) = self.inner.cached_columns(sql) {
            return Ok(schema);
        }
        let sql = sql.to_string();
        self.on_engine(|inner| async move { inner.describe(&sql).await })
            .await
    }

    fn columns_generation(&self) -> Option<u64> {
        // The plan cache's own count: what it keeps a plan (and its columns) against.
        Some(self.inner.generation.load(Ordering::SeqCst))
    }

    async fn parameter_types(&self, sql: &str) -> Result<Vec<Option<DataType>>> {
        let sql = sql.to_string();
        self.on_engine(|inner| async move {
            let planning = inner.planning.lock().await;
            let planned = plan(&planning.state, &sql, TableArguments::Typed).await?;
            drop(planning);
            let mut types = parameter_types(&planned.plan)?;
            for (n, ty) in planned.written_in {
                if types.len() < n {
                    types.resize(n, None);
                }
                types[n - 1] = ty;
            }
            Ok(types)
        })
        .await
    }
}

/// The rows of a running statement, batch by batch; dropping it stops the statement.
struct Batches {
    rx: mpsc::Receiver<Result<RecordBatch>>,
    task: Option<EngineTask>,
    /// Once the channel is closed: how the task ended (a panic is reported, not taken for
    /// the end of the rows).
    ending: Option<Pin<Box<dyn std::future::Future<Output = Option<Error>> + Send>>>,
}

impl Stream for Batches {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ending.is_none() {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(batch)) => return Poll::Ready(Some(batch)),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    let task = self.task.take();
                    self.ending = Some(Box::pin(async move {
                        let mut task = task?;
                        let handle = task.0.take()?;
                        match handle.await {
                            Err(e) if e.is_panic() => Some(engine_failure(e.into_panic().as_ref())),
                            _ => None,
                        }
                    }));
                }
            }
        }
        match self.ending.as_mut().map(|e| e.as_mut().poll(cx)) {
            Some(Poll::Ready(failure)) => {
                self.ending = Some(Box::pin(async { None }));
                Poll::Ready(failure.map(Err))
            }
            Some(Poll::Pending) => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

/// A statement planned: rows to stream, or an outcome already complete.
enum Started {
    Rows(SchemaRef, datafusion::execution::SendableRecordBatchStream),
    Done(QueryOutput),
}

/// What a planned statement does next: run its physical plan, or be applied by the
/// `SessionContext` (DDL, SET, DML).
enum Next {
    Run(
        Arc<dyn ExecutionPlan>,
        Arc<datafusion::execution::TaskContext>,
    ),
    /// A statement applied to completion; with the one-off state a write (COPY, INSERT) runs
    /// in, so its files go through the statement's IO gate.
    Apply(LogicalPlan, Option<Box<SessionState>>),
}

/// Plans that change nothing but produce rows: run straight from the planning state. Others
/// (DDL, SET, DML, COPY) go through the `SessionContext`, which knows how to apply them.
fn is_plain_query(plan: &LogicalPlan) -> bool {
    use datafusion::logical_expr::LogicalPlan as P;
    !matches!(
        plan,
        P::Ddl(_) | P::Statement(_) | P::Dml(_) | P::Copy(_) | P::DescribeTable(_)
    )
}

/// What an applied statement answers, decided by its plan.
enum Answer {
    /// A command tag, with the rows it affected when Postgres counts them.
    Tag(String, bool),
    Rows,
}

fn answer(plan: &LogicalPlan, sql: &str) -> Answer {
    use datafusion::logical_expr::{LogicalPlan as P, Statement as S, WriteOp};
    match plan {
        P::Dml(d) => match d.op {
            WriteOp::Insert(_) => Answer::Tag("INSERT 0".into(), true),
            WriteOp::Update => Answer::Tag("UPDATE".into(), true),
            WriteOp::Delete => Answer::Tag("DELETE".into(), true),
            _ => Answer::Tag("INSERT 0".into(), true),
        },
        P::Copy(_) => Answer::Tag("COPY".into(), true),
        P::Ddl(_) => Answer::Tag(command_tag(sql), false),
        P::Statement(S::SetVariable(_)) => Answer::Tag("SET".into(), false),
        P::Statement(_) => Answer::Tag(
            sql.split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_uppercase(),
            false,
        ),
        _ => Answer::Rows,
    }
}

/// The types of a plan's placeholders `$1`, `$2`, … in order (`None`: not inferable). A
/// `PREPARE`'s placeholders are its statement's, bound by a later `EXECUTE`: the `PREPARE`
/// itself takes none, as in PostgreSQL.
fn parameter_types(plan: &LogicalPlan) -> Result<Vec<Option<DataType>>> {
    if matches!(plan, LogicalPlan::Statement(Statement::Prepare(_))) {
        return Ok(Vec::new());
    }
    let mut by_index: Vec<(usize, Option<DataType>)> = plan
        .get_parameter_types()
        .map_err(df)?
        .into_iter()
        .filter_map(|(name, ty)| Some((name.strip_prefix('$')?.parse::<usize>().ok()?, ty)))
        .collect();
    by_index.sort_by_key(|(i, _)| *i);
    let len = by_index.last().map_or(0, |(i, _)| *i);
    let mut out = vec![None; len];
    for (i, ty) in by_index {
        if i > 0 {
            out[i - 1] = ty;
        }
    }
    Ok(out)
}

/// The values of an `EXECUTE`, as DataFusion reads them for a prepared plan: each simplified
/// to a literal (anything else is refused, as DataFusion refuses it), then cast to the type
/// `PREPARE` declared for it (when it declared any; a count that differs is DataFusion's
/// error, given by the caller).
fn execute_values(
    state: &SessionState,
    parameters: &[datafusion::logical_expr::Expr],
    types: &[DataType],
) -> Result<Vec<ScalarValue>> {
    use datafusion::logical_expr::simplify::SimplifyContext;
    use datafusion::optimizer::simplify_expressions::ExprSimplifier;
    let context = SimplifyContext::builder()
        .with_config_options(Arc::clone(state.config_options()))
        .with_query_execution_start_time(state.execution_props().query_execution_start_time)
        .build();
    let simplifier = ExprSimplifier::new(context);
    parameters
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let value = match simplifier.simplify(e.clone()).map_err(df)? {
                datafusion::logical_expr::Expr::Literal(value, _) => value,
                e => {
                    return Err(Error::new(
                        ErrorCode::BadArguments,
                        format!("EXECUTE takes values only: parameter ${} is {e}", i + 1),
                    )
                    .with_sqlstate("0A000"))
                }
            };
            match types.get(i) {
                Some(ty) => value.cast_to(ty).map_err(df),
                None => Ok(value),
            }
        })
        .collect()
}

/// Binds `params` into `plan`, each cast to the type the plan gives its placeholder (the
/// column it is compared with or written into), as PostgreSQL casts a parameter to its
/// inferred type: a driver that sends an `int2` for an `INT` column writes an `INT`.
fn bind(plan: LogicalPlan, params: Vec<ScalarValue>) -> Result<LogicalPlan> {
    let types = parameter_types(&plan)?;
    let params = params
        .into_iter()
        .enumerate()
        .map(|(i, value)| match types.get(i).cloned().flatten() {
            // An array sent as text, untyped (node-postgres): its elements, then the cast.
            Some(target @ DataType::List(_)) if matches!(value, ScalarValue::Utf8(Some(_))) => {
                let ScalarValue::Utf8(Some(text)) = &value else {
                    unreachable!("matched above")
                };
                let elements = postgres_array_elements(text).ok_or_else(|| {
                    cannot_convert(i, &value, &target, "write an array as {a,b,…}")
                })?;
                let elements: Vec<ScalarValue> =
                    elements.into_iter().map(ScalarValue::Utf8).collect();
                ScalarValue::List(ScalarValue::new_list_nullable(&elements, &DataType::Utf8))
                    .cast_to(&target)
                    .map_err(|e| cannot_convert(i, &value, &target, e))
            }
            Some(target) if target != value.data_type() => value
                .cast_to(&target)
                .map_err(|e| cannot_convert(i, &value, &target, e)),
            _ => Ok(value),
        })
        .collect::<Result<Vec<_>>>()?;
    plan.with_param_values(params).map_err(df)
}

/// Parameter `$i+1` could not be taken as the type its placeholder has.
fn cannot_convert(
    i: usize,
    value: &ScalarValue,
    target: &DataType,
    why: impl std::fmt::Display,
) -> Error {
    // A parameter can be megabytes long, and DataFusion's cast errors quote it in full: the
    // message names it by its start, so a hostile Bind cannot make sluice echo it back.
    Error::new(
        ErrorCode::CannotConvertType,
        format!(
            "parameter ${} ({}) cannot be taken as {target}: {}",
            i + 1,
            clipped(&value.to_string(), 60),
            clipped(&why.to_string(), 200),
        ),
    )
    .with_sqlstate("22P02")
}

/// `text` cut to its first `limit` characters, with an ellipsis and the length when cut.
fn clipped(text: &str, limit: usize) -> String {
    let cut = sluice_sql::first_chars(text, limit);
    if cut.len() == text.len() {
        return text.to_string();
    }
    format!("{cut}… ({} characters)", text.chars().count())
}

impl SessionInner {
    /// A statement whose kept physical plan is tiny (see [`tiny`]) runs where it is asked
    /// for: planning it is a reset copy, running it is bounded by a few rows in memory, and
    /// the round trip to the engine's threads would cost more than the statement (`SELECT 1`
    /// over pgbench: ~20% of throughput). `None`: not such a statement (or the session is
    /// busy), for the engine's threads.
    fn run_tiny(&self, sql: &str) -> Result<Option<QueryOutput>> {
        use datafusion::physical_plan::execution_plan::reset_plan_states;
        let Ok(planning) = self.planning.try_lock() else {
            return Ok(None);
        };
        let generation = self.generation.load(Ordering::SeqCst);
        let Some(cached) = planning.cached(sql, generation).filter(|c| c.tiny) else {
            return Ok(None);
        };
        let Some(kept) = cached.physical.clone() else {
            return Ok(None);
        };
        let schema = cached.columns.clone();
        if let Some(rows) = &cached.rows {
            return Ok(Some(QueryOutput::Rows {
                schema,
                batches: collected(rows.clone()),
            }));
        }
        let task = planning.task.clone();
        drop(planning);
        let run = || -> Result<datafusion::execution::SendableRecordBatchStream> {
            let physical = reset_plan_states(kept.clone()).map_err(df)?;
            datafusion::physical_plan::execute_stream(physical, task.clone()).map_err(df)
        };
        if crate::cache::constant(&kept) {
            // Constant rows are ready at once: the first run's are kept for the next.
            let first = futures::FutureExt::now_or_never(
                datafusion::physical_plan::common::collect(run()?),
            );
            if let Some(rows) = first {
                let rows = rows.map_err(df)?;
                if let Ok(mut planning) = self.planning.try_lock() {
                    if let Some(c) = planning.cached_mut(sql, generation) {
                        c.rows = Some(rows.clone());
                    }
                }
                return Ok(Some(QueryOutput::Rows {
                    schema,
                    batches: collected(rows),
                }));
            }
        }
        let stream = run()?;
        Ok(Some(QueryOutput::Rows {
            schema,
            batches: Box::pin(stream.map(|b| b.map_err(df))),
        }))
    }

    /// The columns of a cached statement, without planning (drivers Describe before every
    /// Execute); `None` when it is not cached.
    fn cached_columns(&self, sql: &str) -> Option<Option<SchemaRef>> {
        let planning = self.planning.try_lock().ok()?;
        self.cached_columns_in(&planning, sql)
    }

    /// A cached statement's columns, from the planning state already locked.
    fn cached_columns_in(&self, planning: &Planning, sql: &str) -> Option<Option<SchemaRef>> {
        let c = planning.cached(sql, self.generation.load(Ordering::SeqCst))?;
        Some((!c.columns.fields().is_empty()).then(|| c.columns.clone()))
    }

    /// Plans one statement and starts it: a query's stream of batches, or a command applied
    /// to completion.
    async fn start(
        &self,
        sql: &str,
        options: ExecuteOptions,
        params: Vec<ScalarValue>,
    ) -> Result<Started> {
        let generation = self.generation.load(Ordering::SeqCst);
        // Planned under the session's lock; run after it is released.
        let (schema, next, prepares) = {
            let mut planning = self.planning.lock().await;
            // A statement's own max_threads or IO gate: a one-off planning state, the
            // session's untouched.
            let parallelism = options
                .target_partitions
                .filter(|&n| n > 0 && n != planning.target_partitions());
            let own_runtime = options.io.is_some() || options.memory.is_some();
            let mut one_off = (parallelism.is_some() || own_runtime).then(|| {
                let mut state = self.ctx.state();
                if let Some(n) = parallelism {
                    state.config_mut().options_mut().execution.target_partitions = n;
                }
                if own_runtime {
                    let mut env = (**state.runtime_env()).clone();
                    if let Some(gate) = options.io.clone() {
                        env.object_store_registry =
                            crate::io::gated_registry(env.object_store_registry.clone(), gate);
                    }
                    if let Some(charge) = options.memory.clone() {
                        env.memory_pool = Arc::new(crate::memory::ChargedPool::new(
                            env.memory_pool.clone(),
                            charge,
                        ));
                    }
                    state = SessionStateBuilder::new_from_existing(state)
                        .with_runtime_env(Arc::new(env))
                        .build();
                }
                Planning::of(&state)
            });
            // The optimized logical plan does not depend on parallelism, so the session's
            // cache serves every statement; a kept physical plan was made for the session's
            // parallelism and serves only a statement that runs at it.
            let use_cache = params.is_empty();
            let cached = use_cache
                .then(|| planning.cached(sql, generation))
                .flatten()
                .map(|c| (c.plan.clone(), c.columns.clone(), c.physical.clone()));
            let from_cache = cached.is_some();
            let (cached, kept_physical) = match cached {
                Some((plan, columns, physical)) => (
                    Some((plan, columns)),
                    physical.filter(|_| one_off.is_none()),
                ),
                None => (None, None),
            };
            let keeps_physical = use_cache && one_off.is_none();
            let active = match one_off.as_mut() {
                Some(p) => p,
                None => &mut *planning,
            };
            active.state.mark_start_execution();
            let mut to_remember = None;
            let mut prepares = None;
            let (plan, names, schema) = match cached {
                Some((plan, columns)) => (plan, None, columns),
                None => {
                    let arguments = match params.is_empty() {
                        true => TableArguments::Leave,
                        false => TableArguments::Bound(&params),
                    };
                    let Planned {
                        plan,
                        names,
                        replanned,
                        ..
                    } = plan(&active.state, sql, arguments).await?;
                    let mut plan = if params.is_empty() {
                        plan
                    } else {
                        bind(plan, params)?
                    };
                    // What sluice keeps of a PREPARE, once it is applied; a DEALLOCATE's
                    // statement forgotten.
                    match &mut plan {
                        LogicalPlan::Statement(Statement::Prepare(p)) => {
                            // Said before DataFusion's own checks, which count the declared
                            // types first and answer a name taken with a count's error.
                            if self
                                .prepared
                                .lock()
                                .expect("prepared statements")
                                .contains_key(&p.name)
                            {
                                return Err(df(DataFusionError::Execution(format!(
                                    "Prepared statement '{}' already exists",
                                    p.name
                                ))));
                            }
                            let replanned = match replanned {
                                Some((text, highest)) => {
                                    // Its declared types are sluice's to cast to: DataFusion
                                    // would count them against the placeholders its plan
                                    // still has (none where a table function took them).
                                    let types: Vec<DataType> = std::mem::take(&mut p.fields)
                                        .iter()
                                        .map(|f| f.data_type().clone())
                                        .collect();
                                    let elsewhere = parameter_types(&p.input)?.len();
                                    Some(Replanned {
                                        text,
                                        values: types.len().max(highest).max(elsewhere),
                                        types,
                                    })
                                }
                                None => None,
                            };
                            let prepared = Prepared {
                                names: names.clone(),
                                replanned,
                            };
                            prepares = Some((p.name.clone(), Some(prepared)));
                        }
                        LogicalPlan::Statement(Statement::Deallocate(d)) => {
                            prepares = Some((d.name.clone(), None));
                        }
                        _ => {}
                    }
                    let (plan, names) = self.prepared_in_place(&active.state, plan, names).await?;
                    let schema = postgres_names(plan.schema().as_arrow(), names.clone());
                    (plan, names, schema)
                }
            };
            let next = if !is_plain_query(&plan) {
                let writes = matches!(plan, LogicalPlan::Copy(_) | LogicalPlan::Dml(_));
                let state = one_off
                    .as_ref()
                    .filter(|_| writes)
                    .map(|p| Box::new(p.state.clone()));
                Next::Apply(plan, state)
            } else {
                let optimized = if from_cache {
                    plan
                } else {
                    let optimized = active.state.optimize(&plan).map_err(df)?;
                    if use_cache && cacheable(&plan) {
                        if keeps_physical {
                            active.remember(sql, generation, optimized.clone(), names);
                        } else {
                            to_remember = Some((optimized.clone(), names));
                        }
                    }
                    optimized
                };
                use datafusion::physical_plan::execution_plan::reset_plan_states;
                let physical = match kept_physical {
                    Some(kept) => reset_plan_states(kept).map_err(df)?,
                    None => {
                        let planner = active.state.query_planner().clone();
                        let physical = planner
                            .create_physical_plan(&optimized, &active.state)
                            .await
                            .map_err(df)?;
                        match active.cached_mut(sql, generation) {
                            Some(entry) if keeps_physical && reusable(&physical) => {
                                entry.tiny = tiny(&physical);
                                entry.physical = Some(physical.clone());
                                reset_plan_states(physical).map_err(df)?
                            }
                            _ => physical,
                        }
                    }
                };
                // A leased statement is preempted between the batches of its leaves.
                let physical = match options.cpu.clone() {
                    Some(lease) => crate::cpu::leased(physical, lease).map_err(df)?,
                    None => physical,
                };
                Next::Run(physical, active.task.clone())
            };
            // Planned at a statement's own parallelism: its logical plan goes to the session.
            if let Some((optimized, names)) = to_remember {
                planning.remember(sql, generation, optimized, names);
            }
            (schema, next, prepares)
        };
        match next {
            Next::Run(physical, task) => {
                let stream =
                    datafusion::physical_plan::execute_stream(physical, task).map_err(df)?;
                if schema.fields().is_empty() {
                    // Nothing to show (an empty projection): run it, answer with a tag.
                    let batches: Vec<RecordBatch> = stream
                        .collect::<Vec<_>>()
                        .await
                        .into_iter()
                        .collect::<std::result::Result<_, _>>()
                        .map_err(df)?;
                    return Ok(Started::Done(QueryOutput::Command {
                        tag: "SELECT".into(),
                        rows: Some(batches.iter().map(|b| b.num_rows()).sum()),
                    }));
                }
                Ok(Started::Rows(schema, stream))
            }
            Next::Apply(plan, one_off) => {
                let answer = answer(&plan, sql);
                // Bumped before and after: a plan cached while this runs is retired too.
                self.generation.fetch_add(1, Ordering::SeqCst);
                let batches = match one_off {
                    Some(state) => DataFrame::new(*state, plan).collect().await,
                    None => match self.ctx.execute_logical_plan(plan).await {
                        Ok(frame) => frame.collect().await,
                        Err(e) => Err(e),
                    },
                };
                self.generation.fetch_add(1, Ordering::SeqCst);
                // SET and DDL may have changed the session: plan with what it is now.
                *self.planning.lock().await = Planning::of(&self.ctx.state());
                let batches = batches.map_err(df)?;
                if let Some((name, prepared)) = prepares {
                    let mut kept = self.prepared.lock().expect("prepared statements");
                    match prepared {
                        Some(prepared) => kept.insert(name, prepared),
                        None => kept.remove(&name),
                    };
                }
                Ok(Started::Done(match answer {
                    Answer::Tag(tag, counted) => QueryOutput::Command {
                        rows: counted.then(|| count(&batches)),
                        tag,
                    },
                    Answer::Rows => QueryOutput::Rows {
                        schema,
                        batches: collected(batches),
                    },
                }))
            }
        }
    }

    /// `EXECUTE name(…)` (SQL's, not the protocol's): the statement prepared as `name`, its
    /// values bound, in its place — so that it runs, is described and answers as that statement
    /// does (its rows and `SELECT n`, a write's count), as PostgreSQL's EXECUTE does. Left to
    /// DataFusion's own handling, it ran and answered an empty "EXECUTE", its rows dropped.
    /// Any other plan is returned as it is.
    /// `names` are the Postgres names of the plan's columns; an EXECUTE's are those of the
    /// statement PREPARE was given (`?column?`, `count`, not DataFusion's).
    async fn prepared_in_place(
        &self,
        state: &SessionState,
        plan: LogicalPlan,
        names: Names,
    ) -> Result<(LogicalPlan, Names)> {
        let LogicalPlan::Statement(Statement::Execute(execute)) = &plan else {
            return Ok((plan, names));
        };
        let kept = self
            .prepared
            .lock()
            .expect("prepared statements")
            .get(&execute.name)
            .cloned();
        let Some(Prepared {
            replanned: Some(replanned),
            ..
        }) = kept
        else {
            // DataFusion binds the values into the prepared plan (casting them to the types
            // PREPARE declared) and runs nothing until the frame is collected.
            let frame = self.ctx.execute_logical_plan(plan).await.map_err(df)?;
            return Ok((frame.into_unoptimized_plan(), kept.and_then(|k| k.names)));
        };
        // Planned again with its values, read as DataFusion reads them.
        if execute.parameters.len() != replanned.values {
            return Err(df(DataFusionError::Execution(format!(
                "Prepared statement '{}' expects {} parameters, but {} provided",
                execute.name,
                replanned.values,
                execute.parameters.len()
            ))));
        }
        let values = execute_values(state, &execute.parameters, &replanned.types)?;
        let planned = Box::pin(crate::embedded::plan(
            state,
            &replanned.text,
            TableArguments::Bound(&values),
        ))
        .await?;
        Ok((bind(planned.plan, values)?, planned.names))
    }

    /// The result columns of a statement, planned but not run (DDL is not executed); `None`
    /// for a statement that returns no rows.
    async fn describe(&self, sql: &str) -> Result<Option<SchemaRef>> {
        let planning = self.planning.lock().await;
        if let Some(columns) = self.cached_columns_in(&planning, sql) {
            return Ok(columns);
        }
        let Planned { plan, names, .. } = plan(&planning.state, sql, TableArguments::Typed).await?;
        let (plan, names) = self.prepared_in_place(&planning.state, plan, names).await?;
        if !matches!(answer(&plan, sql), Answer::Rows) {
            return Ok(None);
        }
        Ok(row_columns(plan.schema().as_arrow(), names))
    }
}

/// The Postgres-named columns of a result; `None` when it has none.
fn row_columns(
    schema: &datafusion::arrow::datatypes::Schema,
    names: Option<Vec<Option<String>>>,
) -> Option<SchemaRef> {
    let schema = postgres_names(schema, names);
    (!schema.fields().is_empty()).then_some(schema)
}

/// Batches already complete, as a stream.
pub fn collected(batches: Vec<RecordBatch>) -> BatchStream {
    Box::pin(futures::stream::iter(batches.into_iter().map(Ok)))
}

/// A statement planned, with the Postgres names of its result columns.
struct Planned {
    plan: LogicalPlan,
    names: Option<Vec<Option<String>>>,
    /// Placeholders written into table functions' arguments, by number, with the type each
    /// is announced as ([`crate::compat::table_function_placeholders`]).
    written_in: Vec<(usize, Option<DataType>)>,
    /// A SQL `PREPARE` whose table functions take placeholders: its statement's text, planned
    /// again by each `EXECUTE` with the values ([`Prepared::replanned`]), and the highest of
    /// those placeholders.
    replanned: Option<(String, usize)>,
}

/// Parses and plans one statement; `arguments` says what becomes of placeholders among a
/// table function's arguments.
async fn plan(
    state: &SessionState,
    sql: &str,
    arguments: crate::compat::TableArguments<'_>,
) -> Result<Planned> {
    let read = |state: &SessionState, sql: &str| {
        crate::compat::check_tokens(sql)?;
        let dialect = state.config().options().sql_parser.dialect;
        state.sql_to_statement(sql, &dialect).map_err(df)
    };
    // A text of megabytes is read on a blocking thread, not on the connection thread every
    // client of it shares.
    let mut statement = if sql.len() > sluice_sql::lexer::READ_APART_BYTES {
        let (state, text) = (state.clone(), sql.to_string());
        Box::pin(tokio::task::spawn_blocking(move || read(&state, &text)))
            .await
            .map_err(|e| Error::new(ErrorCode::InternalError, e.to_string()))??
    } else {
        read(state, sql)?
    };
    crate::compat::check_size(&statement)?;
    // A PREPARE's text as written, before the rewrites below.
    let prepared_text = sql
        .contains('$')
        .then(|| crate::compat::prepared_text(&statement))
        .flatten();
    if let datafusion::sql::parser::Statement::Statement(inner) = &mut statement {
        postgres_series(inner);
    }
    let written_in = if sql.contains('$') {
        crate::compat::table_function_placeholders(&mut statement, arguments)
    } else {
        Vec::new()
    };
    // A PREPARE's placeholders are its EXECUTE's to bind, not the protocol's.
    let (written_in, replanned) = match prepared_text {
        Some(text) => {
            let highest = written_in.iter().map(|(n, _)| *n).max();
            (Vec::new(), highest.map(|highest| (text, highest)))
        }
        None => (written_in, None),
    };
    // Named before the catalog rewrites, which alias and replace items Postgres names by
    // what the client wrote.
    let names = column_names(&statement);
    if let datafusion::sql::parser::Statement::Statement(inner) = &mut statement {
        crate::pg_catalog::postgres_catalog(inner);
    }
    let plan = state.statement_to_plan(statement).await.map_err(df)?;
    // Only a statement with placeholders has any to type: no walk of the plan otherwise.
    let plan = if sql.contains('$') {
        array_placeholders(plan).map_err(df)?
    } else {
        plan
    };
    Ok(Planned {
        plan,
        names,
        written_in,
        replanned,
    })
}

//! # sluice-engine: where queries run
//!
//! Owns the embedded Apache DataFusion engine (the default): one [`Session`] per client
//! connection, all sharing one set of catalogs (a table one client creates, the others see) but
//! each with its own settings, so nothing a client `SET`s leaks to another. It adds what
//! Postgres clients expect and DataFusion lacks (`pg_sleep`). The upstream-Postgres engine comes
//! later behind the same calls.
//!
//! Invariants:
//! - A statement's results are complete before [`Session::execute`] returns, so dropping the
//!   returned future (a cancelled query) stops the work and holds nothing.
//! - `target_partitions` given to a statement applies to that statement only.
//! - A cached plan is never used after anything that could change it: each session keeps
//!   optimized plans of plain queries (immutable functions only, no placeholders) tagged with
//!   an engine-wide generation that every DDL, SET, DML and system-table refresh bumps.
//!   A physical plan is kept beside it only when it reads nothing but memory tables (which
//!   change only by DML, so a kept plan is never older than the data) through nodes that
//!   [`reset_plan_states`](datafusion::physical_plan::execution_plan::reset_plan_states)
//!   makes new again; each run executes a reset copy, never the kept plan. Files are
//!   planned, and so listed, on every run.
//!
//! It decides no policy: admission and limits are the server's and the scheduler's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, StringArray};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::execution::context::SessionContext;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::async_udf::{AsyncScalarUDF, AsyncScalarUDFImpl};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionConfig;

pub use datafusion;
pub use datafusion::error::DataFusionError;

/// What a statement produced.
#[derive(Debug)]
pub enum QueryOutput {
    /// Rows (a query).
    Rows {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    /// A command, with the Postgres command tag and the rows it affected when that applies.
    Command { tag: String, rows: Option<usize> },
}

/// The embedded engine: shared catalogs, and a template for sessions.
#[derive(Clone)]
pub struct Engine {
    base: SessionContext,
    /// Bumped by anything that may change what a statement plans to: DDL, SET, DML in any
    /// session, and system-table refreshes. Cached plans of an older generation are dropped.
    generation: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new()
    }
}

impl Engine {
    pub fn new() -> Self {
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema("datafusion", "public");
        let base = SessionContext::new_with_config(config);
        base.register_udf(AsyncScalarUDF::new(Arc::new(PgSleep::new())).into_scalar_udf());
        Engine {
            base,
            generation: Arc::default(),
        }
    }

    /// A new session: shares the catalogs (tables), owns its settings.
    pub fn session(&self) -> Session {
        let state = SessionStateBuilder::new_from_existing(self.base.state()).build();
        Session {
            generation: self.generation.clone(),
            planning: tokio::sync::Mutex::new(Planning::of(&state)),
            ctx: SessionContext::new_with_state(state),
        }
    }

    /// Registers (or replaces) a table of the given batches in schema `schema` of the shared
    /// catalog: how the server publishes `system.*`.
    pub fn set_table(
        &self,
        schema: &str,
        name: &str,
        batch: RecordBatch,
    ) -> Result<(), DataFusionError> {
        use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
        use datafusion::datasource::MemTable;
        let catalog = self
            .base
            .catalog("datafusion")
            .ok_or_else(|| DataFusionError::Internal("no default catalog".into()))?;
        let provider = match catalog.schema(schema) {
            Some(p) => p,
            None => {
                let p: Arc<dyn SchemaProvider> = Arc::new(MemorySchemaProvider::new());
                catalog.register_schema(schema, p.clone())?;
                p
            }
        };
        let table = MemTable::try_new(batch.schema(), vec![vec![batch]])?;
        provider.deregister_table(name)?;
        provider.register_table(name.to_string(), Arc::new(table))?;
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// One client's session.
pub struct Session {
    ctx: SessionContext,
    /// A copy of the session's state kept for planning queries, and the task context derived
    /// from it: `SessionContext::state()` clones every function registry, which was most of
    /// the cost of a small query. Refreshed after any statement that may change the session
    /// (SET, DDL); tables live in the shared catalogs, so new ones are seen without refresh.
    /// A connection runs one statement at a time, so the lock is never contended.
    planning: tokio::sync::Mutex<Planning>,
    generation: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

struct Planning {
    state: datafusion::execution::session_state::SessionState,
    task: Arc<datafusion::execution::TaskContext>,
    /// Optimized plans of plain queries by statement text (see [`cacheable`]).
    cache: HashMap<String, CachedPlan>,
}

struct CachedPlan {
    generation: u64,
    plan: datafusion::logical_expr::LogicalPlan,
    names: Option<Vec<Option<String>>>,
    /// The physical plan too, when every node of it can run again after a reset (see
    /// [`reusable`]). Never executed itself: each run gets a reset copy.
    physical: Option<Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
}

/// Plans kept per session; past this many the cache starts afresh.
const PLAN_CACHE_ENTRIES: usize = 256;

impl Planning {
    fn of(state: &datafusion::execution::session_state::SessionState) -> Planning {
        Planning {
            state: state.clone(),
            task: state.task_ctx(),
            cache: HashMap::new(),
        }
    }

    fn target_partitions(&self) -> usize {
        self.state.config().options().execution.target_partitions
    }

    /// The cached plan of `sql`, unless something changed since it was made.
    fn cached(&self, sql: &str, generation: u64) -> Option<&CachedPlan> {
        self.cache.get(sql).filter(|c| c.generation == generation)
    }

    fn remember(
        &mut self,
        sql: &str,
        generation: u64,
        plan: datafusion::logical_expr::LogicalPlan,
        names: Option<Vec<Option<String>>>,
    ) {
        // Plans of an older generation are never used again; they may hold whole tables.
        self.cache.retain(|_, c| c.generation == generation);
        if self.cache.len() >= PLAN_CACHE_ENTRIES {
            self.cache.clear();
        }
        let cached = CachedPlan {
            generation,
            plan,
            names,
            physical: None,
        };
        self.cache.insert(sql.to_string(), cached);
    }
}

/// What a planned statement does next: run its physical plan, or be applied by the
/// `SessionContext` (DDL, SET, DML).
enum Next {
    Run(
        Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        Arc<datafusion::execution::TaskContext>,
    ),
    Apply(datafusion::logical_expr::LogicalPlan),
}

/// Whether an optimized plan may be reused for the same text: no placeholders, and only
/// immutable functions (the optimizer folds `now()` and friends into constants, so a plan
/// with a stable or volatile function is only right for the moment it was made).
fn cacheable(plan: &datafusion::logical_expr::LogicalPlan) -> bool {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::{Expr, LogicalPlan as P};
    if matches!(plan, P::Explain(_) | P::Analyze(_)) {
        return false;
    }
    let mut ok = true;
    let _ = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                let fixed = match e {
                    Expr::Placeholder(_) => false,
                    Expr::ScalarFunction(f) => {
                        f.func.signature().volatility == Volatility::Immutable
                    }
                    _ => true,
                };
                if !fixed {
                    ok = false;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(if ok {
            TreeNodeRecursion::Continue
        } else {
            TreeNodeRecursion::Stop
        })
    });
    ok
}

/// Whether a physical plan can be kept and run again after
/// [`reset_plan_states`](datafusion::physical_plan::execution_plan::reset_plan_states): only
/// nodes whose every run starts afresh from a reset copy. Scans of files are left out (the
/// files on disk may change between runs; a memory table cannot without a DML that bumps the
/// generation), and so are joins and anything with dynamic filters (a reset does not reach
/// the copies of a filter pushed into other nodes).
fn reusable(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> bool {
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::physical_plan as pp;
    let node: &dyn pp::ExecutionPlan = plan.as_ref();
    #[allow(deprecated)]
    let known = node
        .downcast_ref::<pp::projection::ProjectionExec>()
        .is_some()
        || node
            .downcast_ref::<pp::placeholder_row::PlaceholderRowExec>()
            .is_some()
        || node.downcast_ref::<pp::empty::EmptyExec>().is_some()
        || node.downcast_ref::<pp::filter::FilterExec>().is_some()
        || node
            .downcast_ref::<pp::coalesce_batches::CoalesceBatchesExec>()
            .is_some()
        || node
            .downcast_ref::<pp::coalesce_partitions::CoalescePartitionsExec>()
            .is_some()
        || node.downcast_ref::<pp::limit::GlobalLimitExec>().is_some()
        || node.downcast_ref::<pp::limit::LocalLimitExec>().is_some()
        || node
            .downcast_ref::<pp::repartition::RepartitionExec>()
            .is_some()
        || node
            .downcast_ref::<pp::sorts::sort_preserving_merge::SortPreservingMergeExec>()
            .is_some()
        || node.downcast_ref::<pp::union::UnionExec>().is_some()
        || node.downcast_ref::<pp::memory::LazyMemoryExec>().is_some()
        || node.downcast_ref::<pp::coop::CooperativeExec>().is_some()
        || node
            .downcast_ref::<pp::aggregates::AggregateExec>()
            .is_some()
        || node.downcast_ref::<pp::sorts::sort::SortExec>().is_some();
    let ok = (known
        || node.downcast_ref::<DataSourceExec>().is_some_and(|d| {
            d.data_source()
                .downcast_ref::<MemorySourceConfig>()
                .is_some()
        }))
        && node.dynamic_expressions_produced().is_empty();
    ok && plan.children().into_iter().all(reusable)
}

/// Statements whose first keyword says they answer with rows.
fn is_rows(kind: &str) -> bool {
    matches!(
        kind,
        "SELECT" | "WITH" | "VALUES" | "SHOW" | "EXPLAIN" | "DESCRIBE" | "TABLE"
    )
}

/// Plans that change nothing but produce rows: run straight from the planning state. Others
/// (DDL, SET, DML, COPY) go through the `SessionContext`, which knows how to apply them.
fn is_plain_query(plan: &datafusion::logical_expr::LogicalPlan) -> bool {
    use datafusion::logical_expr::LogicalPlan as P;
    !matches!(
        plan,
        P::Ddl(_) | P::Statement(_) | P::Dml(_) | P::Copy(_) | P::DescribeTable(_)
    )
}

impl Session {
    /// Plans and runs one statement to completion. `target_partitions` (the query's
    /// parallelism) applies to this statement only.
    pub async fn execute(
        &self,
        sql: &str,
        target_partitions: Option<usize>,
        params: Vec<ScalarValue>,
    ) -> Result<QueryOutput, DataFusionError> {
        let kind = first_keyword(sql);
        let generation = self.generation.load(std::sync::atomic::Ordering::SeqCst);
        // Planned under the session's lock; run after it is released.
        let (schema, next) = {
            let mut planning = self.planning.lock().await;
            // A statement's own max_threads: a one-off planning state, the session's untouched.
            let mut one_off = target_partitions
                .filter(|&n| n > 0 && n != planning.target_partitions())
                .map(|n| {
                    let mut state = self.ctx.state();
                    state.config_mut().options_mut().execution.target_partitions = n;
                    Planning::of(&state)
                });
            let use_cache = params.is_empty() && one_off.is_none();
            let active = match one_off.as_mut() {
                Some(p) => p,
                None => &mut *planning,
            };
            active.state.mark_start_execution();
            let cached = use_cache
                .then(|| active.cached(sql, generation))
                .flatten()
                .map(|c| (c.plan.clone(), c.names.clone(), c.physical.clone()));
            let from_cache = cached.is_some();
            let (cached, kept_physical) = match cached {
                Some((plan, names, physical)) => (Some((plan, names)), physical),
                None => (None, None),
            };
            let (plan, names) = match cached {
                Some(hit) => hit,
                None => {
                    let (plan, names) = plan(&active.state, sql).await?;
                    if params.is_empty() {
                        (plan, names)
                    } else {
                        (plan.with_param_values(params)?, names)
                    }
                }
            };
            let schema = postgres_names(plan.schema().as_arrow(), names.clone());
            let next = if !is_plain_query(&plan) {
                Next::Apply(plan)
            } else {
                let optimized = if from_cache {
                    plan
                } else {
                    let optimized = active.state.optimize(&plan)?;
                    if use_cache && is_rows(&kind) && cacheable(&plan) {
                        active.remember(sql, generation, optimized.clone(), names);
                    }
                    optimized
                };
                use datafusion::physical_plan::execution_plan::reset_plan_states;
                let physical = match kept_physical {
                    Some(kept) => reset_plan_states(kept)?,
                    None => {
                        let planner = active.state.query_planner().clone();
                        let physical = planner
                            .create_physical_plan(&optimized, &active.state)
                            .await?;
                        match active.cache.get_mut(sql) {
                            Some(entry)
                                if use_cache
                                    && entry.generation == generation
                                    && reusable(&physical) =>
                            {
                                entry.physical = Some(physical.clone());
                                reset_plan_states(physical)?
                            }
                            _ => physical,
                        }
                    }
                };
                Next::Run(physical, active.task.clone())
            };
            (schema, next)
        };
        let batches = match next {
            Next::Run(physical, task) => datafusion::physical_plan::collect(physical, task).await?,
            Next::Apply(plan) => {
                // Bumped before and after: a plan cached while this runs is retired too.
                self.generation
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let batches = self.ctx.execute_logical_plan(plan).await?.collect().await;
                self.generation
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // SET and DDL may have changed the session: plan with what it is now.
                *self.planning.lock().await = Planning::of(&self.ctx.state());
                batches?
            }
        };
        Ok(match kind.as_str() {
            k if is_rows(k) => QueryOutput::Rows { schema, batches },
            "INSERT" => QueryOutput::Command {
                tag: "INSERT 0".into(),
                rows: Some(count(&batches)),
            },
            "UPDATE" | "DELETE" => QueryOutput::Command {
                tag: kind.clone(),
                rows: Some(count(&batches)),
            },
            "CREATE" | "DROP" => QueryOutput::Command {
                tag: command_tag(sql),
                rows: None,
            },
            "SET" => QueryOutput::Command {
                tag: "SET".into(),
                rows: None,
            },
            _ if !batches.is_empty() && !schema.fields().is_empty() => {
                QueryOutput::Rows { schema, batches }
            }
            _ => QueryOutput::Command {
                tag: kind,
                rows: None,
            },
        })
    }
}

impl Session {
    /// The result columns of a statement, planned but not run (DDL is not executed); `None`
    /// for a statement that returns no rows.
    pub async fn describe(&self, sql: &str) -> Result<Option<SchemaRef>, DataFusionError> {
        let planning = self.planning.lock().await;
        let generation = self.generation.load(std::sync::atomic::Ordering::SeqCst);
        if let Some(c) = planning.cached(sql, generation) {
            // A cached plan's columns are the statement's (drivers Describe before each run).
            let schema = postgres_names(c.plan.schema().as_arrow(), c.names.clone());
            return Ok((!schema.fields().is_empty()).then_some(schema));
        }
        let (plan, names) = plan(&planning.state, sql).await?;
        let schema = postgres_names(plan.schema().as_arrow(), names);
        Ok((!schema.fields().is_empty()).then_some(schema))
    }

    /// The types of a statement's placeholders `$1`, `$2`, … in order, as far as the planner
    /// can infer them (`None`: not inferable, e.g. a bare `SELECT $1`).
    pub async fn parameter_types(
        &self,
        sql: &str,
    ) -> Result<Vec<Option<DataType>>, DataFusionError> {
        let plan = self
            .planning
            .lock()
            .await
            .state
            .create_logical_plan(sql)
            .await?;
        let mut by_index: Vec<(usize, Option<DataType>)> = plan
            .get_parameter_types()?
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
}

/// Parses and plans one statement; also returns the Postgres names of its result columns.
async fn plan(
    state: &datafusion::execution::session_state::SessionState,
    sql: &str,
) -> Result<
    (
        datafusion::logical_expr::LogicalPlan,
        Option<Vec<Option<String>>>,
    ),
    DataFusionError,
> {
    let dialect = state.config().options().sql_parser.dialect;
    let mut statement = state.sql_to_statement(sql, &dialect)?;
    if let datafusion::sql::parser::Statement::Statement(inner) = &mut statement {
        postgres_series(inner);
    }
    let names = column_names(&statement);
    Ok((state.statement_to_plan(statement).await?, names))
}

/// `generate_series` as Postgres has it, where DataFusion differs: in a select list it is a
/// set-returning function (one row per value; DataFusion's returns one list), so it is
/// unnested there; in `FROM` its column is named after the function or the table alias
/// (DataFusion calls it `value`). Applied to every query in the statement (subqueries,
/// CTEs, `CREATE TABLE … AS`, `INSERT … SELECT`).
fn postgres_series(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{Query, VisitMut, VisitorMut};
    use std::ops::ControlFlow;
    struct Series;
    impl VisitorMut for Series {
        type Break = ();
        fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
            set_returning_series(query);
            ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Series);
}

/// [`postgres_series`] for one query's own select lists and `FROM` clauses (its subqueries
/// are queries of their own).
fn set_returning_series(query: &mut datafusion::sql::sqlparser::ast::Query) {
    use datafusion::sql::sqlparser::ast::{
        Expr, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, Ident,
        ObjectName, SelectItem, SetExpr, TableAlias, TableAliasColumnDef, TableFactor,
    };
    fn is_series(name: &ObjectName) -> bool {
        name.0.last().and_then(|p| p.as_ident()).is_some_and(|i| {
            i.quote_style.is_none() && i.value.eq_ignore_ascii_case("generate_series")
        })
    }
    fn unnest(expr: &mut Expr) -> bool {
        let Expr::Function(f) = expr else {
            return false;
        };
        if !is_series(&f.name) {
            return false;
        }
        let mut wrapper = f.clone();
        wrapper.name = ObjectName::from(vec![Ident::new("unnest")]);
        wrapper.args = FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(expr.clone()))],
            clauses: vec![],
        });
        *expr = Expr::Function(wrapper);
        true
    }
    fn relation(factor: &mut TableFactor) {
        match factor {
            TableFactor::Table {
                name,
                alias,
                args: Some(_),
                with_ordinality: false,
                ..
            } if is_series(name) => {
                let alias = alias.get_or_insert_with(|| TableAlias {
                    explicit: true,
                    name: Ident::new("generate_series"),
                    columns: vec![],
                    at: None,
                });
                if alias.columns.is_empty() {
                    alias.columns = vec![TableAliasColumnDef::from_name(alias.name.value.clone())];
                }
            }
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => {
                relation(&mut table_with_joins.relation);
                for join in &mut table_with_joins.joins {
                    relation(&mut join.relation);
                }
            }
            _ => {}
        }
    }
    fn body(set: &mut SetExpr) {
        match set {
            SetExpr::Select(select) => {
                for item in &mut select.projection {
                    let unnamed = match item {
                        SelectItem::UnnamedExpr(expr) => unnest(expr).then(|| expr.clone()),
                        SelectItem::ExprWithAlias { expr, .. } => {
                            unnest(expr);
                            None
                        }
                        _ => None,
                    };
                    // Postgres names the column after the function.
                    if let Some(expr) = unnamed {
                        *item = SelectItem::ExprWithAlias {
                            expr,
                            alias: Ident::new("generate_series"),
                        };
                    }
                }
                for from in &mut select.from {
                    relation(&mut from.relation);
                    for join in &mut from.joins {
                        relation(&mut join.relation);
                    }
                }
            }
            SetExpr::SetOperation { left, right, .. } => {
                body(left);
                body(right);
            }
            _ => {}
        }
    }
    body(&mut query.body);
}

/// What Postgres would call each result column of a plain `SELECT` where DataFusion's name is
/// an expression's text: a function's name (`count`), a cast column's name, else `?column?`.
/// `None` for an item DataFusion already names as Postgres does (aliases, columns), and for
/// statements whose columns do not map one to one (wildcards, set operations).
fn column_names(statement: &datafusion::sql::parser::Statement) -> Option<Vec<Option<String>>> {
    use datafusion::sql::sqlparser::ast::{Expr, SelectItem, SetExpr, Statement};
    fn name(expr: &Expr) -> Option<String> {
        match expr {
            Expr::Identifier(_) | Expr::CompoundIdentifier(_) => None,
            Expr::Function(f) => f.name.0.last().map(|p| p.to_string().to_lowercase()),
            Expr::Cast { expr, .. } | Expr::Nested(expr) => match expr.as_ref() {
                Expr::Identifier(i) => Some(i.value.clone()),
                Expr::CompoundIdentifier(parts) => parts.last().map(|i| i.value.clone()),
                inner => name(inner),
            },
            _ => Some("?column?".to_string()),
        }
    }
    let datafusion::sql::parser::Statement::Statement(statement) = statement else {
        return None;
    };
    let Statement::Query(query) = statement.as_ref() else {
        return None;
    };
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    select
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) => Some(name(e)),
            SelectItem::ExprWithAlias { .. } => Some(None),
            _ => None,
        })
        .collect()
}

/// The result schema with the Postgres names of [`column_names`] where they apply.
fn postgres_names(
    schema: &datafusion::arrow::datatypes::Schema,
    names: Option<Vec<Option<String>>>,
) -> SchemaRef {
    match names {
        Some(names) if names.len() == schema.fields().len() => Arc::new(
            datafusion::arrow::datatypes::Schema::new(
                schema
                    .fields()
                    .iter()
                    .zip(names)
                    .map(|(f, n)| match n {
                        Some(n) => Arc::new(f.as_ref().clone().with_name(n)),
                        None => f.clone(),
                    })
                    .collect::<Vec<_>>(),
            )
            .with_metadata(schema.metadata().clone()),
        ),
        _ => Arc::new(schema.clone()),
    }
}

/// Rows counted by a DML statement's result (DataFusion returns one `count` column).
fn count(batches: &[RecordBatch]) -> usize {
    batches
        .iter()
        .filter_map(|b| b.columns().first())
        .filter_map(|c| {
            c.as_any()
                .downcast_ref::<datafusion::arrow::array::UInt64Array>()
                .map(|a| a.iter().flatten().sum::<u64>() as usize)
        })
        .sum()
}

/// The first keyword of a statement, uppercased.
pub fn first_keyword(sql: &str) -> String {
    let mut rest = sql.trim_start();
    // Skip leading comments and parentheses.
    loop {
        if let Some(r) = rest.strip_prefix("--") {
            rest = r
                .split_once('\n')
                .map_or("", |(_, after)| after)
                .trim_start();
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r
                .split_once("*/")
                .map_or("", |(_, after)| after)
                .trim_start();
        } else if let Some(r) = rest.strip_prefix('(') {
            rest = r.trim_start();
        } else {
            break;
        }
    }
    rest.split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase()
}

/// `CREATE TABLE`, `DROP VIEW`, … : the first two words (three for `CREATE EXTERNAL TABLE`).
fn command_tag(sql: &str) -> String {
    let words: Vec<String> = sql
        .split_whitespace()
        .take(4)
        .map(|w| w.to_ascii_uppercase())
        .collect();
    match words.as_slice() {
        [a, b, _, d, ..] if b == "OR" => format!("{a} {d}"),
        [a, b, ..] if b == "EXTERNAL" || b == "UNBOUNDED" => format!("{a} TABLE"),
        [a, b, ..] => format!("{a} {b}"),
        _ => words.join(" "),
    }
}

/// `pg_sleep(seconds)`: sleeps without blocking a thread, returns NULL (Postgres' `void`).
#[derive(Debug, PartialEq, Eq, Hash)]
struct PgSleep {
    signature: Signature,
}

impl PgSleep {
    fn new() -> Self {
        PgSleep {
            signature: Signature::uniform(1, vec![DataType::Float64], Volatility::Volatile),
        }
    }
}

impl ScalarUDFImpl for PgSleep {
    fn name(&self) -> &str {
        "pg_sleep"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _args: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Utf8)
    }
    fn invoke_with_args(
        &self,
        _args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        Err(DataFusionError::Internal(
            "pg_sleep runs asynchronously".into(),
        ))
    }
}

#[async_trait]
impl AsyncScalarUDFImpl for PgSleep {
    async fn invoke_async_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let rows = args.number_rows;
        let seconds: Vec<f64> = match args.args.first() {
            Some(ColumnarValue::Scalar(ScalarValue::Float64(v))) => {
                vec![v.unwrap_or(0.0); rows.max(1)]
            }
            Some(ColumnarValue::Array(a)) => {
                let a = a
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Float64Array>()
                    .ok_or_else(|| DataFusionError::Internal("pg_sleep takes seconds".into()))?;
                a.iter().map(|v| v.unwrap_or(0.0)).collect()
            }
            _ => vec![0.0],
        };
        for s in seconds {
            if s.is_finite() && s > 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(s)).await;
            }
        }
        let nulls: ArrayRef = Arc::new(StringArray::from(vec![None::<&str>; rows]));
        Ok(ColumnarValue::Array(nulls))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sessions_share_tables_not_settings() {
        let engine = Engine::new();
        let a = engine.session();
        let b = engine.session();
        a.execute("CREATE TABLE t (x INT)", None, vec![])
            .await
            .expect("create");
        let out = a
            .execute("INSERT INTO t VALUES (1), (2)", None, vec![])
            .await
            .expect("insert");
        assert!(
            matches!(out, QueryOutput::Command { rows: Some(2), .. }),
            "{out:?}"
        );
        let QueryOutput::Rows { batches, .. } = b
            .execute("SELECT sum(x) FROM t", None, vec![])
            .await
            .expect("select")
        else {
            panic!("rows expected");
        };
        assert_eq!(batches[0].num_rows(), 1);
        a.execute("SET datafusion.execution.batch_size = 7", None, vec![])
            .await
            .expect("set");
        async fn show(s: &Session) -> String {
            match s
                .execute("SHOW datafusion.execution.batch_size", None, vec![])
                .await
                .expect("show")
            {
                QueryOutput::Rows { batches, .. } => format!("{:?}", batches[0].column(1)),
                other => panic!("{other:?}"),
            }
        }
        assert!(show(&a).await.contains('7'));
        assert!(!show(&b).await.contains("\"7\""));
    }

    #[tokio::test]
    async fn result_columns_are_named_as_postgres_names_them() {
        let s = Engine::new().session();
        s.execute("CREATE TABLE n (x INT)", None, vec![])
            .await
            .expect("create");
        let names = |sql: &'static str| {
            let s = &s;
            async move {
                let schema = s.describe(sql).await.expect("plans").expect("rows");
                schema
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(
            names("SELECT 1, x, count(*) AS c, upper('a') FROM n GROUP BY x").await,
            ["?column?", "x", "c", "upper"]
        );
        assert_eq!(names("SELECT CAST(x AS BIGINT) FROM n").await, ["x"]);
        assert_eq!(names("SELECT count(*) FROM n").await, ["count"]);
        assert_eq!(names("SELECT * FROM n").await, ["x"]);
        let out = s.execute("SELECT 1 + 1", None, vec![]).await.expect("runs");
        let QueryOutput::Rows { schema, .. } = out else {
            panic!("rows")
        };
        assert_eq!(schema.field(0).name(), "?column?");
    }

    async fn text(s: &Session, sql: &str) -> String {
        match s.execute(sql, None, vec![]).await.expect(sql) {
            QueryOutput::Rows { batches, .. } => {
                datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                    .expect("formats")
                    .to_string()
            }
            QueryOutput::Command { tag, .. } => tag,
        }
    }

    #[tokio::test]
    async fn cached_plans_never_serve_stale_tables_or_times() {
        let engine = Engine::new();
        let (a, b) = (engine.session(), engine.session());
        text(&a, "CREATE TABLE c (x INT)").await;
        text(&a, "INSERT INTO c VALUES (1)").await;
        let q = "SELECT sum(x) AS s FROM c";
        assert!(text(&a, q).await.contains("| 1 "));
        assert!(a.planning.lock().await.cache.contains_key(q), "cached");
        // New rows, from another session: the cached plan reads the table as it is.
        text(&b, "INSERT INTO c VALUES (41)").await;
        assert!(text(&a, q).await.contains("| 42 "));
        // The table replaced by another with other columns: planned again.
        text(&b, "DROP TABLE c").await;
        text(&b, "CREATE TABLE c (x BIGINT, y INT)").await;
        text(&b, "INSERT INTO c VALUES (7, 0)").await;
        assert!(text(&a, q).await.contains("| 7 "));
        text(&b, "DROP TABLE c").await;
        let e = a.execute(q, None, vec![]).await.expect_err("table gone");
        assert!(e.to_string().contains("not found"), "{e}");
        // Time-dependent queries are never cached (the optimizer folds now()).
        let t = "SELECT now() AS t";
        let first = text(&a, t).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_ne!(text(&a, t).await, first);
        assert!(!a.planning.lock().await.cache.contains_key(t));
    }

    #[tokio::test]
    async fn generate_series_returns_rows_named_as_in_postgres() {
        let s = Engine::new().session();
        async fn shape(s: &Session, sql: &str) -> (Vec<String>, usize) {
            match s.execute(sql, None, vec![]).await.expect(sql) {
                QueryOutput::Rows { schema, batches } => (
                    schema.fields().iter().map(|f| f.name().clone()).collect(),
                    batches.iter().map(|b| b.num_rows()).sum(),
                ),
                QueryOutput::Command { tag, .. } => panic!("{sql}: {tag}"),
            }
        }
        let cases: [(&str, &[&str], usize); 9] = [
            ("SELECT generate_series(1, 3)", &["generate_series"], 3),
            ("SELECT generate_series(1, 10, 4) AS n", &["n"], 3),
            (
                "SELECT 7 AS k, GENERATE_SERIES(1, 2)",
                &["k", "generate_series"],
                2,
            ),
            (
                "SELECT * FROM generate_series(1, 4)",
                &["generate_series"],
                4,
            ),
            ("SELECT g FROM generate_series(1, 2) AS g", &["g"], 2),
            ("SELECT n FROM generate_series(1, 2) AS g(n)", &["n"], 2),
            (
                "WITH w AS (SELECT generate_series(1, 2) AS x) SELECT sum(x) AS s FROM w",
                &["s"],
                1,
            ),
            (
                "SELECT generate_series(1, 2) UNION ALL SELECT generate_series(5, 6)",
                &["generate_series"],
                4,
            ),
            (
                "SELECT count(*) AS n FROM (SELECT * FROM generate_series(1, 5)) AS t",
                &["n"],
                1,
            ),
        ];
        for (sql, columns, rows) in cases {
            let (got_columns, got_rows) = shape(&s, sql).await;
            assert_eq!(got_columns, columns, "{sql}");
            assert_eq!(got_rows, rows, "{sql}");
        }
        text(
            &s,
            "CREATE TABLE gs AS SELECT generate_series AS id FROM generate_series(1, 3)",
        )
        .await;
        text(&s, "INSERT INTO gs SELECT generate_series(4, 6)").await;
        let ids = text(&s, "SELECT count(*) AS n, sum(id) AS s FROM gs").await;
        assert!(ids.contains("| 6 | 21 |"), "{ids}");
        let summed = text(
            &s,
            "SELECT sum(generate_series) AS s FROM generate_series(1, 100)",
        )
        .await;
        assert!(summed.contains("| 5050 |"), "{summed}");
    }

    #[tokio::test]
    async fn kept_physical_plans_run_again_from_the_start() {
        let engine = Engine::new();
        let s = engine.session();
        // Several partitions, so plans have repartitions and merges to reset.
        text(&s, "SET datafusion.execution.target_partitions = 4").await;
        text(&s, "CREATE TABLE k (g INT, x INT)").await;
        text(
            &s,
            "INSERT INTO k VALUES (1, 1), (1, 2), (2, 3), (3, 4), (3, 5)",
        )
        .await;
        text(&s, "INSERT INTO k VALUES (2, 6), (4, 7)").await;
        let queries = [
            "SELECT 1",
            "SELECT count(*) AS n, sum(generate_series) AS s FROM generate_series(1, 1000)",
            "SELECT g, sum(x) AS s FROM k GROUP BY g ORDER BY g",
            "SELECT x FROM k WHERE x % 2 = 1 ORDER BY x DESC",
            "SELECT g FROM k UNION ALL SELECT x FROM k ORDER BY 1",
            "SELECT count(*) AS n FROM (SELECT x FROM k WHERE g > 1 LIMIT 2)",
        ];
        for q in queries {
            let first = text(&s, q).await;
            let planning = s.planning.lock().await;
            let kept = planning.cache.get(q).and_then(|c| c.physical.as_ref());
            assert!(kept.is_some(), "physical plan kept for {q}");
            drop(planning);
            for _ in 0..3 {
                assert_eq!(text(&s, q).await, first, "{q}");
            }
        }
        // A DML retires the kept plans: the next run reads the new rows.
        text(&s, "INSERT INTO k VALUES (1, 100)").await;
        let grouped = text(&s, queries[2]).await;
        assert!(grouped.contains("| 1 | 103 |"), "{grouped}");
        // Plans that a reset cannot make new again are planned each run: a top-k sort pushes
        // a dynamic filter into its input.
        let topk = "SELECT x FROM k ORDER BY x LIMIT 2";
        text(&s, topk).await;
        let planning = s.planning.lock().await;
        assert!(planning
            .cache
            .get(topk)
            .is_some_and(|c| c.physical.is_none()));
    }

    #[tokio::test(start_paused = true)]
    async fn pg_sleep_sleeps_in_virtual_time() {
        let s = Engine::new().session();
        let start = tokio::time::Instant::now();
        let out = s
            .execute("SELECT pg_sleep(2)", None, vec![])
            .await
            .expect("runs");
        assert!(matches!(out, QueryOutput::Rows { .. }));
        assert!(start.elapsed() >= Duration::from_secs(2));
    }

    #[test]
    fn keywords_and_tags() {
        assert_eq!(first_keyword("  /* x */ -- y\n (select 1)"), "SELECT");
        assert_eq!(
            command_tag("create external table t stored as csv location 'x'"),
            "CREATE TABLE"
        );
        assert_eq!(
            command_tag("CREATE OR REPLACE VIEW v AS SELECT 1"),
            "CREATE VIEW"
        );
    }
}

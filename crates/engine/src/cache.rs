//! The per-session plan cache: optimized plans of plain queries, and physical plans beside them
//! when a reset makes every node new (see the crate docs for the invariant).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::logical_expr::Volatility;

/// A session's planning state and its cache.
pub(crate) struct Planning {
    pub(crate) state: datafusion::execution::session_state::SessionState,
    pub(crate) task: Arc<datafusion::execution::TaskContext>,
    /// Optimized plans of plain queries by statement text (see [`cacheable`]).
    pub(crate) cache: HashMap<String, CachedPlan>,
}

pub(crate) struct CachedPlan {
    pub(crate) generation: u64,
    pub(crate) plan: datafusion::logical_expr::LogicalPlan,
    /// The result's columns as a client sees them (Postgres's names: see
    /// [`crate::compat::postgres_names`]), made once: drivers Describe before every Execute.
    pub(crate) columns: datafusion::arrow::datatypes::SchemaRef,
    /// The physical plan too, when every node of it can run again after a reset (see
    /// [`reusable`]). Never executed itself: each run gets a reset copy.
    pub(crate) physical: Option<Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
    /// The kept physical plan reads at most [`TINY_ROWS`] rows, all in memory (see [`tiny`]).
    pub(crate) tiny: bool,
    /// The rows of a tiny plan that reads no table (see [`constant`]), kept from its first
    /// run: every later run of this generation gives the same, so they are served as they
    /// are (`SELECT 1`, a driver's `SELECT version()`), with no plan run at all.
    pub(crate) rows: Option<Vec<datafusion::arrow::record_batch::RecordBatch>>,
}

/// Whether a kept plan's answer is the same at every run of its generation: its leaves are
/// constant rows, no table (a cached plan has only immutable functions and no placeholders:
/// [`cacheable`]).
pub(crate) fn constant(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> bool {
    use datafusion::physical_plan as pp;
    let node: &dyn pp::ExecutionPlan = plan.as_ref();
    let children = plan.children();
    if children.is_empty() {
        return node
            .downcast_ref::<pp::placeholder_row::PlaceholderRowExec>()
            .is_some()
            || node.downcast_ref::<pp::empty::EmptyExec>().is_some();
    }
    children.into_iter().all(constant)
}

/// Rows a plan may read and still count as tiny.
pub(crate) const TINY_ROWS: usize = 1024;

/// Whether a (reusable) physical plan reads at most [`TINY_ROWS`] rows, all already in memory:
/// its leaves are constant rows (`SELECT 1`) or small memory tables; no file, no generated
/// series. Such a plan's run is bounded by its input, which is what lets the engine run it
/// without a hop to its own threads.
pub(crate) fn tiny(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> bool {
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::physical_plan as pp;
    fn rows(plan: &Arc<dyn pp::ExecutionPlan>) -> Option<usize> {
        let node: &dyn pp::ExecutionPlan = plan.as_ref();
        if node
            .downcast_ref::<pp::placeholder_row::PlaceholderRowExec>()
            .is_some()
        {
            return Some(1);
        }
        if node.downcast_ref::<pp::empty::EmptyExec>().is_some() {
            return Some(0);
        }
        if let Some(source) = node.downcast_ref::<DataSourceExec>() {
            let memory = source.data_source().downcast_ref::<MemorySourceConfig>()?;
            return Some(
                memory
                    .partitions()
                    .iter()
                    .flatten()
                    .map(|b| b.num_rows())
                    .sum(),
            );
        }
        let children = plan.children();
        if children.is_empty() {
            return None;
        }
        children.into_iter().map(rows).sum()
    }
    rows(plan).is_some_and(|n| n <= TINY_ROWS)
}

/// Plans kept per session; past this many the cache starts afresh.
const PLAN_CACHE_ENTRIES: usize = 256;

/// The longest statement text whose plan is kept (and looked up: a lookup hashes the text).
/// The cache is for the short statements a client repeats; a longer one is planned each time.
/// Unbounded, a client's distinct statements of megabytes (a long literal plans) were each
/// kept whole, text and plan: 40 of 8 MB held 2.1 GB for one idle connection.
pub(crate) const CACHED_TEXT_MAX: usize = 64 * 1024;

/// The statement text a session's cache keeps at most, all its entries together; past it the
/// cache starts afresh (as past [`PLAN_CACHE_ENTRIES`]). A plan holds about its text again
/// (its literals), so a session's cache stays within a few times this.
const CACHED_TEXT_BYTES: usize = 4 << 20;

impl Planning {
    pub(crate) fn of(state: &datafusion::execution::session_state::SessionState) -> Planning {
        Planning {
            state: state.clone(),
            task: state.task_ctx(),
            cache: HashMap::new(),
        }
    }

    pub(crate) fn target_partitions(&self) -> usize {
        self.state.config().options().execution.target_partitions
    }

    /// The cached plan of `sql`, unless something changed since it was made.
    pub(crate) fn cached(&self, sql: &str, generation: u64) -> Option<&CachedPlan> {
        if sql.len() > CACHED_TEXT_MAX {
            return None;
        }
        self.cache.get(sql).filter(|c| c.generation == generation)
    }

    /// [`Planning::cached`], to fill in what a plan's first run found (its physical plan, its
    /// rows).
    pub(crate) fn cached_mut(&mut self, sql: &str, generation: u64) -> Option<&mut CachedPlan> {
        if sql.len() > CACHED_TEXT_MAX {
            return None;
        }
        self.cache
            .get_mut(sql)
            .filter(|c| c.generation == generation)
    }

    pub(crate) fn remember(
        &mut self,
        sql: &str,
        generation: u64,
        plan: datafusion::logical_expr::LogicalPlan,
        names: Option<Vec<Option<String>>>,
    ) {
        if sql.len() > CACHED_TEXT_MAX {
            return;
        }
        // Plans of an older generation are never used again; they may hold whole tables.
        self.cache.retain(|_, c| c.generation == generation);
        let kept_text: usize = self.cache.keys().map(String::len).sum();
        if self.cache.len() >= PLAN_CACHE_ENTRIES || kept_text + sql.len() > CACHED_TEXT_BYTES {
            self.cache.clear();
        }
        let columns = crate::compat::postgres_names(plan.schema().as_arrow(), names);
        let cached = CachedPlan {
            generation,
            plan,
            columns,
            physical: None,
            tiny: false,
            rows: None,
        };
        self.cache.insert(sql.to_string(), cached);
    }
}

/// Whether an optimized plan may be reused for the same text: no placeholders, and only
/// immutable functions (the optimizer folds `now()` and friends into constants, so a plan
/// with a stable or volatile function is only right for the moment it was made).
pub(crate) fn cacheable(plan: &datafusion::logical_expr::LogicalPlan) -> bool {
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
pub(crate) fn reusable(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> bool {
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

//! Functions Postgres clients call that DataFusion lacks (`pg_sleep`), and the test barrier
//! (`sluice_barrier`), registered only in an engine built [`with_barriers`](crate::Embedded::with_barriers).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::async_udf::{AsyncScalarUDF, AsyncScalarUDFImpl};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

/// Registers sluice's functions in `ctx`.
pub(crate) fn register(ctx: &SessionContext) {
    let pg_sleep = VoidFunction::new("pg_sleep", DataType::Float64, PgSleep);
    ctx.register_udf(AsyncScalarUDF::new(Arc::new(pg_sleep)).into_scalar_udf());
}

/// Named gates a test opens: `SELECT sluice_barrier('b')` waits, holding whatever its query
/// holds, until the test calls [`Barriers::open`]`("b")`. It lets a test keep a query running
/// exactly as long as it needs, instead of guessing with `pg_sleep`. Cloning shares the gates.
#[derive(Debug, Clone, Default)]
pub struct Barriers {
    gates: Arc<tokio::sync::watch::Sender<BTreeMap<String, Gate>>>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Gate {
    open: bool,
    /// Calls waiting at the gate now.
    waiting: usize,
}

impl Barriers {
    /// Opens gate `name` for good: its waiters and every later call pass.
    pub fn open(&self, name: &str) {
        self.gates
            .send_modify(|g| g.entry(name.to_string()).or_default().open = true);
    }

    /// Closes gate `name` again (calls from now on wait).
    pub fn close(&self, name: &str) {
        self.gates
            .send_modify(|g| g.entry(name.to_string()).or_default().open = false);
    }

    /// How many calls wait at gate `name` now.
    pub fn waiting(&self, name: &str) -> usize {
        self.gates.borrow().get(name).map_or(0, |g| g.waiting)
    }

    /// Resolves once `n` calls wait at gate `name`.
    pub async fn reached(&self, name: &str, n: usize) {
        let mut changes = self.gates.subscribe();
        let _ = changes
            .wait_for(|g| g.get(name).map_or(0, |g| g.waiting) >= n)
            .await;
    }

    async fn pass(&self, name: &str) {
        let mut changes = self.gates.subscribe();
        if changes.borrow().get(name).is_some_and(|g| g.open) {
            return;
        }
        self.gates
            .send_modify(|g| g.entry(name.to_string()).or_default().waiting += 1);
        // Counted out however the wait ends: opened, or the query dropped (cancel, disconnect).
        struct Leave<'a>(&'a Barriers, &'a str);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.gates.send_modify(|g| {
                    if let Some(g) = g.get_mut(self.1) {
                        g.waiting = g.waiting.saturating_sub(1);
                    }
                });
            }
        }
        let _leave = Leave(self, name);
        let _ = changes
            .wait_for(|g| g.get(name).is_some_and(|g| g.open))
            .await;
    }
}

/// Registers `sluice_barrier(name)` in `ctx`, waiting on `barriers`.
pub(crate) fn register_barriers(ctx: &SessionContext, barriers: Barriers) {
    let udf = VoidFunction::new("sluice_barrier", DataType::Utf8, SluiceBarrier(barriers));
    ctx.register_udf(AsyncScalarUDF::new(Arc::new(udf)).into_scalar_udf());
}

/// What a [`VoidFunction`] does with each row's argument.
#[async_trait]
trait RowAction: Send + Sync + std::fmt::Debug + 'static {
    async fn run(&self, argument: ScalarValue);
}

/// A volatile function of one argument, run asynchronously once per row (never blocking a
/// thread), that returns NULL as Postgres' `void` functions do.
#[derive(Debug)]
struct VoidFunction<A> {
    name: &'static str,
    signature: Signature,
    action: A,
}

impl<A: RowAction> VoidFunction<A> {
    fn new(name: &'static str, argument: DataType, action: A) -> Self {
        VoidFunction {
            name,
            signature: Signature::uniform(1, vec![argument], Volatility::Volatile),
            action,
        }
    }
}

// One function per name in a session: equal and hashed by name.
impl<A> PartialEq for VoidFunction<A> {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl<A> Eq for VoidFunction<A> {}
impl<A> std::hash::Hash for VoidFunction<A> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl<A: RowAction> ScalarUDFImpl for VoidFunction<A> {
    fn name(&self) -> &str {
        self.name
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
        Err(DataFusionError::Internal(format!(
            "{} runs asynchronously",
            self.name
        )))
    }
}

#[async_trait]
impl<A: RowAction> AsyncScalarUDFImpl for VoidFunction<A> {
    async fn invoke_async_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let rows = args.number_rows;
        let values: Vec<ScalarValue> = match args.args.first() {
            Some(ColumnarValue::Scalar(v)) => vec![v.clone(); rows.max(1)],
            Some(ColumnarValue::Array(a)) => (0..a.len())
                .map(|i| ScalarValue::try_from_array(a, i))
                .collect::<datafusion::error::Result<_>>()?,
            None => Vec::new(),
        };
        for value in values {
            self.action.run(value).await;
        }
        let nulls: ArrayRef = Arc::new(StringArray::from(vec![None::<&str>; rows]));
        Ok(ColumnarValue::Array(nulls))
    }
}

/// `sluice_barrier(name)`: waits at gate `name` once per row.
#[derive(Debug)]
struct SluiceBarrier(Barriers);

#[async_trait]
impl RowAction for SluiceBarrier {
    async fn run(&self, argument: ScalarValue) {
        self.0.pass(&argument.to_string()).await;
    }
}

/// `pg_sleep(seconds)`: sleeps without blocking a thread.
#[derive(Debug)]
struct PgSleep;

#[async_trait]
impl RowAction for PgSleep {
    async fn run(&self, argument: ScalarValue) {
        if let ScalarValue::Float64(Some(s)) = argument {
            if s > 0.0 {
                // Past what a Duration holds (or infinite): until the statement is stopped, as
                // PostgreSQL sleeps (a plain conversion panicked the engine thread; found by
                // the wire fuzzer).
                let long = Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX);
                tokio::time::sleep(long).await;
            }
        }
    }
}

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
    ctx.register_udf(AsyncScalarUDF::new(Arc::new(PgSleep::new())).into_scalar_udf());
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
    let udf = SluiceBarrier {
        signature: Signature::uniform(1, vec![DataType::Utf8], Volatility::Volatile),
        barriers,
    };
    ctx.register_udf(AsyncScalarUDF::new(Arc::new(udf)).into_scalar_udf());
}

/// `sluice_barrier(name)`: waits at gate `name` once per row, returns NULL.
#[derive(Debug)]
struct SluiceBarrier {
    signature: Signature,
    barriers: Barriers,
}

impl PartialEq for SluiceBarrier {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.barriers.gates, &other.barriers.gates)
    }
}
impl Eq for SluiceBarrier {}
impl std::hash::Hash for SluiceBarrier {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        "sluice_barrier".hash(state);
    }
}

impl ScalarUDFImpl for SluiceBarrier {
    fn name(&self) -> &str {
        "sluice_barrier"
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
            "sluice_barrier runs asynchronously".into(),
        ))
    }
}

#[async_trait]
impl AsyncScalarUDFImpl for SluiceBarrier {
    async fn invoke_async_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let rows = args.number_rows;
        let names: Vec<String> = match args.args.first() {
            Some(ColumnarValue::Scalar(v)) => {
                vec![v.to_string(); rows.max(1)]
            }
            Some(ColumnarValue::Array(a)) => (0..a.len())
                .map(|i| ScalarValue::try_from_array(a, i).map(|v| v.to_string()))
                .collect::<datafusion::error::Result<_>>()?,
            None => Vec::new(),
        };
        for name in names {
            self.barriers.pass(&name).await;
        }
        let nulls: ArrayRef = Arc::new(StringArray::from(vec![None::<&str>; rows]));
        Ok(ColumnarValue::Array(nulls))
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

//! Functions Postgres clients call that DataFusion lacks: `pg_sleep`.

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

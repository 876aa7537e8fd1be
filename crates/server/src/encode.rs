//! Arrow results as Postgres rows: a Postgres type per Arrow type, and each value encoded in
//! the format (text or binary) the client asked for. Types without a faithful Postgres binary
//! form here (intervals, lists, structs, unsigned 64-bit) go out as `text` in Arrow's display
//! form, which is what psql would print.

use std::sync::Arc;

use chrono::{DateTime, NaiveDate, NaiveDateTime};
use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float16Array,
    Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, LargeBinaryArray,
    LargeStringArray, StringArray, StringViewArray, TimestampMicrosecondArray,
    TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt16Array,
    UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::datatypes::{DataType, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo};
use pgwire::api::Type;
use pgwire::error::PgWireResult;
use pgwire::messages::data::DataRow;
use rust_decimal::Decimal;

use sluice_engine::datafusion;

/// The Postgres type a column of `dt` is sent as.
pub fn pg_type(dt: &DataType) -> Type {
    match dt {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => Type::INT2,
        DataType::Int32 | DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => Type::INT8,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 => Type::FLOAT8,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Type::TEXT,
        DataType::Binary | DataType::LargeBinary => Type::BYTEA,
        DataType::Date32 => Type::DATE,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        DataType::Decimal128(p, _) if *p <= 28 => Type::NUMERIC,
        _ => Type::TEXT,
    }
}

/// Field descriptions for a result schema, in the formats the client asked for.
pub fn fields(schema: &Schema, format: impl Fn(usize) -> FieldFormat) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            FieldInfo::new(
                f.name().clone(),
                None,
                None,
                pg_type(f.data_type()),
                format(i),
            )
        })
        .collect()
}

macro_rules! typed {
    ($enc:expr, $array:expr, $row:expr, $ty:ty, $conv:expr) => {{
        let a = $array
            .as_any()
            .downcast_ref::<$ty>()
            .expect("array matches its data type");
        if a.is_null($row) {
            $enc.encode_field(&None::<i8>)
        } else {
            $enc.encode_field(&$conv(a.value($row)))
        }
    }};
}

fn encode_value(
    enc: &mut DataRowEncoder,
    array: &ArrayRef,
    row: usize,
    text: &ArrayFormatter<'_>,
) -> PgWireResult<()> {
    match array.data_type() {
        DataType::Boolean => typed!(enc, array, row, BooleanArray, |v: bool| v),
        DataType::Int8 => typed!(enc, array, row, Int8Array, |v: i8| i16::from(v)),
        DataType::Int16 => typed!(enc, array, row, Int16Array, |v: i16| v),
        DataType::UInt8 => typed!(enc, array, row, UInt8Array, |v: u8| i16::from(v)),
        DataType::Int32 => typed!(enc, array, row, Int32Array, |v: i32| v),
        DataType::UInt16 => typed!(enc, array, row, UInt16Array, |v: u16| i32::from(v)),
        DataType::Int64 => typed!(enc, array, row, Int64Array, |v: i64| v),
        DataType::UInt32 => typed!(enc, array, row, UInt32Array, |v: u32| i64::from(v)),
        // Counters and ids: beyond i64::MAX they would saturate, which no counter reaches.
        DataType::UInt64 => typed!(enc, array, row, UInt64Array, |v: u64| i64::try_from(v).unwrap_or(i64::MAX)),
        DataType::Float16 => typed!(enc, array, row, Float16Array, |v: <datafusion::arrow::array::types::Float16Type as datafusion::arrow::datatypes::ArrowPrimitiveType>::Native| v.to_f32()),
        DataType::Float32 => typed!(enc, array, row, Float32Array, |v: f32| v),
        DataType::Float64 => typed!(enc, array, row, Float64Array, |v: f64| v),
        DataType::Utf8 => typed!(enc, array, row, StringArray, |v: &str| v.to_string()),
        DataType::LargeUtf8 => typed!(enc, array, row, LargeStringArray, |v: &str| v.to_string()),
        DataType::Utf8View => typed!(enc, array, row, StringViewArray, |v: &str| v.to_string()),
        DataType::Binary => typed!(enc, array, row, BinaryArray, |v: &[u8]| v.to_vec()),
        DataType::LargeBinary => typed!(enc, array, row, LargeBinaryArray, |v: &[u8]| v.to_vec()),
        DataType::Date32 => typed!(enc, array, row, Date32Array, |v: i32| {
            NaiveDate::from_num_days_from_ce_opt(v + 719_163).unwrap_or_default()
        }),
        DataType::Timestamp(unit, tz) => {
            let nanos = |v: i64, per: i64| -> NaiveDateTime {
                DateTime::from_timestamp(v.div_euclid(per), (v.rem_euclid(per) * (1_000_000_000 / per)) as u32)
                    .unwrap_or_default()
                    .naive_utc()
            };
            let value: Option<NaiveDateTime> = if array.is_null(row) {
                None
            } else {
                Some(match unit {
                    TimeUnit::Second => nanos(array.as_any().downcast_ref::<TimestampSecondArray>().map_or(0, |a| a.value(row)), 1),
                    TimeUnit::Millisecond => nanos(array.as_any().downcast_ref::<TimestampMillisecondArray>().map_or(0, |a| a.value(row)), 1_000),
                    TimeUnit::Microsecond => nanos(array.as_any().downcast_ref::<TimestampMicrosecondArray>().map_or(0, |a| a.value(row)), 1_000_000),
                    TimeUnit::Nanosecond => nanos(array.as_any().downcast_ref::<TimestampNanosecondArray>().map_or(0, |a| a.value(row)), 1_000_000_000),
                })
            };
            match (value, tz) {
                (None, _) => enc.encode_field(&None::<i8>),
                (Some(v), None) => enc.encode_field(&v),
                (Some(v), Some(_)) => enc.encode_field(&v.and_utc()),
            }
        }
        DataType::Decimal128(p, scale) if *p <= 28 => {
            let a = array.as_any().downcast_ref::<Decimal128Array>().expect("decimal array");
            if a.is_null(row) {
                enc.encode_field(&None::<i8>)
            } else {
                let d = Decimal::try_from_i128_with_scale(a.value(row), (*scale).max(0) as u32).unwrap_or_default();
                enc.encode_field(&d)
            }
        }
        _ => {
            if array.is_null(row) {
                enc.encode_field(&None::<i8>)
            } else {
                enc.encode_field(&text.value(row).to_string())
            }
        }
    }
}

/// Encodes every row of `batches` for `fields`.
pub fn rows(batches: &[RecordBatch], fields: Arc<Vec<FieldInfo>>) -> PgWireResult<Vec<DataRow>> {
    let options = FormatOptions::default().with_null("");
    let mut out = Vec::new();
    let mut enc = DataRowEncoder::new(fields);
    for batch in batches {
        let formatters: Vec<ArrayFormatter<'_>> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<_, _>>()
            .map_err(|e| pgwire::error::PgWireError::ApiError(Box::new(e)))?;
        for row in 0..batch.num_rows() {
            for (col, array) in batch.columns().iter().enumerate() {
                encode_value(&mut enc, array, row, &formatters[col])?;
            }
            out.push(enc.take_row());
        }
    }
    Ok(out)
}

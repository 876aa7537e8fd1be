//! Arrow results as Postgres rows: a Postgres type per Arrow type, and each value encoded in
//! the format (text or binary) the client asked for. Intervals and durations are `interval`;
//! lists of booleans, integers, floats and strings are arrays of those. Types without a
//! faithful Postgres form here (structs, maps, nested lists) go out as `text` in Arrow's
//! display form.

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
use pg_interval::Interval;
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo};
use pgwire::api::Type;
use pgwire::error::PgWireResult;
use pgwire::messages::data::DataRow;
use rust_decimal::Decimal;

use sluice_engine::datafusion;

/// The Postgres type a column of `dt` is sent as.
pub fn pg_type(dt: &DataType) -> Type {
    // One mapping for the wire and the engine's pg_catalog, so a client's type lookups agree
    // with the rows it receives.
    Type::from_oid(sluice_engine::pg_catalog::type_oid(dt)).unwrap_or(Type::TEXT)
}

/// The elements of a list value, as the array element type [`pg_type`] chose.
fn list_field(enc: &mut DataRowEncoder, elements: &ArrayRef) -> PgWireResult<()> {
    macro_rules! list {
        ($array:expr, $conv:expr) => {{
            let a = $array;
            let v: Vec<Option<_>> = a.iter().map(|x| x.map($conv)).collect();
            enc.encode_field(&v)
        }};
    }
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes as t;
    match elements.data_type() {
        DataType::Boolean => list!(elements.as_boolean(), |v: bool| v),
        DataType::Int8 => list!(elements.as_primitive::<t::Int8Type>(), i16::from),
        DataType::Int16 => list!(elements.as_primitive::<t::Int16Type>(), |v: i16| v),
        DataType::UInt8 => list!(elements.as_primitive::<t::UInt8Type>(), i16::from),
        DataType::Int32 => list!(elements.as_primitive::<t::Int32Type>(), |v: i32| v),
        DataType::UInt16 => list!(elements.as_primitive::<t::UInt16Type>(), i32::from),
        DataType::Int64 => list!(elements.as_primitive::<t::Int64Type>(), |v: i64| v),
        DataType::UInt32 => list!(elements.as_primitive::<t::UInt32Type>(), i64::from),
        DataType::Float32 => list!(elements.as_primitive::<t::Float32Type>(), |v: f32| v),
        DataType::Float64 => list!(elements.as_primitive::<t::Float64Type>(), |v: f64| v),
        DataType::Utf8 => list!(elements.as_string::<i32>(), str::to_string),
        DataType::LargeUtf8 => list!(elements.as_string::<i64>(), str::to_string),
        DataType::Utf8View => list!(elements.as_string_view(), str::to_string),
        other => unreachable!("pg_type sends lists of {other} as text"),
    }
}

/// An Arrow interval or duration as a Postgres interval (microsecond precision, as Postgres).
fn interval(array: &ArrayRef, row: usize) -> Interval {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{self as t, IntervalUnit};
    // A duration (what timestamp - timestamp gives) in days and time, as Postgres' own
    // timestamp subtraction does.
    let micros = |d: i64, per_second: i64| {
        let micros = (i128::from(d) * 1_000_000 / i128::from(per_second)) as i64;
        const DAY: i64 = 86_400_000_000;
        Interval::new(0, (micros / DAY) as i32, micros % DAY)
    };
    match array.data_type() {
        DataType::Interval(IntervalUnit::YearMonth) => Interval::new(
            array.as_primitive::<t::IntervalYearMonthType>().value(row),
            0,
            0,
        ),
        DataType::Interval(IntervalUnit::DayTime) => {
            let v = array.as_primitive::<t::IntervalDayTimeType>().value(row);
            Interval::new(0, v.days, i64::from(v.milliseconds) * 1000)
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let v = array
                .as_primitive::<t::IntervalMonthDayNanoType>()
                .value(row);
            Interval::new(v.months, v.days, v.nanoseconds / 1000)
        }
        DataType::Duration(TimeUnit::Second) => {
            micros(array.as_primitive::<t::DurationSecondType>().value(row), 1)
        }
        DataType::Duration(TimeUnit::Millisecond) => micros(
            array
                .as_primitive::<t::DurationMillisecondType>()
                .value(row),
            1_000,
        ),
        DataType::Duration(TimeUnit::Microsecond) => micros(
            array
                .as_primitive::<t::DurationMicrosecondType>()
                .value(row),
            1_000_000,
        ),
        DataType::Duration(TimeUnit::Nanosecond) => micros(
            array.as_primitive::<t::DurationNanosecondType>().value(row),
            1_000_000_000,
        ),
        other => {
            unreachable!("pg_type sends only intervals and durations as interval, not {other}")
        }
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

/// The result columns last described, kept for the next statement with the same schema and
/// formats: a driver describes its portal, then executes it, every round trip, and both need
/// the columns as pgwire has them. The schema is kept, so comparing it by address is sound (a
/// statement's kept plan hands out one schema each time; another schema is another entry).
#[derive(Default)]
pub struct FieldsMemo(std::sync::Mutex<Option<Described>>);

impl std::fmt::Debug for FieldsMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FieldsMemo")
    }
}

struct Described {
    schema: datafusion::arrow::datatypes::SchemaRef,
    format: FormatKey,
    fields: Arc<Vec<FieldInfo>>,
}

/// A portal's result formats, comparable.
#[derive(PartialEq)]
enum FormatKey {
    Text,
    Binary,
    Each(Vec<i16>),
}

impl FormatKey {
    fn of(format: &pgwire::api::portal::Format) -> FormatKey {
        use pgwire::api::portal::Format;
        match format {
            Format::UnifiedText => FormatKey::Text,
            Format::UnifiedBinary => FormatKey::Binary,
            Format::Individual(codes) => FormatKey::Each(codes.clone()),
        }
    }

    fn is(&self, format: &pgwire::api::portal::Format) -> bool {
        use pgwire::api::portal::Format;
        match (self, format) {
            (FormatKey::Text, Format::UnifiedText) | (FormatKey::Binary, Format::UnifiedBinary) => {
                true
            }
            (FormatKey::Each(mine), Format::Individual(theirs)) => mine == theirs,
            _ => false,
        }
    }
}

impl FieldsMemo {
    /// [`fields`] of `schema` in `format`, made once for a schema asked for again in a row.
    pub fn fields(
        &self,
        schema: &datafusion::arrow::datatypes::SchemaRef,
        format: &pgwire::api::portal::Format,
    ) -> Arc<Vec<FieldInfo>> {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = last
            .as_ref()
            .filter(|d| Arc::ptr_eq(&d.schema, schema) && d.format.is(format))
        {
            return d.fields.clone();
        }
        let fields = Arc::new(fields(schema, |i| format.format_for(i)));
        *last = Some(Described {
            schema: schema.clone(),
            format: FormatKey::of(format),
            fields: fields.clone(),
        });
        fields
    }
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

fn timestamp_text(v: NaiveDateTime, zone: &str) -> String {
    let mut out = v.format("%Y-%m-%d %H:%M:%S%.6f").to_string();
    while out.ends_with('0') {
        out.pop();
    }
    if out.ends_with('.') {
        out.pop();
    }
    out + zone
}

/// A UTC instant as PostgreSQL prints a `timestamptz` in `zone` (an unknown zone: in UTC).
fn timestamptz_text(utc: NaiveDateTime, zone: &str) -> String {
    use chrono::{Offset, TimeZone};
    let Ok(tz) = zone.parse::<datafusion::arrow::array::timezone::Tz>() else {
        return timestamp_text(utc, "+00");
    };
    let local = tz.from_utc_datetime(&utc);
    let seconds = local.offset().fix().local_minus_utc();
    let (sign, seconds) = if seconds < 0 {
        ('-', -seconds)
    } else {
        ('+', seconds)
    };
    let (hours, minutes, rest) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let offset = match (minutes, rest) {
        (0, 0) => format!("{sign}{hours:02}"),
        (_, 0) => format!("{sign}{hours:02}:{minutes:02}"),
        _ => format!("{sign}{hours:02}:{minutes:02}:{rest:02}"),
    };
    timestamp_text(local.naive_local(), &offset)
}

fn encode_value<'a>(
    enc: &mut DataRowEncoder,
    array: &'a ArrayRef,
    row: usize,
    text: &mut Option<ArrayFormatter<'a>>,
    options: &'a FormatOptions<'a>,
    text_format: bool,
) -> PgWireResult<()> {
    match array.data_type() {
        DataType::Boolean => typed!(enc, array, row, BooleanArray, |v: bool| v),
        DataType::Int8 => typed!(enc, array, row, Int8Array, |v: i8| i16::from(v)),
        DataType::Int16 => typed!(enc, array, row, Int16Array, |v: i16| v),
        DataType::UInt8 => typed!(enc, array, row, UInt8Array, |v: u8| i16::from(v)),
        DataType::Int32 => typed!(enc, array, row, Int32Array, |v: i32| v),
        DataType::UInt16 => typed!(enc, array, row, UInt16Array, |v: u16| i32::from(v)),
        DataType::Int64 => typed!(enc, array, row, Int64Array, |v: i64| v),
        DataType::UInt32 => typed!(enc, array, row, UInt32Array, |v: u32| v),
        // Counters and ids: beyond i64::MAX they would saturate, which no counter reaches.
        DataType::UInt64 => typed!(enc, array, row, UInt64Array, |v: u64| i64::try_from(v).unwrap_or(i64::MAX)),
        DataType::Float16 => typed!(enc, array, row, Float16Array, |v: <datafusion::arrow::array::types::Float16Type as datafusion::arrow::datatypes::ArrowPrimitiveType>::Native| v.to_f32()),
        DataType::Float32 => typed!(enc, array, row, Float32Array, |v: f32| v),
        DataType::Float64 => typed!(enc, array, row, Float64Array, |v: f64| v),
        // Borrowed from the array: no copy of each value before it is encoded.
        DataType::Utf8 => typed!(enc, array, row, StringArray, std::convert::identity),
        DataType::LargeUtf8 => typed!(enc, array, row, LargeStringArray, std::convert::identity),
        DataType::Utf8View => typed!(enc, array, row, StringViewArray, std::convert::identity),
        DataType::Binary => typed!(enc, array, row, BinaryArray, std::convert::identity),
        DataType::LargeBinary => typed!(enc, array, row, LargeBinaryArray, std::convert::identity),
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
                // Text as Postgres prints it: no fraction when it is zero, trailing zeros off.
                (Some(v), None) if text_format => enc.encode_field(&timestamp_text(v, "")),
                // In the zone the value carries (the session's `TimeZone`), with its offset
                // as PostgreSQL prints it: `-08`, `+05:30`.
                (Some(v), Some(zone)) if text_format => {
                    enc.encode_field(&timestamptz_text(v, zone))
                }
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
        _ if array.is_null(row) => enc.encode_field(&None::<i8>),
        DataType::Interval(_) | DataType::Duration(_) => enc.encode_field(&interval(array, row)),
        DataType::List(_) if pg_type(array.data_type()) != Type::TEXT => {
            use datafusion::arrow::array::AsArray;
            list_field(enc, &array.as_list::<i32>().value(row))
        }
        DataType::LargeList(_) if pg_type(array.data_type()) != Type::TEXT => {
            use datafusion::arrow::array::AsArray;
            list_field(enc, &array.as_list::<i64>().value(row))
        }
        _ => {
            // Made for the first value that needs it (most columns never do).
            let text = match text {
                Some(text) => text,
                None => text.insert(
                    ArrayFormatter::try_new(array.as_ref(), options)
                        .map_err(|e| pgwire::error::PgWireError::ApiError(Box::new(e)))?,
                ),
            };
            enc.encode_field(&text.value(row).to_string())
        }
    }
}

/// Encodes every row of `batches` for `fields`.
pub fn rows(batches: &[RecordBatch], fields: Arc<Vec<FieldInfo>>) -> PgWireResult<Vec<DataRow>> {
    let options = FormatOptions::default().with_null("");
    let mut out = Vec::with_capacity(batches.iter().map(|b| b.num_rows()).sum());
    let mut enc = DataRowEncoder::new(fields.clone());
    for batch in batches {
        let mut formatters: Vec<Option<ArrayFormatter<'_>>> =
            batch.columns().iter().map(|_| None).collect();
        for row in 0..batch.num_rows() {
            for (col, array) in batch.columns().iter().enumerate() {
                let text_format = fields[col].format() == FieldFormat::Text;
                encode_value(
                    &mut enc,
                    array,
                    row,
                    &mut formatters[col],
                    &options,
                    text_format,
                )?;
            }
            out.push(enc.take_row());
        }
    }
    Ok(out)
}

/// The fields of an encoded row (`None`: NULL).
fn row_fields(row: &DataRow) -> Vec<Option<&[u8]>> {
    let mut fields = Vec::with_capacity(row.field_count.max(0) as usize);
    let mut at = 0;
    let data = &row.data[..];
    for _ in 0..row.field_count {
        let Some(len) = data.get(at..at + 4) else {
            break;
        };
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        at += 4;
        if len < 0 {
            fields.push(None);
        } else {
            let end = (at + len as usize).min(data.len());
            fields.push(Some(&data[at..end]));
            at = end;
        }
    }
    fields
}

/// One line of `COPY … TO STDOUT` output from text-format values, with its newline.
pub fn copy_line<'a>(
    values: impl Iterator<Item = Option<&'a [u8]>>,
    format: &sluice_sql::CopyFormat,
) -> Vec<u8> {
    let mut line = Vec::new();
    for (i, value) in values.enumerate() {
        if i > 0 {
            line.extend_from_slice(format.delimiter.as_bytes());
        }
        match value {
            None => line.extend_from_slice(format.null.as_bytes()),
            Some(v) if format.csv => {
                let quote = v.is_empty()
                    || v.iter().any(|&b| {
                        b == b'"'
                            || b == b'\n'
                            || b == b'\r'
                            || format.delimiter.as_bytes().contains(&b)
                    });
                if quote {
                    line.push(b'"');
                    for &b in v {
                        if b == b'"' {
                            line.push(b'"');
                        }
                        line.push(b);
                    }
                    line.push(b'"');
                } else {
                    line.extend_from_slice(v);
                }
            }
            Some(v) => {
                for &b in v {
                    match b {
                        b'\\' => line.extend_from_slice(b"\\\\"),
                        b'\n' => line.extend_from_slice(b"\\n"),
                        b'\r' => line.extend_from_slice(b"\\r"),
                        b'\t' => line.extend_from_slice(b"\\t"),
                        _ => line.push(b),
                    }
                }
            }
        }
    }
    line.push(b'\n');
    line
}

/// Every row of `batch` as lines of `COPY … TO STDOUT` output (`fields` in text format).
pub fn copy_lines(
    batch: &RecordBatch,
    fields: Arc<Vec<FieldInfo>>,
    format: &sluice_sql::CopyFormat,
) -> PgWireResult<Vec<Vec<u8>>> {
    Ok(rows(std::slice::from_ref(batch), fields)?
        .iter()
        .map(|row| copy_line(row_fields(row).into_iter(), format))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Field;
    use pgwire::api::portal::Format;

    /// The memo answers only for the very schema and formats it was made for.
    #[test]
    fn the_fields_memo_answers_only_for_its_schema_and_formats() {
        let schema = |name: &str| {
            Arc::new(Schema::new(vec![
                Field::new(name, DataType::Int64, true),
                Field::new("b", DataType::Utf8, true),
            ]))
        };
        let memo = FieldsMemo::default();
        let first = schema("a");
        let text = memo.fields(&first, &Format::UnifiedText);
        assert!(Arc::ptr_eq(
            &text,
            &memo.fields(&first, &Format::UnifiedText)
        ));
        assert_eq!(text[0].format(), FieldFormat::Text);
        let binary = memo.fields(&first, &Format::UnifiedBinary);
        assert_eq!(binary[1].format(), FieldFormat::Binary);
        let mixed = memo.fields(&first, &Format::Individual(vec![1, 0]));
        assert_eq!(
            (mixed[0].format(), mixed[1].format()),
            (FieldFormat::Binary, FieldFormat::Text)
        );
        let other = memo.fields(&first, &Format::Individual(vec![0, 1]));
        assert_eq!(other[1].format(), FieldFormat::Binary);
        // An equal schema made anew (the table dropped and made again, say) is asked again.
        let renamed = memo.fields(&schema("c"), &Format::Individual(vec![0, 1]));
        assert_eq!(renamed[0].name(), "c");
    }
}

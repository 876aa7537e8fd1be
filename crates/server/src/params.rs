//! Bind parameters of the extended protocol: the Postgres type of each placeholder (as the
//! client declared it, else as the planner infers it, else `text`) and each bound value as the
//! engine's scalar of that type, decoded from the text or binary format the client chose.

use chrono::{DateTime, FixedOffset, NaiveDate, NaiveDateTime};
use pgwire::api::portal::Portal;
use pgwire::api::Type;
use pgwire::error::{PgWireError, PgWireResult};
use rust_decimal::Decimal;
use sluice_engine::datafusion::arrow::datatypes::DataType;
use sluice_engine::datafusion::common::ScalarValue;
use sluice_sql::{Error, ErrorCode};

use crate::encode::pg_type;

/// The type of each placeholder: declared by the client in Parse, or inferred, or `text`.
pub fn resolve_types(declared: &[Option<Type>], inferred: &[Option<DataType>]) -> Vec<Type> {
    let len = declared.len().max(inferred.len());
    (0..len)
        .map(|i| match declared.get(i).cloned().flatten() {
            Some(t) if t != Type::UNKNOWN => t,
            _ => inferred
                .get(i)
                .cloned()
                .flatten()
                .map_or(Type::TEXT, |dt| pg_type(&dt)),
        })
        .collect()
}

/// The highest `$n` in a statement (0 without placeholders); a rough count for statements the
/// planner does not see.
pub fn highest_placeholder(sql: &str) -> usize {
    sql.split('$')
        .skip(1)
        .filter_map(|tail| {
            let digits: String = tail.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        })
        .max()
        .unwrap_or(0)
}

/// The bound values of a portal, one scalar per placeholder, typed by `types`.
pub fn values<S: Clone>(portal: &Portal<S>, types: &[Type]) -> PgWireResult<Vec<ScalarValue>> {
    (0..portal.parameter_len())
        .map(|i| value(portal, i, types.get(i).unwrap_or(&Type::TEXT)))
        .collect()
}

fn value<S: Clone>(portal: &Portal<S>, i: usize, ty: &Type) -> PgWireResult<ScalarValue> {
    // Postgres names an array type after its element, with a leading underscore.
    let dimensions = match portal.parameters.get(i) {
        Some(Some(bytes)) if ty.name().starts_with('_') => {
            array_dimensions(bytes, portal.parameter_format.is_binary(i))
        }
        _ => None,
    };
    if let Some(dimensions) = dimensions.filter(|d| *d > 1) {
        return Err(crate::error::to_pg(&Error::new(
            ErrorCode::NotImplemented,
            format!(
                "parameter ${} is a {dimensions}-dimensional array: sluice takes arrays of one \
                 dimension as parameters (send a flat list)",
                i + 1
            ),
        )));
    }
    Ok(match *ty {
        Type::BOOL => ScalarValue::Boolean(portal.parameter::<bool>(i, ty)?),
        Type::INT2 => ScalarValue::Int16(portal.parameter::<i16>(i, ty)?),
        Type::INT4 => ScalarValue::Int32(portal.parameter::<i32>(i, ty)?),
        Type::INT8 => ScalarValue::Int64(portal.parameter::<i64>(i, ty)?),
        Type::FLOAT4 => ScalarValue::Float32(portal.parameter::<f32>(i, ty)?),
        Type::FLOAT8 => ScalarValue::Float64(portal.parameter::<f64>(i, ty)?),
        Type::NUMERIC => match portal.parameter::<Decimal>(i, ty)? {
            Some(d) => ScalarValue::Decimal128(Some(d.mantissa()), 38, d.scale() as i8),
            None => ScalarValue::Decimal128(None, 38, 10),
        },
        Type::DATE => ScalarValue::Date32(
            portal
                .parameter::<NaiveDate>(i, ty)?
                .map(|d| (d - NaiveDate::default()).num_days() as i32),
        ),
        Type::TIMESTAMP => ScalarValue::TimestampMicrosecond(
            portal
                .parameter::<NaiveDateTime>(i, ty)?
                .map(|t| t.and_utc().timestamp_micros()),
            None,
        ),
        Type::TIMESTAMPTZ => ScalarValue::TimestampMicrosecond(
            portal
                .parameter::<DateTime<FixedOffset>>(i, ty)?
                .map(|t| t.timestamp_micros()),
            Some("+00:00".into()),
        ),
        Type::BYTEA => ScalarValue::Binary(portal.parameter::<Vec<u8>>(i, ty)?),
        // Arrays (`= ANY($1)`), in Postgres's text form `{1,2,NULL}` or binary.
        Type::BOOL_ARRAY => list(
            portal.parameter(i, ty)?,
            ScalarValue::Boolean,
            DataType::Boolean,
        ),
        Type::INT2_ARRAY => list(
            portal.parameter(i, ty)?,
            ScalarValue::Int16,
            DataType::Int16,
        ),
        Type::INT4_ARRAY => list(
            portal.parameter(i, ty)?,
            ScalarValue::Int32,
            DataType::Int32,
        ),
        Type::INT8_ARRAY => list(
            portal.parameter(i, ty)?,
            ScalarValue::Int64,
            DataType::Int64,
        ),
        Type::FLOAT4_ARRAY => list(
            portal.parameter(i, ty)?,
            ScalarValue::Float32,
            DataType::Float32,
        ),
        Type::FLOAT8_ARRAY => list(
            portal.parameter(i, ty)?,
            ScalarValue::Float64,
            DataType::Float64,
        ),
        Type::TEXT_ARRAY | Type::VARCHAR_ARRAY => {
            list(portal.parameter(i, ty)?, ScalarValue::Utf8, DataType::Utf8)
        }
        // text, varchar, unknown, and anything else: the bytes as text, as Postgres would
        // read an untyped literal.
        _ => ScalarValue::Utf8(match portal.parameters.get(i) {
            Some(Some(bytes)) => Some(
                String::from_utf8(bytes.to_vec())
                    .map_err(|e| PgWireError::FailedToParseParameter(Box::new(e)))?,
            ),
            Some(None) => None,
            None => return Err(PgWireError::ParameterIndexOutOfBound(i)),
        }),
    })
}

/// How many dimensions an array parameter's value has, as its text form (`{{1,2},{3,4}}`, after
/// an optional `[1:2][1:2]=` bounds prefix) or its binary header's first word says.
fn array_dimensions(bytes: &[u8], binary: bool) -> Option<usize> {
    if binary {
        let header: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
        return Some(u32::from_be_bytes(header) as usize);
    }
    let text = std::str::from_utf8(bytes).ok()?.trim_start();
    let text = match text.strip_prefix('[') {
        Some(_) => text.split_once('=')?.1,
        None => text,
    };
    Some(
        text.chars()
            .filter(|c| !c.is_whitespace())
            .take_while(|c| *c == '{')
            .count(),
    )
}

/// An array parameter as a list scalar of `element`s (NULL: a NULL list).
fn list<T>(
    values: Option<Vec<Option<T>>>,
    scalar: impl Fn(Option<T>) -> ScalarValue,
    element: DataType,
) -> ScalarValue {
    match values {
        Some(values) => {
            let values: Vec<ScalarValue> = values.into_iter().map(scalar).collect();
            ScalarValue::List(ScalarValue::new_list_nullable(&values, &element))
        }
        None => ScalarValue::try_from(DataType::List(std::sync::Arc::new(
            sluice_engine::datafusion::arrow::datatypes::Field::new_list_field(element, true),
        )))
        .unwrap_or(ScalarValue::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_dimensions_in_text_and_binary() {
        for (text, want) in [
            ("{1,2}", 1),
            ("{}", 1),
            ("{{1,2},{3,4}}", 2),
            (" { {1}, {2} }", 2),
            ("[1:1][1:2]={{1,2}}", 2),
            ("{{{1}}}", 3),
            (r#"{"{a",b}"#, 1),
        ] {
            assert_eq!(
                array_dimensions(text.as_bytes(), false),
                Some(want),
                "{text}"
            );
        }
        let binary = |ndim: u32| [&ndim.to_be_bytes()[..], &[0; 8]].concat();
        assert_eq!(array_dimensions(&binary(0), true), Some(0));
        assert_eq!(array_dimensions(&binary(2), true), Some(2));
        assert_eq!(array_dimensions(&[0, 0], true), None);
    }

    #[test]
    fn declared_types_win_then_inferred_then_text() {
        let declared = [Some(Type::INT8), None, Some(Type::UNKNOWN)];
        let inferred = [Some(DataType::Int32), Some(DataType::Float64), None, None];
        assert_eq!(
            resolve_types(&declared, &inferred),
            [Type::INT8, Type::FLOAT8, Type::TEXT, Type::TEXT]
        );
        assert_eq!(highest_placeholder("SET workload = $2 -- $1"), 2);
        assert_eq!(highest_placeholder("SHOW workload"), 0);
    }
}

//! The one mapping of DataFusion's errors to sluice's: a ClickHouse code and the SQLSTATE a
//! Postgres client would get for the same failure, decided on the error's variant.

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use datafusion::sql::sqlparser::parser::ParserError;
use sluice_sql::{Error, ErrorCode};

/// An engine error as sluice reports it.
pub fn from_datafusion(e: &DataFusionError) -> Error {
    let text = e.to_string();
    let root = e.find_root();
    if let DataFusionError::Execution(m) = root {
        if let Some(error) = prepared_name_error(m) {
            return error;
        }
    }
    let (code, sqlstate) = match root {
        DataFusionError::SQL(p, _) if matches!(**p, ParserError::RecursionLimitExceeded) => {
            (ErrorCode::TooDeepAst, None)
        }
        DataFusionError::SQL(..) => (ErrorCode::SyntaxError, None),
        DataFusionError::NotImplemented(_) => (ErrorCode::NotImplemented, None),
        // DataFusion has no variant of its own for a missing table.
        DataFusionError::Plan(m) if m.contains("table") && m.contains("not found") => {
            (ErrorCode::UnknownTable, None)
        }
        DataFusionError::SchemaError(..) => (ErrorCode::UnknownIdentifier, None),
        DataFusionError::Plan(_) => (ErrorCode::BadArguments, None),
        // The engine's memory pool refused an allocation: the query needed more than the
        // engine may use (ClickHouse says MEMORY_LIMIT_EXCEEDED for its total limit).
        // A statement's own cap (its charge names the setting); its explicit SQLSTATE also
        // keeps the engine-wide preamble below off it.
        DataFusionError::ResourcesExhausted(m) if m.contains("max_memory_usage") => {
            (ErrorCode::MemoryLimitExceeded, Some("53200"))
        }
        DataFusionError::ResourcesExhausted(m) if m.contains("allocate") => {
            (ErrorCode::MemoryLimitExceeded, None)
        }
        DataFusionError::ResourcesExhausted(_) => (ErrorCode::ResourceLimitExceeded, None),
        DataFusionError::ArrowError(a, _) => match a.as_ref() {
            ArrowError::DivideByZero => (ErrorCode::IllegalDivision, None),
            ArrowError::CastError(_) | ArrowError::ParseError(_) => {
                (ErrorCode::CannotConvertType, None)
            }
            // numeric_value_out_of_range
            ArrowError::ArithmeticOverflow(_) => (ErrorCode::BadArguments, Some("22003")),
            _ => (ErrorCode::InternalError, None),
        },
        // A statement's own runtime failure (a bad argument to a function, say): the user's.
        DataFusionError::Execution(_) => (ErrorCode::BadArguments, None),
        _ => (ErrorCode::InternalError, None),
    };
    let text = if code == ErrorCode::MemoryLimitExceeded && sqlstate.is_none() {
        // Say what the limit is before DataFusion's account of who holds what.
        format!("Memory limit (total) exceeded: the statement needed more memory than the engine's queries may hold together (server.engine_memory_ratio of server.memory); it was stopped and what it held is free. {text}")
    } else {
        text
    };
    let error = Error::new(code, text);
    match sqlstate {
        Some(s) => error.with_sqlstate(s),
        None => error,
    }
}

/// DataFusion's two complaints about a prepared statement's name (its own words end in
/// these), each with the SQLSTATE drivers act on.
const PREPARED_NAME_ERRORS: [(&str, &str); 2] = [
    // EXECUTE or DEALLOCATE of a name never prepared (or deallocated):
    // invalid_sql_statement_name.
    ("does not exist", "26000"),
    // PREPARE of a name prepared already: duplicate_prepared_statement.
    ("already exists", "42P05"),
];

/// `Prepared statement 'p' does not exist` as PostgreSQL words it:
/// `prepared statement "p" does not exist`.
fn prepared_name_error(message: &str) -> Option<Error> {
    let rest = message.strip_prefix("Prepared statement '")?;
    PREPARED_NAME_ERRORS
        .iter()
        .find_map(|&(complaint, sqlstate)| {
            let name = rest.strip_suffix(complaint)?.strip_suffix("' ")?;
            Some(
                Error::new(
                    ErrorCode::BadArguments,
                    format!("prepared statement \"{name}\" {complaint}"),
                )
                .with_sqlstate(sqlstate),
            )
        })
}

/// A statement whose engine task panicked: the panic is contained (the server and the other
/// statements go on) and reported as what it is.
pub fn engine_failure(panic: &(dyn std::any::Any + Send)) -> Error {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("no message");
    Error::new(
        ErrorCode::InternalError,
        format!(
            "the engine failed while running the statement (a bug; the server goes on): {detail}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_variant() {
        let div = DataFusionError::ArrowError(Box::new(ArrowError::DivideByZero), None);
        assert_eq!(from_datafusion(&div).sqlstate(), "22012");
        let cast = DataFusionError::ArrowError(Box::new(ArrowError::CastError("x".into())), None);
        assert_eq!(from_datafusion(&cast).code, ErrorCode::CannotConvertType);
        let deep = DataFusionError::SQL(Box::new(ParserError::RecursionLimitExceeded), None);
        assert_eq!(from_datafusion(&deep).sqlstate(), "54001");
        let missing = DataFusionError::Plan("table 'x' not found".into());
        assert_eq!(from_datafusion(&missing).sqlstate(), "42P01");
        let unknown = DataFusionError::Execution("Prepared statement 'p' does not exist".into());
        let unknown = from_datafusion(&unknown);
        assert_eq!(unknown.sqlstate(), "26000");
        assert!(unknown
            .to_string()
            .contains(r#"prepared statement "p" does not exist"#));
        let again = DataFusionError::Execution("Prepared statement 'q' already exists".into());
        assert_eq!(from_datafusion(&again).sqlstate(), "42P05");
        let other = DataFusionError::Execution("Prepared statement 'r' is odd".into());
        assert_eq!(from_datafusion(&other).code, ErrorCode::BadArguments);
        assert_ne!(from_datafusion(&other).sqlstate(), "26000");
    }
}

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
        // EXECUTE or DEALLOCATE of a name never prepared (or deallocated):
        // invalid_sql_statement_name, which drivers act on.
        DataFusionError::Execution(m)
            if m.starts_with("Prepared statement '") && m.ends_with("' does not exist") =>
        {
            let name = &m["Prepared statement '".len()..m.len() - "' does not exist".len()];
            return Error::new(
                ErrorCode::BadArguments,
                format!("prepared statement \"{name}\" does not exist"),
            )
            .with_sqlstate("26000");
        }
        // PREPARE of a name prepared already: duplicate_prepared_statement.
        DataFusionError::Execution(m)
            if m.starts_with("Prepared statement '") && m.ends_with("' already exists") =>
        {
            let name = &m["Prepared statement '".len()..m.len() - "' already exists".len()];
            return Error::new(
                ErrorCode::BadArguments,
                format!("prepared statement \"{name}\" already exists"),
            )
            .with_sqlstate("42P05");
        }
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
    }
}

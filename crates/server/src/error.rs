//! The one mapping of every error to what a Postgres client receives: severity, SQLSTATE, and
//! a message ending in ClickHouse's code name.

use pgwire::error::{ErrorInfo, PgWireError};
use sluice_engine::DataFusionError;
use sluice_sql::{Error, ErrorCode};

/// A sluice error as the client sees it.
pub fn to_pg(e: &Error) -> PgWireError {
    let mut info = ErrorInfo::new(
        "ERROR".to_owned(),
        e.code.sqlstate().to_owned(),
        e.to_string(),
    );
    if let Some(p) = e.position {
        // psql points at the character when the position is given (1-based, in characters of
        // the query); sluice knows line and column, which for a one-line query is the same.
        if p.line == 1 {
            info.position = Some(p.column.to_string());
        }
    }
    PgWireError::UserError(Box::new(info))
}

/// An engine error, with the closest ClickHouse code.
pub fn from_engine(e: &DataFusionError) -> Error {
    let text = e.to_string();
    let code = match e.find_root() {
        DataFusionError::SQL(..) => ErrorCode::SyntaxError,
        DataFusionError::NotImplemented(_) => ErrorCode::NotImplemented,
        DataFusionError::Plan(m) if m.contains("table") && m.contains("not found") => {
            ErrorCode::UnknownTable
        }
        DataFusionError::SchemaError(..) => ErrorCode::UnknownIdentifier,
        DataFusionError::Plan(_) => ErrorCode::BadArguments,
        _ => ErrorCode::InternalError,
    };
    Error::new(code, text)
}

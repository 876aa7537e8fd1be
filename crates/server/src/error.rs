//! The one mapping of every error to what a Postgres client receives: severity, SQLSTATE, and
//! a message ending in ClickHouse's code name.

use pgwire::error::{ErrorInfo, PgWireError};
use sluice_sql::Error;

/// A sluice error as the client sees it.
pub fn to_pg(e: &Error) -> PgWireError {
    let mut info = ErrorInfo::new("ERROR".to_owned(), e.sqlstate().to_owned(), e.to_string());
    if let Some(p) = e.position {
        // psql points at the character when the position is given (1-based, in characters of
        // the query); sluice knows line and column, which for a one-line query is the same.
        if p.line == 1 {
            info.position = Some(p.column.to_string());
        }
    }
    PgWireError::UserError(Box::new(info))
}

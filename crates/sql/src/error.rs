//! Error codes shared by every layer: ClickHouse's code names and numbers, and the SQLSTATE a
//! Postgres client can act on. This is the one place the mapping lives.

use std::fmt;

/// A ClickHouse error code (by name and number) as sluice reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    BadArguments,
    BadGet,
    CannotParseNumber,
    CannotParseInputAssertionFailed,
    /// A string that is no boolean, for a boolean setting.
    CannotParseBool,
    AttemptToReadAfterEof,
    IncorrectQuery,
    SyntaxError,
    InvalidSchedulerNode,
    ResourceAccessDenied,
    ResourceNotFound,
    ServerOverloaded,
    QueryWasCancelled,
    ResourceLimitExceeded,
    /// A query needed more memory than the engine may use.
    MemoryLimitExceeded,
    /// A query waited longer than `workload_admission_timeout_ms` for a query slot.
    QuerySlotAcquisitionTimeout,
    /// A query waited longer than `workload_admission_timeout_ms` for its memory reservation.
    MemoryReservationAcquisitionTimeout,
    TimeoutExceeded,
    SettingConstraintViolation,
    AccessDenied,
    QueryIsProhibited,
    UnknownSetting,
    UnknownTable,
    UnknownIdentifier,
    NotImplemented,
    /// A statement nested deeper than sluice plans (ClickHouse's `max_ast_depth`).
    TooDeepAst,
    /// A statement with more expressions than the embedded engine plans (ClickHouse's
    /// `max_ast_elements`), or a select list wider than PostgreSQL's.
    TooBigAst,
    /// Division by zero in a query.
    IllegalDivision,
    /// A value that does not fit the type it is cast or written to.
    CannotConvertType,
    /// The server is shutting down: the statement was not run, or was stopped.
    Aborted,
    /// A file of the data dir that does not read as what sluice wrote.
    CorruptedData,
    /// A failure of sluice itself (I/O, a broken data dir): not the user's input.
    InternalError,
    /// The upstream database cannot be reached or talked to (upstream mode).
    AllConnectionTriesFailed,
    /// A login that does not prove its password (upstream mode: one sluice cannot prove for
    /// a client's role).
    AuthenticationFailed,
    /// The fleet's coordination store (etcd) failed or cannot be reached; ClickHouse's name
    /// for a failure of its coordination store (ZooKeeper, Keeper).
    KeeperException,
    /// `clusterAllReplicas` naming a cluster this node is not part of.
    ClusterDoesntExist,
}

impl ErrorCode {
    /// ClickHouse's code name, as printed at the end of its messages.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::BadArguments => "BAD_ARGUMENTS",
            ErrorCode::BadGet => "BAD_GET",
            ErrorCode::CannotParseNumber => "CANNOT_PARSE_NUMBER",
            ErrorCode::CannotParseInputAssertionFailed => "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
            ErrorCode::CannotParseBool => "CANNOT_PARSE_BOOL",
            ErrorCode::AttemptToReadAfterEof => "ATTEMPT_TO_READ_AFTER_EOF",
            ErrorCode::IncorrectQuery => "INCORRECT_QUERY",
            ErrorCode::SyntaxError => "SYNTAX_ERROR",
            ErrorCode::InvalidSchedulerNode => "INVALID_SCHEDULER_NODE",
            ErrorCode::ResourceAccessDenied => "RESOURCE_ACCESS_DENIED",
            ErrorCode::ResourceNotFound => "RESOURCE_NOT_FOUND",
            ErrorCode::ServerOverloaded => "SERVER_OVERLOADED",
            ErrorCode::QueryWasCancelled => "QUERY_WAS_CANCELLED",
            ErrorCode::ResourceLimitExceeded => "RESOURCE_LIMIT_EXCEEDED",
            ErrorCode::MemoryLimitExceeded => "MEMORY_LIMIT_EXCEEDED",
            ErrorCode::QuerySlotAcquisitionTimeout => "QUERY_SLOT_ACQUISITION_TIMEOUT",
            ErrorCode::MemoryReservationAcquisitionTimeout => {
                "MEMORY_RESERVATION_ACQUISITION_TIMEOUT"
            }
            ErrorCode::TimeoutExceeded => "TIMEOUT_EXCEEDED",
            ErrorCode::SettingConstraintViolation => "SETTING_CONSTRAINT_VIOLATION",
            ErrorCode::AccessDenied => "ACCESS_DENIED",
            ErrorCode::QueryIsProhibited => "QUERY_IS_PROHIBITED",
            ErrorCode::UnknownSetting => "UNKNOWN_SETTING",
            ErrorCode::UnknownTable => "UNKNOWN_TABLE",
            ErrorCode::UnknownIdentifier => "UNKNOWN_IDENTIFIER",
            ErrorCode::NotImplemented => "NOT_IMPLEMENTED",
            ErrorCode::TooDeepAst => "TOO_DEEP_AST",
            ErrorCode::TooBigAst => "TOO_BIG_AST",
            ErrorCode::IllegalDivision => "ILLEGAL_DIVISION",
            ErrorCode::CannotConvertType => "CANNOT_CONVERT_TYPE",
            ErrorCode::Aborted => "ABORTED",
            ErrorCode::CorruptedData => "CORRUPTED_DATA",
            ErrorCode::InternalError => "LOGICAL_ERROR",
            ErrorCode::AllConnectionTriesFailed => "ALL_CONNECTION_TRIES_FAILED",
            ErrorCode::AuthenticationFailed => "AUTHENTICATION_FAILED",
            ErrorCode::KeeperException => "KEEPER_EXCEPTION",
            ErrorCode::ClusterDoesntExist => "CLUSTER_DOESNT_EXIST",
        }
    }

    /// ClickHouse's numeric code (checked with `errorCodeToName` on ClickHouse 26.9).
    pub fn number(self) -> i32 {
        match self {
            ErrorCode::BadArguments => 36,
            ErrorCode::BadGet => 170,
            ErrorCode::CannotParseNumber => 72,
            ErrorCode::CannotParseInputAssertionFailed => 27,
            ErrorCode::CannotParseBool => 467,
            ErrorCode::AttemptToReadAfterEof => 32,
            ErrorCode::IncorrectQuery => 80,
            ErrorCode::SyntaxError => 62,
            ErrorCode::InvalidSchedulerNode => 672,
            ErrorCode::ResourceAccessDenied => 673,
            ErrorCode::ResourceNotFound => 674,
            ErrorCode::ServerOverloaded => 745,
            ErrorCode::QueryWasCancelled => 394,
            ErrorCode::ResourceLimitExceeded => 776,
            ErrorCode::MemoryLimitExceeded => 241,
            ErrorCode::QuerySlotAcquisitionTimeout => 1019,
            ErrorCode::MemoryReservationAcquisitionTimeout => 1020,
            ErrorCode::TimeoutExceeded => 159,
            ErrorCode::SettingConstraintViolation => 452,
            ErrorCode::AccessDenied => 497,
            ErrorCode::QueryIsProhibited => 392,
            ErrorCode::UnknownSetting => 115,
            ErrorCode::UnknownTable => 60,
            ErrorCode::UnknownIdentifier => 47,
            ErrorCode::NotImplemented => 48,
            ErrorCode::TooDeepAst => 167,
            ErrorCode::TooBigAst => 168,
            ErrorCode::IllegalDivision => 153,
            ErrorCode::CannotConvertType => 70,
            ErrorCode::Aborted => 236,
            ErrorCode::CorruptedData => 246,
            ErrorCode::InternalError => 49,
            ErrorCode::AllConnectionTriesFailed => 279,
            ErrorCode::AuthenticationFailed => 516,
            ErrorCode::KeeperException => 999,
            ErrorCode::ClusterDoesntExist => 701,
        }
    }

    /// The SQLSTATE sluice sends to Postgres clients for this code (DESIGN.md, "Errors").
    pub fn sqlstate(self) -> &'static str {
        match self {
            ErrorCode::SyntaxError => "42601",
            ErrorCode::ResourceNotFound => "42704",
            ErrorCode::UnknownTable => "42P01",
            ErrorCode::UnknownIdentifier => "42703",
            ErrorCode::NotImplemented => "0A000",
            // statement_too_complex, PostgreSQL's for a statement past its limits.
            ErrorCode::TooDeepAst | ErrorCode::TooBigAst => "54001",
            ErrorCode::IllegalDivision => "22012",
            ErrorCode::CannotConvertType => "22P02",
            ErrorCode::Aborted => "57P01",
            ErrorCode::BadArguments
            | ErrorCode::BadGet
            | ErrorCode::CannotParseNumber
            | ErrorCode::CannotParseInputAssertionFailed
            | ErrorCode::CannotParseBool
            | ErrorCode::AttemptToReadAfterEof
            | ErrorCode::IncorrectQuery
            | ErrorCode::InvalidSchedulerNode
            | ErrorCode::UnknownSetting => "22023",
            ErrorCode::ServerOverloaded => "53000",
            ErrorCode::ResourceLimitExceeded => "53200",
            ErrorCode::MemoryLimitExceeded => "53200",
            ErrorCode::QuerySlotAcquisitionTimeout => "57014",
            ErrorCode::MemoryReservationAcquisitionTimeout => "57014",
            ErrorCode::ResourceAccessDenied
            | ErrorCode::AccessDenied
            | ErrorCode::SettingConstraintViolation
            | ErrorCode::QueryIsProhibited => "42501",
            ErrorCode::QueryWasCancelled | ErrorCode::TimeoutExceeded => "57014",
            ErrorCode::CorruptedData => "XX001",
            ErrorCode::InternalError => "XX000",
            ErrorCode::AllConnectionTriesFailed => "08006",
            ErrorCode::AuthenticationFailed => "28P01",
            // system_error: an external system failed.
            ErrorCode::KeeperException => "58000",
            ErrorCode::ClusterDoesntExist => "42704",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where in the input text something is: 1-based line and column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    pub line: u64,
    pub column: u64,
}

/// An error with its ClickHouse code. `Display` prints the message the way ClickHouse does,
/// with the code name at the end: `Workload entity 'all' already exists. (BAD_ARGUMENTS)`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}. ({})", code.name())]
pub struct Error {
    pub code: ErrorCode,
    /// The message without the code suffix and without a final period.
    pub message: String,
    /// For syntax errors: where in the statement text the parser stopped.
    pub position: Option<Position>,
    /// A SQLSTATE more precise than the code's own: ClickHouse says BAD_ARGUMENTS for a
    /// duplicate entity, where a Postgres client expects 42710.
    pub sqlstate: Option<&'static str>,
    /// When the error is the upstream database's own answer (upstream mode: a start-up it
    /// refused), its ErrorResponse fields as they came (code byte, text): a client is shown
    /// PostgreSQL's words and SQLSTATE, not sluice's.
    pub upstream: Option<std::sync::Arc<Vec<(u8, String)>>>,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        while message.ends_with('.') {
            message.pop();
        }
        Error {
            code,
            message,
            position: None,
            sqlstate: None,
            upstream: None,
        }
    }

    /// The SQLSTATE a Postgres client receives: the override, else the code's.
    pub fn sqlstate(&self) -> &'static str {
        self.sqlstate.unwrap_or_else(|| self.code.sqlstate())
    }

    pub fn with_sqlstate(mut self, sqlstate: &'static str) -> Self {
        self.sqlstate = Some(sqlstate);
        self
    }

    pub fn with_position(mut self, position: Position) -> Self {
        self.position = Some(position);
        self
    }

    pub fn bad_arguments(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::BadArguments, message)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

//! `[upstream]` / `--upstream`: the upstream's URL, how its connections are pooled and what
//! one admission covers.

pub use sluice_engine::upstream::UpstreamUrl;

/// `[upstream]` / `--upstream`.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    pub url: UpstreamUrl,
    /// Connections sluice opens to the upstream at most.
    pub pool_size: usize,
    pub pool_mode: PoolMode,
    pub admission: AdmissionMode,
    /// `auth_query`: the SQL the URL's user runs to read a role's SCRAM verifier (`$1` is the
    /// role's name; the last column of the first row is read), so clients log in with their
    /// PostgreSQL roles and passwords. `None`: clients log in with `[[users]]`, or are trusted.
    pub auth_query: Option<String>,
    /// `server_idle_timeout`: an upstream connection idle in a pool this long is closed
    /// (PgBouncer's setting of that name); `None`: kept until it is needed elsewhere.
    pub server_idle_timeout: Option<std::time::Duration>,
    /// `max_prepared_statements`: in transaction pooling, the statements one upstream
    /// connection keeps prepared for its clients at most; preparing one more closes the one
    /// used longest ago (PgBouncer's setting of that name).
    pub max_prepared_statements: usize,
}

impl UpstreamOptions {
    /// `url` with what the config leaves unsaid: 20 connections, session pooling, a statement's
    /// admission per statement, logins by `[[users]]`, PgBouncer's idle timeout and prepared
    /// statements bound.
    pub fn new(url: UpstreamUrl) -> UpstreamOptions {
        UpstreamOptions {
            url,
            pool_size: 20,
            pool_mode: PoolMode::Session,
            admission: AdmissionMode::Statement,
            auth_query: None,
            server_idle_timeout: Some(DEFAULT_SERVER_IDLE_TIMEOUT),
            max_prepared_statements: DEFAULT_MAX_PREPARED_STATEMENTS,
        }
    }
}

/// `max_prepared_statements` when the config says nothing: PgBouncer's default.
pub const DEFAULT_MAX_PREPARED_STATEMENTS: usize = 200;

/// `server_idle_timeout` when the config says nothing: PgBouncer's default.
pub const DEFAULT_SERVER_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// PgBouncer's default `auth_query` (`pg_shadow` is readable by superusers only).
pub const DEFAULT_AUTH_QUERY: &str = "SELECT usename, passwd FROM pg_shadow WHERE usename = $1";

/// How long a client keeps an upstream connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// From its first forwarded statement to its disconnect (`LISTEN`, session `SET`s,
    /// prepared statements all work as direct).
    Session,
    /// For one transaction (a statement outside one is a transaction of its own).
    Transaction,
}

/// What one admission covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionMode {
    /// Each statement (each simple Query, each extended-protocol batch up to Sync).
    Statement,
    /// A whole transaction: the slot is held from its first statement to its end.
    Transaction,
}

impl std::str::FromStr for PoolMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "session" => Ok(PoolMode::Session),
            "transaction" => Ok(PoolMode::Transaction),
            other => Err(format!(
                "pool_mode is 'session' or 'transaction', got '{other}'"
            )),
        }
    }
}

impl std::str::FromStr for AdmissionMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "statement" => Ok(AdmissionMode::Statement),
            "transaction" => Ok(AdmissionMode::Transaction),
            other => Err(format!(
                "admission is 'statement' or 'transaction', got '{other}'"
            )),
        }
    }
}

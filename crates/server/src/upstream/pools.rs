//! The upstream as the server shares it: one pool of connections per role, database and
//! start-up parameters, what the upstream announced at start-up, what a client's start-up asks
//! of its upstream session (its run-time parameters, checked by PostgreSQL itself), and the
//! roles' SCRAM verifiers for clients' logins (`auth_query`).

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use pgwire::error::{ErrorInfo, PgWireError};
use sluice_engine::upstream::{
    Frame, Lent, ScramKeys, UpstreamConnection, UpstreamPool, UpstreamUrl,
};
use sluice_sql::{Error, ErrorCode};

use crate::auth::VerifierLookup;

use super::options::{AdmissionMode, PoolMode, UpstreamOptions};

/// Which pool serves a client: its database and the run-time parameters of its start-up
/// (its `application_name` aside: that one is set per lend, so clients that differ only in
/// their names share connections). Connections are opened with these as their own start-up,
/// so the session is the client's as going direct (`RESET TimeZone` returns to its start-up
/// value).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// The client's role: its statements run upstream as that role, never as the URL's.
    user: String,
    /// How sluice logs in as `user`: the keys its client's SCRAM login revealed; `None` for
    /// the URL's own user (its password) or an upstream that trusts sluice's host.
    keys: Option<ScramKeys>,
    database: String,
    parameters: Vec<(String, String)>,
}

/// Pools kept before those no client holds are dropped with their idle connections (each
/// client with start-up parameters of its own may make one).
const KEPT_POOLS: usize = 64;

/// The upstream, as the server shares it: its pools and what it announced at start-up.
#[derive(Debug)]
pub struct Upstream {
    pub options: UpstreamOptions,
    /// The URL's own: its database, no client's parameters (the start-up probe's).
    pub pool: UpstreamPool,
    /// One pool per [`PoolKey`]; all of them (and `pool`) lend from the same `pool_size`
    /// slots.
    pools: Mutex<HashMap<PoolKey, UpstreamPool>>,
    /// The run-time parameters its connections announce (`server_version`, `TimeZone`, …),
    /// passed on to clients at their start-up so they see the upstream's.
    parameters: Mutex<Vec<(String, String)>>,
    /// `auth_query`'s own connection (the URL's user, kept between logins), outside
    /// `pool_size` as PgBouncer's `auth_user` connection is: a login never waits for a pooled
    /// connection, however many clients hold one.
    auth: tokio::sync::Mutex<Option<UpstreamConnection>>,
}

/// Parameters of the upstream a client is told at start-up: those that describe the server
/// and how it formats values (not the upstream session's user or application name).
const PASSED_PARAMETERS: &[&str] = &[
    "server_version",
    "server_encoding",
    "client_encoding",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "integer_datetimes",
    "standard_conforming_strings",
    "default_transaction_read_only",
    "in_hot_standby",
];

/// Closes the upstream connections idle longer than `idle_for`, in every pool, for as long as
/// the upstream is served (looked at a few times per `idle_for`, so one is closed at most a
/// quarter of it late).
pub async fn close_idle_connections(
    upstream: std::sync::Arc<Upstream>,
    idle_for: std::time::Duration,
) {
    let every = (idle_for / 4).max(std::time::Duration::from_millis(10));
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Not kept alive by this task: it ends once the server is gone.
    let upstream = std::sync::Arc::downgrade(&upstream);
    loop {
        ticks.tick().await;
        let Some(upstream) = upstream.upgrade() else {
            return;
        };
        let closed = upstream.pool.close_idle(idle_for);
        if closed > 0 {
            tracing::debug!(
                closed,
                "upstream connections idle past server_idle_timeout closed"
            );
        }
    }
}

impl Upstream {
    pub fn new(options: UpstreamOptions) -> Upstream {
        Upstream {
            pool: UpstreamPool::new(options.url.clone(), options.pool_size),
            pools: Mutex::default(),
            options,
            parameters: Mutex::default(),
            auth: tokio::sync::Mutex::new(None),
        }
    }

    /// The pool for a client whose start-up says `metadata` and whose login revealed `keys`:
    /// its role (logged in with the URL's password if it is the URL's user, else with the
    /// keys), its database (the URL's when it names none) and its run-time parameters.
    pub fn pool_for(
        &self,
        metadata: &HashMap<String, String>,
        keys: Option<&ScramKeys>,
    ) -> UpstreamPool {
        let url = &self.options.url;
        let user = metadata
            .get("user")
            .filter(|u| !u.is_empty())
            .unwrap_or(&url.user)
            .clone();
        let by_password = user == url.user && url.password.is_some();
        let key = PoolKey {
            keys: keys.filter(|_| !by_password).cloned(),
            user,
            database: metadata
                .get("database")
                .filter(|d| !d.is_empty())
                .unwrap_or(&url.database)
                .clone(),
            parameters: client_parameters(metadata)
                .into_iter()
                .filter(|(name, _)| !name.eq_ignore_ascii_case("application_name"))
                .collect(),
        };
        if key.user == url.user
            && key.keys.is_none()
            && key.database == url.database
            && key.parameters.is_empty()
        {
            return self.pool.clone();
        }
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pool) = pools.get(&key) {
            return pool.clone();
        }
        // Pools no client holds go (their idle connections closed), so clients that each
        // bring a parameter set of their own cannot pile up idle upstream connections.
        if pools.len() >= KEPT_POOLS {
            pools.retain(|_, pool| !pool.is_held_only_here());
        }
        // Every pool lends from the same `pool_size` slots: however many start-up parameter
        // sets clients bring, the upstream serves at most that many of sluice's statements at
        // once.
        let pool = UpstreamPool::sharing(
            UpstreamUrl {
                user: key.user.clone(),
                // The URL's password is its user's alone.
                password: url.password.clone().filter(|_| key.user == url.user),
                scram_keys: key.keys.clone(),
                database: key.database.clone(),
                parameters: key.parameters.clone(),
                ..url.clone()
            },
            &self.pool,
        );
        pools.insert(key, pool.clone());
        pool
    }

    /// Connects once to learn the upstream's parameters; an upstream that is down is only
    /// logged (sluice serves its own statements meanwhile, forwarded ones fail fast).
    pub async fn probe(&self) {
        match self.pool.checkout().await {
            Ok(lent) => {
                self.note_parameters(&lent);
                tracing::info!(
                    "upstream {} ({}, {} connections at most, {} pooling, admission per {})",
                    self.options.url,
                    lent.parameters
                        .iter()
                        .find(|(k, _)| k == "server_version")
                        .map_or("server version unknown", |(_, v)| v.as_str()),
                    self.options.pool_size,
                    match self.options.pool_mode {
                        PoolMode::Session => "session",
                        PoolMode::Transaction => "transaction",
                    },
                    match self.options.admission {
                        AdmissionMode::Statement => "statement",
                        AdmissionMode::Transaction => "transaction",
                    }
                );
            }
            Err(e) => tracing::warn!("upstream {}: {e}", self.options.url),
        }
    }

    pub(crate) fn note_parameters(&self, conn: &UpstreamConnection) {
        let passed: Vec<_> = conn
            .parameters
            .iter()
            .filter(|(k, _)| PASSED_PARAMETERS.contains(&k.as_str()))
            .cloned()
            .collect();
        *self.parameters.lock().unwrap_or_else(|p| p.into_inner()) = passed;
    }

    /// What a client whose start-up says `metadata` (and whose login revealed `keys`) is told
    /// of its session, as PostgreSQL would tell it: the upstream's parameters with the
    /// client's own in place, each as the upstream takes it (`datestyle=german` is reported
    /// `German, DMY`). The client's parameters are tried on a connection of its pool, which is
    /// returned when `keep` (session pooling: the client's backend from now on, whose pid is
    /// the client's) and otherwise goes back with them set (so the first statement needs no
    /// `SET`). `Err` is the upstream's refusal (an unknown role or database, a wrong
    /// password, a parameter it does not take), which ends the client's start-up as
    /// PostgreSQL's would. While the upstream is out of reach or every connection is lent,
    /// the values are reported as the client gave them, and its first statement's
    /// connection is given them.
    pub async fn start_session(
        &self,
        metadata: &HashMap<String, String>,
        keys: Option<&ScramKeys>,
        keep: bool,
    ) -> Result<(Vec<(String, String)>, Option<Lent>), Frame> {
        let wanted = client_parameters(metadata);
        let mut reported = self.parameters();
        let pool = self.pool_for(metadata, keys);
        let tried = if pool.has_room() {
            match pool.checkout().await {
                Ok(lent) => Some(lent),
                // Refused (no such role or database, a parameter it does not take): the
                // client's start-up is refused as PostgreSQL refuses it.
                Err(Error {
                    upstream: Some(fields),
                    ..
                }) => {
                    return Err(Frame {
                        tag: b'E',
                        body: error_body(&fields),
                    })
                }
                Err(_) => None,
            }
        } else {
            None
        };
        let Some(mut lent) = tried else {
            for (name, value) in &mut reported {
                if let Some((_, given)) = wanted.iter().find(|(n, _)| n.eq_ignore_ascii_case(name))
                {
                    *value = given.clone();
                }
            }
            return Ok((reported, None));
        };
        if reported.is_empty() {
            self.note_parameters(&lent);
            reported = self.parameters();
        }
        match lent.apply_session(&wanted).await {
            Ok(None) => {
                for (name, value) in &mut reported {
                    if let Some((_, now)) = lent.parameters.iter().find(|(n, _)| n == name) {
                        *value = now.clone();
                    }
                }
                Ok((reported, keep.then_some(lent)))
            }
            Ok(Some(refused)) => Err(refused),
            Err(_) => {
                lent.discard();
                Ok((reported, None))
            }
        }
    }

    /// Whether the upstream's parameters were noted (it was reached once): asked at every
    /// connection lent, so nothing is copied.
    pub fn knows_parameters(&self) -> bool {
        !self
            .parameters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// What clients are told at start-up (empty until the upstream was reached once).
    pub fn parameters(&self) -> Vec<(String, String)> {
        self.parameters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A session-pooled client's upstream backend from its start-up, until the connection loop
/// hands it to the client's [`crate::forward::Forwarder`] (kept in the client's session).
#[derive(Debug)]
pub struct SessionBackend(Mutex<Option<Lent>>);

impl SessionBackend {
    pub fn new(lent: Lent) -> SessionBackend {
        SessionBackend(Mutex::new(Some(lent)))
    }

    pub fn take(&self) -> Option<Lent> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// `auth_query`: a role's verifier, read by the URL's user on the URL's database (PgBouncer's
/// `auth_user`), with the role's name in place of `$1`.
#[async_trait]
impl VerifierLookup for Upstream {
    async fn scram_verifier(&self, role: &str) -> sluice_sql::Result<Option<String>> {
        let Some(query) = &self.options.auth_query else {
            return Ok(None);
        };
        // An escape string reads the same whatever `standard_conforming_strings` is.
        let literal = format!("E'{}'", role.replace('\\', "\\\\").replace('\'', "''"));
        let mut kept = self.auth.lock().await;
        let mut conn = match kept.take() {
            Some(conn) => conn.at_home().map_err(|e| {
                Error::new(
                    ErrorCode::AllConnectionTriesFailed,
                    format!(
                        "upstream.auth_query's connection to {}: {e}",
                        self.options.url
                    ),
                )
            })?,
            None => UpstreamConnection::connect(&self.options.url).await?,
        };
        if !conn.is_usable() {
            conn = UpstreamConnection::connect(&self.options.url).await?;
        }
        conn.query(&query.replace("$1", &literal)).await?;
        let frames = conn.read_response().await?;
        // Kept for the next login only when it answered whole (an error above drops it).
        *kept = Some(conn);
        let mut verifier = None;
        for frame in &frames {
            match frame.tag {
                b'E' => {
                    let fields = frame.fields();
                    let message = fields
                        .iter()
                        .find(|(code, _)| *code == b'M')
                        .map_or("", |(_, m)| m.as_str());
                    return Err(Error::new(
                        ErrorCode::AllConnectionTriesFailed,
                        format!(
                            "upstream.auth_query failed on {}: {message}",
                            self.options.url
                        ),
                    ));
                }
                // PgBouncer's form returns the name, then the password; a one-column query the
                // password alone: the last column is read.
                b'D' if verifier.is_none() => verifier = Some(frame.values().pop().flatten()),
                _ => {}
            }
        }
        Ok(verifier.flatten())
    }
}

/// Start-up keys that are not run-time parameters: the login, the protocol's own, and
/// `options` (read apart: its `-c` settings are parameters too).
const NOT_PARAMETERS: &[&str] = &["user", "database", "options", "replication"];

/// The run-time parameters a client's start-up asks of its session, as PostgreSQL would set
/// them: every start-up key that is not the login's (`TimeZone`, `DateStyle`, `search_path`,
/// `extra_float_digits`, `application_name`, `client_encoding`, …) and every `-c` of its
/// `options`, less sluice's own settings; sorted by name, so that clients asking the same
/// have equal lists and a pooled connection lent from one to the other needs no `SET`.
pub fn client_parameters(metadata: &HashMap<String, String>) -> Vec<(String, String)> {
    let ours = |name: &str| {
        crate::settings::KNOWN_SETTINGS
            .iter()
            .any(|k| k.eq_ignore_ascii_case(name))
    };
    let mut wanted: Vec<(String, String)> = metadata
        .iter()
        .filter(|(name, _)| !NOT_PARAMETERS.contains(&name.as_str()) && !name.starts_with("_pq_."))
        .map(|(name, value)| (name.clone(), value.clone()))
        .chain(
            metadata
                .get("options")
                .map(|o| crate::settings::startup_settings(o))
                .unwrap_or_default(),
        )
        .filter(|(name, _)| !ours(name))
        .filter(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        })
        .collect();
    // A name given twice (a key and a `-c`) counts once, the `-c` last as PostgreSQL applies it.
    wanted.reverse();
    let mut seen = std::collections::HashSet::new();
    wanted.retain(|(name, _)| seen.insert(name.to_ascii_lowercase()));
    wanted.sort_by_key(|(name, _)| name.to_ascii_lowercase());
    wanted
}

/// The reported parameters (those PostgreSQL announces with ParameterStatus) a client may
/// set, followed from the ParameterStatus messages its statements cause so that its `SET`
/// outlives the connection it ran on (transaction pooling lends each transaction another).
const FOLLOWED_PARAMETERS: &[&str] = &[
    "application_name",
    "client_encoding",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "standard_conforming_strings",
    "default_transaction_read_only",
    "search_path",
];

/// `wanted` with a ParameterStatus's new value in it, if the parameter is one a client sets.
pub(crate) fn follow_parameter(wanted: &mut Vec<(String, String)>, frame: &Frame) {
    let Some((name, value)) = parameter_status(frame) else {
        return;
    };
    if !FOLLOWED_PARAMETERS
        .iter()
        .any(|p| p.eq_ignore_ascii_case(&name))
    {
        return;
    }
    match wanted
        .iter_mut()
        .find(|(n, _)| n.eq_ignore_ascii_case(&name))
    {
        Some(slot) => slot.1 = value,
        None => {
            wanted.push((name, value));
            wanted.sort_by_key(|(name, _)| name.to_ascii_lowercase());
        }
    }
}

/// A ParameterStatus's name and value.
fn parameter_status(frame: &Frame) -> Option<(String, String)> {
    let mut parts = frame.body.split(|&b| b == 0);
    let name = std::str::from_utf8(parts.next()?).ok()?.to_string();
    let value = String::from_utf8_lossy(parts.next()?).into_owned();
    Some((name, value))
}

/// An upstream ErrorResponse as the FATAL it is for a client's start-up (PostgreSQL refuses a
/// start-up parameter it cannot set with FATAL and closes).
pub fn fatal_from(frame: &Frame) -> PgWireError {
    let fields = frame
        .fields()
        .into_iter()
        .map(|(code, value)| match code {
            b'S' | b'V' => (code, "FATAL".to_string()),
            _ => (code, value),
        })
        .collect();
    PgWireError::UserError(Box::new(ErrorInfo::from(
        pgwire::messages::response::ErrorResponse::new(fields),
    )))
}

/// An ErrorResponse's body from its fields.
fn error_body(fields: &[(u8, String)]) -> bytes::Bytes {
    let mut body = Vec::new();
    for (code, value) in fields {
        body.push(*code);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    body.into()
}

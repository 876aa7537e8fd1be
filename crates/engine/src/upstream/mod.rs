//! The upstream's wire (issue 12, first part): a client of the Postgres protocol that keeps
//! what the upstream says as it said it. Upstream mode forwards statements to a Postgres-wire
//! database and relays its answers to the client at the message level — rows are never decoded
//! into values and encoded again — so this client hands out each backend message as a
//! [`Frame`]: its type byte and its body, the bytes that came. It interprets only what it must
//! to hold a connection: start-up, authentication (trust, cleartext password, MD5, SCRAM-SHA-256
//! without channel binding), the parameters and cancel key the server announces, and the end
//! of each response (`ReadyForQuery`, with the transaction status).
//!
//! Failures to reach or talk to the upstream are ALL_CONNECTION_TRIES_FAILED (SQLSTATE 08006)
//! with a message naming the upstream (`host:port`), so a client can tell them from its own
//! statement's errors; an error the upstream sends during start-up (a wrong password, an
//! unknown database) is relayed with its own SQLSTATE and message.
//!
//! [`pool`] lends these connections to clients and resets them between clients.
//!
//! [`tls`] encrypts the connection as the URL's `sslmode` asks (libpq's meanings).

pub mod pool;
pub mod scram;
pub mod tls;

pub use pool::{Lent, UpstreamPool};
pub use scram::ScramKeys;

use std::fmt;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl;
use postgres_protocol::message::{backend, frontend};
use sluice_sql::{Error, ErrorCode, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest backend message accepted (PostgreSQL's own limit on a field is 1 GB).
const MAX_FRAME: usize = 1 << 30;

/// The most a connection's read buffer keeps between messages (see
/// [`UpstreamConnection::release_large_buffer`]).
const KEPT_READ_BUFFER: usize = 1 << 20;

/// Where the upstream is and who sluice is there: `postgres://user[:password]@host[:port]/db
/// [?sslmode=disable|prefer|require&connect_timeout=SECONDS]`.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    /// The role's SCRAM keys, learnt from a client's login ([`scram`]): how sluice logs in as
    /// a client's role without its password. Used where there is no password.
    pub scram_keys: Option<ScramKeys>,
    pub database: String,
    pub sslmode: SslMode,
    /// `sslrootcert`: the CA certificate(s) `verify-ca`/`verify-full` check the upstream's
    /// against.
    pub sslrootcert: Option<std::path::PathBuf>,
    pub connect_timeout: Duration,
    /// Start-up parameters sent besides the user and the database: the run-time parameters
    /// of the clients a pool serves (`TimeZone`, `DateStyle`, `-c` options, …), so that
    /// PostgreSQL makes them the session's own (a `RESET` returns to them). sluice's
    /// `application_name` and `client_encoding=UTF8` are sent unless they are given here.
    pub parameters: Vec<(String, String)>,
}

/// The URL's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    /// `verify-ca` and `verify-full`: the certificate is checked against `sslrootcert`, and
    /// its name against the host (for `verify-ca` too: rustls always checks the name).
    VerifyFull,
}

impl SslMode {
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Debug for UpstreamUrl {
    // Never the password: URLs end up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "postgres://{}@{}:{}/{}",
            self.user, self.host, self.port, self.database
        )
    }
}

fn bad_url(url: &str, why: &str) -> Error {
    // The password, if any, stays out of the message.
    let shown = url::Url::parse(url)
        .map(|mut u| {
            let _ = u.set_password(None);
            u.to_string()
        })
        .unwrap_or_else(|_| "the upstream URL".to_string());
    Error::new(
        ErrorCode::BadArguments,
        format!("Invalid upstream URL {shown}: {why}; expected postgres://user[:password]@host[:port]/database[?sslmode=disable|prefer|require|verify-full&sslrootcert=PATH]"),
    )
}

impl UpstreamUrl {
    pub fn parse(text: &str) -> Result<UpstreamUrl> {
        let url = url::Url::parse(text).map_err(|e| bad_url(text, &e.to_string()))?;
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err(bad_url(text, &format!("the scheme is '{}'", url.scheme())));
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad_url(text, "no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let decode = |s: &str| {
            url::form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        let user = decode(url.username());
        if user.is_empty() {
            return Err(bad_url(text, "no user"));
        }
        let database = decode(url.path().trim_start_matches('/'));
        let mut out = UpstreamUrl {
            host,
            port: url.port().unwrap_or(5432),
            password: url.password().map(decode),
            scram_keys: None,
            database: if database.is_empty() {
                user.clone()
            } else {
                database
            },
            user,
            sslmode: SslMode::Prefer,
            sslrootcert: None,
            connect_timeout: Duration::from_secs(10),
            parameters: Vec::new(),
        };
        for (key, value) in url.query_pairs() {
            match (key.as_ref(), value.as_ref()) {
                ("sslmode", "disable") => out.sslmode = SslMode::Disable,
                ("sslmode", "allow" | "prefer") => out.sslmode = SslMode::Prefer,
                ("sslmode", "require") => out.sslmode = SslMode::Require,
                ("sslmode", "verify-ca" | "verify-full") => out.sslmode = SslMode::VerifyFull,
                ("sslmode", other) => {
                    return Err(bad_url(text, &format!("unknown sslmode '{other}'")));
                }
                ("sslrootcert", path) => out.sslrootcert = Some(path.into()),
                ("connect_timeout", seconds) => {
                    let seconds: u64 = seconds
                        .parse()
                        .map_err(|_| bad_url(text, "connect_timeout is not a number of seconds"))?;
                    out.connect_timeout = Duration::from_secs(seconds.max(1));
                }
                ("application_name", _) => {}
                (other, _) => {
                    return Err(bad_url(text, &format!("unknown parameter '{other}'")));
                }
            }
        }
        Ok(out)
    }

    /// `host:port`, as errors name the upstream.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// What makes a session's parameters `wanted` where `current` were set: `RESET`s of those no
/// longer wanted, then one `SELECT set_config(…)` of those that differ; `None` if nothing
/// differs.
pub fn session_sql(current: &[(String, String)], wanted: &[(String, String)]) -> Option<String> {
    let find = |list: &[(String, String)], name: &str| {
        list.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    // An escape string reads the same whatever `standard_conforming_strings` is.
    let quote = |v: &str| format!("E'{}'", v.replace('\\', "\\\\").replace('\'', "''"));
    if current == wanted {
        return None;
    }
    let mut statements: Vec<String> = current
        .iter()
        .filter(|(name, _)| find(wanted, name).is_none())
        .map(|(name, _)| format!("RESET \"{}\"", name.replace('"', "\"\"")))
        .collect();
    let sets: Vec<String> = wanted
        .iter()
        .filter(|(name, value)| find(current, name).as_deref() != Some(value.as_str()))
        .map(|(name, value)| format!("set_config({}, {}, false)", quote(name), quote(value)))
        .collect();
    if !sets.is_empty() {
        statements.push(format!("SELECT {}", sets.join(", ")));
    }
    (!statements.is_empty()).then(|| statements.join("; "))
}

/// The statements a pooled connection has prepared, by name, in the order they were last
/// used: bounded, as PgBouncer bounds them (`max_prepared_statements`), so a connection lent
/// for years does not keep every statement any client ever prepared (each holds memory in
/// its backend).
#[derive(Debug, Default)]
pub struct PreparedNames {
    /// Each name with the turn it was last used at.
    used: std::collections::HashMap<String, u64>,
    turn: u64,
}

impl PreparedNames {
    /// `name` used now: whether it must be prepared (it was not), and, when preparing it
    /// takes the connection past `max`, the name used longest ago, to close first (it is
    /// forgotten here).
    pub fn use_name(&mut self, name: &str, max: usize) -> (bool, Option<String>) {
        self.turn += 1;
        if let Some(turn) = self.used.get_mut(name) {
            *turn = self.turn;
            return (false, None);
        }
        let evicted = (self.used.len() >= max.max(1))
            .then(|| {
                let oldest = self.used.iter().min_by_key(|(_, &turn)| turn)?.0.clone();
                self.used.remove(&oldest);
                Some(oldest)
            })
            .flatten();
        self.used.insert(name.to_string(), self.turn);
        (true, evicted)
    }

    /// `name` prepared on the connection after all (a close that the upstream skipped), as
    /// used longest ago.
    pub fn keep(&mut self, name: String) {
        self.used.entry(name).or_insert(0);
    }

    /// `name` not prepared after all (its Parse failed or was skipped).
    pub fn remove(&mut self, name: &str) {
        self.used.remove(name);
    }

    pub fn clear(&mut self) {
        self.used.clear();
    }

    pub fn len(&self) -> usize {
        self.used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.used.contains_key(name)
    }
}

/// One backend message as the upstream sent it: its type byte and its body (without the
/// length word).
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    pub tag: u8,
    pub body: Bytes,
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Frame({:?}, {} bytes)",
            self.tag as char,
            self.body.len()
        )
    }
}

impl Frame {
    /// The message parsed (for what sluice itself must read: errors, statuses, keys).
    pub fn parse(&self) -> Result<backend::Message> {
        let mut buf = BytesMut::with_capacity(self.body.len() + 5);
        buf.extend_from_slice(&[self.tag]);
        buf.extend_from_slice(&(self.body.len() as i32 + 4).to_be_bytes());
        buf.extend_from_slice(&self.body);
        backend::Message::parse(&mut buf)
            .ok()
            .flatten()
            .ok_or_else(|| protocol_error(&format!("a malformed '{}' message", self.tag as char)))
    }

    /// The fields of an ErrorResponse or NoticeResponse, by their one-byte codes.
    pub fn fields(&self) -> Vec<(u8, String)> {
        let mut out = Vec::new();
        let mut body = &self.body[..];
        while let Some((&code, rest)) = body.split_first() {
            if code == 0 {
                break;
            }
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            out.push((code, String::from_utf8_lossy(&rest[..end]).into_owned()));
            body = rest.get(end + 1..).unwrap_or_default();
        }
        out
    }

    /// A RowDescription's columns: each one's name and type OID.
    pub fn columns(&self) -> Vec<(String, u32)> {
        let Ok(backend::Message::RowDescription(body)) = self.parse() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut fields = body.fields();
        while let Ok(Some(field)) = fields.next() {
            out.push((field.name().to_string(), field.type_oid()));
        }
        out
    }

    /// A DataRow's values as text (`None` for NULL); empty for another message.
    pub fn values(&self) -> Vec<Option<String>> {
        let Ok(backend::Message::DataRow(row)) = self.parse() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut ranges = row.ranges();
        while let Ok(Some(range)) = ranges.next() {
            out.push(range.map(|r| String::from_utf8_lossy(&row.buffer()[r]).into_owned()));
        }
        out
    }

    /// An ErrorResponse as sluice's error: its SQLSTATE and message kept (in the message,
    /// since sluice's errors carry ClickHouse codes), for failures during start-up.
    fn upstream_error(&self, address: &str) -> Error {
        let fields = self.fields();
        let get = |c: u8| {
            fields
                .iter()
                .find(|(k, _)| *k == c)
                .map(|(_, v)| v.as_str())
        };
        let mut error = Error::new(
            ErrorCode::AllConnectionTriesFailed,
            format!(
                "The upstream {address} refused the connection: {} (SQLSTATE {})",
                get(b'M').unwrap_or("no message"),
                get(b'C').unwrap_or("?")
            ),
        );
        error.upstream = Some(std::sync::Arc::new(fields));
        error
    }
}

fn protocol_error(what: &str) -> Error {
    Error::new(
        ErrorCode::AllConnectionTriesFailed,
        format!("The upstream broke the protocol: {what}"),
    )
}

/// What the upstream says of a statement without running it (the extended protocol's
/// Parse and Describe of an unnamed statement).
#[derive(Debug, Clone, PartialEq)]
pub struct Described {
    /// The type OIDs of its parameters `$1`, `$2`, … as the upstream inferred them.
    pub parameters: Vec<u32>,
    /// Its result columns (a RowDescription, as it came); `None` for a statement without rows.
    pub rows: Option<Frame>,
}

/// How to cancel what a connection runs: PostgreSQL's CancelRequest, sent on a connection of
/// its own to where the connection is.
#[derive(Clone)]
pub struct CancelToken {
    address: String,
    process_id: i32,
    secret_key: i32,
}

impl fmt::Debug for CancelToken {
    // Not the secret key: whoever holds it can cancel the upstream's statements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelToken")
            .field("address", &self.address)
            .field("process_id", &self.process_id)
            .finish_non_exhaustive()
    }
}

impl CancelToken {
    /// Asks the upstream to cancel the statement running on the connection, if any.
    pub async fn cancel(&self) -> Result<()> {
        let mut stream = TcpStream::connect(&self.address)
            .await
            .map_err(|e| unreachable(&self.address, &e.to_string()))?;
        let mut buf = BytesMut::new();
        frontend::cancel_request(self.process_id, self.secret_key, &mut buf);
        stream
            .write_all(&buf)
            .await
            .map_err(|e| unreachable(&self.address, &e.to_string()))?;
        // The upstream closes the connection once it has read the request.
        let _ = stream.read(&mut [0u8; 1]).await;
        Ok(())
    }
}

pub(crate) fn unreachable(address: &str, why: &str) -> Error {
    Error::new(
        ErrorCode::AllConnectionTriesFailed,
        format!("The upstream {address} is unreachable: {why}"),
    )
}

/// One connection to the upstream, authenticated and ready for a statement.
#[derive(Debug)]
pub struct UpstreamConnection {
    address: String,
    stream: tls::Stream,
    read: BytesMut,
    /// The run-time parameters the upstream announced (`server_version`, `TimeZone`, …), in
    /// order, updated as ParameterStatus messages pass.
    pub parameters: Vec<(String, String)>,
    cancel: Option<CancelToken>,
    /// The transaction status of the last ReadyForQuery: `I` idle, `T` in a transaction, `E`
    /// in a failed one.
    pub transaction: u8,
    /// Responses still to come: each [`UpstreamConnection::query`] adds one, each
    /// ReadyForQuery read takes one (messages sent raw with [`UpstreamConnection::send`]
    /// count only if the caller adds them).
    pub awaiting: usize,
    /// Statements prepared on this connection under sluice's pooled names (transaction
    /// pooling shares them between the clients the connection is lent to).
    pub prepared: PreparedNames,
    /// A client may have changed the session beyond its transaction (a `SET`, a temporary
    /// table, a hold cursor): the connection is reset before it is lent again.
    pub dirty: bool,
    /// The `SET`s sluice last sent to carry a grant (so unchanged ones are not sent again).
    pub applied: String,
    /// The run-time parameters of the client it was last lent to (its start-up `TimeZone`,
    /// `DateStyle`, `options=-c …`, …), as sluice set them on top of the connection's own
    /// start: [`UpstreamConnection::apply_session`] sends only what differs for the next
    /// client, and a reset (`DISCARD ALL`) returns it to `startup_session`.
    pub session: Vec<(String, String)>,
    /// The run-time parameters its start-up packet set (the URL's `parameters`).
    pub startup_session: Vec<(String, String)>,
    /// The thread whose runtime its socket is registered with, when that runtime is a
    /// current-thread one (see [`UpstreamConnection::at_home`]).
    home: Option<std::thread::ThreadId>,
}

/// The current thread, when it runs a current-thread runtime: a socket registered from here
/// is served by this thread alone. `None` on a multi-threaded runtime (whose workers share
/// one reactor, so where a socket was registered does not matter).
pub fn current_home() -> Option<std::thread::ThreadId> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    (runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
        .then(|| std::thread::current().id())
}

impl UpstreamConnection {
    /// Connects to `url` and authenticates as its user, within its `connect_timeout`.
    pub async fn connect(url: &UpstreamUrl) -> Result<UpstreamConnection> {
        let address = url.address();
        tokio::time::timeout(url.connect_timeout, Self::start(url, address.clone()))
            .await
            .unwrap_or_else(|_| {
                Err(unreachable(
                    &address,
                    &format!(
                        "no answer within {:?} (connect_timeout)",
                        url.connect_timeout
                    ),
                ))
            })
    }

    async fn start(url: &UpstreamUrl, address: String) -> Result<UpstreamConnection> {
        let stream = TcpStream::connect((url.host.as_str(), url.port))
            .await
            .map_err(|e| unreachable(&address, &e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let stream = tls::negotiate(stream, url, &address).await?;
        let mut conn = UpstreamConnection {
            address,
            stream,
            read: BytesMut::with_capacity(8192),
            parameters: Vec::new(),
            cancel: None,
            transaction: b'I',
            awaiting: 0,
            prepared: Default::default(),
            dirty: false,
            applied: String::new(),
            session: Vec::new(),
            startup_session: Vec::new(),
            home: current_home(),
        };
        let mut buf = BytesMut::new();
        let given = |name: &str| {
            url.parameters
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
        };
        let defaults = [("application_name", "sluice"), ("client_encoding", "UTF8")];
        frontend::startup_message(
            [
                ("user", url.user.as_str()),
                ("database", url.database.as_str()),
            ]
            .into_iter()
            .chain(defaults.into_iter().filter(|(name, _)| !given(name)))
            .chain(
                url.parameters
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_str())),
            ),
            &mut buf,
        )
        .map_err(|e| protocol_error(&e.to_string()))?;
        // What the start-up set is the session's own: the first client wants no SET for it.
        conn.session = url.parameters.clone();
        conn.startup_session = url.parameters.clone();
        conn.send(&buf).await?;
        conn.authenticate(url).await?;
        // Then parameters and the cancel key, up to the first ReadyForQuery.
        loop {
            let frame = conn.read_frame().await?;
            match frame.tag {
                b'Z' => {
                    conn.transaction = frame.body.first().copied().unwrap_or(b'I');
                    return Ok(conn);
                }
                b'E' => return Err(frame.upstream_error(&conn.address)),
                _ => conn.observe(&frame),
            }
        }
    }

    async fn authenticate(&mut self, url: &UpstreamUrl) -> Result<()> {
        let address = self.address.clone();
        let password = || {
            url.password.as_deref().ok_or_else(|| {
                // 28P01, as PostgreSQL refuses a login without the password it asks for.
                let mut e = Error::new(
                    ErrorCode::AuthenticationFailed,
                    format!(
                        "password authentication failed for user \"{}\": the upstream {address} asks sluice for a password it does not hold (see docs/upstream.md, \"Roles\")",
                        url.user
                    ),
                );
                e.upstream = Some(std::sync::Arc::new(vec![
                    (b'S', "FATAL".to_string()),
                    (b'V', "FATAL".to_string()),
                    (b'C', "28P01".to_string()),
                    (b'M', e.message.clone()),
                ]));
                e
            })
        };
        let mut scram: Option<Scram> = None;
        loop {
            let frame = self.read_frame().await?;
            if frame.tag == b'E' {
                return Err(frame.upstream_error(&self.address));
            }
            if frame.tag != b'R' {
                return Err(protocol_error(&format!(
                    "'{}' during authentication",
                    frame.tag as char
                )));
            }
            let mut buf = BytesMut::new();
            match frame.parse()? {
                backend::Message::AuthenticationOk => return Ok(()),
                backend::Message::AuthenticationCleartextPassword => {
                    frontend::password_message(password()?.as_bytes(), &mut buf)
                        .map_err(|e| protocol_error(&e.to_string()))?;
                }
                backend::Message::AuthenticationMd5Password(body) => {
                    let hash = postgres_protocol::authentication::md5_hash(
                        url.user.as_bytes(),
                        password()?.as_bytes(),
                        body.salt(),
                    );
                    frontend::password_message(hash.as_bytes(), &mut buf)
                        .map_err(|e| protocol_error(&e.to_string()))?;
                }
                backend::Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut scram_offered = false;
                    while let Some(m) = mechanisms
                        .next()
                        .map_err(|e| protocol_error(&e.to_string()))?
                    {
                        scram_offered |= m == sasl::SCRAM_SHA_256;
                    }
                    if !scram_offered {
                        return Err(Error::new(
                            ErrorCode::AllConnectionTriesFailed,
                            format!("The upstream {} offers no SASL mechanism sluice speaks (SCRAM-SHA-256 without channel binding)", self.address),
                        ));
                    }
                    // The password when the URL holds the role's, else the role's keys.
                    let state = match (&url.password, &url.scram_keys) {
                        (None, Some(keys)) => Scram::Keyed(scram::KeyedScram::new(keys.clone())),
                        _ => Scram::Password(sasl::ScramSha256::new(
                            password()?.as_bytes(),
                            sasl::ChannelBinding::unsupported(),
                        )),
                    };
                    frontend::sasl_initial_response(sasl::SCRAM_SHA_256, state.message(), &mut buf)
                        .map_err(|e| protocol_error(&e.to_string()))?;
                    scram = Some(state);
                }
                backend::Message::AuthenticationSaslContinue(body) => {
                    let state = scram
                        .as_mut()
                        .ok_or_else(|| protocol_error("a SASL continuation unasked"))?;
                    match state {
                        Scram::Password(state) => state.update(body.data()).map_err(|e| e.to_string()),
                        Scram::Keyed(state) => state.update(body.data()),
                    }
                    .map_err(|e| protocol_error(&format!("SCRAM: {e}")))?;
                    frontend::sasl_response(state.message(), &mut buf)
                        .map_err(|e| protocol_error(&e.to_string()))?;
                }
                backend::Message::AuthenticationSaslFinal(body) => {
                    let state = scram
                        .as_mut()
                        .ok_or_else(|| protocol_error("a SASL final message unasked"))?;
                    match state {
                        Scram::Password(state) => state.finish(body.data()).map_err(|e| e.to_string()),
                        Scram::Keyed(state) => state.finish(body.data()),
                    }
                    .map_err(|e| {
                        Error::new(
                            ErrorCode::AllConnectionTriesFailed,
                            format!("The upstream {} failed SCRAM's server proof: {e}", self.address),
                        )
                    })?;
                    continue;
                }
                _ => {
                    return Err(Error::new(
                        ErrorCode::AllConnectionTriesFailed,
                        format!("The upstream {} asks for an authentication method sluice does not speak (Kerberos, GSS or SSPI)", self.address),
                    ))
                }
            }
            self.send(&buf).await?;
        }
    }

    /// Keeps what sluice must know of a message passing by: parameters and the cancel key.
    fn observe(&mut self, frame: &Frame) {
        match frame.tag {
            b'S' => {
                if let Ok(backend::Message::ParameterStatus(p)) = frame.parse() {
                    if let (Ok(name), Ok(value)) = (p.name(), p.value()) {
                        let (name, value) = (name.to_string(), value.to_string());
                        match self.parameters.iter_mut().find(|(n, _)| *n == name) {
                            Some(slot) => slot.1 = value,
                            None => self.parameters.push((name, value)),
                        }
                    }
                }
            }
            b'K' => {
                if let Ok(backend::Message::BackendKeyData(k)) = frame.parse() {
                    self.cancel = Some(CancelToken {
                        address: self.address.clone(),
                        process_id: k.process_id(),
                        secret_key: k.secret_key(),
                    });
                }
            }
            b'Z' => self.ready_for_query(frame.body.first().copied()),
            _ => {}
        }
    }

    /// Whether its socket is registered with the runtime of the current thread (or where it
    /// is registered does not matter).
    pub fn is_home(&self) -> bool {
        self.is_home_at(current_home())
    }

    /// [`UpstreamConnection::is_home`] with the current thread's [`current_home`] at hand.
    pub fn is_home_at(&self, here: Option<std::thread::ThreadId>) -> bool {
        here.is_none() || here == self.home
    }

    /// The connection with its socket registered with the current thread's runtime, so that
    /// its readiness wakes this thread directly instead of through the thread it was opened
    /// on (connections run on a thread each: `sluice_server::threads`). An encrypted
    /// connection stays where it is (correct, one cross-thread wake-up a read slower).
    pub fn at_home(mut self) -> std::io::Result<UpstreamConnection> {
        if self.is_home() {
            return Ok(self);
        }
        self.stream = match self.stream {
            tls::Stream::Plain(socket) => {
                tls::Stream::Plain(TcpStream::from_std(socket.into_std()?)?)
            }
            encrypted => {
                return Ok(UpstreamConnection {
                    stream: encrypted,
                    ..self
                })
            }
        };
        self.home = current_home();
        Ok(self)
    }

    /// Whether the connection is still open and quiet, as an idle one must be: the upstream
    /// has not closed it (a restart, `pg_terminate_backend`) nor said anything unasked (a
    /// FATAL message before closing). Reads nothing if so.
    pub fn is_usable(&mut self) -> bool {
        if self.awaiting > 0 || !self.read.is_empty() {
            return false;
        }
        self.stream.is_quiet()
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        self.stream.is_tls()
    }

    /// The upstream's `host:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The upstream backend's process id (`None` if the upstream sent no key).
    pub fn backend_pid(&self) -> Option<i32> {
        self.cancel.as_ref().map(|c| c.process_id)
    }

    /// How to cancel what this connection runs (`None` if the upstream sent no key).
    pub fn cancel_token(&self) -> Option<CancelToken> {
        self.cancel.clone()
    }

    /// Sends frontend messages as they are (a client's Query, Parse, Bind, …).
    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream
            .write_all(bytes)
            .await
            .map_err(|e| self.lost(&e.to_string()))
    }

    /// Sends a simple-protocol Query for `sql`.
    pub async fn query(&mut self, sql: &str) -> Result<()> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf).map_err(|e| protocol_error(&e.to_string()))?;
        self.send(&buf).await?;
        self.awaiting += 1;
        Ok(())
    }

    /// The next backend message, as it came (parameters, keys and transaction status noted
    /// on the way).
    pub async fn read_frame(&mut self) -> Result<Frame> {
        loop {
            if let Some(frame) = self.buffered_frame() {
                return frame;
            }
            self.read_more().await?;
        }
    }

    /// Reads what the upstream sent next into the connection's buffer (at least a byte),
    /// where [`UpstreamConnection::peek_message`] and `buffered_frame` find it. Cancel-safe.
    pub async fn read_more(&mut self) -> Result<()> {
        let n = self
            .stream
            .read_buf(&mut self.read)
            .await
            .map_err(|e| self.lost(&e.to_string()))?;
        if n == 0 {
            return Err(self.lost("the connection closed"));
        }
        Ok(())
    }

    /// The next backend message if it has already been read whole, without waiting (for the
    /// relay: most of a response arrives in one read, and its messages need no future each).
    /// `None` when more must be read first (room for the whole message is made then).
    pub fn buffered_frame(&mut self) -> Option<Result<Frame>> {
        if self.read.len() < 5 {
            return None;
        }
        let len = i32::from_be_bytes([self.read[1], self.read[2], self.read[3], self.read[4]]);
        let Some(len) = usize::try_from(len)
            .ok()
            .filter(|&l| (4..=MAX_FRAME).contains(&l))
        else {
            return Some(Err(protocol_error(&format!("a message length of {len}"))));
        };
        if self.read.len() <= len {
            self.read.reserve(len + 1 - self.read.len());
            return None;
        }
        let tag = self.read[0];
        self.read.advance(5);
        let body = self.read.split_to(len - 4).freeze();
        let frame = Frame { tag, body };
        self.observe(&frame);
        self.release_large_buffer();
        Some(Ok(frame))
    }

    /// The next message if it has been read whole, left where it is: its bytes as they came
    /// (type, length word, body), for a relay that copies them on and then
    /// [`UpstreamConnection::pass`]es them. Unlike [`UpstreamConnection::buffered_frame`] it
    /// takes nothing apart: most of an answer (rows, completions, descriptions,
    /// ReadyForQuery) only passes through. `None` when more must be read first or the length
    /// is out of bounds (`buffered_frame` says so then).
    pub fn peek_message(&self) -> Option<&[u8]> {
        let read = &self.read[..];
        let header: [u8; 5] = read.get(..5)?.try_into().ok()?;
        let len = usize::try_from(i32::from_be_bytes([
            header[1], header[2], header[3], header[4],
        ]))
        .ok()
        .filter(|&l| (4..=MAX_FRAME).contains(&l))?;
        read.get(..1 + len)
    }

    /// Takes the `len` bytes of the message [`UpstreamConnection::peek_message`] showed, noting
    /// what sluice keeps of it as [`UpstreamConnection::buffered_frame`] does.
    ///
    /// REQUIRES: `len` is the length of the message `peek_message` returned last.
    pub fn pass(&mut self, len: usize) {
        match self.read[0] {
            b'Z' => self.ready_for_query(self.read.get(5).copied()),
            b'S' | b'K' => {
                let frame = Frame {
                    tag: self.read[0],
                    body: Bytes::copy_from_slice(&self.read[5..len]),
                };
                self.observe(&frame);
            }
            _ => {}
        }
        self.read.advance(len);
        self.release_large_buffer();
    }

    /// The bytes its read buffer holds on to between messages (allocated, used or not).
    pub fn read_buffer_capacity(&self) -> usize {
        self.read.capacity()
    }

    /// Once a message larger than [`KEPT_READ_BUFFER`] has been taken and nothing is left in
    /// the buffer, the buffer goes: a connection that once carried a 50 MB value would
    /// otherwise keep 50 MB for the rest of its life in the pool.
    fn release_large_buffer(&mut self) {
        if self.read.is_empty() && self.read.capacity() > KEPT_READ_BUFFER {
            self.read = BytesMut::with_capacity(8192);
        }
    }

    /// A ReadyForQuery with transaction status `status` came: one answer less awaited.
    fn ready_for_query(&mut self, status: Option<u8>) {
        self.transaction = status.unwrap_or(b'I');
        self.awaiting = self.awaiting.saturating_sub(1);
    }

    /// Asks the upstream what `sql` takes and gives without running it: Parse, Describe and
    /// Sync of the unnamed statement (`param_types`: OIDs the client declared, 0 to let the
    /// upstream infer). `Err(frame)` carries the upstream's ErrorResponse (a syntax error, an
    /// unknown column), as it came; the connection is idle again either way.
    pub async fn describe(
        &mut self,
        sql: &str,
        param_types: &[u32],
    ) -> Result<std::result::Result<Described, Frame>> {
        let mut buf = BytesMut::new();
        frontend::parse("", sql, param_types.iter().copied(), &mut buf)
            .map_err(|e| protocol_error(&e.to_string()))?;
        frontend::describe(b'S', "", &mut buf).map_err(|e| protocol_error(&e.to_string()))?;
        frontend::sync(&mut buf);
        self.send(&buf).await?;
        self.awaiting += 1;
        let mut described = Described {
            parameters: Vec::new(),
            rows: None,
        };
        let mut error = None;
        for frame in self.read_response().await? {
            match frame.tag {
                b't' => {
                    if let Ok(backend::Message::ParameterDescription(body)) = frame.parse() {
                        let mut oids = body.parameters();
                        while let Ok(Some(oid)) = oids.next() {
                            described.parameters.push(oid);
                        }
                    }
                }
                b'T' => described.rows = Some(frame),
                b'E' => error = Some(frame),
                _ => {} // ParseComplete, NoData, ReadyForQuery
            }
        }
        Ok(match error {
            Some(e) => Err(e),
            None => Ok(described),
        })
    }

    /// Reads the rest of a response: every message up to and including ReadyForQuery.
    pub async fn read_response(&mut self) -> Result<Vec<Frame>> {
        let mut frames = Vec::new();
        loop {
            let frame = self.read_frame().await?;
            let done = frame.tag == b'Z';
            frames.push(frame);
            if done {
                return Ok(frames);
            }
        }
    }

    /// Makes the session's run-time parameters `wanted` (names as a client gives them,
    /// compared without case): a parameter the last client set and this one does not is
    /// `RESET`, one whose value differs is set (`set_config`, as a start-up packet's value
    /// would be), the rest are left alone, so clients that want the same parameters cost no
    /// round trip. `Ok(Some(frame))` is the upstream's ErrorResponse (an unknown parameter, a
    /// value it refuses): the connection then counts as changed ([`Self::dirty`]), so it is
    /// reset before it is lent again.
    pub async fn apply_session(&mut self, wanted: &[(String, String)]) -> Result<Option<Frame>> {
        let Some(sql) = session_sql(&self.session, wanted) else {
            return Ok(None);
        };
        self.query(&sql).await?;
        let error = self
            .read_response()
            .await?
            .into_iter()
            .find(|f| f.tag == b'E');
        if error.is_some() {
            // Unknown now: the connection is reset before it is lent again.
            self.dirty = true;
        } else {
            self.session = wanted.to_vec();
        }
        Ok(error)
    }

    /// Ends the session politely.
    pub async fn terminate(mut self) {
        let mut buf = BytesMut::new();
        frontend::terminate(&mut buf);
        let _ = self.stream.write_all(&buf).await;
    }

    fn lost(&self, why: &str) -> Error {
        Error::new(
            ErrorCode::AllConnectionTriesFailed,
            format!(
                "The connection to the upstream {} was lost: {why}",
                self.address
            ),
        )
    }
}

/// sluice's side of a SCRAM exchange with the upstream: with the URL's password, or with the
/// keys a client's login revealed.
enum Scram {
    Password(sasl::ScramSha256),
    Keyed(scram::KeyedScram),
}

impl Scram {
    fn message(&self) -> &[u8] {
        match self {
            Scram::Password(state) => state.message(),
            Scram::Keyed(state) => state.message(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn prepared_names_close_the_one_used_longest_ago() {
        let mut names = super::PreparedNames::default();
        assert_eq!(names.use_name("a", 2), (true, None));
        assert_eq!(names.use_name("b", 2), (true, None));
        // `a` used again: `b` is now the oldest.
        assert_eq!(names.use_name("a", 2), (false, None));
        assert_eq!(names.use_name("c", 2), (true, Some("b".to_string())));
        assert_eq!(names.len(), 2);
        assert!(names.contains("a") && names.contains("c") && !names.contains("b"));
        // A close the upstream skipped: `b` is still there, the first to go next.
        names.keep("b".to_string());
        assert_eq!(names.use_name("d", 3), (true, Some("b".to_string())));
        names.remove("d");
        assert!(!names.contains("d"));
    }

    use super::*;

    #[test]
    fn urls_parse_and_never_show_the_password() {
        let url =
            UpstreamUrl::parse("postgres://app:s%40cret@db.example:6432/sales?sslmode=disable")
                .expect("parses");
        assert_eq!(url.host, "db.example");
        assert_eq!(url.port, 6432);
        assert_eq!(url.user, "app");
        assert_eq!(url.password.as_deref(), Some("s@cret"));
        assert_eq!(url.database, "sales");
        assert_eq!(url.sslmode, SslMode::Disable);
        assert_eq!(format!("{url:?}"), "postgres://app@db.example:6432/sales");
        let url = UpstreamUrl::parse("postgresql://me@[::1]/").expect("parses");
        assert_eq!(
            (url.address().as_str(), url.database.as_str()),
            ("[::1]:5432", "me")
        );
        for bad in [
            "mysql://a@b/c",
            "postgres://b/c",
            "postgres://a:pw@/c",
            "postgres://a:pw@b/c?sslmode=disable&bogus=1",
            "not a url",
        ] {
            let e = UpstreamUrl::parse(bad).expect_err(bad);
            assert_eq!(e.code, ErrorCode::BadArguments, "{bad}");
            assert!(!e.message.contains("pw"), "{bad}: {}", e.message);
        }
    }
}

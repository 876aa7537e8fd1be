//! One client connection: its settings, statement routing, admission, and the pgwire handlers
//! (startup, simple and extended query). Each text is lexed once into
//! [`sluice_sql::ClientStatement`]s, and routing is a match on that enum:
//! 1. workload DDL (`CREATE|DROP WORKLOAD|RESOURCE`) → the catalog;
//! 2. session settings (`SET|RESET|SHOW workload`, and other `SET`s clients send at connect);
//! 3. conveniences: `SHOW WORKLOADS`, `SHOW RESOURCES`, `SHOW CREATE WORKLOAD|RESOURCE name`;
//! 4. transaction control, answered with the tags drivers expect (the embedded engine has no
//!    transactions; a `ROLLBACK` that cannot undo writes says so);
//! 5. any other statement (a [`Query`], its `SETTINGS` tail already off): admitted through
//!    every QUERY resource's scheduler in its workload, then run by the engine, its rows
//!    streamed to the client batch by batch while the permits are held.
//!
//! While a statement waits or runs, the connection's [`ClientWatch`] notices a client that
//! went away, and the statement is dropped: its queue place or its permits are freed at once.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures::{stream, Sink, SinkExt, Stream, StreamExt};
use pgwire::api::auth::{
    protocol_negotiation, save_startup_parameters_to_metadata, DefaultServerParameterProvider,
    ServerParameterProvider, StartupHandler,
};
use pgwire::api::copy::send_copy_out_response;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{
    send_describe_response, send_execution_response, send_query_response, ExtendedQueryHandler,
    SimpleQueryHandler,
};
use pgwire::api::results::CopyResponse;
use pgwire::api::results::{
    DescribePortalResponse, DescribeStatementResponse, FieldFormat, FieldInfo, QueryResponse,
    Response, Tag,
};
use pgwire::api::stmt::{NoopQueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionGuard, ConnectionHandle, ConnectionManager,
    PgWireConnectionState, PidSecretKeyGenerator, RandomPidSecretKeyGenerator, Type, METADATA_USER,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::CopyData;
use pgwire::messages::extendedquery::{Describe, TARGET_TYPE_BYTE_PORTAL};
use pgwire::messages::response::{ReadyForQuery, TransactionStatus};
use pgwire::messages::startup::{Authentication, BackendKeyData, ParameterStatus};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use sluice_engine::datafusion::arrow::array::StringArray;
use sluice_engine::datafusion::arrow::datatypes::{DataType, Field, Schema};
use sluice_engine::datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::datafusion::common::ScalarValue;
use sluice_engine::{collected, BatchStream, ExecuteOptions, QueryOutput, Session};
use sluice_sql::{
    ClientStatement, CopyFormat, EntityKind, Error, ErrorCode, Query, Result, StatementKind,
    TransactionControl,
};

use crate::encode;
use crate::error::to_pg;
use crate::params;
use crate::record::RunRecord;
use crate::settings::{query_settings, startup_settings, QuerySettings};
use crate::state::{access_denied, shutting_down, Attachment, CancelKey, Grant, Phase, Shared};
use crate::watch::ClientWatch;

/// What a statement tells the client besides its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Notice,
    Warning,
}

/// Where a statement's notices go while it runs: the client, or nowhere.
#[async_trait]
pub trait Notices: Send {
    async fn notice(&mut self, severity: Severity, sqlstate: &str, text: String);
}

/// Notices dropped (`sluice local`).
#[derive(Debug)]
pub struct NoNotices;

#[async_trait]
impl Notices for NoNotices {
    async fn notice(&mut self, _severity: Severity, _sqlstate: &str, _text: String) {}
}

/// Notices sent to the client as NoticeResponse messages, at once (before the statement's
/// result), so psql prints them while the statement waits.
pub(crate) struct ClientNotices<'a, C>(pub &'a mut C);

#[async_trait]
impl<C> Notices for ClientNotices<'_, C>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
{
    async fn notice(&mut self, severity: Severity, sqlstate: &str, text: String) {
        let severity = match severity {
            Severity::Notice => "NOTICE",
            Severity::Warning => "WARNING",
        };
        let info = ErrorInfo::new(severity.to_owned(), sqlstate.to_owned(), text);
        // A client gone away is noticed by the statement's own I/O; nothing to do here.
        let _ = self
            .0
            .send(PgWireBackendMessage::NoticeResponse(info.into()))
            .await;
    }
}

/// Where a transaction block stands (the embedded engine runs each statement on its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    None,
    Open { wrote: bool },
}

/// A connection's handlers and state.
pub struct Connection {
    shared: Arc<Shared>,
    /// Its engine session, made at its first engine statement (see [`Connection::session`]).
    session: std::sync::OnceLock<Box<dyn Session>>,
    /// Session variables: `workload`, and whatever else clients `SET`.
    /// (foldhash: every statement looks its workload up here.)
    vars: Mutex<HashMap<String, String, foldhash::fast::RandomState>>,
    block: Mutex<Block>,
    manager: Arc<ConnectionManager>,
    parser: Arc<NoopQueryParser>,
    watch: Arc<ClientWatch>,
    /// This connection's cancel key, registered at its first statement.
    cancel: std::sync::OnceLock<CancelKey>,
    /// Notified by `pg_terminate_backend`: the connection closes (its message loop watches).
    pub terminate: Arc<crate::state::Flag>,
    /// Open cursors by name (`DECLARE`, `FETCH`, `CLOSE`).
    cursors: tokio::sync::Mutex<HashMap<String, Cursor>>,
    /// The fingerprints of the statements this connection ran lately, by text with literals
    /// cut out: a client repeats its statements, and a fingerprint costs a second lexing pass.
    fingerprints: Mutex<HashMap<String, Arc<sluice_sql::Fingerprint>, foldhash::fast::RandomState>>,
    /// The client's address (`None`: not on TCP), for classifiers' `client_addr`.
    peer: Option<std::net::IpAddr>,
    /// The database named at start-up, for classifiers' `database`.
    database: std::sync::OnceLock<String>,
    /// The user it logged in as (see [`Connection::user`]).
    user: std::sync::OnceLock<Arc<str>>,
    /// The workload its last statement was admitted in, shared by that statement's records
    /// and by the next one's when it runs there too (most do).
    last_workload: Mutex<Option<Arc<str>>>,
    /// The metrics series its statements were admitted under, by resource and workload (a
    /// connection uses few; series live as long as the server).
    series: Mutex<Vec<KeptSeries>>,
}

/// Texts whose fingerprints a connection keeps (all are dropped when it is full).
const FINGERPRINTS_KEPT: usize = 256;

/// Metrics series a connection keeps at hand (the oldest goes when it is full).
const SERIES_KEPT: usize = 8;

/// A metrics series kept at hand: its resource, its workload, the series.
type KeptSeries = (String, Arc<str>, Arc<crate::metrics::Series>);

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(key) = self.cancel.get() {
            self.shared.forget_cancel(key);
        }
    }
}

impl Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

/// What admission keeps of a statement between its runs, made at its first (a prepared
/// statement runs many times; one run's text gets a memo of its own, used once).
#[derive(Debug, Clone, Default)]
pub(crate) struct StatementMemo {
    /// Its fingerprint (otherwise looked up by text at each run).
    fingerprint: std::sync::OnceLock<Arc<sluice_sql::Fingerprint>>,
    /// Its text, shared by each run's `system.processes` entry and record.
    text: std::sync::OnceLock<Arc<str>>,
}

/// What `slot` keeps (made now if it is empty), or, without a slot, `make`'s.
fn kept<T: Clone>(slot: Option<&std::sync::OnceLock<T>>, make: impl FnOnce() -> T) -> T {
    match slot {
        Some(slot) => slot.get_or_init(make).clone(),
        None => make(),
    }
}

/// What a statement holds until its last row is sent, dropped in this order: its
/// `system.processes` entry first (so it is never seen running beside its successor), then
/// its grant (permits, gauges, memory), then its demotion timer. `Held::default()` holds
/// nothing (sluice's own answers).
#[derive(Default)]
pub(crate) struct Held {
    _process: Option<crate::state::ProcessGuard>,
    _grant: Option<Arc<Mutex<Grant>>>,
    _demoter: Option<crate::demotion::AbortOnDrop>,
}

/// A statement admitted by every resource its workload asks for, not yet run.
pub(crate) struct Admitted {
    /// First, so dropped first: its process entry, grant and demotion timer.
    pub hold: Held,
    pub grant: Arc<Mutex<Grant>>,
    /// The CPU threads it holds (its parallelism); `None`: no CPU resource applies.
    pub threads: Option<usize>,
    pub memory: Option<Arc<crate::memory::StatementMemory>>,
    /// `reserve_memory`: the bytes its memory was admitted with.
    pub reserve_memory: u64,
    /// What ends it early: a cancel, a kill, its client going away, `max_execution_time`.
    pub stop: Stop,
}

/// A result on its way to the client: rows (with what must stay held until they are sent) or
/// a command tag.
enum Outcome {
    Rows {
        schema: Arc<Schema>,
        batches: BatchStream,
        hold: Held,
    },
    /// Rows for `COPY … TO STDOUT`.
    CopyOut {
        schema: Arc<Schema>,
        batches: BatchStream,
        hold: Held,
        format: CopyFormat,
    },
    /// Rows fetched from a cursor (`FETCH n`).
    Fetched {
        schema: Arc<Schema>,
        batches: Vec<RecordBatch>,
    },
    Command(Tag),
}

/// An open cursor: the rows of its query as they stream, and what the query holds (its slot
/// stays taken until the cursor is closed, as in PostgreSQL).
struct Cursor {
    schema: Arc<Schema>,
    batches: BatchStream,
    /// Rows of a batch a `FETCH` took only part of.
    pending: Option<RecordBatch>,
    /// `WITH HOLD`: outlives the transaction block.
    with_hold: bool,
    _hold: Held,
}

impl Cursor {
    /// Up to `count` more rows (all that are left for `None`).
    async fn fetch(&mut self, count: Option<u64>) -> Result<Vec<RecordBatch>> {
        let mut want = count.map_or(usize::MAX, |n| n as usize);
        let mut out = Vec::new();
        while want > 0 {
            let batch = match self.pending.take() {
                Some(batch) => batch,
                None => match self.batches.next().await {
                    Some(batch) => batch?,
                    None => break,
                },
            };
            if batch.num_rows() > want {
                out.push(batch.slice(0, want));
                self.pending = Some(batch.slice(want, batch.num_rows() - want));
                want = 0;
            } else {
                want -= batch.num_rows();
                out.push(batch);
            }
        }
        Ok(out)
    }
}

/// What ends an admitted statement early, whichever comes first: its [`Control`] stopped (a
/// cancel request, `KILL QUERY`, an eviction, the shutdown's grace running out), its client
/// going away, its `max_execution_time`. A future polled by the statement's connection only;
/// nothing is registered anywhere until it is first polled, and a statement that answers at
/// once never polls it.
///
/// [`Control`]: crate::state::Control
pub(crate) struct Stop {
    control: Arc<crate::state::Control>,
    watch: Arc<ClientWatch>,
    watching: crate::watch::Watching,
    timeout: Option<Timeout>,
}

/// A statement's `max_execution_time`: its timer is made when the stop is first polled.
struct Timeout {
    at: tokio::time::Instant,
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// For the error's word on a demotion.
    grant: Option<Arc<Mutex<Grant>>>,
}

impl Future for Stop {
    type Output = Error;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Error> {
        if let Poll::Ready(e) = self.control.poll_stopped(cx) {
            return Poll::Ready(e);
        }
        if let Some(timeout) = self.timeout.as_mut() {
            let at = timeout.at;
            let timer = timeout
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(timeout_exceeded(timeout.limit, timeout.grant.as_ref()));
            }
        }
        let this = &mut *self;
        match this.watch.poll_gone(cx, &mut this.watching) {
            Poll::Ready(()) => Poll::Ready(client_gone()),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A statement's rows, ended by its [`Stop`]: the error is the last item.
///
/// The stop is looked at whenever the rows are not ready, and every [`STOP_EVERY`] batches
/// while they are: a statement that answers at once (`SELECT 1`) never arms its timers.
struct Stoppable {
    batches: BatchStream,
    stop: Option<Stop>,
    since_stop: usize,
    /// Counts the rows and notes how the statement ended.
    record: Option<RunRecord>,
}

/// Batches a ready stream may yield before its stop is looked at again.
const STOP_EVERY: usize = 16;

impl Stoppable {
    fn new(batches: BatchStream, stop: Stop, record: Option<RunRecord>) -> Stoppable {
        Stoppable {
            batches,
            stop: Some(stop),
            since_stop: 0,
            record,
        }
    }

    fn stopped(&mut self, e: Error) -> Poll<Option<Result<RecordBatch>>> {
        if let Some(record) = self.record.as_mut() {
            record.failed(&e);
        }
        Poll::Ready(Some(Err(e)))
    }

    fn poll_stop(&mut self, cx: &mut Context<'_>) -> Option<Error> {
        self.since_stop = 0;
        let stop = self.stop.as_mut()?;
        match Pin::new(stop).poll(cx) {
            Poll::Ready(e) => {
                self.stop = None;
                Some(e)
            }
            Poll::Pending => None,
        }
    }
}

impl Stream for Stoppable {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.stop.is_none() {
            return Poll::Ready(None);
        }
        if self.since_stop >= STOP_EVERY {
            if let Some(e) = self.poll_stop(cx) {
                return self.stopped(e);
            }
        }
        match self.batches.as_mut().poll_next(cx) {
            Poll::Pending => match self.poll_stop(cx) {
                Some(e) => self.stopped(e),
                None => Poll::Pending,
            },
            Poll::Ready(Some(Ok(batch))) => {
                self.since_stop += 1;
                if let Some(record) = self.record.as_mut() {
                    record.add_rows(batch.num_rows());
                }
                Poll::Ready(Some(Ok(batch)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.stop = None;
                self.stopped(e)
            }
            Poll::Ready(None) => {
                self.stop = None;
                if let Some(record) = self.record.as_mut() {
                    record.finished();
                }
                Poll::Ready(None)
            }
        }
    }
}

impl Connection {
    pub fn new(shared: Arc<Shared>, manager: Arc<ConnectionManager>, watch: ClientWatch) -> Self {
        Connection {
            shared,
            session: std::sync::OnceLock::new(),
            vars: Mutex::default(),
            block: Mutex::new(Block::None),
            manager,
            parser: Arc::new(NoopQueryParser::new()),
            watch: Arc::new(watch),
            cancel: std::sync::OnceLock::new(),
            terminate: Arc::default(),
            cursors: tokio::sync::Mutex::default(),
            fingerprints: Mutex::default(),
            peer: None,
            database: std::sync::OnceLock::new(),
            user: std::sync::OnceLock::new(),
            last_workload: Mutex::default(),
            series: Mutex::default(),
        }
    }

    /// What the server shares.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The connection's engine session. Made when first asked for: an embedded session costs
    /// as much as hundreds of forwarded statements (DataFusion registers every function in
    /// it), and in upstream mode most connections never run a statement on the engine.
    fn session(&self) -> &dyn Session {
        self.session
            .get_or_init(|| self.shared.engine.session())
            .as_ref()
    }

    /// The connection's client is at `peer`.
    pub fn with_peer(mut self, peer: std::net::SocketAddr) -> Self {
        self.peer = Some(peer.ip());
        self
    }

    fn var(&self, name: &str) -> Option<String> {
        self.with_var(name, |v| v.map(str::to_string))
    }

    /// `f` of session variable `name`, read in place.
    fn with_var<R>(&self, name: &str, f: impl FnOnce(Option<&str>) -> R) -> R {
        let vars = self.vars.lock().unwrap_or_else(|p| p.into_inner());
        f(vars.get(name).map(String::as_str))
    }

    fn set_var(&self, name: &str, value: Option<String>) {
        let mut vars = self.vars.lock().unwrap_or_else(|p| p.into_inner());
        match value {
            Some(v) => vars.insert(name.to_string(), v),
            None => vars.remove(name),
        };
    }

    fn block(&self) -> std::sync::MutexGuard<'_, Block> {
        self.block.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run(
        &self,
        user: &Arc<str>,
        statement: ClientStatement,
        params: Vec<ScalarValue>,
        notices: &mut dyn Notices,
    ) -> Result<Outcome> {
        let takes_params = matches!(
            statement,
            ClientStatement::Query(_)
                | ClientStatement::Declare { .. }
                | ClientStatement::CopyOut { .. }
        );
        if !params.is_empty() && !takes_params {
            return Err(Error::new(
                ErrorCode::BadArguments,
                "only queries take bind parameters; send this statement without them",
            ));
        }
        match statement {
            ClientStatement::Workload(stmt) => {
                if !self.shared.logins.is_admin(user) {
                    return Err(Error::new(
                        ErrorCode::AccessDenied,
                        format!("{user}: Not enough privileges. To change workloads and resources, the user needs admin = true in [[users]]"),
                    ));
                }
                self.shared.apply_ddl(&stmt).await?;
                let tag = match &stmt {
                    sluice_sql::Statement::CreateWorkload(_) => "CREATE WORKLOAD",
                    sluice_sql::Statement::CreateResource(_) => "CREATE RESOURCE",
                    sluice_sql::Statement::CreateClassifier(_) => "CREATE CLASSIFIER",
                    sluice_sql::Statement::Drop(d) => match d.kind {
                        EntityKind::Workload => "DROP WORKLOAD",
                        EntityKind::Resource => "DROP RESOURCE",
                        EntityKind::Classifier => "DROP CLASSIFIER",
                    },
                };
                Ok(Outcome::Command(Tag::new(tag)))
            }
            ClientStatement::KillQuery { predicate, mode } => {
                let matched = self.matching(user, &predicate).await?;
                let batch = crate::operator::kill(&self.shared, user, matched, mode).await?;
                Ok(batch_outcome(batch))
            }
            ClientStatement::MoveQuery {
                predicate,
                workload,
            } => {
                let matched = self.matching(user, &predicate).await?;
                Ok(batch_outcome(crate::operator::move_to(
                    &self.shared,
                    matched,
                    &workload,
                )?))
            }
            ClientStatement::SignalBackend { pid, terminate } => Ok(batch_outcome(
                crate::operator::signal_backend(&self.shared, user, pid, terminate)?,
            )),
            ClientStatement::Fingerprint { id, workload } => {
                if !self.shared.logins.is_admin(user) {
                    return Err(Error::new(
                        ErrorCode::AccessDenied,
                        format!("{user}: Not enough privileges. To pin or forget fingerprints, the user needs admin = true in [[users]]"),
                    ));
                }
                match workload {
                    Some(workload) => {
                        let snapshot = self.shared.snapshot();
                        if snapshot.catalog.workload(&workload).is_none() {
                            return Err(Error::bad_arguments(format!(
                                "Workload '{workload}' doesn't exist; a fingerprint is pinned to a leaf workload (SHOW WORKLOADS lists them)"
                            )));
                        }
                        if snapshot.catalog.children_of(&workload).next().is_some() {
                            return Err(Error::new(
                                ErrorCode::InvalidSchedulerNode,
                                format!("Workload '{workload}' has children; queries run in leaf workloads only"),
                            ));
                        }
                        self.shared.lanes.pin(&id, &workload)?;
                        Ok(Outcome::Command(Tag::new("PIN FINGERPRINT")))
                    }
                    None => {
                        if !self.shared.lanes.forget(&id)? {
                            return Err(Error::bad_arguments(format!(
                                "Fingerprint '{id}' has no lane to forget (system.fingerprints shows each one's lane)"
                            )));
                        }
                        Ok(Outcome::Command(Tag::new("FORGET FINGERPRINT")))
                    }
                }
            }
            ClientStatement::Set { name, value, reset } => {
                if name == "workload" {
                    if let Some(v) = &value {
                        self.check_pinned(user, v)?;
                    }
                }
                if name == "timezone" && self.shared.upstream.is_none() {
                    // The engine reads and shows timestamptz values in it; RESET is UTC.
                    self.session()
                        .set_time_zone(value.as_deref().unwrap_or("UTC"))
                        .await?;
                }
                self.set_var(&name, value);
                Ok(Outcome::Command(Tag::new(if reset {
                    "RESET"
                } else {
                    "SET"
                })))
            }
            ClientStatement::Show(name) => {
                let value = if name == "workload" {
                    self.workload_of(user, None)?
                } else if name == "server_version" {
                    // As announced at start-up (upstream mode forwards this SHOW).
                    sluice_engine::pg_catalog::server_version()
                } else if name == "timezone" {
                    self.var(&name).unwrap_or_else(|| "UTC".to_string())
                } else {
                    self.var(&name).unwrap_or_default()
                };
                Ok(one_column(&name, vec![value]))
            }
            ClientStatement::ShowEntities(kind) => {
                let snapshot = self.shared.snapshot();
                let names: Vec<String> = match kind {
                    EntityKind::Workload => snapshot
                        .catalog
                        .workloads()
                        .map(|w| w.name.clone())
                        .collect(),
                    EntityKind::Resource => snapshot
                        .catalog
                        .resources()
                        .map(|r| r.name.clone())
                        .collect(),
                    EntityKind::Classifier => snapshot
                        .catalog
                        .classifiers()
                        .map(|c| c.entity.name().to_string())
                        .collect(),
                };
                Ok(one_column("name", names))
            }
            ClientStatement::ShowCreate { kind, name } => {
                let snapshot = self.shared.snapshot();
                let stored = snapshot.catalog.entity(kind, &name).ok_or_else(|| {
                    Error::new(
                        ErrorCode::ResourceNotFound,
                        format!("Workload entity '{name}' doesn't exist"),
                    )
                })?;
                Ok(one_column(
                    "create_query",
                    vec![stored.entity.create_query()],
                ))
            }
            ClientStatement::Transaction(control) => {
                let was = std::mem::replace(
                    &mut *self.block(),
                    match control {
                        TransactionControl::Begin => Block::Open { wrote: false },
                        _ => Block::None,
                    },
                );
                if control != TransactionControl::Begin {
                    // The block's cursors end with it, unless declared WITH HOLD.
                    self.cursors.lock().await.retain(|_, c| c.with_hold);
                }
                if control == TransactionControl::Rollback && was == (Block::Open { wrote: true }) {
                    notices
                        .notice(
                            Severity::Warning,
                            "01000",
                            "ROLLBACK did not undo this block's writes: sluice's embedded engine has no transactions, each statement took effect when it ran".into(),
                        )
                        .await;
                }
                Ok(Outcome::Command(Tag::new(control.tag())))
            }
            ClientStatement::Declare { name, hold, query } => {
                if self.cursors.lock().await.contains_key(&name) {
                    return Err(Error::new(
                        ErrorCode::BadArguments,
                        format!("cursor \"{name}\" already exists"),
                    )
                    .with_sqlstate("42P03"));
                }
                let Outcome::Rows {
                    schema,
                    batches,
                    hold: held,
                } = self.run_query(user, query, params, notices).await?
                else {
                    return Err(Error::new(
                        ErrorCode::BadArguments,
                        "a cursor's query must return rows",
                    )
                    .with_sqlstate("42P11"));
                };
                let cursor = Cursor {
                    schema,
                    batches,
                    pending: None,
                    with_hold: hold,
                    _hold: held,
                };
                self.cursors.lock().await.insert(name, cursor);
                Ok(Outcome::Command(Tag::new("DECLARE CURSOR")))
            }
            ClientStatement::Fetch { name, count } => {
                let mut cursors = self.cursors.lock().await;
                let cursor = cursors.get_mut(&name).ok_or_else(|| no_cursor(&name))?;
                match cursor.fetch(count).await {
                    Ok(batches) => Ok(Outcome::Fetched {
                        schema: cursor.schema.clone(),
                        batches,
                    }),
                    Err(e) => {
                        cursors.remove(&name);
                        Err(e)
                    }
                }
            }
            ClientStatement::CopyOut { query, format } => {
                match self.run_query(user, query, params, notices).await? {
                    Outcome::Rows {
                        schema,
                        batches,
                        hold,
                    } => Ok(Outcome::CopyOut {
                        schema,
                        batches,
                        hold,
                        format,
                    }),
                    _ => Err(Error::new(
                        ErrorCode::BadArguments,
                        "COPY TO STDOUT needs a query that returns rows",
                    )),
                }
            }
            ClientStatement::Close(name) => {
                let mut cursors = self.cursors.lock().await;
                match name {
                    Some(name) => {
                        cursors.remove(&name).ok_or_else(|| no_cursor(&name))?;
                    }
                    None => cursors.clear(),
                }
                Ok(Outcome::Command(Tag::new("CLOSE CURSOR")))
            }
            ClientStatement::Query(query) => {
                if query.kind != StatementKind::Select {
                    if let Block::Open { wrote } = &mut *self.block() {
                        *wrote |= query.kind != StatementKind::Utility;
                    }
                }
                self.run_query(user, query, params, notices).await
            }
        }
    }

    /// The workload a query runs in, classifiers aside: [`Connection::chosen_workload`], else
    /// [`Connection::fallback_workload`].
    fn workload_of(&self, user: &str, requested: Option<String>) -> Result<String> {
        Ok(match self.chosen_workload(user, requested)? {
            Some(w) => w.to_string(),
            None => self.fallback_workload(user).to_string(),
        })
    }

    /// The workload chosen for a query before any classifier is asked: the user's pinned one
    /// (a request for another is refused), else the `SETTINGS` tail's, else the session's.
    ///
    /// Shared with the connection's last statement when it names the same (no copy).
    fn chosen_workload(&self, user: &str, requested: Option<String>) -> Result<Option<Arc<str>>> {
        let requested = match requested {
            Some(r) => Some(self.shared_name(&r)),
            None => self.with_var("workload", |v| v.map(|v| self.shared_name(v))),
        };
        let config = self.shared.users.get(user);
        if let Some(pinned) = config.and_then(|u| u.pinned_workload.as_ref()) {
            if let Some(r) = &requested {
                self.check_pinned(user, r)?;
            }
            return Ok(Some(self.shared_name(pinned)));
        }
        Ok(requested)
    }

    /// Where a query nobody chose a workload for, and no classifier placed, runs: its user's
    /// `default_workload`, else `default`.
    fn fallback_workload(&self, user: &str) -> &str {
        self.shared
            .users
            .get(user)
            .and_then(|u| u.default_workload.as_deref())
            .unwrap_or("default")
    }

    /// The classifiers' verdict on a query nobody chose a workload for: the rule that places
    /// it, with what it was judged on. Dry-run rules that match before it count and log.
    fn classify(
        &self,
        user: &str,
        query: &Query,
        tags: &[(String, String)],
        catalog: &sluice_catalog::Catalog,
    ) -> Option<Arc<crate::state::Classified>> {
        let rules = catalog.rules();
        if rules.is_empty() {
            return None;
        }
        let application_name = self.var("application_name");
        let facts = sluice_catalog::Facts {
            user,
            database: self.database.get().map(String::as_str),
            application_name: application_name.as_deref(),
            client_addr: self.peer,
            statement_kind: query.kind,
            query: &query.text,
            tags,
        };
        let rule = rules.classify(&facts, |dry| {
            tracing::info!(
                classifier = %dry.name,
                would_route_to = %dry.workload,
                user,
                "dry-run classifier matched"
            );
        })?;
        Some(Arc::new(crate::state::Classified {
            rule: rule.clone(),
            facts: sluice_catalog::OwnedFacts::of(&facts),
            fallback: self.fallback_workload(user).to_string(),
        }))
    }

    fn check_pinned(&self, user: &str, workload: &str) -> Result<()> {
        match self.shared.users.get(user).and_then(|u| u.pinned_workload.as_ref()) {
            Some(pinned) if pinned != workload => Err(Error::new(
                ErrorCode::SettingConstraintViolation,
                format!("Setting workload should not be changed: user '{user}' runs in workload '{pinned}' only"),
            )),
            _ => Ok(()),
        }
    }

    /// How long a statement may wait for admission: the query's `workload_admission_timeout_ms`,
    /// else the session's (`SET`), else its user's default; 0 (or nothing) is no limit.
    fn admission_timeout(&self, user: &str, query: Option<Duration>) -> Result<Option<Duration>> {
        let session = self.with_var("workload_admission_timeout_ms", |v| match v {
            None => Ok(None),
            Some(v) => Ok(Some(Duration::from_millis(v.trim().parse::<u64>().map_err(|_| {
                Error::new(
                    ErrorCode::BadArguments,
                    format!("setting 'workload_admission_timeout_ms' takes milliseconds (an integer), got '{v}'"),
                )
            })?))),
        })?;
        let chosen = query.or(session).or_else(|| {
            self.shared
                .users
                .get(user)
                .and_then(|u| u.admission_timeout)
        });
        Ok(chosen.filter(|d| !d.is_zero()))
    }

    /// What ends a statement early, once admitted (see [`Stop`]).
    fn stop(
        &self,
        max_execution_time: Option<Duration>,
        grant: Option<Arc<Mutex<Grant>>>,
        control: Arc<crate::state::Control>,
    ) -> Stop {
        Stop {
            control,
            watch: self.watch.clone(),
            watching: crate::watch::Watching::starting_now(),
            timeout: max_execution_time.map(|limit| Timeout {
                at: tokio::time::Instant::now() + limit,
                limit,
                timer: None,
                grant,
            }),
        }
    }

    async fn run_query(
        &self,
        user: &Arc<str>,
        query: Query,
        params: Vec<ScalarValue>,
        notices: &mut dyn Notices,
    ) -> Result<Outcome> {
        // Declared before the admission so that, however the statement ends (an error, a
        // cancel dropping this future), what it holds goes first and the record after it; the
        // record is written last, when the statement has let go of everything.
        let mut record = None;
        let result = async {
            let admitted = self.admit(user, &query, None, notices, &mut record).await?;
            self.execute_admitted(admitted, &query, params, &mut record)
                .await
        }
        .await;
        if let (Err(e), Some(record)) = (&result, record.as_mut()) {
            record.failed(e);
        }
        result
    }

    /// Admits `query`: its workload (chosen, classified, its lane), its place in
    /// `system.processes`, then every resource its workload's tree asks for. The record of
    /// the run is put in `record` as soon as there is one, so a failure is recorded too.
    pub(crate) async fn admit(
        &self,
        user: &Arc<str>,
        query: &Query,
        memo: Option<&StatementMemo>,
        notices: &mut dyn Notices,
        record: &mut Option<RunRecord>,
    ) -> Result<Admitted> {
        let settings = query_settings(&query.settings)?;
        let chosen = self.chosen_workload(user, settings.workload.clone())?;
        if self.shared.phase() != Phase::Serving {
            return Err(shutting_down(self.shared.phase()));
        }
        let snapshot = self.shared.snapshot();
        let fingerprint = kept(memo.map(|m| &m.fingerprint), || self.fingerprint_of(query));
        let classified = match chosen {
            Some(_) => None,
            None => self.classify(user, query, &fingerprint.tags, &snapshot.catalog),
        };
        let requested = match (chosen, &classified) {
            (Some(w), _) => w,
            (None, Some(c)) => self.shared_name(&c.rule.workload),
            (None, None) => self.shared_name(self.fallback_workload(user)),
        };
        let judged_by = snapshot.catalog.lanes(&requested).demotion;
        let workload = self.lane_of(
            &snapshot.catalog,
            user,
            requested,
            judged_by.as_ref(),
            &fingerprint,
        );
        // One copy of the text for the statement's process entry and its record (none for a
        // prepared statement's run: it keeps its copy).
        let text = kept(memo.map(|m| &m.text), || Arc::from(query.text.as_str()));
        *record = Some(RunRecord::new(
            self.shared.clone(),
            0,
            user,
            &workload,
            fingerprint,
            &text,
            judged_by,
        ));
        self.admit_in(
            user, &workload, classified, &text, settings, notices, record,
        )
        .await
    }

    /// The metrics series of `workload` in `resource`, from the connection's own few.
    fn series(&self, resource: &str, workload: &Arc<str>) -> Arc<crate::metrics::Series> {
        let mut kept = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, s)) = kept
            .iter()
            .find(|(r, w, _)| r == resource && (Arc::ptr_eq(w, workload) || w == workload))
        {
            return s.clone();
        }
        let s = self.shared.metrics.series(resource, workload);
        if kept.len() >= SERIES_KEPT {
            kept.remove(0);
        }
        kept.push((resource.to_string(), workload.clone(), s.clone()));
        s
    }

    /// `workload` as the connection's last statement had it, or anew.
    fn shared_name(&self, workload: &str) -> Arc<str> {
        let mut last = self.last_workload.lock().unwrap_or_else(|p| p.into_inner());
        match &*last {
            Some(name) if **name == *workload => name.clone(),
            _ => last.insert(Arc::from(workload)).clone(),
        }
    }

    /// Kept by the text with its literals cut out ([`sluice_sql::fingerprint_key`]): a
    /// statement run with new values each time (most are) is lexed for it once.
    fn fingerprint_of(&self, query: &Query) -> Arc<sluice_sql::Fingerprint> {
        let key = sluice_sql::fingerprint_key(&query.text, &query.literals);
        let mut kept = self.fingerprints.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = kept.get(key.as_ref()) {
            return f.clone();
        }
        let f = Arc::new(sluice_sql::fingerprint(&query.text));
        if kept.len() >= FINGERPRINTS_KEPT {
            kept.clear();
        }
        kept.insert(key.into_owned(), f.clone());
        f
    }

    /// The statements `predicate` matches in `system.processes` that `user` may act on.
    async fn matching(&self, user: &str, predicate: &str) -> Result<Vec<crate::operator::Matched>> {
        crate::operator::matching(&self.shared, self.session(), user, predicate).await
    }

    /// Where a statement asked to run in `requested` is admitted (see [`crate::lanes::lane_for`]).
    fn lane_of(
        &self,
        catalog: &sluice_catalog::Catalog,
        user: &str,
        requested: Arc<str>,
        demotion: Option<&sluice_catalog::Demotion>,
        fingerprint: &sluice_sql::Fingerprint,
    ) -> Arc<str> {
        let user_pinned = self
            .shared
            .users
            .get(user)
            .is_some_and(|u| u.pinned_workload.is_some());
        crate::lanes::lane_for(
            &self.shared.lanes,
            catalog,
            user_pinned,
            demotion,
            fingerprint,
        )
        .map_or(requested, |lane| self.shared_name(&lane))
    }

    /// Waits for one slot of each resource of `order` in turn (a QUERY slot, a master thread),
    /// adding each permit to `attachments`. A `MOVE QUERY` meanwhile moves the request and the
    /// permits already held to the new `workload`; a kill, the client going away, shutdown or
    /// the admission deadline end the wait with their error.
    #[allow(clippy::too_many_arguments)]
    async fn wait_for_slots(
        &self,
        order: &[(&String, &sluice_sched::ResourceScheduler)],
        guard: &crate::state::ProcessGuard,
        snapshot: &crate::state::Snapshot,
        workload: &mut Arc<str>,
        attachments: &mut Vec<Attachment>,
        admission_deadline: Option<(tokio::time::Instant, Duration)>,
        notices: &mut dyn Notices,
    ) -> Result<()> {
        let mut resources = order.iter().copied();
        let mut next = resources.next();
        let mut shown_waiting = false;
        'resources: while let Some((resource, scheduler)) = next {
            let arrived = std::time::Instant::now();
            let acquired = scheduler.acquire_known(workload, 1).inspect_err(|e| {
                if e.code == ErrorCode::ServerOverloaded {
                    self.series(resource, workload).rejected();
                }
            })?;
            let Some(mut acquire) = acquired else {
                if self.shared.options.throw_on_unknown_workload {
                    return Err(access_denied(resource));
                }
                next = resources.next();
                continue;
            };
            let mut series = self.series(resource, workload);
            let mut counted_waiting = series.waiting();
            if !acquire.is_granted() {
                shown_waiting = true;
                guard.waiting_for(Some(resource));
                notices
                    .notice(
                        Severity::Notice,
                        "00000",
                        format!(
                            "waiting for resource '{resource}' in workload '{workload}' (queue {}); system.processes shows it as query_id {}",
                            acquire.queue_path(),
                            guard.query_id
                        ),
                    )
                    .await;
            }
            let permit = loop {
                if acquire.is_granted() {
                    break (&mut acquire).await?;
                }
                tokio::select! {
                    permit = &mut acquire => break permit?,
                    e = guard.control.killed() => return Err(e),
                    to = guard.control.moved() => {
                        // Into the new workload's queue, in arrival order (this resource's
                        // request moves; the permits already held move with it).
                        let in_place = match acquire.move_to(&to) {
                            Ok(moved) => moved,
                            Err(e) => {
                                tracing::warn!(query_id = guard.query_id, to = %to, "waiting query not moved: {e}");
                                continue;
                            }
                        };
                        for held in attachments.iter_mut() {
                            if let Some(s) = snapshot.schedulers.get(&held.resource) {
                                held.permit.move_to(s, &to)?;
                            }
                            held.in_flight = self.shared.metrics.series(&held.resource, &to).held();
                        }
                        tracing::info!(query_id = guard.query_id, from = %workload, to = %to, "waiting query moved");
                        self.shared.show_in(guard.query_id, &to);
                        *workload = Arc::from(to);
                        drop(counted_waiting);
                        if !in_place {
                            // Granted meanwhile, or no queue for it here: ask this resource
                            // again in the new workload (the old request is let go).
                            continue 'resources;
                        }
                        series = self.series(resource, workload);
                        counted_waiting = series.waiting();
                    }
                    _ = self.shared.reached(Phase::Draining) => return Err(shutting_down(Phase::Draining)),
                    _ = self.watch.gone() => return Err(client_gone()),
                    _ = until(admission_deadline) => {
                        let limit = admission_deadline.map_or(Duration::ZERO, |(_, l)| l);
                        return Err(slot_timeout(limit, workload, resource));
                    }
                }
            };
            drop(counted_waiting);
            attachments.push(Attachment {
                resource: resource.clone(),
                permit,
                in_flight: series.admitted(arrived.elapsed()),
                // A master thread's slot is the statement's slot 0 (its workers are 1..).
                cpu_slot: (snapshot.roles.master.as_deref() == Some(resource.as_str()))
                    .then_some(0),
            });
            // Only a wait was shown: most statements are granted at once.
            if std::mem::take(&mut shown_waiting) {
                guard.waiting_for(None);
            }
            next = resources.next();
        }
        Ok(())
    }

    /// The statement's memory in its workload: its allocation in the MEMORY RESERVATION
    /// resource, admitted with `reserve_memory` bytes (waiting for them in its queue), and its
    /// `max_memory_usage` cap. `None` when neither applies.
    #[allow(clippy::too_many_arguments)]
    async fn reserve_memory(
        &self,
        guard: &crate::state::ProcessGuard,
        snapshot: &crate::state::Snapshot,
        workload: &str,
        settings: &QuerySettings,
        admission_deadline: Option<(tokio::time::Instant, Duration)>,
        notices: &mut dyn Notices,
    ) -> Result<Option<Arc<crate::memory::StatementMemory>>> {
        // More than the engine may ever hold can never be used, and would let the tree's sums
        // run past what an i64 counts.
        let engine = self.shared.options.engine_memory() as u64;
        if settings.reserve_memory > engine {
            return Err(Error::new(
                ErrorCode::ResourceLimitExceeded,
                format!(
                    "reserve_memory = {} exceeds the {engine} bytes the engine's queries may hold together (server.engine_memory_ratio of server.memory)",
                    settings.reserve_memory
                ),
            ));
        }
        let reserve = i64::try_from(settings.reserve_memory).unwrap_or(i64::MAX);
        let cap = (settings.max_memory_usage > 0)
            .then(|| i64::try_from(settings.max_memory_usage).unwrap_or(i64::MAX));
        let mut allocation = None;
        if let Some((resource, scheduler)) = snapshot.memory.iter().next() {
            if !scheduler.has_workload(workload) {
                if self.shared.options.throw_on_unknown_workload {
                    return Err(access_denied(resource));
                }
            } else {
                let control = guard.control.clone();
                let kill: sluice_sched::KillSwitch = Arc::new(move |e| control.stop_with(e));
                let mut pending = scheduler.allocate(workload, reserve, kill)?;
                if !pending.is_admitted() {
                    guard.waiting_for(Some(resource));
                    notices
                        .notice(
                            Severity::Notice,
                            "00000",
                            format!(
                                "waiting for {reserve} bytes of resource '{resource}' in workload '{workload}' (reserve_memory); system.processes shows it as query_id {}",
                                guard.query_id
                            ),
                        )
                        .await;
                }
                let admitted = tokio::select! {
                    admitted = &mut pending => admitted?,
                    e = guard.control.killed() => return Err(e),
                    _ = self.shared.reached(Phase::Draining) => return Err(shutting_down(Phase::Draining)),
                    _ = self.watch.gone() => return Err(client_gone()),
                    _ = until(admission_deadline) => {
                        let limit = admission_deadline.map_or(Duration::ZERO, |(_, l)| l);
                        return Err(memory_timeout(limit, workload, resource));
                    }
                };
                guard.waiting_for(None);
                allocation = Some(admitted);
            }
        }
        if allocation.is_none() && cap.is_none() {
            return Ok(None);
        }
        Ok(Some(Arc::new(crate::memory::StatementMemory::new(
            allocation, reserve, cap,
        ))))
    }

    #[allow(clippy::too_many_arguments)]
    async fn admit_in(
        &self,
        user: &Arc<str>,
        workload: &Arc<str>,
        classified: Option<Arc<crate::state::Classified>>,
        text: &Arc<str>,
        settings: QuerySettings,
        notices: &mut dyn Notices,
        record: &mut Option<RunRecord>,
    ) -> Result<Admitted> {
        // A query slot and a master thread's, most often.
        let mut attachments: Vec<Attachment> = Vec::with_capacity(2);
        let pid = self.cancel.get().map(|(pid, _)| *pid);
        let guard = self.shared.register(user, workload, text, pid);
        // Only a statement a rule placed can be placed again while it waits.
        let placed_by_rule = classified.is_some();
        guard.classified(classified);
        if let Some(record) = record.as_mut() {
            record.set_query_id(guard.query_id);
        }
        // Where it queues; a `MOVE QUERY` while it waits changes it.
        let mut workload = workload.clone();
        // `workload_admission_timeout_ms` bounds the whole wait (every resource together).
        let admission_deadline = self
            .admission_timeout(user, settings.admission_timeout)?
            .map(|limit| (tokio::time::Instant::now() + limit, limit));
        let snapshot = self.shared.snapshot();
        let cpu_scheduled = !settings.no_concurrency_control;
        // Its query slot, then its memory reservation, then its master thread.
        let slot = snapshot.query_slot();
        self.wait_for_slots(
            slot.as_slice(),
            &guard,
            &snapshot,
            &mut workload,
            &mut attachments,
            admission_deadline,
            notices,
        )
        .await?;
        let memory = self
            .reserve_memory(
                &guard,
                &snapshot,
                &workload,
                &settings,
                admission_deadline,
                notices,
            )
            .await?;
        if cpu_scheduled {
            let master = snapshot.master();
            self.wait_for_slots(
                master.as_slice(),
                &guard,
                &snapshot,
                &mut workload,
                &mut attachments,
                admission_deadline,
                notices,
            )
            .await?;
        }
        // Worker threads: as many as are free now, up to max_threads - 1, never waited for
        // (reference §4.8); the statement's parallelism is the threads it holds.
        let threads = match snapshot.workers() {
            Some((resource, scheduler)) if cpu_scheduled && scheduler.has_workload(&workload) => {
                let wanted = settings
                    .max_threads
                    .filter(|&n| n > 0)
                    .unwrap_or(self.shared.options.machine.cores as usize)
                    .max(1);
                let series = self.shared.metrics.series(resource, &workload);
                let mut threads = 1;
                while threads < wanted {
                    let Some(permit) = scheduler.try_acquire(&workload, 1) else {
                        break;
                    };
                    attachments.push(Attachment {
                        resource: resource.clone(),
                        permit,
                        in_flight: series.held(),
                        cpu_slot: Some(threads),
                    });
                    threads += 1;
                }
                Some(threads)
            }
            _ => settings.max_threads,
        };
        // The statement's memory is held by its grant, not by the engine (which lets go of its
        // runtime once the plan is started), so the allocation lasts as long as the statement
        // and moves with it.
        let grant = Arc::new(Mutex::new(Grant {
            workload: workload.clone(),
            attachments,
            memory: memory.clone(),
            demoted: None,
        }));
        guard.running(grant.clone());
        if let Some(record) = record.as_mut() {
            let classifier = placed_by_rule
                .then(|| self.shared.classifier_of(guard.query_id))
                .flatten();
            record.admitted(grant.clone(), classifier);
        }
        let lanes = snapshot.catalog.lanes(&workload);
        // Its soft deadline: demoted (moved, never stopped) when it outlives it.
        let demoter = lanes.demotion.is_some().then(|| {
            let task = crate::demotion::demote_when_due(
                self.shared.clone(),
                guard.query_id,
                tokio::time::Instant::now(),
            );
            crate::demotion::AbortOnDrop(tokio::spawn(task))
        });
        let control = guard.control.clone();
        let hold = Held {
            _process: Some(guard),
            _grant: Some(grant.clone()),
            _demoter: demoter,
        };
        // The hard limit: the query's own, else its user's, else its workload's.
        let limit = settings
            .max_execution_time
            .or_else(|| {
                self.shared
                    .users
                    .get(user)
                    .and_then(|u| u.max_execution_time)
            })
            .or(lanes.max_execution_time);
        let stop = self.stop(limit, Some(grant.clone()), control);
        Ok(Admitted {
            hold,
            grant,
            threads,
            memory,
            reserve_memory: settings.reserve_memory,
            stop,
        })
    }

    /// Runs an admitted statement on the engine; its rows stream while what it holds is held.
    async fn execute_admitted(
        &self,
        admitted: Admitted,
        query: &Query,
        params: Vec<ScalarValue>,
        record: &mut Option<RunRecord>,
    ) -> Result<Outcome> {
        let Admitted {
            hold,
            grant,
            threads,
            memory,
            mut stop,
            ..
        } = admitted;
        crate::system::refresh_if_mentioned(&self.shared, &query.text)?;
        let options = ExecuteOptions {
            target_partitions: threads,
            io: crate::disk_gate::DiskGate::for_statement(&self.shared, &grant),
            memory: memory.map(|m| m as Arc<dyn sluice_engine::MemoryCharge>),
            cpu: crate::lease::SlotLease::for_statement(&self.shared, &grant),
        };
        // The statement first: one that answers at once never arms the stop's timers.
        let output = tokio::select! {
            biased;
            output = self.session().execute(&query.text, options, params) => output?,
            e = &mut stop => return Err(e),
        };
        Ok(match output {
            QueryOutput::Rows { schema, batches } => Outcome::Rows {
                schema,
                batches: Box::pin(Stoppable::new(batches, stop, record.take())),
                hold,
            },
            QueryOutput::Command { tag, rows } => {
                if let Some(record) = record.as_mut() {
                    record.add_rows(rows.unwrap_or(0));
                    record.finished();
                }
                let tag = Tag::new(&tag);
                Outcome::Command(match rows {
                    Some(n) => tag.with_rows(n),
                    None => tag,
                })
            }
        })
    }

    /// The result columns of a statement, without running it.
    async fn describe(&self, statement: &ClientStatement) -> Result<Option<Arc<Schema>>> {
        Ok(match statement {
            ClientStatement::Workload(_)
            | ClientStatement::Fingerprint { .. }
            | ClientStatement::Set { .. }
            | ClientStatement::Transaction(_)
            | ClientStatement::Declare { .. }
            | ClientStatement::CopyOut { .. }
            | ClientStatement::Close(_) => None,
            ClientStatement::Fetch { name, .. } => Some(
                self.cursors
                    .lock()
                    .await
                    .get(name)
                    .ok_or_else(|| no_cursor(name))?
                    .schema
                    .clone(),
            ),
            ClientStatement::Show(name) => Some(text_schema(name)),
            ClientStatement::KillQuery { .. } => {
                Some(crate::operator::status_schema("kill_status"))
            }
            ClientStatement::MoveQuery { .. } => {
                Some(crate::operator::status_schema("move_status"))
            }
            ClientStatement::SignalBackend { terminate, .. } => {
                Some(crate::operator::signal_schema(*terminate))
            }
            ClientStatement::ShowEntities(_) => Some(text_schema("name")),
            ClientStatement::ShowCreate { .. } => Some(text_schema("create_query")),
            ClientStatement::Query(query) => {
                crate::system::refresh_if_mentioned(&self.shared, &query.text)?;
                self.session().describe(&query.text).await?
            }
        })
    }

    /// The Postgres type of each placeholder of a statement: as declared by the client, else
    /// as the planner infers it, else `text`.
    async fn parameter_types(
        &self,
        statement: &ClientStatement,
        sql: &str,
        declared: &[Option<Type>],
    ) -> Result<Vec<Type>> {
        let inferred = match statement {
            ClientStatement::Query(query) if query.text.contains('$') => {
                self.session().parameter_types(&query.text).await?
            }
            ClientStatement::Query(_) => Vec::new(),
            // Not for the engine: announce the placeholders anyway, so the client binds and
            // hears from `run` that this statement takes none.
            _ => vec![None; params::highest_placeholder(sql)],
        };
        Ok(params::resolve_types(declared, &inferred))
    }

    /// The row description of a statement, for Describe messages.
    async fn describe_fields(
        &self,
        sql: &str,
        format: impl Fn(usize) -> FieldFormat,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let statement = match sluice_sql::statement(sql).map_err(|e| to_pg(&e))? {
            Some(statement) => statement,
            None => return Ok(Vec::new()),
        };
        Ok(
            match self.describe(&statement).await.map_err(|e| to_pg(&e))? {
                Some(schema) => encode::fields(&schema, format),
                None => Vec::new(),
            },
        )
    }

    fn respond(&self, outcome: Outcome, format: &Format) -> PgWireResult<Response> {
        match outcome {
            Outcome::Command(tag) => Ok(Response::Execution(tag)),
            Outcome::CopyOut {
                schema,
                batches,
                hold,
                format,
            } => {
                let fields = Arc::new(encode::fields(&schema, |_| FieldFormat::Text));
                let header = format.header.then(|| {
                    let names: Vec<String> =
                        schema.fields().iter().map(|f| f.name().clone()).collect();
                    Ok(CopyData::new(
                        encode::copy_line(names.iter().map(|n| Some(n.as_bytes())), &format).into(),
                    ))
                });
                let columns = fields.len();
                let lines = per_batch(batches, hold, move |b| {
                    Ok(encode::copy_lines(&b, fields.clone(), &format)?
                        .into_iter()
                        .map(|l| CopyData::new(l.into()))
                        .collect())
                });
                let data = stream::iter(header).chain(lines);
                Ok(Response::CopyOut(CopyResponse::new(0, columns, data)))
            }
            Outcome::Fetched { schema, batches } => {
                let fields = Arc::new(encode::fields(&schema, |i| format.format_for(i)));
                let rows = encode::rows(&batches, fields.clone())?;
                let mut response =
                    QueryResponse::new(fields, stream::iter(rows.into_iter().map(Ok)));
                response.command_tag = "FETCH".to_owned();
                Ok(Response::Query(response))
            }
            Outcome::Rows {
                schema,
                batches,
                hold,
            } => {
                let fields = Arc::new(encode::fields(&schema, |i| format.format_for(i)));
                let encoding = fields.clone();
                let rows = per_batch(batches, hold, move |b| encode::rows(&[b], encoding.clone()));
                Ok(Response::Query(QueryResponse::new(fields, rows)))
            }
        }
    }
}

/// A statement's rows as wire messages, each batch encoded as it arrives. What the statement
/// holds (`hold`: its process entry and permits) lives until the last message is sent, or
/// the stream is dropped.
fn per_batch<T: Send + 'static>(
    batches: BatchStream,
    hold: Held,
    encode: impl Fn(RecordBatch) -> PgWireResult<Vec<T>> + Send + 'static,
) -> impl Stream<Item = PgWireResult<T>> + Send + 'static {
    batches
        .map(move |batch| {
            let _held = &hold;
            match batch.map_err(|e| to_pg(&e)).and_then(&encode) {
                Ok(items) => stream::iter(items.into_iter().map(Ok).collect::<Vec<_>>()),
                Err(e) => stream::iter(vec![Err(e)]),
            }
        })
        .flatten()
}

/// A cursor that is not open (`invalid_cursor_name`).
fn no_cursor(name: &str) -> Error {
    Error::new(
        ErrorCode::BadArguments,
        format!("cursor \"{name}\" does not exist"),
    )
    .with_sqlstate("34000")
}

/// The hard limit's error. Told apart from a demotion in words: the statement failed and is
/// not retried (a soft deadline, `demote_after`, moves a statement and lets it finish).
fn timeout_exceeded(limit: Duration, grant: Option<&Arc<Mutex<Grant>>>) -> Error {
    let demoted = grant.and_then(|g| {
        let g = g.lock().unwrap_or_else(|p| p.into_inner());
        g.demoted.as_ref().map(|(from, _)| {
            format!(
                "; it had been demoted from '{from}' to '{}' before",
                g.workload
            )
        })
    });
    Error::new(
        ErrorCode::TimeoutExceeded,
        format!(
            "Timeout exceeded: elapsed {:.3} seconds, maximum: {:.3}. max_execution_time is a hard limit: the statement was stopped and is not retried{}",
            limit.as_secs_f64(),
            limit.as_secs_f64(),
            demoted.unwrap_or_default()
        ),
    )
}

/// The error of a statement whose client went away (nobody receives it; it ends the work).
/// Resolves at `deadline`, or never without one.
async fn until(deadline: Option<(tokio::time::Instant, Duration)>) {
    match deadline {
        Some((at, _)) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A statement that waited `workload_admission_timeout_ms` for a query slot.
fn memory_timeout(limit: Duration, workload: &str, resource: &str) -> Error {
    Error::new(
        ErrorCode::MemoryReservationAcquisitionTimeout,
        format!(
            "Memory reservation acquisition timed out: waited {} ms (workload_admission_timeout_ms) for reserve_memory in resource '{resource}' of workload '{workload}'; the statement did not start. Raise the timeout, lower reserve_memory, or raise the workload's max_memory",
            limit.as_millis()
        ),
    )
}

fn slot_timeout(limit: Duration, workload: &str, resource: &str) -> Error {
    Error::new(
        ErrorCode::QuerySlotAcquisitionTimeout,
        format!(
            "Query slot acquisition timed out: waited {} ms (workload_admission_timeout_ms) for resource '{resource}' in workload '{workload}'; the statement did not start. Raise the timeout, or the workload's limit on it (max_concurrent_queries, max_concurrent_threads)",
            limit.as_millis()
        ),
    )
}

fn client_gone() -> Error {
    Error::new(
        ErrorCode::QueryWasCancelled,
        "the client closed its connection; the statement was dropped",
    )
}

fn text_schema(name: &str) -> Arc<Schema> {
    Arc::new(Schema::new(vec![Field::new(name, DataType::Utf8, true)]))
}

fn batch_outcome(batch: RecordBatch) -> Outcome {
    Outcome::Rows {
        schema: batch.schema(),
        batches: collected(vec![batch]),
        hold: Held::default(),
    }
}

fn one_column(name: &str, values: Vec<String>) -> Outcome {
    let schema = text_schema(name);
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(values))]);
    Outcome::Rows {
        schema,
        batches: collected(batch.into_iter().collect()),
        hold: Held::default(),
    }
}

/// What one statement of a local script gave.
#[derive(Debug)]
pub enum LocalOutput {
    /// A command that succeeded.
    Ok,
    /// Rows: a header and each row's values as text (NULL as `\N`).
    Rows {
        header: Vec<String>,
        rows: Vec<Vec<String>>,
    },
}

impl Connection {
    /// Runs one statement outside the wire protocol (`sluice local`), with the same routing,
    /// admission and engine as a client connection.
    pub async fn run_local(&self, sql: &str) -> Result<LocalOutput> {
        use sluice_engine::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
        let Some(statement) = sluice_sql::statement(sql)? else {
            return Ok(LocalOutput::Ok);
        };
        let outcome = match self
            .run(&Arc::from("local"), statement, Vec::new(), &mut NoNotices)
            .await?
        {
            Outcome::Fetched { schema, batches } => Outcome::Rows {
                schema,
                batches: collected(batches),
                hold: Held::default(),
            },
            other => other,
        };
        match outcome {
            Outcome::Command(_) | Outcome::Fetched { .. } | Outcome::CopyOut { .. } => {
                Ok(LocalOutput::Ok)
            }
            Outcome::Rows {
                schema,
                mut batches,
                hold,
            } => {
                let options = FormatOptions::default().with_null("\\N");
                let header = schema.fields().iter().map(|f| f.name().clone()).collect();
                let mut rows = Vec::new();
                while let Some(batch) = batches.next().await {
                    let batch = batch?;
                    let formatters: Vec<ArrayFormatter<'_>> = batch
                        .columns()
                        .iter()
                        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                        .collect::<std::result::Result<_, _>>()
                        .map_err(|e| Error::new(ErrorCode::InternalError, e.to_string()))?;
                    for row in 0..batch.num_rows() {
                        rows.push(
                            formatters
                                .iter()
                                .map(|f| f.value(row).to_string())
                                .collect(),
                        );
                    }
                }
                drop(hold);
                Ok(LocalOutput::Rows { header, rows })
            }
        }
    }
}

/// Splits a script into statements at top-level `;` (quotes and comments respected, see
/// [`sluice_sql::lexer`]), each with the comments before it (its own).
pub fn script_statements(script: &str) -> Vec<String> {
    sluice_sql::lexer::split(script)
        .into_iter()
        .map(|lexed| script[lexed.span].trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

impl Connection {
    /// The user the client logged in as, shared by its statements' records (it is fixed once
    /// the client is authenticated, before any statement).
    pub(crate) fn user<C: ClientInfo>(&self, client: &C) -> Arc<str> {
        self.user
            .get_or_init(|| {
                Arc::from(
                    client
                        .metadata()
                        .get(METADATA_USER)
                        .map_or("", String::as_str),
                )
            })
            .clone()
    }
}

/// Process ids sluice gives clients that have no upstream backend of their own (the embedded
/// engine, transaction pooling): from 2^22 up, above every pid Linux hands out, so that none
/// is also an upstream backend's pid, which session pooling gives its clients.
static SLUICE_PIDS: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1 << 22);

#[async_trait]
impl StartupHandler for Connection {
    /// A trusted client's start-up, or a logged-in one's (`auth::Startup` hands it here):
    /// the start-up options, the session's parameters as the engine or the upstream takes
    /// them, the process id, then AuthenticationOk, ParameterStatus, BackendKeyData and
    /// ReadyForQuery, as PostgreSQL sends them. In session pooling the client's upstream
    /// backend is taken now, and its pid is the client's: BackendKeyData, `pg_backend_pid()`
    /// and a notification's sender all say the same pid, as going direct.
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let PgWireFrontendMessage::Startup(startup) = message else {
            return Ok(());
        };
        protocol_negotiation(client, &startup).await?;
        save_startup_parameters_to_metadata(client, &startup);
        self.apply_startup_options(client.metadata());
        // In upstream mode the client sees the upstream's parameters (its server_version
        // above all: psql and drivers choose their catalog queries by it), with its own
        // start-up parameters in place as the upstream took them.
        let (parameters, warnings, backend) = match &self.shared.upstream {
            Some(upstream) => {
                let keys = client
                    .session_extensions()
                    .get::<sluice_engine::upstream::ScramKeys>();
                let keep = upstream.options.pool_mode == crate::upstream::PoolMode::Session;
                let (parameters, backend) = upstream
                    .start_session(client.metadata(), keys.as_deref(), keep)
                    .await
                    .map_err(|refused| crate::upstream::fatal_from(&refused))?;
                (parameters, Vec::new(), backend)
            }
            None => {
                let (parameters, warnings) = self.embedded_start().await.map_err(|e| {
                    PgWireError::UserError(Box::new(ErrorInfo::new(
                        "FATAL".to_owned(),
                        e.sqlstate().to_owned(),
                        e.to_string(),
                    )))
                })?;
                (parameters, warnings, None)
            }
        };
        let (_, secret) = RandomPidSecretKeyGenerator::default().generate(client);
        let pid = backend
            .as_ref()
            .and_then(|b| b.backend_pid())
            .unwrap_or_else(|| SLUICE_PIDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        client.set_pid_and_secret_key(pid, secret.clone());
        let (handle, guard) = self.manager.register(pid, secret.clone());
        client
            .session_extensions()
            .insert::<Arc<ConnectionHandle>>(handle);
        client.session_extensions().insert::<ConnectionGuard>(guard);
        if let Some(backend) = backend {
            client
                .session_extensions()
                .insert(crate::upstream::SessionBackend::new(backend));
        }
        client
            .feed(PgWireBackendMessage::Authentication(Authentication::Ok))
            .await?;
        let mut all = DefaultServerParameterProvider::default()
            .server_parameters(client)
            .unwrap_or_default();
        for (name, value) in parameters {
            all.insert(name, value);
        }
        let mut all: Vec<_> = all.into_iter().collect();
        all.sort();
        for (name, value) in all {
            client
                .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                    name, value,
                )))
                .await?;
        }
        client
            .feed(PgWireBackendMessage::BackendKeyData(BackendKeyData::new(
                pid, secret,
            )))
            .await?;
        for warning in warnings {
            let info = ErrorInfo::new("WARNING".to_owned(), "01000".to_owned(), warning);
            client
                .feed(PgWireBackendMessage::NoticeResponse(info.into()))
                .await?;
        }
        client
            .send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(
                TransactionStatus::Idle,
            )))
            .await?;
        client.set_state(PgWireConnectionState::ReadyForQuery);
        Ok(())
    }
}

impl Connection {
    /// What a client is told of the server at start-up besides pgwire's defaults: the
    /// upstream's parameters, or the embedded engine's version.
    fn server_parameters(&self) -> Vec<(String, String)> {
        self.shared
            .upstream
            .as_ref()
            .map(|u| u.parameters())
            .unwrap_or_else(|| {
                vec![(
                    "server_version".to_string(),
                    sluice_engine::pg_catalog::server_version(),
                )]
            })
    }

    /// `options=-c workload=x` (psql: PGOPTIONS, libpq: options=) sets the session's workload.
    fn apply_startup_options(&self, metadata: &HashMap<String, String>) {
        if let Some(database) = metadata.get("database") {
            let _ = self.database.set(database.clone());
        }
        if let Some(name) = metadata.get("application_name") {
            self.set_var("application_name", Some(name.clone()));
        }
        // Run-time parameters given as start-up keys (psql's PGTZ, PGDATESTYLE), then as
        // `-c` options, which PostgreSQL applies after them.
        for (name, value) in metadata {
            if matches!(
                name.to_ascii_lowercase().as_str(),
                "timezone" | "datestyle" | "intervalstyle"
            ) {
                self.set_var(&name.to_ascii_lowercase(), Some(value.clone()));
            }
        }
        if let Some(options) = metadata.get("options") {
            for (name, value) in startup_settings(options) {
                self.set_var(&name, Some(value));
            }
        }
    }
}

/// The styles the embedded engine prints dates and intervals in (PostgreSQL's defaults).
const EMBEDDED_DATE_STYLE: &str = "ISO, MDY";
const EMBEDDED_INTERVAL_STYLE: &str = "postgres";

impl Connection {
    /// The embedded engine's answer to a start-up's run-time parameters: its `TimeZone` is
    /// the session's (an unknown one refuses the start-up with FATAL 22023, as PostgreSQL
    /// does); a `DateStyle` or `IntervalStyle` the engine does not print in is not taken
    /// silently: a WARNING says what the session shows instead. Returns the parameters to
    /// report, and the warnings.
    async fn embedded_start(&self) -> Result<(Vec<(String, String)>, Vec<String>)> {
        let mut reported = self.server_parameters();
        let mut warnings = Vec::new();
        if let Some(zone) = self.var("timezone") {
            self.session().set_time_zone(&zone).await?;
            reported.push(("TimeZone".to_string(), zone));
        }
        for (name, var, shown) in [
            ("DateStyle", "datestyle", EMBEDDED_DATE_STYLE),
            ("IntervalStyle", "intervalstyle", EMBEDDED_INTERVAL_STYLE),
        ] {
            if let Some(asked) = self.var(var) {
                if !shown
                    .to_ascii_lowercase()
                    .starts_with(&asked.to_ascii_lowercase())
                {
                    warnings.push(format!(
                        "{name} '{asked}' is not one the embedded engine prints in; this session shows {shown}"
                    ));
                }
                self.set_var(var, Some(shown.to_string()));
            }
            reported.push((name.to_string(), shown.to_string()));
        }
        Ok((reported, warnings))
    }
}

#[async_trait]
impl SimpleQueryHandler for Connection {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.cancellable(client);
        let user = self.user(client);
        // A simple query may hold several statements; each runs in turn and its answer is
        // sent before the next starts (so its rows stream, and its permits go, first); the
        // first error stops.
        for statement in sluice_sql::statements(query) {
            let statement = statement.map_err(|e| to_pg(&e))?;
            let outcome = self
                .run(&user, statement, Vec::new(), &mut ClientNotices(client))
                .await
                .map_err(|e| to_pg(&e))?;
            match self.respond(outcome, &Format::UnifiedText)? {
                Response::Query(rows) => send_query_response(client, rows, true).await?,
                Response::Execution(tag) => send_execution_response(client, tag).await?,
                Response::CopyOut(copy) => send_copy_out_response(client, copy).await?,
                _ => {}
            }
        }
        Ok(Vec::new())
    }
}

#[async_trait]
impl ExtendedQueryHandler for Connection {
    type Statement = String;
    type QueryParser = NoopQueryParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.cancellable(client);
        let sql = &portal.statement.statement;
        let Some(statement) = sluice_sql::statement(sql).map_err(|e| to_pg(&e))? else {
            return Ok(Response::EmptyQuery);
        };
        let values = if portal.parameter_len() > 0 {
            let types = self
                .bind_types(&statement, sql, &portal.statement.parameter_types, portal)
                .await
                .map_err(|e| to_pg(&e))?;
            params::values(portal, &types)?
        } else {
            Vec::new()
        };
        let user = self.user(client);
        let outcome = self
            .run(&user, statement, values, &mut ClientNotices(client))
            .await
            .map_err(|e| to_pg(&e))?;
        self.respond(outcome, &portal.result_column_format)
    }

    /// A Describe of a portal that is an SQL cursor (`DECLARE name CURSOR`): drivers' named
    /// cursors (psycopg's) describe the cursor by its name, as PostgreSQL allows.
    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if message.target_type == TARGET_TYPE_BYTE_PORTAL {
            let name = message.name.clone().unwrap_or_default();
            if client.portal_store().get_portal(&name).is_none() {
                let schema = self
                    .cursors
                    .lock()
                    .await
                    .get(&name)
                    .map(|c| c.schema.clone());
                if let Some(schema) = schema {
                    let fields = encode::fields(&schema, |_| FieldFormat::Text);
                    return send_describe_response(client, &DescribePortalResponse::new(fields))
                        .await;
                }
            }
        }
        self._on_describe(client, message).await
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        stmt: &StoredStatement<Self::Statement>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
    {
        let statement = sluice_sql::statement(&stmt.statement).map_err(|e| to_pg(&e))?;
        let params = match &statement {
            Some(statement) => self
                .parameter_types(statement, &stmt.statement, &stmt.parameter_types)
                .await
                .map_err(|e| to_pg(&e))?,
            None => Vec::new(),
        };
        let fields = self
            .describe_fields(&stmt.statement, |_| FieldFormat::Text)
            .await?;
        Ok(DescribeStatementResponse::new(params, fields))
    }

    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        portal: &Portal<Self::Statement>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
    {
        let fields = self
            .describe_fields(&portal.statement.statement, |i| {
                portal.result_column_format.format_for(i)
            })
            .await?;
        Ok(DescribePortalResponse::new(fields))
    }
}

impl Connection {
    /// Registers this connection's cancel key (once).
    pub(crate) fn cancellable<C: ClientInfo>(&self, client: &C) {
        if self.cancel.get().is_none() {
            let (pid, secret) = client.pid_and_secret_key();
            let key = (pid, secret.to_bytes().to_vec());
            self.shared.cancellable(key.clone());
            self.shared.terminable(pid, self.terminate.clone());
            let _ = self.cancel.set(key);
        }
    }

    /// The types to decode a portal's values with. Values the client declared a type for, and
    /// values sent as text, need no planning (the engine casts each to its placeholder's
    /// type); only an undeclared value in binary needs the inferred type to be read at all.
    async fn bind_types<S: Clone>(
        &self,
        statement: &ClientStatement,
        sql: &str,
        declared: &[Option<Type>],
        portal: &Portal<S>,
    ) -> Result<Vec<Type>> {
        let undeclared_binary = (0..portal.parameter_len()).any(|i| {
            let known = declared
                .get(i)
                .cloned()
                .flatten()
                .is_some_and(|t| t != Type::UNKNOWN);
            !known && portal.parameter_format.is_binary(i)
        });
        if undeclared_binary {
            self.parameter_types(statement, sql, declared).await
        } else {
            Ok(params::resolve_types(declared, &[]))
        }
    }
}

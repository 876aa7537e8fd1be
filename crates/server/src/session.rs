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

use async_trait::async_trait;
use futures::{stream, Sink, SinkExt, Stream, StreamExt};
use pgwire::api::auth::{
    protocol_negotiation, save_startup_parameters_to_metadata, DefaultServerParameterProvider,
    ServerParameterProvider, StartupHandler,
};
use pgwire::api::copy::send_copy_out_response;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{
    send_describe_response, send_execution_response, ExtendedQueryHandler, SimpleQueryHandler,
};
use pgwire::api::results::CopyResponse;
use pgwire::api::results::{
    DescribePortalResponse, DescribeStatementResponse, FieldFormat, FieldInfo, QueryResponse,
    Response, Tag,
};
use pgwire::api::stmt::{NoopQueryParser, StoredStatement};
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionGuard, ConnectionHandle, ConnectionManager,
    PgWireConnectionState, PidSecretKeyGenerator, RandomPidSecretKeyGenerator, Type, DEFAULT_NAME,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::CopyData;
use pgwire::messages::data::{NoData, RowDescription};
use pgwire::messages::extendedquery::{
    Bind, BindComplete, Describe, Execute, Parse, ParseComplete, TARGET_TYPE_BYTE_PORTAL,
};
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
use crate::settings::startup_settings;
use crate::state::Shared;
use crate::watch::ClientWatch;

mod execute;
mod startup;

use crate::admit::{Admission, Admitted, ClientNotices, Held, Stop};
pub use crate::admit::{NoNotices, Notices, Severity};

/// Where a transaction block stands (the embedded engine runs each statement on its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    None,
    Open { wrote: bool },
}

/// A connection's handlers and state: its engine session, its transaction block and cursors;
/// who the client is and how its statements are admitted is its [`Admission`].
pub struct Connection {
    shared: Arc<Shared>,
    /// Its engine session, made at its first engine statement (see [`Connection::session`]).
    session: std::sync::OnceLock<Box<dyn Session>>,
    block: Mutex<Block>,
    manager: Arc<ConnectionManager>,
    parser: Arc<NoopQueryParser>,
    /// Open cursors by name (`DECLARE`, `FETCH`, `CLOSE`).
    cursors: tokio::sync::Mutex<HashMap<String, Cursor>>,
    /// The last text read as statements, and what it read as (when every one read without
    /// an error): the extended protocol reads a text at Describe and again at Execute, and a
    /// driver, or a simple Query in a loop, repeats its texts.
    last_statements: std::sync::Mutex<Option<(String, Vec<Arc<ClientStatement>>)>>,
    /// The result columns last described or sent (a driver describes, then executes, each
    /// portal).
    fields: encode::FieldsMemo,
    /// The columns of the query last described, while the engine's columns count stands (a
    /// driver describes each statement it runs).
    described: Described,
    /// pgwire's cancel handle for this connection, kept at start-up (each Execute arms it;
    /// looking it up in the session's extensions cost a lock and a map lookup each time).
    cancel_handle: std::sync::OnceLock<Arc<ConnectionHandle>>,
    /// The last query text [`Connection::engine_text`] looked through, and what it names.
    last_mentions: std::sync::Mutex<Option<(String, Mentions)>>,
    pub admission: Admission,
}

/// The longest query text whose [`Mentions`] a connection keeps.
const MENTIONS_TEXT_MAX: usize = 64 * 1024;

/// What a query's text names that needs work before the engine sees it.
#[derive(Debug, Clone, Copy)]
struct Mentions {
    /// A system table: they are rebuilt first (only as fresh as their last rebuild, and a
    /// rebuild retires the engine's kept plans, so other queries skip it).
    system: bool,
    /// A fleet view (`clusterAllReplicas`): the text is rewritten.
    fleet_views: bool,
}

impl Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
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
            admission: Admission::new(shared.clone(), watch),
            shared,
            session: std::sync::OnceLock::new(),
            block: Mutex::new(Block::None),
            manager,
            parser: Arc::new(NoopQueryParser::new()),
            cursors: tokio::sync::Mutex::default(),
            last_statements: std::sync::Mutex::default(),
            fields: encode::FieldsMemo::default(),
            cancel_handle: std::sync::OnceLock::new(),
            described: Described::default(),
            last_mentions: std::sync::Mutex::default(),
        }
    }

    /// The text the engine runs or describes for `text`: the system tables rebuilt first if it
    /// names one, fleet views rewritten. What it names is read once for a text asked for again
    /// in a row (a driver describes, then executes, each statement; a client repeats one).
    async fn engine_text<'a>(&self, text: &'a str) -> Result<std::borrow::Cow<'a, str>> {
        let kept = self.last_mentions.lock().ok().and_then(|last| {
            last.as_ref()
                .filter(|(seen, _)| seen == text)
                .map(|(_, mentions)| *mentions)
        });
        let mentions = match kept {
            Some(mentions) => mentions,
            None => {
                let mentions = Mentions {
                    system: sluice_sql::mentions(text, "system."),
                    fleet_views: sluice_sql::mentions(text, "clusterallreplicas"),
                };
                // (A huge text is not kept: the statement memo holds one copy already.)
                if let (true, Ok(mut last)) =
                    (text.len() <= MENTIONS_TEXT_MAX, self.last_mentions.lock())
                {
                    match last.as_mut() {
                        // The buffer reused.
                        Some((seen, kept)) => {
                            seen.clear();
                            seen.push_str(text);
                            *kept = mentions;
                        }
                        None => *last = Some((text.to_string(), mentions)),
                    }
                }
                mentions
            }
        };
        if mentions.system {
            crate::system::refresh(&self.shared)?;
        }
        if mentions.fleet_views {
            crate::fleet_views::prepare(&self.shared, text).await
        } else {
            Ok(std::borrow::Cow::Borrowed(text))
        }
    }

    /// `sluice_sql::statements(sql)`, read once for a text asked for again in a row (a
    /// statement depends on its text alone).
    fn statements_of(&self, sql: &str) -> Vec<Result<Arc<ClientStatement>>> {
        if let Ok(last) = self.last_statements.lock() {
            if let Some((_, kept)) = last.as_ref().filter(|(text, _)| text == sql) {
                return kept.iter().cloned().map(Ok).collect();
            }
        }
        let read: Vec<Result<Arc<ClientStatement>>> = sluice_sql::statements(sql)
            .into_iter()
            .map(|s| s.map(Arc::new))
            .collect();
        if let (true, Ok(mut last)) = (read.iter().all(|s| s.is_ok()), self.last_statements.lock())
        {
            let statements = read.iter().filter_map(|s| s.as_ref().ok().cloned());
            match last.as_mut() {
                // The buffers reused.
                Some((text, kept)) => {
                    text.clear();
                    text.push_str(sql);
                    kept.clear();
                    kept.extend(statements);
                }
                None => *last = Some((sql.to_string(), statements.collect())),
            }
        }
        read
    }

    /// [`Connection::statements_of`] for a text past [`sluice_sql::lexer::READ_APART_BYTES`]
    /// ([`reads_apart`]): read on a blocking thread (and not kept), not on the connection
    /// thread every client of it shares, where reading a text of megabytes would hold them a
    /// tenth of a second or more. (The callers test the length: a future awaited on every
    /// statement cost the extended protocol's round trip ~1% more instructions; they box it, so
    /// that their own futures do not grow by it.)
    async fn read_statements_apart(&self, sql: &str) -> Vec<Result<Arc<ClientStatement>>> {
        let text = sql.to_string();
        let read = tokio::task::spawn_blocking(move || {
            let statements: Vec<_> = sluice_sql::statements(&text)
                .into_iter()
                .map(|s| s.map(Arc::new))
                .collect();
            // The long queries' fingerprints too, which admission would make on this thread.
            let fingerprints = statements
                .iter()
                .filter_map(|s| match s.as_deref() {
                    Ok(ClientStatement::Query(q)) if reads_apart(&q.text) => {
                        Some((q.text.clone(), Arc::new(sluice_sql::fingerprint(&q.text))))
                    }
                    _ => None,
                })
                .collect();
            (statements, fingerprints)
        });
        match read.await {
            Ok((statements, fingerprints)) => {
                self.admission.keep_read_apart(fingerprints);
                statements
            }
            Err(e) => vec![Err(Error::new(
                ErrorCode::InternalError,
                format!("reading the statement failed: {e}"),
            ))],
        }
    }

    /// [`Connection::statement_of`] for a text past the length, read as
    /// [`Connection::read_statements_apart`] reads it.
    async fn read_statement_apart(&self, sql: &str) -> Result<Option<Arc<ClientStatement>>> {
        sluice_sql::only_statement(self.read_statements_apart(sql).await)
    }

    /// `sluice_sql::statement(sql)`, through [`Connection::statements_of`]: shared with the
    /// memo, not copied (a driver describes, then executes, each text).
    fn statement_of(&self, sql: &str) -> Result<Option<Arc<ClientStatement>>> {
        // The usual case, a text of one statement kept: no list made.
        if let Ok(last) = self.last_statements.lock() {
            if let Some((_, [only])) = last
                .as_ref()
                .map(|(text, kept)| (text, kept.as_slice()))
                .filter(|(text, _)| *text == sql)
            {
                return Ok(Some(only.clone()));
            }
        }
        sluice_sql::only_statement(self.statements_of(sql))
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
        self.admission = self.admission.with_peer(peer);
        self
    }

    fn block(&self) -> std::sync::MutexGuard<'_, Block> {
        self.block.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run(
        &self,
        user: &Arc<str>,
        statement: &ClientStatement,
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
        // A query, the statement of nearly every round trip, runs from the memo's copy; the
        // rest take theirs apart.
        if let ClientStatement::Query(query) = statement {
            return self.run_client_query(user, query, params, notices).await;
        }
        // Boxed: their futures are more than twice a query's, and `run`'s is as large as
        // its largest arm; every statement's future is copied whole into pgwire's box.
        Box::pin(self.run_other(user, statement, params, notices)).await
    }

    /// The statements that are not queries (sluice's own, cursors, transactions, COPY).
    async fn run_other(
        &self,
        user: &Arc<str>,
        statement: &ClientStatement,
        params: Vec<ScalarValue>,
        notices: &mut dyn Notices,
    ) -> Result<Outcome> {
        match statement.clone() {
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
                Ok(batch_outcome(
                    crate::operator::move_to(&self.shared, matched, &workload).await?,
                ))
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
                        self.admission.check_pinned(user, v)?;
                    }
                }
                if name == "timezone" && self.shared.upstream.is_none() {
                    // The engine reads and shows timestamptz values in it; RESET is UTC.
                    self.session()
                        .set_time_zone(value.as_deref().unwrap_or("UTC"))
                        .await?;
                }
                self.admission.set_var(&name, value);
                Ok(Outcome::Command(Tag::new(if reset {
                    "RESET"
                } else {
                    "SET"
                })))
            }
            ClientStatement::Show(name) => {
                let value = if name == "workload" {
                    self.admission.workload_of(user, None)?
                } else if name == "server_version" {
                    // As announced at start-up (upstream mode forwards this SHOW).
                    sluice_engine::pg_catalog::server_version()
                } else if name == "timezone" {
                    self.admission
                        .var(&name)
                        .unwrap_or_else(|| "UTC".to_string())
                } else {
                    self.admission.var(&name).unwrap_or_default()
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
                } = self.run_query(user, &query, params, notices).await?
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
                match self.run_query(user, &query, params, notices).await? {
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
            // (Run by `run` itself; answered the same way here.)
            ClientStatement::Query(query) => {
                self.run_client_query(user, &query, params, notices).await
            }
        }
    }

    /// A client's query: noted in its transaction block if it writes, then run.
    async fn run_client_query(
        &self,
        user: &Arc<str>,
        query: &Query,
        params: Vec<ScalarValue>,
        notices: &mut dyn Notices,
    ) -> Result<Outcome> {
        if query.kind != StatementKind::Select {
            if let Block::Open { wrote } = &mut *self.block() {
                *wrote |= query.kind != StatementKind::Utility;
            }
        }
        self.run_query(user, query, params, notices).await
    }

    async fn run_query(
        &self,
        user: &Arc<str>,
        query: &Query,
        params: Vec<ScalarValue>,
        notices: &mut dyn Notices,
    ) -> Result<Outcome> {
        // Declared before the admission so that, however the statement ends (an error, a
        // cancel dropping this future), what it holds goes first and the record after it; the
        // record is written last, when the statement has let go of everything.
        let mut record = None;
        let result = async {
            let admitted = self
                .admission
                .admit(user, query, None, notices, &mut record)
                .await?;
            self.execute_admitted(admitted, query, params, &mut record)
                .await
        }
        .await;
        if let (Err(e), Some(record)) = (&result, record.as_mut()) {
            record.failed(e);
        }
        result
    }

    /// The statements `predicate` matches in `system.processes` that `user` may act on.
    async fn matching(&self, user: &str, predicate: &str) -> Result<Vec<crate::operator::Matched>> {
        crate::operator::matching(&self.shared, self.session(), user, predicate).await
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
        // The statement's own text when the engine runs it as written (shared, not copied).
        let rewritten = match self.engine_text(&query.text).await? {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(rewritten) => Some(Arc::from(rewritten)),
        };
        let text = rewritten.as_ref().unwrap_or(&query.text);
        let options = ExecuteOptions {
            target_partitions: threads,
            io: crate::disk_gate::DiskGate::for_statement(&self.shared, &grant),
            memory: memory.map(|m| m as Arc<dyn sluice_engine::MemoryCharge>),
            cpu: crate::lease::SlotLease::for_statement(&self.shared, &grant),
        };
        // The statement first: one that answers at once never arms the stop's timers.
        let output = tokio::select! {
            biased;
            output = self.session().execute_shared(text, options, params) => output?,
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
                // The statement's own text when the engine runs it as written (shared, not copied).
                let text: Arc<str> = match self.engine_text(&query.text).await? {
                    std::borrow::Cow::Borrowed(_) => query.text.clone(),
                    std::borrow::Cow::Owned(rewritten) => Arc::from(rewritten),
                };
                self.session().describe(&text).await?
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

    /// The row description of a statement, for Describe messages, in `format`.
    async fn describe_fields(
        &self,
        sql: &str,
        format: &Format,
    ) -> PgWireResult<Arc<Vec<FieldInfo>>> {
        // Read before describing: an answer is kept against the count as it was before it
        // was made, so any change while it was made retires it.
        let generation = self.session.get().and_then(|s| s.columns_generation());
        let schema = match generation.and_then(|g| self.described.get(sql, g)) {
            Some(schema) => schema,
            None => {
                let statement = match reads_apart(sql) {
                    false => self.statement_of(sql),
                    true => Box::pin(self.read_statement_apart(sql)).await,
                };
                let statement = match statement.map_err(|e| to_pg(&e))? {
                    Some(statement) => statement,
                    None => return Ok(Arc::default()),
                };
                let schema = self.describe(&statement).await.map_err(|e| to_pg(&e))?;
                // Only a query's columns follow the engine's count (a cursor's, say, do not).
                if let (ClientStatement::Query(_), Some(generation)) = (&*statement, generation) {
                    self.described.keep(sql, generation, schema.clone());
                }
                schema
            }
        };
        Ok(match schema {
            Some(schema) => self.fields.fields(&schema, format),
            None => Arc::default(),
        })
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
                let fields = self.fields.fields(&schema, format);
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
            .run(&Arc::from("local"), &statement, Vec::new(), &mut NoNotices)
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

#[async_trait]
impl SimpleQueryHandler for Connection {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.admission.cancellable(client);
        let user = self.admission.user(client);
        // A simple query may hold several statements; each runs in turn and its answer is
        // sent before the next starts (so its rows stream, and its permits go, first); the
        // first error stops.
        let statements = match reads_apart(query) {
            false => self.statements_of(query),
            true => Box::pin(self.read_statements_apart(query)).await,
        };
        for statement in statements {
            let statement = statement.map_err(|e| to_pg(&e))?;
            let outcome = self
                .run(&user, &statement, Vec::new(), &mut ClientNotices(client))
                .await
                .map_err(|e| to_pg(&e))?;
            match self.respond(outcome, &Format::UnifiedText)? {
                Response::Query(rows) => execute::send_query_rows(client, rows).await?,
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

    /// pgwire's, but ParseComplete is fed, not flushed: it goes with the rest of the round
    /// trip's answers at Sync (or Flush), as PostgreSQL sends it.
    async fn on_parse<C>(&self, client: &mut C, message: Parse) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match StoredStatement::parse(client, &message, self.query_parser()).await? {
            Some(stmt) => client.portal_store().put_statement(Arc::new(stmt)),
            None => client
                .portal_store()
                .put_empty_statement(message.name.as_deref().unwrap_or(DEFAULT_NAME)),
        }
        client
            .feed(PgWireBackendMessage::ParseComplete(ParseComplete::new()))
            .await?;
        Ok(())
    }

    /// pgwire's, but BindComplete is fed, not flushed (as ParseComplete).
    async fn on_bind<C>(&self, client: &mut C, message: Bind) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statement_name = message.statement_name.as_deref().unwrap_or(DEFAULT_NAME);
        let portal_name = message.portal_name.as_deref().unwrap_or(DEFAULT_NAME);
        match client.portal_store().get_statement(statement_name) {
            Some(Entry::Value(statement)) => {
                let portal = Portal::try_new(&message, statement)?;
                client.portal_store().put_portal(Arc::new(portal));
            }
            Some(Entry::Empty) => {
                if !message.parameters.is_empty() {
                    return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                        "ERROR".to_owned(),
                        "08P01".to_owned(),
                        format!(
                            "bind message supplies {} parameters, but prepared statement {:?} requires 0",
                            message.parameters.len(),
                            statement_name
                        ),
                    ))));
                }
                client.portal_store().put_empty_portal(portal_name);
            }
            None => return Err(PgWireError::StatementNotFound(statement_name.to_owned())),
        }
        client
            .feed(PgWireBackendMessage::BindComplete(BindComplete::new()))
            .await?;
        Ok(())
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
        self.admission.cancellable(client);
        let sql = &portal.statement.statement;
        let statement = match reads_apart(sql) {
            false => self.statement_of(sql),
            true => Box::pin(self.read_statement_apart(sql)).await,
        };
        let Some(statement) = statement.map_err(|e| to_pg(&e))? else {
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
        let user = self.admission.user(client);
        let outcome = self
            .run(&user, &statement, values, &mut ClientNotices(client))
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
            // A cursor has a name: the unnamed portal (every pgbench round trip) is never one.
            let named = message.name.as_deref().filter(|n| !n.is_empty());
            match client
                .portal_store()
                .get_portal(named.unwrap_or(DEFAULT_NAME))
            {
                Some(Entry::Value(portal)) => {
                    let fields = self
                        .describe_fields(&portal.statement.statement, &portal.result_column_format)
                        .await?;
                    let description = if fields.is_empty() {
                        PgWireBackendMessage::NoData(NoData::new())
                    } else {
                        PgWireBackendMessage::RowDescription(RowDescription::new(
                            fields.iter().map(Into::into).collect(),
                        ))
                    };
                    // Fed, not flushed: the Sync or Flush that ends the client's batch sends
                    // it, as PostgreSQL buffers its answers until then.
                    client.feed(description).await?;
                    return Ok(());
                }
                Some(Entry::Empty) => {}
                None => {
                    let schema = match named {
                        Some(name) => self
                            .cursors
                            .lock()
                            .await
                            .get(name)
                            .map(|c| c.schema.clone()),
                        None => None,
                    };
                    if let Some(schema) = schema {
                        let fields = encode::fields(&schema, |_| FieldFormat::Text);
                        return send_describe_response(
                            client,
                            &DescribePortalResponse::new(fields),
                        )
                        .await;
                    }
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
        let statement = match reads_apart(&stmt.statement) {
            false => self.statement_of(&stmt.statement),
            true => Box::pin(self.read_statement_apart(&stmt.statement)).await,
        };
        let statement = statement.map_err(|e| to_pg(&e))?;
        let params = match &statement {
            Some(statement) => self
                .parameter_types(statement, &stmt.statement, &stmt.parameter_types)
                .await
                .map_err(|e| to_pg(&e))?,
            None => Vec::new(),
        };
        let fields = self
            .describe_fields(&stmt.statement, &Format::UnifiedText)
            .await?;
        Ok(DescribeStatementResponse::new(params, fields.to_vec()))
    }

    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        execute::execute(self, client, message, self.cancel_handle.get()).await
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
            .describe_fields(&portal.statement.statement, &portal.result_column_format)
            .await?;
        Ok(DescribePortalResponse::new(fields.to_vec()))
    }
}

impl Connection {
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

/// A query text's columns as the engine last described them, with the engine's columns
/// count ([`sluice_engine::Session::columns_generation`]) they hold for.
#[derive(Debug, Default)]
struct Described(std::sync::Mutex<Option<DescribedText>>);

#[derive(Debug)]
struct DescribedText {
    text: String,
    generation: u64,
    columns: Option<Arc<Schema>>,
}

impl Described {
    fn get(&self, sql: &str, generation: u64) -> Option<Option<Arc<Schema>>> {
        let kept = self.0.lock().ok()?;
        let kept = kept.as_ref()?;
        (kept.generation == generation && kept.text == sql).then(|| kept.columns.clone())
    }

    fn keep(&self, sql: &str, generation: u64, columns: Option<Arc<Schema>>) {
        let Ok(mut kept) = self.0.lock() else { return };
        match kept.as_mut() {
            // The buffer reused.
            Some(kept) => {
                kept.text.clear();
                kept.text.push_str(sql);
                kept.generation = generation;
                kept.columns = columns;
            }
            None => {
                *kept = Some(DescribedText {
                    text: sql.to_string(),
                    generation,
                    columns,
                })
            }
        }
    }
}

impl AsRef<Admission> for Connection {
    fn as_ref(&self) -> &Admission {
        &self.admission
    }
}

/// Whether `sql` is long enough to be read on a blocking thread
/// ([`Connection::read_statements_apart`]).
fn reads_apart(sql: &str) -> bool {
    sql.len() > sluice_sql::lexer::READ_APART_BYTES
}

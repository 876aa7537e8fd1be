//! # Upstream mode: statements forwarded to a Postgres-wire database
//!
//! With `--upstream URL` sluice is a gateway: it answers its own statements (the workload
//! dialect, `system.*`, `SET/SHOW workload` and its other settings, `KILL QUERY`, …) as
//! always, and forwards every other message of a client's conversation to the upstream, at
//! the message level: rows, errors, notices and COPY data reach the client as the upstream
//! sent them, never decoded into values. Only what the workload tree admits is forwarded: a
//! statement waits for its QUERY slot (and its memory, its CPU threads) exactly as on the
//! embedded engine, and holds them until the upstream's ReadyForQuery ends its answer (with
//! `admission = 'transaction'`, until its transaction ends).
//!
//! The [`Forwarder`] is one client's side of that. Extended-protocol messages are collected
//! until Sync (or Flush) and sent in one write, so a driver's round trip stays one round trip;
//! Bind, Describe, Execute and Sync are read whole and sent as the client's bytes ([`Forwarder::route_raw`]);
//! what the upstream answers is matched to what was sent ([`Answer`]), which lets sluice add
//! messages of its own (a statement re-prepared on another pooled connection, the `SET`s that
//! carry a grant to the upstream) and answer some itself, without the client seeing either.
//!
//! Invariants:
//! - The client receives the answers to its messages in the order it sent them, whether
//!   sluice or the upstream answers; a message of sluice's own is handled only after every
//!   forwarded message before it has its answer.
//! - A forwarded statement is admitted before any of it reaches the upstream, and what it
//!   holds is released when its answer is complete, when it is cancelled, or when its client
//!   or the upstream goes away; a lost upstream connection is never lent again.
//! - In transaction pooling a connection is lent from the first forwarded message of a
//!   transaction to the ReadyForQuery that ends it, and what a client prepared is prepared
//!   again (under sluice's own name, one per text and types) on whatever connection it gets;
//!   a connection whose session state a client may have changed is reset (`DISCARD ALL`)
//!   before it is lent again, so nothing leaks between clients.
//! - A statement's `SETTINGS` tail is cut off; its text otherwise reaches the upstream as the
//!   client wrote it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::BytesMut;
use futures::SinkExt;
use pgwire::api::ClientInfo;
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::extendedquery::{
    Close, Describe, Flush, Parse, TARGET_TYPE_BYTE_PORTAL, TARGET_TYPE_BYTE_STATEMENT,
};
use pgwire::messages::response::TransactionStatus;
use pgwire::messages::{Message, PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::PgWireMessageServerCodec;
use sluice_engine::upstream::{Frame, Lent, ScramKeys, UpstreamPool};
use sluice_sql::{ClientStatement, Error, Query, StatementKind};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::codec::Framed;

use crate::admit::{Admission, Admitted, ClientNotices, StatementMemo};
use crate::frame::{messages, next_incoming, Corked, Incoming};
use crate::record::RunRecord;
use crate::upstream::{client_parameters, follow_parameter, AdmissionMode, PoolMode, Upstream};

mod relay;
mod routing;
mod translate;

use routing::*;
pub use routing::{is_sluices, passes_whole, Forwarded, Prepared, Routed, RoutedRaw, Step};
use translate::*;

/// How the answer to one message sent upstream is handled, in the order sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expect {
    answer: Answer,
    /// The pooled statement name a Parse creates on the connection (undone if it fails).
    prepares: Option<String>,
    /// The client's statement name a Parse defines (forgotten if it fails or is skipped, as
    /// PostgreSQL never defines it).
    defines: Option<String>,
    /// A pooled statement name the upstream's error shows, and the client's name shown
    /// instead.
    shows: Option<(String, String)>,
    /// The pooled statement name a Close removes from the connection (kept if the upstream
    /// skips the Close after an error).
    closes: Option<String>,
}

impl Expect {
    fn new(answer: Answer) -> Expect {
        Expect {
            answer,
            prepares: None,
            defines: None,
            shows: None,
            closes: None,
        }
    }

    fn relay(ends: Ends) -> Expect {
        Expect::new(Answer::Relay(ends))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Passed to the client.
    Relay(Ends),
    /// sluice's own Parse or Close in front of the client's message (a statement prepared on
    /// a connection that lacks it, one closed to keep the connection within
    /// `max_prepared_statements`): its one answer is dropped, its error is the client's.
    Own,
    /// sluice's own settings (a grant's `SET`s, start-up options): nothing reaches the client
    /// but an error, as a notice; it is not the client's statement failing.
    Quiet,
    /// One forwarded statement of a simple Query that mixes sluice's and the upstream's:
    /// everything but its ReadyForQuery (one ends the whole text).
    Piece,
    /// Not sent upstream: sluice answers with this message type (an empty body), in order.
    Synthetic(u8),
}

impl Answer {
    fn ends(self) -> Ends {
        match self {
            Answer::Relay(ends) => ends,
            Answer::Own | Answer::Synthetic(_) => Ends::One,
            Answer::Quiet | Answer::Piece => Ends::Ready,
        }
    }

    /// Whether a message of this answer (not an error, not ReadyForQuery) reaches the client.
    fn shown(self) -> bool {
        matches!(self, Answer::Relay(_) | Answer::Piece)
    }
}

/// Where an answer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ends {
    /// One message (ParseComplete, BindComplete, CloseComplete, a portal's description).
    One,
    /// A statement's description: ParameterDescription, then RowDescription or NoData.
    Description,
    /// An Execute's: rows up to CommandComplete, EmptyQueryResponse or PortalSuspended.
    Execution,
    /// A Sync's or a simple Query's: up to ReadyForQuery.
    Ready,
}

impl Ends {
    fn by(self, tag: u8) -> bool {
        match self {
            Ends::One => true,
            Ends::Description => matches!(tag, b'T' | b'n'),
            Ends::Execution => matches!(tag, b'C' | b'I' | b's'),
            Ends::Ready => tag == b'Z',
        }
    }
}

/// What one forwarded statement (or transaction) holds while it runs upstream (its record
/// is the [`Forwarder`]'s, beside it: admission writes it in place).
struct Running {
    admitted: Admitted,
    /// Set once the stop fired: the error the client gets instead of the upstream's cancel.
    stopped: Option<Error>,
    failed: bool,
}

/// Where a batch stands after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failed {
    No,
    /// The upstream failed a message: it skips the rest up to Sync, whose ReadyForQuery it
    /// sends.
    Upstream,
    /// sluice refused the batch before sending it (admission, no connection): it skips the
    /// rest up to Sync and answers that itself.
    Here,
}

/// The maps looked up for every message a client sends hash with foldhash (seeded per
/// process), not SipHash: their keys are the client's own names, so a client that chose
/// colliding names slows only itself.
type NameMap<V> = HashMap<String, V, foldhash::fast::RandomState>;
type NameSet = std::collections::HashSet<String, foldhash::fast::RandomState>;

/// One client's forwarding state.
pub struct Forwarder {
    upstream: Arc<Upstream>,
    lent: Option<Lent>,
    /// The client's statements for the upstream, by the client's names.
    statements: NameMap<Arc<Prepared>>,
    /// Names the client gave statements and portals that sluice answers.
    local_statements: NameSet,
    local_portals: NameSet,
    /// The upstream portals, with the statement each was bound from.
    portals: NameMap<Arc<Prepared>>,
    /// Extended-protocol messages not sent yet (up to the next Sync or Flush).
    pending: Vec<Step>,
    /// The last batch's list of answers, kept empty for the next (a round trip allocates
    /// none).
    spare_answers: VecDeque<Expect>,
    /// The last batch's bytes for the upstream, kept empty for the next (as `spare_answers`).
    spare_out: BytesMut,
    failed: Failed,
    /// Forwarded messages were sent since the last Sync (the Sync goes upstream too).
    in_batch: bool,
    running: Option<Running>,
    /// The record of the statement running (or of the one being admitted), written when it
    /// ends, after `running` let go of what it held (declared after it, so also dropped after
    /// it when the client goes away mid-statement).
    record: Option<RunRecord>,
    /// The status of the upstream's last ReadyForQuery.
    status: TransactionStatus,
    /// The last exchange's answer held an error.
    last_failed: bool,
    /// The exchange's answers stay in the client socket's buffer unless one is an error
    /// ([`Forwarder::answer_unsynced`]).
    hold_answers: bool,
    /// The pool of the client's database and start-up parameters ([`Upstream::pool_for`]),
    /// found at its first forwarded statement.
    pool: Option<UpstreamPool>,
    /// The run-time parameters the client's session has ([`client_parameters`] of its
    /// start-up, then as its own `SET`s change them): each connection it gets is given them
    /// ([`UpstreamConnection::apply_session`]).
    wanted: Option<Vec<(String, String)>>,
    /// The simple Queries read so far, by their integer shape ([`Shapes`]).
    shapes: Shapes,
    /// The next message's text, read on a blocking thread ([`Forwarder::route_raw_apart`]).
    read_ahead: Option<ReadAhead>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("lent", &self.lent.is_some())
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// Extended-protocol messages held at most before they are sent without waiting for Sync.
const MAX_PENDING: usize = 256;

/// How long a stopped statement (cancelled, killed, out of time, its client gone) waits for
/// the upstream's answer after the upstream was asked to stop, before its connection is
/// closed and what it held let go.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The client's socket, as the connection loop has it.
pub type Socket<S, T> = Framed<Corked<S>, PgWireMessageServerCodec<T>>;

/// I/O with the client failed: the connection ends.
type ClientResult<T> = std::io::Result<T>;

impl Forwarder {
    pub fn new(upstream: Arc<Upstream>) -> Forwarder {
        Forwarder {
            upstream,
            lent: None,
            statements: NameMap::default(),
            local_statements: NameSet::default(),
            local_portals: NameSet::default(),
            portals: NameMap::default(),
            pending: Vec::new(),
            spare_answers: VecDeque::new(),
            spare_out: BytesMut::new(),
            failed: Failed::No,
            in_batch: false,
            running: None,
            record: None,
            status: TransactionStatus::Idle,
            read_ahead: None,
            last_failed: false,
            hold_answers: false,
            pool: None,
            wanted: None,
            shapes: Shapes::default(),
        }
    }

    /// The upstream's parameters a new client is told.
    pub fn parameters(&self) -> Vec<(String, String)> {
        self.upstream.parameters()
    }

    /// Takes the upstream backend a session-pooled client was given at start-up (its pid is
    /// the client's, [`crate::upstream::SessionBackend`]): the client's statements run there
    /// from the first, and what the upstream says while the client is idle reaches it.
    pub fn adopt<C: ClientInfo>(&mut self, client: &C) {
        let Some(mut lent) = client
            .session_extensions()
            .get::<crate::upstream::SessionBackend>()
            .and_then(|backend| backend.take())
        else {
            return;
        };
        self.pool = Some(self.upstream.pool_for(
            client.metadata(),
            client.session_extensions().get::<ScramKeys>().as_deref(),
        ));
        // Its start-up parameters are set (`Upstream::start_session`); what the client changes
        // is followed from here, as for a connection lent at a first statement.
        lent.dirty = true;
        self.wanted = Some(client_parameters(client.metadata()));
        self.lent = Some(lent);
    }

    /// Completes with what the upstream sends on a connection this client holds while the
    /// client is idle (session pooling: a `NOTIFY` for a `LISTEN`, a notice, a parameter's new
    /// value, or the connection's end); never when no connection is held or a batch is open.
    pub async fn idle_message(&mut self) -> Result<Frame, Error> {
        match self.lent.as_mut() {
            Some(lent) if self.pending.is_empty() && !self.in_batch && lent.awaiting == 0 => {
                lent.read_frame().await
            }
            _ => std::future::pending().await,
        }
    }

    /// Passes on what [`Forwarder::idle_message`] read: notifications, notices and parameter
    /// values go to the client at once. A connection the upstream ended (an error, a FATAL
    /// message) is dropped; the client's next statement gets another.
    pub async fn relay_idle<S, T>(
        &mut self,
        message: Result<Frame, Error>,
        socket: &mut Socket<S, T>,
    ) -> ClientResult<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        match message {
            Ok(frame) if matches!(frame.tag, b'A' | b'N' | b'S') => {
                write_frame(socket, &frame).await?;
                socket.get_mut().flush().await
            }
            // The upstream ended the session (`pg_terminate_backend`, a shutdown, an idle
            // timeout): the client is told as PostgreSQL tells it, and its connection closes,
            // as it would going direct.
            Ok(frame) if frame.tag == b'E' && is_fatal(&frame) => {
                if let Some(lent) = self.lent.take() {
                    lent.discard();
                }
                write_frame(socket, &frame).await?;
                socket.get_mut().flush().await?;
                Err(session_ended())
            }
            other => {
                // Session pooling: the backend was the client's session (its pid the
                // client's), so the session ends with it, as going direct; so does a
                // transaction the client had open (its work is gone with the backend: the
                // client must not go on as if it were in it). In transaction pooling, between
                // transactions, the client's next statement gets another connection.
                let session = self.upstream.options.pool_mode == PoolMode::Session
                    || self.status != TransactionStatus::Idle;
                tracing::info!(
                    "upstream connection of an idle client ended ({}); {}",
                    match &other {
                        Ok(frame) => format!("'{}' message", frame.tag as char),
                        Err(e) => e.to_string(),
                    },
                    if session {
                        "so does the client's session"
                    } else {
                        "its next statement gets a new one"
                    }
                );
                if let Some(lent) = self.lent.take() {
                    lent.discard();
                }
                if session {
                    let e = Error::new(
                        sluice_sql::ErrorCode::AllConnectionTriesFailed,
                        "the upstream connection of this session ended (its backend or the network went away); reconnect",
                    );
                    let fatal =
                        ErrorInfo::new("FATAL".to_owned(), e.sqlstate().to_owned(), e.to_string());
                    socket
                        .send(PgWireBackendMessage::ErrorResponse(fatal.into()))
                        .await?;
                    return Err(session_ended());
                }
                self.status = TransactionStatus::Idle;
                socket.set_transaction_status(TransactionStatus::Idle);
                Ok(())
            }
        }
    }

    /// Whether the portal or statement `name` is one sluice answers for; `forget`: the name
    /// is being closed.
    fn is_local(&mut self, portal: bool, name: &str, forget: bool) -> bool {
        let names = if portal {
            &mut self.local_portals
        } else {
            &mut self.local_statements
        };
        if forget {
            names.remove(name)
        } else {
            names.contains(name)
        }
    }

    /// After an error in an extended-protocol batch: every message up to the next Sync is
    /// discarded, as PostgreSQL discards them.
    pub fn skips_to_sync(&self) -> bool {
        self.failed != Failed::No
    }

    /// Whether forwarded messages wait for a Sync or a Flush that has not come.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The client waits, having sent extended-protocol messages without a Sync or a Flush
    /// (libpq's pipeline mode): they go upstream and are answered as PostgreSQL answers them —
    /// its answers held in the output buffer until a Sync or a Flush asks for them, except
    /// an error, which PostgreSQL sends at once (and with it what it held).
    pub async fn answer_unsynced<S, T, H>(
        &mut self,
        socket: &mut Socket<S, T>,
        connection: &H,
    ) -> ClientResult<()>
    where
        H: pgwire::api::query::SimpleQueryHandler + AsRef<Admission>,
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        self.hold_answers = true;
        let answered = self.run_batch(socket, connection, false).await;
        self.hold_answers = false;
        if answered.is_ok() && !self.last_failed {
            socket.get_mut().hold_through_reads();
        }
        answered
    }

    /// Before sluice answers a message itself: every forwarded message before it gets its
    /// answer first (a Flush upstream), so the client's answers stay in order.
    pub async fn settle<S, T, H>(
        &mut self,
        socket: &mut Socket<S, T>,
        connection: &H,
    ) -> ClientResult<()>
    where
        H: pgwire::api::query::SimpleQueryHandler + AsRef<Admission>,
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        if !self.pending.is_empty() {
            self.run_batch(socket, connection, false).await?;
        }
        Ok(())
    }

    /// Forwards one message routed upstream.
    pub async fn forward<S, T, H>(
        &mut self,
        step: Step,
        socket: &mut Socket<S, T>,
        connection: &H,
    ) -> ClientResult<()>
    where
        H: pgwire::api::query::SimpleQueryHandler + AsRef<Admission>,
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        if self.skips_to_sync() && !matches!(step, Step::Sync) {
            // Discarded, as the upstream discards it (a Query sent now would never be
            // answered, and its statement would hold its slot for good); a Parse discarded
            // defines nothing.
            if let Step::Parse {
                name,
                existing: None,
                ..
            } = &step
            {
                self.statements.remove(name);
            }
            return Ok(());
        }
        match step {
            Step::Query { text, pieces, raw } => {
                self.simple_query(text, pieces, raw, socket, connection)
                    .await
            }
            Step::Deallocate { name } => {
                self.settle(socket, connection).await?;
                self.statements.remove(&name);
                write_raw(socket, &messages::command_complete("DEALLOCATE")).await?;
                self.ready(socket).await
            }
            Step::Sync => self.run_batch(socket, connection, true).await,
            Step::Flush => self.run_batch(socket, connection, false).await,
            other => {
                self.pending.push(other);
                // A client that pipelines without ever sending Sync is answered as it goes
                // (a Flush upstream), so what sluice holds for it stays bounded.
                if self.pending.len() >= MAX_PENDING {
                    self.run_batch(socket, connection, false).await?;
                }
                Ok(())
            }
        }
    }

    /// A simple Query: statements for the upstream go as one Query (one admission); a text
    /// that mixes sluice's statements with the upstream's runs statement by statement.
    async fn simple_query<S, T, H>(
        &mut self,
        text: Arc<str>,
        pieces: Vec<Piece>,
        raw: Option<BytesMut>,
        socket: &mut Socket<S, T>,
        connection: &H,
    ) -> ClientResult<()>
    where
        H: pgwire::api::query::SimpleQueryHandler + AsRef<Admission>,
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        let mixed = pieces.iter().any(|(_, f)| f.is_none());
        if !mixed {
            // What goes upstream, encoded from the texts at hand (none copied).
            let mut out = std::mem::take(&mut self.spare_out);
            match pieces.as_slice() {
                // Not UTF-8: the client's bytes, as they came (its encoding is the upstream's
                // to read; a SETTINGS tail in it is not cut).
                _ if raw.is_some() => out.extend_from_slice(raw.as_deref().unwrap_or_default()),
                [(_, Some(f))] => encode_query(&f.sql, &mut out),
                _ if pieces
                    .iter()
                    .all(|(at, f)| f.as_ref().is_some_and(|f| *f.sql == text[at.clone()])) =>
                {
                    encode_query(&text, &mut out)
                }
                _ => {
                    let sqls: Vec<&str> = pieces
                        .iter()
                        .filter_map(|(_, f)| f.as_ref().map(|f| &*f.sql))
                        .collect();
                    encode_query(&sqls.join(";\n"), &mut out)
                }
            }
            let changes_session = pieces
                .iter()
                .any(|(_, f)| f.as_ref().is_some_and(|f| f.changes_session));
            let admit_as = pieces
                .into_iter()
                .find_map(|(_, f)| f)
                .unwrap_or_else(|| Forwarded::new(&text, utility(&text), false));
            if !self.begin(socket, connection, Some(&admit_as)).await? {
                out.clear();
                self.spare_out = out;
                return self.ready(socket).await;
            }
            self.mark(changes_session);
            let mut answers = std::mem::take(&mut self.spare_answers);
            answers.push_back(Expect::relay(Ends::Ready));
            return self.relay(socket, out, answers, true).await;
        }
        // Mixed: each statement in turn, one ReadyForQuery at the end; the first error stops.
        for (piece, forwarded) in pieces {
            let ok = match forwarded {
                Some(f) => {
                    if !self.begin(socket, connection, Some(&f)).await? {
                        false
                    } else {
                        let mut out = std::mem::take(&mut self.spare_out);
                        encode_query(&f.sql, &mut out);
                        self.mark(f.changes_session);
                        let answers = VecDeque::from([Expect::new(Answer::Piece)]);
                        self.relay(socket, out, answers, false).await?;
                        !self.last_failed
                    }
                }
                None => {
                    let result = pgwire::api::query::SimpleQueryHandler::do_query(
                        connection,
                        socket,
                        &text[piece],
                    )
                    .await;
                    match result {
                        Ok(_) => true,
                        Err(e) => {
                            send_error(socket, e).await?;
                            false
                        }
                    }
                }
            };
            if !ok {
                break;
            }
        }
        self.ready(socket).await
    }

    /// Marks the lent connection as changed beyond its transaction (reset before it is lent
    /// to another client).
    fn mark(&mut self, changes_session: bool) {
        if let Some(lent) = self.lent.as_mut() {
            lent.dirty |= changes_session || self.upstream.options.pool_mode == PoolMode::Session;
        }
    }

    /// Sends the batch collected up to this Sync (`sync`) or Flush.
    async fn run_batch<S, T, H>(
        &mut self,
        socket: &mut Socket<S, T>,
        connection: &H,
        sync: bool,
    ) -> ClientResult<()>
    where
        H: pgwire::api::query::SimpleQueryHandler + AsRef<Admission>,
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        let mut steps = std::mem::take(&mut self.pending);
        match self.failed {
            Failed::Here => {
                // Refused before anything was sent: the rest up to Sync is skipped here.
                if sync {
                    self.failed = Failed::No;
                    self.in_batch = false;
                    return self.ready(socket).await;
                }
                return Ok(());
            }
            Failed::Upstream if !sync => return Ok(()),
            _ => {}
        }
        // Admitted as the batch's first Execute (an unknown portal: as an empty utility
        // statement, which the upstream then refuses).
        let unknown;
        let admit_as = match steps.iter().find_map(|s| match s {
            Step::Execute { prepared, .. } => Some(prepared),
            _ => None,
        }) {
            Some(Some(prepared)) => Some(&prepared.forwarded),
            Some(None) => {
                unknown = Forwarded::new("", utility(""), false);
                Some(&unknown)
            }
            None => None,
        };
        if self.failed == Failed::No && !self.begin(socket, connection, admit_as).await? {
            // Refused: the rest up to Sync is skipped here, and the Sync answered.
            self.failed = Failed::Here;
            if sync {
                self.failed = Failed::No;
                self.in_batch = false;
                return self.ready(socket).await;
            }
            return Ok(());
        }
        let Some(lent) = self.lent.as_mut() else {
            // Only a Sync after an upstream failure gets here without a connection.
            self.failed = Failed::No;
            return self.ready(socket).await;
        };
        let pooled = self.upstream.options.pool_mode == PoolMode::Transaction;
        let mut out = std::mem::take(&mut self.spare_out);
        let mut answers = std::mem::take(&mut self.spare_answers);
        let mut dirty = self.upstream.options.pool_mode == PoolMode::Session;
        if self.failed == Failed::No {
            for step in steps.drain(..) {
                translate(
                    step,
                    lent,
                    pooled.then_some(self.upstream.options.max_prepared_statements),
                    &mut out,
                    &mut answers,
                    &mut dirty,
                );
            }
        }
        steps.clear();
        // Kept for the next batch, its capacity with it.
        self.pending = steps;
        lent.dirty |= dirty;
        if sync {
            out.extend_from_slice(&messages::SYNC);
            answers.push_back(Expect::relay(Ends::Ready));
            self.failed = Failed::No;
        } else {
            encode(&Flush::new(), &mut out);
        }
        self.in_batch = !sync;
        self.relay(socket, out, answers, true).await
    }

    /// Before a statement is sent: its admission (unless what it runs in already holds one)
    /// and an upstream connection. `false` if either failed: the client was told why.
    async fn begin<S, T, H>(
        &mut self,
        socket: &mut Socket<S, T>,
        connection: &H,
        admit_as: Option<&Forwarded>,
    ) -> ClientResult<bool>
    where
        H: pgwire::api::query::SimpleQueryHandler + AsRef<Admission>,
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        connection.as_ref().cancellable(&*socket);
        if let (Some(forwarded), None) = (admit_as, &self.running) {
            let user = connection.as_ref().user(&*socket);
            let admitted = connection
                .as_ref()
                .admit(
                    &user,
                    &forwarded.query,
                    Some(&forwarded.memo),
                    &mut ClientNotices(socket),
                    &mut self.record,
                )
                .await;
            match admitted {
                Ok(admitted) => {
                    self.running = Some(Running {
                        admitted,
                        stopped: None,
                        failed: false,
                    })
                }
                Err(e) => {
                    if let Some(record) = self.record.as_mut() {
                        record.failed(&e);
                    }
                    self.record = None;
                    write_raw(socket, &error_bytes(&e)).await?;
                    return Ok(false);
                }
            }
        }
        if self.lent.is_none() {
            let pool = self.pool.get_or_insert_with(|| {
                self.upstream.pool_for(
                    socket.metadata(),
                    socket.session_extensions().get::<ScramKeys>().as_deref(),
                )
            });
            match pool.checkout().await {
                Ok(mut lent) => {
                    if !self.upstream.knows_parameters() {
                        self.upstream.note_parameters(&lent);
                    }
                    // What this client changes is followed from here (`mark`, `translate`).
                    lent.dirty = self.upstream.options.pool_mode == PoolMode::Session;
                    let wanted = self
                        .wanted
                        .get_or_insert_with(|| client_parameters(socket.metadata()));
                    match lent.apply_session(wanted).await {
                        Ok(None) => self.lent = Some(lent),
                        // Checked at start-up, so only an upstream changed since refuses: the
                        // client hears of it, its statement runs.
                        Ok(Some(error)) => {
                            let notice = Frame {
                                tag: b'N',
                                body: error.body,
                            };
                            write_frame(socket, &notice).await?;
                            self.lent = Some(lent);
                        }
                        Err(e) => {
                            lent.discard();
                            self.end_running(Some(&e));
                            write_raw(socket, &error_bytes(&e)).await?;
                            return Ok(false);
                        }
                    }
                }
                Err(e) => {
                    self.end_running(Some(&e));
                    write_raw(socket, &error_bytes(&e)).await?;
                    return Ok(false);
                }
            }
        }
        // The grant, carried to the upstream: CPU threads as parallel workers, the memory
        // reservation as work_mem.
        if let (Some(running), Some(lent)) = (&self.running, self.lent.as_mut()) {
            let settings = upstream_settings(&running.admitted);
            if lent.applied != settings {
                // A grant without either after one with them: back to the session's values.
                let sql = if settings.is_empty() {
                    format!("{RESET_WORKERS}; {RESET_MEMORY}")
                } else {
                    settings.clone()
                };
                lent.applied = settings;
                self.quietly(socket, sql).await?;
            }
        }
        Ok(self.lent.is_some())
    }

    /// Runs sluice's own `sql` on the lent connection before the client's statement: its
    /// answer is not shown (an error comes back as a notice), and the connection counts as
    /// changed.
    async fn quietly<S, T>(&mut self, socket: &mut Socket<S, T>, sql: String) -> ClientResult<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        if let Some(lent) = self.lent.as_mut() {
            lent.dirty = true;
        }
        let mut out = BytesMut::new();
        encode_query(&sql, &mut out);
        let answers = VecDeque::from([Expect::new(Answer::Quiet)]);
        self.relay(socket, out, answers, false).await
    }

    /// The statement (or transaction) ended: what it held is let go.
    fn end_running(&mut self, error: Option<&Error>) {
        if let Some(running) = self.running.as_mut() {
            if let (Some(e), Some(record)) = (error, self.record.as_mut()) {
                record.failed(e);
                running.failed = true;
            }
            self.let_go();
        }
    }

    /// The running statement lets go of what it held, then its record is written (both in
    /// place: neither is moved out first).
    fn let_go(&mut self) {
        if let (Some(record), Some(false)) = (
            self.record.as_mut(),
            self.running.as_ref().map(|r| r.failed),
        ) {
            record.finished();
        }
        self.running = None;
        self.record = None;
    }

    /// sluice's own ReadyForQuery, with the upstream transaction's status.
    async fn ready<S, T>(&mut self, socket: &mut Socket<S, T>) -> ClientResult<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        self.settled();
        write_raw(socket, &messages::ready_for_query(self.status)).await?;
        socket.get_mut().flush().await
    }

    /// After a ReadyForQuery: the statement's admission ends (with `admission =
    /// 'transaction'`, only outside a transaction), and in transaction pooling the
    /// connection goes back to the pool outside a transaction.
    fn settled(&mut self) {
        let outside = self.status == TransactionStatus::Idle;
        if outside || self.upstream.options.admission == AdmissionMode::Statement {
            let failed = self.last_failed;
            if let Some(running) = self.running.as_mut() {
                running.failed |= failed;
                self.let_go();
            }
        }
        if outside && self.upstream.options.pool_mode == PoolMode::Transaction {
            self.lent = None;
        }
    }
}

/// Whether an ErrorResponse is FATAL (or PANIC): the upstream closes the session after it.
fn is_fatal(frame: &Frame) -> bool {
    // `V` is the severity unlocalized; `S` (localized) stands in for it on servers before 9.6.
    let fields = frame.fields();
    let severity = |code: u8| fields.iter().find(|(k, _)| *k == code).map(|(_, v)| v);
    severity(b'V')
        .or_else(|| severity(b'S'))
        .is_some_and(|severity| severity == "FATAL" || severity == "PANIC")
}

/// How a client's connection ends when the upstream ended its session.
fn session_ended() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the upstream ended the session",
    )
}

/// Whether a CommandComplete's tag says every prepared statement of the session is gone
/// (`DEALLOCATE ALL`, `DISCARD ALL`).
fn drops_prepared(tag: &[u8]) -> bool {
    tag.starts_with(b"DEALLOCATE ALL\0") || tag.starts_with(b"DISCARD ALL\0")
}

/// An ErrorResponse's SQLSTATE.
fn sqlstate(frame: &Frame) -> String {
    frame
        .fields()
        .into_iter()
        .find(|(k, _)| *k == b'C')
        .map(|(_, v)| v)
        .unwrap_or_default()
}

/// The rows a CommandComplete's body counts (`SELECT 5`, `INSERT 0 3`), 0 if none: the
/// digits after the tag's last space (one runs per statement, so it reads bytes, not strings;
/// a tag is a few bytes, shorter than what `memchr`'s vector search gains on).
fn rows_counted(body: &[u8]) -> usize {
    let tag = &body[..body.iter().position(|&b| b == 0).unwrap_or(body.len())];
    let digits = &tag[tag.iter().rposition(|&b| b == b' ').map_or(0, |at| at + 1)..];
    if digits.is_empty() {
        return 0;
    }
    digits
        .iter()
        .try_fold(0usize, |n, &d| {
            d.is_ascii_digit()
                .then(|| n.checked_mul(10)?.checked_add(usize::from(d - b'0')))
                .flatten()
        })
        .unwrap_or(0)
}

/// A backend message as the upstream sent it, to the client.
async fn write_frame<S, T>(socket: &mut Socket<S, T>, frame: &Frame) -> ClientResult<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    let mut header = [frame.tag, 0, 0, 0, 0];
    header[1..].copy_from_slice(&(frame.body.len() as u32 + 4).to_be_bytes());
    let io = socket.get_mut();
    if io.hold(&header, &frame.body) {
        return Ok(());
    }
    io.write_all(&header).await?;
    io.write_all(&frame.body).await
}

/// Backend messages the relay passes to the client in place, as they came
/// ([`UpstreamConnection::peek_message`]): all but those sluice must read or act on —
/// notices, notifications and parameter changes (sent at once), errors, the start of a
/// `COPY FROM STDIN`, and what only comes at start-up.
fn passes_in_place(tag: u8) -> bool {
    !matches!(tag, b'N' | b'A' | b'S' | b'E' | b'G' | b'K' | b'R')
}

/// A backend message whole (type, length, body), to the client: held with the rest of the
/// answer, or written once [`crate::frame::HOLD_LIMIT`] is held.
async fn write_message<S, T>(socket: &mut Socket<S, T>, message: &[u8]) -> ClientResult<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    let io = socket.get_mut();
    if io.hold(&message[..5], &message[5..]) {
        return Ok(());
    }
    io.write_all(message).await
}

async fn write_raw<S, T>(socket: &mut Socket<S, T>, bytes: &[u8]) -> ClientResult<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    SinkExt::<PgWireBackendMessage>::flush(socket).await?;
    socket.get_mut().write_all(bytes).await
}

/// Reads of upstream data between looks at the statement's stop while the data keeps coming.
const READS_PER_STOP_CHECK: usize = 16;

/// The most a connection keeps of a batch's buffer for the next one.
const KEEP_AT_MOST: usize = 64 * 1024;

fn encode<M: Message>(message: &M, out: &mut BytesMut) {
    // Encoding into memory cannot fail for messages pgwire decoded.
    let _ = message.encode(out);
}

/// A simple-protocol Query for `sql`, as pgwire's `Query` encodes it, from the text where it
/// is (no `String` made for it).
fn encode_query(sql: &str, out: &mut BytesMut) {
    out.reserve(6 + sql.len());
    out.extend_from_slice(b"Q");
    out.extend_from_slice(&(4 + sql.len() as u32 + 1).to_be_bytes());
    out.extend_from_slice(sql.as_bytes());
    out.extend_from_slice(b"\0");
}

fn encode_frontend(message: &PgWireFrontendMessage, out: &mut BytesMut) {
    // As `encode`.
    let _ = message.encode(out);
}

/// Sends a pgwire error as an ErrorResponse (no ReadyForQuery).
async fn send_error<S, T>(socket: &mut Socket<S, T>, e: PgWireError) -> ClientResult<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    let info = match e {
        PgWireError::UserError(info) => *info,
        other => ErrorInfo::new("ERROR".into(), "XX000".into(), other.to_string()),
    };
    socket
        .send(PgWireBackendMessage::ErrorResponse(info.into()))
        .await
}

/// A sluice error as an ErrorResponse message's bytes.
fn error_bytes(e: &Error) -> BytesMut {
    let mut out = BytesMut::new();
    if let PgWireError::UserError(info) = crate::error::to_pg(e) {
        let _ = PgWireBackendMessage::ErrorResponse((*info).into()).encode(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::{UpstreamOptions, UpstreamUrl};
    use pgwire::messages::extendedquery::Bind;
    use pgwire::messages::simplequery::Query as QueryMessage;
    use pgwire::messages::DecodeContext;

    fn decoded(frame: &mut BytesMut) -> Bind {
        let mut context = DecodeContext::new(Default::default());
        context.awaiting_frontend_ssl = false;
        context.awaiting_frontend_startup = false;
        match PgWireFrontendMessage::decode(frame, &context) {
            Ok(Some(PgWireFrontendMessage::Bind(bind))) => bind,
            other => panic!("not a Bind: {other:?}"),
        }
    }

    #[test]
    fn a_bind_read_whole_is_renamed_and_otherwise_unchanged() {
        let bind = Bind::new(
            Some("portal".into()),
            Some("s1".into()),
            vec![1],
            vec![Some(bytes::Bytes::from_static(b"\0\x01")), None],
            vec![0, 1],
        );
        let mut frame = BytesMut::new();
        encode(&bind, &mut frame);
        let (portal, statement) = bind_names(&frame).expect("names");
        assert_eq!(
            (&frame[portal], &frame[statement.clone()]),
            (&b"portal"[..], &b"s1"[..])
        );
        let mut out = BytesMut::new();
        renamed_bind(&frame, statement, "sluice_0123456789abcdef", &mut out);
        let length = u32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize;
        assert_eq!(length, out.len() - 1, "the length counts the new name");
        let mut renamed = decoded(&mut out);
        assert!(out.is_empty(), "exactly one message");
        assert_eq!(
            renamed.statement_name.as_deref(),
            Some("sluice_0123456789abcdef")
        );
        renamed.statement_name = bind.statement_name.clone();
        assert_eq!(renamed, bind);
    }

    /// A client's forwarder before it has an upstream connection (routing needs none).
    fn forwarder() -> Forwarder {
        let url = UpstreamUrl::parse("postgres://u@127.0.0.1:1/db").expect("url");
        Forwarder::new(Arc::new(Upstream::new(UpstreamOptions {
            pool_size: 1,
            server_idle_timeout: None,
            max_prepared_statements: 2,
            ..UpstreamOptions::new(url)
        })))
    }

    /// `body` as one frontend message of type `tag`.
    fn message(tag: u8, body: &[u8]) -> BytesMut {
        let mut frame = BytesMut::from(&[tag][..]);
        frame.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        frame.extend_from_slice(body);
        frame
    }

    #[test]
    fn a_describe_read_whole_goes_upstream_as_it_came_unless_it_is_sluices() {
        let mut f = forwarder();
        let portal = message(b'D', b"Pp1\0");
        match f.route_raw(portal.clone()) {
            RoutedRaw::Upstream(Step::Passed { frame, ends }) => {
                assert_eq!((frame, ends), (portal, Ends::One));
            }
            other => panic!("{other:?}"),
        }
        match f.route_raw(message(b'D', b"Ss1\0")) {
            RoutedRaw::Upstream(Step::DescribeStatement { name, prepared }) => {
                assert_eq!((name.as_str(), prepared.is_none()), ("s1", true));
            }
            other => panic!("{other:?}"),
        }
        // A statement sluice answers (system.*) is described by sluice, as is its portal.
        let parse = Parse::new(
            Some("own".into()),
            "SELECT * FROM system.workloads".into(),
            vec![],
        );
        assert!(matches!(
            f.route(PgWireFrontendMessage::Parse(parse)),
            Routed::Local(_)
        ));
        assert!(matches!(
            f.route_raw(message(b'D', b"Sown\0")),
            RoutedRaw::Local(_)
        ));
        f.local_portals.insert("mine".into());
        assert!(matches!(
            f.route_raw(message(b'D', b"Pmine\0")),
            RoutedRaw::Local(_)
        ));
        // No NUL after the name, or none at all: a protocol violation.
        assert!(matches!(
            f.route_raw(message(b'D', b"Pp1")),
            RoutedRaw::Malformed
        ));
        assert!(matches!(
            f.route_raw(message(b'D', b"")),
            RoutedRaw::Malformed
        ));
        // A target type that is neither: pgwire refuses it, as PostgreSQL does.
        assert!(matches!(
            f.route_raw(message(b'D', b"Xp1\0")),
            RoutedRaw::Local(_)
        ));
    }

    #[test]
    fn a_query_read_whole_is_routed_on_its_text() {
        let mut f = forwarder();
        let text = |routed: RoutedRaw| match routed {
            RoutedRaw::Upstream(Step::Query { text, pieces, .. }) => (text, pieces.len()),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            text(f.route_raw(message(b'Q', b"SELECT 1; SELECT 2\0"))),
            (Arc::from("SELECT 1; SELECT 2"), 2)
        );
        // sluice's own statements are answered by sluice (decoded from these bytes).
        let own = message(b'Q', b"SHOW WORKLOADS\0");
        match f.route_raw(own.clone()) {
            RoutedRaw::Local(frame) => assert_eq!(frame, own),
            other => panic!("{other:?}"),
        }
        // Invalid UTF-8 replaced, as pgwire's decoder does; a text without its NUL is a
        // protocol violation (PostgreSQL: "invalid string in message").
        assert_eq!(
            text(f.route_raw(message(b'Q', b"SELECT '\xff'\0"))),
            (Arc::from("SELECT '\u{fffd}'"), 1)
        );
        assert!(matches!(
            f.route_raw(message(b'Q', b"SELECT 3")),
            RoutedRaw::Malformed
        ));
    }

    #[test]
    fn system_tables_are_named_only_as_a_qualifier() {
        for named in [
            "SELECT * FROM system.processes",
            "select * from SYSTEM.workloads",
            "SELECT (system.x)",
            "SELECT * FROM mysystem.a, system.b",
        ] {
            assert!(mentions_system(named), "{named}");
        }
        for not in [
            "SELECT * FROM mysystem.a",
            "SELECT * FROM a.system.b",
            "SELECT * FROM my_system.b",
            "SELECT \"system\"",
            "SELECT 'system'",
        ] {
            assert!(!mentions_system(not), "{not}");
        }
    }

    #[test]
    fn a_query_is_encoded_as_pgwire_encodes_it() {
        for sql in ["SELECT 1", "", "SELECT 'é'"] {
            let (mut ours, mut theirs) = (BytesMut::new(), BytesMut::new());
            encode_query(sql, &mut ours);
            encode(&QueryMessage::new(sql.to_string()), &mut theirs);
            assert_eq!(ours, theirs);
        }
    }

    #[test]
    fn rows_are_the_last_number_of_a_command_tag() {
        for (tag, rows) in [
            (&b"SELECT 5\0"[..], 5),
            (b"INSERT 0 3\0", 3),
            (b"UPDATE 12345678\0", 12_345_678),
            (b"CREATE TABLE\0", 0),
            (b"BEGIN\0", 0),
            (b"SELECT 5", 5),
            (b"SELECT -1\0", 0),
            (b"SELECT 18446744073709551615\0", usize::MAX),
            (b"SELECT 18446744073709551616\0", 0),
            (b"\0", 0),
            (b"", 0),
        ] {
            assert_eq!(
                rows_counted(tag),
                rows,
                "{:?}",
                String::from_utf8_lossy(tag)
            );
        }
    }

    #[test]
    fn names_without_their_nul_are_not_read() {
        assert!(bind_names(b"B\0\0\0\x08p\0s").is_none());
        assert!(cstring_at(b"E\0\0\0\x05", 5).is_none());
        assert_eq!(cstring_at(b"E\0\0\0\x09\0\0\0\0\0", 5), Some(5..5));
    }
}

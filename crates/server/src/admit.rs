//! Admission, one piece for both paths (the embedded engine's statements and those forwarded
//! upstream): the workload a statement runs in (pinned, requested, classified, its lane), its
//! `system.processes` entry and record, then every resource its workload's tree asks for —
//! query slots, CPU threads, memory — waited for in order, with the statement's stop
//! (`Stop`: a cancel, a kill, its client gone, `max_execution_time`) and the notices it
//! tells the client while it waits.
//!
//! Invariant: what an admission took is held by its `Admitted` (its `Held` first) and let
//! go when that is dropped, however the statement ends.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures::{Sink, SinkExt};
use pgwire::api::{ClientInfo, METADATA_USER};
use pgwire::error::ErrorInfo;
use pgwire::messages::PgWireBackendMessage;
use sluice_sql::{Error, ErrorCode, Query, Result};

use crate::record::RunRecord;
use crate::registry::{Attachment, CancelKey, Flag, Grant, ProcessGuard};
use crate::settings::{query_settings, QuerySettings};
use crate::state::{access_denied, shutting_down, Phase, Shared, Snapshot};
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

/// What admission keeps of a statement between its runs, made at its first (a prepared
/// statement runs many times; one run's text gets a memo of its own, used once).
#[derive(Debug, Clone, Default)]
pub(crate) struct StatementMemo {
    /// Its fingerprint (otherwise looked up by text at each run).
    fingerprint: std::sync::OnceLock<Arc<sluice_sql::Fingerprint>>,
}

impl StatementMemo {
    /// A memo whose fingerprint is known already (a text read as one seen before).
    pub(crate) fn with_fingerprint(fingerprint: Arc<sluice_sql::Fingerprint>) -> StatementMemo {
        StatementMemo {
            fingerprint: fingerprint.into(),
        }
    }

    /// Its fingerprint, if made.
    #[cfg(test)]
    pub(crate) fn fingerprint(&self) -> Option<&Arc<sluice_sql::Fingerprint>> {
        self.fingerprint.get()
    }
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
    _process: Option<ProcessGuard>,
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

/// An admission as [`Admission::admit`] returns it, awaited for its outcome: decided already
/// (admitted or refused without waiting, most statements: no future state, nothing boxed),
/// or waiting for a resource, the wait boxed.
pub(crate) enum Admitting<'a> {
    /// Taken by the first poll.
    Decided(Option<Result<Admitted>>),
    Waiting(Pin<Box<dyn Future<Output = Result<Admitted>> + Send + 'a>>),
}

impl Future for Admitting<'_> {
    type Output = Result<Admitted>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Admitted>> {
        match self.get_mut() {
            Admitting::Decided(decided) => Poll::Ready(
                decided
                    .take()
                    .expect("an admission is polled until it is ready, not after"),
            ),
            Admitting::Waiting(waiting) => waiting.as_mut().poll(cx),
        }
    }
}

/// An admission under way: the statement registered, what it took so far, what it asks for
/// next.
struct UnderWay {
    plan: Arc<SessionPlan>,
    snapshot: Arc<Snapshot>,
    guard: ProcessGuard,
    /// Where it queues; a `MOVE QUERY` while it waits changes it.
    workload: Arc<str>,
    attachments: Vec<Attachment>,
    settings: QuerySettings,
    admission_deadline: Option<(tokio::time::Instant, Duration)>,
    placed_by_rule: bool,
    memory: Option<Arc<crate::memory::StatementMemory>>,
    stage: Stage,
}

impl UnderWay {
    /// Whether it reserves memory: a MEMORY RESERVATION resource, `reserve_memory` or
    /// `max_memory_usage`.
    fn needs_memory(&self) -> bool {
        !self.snapshot.memory.is_empty()
            || self.settings.reserve_memory != 0
            || self.settings.max_memory_usage != 0
    }
}

/// What an admission asks for, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    QuerySlot,
    Memory,
    Master,
    /// Everything it waits for is taken (its worker threads are never waited for).
    Taken,
}

impl Stage {
    fn next(self) -> Stage {
        match self {
            Stage::QuerySlot => Stage::Memory,
            Stage::Memory => Stage::Master,
            Stage::Master | Stage::Taken => Stage::Taken,
        }
    }
}

/// What an admission under way waits for, at its stage.
enum Wait {
    /// A slot of its stage's resource (the query slot's or the master thread's).
    Slot(sluice_sched::Acquire),
    /// Its memory reservation.
    Memory,
}

/// What ends an admitted statement early, whichever comes first: its [`Control`] stopped (a
/// cancel request, `KILL QUERY`, an eviction, the shutdown's grace running out), its client
/// going away, its `max_execution_time`. A future polled by the statement's connection only;
/// nothing is registered anywhere until it is first polled, and a statement that answers at
/// once never polls it.
///
/// [`Control`]: crate::registry::Control
pub(crate) struct Stop {
    control: Arc<crate::registry::Control>,
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

/// Whether `resource` plays `role` (the snapshot's roles share their names with its parts).
fn is_role(role: &Option<Arc<str>>, resource: &Arc<str>) -> bool {
    role.as_ref()
        .is_some_and(|r| Arc::ptr_eq(r, resource) || r == resource)
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

/// One client's admission desk: who the client is (its user, database, address, cancel key),
/// its session variables, and what its statements' admissions keep at hand (fingerprints,
/// metrics series, the last workload's name). The connection's handlers and the upstream
/// forwarder both hold it; neither reaches into the other.
pub struct Admission {
    shared: Arc<Shared>,
    /// Session variables (`workload`, and whatever else clients `SET`) and what admission
    /// made of them.
    vars: Mutex<Vars>,
    watch: Arc<ClientWatch>,
    /// This connection's cancel key, registered at its first statement.
    cancel: std::sync::OnceLock<CancelKey>,
    /// Raised by `pg_terminate_backend`: the connection closes (its message loop watches).
    pub terminate: Arc<Flag>,
    /// The fingerprints of the statements this connection ran lately.
    fingerprints: Mutex<Fingerprints>,
    /// The client's address (`None`: not on TCP), for classifiers' `client_addr`.
    peer: Option<std::net::IpAddr>,
    /// The database named at start-up, for classifiers' `database`.
    database: std::sync::OnceLock<String>,
    /// The user it logged in as (see [`Admission::user`]).
    user: std::sync::OnceLock<Arc<str>>,
    /// The workload its last statement was admitted in, shared by that statement's records
    /// and by the next one's when it runs there too (most do).
    last_workload: Mutex<Option<Arc<str>>>,
    /// The metrics series its statements were admitted under, by resource and workload (a
    /// connection uses few; series live as long as the server).
    series: Mutex<Vec<KeptSeries>>,
    /// Where its statements' `system.processes` entries are kept, from its first statement.
    process_slot: std::sync::OnceLock<crate::registry::SlotHandle>,
}

/// A connection's session variables, and its [`SessionPlan`] while they stand.
#[derive(Default)]
struct Vars {
    values: HashMap<String, String, foldhash::fast::RandomState>,
    /// Made at the first statement after a change to `values` (dropped by each change).
    plan: Option<Arc<SessionPlan>>,
}

/// What admission reads of a session and of its user — the same for each of its statements
/// until a `SET` changes a variable (the users are fixed while the server runs) — read once
/// instead of at every statement: three lookups by name in the variables, three in the users.
/// A statement's own `SETTINGS` come before it, as they come before the session's values.
#[derive(Debug)]
struct SessionPlan {
    /// Whom it was made for (a connection's statements are all its user's).
    user: Arc<str>,
    /// The workload chosen when the statement names none ([`Admission::chosen_workload`]):
    /// the user's pinned one, else the session's `workload`; `None`: classifiers decide.
    chosen: Result<Option<Arc<str>>>,
    /// Where a statement nobody placed runs: the user's `default_workload`, else `default`.
    fallback: Arc<str>,
    /// The session's `workload_admission_timeout_ms`, else the user's default.
    admission_timeout: Result<Option<Duration>>,
    user_pinned: bool,
    /// The user's `max_execution_time`.
    max_execution_time: Option<Duration>,
}

/// A connection's fingerprints of its statements (a fingerprint costs a second lexing pass).
#[derive(Default)]
struct Fingerprints {
    /// By text with its literals cut out ([`sluice_sql::fingerprint_key`]): a client repeats
    /// its statements, most with new values each time.
    by_key: HashMap<String, Arc<sluice_sql::Fingerprint>, foldhash::fast::RandomState>,
    /// The fingerprints of the long statements the connection last read on a blocking thread,
    /// made there ([`Admission::keep_read_apart`]), by the statement's own text (the same
    /// `Arc`): each taken once, by its statement's admission.
    read_apart: Vec<(Arc<str>, Arc<sluice_sql::Fingerprint>)>,
}

/// Texts whose fingerprints a connection keeps (all are dropped when it is full).
const FINGERPRINTS_KEPT: usize = 256;

/// The most a connection's fingerprint cache keeps of its keys together (then it starts
/// afresh): its keys are the client's texts (of each, what the fingerprint reads: its first
/// [`sluice_sql::lexer::FINGERPRINTED_BYTES`]), so 256 distinct long texts kept 64 MB.
const FINGERPRINT_KEY_BYTES: usize = 4 << 20;

impl Fingerprints {
    /// `query`'s fingerprint: made on the reading thread, kept, or made now (and kept).
    fn of(&mut self, query: &Query) -> Arc<sluice_sql::Fingerprint> {
        // A text read apart was fingerprinted there; keyed here, it would be copied.
        if query.text.len() > sluice_sql::lexer::READ_APART_BYTES {
            let read = &mut self.read_apart;
            if let Some(at) = read.iter().position(|(t, _)| Arc::ptr_eq(t, &query.text)) {
                return read.swap_remove(at).1;
            }
        }
        let key = sluice_sql::fingerprint_key(&query.text, &query.literals);
        if let Some(f) = self.by_key.get(key.as_ref()) {
            return f.clone();
        }
        let f = Arc::new(sluice_sql::fingerprint(&query.text));
        let kept_bytes: usize = self.by_key.keys().map(String::len).sum();
        if self.by_key.len() >= FINGERPRINTS_KEPT || kept_bytes + key.len() > FINGERPRINT_KEY_BYTES
        {
            self.by_key.clear();
        }
        self.by_key.insert(key.into_owned(), f.clone());
        f
    }
}

/// Metrics series a connection keeps at hand (the oldest goes when it is full).
const SERIES_KEPT: usize = 8;

/// A metrics series kept at hand: its resource, its workload, the series.
type KeptSeries = (String, Arc<str>, Arc<crate::metrics::Series>);

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(key) = self.cancel.get() {
            self.shared.registry.forget_cancel(key);
        }
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("user", &self.user.get())
            .finish_non_exhaustive()
    }
}

impl Admission {
    pub fn new(shared: Arc<Shared>, watch: ClientWatch) -> Admission {
        Admission {
            shared,
            vars: Mutex::default(),
            watch: Arc::new(watch),
            cancel: std::sync::OnceLock::new(),
            terminate: Arc::default(),
            fingerprints: Mutex::default(),
            peer: None,
            database: std::sync::OnceLock::new(),
            user: std::sync::OnceLock::new(),
            last_workload: Mutex::default(),
            series: Mutex::default(),
            process_slot: std::sync::OnceLock::new(),
        }
    }

    /// What the server shares.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The client is at `peer`.
    pub fn with_peer(mut self, peer: std::net::SocketAddr) -> Self {
        self.peer = Some(peer.ip());
        self
    }

    /// The database the client named at start-up (once).
    pub fn set_database(&self, database: &str) {
        let _ = self.database.set(database.to_string());
    }

    pub fn var(&self, name: &str) -> Option<String> {
        self.with_var(name, |v| v.map(str::to_string))
    }

    /// `f` of session variable `name`, read in place.
    pub fn with_var<R>(&self, name: &str, f: impl FnOnce(Option<&str>) -> R) -> R {
        let vars = self.vars.lock().unwrap_or_else(|p| p.into_inner());
        f(vars.values.get(name).map(String::as_str))
    }

    pub fn set_var(&self, name: &str, value: Option<String>) {
        let mut vars = self.vars.lock().unwrap_or_else(|p| p.into_inner());
        match value {
            Some(v) => vars.values.insert(name.to_string(), v),
            None => vars.values.remove(name),
        };
        vars.plan = None;
    }

    /// The session's [`SessionPlan`] for `user`, made now if a variable changed since the last.
    fn plan(&self, user: &Arc<str>) -> Arc<SessionPlan> {
        let mut vars = self.vars.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(plan) = vars.plan.as_ref().filter(|p| p.user == *user) {
            return plan.clone();
        }
        let session_workload = vars.values.get("workload").map(|w| self.shared_name(w));
        let chosen = self.pinned_or(user, session_workload);
        let config = self.shared.users.get(user);
        let admission_timeout = match vars.values.get("workload_admission_timeout_ms") {
            None => Ok(None),
            Some(v) => v.trim().parse::<u64>().map(|ms| Some(Duration::from_millis(ms))).map_err(|_| {
                Error::new(
                    ErrorCode::BadArguments,
                    format!("setting 'workload_admission_timeout_ms' takes milliseconds (an integer), got '{v}'"),
                )
            }),
        }
        .map(|session| session.or_else(|| config.and_then(|u| u.admission_timeout)));
        let plan = Arc::new(SessionPlan {
            user: user.clone(),
            chosen,
            fallback: Arc::from(self.fallback_workload(user)),
            admission_timeout,
            user_pinned: config.is_some_and(|u| u.pinned_workload.is_some()),
            max_execution_time: config.and_then(|u| u.max_execution_time),
        });
        vars.plan = Some(plan.clone());
        plan
    }

    /// The user the client logged in as, shared by its statements' records (it is fixed once
    /// the client is authenticated, before any statement).
    pub fn user<C: ClientInfo>(&self, client: &C) -> Arc<str> {
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

    /// Registers this connection's cancel key (once).
    pub fn cancellable<C: ClientInfo>(&self, client: &C) {
        if self.cancel.get().is_none() {
            let (pid, secret) = client.pid_and_secret_key();
            let key = (pid, secret.to_bytes().to_vec());
            self.shared.registry.cancellable(key.clone());
            self.shared.registry.terminable(pid, self.terminate.clone());
            let _ = self.cancel.set(key);
        }
    }

    /// The workload a query runs in, classifiers aside: the chosen one, else
    /// the fallback.
    pub fn workload_of(&self, user: &str, requested: Option<String>) -> Result<String> {
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
        self.pinned_or(user, requested)
    }

    /// The user's pinned workload (a request for another, `requested`, is refused), else
    /// `requested`.
    fn pinned_or(&self, user: &str, requested: Option<Arc<str>>) -> Result<Option<Arc<str>>> {
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
        plan: &SessionPlan,
        query: &Query,
        tags: &[(String, String)],
        catalog: &sluice_catalog::Catalog,
    ) -> Option<Arc<crate::registry::Classified>> {
        let rules = catalog.rules();
        if rules.is_empty() {
            return None;
        }
        let application_name = self.var("application_name");
        let user = &*plan.user;
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
        Some(Arc::new(crate::registry::Classified {
            rule: rule.clone(),
            facts: sluice_catalog::OwnedFacts::of(&facts),
            fallback: plan.fallback.to_string(),
        }))
    }

    pub fn check_pinned(&self, user: &str, workload: &str) -> Result<()> {
        match self.shared.users.get(user).and_then(|u| u.pinned_workload.as_ref()) {
            Some(pinned) if pinned != workload => Err(Error::new(
                ErrorCode::SettingConstraintViolation,
                format!("Setting workload should not be changed: user '{user}' runs in workload '{pinned}' only"),
            )),
            _ => Ok(()),
        }
    }

    /// What ends a statement early, once admitted (see [`Stop`]).
    fn stop(
        &self,
        max_execution_time: Option<Duration>,
        grant: Option<Arc<Mutex<Grant>>>,
        control: Arc<crate::registry::Control>,
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

    /// Admits `query`: its workload (chosen, classified, its lane), its place in
    /// `system.processes`, then every resource its workload's tree asks for. The record of
    /// the run is put in `record` as soon as there is one, so a failure is recorded too.
    ///
    /// Decided here, without a future of its own, when nothing has to be waited for (most
    /// statements: every slot they ask for is free); only a statement that waits gets a
    /// (boxed) future, the wait's.
    pub(crate) fn admit<'a>(
        &'a self,
        user: &Arc<str>,
        query: &Query,
        memo: Option<&StatementMemo>,
        notices: &'a mut dyn Notices,
        record: &'a mut Option<RunRecord>,
    ) -> Admitting<'a> {
        let (mut under_way, wait) = match self.arrive(user, query, memo, record) {
            Err(e) => return Admitting::Decided(Some(Err(e))),
            Ok(mut under_way) => match self.advance(&mut under_way) {
                Err(e) => return Admitting::Decided(Some(Err(e))),
                Ok(None) => return Admitting::Decided(Some(Ok(self.admitted(under_way, record)))),
                Ok(Some(wait)) => (under_way, wait),
            },
        };
        Admitting::Waiting(Box::pin(async move {
            let mut wait = wait;
            loop {
                self.wait_for(&mut under_way, wait, notices).await?;
                under_way.stage = under_way.stage.next();
                match self.advance(&mut under_way)? {
                    None => return Ok(self.admitted(under_way, record)),
                    Some(next) => wait = next,
                }
            }
        }))
    }

    /// A statement's arrival at admission: its workload (chosen, classified, its lane), its
    /// record (put in `record`), its `system.processes` entry, its admission deadline.
    fn arrive(
        &self,
        user: &Arc<str>,
        query: &Query,
        memo: Option<&StatementMemo>,
        record: &mut Option<RunRecord>,
    ) -> Result<UnderWay> {
        let settings = query_settings(&query.settings)?;
        let plan = self.plan(user);
        let chosen = match &settings.workload {
            None => plan.chosen.clone()?,
            Some(requested) => self.pinned_or(user, Some(self.shared_name(requested)))?,
        };
        if self.shared.phase() != Phase::Serving {
            return Err(shutting_down(self.shared.phase()));
        }
        let snapshot = self.shared.snapshot();
        let fingerprint = kept(memo.map(|m| &m.fingerprint), || self.fingerprint_of(query));
        let classified = match chosen {
            Some(_) => None,
            None => self.classify(&plan, query, &fingerprint.tags, &snapshot.catalog),
        };
        let requested = match (chosen, &classified) {
            (Some(w), _) => w,
            (None, Some(c)) => self.shared_name(&c.rule.workload),
            (None, None) => plan.fallback.clone(),
        };
        let judged_by = snapshot.catalog.lanes(&requested).demotion;
        let workload = self.lane_of(
            &snapshot.catalog,
            plan.user_pinned,
            requested,
            judged_by.as_ref(),
            &fingerprint,
        );
        // The statement's text, shared by its process entry and its record.
        let text = &query.text;
        let record = record.insert(RunRecord::new(
            self.shared.clone(),
            0,
            user,
            &workload,
            fingerprint,
            text,
            judged_by,
        ));
        let pid = self.cancel.get().map(|(pid, _)| *pid);
        // The clock read once at its arrival, for its record and its process entry.
        let arrived = record.arrived_at();
        let registry = &self.shared.registry;
        let slot = self.process_slot.get_or_init(|| registry.slot());
        let guard = registry.register(&plan.user, &workload, text, pid, arrived, Some(slot));
        // Only a statement a rule placed can be placed again while it waits.
        let placed_by_rule = classified.is_some();
        guard.classified(classified);
        record.set_query_id(guard.query_id);
        // `workload_admission_timeout_ms` bounds the whole wait (every resource together): the
        // statement's, else the session's, else its user's; 0 (or nothing) is no limit.
        let admission_deadline = match settings.admission_timeout {
            Some(own) => Some(own),
            None => plan.admission_timeout.clone()?,
        }
        .filter(|d| !d.is_zero())
        .map(|limit| (tokio::time::Instant::now() + limit, limit));
        Ok(UnderWay {
            plan,
            snapshot,
            guard,
            workload,
            // A query slot and a master thread's, most often.
            attachments: Vec::with_capacity(2),
            settings,
            admission_deadline,
            placed_by_rule,
            memory: None,
            stage: Stage::QuerySlot,
        })
    }

    /// Takes what `under_way` asks for, from its stage on, as far as it can without waiting
    /// (its query slot, then its memory reservation, then its master thread): `None` once it
    /// holds them all, else what it must wait for (its stage left at that one).
    fn advance(&self, u: &mut UnderWay) -> Result<Option<Wait>> {
        loop {
            let part = match u.stage {
                Stage::QuerySlot => u.snapshot.query_slot(),
                // (No memory resource, no reservation, no cap, most often: nothing to reserve.)
                Stage::Memory if u.needs_memory() => return Ok(Some(Wait::Memory)),
                Stage::Memory => None,
                // (No master-thread resource, most often in front of an upstream: nothing.)
                Stage::Master => u
                    .snapshot
                    .master()
                    .filter(|_| !u.settings.no_concurrency_control),
                Stage::Taken => return Ok(None),
            };
            if let Some((resource, scheduler)) = part {
                let asked = self.ask_slot(
                    resource,
                    scheduler,
                    &u.guard,
                    &u.snapshot,
                    &u.workload,
                    &mut u.attachments,
                )?;
                if let Some(acquire) = asked {
                    return Ok(Some(Wait::Slot(acquire)));
                }
            }
            u.stage = u.stage.next();
        }
    }

    /// Waits for what `wait` says `under_way` waits for, telling the client it waits.
    async fn wait_for(
        &self,
        u: &mut UnderWay,
        wait: Wait,
        notices: &mut dyn Notices,
    ) -> Result<()> {
        match wait {
            Wait::Slot(acquire) => {
                let snapshot = u.snapshot.clone();
                let part = match u.stage {
                    Stage::QuerySlot => snapshot.query_slot(),
                    _ => snapshot.master(),
                };
                let (resource, scheduler) = part.expect("a slot asked of a resource the tree has");
                self.wait_for_slot(
                    resource,
                    scheduler,
                    acquire,
                    &u.guard,
                    &snapshot,
                    &mut u.workload,
                    &mut u.attachments,
                    u.admission_deadline,
                    notices,
                )
                .await
            }
            Wait::Memory => {
                u.memory = self
                    .reserve_memory(
                        &u.guard,
                        &u.snapshot,
                        &u.workload,
                        &u.settings,
                        u.admission_deadline,
                        notices,
                    )
                    .await?;
                Ok(())
            }
        }
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

    /// `query`'s fingerprint, from the connection's ([`Fingerprints::of`]).
    fn fingerprint_of(&self, query: &Query) -> Arc<sluice_sql::Fingerprint> {
        let mut kept = self.fingerprints.lock().unwrap_or_else(|p| p.into_inner());
        kept.of(query)
    }

    /// Keeps the fingerprints of the long statements just read on a blocking thread, made
    /// there ([`sluice_sql::fingerprint`] of each text): their admissions take them instead
    /// of lexing the texts again on the connection thread. Replaces what was kept before
    /// (statements read and never admitted: a multi-statement text that failed part way).
    pub(crate) fn keep_read_apart(&self, read: Vec<(Arc<str>, Arc<sluice_sql::Fingerprint>)>) {
        self.fingerprints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .read_apart = read;
    }

    /// Where a statement asked to run in `requested` is admitted (see [`crate::lanes::lane_for`]).
    fn lane_of(
        &self,
        catalog: &sluice_catalog::Catalog,
        user_pinned: bool,
        requested: Arc<str>,
        demotion: Option<&sluice_catalog::Demotion>,
        fingerprint: &sluice_sql::Fingerprint,
    ) -> Arc<str> {
        crate::lanes::lane_for(
            &self.shared.lanes,
            catalog,
            user_pinned,
            demotion,
            fingerprint,
        )
        .map_or(requested, |lane| self.shared_name(&lane))
    }

    /// Asks for a slot of `resource` in `workload`: taken at once when one is free (most
    /// statements: its attachment is added to `attachments`, nothing waits, the clock is not
    /// read), `None` also when the workload has no queue in it; otherwise the request to wait
    /// on ([`Admission::wait_for_slot`]).
    fn ask_slot(
        &self,
        resource: &Arc<str>,
        scheduler: &sluice_sched::ResourceScheduler,
        guard: &ProcessGuard,
        snapshot: &Snapshot,
        workload: &Arc<str>,
        attachments: &mut Vec<Attachment>,
    ) -> Result<Option<sluice_sched::Acquire>> {
        let acquired = scheduler.acquire_known(workload, 1).inspect_err(|e| {
            if e.code == ErrorCode::ServerOverloaded {
                self.series(resource, workload).rejected();
            }
        })?;
        let Some(mut acquire) = acquired else {
            if self.shared.options.throw_on_unknown_workload {
                return Err(access_denied(resource));
            }
            return Ok(None);
        };
        if !acquire.is_granted() {
            return Ok(Some(acquire));
        }
        // Decided already: its first poll is ready.
        let Some(permit) = futures::FutureExt::now_or_never(&mut acquire) else {
            return Ok(Some(acquire));
        };
        let permit = permit?;
        let series = self.series(resource, workload);
        let attached = self.attachment(
            resource,
            permit,
            &series,
            Duration::ZERO,
            guard,
            snapshot,
            workload,
        );
        attachments.push(attached);
        Ok(None)
    }

    /// What holding `permit` of `resource` is: its gauge, its admission-log entry (a QUERY
    /// slot's), its CPU slot number (a master thread's is the statement's slot 0; its workers
    /// are 1..).
    #[allow(clippy::too_many_arguments)]
    fn attachment(
        &self,
        resource: &Arc<str>,
        permit: sluice_sched::Permit,
        series: &Arc<crate::metrics::Series>,
        waited: Duration,
        guard: &ProcessGuard,
        snapshot: &Snapshot,
        workload: &Arc<str>,
    ) -> Attachment {
        let logged = self
            .shared
            .admission_log
            .as_ref()
            .filter(|_| is_role(&snapshot.roles.query, resource))
            .map(|log| log.admitted(guard.query_id, workload, permit.dequeued_at()));
        Attachment {
            resource: resource.clone(),
            in_flight: series.admitted(waited),
            logged,
            cpu_slot: is_role(&snapshot.roles.master, resource).then_some(0),
            permit,
        }
    }

    /// Waits for the slot of `resource` that `acquire` asked for, adding its permit to
    /// `attachments`, and tells the client it waits. A `MOVE QUERY` meanwhile moves the request
    /// and the permits already held to the new `workload`; a kill, the client going away,
    /// shutdown or the admission deadline end the wait with their error.
    #[allow(clippy::too_many_arguments)]
    async fn wait_for_slot(
        &self,
        resource: &Arc<str>,
        scheduler: &sluice_sched::ResourceScheduler,
        acquire: sluice_sched::Acquire,
        guard: &ProcessGuard,
        snapshot: &Snapshot,
        workload: &mut Arc<str>,
        attachments: &mut Vec<Attachment>,
        admission_deadline: Option<(tokio::time::Instant, Duration)>,
        notices: &mut dyn Notices,
    ) -> Result<()> {
        let is_query = is_role(&snapshot.roles.query, resource);
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
        let mut next = Some(acquire);
        // One request at a time: a move that could not take the request along asks again in
        // the new workload.
        while let Some(mut acquire) = next.take() {
            let arrived = std::time::Instant::now();
            let waited = self
                .shared
                .admission_log
                .as_ref()
                .filter(|_| is_query)
                .map(|log| log.waits(guard.query_id, workload));
            let mut series = self.series(resource, workload);
            let mut counted_waiting = series.waiting();
            let permit = loop {
                if acquire.is_granted() {
                    break Some((&mut acquire).await?);
                }
                tokio::select! {
                    permit = &mut acquire => break Some(permit?),
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
                            if let Some(s) = snapshot.schedulers.get(&*held.resource) {
                                held.permit.move_to(s, &to)?;
                            }
                            held.in_flight = self.shared.metrics.series(&held.resource, &to).held();
                        }
                        tracing::info!(query_id = guard.query_id, from = %workload, to = %to, "waiting query moved");
                        self.shared.registry.show_in(guard.query_id, &to);
                        *workload = Arc::from(to);
                        if !in_place {
                            // Granted meanwhile, or no queue for it here: asked again below
                            // in the new workload (the old request is let go first).
                            break None;
                        }
                        drop(counted_waiting);
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
            let Some(permit) = permit else {
                drop((acquire, waited));
                next =
                    self.ask_slot(resource, scheduler, guard, snapshot, workload, attachments)?;
                continue;
            };
            if let Some(waited) = waited {
                waited.dequeued(permit.dequeued_at());
            }
            let attached = self.attachment(
                resource,
                permit,
                &series,
                arrived.elapsed(),
                guard,
                snapshot,
                workload,
            );
            attachments.push(attached);
        }
        guard.waiting_for(None);
        Ok(())
    }

    /// The statement's memory in its workload: its allocation in the MEMORY RESERVATION
    /// resource, admitted with `reserve_memory` bytes (waiting for them in its queue), and its
    /// `max_memory_usage` cap. `None` when neither applies.
    #[allow(clippy::too_many_arguments)]
    async fn reserve_memory(
        &self,
        guard: &ProcessGuard,
        snapshot: &Snapshot,
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

    /// The statement of `under_way`, holding every slot and its memory: its worker threads
    /// (as many as are free), its grant, its record's admission, its demotion timer, its stop.
    fn admitted(&self, under_way: UnderWay, record: &mut Option<RunRecord>) -> Admitted {
        let UnderWay {
            plan,
            snapshot,
            guard,
            workload,
            mut attachments,
            settings,
            placed_by_rule,
            memory,
            ..
        } = under_way;
        let cpu_scheduled = !settings.no_concurrency_control;
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
                        logged: None,
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
                .then(|| self.shared.registry.classifier_of(guard.query_id))
                .flatten();
            // Admitted as it arrived unless it waited (no second clock read for most).
            let at = if guard.waited() {
                std::time::Instant::now()
            } else {
                record.arrived_at()
            };
            record.admitted(at, grant.clone(), classifier);
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
            .or(plan.max_execution_time)
            .or(lanes.max_execution_time);
        let stop = self.stop(limit, Some(grant.clone()), control);
        Admitted {
            hold,
            grant,
            threads,
            memory,
            reserve_memory: settings.reserve_memory,
            stop,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(text: &str) -> Query {
        match sluice_sql::statement(text) {
            Ok(Some(sluice_sql::ClientStatement::Query(q))) => q,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn a_statement_with_new_values_is_fingerprinted_once() {
        let mut kept = Fingerprints::default();
        let first = kept.of(&query("SELECT * FROM t WHERE id = 1"));
        let again = kept.of(&query("SELECT * FROM t WHERE id = 2"));
        assert!(
            Arc::ptr_eq(&first, &again),
            "kept by its text without literals"
        );
        let other = kept.of(&query("SELECT * FROM u WHERE id = 1"));
        assert_ne!(first.id, other.id);
    }

    /// A read-apart fingerprint is taken by its statement (the same text), once.
    #[test]
    fn a_fingerprint_made_apart_is_taken_by_its_statement() {
        let mut kept = Fingerprints::default();
        let long = query(&format!(
            "SELECT a{} FROM t",
            ",a".repeat(sluice_sql::lexer::READ_APART_BYTES)
        ));
        let made = Arc::new(sluice_sql::fingerprint(&long.text));
        kept.read_apart = vec![(long.text.clone(), made.clone())];
        // Another text of the same words is not it.
        let same_words = Query {
            text: Arc::from(&*long.text),
            ..long.clone()
        };
        assert!(!Arc::ptr_eq(&kept.of(&same_words), &made));
        assert!(Arc::ptr_eq(&kept.of(&long), &made));
        assert!(kept.read_apart.is_empty(), "taken once");
    }

    /// The cache's keys are the client's texts: all of them together stay within their
    /// budget, however many distinct long texts come.
    #[test]
    fn the_fingerprint_cache_keeps_a_bounded_sum_of_texts() {
        let mut kept = Fingerprints::default();
        for i in 0..64 {
            let q = query(&format!("SELECT a{} FROM t{i}", ",a".repeat(60 * 1024)));
            kept.of(&q);
            let bytes: usize = kept.by_key.keys().map(String::len).sum();
            assert!(
                bytes <= FINGERPRINT_KEY_BYTES,
                "statement {i}: {bytes} bytes kept"
            );
            assert!(kept.by_key.contains_key(&*q.text), "statement {i} kept");
        }
    }
}

//! What is in flight, below everything that shares it: the [`Registry`] of statements waiting
//! or running (each a [`Process`] entry, kept while its [`ProcessGuard`] lives), of the
//! connections a cancel request or `pg_terminate_backend` may name; what an admitted statement
//! holds ([`Grant`], one [`Attachment`] per permit); an operator's hand on it ([`Control`]);
//! the one-shot signal both use ([`Flag`]). `state::Shared` holds the registry; nothing here
//! knows of `Shared`, the catalog snapshot or the schedulers.
//!
//! A connection's statements are kept in its own [`ProcessSlot`], filled at each statement
//! and emptied at its end in place (one lock no other connection takes, nothing hashed or
//! moved in a shared map); statements without a slot (or a second one of a connection at
//! once) go in the shared map. Readers see both.
//!
//! Invariant: a statement is in the registry exactly as long as its guard lives, however it
//! ends; once [`Registry::stop_all`] was called, every statement in it, and every one
//! registered later, is stopped.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sluice_sql::{Error, ErrorCode};

/// The statements waiting or running, by query id, and the connections a cancel request or
/// `pg_terminate_backend` may reach.
#[derive(Debug)]
pub struct Registry {
    /// By query id (hashed: a statement's entry comes and goes at every statement; the rare
    /// readers sort by it, which is arrival order).
    processes: Mutex<HashMap<u64, Process, foldhash::fast::RandomState>>,
    /// The connections' own slots, by slot number (an entry per connection, from its first
    /// statement to its end).
    slots: Mutex<HashMap<u64, Arc<ProcessSlot>, foldhash::fast::RandomState>>,
    next_slot: AtomicU64,
    /// The keys (pid, secret) of connections a cancel request may name ([`Registry::cancel`]).
    cancels: Mutex<HashSet<CancelKey>>,
    /// Each connection's close signal by backend pid (`pg_terminate_backend`), registered at
    /// its first statement.
    terminations: Mutex<HashMap<i32, Arc<Flag>>>,
    next_query_id: AtomicU64,
    /// In a fleet, this node's number times [`NODE_IDS`]: added to every query id, so that ids
    /// are unique across the fleet (0 alone).
    id_base: AtomicU64,
    /// Set by [`Registry::stop_all`]: what every statement registered later is stopped with.
    closed: Mutex<Option<Error>>,
    /// Whether `closed` is set (read at each registration without the lock; set before
    /// `stop_all` looks at the statements, so one registered after that look sees it).
    is_closed: AtomicBool,
}

impl Default for Registry {
    fn default() -> Registry {
        Registry {
            processes: Mutex::default(),
            slots: Mutex::default(),
            next_slot: AtomicU64::new(0),
            cancels: Mutex::default(),
            terminations: Mutex::default(),
            next_query_id: AtomicU64::new(1),
            id_base: AtomicU64::new(0),
            closed: Mutex::default(),
            is_closed: AtomicBool::new(false),
        }
    }
}

/// Query ids a node of a fleet numbers its statements with: node `k`'s are `k × NODE_IDS + n`
/// (a thousand million million each: node 2's 42nd statement is 2000000000000042).
pub const NODE_IDS: u64 = 1_000_000_000_000_000;

impl Registry {
    /// Numbers this node's statements from now on as node `number` of a fleet.
    pub fn set_node_number(&self, number: u64) {
        self.id_base
            .store(number.saturating_mul(NODE_IDS), Ordering::Relaxed);
    }

    fn processes(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, Process, foldhash::fast::RandomState>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn slots(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ProcessSlot>, foldhash::fast::RandomState>>
    {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for one connection's statements, listed while the handle lives.
    pub fn slot(self: &Arc<Self>) -> SlotHandle {
        let number = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(ProcessSlot::default());
        self.slots().insert(number, slot.clone());
        SlotHandle {
            registry: self.clone(),
            number,
            slot,
        }
    }

    /// Registers a statement, in `slot` when that is given and empty; the guard removes it
    /// when the statement ends, however it ends.
    pub fn register(
        self: &Arc<Self>,
        user: &Arc<str>,
        workload: &Arc<str>,
        query: &Arc<str>,
        pid: Option<i32>,
        started: Instant,
        slot: Option<&SlotHandle>,
    ) -> ProcessGuard {
        let query_id = self.id_base.load(Ordering::Relaxed)
            + self.next_query_id.fetch_add(1, Ordering::Relaxed) % NODE_IDS;
        let control = Arc::new(Control::default());
        let process = || Process {
            query_id,
            user: user.clone(),
            workload: workload.clone(),
            waiting_for: None,
            running: false,
            started,
            query: query.clone(),
            grant: None,
            pid,
            control: control.clone(),
            classified: None,
        };
        // In the connection's slot when it is free (made there, not moved in), else in the
        // shared map.
        let home = slot.and_then(|handle| {
            let mut entry = handle.slot.lock();
            entry.is_none().then(|| {
                *entry = Some(process());
                handle.slot.clone()
            })
        });
        if home.is_none() {
            self.processes().insert(query_id, process());
        }
        // Registered as the registry closed, after `stop_all` stopped the others.
        if self.is_closed.load(Ordering::SeqCst) {
            if let Some(error) = self
                .closed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
            {
                control.stop_with(error);
            }
        }
        ProcessGuard {
            registry: self.clone(),
            query_id,
            control,
            waited: AtomicBool::new(false),
            home,
        }
    }

    /// Stops every statement registered, and every one registered from now on, with `error`.
    pub fn stop_all(&self, error: Error) {
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.clone());
        self.is_closed.store(true, Ordering::SeqCst);
        self.for_each(|p| p.control.stop_with(error.clone()));
    }

    /// `f` on every statement's entry (the shared map's, then the slots'; each lock held only
    /// while its own entries are visited).
    fn for_each(&self, mut f: impl FnMut(&mut Process)) {
        for p in self.processes().values_mut() {
            f(p);
        }
        for slot in self.slot_list() {
            if let Some(p) = slot.lock().as_mut() {
                f(p);
            }
        }
    }

    /// The connections' slots as they are now (the list's lock is not held while each slot's
    /// is taken).
    fn slot_list(&self) -> Vec<Arc<ProcessSlot>> {
        self.slots().values().cloned().collect()
    }

    /// `f` on statement `query_id`'s entry, while it has one.
    fn with_process<T>(&self, query_id: u64, f: impl FnOnce(&mut Process) -> T) -> Option<T> {
        if let Some(p) = self.processes().get_mut(&query_id) {
            return Some(f(p));
        }
        for slot in self.slot_list() {
            if let Some(p) = slot.lock().as_mut().filter(|p| p.query_id == query_id) {
                return Some(f(p));
            }
        }
        None
    }

    /// Stops statement `query_id` with `error` (`KILL QUERY`, `pg_cancel_backend`), waiting
    /// or running. Whether it was there to stop.
    pub fn kill(&self, query_id: u64, error: Error) -> bool {
        let control = self.process(query_id, |p| Some(p.control.clone()));
        match control {
            Some(control) => {
                control.stop_with(error);
                true
            }
            None => false,
        }
    }

    /// Sets the workload statement `query_id` is shown in (a waiting one that was moved).
    pub fn show_in(&self, query_id: u64, workload: &str) {
        self.update(query_id, |p| p.workload = Arc::from(workload));
    }

    /// Registers the connection with `key` for cancel requests (until
    /// [`Registry::forget_cancel`]).
    pub fn cancellable(&self, key: CancelKey) {
        self.cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
    }

    /// Registers connection `pid`'s close signal.
    pub fn terminable(&self, pid: i32, signal: Arc<Flag>) {
        self.terminations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pid, signal);
    }

    /// Asks connection `pid` to close (after its statement, which the caller stops); whether
    /// there is one.
    pub fn terminate(&self, pid: i32) -> bool {
        let signal = self
            .terminations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&pid)
            .cloned();
        signal.inspect(|s| s.raise()).is_some()
    }

    pub fn forget_cancel(&self, key: &CancelKey) {
        self.terminations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key.0);
        self.cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// A cancel request for connection `key`: its statement stops, waiting or running
    /// (pgwire's own cancel only reaches a statement until its response starts, and never
    /// one that is forwarded upstream). Nothing happens for a key not registered.
    pub fn cancel(&self, key: &CancelKey) {
        if !self
            .cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
        {
            return;
        }
        let pid = Some(key.0);
        self.for_each(|p| {
            if p.pid == pid {
                p.control.stop_with(Error::new(
                    ErrorCode::QueryWasCancelled,
                    "canceling statement due to user request",
                ));
            }
        });
    }

    /// What `f` reads of statement `query_id`'s entry (`None` once it has ended).
    pub fn process<T>(&self, query_id: u64, f: impl FnOnce(&Process) -> Option<T>) -> Option<T> {
        self.with_process(query_id, |p| f(p)).flatten()
    }

    /// The classifier that placed statement `query_id` (after any re-classification).
    pub fn classifier_of(&self, query_id: u64) -> Option<String> {
        self.process(query_id, |p| {
            p.classified.as_ref().map(|c| c.rule.name.clone())
        })
    }

    /// The workload query `query_id` counts in now (`None` once it has ended).
    pub fn workload_of_query(&self, query_id: u64) -> Option<String> {
        self.process(query_id, |p| Some(p.workload.to_string()))
    }

    /// Whether no statement is waiting or running.
    pub fn is_empty(&self) -> bool {
        self.processes().is_empty() && self.slots().values().all(|s| s.lock().is_none())
    }

    /// Every statement waiting or running, in arrival order.
    pub fn all(&self) -> Vec<Process> {
        let mut all: Vec<Process> = Vec::new();
        self.for_each(|p| all.push(p.clone()));
        all.sort_unstable_by_key(|p| p.query_id);
        all
    }

    /// Changes statement `query_id`'s entry, while it has one.
    pub fn update(&self, query_id: u64, f: impl FnOnce(&mut Process)) {
        self.with_process(query_id, f);
    }

    /// Classifier `changed` was replaced or dropped: every waiting statement it placed is
    /// judged again by the rules of `catalog` (counting nothing). Returns the statements the
    /// rules now send elsewhere — query id, where it waits, where it goes — in arrival order;
    /// the caller moves them. A statement already admitted stays where it runs.
    pub fn judge_again(
        &self,
        changed: &str,
        catalog: &sluice_catalog::Catalog,
    ) -> Vec<(u64, Arc<str>, String)> {
        let mut moves = Vec::new();
        self.for_each(|p| {
            let Some(old) = p.classified.as_ref().filter(|c| c.rule.name == changed) else {
                return;
            };
            if p.grant.is_some() {
                return;
            }
            let rule = catalog.rules().route(&old.facts.facts()).cloned();
            let to = rule
                .as_ref()
                .map_or_else(|| old.fallback.clone(), |r| r.workload.clone());
            p.classified = rule.map(|rule| {
                Arc::new(Classified {
                    rule,
                    facts: old.facts.clone(),
                    fallback: old.fallback.clone(),
                })
            });
            if *to != *p.workload {
                moves.push((p.query_id, p.workload.clone(), to));
            }
        });
        moves.sort_unstable_by_key(|(query_id, _, _)| *query_id);
        moves
    }
}

/// A registered statement; dropping it unregisters.
#[derive(Debug)]
pub struct ProcessGuard {
    registry: Arc<Registry>,
    pub query_id: u64,
    pub control: Arc<Control>,
    /// Whether it has waited for anything (most statements are admitted at once).
    waited: AtomicBool,
    /// Its connection's slot, when its entry is there (else it is in the shared map).
    home: Option<Arc<ProcessSlot>>,
}

impl ProcessGuard {
    pub fn waiting_for(&self, resource: Option<&str>) {
        if resource.is_some() {
            self.waited.store(true, Ordering::Relaxed);
        }
        self.update(|p| p.waiting_for = resource.map(str::to_string));
    }

    /// Changes its entry: in its slot in place, or in the shared map.
    fn update(&self, f: impl FnOnce(&mut Process)) {
        match &self.home {
            Some(slot) => {
                if let Some(p) = slot.lock().as_mut() {
                    f(p);
                }
            }
            None => self.registry.update(self.query_id, f),
        }
    }

    /// Whether it waited for a resource ([`ProcessGuard::waiting_for`]) since it was registered.
    pub fn waited(&self) -> bool {
        self.waited.load(Ordering::Relaxed)
    }

    /// Placed by a classifier (kept while it waits: see [`Registry::judge_again`]).
    pub fn classified(&self, classified: Option<Arc<Classified>>) {
        if classified.is_some() {
            self.update(|p| p.classified = classified);
        }
    }

    /// Admitted with `grant`: from now on the statement runs.
    pub fn running(&self, grant: Arc<Mutex<Grant>>) {
        self.update(|p| {
            p.waiting_for = None;
            p.running = true;
            p.grant = Some(grant);
        });
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        // The entry is dropped after its lock is let go.
        let _gone = match &self.home {
            Some(slot) => slot.lock().take(),
            None => self.registry.processes().remove(&self.query_id),
        };
    }
}

/// One connection's place for the entry of its statement (see the module's opening).
#[derive(Debug, Default)]
pub struct ProcessSlot {
    entry: Mutex<Option<Process>>,
}

impl ProcessSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Process>> {
        self.entry.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connection's [`ProcessSlot`], listed in the registry until the handle is dropped.
#[derive(Debug)]
pub struct SlotHandle {
    registry: Arc<Registry>,
    number: u64,
    slot: Arc<ProcessSlot>,
}

impl Drop for SlotHandle {
    fn drop(&mut self) {
        self.registry.slots().remove(&self.number);
    }
}

/// A connection's identity for cancel requests: its process id and secret key.
pub type CancelKey = (i32, Vec<u8>);

/// What an admitted query holds: one attachment per slot it holds (its query slot, its master
/// thread, each worker thread), each a permit of that resource's scheduler. Found by its `query_id` (see `Shared::move_query`), so
/// an admitted query can be moved to another workload without being released.
#[derive(Debug)]
pub struct Grant {
    pub workload: Arc<str>,
    pub attachments: Vec<Attachment>,
    /// Its memory in the MEMORY RESERVATION resource, when it has any.
    pub memory: Option<Arc<crate::memory::StatementMemory>>,
    /// The workload it was demoted from, and when (the last demotion, when there were several).
    pub demoted: Option<(String, std::time::SystemTime)>,
}

impl Grant {
    /// Takes out the attachment of CPU slot `slot`, if the grant holds it.
    pub fn take_cpu_slot(&mut self, slot: usize) -> Option<Attachment> {
        let at = self
            .attachments
            .iter()
            .position(|a| a.cpu_slot == Some(slot))?;
        Some(self.attachments.remove(at))
    }
}

/// A query's hold on one resource: its permit, and the metrics gauge counting it in flight.
#[derive(Debug)]
pub struct Attachment {
    pub resource: Arc<str>,
    /// `server.admission_log`'s record of a QUERY slot (before `permit`: logged as given back
    /// just before it is, so that the next query the slot admits is logged after it).
    pub logged: Option<crate::admission_log::Logged>,
    pub permit: sluice_sched::Permit,
    pub in_flight: crate::metrics::Gauge,
    /// The CPU slot it is of the statement's (0: the master thread's, 1..: worker threads'),
    /// for the slot leases of `cpu_slot_preemption`; `None` for other resources.
    pub cpu_slot: Option<usize>,
}

/// A statement running or waiting, for `system.processes`.
#[derive(Debug, Clone)]
pub struct Process {
    pub query_id: u64,
    // The statement's strings are shared with its record and its grant (one allocation
    // each per statement, or none: the user is the connection's).
    pub user: Arc<str>,
    pub workload: Arc<str>,
    pub waiting_for: Option<String>,
    /// Admitted by every scheduler (until then it is waiting, or about to).
    pub running: bool,
    pub started: Instant,
    pub query: Arc<str>,
    /// What it holds, once admitted.
    pub grant: Option<Arc<Mutex<Grant>>>,
    /// The connection's process id (`pg_cancel_backend` takes it), when it has one.
    pub pid: Option<i32>,
    /// How an operator reaches the statement: `KILL QUERY`, `MOVE QUERY` while it waits.
    pub control: Arc<Control>,
    /// The classifier that placed it, when one did (see [`Registry::judge_again`]).
    pub classified: Option<Arc<Classified>>,
}

/// A statement a classifier placed: the rule, and what it was judged on, so that it can be
/// judged again while it waits if the rule is replaced or dropped.
#[derive(Debug)]
pub struct Classified {
    pub rule: Arc<sluice_catalog::Rule>,
    pub facts: sluice_catalog::OwnedFacts,
    /// Where it goes when no rule matches it any more (its user's default, or `default`).
    pub fallback: String,
}

/// A signal raised once, from any thread, and awaited by one task at a time: a poll is an
/// atomic load and a waker check, where a `Notify`'s takes a lock (a connection's loop polls
/// its termination signal at every message).
#[derive(Debug, Default)]
pub struct Flag {
    raised: AtomicBool,
    waker: futures::task::AtomicWaker,
}

impl Flag {
    pub fn raise(&self) {
        self.raised.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Whether it was raised (without waiting for it).
    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// Ready once raised; the waker it last polled with is the one woken.
    pub fn poll_raised(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if !self.raised.load(Ordering::Acquire) {
            self.waker.register(cx.waker());
            // Raised between the load and the registration: its wake may have missed us.
            if !self.raised.load(Ordering::Acquire) {
                return std::task::Poll::Pending;
            }
        }
        std::task::Poll::Ready(())
    }
}

/// An operator's hand on one statement, and the one signal that ends it early: a `KILL
/// QUERY`, a cancel request, an eviction and the shutdown's grace running out all stop it
/// through [`Control::stop_with`], so a statement waits on one flag, not on a source each.
#[derive(Debug, Default)]
pub struct Control {
    /// The first reason it was stopped for.
    killed: Mutex<Option<Error>>,
    /// Raised once `killed` is set; the statement's connection waits on it.
    stopped: Flag,
    /// Notified by `MOVE QUERY` while the statement waits: it queues again in `move_to`.
    pub moved: tokio::sync::Notify,
    pub move_to: Mutex<Option<String>>,
}

impl Control {
    /// Stops the statement with `error`, waiting or running; the first reason given is the
    /// one it fails with.
    pub fn stop_with(&self, error: Error) {
        self.killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(error);
        self.stopped.raise();
    }

    /// Ready with the reason, once the statement is stopped. One task waits at a time (the
    /// statement's own); the waker it last polled with is the one woken.
    pub fn poll_stopped(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Error> {
        std::task::ready!(self.stopped.poll_raised(cx));
        std::task::Poll::Ready(
            self.killed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_else(|| Error::new(ErrorCode::QueryWasCancelled, "Query was cancelled")),
        )
    }

    /// Resolves with the reason the statement was stopped for.
    pub async fn killed(&self) -> Error {
        std::future::poll_fn(|cx| self.poll_stopped(cx)).await
    }

    /// Resolves with the workload a `MOVE QUERY` asked for.
    pub async fn moved(&self) -> String {
        loop {
            self.moved.notified().await;
            if let Some(to) = self
                .move_to
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
            {
                return to;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(registry: &Arc<Registry>, text: &str, slot: Option<&SlotHandle>) -> ProcessGuard {
        registry.register(
            &Arc::from("u"),
            &Arc::from("w"),
            &Arc::from(text),
            Some(7),
            Instant::now(),
            slot,
        )
    }

    fn texts(registry: &Registry) -> Vec<String> {
        registry.all().iter().map(|p| p.query.to_string()).collect()
    }

    #[test]
    fn a_connections_statements_are_seen_and_reached_in_its_slot() {
        let registry = Arc::new(Registry::default());
        let slot = registry.slot();
        let first = register(&registry, "SELECT 1", Some(&slot));
        assert!(first.home.is_some(), "an empty slot takes it");
        // A second statement of the connection at once goes in the shared map.
        let second = register(&registry, "SELECT 2", Some(&slot));
        assert!(second.home.is_none());
        assert_eq!(texts(&registry), ["SELECT 1", "SELECT 2"]);
        first.running(Arc::new(Mutex::new(Grant {
            workload: Arc::from("w"),
            attachments: Vec::new(),
            memory: None,
            demoted: None,
        })));
        assert_eq!(
            registry.process(first.query_id, |p| Some(p.running)),
            Some(true)
        );
        registry.show_in(first.query_id, "elsewhere");
        assert_eq!(
            registry.workload_of_query(first.query_id).as_deref(),
            Some("elsewhere")
        );
        assert!(registry.kill(
            first.query_id,
            Error::new(ErrorCode::QueryWasCancelled, "k")
        ));
        assert!(futures::executor::block_on(first.control.killed())
            .message
            .contains('k'));
        let key: CancelKey = (7, vec![1]);
        registry.cancellable(key.clone());
        registry.cancel(&key);
        assert!(
            second.control.stopped.is_raised(),
            "a cancel reaches the map's too"
        );
        drop(first);
        assert_eq!(texts(&registry), ["SELECT 2"]);
        assert!(!registry.kill(1, Error::new(ErrorCode::QueryWasCancelled, "k")));
        drop(second);
        assert!(registry.is_empty());
        // The slot is used again by the connection's next statement.
        let third = register(&registry, "SELECT 3", Some(&slot));
        assert!(third.home.is_some());
        assert!(!registry.is_empty());
        drop(third);
        assert!(registry.is_empty());
        drop(slot);
        assert!(
            registry.slots().is_empty(),
            "a connection gone takes its slot with it"
        );
    }

    #[test]
    fn stop_all_stops_what_is_in_slots_and_what_comes_after() {
        let registry = Arc::new(Registry::default());
        let slot = registry.slot();
        let before = register(&registry, "SELECT 1", Some(&slot));
        registry.stop_all(Error::new(ErrorCode::QueryWasCancelled, "closing"));
        assert!(before.control.stopped.is_raised());
        drop(before);
        let after = register(&registry, "SELECT 2", Some(&slot));
        assert!(after.control.stopped.is_raised());
    }
}

//! What is in flight, below everything that shares it: the entry of a statement waiting or
//! running ([`Process`]), what an admitted statement holds ([`Grant`], one [`Attachment`] per
//! permit), an operator's hand on it ([`Control`]), the one-shot signal both use ([`Flag`]),
//! and a connection's cancel key. The registry's map of them lives in `state::Shared`, which
//! assembles the server; these types know nothing of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sluice_sql::{Error, ErrorCode};

/// A connection's identity for cancel requests: its process id and secret key.
pub type CancelKey = (i32, Vec<u8>);

/// What an admitted query holds: one attachment per slot it holds (its query slot, its master
/// thread, each worker thread), each a permit of that resource's scheduler. Found by its `query_id` (see [`Shared::move_query`]), so
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
    pub resource: String,
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
    /// The classifier that placed it, when one did (see [`Shared::reclassify_waiting`]).
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

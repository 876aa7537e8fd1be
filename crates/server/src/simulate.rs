//! `sluice simulate`: a trace of statements replayed through the same scheduler code the server
//! runs — the compiled trees, `ResourceScheduler` admission, permits that move on demotion, the
//! learned lanes' book — in virtual time, so a day of reports takes seconds.
//!
//! The time is [`VirtualTime`]'s: it stands still while any statement can go on, and jumps to
//! the next timer when none can (what tokio's paused clock does, without tokio's test
//! utilities compiled into the server, where they make every read of the runtime's clock take
//! a lock). The statements run on a local executor of their own, not on a tokio runtime.
//!
//! What is simulated is admission: each statement holds its QUERY slots for its service time
//! (the time it takes alone), as sluice would hold them. The engine is not: service times do
//! not stretch when statements share a CPU. That is the model the lanes problem needs (slots
//! are what fast reports wait for) and it says so wherever it is printed.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::task::LocalSpawnExt;
use futures::FutureExt;
use sluice_catalog::Catalog;
use sluice_sched::{compile, Clock, Machine, Permit, ResourceScheduler, Wake};
use sluice_sql::{CostUnit, Error, ErrorCode, Fingerprint, Result};
use tokio::time::Instant;

use crate::lanes::{lane_for, LaneBook, Run};

/// One statement of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// From the start of the trace.
    pub at: Duration,
    pub user: String,
    pub application: String,
    /// The workload it asks for (`None`: `default`).
    pub workload: Option<String>,
    /// Its text, or a fingerprint (16 hex digits).
    pub statement: String,
    /// How long it runs alone.
    pub service: Duration,
}

/// How one statement of the trace fared.
#[derive(Debug, Clone, PartialEq)]
pub struct Fate {
    /// Its index in the trace.
    pub index: usize,
    /// The workload it asked for.
    pub requested: String,
    /// Where it was admitted (its learned or pinned lane, or `requested`).
    pub admitted_in: String,
    /// Where it ended (after demotions).
    pub ended_in: String,
    pub waited: Duration,
    /// From arrival to its end.
    pub completed: Duration,
    pub service: Duration,
    pub demoted: bool,
    pub outcome: Outcome,
}

/// How a simulated statement ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// `max_waiting_queries` was full: SERVER_OVERLOADED.
    Rejected,
    /// It outlived its `max_execution_time`.
    TimedOut,
}

/// The most statements waiting at once, per workload.
pub type PeakQueues = BTreeMap<String, usize>;

/// The fingerprint of a trace's statement: its text's, or the fingerprint it already is.
fn fingerprint_of(statement: &str) -> Fingerprint {
    let s = statement.trim();
    if s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Fingerprint {
            id: s.to_ascii_lowercase(),
            text: s.to_string(),
            tags: Vec::new(),
        };
    }
    sluice_sql::fingerprint(s)
}

/// Replays `trace` against `catalog` (a fresh learned-lanes book: what the trace teaches it,
/// it uses for the trace's later statements). The fates come in trace order.
pub fn simulate(
    catalog: &Catalog,
    machine: Machine,
    trace: &[Arrival],
) -> Result<(Vec<Fate>, PeakQueues)> {
    let trees = compile(catalog, machine)?;
    let time = Arc::new(VirtualTime::new());
    let schedulers: Arc<Vec<ResourceScheduler>> = Arc::new(
        trees
            .trees
            .iter()
            .filter(|t| t.unit == CostUnit::QuerySlot)
            .map(|t| ResourceScheduler::new(t, time.clone()))
            .collect(),
    );
    let catalog = Arc::new(catalog.clone());
    let book = Arc::new(LaneBook::in_memory());
    let queues = Arc::new(Mutex::new(Queues::default()));
    let start = time.now();
    let mut pool = futures::executor::LocalPool::new();
    let spawner = pool.spawner();
    let mut statements = Vec::with_capacity(trace.len());
    for (index, arrival) in trace.iter().cloned().enumerate() {
        let (schedulers, catalog, book, queues, time) = (
            schedulers.clone(),
            catalog.clone(),
            book.clone(),
            queues.clone(),
            time.clone(),
        );
        let statement = async move {
            time.sleep_until(start + arrival.at).await;
            one(index, arrival, &schedulers, &catalog, &book, &queues, &time).await
        };
        statements.push(spawner.spawn_local_with_handle(statement).map_err(|e| {
            Error::new(
                ErrorCode::InternalError,
                format!("cannot start a simulated statement: {e}"),
            )
        })?);
    }
    // Every statement goes as far as it can at this time; then the time moves on to the next
    // timer, until none is left.
    loop {
        pool.run_until_stalled();
        if !time.advance() {
            break;
        }
    }
    let mut fates = Vec::with_capacity(statements.len());
    for statement in statements {
        let Some(fate) = statement.now_or_never() else {
            return Err(Error::new(
                ErrorCode::InternalError,
                "a simulated statement waits for nothing that will come (the simulation stalled)",
            ));
        };
        fates.push(fate?);
    }
    let peak = std::mem::take(&mut queues.lock().unwrap_or_else(|p| p.into_inner()).peak);
    Ok((fates, peak))
}

/// The simulation's clock and timers (see the module's opening).
struct VirtualTime {
    /// Where its time begins (a real instant: only differences are read).
    start: Instant,
    timers: Mutex<Timers>,
}

#[derive(Default)]
struct Timers {
    /// How far from `start` the time is.
    now: Duration,
    /// What is due when, in the order it was asked for at one time.
    due: BTreeMap<(Instant, u64), Due>,
    next: u64,
}

enum Due {
    /// A statement's sleep: its task is woken.
    Wake(Waker),
    /// A scheduler's refill.
    Call(Wake),
}

impl std::fmt::Debug for VirtualTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualTime").finish_non_exhaustive()
    }
}

impl VirtualTime {
    fn new() -> VirtualTime {
        VirtualTime {
            start: Instant::now(),
            timers: Mutex::default(),
        }
    }

    fn timers(&self) -> std::sync::MutexGuard<'_, Timers> {
        self.timers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `due` off at `key`'s time: at `key` when given (a timer set before, again), else
    /// at `at`, after whatever was set for that time already. Returns where it is set.
    fn set(&self, at: Instant, key: Option<(Instant, u64)>, due: Due) -> (Instant, u64) {
        let mut timers = self.timers();
        let key = key.unwrap_or_else(|| {
            timers.next += 1;
            (at, timers.next)
        });
        timers.due.insert(key, due);
        key
    }

    /// Moves the time on to the earliest timer and sets off every one due then; `false` when
    /// no timer is left. (Nothing is set off under the lock: a refill takes its scheduler's.)
    fn advance(&self) -> bool {
        let fired = {
            let mut timers = self.timers();
            let Some(&(at, _)) = timers.due.keys().next() else {
                return false;
            };
            timers.now = timers.now.max(at - self.start);
            let later = timers.due.split_off(&(at, u64::MAX));
            std::mem::replace(&mut timers.due, later)
        };
        for due in fired.into_values() {
            match due {
                Due::Wake(waker) => waker.wake(),
                Due::Call(wake) => wake(),
            }
        }
        true
    }

    /// Ready once the time is `at` or later.
    fn sleep_until(&self, at: Instant) -> Sleep<'_> {
        Sleep {
            time: self,
            at,
            key: None,
        }
    }
}

impl Clock for VirtualTime {
    fn now(&self) -> Instant {
        self.start + self.timers().now
    }

    fn call_at(&self, at: Instant, wake: Wake) -> std::result::Result<(), Wake> {
        self.set(at, None, Due::Call(wake));
        Ok(())
    }
}

/// [`VirtualTime::sleep_until`].
struct Sleep<'a> {
    time: &'a VirtualTime,
    at: Instant,
    /// Its timer, once set (polled again, the timer wakes the task that polled last).
    key: Option<(Instant, u64)>,
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.time.now() >= self.at {
            return Poll::Ready(());
        }
        let key = self
            .time
            .set(self.at, self.key, Due::Wake(cx.waker().clone()));
        self.key = Some(key);
        Poll::Pending
    }
}

#[derive(Debug, Default)]
struct Queues {
    now: BTreeMap<String, usize>,
    peak: PeakQueues,
}

/// The workload the catalog's classifiers place a statement that names none in, as the
/// server does (the trace has no database or address: those are NULL).
fn classify(catalog: &Catalog, arrival: &Arrival, fingerprint: &Fingerprint) -> Option<String> {
    let rules = catalog.rules();
    if rules.is_empty() {
        return None;
    }
    let kind = match sluice_sql::statement(&arrival.statement) {
        Ok(Some(sluice_sql::ClientStatement::Query(q))) => q.kind,
        _ => sluice_sql::StatementKind::Utility,
    };
    let facts = sluice_catalog::Facts {
        user: &arrival.user,
        database: None,
        application_name: (!arrival.application.is_empty()).then_some(arrival.application.as_str()),
        client_addr: None,
        statement_kind: kind,
        query: &arrival.statement,
        tags: &fingerprint.tags,
    };
    rules
        .classify(&facts, |_| {})
        .map(|rule| rule.workload.clone())
}

/// One statement's life: its lane, admission on every QUERY resource, its run with its
/// demotions, its hard limit; then what it taught the book.
async fn one(
    index: usize,
    arrival: Arrival,
    schedulers: &[ResourceScheduler],
    catalog: &Catalog,
    book: &LaneBook,
    queues: &Mutex<Queues>,
    time: &VirtualTime,
) -> Result<Fate> {
    let arrived = time.now();
    let fingerprint = fingerprint_of(&arrival.statement);
    let requested = match &arrival.workload {
        Some(w) => w.clone(),
        None => classify(catalog, &arrival, &fingerprint).unwrap_or_else(|| "default".into()),
    };
    let judged_by = catalog.lanes(&requested).demotion;
    let admitted_in = lane_for(book, catalog, false, judged_by.as_ref(), &fingerprint)
        .unwrap_or_else(|| requested.clone());
    let mut fate = Fate {
        index,
        requested,
        admitted_in: admitted_in.clone(),
        ended_in: admitted_in.clone(),
        waited: Duration::ZERO,
        completed: Duration::ZERO,
        service: arrival.service,
        demoted: false,
        outcome: Outcome::Ok,
    };
    let mut permits: Vec<(&ResourceScheduler, Permit)> = Vec::new();
    for scheduler in schedulers {
        if !scheduler.has_workload(&admitted_in) {
            continue;
        }
        let mut acquire = match scheduler.acquire(&admitted_in, 1) {
            Ok(a) => a,
            Err(e) if e.code == ErrorCode::ServerOverloaded => {
                fate.outcome = Outcome::Rejected;
                fate.completed = time.now() - arrived;
                return Ok(fate);
            }
            Err(e) => return Err(e),
        };
        let waits = !acquire.is_granted();
        if waits {
            let mut q = queues.lock().unwrap_or_else(|p| p.into_inner());
            let n = q.now.entry(admitted_in.clone()).or_default();
            *n += 1;
            let n = *n;
            let peak = q.peak.entry(admitted_in.clone()).or_default();
            *peak = (*peak).max(n);
        }
        let permit = acquire.await;
        if waits {
            let mut q = queues.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = q.now.get_mut(&admitted_in) {
                *n -= 1;
            }
        }
        permits.push((scheduler, permit?));
    }
    let admitted = time.now();
    fate.waited = admitted - arrived;
    let limit = catalog.lanes(&admitted_in).max_execution_time;
    let mut end = admitted + arrival.service;
    if let Some(limit) = limit.filter(|l| *l < arrival.service) {
        end = admitted + limit;
        fate.outcome = Outcome::TimedOut;
    }
    // Demotions due before it ends, as `demotion::demote_when_due` makes them.
    while let Some(due) = catalog.lanes(&fate.ended_in).demotion {
        if admitted + due.after >= end {
            break;
        }
        time.sleep_until(admitted + due.after).await;
        for (scheduler, permit) in &mut permits {
            permit.move_to(scheduler, &due.to)?;
        }
        book.demoted(&fingerprint, &arrival.statement, &due.to)?;
        fate.ended_in = due.to;
        fate.demoted = true;
    }
    time.sleep_until(end).await;
    drop(permits);
    fate.completed = time.now() - arrived;
    let ran = end - admitted;
    book.record(
        &fingerprint,
        &arrival.statement,
        Run {
            ms: ran.as_millis() as u64,
            demoted_to: fate.demoted.then(|| fate.ended_in.clone()),
            fast: fate.outcome == Outcome::Ok
                && !fate.demoted
                && judged_by.as_ref().is_none_or(|d| ran < d.after),
            relearn_after: judged_by
                .as_ref()
                .map_or(sluice_catalog::lanes::DEFAULT_RELEARN_AFTER, |d| {
                    d.relearn_after
                }),
        },
    )?;
    Ok(fate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(sql: &str) -> Catalog {
        let mut c = Catalog::new();
        for stmt in sluice_sql::parse_script(sql) {
            c.apply_mut(&stmt.result.expect("parses")).expect("valid");
        }
        c
    }

    fn arrival(at_ms: u64, statement: &str, service_ms: u64) -> Arrival {
        Arrival {
            at: Duration::from_millis(at_ms),
            user: "u".into(),
            application: String::new(),
            workload: Some("fast".into()),
            statement: statement.into(),
            service: Duration::from_millis(service_ms),
        }
    }

    const MACHINE: Machine = Machine {
        cores: 4,
        memory: 1 << 34,
    };

    #[test]
    fn a_slow_statement_is_demoted_then_learned_and_fast_ones_pass_it() {
        let c = catalog(
            "CREATE RESOURCE q (QUERY);
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 2;
             CREATE WORKLOAD slow IN all SETTINGS max_concurrent_queries = 1;
             CREATE WORKLOAD fast IN all SETTINGS demote_after = 1, demote_to = 'slow'",
        );
        let trace = [
            arrival(0, "SELECT big FROM t WHERE d = 1", 10_000),
            arrival(100, "SELECT small FROM t", 500),
            arrival(2_000, "SELECT big FROM t WHERE d = 2", 10_000),
            arrival(2_100, "SELECT small FROM t", 500),
        ];
        let (fates, peak) = simulate(&c, MACHINE, &trace).expect("simulates");
        let f = |i: usize| &fates[i];
        // The first big one runs in fast, is demoted at 1 s, ends in slow at 10 s.
        assert_eq!(
            (
                f(0).admitted_in.as_str(),
                f(0).ended_in.as_str(),
                f(0).demoted
            ),
            ("fast", "slow", true)
        );
        assert_eq!(f(0).completed, Duration::from_millis(10_000));
        assert_eq!(f(1).waited, Duration::ZERO);
        // The second big one was learned: admitted straight into slow, where it waits for
        // the first (slow's one slot) until 10 s.
        assert_eq!((f(2).admitted_in.as_str(), f(2).demoted), ("slow", false));
        assert_eq!(f(2).waited, Duration::from_millis(8_000));
        // The small one is not held up by either.
        assert_eq!(f(3).waited, Duration::ZERO);
        assert_eq!(peak.get("slow"), Some(&1));
    }

    /// A rate limit's refills come on the simulation's own timers (`Clock::call_at`): without
    /// them the statements it holds would wait for good.
    #[test]
    fn a_rate_limit_admits_statements_as_its_tokens_refill_in_virtual_time() {
        let c = catalog(
            "CREATE RESOURCE q (QUERY);
             CREATE WORKLOAD all SETTINGS max_queries_per_second = 10, max_burst_queries = 1;
             CREATE WORKLOAD fast IN all",
        );
        let trace: Vec<Arrival> = (0..5).map(|_| arrival(0, "SELECT 1", 1)).collect();
        let (fates, _) = simulate(&c, MACHINE, &trace).expect("simulates");
        let waited: Vec<u128> = fates.iter().map(|f| f.waited.as_millis()).collect();
        assert_eq!(waited, [0, 0, 100, 200, 300]);
    }

    /// Statements that name no workload are placed by the classifiers, and an outranked
    /// stream with `outranked_share = 0.1` is admitted every tenth time while the others wait.
    #[test]
    fn classifiers_place_a_trace_and_outranked_work_keeps_its_share() {
        let c = catalog(
            "CREATE RESOURCE q (QUERY);
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
             CREATE WORKLOAD etl IN all SETTINGS priority = 0;
             CREATE WORKLOAD adhoc IN all SETTINGS priority = 1, outranked_share = 0.1;
             CREATE CLASSIFIER etl WORKLOAD etl WHEN user = 'etl';
             CREATE CLASSIFIER adhoc WORKLOAD adhoc WHEN tag('team') = 'analysts'",
        );
        let mut trace = Vec::new();
        for i in 0..40 {
            trace.push(Arrival {
                user: "etl".into(),
                workload: None,
                ..arrival(i, "INSERT INTO t SELECT 1", 1_000)
            });
            trace.push(Arrival {
                workload: None,
                ..arrival(i, "SELECT 2 /* team='analysts' */", 1_000)
            });
        }
        let (fates, _) = simulate(&c, MACHINE, &trace).expect("simulates");
        // In admission order (arrival plus wait); the first went in at once, the next forty
        // were dequeued while both streams waited.
        let mut order: Vec<&Fate> = fates.iter().collect();
        order.sort_by_key(|f| (trace[f.index].at + f.waited, f.index));
        let first_forty: Vec<&str> = order[1..41].iter().map(|f| f.requested.as_str()).collect();
        assert_eq!(
            first_forty.iter().filter(|w| **w == "adhoc").count(),
            4,
            "{first_forty:?}"
        );
        assert!(fates.iter().all(|f| f.requested == f.admitted_in));
    }

    #[test]
    fn the_hard_limit_and_full_queues_are_simulated() {
        let c = catalog(
            "CREATE RESOURCE q (QUERY);
             CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
             CREATE WORKLOAD fast IN all SETTINGS max_waiting_queries = 1, max_execution_time = 2",
        );
        let trace = [
            arrival(0, "a", 5_000),
            arrival(10, "b", 100),
            arrival(20, "c", 100),
        ];
        let (fates, _) = simulate(&c, MACHINE, &trace).expect("simulates");
        assert_eq!(fates[0].outcome, Outcome::TimedOut);
        assert_eq!(fates[0].completed, Duration::from_secs(2));
        assert_eq!(fates[1].waited, Duration::from_millis(1_990));
        assert_eq!(fates[2].outcome, Outcome::Rejected);
    }
}

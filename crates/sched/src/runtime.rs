//! Running a compiled tree: admission of requests through the time-shared nodes of one resource
//! (reference §4.0–4.5).
//!
//! A request enters the leaf queue of its workload and is *granted* when the root can dequeue
//! it: every node on its path is active — a queue with requests, a satisfied `inflight_limit`,
//! a `bandwidth_limit` with tokens — and `priority` / `fair` nodes pick which child goes next.
//! A grant becomes a [`Permit`]; dropping it gives back what it holds on every `inflight_limit`
//! of its path, which may let the next request through.
//!
//! A `priority` node serves its highest-priority active child, except that a child with
//! sluice's `outranked_share` takes that fraction of the node's dequeues while it is outranked
//! (credit in integer millionths: a share of 0.1 is exactly every tenth dequeue); with every
//! share 0 it is ClickHouse's strict priority.
//!
//! A waiting request can move to another leaf's queue ([`Acquire::move_to`]) keeping its
//! arrival order: request ids are arrival order, every queue is sorted by id, and a successor
//! scheduler keeps the ids of the requests it takes over.
//!
//! A granted [`Permit`] can move: [`Permit::move_to`] takes it to another leaf workload of the
//! same resource (it leaves the old path's `inflight_limit`s and counts in the new path's,
//! without being released), and [`Permit::set_cost`] changes the cost it holds. Both count the
//! new place before they give back the old, so a constraint both paths share never dips.
//!
//! Invariants (each has a test in `tests/runtime.rs` or a script in `testdata/`):
//! - Dropping an [`Acquire`] that has not been granted removes its request from the queue; one
//!   dropped after the grant was decided releases the grant. Dropping a [`Permit`] returns all it
//!   held. No path leaks a slot or a queue entry.
//! - Requests in flight under an `inflight_limit` never exceed `max_requests`, and their cost
//!   exceeds `max_cost` by at most the last request's (ClickHouse's one-request overshoot).
//! - A `bandwidth_limit` dequeues at most `max_burst + max_speed × T` cost in any window `T`,
//!   plus one request: as in ClickHouse, a request passes while tokens ≥ 0 and is charged after,
//!   so the last one may overdraw the bucket (a request larger than the burst must pass too).
//!
//! Locking: all state of one resource sits behind one mutex. Grants are handed over through
//! oneshot channels while it is held (a send only wakes the receiver); nothing that locks runs
//! under the lock: a grant that finds its receiver gone is released in place.
//!
//! The admission path is short on purpose (issue 11's target: 250 ns a request). A request
//! that finds nothing waiting anywhere and every constraint of its path open is granted in one
//! walk up its path (`grant_idle`) with exactly the effects of a queue entry and a dispatch
//! — a property test runs both side by side; a request granted inside its own `acquire` gets
//! no channel; each queue knows its path's `inflight_limit`s; a node's `is_active` is memoised
//! per walk; the maps hash with foldhash.
//!
//! Catalog changes ([`ResourceScheduler::succeed`]): the new tree's scheduler takes over what
//! the old one holds, as ClickHouse updates its tree in place. Requests in flight keep counting
//! against the constraint they passed (an `inflight_limit` of the same workload in the new
//! tree), throttlers keep their tokens, and waiting requests move to their workload's new
//! queue in order — or fail with INVALID_SCHEDULER_NODE when it has none (ClickHouse's purge).
//! The old scheduler forwards: a permit released there is released in its successor too, and
//! requests sent to it go to the successor. So a change never admits more than the new limits.
//! In a fleet each limit's share is carried over, scaled down with a limit that came down
//! (`carried_share`), and a share reckoned on a limit's old size is not raised on the new one
//! (`set_share`'s `size`).
//!
//! The space-shared (memory) nodes run in [`crate::space`].

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use sluice_sql::{Error, ErrorCode, Result};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::tree::{Node, NodeKind, ResourceTree};

/// The scheduler's maps: request ids and workload names on the admission path, hashed fast
/// (foldhash, seeded per process) rather than with SipHash.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The leaf queue of each workload of a tree (`None`: it has children).
pub(crate) type Leaves = HashMap<String, Option<usize>>;

/// One dequeue in the credit units of `outranked_share` (millionths: integers, so a share of
/// 0.1 takes exactly every tenth dequeue, never drifting).
const ONE_DEQUEUE: u64 = 1_000_000;

/// Where time comes from. The default follows tokio's clock, so tests can pause and advance
/// time (`tokio::time::pause`) and timing logic runs deterministically in virtual time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now(&self) -> Instant;

    /// Calls `wake` at `at` (or later) on this clock's time — later, never from within
    /// `call_at` — for a clock with timers of its own (a simulation's). A clock without gives
    /// `wake` back: the scheduler then sleeps on the tokio runtime it was made on.
    fn call_at(&self, _at: Instant, wake: Wake) -> std::result::Result<(), Wake> {
        Err(wake)
    }
}

/// What a [`Clock`] calls at a time it was given.
pub type Wake = Box<dyn FnOnce() + Send>;

/// tokio's clock (virtual when the runtime's time is paused).
#[derive(Debug, Default, Clone, Copy)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Counters of one node, the live columns of `system.scheduler`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct NodeStats {
    pub dequeued_requests: u64,
    pub dequeued_cost: i64,
    pub canceled_requests: u64,
    pub canceled_cost: i64,
    pub rejected_requests: u64,
    pub rejected_cost: i64,
    /// Times the node went from busy to idle (fair nodes).
    pub busy_periods: u64,
    /// Time spent throttled (bandwidth_limit).
    pub throttling: Duration,
}

/// One node's live state, as `system.scheduler` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    pub path: String,
    pub type_name: &'static str,
    pub stats: NodeStats,
    /// Requests waiting in a queue.
    pub queue_length: Option<u64>,
    /// Requests and cost held under an inflight_limit.
    pub inflight_requests: Option<i64>,
    pub inflight_cost: Option<i64>,
    /// Tokens of a bandwidth_limit.
    pub tokens: Option<f64>,
    /// The node's virtual runtime, for children of a fair node.
    pub vruntime: Option<f64>,
    /// The fair node's own clock.
    pub system_vruntime: Option<f64>,
    /// Whether the node could give a request now (ClickHouse's `is_active`).
    pub is_active: bool,
    /// Children that are active.
    pub active_children: u64,
    /// Dequeued cost per second, smoothed over about a second ([`THROUGHPUT_WINDOW`]).
    pub throughput: f64,
    /// Cost of the requests waiting in a queue.
    pub queue_cost: Option<i64>,
    /// A queue's balance of estimated against real cost (ClickHouse's IO budget). sluice's
    /// requests carry their real cost, so it stays 0.
    pub budget: Option<i64>,
    /// Whether a constraint (`inflight_limit`, `bandwidth_limit`) lets requests through now.
    pub is_satisfied: Option<bool>,
}

/// The time constant of `throughput`'s exponential smoothing.
pub const THROUGHPUT_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug)]
enum RtKind {
    Workload,
    Queue {
        queue: VecDeque<u64>,
        max_queued: i64,
        /// In a fleet: this node's share of `max_queued` (see [`Fence`]); `i64::MAX` alone.
        share: i64,
    },
    Inflight {
        max_requests: i64,
        max_cost: i64,
        requests: i64,
        cost: i64,
        /// In a fleet: this node's share of `max_requests` (see [`Fence`]); `i64::MAX` alone.
        share: i64,
    },
    /// `max_speed` and `max_burst` are what this node may use: the workload's own alone, in a
    /// fleet its share of them (`share` of `limit_speed`, in thousandths of a request per
    /// second, and the burst in the same proportion).
    Bandwidth {
        max_speed: f64,
        max_burst: f64,
        tokens: f64,
        last: Instant,
        limit_speed: f64,
        limit_burst: f64,
        /// In a fleet: this node's share of `limit_speed` in thousandths; `i64::MAX` alone.
        share: i64,
    },
    Priority,
    Fair {
        system_vruntime: f64,
        max_vruntime: f64,
    },
}

#[derive(Debug)]
struct RtNode {
    /// Shared with every `Acquire` that waits here (a clone is a count, not a copy).
    path: Arc<str>,
    type_name: &'static str,
    parent: Option<usize>,
    children: Vec<usize>,
    /// Requests queued anywhere below (kept along the leaf-to-root path on every enqueue,
    /// dequeue and cancel), so the dispatcher skips idle subtrees without visiting them.
    pending: usize,
    weight: f64,
    priority: i64,
    /// Start-time fair queueing tag, kept by the node for its fair parent.
    vruntime: f64,
    /// `outranked_share` in millionths, read by a priority parent (0: strict priority).
    outranked_share: u64,
    /// Millionths of a dequeue earned while outranked; at [`ONE_DEQUEUE`] the node takes one.
    credit: u64,
    /// [`is_active`]'s answer as of [`State::epoch`] `active_epoch` (a dequeue asks each node
    /// on its path several times; the tree does not change between those asks).
    active: bool,
    active_epoch: u64,
    /// For a queue: the `inflight_limit` nodes on its path to the root, what a request granted
    /// from it counts against (computed once; every grant shares it).
    constraints: Arc<[usize]>,
    has_fair_parent: bool,
    /// The workload whose subtree this node belongs to (for constraints: the one they limit).
    owner: Option<Arc<str>>,
    kind: RtKind,
    stats: NodeStats,
    /// Smoothed dequeued cost per second as of `rate_at`, when `dequeued_cost` was
    /// `rate_cost`: advanced when `system.scheduler` is read ([`advance_rate`]), so that a
    /// dequeue costs no clock read and no `exp`.
    rate: f64,
    rate_at: Instant,
    rate_cost: i64,
    /// For a queue: whether a `bandwidth_limit` is on its path (then granting needs the clock).
    throttled: bool,
}

/// What a grant holds: its cost on the `inflight_limit`s of its leaf queue's path.
#[derive(Debug)]
struct Grant {
    /// The leaf queue it was granted from (its [`RtNode::constraints`] are what it holds).
    leaf: usize,
    cost: i64,
    /// The leaf workload it counts in.
    workload: Arc<str>,
    /// The scheduler whose nodes `leaf` indexes. Strong: a grant never stays in that
    /// scheduler's state (only in a channel to its `Acquire` or in a `Permit`), so no cycle.
    owner: Arc<Shared>,
    /// When it left its queue (`None`: granted without waiting).
    dequeued: Option<Instant>,
}

#[derive(Debug)]
struct Waiting {
    leaf: usize,
    cost: i64,
    /// Where the grant goes; `None` only while the request's own `acquire` holds the lock
    /// (a grant then is kept in [`State::granted_now`], and no channel is ever made).
    grant: Option<oneshot::Sender<Grant>>,
}

#[derive(Debug)]
struct State {
    nodes: Vec<RtNode>,
    /// Leaf queue of each leaf workload; `None` for workloads that have children.
    leaves: Leaves,
    waiting: HashMap<u64, Waiting>,
    /// A grant for the request still being enqueued under the lock (see [`Waiting::grant`]).
    granted_now: Option<(u64, Grant)>,
    /// Bumped whenever a request leaves a queue and before every walk of the tree: the
    /// memoised [`is_active`] answers of an older epoch are stale.
    epoch: u64,
    /// Whether the tree has a `bandwidth_limit` (otherwise no timer is ever armed).
    throttled: bool,
    /// Tests compare the idle-tree shortcut ([`grant_idle`]) with the queue it skips.
    idle_grants_off: bool,
    next_id: u64,
    /// When a timer will next run the dispatcher (a throttler refills then).
    wake_at: Option<Instant>,
    /// Set once a new tree took over (see [`ResourceScheduler::succeed`]).
    successor: Option<Successor>,
    /// In a fleet: the `inflight_limit`s let through only their shares, and only while the
    /// node's lease certainly lives ([`ResourceScheduler::join_fleet`]).
    fence: Option<Arc<Fence>>,
}

/// Until when a node of a fleet may use the shares it holds: its lease in etcd certainly
/// lives until then (the last renewal etcd confirmed, sent at `s`, holds the lease until at
/// least `s + ttl` on etcd's clock; the fleet sets the fence earlier than that, by a margin
/// for clock rates). Past it, every `inflight_limit` of a scheduler in the fleet lets nothing
/// through, so a node cut off from etcd stops admitting before its shares can be given to
/// another node. Read on the admission path: one atomic load and a clock reading.
#[derive(Debug)]
pub struct Fence {
    base: Instant,
    /// Nanoseconds after `base` until which the lease lives; 0: no lease held.
    until: std::sync::atomic::AtomicU64,
}

impl Fence {
    /// A fence that holds nothing yet.
    pub fn new() -> Arc<Fence> {
        Arc::new(Fence {
            base: Instant::now(),
            until: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The lease certainly lives until `until`.
    pub fn hold_until(&self, until: Instant) {
        let nanos = until.saturating_duration_since(self.base).as_nanos();
        self.until.store(
            u64::try_from(nanos).unwrap_or(u64::MAX).max(1),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// No lease is held (it was lost): nothing passes until [`Fence::hold_until`] again.
    pub fn lift(&self) {
        self.until.store(0, std::sync::atomic::Ordering::Release);
    }

    /// Whether the lease certainly lives at `now`.
    pub fn holds(&self, now: Instant) -> bool {
        let until = self.until.load(std::sync::atomic::Ordering::Acquire);
        until != 0 && now.saturating_duration_since(self.base).as_nanos() < u128::from(until)
    }

    /// When the lease stops certainly living (`None`: none held).
    pub fn until(&self) -> Option<Instant> {
        let until = self.until.load(std::sync::atomic::Ordering::Acquire);
        (until != 0).then(|| self.base + Duration::from_nanos(until))
    }
}

/// Which of a workload's limits a [`LimitState`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LimitKind {
    /// `max_concurrent_queries` (an `inflight_limit`): requests in flight.
    Slots,
    /// `max_queries_per_second` and `max_burst_queries` (a `bandwidth_limit`), in thousandths
    /// of a request per second; the burst is divided in the same proportion as the rate.
    Rate,
    /// `max_waiting_queries` (a leaf's queue): requests waiting.
    Waiting,
}

impl LimitKind {
    /// Its name in the fleet's keys and views.
    pub fn name(self) -> &'static str {
        match self {
            LimitKind::Slots => "slots",
            LimitKind::Rate => "rate",
            LimitKind::Waiting => "waiting",
        }
    }
}

/// One limit of a scheduler, as the fleet's share keeper reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitState {
    /// The workload it limits.
    pub workload: String,
    pub kind: LimitKind,
    /// The limit, in the kind's units (requests; thousandths of a request per second).
    pub max_requests: i64,
    /// What this node holds of it now and cannot give back before it ends: requests in
    /// flight (slots), requests waiting (waiting); 0 for a rate.
    pub requests: i64,
    /// This node's share of `max_requests` (`i64::MAX` outside a fleet).
    pub share: i64,
    /// Requests that passed it since the scheduler started (a rate's use is measured on it).
    pub passed: u64,
    /// Requests waiting below it now.
    pub pending: usize,
    /// Whether it holds requests back now for want of a bigger share: requests wait below a
    /// full share of slots or an empty bucket; the queue is full to its share.
    pub binds: bool,
    /// Requests it refused since the scheduler started (a queue at its share).
    pub rejected: u64,
}

/// Where a replaced scheduler forwards to.
#[derive(Debug)]
struct Successor {
    /// Strong: a permit of this scheduler must reach every later version to give back what
    /// they took over, even once no snapshot holds the versions between (new versions never
    /// point back, so there is no cycle; the chain lives as long as the oldest permit).
    shared: Arc<Shared>,
    /// Constraint nodes whose in-flight counts the successor took over: ours → theirs.
    constraints: HashMap<usize, usize>,
    /// Requests that moved to the successor's queues: our id → theirs.
    moved: HashMap<u64, u64>,
}

#[derive(Debug)]
struct Shared {
    resource: String,
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    /// Where throttler wake-up timers run; none outside a tokio runtime (then rates are
    /// re-checked only when requests arrive or finish).
    runtime: Option<tokio::runtime::Handle>,
}

/// Admission for one resource, running its compiled tree.
#[derive(Debug, Clone)]
pub struct ResourceScheduler {
    shared: Arc<Shared>,
}

impl ResourceScheduler {
    /// Builds the runtime nodes of `tree`. Call it inside a tokio runtime for throttler timers.
    pub fn new(tree: &ResourceTree, clock: Arc<dyn Clock>) -> Self {
        let now = clock.now();
        let mut state = State {
            nodes: Vec::new(),
            leaves: Leaves::default(),
            waiting: HashMap::default(),
            granted_now: None,
            epoch: 0,
            idle_grants_off: false,
            throttled: false,
            next_id: 0,
            wake_at: None,
            successor: None,
            fence: None,
        };
        if let Some(root) = &tree.root {
            add_node(&mut state, root, "", None, None, false, now);
        }
        for leaf in 0..state.nodes.len() {
            if matches!(state.nodes[leaf].kind, RtKind::Queue { .. }) {
                state.nodes[leaf].constraints = constraints_of(&state, leaf).into();
                let mut at = Some(leaf);
                while let Some(n) = at {
                    if matches!(state.nodes[n].kind, RtKind::Bandwidth { .. }) {
                        state.nodes[leaf].throttled = true;
                        state.throttled = true;
                    }
                    at = state.nodes[n].parent;
                }
            }
        }
        ResourceScheduler {
            shared: Arc::new(Shared {
                resource: tree.resource.clone(),
                state: Mutex::new(state),
                clock,
                runtime: tokio::runtime::Handle::try_current().ok(),
            }),
        }
    }

    pub fn resource(&self) -> &str {
        &self.shared.resource
    }

    /// Whether `workload` has a node in this tree (unknown workloads are the caller's
    /// decision: unlimited, or RESOURCE_ACCESS_DENIED with `throw_on_unknown_workload`).
    pub fn has_workload(&self, workload: &str) -> bool {
        self.current().shared.lock().leaves.contains_key(workload)
    }

    /// Whether `workload` is in this tree but has children (requests cannot link to it).
    pub fn is_inner_workload(&self, workload: &str) -> bool {
        matches!(
            self.current().shared.lock().leaves.get(workload),
            Some(None)
        )
    }

    /// The scheduler now in charge: this one, or the last of its successors.
    fn current(&self) -> ResourceScheduler {
        self.with_current(|shared, _| ResourceScheduler {
            shared: shared.clone(),
        })
    }

    /// The resource is gone: every waiting request fails with INVALID_SCHEDULER_NODE; what
    /// is in flight finishes.
    pub fn retire(&self) {
        let mut state = self.shared.lock();
        let waiting: Vec<(u64, usize)> =
            state.waiting.iter().map(|(id, w)| (*id, w.leaf)).collect();
        for (id, leaf) in waiting {
            state.waiting.remove(&id);
            if let RtKind::Queue { queue, .. } = &mut state.nodes[leaf].kind {
                queue.retain(|&q| q != id);
            }
            count_pending(&mut state, leaf, false);
        }
    }

    /// Builds the scheduler of `tree`, the new version of this resource's tree, and hands it
    /// what this one holds (see the module docs): in-flight counts of each workload's
    /// `inflight_limit`, each workload's throttler tokens, and the waiting requests, in order,
    /// in their workload's new queue. Waiting requests whose workload has no queue in `tree`
    /// fail with INVALID_SCHEDULER_NODE. From then on this scheduler forwards to the new one.
    pub fn succeed(&self, tree: &ResourceTree) -> ResourceScheduler {
        let next = ResourceScheduler::new(tree, self.shared.clock.clone());
        let now = self.shared.clock.now();
        let mut old = self.shared.lock();
        let mut new = next.shared.lock();
        new.idle_grants_off = old.idle_grants_off;
        if let Some(fence) = &old.fence {
            // In a fleet a new limit holds no share until the fleet grants it one.
            enter_fleet(&mut new, fence.clone());
        }
        let key = |n: &RtNode| n.owner.as_deref().map(|o| (o.to_string(), n.type_name));
        let new_by_key: HashMap<(String, &'static str), usize> = new
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.kind, RtKind::Inflight { .. } | RtKind::Bandwidth { .. }))
            .filter_map(|(i, n)| Some((key(n)?, i)))
            .collect();
        let mut constraints = HashMap::default();
        for i in 0..old.nodes.len() {
            refill(&mut old.nodes[i].kind, now);
            let Some(&j) = key(&old.nodes[i]).and_then(|k| new_by_key.get(&k)) else {
                continue;
            };
            match (&old.nodes[i].kind, &mut new.nodes[j].kind) {
                (
                    RtKind::Inflight {
                        max_requests,
                        requests,
                        cost,
                        share,
                        ..
                    },
                    RtKind::Inflight {
                        max_requests: to_max,
                        requests: to_requests,
                        cost: to_cost,
                        share: to_share,
                        ..
                    },
                ) => {
                    *to_requests += requests;
                    *to_cost += cost;
                    *to_share = carried_share(*share, *max_requests, *to_max);
                    constraints.insert(i, j);
                }
                (
                    RtKind::Bandwidth {
                        tokens,
                        share,
                        limit_speed,
                        ..
                    },
                    to,
                ) => {
                    let (tokens, share) = (*tokens, *share);
                    if share != i64::MAX {
                        let sizes = (thousandths(*limit_speed), limit_size(to).map_or(0, |l| l.1));
                        share_rate(to, carried_share(share, sizes.0, sizes.1));
                    }
                    if let RtKind::Bandwidth {
                        tokens: to_tokens,
                        max_burst,
                        ..
                    } = to
                    {
                        *to_tokens = tokens.min(*max_burst);
                    }
                }
                _ => {}
            }
        }
        // Waiting requests, leaf by leaf in queue order (the order within a leaf is the
        // order they are served in; across leaves the new tree decides). They keep their ids,
        // which are their arrival order (queues stay sorted by id; see `Acquire::move_to`).
        new.next_id = new.next_id.max(old.next_id);
        let mut moved = HashMap::default();
        for leaf in 0..old.nodes.len() {
            let queued: Vec<u64> = match &mut old.nodes[leaf].kind {
                RtKind::Queue { queue, .. } => queue.drain(..).collect(),
                _ => continue,
            };
            let workload = old.nodes[leaf]
                .owner
                .as_deref()
                .unwrap_or_default()
                .to_string();
            let target = new.leaves.get(&workload).copied().flatten();
            if let (
                Some(target),
                RtKind::Queue {
                    share,
                    max_queued: was,
                    ..
                },
            ) = (target, &old.nodes[leaf].kind)
            {
                if let RtKind::Queue {
                    share: to_share,
                    max_queued,
                    ..
                } = &mut new.nodes[target].kind
                {
                    if *max_queued < sluice_catalog::UNLIMITED && *share != i64::MAX {
                        *to_share = carried_share(*share, *was, *max_queued);
                    }
                }
            }
            for id in queued {
                let Some(waiting) = old.waiting.remove(&id) else {
                    continue;
                };
                count_pending(&mut old, leaf, false);
                // No queue for it any more: dropping its sender fails the wait with
                // INVALID_SCHEDULER_NODE, as ClickHouse's purge does.
                let Some(target) = target else { continue };
                let new_id = id;
                if let RtKind::Queue { queue, .. } = &mut new.nodes[target].kind {
                    queue.push_back(new_id);
                }
                count_pending(&mut new, target, true);
                new.waiting.insert(
                    new_id,
                    Waiting {
                        leaf: target,
                        ..waiting
                    },
                );
                moved.insert(id, new_id);
            }
        }
        old.successor = Some(Successor {
            shared: next.shared.clone(),
            constraints,
            moved,
        });
        next.shared.dispatch(&mut new);
        drop(new);
        drop(old);
        next
    }

    /// Enqueues a request of `cost` for `workload` and returns the future of its grant. Errors
    /// come at once: the workload has children (INVALID_SCHEDULER_NODE), or its queue is full
    /// (SERVER_OVERLOADED). An unknown workload is granted at once, without limits.
    pub fn acquire(&self, workload: &str, cost: i64) -> Result<Acquire> {
        Ok(self
            .acquire_known(workload, cost)?
            .unwrap_or_else(Acquire::unlimited))
    }

    /// [`ResourceScheduler::acquire`] for a workload of this resource's tree: `None`, and
    /// nothing queued, when `workload` is not in it (one lock for what
    /// [`ResourceScheduler::has_workload`] and `acquire` would take two for).
    pub fn acquire_known(&self, workload: &str, cost: i64) -> Result<Option<Acquire>> {
        let shared = &self.shared;
        let mut state = shared.lock();
        if state.successor.is_some() {
            drop(state);
            return self.current().acquire_known(workload, cost);
        }
        let Some(leaf) = leaf_of(&state.leaves, workload)? else {
            return Ok(None);
        };
        if let Some(grant) = shared.grant_idle(&mut state, leaf, cost) {
            let queue_path = state.nodes[leaf].path.clone();
            drop(state);
            return Ok(Some(Acquire {
                shared: None,
                id: 0,
                rx: None,
                ready: Some(Permit::granted(grant)),
                queue_path,
            }));
        }
        let id = enqueue(&mut state, leaf, cost)?;
        let queue_path = state.nodes[leaf].path.clone();
        shared.dispatch(&mut state);
        if let Some(grant) = take_granted_now(&mut state, id) {
            // Granted at once (the uncontended case): no channel, no second lock to poll.
            drop(state);
            return Ok(Some(Acquire {
                shared: None,
                id,
                rx: None,
                ready: Some(Permit::granted(grant)),
                queue_path,
            }));
        }
        let (tx, rx) = oneshot::channel();
        if let Some(waiting) = state.waiting.get_mut(&id) {
            waiting.grant = Some(tx);
        }
        drop(state);
        Ok(Some(Acquire {
            shared: Some(shared.clone()),
            id,
            rx: Some(rx),
            ready: None,
            queue_path,
        }))
    }

    /// Grants a request of `cost` for leaf `workload` now, or not at all: it queues behind
    /// whoever waits, the tree is dispatched once, and if that did not grant it, it leaves the
    /// queue again, counted nowhere (nothing was refused: the caller chose not to wait). What
    /// a query takes this way is CPU worker slots, only while they are free (reference §4.8).
    /// `None` also for a workload with children or a full queue; an unknown workload is granted
    /// without limits.
    pub fn try_acquire(&self, workload: &str, cost: i64) -> Option<Permit> {
        let current = self.current();
        let shared = &current.shared;
        let mut state = shared.lock();
        let leaf = match state.leaves.get(workload) {
            None => return Some(Permit { grant: None }),
            Some(None) => return None,
            Some(Some(leaf)) => *leaf,
        };
        if let Some(grant) = shared.grant_idle(&mut state, leaf, cost) {
            return Some(Permit::granted(grant));
        }
        let id = enqueue(&mut state, leaf, cost).ok()?;
        shared.dispatch(&mut state);
        if let Some(grant) = take_granted_now(&mut state, id) {
            return Some(Permit::granted(grant));
        }
        if state.waiting.remove(&id).is_some() {
            if let RtKind::Queue { queue, .. } = &mut state.nodes[leaf].kind {
                queue.retain(|&q| q != id);
            }
            count_pending(&mut state, leaf, false);
        }
        None
    }

    /// The live state of every node, ordered by path.
    pub fn nodes(&self) -> Vec<NodeState> {
        let now = self.shared.clock.now();
        let mut state = self.shared.lock();
        state.epoch += 1;
        let mut out = Vec::with_capacity(state.nodes.len());
        for i in 0..state.nodes.len() {
            advance_rate(&mut state.nodes[i], now);
            let active = is_active(&mut state, i, now);
            let children = state.nodes[i].children.clone();
            let active_children = children
                .into_iter()
                .filter(|&c| is_active(&mut state, c, now))
                .count() as u64;
            let n = &state.nodes[i];
            let queue_cost = match &n.kind {
                RtKind::Queue { queue, .. } => Some(
                    queue
                        .iter()
                        .filter_map(|id| state.waiting.get(id))
                        .map(|w| w.cost)
                        .sum(),
                ),
                _ => None,
            };
            out.push(NodeState {
                path: n.path.to_string(),
                type_name: n.type_name,
                stats: n.stats.clone(),
                queue_length: match &n.kind {
                    RtKind::Queue { queue, .. } => Some(queue.len() as u64),
                    _ => None,
                },
                inflight_requests: match n.kind {
                    RtKind::Inflight { requests, .. } => Some(requests),
                    _ => None,
                },
                inflight_cost: match n.kind {
                    RtKind::Inflight { cost, .. } => Some(cost),
                    _ => None,
                },
                tokens: match n.kind {
                    RtKind::Bandwidth { tokens, .. } => Some(tokens),
                    _ => None,
                },
                vruntime: n.has_fair_parent.then_some(n.vruntime),
                system_vruntime: match n.kind {
                    RtKind::Fair {
                        system_vruntime, ..
                    } => Some(system_vruntime),
                    _ => None,
                },
                is_active: active,
                active_children,
                throughput: n.rate,
                budget: queue_cost.map(|_| 0),
                queue_cost,
                is_satisfied: matches!(n.kind, RtKind::Inflight { .. } | RtKind::Bandwidth { .. })
                    .then(|| lets_through(&n.kind, is_fenced(&state, now))),
            });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// Puts this scheduler (and every successor) in a fleet: each `inflight_limit` lets
    /// through at most this node's share of it, set by [`ResourceScheduler::set_share`]
    /// (none until then), and nothing while `fence` does not hold.
    pub fn join_fleet(&self, fence: Arc<Fence>) {
        self.with_current(|_, state| enter_fleet(state, fence));
    }

    /// Sets this node's share of `workload`'s limit of `kind`, a share of a limit of `size`
    /// (in the kind's units, [`LimitState::max_requests`]), and grants what it lets through.
    /// A smaller share of slots admits nothing until the requests in flight are below it (it
    /// never stops what runs); of waiting, queues nothing more until fewer wait; of a rate,
    /// refills slower from now on and keeps no more tokens than its burst. A share is never
    /// raised on a limit that is no longer of `size` (the catalog changed since the share was
    /// reckoned: it was reckoned on the old limit). False when the workload has no such limit
    /// here, or the share was not raised for that reason.
    pub fn set_share(&self, workload: &str, kind: LimitKind, size: i64, to: i64) -> bool {
        let now = self.shared.clock.now();
        self.with_current(|shared, state| {
            let mut found = false;
            for node in &mut state.nodes {
                if node.owner.as_deref() != Some(workload) {
                    continue;
                }
                let Some((of, now_size)) = limit_size(&node.kind) else {
                    continue;
                };
                if of != kind || (now_size != size && to > share_of(&node.kind)) {
                    continue;
                }
                match (&mut node.kind, kind) {
                    (RtKind::Inflight { share, .. }, LimitKind::Slots) => *share = to.max(0),
                    (
                        RtKind::Queue {
                            share, max_queued, ..
                        },
                        LimitKind::Waiting,
                    ) if *max_queued < sluice_catalog::UNLIMITED => *share = to.max(0),
                    (limit @ RtKind::Bandwidth { .. }, LimitKind::Rate) => {
                        refill(limit, now);
                        share_rate(limit, to.max(0));
                    }
                    _ => continue,
                }
                found = true;
            }
            if found {
                state.epoch += 1;
                shared.dispatch(state);
            }
            found
        })
    }

    /// Grants what the tree lets through now (after the fleet's fence moved on).
    pub fn wake(&self) {
        self.with_current(|shared, state| {
            state.epoch += 1;
            shared.dispatch(state);
        });
    }

    /// Every limit the fleet divides (an `inflight_limit`, a `bandwidth_limit`, a bounded
    /// queue) with the workload it limits, what this node holds of it and its share of it.
    pub fn limits(&self) -> Vec<LimitState> {
        self.with_current(|_, state| {
            state
                .nodes
                .iter()
                .filter_map(|n| {
                    let waits = n.pending > 0;
                    let (kind, max_requests, requests, share, binds) = match &n.kind {
                        RtKind::Inflight {
                            max_requests,
                            requests,
                            share,
                            ..
                        } => (
                            LimitKind::Slots,
                            *max_requests,
                            *requests,
                            *share,
                            waits && requests >= share,
                        ),
                        RtKind::Bandwidth {
                            limit_speed,
                            share,
                            tokens,
                            ..
                        } => (
                            LimitKind::Rate,
                            thousandths(*limit_speed),
                            0,
                            *share,
                            waits && (*tokens < 0.0 || *share == 0),
                        ),
                        RtKind::Queue {
                            queue,
                            max_queued,
                            share,
                        } if *max_queued < sluice_catalog::UNLIMITED => (
                            LimitKind::Waiting,
                            *max_queued,
                            queue.len() as i64,
                            *share,
                            queue.len() as i64 >= *share,
                        ),
                        _ => return None,
                    };
                    Some(LimitState {
                        workload: n.owner.as_deref()?.to_string(),
                        kind,
                        max_requests,
                        requests,
                        share,
                        passed: n.stats.dequeued_requests,
                        pending: n.pending,
                        binds,
                        rejected: n.stats.rejected_requests,
                    })
                })
                .collect()
        })
    }

    /// Requests waiting in each leaf workload's queue (workloads with none waiting left out).
    pub fn queue_lengths(&self) -> Vec<(String, usize)> {
        self.with_current(|_, state| {
            state
                .nodes
                .iter()
                .filter_map(|n| match &n.kind {
                    RtKind::Queue { queue, .. } if !queue.is_empty() => {
                        Some((n.owner.as_deref()?.to_string(), queue.len()))
                    }
                    _ => None,
                })
                .collect()
        })
    }

    /// Runs `f` on the scheduler now in charge, under its lock (so no successor can take
    /// over meanwhile: a change made here is one `succeed` carries over).
    fn with_current<R>(&self, f: impl FnOnce(&Arc<Shared>, &mut State) -> R) -> R {
        let mut at = self.shared.clone();
        loop {
            let mut state = at.lock();
            let next = state.successor.as_ref().map(|s| s.shared.clone());
            match next {
                Some(next) => {
                    drop(state);
                    at = next;
                }
                None => return f(&at, &mut state),
            }
        }
    }

    /// Makes every request take the queue, even on an idle tree (for tests that check the
    /// shortcut has the queue's effects exactly).
    #[doc(hidden)]
    pub fn without_idle_grants(self) -> Self {
        self.shared.lock().idle_grants_off = true;
        self
    }

    /// Requests waiting in all queues.
    pub fn waiting(&self) -> usize {
        self.shared.lock().waiting.len()
    }
}

fn add_node(
    state: &mut State,
    node: &Node,
    prefix: &str,
    parent: Option<usize>,
    workload: Option<&str>,
    fair_parent: bool,
    now: Instant,
) -> usize {
    let path = format!("{prefix}/{}", node.basename);
    let kind = match &node.kind {
        NodeKind::Workload => RtKind::Workload,
        NodeKind::Fifo { max_queued } | NodeKind::AllocationQueue { max_queued } => RtKind::Queue {
            queue: VecDeque::new(),
            max_queued: *max_queued,
            share: i64::MAX,
        },
        NodeKind::InflightLimit {
            max_requests,
            max_cost,
        } => RtKind::Inflight {
            max_requests: *max_requests,
            max_cost: *max_cost,
            requests: 0,
            cost: 0,
            share: i64::MAX,
        },
        NodeKind::BandwidthLimit {
            max_speed,
            max_burst,
        } => RtKind::Bandwidth {
            max_speed: *max_speed,
            max_burst: *max_burst,
            tokens: *max_burst,
            last: now,
            limit_speed: *max_speed,
            limit_burst: *max_burst,
            share: i64::MAX,
        },
        NodeKind::Priority | NodeKind::PrecedenceAllocation => RtKind::Priority,
        NodeKind::Fair | NodeKind::FairAllocation => RtKind::Fair {
            system_vruntime: 0.0,
            max_vruntime: 0.0,
        },
        NodeKind::AllocationLimit { .. } => RtKind::Workload,
    };
    let index = state.nodes.len();
    state.nodes.push(RtNode {
        path: Arc::from(path.as_str()),
        type_name: node.kind.type_name(),
        parent,
        children: Vec::new(),
        pending: 0,
        weight: node.weight,
        priority: node.priority,
        vruntime: 0.0,
        outranked_share: (node.outranked_share.clamp(0.0, 1.0) * ONE_DEQUEUE as f64).round() as u64,
        credit: 0,
        active: false,
        active_epoch: u64::MAX,
        constraints: Arc::from([]),
        has_fair_parent: fair_parent,
        owner: workload.map(Arc::from),
        kind,
        stats: NodeStats::default(),
        rate: 0.0,
        rate_at: now,
        rate_cost: 0,
        throttled: false,
    });
    let is_fair = matches!(node.kind, NodeKind::Fair | NodeKind::FairAllocation);
    let own = if node.kind == NodeKind::Workload {
        Some(node.basename.as_str())
    } else {
        workload
    };
    if node.kind == NodeKind::Workload {
        // A workload that holds a queue directly below its constraints is a leaf.
        state.leaves.insert(node.basename.clone(), None);
    }
    for child in &node.children {
        let c = add_node(state, child, &path, Some(index), own, is_fair, now);
        state.nodes[index].children.push(c);
    }
    if matches!(state.nodes[index].kind, RtKind::Queue { .. }) {
        if let Some(w) = own {
            state.leaves.insert(w.to_string(), Some(index));
        }
    }
    index
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counters that are still consistent enough to
        // keep serving; do not cascade it into every later query.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// [`grant_idle`] for this scheduler: the grant, owned here.
    fn grant_idle(self: &Arc<Self>, state: &mut State, leaf: usize, cost: i64) -> Option<Grant> {
        if state.idle_grants_off || state.nodes[0].pending != 0 {
            return None;
        }
        // The clock only for a throttler's tokens, or a fleet's fence.
        let now = (state.nodes[leaf].throttled || state.fence.is_some()).then(|| self.clock.now());
        let workload = grant_idle(state, leaf, cost, now)?;
        Some(Grant {
            leaf,
            cost,
            workload,
            owner: self.clone(),
            dequeued: None,
        })
    }

    /// Grants every request the tree lets through now, then arms a timer for the earliest
    /// throttler refill that would let more through.
    fn dispatch(self: &Arc<Self>, state: &mut State) {
        // Nothing waits (a release on an idle tree): no clock read, no walk, no timer.
        if state.nodes.first().is_none_or(|root| root.pending == 0) {
            return;
        }
        let now = self.clock.now();
        loop {
            state.epoch += 1;
            if !is_active(state, 0, now) {
                break;
            }
            let Some((id, _)) = dequeue(state, 0, now) else {
                break;
            };
            let Some(waiting) = state.waiting.remove(&id) else {
                continue;
            };
            hold(state, waiting.leaf, waiting.cost);
            let grant = Grant {
                leaf: waiting.leaf,
                cost: waiting.cost,
                workload: workload_of(state, waiting.leaf),
                owner: self.clone(),
                dequeued: Some(now),
            };
            match waiting.grant {
                None => state.granted_now = Some((id, grant)),
                Some(sender) => {
                    if let Err(grant) = sender.send(grant) {
                        // The future is gone (its drop waits for this lock): release in place.
                        release_locked(state, grant.leaf, grant.cost);
                    }
                }
            }
        }
        self.arm_timer(state, now);
    }

    fn arm_timer(self: &Arc<Self>, state: &mut State, now: Instant) {
        if !state.throttled {
            return; // no bandwidth_limit in the tree: nothing refills
        }
        let Some(at) = next_refill(state, 0, now) else {
            return;
        };
        if state.wake_at.is_some_and(|w| w <= at && w > now) {
            return;
        }
        let weak: Weak<Shared> = Arc::downgrade(self);
        let refill = move || {
            if let Some(shared) = weak.upgrade() {
                let mut state = shared.lock();
                if state.wake_at == Some(at) {
                    state.wake_at = None;
                }
                shared.dispatch(&mut state);
            }
        };
        // The clock's own timer (its call comes after this lock is let go), else the runtime's.
        let refill = match self.clock.call_at(at, Box::new(refill)) {
            Ok(()) => {
                state.wake_at = Some(at);
                return;
            }
            Err(refill) => refill,
        };
        let Some(runtime) = &self.runtime else { return };
        state.wake_at = Some(at);
        runtime.spawn(async move {
            tokio::time::sleep_until(at).await;
            refill();
        });
    }

    /// Gives back what a grant from leaf queue `leaf` holds here, and in every successor that
    /// took its counts over.
    fn release(self: &Arc<Self>, leaf: usize, cost: i64) {
        let mut state = self.lock();
        release_locked(&mut state, leaf, cost);
        self.dispatch(&mut state);
        let Some(next) = &state.successor else {
            return;
        };
        // Replaced: the successors took the counts over, so they give them back too.
        let mut constraints: Vec<usize> = state.nodes[leaf]
            .constraints
            .iter()
            .filter_map(|c| next.constraints.get(c).copied())
            .collect();
        let mut at = (!constraints.is_empty()).then(|| next.shared.clone());
        drop(state);
        while let Some(shared) = at.take() {
            let mut state = shared.lock();
            release_constraints(&mut state, &constraints, cost);
            shared.dispatch(&mut state);
            if let Some(next) = &state.successor {
                constraints = constraints
                    .iter()
                    .filter_map(|c| next.constraints.get(c).copied())
                    .collect();
                if !constraints.is_empty() {
                    at = Some(next.shared.clone());
                }
            }
        }
    }
}

/// Gives back a grant of `cost` from leaf queue `leaf` on its path's `inflight_limit`s.
fn release_locked(state: &mut State, leaf: usize, released_cost: i64) {
    for i in 0..state.nodes[leaf].constraints.len() {
        let c = state.nodes[leaf].constraints[i];
        if let RtKind::Inflight { requests, cost, .. } = &mut state.nodes[c].kind {
            *requests -= 1;
            *cost -= released_cost;
        }
    }
}

/// Gives back `released_cost` on the `inflight_limit` nodes `constraints` (a successor's
/// nodes that took a grant's counts over).
fn release_constraints(state: &mut State, constraints: &[usize], released_cost: i64) {
    for &c in constraints {
        if let RtKind::Inflight { requests, cost, .. } = &mut state.nodes[c].kind {
            *requests -= 1;
            *cost -= released_cost;
        }
    }
}

fn refill(kind: &mut RtKind, now: Instant) {
    if let RtKind::Bandwidth {
        max_speed,
        max_burst,
        tokens,
        last,
        ..
    } = kind
    {
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + *max_speed * elapsed).min(*max_burst);
        *last = now;
    }
}

/// The leaf queue of `workload` in a tree's `leaves` map: `None` for a workload the tree does
/// not know (the caller decides: unlimited), INVALID_SCHEDULER_NODE for one with children
/// (requests link to leaves only). Both runtimes look workloads up through it.
pub(crate) fn leaf_of(leaves: &Leaves, workload: &str) -> Result<Option<usize>> {
    match leaves.get(workload) {
        None => Ok(None),
        Some(None) => Err(Error::new(
            ErrorCode::InvalidSchedulerNode,
            format!("Unable to link to workload '{workload}' that has children"),
        )),
        Some(Some(leaf)) => Ok(Some(*leaf)),
    }
}

/// Queues a request of `cost` at the back of leaf queue `leaf`, or refuses it when the queue
/// is full (SERVER_OVERLOADED, counted as rejected). Its id is its arrival order. It has no
/// channel yet: a grant in the caller's dispatch lands in [`State::granted_now`], and the
/// caller attaches a sender before it lets the lock go.
fn enqueue(state: &mut State, leaf: usize, cost: i64) -> Result<u64> {
    let node = &mut state.nodes[leaf];
    let RtKind::Queue {
        queue,
        max_queued,
        share,
    } = &mut node.kind
    else {
        unreachable!("leaves map to queue nodes");
    };
    if queue.len() as i64 >= (*max_queued).min(*share) {
        let message = if *share < *max_queued {
            format!(
                "Workload limit `max_waiting_queries` has been reached: {} waiting on this node, its share of {max_queued} across the fleet",
                queue.len()
            )
        } else {
            format!(
                "Workload limit `max_waiting_queries` has been reached: {} of {max_queued}",
                queue.len()
            )
        };
        node.stats.rejected_requests += 1;
        node.stats.rejected_cost += cost;
        return Err(Error::new(ErrorCode::ServerOverloaded, message));
    }
    let id = state.next_id;
    state.next_id += 1;
    if let RtKind::Queue { queue, .. } = &mut state.nodes[leaf].kind {
        queue.push_back(id);
    }
    count_pending(state, leaf, true);
    state.waiting.insert(
        id,
        Waiting {
            leaf,
            cost,
            grant: None,
        },
    );
    Ok(id)
}

/// The grant request `id` got in the dispatch its own enqueue ran, if it got one.
fn take_granted_now(state: &mut State, id: u64) -> Option<Grant> {
    match state.granted_now.take() {
        Some((granted, grant)) if granted == id => Some(grant),
        other => {
            state.granted_now = other;
            None
        }
    }
}

/// Adds or removes one pending request on the path from `leaf` to the root.
fn count_pending(state: &mut State, leaf: usize, added: bool) {
    let mut at = Some(leaf);
    while let Some(n) = at {
        let node = &mut state.nodes[n];
        node.pending = if added {
            node.pending + 1
        } else {
            node.pending.saturating_sub(1)
        };
        at = node.parent;
    }
}

/// Whether node `n` can give a request now.
fn is_active(state: &mut State, n: usize, now: Instant) -> bool {
    let node = &state.nodes[n];
    if node.pending == 0 {
        return false;
    }
    if node.active_epoch == state.epoch {
        return node.active;
    }
    let active = compute_active(state, n, now);
    let node = &mut state.nodes[n];
    node.active = active;
    node.active_epoch = state.epoch;
    active
}

/// A rate in thousandths of a request per second (what the fleet divides), rounded down.
fn thousandths(speed: f64) -> i64 {
    (speed * 1000.0).floor().min(i64::MAX as f64) as i64
}

/// The limit a node of the tree divides across a fleet, and its size in the kind's units
/// ([`LimitState::max_requests`]); `None` for a node that has none.
fn limit_size(kind: &RtKind) -> Option<(LimitKind, i64)> {
    match kind {
        RtKind::Inflight { max_requests, .. } => Some((LimitKind::Slots, *max_requests)),
        RtKind::Bandwidth { limit_speed, .. } => Some((LimitKind::Rate, thousandths(*limit_speed))),
        RtKind::Queue { max_queued, .. } if *max_queued < sluice_catalog::UNLIMITED => {
            Some((LimitKind::Waiting, *max_queued))
        }
        _ => None,
    }
}

/// This node's share of the limit `kind` holds (`i64::MAX` outside a fleet; 0 for a node
/// without one).
fn share_of(kind: &RtKind) -> i64 {
    match kind {
        RtKind::Inflight { share, .. }
        | RtKind::Bandwidth { share, .. }
        | RtKind::Queue { share, .. } => *share,
        _ => 0,
    }
}

/// A node's share of a limit whose size a catalog change took from `old` to `new`: kept when
/// the limit did not come down, scaled down with it (rounded down) when it did. Every node of
/// the fleet scales its own alike, so shares that summed to no more than the old limit sum to
/// no more than the new one from the moment each node has applied the change — not only once
/// the fleet's keepers have divided it anew over etcd, which a busy etcd can hold up for as
/// long as a keeper's round (the fleet's test saw half a second).
fn carried_share(share: i64, old: i64, new: i64) -> i64 {
    if share == i64::MAX || new >= old || old <= 0 {
        share
    } else {
        (i128::from(share) * i128::from(new.max(0)) / i128::from(old)) as i64
    }
}

/// A throttler's share of its workload's rate (thousandths of a request per second): it
/// refills at no more than that, and holds at most the burst in the same proportion. The
/// caller refilled it up to now first, at the old rate.
fn share_rate(kind: &mut RtKind, to: i64) {
    if let RtKind::Bandwidth {
        max_speed,
        max_burst,
        tokens,
        limit_speed,
        limit_burst,
        share,
        ..
    } = kind
    {
        *share = to;
        *max_speed = (to as f64 / 1000.0).min(*limit_speed);
        *max_burst = if *limit_speed > 0.0 {
            *limit_burst * (*max_speed / *limit_speed)
        } else {
            0.0
        };
        *tokens = tokens.min(*max_burst);
    }
}

/// Whether the scheduler is in a fleet whose fence has passed at `now`.
fn is_fenced(state: &State, now: Instant) -> bool {
    state.fence.as_ref().is_some_and(|f| !f.holds(now))
}

/// Puts a scheduler's state in a fleet behind `fence`: every `inflight_limit` holds no share
/// until one is set.
fn enter_fleet(state: &mut State, fence: Arc<Fence>) {
    for node in &mut state.nodes {
        match &mut node.kind {
            RtKind::Inflight { share, .. } => *share = 0,
            RtKind::Queue {
                share, max_queued, ..
            } if *max_queued < sluice_catalog::UNLIMITED => *share = 0,
            kind @ RtKind::Bandwidth { .. } => share_rate(kind, 0),
            _ => {}
        }
    }
    state.fence = Some(fence);
}

/// Whether a constraint (`inflight_limit`, `bandwidth_limit`) lets a request through now;
/// true for every other kind of node. `fenced`: the node is in a fleet and its lease is not
/// certain to live (its `inflight_limit`s let nothing through).
fn lets_through(kind: &RtKind, fenced: bool) -> bool {
    match kind {
        RtKind::Inflight {
            max_requests,
            max_cost,
            requests,
            cost,
            share,
        } => !fenced && requests < max_requests.min(share) && cost < max_cost,
        // In a fleet a throttler passes nothing on no share (its overdraft would be one more
        // than the share allows) or past the fence.
        RtKind::Bandwidth { tokens, share, .. } => {
            *tokens >= 0.0 && (*share == i64::MAX || (!fenced && *share > 0))
        }
        RtKind::Queue { .. } | RtKind::Workload | RtKind::Priority | RtKind::Fair { .. } => true,
    }
}

fn compute_active(state: &mut State, n: usize, now: Instant) -> bool {
    refill(&mut state.nodes[n].kind, now);
    let kind = &state.nodes[n].kind;
    if let RtKind::Queue { queue, .. } = kind {
        return !queue.is_empty();
    }
    if !lets_through(kind, is_fenced(state, now)) {
        return false;
    }
    (0..state.nodes[n].children.len()).any(|i| {
        let c = state.nodes[n].children[i];
        is_active(state, c, now)
    })
}

/// Takes the next request below active node `n`: its id and cost (the `inflight_limit`s it
/// passes are its queue's [`RtNode::constraints`]).
fn dequeue(state: &mut State, n: usize, now: Instant) -> Option<(u64, i64)> {
    // Taken out while the subtree is walked (nothing below reads a parent's children) and put
    // back, instead of cloned: no allocation per level on the admission path.
    let children = std::mem::take(&mut state.nodes[n].children);
    let id = dequeue_below(state, n, &children, now);
    state.nodes[n].children = children;
    let (id, cost) = id?;
    count_dequeued(&mut state.nodes[n], cost);
    Some((id, cost))
}

/// What a request of `cost` passing node `node` changes there: its counters and throughput,
/// and a throttler's tokens (charged after: the last request may overdraw).
#[inline]
fn count_dequeued(node: &mut RtNode, cost: i64) {
    node.stats.dequeued_requests += 1;
    node.stats.dequeued_cost += cost;
    if let RtKind::Bandwidth {
        max_speed, tokens, ..
    } = &mut node.kind
    {
        *tokens -= cost as f64;
        if *tokens < 0.0 && *max_speed > 0.0 {
            node.stats.throttling += Duration::from_secs_f64(-*tokens / *max_speed);
        }
    }
}

/// Fair node `n` served a request of `cost` from `child`, which started at virtual time
/// `start`: the child's clock advances by cost / weight, the node's clock to `start`, and if
/// no child is active any more the busy period ends (whoever comes next starts level).
fn count_fair_served(
    state: &mut State,
    n: usize,
    child: usize,
    start: f64,
    cost: i64,
    any_active: bool,
) {
    let weight = state.nodes[child].weight;
    state.nodes[child].vruntime += cost as f64 / weight;
    let finish = state.nodes[child].vruntime;
    if let RtKind::Fair {
        system_vruntime,
        max_vruntime,
    } = &mut state.nodes[n].kind
    {
        *system_vruntime = start;
        *max_vruntime = max_vruntime.max(finish);
        if !any_active {
            *system_vruntime = *max_vruntime;
            state.nodes[n].stats.busy_periods += 1;
        }
    }
}

/// The grant of a request of `cost` arriving at leaf queue `leaf` of an idle tree (nothing
/// waits anywhere) whose path lets it through now — with exactly the effects enqueue and
/// dispatch would have, in one walk up the path instead of a queue entry, a walk down and a
/// channel. `None` when the tree is busy or a constraint on the path holds it: then it takes
/// the queue like any other. `now` is read only when a throttler is on the path.
fn grant_idle(state: &mut State, leaf: usize, cost: i64, now: Option<Instant>) -> Option<Arc<str>> {
    let fenced = now.is_some_and(|now| is_fenced(state, now));
    let mut at = Some(leaf);
    while let Some(n) = at {
        let node = &mut state.nodes[n];
        if let Some(now) = now {
            refill(&mut node.kind, now);
        }
        let open = match &node.kind {
            // Enqueue would refuse it (a limit of zero waiters): let it.
            RtKind::Queue { max_queued, .. } => *max_queued > 0,
            kind => lets_through(kind, fenced),
        };
        if !open {
            return None;
        }
        at = node.parent;
    }
    let mut child: Option<usize> = None;
    let mut at = Some(leaf);
    while let Some(n) = at {
        if let Some(c) = child {
            match state.nodes[n].kind {
                RtKind::Fair {
                    system_vruntime, ..
                } => {
                    let start = state.nodes[c].vruntime.max(system_vruntime);
                    state.nodes[c].vruntime = start;
                    count_fair_served(state, n, c, start, cost, false);
                }
                RtKind::Priority => {
                    // Its only active child is the top: no one is outranked, no credit kept.
                    for i in 0..state.nodes[n].children.len() {
                        let sibling = state.nodes[n].children[i];
                        state.nodes[sibling].credit = 0;
                    }
                }
                _ => {}
            }
        }
        count_dequeued(&mut state.nodes[n], cost);
        child = Some(n);
        at = state.nodes[n].parent;
    }
    hold(state, leaf, cost);
    state.next_id += 1;
    Some(workload_of(state, leaf))
}

/// Counts a grant of `cost` from leaf queue `leaf` on every `inflight_limit` of its path.
fn hold(state: &mut State, leaf: usize, cost: i64) {
    for i in 0..state.nodes[leaf].constraints.len() {
        let c = state.nodes[leaf].constraints[i];
        if let RtKind::Inflight {
            requests,
            cost: held,
            ..
        } = &mut state.nodes[c].kind
        {
            *requests += 1;
            *held += cost;
        }
    }
}

/// The workload whose leaf queue `leaf` is.
fn workload_of(state: &State, leaf: usize) -> Arc<str> {
    state.nodes[leaf]
        .owner
        .clone()
        .unwrap_or_else(|| Arc::from(""))
}

/// The request node `n` gives next, from its queue or the child its policy picks.
fn dequeue_below(
    state: &mut State,
    n: usize,
    children: &[usize],
    now: Instant,
) -> Option<(u64, i64)> {
    match &state.nodes[n].kind {
        RtKind::Queue { .. } => {
            let RtKind::Queue { queue, .. } = &mut state.nodes[n].kind else {
                unreachable!()
            };
            let id = queue.pop_front()?;
            // Counted out of its path now, so the nodes above see the tree as it is after
            // this dequeue (a fair node asks whether its busy period ended).
            count_pending(state, n, false);
            state.epoch += 1;
            let cost = state.waiting.get(&id).map_or(0, |w| w.cost);
            Some((id, cost))
        }
        RtKind::Workload | RtKind::Inflight { .. } | RtKind::Bandwidth { .. } => {
            let child = *children.first()?;
            dequeue(state, child, now)
        }
        RtKind::Priority => {
            let chosen = pick_by_priority(state, children, now)?;
            dequeue(state, chosen, now)
        }
        RtKind::Fair {
            system_vruntime, ..
        } => {
            let system = *system_vruntime;
            let mut best: Option<usize> = None;
            for c in children.iter().copied() {
                if !is_active(state, c, now) {
                    continue;
                }
                // A child that was idle earns no credit: it restarts at the node's clock.
                let v = state.nodes[c].vruntime.max(system);
                state.nodes[c].vruntime = v;
                if best.is_none_or(|b| v < state.nodes[b].vruntime) {
                    best = Some(c);
                }
            }
            let best = best?;
            let start = state.nodes[best].vruntime;
            let (id, cost) = dequeue(state, best, now)?;
            let any_active = children.iter().any(|&c| is_active(state, c, now));
            count_fair_served(state, n, best, start, cost, any_active);
            Some((id, cost))
        }
    }
}

/// The child of a priority node that gives the next request: the active child of highest
/// priority (lowest value), unless an outranked active child with an `outranked_share` has
/// earned a whole dequeue. Each outranked active child earns its share of every dequeue; a
/// child that is idle or not outranked keeps no credit (a share is a floor while outranked,
/// not a debt paid later). The richest child that has earned one dequeue takes it, ties to
/// the higher priority; with every share 0 this is ClickHouse's strict priority.
fn pick_by_priority(state: &mut State, children: &[usize], now: Instant) -> Option<usize> {
    let mut best: Option<usize> = None;
    for &c in children {
        if is_active(state, c, now) {
            if best.is_none_or(|b| state.nodes[c].priority < state.nodes[b].priority) {
                best = Some(c);
            }
        } else {
            state.nodes[c].credit = 0;
        }
    }
    let best = best?;
    let top = state.nodes[best].priority;
    let mut chosen = best;
    let mut richest = 0;
    for &c in children {
        if !is_active(state, c, now) {
            continue;
        }
        let node = &mut state.nodes[c];
        if node.priority == top || node.outranked_share == 0 {
            node.credit = 0;
            continue;
        }
        node.credit += node.outranked_share;
        if node.credit >= ONE_DEQUEUE && node.credit > richest {
            richest = node.credit;
            chosen = c;
        }
    }
    if chosen != best {
        state.nodes[chosen].credit -= ONE_DEQUEUE;
    }
    Some(chosen)
}

/// Brings node `node`'s smoothed throughput up to `now`: the cost dequeued since the last
/// reading, as a rate over the time between, blended in by how much of the window that time
/// is (an exponential moving average in continuous time: `1 - e^(-dt/window)`).
fn advance_rate(node: &mut RtNode, now: Instant) {
    let elapsed = now.saturating_duration_since(node.rate_at).as_secs_f64();
    if elapsed <= 0.0 {
        return;
    }
    let dequeued = (node.stats.dequeued_cost - node.rate_cost) as f64;
    let blend = 1.0 - (-elapsed / THROUGHPUT_WINDOW.as_secs_f64()).exp();
    node.rate += blend * (dequeued / elapsed - node.rate);
    node.rate_at = now;
    node.rate_cost = node.stats.dequeued_cost;
}

/// The earliest moment a throttler that holds back waiting requests has tokens again.
fn next_refill(state: &mut State, n: usize, now: Instant) -> Option<Instant> {
    if state.nodes[n].pending == 0 {
        return None;
    }
    let mut earliest = match state.nodes[n].kind {
        // Something waits below (pending > 0) behind the debt.
        RtKind::Bandwidth {
            max_speed, tokens, ..
        } if tokens < 0.0 && max_speed > 0.0 => {
            Some(now + Duration::from_secs_f64(-tokens / max_speed))
        }
        _ => None,
    };
    for i in 0..state.nodes[n].children.len() {
        let c = state.nodes[n].children[i];
        if let Some(at) = next_refill(state, c, now) {
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
        }
    }
    earliest
}

/// The future of a grant. Dropping it before the grant cancels the request; dropping it after
/// releases the grant.
#[derive(Debug)]
pub struct Acquire {
    /// The scheduler it was queued in (kept alive while the request may still be followed to
    /// a successor's queue).
    shared: Option<Arc<Shared>>,
    id: u64,
    rx: Option<oneshot::Receiver<Grant>>,
    /// The permit of a request granted inside `acquire`, or of unlimited access.
    ready: Option<Permit>,
    queue_path: Arc<str>,
}

impl Acquire {
    fn unlimited() -> Self {
        Acquire {
            shared: None,
            id: 0,
            rx: None,
            ready: Some(Permit { grant: None }),
            queue_path: Arc::from(""),
        }
    }

    /// The path of the queue the request waits in (empty for unlimited access), for telling a
    /// client where its query waits.
    pub fn queue_path(&self) -> &str {
        &self.queue_path
    }

    /// Moves the request, still waiting, to the queue of leaf `workload` of this resource, in
    /// arrival order: ahead of every request there that arrived after it, behind the rest.
    /// Nothing else changes (it keeps its cost; limits are checked when it is dequeued).
    /// `Ok(false)` when there is nothing to move — the request was granted or failed meanwhile,
    /// or `workload` has no node in this tree — so the caller decides (poll it, or ask again).
    /// Fails, changing nothing, for a workload that has children.
    pub fn move_to(&mut self, workload: &str) -> Result<bool> {
        let (Some(rx), Some(shared)) = (&self.rx, &self.shared) else {
            return Ok(false);
        };
        if !rx.is_empty() {
            return Ok(false);
        }
        let queue_path = &mut self.queue_path;
        let moved = with_waiting(shared.clone(), self.id, |shared, state, id| {
            let Some(target) = leaf_of(&state.leaves, workload)? else {
                return Ok(false);
            };
            let from = state.waiting[&id].leaf;
            if from == target {
                return Ok(true);
            }
            if let RtKind::Queue { queue, .. } = &mut state.nodes[from].kind {
                queue.retain(|&q| q != id);
            }
            count_pending(state, from, false);
            if let RtKind::Queue { queue, .. } = &mut state.nodes[target].kind {
                let at = queue.partition_point(|&q| q < id);
                queue.insert(at, id);
            }
            count_pending(state, target, true);
            if let Some(w) = state.waiting.get_mut(&id) {
                w.leaf = target;
            }
            *queue_path = state.nodes[target].path.clone();
            shared.dispatch(state);
            Ok(true)
        });
        moved.unwrap_or(Ok(false))
    }

    /// Whether the grant has been decided already (the first poll will be ready).
    pub fn is_granted(&mut self) -> bool {
        match &mut self.rx {
            None => true,
            Some(rx) => !rx.is_empty(),
        }
    }
}

impl Permit {
    fn granted(grant: Grant) -> Permit {
        Permit { grant: Some(grant) }
    }
}

impl Future for Acquire {
    type Output = Result<Permit>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(permit) = self.ready.take() {
            return Poll::Ready(Ok(permit));
        }
        let Some(rx) = self.rx.as_mut() else {
            // Polled again after it was ready (futures should not be): nothing more to give.
            return Poll::Ready(Err(Error::new(
                ErrorCode::InternalError,
                "A resource request was polled after it completed",
            )));
        };
        match Pin::new(rx).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(grant)) => {
                self.rx = None;
                self.shared = None;
                Poll::Ready(Ok(Permit::granted(grant)))
            }
            Poll::Ready(Err(_)) => {
                self.rx = None;
                Poll::Ready(Err(Error::new(
                    ErrorCode::InvalidSchedulerNode,
                    "Scheduler queue with resource request is about to be destructed",
                )))
            }
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        let (Some(mut rx), Some(shared)) = (self.rx.take(), self.shared.take()) else {
            return;
        };
        let cancelled = with_waiting(shared, self.id, |_, state, id| {
            let Some(waiting) = state.waiting.remove(&id) else {
                return;
            };
            let leaf = waiting.leaf;
            let node = &mut state.nodes[leaf];
            if let RtKind::Queue { queue, .. } = &mut node.kind {
                queue.retain(|&queued| queued != id);
            }
            node.stats.canceled_requests += 1;
            node.stats.canceled_cost += waiting.cost;
            count_pending(state, leaf, false);
        });
        if cancelled.is_some() {
            return;
        }
        // Granted before anyone polled: give it back where it was granted.
        if let Ok(grant) = rx.try_recv() {
            drop(Permit::granted(grant));
        }
    }
}

/// Runs `f` on the scheduler state that holds waiting request `id` of `shared` now, under its
/// lock, with the request's id there: the request is followed through the successors that
/// took it over. `None` when no scheduler holds it waiting (it was granted, or failed).
fn with_waiting<R>(
    mut shared: Arc<Shared>,
    mut id: u64,
    f: impl FnOnce(&Arc<Shared>, &mut State, u64) -> R,
) -> Option<R> {
    loop {
        let mut state = shared.lock();
        if state.waiting.contains_key(&id) {
            return Some(f(&shared, &mut state, id));
        }
        let next = state.successor.as_ref().and_then(|s| {
            let moved_to = *s.moved.get(&id)?;
            Some((s.shared.clone(), moved_to))
        });
        drop(state);
        let (successor, moved_to) = next?;
        shared = successor;
        id = moved_to;
    }
}

/// What a granted request holds until it is dropped.
#[derive(Debug)]
pub struct Permit {
    grant: Option<Grant>,
}

impl Permit {
    /// Whether the permit was granted without limits (the workload has no node here).
    pub fn is_unlimited(&self) -> bool {
        self.grant.is_none()
    }

    /// When its request left the queue it waited in, on the scheduler's clock (`None`: it
    /// did not wait, or was moved since).
    pub fn dequeued_at(&self) -> Option<Instant> {
        self.grant.as_ref().and_then(|g| g.dequeued)
    }

    /// The leaf workload the permit counts in (`None` when unlimited).
    pub fn workload(&self) -> Option<&str> {
        self.grant.as_ref().map(|g| &*g.workload)
    }

    /// The cost the permit holds.
    pub fn cost(&self) -> i64 {
        self.grant.as_ref().map_or(0, |g| g.cost)
    }

    /// Moves the permit to leaf `workload` of the same resource, without releasing it: it
    /// leaves the `inflight_limit`s of its old path and counts in those of the new one, even
    /// past their limits (new admissions there wait until it is back under). Constraints the
    /// two paths share never see it leave. Waiters the move frees are granted in order. A
    /// workload this resource does not know makes the permit unlimited.
    ///
    /// Fails (and changes nothing) for a workload that has children.
    pub fn move_to(&mut self, scheduler: &ResourceScheduler, workload: &str) -> Result<()> {
        let cost = self.grant.as_ref().map_or(1, |g| g.cost);
        self.regrant(scheduler, workload, cost)
    }

    /// Changes the cost the permit holds (a query's memory grows or shrinks): every constraint
    /// of its path counts the new cost; a smaller cost may let waiters through.
    pub fn set_cost(&mut self, scheduler: &ResourceScheduler, cost: i64) -> Result<()> {
        match self.workload().map(str::to_string) {
            Some(workload) => self.regrant(scheduler, &workload, cost),
            None => Ok(()),
        }
    }

    /// Counts the permit anew in `workload` at `cost` in the scheduler now in charge, then
    /// gives back what it held: in that order, so a constraint both count in never dips.
    fn regrant(&mut self, scheduler: &ResourceScheduler, workload: &str, cost: i64) -> Result<()> {
        let current = scheduler.current();
        let shared = current.shared;
        let new_grant = {
            let mut state = shared.lock();
            leaf_of(&state.leaves, workload)?.map(|leaf| {
                hold(&mut state, leaf, cost);
                Grant {
                    leaf,
                    cost,
                    workload: workload_of(&state, leaf),
                    owner: shared.clone(),
                    dequeued: None,
                }
            })
        };
        match std::mem::replace(&mut self.grant, new_grant) {
            Some(old) => old.owner.release(old.leaf, old.cost),
            None => {
                let mut state = shared.lock();
                shared.dispatch(&mut state);
            }
        }
        Ok(())
    }
}

/// The `inflight_limit` nodes on the path from `leaf` to the root: what a request granted
/// there counts against (the nodes a [`dequeue`] from it passes), root first.
fn constraints_of(state: &State, leaf: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = Some(leaf);
    while let Some(n) = at {
        if matches!(state.nodes[n].kind, RtKind::Inflight { .. }) {
            out.push(n);
        }
        at = state.nodes[n].parent;
    }
    out.reverse();
    out
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(grant) = self.grant.take() {
            grant.owner.release(grant.leaf, grant.cost);
        }
    }
}

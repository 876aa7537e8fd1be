//! Running a memory tree (reference §4.7): allocations admitted, grown, shrunk and evicted
//! through the space-shared nodes `allocation_queue`, `fair_allocation`,
//! `precedence_allocation` and `allocation_limit`.
//!
//! Each statement in a workload of the tree has one [`Allocation`] in its leaf's queue. One
//! asked for with a reservation (`reserve_memory`) is *pending* until the tree admits it; one of
//! size 0 runs at once. The tree admits one pending allocation at a time, top-down: a
//! `precedence_allocation` serves its child of lowest precedence that has a pending one, a
//! `fair_allocation` the child with the least `allocated / weight` (max-min fairness), a queue
//! its oldest. If the chosen one does not fit under every `allocation_limit` on its path it
//! waits (and so does everyone behind it), unless a victim can be evicted for it.
//!
//! Growth of a running allocation ([`Allocation::try_grow`]) is granted when it fits; when it
//! does not, victims are chosen under the limits it would pass until it fits, and killed (each
//! owner's kill callback gets RESOURCE_LIMIT_EXCEEDED, and it frees what it held as it stops) —
//! all of them, or none if they cannot make room together (the growth then fails; see the
//! deviation below). Victims, by ClickHouse's rules: in a queue the running allocation with the
//! largest key, its size plus what it asks for (so a growing allocation that is the largest in
//! its own queue picks itself, and fails); in a `fair_allocation` the
//! child with the largest `allocated / weight`; in a `precedence_allocation` the child of
//! highest precedence value. A pending allocation never evicts a running one of its own
//! workload, nor of an equal precedence; lower precedence never evicts higher.
//!
//! Deviation, forced by the engine: DataFusion grows memory synchronously and cannot wait, so
//! a growth that evicts a victim is granted at once, and the limit is over by at most the
//! victims' sizes until they have stopped (ClickHouse blocks the growing thread meanwhile). A
//! growth with no victim to evict fails, and the statement spills or fails.
//!
//! Invariants:
//! - `allocated` of every node is the sum of the sizes of the running allocations below it.
//! - Dropping a [`PendingAllocation`] removes it from its queue; dropping an [`Allocation`]
//!   returns everything it held. A catalog change ([`MemoryScheduler::succeed`]) hands every
//!   allocation to the new tree's leaf of its workload (pending ones in order; a pending one
//!   whose workload has no queue any more fails with INVALID_SCHEDULER_NODE).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use sluice_sql::{Error, ErrorCode, Result};
use tokio::sync::oneshot;

use crate::runtime::{leaf_of, HashMap, Leaves};
use crate::tree::{Node, NodeKind, ResourceTree};

/// Called (outside the scheduler's lock) with the error a killed allocation's statement
/// should fail with.
pub type KillSwitch = Arc<dyn Fn(Error) + Send + Sync>;

/// Counters of one space-shared node, the live columns of `system.scheduler`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SpaceStats {
    pub admits: u64,
    pub removes: u64,
    pub increases: u64,
    pub decreases: u64,
    pub killers: u64,
    pub victims: u64,
    /// Allocations refused at their queue (allocation_queue only).
    pub rejects: u64,
}

/// One node's live state.
#[derive(Debug, Clone, PartialEq)]
pub struct SpaceNodeState {
    pub path: String,
    pub type_name: &'static str,
    /// Bytes held by the running allocations below.
    pub allocated: i64,
    /// Running allocations below.
    pub allocations: u64,
    /// Pending allocations waiting in the queue (allocation_queue only).
    pub pending: Option<u64>,
    pub stats: SpaceStats,
}

#[derive(Debug)]
enum Kind {
    Workload,
    Queue {
        max_queued: i64,
        pending: VecDeque<u64>,
    },
    Limit {
        max: i64,
    },
    Precedence,
    Fair,
}

#[derive(Debug)]
struct SpaceNode {
    path: String,
    type_name: &'static str,
    parent: Option<usize>,
    children: Vec<usize>,
    weight: f64,
    precedence: i64,
    kind: Kind,
    allocated: i64,
    running: u64,
    /// Pending allocations anywhere below.
    waiting: u64,
    stats: SpaceStats,
}

struct Alloc {
    workload: String,
    /// The leaf queue it lives in; `None` for an allocation of a workload the tree lost.
    leaf: Option<usize>,
    size: i64,
    /// `Some` while pending: what it asked for, and where to say it was admitted.
    pending: Option<(i64, oneshot::Sender<()>)>,
    killed: bool,
    kill: KillSwitch,
}

struct State {
    nodes: Vec<SpaceNode>,
    leaves: Leaves,
    allocs: HashMap<u64, Alloc>,
    next_id: u64,
    /// Strong, as in the time-shared runtime: an allocation of this version must reach the
    /// version holding it now, even once no snapshot holds the versions between.
    successor: Option<Arc<Shared>>,
}

struct Shared {
    resource: String,
    state: Mutex<State>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryScheduler")
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

/// Admission and accounting for one memory resource, running its compiled tree.
#[derive(Debug, Clone)]
pub struct MemoryScheduler {
    shared: Arc<Shared>,
}

/// Kills to deliver once the lock is released.
type Kills = Vec<(KillSwitch, Error)>;

impl MemoryScheduler {
    pub fn new(tree: &ResourceTree) -> MemoryScheduler {
        let mut state = State {
            nodes: Vec::new(),
            leaves: Leaves::default(),
            allocs: HashMap::default(),
            next_id: 1,
            successor: None,
        };
        if let Some(root) = &tree.root {
            add(&mut state, root, "", None, None);
        }
        MemoryScheduler {
            shared: Arc::new(Shared {
                resource: tree.resource.clone(),
                state: Mutex::new(state),
            }),
        }
    }

    pub fn resource(&self) -> &str {
        &self.shared.resource
    }

    /// The scheduler now in charge (this one, or the last of its successors).
    fn current(&self) -> Arc<Shared> {
        let mut at = self.shared.clone();
        loop {
            let next = at.lock().successor.clone();
            match next {
                Some(next) => at = next,
                None => return at,
            }
        }
    }

    /// Whether `workload` has a node in this tree.
    pub fn has_workload(&self, workload: &str) -> bool {
        self.current().lock().leaves.contains_key(workload)
    }

    /// Whether `workload` is in this tree but has children (allocations cannot live there).
    pub fn is_inner_workload(&self, workload: &str) -> bool {
        matches!(self.current().lock().leaves.get(workload), Some(None))
    }

    /// Asks for an allocation of `reserve` bytes in leaf `workload`. Errors at once: the
    /// workload has children (INVALID_SCHEDULER_NODE), the reservation exceeds a limit on its
    /// path (RESOURCE_LIMIT_EXCEEDED), or the queue holds `max_waiting_queries` pending ones
    /// (SERVER_OVERLOADED). An unknown workload gets an allocation counted nowhere.
    pub fn allocate(
        &self,
        workload: &str,
        reserve: i64,
        kill: KillSwitch,
    ) -> Result<PendingAllocation> {
        let shared = self.current();
        let mut state = shared.lock();
        let leaf = leaf_of(&state.leaves, workload)?;
        let reserve = reserve.max(0);
        let id = state.next_id;
        state.next_id += 1;
        let mut alloc = Alloc {
            workload: workload.to_string(),
            leaf,
            size: 0,
            pending: None,
            killed: false,
            kill,
        };
        let Some(leaf) = leaf.filter(|_| reserve > 0) else {
            if let Some(leaf) = leaf {
                for n in path(&state, leaf) {
                    state.nodes[n].running += 1;
                    state.nodes[n].stats.admits += 1;
                }
            }
            state.allocs.insert(id, alloc);
            drop(state);
            return Ok(PendingAllocation {
                shared: Some(shared),
                id,
                admitted: None,
            });
        };
        let limit = path(&state, leaf)
            .into_iter()
            .filter_map(|n| match state.nodes[n].kind {
                Kind::Limit { max } => Some(max),
                _ => None,
            })
            .min();
        if let Some(limit) = limit.filter(|&l| reserve > l) {
            state.nodes[leaf].stats.rejects += 1;
            return Err(Error::new(
                ErrorCode::ResourceLimitExceeded,
                format!("Workload '{workload}' allocation of size {reserve} exceeds the limit of {limit}"),
            ));
        }
        let Kind::Queue {
            max_queued,
            pending,
        } = &mut state.nodes[leaf].kind
        else {
            unreachable!("leaves map to queues");
        };
        if pending.len() as i64 >= *max_queued {
            let message = format!(
                "Workload '{workload}' limit `max_waiting_queries` has been reached: {} of {max_queued}",
                pending.len()
            );
            state.nodes[leaf].stats.rejects += 1;
            return Err(Error::new(ErrorCode::ServerOverloaded, message));
        }
        pending.push_back(id);
        for n in path(&state, leaf) {
            state.nodes[n].waiting += 1;
        }
        let (tx, rx) = oneshot::channel();
        alloc.pending = Some((reserve, tx));
        state.allocs.insert(id, alloc);
        let kills = admit_pending(&mut state, &self.shared.resource);
        drop(state);
        deliver(kills);
        Ok(PendingAllocation {
            shared: Some(shared),
            id,
            admitted: Some(rx),
        })
    }

    /// The live state of every node, ordered by path.
    pub fn nodes(&self) -> Vec<SpaceNodeState> {
        let state = self.shared.lock();
        let mut out: Vec<SpaceNodeState> = state
            .nodes
            .iter()
            .map(|n| SpaceNodeState {
                path: n.path.clone(),
                type_name: n.type_name,
                allocated: n.allocated,
                allocations: n.running,
                pending: match &n.kind {
                    Kind::Queue { pending, .. } => Some(pending.len() as u64),
                    _ => None,
                },
                stats: n.stats.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// Builds the scheduler of `tree`, the new version of this resource's tree, and hands it
    /// every allocation: running ones count in their workload's new leaf (or nowhere, if it
    /// has none), pending ones wait in its new queue in order (or fail with
    /// INVALID_SCHEDULER_NODE). From then on this scheduler forwards to the new one.
    pub fn succeed(&self, tree: &ResourceTree) -> MemoryScheduler {
        let next = MemoryScheduler::new(tree);
        let mut old = self.shared.lock();
        let mut new = next.shared.lock();
        new.next_id = old.next_id;
        let mut ids: Vec<u64> = old.allocs.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let Some(mut alloc) = old.allocs.remove(&id) else {
                continue;
            };
            let leaf = new.leaves.get(&alloc.workload).copied().flatten();
            alloc.leaf = leaf;
            match (&alloc.pending, leaf) {
                // No queue for it any more: dropping its sender fails the wait.
                (Some(_), None) => continue,
                (Some(_), Some(leaf)) => {
                    if let Kind::Queue { pending, .. } = &mut new.nodes[leaf].kind {
                        pending.push_back(id);
                    }
                    for n in path(&new, leaf) {
                        new.nodes[n].waiting += 1;
                    }
                }
                (None, Some(leaf)) => {
                    for n in path(&new, leaf) {
                        new.nodes[n].allocated = new.nodes[n].allocated.saturating_add(alloc.size);
                        new.nodes[n].running += 1;
                    }
                }
                (None, None) => {}
            }
            new.allocs.insert(id, alloc);
        }
        old.nodes.iter_mut().for_each(|n| {
            n.allocated = 0;
            n.running = 0;
            n.waiting = 0;
            if let Kind::Queue { pending, .. } = &mut n.kind {
                pending.clear();
            }
        });
        old.successor = Some(next.shared.clone());
        let kills = admit_pending(&mut new, &next.shared.resource);
        drop(new);
        drop(old);
        deliver(kills);
        next
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn add(
    state: &mut State,
    node: &Node,
    prefix: &str,
    parent: Option<usize>,
    workload: Option<&str>,
) -> usize {
    let path = format!("{prefix}/{}", node.basename);
    let kind = match &node.kind {
        NodeKind::AllocationQueue { max_queued } | NodeKind::Fifo { max_queued } => Kind::Queue {
            max_queued: *max_queued,
            pending: VecDeque::new(),
        },
        NodeKind::AllocationLimit { max_allocated } => Kind::Limit {
            max: *max_allocated,
        },
        NodeKind::PrecedenceAllocation | NodeKind::Priority => Kind::Precedence,
        NodeKind::FairAllocation | NodeKind::Fair => Kind::Fair,
        _ => Kind::Workload,
    };
    let index = state.nodes.len();
    state.nodes.push(SpaceNode {
        path: path.clone(),
        type_name: node.kind.type_name(),
        parent,
        children: Vec::new(),
        weight: node.weight,
        precedence: node.precedence,
        kind,
        allocated: 0,
        running: 0,
        waiting: 0,
        stats: SpaceStats::default(),
    });
    let own = if node.kind == NodeKind::Workload {
        state.leaves.insert(node.basename.clone(), None);
        Some(node.basename.as_str())
    } else {
        workload
    };
    for child in &node.children {
        let c = add(state, child, &path, Some(index), own);
        state.nodes[index].children.push(c);
    }
    if matches!(state.nodes[index].kind, Kind::Queue { .. }) {
        if let Some(w) = own {
            state.leaves.insert(w.to_string(), Some(index));
        }
    }
    index
}

/// The nodes from `leaf` up to the root.
fn path(state: &State, leaf: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = Some(leaf);
    while let Some(n) = at {
        out.push(n);
        at = state.nodes[n].parent;
    }
    out
}

/// Whether the subtree of `n` holds leaf `leaf`.
fn holds(state: &State, n: usize, leaf: usize) -> bool {
    path(state, leaf).contains(&n)
}

fn deliver(kills: Kills) {
    for (kill, error) in kills {
        kill(error);
    }
}

/// The pending allocation the tree would admit next, top-down (limits not checked).
fn next_pending(state: &State, n: usize) -> Option<u64> {
    let node = &state.nodes[n];
    if node.waiting == 0 {
        return None;
    }
    match &node.kind {
        Kind::Queue { pending, .. } => pending.front().copied(),
        Kind::Precedence => node
            .children
            .iter()
            .filter(|&&c| state.nodes[c].waiting > 0)
            .min_by_key(|&&c| state.nodes[c].precedence)
            .and_then(|&c| next_pending(state, c)),
        Kind::Fair => node
            .children
            .iter()
            .filter(|&&c| state.nodes[c].waiting > 0)
            .min_by(|&&a, &&b| usage(state, a).total_cmp(&usage(state, b)))
            .and_then(|&c| next_pending(state, c)),
        Kind::Workload | Kind::Limit { .. } => {
            node.children.iter().find_map(|&c| next_pending(state, c))
        }
    }
}

fn usage(state: &State, n: usize) -> f64 {
    state.nodes[n].allocated as f64 / state.nodes[n].weight.max(f64::MIN_POSITIVE)
}

/// The outermost `allocation_limit` on `leaf`'s path that `extra` more bytes would pass,
/// counting what killed allocations below it will free as free already.
fn violated(state: &State, leaf: usize, extra: i64) -> Option<usize> {
    path(state, leaf)
        .into_iter()
        .rev()
        .find(|&n| match state.nodes[n].kind {
            // What victims will free is only counted when the limit is reached (it scans).
            Kind::Limit { max } => {
                let allocated = state.nodes[n].allocated;
                allocated.saturating_add(extra) > max
                    && allocated
                        .saturating_sub(freeing(state, n))
                        .saturating_add(extra)
                        > max
            }
            _ => false,
        })
}

/// Bytes held by killed allocations under `n` (freed as they stop).
fn freeing(state: &State, n: usize) -> i64 {
    state
        .allocs
        .values()
        .filter(|a| a.killed && a.pending.is_none())
        .filter(|a| a.leaf.is_some_and(|l| holds(state, n, l)))
        .fold(0i64, |sum, a| sum.saturating_add(a.size))
}

/// Who asks for room: a pending allocation being admitted, or running allocation `id`
/// growing by `bytes`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Killer {
    Pending,
    Growing { id: u64, bytes: i64 },
}

/// The allocation under node `n` to evict for a killer in `killer_leaf`, by the rules in the
/// module docs. It may be the growing killer itself (its own key, size + growth, is the
/// largest in its queue): then nothing is evicted and the growth fails.
fn victim(state: &State, n: usize, killer_leaf: usize, killer: Killer) -> Option<u64> {
    let pending = killer == Killer::Pending;
    let node = &state.nodes[n];
    let running = |c: usize| state.nodes[c].allocated.saturating_sub(freeing(state, c)) > 0;
    match &node.kind {
        Kind::Queue { .. } => {
            if pending && n == killer_leaf {
                return None; // a pending allocation never evicts its own workload's
            }
            // ClickHouse's fair_key: what an allocation holds plus what it asks for.
            let key = |id: u64, size: i64| match killer {
                Killer::Growing { id: k, bytes } if k == id => size.saturating_add(bytes),
                _ => size,
            };
            state
                .allocs
                .iter()
                .filter(|(_, a)| a.leaf == Some(n) && a.pending.is_none() && !a.killed)
                .map(|(id, a)| (*id, key(*id, a.size)))
                .filter(|&(_, key)| key > 0)
                .max_by_key(|&(id, key)| (key, std::cmp::Reverse(id)))
                .map(|(id, _)| id)
        }
        Kind::Workload | Kind::Limit { .. } => node
            .children
            .iter()
            .find_map(|&c| victim(state, c, killer_leaf, killer)),
        Kind::Fair => {
            let own = node
                .children
                .iter()
                .copied()
                .find(|&c| holds(state, c, killer_leaf));
            let candidates: Vec<usize> = node
                .children
                .iter()
                .copied()
                .filter(|&c| running(c))
                // A pending allocation never evicts a running one of another child.
                .filter(|&c| !pending || own.is_none() || own == Some(c))
                .collect();
            let c = candidates
                .into_iter()
                .max_by(|&a, &b| usage(state, a).total_cmp(&usage(state, b)))?;
            victim(state, c, killer_leaf, killer)
        }
        Kind::Precedence => {
            let own = node
                .children
                .iter()
                .copied()
                .find(|&c| holds(state, c, killer_leaf));
            let c = node
                .children
                .iter()
                .copied()
                .filter(|&c| running(c))
                .max_by_key(|&c| state.nodes[c].precedence)?;
            if let Some(own) = own {
                let (mine, theirs) = (state.nodes[own].precedence, state.nodes[c].precedence);
                // Lower precedence never evicts higher; a pending one not an equal one.
                if theirs < mine || (pending && theirs == mine && c != own) {
                    return None;
                }
            }
            victim(state, c, killer_leaf, killer)
        }
    }
}

/// Marks `victim` killed on behalf of `killer`, counting both; returns the kill to deliver.
fn kill(
    state: &mut State,
    resource: &str,
    limit: usize,
    victim: u64,
    killer_leaf: usize,
) -> Option<(KillSwitch, Error)> {
    let max = match state.nodes[limit].kind {
        Kind::Limit { max } => max,
        _ => 0,
    };
    let allocated = state.nodes[limit].allocated;
    let workload = state.allocs.get(&victim)?.workload.clone();
    let victim_leaf = state.allocs.get(&victim)?.leaf?;
    for n in path(state, killer_leaf) {
        state.nodes[n].stats.killers += 1;
    }
    for n in path(state, victim_leaf) {
        state.nodes[n].stats.victims += 1;
    }
    let alloc = state.allocs.get_mut(&victim)?;
    alloc.killed = true;
    let limit_path = &state.nodes[limit].path;
    let error = Error::new(
        ErrorCode::ResourceLimitExceeded,
        format!(
            "Workload '{workload}' limit is hit for resource '{resource}': {allocated} bytes allocated under {limit_path} of {max}; this statement was evicted to make room"
        ),
    );
    Some((alloc.kill.clone(), error))
}

/// Admits pending allocations while the next one fits; evicts for it when the rules allow.
fn admit_pending(state: &mut State, resource: &str) -> Kills {
    let mut kills = Vec::new();
    if state.nodes.is_empty() {
        return kills;
    }
    while let Some(id) = next_pending(state, 0) {
        let (leaf, reserve) = {
            let a = &state.allocs[&id];
            (
                a.leaf.expect("pending allocations have a queue"),
                a.pending.as_ref().map_or(0, |p| p.0),
            )
        };
        if let Some(limit) = violated(state, leaf, reserve) {
            if let Some(v) = victim(state, limit, leaf, Killer::Pending) {
                kills.extend(kill(state, resource, limit, v, leaf));
            }
            break; // it waits for memory to free, and so does everyone behind it
        }
        let Some(alloc) = state.allocs.get_mut(&id) else {
            break;
        };
        let Some((_, admitted)) = alloc.pending.take() else {
            break;
        };
        alloc.size = reserve;
        if let Kind::Queue { pending, .. } = &mut state.nodes[leaf].kind {
            pending.retain(|&p| p != id);
        }
        for n in path(state, leaf) {
            let node = &mut state.nodes[n];
            node.waiting = node.waiting.saturating_sub(1);
            node.allocated = node.allocated.saturating_add(reserve);
            node.running += 1;
            node.stats.admits += 1;
        }
        // A receiver gone means its statement gave up: the allocation is dropped by its
        // PendingAllocation, which finds it running and removes it.
        let _ = admitted.send(());
    }
    kills
}

/// Runs `f` on the state holding allocation `id` now (following successors).
fn with_alloc<R>(
    mut shared: Arc<Shared>,
    id: u64,
    f: impl FnOnce(&Shared, &mut State) -> R,
) -> Option<R> {
    loop {
        let mut state = shared.lock();
        if state.allocs.contains_key(&id) {
            return Some(f(&shared, &mut state));
        }
        let next = state.successor.clone();
        drop(state);
        shared = next?;
    }
}

/// Removes allocation `id`: out of its queue if pending, its bytes given back if running.
fn remove(shared: &Shared, state: &mut State, id: u64) -> Kills {
    {
        let Some(alloc) = state.allocs.remove(&id) else {
            return Vec::new();
        };
        if let Some(leaf) = alloc.leaf {
            if alloc.pending.is_some() {
                if let Kind::Queue { pending, .. } = &mut state.nodes[leaf].kind {
                    pending.retain(|&p| p != id);
                }
                for n in path(state, leaf) {
                    state.nodes[n].waiting = state.nodes[n].waiting.saturating_sub(1);
                }
            } else {
                for n in path(state, leaf) {
                    let node = &mut state.nodes[n];
                    node.allocated = node.allocated.saturating_sub(alloc.size);
                    node.running = node.running.saturating_sub(1);
                    node.stats.removes += 1;
                }
            }
        }
        admit_pending(state, &shared.resource)
    }
}

/// An allocation waiting for admission. Dropping it leaves the queue.
#[derive(Debug)]
pub struct PendingAllocation {
    shared: Option<Arc<Shared>>,
    id: u64,
    admitted: Option<oneshot::Receiver<()>>,
}

impl PendingAllocation {
    /// Whether it has been admitted already (the first poll will be ready).
    pub fn is_admitted(&mut self) -> bool {
        self.admitted.as_mut().is_none_or(|rx| !rx.is_empty())
    }
}

impl Future for PendingAllocation {
    type Output = Result<Allocation>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(rx) = self.admitted.as_mut() {
            match Pin::new(rx).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => {
                    self.admitted = None;
                    self.shared = None;
                    return Poll::Ready(Err(Error::new(
                        ErrorCode::InvalidSchedulerNode,
                        "Queue for pending allocation is about to be destructed",
                    )));
                }
            }
        }
        self.admitted = None;
        Poll::Ready(Ok(Allocation {
            shared: self.shared.take(),
            id: self.id,
        }))
    }
}

impl Drop for PendingAllocation {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let kills = with_alloc(shared, self.id, |shared, state| {
                remove(shared, state, self.id)
            });
            deliver(kills.unwrap_or_default());
        }
    }
}

/// A running allocation: a statement's memory in its workload. Dropping it gives back all.
pub struct Allocation {
    shared: Option<Arc<Shared>>,
    id: u64,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation").field("id", &self.id).finish()
    }
}

impl Allocation {
    /// Grows the allocation by `bytes` if every limit on its path allows it, or if a victim
    /// can be evicted to make room (see the module docs); fails with RESOURCE_LIMIT_EXCEEDED
    /// otherwise, and once this allocation was itself evicted.
    pub fn try_grow(&self, bytes: i64) -> Result<()> {
        self.change(bytes, true)
    }

    /// Grows without asking (memory already taken).
    pub fn grow(&self, bytes: i64) {
        let _ = self.change(bytes, false);
    }

    /// Gives back `bytes`; pending allocations that now fit are admitted.
    pub fn shrink(&self, bytes: i64) {
        let _ = self.change(-bytes, false);
    }

    /// The bytes it holds.
    pub fn size(&self) -> i64 {
        let Some(shared) = self.shared.clone() else {
            return 0;
        };
        with_alloc(shared, self.id, |_, state| state.allocs[&self.id].size).unwrap_or(0)
    }

    /// Moves the allocation, running, to leaf `workload` with everything it holds: its bytes
    /// leave its old path and count on the new one, even past the limits there (new
    /// admissions wait until it is back under), as a moved query slot does. A workload the tree
    /// does not know leaves it counted nowhere. Fails, changing nothing, for a workload with
    /// children.
    pub fn move_to(&self, workload: &str) -> Result<()> {
        let Some(shared) = self.shared.clone() else {
            return Ok(());
        };
        let id = self.id;
        let moved = with_alloc(shared, id, |shared, state| {
            let to = leaf_of(&state.leaves, workload)?;
            let (from, size) = {
                let a = &state.allocs[&id];
                (a.leaf, a.size)
            };
            if let Some(to) = to {
                for n in path(state, to) {
                    state.nodes[n].allocated = state.nodes[n].allocated.saturating_add(size);
                    state.nodes[n].running += 1;
                }
            }
            if let Some(from) = from {
                for n in path(state, from) {
                    state.nodes[n].allocated = state.nodes[n].allocated.saturating_sub(size);
                    state.nodes[n].running = state.nodes[n].running.saturating_sub(1);
                }
            }
            if let Some(a) = state.allocs.get_mut(&id) {
                a.leaf = to;
                a.workload = workload.to_string();
            }
            Ok(admit_pending(state, &shared.resource))
        });
        match moved {
            Some(Ok(kills)) => {
                deliver(kills);
                Ok(())
            }
            Some(Err(e)) => Err(e),
            None => Ok(()),
        }
    }

    fn change(&self, bytes: i64, checked: bool) -> Result<()> {
        let Some(shared) = self.shared.clone() else {
            return Ok(());
        };
        let id = self.id;
        let outcome = with_alloc(shared, id, |shared, state| {
            let mut kills = Vec::new();
            let (leaf, killed, workload) = {
                let a = &state.allocs[&id];
                (a.leaf, a.killed, a.workload.clone())
            };
            if checked && killed {
                return (
                    Err(Error::new(
                        ErrorCode::ResourceLimitExceeded,
                        format!("Workload '{workload}': this statement was evicted to make room"),
                    )),
                    kills,
                );
            }
            if let (true, Some(leaf)) = (checked && bytes > 0, leaf) {
                // The victims that make room, chosen all before any is killed: growth is
                // granted at once (see the module docs), so if they cannot make room together
                // none dies for nothing and the growth fails.
                let killer = Killer::Growing { id, bytes };
                let mut chosen: Vec<(usize, u64)> = Vec::new();
                let blocked = loop {
                    let Some(limit) = violated(state, leaf, bytes) else {
                        break None;
                    };
                    match victim(state, limit, leaf, killer) {
                        Some(v) if v != id => {
                            if let Some(a) = state.allocs.get_mut(&v) {
                                a.killed = true;
                            }
                            chosen.push((limit, v));
                        }
                        _ => break Some(limit),
                    }
                };
                for (_, v) in &chosen {
                    if let Some(a) = state.allocs.get_mut(v) {
                        a.killed = false;
                    }
                }
                if let Some(limit) = blocked {
                    let (allocated, max) = match state.nodes[limit].kind {
                        Kind::Limit { max } => (state.nodes[limit].allocated, max),
                        _ => (0, 0),
                    };
                    return (
                        Err(Error::new(
                            ErrorCode::ResourceLimitExceeded,
                            format!(
                                "Workload '{workload}' limit is hit for resource '{}': {allocated} + {bytes} bytes > {max} under {}",
                                shared.resource, state.nodes[limit].path
                            ),
                        )),
                        kills,
                    );
                }
                for (limit, v) in chosen {
                    kills.extend(kill(state, &shared.resource, limit, v, leaf));
                }
            }
            if let Some(a) = state.allocs.get_mut(&id) {
                a.size = a.size.saturating_add(bytes);
            }
            if let Some(leaf) = leaf {
                for n in path(state, leaf) {
                    let node = &mut state.nodes[n];
                    node.allocated = node.allocated.saturating_add(bytes);
                    if bytes > 0 {
                        node.stats.increases += 1;
                    } else if bytes < 0 {
                        node.stats.decreases += 1;
                    }
                }
            }
            if bytes < 0 {
                kills.extend(admit_pending(state, &shared.resource));
            }
            (Ok(()), kills)
        });
        let (result, kills) = outcome.unwrap_or((Ok(()), Vec::new()));
        deliver(kills);
        result
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let kills = with_alloc(shared, self.id, |shared, state| {
                remove(shared, state, self.id)
            });
            deliver(kills.unwrap_or_default());
        }
    }
}

//! This node in a fleet (`[cluster]`): joining it, following its catalog, and keeping this
//! node's shares of the QUERY resource's limits.
//!
//! The shares. Every `inflight_limit` of the QUERY tree (`max_concurrent_queries`) holds
//! across the fleet: each node admits locally, without a round trip, within the share of the
//! limit that etcd stored for it (`sluice_cluster::ShareBook`, whose invariant is that a
//! limit's shares never sum above it), and only while its lease certainly lives (the
//! scheduler's `Fence`). The keeper here moves the shares with demand, as often as every
//! [`TICK`] or at once on a change of what the fleet published:
//!
//! 1. it publishes this node's demand (per leaf workload: queries waiting and running,
//!    capped at the largest limit: beyond it more demand changes nothing; and whether any
//!    waits) when it changed — at once while anyone in the fleet has queries waiting, at most
//!    every [`QUIET_PUBLISH`] while nobody does;
//! 2. it divides each limit over the live nodes by everyone's demand
//!    (`sluice_sched::fleet::allot`: every node reaches the same division);
//! 3. a share above its target is lowered: first in the scheduler (nothing more is admitted
//!    beyond the target), then in etcd, to no less than the queries it still has running;
//!    a share below its target grows: first in etcd (a transaction within the limit), then
//!    in the scheduler. After a round that failed or was cut short, every share is settled
//!    (made certain in etcd) before any is raised in the scheduler.
//!
//! So at every moment, for every limit: queries admitted on a node ≤ its share in etcd, and
//! the shares in etcd ≤ the limit. A lost lease takes the node's shares with it (etcd deletes
//! its keys); the node's fence passed before that, and it starts again from no share under a
//! new lease.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_cluster::{FleetView, LeaseState, ShareBook};
use sluice_sched::fleet::{allot, Demand};

use crate::state::Shared;

/// How often the keeper looks at local demand when nothing else woke it.
pub const TICK: Duration = Duration::from_millis(20);

/// How often at most a node publishes a change of its demand while nobody in the fleet has
/// a query waiting.
const QUIET_PUBLISH: Duration = Duration::from_millis(250);

/// How long the odd slots of an uneven division stay on the same nodes (see [`turn`]).
const TURN: Duration = Duration::from_secs(2);

/// The division's turn: the wall clock in [`TURN`]s, which every node of the fleet reads
/// alike (clocks a little apart disagree for a moment around a change of turn: that costs a
/// share move, never the limit).
fn turn() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / TURN.as_secs())
}

/// The longest one round of the keeper waits for etcd.
const ROUND_LIMIT: Duration = Duration::from_secs(1);

/// Joins the fleet `[cluster]` names (nothing without one), as reachable at `address`;
/// `serve` does it unless it was done before (the binary joins before it announces itself).
pub async fn join_fleet(shared: &Arc<Shared>, address: &str) -> sluice_sql::Result<()> {
    let Some(options) = &shared.options.cluster else {
        return Ok(());
    };
    if shared.fleet.get().is_some() {
        return Ok(());
    }
    let membership = sluice_cluster::Membership::join(options.clone(), address).await?;
    // Every QUERY scheduler from now on admits within shares (none yet: the keeper grants).
    let fence = sluice_sched::Fence::new();
    if shared.fleet_fence.set(fence.clone()).is_ok() {
        let snapshot = shared.snapshot();
        if let Some((_, scheduler)) = snapshot.query_slot() {
            scheduler.join_fleet(fence.clone());
        }
    }
    // The fleet's catalog replaces the data dir's: read whole, then followed.
    let store = membership.catalog();
    let stored = store.load().await?;
    shared.adopt_fleet_catalog(&stored).await?;
    let _ = shared.fleet_catalog.set(crate::state::FleetCatalog::new(
        store.clone(),
        stored.revision,
    ));
    let book = membership.share_book();
    let alive = membership.alive();
    let _ = shared.fleet.set(membership);
    let (view_tx, view) = tokio::sync::watch::channel(FleetView::default());
    let _ = shared.fleet_view.set(view.clone());
    tokio::spawn(follow_fleet_catalog(Arc::downgrade(shared), store));
    tokio::spawn(keep_shares(
        Arc::downgrade(shared),
        book,
        alive,
        fence,
        view_tx,
        view,
    ));
    Ok(())
}

/// Applies the fleet's catalog changes as etcd reports them, for as long as the server runs;
/// when following breaks (etcd unreachable, a change this node cannot apply), the catalog is
/// read whole again and followed from there.
async fn follow_fleet_catalog(shared: Weak<Shared>, store: sluice_cluster::CatalogStore) {
    loop {
        let Some(from) = shared
            .upgrade()
            .and_then(|s| s.fleet_catalog.get().map(|f| *f.applied.borrow()))
        else {
            return;
        };
        let (sender, mut changes) = tokio::sync::mpsc::channel(64);
        let follow = store.follow(from, sender);
        tokio::pin!(follow);
        let broke = loop {
            tokio::select! {
                ended = &mut follow => break ended.err(),
                Some(followed) = changes.recv() => {
                    let Some(shared) = shared.upgrade() else { return };
                    if let Err(e) = shared.apply_followed(&followed).await {
                        break Some(e);
                    }
                }
            }
        };
        if let Some(e) = broke {
            tracing::warn!("following the fleet's catalog: {e}; reading it whole again");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match store.load().await {
            Ok(stored) => match shared.adopt_fleet_catalog(&stored).await {
                Ok(()) => {
                    if let Some(fleet) = shared.fleet_catalog.get() {
                        fleet.applied.send_replace(stored.revision);
                    }
                }
                Err(e) => tracing::error!("the fleet's catalog cannot be adopted: {e}"),
            },
            Err(e) => tracing::warn!("reading the fleet's catalog: {e}"),
        }
    }
}

/// What the keeper remembers between rounds.
struct Keeper {
    book: ShareBook,
    fence: Arc<sluice_sched::Fence>,
    /// The lease the shares in `held` are under.
    lease: i64,
    /// This node's shares as stored in etcd, by workload, with their keys' revisions (what
    /// its next write of each compares).
    held: BTreeMap<String, (i64, i64)>,
    /// The demand last published, and when.
    published: Option<String>,
    published_at: Option<tokio::time::Instant>,
    /// When each workload last had a query waiting here.
    waited: BTreeMap<String, tokio::time::Instant>,
    /// A write of a share may have been stored unbeknown (its answer was lost, or a round
    /// was cut short): settle every share before using any.
    unsure: bool,
    /// Whether the fence held at the last round (to log and wake on a change).
    fenced: bool,
}

/// Keeps this node's shares (see the module docs) for as long as the server runs.
async fn keep_shares(
    shared: Weak<Shared>,
    book: ShareBook,
    mut alive: tokio::sync::watch::Receiver<LeaseState>,
    fence: Arc<sluice_sched::Fence>,
    view_tx: tokio::sync::watch::Sender<FleetView>,
    mut view: tokio::sync::watch::Receiver<FleetView>,
) {
    if let Some(shared) = shared.upgrade() {
        shared.metrics.fleet.active.store(true, Relaxed);
    }
    let follower = book.clone();
    let following = tokio::spawn(async move { follower.follow(view_tx).await });
    let mut keeper = Keeper {
        book,
        fence,
        lease: alive.borrow().lease,
        held: BTreeMap::new(),
        published: None,
        published_at: None,
        waited: BTreeMap::new(),
        unsure: false,
        fenced: true,
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = view.changed() => if changed.is_err() { break },
            changed = alive.changed() => if changed.is_err() { break },
        }
        let Some(shared) = shared.upgrade() else {
            break;
        };
        let lease = *alive.borrow_and_update();
        let fleet = view.borrow_and_update().clone();
        // Bounded, so that the fence moves on every round even while etcd does not answer
        // (its calls retry for longer). A round that failed or was cut short may have had a
        // write stored unbeknown: the next one settles every share first.
        match tokio::time::timeout(ROUND_LIMIT, keeper.round(&shared, lease, &fleet)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!("keeping the fleet's shares: {e}");
                keeper.unsure = true;
                shared.metrics.fleet.rounds_failed.fetch_add(1, Relaxed);
            }
            Err(_) => {
                shared.metrics.fleet.rounds_failed.fetch_add(1, Relaxed);
                tracing::warn!(
                    "keeping the fleet's shares: etcd did not answer within {ROUND_LIMIT:?}"
                );
                keeper.unsure = true;
                keeper.published = None;
            }
        }
    }
    following.abort();
}

impl Keeper {
    /// The fence passed at `at` (this node's clock; `None`: unknown, now): logged, and
    /// written to the admission log.
    fn log_fence(&self, shared: &Shared, at: Option<tokio::time::Instant>) {
        shared.metrics.fleet.fences_passed.fetch_add(1, Relaxed);
        if let Some(log) = &shared.admission_log {
            // When it passed, which may be well before now (a paused process).
            let ago = at.map_or(Duration::ZERO, |at| {
                tokio::time::Instant::now().saturating_duration_since(at)
            });
            log.fenced(std::time::SystemTime::now() - ago);
        }
        tracing::warn!(
            lease = self.lease,
            "the fleet's fence passed: this node admits nothing on the fleet's limits until its lease is renewed"
        );
    }

    async fn round(
        &mut self,
        shared: &Shared,
        lease: LeaseState,
        fleet: &FleetView,
    ) -> sluice_sql::Result<()> {
        let snapshot = shared.snapshot();
        let Some((resource, scheduler)) = snapshot.query_slot() else {
            return Ok(());
        };
        // The fence first: it is what stops admission when the lease is in doubt.
        let before = self.fence.until();
        if lease.lease != self.lease {
            // A new lease: the old one was lost, and its keys (demand, shares) with it. No
            // share is usable before the new lease's fence is set below.
            for limit in scheduler.limits() {
                scheduler.set_share(&limit.workload, 0);
            }
            shared.metrics.fleet.leases_replaced.fetch_add(1, Relaxed);
            if !self.fenced {
                // Its fence passed unseen (the process was paused, say): it passed then.
                self.log_fence(shared, before);
                self.fenced = true;
            }
            self.lease = lease.lease;
            self.held.clear();
            self.unsure = false;
            self.published = None;
        }
        match lease.until {
            Some(until) => self.fence.hold_until(until),
            None => self.fence.lift(),
        }
        let fenced = lease.until.is_none_or(|u| u <= tokio::time::Instant::now());
        if fenced != self.fenced {
            if fenced {
                self.log_fence(shared, before.or(lease.until));
            } else {
                tracing::info!(
                    lease = lease.lease,
                    "this node's lease is certain again: it admits within its shares"
                );
                scheduler.wake();
            }
            self.fenced = fenced;
        }
        if fenced {
            return Ok(());
        }
        let limits = scheduler.limits();
        let this = shared.fleet.get().map(|m| m.name().to_string());
        let Some(this) = this else { return Ok(()) };
        // 1. This node's demand, published when it changed.
        let cap = limits.iter().map(|l| l.max_requests).max().unwrap_or(0);
        let mut demand: BTreeMap<String, i64> = BTreeMap::new();
        // A workload counts as waiting for QUIET_PUBLISH after it last had a query waiting:
        // under a limit that binds, queues empty and fill many times a second, and the flag
        // would otherwise flicker into etcd with them.
        let now = tokio::time::Instant::now();
        for (workload, waiting) in scheduler.queue_lengths() {
            *demand.entry(workload.clone()).or_default() += waiting as i64;
            self.waited.insert(workload, now);
        }
        for (workload, running) in shared.metrics.in_flight(resource) {
            *demand.entry(workload).or_default() += running;
        }
        self.waited
            .retain(|_, at| now.saturating_duration_since(*at) < QUIET_PUBLISH);
        let waiting = &self.waited;
        let text: String = demand
            .iter()
            .map(|(w, n)| {
                let waits = u8::from(waiting.contains_key(w));
                format!("{w}\t{}\t{waits}\n", (*n).min(cap))
            })
            .collect();
        // While nobody in the fleet has a query waiting, shares bind no one: a change of
        // demand is published at most every QUIET_PUBLISH (a busy node under a limit that
        // does not bind would otherwise write to etcd on most of its queries). Once anyone
        // waits, every change goes out at once: it is what moves slots to the waiting.
        let urgent = !waiting.is_empty()
            || fleet
                .demand
                .iter()
                .any(|(node, text)| *node != this && someone_waits(text));
        let quiet = self
            .published_at
            .is_none_or(|at| at.elapsed() >= QUIET_PUBLISH);
        if self.published.as_deref() != Some(text.as_str()) && (urgent || quiet) {
            self.book.publish_demand(lease.lease, &text).await?;
            self.published = Some(text.clone());
            self.published_at = Some(tokio::time::Instant::now());
        }
        // 2. The division, on what the fleet published (this node's own demand as it is now).
        let mut nodes: Vec<String> = shared
            .fleet
            .get()
            .map(|m| m.nodes().into_iter().map(|n| n.name).collect())
            .unwrap_or_default();
        // This node holds a certain lease: it is a member, whether or not the members' watch
        // has shown its key again yet (after a lost lease, it is written anew).
        if !nodes.contains(&this) {
            nodes.push(this.clone());
            nodes.sort();
        }
        let mut everyone: Demand = fleet
            .demand
            .iter()
            .map(|(node, text)| (node.clone(), parse_demand(text)))
            .collect();
        everyone.insert(this.clone(), parse_demand(&text));
        let Some(tree) = snapshot.trees.tree(resource) else {
            return Ok(());
        };
        let division = allot(tree, &nodes, &everyone, turn());
        if self.unsure {
            // A write may have been stored without this node knowing (its answer was lost):
            // make every share certain before using any (the cap only comes down here).
            let workloads: std::collections::BTreeSet<String> = limits
                .iter()
                .map(|l| l.workload.clone())
                .chain(self.held.keys().cloned())
                .collect();
            for workload in workloads {
                let (value, revision) = self.book.settle(lease.lease, &workload).await?;
                self.held.insert(workload.clone(), (value, revision));
                if limits
                    .iter()
                    .any(|l| l.workload == workload && l.share > value)
                {
                    scheduler.set_share(&workload, value);
                }
            }
            self.unsure = false;
        }
        // 3. Each limit's share toward its target.
        for limit in &limits {
            let target = division
                .get(&limit.workload)
                .and_then(|d| d.get(&this))
                .copied()
                .unwrap_or(0);
            let (held, revision) = self.held.get(&limit.workload).copied().unwrap_or((0, 0));
            if target < held {
                if limit.share != target {
                    scheduler.set_share(&limit.workload, target);
                }
                // What runs now, read after the cap came down (it cannot rise past the cap
                // from here; `limit.requests` is from before this round's awaits, when more
                // may have been admitted under the old cap).
                let running = scheduler
                    .limits()
                    .into_iter()
                    .find(|l| l.workload == limit.workload)
                    .map_or(limit.requests, |l| l.requests);
                let to = target.max(running).min(held);
                if to < held {
                    let lowered = self
                        .book
                        .lower(lease.lease, &limit.workload, to, revision)
                        .await?;
                    let Some(revision) = lowered else {
                        self.unsure = true;
                        return Ok(());
                    };
                    self.held.insert(limit.workload.clone(), (to, revision));
                    shared.metrics.fleet.shares_lowered.fetch_add(1, Relaxed);
                }
            } else if target > held {
                let (now, revision) = self
                    .book
                    .grow(
                        lease.lease,
                        &limit.workload,
                        target,
                        limit.max_requests,
                        snapshot.fleet_version,
                        revision,
                    )
                    .await?;
                if now > held {
                    shared.metrics.fleet.shares_grown.fetch_add(1, Relaxed);
                }
                self.held.insert(limit.workload.clone(), (now, revision));
                if limit.share != now {
                    scheduler.set_share(&limit.workload, now);
                }
            } else if limit.share != held {
                scheduler.set_share(&limit.workload, held);
            }
        }
        // Shares of limits that are gone (a workload dropped or no longer limited).
        let gone: Vec<String> = self
            .held
            .keys()
            .filter(|w| !limits.iter().any(|l| &l.workload == *w))
            .cloned()
            .collect();
        for workload in gone {
            let (held, revision) = self.held[&workload];
            if held > 0 {
                let lowered = self.book.lower(lease.lease, &workload, 0, revision).await?;
                if lowered.is_none() {
                    self.unsure = true;
                    return Ok(());
                }
            }
            self.held.remove(&workload);
        }
        *shared
            .metrics
            .fleet
            .shares
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = self
            .held
            .iter()
            .map(|(w, (v, _))| (w.clone(), *v))
            .collect();
        Ok(())
    }
}

/// A node's published demand: `workload<TAB>count<TAB>waits` lines (`waits`: 1 when the
/// node has queries of the workload waiting).
fn parse_demand(text: &str) -> BTreeMap<String, i64> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.rsplitn(3, '\t');
            let (_waits, count, workload) = (fields.next()?, fields.next()?, fields.next()?);
            Some((workload.to_string(), count.parse().ok()?))
        })
        .collect()
}

/// A node's published demand as `system.nodes` shows it: `workload=count`, and ` (waiting)`
/// when some of them wait.
pub fn demand_shown(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.rsplitn(3, '\t');
            let (waits, count, workload) = (fields.next()?, fields.next()?, fields.next()?);
            let waiting = if waits == "1" { " (waiting)" } else { "" };
            Some(format!("{workload}={count}{waiting}"))
        })
        .collect()
}

/// Whether a node's published demand says it has queries waiting.
fn someone_waits(text: &str) -> bool {
    text.lines().any(|line| line.ends_with("\t1"))
}

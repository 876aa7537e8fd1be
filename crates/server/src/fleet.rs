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
//!    capped at the largest limit: beyond it more demand changes nothing, and whether a limit
//!    of slots holds them back; per rate: its use, or that it wants more; per bounded queue:
//!    the queries in it, and whether it is full) when it changed — at once while anyone in
//!    the fleet waits for slots or a queue's place, or when what it wants more of changed; at
//!    most every [`QUIET_PUBLISH`] otherwise;
//! 2. it divides each limit over the live nodes by everyone's demand (slots:
//!    `sluice_sched::fleet::allot`; rates and queues: `divide`; every node reaches the same
//!    division);
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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_cluster::limit_key;
use sluice_cluster::{FleetView, LeaseState, ShareBook};
use sluice_sched::fleet::{allot, divide, Demand};
use sluice_sched::{LimitKind, LimitState};

use crate::fleet_demand::{self, parse_demand, someone_waits, wanting, Published};
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
    shared.registry.set_node_number(membership.number());
    // The learned lanes are the fleet's: read whole (this node's own added), then followed.
    share_lanes(shared, membership.map("lanes")).await?;
    let book = membership.share_book();
    let alive = membership.alive();
    let _ = shared.fleet.set(membership);
    let (view_tx, view) = tokio::sync::watch::channel(FleetView::default());
    let _ = shared.fleet_view.set(view.clone());
    tokio::spawn(follow_fleet_catalog(Arc::downgrade(shared), store));
    if options.cancel_at_fence {
        tokio::spawn(cancel_at_fence(Arc::downgrade(shared), fence.clone()));
    }
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

/// A lane as the fleet stores it: `LANE<TAB>pinned|learned`.
fn lane_value(lane: &str, pinned: bool) -> String {
    format!("{lane}\t{}", if pinned { "pinned" } else { "learned" })
}

fn parse_lane(value: &str) -> Option<(String, bool)> {
    let (lane, how) = value.rsplit_once('\t')?;
    Some((lane.to_string(), how == "pinned"))
}

/// The fleet's lanes as etcd stores them, by fingerprint.
fn fleet_lanes(stored: &[(String, String)]) -> BTreeMap<String, (String, bool)> {
    stored
        .iter()
        .filter_map(|(id, value)| Some((id.clone(), parse_lane(value)?)))
        .collect()
}

/// Takes the fleet's lanes; with `exactly`, forgets the lanes here that the fleet lacks (it
/// forgot them while this node was not following).
fn adopt_lanes(
    shared: &Shared,
    fleet: BTreeMap<String, (String, bool)>,
    exactly: bool,
) -> sluice_sql::Result<()> {
    if exactly {
        for (id, _, _) in shared.lanes.lanes() {
            if !fleet.contains_key(&id) {
                shared.lanes.adopt(&id, None)?;
            }
        }
    }
    for (id, lane) in fleet {
        shared.lanes.adopt(&id, Some(lane))?;
    }
    Ok(())
}

/// Makes the learned lanes the fleet's (`PREFIX/lanes/FINGERPRINT`): the fleet's are adopted,
/// this node's that the fleet lacks are added to it; from then on this node's changes go to
/// etcd and the others' come back by watch.
async fn share_lanes(
    shared: &Arc<Shared>,
    map: sluice_cluster::SharedMap,
) -> sluice_sql::Result<()> {
    let (stored, revision) = map.load().await?;
    let fleet = fleet_lanes(&stored);
    for (id, lane, pinned) in shared.lanes.lanes() {
        if !fleet.contains_key(&id) {
            map.put(&id, &lane_value(&lane, pinned)).await?;
        }
    }
    adopt_lanes(shared, fleet, false)?;
    // This node's changes, in order.
    if let Some(mut changes) = shared.lanes.changes() {
        let map = map.clone();
        tokio::spawn(async move {
            while let Some((id, lane)) = changes.recv().await {
                let stored = match &lane {
                    Some((lane, pinned)) => map.put(&id, &lane_value(lane, *pinned)).await,
                    None => map.delete(&id).await,
                };
                if let Err(e) = stored {
                    tracing::warn!(fingerprint = %id, "a lane not shared with the fleet: {e}");
                }
            }
        });
    }
    // The fleet's changes, from the revision read.
    let shared = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut from = revision;
        loop {
            let (sender, mut changes) = tokio::sync::mpsc::unbounded_channel();
            let follow = map.follow(from, sender);
            tokio::pin!(follow);
            let broke = loop {
                tokio::select! {
                    ended = &mut follow => break ended.err(),
                    Some((id, value)) = changes.recv() => {
                        let Some(shared) = shared.upgrade() else { return };
                        let lane = value.as_deref().and_then(parse_lane);
                        if let Err(e) = shared.lanes.adopt(&id, lane) {
                            tracing::warn!(fingerprint = %id, "the fleet's lane not kept here: {e}");
                        }
                    }
                }
            };
            if let Some(e) = broke {
                tracing::warn!("following the fleet's lanes: {e}; reading them whole again");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let Some(node) = shared.upgrade() else { return };
            match map.load().await {
                Ok((stored, revision)) => {
                    if let Err(e) = adopt_lanes(&node, fleet_lanes(&stored), true) {
                        tracing::warn!("the fleet's lanes not kept here: {e}");
                    }
                    from = revision;
                }
                Err(e) => tracing::warn!("reading the fleet's lanes: {e}"),
            }
        }
    });
    Ok(())
}

/// Applies the fleet's catalog changes as etcd reports them, for as long as the server runs;
/// when following breaks (etcd unreachable, a change this node cannot apply), the catalog is
/// read whole again and followed from there.
async fn follow_fleet_catalog(shared: Weak<Shared>, store: sluice_cluster::CatalogStore) {
    // Failures in a row: a change this node cannot apply fails again at every try (its
    // `[catalog] statements` differ from the node's that made it, say), so the tries back off.
    let mut failures = 0u32;
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
        let pause = Duration::from_millis(200 << failures.min(6)).min(Duration::from_secs(10));
        tokio::time::sleep(pause).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match store.load().await {
            Ok(stored) => match shared.adopt_fleet_catalog(&stored).await {
                Ok(()) => {
                    failures = 0;
                    if let Some(fleet) = shared.fleet_catalog.get() {
                        fleet.applied.send_replace(stored.revision);
                    }
                }
                Err(e) => {
                    failures += 1;
                    shared.metrics.fleet.catalog_failures.fetch_add(1, Relaxed);
                    tracing::error!(
                        "the fleet's catalog cannot be applied on this node: {e}; this node keeps its catalog as of revision {} and tries again (a node whose [catalog] statements differ from the others' may not be able to take a change they took)",
                        shared.fleet_catalog.get().map_or(0, |f| *f.applied.borrow())
                    );
                }
            },
            Err(e) => {
                failures += 1;
                tracing::warn!("reading the fleet's catalog: {e}");
            }
        }
    }
}

/// `[cluster] cancel_at_fence`: the moment the fence passes (not at the keeper's next round,
/// which etcd may hold up), every statement holding a QUERY slot here is stopped. The other
/// nodes can take this node's shares only once its lease expired, a tenth of `lease_ttl`
/// after the fence: so with it, a statement counts against the fleet's limits until it ends,
/// and the limits hold strictly (docs/fleet.md).
async fn cancel_at_fence(shared: Weak<Shared>, fence: Arc<sluice_sched::Fence>) {
    const LOOK: Duration = Duration::from_millis(20);
    loop {
        let Some(until) = fence.until() else {
            tokio::time::sleep(LOOK).await;
            continue;
        };
        tokio::time::sleep_until(until).await;
        if fence.until() != Some(until) {
            continue; // renewed meanwhile
        }
        let Some(node) = shared.upgrade() else { return };
        let Some(query) = node.snapshot().roles.query.clone() else {
            continue;
        };
        let mut stopped = 0;
        for process in node.registry.all() {
            let holds = process.grant.as_ref().is_some_and(|g| {
                g.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .attachments
                    .iter()
                    .any(|a| a.resource == query)
            });
            if holds
                && node.registry.kill(
                    process.query_id,
                    sluice_sql::Error::new(
                        sluice_sql::ErrorCode::QueryWasCancelled,
                        "Query was cancelled: this node's lease in etcd is in doubt (its fence passed) and [cluster] cancel_at_fence stops what it runs; run it again",
                    ),
                )
            {
                stopped += 1;
            }
        }
        node.metrics
            .fleet
            .cancelled_at_fence
            .fetch_add(stopped, Relaxed);
        tracing::warn!(
            stopped,
            "the fleet's fence passed: cancel_at_fence stopped the statements holding QUERY slots"
        );
        drop(node);
        // Until the fence moves on (a renewal, or a new lease).
        while fence.until() == Some(until) {
            tokio::time::sleep(LOOK).await;
        }
    }
}

/// What the keeper remembers between rounds.
struct Keeper {
    book: ShareBook,
    fence: Arc<sluice_sched::Fence>,
    /// The lease the shares in `held` are under.
    lease: i64,
    /// This node's shares as stored in etcd, by limit (`sluice_cluster::limit_key`), with
    /// their keys' revisions (what its next write of each compares).
    held: BTreeMap<String, (i64, i64)>,
    /// The demand last published, and when.
    published: Option<String>,
    published_at: Option<tokio::time::Instant>,
    /// When each limit (kind, workload) last wanted more here: queries waited (slots), the
    /// rate held queries back, the queue was full or refused one (waiting).
    waited: BTreeMap<(LimitKind, String), tokio::time::Instant>,
    /// Each rate limit's use here: requests passed at the last round, when, and the smoothed
    /// rate (thousandths of a request per second).
    rates: BTreeMap<String, (u64, tokio::time::Instant, f64)>,
    /// Each waiting limit's refusals as of the last round.
    rejected: BTreeMap<String, u64>,
    /// A write of a share may have been stored unbeknown (its answer was lost, or a round
    /// was cut short): settle every share before using any.
    unsure: bool,
    /// Whether the fence held at the last round (to log and wake on a change).
    fenced: bool,
    /// Each limit's size (`LimitState::max_requests`) at the last round.
    sizes: BTreeMap<String, i64>,
    /// Limits that came down since this node's share of them in etcd was granted: the
    /// scheduler scaled the share down with the limit; what etcd holds (this node's, and the
    /// others') may still be the old limit's, so nothing is raised until it has come down to
    /// what the scheduler uses (see [`Keeper::round`], step 3).
    shrunk: BTreeSet<String>,
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
        rates: BTreeMap::new(),
        rejected: BTreeMap::new(),
        unsure: false,
        fenced: true,
        sizes: BTreeMap::new(),
        shrunk: BTreeSet::new(),
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

    /// Lowers this node's share `key` in etcd to `to` (its key at `revision`). False when
    /// whether it was stored is unknown: the round ends there, and the next settles every
    /// share first.
    async fn lower(
        &mut self,
        shared: &Shared,
        lease: i64,
        key: &str,
        to: i64,
        revision: i64,
    ) -> sluice_sql::Result<bool> {
        let Some(revision) = self.book.lower(lease, key, to, revision).await? else {
            self.unsure = true;
            return Ok(false);
        };
        self.held.insert(key.to_string(), (to, revision));
        shared.metrics.fleet.shares_lowered.fetch_add(1, Relaxed);
        Ok(true)
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
                scheduler.set_share(&limit.workload, limit.kind, limit.max_requests, 0);
            }
            shared.metrics.fleet.leases_replaced.fetch_add(1, Relaxed);
            if !self.fenced {
                // Its fence passed unseen (the process was paused, say): it passed then.
                self.log_fence(shared, before);
                self.fenced = true;
            }
            self.lease = lease.lease;
            // Its number may have changed with the lease (another node took the old one).
            if let Some(fleet) = shared.fleet.get() {
                shared.registry.set_node_number(fleet.number());
            }
            self.held.clear();
            self.shrunk.clear();
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
        let now = tokio::time::Instant::now();
        let text = self.demand(shared, resource, scheduler, &limits, now);
        // While nobody in the fleet has a query waiting for slots or a queue's place, shares
        // of them bind no one: a change of the counts is published at most every
        // QUIET_PUBLISH (a busy node under a limit that does not bind would otherwise write
        // to etcd on most of its queries). Once anyone waits for them, every change goes out
        // at once: it is what moves those shares to the waiting. A rate's division reads only
        // who wants more of it: a change of that goes out at once, the rest can wait.
        let counts_matter = self.waited.keys().any(|(kind, _)| *kind != LimitKind::Rate)
            || fleet
                .demand
                .iter()
                .any(|(node, text)| *node != this && someone_waits(text));
        let urgent =
            counts_matter || self.published.as_deref().map(wanting) != Some(wanting(&text));
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
        let mut everyone: BTreeMap<String, Published> = fleet
            .demand
            .iter()
            .map(|(node, text)| (node.clone(), parse_demand(text)))
            .collect();
        everyone.insert(this.clone(), parse_demand(&text));
        let Some(tree) = snapshot.trees.tree(resource) else {
            return Ok(());
        };
        let turn = turn();
        let slots: Demand = everyone
            .iter()
            .map(|(node, published)| {
                let of = published
                    .iter()
                    .filter(|((kind, _), _)| *kind == LimitKind::Slots)
                    .map(|((_, w), (count, _))| (w.clone(), *count))
                    .collect();
                (node.clone(), of)
            })
            .collect();
        let division = allot(tree, &nodes, &slots, turn);
        let target_of = |limit: &LimitState| -> i64 {
            match limit.kind {
                LimitKind::Slots => division
                    .get(&limit.workload)
                    .and_then(|d| d.get(&this))
                    .copied()
                    .unwrap_or(0),
                kind => {
                    let key = (kind, limit.workload.clone());
                    let wants = nodes
                        .iter()
                        .map(|node| {
                            let published = everyone.get(node).and_then(|p| p.get(&key));
                            (node.clone(), wanted(limit, published, nodes.len()))
                        })
                        .collect();
                    divide(limit.max_requests, &nodes, &wants, turn)
                        .get(&this)
                        .copied()
                        .unwrap_or(0)
                }
            }
        };
        if self.unsure {
            // A write may have been stored without this node knowing (its answer was lost):
            // make every share certain before using any (the cap only comes down here).
            let keys: BTreeMap<String, Option<&LimitState>> = self
                .held
                .keys()
                .map(|k| (k.clone(), None))
                .chain(limits.iter().map(|l| (key_of(l), Some(l))))
                .collect();
            for (key, limit) in keys {
                let (value, revision) = self.book.settle(lease.lease, &key).await?;
                self.held.insert(key, (value, revision));
                if let Some(limit) = limit.filter(|l| l.share > value) {
                    scheduler.set_share(&limit.workload, limit.kind, limit.max_requests, value);
                }
            }
            self.unsure = false;
        }
        // What `limit` holds here now (running, waiting), read after its cap came down (it
        // cannot rise past the cap from then; `limit.requests` is from before this round's
        // awaits, when more may have been admitted under the old cap).
        let holds_now = |limit: &LimitState| {
            scheduler
                .limits()
                .into_iter()
                .find(|l| l.workload == limit.workload && l.kind == limit.kind)
                .map_or(limit.requests, |l| l.requests)
        };
        // 3. Each limit's share toward its target.
        for limit in &limits {
            let key = key_of(limit);
            let target = target_of(limit);
            let (held, revision) = self.held.get(&key).copied().unwrap_or((0, 0));
            let size = limit.max_requests;
            if self
                .sizes
                .insert(key.clone(), size)
                .is_some_and(|was| size < was)
                && held > 0
            {
                self.shrunk.insert(key.clone());
            }
            if self.shrunk.contains(&key) {
                // The limit came down: the scheduler scaled this node's share down with it
                // (every node alike, so those fit the new limit), but the shares in etcd may
                // still sum to the old one. So this node raises nothing (neither to its
                // target nor to what it holds in etcd) until its share in etcd is down to
                // what it uses; from then it grows as always, by transactions that see every
                // share against the new limit.
                let uses = limit.share.min(target);
                if uses < limit.share {
                    scheduler.set_share(&limit.workload, limit.kind, size, uses);
                }
                let to = uses.max(holds_now(limit)).min(held);
                if to < held && !self.lower(shared, lease.lease, &key, to, revision).await? {
                    return Ok(());
                }
                if to <= uses {
                    self.shrunk.remove(&key);
                }
                continue;
            }
            // A rate moves by no less than a twentieth of an even share: its use, measured,
            // changes a little on every round.
            let step = match limit.kind {
                LimitKind::Rate => (limit.max_requests / (20 * nodes.len() as i64)).max(1),
                _ => 1,
            };
            let far = (target - held).abs() >= step || target == 0 || held == 0;
            if target < held && far {
                if limit.share != target {
                    scheduler.set_share(&limit.workload, limit.kind, size, target);
                }
                let to = target.max(holds_now(limit)).min(held);
                if to < held && !self.lower(shared, lease.lease, &key, to, revision).await? {
                    return Ok(());
                }
            } else if target > held && far {
                let (now, revision) = self
                    .book
                    .grow(
                        lease.lease,
                        &key,
                        target,
                        limit.max_requests,
                        snapshot.fleet_version,
                        revision,
                    )
                    .await?;
                if now > held {
                    shared.metrics.fleet.shares_grown.fetch_add(1, Relaxed);
                }
                self.held.insert(key, (now, revision));
                if limit.share != now {
                    scheduler.set_share(&limit.workload, limit.kind, size, now);
                }
            } else if limit.share != held {
                scheduler.set_share(&limit.workload, limit.kind, size, held);
            }
        }
        // Shares of limits that are gone (a workload dropped or no longer limited).
        let gone: Vec<String> = self
            .held
            .keys()
            .filter(|k| !limits.iter().any(|l| key_of(l) == **k))
            .cloned()
            .collect();
        for key in gone {
            let (held, revision) = self.held[&key];
            if held > 0 && !self.lower(shared, lease.lease, &key, 0, revision).await? {
                return Ok(());
            }
            self.held.remove(&key);
        }
        let current = |k: &String| limits.iter().any(|l| key_of(l) == *k);
        self.sizes.retain(|k, _| current(k));
        self.shrunk.retain(current);
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

    /// This node's demand as published (see [`parse_demand`]): for each leaf workload of a
    /// limit of slots its queries waiting and running (capped at the largest limit: beyond
    /// it more demand changes nothing), for each rate its use, for each bounded queue the
    /// queries waiting in it; each with whether it wants more (held for [`QUIET_PUBLISH`]
    /// after it last did: under a limit that binds, queues empty and fill many times a
    /// second, and the flag would otherwise flicker into etcd with them).
    fn demand(
        &mut self,
        shared: &Shared,
        resource: &str,
        scheduler: &sluice_sched::ResourceScheduler,
        limits: &[LimitState],
        now: tokio::time::Instant,
    ) -> String {
        let cap = limits
            .iter()
            .filter(|l| l.kind == LimitKind::Slots)
            .map(|l| l.max_requests)
            .max()
            .unwrap_or(0);
        let mut lines: BTreeMap<(LimitKind, String), i64> = BTreeMap::new();
        if cap > 0 {
            // Queries wait for slots only while some limit of slots holds them back here (a
            // full share with requests below it); queries held back by a rate, or by nothing
            // yet, would otherwise flag every round and make every node publish at once.
            let slots_bind = limits.iter().any(|l| l.kind == LimitKind::Slots && l.binds);
            for (workload, waiting) in scheduler.queue_lengths() {
                *lines
                    .entry((LimitKind::Slots, workload.clone()))
                    .or_default() += waiting as i64;
                if slots_bind {
                    self.waited.insert((LimitKind::Slots, workload), now);
                }
            }
            for (workload, running) in shared.metrics.in_flight(resource) {
                *lines.entry((LimitKind::Slots, workload)).or_default() += running;
            }
            for count in lines.values_mut() {
                *count = (*count).min(cap);
            }
        }
        self.waited
            .retain(|_, at| now.saturating_duration_since(*at) < QUIET_PUBLISH);
        for limit in limits {
            let key = (limit.kind, limit.workload.clone());
            match limit.kind {
                LimitKind::Slots => {}
                LimitKind::Rate => {
                    // Requests passed per second, smoothed over about a second.
                    let (passed, at, rate) = self.rates.get(&limit.workload).copied().unwrap_or((
                        limit.passed,
                        now,
                        0.0,
                    ));
                    let elapsed = now.saturating_duration_since(at).as_secs_f64();
                    let rate = if elapsed > 0.0 {
                        let seen = limit.passed.saturating_sub(passed) as f64 * 1000.0 / elapsed;
                        rate + (seen - rate) * (1.0 - (-elapsed).exp())
                    } else {
                        rate
                    };
                    self.rates
                        .insert(limit.workload.clone(), (limit.passed, now, rate));
                    if limit.binds {
                        self.waited.insert(key.clone(), now);
                    }
                    // A node that wants more gets an equal level whatever it used (see
                    // `divide`): its use, which moves on every round, is not published then,
                    // or every node would write to etcd on every round while a rate binds.
                    let wants_more = self.waited.contains_key(&key);
                    let used = if wants_more { 0 } else { two_digits(rate) };
                    if used > 0 || wants_more {
                        lines.insert(key, used);
                    }
                }
                LimitKind::Waiting => {
                    let before = self.rejected.insert(limit.workload.clone(), limit.rejected);
                    if limit.binds || before.is_some_and(|b| b < limit.rejected) {
                        self.waited.insert(key.clone(), now);
                    }
                    if limit.requests > 0 || self.waited.contains_key(&key) {
                        lines.insert(key, limit.requests);
                    }
                }
            }
        }
        self.rates.retain(|w, _| {
            limits
                .iter()
                .any(|l| l.kind == LimitKind::Rate && l.workload == *w)
        });
        self.rejected.retain(|w, _| {
            limits
                .iter()
                .any(|l| l.kind == LimitKind::Waiting && l.workload == *w)
        });
        lines
            .iter()
            .map(|((kind, w), n)| {
                let more = self.waited.contains_key(&(*kind, w.clone()));
                fleet_demand::line(*kind, w, *n, more)
            })
            .collect()
    }
}

/// A limit's name in etcd.
fn key_of(limit: &LimitState) -> String {
    limit_key(limit.kind.name(), &limit.workload)
}

/// What a node wants of a rate or waiting limit, for [`divide`], from what it published (or
/// nothing): a rate, what it used with a quarter more, and a twentieth of an even share so
/// that its first query passes at once; waiters, those it has and a quarter of an even
/// share more (at least one).
fn wanted(limit: &LimitState, published: Option<&(i64, bool)>, nodes: usize) -> (i64, bool) {
    let (used, more) = published.copied().unwrap_or((0, false));
    let even = limit.max_requests / nodes.max(1) as i64;
    match limit.kind {
        LimitKind::Rate => (used + used / 4 + even / 20, more),
        _ => (used + (even / 4).max(1), more),
    }
}

/// `x` rounded to two significant digits (a measured rate, published: a change in the
/// third digit is noise and would only write to etcd).
fn two_digits(x: f64) -> i64 {
    if x < 1.0 {
        return 0;
    }
    let scale = 10f64.powi(x.log10().floor() as i32 - 1);
    ((x / scale).round() * scale) as i64
}

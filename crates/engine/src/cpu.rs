//! CPU slot leases (`cpu_slot_preemption`): each CPU slot a statement holds (its master
//! thread's, and each worker thread's) is held for a quantum of CPU time at a time, measured
//! as CPU time (the thread CPU clock), not wall time.
//!
//! The plan's work runs in several tasks: the one that pulls the root's partitions, and those
//! that operators such as `RepartitionExec` and `CoalescePartitionsExec` spawn to drive their
//! inputs' partitions. A [`LeaseExec`] sits over the root, over every input of a node that
//! changes the partitioning (where such tasks start) and over every leaf (a catch-all for a
//! task started elsewhere). The first leased stream a thread polls — the outermost, as a
//! thread-local depth tells — meters the thread CPU time its poll takes (everything its task
//! does in that poll, the operators below included) to the slot of its partition:
//! [`CpuLease::slot_of`]`(p)`, slot `p` at first (the statement's parallelism is its slots).
//! Leased streams polled inside it pass through, so nothing is counted twice. Each poll that
//! gives a batch or waits is a boundary (an aggregate that consumes its input gives nothing
//! until the end, but waits between input batches): once a slot has used a quantum, the
//! stream asks the statement's [`CpuLease`] to renew that slot, saying how much it used; the server charges
//! that to the workload and grants the next quantum when the tree says it is the statement's
//! turn. Until then every task of that slot answers `Pending` at its outermost leased stream:
//! the slot is preempted at a batch boundary. A task that waits for input (`Pending`) while
//! others wait for a slot, or while another slot of its statement is being renewed, renews
//! at once, charged what it used: it gives back a slot it is not using, queued for its next
//! turn so that a pipeline's hand-off between batches keeps its place in the tree. Its
//! statement's other slots whose tasks all wait for input are given back then without
//! queuing ([`CpuLease::give_back`]), and so is its own slot when it waits again right after
//! a grant while a sibling still waits: a renewal queued for a slot with nothing to do,
//! granted, would be held with no poll left to renew it (or, queued again, spin). A task of a
//! slot given back asks for it again, charged what the slot used, when it is next woken, and
//! the slot's preemption counts from when it was given back. A worker slot whose renewal waits too long is
//! given up (the server's `cpu_slot_preemption_timeout_ms`): its partitions then run under the
//! master's slot (`slot_of` answers 0 for them) — DataFusion cannot take partitions out of a
//! running plan, so the statement downscales by folding their work onto the slots it keeps.
//! Time outside the plan's polls (the server encoding rows, a task waiting) is not counted, so
//! other statements' work is never charged to this one.

use std::cell::Cell;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Result as DfResult;
use datafusion::error::DataFusionError;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::Stream;

/// The leases on a statement's CPU slots: slot 0 is its master thread's, slots 1.. its worker
/// threads'.
#[async_trait]
pub trait CpuLease: Send + Sync + std::fmt::Debug {
    /// CPU time a lease lasts before it is renewed.
    fn quantum(&self) -> Duration;
    /// The slots the statement started with.
    fn slots(&self) -> usize;
    /// The slot partition `partition` of a leaf runs under now.
    fn slot_of(&self, partition: usize) -> usize;
    /// Whether anyone waits for a CPU slot now (then a slot whose tasks wait for input is
    /// given back before its quantum is used, instead of held unused).
    fn contended(&self) -> bool;
    /// Asks for slot `slot`'s next quantum, charged `used` CPU time, gives the slot back if it
    /// is held, and waits for the grant (or, for a worker slot, gives it up when that takes
    /// too long: then `slot_of` no longer answers `slot`).
    async fn renew(&self, slot: usize, used: Duration) -> sluice_sql::Result<()>;
    /// Gives slot `slot` back without asking for it again (its tasks wait for input); the
    /// next [`CpuLease::renew`] asks for it.
    fn give_back(&self, slot: usize);
}

/// A slot's renewal, run in a task of its own: every task of the slot waits for it to end.
/// (Not a `futures` `Shared`: that wakes the very task whose poll completes it, and a task
/// woken for nothing would ask again for the slot it just gave back idle.)
struct Renewal {
    state: std::sync::Mutex<RenewalState>,
}

#[derive(Default)]
struct RenewalState {
    outcome: Option<sluice_sql::Result<()>>,
    /// The tasks waiting for it.
    wakers: Vec<std::task::Waker>,
}

impl Renewal {
    fn state(&self) -> std::sync::MutexGuard<'_, RenewalState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_done(&self) -> bool {
        self.state().outcome.is_some()
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<sluice_sql::Result<()>> {
        let mut state = self.state();
        if let Some(outcome) = &state.outcome {
            return Poll::Ready(outcome.clone());
        }
        if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    fn finish(&self, outcome: sluice_sql::Result<()>) {
        let wakers = {
            let mut state = self.state();
            if state.outcome.is_some() {
                return;
            }
            state.outcome = Some(outcome);
            std::mem::take(&mut state.wakers)
        };
        for waker in wakers {
            waker.wake();
        }
    }
}

/// Ends a renewal when its task does, however it does: a renewal that panicked or was
/// aborted must not leave the slot's tasks waiting.
struct Finishes(Arc<Renewal>);

impl Drop for Finishes {
    fn drop(&mut self) {
        self.0.finish(Err(sluice_sql::Error::new(
            sluice_sql::ErrorCode::InternalError,
            "renewing a CPU slot failed",
        )));
    }
}

/// One slot's CPU nanoseconds since its last renewal, its turn (a renewal under way, which
/// every task of the slot waits for, or the slot given back), and how many of its tasks are
/// runnable (polling, or given a batch and about to poll again) rather than waiting for input.
#[derive(Default)]
struct SlotMeter {
    used: AtomicU64,
    turn: std::sync::Mutex<Turn>,
    runnable: std::sync::atomic::AtomicUsize,
}

/// Where a slot stands between its quanta.
#[derive(Default)]
struct Turn {
    /// The last renewal, with the handle that aborts its task.
    renewal: Option<(Arc<Renewal>, Option<tokio::task::AbortHandle>)>,
    /// Given back idle, not asked for again yet.
    given_back: bool,
}

impl Turn {
    /// The renewal under way, if one is.
    fn waiting(&self) -> Option<Arc<Renewal>> {
        self.renewal
            .as_ref()
            .map(|(r, _)| r)
            .filter(|r| !r.is_done())
            .cloned()
    }
}

impl SlotMeter {
    fn turn(&self) -> std::sync::MutexGuard<'_, Turn> {
        self.turn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a task of the slot must wait for before it polls: the renewal under way, or — the
    /// slot given back idle — a renewal it starts now.
    fn wait_for_turn(&self, lease: &Arc<dyn CpuLease>, slot: usize) -> Option<Arc<Renewal>> {
        let mut turn = self.turn();
        if turn.given_back {
            turn.given_back = false;
            let used = Duration::from_nanos(self.used.swap(0, Ordering::Relaxed));
            return Some(Self::start_renewal(&mut turn, lease, slot, used));
        }
        turn.waiting()
    }

    /// Gives the slot back if none of its tasks is runnable and it is held: neither given back
    /// already, nor being renewed (what it used is charged when it is asked for again).
    fn give_back_if_idle(&self, lease: &Arc<dyn CpuLease>, slot: usize) {
        let mut turn = self.turn();
        let idle = self.runnable.load(Ordering::Relaxed) == 0;
        if idle && !turn.given_back && turn.waiting().is_none() {
            turn.given_back = true;
            lease.give_back(slot);
        }
    }

    /// Starts renewing slot `slot`, charged `used`, in a task of its own (so that the slot is
    /// back in the tree at once, not when the task that gave it back next wakes).
    fn start_renewal(
        turn: &mut Turn,
        lease: &Arc<dyn CpuLease>,
        slot: usize,
        used: Duration,
    ) -> Arc<Renewal> {
        let renewal = Arc::new(Renewal {
            state: Default::default(),
        });
        let abort = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let lease = lease.clone();
                let finishes = Finishes(renewal.clone());
                let task = runtime.spawn(async move {
                    let outcome = lease.renew(slot, used).await;
                    finishes.0.finish(outcome);
                });
                Some(task.abort_handle())
            }
            // Plans run on a runtime (their exchanges spawn tasks); outside one, not renewed.
            Err(_) => {
                renewal.finish(Ok(()));
                None
            }
        };
        turn.renewal = Some((renewal.clone(), abort));
        renewal
    }
}

/// The meters of a statement's slots, shared by all its leased nodes.
struct Meters {
    slots: Vec<SlotMeter>,
}

impl Meters {
    /// Whether a slot other than `slot` has a renewal under way.
    fn renewing_besides(&self, slot: usize) -> bool {
        self.slots
            .iter()
            .enumerate()
            .any(|(i, m)| i != slot && m.turn().waiting().is_some())
    }
}

impl Drop for Meters {
    fn drop(&mut self) {
        // The statement's plan is gone: a renewal still waiting would take a turn for nothing.
        for slot in &self.slots {
            if let Some((_, Some(abort))) = slot.turn().renewal.as_ref() {
                abort.abort();
            }
        }
    }
}

impl std::fmt::Debug for Meters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meters")
            .field("slots", &self.slots.len())
            .finish()
    }
}

/// CPU time the calling thread has used (zero where the clock cannot be read).
pub fn thread_cpu_time() -> Duration {
    cpu_time::ThreadTime::try_now()
        .map(|t| t.as_duration())
        .unwrap_or(Duration::ZERO)
}

/// `plan` with every leaf under a [`LeaseExec`] sharing one meter and `lease`.
pub fn leased(
    plan: Arc<dyn ExecutionPlan>,
    lease: Arc<dyn CpuLease>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let meters = Arc::new(Meters {
        slots: (0..lease.slots().max(1))
            .map(|_| SlotMeter::default())
            .collect(),
    });

    let plan = wrap(plan, &lease, &meters)?;
    Ok(leased_node(plan, &lease, &meters))
}

fn leased_node(
    plan: Arc<dyn ExecutionPlan>,
    lease: &Arc<dyn CpuLease>,
    meter: &Arc<Meters>,
) -> Arc<dyn ExecutionPlan> {
    Arc::new(LeaseExec {
        input: plan,
        lease: lease.clone(),
        meter: meter.clone(),
    })
}

/// `plan` with a [`LeaseExec`] over every leaf and every input where a task may start (the
/// inputs of a node that changes the partitioning, as repartitions, merges and coalesces do).
fn wrap(
    plan: Arc<dyn ExecutionPlan>,
    lease: &Arc<dyn CpuLease>,
    meter: &Arc<Meters>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
    if children.is_empty() {
        return Ok(leased_node(plan, lease, meter));
    }
    let partitions = plan.properties().output_partitioning().partition_count();
    let spawns = plan.name() == "RepartitionExec";
    let wrapped = children
        .into_iter()
        .map(|c| {
            let task_starts =
                spawns || c.properties().output_partitioning().partition_count() != partitions;
            let c = wrap(c, lease, meter)?;
            let already = c.name() == "LeaseExec";
            Ok(if task_starts && !already {
                leased_node(c, lease, meter)
            } else {
                c
            })
        })
        .collect::<DfResult<Vec<_>>>()?;
    #[expect(deprecated)]
    plan.with_new_children(wrapped)
}

/// A node of a leased statement where a task may start: its batches, with the CPU time of the
/// task's polls metered to a slot and the slot renewed between them (see the module docs).
#[derive(Debug)]
pub struct LeaseExec {
    input: Arc<dyn ExecutionPlan>,
    lease: Arc<dyn CpuLease>,
    /// The statement's slot meters, shared by all its leaves.
    meter: Arc<Meters>,
}

impl DisplayAs for LeaseExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "LeaseExec")
    }
}

impl ExecutionPlan for LeaseExec {
    fn name(&self) -> &str {
        "LeaseExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(LeaseExec {
            input: children.swap_remove(0),
            lease: self.lease.clone(),
            meter: self.meter.clone(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        Ok(Box::pin(LeasedStream {
            schema: input.schema(),
            input,
            partition,
            lease: self.lease.clone(),
            meters: self.meter.clone(),
            renewing: None,
            runnable_in: None,
        }))
    }
}

struct LeasedStream {
    schema: SchemaRef,
    input: SendableRecordBatchStream,
    partition: usize,
    lease: Arc<dyn CpuLease>,
    meters: Arc<Meters>,
    /// The renewal of its slot this partition waits for.
    renewing: Option<Arc<Renewal>>,
    /// The slot it counts as runnable in, while it does.
    runnable_in: Option<usize>,
}

impl Drop for LeasedStream {
    fn drop(&mut self) {
        self.set_runnable(None);
    }
}

thread_local! {
    /// How many leased streams this thread is inside the poll of.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The thread CPU clock when the outermost one's poll began.
    static POLL_START: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// Whether the outermost leased poll on this thread has run a quantum of CPU time.
fn quantum_spent(quantum: Duration) -> bool {
    POLL_START
        .with(Cell::get)
        .is_some_and(|start| thread_cpu_time().saturating_sub(start) >= quantum)
}

/// Inside a leased stream's poll until dropped (also on unwinding).
struct Inside;

impl Inside {
    /// Enters a poll; says whether it is the outermost on this thread.
    fn enter() -> (Inside, bool) {
        let depth = DEPTH.with(|d| {
            let depth = d.get();
            d.set(depth + 1);
            depth
        });
        (Inside, depth == 0)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl LeasedStream {
    /// The slot this partition runs under now.
    fn slot(&self) -> usize {
        let slot = self.lease.slot_of(self.partition);
        if slot < self.meters.slots.len() {
            slot
        } else {
            0
        }
    }

    /// Counts this task runnable in `slot`, or in none.
    fn set_runnable(&mut self, slot: Option<usize>) {
        if self.runnable_in == slot {
            return;
        }
        if let Some(old) = self.runnable_in {
            self.meters.slots[old]
                .runnable
                .fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(new) = slot {
            self.meters.slots[new]
                .runnable
                .fetch_add(1, Ordering::Relaxed);
        }
        self.runnable_in = slot;
    }

    /// Renews `slot` if it used its quantum — or, while others wait for a slot, if this task
    /// now waits for input (it is not using the slot: it queues for its next quantum and gives
    /// the slot back, so the tree chooses). Whenever anyone waits, every other slot of the
    /// statement whose tasks all wait for input is given back, without queuing: a task that
    /// went idle before anyone waited would otherwise hold its slot until it wakes, and a
    /// renewal queued on its behalf, granted while it still had nothing to do, would be held
    /// with no poll of its left to renew it. A task that waits again right after its grant
    /// (`after_grant`) gives its slot back without queuing.
    fn maybe_renew(
        &mut self,
        slot: usize,
        waits: bool,
        after_grant: bool,
        cx: &mut Context<'_>,
    ) -> DfResult<()> {
        // A task that goes idle while another slot of its statement is being renewed (given
        // back, and perhaps preempted) renews too, contended or not yet: its input most
        // likely comes from that slot's tasks, and an idle slot kept through the other's wait
        // would stay unrenewed for as long as it lasts — never preempted, and never
        // downscaled, should whoever the tree serves first arrive only after this task went
        // idle.
        let sibling_renews = waits && self.meters.renewing_besides(slot);
        let idle = waits && (sibling_renews || self.lease.contended());
        if sibling_renews && after_grant {
            // It waits again right after its grant while a sibling still waits for its own
            // renewal (the likely source of this task's input): queuing once more would most
            // likely be granted again (it was the tree's choice just now) and spin, or hold a
            // slot nothing uses. It gives the slot back without queuing and asks again when
            // its input wakes it.
            self.meters.slots[slot].give_back_if_idle(&self.lease, slot);
            self.give_back_idle_slots_besides(slot);
            return Ok(());
        }
        let quantum = if idle { 1 } else { nanos(self.lease.quantum()) };
        let meter = &self.meters.slots[slot];
        if meter.used.load(Ordering::Relaxed) < quantum {
            return Ok(());
        }
        let spent = meter.used.swap(0, Ordering::Relaxed);
        if spent < quantum {
            meter.used.fetch_add(spent, Ordering::Relaxed);
            return Ok(());
        }
        let renewal = {
            let mut turn = meter.turn();
            if let Some(under_way) = turn.waiting() {
                // Another task of the slot renewed it first; what this one counted goes to the
                // next renewal.
                meter.used.fetch_add(spent, Ordering::Relaxed);
                under_way
            } else {
                SlotMeter::start_renewal(&mut turn, &self.lease, slot, Duration::from_nanos(spent))
            }
        };
        if idle || self.lease.contended() {
            self.give_back_idle_slots_besides(slot);
        }
        if waits {
            // Polled now so that its grant wakes this task (the input's wake-up comes too;
            // the next poll waits for the renewal first); kept only while it waits.
            match renewal.poll(cx) {
                Poll::Pending => self.renewing = Some(renewal),
                Poll::Ready(result) => {
                    result.map_err(|e| DataFusionError::External(Box::new(e)))?
                }
            }
        } else {
            self.renewing = Some(renewal);
        }
        Ok(())
    }

    /// Gives back every slot of the statement but `slot` that is held and whose tasks all
    /// wait for input.
    fn give_back_idle_slots_besides(&self, slot: usize) {
        for (other, meter) in self.meters.slots.iter().enumerate() {
            // A slot given up (its partitions folded onto the master's) has nothing to give.
            if other != slot && self.lease.slot_of(other) == other {
                meter.give_back_if_idle(&self.lease, other);
            }
        }
    }
}

impl Stream for LeasedStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let (_inside, outermost) = Inside::enter();
        if !outermost {
            // Metered (and preempted) by the stream its task polled first. An operator that
            // pulls batch after batch in one poll (an aggregate over a generator) would hold
            // the thread, its slot and the runtime's timers for the whole input: once the poll
            // has run a quantum, yield (woken at once), so the outermost stream renews.
            if quantum_spent(self.lease.quantum()) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            return self.input.as_mut().poll_next(cx);
        }
        // Wait for the slot's turn: its renewal under way (started by another task of the
        // slot, perhaps), or the slot asked for again if it was given back idle. A worker slot
        // given up meanwhile folds this partition onto the master's slot: wait for that one's.
        let mut after_grant = false;
        let slot = loop {
            let slot = self.slot();
            self.set_runnable(Some(slot));
            if self.renewing.is_none() {
                self.renewing = self.meters.slots[slot].wait_for_turn(&self.lease, slot);
            }
            let Some(renewal) = self.renewing.as_ref() else {
                break slot;
            };
            match renewal.poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => {
                    self.renewing = None;
                    after_grant = true;
                    if let Err(e) = result {
                        return Poll::Ready(Some(Err(DataFusionError::External(Box::new(e)))));
                    }
                }
            }
        };
        let start = thread_cpu_time();
        POLL_START.with(|s| s.set(Some(start)));
        let out = self.input.as_mut().poll_next(cx);
        POLL_START.with(|s| s.set(None));
        let end = thread_cpu_time();
        self.meters.slots[slot]
            .used
            .fetch_add(nanos(end.saturating_sub(start)), Ordering::Relaxed);
        // A batch given, or a wait (an aggregate consuming its input gives nothing until the
        // end, but it waits between input batches): either is a boundary to renew at.
        let renewed = match &out {
            Poll::Ready(Some(Ok(_))) => self.maybe_renew(slot, false, after_grant, cx),
            Poll::Pending => {
                self.set_runnable(None);
                self.maybe_renew(slot, true, after_grant, cx)
            }
            _ => {
                self.set_runnable(None);
                Ok(())
            }
        };
        if let Err(e) = renewed {
            return Poll::Ready(Some(Err(e)));
        }
        out
    }
}

impl RecordBatchStream for LeasedStream {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{SessionConfig, SessionContext};
    use std::sync::Mutex;

    /// A lease whose quantum never runs out; slot 0's first renewal waits until `release` is
    /// notified, every other renewal is granted at once. Contended only until slot 0's first
    /// renewal starts, or always with `always_contended`.
    #[derive(Debug, Default)]
    struct HeldBack {
        always_contended: bool,
        /// Each renewal and give-back, in order: (slot, "renew" or "give back").
        events: Mutex<Vec<(usize, &'static str)>>,
        /// Per slot: whether it is held now.
        held: [std::sync::atomic::AtomicBool; 2],
        slot_0_held_back: std::sync::atomic::AtomicBool,
        release: tokio::sync::Notify,
    }

    impl HeldBack {
        fn held_from_the_start(always_contended: bool) -> HeldBack {
            let lease = HeldBack {
                always_contended,
                ..HeldBack::default()
            };
            for held in &lease.held {
                held.store(true, Ordering::SeqCst);
            }
            lease
        }

        fn events(&self) -> Vec<(usize, &'static str)> {
            self.events.lock().expect("not poisoned").clone()
        }

        /// Whether slot 1 is given back while slot 0's renewal is held back: its last event is
        /// a give-back (not a renewal, which lets go of the slot for a moment too).
        fn slot_1_given_back_while_0_waits(&self) -> bool {
            let last_of_1 = self
                .events
                .lock()
                .expect("not poisoned")
                .iter()
                .rev()
                .find(|(slot, _)| *slot == 1)
                .map(|(_, what)| *what);
            self.slot_0_held_back.load(Ordering::SeqCst)
                && !self.held[1].load(Ordering::SeqCst)
                && last_of_1 == Some("give back")
        }

        /// Waits (20 s at most) until slot 1 is given back while slot 0 waits.
        async fn until_slot_1_given_back(&self) -> bool {
            let given_back = async {
                while !self.slot_1_given_back_while_0_waits() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(20), given_back)
                .await
                .is_ok()
        }
    }

    #[async_trait]
    impl CpuLease for HeldBack {
        fn quantum(&self) -> Duration {
            Duration::from_secs(3600)
        }
        fn slots(&self) -> usize {
            2
        }
        fn slot_of(&self, partition: usize) -> usize {
            partition % 2
        }
        fn contended(&self) -> bool {
            self.always_contended || !self.slot_0_held_back.load(Ordering::SeqCst)
        }
        async fn renew(&self, slot: usize, _used: Duration) -> sluice_sql::Result<()> {
            self.events
                .lock()
                .expect("not poisoned")
                .push((slot, "renew"));
            self.held[slot].store(false, Ordering::SeqCst);
            if slot == 0 && !self.slot_0_held_back.swap(true, Ordering::SeqCst) {
                self.release.notified().await;
            }
            self.held[slot].store(true, Ordering::SeqCst);
            Ok(())
        }
        fn give_back(&self, slot: usize) {
            self.events
                .lock()
                .expect("not poisoned")
                .push((slot, "give back"));
            self.held[slot].store(false, Ordering::SeqCst);
        }
    }

    /// A statement summing 20M generated rows on two slots (the generator's partition is slot
    /// 0's), under `lease`.
    async fn summing(lease: &Arc<HeldBack>) -> tokio::task::JoinHandle<DfResult<Vec<RecordBatch>>> {
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
        let plan = ctx
            .sql("SELECT sum(g % 7) FROM generate_series(1, 20000000) AS t(g)")
            .await
            .expect("plans")
            .create_physical_plan()
            .await
            .expect("physical plan");
        let plan = leased(plan, lease.clone()).expect("leased");
        tokio::spawn(datafusion::physical_plan::collect(plan, ctx.task_ctx()))
    }

    /// sum of g % 7 for g in 1..=20,000,000: 2,857,142 cycles of 21, then 1+2+3+4+5+6.
    fn assert_summed(batches: &[RecordBatch]) {
        let sum = datafusion::arrow::util::pretty::pretty_format_batches(batches)
            .expect("formats")
            .to_string();
        assert!(sum.contains("60000003"), "{sum}");
    }

    /// While slot 0 waits for its renewal, the partition of slot 1 runs out of input (the
    /// generator is slot 0's) and goes idle with nobody else waiting: it gives its slot back
    /// all the same, where it used to keep it until slot 0 came back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_slot_is_given_back_while_another_is_renewed() {
        let lease = Arc::new(HeldBack::held_from_the_start(false));
        let run = summing(&lease).await;
        let given_back = lease.until_slot_1_given_back().await;
        lease.release.notify_one();
        let batches = run.await.expect("joined").expect("runs");
        let events = lease.events();
        assert!(
            given_back,
            "slot 1 held while slot 0 waited: {:?}",
            &events[..events.len().min(20)]
        );
        assert_summed(&batches);
    }

    /// Contended throughout, with slot 1's renewals granted at once: while slot 0 waits, the
    /// idle slot 1 is given back and stays given back — neither held idle with nothing left to
    /// renew it (a grant nobody polls: it was kept to the end of the statement, never
    /// downscaled), nor asked for again and again. Once slot 0 is back, slot 1 runs again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_slot_given_back_is_not_taken_again_until_it_has_work() {
        let lease = Arc::new(HeldBack::held_from_the_start(true));
        let run = summing(&lease).await;
        let given_back = lease.until_slot_1_given_back().await;
        let before = lease.events().len();
        // Nothing wakes slot 1's partition while slot 0 (its input) is held back.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = lease.events().len();
        let still_given_back = lease.slot_1_given_back_while_0_waits();
        lease.release.notify_one();
        let batches = run.await.expect("joined").expect("runs");
        let events = lease.events();
        let tail = &events[after.min(events.len())..];
        assert!(
            given_back,
            "slot 1 never given back: {} events",
            events.len()
        );
        assert!(
            still_given_back && before == after,
            "slot 1 taken again while idle: {before} events, then {after}: {:?}",
            &events[..after.min(events.len())]
        );
        assert!(
            tail.contains(&(1, "renew")),
            "slot 1 asked for again once it had work: {:?}",
            &tail[..tail.len().min(20)]
        );
        assert_summed(&batches);
    }
}

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
//! others wait for a slot, or while another slot of its statement is being renewed, renews at
//! once, charged what it used: it gives back a slot it is not using rather than hold it idle
//! to the end of its quantum. A worker slot whose renewal waits too long is
//! given up (the server's `cpu_slot_preemption_timeout_ms`): its partitions then run under the
//! master's slot (`slot_of` answers 0 for them) — DataFusion cannot take partitions out of a
//! running plan, so the statement downscales by folding their work onto the slots it keeps.
//! Time outside the plan's polls (the server encoding rows, a task waiting) is not counted, so
//! other statements' work is never charged to this one.

use std::cell::Cell;
use std::future::Future;
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
    /// Whether anyone waits for a CPU slot now (then a task that waits for input renews
    /// before its quantum is used, instead of holding a slot it does not use).
    fn contended(&self) -> bool;
    /// Gives slot `slot` back, charged `used` CPU time, and waits for its next quantum (or,
    /// for a worker slot, gives it up when that takes too long: then `slot_of` no longer
    /// answers `slot`).
    async fn renew(&self, slot: usize, used: Duration) -> sluice_sql::Result<()>;
}

type Renewal =
    futures::future::Shared<Pin<Box<dyn Future<Output = sluice_sql::Result<()>> + Send>>>;

/// One slot's CPU nanoseconds since its last renewal, the renewal under way (which every task
/// of the slot waits for), and how many of its tasks are runnable (polling, or given a batch
/// and about to poll again) rather than waiting for input.
#[derive(Default)]
struct SlotMeter {
    used: AtomicU64,
    renewal: std::sync::Mutex<Option<(Renewal, Option<tokio::task::AbortHandle>)>>,
    runnable: std::sync::atomic::AtomicUsize,
}

impl SlotMeter {
    /// The renewal under way, if one is.
    fn renewing(&self) -> Option<Renewal> {
        let renewal = self.renewal.lock().unwrap_or_else(|p| p.into_inner());
        renewal
            .as_ref()
            .map(|(r, _)| r)
            .filter(|r| r.peek().is_none())
            .cloned()
    }

    /// Starts renewing slot `slot`, charged `used`, in a task of its own (so that a slot given
    /// back for an idle task is back in the tree at once, not when the task next wakes).
    fn start_renewal(&self, lease: &Arc<dyn CpuLease>, slot: usize, used: Duration) -> Renewal {
        let lease = lease.clone();
        let work = async move { lease.renew(slot, used).await };
        let (future, abort): (Pin<Box<dyn Future<Output = _> + Send>>, _) =
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let task = runtime.spawn(work);
                    let abort = task.abort_handle();
                    let joined = async move {
                        task.await.unwrap_or_else(|e| {
                            Err(sluice_sql::Error::new(
                                sluice_sql::ErrorCode::InternalError,
                                format!("renewing a CPU slot failed: {e}"),
                            ))
                        })
                    };
                    (Box::pin(joined), Some(abort))
                }
                Err(_) => (Box::pin(work), None),
            };
        let shared = futures::FutureExt::shared(future);
        *self.renewal.lock().unwrap_or_else(|p| p.into_inner()) = Some((shared.clone(), abort));
        shared
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
            .any(|(i, m)| i != slot && m.renewing().is_some())
    }
}

impl Drop for Meters {
    fn drop(&mut self) {
        // The statement's plan is gone: a renewal still waiting would take a turn for nothing.
        for slot in &self.slots {
            let renewal = slot.renewal.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, Some(abort))) = renewal.as_ref() {
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
    renewing: Option<Renewal>,
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
    /// now waits for input (it is not using the slot). Then also gives back every other slot
    /// of the statement whose tasks all wait for input: a task that went idle before anyone
    /// waited would otherwise hold its slot until it wakes.
    fn maybe_renew(&mut self, slot: usize, waits: bool, cx: &mut Context<'_>) -> DfResult<()> {
        // A task that goes idle while another slot of its statement is being renewed (given
        // back, and perhaps preempted) gives its slot back too, contended or not yet: its
        // input most likely comes from that slot's tasks, and an idle slot kept through the
        // other's wait would stay unrenewed for as long as it lasts — never preempted, and
        // never downscaled, should whoever the tree serves first arrive only after this task
        // went idle.
        let contended = waits && (self.lease.contended() || self.meters.renewing_besides(slot));
        let quantum = if contended {
            1
        } else {
            nanos(self.lease.quantum())
        };
        let meter = &self.meters.slots[slot];
        if meter.used.load(Ordering::Relaxed) < quantum {
            return Ok(());
        }
        let spent = meter.used.swap(0, Ordering::Relaxed);
        if spent < quantum {
            meter.used.fetch_add(spent, Ordering::Relaxed);
            return Ok(());
        }
        let mut renewal = meter.start_renewal(&self.lease, slot, Duration::from_nanos(spent));
        if contended || self.lease.contended() {
            for (other, meter) in self.meters.slots.iter().enumerate() {
                let idle = meter.runnable.load(Ordering::Relaxed) == 0;
                // A slot given up (its partitions folded onto the master's) has nothing to renew.
                let held = self.lease.slot_of(other) == other;
                if other != slot && held && idle && meter.renewing().is_none() {
                    let used = Duration::from_nanos(meter.used.swap(0, Ordering::Relaxed));
                    // It runs in its own task; the slot's tasks find it when they wake.
                    drop(meter.start_renewal(&self.lease, other, used));
                }
            }
        }
        if waits {
            // Polled now so that its grant wakes this task (the input's wake-up comes too;
            // the next poll waits for the renewal first). A completed clone must not be polled
            // again: kept only while it waits.
            match Pin::new(&mut renewal).poll(cx) {
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
        let slot = self.slot();
        self.set_runnable(Some(slot));
        if self.renewing.is_none() {
            // Another task of the slot may be renewing it: wait with it.
            self.renewing = self.meters.slots[slot].renewing();
        }
        if let Some(renewal) = self.renewing.as_mut() {
            match Pin::new(renewal).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => {
                    self.renewing = None;
                    if let Err(e) = result {
                        return Poll::Ready(Some(Err(DataFusionError::External(Box::new(e)))));
                    }
                }
            }
        }
        let slot = self.slot();
        self.set_runnable(Some(slot));
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
            Poll::Ready(Some(Ok(_))) => self.maybe_renew(slot, false, cx),
            Poll::Pending => {
                self.set_runnable(None);
                self.maybe_renew(slot, true, cx)
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

    /// A lease whose quantum never runs out and which is contended only until slot 0's first
    /// renewal starts; that renewal waits until `release` is notified.
    #[derive(Debug, Default)]
    struct HeldBack {
        renewals: Mutex<Vec<usize>>,
        slot_0_held: std::sync::atomic::AtomicBool,
        release: tokio::sync::Notify,
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
            !self.slot_0_held.load(Ordering::SeqCst)
        }
        async fn renew(&self, slot: usize, _used: Duration) -> sluice_sql::Result<()> {
            self.renewals.lock().expect("not poisoned").push(slot);
            if slot == 0 && !self.slot_0_held.swap(true, Ordering::SeqCst) {
                self.release.notified().await;
            }
            Ok(())
        }
    }

    /// While slot 0 waits for its renewal, the partition of slot 1 runs out of input (the
    /// generator is slot 0's) and goes idle with nobody else waiting: it gives its slot back
    /// all the same, where it used to keep it unrenewed until slot 0 came back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_slot_is_given_back_while_another_is_renewed() {
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
        let plan = ctx
            .sql("SELECT sum(g % 7) FROM generate_series(1, 20000000) AS t(g)")
            .await
            .expect("plans")
            .create_physical_plan()
            .await
            .expect("physical plan");
        let lease = Arc::new(HeldBack::default());
        let plan = leased(plan, lease.clone()).expect("leased");
        let run = tokio::spawn(datafusion::physical_plan::collect(plan, ctx.task_ctx()));
        let slot_1_renewed_while_0_waits = async {
            loop {
                if lease.slot_0_held.load(Ordering::SeqCst) {
                    let renewals = lease.renewals.lock().expect("not poisoned").clone();
                    let held_at = renewals
                        .iter()
                        .position(|&s| s == 0)
                        .expect("slot 0 renewed");
                    if renewals[held_at..].contains(&1) {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let seen =
            tokio::time::timeout(Duration::from_secs(20), slot_1_renewed_while_0_waits).await;
        lease.release.notify_one();
        let batches = run.await.expect("joined").expect("runs");
        assert!(
            seen.is_ok(),
            "slot 1 was never renewed while slot 0 waited: {:?}",
            lease.renewals
        );
        let sum = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .expect("formats")
            .to_string();
        // sum of g % 7 for g in 1..=20,000,000: 2,857,142 cycles of 21, then 1+2+3+4+5+6.
        assert!(sum.contains("60000003"), "{sum}");
    }
}

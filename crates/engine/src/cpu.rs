//! CPU slot leases (`cpu_slot_preemption`): a statement's master thread holds its slot for a
//! quantum of CPU time at a time, measured as CPU time (the thread CPU clock), not wall time.
//!
//! Every leaf of the statement's physical plan (a scan, a `generate_series`) runs under a
//! [`LeaseExec`], and each pull of a batch from a leaf is a batch boundary: the thread CPU time
//! since the previous pull on the same thread (the operators above worked on that batch) and
//! inside the pull (the leaf's own work) is added to the statement's meter. Once a quantum is
//! used, the leaf asks the statement's [`CpuLease`] to renew, saying how much it used; the
//! server charges that to the workload and grants the next quantum when the tree says it is
//! the statement's turn. Until then the leaf answers `Pending`: the statement is preempted at
//! a batch boundary, whatever operators sit above. Time between pulls is not counted when the
//! task changed threads or waited (`Pending`), so other statements' work is never charged to
//! this one; in a parallel plan, work in the tasks a repartition spawns is counted only as far
//! as it happens between pulls on the same thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::ThreadId;
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

/// The lease on a statement's master thread.
#[async_trait]
pub trait CpuLease: Send + Sync + std::fmt::Debug {
    /// CPU time a lease lasts before it is renewed.
    fn quantum(&self) -> Duration;
    /// Gives the slot back, charged `used` CPU time, and waits for the next quantum.
    async fn renew(&self, used: Duration) -> sluice_sql::Result<()>;
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
    let meter = Arc::new(AtomicU64::new(0));
    wrap(plan, &lease, &meter)
}

fn wrap(
    plan: Arc<dyn ExecutionPlan>,
    lease: &Arc<dyn CpuLease>,
    meter: &Arc<AtomicU64>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
    if children.is_empty() {
        return Ok(Arc::new(LeaseExec {
            input: plan,
            lease: lease.clone(),
            meter: meter.clone(),
        }));
    }
    let wrapped = children
        .into_iter()
        .map(|c| wrap(c, lease, meter))
        .collect::<DfResult<Vec<_>>>()?;
    #[expect(deprecated)]
    plan.with_new_children(wrapped)
}

/// A leaf of a leased statement: its batches, with the statement's CPU time metered and its
/// lease renewed between them (see the module docs).
#[derive(Debug)]
pub struct LeaseExec {
    input: Arc<dyn ExecutionPlan>,
    lease: Arc<dyn CpuLease>,
    /// CPU nanoseconds the statement used since its last renewal, shared by all its leaves.
    meter: Arc<AtomicU64>,
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
            lease: self.lease.clone(),
            meter: self.meter.clone(),
            last: None,
            renewing: None,
        }))
    }
}

type Renewal = Pin<Box<dyn Future<Output = sluice_sql::Result<()>> + Send>>;

struct LeasedStream {
    schema: SchemaRef,
    input: SendableRecordBatchStream,
    lease: Arc<dyn CpuLease>,
    meter: Arc<AtomicU64>,
    /// The thread and its CPU clock when the last batch left this leaf.
    last: Option<(ThreadId, Duration)>,
    renewing: Option<Renewal>,
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl Stream for LeasedStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(renewal) = self.renewing.as_mut() {
            match renewal.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => {
                    self.renewing = None;
                    self.last = None; // the wait is not this statement's CPU
                    if let Err(e) = result {
                        return Poll::Ready(Some(Err(DataFusionError::External(Box::new(e)))));
                    }
                }
            }
        }
        let thread = std::thread::current().id();
        let start = thread_cpu_time();
        if let Some((t, at)) = self.last {
            if t == thread {
                self.meter
                    .fetch_add(nanos(start.saturating_sub(at)), Ordering::Relaxed);
            }
        }
        let out = self.input.as_mut().poll_next(cx);
        let end = thread_cpu_time();
        self.meter
            .fetch_add(nanos(end.saturating_sub(start)), Ordering::Relaxed);
        match &out {
            Poll::Ready(Some(Ok(_))) => {
                self.last = Some((thread, end));
                let quantum = nanos(self.lease.quantum());
                if self.meter.load(Ordering::Relaxed) >= quantum {
                    let spent = self.meter.swap(0, Ordering::Relaxed);
                    if spent >= quantum {
                        let lease = self.lease.clone();
                        let used = Duration::from_nanos(spent);
                        self.renewing = Some(Box::pin(async move { lease.renew(used).await }));
                    } else {
                        self.meter.fetch_add(spent, Ordering::Relaxed);
                    }
                }
            }
            _ => self.last = None,
        }
        out
    }
}

impl RecordBatchStream for LeasedStream {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

//! The leases on a statement's CPU slots with `cpu_slot_preemption` on
//! ([`sluice_engine::CpuLease`]): each quantum of CPU time a slot's partitions use, the slot is
//! given back and asked for again with a request whose cost is the CPU nanoseconds it used, so
//! the tree's `fair` nodes share CPU time by weight, `priority` orders it, and a `max_cpus`
//! throttler paces it. While a renewal waits the slot is preempted.
//!
//! Slot 0 is the master thread's: it is never downscaled (ClickHouse's rule), so its renewal
//! waits as long as it takes. A worker slot's renewal waits at most
//! `cpu_slot_preemption_timeout_ms`; then the request is withdrawn, the slot is given up for
//! the rest of the statement (it holds one thread fewer: `system.processes.threads` shows it),
//! and its partitions run under the master's slot from then on. A slot given back idle
//! ([`sluice_engine::CpuLease::give_back`]) is out of the statement from that moment: asked for
//! again, it is kept if granted at once, and otherwise waits only what is left of the timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sluice_sql::Result;

use crate::registry::{Attachment, Grant};
use crate::state::Shared;

#[derive(Debug)]
pub struct SlotLease {
    shared: Arc<Shared>,
    grant: Arc<Mutex<Grant>>,
    /// The resources that grant master and worker threads (often the same one).
    master: Arc<str>,
    worker: Option<Arc<str>>,
    quantum: Duration,
    /// How long a worker slot's renewal may wait before the slot is given up.
    downscale_after: Duration,
    /// Per slot the statement started with: whether it was given up.
    given_up: Vec<AtomicBool>,
    /// Per slot: when it was given back idle, while it is (its preemption began then).
    given_back_at: Vec<Mutex<Option<tokio::time::Instant>>>,
}

impl SlotLease {
    /// The leases of a statement holding `grant`, when preemption is on and it holds a master
    /// thread: one slot for it and one per worker thread it holds.
    pub fn for_statement(
        shared: &Arc<Shared>,
        grant: &Arc<Mutex<Grant>>,
    ) -> Option<Arc<dyn sluice_engine::CpuLease>> {
        let options = &shared.options.cpu_slots;
        if !options.preemption {
            return None;
        }
        let snapshot = shared.snapshot();
        let master = snapshot.roles.master.clone()?;
        let slots = {
            let grant = grant.lock().unwrap_or_else(|p| p.into_inner());
            let slots = grant.attachments.iter().filter_map(|a| a.cpu_slot);
            slots.max().map(|last| last + 1)?
        };
        Some(Arc::new(SlotLease {
            shared: shared.clone(),
            grant: grant.clone(),
            master,
            worker: snapshot.roles.worker.clone(),
            quantum: Duration::from_nanos(options.quantum_ns.max(1)),
            downscale_after: Duration::from_millis(options.preemption_timeout_ms),
            given_up: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            given_back_at: (0..slots).map(|_| Mutex::new(None)).collect(),
        }) as Arc<dyn sluice_engine::CpuLease>)
    }
}

#[async_trait]
impl sluice_engine::CpuLease for SlotLease {
    fn quantum(&self) -> Duration {
        self.quantum
    }

    fn slots(&self) -> usize {
        self.given_up.len()
    }

    fn contended(&self) -> bool {
        let snapshot = self.shared.snapshot();
        [Some(&self.master), self.worker.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|r| snapshot.schedulers.get(&**r))
            .any(|s| s.waiting() > 0)
    }

    fn slot_of(&self, partition: usize) -> usize {
        let slot = partition % self.given_up.len().max(1);
        if self.given_up[slot].load(Ordering::Relaxed) {
            0
        } else {
            slot
        }
    }

    fn give_back(&self, slot: usize) {
        if let Some(at) = self.given_back_at.get(slot) {
            *at.lock().unwrap_or_else(|p| p.into_inner()) = Some(tokio::time::Instant::now());
        }
        let held = self
            .grant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take_cpu_slot(slot);
        // Dropped outside the lock: the permit's release grants the next request.
        drop(held);
    }

    async fn renew(&self, slot: usize, used: Duration) -> Result<()> {
        let resource = match (slot, &self.worker) {
            (0, _) => &self.master,
            (_, Some(worker)) => worker,
            (_, None) => return Ok(()),
        };
        let snapshot = self.shared.snapshot();
        let Some(scheduler) = snapshot.schedulers.get(&**resource) else {
            return Ok(()); // the resource is gone: nothing to renew
        };
        if self.given_up[slot].load(Ordering::Relaxed) {
            return Ok(());
        }
        let (workload, held) = {
            let mut grant = self.grant.lock().unwrap_or_else(|p| p.into_inner());
            (grant.workload.clone(), grant.take_cpu_slot(slot))
        };
        // Queue for the next quantum first, charged with what this one used, then give the
        // slot back (unless it was given back idle already): the tree then chooses among
        // everyone waiting, this statement included, by weight and priority (giving it back
        // first would just alternate with whoever waits).
        let cost = i64::try_from(used.as_nanos()).unwrap_or(i64::MAX).max(1);
        let next = scheduler.acquire(&workload, cost);
        drop(held);
        let next = next?;
        // A slot given back idle has been out of the statement since then: its wait counts
        // from that moment (it would otherwise sit out a whole preemption given back, never
        // waiting long enough to be given up).
        let given_back_at = self.given_back_at[slot]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let permit = if slot == 0 {
            next.await?
        } else {
            let mut next = std::pin::pin!(next);
            let out_since = given_back_at.map_or(Duration::ZERO, |at| at.elapsed());
            // Granted at once (a slot free, nobody waiting), it is kept however long it was out.
            let at_once = futures::FutureExt::now_or_never(next.as_mut());
            let waited = match at_once {
                Some(permit) => Some(permit),
                None => within(self.downscale_after.saturating_sub(out_since), next).await,
            };
            match waited {
                Some(permit) => permit?,
                None => {
                    // Preempted too long: the request is withdrawn (or the late grant dropped)
                    // and the statement goes on with one thread fewer.
                    self.given_up[slot].store(true, Ordering::Relaxed);
                    tracing::debug!(slot, workload = %workload, "worker CPU slot given up after {:?} preempted", self.downscale_after);
                    return Ok(());
                }
            }
        };
        let in_flight = self.shared.metrics.series(resource, &workload).held();
        self.grant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .attachments
            .push(Attachment {
                resource: resource.clone(),
                permit,
                in_flight,
                logged: None,
                cpu_slot: Some(slot),
            });
        Ok(())
    }
}

/// `wait` if it completes within `limit` of now, by the clock, not just by the timer: on an
/// engine runtime whose threads are all busy with CPU-bound partitions the timer is turned
/// late, and a grant arriving after the limit but before the timer fired would otherwise count
/// as in time (a worker slot preempted for longer than the timeout kept for good).
async fn within<T>(limit: Duration, wait: impl std::future::Future<Output = T>) -> Option<T> {
    let started = tokio::time::Instant::now();
    match tokio::time::timeout(limit, wait).await {
        Ok(value) if started.elapsed() < limit => Some(value),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_is_in_time_only_if_the_clock_says_so() {
        let limit = Duration::from_millis(200);
        assert_eq!(within(limit, async { 1 }).await, Some(1));
        let in_time = async {
            tokio::time::sleep(Duration::from_millis(199)).await;
            2
        };
        assert_eq!(within(limit, in_time).await, Some(2));
        let never = std::future::pending::<()>();
        assert_eq!(within(limit, never).await, None);
        // Completes on its first poll, but only after the limit has passed (a runtime too busy
        // to turn its timer in time): too late all the same.
        let late = async {
            tokio::time::advance(Duration::from_millis(250)).await;
            3
        };
        assert_eq!(within(limit, late).await, None);
    }
}

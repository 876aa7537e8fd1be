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
//! and its partitions run under the master's slot from then on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sluice_sql::Result;

use crate::state::{Attachment, Grant, Shared};

#[derive(Debug)]
pub struct SlotLease {
    shared: Arc<Shared>,
    grant: Arc<Mutex<Grant>>,
    /// The resources that grant master and worker threads (often the same one).
    master: String,
    worker: Option<String>,
    quantum: Duration,
    /// How long a worker slot's renewal may wait before the slot is given up.
    downscale_after: Duration,
    /// Per slot the statement started with: whether it was given up.
    given_up: Vec<AtomicBool>,
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
            .filter_map(|r| snapshot.schedulers.get(r))
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

    async fn renew(&self, slot: usize, used: Duration) -> Result<()> {
        let resource = match (slot, &self.worker) {
            (0, _) => &self.master,
            (_, Some(worker)) => worker,
            (_, None) => return Ok(()),
        };
        let snapshot = self.shared.snapshot();
        let Some(scheduler) = snapshot.schedulers.get(resource) else {
            return Ok(()); // the resource is gone: nothing to renew
        };
        let (workload, held) = {
            let mut grant = self.grant.lock().unwrap_or_else(|p| p.into_inner());
            let at = grant
                .attachments
                .iter()
                .position(|a| a.cpu_slot == Some(slot));
            (
                grant.workload.clone(),
                at.map(|i| grant.attachments.remove(i)),
            )
        };
        if held.is_none() {
            return Ok(()); // given up already, or never held
        }
        // Queue for the next quantum first, charged with what this one used, then give the
        // slot back: the tree then chooses among everyone waiting, this statement included, by
        // weight and priority (giving it back first would just alternate with whoever waits).
        let cost = i64::try_from(used.as_nanos()).unwrap_or(i64::MAX).max(1);
        let next = scheduler.acquire(&workload, cost);
        drop(held);
        let next = next?;
        let permit = if slot == 0 {
            next.await?
        } else {
            match within(self.downscale_after, next).await {
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

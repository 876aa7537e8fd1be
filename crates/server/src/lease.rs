//! The lease on a statement's master thread with `cpu_slot_preemption` on
//! ([`sluice_engine::CpuLease`]): each quantum of CPU time the statement uses, it gives its
//! master slot back and asks again with a request whose cost is the CPU nanoseconds it used, so
//! the tree's `fair` nodes share CPU time by weight, `priority` orders it, and a `max_cpus`
//! throttler paces it. While the renewal waits the statement is preempted; the master thread
//! is never downscaled (ClickHouse's rule), so it waits as long as it takes. Worker slots are
//! held until the statement ends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sluice_sql::Result;

use crate::state::{Attachment, Grant, Shared};

#[derive(Debug)]
pub struct SlotLease {
    shared: Arc<Shared>,
    grant: Arc<Mutex<Grant>>,
    /// The resource that grants master threads.
    resource: String,
    quantum: Duration,
}

impl SlotLease {
    /// The lease of a statement holding `grant`, when preemption is on and it holds a master
    /// thread.
    pub fn for_statement(
        shared: &Arc<Shared>,
        grant: &Arc<Mutex<Grant>>,
    ) -> Option<Arc<dyn sluice_engine::CpuLease>> {
        let options = &shared.options.cpu_slots;
        if !options.preemption {
            return None;
        }
        let resource = shared.snapshot().roles.master.clone()?;
        let holds = grant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .attachments
            .iter()
            .any(|a| a.resource == resource);
        holds.then(|| {
            Arc::new(SlotLease {
                shared: shared.clone(),
                grant: grant.clone(),
                resource,
                quantum: Duration::from_nanos(options.quantum_ns.max(1)),
            }) as Arc<dyn sluice_engine::CpuLease>
        })
    }
}

#[async_trait]
impl sluice_engine::CpuLease for SlotLease {
    fn quantum(&self) -> Duration {
        self.quantum
    }

    async fn renew(&self, used: Duration) -> Result<()> {
        let snapshot = self.shared.snapshot();
        let Some(scheduler) = snapshot.schedulers.get(&self.resource) else {
            return Ok(()); // the resource is gone: nothing to renew
        };
        let (workload, held) = {
            let mut grant = self.grant.lock().unwrap_or_else(|p| p.into_inner());
            let at = grant
                .attachments
                .iter()
                .position(|a| a.resource == self.resource);
            (
                grant.workload.clone(),
                at.map(|i| grant.attachments.remove(i)),
            )
        };
        // Queue for the next quantum first, charged with what this one used, then give the
        // slot back: the tree then chooses among everyone waiting, this statement included, by
        // weight and priority (giving it back first would just alternate with whoever waits).
        let cost = i64::try_from(used.as_nanos()).unwrap_or(i64::MAX).max(1);
        let next = scheduler.acquire(&workload, cost);
        drop(held);
        let permit = next?.await?;
        let in_flight = self.shared.metrics.series(&self.resource, &workload).held();
        self.grant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .attachments
            .push(Attachment {
                resource: self.resource.clone(),
                permit,
                in_flight,
            });
        Ok(())
    }
}

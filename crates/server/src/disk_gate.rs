//! The gate a statement's file reads and writes wait at ([`DiskGate`]): each read or write of
//! a file on a configured disk ([`crate::disks`]) is a request to the IO resources covering it,
//! in the statement's current workload. It reads the server's state, so it sits above it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sluice_sql::Result;

use crate::disks::covers;
use crate::registry::Grant;
use crate::state::Shared;

/// Where one statement's file IO waits: its workload's queues in the IO resources.
#[derive(Debug)]
pub struct DiskGate {
    shared: Arc<Shared>,
    grant: Arc<Mutex<Grant>>,
}

impl DiskGate {
    /// The gate of a statement holding `grant`, when IO can be scheduled at all (disks are
    /// configured and a resource reads or writes one).
    pub fn for_statement(
        shared: &Arc<Shared>,
        grant: &Arc<Mutex<Grant>>,
    ) -> Option<Arc<dyn sluice_engine::IoGate>> {
        if shared.disks.is_empty() {
            return None;
        }
        shared.snapshot().roles.disk_io.then(|| {
            Arc::new(DiskGate {
                shared: shared.clone(),
                grant: grant.clone(),
            }) as Arc<dyn sluice_engine::IoGate>
        })
    }
}

#[async_trait]
impl sluice_engine::IoGate for DiskGate {
    async fn admit(&self, path: &Path, bytes: u64, write: bool) -> Result<Box<dyn Send>> {
        let Some(disk) = self.shared.disks.disk_of(path) else {
            return Ok(Box::new(()));
        };
        let snapshot = self.shared.snapshot();
        let workload = self
            .grant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .workload
            .clone();
        let cost = i64::try_from(bytes).unwrap_or(i64::MAX);
        let mut permits = Vec::new();
        for resource in snapshot
            .catalog
            .resources()
            .filter(|r| r.operations.iter().any(|op| covers(op, disk, write)))
        {
            let Some(scheduler) = snapshot.schedulers.get(&resource.name) else {
                continue;
            };
            permits.push(scheduler.acquire(&workload, cost)?.await?);
        }
        Ok(Box::new(permits))
    }
}

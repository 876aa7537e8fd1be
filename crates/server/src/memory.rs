//! One statement's memory as its workload counts it ([`StatementMemory`]): the engine's
//! charge for the statement (`sluice_engine::MemoryCharge`), backed by its allocation in the
//! MEMORY RESERVATION resource and capped by `max_memory_usage`. The statement's grant holds
//! it, so a moved statement takes its allocation along.

use std::sync::Mutex;

/// What one statement holds in memory, as its workload counts it: the engine's bytes, its
/// allocation (at least its reservation: growth first uses what was reserved), its cap.
#[derive(Debug)]
pub struct StatementMemory {
    allocation: Option<sluice_sched::Allocation>,
    reserved: i64,
    used: Mutex<i64>,
    cap: Option<i64>,
}

impl sluice_engine::MemoryCharge for StatementMemory {
    fn try_grow(&self, bytes: usize) -> std::result::Result<(), String> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let want = used.saturating_add(i64::try_from(bytes).unwrap_or(i64::MAX));
        if let Some(cap) = self.cap.filter(|&cap| want > cap) {
            return Err(format!(
                "Memory limit (for query) exceeded: would use {want} bytes, max_memory_usage is {cap}"
            ));
        }
        if let Some(allocation) = &self.allocation {
            let size = allocation.size();
            if want > size {
                allocation.try_grow(want - size).map_err(|e| e.message)?;
            }
        }
        *used = want;
        Ok(())
    }

    fn grow(&self, bytes: usize) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_add(i64::try_from(bytes).unwrap_or(i64::MAX));
        if let Some(allocation) = &self.allocation {
            let size = allocation.size();
            if *used > size {
                allocation.grow(*used - size);
            }
        }
    }

    fn shrink(&self, bytes: usize) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = (*used - i64::try_from(bytes).unwrap_or(i64::MAX)).max(0);
        if let Some(allocation) = &self.allocation {
            let keep = (*used).max(self.reserved);
            let size = allocation.size();
            if size > keep {
                allocation.shrink(size - keep);
            }
        }
    }
}

impl StatementMemory {
    pub fn new(
        allocation: Option<sluice_sched::Allocation>,
        reserved: i64,
        cap: Option<i64>,
    ) -> Self {
        StatementMemory {
            allocation,
            reserved,
            used: Mutex::new(0),
            cap,
        }
    }

    /// The bytes the statement holds in the engine now.
    pub fn used(&self) -> i64 {
        *self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the statement's allocation to leaf `workload` with its bytes.
    pub fn move_to(&self, workload: &str) -> sluice_sql::Result<()> {
        match &self.allocation {
            Some(allocation) => allocation.move_to(workload),
            None => Ok(()),
        }
    }
}

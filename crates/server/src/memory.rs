//! One statement's memory as its workload counts it ([`StatementMemory`]): the engine's
//! charge for the statement (`sluice_engine::MemoryCharge`), backed by its allocation in the
//! MEMORY RESERVATION resource and capped by `max_memory_usage`. The statement's grant holds
//! it, so a moved statement takes its allocation along.

use std::sync::Mutex;

/// What one statement holds in memory, as its workload counts it: the engine's bytes, its
/// allocation, its cap. The allocation is admitted at the reservation and only this changes
/// it, so its size is always `max(used, reserved)`: growth first uses what was reserved, and
/// shrinking never goes below it. Nothing needs to ask the scheduler what it holds.
#[derive(Debug)]
pub struct StatementMemory {
    allocation: Option<sluice_sched::Allocation>,
    reserved: i64,
    used: Mutex<i64>,
    cap: Option<i64>,
}

fn bytes_of(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl sluice_engine::MemoryCharge for StatementMemory {
    fn try_grow(&self, bytes: usize) -> std::result::Result<(), String> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let want = used.saturating_add(bytes_of(bytes));
        if let Some(cap) = self.cap.filter(|&cap| want > cap) {
            return Err(format!(
                "Memory limit (for query) exceeded: would use {want} bytes, max_memory_usage is {cap}"
            ));
        }
        let more = self.charged(want) - self.charged(*used);
        if let (Some(allocation), true) = (&self.allocation, more > 0) {
            allocation.try_grow(more).map_err(|e| e.message)?;
        }
        *used = want;
        Ok(())
    }

    fn grow(&self, bytes: usize) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let want = used.saturating_add(bytes_of(bytes));
        let more = self.charged(want) - self.charged(*used);
        if let (Some(allocation), true) = (&self.allocation, more > 0) {
            allocation.grow(more);
        }
        *used = want;
    }

    fn shrink(&self, bytes: usize) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let left = (*used - bytes_of(bytes)).max(0);
        let less = self.charged(*used) - self.charged(left);
        if let (Some(allocation), true) = (&self.allocation, less > 0) {
            allocation.shrink(less);
        }
        *used = left;
    }
}

impl StatementMemory {
    /// What the allocation holds while the engine holds `used`.
    fn charged(&self, used: i64) -> i64 {
        used.max(self.reserved)
    }

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

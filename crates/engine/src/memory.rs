//! A statement's memory, charged to its workload: the pool a statement runs with when the
//! server gives it a [`MemoryCharge`] (a `MEMORY RESERVATION` resource's allocation, and
//! `max_memory_usage`).
//!
//! [`ChargedPool`] wraps the engine's bounded pool: every growth is asked of the statement's
//! charge first, then of the engine's pool, and undone in the charge if the pool refuses; every
//! shrink is given back to both. So the engine-wide bound holds whatever the charge says, and
//! a charge's refusal is a `ResourcesExhausted` error, the one DataFusion's spilling operators
//! (sorts, hash aggregates) answer by spilling before they fail.
//!
//! Invariant: the charge sees exactly the bytes the statement holds in the engine's pool.

use std::fmt;
use std::sync::Arc;

use datafusion::common::Result as DfResult;
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};

/// Where a statement's memory is counted. `try_grow` may refuse (the message says why, and
/// decides the error: one that names `max_memory_usage` is MEMORY_LIMIT_EXCEEDED, any other
/// RESOURCE_LIMIT_EXCEEDED); `grow` and `shrink` cannot.
pub trait MemoryCharge: Send + Sync + fmt::Debug {
    fn try_grow(&self, bytes: usize) -> Result<(), String>;
    fn grow(&self, bytes: usize);
    fn shrink(&self, bytes: usize);
}

/// The engine's pool, with one statement's charge in front of it.
#[derive(Debug)]
pub struct ChargedPool {
    inner: Arc<dyn MemoryPool>,
    charge: Arc<dyn MemoryCharge>,
}

impl ChargedPool {
    pub fn new(inner: Arc<dyn MemoryPool>, charge: Arc<dyn MemoryCharge>) -> ChargedPool {
        ChargedPool { inner, charge }
    }
}

impl fmt::Display for ChargedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "charged({})", self.inner)
    }
}

impl MemoryPool for ChargedPool {
    fn name(&self) -> &str {
        "sluice charged pool"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.charge.grow(additional);
        self.inner.grow(reservation, additional)
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
        self.charge.shrink(shrink)
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        self.charge
            .try_grow(additional)
            .map_err(DataFusionError::ResourcesExhausted)?;
        self.inner
            .try_grow(reservation, additional)
            .inspect_err(|_| self.charge.shrink(additional))
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.inner.memory_limit()
    }
}

//! Memory given back after a big statement.
//!
//! The allocator (the binary's choice: mimalloc) returns what a thread freed to the system
//! only when that thread next works in its heap, and memory one thread frees for another (a
//! partition's buffers, dropped where the statement's stream ends) waits for the owner. The
//! engine's workers, idle after a big statement, would keep gigabytes for good. So after a
//! statement that ran [`BIG_STATEMENT`] or longer, every worker collects once: one task per
//! worker, each holding its thread briefly so the next lands on another.
//!
//! Invariant: a statement shorter than [`BIG_STATEMENT`] costs one clock read here; nothing
//! else is added to the `SELECT 1` path.

use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// What makes the calling thread give back what it freed (set once by the binary).
static COLLECT: OnceLock<fn()> = OnceLock::new();

/// A statement this long (from its start on the engine to its end) may have held much
/// memory: the workers collect after it. Shorter ones cannot have allocated enough to matter.
pub const BIG_STATEMENT: Duration = Duration::from_millis(100);

/// How long a collecting task holds its worker at most, waiting for the others.
const HOLD: Duration = Duration::from_millis(20);

/// Sets what a worker calls to give back what it freed (`mi_collect` with mimalloc). Without
/// it nothing is collected.
pub fn set_collector(collect: fn()) {
    let _ = COLLECT.set(collect);
}

/// After a statement that ran `ran`: if it was big, each of the `workers` threads of
/// `handle`'s runtime collects once.
pub(crate) fn after_statement(handle: &tokio::runtime::Handle, workers: usize, ran: Duration) {
    let Some(collect) = COLLECT.get().copied() else {
        return;
    };
    if ran < BIG_STATEMENT {
        return;
    }
    let arrived = std::sync::Arc::new((Mutex::new(0usize), Condvar::new()));
    for _ in 0..workers {
        let arrived = arrived.clone();
        handle.spawn(async move {
            collect();
            let (count, all) = &*arrived;
            let Ok(mut n) = count.lock() else { return };
            *n += 1;
            all.notify_all();
            // Held until every worker has one (or briefly): the next task goes elsewhere.
            let _ = all.wait_timeout_while(n, HOLD, |n| *n < workers);
        });
    }
}

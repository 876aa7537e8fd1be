//! Where client connections run: one thread per core, each with a runtime of its own.
//!
//! A connection's work is a chain of short steps (read a message, admit it, write it
//! upstream, read the answer, write it back), each woken by the one before. On tokio's
//! multi-threaded runtime those wake-ups cross threads — a socket's readiness seen by one
//! worker, the task run by another, a parked worker woken through the kernel to steal it.
//! Here each connection is placed, at accept, on one of `n` threads, each running a
//! current-thread runtime: its task, its sockets, its timers and the tasks it spawns all stay
//! on that thread (an upstream connection lent to it is moved to its thread too: see
//! `sluice_engine::upstream::pool`).
//!
//! Invariants:
//! - A connection's socket is registered with the runtime of the thread it runs on (it is
//!   handed over unregistered, and registered there).
//! - With `n = 0` connections run on the runtime that accepted them, as tasks of it (the
//!   runtime the caller of `serve` chose: a test's, with whatever clock it set).
//! - Dropping [`ConnectionThreads`] ends every thread's runtime, dropping the connections
//!   still on it (their statements release what they hold as on any disconnect).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::oneshot;

/// `server.connection_threads` when the config says nothing: one per core, but one in all on
/// a machine of two cores or fewer. There sluice shares its cores with the database it fronts
/// (or the engine's threads), and two connection threads, each with a queue of its own, ran no
/// more transactions than one through pgbench -S and had the longer tail: a client waits
/// behind its own thread's queue while the other thread's may be empty (BENCHMARKS.md, "The
/// harness fixed, one connection thread on two cores").
pub fn default_count(cores: usize) -> usize {
    if cores <= 2 {
        1
    } else {
        cores
    }
}

/// The threads connections run on.
#[derive(Debug)]
pub struct ConnectionThreads {
    runtimes: Vec<tokio::runtime::Handle>,
    /// Round-robin: the next connection's thread.
    next: AtomicUsize,
    /// Dropped to end the threads.
    _stops: Vec<oneshot::Sender<()>>,
}

impl ConnectionThreads {
    /// `n` threads (`sluice-conn-0`, …), each with a current-thread runtime; none for `n = 0`.
    pub fn start(n: usize) -> std::io::Result<ConnectionThreads> {
        let mut runtimes = Vec::with_capacity(n);
        let mut stops = Vec::with_capacity(n);
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            runtimes.push(runtime.handle().clone());
            stops.push(stop);
            std::thread::Builder::new()
                .name(format!("sluice-conn-{i}"))
                .spawn(move || {
                    // Runs the connections spawned onto it until the server lets it go.
                    let _ = runtime.block_on(stopped);
                    // Ends the connections still open without waiting for them.
                    runtime.shutdown_background();
                })?;
        }
        Ok(ConnectionThreads {
            runtimes,
            next: AtomicUsize::new(0),
            _stops: stops,
        })
    }

    /// Runs `connection` on the next thread, or on the current runtime when there are none.
    /// `connection` registers its socket itself (see the module's invariants).
    pub fn spawn<F>(&self, connection: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.runtimes.is_empty() {
            tokio::spawn(connection);
            return;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.runtimes.len();
        self.runtimes[i].spawn(connection);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_cores_or_fewer_get_one_connection_thread() {
        assert_eq!(
            [1, 2, 3, 4, 16].map(default_count),
            [1, 1, 3, 4, 16],
            "one queue on small machines, one per core above"
        );
    }
}

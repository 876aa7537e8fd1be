//! Noticing a client that went away while its statement waits or runs.
//!
//! Nobody reads a connection's socket while its statement is in progress (the next message is
//! read only when the statement has answered), so without a watch a client that vanishes keeps
//! its queue place until the query is granted, and its query runs to the end for nobody.
//! [`ClientWatch`] holds a second handle to the same TCP socket and *peeks* at it: end of file
//! or a reset means the client is gone; a pending `Terminate` message means it is leaving. Any
//! other pending input (a pipelined next statement) is left where it is, for the next statement
//! to read: a peek consumes nothing.
//!
//! The watch starts [`WATCH_AFTER`] into a statement (between one and two of them), so the
//! short statements that make up most traffic never pay its system call. That delay is kept by
//! one clock per connection thread, not a timer per statement or per connection: a
//! [`Ticker`] task ticks every [`WATCH_AFTER`] while a statement of the thread is watched and
//! wakes each statement whose tick has come. A statement notes the tick it is due at and
//! clears it when it ends: no clock read, no timer registered, moved or polled per statement
//! (a timer per connection moved on at each statement cost 400 instructions a statement; a
//! timer per statement woke the runtime's driver, a fifth of a forwarded statement's system
//! calls). When nothing is watched the ticker waits without ticking.

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;

/// How long a statement runs or waits, at least, before its socket is watched (at most
/// twice this).
pub const WATCH_AFTER: Duration = Duration::from_millis(5);

/// A `Terminate` message: the client says it is leaving.
const TERMINATE: [u8; 5] = [b'X', 0, 0, 0, 4];

/// The watch over one client's socket.
#[derive(Debug, Default)]
pub struct ClientWatch {
    socket: Option<tokio::net::TcpStream>,
    /// The connection's place on its thread's ticker, from its first watched statement.
    due: OnceLock<Option<(Arc<Ticker>, Arc<Due>)>>,
}

impl ClientWatch {
    /// Watches `socket` through a second handle to it (the connection keeps the first).
    pub fn new(socket: &tokio::net::TcpStream) -> ClientWatch {
        use std::os::fd::AsFd;
        let handle = socket
            .as_fd()
            .try_clone_to_owned()
            .map(std::net::TcpStream::from)
            .and_then(|s| {
                s.set_nonblocking(true)?;
                tokio::net::TcpStream::from_std(s)
            });
        match handle {
            Ok(socket) => ClientWatch {
                socket: Some(socket),
                due: OnceLock::new(),
            },
            Err(e) => {
                tracing::warn!("cannot watch a client socket ({e}); a vanished client's statement will run to its end");
                ClientWatch::default()
            }
        }
    }

    /// No socket to watch (`sluice local`): never completes.
    pub fn none() -> ClientWatch {
        ClientWatch::default()
    }

    /// Completes once the client has closed its connection, reset it, or sent `Terminate`;
    /// never while it is connected (pipelined input included).
    pub async fn gone(&self) {
        let mut watching = Watching::starting_now();
        std::future::poll_fn(|cx| self.poll_gone(cx, &mut watching)).await
    }

    /// This connection's place on the ticker of the thread it is first polled on (`None`
    /// outside a tokio runtime: nothing ticks there).
    fn due(&self) -> Option<&(Arc<Ticker>, Arc<Due>)> {
        self.due
            .get_or_init(|| {
                let ticker = Ticker::of_this_thread()?;
                let due = Arc::new(Due::default());
                ticker
                    .watches
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Arc::downgrade(&due));
                Some((ticker, due))
            })
            .as_ref()
    }

    /// [`ClientWatch::gone`] as a poll, for a statement's stop: `watching` is where this
    /// statement's watch is (made when the statement starts).
    pub fn poll_gone(&self, cx: &mut Context<'_>, watching: &mut Watching) -> Poll<()> {
        let Some(socket) = &self.socket else {
            return Poll::Pending;
        };
        loop {
            match watching.look {
                Look::Start | Look::At(_) => std::task::ready!(self.poll_due(cx, watching)),
                Look::Peek => {
                    let mut head = [0u8; 5];
                    let mut read = tokio::io::ReadBuf::new(&mut head);
                    match std::task::ready!(socket.poll_peek(cx, &mut read)) {
                        Ok(0) => return Poll::Ready(()),
                        Ok(n) if head[..n] == TERMINATE[..n] => {
                            if n == TERMINATE.len() {
                                return Poll::Ready(());
                            }
                            // A Terminate still arriving: look again shortly.
                            watching.look = Look::Start;
                        }
                        // Input for the next statement: the client is there.
                        Ok(_) => watching.look = Look::Never,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => return Poll::Ready(()),
                    }
                }
                Look::Never => return Poll::Pending,
            }
        }
    }

    /// Ready (and `watching` at [`Look::Peek`]) once its tick has come: [`WATCH_AFTER`] to
    /// twice that after its first poll. The wake comes to the task that polled it last.
    fn poll_due(&self, cx: &mut Context<'_>, watching: &mut Watching) -> Poll<()> {
        let Some((ticker, due)) = self.due() else {
            watching.look = Look::Never;
            return Poll::Pending;
        };
        let at = match watching.look {
            Look::At(at) => at,
            _ => {
                // The tick after next: at least one whole tick away.
                let at = ticker.tick.load(Ordering::SeqCst) + 2;
                watching.look = Look::At(at);
                watching.due = Some(due.clone());
                due.tick.store(at, Ordering::SeqCst);
                ticker.wanted();
                at
            }
        };
        if ticker.tick.load(Ordering::SeqCst) < at {
            due.waker.register(cx.waker());
            // Its tick came between the load and the registration: its wake may be missed.
            if ticker.tick.load(Ordering::SeqCst) < at {
                return Poll::Pending;
            }
        }
        watching.look = Look::Peek;
        Poll::Ready(())
    }

    #[cfg(test)]
    async fn until_due(&self, watching: &mut Watching) {
        std::future::poll_fn(|cx| self.poll_due(cx, watching)).await
    }
}

/// Where one statement's watch over its client is: not begun, waiting for its tick, looking
/// at the socket, or satisfied that the client is there. Dropped, it is no longer due.
#[derive(Debug)]
pub struct Watching {
    look: Look,
    /// Its connection's due tick, once set (cleared at the drop if still this one's).
    due: Option<Arc<Due>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    Start,
    At(u64),
    Peek,
    Never,
}

impl Watching {
    /// A statement starting now (its wait is counted from its first poll).
    pub fn starting_now() -> Watching {
        Watching {
            look: Look::Start,
            due: None,
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        if let (Some(due), Look::At(at)) = (&self.due, self.look) {
            // Ended before its tick: the ticker has nothing to wake (a later statement's tick
            // stays).
            let _ = due
                .tick
                .compare_exchange(at, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

/// One connection's due tick (0: none) and the task to wake at it.
#[derive(Debug, Default)]
struct Due {
    tick: AtomicU64,
    waker: AtomicWaker,
}

/// A connection thread's watch clock (see the module's opening).
#[derive(Debug, Default)]
struct Ticker {
    /// Ticks so far.
    tick: AtomicU64,
    /// Its connections' places (one each, from its first watched statement; pruned as they
    /// go).
    watches: Mutex<Vec<Weak<Due>>>,
    /// Set while its task waits for a statement to watch.
    parked: AtomicBool,
    unpark: tokio::sync::Notify,
    /// Cleared when its task ends (its runtime was shut down): the thread starts another.
    alive: AtomicBool,
}

thread_local! {
    static TICKER: RefCell<Option<Arc<Ticker>>> = const { RefCell::new(None) };
}

impl Ticker {
    /// The ticker of this thread's runtime, started if there is none (`None` outside one).
    fn of_this_thread() -> Option<Arc<Ticker>> {
        TICKER.with(|kept| {
            let mut kept = kept.borrow_mut();
            if let Some(ticker) = kept.as_ref().filter(|t| t.alive.load(Ordering::SeqCst)) {
                return Some(ticker.clone());
            }
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let ticker = Arc::new(Ticker {
                alive: AtomicBool::new(true),
                ..Ticker::default()
            });
            runtime.spawn(ticker.clone().run());
            *kept = Some(ticker.clone());
            Some(ticker)
        })
    }

    /// A statement was given a due tick: the task ticks again if it waited.
    fn wanted(&self) {
        if self.parked.load(Ordering::SeqCst) {
            self.parked.store(false, Ordering::SeqCst);
            self.unpark.notify_one();
        }
    }

    /// Ticks every [`WATCH_AFTER`], waking the statements whose tick came, while any is due.
    fn run(self: Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        struct Ended(Arc<Ticker>);
        impl Drop for Ended {
            fn drop(&mut self) {
                self.0.alive.store(false, Ordering::SeqCst);
            }
        }
        // Made before the task's first poll: a runtime shut down before that drops it too.
        let ended = Ended(self);
        async move {
            let this = &ended.0;
            loop {
                tokio::time::sleep(WATCH_AFTER).await;
                let now = this.tick.fetch_add(1, Ordering::SeqCst) + 1;
                if this.wake_due(now) {
                    continue;
                }
                // Nothing due: wait for a statement (looked for again after saying so, so one
                // given its tick meanwhile is not missed).
                this.parked.store(true, Ordering::SeqCst);
                if this.wake_due(now) {
                    this.parked.store(false, Ordering::SeqCst);
                    continue;
                }
                this.unpark.notified().await;
            }
        }
    }

    /// Wakes the statements due by tick `now`; whether any is due later.
    fn wake_due(&self, now: u64) -> bool {
        let mut later = false;
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|watch| {
                let Some(due) = watch.upgrade() else {
                    return false;
                };
                let at = due.tick.load(Ordering::SeqCst);
                if at != 0 && at <= now {
                    if due
                        .tick
                        .compare_exchange(at, 0, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        due.waker.wake();
                    }
                } else if at != 0 {
                    later = true;
                }
                true
            });
        later
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// How long after `start` a statement's tick comes.
    async fn due_after(watch: &ClientWatch, watching: &mut Watching) -> Duration {
        let start = Instant::now();
        watch.until_due(watching).await;
        Instant::now() - start
    }

    #[tokio::test(start_paused = true)]
    async fn a_statements_tick_comes_after_one_to_two_periods_and_never_early() {
        let (watch, busy) = (ClientWatch::default(), ClientWatch::default());
        // Another connection's statements keep the ticker ticking meanwhile.
        let keep_busy = async {
            for _ in 0..40 {
                due_after(&busy, &mut Watching::starting_now()).await;
            }
        };
        let measured = async {
            for round in 0..6 {
                // Statements start anywhere in a period.
                tokio::time::sleep(WATCH_AFTER / 3).await;
                let waited = due_after(&watch, &mut Watching::starting_now()).await;
                assert!(
                    waited >= WATCH_AFTER && waited <= 2 * WATCH_AFTER,
                    "round {round}: {waited:?}"
                );
            }
        };
        tokio::join!(keep_busy, measured);
    }

    #[tokio::test(start_paused = true)]
    async fn the_connections_of_a_thread_share_one_ticker() {
        let (a, b) = (ClientWatch::default(), ClientWatch::default());
        let (mut wa, mut wb) = (Watching::starting_now(), Watching::starting_now());
        let (da, db) = tokio::join!(due_after(&a, &mut wa), due_after(&b, &mut wb));
        assert!(da >= WATCH_AFTER && db >= WATCH_AFTER, "{da:?} {db:?}");
        let (ta, tb) = (a.due().expect("ticks"), b.due().expect("ticks"));
        assert!(Arc::ptr_eq(&ta.0, &tb.0));
        assert_eq!(ta.0.watches.lock().expect("not poisoned").len(), 2);
        // A connection gone is pruned at the next tick that looks.
        drop((b, wb));
        let _ = due_after(&a, &mut Watching::starting_now()).await;
        let ticker = a.due().expect("ticks").0.clone();
        assert_eq!(ticker.watches.lock().expect("not poisoned").len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_statement_that_ends_first_is_not_woken_and_the_ticker_waits_for_the_next() {
        let watch = ClientWatch::default();
        {
            // Polled once (its tick set), then ended before the tick.
            let mut watching = Watching::starting_now();
            let pending = futures::FutureExt::now_or_never(watch.until_due(&mut watching));
            assert!(pending.is_none());
            let (_, due) = watch.due().expect("ticks");
            assert_ne!(due.tick.load(Ordering::SeqCst), 0);
        }
        let (ticker, due) = watch.due().expect("ticks").clone();
        assert_eq!(due.tick.load(Ordering::SeqCst), 0, "cleared as it ended");
        // Nothing due: after a tick the ticker waits, and stops counting.
        tokio::time::sleep(3 * WATCH_AFTER).await;
        assert!(ticker.parked.load(Ordering::SeqCst));
        let tick = ticker.tick.load(Ordering::SeqCst);
        tokio::time::sleep(10 * WATCH_AFTER).await;
        assert_eq!(ticker.tick.load(Ordering::SeqCst), tick);
        // The next statement wakes it, and is woken at its tick.
        let waited = due_after(&watch, &mut Watching::starting_now()).await;
        assert!(
            waited >= WATCH_AFTER && waited <= 2 * WATCH_AFTER,
            "{waited:?}"
        );
    }

    #[test]
    fn outside_a_runtime_nothing_ticks_and_nothing_is_watched() {
        let watch = ClientWatch::default();
        let mut watching = Watching::starting_now();
        let polled = futures::FutureExt::now_or_never(watch.until_due(&mut watching));
        assert!(polled.is_none());
        assert_eq!(watching.look, Look::Never);
    }
}

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
//! The watch starts [`WATCH_AFTER`] into a statement, so the short statements that make up
//! most traffic never pay its system call. That delay is one timer per connection, moved on
//! at each statement, not one per statement: registering a timer that ends before any other
//! on the runtime wakes the runtime's driver (a `write` to its eventfd and an extra turn of
//! its `epoll_wait`), which per statement was a fifth of the system calls of a forwarded one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// How long a statement runs or waits before its socket is watched.
pub const WATCH_AFTER: Duration = Duration::from_millis(5);

/// A `Terminate` message: the client says it is leaving.
const TERMINATE: [u8; 5] = [b'X', 0, 0, 0, 4];

/// The watch over one client's socket.
#[derive(Debug, Default)]
pub struct ClientWatch {
    socket: Option<tokio::net::TcpStream>,
    /// The connection's one timer for [`WATCH_AFTER`]: once registered it stays, and a later
    /// statement moves its deadline later, which never wakes the driver.
    timer: Mutex<Option<Pin<Box<Sleep>>>>,
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
                timer: Mutex::default(),
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

    /// [`ClientWatch::gone`] as a poll, for a statement's stop: `watching` is where this
    /// statement's watch is (made when the statement starts).
    pub fn poll_gone(&self, cx: &mut Context<'_>, watching: &mut Watching) -> Poll<()> {
        let Some(socket) = &self.socket else {
            return Poll::Pending;
        };
        loop {
            match watching.0 {
                Look::At(due) => {
                    std::task::ready!(self.poll_until(cx, due));
                    watching.0 = Look::Peek;
                }
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
                            watching.0 = Look::At(Instant::now() + WATCH_AFTER);
                        }
                        // Input for the next statement: the client is there.
                        Ok(_) => watching.0 = Look::Never,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => return Poll::Ready(()),
                    }
                }
                Look::Never => return Poll::Pending,
            }
        }
    }

    /// Ready at `due` or later, on the connection's timer. Its waits come from the
    /// statement in progress (admission, then the run's stop), all polled by the connection's
    /// task, one at a time; should two of that task overlap, the timer goes to the later
    /// deadline and the earlier wait completes then (late, never early). The timer wakes only
    /// the task that polled it last: a wait polled from another task would need its own.
    fn poll_until(&self, cx: &mut Context<'_>, due: Instant) -> Poll<()> {
        if Instant::now() >= due {
            return Poll::Ready(());
        }
        let mut timer = self.timer.lock().unwrap_or_else(|p| p.into_inner());
        let sleep = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if sleep.deadline() < due {
            sleep.as_mut().reset(due);
        }
        // Ready (its deadline passed) with `now` before `due` cannot happen: the deadline
        // is at least `due`.
        sleep.as_mut().poll(cx)
    }

    #[cfg(test)]
    async fn until(&self, due: Instant) {
        std::future::poll_fn(|cx| self.poll_until(cx, due)).await
    }
}

/// Where one statement's watch over its client is: waiting out [`WATCH_AFTER`] from the
/// statement's start, looking at the socket, or satisfied that the client is there.
#[derive(Debug)]
pub struct Watching(Look);

#[derive(Debug)]
enum Look {
    At(Instant),
    Peek,
    Never,
}

impl Watching {
    /// A statement starting now.
    pub fn starting_now() -> Watching {
        Watching(Look::At(Instant::now() + WATCH_AFTER))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn statements_share_one_timer_that_never_completes_early() {
        let watch = ClientWatch::default();
        let start = Instant::now();
        watch.until(start + WATCH_AFTER).await;
        assert!(Instant::now() >= start + WATCH_AFTER);
        // The next statement moves the same timer on.
        let kept = |w: &ClientWatch| {
            let timer = w.timer.lock().expect("not poisoned");
            timer.as_ref().map(|t| t.deadline())
        };
        assert_eq!(kept(&watch), Some(start + WATCH_AFTER));
        let next = Instant::now() + WATCH_AFTER;
        watch.until(next).await;
        assert!(Instant::now() >= next);
        assert_eq!(kept(&watch), Some(next));
        // Two waits at once: each completes, neither before its own deadline.
        let (early, late) = (
            Instant::now() + WATCH_AFTER,
            Instant::now() + 2 * WATCH_AFTER,
        );
        let first = async {
            watch.until(early).await;
            Instant::now()
        };
        let second = async {
            watch.until(late).await;
            Instant::now()
        };
        let (a, b) = tokio::join!(first, second);
        assert!(a >= early && b >= late, "{a:?} {b:?}");
    }
}

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
//! most traffic never pay its system call.

use std::time::Duration;

/// How long a statement runs or waits before its socket is watched.
pub const WATCH_AFTER: Duration = Duration::from_millis(5);

/// A `Terminate` message: the client says it is leaving.
const TERMINATE: [u8; 5] = [b'X', 0, 0, 0, 4];

/// The watch over one client's socket.
#[derive(Debug, Default)]
pub struct ClientWatch {
    socket: Option<tokio::net::TcpStream>,
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
        let Some(socket) = &self.socket else {
            return std::future::pending().await;
        };
        tokio::time::sleep(WATCH_AFTER).await;
        let mut head = [0u8; 5];
        loop {
            match socket.peek(&mut head).await {
                Ok(0) => return,
                Ok(n) if head[..n] == TERMINATE[..n] => {
                    if n == TERMINATE.len() {
                        return;
                    }
                    // A Terminate still arriving: look again shortly.
                    tokio::time::sleep(WATCH_AFTER).await;
                }
                // Input for the next statement: the client is there.
                Ok(_) => return std::future::pending().await,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

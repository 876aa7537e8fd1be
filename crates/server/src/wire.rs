//! The connection loop, with writes batched per response.
//!
//! pgwire's handlers flush after ParseComplete, BindComplete, each Describe answer and each
//! CommandComplete, so an extended-protocol round trip (Parse, Bind, Describe, Execute, Sync)
//! cost five `send` calls, each waking the client. PostgreSQL sends such a round trip in one:
//! it flushes when a response is complete (ReadyForQuery), when the client must answer
//! (authentication, COPY), for asynchronous messages (NOTICE), and before it waits for input.
//! [`Corked`] does the same under pgwire: it holds back flushes whose last message is one of
//! a response's middle parts, and always sends what it holds before the connection reads.
//!
//! Invariants:
//! - Nothing is held while the server waits for the client: every read first sends all that
//!   is held, so no client can wait on an answer the server has not sent.
//! - A NOTICE (a query waiting for admission says so) and every message that ends a response
//!   or asks the client for something go out at once.
//! - At most [`HOLD_LIMIT`] bytes are held; a large result streams as before.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures::StreamExt;
use pgwire::api::{ClientInfo, ErrorHandler, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::ErrorInfo;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{negotiate_tls, process_error, process_message, MaybeTls};
use pgwire::tokio::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, FramedParts};

/// Bytes held back at most before they are written anyway.
pub const HOLD_LIMIT: usize = 64 * 1024;

/// How long a client has to finish start-up and authentication (pgwire's own limit).
const STARTUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Backend message types that never end a response: a flush right after one of them is held
/// until the response's end or the next read. ParseComplete, BindComplete, CloseComplete,
/// RowDescription, NoData, ParameterDescription, DataRow, CommandComplete,
/// EmptyQueryResponse, PortalSuspended.
fn is_middle(message_type: u8) -> bool {
    matches!(
        message_type,
        b'1' | b'2' | b'3' | b'T' | b'n' | b't' | b'D' | b'C' | b'I' | b's'
    )
}

/// A socket that holds back flushes in the middle of a response (see the module docs).
pub struct Corked<S> {
    inner: S,
    held: Vec<u8>,
    /// Where the next message header starts in the bytes written so far: `skip` more bytes
    /// belong to the current message; `header` collects a header split across writes.
    skip: usize,
    header: Vec<u8>,
    /// The type of the last message whose header was written.
    last_type: Option<u8>,
}

impl<S> std::fmt::Debug for Corked<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Corked")
            .field("held", &self.held.len())
            .field("last_type", &self.last_type.map(char::from))
            .finish_non_exhaustive()
    }
}

impl<S> Corked<S> {
    pub fn new(inner: S) -> Self {
        Corked {
            inner,
            held: Vec::new(),
            skip: 0,
            header: Vec::with_capacity(5),
            last_type: None,
        }
    }

    /// Follows message boundaries (type byte, then a length that counts itself) through `buf`.
    fn track(&mut self, mut buf: &[u8]) {
        while !buf.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(buf.len());
                self.skip -= n;
                buf = &buf[n..];
                continue;
            }
            let need = 5 - self.header.len();
            let n = need.min(buf.len());
            self.header.extend_from_slice(&buf[..n]);
            buf = &buf[n..];
            if self.header.len() == 5 {
                self.last_type = Some(self.header[0]);
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as usize;
                self.skip = len.saturating_sub(4);
                self.header.clear();
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> Corked<S> {
    /// Writes out everything held, then flushes the socket.
    fn poll_send_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held.drain(..n);
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Corked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // About to wait for the client: it must have every answer first.
        ready!(self.poll_send_held(cx))?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Corked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.held.len() >= HOLD_LIMIT {
            ready!(self.poll_send_held(cx))?;
        }
        self.track(buf);
        self.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.last_type.is_some_and(is_middle) && self.held.len() < HOLD_LIMIT {
            return Poll::Ready(Ok(()));
        }
        self.poll_send_held(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send_held(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves one client connection: TLS negotiation and the message loop of pgwire's
/// `process_socket`, over a [`Corked`] socket.
pub async fn process_connection<H: PgWireServerHandlers>(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    handlers: H,
    terminate: Arc<tokio::sync::Notify>,
    mut forwarding: Option<(crate::forward::Forwarder, Arc<crate::session::Connection>)>,
) -> io::Result<()> {
    let startup_deadline = tokio::time::sleep(STARTUP_TIMEOUT);
    tokio::pin!(startup_deadline);
    let negotiated = tokio::select! {
        _ = &mut startup_deadline => return Ok(()),
        socket = negotiate_tls(tcp, tls) => socket?,
    };
    // A client that asked for direct TLS where none is configured: nothing to serve.
    let Some(socket) = negotiated else {
        return Ok(());
    };
    let old = socket.into_parts();
    let mut parts = FramedParts::new(Corked::new(old.io), old.codec);
    parts.read_buf = old.read_buf;
    parts.write_buf = old.write_buf;
    let mut socket: Framed<Corked<MaybeTls>, _> = Framed::from_parts(parts);

    let startup = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let errors = handlers.error_handler();
    // One registration for the connection's life, not one per message.
    let terminated = terminate.notified();
    tokio::pin!(terminated);
    loop {
        let starting = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        let message = if starting {
            tokio::select! {
                _ = &mut startup_deadline => None,
                m = socket.next() => m,
            }
        } else {
            tokio::select! {
                biased;
                // pg_terminate_backend: its statement was stopped; the connection closes with
                // PostgreSQL's FATAL (57P01), idle or between statements.
                _ = &mut terminated => {
                    let fatal = ErrorInfo::new(
                        "FATAL".to_owned(),
                        "57P01".to_owned(),
                        "terminating connection due to administrator command".to_owned(),
                    );
                    let _ = futures::SinkExt::send(
                        &mut socket,
                        PgWireBackendMessage::ErrorResponse(fatal.into()),
                    )
                    .await;
                    break;
                }
                m = socket.next() => m,
                // Upstream mode: what the upstream says while the client is idle (a NOTIFY
                // for its LISTEN) is passed on as it comes.
                idle = async {
                    match forwarding.as_mut() {
                        Some((forwarder, _)) => forwarder.idle_message().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Some((forwarder, _)) = forwarding.as_mut() {
                        forwarder.relay_idle(idle, &mut socket).await?;
                    }
                    continue;
                }
            }
        };
        let Some(Ok(message)) = message else {
            break;
        };
        // Terminate: the client is leaving; close (some clients wait for the close).
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            break;
        }
        // Upstream mode: what is not sluice's own goes upstream; before sluice answers a
        // message itself, what was forwarded before it is answered.
        let message = match forwarding.as_mut() {
            Some((forwarder, connection)) if !starting => match forwarder.route(message) {
                crate::forward::Routed::Upstream(step) => {
                    forwarder.forward(step, &mut socket, connection).await?;
                    continue;
                }
                crate::forward::Routed::Local(message) => {
                    forwarder.settle(&mut socket, connection).await?;
                    message
                }
            },
            _ => message,
        };
        let in_extended = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        let is_cancel = matches!(message, PgWireFrontendMessage::CancelRequest(_));
        let outcome = process_message(
            message,
            &mut socket,
            startup.clone(),
            simple.clone(),
            extended.clone(),
            copy.clone(),
            cancel.clone(),
        )
        .await;
        if let Err(mut e) = outcome {
            errors.on_error(&socket, &mut e);
            let fatal = e.is_fatal();
            process_error(&mut socket, e, in_extended).await?;
            if fatal {
                break;
            }
        }
        if is_cancel {
            break;
        }
    }
    // Whatever is still held (a last answer before Terminate) goes out before the close.
    futures::SinkExt::close(&mut socket).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(payload.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn tracks_message_types_across_split_writes() {
        let mut c = Corked::new(tokio::io::sink());
        let mut bytes = message(b'C', b"SELECT 1\0");
        bytes.extend(message(b'Z', b"I"));
        // One byte at a time: headers and payloads split everywhere.
        for b in &bytes[..bytes.len() - 6] {
            c.track(std::slice::from_ref(b));
        }
        assert_eq!(c.last_type, Some(b'C'));
        for b in &bytes[bytes.len() - 6..] {
            c.track(std::slice::from_ref(b));
        }
        assert_eq!(c.last_type, Some(b'Z'));
        // A payload that contains what looks like a header is skipped as payload.
        c.track(&message(b'D', &message(b'Z', b"I")));
        assert_eq!(c.last_type, Some(b'D'));
    }

    /// Writes one message and flushes, as pgwire's `send` does.
    async fn send<S: AsyncRead + AsyncWrite + Unpin>(c: &mut Corked<S>, kind: u8, payload: &[u8]) {
        use tokio::io::AsyncWriteExt;
        c.write_all(&message(kind, payload)).await.expect("write");
        c.flush().await.expect("flush");
    }

    #[tokio::test]
    async fn holds_middle_flushes_and_sends_before_reading() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (server, mut client) = tokio::io::duplex(1 << 20);
        let mut corked = Corked::new(server);
        send(&mut corked, b'1', b"").await;
        send(&mut corked, b'C', b"SELECT 1\0").await;
        // Held: nothing has reached the client.
        let mut probe = [0u8; 64];
        let wait = std::time::Duration::from_millis(20);
        let early = tokio::time::timeout(wait, client.read(&mut probe)).await;
        assert!(early.is_err(), "nothing sent yet");
        // A NOTICE goes out at once, with all before it.
        send(&mut corked, b'N', b"x\0").await;
        let mut got = vec![0u8; 5 + 14 + 7];
        client.read_exact(&mut got).await.expect("read");
        assert_eq!((got[0], got[5], got[19]), (b'1', b'C', b'N'));
        // Held again, then a read sends it before waiting for the client.
        send(&mut corked, b'2', b"").await;
        client.write_all(b"!").await.expect("write");
        let mut one = [0u8; 1];
        corked.read_exact(&mut one).await.expect("read");
        let mut bind = [0u8; 5];
        client.read_exact(&mut bind).await.expect("read");
        assert_eq!(bind[0], b'2');
    }

    #[tokio::test]
    async fn large_results_are_not_held_past_the_limit() {
        use tokio::io::AsyncReadExt;
        let (server, mut client) = tokio::io::duplex(1 << 20);
        let mut corked = Corked::new(server);
        let row = vec![b'x'; 1000];
        for _ in 0..(HOLD_LIMIT / 1000 + 2) {
            send(&mut corked, b'D', &row).await;
        }
        let mut first = vec![0u8; HOLD_LIMIT];
        client
            .read_exact(&mut first)
            .await
            .expect("rows stream out");
        assert!(corked.held.len() < HOLD_LIMIT);
    }
}

//! The connection loop: TLS negotiation, start-up, then each message of a client's
//! conversation to pgwire's handlers or, in upstream mode, to the [`crate::forward::Forwarder`]
//! — over the framing of [`crate::frame`] (writes batched per response, messages read whole).

use std::io;
use std::sync::Arc;

use pgwire::api::{ClientInfo, ErrorHandler, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{
    negotiate_tls, process_error, process_message, MaybeTls, PgWireMessageServerCodec,
};
use pgwire::tokio::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, Framed, FramedParts};

use crate::frame::{
    buffered_incoming, next_incoming, next_startup, Corked, Incoming, MAX_STARTUP_PACKET,
};

/// How long a client has to finish start-up and authentication (pgwire's own limit).
const STARTUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the first four bytes a client sends could be a start-up packet's length (or an
/// SSL request's, or a TLS record's): a Terminate or garbage is not, and the connection is
/// closed without a word, as PostgreSQL closes it (pgwire would wait for eight bytes that may
/// never come, then answer with an error the client never asked to read). Read by peeking:
/// the bytes stay for the TLS negotiation.
async fn first_length_is_a_packets(tcp: &TcpStream) -> bool {
    let mut head = [0u8; 4];
    if !matches!(peek_all(tcp, &mut head).await, Ok(true)) {
        return false;
    }
    // A TLS ClientHello (direct TLS) begins with a record header, not a length.
    if head[0] == 0x16 || (8..=MAX_STARTUP_PACKET).contains(&u32::from_be_bytes(head)) {
        return true;
    }
    // What has arrived is taken, as PostgreSQL's buffered read takes it: a close with bytes
    // unread would be a reset.
    let mut arrived = [0u8; 8192];
    let _ = tcp.try_read(&mut arrived);
    tracing::debug!("connection closed before its start-up: a length of {head:?}");
    false
}

/// Peeks until `into` is full: `false` if the client closed first. A few bytes so far are
/// waited on (the caller bounds the wait with the start-up deadline).
async fn peek_all(tcp: &TcpStream, into: &mut [u8]) -> io::Result<bool> {
    loop {
        match tcp.peek(into).await? {
            0 => return Ok(false),
            n if n == into.len() => return Ok(true),
            _ => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
        }
    }
}

/// The codes of the requests for an encrypted connection (protocol "versions" 1234.5679 and
/// 1234.5680).
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

/// Answers the encryption requests sluice refuses as PostgreSQL does: 'N' to a GSSENCRequest
/// and, without TLS, to an SSLRequest, each once (a client may try one after the other), and a
/// request made again after its refusal is taken as a start-up packet of protocol 1234.5680
/// (or .5679): FATAL 0A000, the connection closed. pgwire answered 'N' to every SSLRequest,
/// for as long as the client kept asking. With TLS (`ssl_offered`) an SSLRequest is left for
/// pgwire's negotiation, which accepts it. Returns whether the client goes on (the bytes after
/// the requests refused are left unread).
async fn refuse_encryption(tcp: &mut TcpStream, ssl_offered: bool) -> io::Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut ssl_refused, mut gss_refused) = (false, false);
    loop {
        // A start-up packet is at least eight bytes.
        let mut head = [0u8; 8];
        if !peek_all(tcp, &mut head).await? {
            return Ok(false);
        }
        let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        let refused = match (length, code) {
            (8, SSL_REQUEST) if !ssl_offered => &mut ssl_refused,
            (8, GSSENC_REQUEST) => &mut gss_refused,
            _ => return Ok(true),
        };
        // Read, as PostgreSQL reads the packet (a close with bytes unread would be a reset).
        tcp.read_exact(&mut head).await?;
        if *refused {
            let e = sluice_sql::Error::new(
                sluice_sql::ErrorCode::NotImplemented,
                format!(
                    "unsupported frontend protocol {}.{}: server supports 3.0 to 3.0",
                    code >> 16,
                    code & 0xffff
                ),
            );
            tcp.write_all(&fatal_before_startup(&e)).await?;
            return Ok(false);
        }
        tcp.write_all(b"N").await?;
        *refused = true;
    }
}

/// An ErrorResponse with severity FATAL, written before any codec is on the socket.
fn fatal_before_startup(e: &sluice_sql::Error) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', e.sqlstate()),
        (b'M', &e.to_string()),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut message = vec![b'E'];
    message.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    message.extend_from_slice(&body);
    message
}

/// As PostgreSQL answers a message it cannot read: FATAL 08P01 (the connection then closes),
/// with ClickHouse's code name for input that breaks its format.
async fn fatal_protocol_violation<S, T>(
    socket: &mut Framed<Corked<S>, PgWireMessageServerCodec<T>>,
    message: String,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    PgWireMessageServerCodec<T>: tokio_util::codec::Encoder<PgWireBackendMessage>,
{
    let e = sluice_sql::Error::new(
        sluice_sql::ErrorCode::CannotParseInputAssertionFailed,
        message,
    )
    .with_sqlstate("08P01");
    let fatal = ErrorInfo::new("FATAL".to_owned(), e.sqlstate().to_owned(), e.to_string());
    let _ = futures::SinkExt::send(socket, PgWireBackendMessage::ErrorResponse(fatal.into())).await;
}

/// A message of an established session (no COPY under way, no error waiting for its Sync),
/// to its handler: what pgwire's `process_message` does in that state, a CancelRequest (which
/// it answers in any state) aside.
async fn serve_in_session<S, Q, EQ>(
    message: PgWireFrontendMessage,
    socket: &mut Framed<S, PgWireMessageServerCodec<EQ::Statement>>,
    simple: &Q,
    extended: &EQ,
) -> Result<(), PgWireError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
    Q: pgwire::api::query::SimpleQueryHandler,
    EQ: pgwire::api::query::ExtendedQueryHandler,
{
    match message {
        PgWireFrontendMessage::Query(query) => simple.on_query(socket, query).await,
        PgWireFrontendMessage::Parse(parse) => extended.on_parse(socket, parse).await,
        PgWireFrontendMessage::Bind(bind) => extended.on_bind(socket, bind).await,
        PgWireFrontendMessage::Execute(execute) => extended.on_execute(socket, execute).await,
        PgWireFrontendMessage::Describe(describe) => extended.on_describe(socket, describe).await,
        PgWireFrontendMessage::Flush(flush) => extended.on_flush(socket, flush).await,
        PgWireFrontendMessage::Sync(sync) => extended.on_sync(socket, sync).await,
        PgWireFrontendMessage::Close(close) => extended.on_close(socket, close).await,
        _ => Ok(()),
    }
}

/// Serves one client connection: TLS negotiation and the message loop of pgwire's
/// `process_socket`, over a [`Corked`] socket.
pub async fn process_connection<H: PgWireServerHandlers>(
    mut tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    handlers: H,
    terminate: Arc<crate::registry::Flag>,
    mut forwarding: Option<(crate::forward::Forwarder, Arc<crate::session::Connection>)>,
) -> io::Result<()> {
    let startup_deadline = tokio::time::sleep(STARTUP_TIMEOUT);
    tokio::pin!(startup_deadline);
    let negotiated = tokio::select! {
        _ = &mut startup_deadline => return Ok(()),
        socket = async {
            if !first_length_is_a_packets(&tcp).await {
                return Ok(None);
            }
            if !refuse_encryption(&mut tcp, tls.is_some()).await? {
                return Ok(None);
            }
            negotiate_tls(tcp, tls).await
        } => socket?,
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
    // Upstream mode reads the messages it passes on as they are whole, without decoding them.
    let raw_reads: fn(u8) -> bool = if forwarding.is_some() {
        crate::forward::passes_whole
    } else {
        |_| false
    };
    loop {
        let starting = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        let incoming = if starting {
            tokio::select! {
                _ = &mut startup_deadline => None,
                m = next_startup(&mut socket) => m,
            }
        } else if let Some(incoming) = (!terminate.is_raised())
            .then(|| buffered_incoming(&mut socket, raw_reads))
            .flatten()
        {
            // Read already (the rest of a round trip): no wait, so nothing to select.
            Some(incoming)
        } else if let Some((forwarder, connection)) =
            forwarding.as_mut().filter(|(f, _)| f.has_pending())
        {
            // The client waits, having sent extended-protocol messages without a Sync (a
            // libpq pipeline): they are run now, as PostgreSQL runs each message it has read.
            forwarder
                .answer_unsynced(&mut socket, &**connection)
                .await?;
            continue;
        } else {
            tokio::select! {
                biased;
                // pg_terminate_backend: its statement was stopped; the connection closes with
                // PostgreSQL's FATAL (57P01), idle or between statements.
                _ = std::future::poll_fn(|cx| terminate.poll_raised(cx)) => {
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
                m = next_incoming(&mut socket, raw_reads) => m,
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
        // Whatever the client says, answers held for it go before the next read (a Flush asks
        // for them; another unsynced message is held again with its own).
        socket.get_mut().release_held();
        let incoming = match incoming {
            Some(Ok(incoming)) => incoming,
            // Bytes that are no start-up packet (a Terminate, garbage, a length out of
            // bounds) as the first thing said: PostgreSQL only logs "invalid length of
            // startup packet" and closes, telling the client nothing (an error message
            // there is one the client never asked to read).
            Some(Err(e)) if matches!(socket.state(), PgWireConnectionState::AwaitingStartup) => {
                tracing::debug!("connection closed before its start-up: {e}");
                break;
            }
            Some(Err(e)) => {
                let says = match e {
                    // What `frame::malformed` found: said as it is.
                    PgWireError::ApiError(why) => why.to_string(),
                    e => format!("invalid message: {e}"),
                };
                fatal_protocol_violation(&mut socket, says).await;
                break;
            }
            None => break,
        };
        // Upstream mode: what is not sluice's own goes upstream; before sluice answers a
        // message itself, what was forwarded before it is answered. A statement of megabytes
        // is read on a blocking thread, not on this one, which every client of the thread
        // shares.
        let message = match (incoming, forwarding.as_mut()) {
            (Incoming::Raw(frame), Some((forwarder, connection))) => {
                let routed = if crate::forward::Forwarder::reads_apart(&frame) {
                    Box::pin(forwarder.route_raw_apart(frame)).await
                } else {
                    forwarder.route_raw(frame)
                };
                match routed {
                    crate::forward::RoutedRaw::Upstream(step) => {
                        forwarder.forward(step, &mut socket, &**connection).await?;
                        continue;
                    }
                    crate::forward::RoutedRaw::Malformed => {
                        let says =
                            "invalid message format: a string in it is not terminated, or a name not UTF-8";
                        fatal_protocol_violation(&mut socket, says.to_owned()).await;
                        break;
                    }
                    crate::forward::RoutedRaw::Local(mut frame) => {
                        forwarder.settle(&mut socket, &**connection).await?;
                        if forwarder.skips_to_sync() {
                            continue;
                        }
                        if let Err(e) = crate::frame::checked(&frame) {
                            fatal_protocol_violation(&mut socket, e.to_string()).await;
                            break;
                        }
                        match socket.codec_mut().decode(&mut frame) {
                            Ok(Some(message)) => message,
                            _ => break,
                        }
                    }
                }
            }
            // Only a forwarding connection reads messages whole.
            (Incoming::Raw(_), None) => break,
            // Terminate: the client is leaving; close (some clients wait for the close).
            (Incoming::Message(PgWireFrontendMessage::Terminate(_)), _) => break,
            (Incoming::Message(message), Some((forwarder, connection))) if !starting => {
                let routed = if crate::forward::Forwarder::reads_apart(&message) {
                    Box::pin(forwarder.route_apart(message)).await
                } else {
                    forwarder.route(message)
                };
                match routed {
                    crate::forward::Routed::Upstream(step) => {
                        forwarder.forward(step, &mut socket, &**connection).await?;
                        continue;
                    }
                    crate::forward::Routed::Local(message) => {
                        forwarder.settle(&mut socket, &**connection).await?;
                        if forwarder.skips_to_sync() {
                            continue;
                        }
                        message
                    }
                }
            }
            (Incoming::Message(message), _) => message,
        };
        let in_extended = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        let is_cancel = matches!(message, PgWireFrontendMessage::CancelRequest(_));
        // A session's round trips go straight to their handlers: `process_message` takes each
        // handler by value (five reference counts up and down a message) and is one future
        // for every state, start-up's included. The states it treats apart go through it.
        let outcome = match (socket.state(), message) {
            (
                PgWireConnectionState::ReadyForQuery | PgWireConnectionState::QueryInProgress,
                message,
            ) if !is_cancel => serve_in_session(message, &mut socket, &*simple, &*extended).await,
            (_, message) => {
                process_message(
                    message,
                    &mut socket,
                    startup.clone(),
                    simple.clone(),
                    extended.clone(),
                    copy.clone(),
                    cancel.clone(),
                )
                .await
            }
        };
        // Start-up done: a session-pooled client's upstream backend goes to its forwarder.
        if starting && matches!(socket.state(), PgWireConnectionState::ReadyForQuery) {
            if let Some((forwarder, _)) = forwarding.as_mut() {
                forwarder.adopt(&socket);
            }
        }
        if let Err(mut e) = outcome {
            errors.on_error(&socket, &mut e);
            if e.is_fatal() {
                // PostgreSQL's FATAL is the last message: no ReadyForQuery after it (pgwire's
                // `process_error` sends one, and a client then sees a session that is gone).
                let info: ErrorInfo = e.into();
                futures::SinkExt::send(
                    &mut socket,
                    PgWireBackendMessage::ErrorResponse(info.into()),
                )
                .await?;
                break;
            }
            process_error(&mut socket, e, in_extended).await?;
        }
        if is_cancel {
            break;
        }
    }
    // Whatever is still held (a last answer before Terminate) goes out before the close.
    futures::SinkExt::close(&mut socket).await
}

//! The wire's framing under the connection loop: messages read whole or decoded
//! ([`Incoming`], [`next_incoming`]), and writes batched per response ([`Corked`]).
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
//!   is held, so no client can wait on an answer the server has not sent — except answers to
//!   extended-protocol messages that came without a Sync or a Flush
//!   ([`Corked::hold_through_reads`]): PostgreSQL holds those until the client asks (or until
//!   an error, or a full buffer), and a libpq pipeline relies on it.
//! - A NOTICE (a query waiting for admission says so) and every message that ends a response
//!   or asks the client for something go out at once.
//! - At most [`HOLD_LIMIT`] bytes are held; a large result streams as before.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use pgwire::api::{ClientInfo, PgWireConnectionState};
use pgwire::error::PgWireError;
use pgwire::messages::PgWireFrontendMessage;
use pgwire::tokio::server::PgWireMessageServerCodec;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::codec::{Decoder, Framed};

/// Messages sluice writes itself, whole (type byte, length word, body): each built in one
/// place instead of spelled as bytes where it is sent.
pub mod messages {
    use pgwire::messages::response::TransactionStatus;

    /// ReadyForQuery with the transaction's status.
    pub fn ready_for_query(status: TransactionStatus) -> [u8; 6] {
        [b'Z', 0, 0, 0, 5, status as u8]
    }

    /// A message without a body: ParseComplete (`1`), BindComplete (`2`), CloseComplete
    /// (`3`), NoData (`n`), a frontend Sync (`S`), …
    pub const fn bodiless(tag: u8) -> [u8; 5] {
        [tag, 0, 0, 0, 4]
    }

    /// CommandComplete with `tag`.
    pub fn command_complete(tag: &str) -> Vec<u8> {
        let mut out = vec![b'C'];
        out.extend_from_slice(&(tag.len() as u32 + 5).to_be_bytes());
        out.extend_from_slice(tag.as_bytes());
        out.push(0);
        out
    }

    /// The frontend's Sync.
    pub const SYNC: [u8; 5] = bodiless(b'S');

    /// ParseComplete's type byte.
    pub const PARSE_COMPLETE: u8 = b'1';
    /// CloseComplete's type byte.
    pub const CLOSE_COMPLETE: u8 = b'3';

    /// The transaction status a ReadyForQuery's status byte says (anything unknown is idle).
    pub fn transaction_status(byte: u8) -> TransactionStatus {
        match byte {
            b'T' => TransactionStatus::Transaction,
            b'E' => TransactionStatus::Error,
            _ => TransactionStatus::Idle,
        }
    }
}

/// Bytes held back at most before they are written anyway.
pub const HOLD_LIMIT: usize = 64 * 1024;

/// What [`Corked`] keeps of the room it held an answer in while it waits for the client.
const KEPT_HELD: usize = 16 * 1024;

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
    /// What is held stays held while the connection reads, until a flush sends it.
    through_reads: bool,
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
            through_reads: false,
        }
    }

    /// Keeps what is held (answers to messages the client sent without a Sync or a Flush)
    /// while the connection reads, as PostgreSQL keeps them in its output buffer: the next
    /// flush of a response's end (an error, a ReadyForQuery) sends them, as does reaching
    /// [`HOLD_LIMIT`].
    pub fn hold_through_reads(&mut self) {
        self.through_reads = !self.held.is_empty();
    }

    /// The client said something (a Flush asks for what is held): what is held goes before
    /// the next read again.
    pub fn release_held(&mut self) {
        self.through_reads = false;
    }

    /// Holds a message (`header`, then `body`) as a write would, without a write's future:
    /// `false`, and nothing held, when [`HOLD_LIMIT`] is reached (a write sends what is held
    /// first).
    pub fn hold(&mut self, header: &[u8], body: &[u8]) -> bool {
        if self.held.len() >= HOLD_LIMIT {
            return false;
        }
        if self.skip == 0 && self.header.is_empty() && header.len() == 5 {
            // At a message boundary, with a whole message: nothing to follow through it.
            debug_assert_eq!(
                u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize,
                body.len() + 4
            );
            self.last_type = Some(header[0]);
            self.held.extend_from_slice(header);
            self.held.extend_from_slice(body);
            return true;
        }
        self.append(header);
        self.append(body);
        true
    }

    /// Adds `buf` to what is held, following its message boundaries.
    fn append(&mut self, buf: &[u8]) {
        self.track(buf);
        self.held.extend_from_slice(buf);
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
        self.through_reads = false;
        Pin::new(&mut self.inner).poll_flush(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Corked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // About to wait for the client: it must have every answer first (unless it has not
        // asked for them yet).
        if !self.through_reads {
            ready!(self.poll_send_held(cx))?;
            // A long answer's room is not kept while the client is idle (it is made again,
            // once per answer, not per write, if the next answer is long too).
            if self.held.capacity() > KEPT_HELD {
                self.held = Vec::new();
            }
        }
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
        self.append(buf);
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

/// A client message as the connection loop reads it.
#[derive(Debug)]
pub enum Incoming {
    /// Decoded by pgwire's codec.
    Message(PgWireFrontendMessage),
    /// Read whole and not decoded: its bytes as the client sent them (type, length, body),
    /// for the forwarder to pass upstream as they are.
    Raw(BytesMut),
}

/// The largest message read whole: pgwire's own bound for the largest messages (a Bind's
/// parameters, a COPY's data); a message type it bounds lower is bounded so here too.
const RAW_LIMIT: usize = 0x3fff_fffe;
const SMALL_RAW_LIMIT: usize = 10_000;

/// How much more is read at a time while a long message is incomplete: a hostile length
/// announces a gigabyte, but only what arrives is ever held.
const READ_CHUNK: usize = 64 * 1024;

/// The room a read is given when no long message is under way. Small, so that the buffer the
/// connection started with (pgwire's 8 KiB) is reused in place once its messages are consumed:
/// asking for [`READ_CHUNK`] each time the room ran low outgrew it, and every client that had
/// run a few hundred statements held a read buffer of 64–128 KiB for as long as it stayed
/// connected (BENCHMARKS.md, issue 38 session 40).
const READ_ROOM: usize = 4 * 1024;

/// A message longer than this leaves the read buffer it grew behind: what was read after it
/// moves to a buffer of pgwire's initial size, so that an idle client keeps no more than a
/// busy one needs. pgwire's encoding buffer is let go past it too.
const KEPT_BUFFER: usize = 64 * 1024;
const INITIAL_READ_BUFFER: usize = 8 * 1024;

/// The client's next message after start-up: whole, as bytes, when `raw` says so of its type,
/// else decoded by the socket's codec (as `Framed` itself would). `None` when the client is
/// gone (an end of stream, mid-message or not). Cancel-safe: bytes read stay in the socket's
/// read buffer, where the next call (or pgwire) finds them.
pub async fn next_incoming<S, T>(
    socket: &mut Framed<Corked<S>, PgWireMessageServerCodec<T>>,
    raw: fn(u8) -> bool,
) -> Option<Result<Incoming, PgWireError>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        if let Some(incoming) = buffered_incoming(socket, raw) {
            return Some(incoming);
        }
        if !read_more(socket).await {
            return None;
        }
    }
}

/// More bytes into the socket's own read buffer, taken and put back within one poll (so that
/// dropping this future loses nothing). `false` at the end of the stream or on an error.
/// A plain poll function, not an `async fn`: the read of every round trip awaits it, and a
/// nested state machine would cost each one.
pub(crate) fn read_more<'a, S, T>(
    socket: &'a mut Framed<Corked<S>, PgWireMessageServerCodec<T>>,
) -> impl std::future::Future<Output = bool> + 'a
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    std::future::poll_fn(move |cx| {
        let mut bytes = std::mem::take(socket.read_buffer_mut());
        if bytes.capacity() - bytes.len() < 1024 {
            bytes.reserve(read_room(&bytes));
        }
        // pgwire's encoding buffer, grown by a long message sent (a row of megabytes), is let
        // go too: it is empty whenever the connection reads.
        let written = socket.write_buffer_mut();
        if written.is_empty() && written.capacity() > KEPT_BUFFER {
            *written = BytesMut::new();
        }
        let polled = tokio_util::io::poll_read_buf(Pin::new(socket.get_mut()), cx, &mut bytes);
        *socket.read_buffer_mut() = bytes;
        polled.map(|read| matches!(read, Ok(n) if n > 0))
    })
}

/// How much room to make in `buffered` for the next read: what the message under way still
/// lacks, a chunk at most, when it is long; else [`READ_ROOM`].
fn read_room(buffered: &BytesMut) -> usize {
    let lacking = match buffered.get(..5) {
        Some(&[_, a, b, c, d]) => {
            (1 + u32::from_be_bytes([a, b, c, d]) as usize).saturating_sub(buffered.len())
        }
        _ => 0,
    };
    lacking.clamp(READ_ROOM, READ_CHUNK)
}

/// Moves what `buffer` holds after a long message taken from it to a buffer of the initial
/// size (the long message's allocation goes with the message).
fn leave_long_buffer(buffer: &mut BytesMut) {
    let mut fresh = BytesMut::with_capacity(INITIAL_READ_BUFFER.max(buffer.len()));
    fresh.extend_from_slice(buffer);
    *buffer = fresh;
}

/// PostgreSQL's bound on a start-up packet (`MAX_STARTUP_PACKET_LENGTH`).
pub(crate) const MAX_STARTUP_PACKET: u32 = 10_000;

/// A start-up message (or, during authentication, a password message). Before the start-up
/// packet, its length is judged as soon as its four bytes are in, as PostgreSQL judges it:
/// out of bounds (a Terminate, garbage) is an error at once, not a wait for bytes that will
/// never come.
pub(crate) async fn next_startup<S, T>(
    socket: &mut Framed<Corked<S>, PgWireMessageServerCodec<T>>,
) -> Option<Result<Incoming, PgWireError>>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    loop {
        if matches!(socket.state(), PgWireConnectionState::AwaitingStartup) {
            if let Some(&[a, b, c, d]) = socket.read_buffer().get(..4) {
                let len = u32::from_be_bytes([a, b, c, d]);
                if !(8..=MAX_STARTUP_PACKET).contains(&len) {
                    return Some(Err(PgWireError::InvalidStartupMessage));
                }
            }
        }
        if let Some(incoming) = buffered_incoming(socket, |_| false) {
            return Some(incoming);
        }
        if !read_more(socket).await {
            return None;
        }
    }
}

/// The client's next message if its socket has already read it whole (see
/// [`next_incoming`]), without waiting: a round trip's Bind, Describe, Execute and Sync come
/// in one read, and only the first of them needs a wait.
pub fn buffered_incoming<S, T>(
    socket: &mut Framed<Corked<S>, PgWireMessageServerCodec<T>>,
    raw: fn(u8) -> bool,
) -> Option<Result<Incoming, PgWireError>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let buffered = socket.read_buffer();
    let &tag = buffered.first()?;
    if raw(tag) {
        if buffered.len() < 5 {
            return None;
        }
        let len = u32::from_be_bytes([buffered[1], buffered[2], buffered[3], buffered[4]]) as usize;
        let limit = if matches!(tag, b'Q' | b'B' | b'd' | b'P') {
            RAW_LIMIT
        } else {
            SMALL_RAW_LIMIT
        };
        if !(4..=limit).contains(&len) {
            return Some(Err(PgWireError::MessageTooLarge(limit, len)));
        }
        if buffered.len() <= len {
            return None;
        }
        // A Parse is decoded as any message, unless its text is not UTF-8 (a client_encoding
        // other than UTF8): decoding would replace its bytes, so it is passed on as it came.
        if tag != b'P' || !parse_text_is_utf8(&buffered[..1 + len]) {
            let frame = socket.read_buffer_mut().split_to(1 + len);
            if len > KEPT_BUFFER {
                leave_long_buffer(socket.read_buffer_mut());
            }
            return Some(Ok(Incoming::Raw(frame)));
        }
    }
    // A whole message's body is checked before pgwire decodes it (its decoders trust the
    // counts and lengths in it, and panic past its end). A message read whole is passed on
    // as bytes: the upstream judges it (or `checked` does, before sluice decodes one).
    let whole = whole_frame(socket.read_buffer());
    if let Some(Err(e)) = whole.map(checked) {
        return Some(Err(e));
    }
    let long = whole.is_some_and(|f| f.len() > KEPT_BUFFER);
    // The codec and the bytes are both the socket's: the buffer is lent to it.
    let mut bytes = std::mem::take(socket.read_buffer_mut());
    let decoded = socket.codec_mut().decode(&mut bytes);
    if long {
        leave_long_buffer(&mut bytes);
    }
    *socket.read_buffer_mut() = bytes;
    match decoded {
        Ok(Some(message)) => Some(Ok(Incoming::Message(message))),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    }
}

/// Nothing, if [`malformed`] finds nothing wrong with `frame`; else the error that says what
/// (`FATAL 08P01` when the connection loop sends it).
pub(crate) fn checked(frame: &[u8]) -> Result<(), PgWireError> {
    match malformed(frame) {
        None => Ok(()),
        Some(why) => Err(PgWireError::ApiError(
            format!("invalid message format: {why}").into(),
        )),
    }
}

/// The first message of `buffered` if all of it is there (type byte, length, body).
fn whole_frame(buffered: &[u8]) -> Option<&[u8]> {
    let len = u32::from_be_bytes(buffered.get(1..5)?.try_into().ok()?) as usize;
    buffered.get(..len.checked_add(1)?)
}

/// What is wrong with a whole frontend message's body, if anything: each field it must hold,
/// in order, and nothing after them — PostgreSQL's reading (`pq_getmsg*`, `pq_getmsgend`) of
/// the messages after start-up. Messages of other types are for their readers to judge.
pub(crate) fn malformed(frame: &[u8]) -> Option<&'static str> {
    struct Body<'a>(&'a [u8]);
    impl Body<'_> {
        fn take(&mut self, n: usize) -> Option<&[u8]> {
            if self.0.len() < n {
                return None;
            }
            let (taken, rest) = self.0.split_at(n);
            self.0 = rest;
            Some(taken)
        }
        fn cstring(&mut self) -> Option<()> {
            let end = memchr::memchr(0, self.0)?;
            self.0 = &self.0[end + 1..];
            Some(())
        }
        fn int16(&mut self) -> Option<i16> {
            self.take(2).map(|b| i16::from_be_bytes([b[0], b[1]]))
        }
        fn int32(&mut self) -> Option<i32> {
            self.take(4)
                .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        }
        /// A count (an unsigned Int16, as PostgreSQL reads it), then that many of `each`.
        fn counted(&mut self, mut each: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
            let n = self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))?;
            (0..n).try_for_each(|_| each(self))
        }
        /// A value: its length (-1 for NULL), then its bytes.
        fn value(&mut self) -> Option<()> {
            match self.int32()? {
                -1 => Some(()),
                n => self.take(usize::try_from(n).ok()?).map(|_| ()),
            }
        }
        fn end(&self) -> Option<()> {
            self.0.is_empty().then_some(())
        }
    }
    let (&tag, rest) = frame.split_first()?;
    let Some(body) = rest.get(4..) else {
        return Some("a message's length counts its own four bytes");
    };
    let mut body = Body(body);
    let read = match tag {
        b'Q' => body.cstring().and_then(|()| body.end()),
        b'P' => body
            .cstring()
            .and_then(|()| body.cstring())
            .and_then(|()| body.counted(|b| b.int32().map(|_| ())))
            .and_then(|()| body.end()),
        b'B' => body
            .cstring()
            .and_then(|()| body.cstring())
            .and_then(|()| body.counted(|b| b.int16().map(|_| ())))
            .and_then(|()| body.counted(Body::value))
            .and_then(|()| body.counted(|b| b.int16().map(|_| ())))
            .and_then(|()| body.end()),
        b'D' | b'C' => body
            .take(1)
            .filter(|kind| matches!(kind[0], b'S' | b'P'))
            .map(|_| ())
            .and_then(|()| body.cstring())
            .and_then(|()| body.end()),
        b'E' => body
            .cstring()
            .and_then(|()| body.int32().map(|_| ()))
            .and_then(|()| body.end()),
        b'F' => body
            .int32()
            .and_then(|_| body.counted(|b| b.int16().map(|_| ())))
            .and_then(|()| body.counted(Body::value))
            .and_then(|()| body.int16().map(|_| ()))
            .and_then(|()| body.end()),
        b'H' | b'S' => body.end(),
        b'f' => body.cstring().and_then(|()| body.end()),
        _ => Some(()),
    };
    read.is_none().then_some(match tag {
        b'Q' => "a Query is one string",
        b'P' => "a Parse is a name, a text, a count of parameter types and each type",
        b'B' => {
            "a Bind is a portal, a statement, format codes, values and result formats, each counted"
        }
        b'D' => "a Describe is 'S' or 'P' and a name",
        b'C' => "a Close is 'S' or 'P' and a name",
        b'E' => "an Execute is a portal and a row count",
        b'F' => "a FunctionCall is a function, format codes, arguments and a result format",
        b'f' => "a CopyFail is one string",
        _ => "this message has no body",
    })
}

/// Whether a whole Parse message's statement text is UTF-8 (a malformed one counts as such:
/// the decoder then says what is wrong with it).
fn parse_text_is_utf8(frame: &[u8]) -> bool {
    let Some(body) = frame.get(5..) else {
        return true;
    };
    let Some(name_end) = memchr::memchr(0, body) else {
        return true;
    };
    let text = &body[name_end + 1..];
    match memchr::memchr(0, text) {
        Some(end) => std::str::from_utf8(&text[..end]).is_ok(),
        None => true,
    }
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
    fn message_bodies_are_read_as_postgres_reads_them() {
        use pgwire::messages::extendedquery::{Bind, Close, Describe, Execute, Parse, Sync};
        use pgwire::messages::simplequery::Query;
        use pgwire::messages::Message;
        fn encoded(m: &impl Message) -> Vec<u8> {
            let mut out = BytesMut::new();
            m.encode(&mut out).expect("encodes");
            out.to_vec()
        }
        let well_formed = [
            encoded(&Query::new("SELECT 1".into())),
            encoded(&Parse::new(Some("s1".into()), "SELECT $1".into(), vec![23])),
            encoded(&Bind::new(
                None,
                Some("s1".into()),
                vec![0, 1],
                vec![Some(bytes::Bytes::from_static(b"42")), None],
                vec![1],
            )),
            encoded(&Describe::new(b'S', Some("s1".into()))),
            encoded(&Close::new(b'P', None)),
            encoded(&Execute::new(None, 0)),
            encoded(&Sync::new()),
            message(b'H', b""),
            message(b'd', b"anything at all"),
        ];
        for frame in &well_formed {
            assert_eq!(malformed(frame), None, "{frame:?}");
            // Cut short anywhere, or with a byte more, it is not (a CopyData is any bytes).
            if frame[0] == b'd' {
                continue;
            }
            for cut in 5..frame.len() {
                assert!(
                    malformed(&message(frame[0], &frame[5..cut])).is_some(),
                    "{frame:?} cut at {cut}"
                );
            }
            let mut longer = frame[5..].to_vec();
            longer.push(0);
            assert!(
                malformed(&message(frame[0], &longer)).is_some(),
                "{frame:?} + 1"
            );
        }
        // What the fuzzer found: a length short of its own four bytes, a Parse that counts
        // more parameter types than it holds.
        assert!(malformed(b"P\0\0\0\x03").is_some());
        assert!(malformed(&message(b'P', b"\0SELECT 1\0\0\x05")).is_some());
        // A value length below -1; a Describe of neither kind.
        let mut bind = b"\0\0\0\0\0\x01".to_vec();
        bind.extend_from_slice(&(-2i32).to_be_bytes());
        bind.extend_from_slice(b"\0\0");
        assert!(malformed(&message(b'B', &bind)).is_some());
        assert!(malformed(&message(b'D', b"Xs1\0")).is_some());
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

    #[tokio::test]
    async fn a_held_message_is_sent_like_a_written_one() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (server, mut client) = tokio::io::duplex(1 << 20);
        let mut c = Corked::new(server);
        let row = message(b'D', b"\0\0\0\0");
        assert!(c.hold(&row[..5], &row[5..]));
        assert_eq!(c.last_type, Some(b'D'));
        // A row in the middle of an answer stays held through a flush; the end sends both.
        c.flush().await.expect("flush");
        let done = message(b'Z', b"I");
        assert!(c.hold(&done[..5], &done[5..]));
        c.flush().await.expect("flush");
        let mut got = vec![0; row.len() + done.len()];
        client.read_exact(&mut got).await.expect("read");
        assert_eq!(got, [row.clone(), done].concat());
        // Past the limit nothing more is held: the caller writes (which sends first).
        c.held = vec![0; HOLD_LIMIT];
        assert!(!c.hold(&row[..5], &row[5..]));
        assert_eq!(c.held.len(), HOLD_LIMIT);
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

    /// A client socket as the connection loop reads it (pgwire's codec, its 8 KiB buffers).
    fn framed<S>(io: S) -> Framed<Corked<S>, PgWireMessageServerCodec<String>> {
        let mut client =
            pgwire::api::DefaultClient::new("127.0.0.1:5432".parse().expect("addr"), false);
        client.state = PgWireConnectionState::ReadyForQuery;
        Framed::new(Corked::new(io), PgWireMessageServerCodec::new(client))
    }

    /// What a connection keeps between statements: the read buffer it started with, however
    /// many statements it reads (the room asked for each read is reclaimed in place; asking for
    /// a 64 KiB chunk each time grew it to 64–128 KiB), and, after a long message, a buffer of
    /// the initial size again — read whole or decoded.
    #[tokio::test]
    async fn the_buffers_stay_small_between_statements() {
        use tokio::io::AsyncWriteExt;
        let (server, mut client) = tokio::io::duplex(4 << 20);
        let mut socket = framed(server);
        let query = message(
            b'Q',
            b"SELECT abalance FROM pgbench_accounts WHERE aid = 42;\0",
        );
        let mut largest = 0;
        for raw in [true, false] {
            let reads: fn(u8) -> bool = if raw { |_| true } else { |_| false };
            for _ in 0..1000 {
                client.write_all(&query).await.expect("write");
                let read = next_incoming(&mut socket, reads).await;
                let expected = if raw { "Raw" } else { "Message(Query" };
                assert!(
                    format!("{read:?}").starts_with(&format!("Some(Ok({expected}")),
                    "{read:?}"
                );
                assert!(socket.read_buffer().is_empty());
                largest = largest.max(socket.read_buffer().capacity());
            }
            assert!(largest <= INITIAL_READ_BUFFER, "read buffer room {largest}");
            // A statement of 1 MiB, and a short one behind it in the same write.
            let mut text = vec![b'x'; 1 << 20];
            text.push(0);
            let mut long = message(b'Q', &text);
            long.extend_from_slice(&query);
            client.write_all(&long).await.expect("write");
            let read = next_incoming(&mut socket, reads).await;
            assert!(matches!(read, Some(Ok(_))), "{read:?}");
            drop(read);
            assert!(
                socket.read_buffer().capacity() <= INITIAL_READ_BUFFER,
                "after a long message, room {}",
                socket.read_buffer().capacity()
            );
            assert_eq!(
                &socket.read_buffer()[..],
                &query[..],
                "what came behind it kept"
            );
            let read = next_incoming(&mut socket, reads).await;
            assert!(matches!(read, Some(Ok(_))), "{read:?}");
        }
        // pgwire's encoding buffer after a long message written: let go at the next read.
        socket.write_buffer_mut().reserve(1 << 20);
        client.write_all(&query).await.expect("write");
        let read = next_incoming(&mut socket, |_| true).await;
        assert!(matches!(read, Some(Ok(_))), "{read:?}");
        assert!(socket.write_buffer().capacity() <= KEPT_BUFFER);
    }

    /// What [`Corked`] held a long answer in is not kept while it waits for the client.
    #[tokio::test]
    async fn a_long_answer_is_not_held_on_to() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (server, mut client) = tokio::io::duplex(1 << 20);
        let mut corked = Corked::new(server);
        let row = vec![b'x'; 1000];
        for _ in 0..40 {
            send(&mut corked, b'D', &row).await;
        }
        assert!(corked.held.capacity() > KEPT_HELD);
        client.write_all(b"!").await.expect("write");
        let mut one = [0u8; 1];
        corked.read_exact(&mut one).await.expect("read");
        assert!(corked.held.capacity() <= KEPT_HELD);
        let mut answer = vec![0u8; 40 * 1005];
        client
            .read_exact(&mut answer)
            .await
            .expect("the answer sent");
    }
}

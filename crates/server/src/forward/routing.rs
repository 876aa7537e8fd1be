//! Routing a forwarding client's messages: which statements are sluice's own and which go
//! upstream ([`is_sluices`]), what each forwarded statement is ([`Forwarded`], [`Prepared`]),
//! and each message's way ([`Forwarder::route`], [`Forwarder::route_raw`]), with the client's
//! names of statements and portals followed as it defines and drops them.

use super::*;

/// Whether a statement is sluice's own in upstream mode (everything else is forwarded).
pub fn is_sluices(statement: &ClientStatement) -> bool {
    match statement {
        ClientStatement::Workload(_)
        | ClientStatement::KillQuery { .. }
        | ClientStatement::MoveQuery { .. }
        | ClientStatement::SignalBackend { .. }
        | ClientStatement::Fingerprint { .. }
        | ClientStatement::ShowEntities(_)
        | ClientStatement::ShowCreate { .. } => true,
        ClientStatement::Set { name, .. } | ClientStatement::Show(name) => {
            crate::settings::KNOWN_SETTINGS.contains(&name.as_str())
        }
        ClientStatement::Query(query) => mentions_system(&query.text),
        ClientStatement::Transaction(_)
        | ClientStatement::Declare { .. }
        | ClientStatement::Fetch { .. }
        | ClientStatement::Close(_)
        | ClientStatement::CopyOut { .. } => false,
    }
}

/// `system.` as the start of a qualified name (not inside another identifier).
pub(super) fn mentions_system(text: &str) -> bool {
    let bytes = text.as_bytes();
    sluice_sql::mention_places(text, "system.").any(|i| {
        i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric() || matches!(bytes[i - 1], b'_' | b'.' | b'"'))
    })
}

/// A text to forward: what reaches the upstream (the `SETTINGS` tail cut), and the statement
/// as admission sees it.
#[derive(Debug, Clone)]
pub struct Forwarded {
    /// What goes upstream (shared with the text it came in, when it is all of it).
    pub(super) sql: Arc<str>,
    pub(super) query: Query,
    /// Whether running it may change the session's state beyond the transaction.
    pub(super) changes_session: bool,
    /// What its admission keeps for its next runs (a prepared statement's).
    pub(super) memo: StatementMemo,
}

impl Forwarded {
    pub(super) fn new(sql: &str, query: Query, changes_session: bool) -> Forwarded {
        // One copy of the text when what goes upstream is the statement whole.
        let sql = if sql == &*query.text {
            query.text.clone()
        } else {
            Arc::from(sql)
        };
        Forwarded {
            sql,
            query,
            changes_session,
            memo: StatementMemo::default(),
        }
    }
}

/// `text` as one forwarded statement; `None` if it is sluice's own.
pub(super) fn forwarded(text: &str) -> Option<Forwarded> {
    forwarded_as(text, sluice_sql::statement(text))
}

/// [`forwarded`], for a statement already read (`statement` is what [`sluice_sql::statement`]
/// makes of `text`).
pub(super) fn forwarded_as(
    text: &str,
    statement: sluice_sql::Result<Option<ClientStatement>>,
) -> Option<Forwarded> {
    let statement = match statement {
        Ok(Some(s)) => s,
        // Empty, or not one statement sluice can read: the upstream says what it makes of it.
        Ok(None) | Err(_) => return Some(Forwarded::new(text, utility(text), false)),
    };
    if is_sluices(&statement) {
        return None;
    }
    Some(match statement {
        ClientStatement::Query(query) => {
            // The text as written, or without its SETTINGS tail when it has one.
            let cut = (!query.settings.is_empty()).then(|| query.text.clone());
            let changes_session = !matches!(
                query.kind,
                StatementKind::Select
                    | StatementKind::Insert
                    | StatementKind::Update
                    | StatementKind::Delete
            ) || sluice_sql::mentions(text, "set_config")
                || sluice_sql::mentions(text, "pg_advisory")
                || sluice_sql::mentions(text, "prepare");
            Forwarded::new(cut.as_deref().unwrap_or(text), query, changes_session)
        }
        ClientStatement::Transaction(_) => tail_cut(text, false),
        _ => tail_cut(text, true),
    })
}

/// A statement that is not a query (`SHOW`, `COPY`, a cursor, transaction control) with its
/// `SETTINGS` tail, if any, cut off and honoured like a query's.
pub(super) fn tail_cut(text: &str, changes_session: bool) -> Forwarded {
    match sluice_sql::split_settings(text) {
        Ok(markup) if !markup.settings.is_empty() => {
            let query = Query {
                settings: markup.settings,
                ..utility(&markup.query)
            };
            Forwarded::new(&markup.query, query, changes_session)
        }
        _ => Forwarded::new(text, utility(text), changes_session),
    }
}

pub(super) fn utility(text: &str) -> Query {
    Query {
        text: Arc::from(text),
        settings: Vec::new(),
        kind: StatementKind::Utility,
        literals: Vec::new(),
        nesting: 0,
    }
}

/// One statement of a simple Query: where it is in the text, and what is forwarded of it
/// (`None`: it is sluice's own).
pub(super) type Piece = (std::ops::Range<usize>, Option<Forwarded>);

/// How the simple Queries a client sends again with new integers were read: by the text's
/// [`sluice_sql::integer_shape`], what its one forwarded statement is, so that the next text
/// of that shape (`… WHERE id = 42`, then `43`: most of a client's traffic, often) is not
/// lexed and classified again. Only a text of one `SELECT`, `INSERT`, `UPDATE` or `DELETE`
/// without a `SETTINGS` tail is kept: its reading holds for every text of its shape (see
/// `integer_shape`; a text sluice answers itself, or one that did not read, is read anew).
#[derive(Default)]
pub(super) struct Shapes {
    read: HashMap<Vec<u8>, Arc<Shape>, foldhash::fast::RandomState>,
    /// The key of the text at hand, built in place (a text seen before allocates none).
    key: Vec<u8>,
    /// The last text read by its shape, with the shape: the next text is first compared with
    /// it ([`sluice_sql::same_integer_shape`]), which is cheaper than building its key and
    /// looking that up, and is what a client repeating one statement needs.
    last: Option<(Vec<u8>, Arc<Shape>)>,
}

/// A forwarded statement as [`Shapes`] keeps it.
struct Shape {
    kind: StatementKind,
    nesting: usize,
    changes_session: bool,
    /// What comes before and after the statement's own text (whitespace, a `;`): the same in
    /// every text of the shape, as it holds no digit.
    lead: usize,
    trail: usize,
    fingerprint: Arc<sluice_sql::Fingerprint>,
}

/// Shapes a client keeps at most (then they are forgotten and read anew), and the longest
/// text kept: the memo is for the statements a client repeats.
/// A Query's or Parse's text longer than this is read (lexed, split into statements) on a
/// blocking thread ([`Forwarder::route_raw_apart`]), not on the connection thread, which every
/// client of the thread shares: reading costs ~75 instructions a byte, so an 8 MB statement
/// held every other client of the thread ~0.1–0.2 s (release) where it now holds only its own.
const READ_AHEAD_BYTES: usize = sluice_sql::lexer::READ_APART_BYTES;

/// What a long Query's or Parse's text reads as, read apart ([`Forwarder::route_raw_apart`]).
#[derive(Debug)]
pub enum ReadAhead {
    /// A Query's pieces ([`query_pieces`]).
    Query(Option<Vec<Piece>>),
    /// A Parse's statement ([`forwarded`]).
    Parse(Option<Forwarded>),
}

/// A raw simple Query's text, up to its NUL (invalid UTF-8 made valid, as pgwire's decoder
/// does), and whether it was valid; `None` without the NUL (no message PostgreSQL would read
/// either).
fn query_text(frame: &[u8]) -> Option<(std::borrow::Cow<'_, str>, bool)> {
    let body = frame.get(5..)?;
    let text = &body[..memchr::memchr(0, body)?];
    Some(match std::str::from_utf8(text) {
        Ok(text) => (std::borrow::Cow::Borrowed(text), true),
        Err(_) => (String::from_utf8_lossy(text), false),
    })
}

/// A message whose text [`Forwarder::route`] or [`Forwarder::route_raw`] reads: how long it
/// is, and what they would read of it (`None` for a message without such a text, or one that
/// cannot be read: routing says so).
pub trait AsText: Send + 'static {
    fn text_len(&self) -> usize;
    fn read_text(&self) -> Option<ReadAhead>;
}

impl AsText for BytesMut {
    fn text_len(&self) -> usize {
        self.len()
    }

    fn read_text(&self) -> Option<ReadAhead> {
        match self.first() {
            Some(b'Q') => Some(ReadAhead::Query(query_pieces(&query_text(self)?.0))),
            Some(b'P') => {
                let (_, text) = parse_names(self)?;
                Some(ReadAhead::Parse(forwarded(&String::from_utf8_lossy(
                    &self[text],
                ))))
            }
            _ => None,
        }
    }
}

impl AsText for PgWireFrontendMessage {
    fn text_len(&self) -> usize {
        match self {
            PgWireFrontendMessage::Parse(p) => p.query.len(),
            _ => 0,
        }
    }

    fn read_text(&self) -> Option<ReadAhead> {
        match self {
            PgWireFrontendMessage::Parse(p) => Some(ReadAhead::Parse(forwarded(&p.query))),
            _ => None,
        }
    }
}

impl ReadAhead {
    /// Each forwarded statement's fingerprint made now, on the reading thread: admission
    /// takes it from the statement's memo ([`StatementMemo::with_fingerprint`]) instead of
    /// lexing the text's first [`sluice_sql::lexer::FINGERPRINTED_BYTES`] on the connection
    /// thread (~30 ms release for a text that long) and keying its cache by a copy of the text.
    fn fingerprinted(mut self) -> ReadAhead {
        let mut stamp = |forwarded: &mut Forwarded| {
            let fingerprint = Arc::new(sluice_sql::fingerprint(&forwarded.query.text));
            forwarded.memo = StatementMemo::with_fingerprint(fingerprint);
        };
        match &mut self {
            ReadAhead::Query(Some(pieces)) => pieces
                .iter_mut()
                .filter_map(|(_, f)| f.as_mut())
                .for_each(&mut stamp),
            ReadAhead::Parse(Some(forwarded)) => stamp(forwarded),
            ReadAhead::Query(None) | ReadAhead::Parse(None) => {}
        }
        self
    }
}

/// Reads `message`'s text on a blocking thread; the message comes back with what was read
/// (and its statements' fingerprints: [`ReadAhead::fingerprinted`]).
async fn read_apart<M: AsText>(message: M) -> (M, Option<ReadAhead>) {
    tokio::task::spawn_blocking(move || {
        // A panic is the lexer's bug, not the client's: the message is read again in line
        // (where it would meet the same bug as any other message).
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            message.read_text().map(ReadAhead::fingerprinted)
        }));
        (message, read.ok().flatten())
    })
    .await
    .expect("the reading catches its panics")
}

/// Where a raw Parse's statement name and text are.
fn parse_names(frame: &[u8]) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    let name = cstring_at(frame, 5)?;
    let text = cstring_at(frame, name.end + 1)?;
    Some((name, text))
}

const SHAPES_KEPT: usize = 64;
const SHAPE_TEXT_MAX: usize = 4096;

impl Shapes {
    /// [`query_pieces`] of `text`, from what a text of its shape was read as when there was one.
    pub(super) fn pieces(&mut self, text: &Arc<str>) -> Option<Vec<Piece>> {
        if text.len() > SHAPE_TEXT_MAX {
            return query_pieces(text);
        }
        if let Some((last, shape)) = &self.last {
            if sluice_sql::same_integer_shape(last, text.as_bytes()) {
                return Some(shape.pieces(text));
            }
        }
        if !sluice_sql::integer_shape(text, &mut self.key) {
            return query_pieces(text);
        }
        if let Some(shape) = self.read.get(self.key.as_slice()) {
            let pieces = shape.pieces(text);
            self.last = Some((text.as_bytes().to_vec(), shape.clone()));
            return Some(pieces);
        }
        let mut pieces = query_pieces(text);
        if let Some(shape) = pieces.as_deref().and_then(|p| Shape::of(text, p)) {
            // This run's admission takes the fingerprint made for the shape (not made twice).
            if let Some([(_, Some(forwarded))]) = pieces.as_deref_mut() {
                forwarded.memo = StatementMemo::with_fingerprint(shape.fingerprint.clone());
            }
            if self.read.len() >= SHAPES_KEPT {
                self.read.clear();
            }
            let shape = Arc::new(shape);
            self.last = Some((text.as_bytes().to_vec(), shape.clone()));
            self.read.insert(self.key.clone(), shape);
        }
        pieces
    }
}

impl Shape {
    /// `text`, of this shape, read as a text of it was read.
    fn pieces(&self, text: &Arc<str>) -> Vec<Piece> {
        // One copy of the text when the statement is all of it (as in `Forwarded::new`).
        let statement = match (self.lead, self.trail) {
            (0, 0) => text.clone(),
            (lead, trail) => Arc::from(&text[lead..text.len() - trail]),
        };
        let query = Query {
            text: statement,
            settings: Vec::new(),
            kind: self.kind,
            // Only fingerprints read them, and the fingerprint is known.
            literals: Vec::new(),
            nesting: self.nesting,
        };
        let forwarded = Forwarded {
            sql: text.clone(),
            query,
            changes_session: self.changes_session,
            memo: StatementMemo::with_fingerprint(self.fingerprint.clone()),
        };
        vec![(0..text.len(), Some(forwarded))]
    }

    /// What a text read as `pieces` keeps for its shape, if it is a text kept.
    fn of(text: &str, pieces: &[Piece]) -> Option<Shape> {
        let [(_, Some(forwarded))] = pieces else {
            return None;
        };
        let query = &forwarded.query;
        let kept_kind = matches!(
            query.kind,
            StatementKind::Select
                | StatementKind::Insert
                | StatementKind::Update
                | StatementKind::Delete
        );
        if !kept_kind || !query.settings.is_empty() || *forwarded.sql != *text {
            return None;
        }
        let lead = text.len() - text.trim_start().len();
        let trail = text.len().checked_sub(lead + query.text.len())?;
        if !text[lead..].starts_with(&*query.text)
            || text[text.len() - trail..]
                .bytes()
                .any(|b| b.is_ascii_digit())
        {
            return None;
        }
        Some(Shape {
            kind: query.kind,
            nesting: query.nesting,
            changes_session: forwarded.changes_session,
            lead,
            trail,
            fingerprint: Arc::new(sluice_sql::fingerprint(&query.text)),
        })
    }
}

/// A simple Query's statements, each with what is forwarded of it (`None`: sluice's own);
/// `None` when every one is sluice's (sluice answers the whole text).
pub(super) fn query_pieces(text: &str) -> Option<Vec<Piece>> {
    // The script is lexed once: each statement is read as it is split off.
    let mut statements = sluice_sql::statements_with_text(text);
    let pieces: Vec<Piece> = if statements.len() == 1 {
        // One statement goes as the client wrote it (comments, `;` and all).
        let (_, statement) = statements.remove(0);
        vec![(0..text.len(), forwarded_as(text, statement.map(Some)))]
    } else {
        statements
            .into_iter()
            .map(|(piece, statement)| {
                // `piece` is a slice of `text`: where it is.
                let start = piece.as_ptr() as usize - text.as_ptr() as usize;
                (
                    start..start + piece.len(),
                    forwarded_as(piece, statement.map(Some)),
                )
            })
            .collect()
    };
    if !pieces.is_empty() && pieces.iter().all(|(_, f)| f.is_none()) {
        return None;
    }
    Some(pieces)
}

/// A statement the client prepared for the upstream.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub(super) forwarded: Forwarded,
    pub(super) types: Vec<u32>,
    /// The text as the client sent it when it is not UTF-8 (its `client_encoding`'s bytes,
    /// which `forwarded.sql` only approximates): what the upstream is sent.
    pub(super) raw_text: Option<bytes::Bytes>,
    /// Its name on upstream connections in transaction pooling (one per text and types, so
    /// clients preparing the same statement share it).
    pub(super) pooled_name: String,
}

impl Prepared {
    pub(super) fn new(forwarded: Forwarded, types: Vec<u32>) -> Prepared {
        Prepared::with_text(forwarded, types, None)
    }

    /// A statement whose text is `raw_text` as sent (not UTF-8), `forwarded` its reading.
    pub(super) fn with_text(
        forwarded: Forwarded,
        types: Vec<u32>,
        raw_text: Option<bytes::Bytes>,
    ) -> Prepared {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        // The bytes sent, when they are not the text: two texts read alike stay apart.
        match &raw_text {
            Some(raw) => raw.hash(&mut h),
            None => forwarded.sql.hash(&mut h),
        }
        types.hash(&mut h);
        Prepared {
            pooled_name: format!("sluice_{:016x}", h.finish()),
            forwarded,
            types,
            raw_text,
        }
    }

    /// A Parse of this statement as `name`, into `out`.
    pub(super) fn encode_parse(&self, name: &str, out: &mut BytesMut) {
        let Some(text) = &self.raw_text else {
            encode(
                &Parse::new(
                    Some(name.to_string()),
                    self.forwarded.sql.to_string(),
                    self.types.clone(),
                ),
                out,
            );
            return;
        };
        let len = 4 + name.len() + 1 + text.len() + 1 + 2 + 4 * self.types.len();
        out.reserve(1 + len);
        out.extend_from_slice(b"P");
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\0");
        out.extend_from_slice(text);
        out.extend_from_slice(b"\0");
        out.extend_from_slice(&(self.types.len() as u16).to_be_bytes());
        for oid in &self.types {
            out.extend_from_slice(&oid.to_be_bytes());
        }
    }
}

/// A message for the upstream, with what routing found out about it.
#[derive(Debug)]
pub enum Step {
    /// `DEALLOCATE name` of a statement the client prepared with the protocol, in transaction
    /// pooling: upstream it goes by sluice's pooled name, so sluice forgets the client's name
    /// and answers as PostgreSQL would.
    Deallocate {
        name: String,
    },
    /// A simple Query: its statements, each with what is forwarded of it (`None`: sluice's).
    Query {
        text: Arc<str>,
        pieces: Vec<Piece>,
        /// The message as the client sent it, when its text is not UTF-8 (a `client_encoding`
        /// other than UTF8): `text` is read from it for routing and admission, and these
        /// bytes go upstream untouched.
        raw: Option<BytesMut>,
    },
    Parse {
        name: String,
        prepared: Arc<Prepared>,
        /// Transaction pooling: the statement the client already holds under `name` (closed
        /// neither by a Close nor a `DEALLOCATE`), which PostgreSQL refuses to replace (42P05).
        existing: Option<Arc<Prepared>>,
    },
    /// A Bind as the client sent it (type, length, body); `statement`: where the statement's
    /// name is in it (without its NUL), renamed in transaction pooling.
    Bind {
        frame: BytesMut,
        statement: std::ops::Range<usize>,
        prepared: Option<Arc<Prepared>>,
    },
    DescribeStatement {
        name: String,
        prepared: Option<Arc<Prepared>>,
    },
    /// An Execute as the client sent it.
    Execute {
        frame: BytesMut,
        prepared: Option<Arc<Prepared>>,
    },
    /// Describe or Close of a portal: passed as it is.
    Portal(PgWireFrontendMessage, Ends),
    /// A message read whole that goes upstream as the client sent it (a Describe of a
    /// portal), answered up to `ends`.
    Passed {
        frame: BytesMut,
        ends: Ends,
    },
    CloseStatement {
        name: String,
    },
    Sync,
    Flush,
}

/// What routing made of a client's message.
#[derive(Debug)]
pub enum Routed {
    /// sluice answers it (pgwire's handlers, as without an upstream).
    Local(PgWireFrontendMessage),
    Upstream(Step),
}

/// What routing made of a message read whole ([`Forwarder::route_raw`]).
#[derive(Debug)]
pub enum RoutedRaw {
    Upstream(Step),
    /// sluice answers it: its bytes, to decode.
    Local(BytesMut),
    /// A string in it is cut short (no NUL) or a name is not UTF-8: a protocol violation, never
    /// passed to a decoder.
    Malformed,
}

impl Forwarder {
    /// A Parse of `prepared` under the client's name `statement`. In transaction pooling a
    /// name the client still holds keeps its statement: the Parse is sent so that the upstream
    /// refuses it as PostgreSQL refuses the client (see `translate`).
    fn define(&mut self, statement: String, prepared: Prepared) -> Step {
        self.local_statements.remove(&statement);
        let prepared = Arc::new(prepared);
        let existing = match self.upstream.options.pool_mode {
            PoolMode::Transaction if !statement.is_empty() => {
                self.statements.get(&statement).cloned()
            }
            _ => None,
        };
        if existing.is_none() {
            self.statements.insert(statement.clone(), prepared.clone());
        }
        Step::Parse {
            name: statement,
            prepared,
            existing,
        }
    }

    /// Whether `message` (a Query's or a Parse's bytes, or a decoded Parse) is long enough to
    /// be read on a blocking thread ([`Forwarder::route_raw_apart`], [`Forwarder::route_apart`]):
    /// a test of its length alone, asked of every message.
    pub fn reads_apart<M: AsText>(message: &M) -> bool {
        message.text_len() > READ_AHEAD_BYTES
    }

    /// [`Forwarder::route_raw`] of a long message, its text read (lexed, split, classified) on
    /// a blocking thread, not on the connection thread every client of it shares; the message
    /// goes there and back (no copy of its text is made: it may be a gigabyte).
    pub async fn route_raw_apart(&mut self, frame: BytesMut) -> RoutedRaw {
        let (frame, read) = read_apart(frame).await;
        self.read_ahead = read;
        self.route_raw(frame)
    }

    /// [`Forwarder::route`] of a long message, read as [`Forwarder::route_raw_apart`] reads.
    pub async fn route_apart(&mut self, message: PgWireFrontendMessage) -> Routed {
        let (message, read) = read_apart(message).await;
        self.read_ahead = read;
        self.route(message)
    }

    /// Where `message` goes. Called for every message in the order the client sent them, so
    /// the names it defines and drops are followed here.
    pub fn route(&mut self, message: PgWireFrontendMessage) -> Routed {
        let read = self.read_ahead.take();
        let name = |n: &Option<String>| n.clone().unwrap_or_default();
        let step = match message {
            PgWireFrontendMessage::Query(q) => {
                if let Some(name) = self.pooled_deallocate(&q.query) {
                    Step::Deallocate { name }
                } else {
                    let text: Arc<str> = Arc::from(q.query.as_str());
                    match self.shapes.pieces(&text) {
                        Some(pieces) => Step::Query {
                            text,
                            pieces,
                            raw: None,
                        },
                        None => return Routed::Local(PgWireFrontendMessage::Query(q)),
                    }
                }
            }
            PgWireFrontendMessage::Parse(p) => {
                let statement = name(&p.name);
                let read = match read {
                    Some(ReadAhead::Parse(read)) => read,
                    _ => forwarded(&p.query),
                };
                match read {
                    Some(f) => self.define(statement, Prepared::new(f, p.type_oids)),
                    None => {
                        self.statements.remove(&statement);
                        self.local_statements.insert(statement);
                        return Routed::Local(PgWireFrontendMessage::Parse(p));
                    }
                }
            }
            PgWireFrontendMessage::Describe(d) => {
                let target = name(&d.name);
                let portal = d.target_type == TARGET_TYPE_BYTE_PORTAL;
                if self.is_local(portal, &target, false) {
                    return Routed::Local(PgWireFrontendMessage::Describe(d));
                }
                if portal {
                    Step::Portal(PgWireFrontendMessage::Describe(d), Ends::One)
                } else {
                    Step::DescribeStatement {
                        prepared: self.statements.get(&target).cloned(),
                        name: target,
                    }
                }
            }
            PgWireFrontendMessage::Close(c) => {
                let target = name(&c.name);
                let portal = c.target_type == TARGET_TYPE_BYTE_PORTAL;
                if self.is_local(portal, &target, true) {
                    return Routed::Local(PgWireFrontendMessage::Close(c));
                }
                if portal {
                    self.portals.remove(&target);
                    Step::Portal(PgWireFrontendMessage::Close(c), Ends::One)
                } else {
                    self.statements.remove(&target);
                    Step::CloseStatement { name: target }
                }
            }
            // The connection loop reads these whole (`route_raw`); should one come decoded,
            // the same rules route it.
            PgWireFrontendMessage::Bind(_)
            | PgWireFrontendMessage::Execute(_)
            | PgWireFrontendMessage::Sync(_) => {
                let mut frame = BytesMut::new();
                encode_frontend(&message, &mut frame);
                return match self.route_raw(frame) {
                    RoutedRaw::Upstream(step) => Routed::Upstream(step),
                    RoutedRaw::Local(_) | RoutedRaw::Malformed => Routed::Local(message),
                };
            }
            PgWireFrontendMessage::Flush(f) => {
                if self.pending.is_empty() {
                    return Routed::Local(PgWireFrontendMessage::Flush(f));
                }
                Step::Flush
            }
            other => return Routed::Local(other),
        };
        Routed::Upstream(step)
    }

    /// Where a Bind, Describe, Execute or Sync read whole (`frame`: type, length, body) goes, by the
    /// rules of [`Forwarder::route`]: upstream as the bytes it is, or back to be decoded and
    /// answered by sluice; one whose names cannot be read is [`RoutedRaw::Malformed`].
    pub fn route_raw(&mut self, frame: BytesMut) -> RoutedRaw {
        let read = self.read_ahead.take();
        match frame.first() {
            Some(b'B') => {
                let Some((portal, statement)) = bind_names(&frame) else {
                    return RoutedRaw::Malformed;
                };
                let portal_name = utf8(&frame[portal]);
                let statement_name = utf8(&frame[statement.clone()]);
                let (Some(portal_name), Some(statement_name)) = (portal_name, statement_name)
                else {
                    return RoutedRaw::Malformed;
                };
                // (Most clients never bind sluice's own statements: no lookup then.)
                if !self.local_statements.is_empty()
                    && self.local_statements.contains(statement_name)
                {
                    self.portals.remove(portal_name);
                    self.local_portals.insert(portal_name.to_string());
                    return RoutedRaw::Local(frame);
                }
                if !self.local_portals.is_empty() {
                    self.local_portals.remove(portal_name);
                }
                let prepared = self.statements.get(statement_name).cloned();
                match (&prepared, self.portals.get_mut(portal_name)) {
                    // Most Binds name the unnamed portal again: its entry is reused.
                    (Some(p), Some(bound)) => *bound = p.clone(),
                    (Some(p), None) => {
                        self.portals.insert(portal_name.to_string(), p.clone());
                    }
                    (None, _) => {
                        self.portals.remove(portal_name);
                    }
                }
                RoutedRaw::Upstream(Step::Bind {
                    frame,
                    statement,
                    prepared,
                })
            }
            Some(b'E') => {
                let portal = cstring_at(&frame, 5).and_then(|r| utf8(&frame[r]));
                let Some(portal) = portal else {
                    return RoutedRaw::Malformed;
                };
                if !self.local_portals.is_empty() && self.local_portals.contains(portal) {
                    return RoutedRaw::Local(frame);
                }
                let prepared = self.portals.get(portal).cloned();
                RoutedRaw::Upstream(Step::Execute { frame, prepared })
            }
            Some(b'Q') => {
                let Some((text, utf8)) = query_text(&frame) else {
                    return RoutedRaw::Malformed;
                };
                if let Some(name) = self.pooled_deallocate(&text) {
                    return RoutedRaw::Upstream(Step::Deallocate { name });
                }
                let text: Arc<str> = Arc::from(text);
                let pieces = match read {
                    Some(ReadAhead::Query(pieces)) => pieces,
                    _ if utf8 => self.shapes.pieces(&text),
                    _ => query_pieces(&text),
                };
                match pieces {
                    Some(pieces) => RoutedRaw::Upstream(Step::Query {
                        text,
                        pieces,
                        raw: (!utf8).then_some(frame),
                    }),
                    None => RoutedRaw::Local(frame),
                }
            }
            Some(b'D') => {
                // Describe: 'P' a portal, 'S' a statement, then its name.
                let name = cstring_at(&frame, 6).and_then(|r| utf8(&frame[r]));
                let (Some(&target), Some(name)) = (frame.get(5), name) else {
                    return RoutedRaw::Malformed;
                };
                match target {
                    TARGET_TYPE_BYTE_PORTAL if !self.is_local(true, name, false) => {
                        RoutedRaw::Upstream(Step::Passed {
                            frame,
                            ends: Ends::One,
                        })
                    }
                    TARGET_TYPE_BYTE_STATEMENT if !self.is_local(false, name, false) => {
                        RoutedRaw::Upstream(Step::DescribeStatement {
                            prepared: self.statements.get(name).cloned(),
                            name: name.to_string(),
                        })
                    }
                    // sluice's own, or a target type pgwire refuses as PostgreSQL does.
                    _ => RoutedRaw::Local(frame),
                }
            }
            // Only a Parse whose text is not UTF-8 comes whole (`passes_whole`): it goes
            // upstream with its bytes as they came.
            Some(b'P') => {
                let Some((name, text)) = parse_names(&frame) else {
                    return RoutedRaw::Malformed;
                };
                let Some(statement) = utf8(&frame[name.clone()]).map(str::to_string) else {
                    return RoutedRaw::Malformed;
                };
                let count_at = text.end + 1;
                let Some(count) = frame
                    .get(count_at..count_at + 2)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
                else {
                    return RoutedRaw::Malformed;
                };
                let Some(types) = frame.get(count_at + 2..count_at + 2 + 4 * count).map(|b| {
                    b.chunks_exact(4)
                        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                        .collect::<Vec<_>>()
                }) else {
                    return RoutedRaw::Malformed;
                };
                let read = match read {
                    Some(ReadAhead::Parse(read)) => read,
                    _ => forwarded(&String::from_utf8_lossy(&frame[text.clone()])),
                };
                let Some(f) = read else {
                    // sluice's own statement (its words are ASCII): read as pgwire reads it.
                    self.statements.remove(&statement);
                    self.local_statements.insert(statement);
                    return RoutedRaw::Local(frame);
                };
                let raw = bytes::Bytes::copy_from_slice(&frame[text]);
                RoutedRaw::Upstream(
                    self.define(statement, Prepared::with_text(f, types, Some(raw))),
                )
            }
            Some(b'S') => {
                if self.pending.is_empty() && !self.in_batch && self.failed == Failed::No {
                    return RoutedRaw::Local(frame);
                }
                RoutedRaw::Upstream(Step::Sync)
            }
            _ => RoutedRaw::Local(frame),
        }
    }
}

/// The message types the connection loop reads whole for a forwarding client, not decoded
/// ([`crate::frame::Incoming::Raw`]): a simple Query (its text read in place), the Bind,
/// Describe, Execute and Sync of every extended-protocol round trip (libpq describes each
/// portal it executes), and a Parse whose text is not UTF-8, passed upstream as they came
/// ([`Forwarder::route_raw`]).
pub fn passes_whole(tag: u8) -> bool {
    // A Parse only when its text is not UTF-8 (`crate::frame::buffered_incoming` decodes
    // the others).
    matches!(tag, b'Q' | b'B' | b'D' | b'E' | b'S' | b'P')
}

/// Where the NUL-terminated string starting at `at` in `frame` is (without its NUL).
pub(super) fn cstring_at(frame: &[u8], at: usize) -> Option<std::ops::Range<usize>> {
    let rest = frame.get(at..)?;
    let len = rest.iter().position(|&b| b == 0)?;
    Some(at..at + len)
}

/// A Bind's portal and statement names (after the type and length).
pub(super) fn bind_names(frame: &[u8]) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    let portal = cstring_at(frame, 5)?;
    let statement = cstring_at(frame, portal.end + 1)?;
    Some((portal, statement))
}

/// The Bind `frame` with its statement's name (at `statement`) replaced by `name`.
pub(super) fn renamed_bind(
    frame: &[u8],
    statement: std::ops::Range<usize>,
    name: &str,
    out: &mut BytesMut,
) {
    let length = frame.len() - 1 - statement.len() + name.len();
    out.reserve(1 + length);
    out.extend_from_slice(b"B");
    out.extend_from_slice(&(length as u32).to_be_bytes());
    out.extend_from_slice(&frame[5..statement.start]);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&frame[statement.end..]);
}

pub(super) fn utf8(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

impl Forwarder {
    /// The client's statement name a simple Query `DEALLOCATE [PREPARE] name` drops, when it
    /// is one sluice pools (transaction pooling, a statement the client prepared with Parse).
    pub(super) fn pooled_deallocate(&self, text: &str) -> Option<String> {
        if self.upstream.options.pool_mode != PoolMode::Transaction || self.statements.is_empty() {
            return None;
        }
        let name = deallocated_name(text)?;
        self.statements.contains_key(&name).then_some(name)
    }
}

/// The name `DEALLOCATE [PREPARE] name` drops, as PostgreSQL reads it (an unquoted name folded
/// to lower case, a quoted one as written); `None` for any other text (`DEALLOCATE ALL`
/// included, which goes upstream).
pub(super) fn deallocated_name(text: &str) -> Option<String> {
    let text = text.trim().trim_end_matches(';').trim_end();
    let (word, rest) = text.split_at(text.find(char::is_whitespace)?);
    if !word.eq_ignore_ascii_case("deallocate") {
        return None;
    }
    let mut rest = rest.trim_start();
    if let Some(i) = rest.find(char::is_whitespace) {
        if rest[..i].eq_ignore_ascii_case("prepare") {
            rest = rest[i..].trim_start();
        }
    }
    if let Some(quoted) = rest.strip_prefix('"') {
        let inner = quoted.strip_suffix('"')?;
        // A lone quote inside would end the name early: not one name.
        if inner.replace("\"\"", "").contains('"') {
            return None;
        }
        return Some(inner.replace("\"\"", "\""));
    }
    let plain = rest
        .chars()
        .all(|c| c.is_alphanumeric() || c == '_' || c == '$')
        && rest
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_');
    (plain && !rest.eq_ignore_ascii_case("all")).then(|| rest.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_of_the_last_shape_is_read_as_it_was() {
        let mut shapes = Shapes::default();
        let mut read = |text: &str| {
            let pieces = shapes.pieces(&Arc::from(text)).expect("forwarded");
            let [(span, Some(forwarded))] = &pieces[..] else {
                panic!("{text}: one forwarded statement, {pieces:?}");
            };
            assert_eq!(span.clone(), 0..text.len());
            let fingerprint = forwarded.memo.fingerprint().expect("kept").clone();
            assert_eq!(
                fingerprint.id,
                sluice_sql::fingerprint(&forwarded.query.text).id,
                "{text}"
            );
            // What goes upstream is the text as sent, one copy with the statement's when
            // that is all of it.
            assert_eq!(*forwarded.sql, *text);
            assert_eq!(
                Arc::ptr_eq(&forwarded.sql, &forwarded.query.text),
                text == &*forwarded.query.text,
                "{text}"
            );
            (
                forwarded.query.text.to_string(),
                forwarded.query.kind,
                fingerprint,
            )
        };
        let (text, kind, first) = read(" SELECT 1 AS x FROM t WHERE id = 5; ");
        assert_eq!(
            (text.as_str(), kind),
            ("SELECT 1 AS x FROM t WHERE id = 5", StatementKind::Select)
        );
        // The next of its shape: the reading (and the fingerprint) kept, its own text.
        let (text, _, again) = read(" SELECT 22 AS x FROM t WHERE id = 60000; ");
        assert_eq!(text, "SELECT 22 AS x FROM t WHERE id = 60000");
        assert!(Arc::ptr_eq(&first, &again));
        // Digits that are part of a name are the shape's own: read anew.
        let (_, _, t1) = read("SELECT c1 FROM t");
        let (text, _, t2) = read("SELECT c2 FROM t");
        assert_eq!(text, "SELECT c2 FROM t");
        assert!(!Arc::ptr_eq(&t1, &t2));
        assert_ne!(t1.id, t2.id);
        // A text of the last shape that is its statement whole: one copy of it, shared.
        let (_, _, t3) = read("SELECT c2 FROM t");
        assert!(Arc::ptr_eq(&t2, &t3));
        // Another kind of statement is no text of the shape.
        let (_, kind, _) = read("DELETE FROM t WHERE id = 5");
        assert_eq!(kind, StatementKind::Delete);
        // An earlier shape comes back from the memo.
        let (_, _, later) = read(" SELECT 7 AS x FROM t WHERE id = 8; ");
        assert!(Arc::ptr_eq(&first, &later));
    }

    /// A long text's statements come back from the reading thread fingerprinted, so that
    /// admission does not lex them again on the connection thread.
    #[tokio::test]
    async fn a_text_read_apart_comes_back_fingerprinted() {
        let long = format!(
            "SELECT 1{} FROM t WHERE x = 'a'",
            ",1".repeat(READ_AHEAD_BYTES)
        );
        let two = format!("{long}; INSERT INTO t VALUES (2)");
        let mut query = BytesMut::from(&b"Q\0\0\0\0"[..]);
        query.extend_from_slice(two.as_bytes());
        query.extend_from_slice(b"\0");
        assert!(Forwarder::reads_apart(&query));
        let (_, read) = read_apart(query).await;
        let Some(ReadAhead::Query(Some(pieces))) = read else {
            panic!("two forwarded statements: {read:?}");
        };
        assert_eq!(pieces.len(), 2);
        for (_, forwarded) in &pieces {
            let forwarded = forwarded.as_ref().expect("forwarded");
            let made = forwarded.memo.fingerprint().expect("fingerprinted apart");
            assert_eq!(made.id, sluice_sql::fingerprint(&forwarded.query.text).id);
        }

        let mut parse = BytesMut::from(&b"P\0\0\0\0s\0"[..]);
        parse.extend_from_slice(long.as_bytes());
        parse.extend_from_slice(b"\0\0\0");
        let (_, read) = read_apart(parse).await;
        let Some(ReadAhead::Parse(Some(forwarded))) = read else {
            panic!("a forwarded statement: {read:?}");
        };
        assert!(
            forwarded.memo.fingerprint().is_some(),
            "fingerprinted apart"
        );
    }

    #[test]
    fn deallocate_names_are_read_as_postgres_reads_them() {
        let name = |t: &str| deallocated_name(t);
        assert_eq!(name("DEALLOCATE _pg3_0"), Some("_pg3_0".into()));
        assert_eq!(name("  deallocate prepare Stmt ; "), Some("stmt".into()));
        assert_eq!(name("DEALLOCATE \"My \"\"S\"\"\""), Some("My \"S\"".into()));
        assert_eq!(name("DEALLOCATE ALL"), None);
        assert_eq!(name("DEALLOCATE PREPARE ALL"), None);
        assert_eq!(name("DEALLOCATE a; SELECT 1"), None);
        assert_eq!(name("DEALLOCATE \"a\"b\""), None);
        assert_eq!(name("SELECT 1"), None);
        assert_eq!(name("DEALLOCATE"), None);
    }
}

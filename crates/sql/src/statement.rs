//! The statement model of what clients send: a text is lexed once into [`Statement`]s — workload
//! DDL, session settings, transaction control, sluice's conveniences, and everything else as a
//! [`Query`] that keeps its text, its `SETTINGS` tail (already taken off), its
//! [`StatementKind`], the byte span of each literal and how deeply it nests. The server routes on
//! this enum and nothing else.
//!
//! The text is split and its words read by [`crate::lexer`], once.
//!
//! Invariants:
//! - [`Query::nesting`] is at least the depth of the expression tree any parser builds from the
//!   text (each open parenthesis and each operator since the last list separator counts one),
//!   so a statement under [`MAX_NESTING`] cannot exhaust a planner's stack.

use std::ops::Range;

use crate::ast::{EntityKind, Literal, Statement as WorkloadStatement};
use crate::error::{Error, ErrorCode, Result};
use crate::lexer::{lex, split, Lexed, TokenKind, Tokens};
use crate::parser::{mentions, parse_statement, split_settings};

/// How deeply a statement may nest (parentheses and operator chains, see [`Query::nesting`]).
/// ClickHouse's `max_ast_depth` has the same default; PostgreSQL stops at a comparable depth
/// with "stack depth limit exceeded".
pub const MAX_NESTING: usize = 1000;

/// What a statement does, as the classifiers and the engines need to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatementKind {
    Select,
    Insert,
    Update,
    Delete,
    /// `CREATE`, `DROP`, `ALTER`, `TRUNCATE` of anything.
    Ddl,
    /// Everything else: `SET`, `SHOW`, `EXPLAIN`, `COPY`, transaction control, cursors, ….
    Utility,
}

impl StatementKind {
    /// The name classifiers match on: `'select'`, `'insert'`, ….
    pub fn name(self) -> &'static str {
        match self {
            StatementKind::Select => "select",
            StatementKind::Insert => "insert",
            StatementKind::Update => "update",
            StatementKind::Delete => "delete",
            StatementKind::Ddl => "ddl",
            StatementKind::Utility => "utility",
        }
    }

    fn of(first_word: &str) -> StatementKind {
        match first_word.to_ascii_uppercase().as_str() {
            "SELECT" | "WITH" | "VALUES" | "TABLE" => StatementKind::Select,
            "INSERT" => StatementKind::Insert,
            "UPDATE" => StatementKind::Update,
            "DELETE" => StatementKind::Delete,
            "CREATE" | "DROP" | "ALTER" | "TRUNCATE" => StatementKind::Ddl,
            _ => StatementKind::Utility,
        }
    }
}

/// `BEGIN`, `COMMIT`, `ROLLBACK` and their synonyms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionControl {
    Begin,
    Commit,
    Rollback,
}

impl TransactionControl {
    /// The Postgres command tag.
    pub fn tag(self) -> &'static str {
        match self {
            TransactionControl::Begin => "BEGIN",
            TransactionControl::Commit => "COMMIT",
            TransactionControl::Rollback => "ROLLBACK",
        }
    }
}

/// How `COPY … TO STDOUT` writes rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFormat {
    pub csv: bool,
    pub header: bool,
    pub delimiter: String,
    pub null: String,
}

impl CopyFormat {
    fn text() -> CopyFormat {
        CopyFormat {
            csv: false,
            header: false,
            delimiter: "\t".into(),
            null: "\\N".into(),
        }
    }
}

/// Anything sluice does not answer itself: for the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// The text without the `SETTINGS` tail and without a trailing `;`.
    pub text: std::sync::Arc<str>,
    /// The `SETTINGS name = value, …` tail, in written order.
    pub settings: Vec<(String, Literal)>,
    pub kind: StatementKind,
    /// Byte spans in `text` of each string and number literal (for fingerprints: those in the
    /// part a fingerprint reads).
    pub literals: Vec<Range<usize>>,
    /// An upper bound of the depth of the statement's expression tree (see the module docs).
    pub nesting: usize,
}

/// How `KILL QUERY` waits: `ASYNC` (the default) answers at once, `SYNC` once the statements
/// have stopped, `TEST` only lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillMode {
    Async,
    Sync,
    Test,
}

/// One statement, as the server routes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    /// `CREATE|DROP WORKLOAD|RESOURCE|CLASSIFIER …`, parsed.
    Workload(WorkloadStatement),
    /// `SET name = value` / `SET name TO value`; `value` is `None` for `RESET name` and
    /// `SET name TO DEFAULT`.
    Set {
        name: String,
        value: Option<String>,
        reset: bool,
    },
    /// `SHOW name` of a session setting.
    Show(String),
    /// `SHOW WORKLOADS`, `SHOW RESOURCES`, `SHOW CLASSIFIERS`.
    ShowEntities(EntityKind),
    /// `SHOW CREATE WORKLOAD|RESOURCE|CLASSIFIER name`.
    ShowCreate {
        kind: EntityKind,
        name: String,
    },
    Transaction(TransactionControl),
    /// `DECLARE name [BINARY] [NO SCROLL] CURSOR [WITH[OUT] HOLD] FOR query`.
    Declare {
        name: String,
        hold: bool,
        query: Query,
    },
    /// `FETCH [NEXT | n | ALL | FORWARD [n | ALL]] [FROM | IN] name`; `count` is `None` for
    /// all remaining rows.
    Fetch {
        name: String,
        count: Option<u64>,
    },
    /// `CLOSE name` (`None`: `CLOSE ALL`).
    Close(Option<String>),
    /// `COPY (query) TO STDOUT [WITH (…)]` or `COPY table [(columns)] TO STDOUT …`: the
    /// query's rows in COPY's text or CSV format.
    CopyOut {
        query: Query,
        format: CopyFormat,
    },
    /// `KILL QUERY WHERE predicate [SYNC | ASYNC | TEST]`: the predicate is over
    /// `system.processes` columns.
    KillQuery {
        predicate: String,
        mode: KillMode,
    },
    /// `MOVE QUERY WHERE predicate TO WORKLOAD name`.
    MoveQuery {
        predicate: String,
        workload: String,
    },
    /// `SELECT pg_cancel_backend(pid)` / `SELECT pg_terminate_backend(pid)`.
    SignalBackend {
        pid: i32,
        terminate: bool,
    },
    /// `PIN FINGERPRINT 'id' TO WORKLOAD w` (`workload` set) or `FORGET FINGERPRINT 'id'`.
    Fingerprint {
        id: String,
        workload: Option<String>,
    },
    Query(Query),
}

impl Statement {
    /// Whether the engine runs it (as opposed to sluice answering it).
    pub fn is_query(&self) -> bool {
        matches!(self, Statement::Query(_))
    }
}

/// The statements of `text`, in order; empty ones (only comments and whitespace) are left out.
/// An error in one statement (a malformed `SETTINGS` value, workload DDL that does not parse,
/// too deep a nesting) is that statement's item; the others are unaffected.
pub fn statements(text: &str) -> Vec<Result<Statement>> {
    split(text)
        .into_iter()
        .map(|lexed| classify(text, &lexed))
        .collect()
}

/// [`statements`], each beside its own text: from its first word (or the comment before it)
/// to its end before `;`, as [`statement`] would read it alone. A script is lexed once.
pub fn statements_with_text(text: &str) -> Vec<(&str, Result<Statement>)> {
    split(text)
        .into_iter()
        .map(|lexed| (text[lexed.span.clone()].trim(), classify(text, &lexed)))
        .collect()
}

/// Exactly one statement (a trailing `;` allowed), for the extended protocol's Parse.
pub fn statement(text: &str) -> Result<Option<Statement>> {
    only_statement(statements(text))
}

/// The one statement of [`statements`]' answer for a text (none for an empty text; more than
/// one is an error): what [`statement`] makes of it.
pub fn only_statement<S>(mut all: Vec<Result<S>>) -> Result<Option<S>> {
    match all.len() {
        0 => Ok(None),
        1 => all.remove(0).map(Some),
        n => Err(Error::new(
            ErrorCode::SyntaxError,
            format!("cannot insert multiple commands into a prepared statement (got {n})"),
        )),
    }
}

/// A key under which what [`statements`] makes of `text` can be kept for the next text that
/// differs from it only in the values of integer literals (`… WHERE id = 42`, sent again with
/// another id): `text` with each integer literal replaced by a NUL, written into `key`.
/// `false`, and no key, where a digit could mean more than a number's value: a text with a
/// quote of any kind, a comment, a `$` or a backslash (a digit inside them is no literal), or
/// naming what [`classify`] reads a number of (`pg_cancel_backend(pid)` and
/// `pg_terminate_backend(pid)`, whose pid decides whether the statement is sluice's; a
/// `SETTINGS` tail's values).
///
/// Two texts with one key lex alike token for token but for those integers, so they split
/// into the same statements, and a [`Statement::Query`] of one is a query of the other with
/// the same kind, nesting and fingerprint; only its text and literal spans differ. (Other
/// statements read numbers — a `FETCH` count, a `KILL QUERY` condition — and may read
/// differently: only a query's reading is to be kept by this key.)
pub fn integer_shape(text: &str, key: &mut Vec<u8>) -> bool {
    // Refused on the words anywhere, even inside a longer name (`my_settings`, `backend_id`):
    // such a text is only read each time, as any text without a shape is.
    if mentions(text, "settings") || mentions(text, "_backend") {
        return false;
    }
    let bytes = text.as_bytes();
    key.clear();
    // The bytes up to `copied` are in `key` already: what lies between integers is copied
    // whole (this runs on every simple Query a forwarding client sends).
    let mut copied = 0;
    let mut i = 0;
    // Letters, spaces and operators are most of a text: skipped in one tight loop.
    let plain = |b: &u8| {
        matches!(
            SHAPE_CLASS[*b as usize],
            ShapeClass::Other | ShapeClass::Word
        )
    };
    while let Some(skipped) = bytes[i..].iter().position(|b| !plain(b)) {
        i += skipped;
        match SHAPE_CLASS[bytes[i] as usize] {
            // (Not reached: skipped above.)
            ShapeClass::Other | ShapeClass::Word => i += 1,
            ShapeClass::Refused => return false,
            ShapeClass::Dash if bytes.get(i + 1) == Some(&b'-') => return false,
            ShapeClass::Slash if bytes.get(i + 1) == Some(&b'*') => return false,
            ShapeClass::Dash | ShapeClass::Slash => i += 1,
            ShapeClass::Digit => {
                let start = i;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                // The lexer's number is this run exactly only when nothing joins it to a
                // word, a fraction or an exponent (`t1`, `1.5`, `.5`, `1e5`, `0x1F`, `1_000`
                // stay as written).
                let joined = |b: Option<&u8>| {
                    b.is_some_and(|&b| b == b'.' || SHAPE_CLASS[b as usize].in_word())
                };
                if !joined(start.checked_sub(1).map(|p| &bytes[p])) && !joined(bytes.get(i)) {
                    key.extend_from_slice(&bytes[copied..start]);
                    key.push(0);
                    copied = i;
                }
            }
        }
    }
    key.extend_from_slice(&bytes[copied..]);
    true
}

/// Whether `text` has the [`integer_shape`] of `shaped`, a text that has one: the two are the
/// same byte for byte but for the digits of standalone integers (`… id = 42` and `… id =
/// 43`). One pass over both, no key built: a client repeating one statement with new values
/// is told so at a few instructions a byte. (Its non-digit bytes being `shaped`'s, `text`
/// has no quote, comment or refused word `shaped` has not: it has a shape, the same.)
pub fn same_integer_shape(shaped: &[u8], text: &[u8]) -> bool {
    let (mut i, mut j) = (0, 0);
    loop {
        // The equal stretch skipped eight bytes at a time: texts of one shape differ only
        // where an integer does.
        let equal = common_prefix(&shaped[i..], &text[j..]);
        i += equal;
        j += equal;
        let (a, b) = (shaped.get(i), text.get(j));
        if a.is_none() && b.is_none() {
            return true;
        }
        // Where they differ must be in a run of digits in both: one begun before (the same
        // digits so far) or beginning here.
        let mut start = i;
        while start > 0 && shaped[start - 1].is_ascii_digit() {
            start -= 1;
        }
        let digit = |b: Option<&u8>| b.is_some_and(u8::is_ascii_digit);
        if start == i && !(digit(a) && digit(b)) {
            return false;
        }
        let (run_i, run_j) = (start, j - (i - start));
        i = run_i
            + shaped[run_i..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
        j = run_j
            + text[run_j..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
        let after = shaped.get(i);
        if after != text.get(j) {
            return false;
        }
        // A run joined to a word, a fraction or an exponent is no integer literal of the
        // shape (`t1`, `1.5`, `1e5`): its digits are the shape's own, and must agree.
        let joined =
            |b: Option<&u8>| b.is_some_and(|&b| b == b'.' || SHAPE_CLASS[b as usize].in_word());
        let before = run_i.checked_sub(1).map(|p| &shaped[p]);
        if (joined(before) || joined(after)) && shaped[run_i..i] != text[run_j..j] {
            return false;
        }
    }
}

/// How many bytes `a` and `b` begin with alike.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let len = a.len().min(b.len());
    let mut at = 0;
    while at + 8 <= len {
        let word = |s: &[u8]| u64::from_le_bytes(s[at..at + 8].try_into().expect("eight bytes"));
        let differ = word(a) ^ word(b);
        if differ != 0 {
            return at + (differ.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while at < len && a[at] == b[at] {
        at += 1;
    }
    at
}

/// What a byte is to [`integer_shape`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum ShapeClass {
    Other,
    /// A quote, `$` or a backslash: no shape.
    Refused,
    /// `-` (`--` starts a comment), `/` (`/*` does).
    Dash,
    Slash,
    /// A letter, `_` or a byte of a non-ASCII character.
    Word,
    Digit,
}

impl ShapeClass {
    fn in_word(self) -> bool {
        matches!(self, ShapeClass::Word | ShapeClass::Digit)
    }
}

static SHAPE_CLASS: [ShapeClass; 256] = {
    let mut table = [ShapeClass::Other; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = match c {
            b'\'' | b'"' | b'`' | b'$' | b'\\' => ShapeClass::Refused,
            b'-' => ShapeClass::Dash,
            b'/' => ShapeClass::Slash,
            b'0'..=b'9' => ShapeClass::Digit,
            _ if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => ShapeClass::Word,
            _ => ShapeClass::Other,
        };
        b += 1;
    }
    table
};

/// Routes one lexed statement (see [`Statement`]).
fn classify(text: &str, lexed: &Lexed) -> Result<Statement> {
    let source = text[lexed.span.clone()].trim_end();
    let word = |i: usize| lexed.head.get(i).map(|r| &text[r.clone()]);
    let is = |i: usize, kw: &str| word(i).is_some_and(|w| w.eq_ignore_ascii_case(kw));
    let entity = |i: usize| {
        if is(i, "WORKLOAD") {
            Some(EntityKind::Workload)
        } else if is(i, "RESOURCE") {
            Some(EntityKind::Resource)
        } else if is(i, "CLASSIFIER") {
            Some(EntityKind::Classifier)
        } else {
            None
        }
    };
    let first = word(0).unwrap_or("").to_ascii_uppercase();
    match first.as_str() {
        "CREATE" if entity(1).is_some() || (is(1, "OR") && entity(3).is_some()) => {
            return parse_statement(source).map(Statement::Workload)
        }
        "DROP" if entity(1).is_some() => return parse_statement(source).map(Statement::Workload),
        "BEGIN" | "START" => return Ok(Statement::Transaction(TransactionControl::Begin)),
        "COMMIT" | "END" => return Ok(Statement::Transaction(TransactionControl::Commit)),
        "ROLLBACK" | "ABORT" => return Ok(Statement::Transaction(TransactionControl::Rollback)),
        "PIN" | "FORGET" if is(1, "FINGERPRINT") => return fingerprint_command(&first, &word),
        "KILL" | "MOVE" if is(1, "QUERY") => {
            check_nesting(lexed.nesting)?;
            return operator_command(text, lexed, &first);
        }
        "SELECT" if is(1, "pg_cancel_backend") || is(1, "pg_terminate_backend") => {
            if let Some(pid) = (is(2, "(") && is(4, ")") && word(5).is_none())
                .then(|| word(3).and_then(|w| w.parse::<i32>().ok()))
                .flatten()
            {
                return Ok(Statement::SignalBackend {
                    pid,
                    terminate: is(1, "pg_terminate_backend"),
                });
            }
        }
        "SHOW" if is(1, "WORKLOADS") => return Ok(Statement::ShowEntities(EntityKind::Workload)),
        "SHOW" if is(1, "RESOURCES") => return Ok(Statement::ShowEntities(EntityKind::Resource)),
        "SHOW" if is(1, "CLASSIFIERS") => {
            return Ok(Statement::ShowEntities(EntityKind::Classifier))
        }
        "SHOW" if is(1, "CREATE") && entity(2).is_some() => {
            let name = word(3).map(unquote).unwrap_or_default();
            return Ok(Statement::ShowCreate {
                kind: entity(2).unwrap_or(EntityKind::Workload),
                name,
            });
        }
        "SHOW" => {
            if let Some(name) = session_setting(word(1)) {
                return Ok(Statement::Show(name));
            }
        }
        "RESET" => {
            if let Some(name) = session_setting(word(1)) {
                return Ok(Statement::Set {
                    name,
                    value: None,
                    reset: true,
                });
            }
        }
        "SET" => {
            if let Some(name) = session_setting(word(1)) {
                let after_name = lexed.head[1].end;
                let rest = text[after_name..lexed.span.end].trim();
                let value = rest
                    .strip_prefix('=')
                    .or_else(|| {
                        // Bytes, not a slice of the text: its third byte may sit inside a
                        // character (found by the wire fuzzer).
                        (rest.len() > 2 && rest.as_bytes()[..2].eq_ignore_ascii_case(b"TO"))
                            .then(|| &rest[2..])
                            .filter(|v| v.starts_with(|c: char| c.is_whitespace() || c == '\''))
                    })
                    .unwrap_or(rest)
                    .trim();
                let value = value.trim_matches('\'').trim_matches('"').to_string();
                return Ok(Statement::Set {
                    name,
                    value: (!value.eq_ignore_ascii_case("default")).then_some(value),
                    reset: false,
                });
            }
        }
        "DECLARE" => return declare(text, lexed),
        "COPY" => {
            if let Some(copy) = copy_out(text, lexed) {
                return copy;
            }
        }
        "FETCH" => {
            return fetch(
                &lexed
                    .head
                    .iter()
                    .map(|r| &text[r.clone()])
                    .collect::<Vec<_>>(),
            )
        }
        "CLOSE" => {
            return match word(1) {
                Some(w) if w.eq_ignore_ascii_case("ALL") => Ok(Statement::Close(None)),
                Some(w) => Ok(Statement::Close(Some(cursor_name(w)))),
                None => Err(Error::new(
                    ErrorCode::SyntaxError,
                    "CLOSE needs a cursor name (or ALL)",
                )),
            }
        }
        _ => {}
    }
    query(text, lexed)
}

/// A statement for the engine: the `SETTINGS` tail off, its kind, its literals.
fn query(text: &str, lexed: &Lexed) -> Result<Statement> {
    let source = text[lexed.span.clone()].trim_end();
    check_nesting(lexed.nesting)?;
    let markup = split_settings(source)?;
    let literals = lexed
        .literals
        .iter()
        .map(|r| r.start - lexed.span.start..r.end - lexed.span.start)
        .filter(|r| r.end <= markup.query.len())
        .collect();
    // `(SELECT 1)`: the kind is the first word's, past parentheses.
    let kind = lexed
        .head
        .iter()
        .map(|r| &text[r.clone()])
        .find(|w| *w != "(")
        .map_or(StatementKind::Utility, StatementKind::of);
    Ok(Statement::Query(Query {
        text: markup.query.into(),
        settings: markup.settings,
        kind,
        literals,
        nesting: lexed.nesting,
    }))
}

/// `DECLARE name … CURSOR … FOR query`: the query is lexed as a statement of its own.
fn declare(text: &str, lexed: &Lexed) -> Result<Statement> {
    let words: Vec<&str> = lexed.head.iter().map(|r| &text[r.clone()]).collect();
    let syntax = || {
        Error::new(
            ErrorCode::SyntaxError,
            "expected DECLARE name [BINARY] [NO SCROLL] CURSOR [WITH HOLD | WITHOUT HOLD] FOR query",
        )
    };
    let name = words.get(1).map(|w| cursor_name(w)).ok_or_else(syntax)?;
    let at = words
        .iter()
        .position(|w| w.eq_ignore_ascii_case("FOR"))
        .ok_or_else(syntax)?;
    let options: Vec<String> = words[2..at]
        .iter()
        .map(|w| w.to_ascii_uppercase())
        .collect();
    if !options.iter().any(|w| w == "CURSOR") {
        return Err(syntax());
    }
    if options.iter().any(|w| w == "SCROLL") && !options.iter().any(|w| w == "NO") {
        return Err(Error::new(
            ErrorCode::NotImplemented,
            "cursors are NO SCROLL: rows stream forward once",
        ));
    }
    let hold = options.windows(2).any(|w| w[0] == "WITH" && w[1] == "HOLD");
    let query = sub_query(text, lexed.head[at].end..lexed.span.end).ok_or_else(syntax)??;
    Ok(Statement::Declare { name, hold, query })
}

/// The statement in `range` of `text`, lexed on its own, as a query (`None`: not exactly one
/// statement there).
fn sub_query(text: &str, range: Range<usize>) -> Option<Result<Query>> {
    let start = range.start;
    let inner = split(&text[range]);
    let [first] = inner.as_slice() else {
        return None;
    };
    let shift = |r: &Range<usize>| r.start + start..r.end + start;
    let shifted = Lexed {
        span: shift(&first.span),
        head: first.head.iter().map(shift).collect(),
        literals: first.literals.iter().map(shift).collect(),
        nesting: first.nesting,
    };
    Some(match query(text, &shifted) {
        Ok(Statement::Query(q)) => Ok(q),
        Ok(_) => return None,
        Err(e) => Err(e),
    })
}

/// `COPY … TO STDOUT [options]`; `None` for any other `COPY` (the engine's: files).
fn copy_out(text: &str, lexed: &Lexed) -> Option<Result<Statement>> {
    let source = &text[lexed.span.clone()];
    let upper = source.to_ascii_uppercase();
    let to = upper.rfind(" TO ")?;
    let after = upper[to + 4..].trim_start();
    if !after.starts_with("STDOUT") {
        return None;
    }
    let options = source[source.len() - after.len() + "STDOUT".len()..].trim();
    let format = match copy_options(options) {
        Ok(f) => f,
        Err(e) => return Some(Err(e)),
    };
    let body_start = lexed.head.first()?.end - lexed.span.start;
    let body = source[body_start..to].trim();
    let offset = lexed.span.start + source[..to].find(body).unwrap_or(body_start);
    let query = if let Some(inner) = body.strip_prefix('(').and_then(|b| b.strip_suffix(')')) {
        let start = offset + 1;
        sub_query(text, start..start + inner.len())?
    } else {
        // `COPY table [(a, b)]`: its rows, as `SELECT` reads them.
        let (table, columns) = match body.split_once('(') {
            Some((t, cols)) => (t.trim(), cols.trim_end_matches(')').trim()),
            None => (body, "*"),
        };
        Ok(Query {
            text: format!("SELECT {columns} FROM {table}").into(),
            settings: Vec::new(),
            kind: StatementKind::Select,
            literals: Vec::new(),
            nesting: lexed.nesting,
        })
    };
    Some(query.map(|query| Statement::CopyOut { query, format }))
}

/// `WITH (FORMAT csv, HEADER, DELIMITER ',', NULL '')`, or the older `WITH CSV HEADER`.
fn copy_options(options: &str) -> Result<CopyFormat> {
    let mut format = CopyFormat::text();
    let options = options.trim_end_matches(';').trim();
    let options = options
        .strip_prefix("WITH")
        .or_else(|| options.strip_prefix("with"))
        .unwrap_or(options)
        .trim();
    let unquote = |v: &str| v.trim().trim_matches('\'').replace("''", "'");
    // `(FORMAT csv, HEADER, …)`: options split at commas; the older form is words.
    let parts: Vec<&str> = match options.strip_prefix('(').and_then(|o| o.strip_suffix(')')) {
        Some(list) => list.split(',').collect(),
        None => options.split_whitespace().collect(),
    };
    for part in parts {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (key, value) = match part.split_once(char::is_whitespace) {
            Some((k, v)) => (k.to_ascii_uppercase(), Some(v.trim())),
            None => (part.to_ascii_uppercase(), None),
        };
        match (key.as_str(), value) {
            ("FORMAT", Some(v)) if v.eq_ignore_ascii_case("csv") => {
                format.csv = true;
                format.delimiter = ",".into();
                format.null = String::new();
            }
            ("FORMAT", Some(v)) if v.eq_ignore_ascii_case("text") => {}
            ("CSV", None) => {
                format.csv = true;
                format.delimiter = ",".into();
                format.null = String::new();
            }
            ("HEADER", None) => format.header = true,
            ("HEADER", Some(v)) => {
                format.header = matches!(v.to_ascii_lowercase().as_str(), "true" | "on" | "1")
            }
            ("DELIMITER", Some(v)) => format.delimiter = unquote(v),
            ("NULL", Some(v)) => format.null = unquote(v),
            _ => {
                return Err(Error::new(
                    ErrorCode::NotImplemented,
                    format!("COPY TO STDOUT option '{part}' is not supported; sluice writes FORMAT text or csv, HEADER, DELIMITER and NULL"),
                )
                .with_sqlstate("0A000"))
            }
        }
    }
    Ok(format)
}

/// `FETCH …`: how many rows, from which cursor.
fn fetch(words: &[&str]) -> Result<Statement> {
    let syntax = || {
        Error::new(
            ErrorCode::SyntaxError,
            "expected FETCH [NEXT | count | ALL | FORWARD [count | ALL]] [FROM | IN] cursor",
        )
    };
    let mut rest = &words[1..];
    let mut count = Some(1);
    let upper = |w: &str| w.to_ascii_uppercase();
    if let Some(first) = rest.first() {
        match upper(first).as_str() {
            "NEXT" => rest = &rest[1..],
            "ALL" => {
                count = None;
                rest = &rest[1..];
            }
            "FORWARD" => {
                rest = &rest[1..];
                match rest.first().map(|w| upper(w)) {
                    Some(w) if w == "ALL" => {
                        count = None;
                        rest = &rest[1..];
                    }
                    Some(w) if w.parse::<u64>().is_ok() => {
                        count = w.parse().ok();
                        rest = &rest[1..];
                    }
                    _ => {}
                }
            }
            "PRIOR" | "FIRST" | "LAST" | "ABSOLUTE" | "RELATIVE" | "BACKWARD" => {
                return Err(Error::new(
                    ErrorCode::NotImplemented,
                    "cursors are NO SCROLL: only FETCH NEXT, FETCH n, FETCH ALL and FETCH FORWARD",
                ))
            }
            w if w.parse::<u64>().is_ok() => {
                count = w.parse().ok();
                rest = &rest[1..];
            }
            _ => {}
        }
    }
    if rest
        .first()
        .is_some_and(|w| w.eq_ignore_ascii_case("FROM") || w.eq_ignore_ascii_case("IN"))
    {
        rest = &rest[1..];
    }
    match rest {
        [name] => Ok(Statement::Fetch {
            name: cursor_name(name),
            count,
        }),
        _ => Err(syntax()),
    }
}

/// A cursor's name as Postgres folds it: quoted names keep their case.
fn cursor_name(word: &str) -> String {
    match word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
        Some(quoted) => quoted.replace("\"\"", "\""),
        None => word.to_ascii_lowercase(),
    }
}

/// The name of a session setting sluice keeps itself, from the word after `SET`/`SHOW`/`RESET`:
/// engine settings (`datafusion.*`) and the engine's own `SHOW` forms are the engine's.
fn session_setting(word: Option<&str>) -> Option<String> {
    let word = word?;
    let upper = word.to_ascii_uppercase();
    let engine_owned = upper.starts_with("DATAFUSION")
        || matches!(upper.as_str(), "ALL" | "TABLES" | "COLUMNS" | "=" | "TIME");
    (!engine_owned
        && word
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_'))
    .then(|| word.to_ascii_lowercase())
}

/// Past [`MAX_NESTING`] a statement is refused before anything parses it.
fn check_nesting(nesting: usize) -> Result<()> {
    if nesting > MAX_NESTING {
        return Err(Error::new(
            ErrorCode::TooDeepAst,
            format!(
                "AST is too deep: the statement nests {nesting} levels of parentheses and operators. Maximum: {MAX_NESTING}; split the expression or use IN (…) lists"
            ),
        ));
    }
    Ok(())
}

/// `KILL QUERY WHERE … [SYNC|ASYNC|TEST]`, `MOVE QUERY WHERE … TO WORKLOAD name`.
fn operator_command(text: &str, lexed: &Lexed, first: &str) -> Result<Statement> {
    let mut collect = Spans(Vec::new());
    let statement = &text[lexed.span.clone()];
    lex(statement, &mut collect);
    let tokens = collect.0;
    let word = |i: usize| tokens.get(i).map(|(_, r)| &statement[r.clone()]);
    let is = |i: usize, kw: &str| word(i).is_some_and(|w| w.eq_ignore_ascii_case(kw));
    let usage = if first == "KILL" {
        "expected KILL QUERY WHERE condition [SYNC | ASYNC | TEST], the condition over system.processes columns (query_id, user, workload, state, query, …)"
    } else {
        "expected MOVE QUERY WHERE condition TO WORKLOAD name, the condition over system.processes columns (query_id, user, workload, state, query, …)"
    };
    let usage = || Error::new(ErrorCode::SyntaxError, usage);
    if !is(2, "WHERE") || tokens.len() < 4 {
        return Err(usage());
    }
    let mut end = tokens.len();
    if tokens
        .last()
        .is_some_and(|(_, r)| &statement[r.clone()] == ";")
    {
        end -= 1;
    }
    let between = |from: usize, to: usize| -> Result<String> {
        if to <= from {
            return Err(usage());
        }
        Ok(statement[tokens[from].1.start..tokens[to - 1].1.end].to_string())
    };
    if first == "KILL" {
        let mode = match word(end - 1).map(str::to_ascii_uppercase).as_deref() {
            Some("SYNC") => Some(KillMode::Sync),
            Some("ASYNC") => Some(KillMode::Async),
            Some("TEST") => Some(KillMode::Test),
            _ => None,
        };
        if mode.is_some() {
            end -= 1;
        }
        return Ok(Statement::KillQuery {
            predicate: between(3, end)?,
            mode: mode.unwrap_or(KillMode::Async),
        });
    }
    if end < 7 || !is(end - 3, "TO") || !is(end - 2, "WORKLOAD") {
        return Err(usage());
    }
    Ok(Statement::MoveQuery {
        predicate: between(3, end - 3)?,
        workload: word(end - 1).map(unquote).unwrap_or_default(),
    })
}

/// Every token's span (for statements read past their first words).
struct Spans(Vec<(TokenKind, Range<usize>)>);

impl Tokens for Spans {
    fn token(&mut self, kind: TokenKind, span: Range<usize>) {
        self.0.push((kind, span));
    }
}

/// `PIN FINGERPRINT 'id' TO WORKLOAD w`, `FORGET FINGERPRINT 'id'`.
fn fingerprint_command<'a>(
    first: &str,
    word: &impl Fn(usize) -> Option<&'a str>,
) -> Result<Statement> {
    let usage = || {
        Error::new(
            ErrorCode::SyntaxError,
            "expected PIN FINGERPRINT 'fingerprint' TO WORKLOAD name, or FORGET FINGERPRINT 'fingerprint' (system.fingerprints lists them)",
        )
    };
    let id = word(2)
        .and_then(|w| w.strip_prefix('\'')?.strip_suffix('\''))
        .ok_or_else(usage)?
        .to_ascii_lowercase();
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::bad_arguments(format!(
            "'{id}' is not a fingerprint: fingerprints are 16 hex digits, as system.fingerprints lists them"
        )));
    }
    let is = |i: usize, kw: &str| word(i).is_some_and(|w| w.eq_ignore_ascii_case(kw));
    let workload = if first == "PIN" {
        if !(is(3, "TO") && is(4, "WORKLOAD")) {
            return Err(usage());
        }
        Some(word(5).map(unquote).ok_or_else(usage)?)
    } else {
        None
    };
    let expected_words = if workload.is_some() { 6 } else { 3 };
    if word(expected_words).is_some() {
        return Err(usage());
    }
    Ok(Statement::Fingerprint { id, workload })
}

fn unquote(word: &str) -> String {
    word.trim_matches('`').trim_matches('"').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_with_one_integer_shape_differ_only_in_integers() {
        let shape = |text: &str| {
            let mut key = Vec::new();
            integer_shape(text, &mut key).then(|| String::from_utf8(key).expect("UTF-8"))
        };
        let same = [
            (
                "SELECT a FROM t WHERE id = 5;",
                "SELECT a FROM t WHERE id = 123456;",
            ),
            ("select x+1 from t limit 10", "select x+22 from t limit 3"),
            ("SELECT * FROM t WHERE ü = 1", "SELECT * FROM t WHERE ü = 2"),
        ];
        for (a, b) in same {
            assert!(shape(a).is_some(), "{a}");
            assert_eq!(shape(a), shape(b), "{a} / {b}");
            // And the reading agrees: one query, of one kind.
            let (Ok(Statement::Query(qa)), Ok(Statement::Query(qb))) = (
                statement(a).map(Option::unwrap),
                statement(b).map(Option::unwrap),
            ) else {
                panic!("{a} / {b}: queries");
            };
            assert_eq!((qa.kind, qa.nesting), (qb.kind, qb.nesting));
        }
        let differ = [
            ("SELECT 1.5", "SELECT 1.7"),
            ("SELECT .5", "SELECT .7"),
            ("SELECT 1e5", "SELECT 1e6"),
            ("SELECT 0x1F", "SELECT 0x2F"),
            ("SELECT t1 FROM t", "SELECT t2 FROM t"),
            ("SELECT t.c1", "SELECT t.c2"),
        ];
        for (a, b) in differ {
            assert_ne!(shape(a), shape(b), "{a} / {b}");
        }
        // Told without a key exactly when the keys agree.
        let mut pairs: Vec<(&str, &str)> = same.iter().chain(differ.iter()).copied().collect();
        pairs.extend([
            ("SELECT 1", "SELECT 1"),
            ("SELECT 12", "SELECT 1"),
            ("SELECT 1", "SELECT 1 "),
            ("SELECT 1 ", "SELECT 1"),
            ("SELECT 1", "SELECT a"),
            ("SELECT a", "SELECT 1"),
            ("SELECT 1, 2", "SELECT 3, 4"),
            ("SELECT 1, 2", "SELECT 3,4"),
            ("SELECT 12x", "SELECT 34x"),
            ("SELECT 12x", "SELECT 12x"),
            ("SELECT x12", "SELECT x12"),
            ("SELECT 5.", "SELECT 6."),
            ("SELECT 5.", "SELECT 5."),
            ("LIMIT 10", "LIMIT 10000000000000000000000"),
            ("SELECT ü1", "SELECT ü2"),
            ("", ""),
            ("1", "2"),
            ("1", ""),
        ]);
        for (a, b) in pairs {
            for (a, b) in [(a, b), (b, a)] {
                if shape(a).is_some() {
                    assert_eq!(
                        same_integer_shape(a.as_bytes(), b.as_bytes()),
                        shape(a) == shape(b),
                        "{a:?} / {b:?}"
                    );
                }
            }
        }
        for text in [
            "SELECT '1'",
            "SELECT \"c1\"",
            "SELECT `c1`",
            "SELECT $1",
            "SELECT $$1$$",
            "SELECT 1 -- 2",
            "SELECT 1 /* 2 */",
            "SELECT E'\\1'",
            "SELECT 1 SETTINGS max_threads = 2",
            "SELECT pg_cancel_backend(12)",
            "select PG_TERMINATE_BACKEND(99999999999)",
            "SELECT 1 AS my_settings",
        ] {
            assert_eq!(shape(text), None, "{text}");
        }
    }

    fn texts(sql: &str) -> Vec<&str> {
        split(sql).into_iter().map(|l| &sql[l.span]).collect()
    }

    #[test]
    fn semicolons_split_only_outside_quotes_and_comments() {
        let cases: &[(&str, &[&str])] = &[
            ("select 1; select 2;", &["select 1", "select 2"]),
            ("select ';'; select 2", &["select ';'", "select 2"]),
            ("select 'it''s;'; x", &["select 'it''s;'", "x"]),
            (r"select E'a\';b'; x", &[r"select E'a\';b'", "x"]),
            (r"select 'a\'; x", &[r"select 'a\'", "x"]),
            ("select \"a;b\"; x", &["select \"a;b\"", "x"]),
            ("select `a;b`; x", &["select `a;b`", "x"]),
            ("select $$a;b$$; x", &["select $$a;b$$", "x"]),
            ("select $f$a;$$;b$f$; x", &["select $f$a;$$;b$f$", "x"]),
            ("select a$b; x", &["select a$b", "x"]),
            ("select $1; x", &["select $1", "x"]),
            ("-- c;\nselect 1; x", &["-- c;\nselect 1", "x"]),
            ("select 1 -- c;\n; x", &["select 1 -- c;\n", "x"]),
            ("/* c; */ select 1; x", &["/* c; */ select 1", "x"]),
            (
                "/* a /* b; */ c; */ select 1; x",
                &["/* a /* b; */ c; */ select 1", "x"],
            ),
            ("select 1 /* ; */ + 2; x", &["select 1 /* ; */ + 2", "x"]),
            ("select 1+-- c;\n2; x", &["select 1+-- c;\n2", "x"]),
            (";; -- only comments;\n /* ; */ ;", &[]),
            ("select 'unterminated; x", &["select 'unterminated; x"]),
            ("select 'é;'; ü", &["select 'é;'", "ü"]),
        ];
        for (sql, expected) in cases {
            assert_eq!(texts(sql), *expected, "{sql}");
        }
    }

    #[test]
    fn operator_commands() {
        assert_eq!(
            statement("KILL QUERY WHERE user = 'bob' AND query LIKE '%;%' SYNC")
                .ok()
                .flatten(),
            Some(Statement::KillQuery {
                predicate: "user = 'bob' AND query LIKE '%;%'".into(),
                mode: KillMode::Sync
            })
        );
        assert_eq!(
            statement("kill query where query_id = 7").ok().flatten(),
            Some(Statement::KillQuery {
                predicate: "query_id = 7".into(),
                mode: KillMode::Async
            })
        );
        assert_eq!(
            statement("MOVE QUERY WHERE workload = 'fast' AND elapsed_ms > 1000 TO WORKLOAD slow;")
                .ok()
                .flatten(),
            Some(Statement::MoveQuery {
                predicate: "workload = 'fast' AND elapsed_ms > 1000".into(),
                workload: "slow".into()
            })
        );
        assert_eq!(
            statement("SELECT pg_terminate_backend(42)").ok().flatten(),
            Some(Statement::SignalBackend {
                pid: 42,
                terminate: true
            })
        );
        // With anything more it is an ordinary query.
        assert!(matches!(
            statement("SELECT pg_cancel_backend(pid) FROM x")
                .ok()
                .flatten(),
            Some(Statement::Query(_))
        ));
        for bad in [
            "KILL QUERY",
            "KILL QUERY WHERE",
            "KILL QUERY WHERE SYNC",
            "MOVE QUERY WHERE x = 1",
            "MOVE QUERY WHERE TO WORKLOAD slow",
        ] {
            assert_eq!(
                statement(bad).map_err(|e| e.code),
                Err(ErrorCode::SyntaxError),
                "{bad}"
            );
        }
    }

    #[test]
    fn operator_commands_are_bounded_and_fingerprints_checked() {
        let deep = format!("KILL QUERY WHERE {}1{}", "(".repeat(5000), ")".repeat(5000));
        assert_eq!(
            statement(&deep).map_err(|e| e.code),
            Err(ErrorCode::TooDeepAst)
        );
        assert_eq!(
            statement("FORGET FINGERPRINT 'abc'").map_err(|e| e.code),
            Err(ErrorCode::BadArguments)
        );
    }

    #[test]
    fn fingerprint_commands() {
        assert_eq!(
            statement("PIN FINGERPRINT '00AB00ab00AB00ab' TO WORKLOAD \"slow lane\"")
                .ok()
                .flatten(),
            Some(Statement::Fingerprint {
                id: "00ab00ab00ab00ab".into(),
                workload: Some("slow lane".into())
            })
        );
        assert_eq!(
            statement("forget fingerprint '00ab00ab00ab00ab';")
                .ok()
                .flatten(),
            Some(Statement::Fingerprint {
                id: "00ab00ab00ab00ab".into(),
                workload: None
            })
        );
        for bad in [
            "PIN FINGERPRINT 00ab TO WORKLOAD w",
            "PIN FINGERPRINT '00ab00ab00ab00ab' WORKLOAD w",
            "PIN FINGERPRINT '00ab00ab00ab00ab' TO WORKLOAD",
            "FORGET FINGERPRINT '00ab00ab00ab00ab' now",
        ] {
            assert_eq!(
                statement(bad).map_err(|e| e.code),
                Err(ErrorCode::SyntaxError),
                "{bad}"
            );
        }
    }

    #[test]
    fn literals_and_kinds() {
        let s = "SELECT * FROM t WHERE a = 'x' AND b IN (1, 2.5e-3, $1) SETTINGS workload = 'w'";
        let Ok(Statement::Query(q)) = statements(s).remove(0) else {
            panic!("a query")
        };
        let lits: Vec<&str> = q.literals.iter().map(|r| &q.text[r.clone()]).collect();
        assert_eq!(lits, ["'x'", "1", "2.5e-3", "$1"]);
        assert_eq!(q.kind, StatementKind::Select);
        assert_eq!(q.settings.len(), 1);
        assert!(!q.text.contains("SETTINGS"));
        let kind = |sql: &str| match statements(sql).remove(0) {
            Ok(Statement::Query(q)) => q.kind,
            other => panic!("{sql}: {other:?}"),
        };
        assert_eq!(kind("(SELECT 1)"), StatementKind::Select);
        assert_eq!(kind("insert into t values (1)"), StatementKind::Insert);
        assert_eq!(kind("/* x */ UPDATE t SET a = 1"), StatementKind::Update);
        assert_eq!(kind("delete from t"), StatementKind::Delete);
        assert_eq!(kind("CREATE TABLE t (x int)"), StatementKind::Ddl);
        assert_eq!(kind("EXPLAIN SELECT 1"), StatementKind::Utility);
        assert_eq!(
            kind("SET datafusion.execution.batch_size = 10"),
            StatementKind::Utility
        );
    }

    #[test]
    fn routes() {
        let one = |sql: &str| statements(sql).remove(0).expect(sql);
        assert!(matches!(
            one("create or replace workload x"),
            Statement::Workload(_)
        ));
        assert!(matches!(one("  DROP RESOURCE r;"), Statement::Workload(_)));
        assert!(one("CREATE TABLE t (x int)").is_query());
        let set = |name: &str, value: Option<&str>, reset| Statement::Set {
            name: name.into(),
            value: value.map(str::to_string),
            reset,
        };
        assert_eq!(
            one("SET workload = 'prod'"),
            set("workload", Some("prod"), false)
        );
        assert_eq!(
            one("set workload to dev"),
            set("workload", Some("dev"), false)
        );
        assert_eq!(one("SET workload TO DEFAULT"), set("workload", None, false));
        // A value that starts with a character of more than one byte (a client's invalid
        // UTF-8 arrives as U+FFFD): read as it is, no panic.
        assert_eq!(
            one("SET workload \u{fffd} 'x'"),
            set("workload", Some("\u{fffd} 'x"), false)
        );
        assert_eq!(one("RESET workload"), set("workload", None, true));
        assert_eq!(
            one("SET application_name='psql'"),
            set("application_name", Some("psql"), false)
        );
        assert_eq!(one("SHOW workload"), Statement::Show("workload".into()));
        assert_eq!(
            one("SHOW WORKLOADS"),
            Statement::ShowEntities(EntityKind::Workload)
        );
        assert_eq!(
            one("show create workload `all`"),
            Statement::ShowCreate {
                kind: EntityKind::Workload,
                name: "all".into()
            }
        );
        assert!(one("SET datafusion.execution.batch_size = 10").is_query());
        assert!(one("SHOW ALL").is_query());
        assert!(one("SELECT 1 SETTINGS workload = 'x'").is_query());
        assert_eq!(
            one("begin"),
            Statement::Transaction(TransactionControl::Begin)
        );
        assert_eq!(
            one("START TRANSACTION"),
            Statement::Transaction(TransactionControl::Begin)
        );
        assert_eq!(
            one("COMMIT;"),
            Statement::Transaction(TransactionControl::Commit)
        );
    }

    #[test]
    fn copy_to_stdout() {
        let one = |sql: &str| statements(sql).remove(0);
        match one("COPY (SELECT a, b FROM t WHERE a > 1) TO STDOUT WITH (FORMAT csv, HEADER)") {
            Ok(Statement::CopyOut { query, format }) => {
                assert_eq!(&*query.text, "SELECT a, b FROM t WHERE a > 1");
                assert!(format.csv && format.header);
                assert_eq!(format.delimiter, ",");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            one("COPY t TO STDOUT WITH (FORMAT csv)"),
            Ok(Statement::CopyOut {
                format: CopyFormat {
                    csv: true,
                    header: false,
                    ..
                },
                ..
            })
        ));
        assert!(matches!(
            one("COPY t TO STDOUT CSV HEADER"),
            Ok(Statement::CopyOut {
                format: CopyFormat {
                    csv: true,
                    header: true,
                    ..
                },
                ..
            })
        ));
        match one("copy t (a, b) to stdout") {
            Ok(Statement::CopyOut { query, format }) => {
                assert_eq!(&*query.text, "SELECT a, b FROM t");
                assert!(!format.csv);
                assert_eq!(format.null, "\\N");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            one("COPY t TO STDOUT WITH (FORMAT binary)"),
            Err(e) if e.sqlstate() == "0A000"
        ));
        // To a file: the engine's.
        assert!(one("COPY (SELECT 1) TO 'x.csv'").is_ok_and(|s| s.is_query()));
    }

    #[test]
    fn cursors() {
        let one = |sql: &str| statements(sql).remove(0);
        match one(r#"DECLARE "Big" NO SCROLL CURSOR WITH HOLD FOR SELECT * FROM t WHERE a = $1"#) {
            Ok(Statement::Declare { name, hold, query }) => {
                assert_eq!(name, "Big");
                assert!(hold);
                assert_eq!(&*query.text, "SELECT * FROM t WHERE a = $1");
                assert_eq!(query.kind, StatementKind::Select);
                assert_eq!(&query.text[query.literals[0].clone()], "$1");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            one("declare c cursor for select 1"),
            Ok(Statement::Declare { hold: false, .. })
        ));
        assert!(one("DECLARE c SCROLL CURSOR FOR SELECT 1").is_err());
        let fetch = |sql: &str| match one(sql) {
            Ok(Statement::Fetch { name, count }) => (name, count),
            other => panic!("{sql}: {other:?}"),
        };
        assert_eq!(fetch("FETCH c"), ("c".into(), Some(1)));
        assert_eq!(fetch("FETCH NEXT FROM c"), ("c".into(), Some(1)));
        assert_eq!(fetch("FETCH 10 IN c"), ("c".into(), Some(10)));
        assert_eq!(fetch("FETCH ALL FROM c"), ("c".into(), None));
        assert_eq!(
            fetch(r#"FETCH FORWARD 100 FROM "C""#),
            ("C".into(), Some(100))
        );
        assert_eq!(fetch("FETCH FORWARD ALL FROM c"), ("c".into(), None));
        assert!(one("FETCH BACKWARD 1 FROM c").is_err());
        assert_eq!(one("CLOSE c"), Ok(Statement::Close(Some("c".into()))));
        assert_eq!(one("CLOSE ALL"), Ok(Statement::Close(None)));
    }

    #[test]
    fn nesting_is_bounded_before_anything_parses_it() {
        let deep = |sql: String| match statements(&sql).remove(0) {
            Ok(Statement::Query(q)) => Ok(q.nesting),
            Err(e) => Err(e.code),
            other => panic!("{other:?}"),
        };
        let sum = |n: usize| format!("SELECT 1{}", "+1".repeat(n));
        assert_eq!(deep(sum(10)), Ok(10));
        assert_eq!(deep(sum(MAX_NESTING)), Ok(MAX_NESTING));
        assert_eq!(deep(sum(100_000)), Err(ErrorCode::TooDeepAst));
        let parens = |n: usize| format!("SELECT {}1{}", "(".repeat(n), ")".repeat(n));
        assert_eq!(deep(parens(5)), Ok(5));
        assert_eq!(deep(parens(50_000)), Err(ErrorCode::TooDeepAst));
        // Lists are wide, not deep.
        let list = format!("SELECT 1 WHERE 1 IN ({})", vec!["-1"; 50_000].join(", "));
        assert!(deep(list).is_ok_and(|n| n < 5));
        let rows = format!(
            "INSERT INTO t VALUES {}",
            vec!["(1 + 1, 'a')"; 20_000].join(", ")
        );
        assert!(deep(rows).is_ok_and(|n| n < 5));
        // Clauses start afresh.
        let wide = format!(
            "SELECT {} FROM t WHERE {}",
            "a + ".repeat(600) + "a",
            "b = 1 AND ".repeat(300) + "true"
        );
        assert!(deep(wide).is_ok());
        // Keywords in any case; identifiers that only start like one are not.
        assert_eq!(deep("SELECT a aNd b Or c".to_string()), Ok(2));
        assert_eq!(deep("SELECT a + b wHeRe c + d".to_string()), Ok(1));
        assert_eq!(deep("SELECT a + andy + b + orders".to_string()), Ok(3));
    }

    #[test]
    fn a_script_is_read_as_each_statement_alone() {
        let script = "/* c */ SELECT 1 SETTINGS workload = 'a'; set workload = 'b' ;\n\
                      -- x\nSELECT 'x;y' AND 1 = $1;; DECLARE c CURSOR FOR SELECT 2;";
        let together = statements_with_text(script);
        let texts: Vec<&str> = together.iter().map(|(text, _)| *text).collect();
        assert_eq!(
            texts,
            [
                "/* c */ SELECT 1 SETTINGS workload = 'a'",
                "set workload = 'b'",
                "-- x\nSELECT 'x;y' AND 1 = $1",
                "DECLARE c CURSOR FOR SELECT 2"
            ]
        );
        for (text, read) in together {
            let alone = statement(text).map(|s| s.expect("a statement"));
            assert_eq!(format!("{read:?}"), format!("{alone:?}"), "{text}");
        }
    }
}

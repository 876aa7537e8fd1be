//! The lexer: one pass over a client's text that splits it into statements and hands each
//! token to whoever wants it ([`lex`]; [`split`] wants none). The statement model
//! ([`crate::statement`]), fingerprints and SQLCommenter tags all read a text through it.
//!
//! The lexer follows PostgreSQL's rules, since the text is the client's: `--` comments to the end
//! of the line, `/* */` comments (nested, as Postgres has them), `'…'` (quotes doubled), `E'…'`
//! (backslash escapes too), `"…"`, `` `…` `` (ClickHouse's quoted identifiers), and
//! `$tag$…$tag$` dollar quoting. A `;` splits statements only outside all of them.
//!
//! Invariants:
//! - Lexing is one linear pass without recursion, whatever the input (a 100,000-term
//!   expression costs as much as its length); it never panics and every span it reports lies on
//!   character boundaries of the text.
//! - A statement's span starts at its first comment or word (a comment before it is its own:
//!   its tags are read from it) and ends before its `;`; a piece with only comments is none.

use std::ops::Range;

/// A statement's place in the text and what one pass over it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lexed {
    /// From the first character that is not whitespace (a comment before the first word is
    /// the statement's: its tags are read from it), to the end before `;`. A piece with only
    /// comments is no statement.
    pub span: Range<usize>,
    /// The first few words and symbols outside comments, for routing: their spans in the text.
    pub head: Vec<Range<usize>>,
    /// Literal spans, absolute in the text: those ending within the statement's first
    /// [`FINGERPRINTED_BYTES`].
    pub literals: Vec<Range<usize>>,
    pub nesting: usize,
}

/// Words kept per statement for routing (`CREATE OR REPLACE WORKLOAD`, `SHOW CREATE WORKLOAD x`).
const HEAD_WORDS: usize = 12;

/// How much of a statement its fingerprint reads ([`crate::fingerprint`]): literal spans
/// ([`Lexed::literals`]) are kept that far. ClickHouse's default `max_query_size`, the most of a
/// statement ClickHouse reads at all.
pub const FINGERPRINTED_BYTES: usize = 256 * 1024;

/// A statement text longer than this is read (lexed, parsed) on a blocking thread rather than
/// on the connection thread every client of it shares: reading costs ~75–300 instructions a
/// byte, so a text of megabytes held the thread's other clients for a tenth of a second or
/// more (BENCHMARKS.md, issue 38, session 37).
pub const READ_APART_BYTES: usize = 256 * 1024;

/// Splits `text` at top-level `;` (see the module docs for the quoting rules). Statements with
/// nothing but whitespace and comments are left out. An unterminated quote or comment runs to
/// the end of the text (the engine reports it).
pub fn split(text: &str) -> Vec<Lexed> {
    lex(text, &mut ())
}

/// What a token is, for whoever wants every token of a text ([`lex`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A string, number, dollar-quoted text or `$n` placeholder.
    Literal,
    /// A word: keyword or unquoted identifier.
    Word,
    /// `"…"` or `` `…` ``.
    QuotedIdent,
    /// `(`, `[`, `)`, `]`, `,`, `.`, `;` or a run of operator characters.
    Symbol,
}

/// Receives each token [`lex`] passes, in order (comments and whitespace are not tokens).
pub trait Tokens {
    fn token(&mut self, kind: TokenKind, span: Range<usize>);
    /// A `/* … */` comment (its whole span, delimiters included); most sinks ignore them.
    #[inline]
    fn comment(&mut self, _span: Range<usize>) {}
}

/// No tokens wanted: [`split`].
impl Tokens for () {
    #[inline]
    fn token(&mut self, _kind: TokenKind, _span: Range<usize>) {}
}

/// [`split`], handing every token to `tokens` as it passes (the fingerprints read them; the
/// text is still lexed once).
pub fn lex(text: &str, tokens: &mut impl Tokens) -> Vec<Lexed> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut current = Builder::default();
    let mut i = 0;
    let ident = |b: u8| IDENT[b as usize];
    while i < bytes.len() {
        let b = bytes[i];
        let next = bytes.get(i + 1).copied();
        match b {
            b';' => {
                tokens.token(TokenKind::Symbol, i..i + 1);
                current.finish(i, &mut out);
                i += 1;
            }
            b'-' if next == Some(b'-') => {
                current.comment(i);
                i = memchr(bytes, i, b'\n').map_or(bytes.len(), |n| n + 1);
            }
            b'/' if next == Some(b'*') => {
                let start = i;
                let mut depth = 0usize;
                while i < bytes.len() {
                    if bytes[i] == b'/' && bytes.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                current.comment(start);
                tokens.comment(start..i);
            }
            c if c.is_ascii_whitespace() => i += 1,
            b'\'' => {
                let escapes =
                    i > 0 && matches!(bytes[i - 1], b'E' | b'e') && (i < 2 || !ident(bytes[i - 2]));
                let start = if escapes { i - 1 } else { i };
                let end = quoted(bytes, i, b'\'', escapes);
                tokens.token(TokenKind::Literal, start..end);
                current.literal(start, end);
                i = end;
            }
            b'"' | b'`' => {
                let end = quoted(bytes, i, b, false);
                tokens.token(TokenKind::QuotedIdent, i..end);
                current.token(i, end);
                i = end;
            }
            b'$' if next.is_some_and(|n| n.is_ascii_digit()) => {
                // A placeholder `$n`.
                let mut end = i + 1;
                while end < bytes.len() && bytes[end].is_ascii_digit() {
                    end += 1;
                }
                tokens.token(TokenKind::Literal, i..end);
                current.literal(i, end);
                i = end;
            }
            b'$' if i == 0 || !ident(bytes[i - 1]) => match dollar_tag(bytes, i) {
                Some(tag_end) => {
                    let tag = &bytes[i..tag_end];
                    let end = find(bytes, tag_end, tag).map_or(bytes.len(), |at| at + tag.len());
                    tokens.token(TokenKind::Literal, i..end);
                    current.literal(i, end);
                    i = end;
                }
                None => {
                    tokens.token(TokenKind::Symbol, i..i + 1);
                    current.token(i, i + 1);
                    i += 1;
                }
            },
            c if c.is_ascii_digit() || (c == b'.' && next.is_some_and(|n| n.is_ascii_digit())) => {
                let mut end = i + 1;
                while end < bytes.len()
                    && (bytes[end].is_ascii_alphanumeric()
                        || bytes[end] == b'.'
                        || bytes[end] == b'_'
                        || ((bytes[end] == b'+' || bytes[end] == b'-')
                            && matches!(bytes[end - 1], b'e' | b'E')))
                {
                    end += 1;
                }
                tokens.token(TokenKind::Literal, i..end);
                current.literal(i, end);
                i = end;
            }
            c if ident(c) => {
                let mut end = i + 1;
                while end < bytes.len() && ident(bytes[end]) {
                    end += 1;
                }
                tokens.token(TokenKind::Word, i..end);
                current.word(text, i, end);
                i = end;
            }
            b'(' | b'[' => {
                tokens.token(TokenKind::Symbol, i..i + 1);
                current.open(i);
                i += 1;
            }
            b')' | b']' => {
                tokens.token(TokenKind::Symbol, i..i + 1);
                current.close(i);
                i += 1;
            }
            b',' => {
                tokens.token(TokenKind::Symbol, i..i + 1);
                current.separator(i);
                i += 1;
            }
            b'.' => {
                // Qualified names (`s.t.c`) do not nest.
                tokens.token(TokenKind::Symbol, i..i + 1);
                current.token(i, i + 1);
                i += 1;
            }
            _ => {
                // Operators and other symbols: a run of operator characters is one operator.
                let mut end = i + 1;
                while end < bytes.len() && b"+-*/<>=~!@#%^&|?:".contains(&bytes[end]) {
                    // `--` and `/*` start comments even right after an operator.
                    if (bytes[end] == b'-' && bytes.get(end + 1) == Some(&b'-'))
                        || (bytes[end] == b'/' && bytes.get(end + 1) == Some(&b'*'))
                    {
                        break;
                    }
                    end += 1;
                }
                // Keep spans on character boundaries (a non-ASCII symbol).
                while end < bytes.len() && !text.is_char_boundary(end) {
                    end += 1;
                }
                tokens.token(TokenKind::Symbol, i..end);
                current.operator(i, end);
                i = end;
            }
        }
    }
    current.finish(bytes.len(), &mut out);
    out
}

/// The bytes a word is made of: ASCII letters and digits, `_`, `$` and every byte of a
/// non-ASCII character. A table: this is asked of every byte of every word.
static IDENT: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80;
        b += 1;
    }
    table
};

fn memchr(bytes: &[u8], from: usize, needle: u8) -> Option<usize> {
    bytes[from..]
        .iter()
        .position(|&b| b == needle)
        .map(|p| p + from)
}

fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || from > bytes.len() {
        return None;
    }
    bytes[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// The end of a quoted run opened at `start` by `quote` (doubled quotes stay inside; with
/// `escapes`, a backslash escapes the next byte).
fn quoted(bytes: &[u8], start: usize, quote: u8, escapes: bool) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        if escapes && bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if bytes[i] == quote {
            if bytes.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    bytes.len()
}

/// The end of a dollar-quote tag (`$$`, `$body$`) starting at `start`, if one starts there.
fn dollar_tag(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'$' {
            return Some(i + 1);
        }
        let ok = b.is_ascii_alphabetic()
            || b == b'_'
            || b >= 0x80
            || (i > start + 1 && b.is_ascii_digit());
        if !ok {
            return None;
        }
        i += 1;
    }
    None
}

/// What a word does to the nesting [`Builder`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WordRole {
    /// It combines expressions like an operator does (`AND`, `LIKE`, `IN`, …).
    Operator,
    /// An expression starts afresh after it (a new clause: `WHERE`, `ON`, `THEN`, …): the
    /// operator chain before it does not nest what follows.
    Clause,
}

/// The role of a word, ASCII case ignored: upper-cased on the stack and matched once (this runs
/// on every word of every statement; no keyword is longer than nine letters).
fn word_role(word: &[u8]) -> Option<WordRole> {
    let mut upper = [0u8; 9];
    let upper = upper.get_mut(..word.len())?;
    for (u, b) in upper.iter_mut().zip(word) {
        *u = b.to_ascii_uppercase();
    }
    match &*upper {
        b"AND" | b"OR" | b"NOT" | b"IS" | b"LIKE" | b"ILIKE" | b"BETWEEN" | b"IN" | b"SIMILAR"
        | b"COLLATE" | b"AT" => Some(WordRole::Operator),
        b"SELECT" | b"FROM" | b"WHERE" | b"GROUP" | b"HAVING" | b"ORDER" | b"LIMIT" | b"OFFSET"
        | b"UNION" | b"INTERSECT" | b"EXCEPT" | b"JOIN" | b"ON" | b"USING" | b"VALUES" | b"SET"
        | b"RETURNING" | b"WHEN" | b"THEN" | b"ELSE" | b"END" | b"AS" | b"BY" | b"WINDOW"
        | b"QUALIFY" => Some(WordRole::Clause),
        _ => None,
    }
}

#[derive(Default)]
struct Builder {
    /// Where the first comment before the statement's first token starts: the statement's
    /// text begins there (ORMs prepend their SQLCommenter tags, and the text shown is the
    /// statement as sent).
    lead: Option<usize>,
    start: Option<usize>,
    head: Vec<Range<usize>>,
    literals: Vec<Range<usize>>,
    /// Operators since the last separator in the innermost open parenthesis (or at the top
    /// level); `outer` holds the chains of the parentheses around it, outermost first.
    chain: usize,
    outer: Vec<usize>,
    /// The chains (`chain` and `outer`) summed, plus the parentheses open: the current nesting.
    depth: usize,
    max_depth: usize,
}

impl Builder {
    fn comment(&mut self, at: usize) {
        if self.start.is_none() && self.lead.is_none() {
            self.lead = Some(at);
        }
    }

    fn begin(&mut self, at: usize) {
        if self.start.is_none() {
            self.start = Some(at);
            // Sized once: most statements have as many head words as are kept.
            self.head = Vec::with_capacity(HEAD_WORDS);
        }
    }

    fn token(&mut self, start: usize, end: usize) {
        self.begin(start);
        if self.head.len() < HEAD_WORDS {
            self.head.push(start..end);
        }
    }

    fn literal(&mut self, start: usize, end: usize) {
        self.token(start, end);
        // Only fingerprints read them, and only so far into the statement: a multi-megabyte
        // list of values keeps no span for each.
        let statement_start = self.lead.or(self.start).unwrap_or(start);
        if end - statement_start <= FINGERPRINTED_BYTES {
            self.literals.push(start..end);
        }
    }

    fn word(&mut self, text: &str, start: usize, end: usize) {
        self.token(start, end);
        match word_role(&text.as_bytes()[start..end]) {
            Some(WordRole::Operator) => self.push_operator(),
            Some(WordRole::Clause) => self.reset_chain(),
            None => {}
        }
    }

    fn operator(&mut self, start: usize, end: usize) {
        self.token(start, end);
        self.push_operator();
    }

    fn push_operator(&mut self) {
        self.chain += 1;
        self.depth += 1;
        self.max_depth = self.max_depth.max(self.depth);
    }

    fn reset_chain(&mut self) {
        self.depth -= self.chain;
        self.chain = 0;
    }

    fn open(&mut self, at: usize) {
        self.token(at, at + 1);
        self.outer.push(std::mem::take(&mut self.chain));
        self.depth += 1;
        self.max_depth = self.max_depth.max(self.depth);
    }

    fn close(&mut self, at: usize) {
        self.token(at, at + 1);
        // A `)` with none open is the engine's to report; it closes nothing here.
        if let Some(outer) = self.outer.pop() {
            self.depth -= self.chain + 1;
            self.chain = outer;
        }
    }

    fn separator(&mut self, at: usize) {
        self.token(at, at + 1);
        self.reset_chain();
    }

    fn finish(&mut self, end: usize, out: &mut Vec<Lexed>) {
        let done = std::mem::take(self);
        if let Some(start) = done.start {
            out.push(Lexed {
                span: done.lead.unwrap_or(start)..end,
                head: done.head,
                literals: done.literals,
                nesting: done.max_depth,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_are_known_in_any_case_and_only_as_spelled() {
        for (word, role) in [
            ("and", Some(WordRole::Operator)),
            ("Between", Some(WordRole::Operator)),
            ("INTERSECT", Some(WordRole::Clause)),
            ("intersect", Some(WordRole::Clause)),
            ("qualify", Some(WordRole::Clause)),
            ("intersects", None),
            ("an", None),
            ("andy", None),
            ("se1ect", None),
            ("_nd", None),
            ("$nd", None),
            ("ánd", None),
            ("", None),
            ("returning_", None),
        ] {
            assert_eq!(word_role(word.as_bytes()), role, "{word}");
        }
    }
}

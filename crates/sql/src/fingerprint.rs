//! Statement fingerprints: what stays of a statement when its values go, so that every run of
//! the same report — whatever dates, ids or list lengths it was given — has one fingerprint.
//!
//! From the tokens of one lexing pass ([`lex`]): literals (strings, numbers, dollar-quoted
//! text) and `$n` placeholders become `?`, a sign before one goes with it, comments and
//! whitespace go, keywords and unquoted names are lowercased (quoted names stay as written), a
//! parenthesized list of nothing but values becomes `(...)` whatever its length, and repeated
//! `(...)` rows (`VALUES (…), (…)`) become one. The fingerprint's id is a 64-bit FNV-1a hash of
//! that text, written as 16 hex digits: stable across runs, versions and machines, so a data
//! dir's learned lanes keep their meaning.
//!
//! Only a statement's first [`FINGERPRINT_MAX_BYTES`] are read: a fingerprint is made on the
//! connection's thread before the statement is admitted, and a multi-megabyte text (a hostile
//! client's, or a generated `IN` list) would hold that thread — and every client on it — for
//! seconds. Statements that agree in their first 256 KiB share a fingerprint.

use std::borrow::Cow;
use std::ops::Range;

use crate::lexer::{lex, TokenKind, Tokens};

/// A statement's fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// 16 lowercase hex digits.
    pub id: String,
    /// The normalized text the id hashes.
    pub text: String,
    /// The statement's SQLCommenter tags ([`crate::tags`]), read in the same lexing pass:
    /// comments are not part of a fingerprint, but classifiers read them.
    pub tags: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Value,
    /// `(...)`: a list of values.
    List,
    Word(String),
    Symbol(String),
}

#[derive(Default)]
struct Collect {
    tokens: Vec<(TokenKind, Range<usize>)>,
    comments: Vec<Range<usize>>,
}

impl Tokens for Collect {
    fn token(&mut self, kind: TokenKind, span: Range<usize>) {
        // `E'…'`: the lexer passes `E` as a word, then the literal from `E` on.
        if self
            .tokens
            .last()
            .is_some_and(|(_, last)| span.start < last.end)
        {
            self.tokens.pop();
        }
        self.tokens.push((kind, span));
    }

    fn comment(&mut self, span: Range<usize>) {
        self.comments.push(span);
    }
}

/// The part of `text` a fingerprint reads: its first [`FINGERPRINT_MAX_BYTES`], cut at a
/// character.
fn read_part(text: &str) -> &str {
    let mut end = text.len().min(FINGERPRINT_MAX_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Words after which a `-` or `+` starts a value rather than subtracting from one.
const STARTS_EXPRESSION: &[&str] = &[
    "select",
    "where",
    "and",
    "or",
    "not",
    "in",
    "by",
    "when",
    "then",
    "else",
    "values",
    "set",
    "having",
    "on",
    "between",
    "like",
    "is",
    "return",
    "returning",
    "limit",
    "offset",
    "as",
];

/// Words a parenthesis follows with a space between (besides [`STARTS_EXPRESSION`]).
const KEYWORDS_BEFORE_PARENTHESES: &[&str] = &[
    "from", "join", "exists", "any", "all", "using", "over", "with",
];

/// How much of a statement's text its fingerprint reads ([`crate::lexer::FINGERPRINTED_BYTES`]:
/// the lexer keeps literal spans that far).
pub const FINGERPRINT_MAX_BYTES: usize = crate::lexer::FINGERPRINTED_BYTES;

/// The fingerprint of `text` (a statement without its `SETTINGS` tail), from its first
/// [`FINGERPRINT_MAX_BYTES`] (cut at a character).
pub fn fingerprint(text: &str) -> Fingerprint {
    let text = read_part(text);
    let mut collect = Collect::default();
    lex(text, &mut collect);
    let tags = crate::tags::tags_of_comments(text, &collect.comments);
    let mut tokens: Vec<Token> = Vec::with_capacity(collect.tokens.len());
    for (kind, span) in collect.tokens {
        let raw = &text[span];
        let token = match kind {
            TokenKind::Literal => Token::Value,
            TokenKind::Word => Token::Word(raw.to_ascii_lowercase()),
            TokenKind::QuotedIdent => Token::Word(raw.to_string()),
            TokenKind::Symbol if raw == ";" => continue,
            TokenKind::Symbol => Token::Symbol(raw.to_string()),
        };
        // A sign before a value is the value's: `x = -5` is `x = ?`.
        if token == Token::Value {
            if let Some(Token::Symbol(sign)) = tokens.last() {
                if sign == "-" || sign == "+" {
                    let before = tokens.len().checked_sub(2).map(|i| &tokens[i]);
                    let unary = match before {
                        None => true,
                        Some(Token::Symbol(s)) => s != ")" && s != "]",
                        Some(Token::Word(w)) => STARTS_EXPRESSION.contains(&w.as_str()),
                        Some(Token::Value | Token::List) => false,
                    };
                    if unary {
                        tokens.pop();
                    }
                }
            }
        }
        tokens.push(token);
        collapse_list(&mut tokens);
    }
    let text = render(&tokens);
    Fingerprint {
        id: format!("{:016x}", fnv1a(text.as_bytes())),
        text,
        tags,
    }
}

/// If `tokens` ends with `( ? , ? … )`, it becomes `(...)`; and `(...) , (...)` becomes `(...)`.
fn collapse_list(tokens: &mut Vec<Token>) {
    let is = |t: &Token, s: &str| matches!(t, Token::Symbol(x) if x == s);
    if !tokens.last().is_some_and(|t| is(t, ")")) {
        return;
    }
    let close = tokens.len() - 1;
    let mut i = close;
    let mut expect_value = true;
    while i > 0 {
        i -= 1;
        let t = &tokens[i];
        if expect_value {
            if !matches!(t, Token::Value | Token::List) {
                return;
            }
        } else if is(t, "(") {
            break;
        } else if !is(t, ",") {
            return;
        }
        expect_value = !expect_value;
    }
    if !is(&tokens[i], "(") || close - i < 2 {
        return;
    }
    tokens.truncate(i);
    // A row after rows: `VALUES (…), (…)` reads as `VALUES (…)`.
    let n = tokens.len();
    if n >= 2 && is(&tokens[n - 1], ",") && tokens[n - 2] == Token::List {
        tokens.truncate(n - 1);
        return;
    }
    tokens.push(Token::List);
}

fn render(tokens: &[Token]) -> String {
    let mut out = String::new();
    let mut previous: Option<&Token> = None;
    for t in tokens {
        let piece = match t {
            Token::Value => "?",
            Token::List => "(...)",
            Token::Word(w) | Token::Symbol(w) => w.as_str(),
        };
        let tight_after =
            matches!(previous, Some(Token::Symbol(s)) if s == "(" || s == "." || s == "[");
        // A call's parenthesis hugs its name; a keyword's does not (`in (...)`).
        let after_name = matches!(previous, Some(Token::Word(w))
            if !STARTS_EXPRESSION.contains(&w.as_str()) && !KEYWORDS_BEFORE_PARENTHESES.contains(&w.as_str()));
        let tight_before = match t {
            Token::Symbol(s) => {
                matches!(s.as_str(), ")" | "," | "." | "]") || (s == "(" && after_name)
            }
            Token::List => after_name,
            _ => false,
        };
        if previous.is_some() && !tight_after && !tight_before {
            out.push(' ');
        }
        out.push_str(piece);
        previous = Some(t);
    }
    out
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// A key for caching `text`'s fingerprint: the text with each literal span (`literals`, byte
/// ranges in `text` as [`crate::Query::literals`] gives them) cut out and marked. Texts with
/// one key have one fingerprint, since the fingerprint turns every literal into `?` whatever
/// it holds; so a report that runs with new values each time is fingerprinted once. Spans that
/// do not fall on character boundaries in order give the whole text as its key. Only the part
/// the fingerprint reads is keyed (a literal cut by its end stays as written).
pub fn fingerprint_key<'a>(text: &'a str, literals: &[Range<usize>]) -> Cow<'a, str> {
    let text = read_part(text);
    let whole = literals.partition_point(|span| span.end <= text.len());
    let literals = &literals[..whole];
    if literals.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut key = String::with_capacity(text.len());
    let mut at = 0;
    for span in literals {
        let Some(before) = text.get(at..span.start).filter(|_| span.start <= span.end) else {
            return Cow::Borrowed(text);
        };
        key.push_str(before);
        // NUL: never in a statement's text, so no literal-free text can look like a key.
        key.push('\0');
        at = span.end;
    }
    match text.get(at..) {
        Some(rest) => key.push_str(rest),
        None => return Cow::Borrowed(text),
    }
    Cow::Owned(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(text: &str) -> crate::Query {
        match crate::statement(text) {
            Ok(Some(crate::ClientStatement::Query(q))) => q,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn a_cache_key_stands_for_one_fingerprint() {
        // Each group: the same statement with other values; keys and fingerprints agree.
        let groups: &[&[&str]] = &[
            &[
                "SELECT abalance FROM pgbench_accounts WHERE aid = 1",
                "SELECT abalance FROM pgbench_accounts WHERE aid = 98765",
            ],
            &[
                "select * from t where s = 'a''b' and d = $$x;y$$ and n = 1.5e3 /* app='r' */",
                "select * from t where s = 'zz' and d = $$$$ and n = 7 /* app='r' */",
            ],
            &["SELECT 'x' || 'y'", "SELECT '' || 'long; text'"],
        ];
        let mut keys = Vec::new();
        for group in groups {
            let of = |t: &str| {
                let q = query(t);
                (
                    fingerprint_key(&q.text, &q.literals).into_owned(),
                    fingerprint(&q.text),
                )
            };
            let (key, f) = of(group[0]);
            for text in &group[1..] {
                assert_eq!(of(text), (key.clone(), f.clone()), "{text}");
            }
            keys.push(key);
        }
        // Other statements, other keys: a changed comment (its tags), list length, or word.
        for (a, b) in [
            ("SELECT 1 /* app='r' */", "SELECT 1 /* app='s' */"),
            (
                "SELECT * FROM t WHERE a IN (1, 2)",
                "SELECT * FROM t WHERE a IN (1)",
            ),
            ("SELECT a FROM t WHERE a = 1", "SELECT b FROM t WHERE a = 1"),
        ] {
            let (qa, qb) = (query(a), query(b));
            assert_ne!(
                fingerprint_key(&qa.text, &qa.literals),
                fingerprint_key(&qb.text, &qb.literals),
                "{a} / {b}"
            );
        }
        // No literals: the text itself, borrowed.
        assert!(matches!(
            fingerprint_key("SELECT now()", &[]),
            Cow::Borrowed(_)
        ));
        // Spans out of order or off the text: the whole text.
        assert_eq!(fingerprint_key("SELECT 1", &[7..8, 2..3]), "SELECT 1");
        let off_the_end = 7..9;
        assert_eq!(
            fingerprint_key("SELECT 1", std::slice::from_ref(&off_the_end)),
            "SELECT 1"
        );
    }

    #[test]
    fn values_comments_case_and_lists_are_normalized_away() {
        let table: &[(&str, &str)] = &[
            ("SELECT 1", "select ?"),
            (
                "select  *\n FROM t WHERE k = 42",
                "select * from t where k = ?",
            ),
            (
                "SELECT * FROM t WHERE k = $1",
                "select * from t where k = ?",
            ),
            (
                "SELECT * FROM t WHERE k = -5",
                "select * from t where k = ?",
            ),
            ("SELECT a - 5 FROM t", "select a - ? from t"),
            ("SELECT f(x) - 1 FROM t", "select f(x) - ? from t"),
            (
                "SELECT * FROM t WHERE d > '2026-01-01' -- since new year",
                "select * from t where d > ?",
            ),
            (
                "/* team='billing' */ SELECT count(*) FROM \"Orders\"",
                "select count(*) from \"Orders\"",
            ),
            (
                "SELECT * FROM t WHERE k IN (1, 2, 3)",
                "select * from t where k in (...)",
            ),
            (
                "SELECT * FROM t WHERE k IN ($1)",
                "select * from t where k in (...)",
            ),
            (
                "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')",
                "insert into t values (...)",
            ),
            (
                "INSERT INTO t VALUES ($1, $2)",
                "insert into t values (...)",
            ),
            ("SELECT $$body$$, E'x\\'y'", "select ?, ?"),
            ("SELECT s.t.c FROM s.t", "select s.t.c from s.t"),
            ("SELECT 1.5e-3, .5, 0x1F", "select ?, ?, ?"),
            (
                "SELECT * FROM t WHERE (a, b) IN ((1, 2), (3, 4))",
                "select * from t where (a, b) in (...)",
            ),
            ("SELECT pg_sleep(8);", "select pg_sleep(...)"),
        ];
        for (input, want) in table {
            assert_eq!(fingerprint(input).text, *want, "{input}");
        }
    }

    #[test]
    fn runs_of_one_report_share_an_id_and_different_reports_do_not() {
        let a =
            fingerprint("SELECT sum(x) FROM sales WHERE day BETWEEN '2026-01-01' AND '2026-01-31'");
        let b = fingerprint(
            "select sum(x)\nfrom sales\nwhere day between '2025-12-01' and '2025-12-31'",
        );
        let c =
            fingerprint("SELECT sum(y) FROM sales WHERE day BETWEEN '2026-01-01' AND '2026-01-31'");
        assert_eq!(a, b);
        assert_ne!(a.id, c.id);
        assert_eq!(a.id.len(), 16);
        // Fixed for good: the id is stored in data dirs.
        assert_eq!(
            fingerprint("SELECT 1").id,
            format!("{:016x}", fnv1a(b"select ?"))
        );
    }

    #[test]
    fn only_the_first_256_kib_are_read() {
        // A list of values long past the bound, with a different end: one fingerprint, made
        // from the start (the list, cut before its end, stays as far as it was read).
        let long = |tail: &str| {
            format!(
                "SELECT x FROM t WHERE k IN ({}1) {tail}",
                "1,".repeat(400_000)
            )
        };
        let (a, b) = (fingerprint(&long("AND y = 1")), fingerprint(&long("OR z")));
        assert_eq!(a, b);
        assert!(a.text.len() < 2 * FINGERPRINT_MAX_BYTES, "{}", a.text.len());
        assert!(
            a.text.starts_with("select x from t where k in ("),
            "{}",
            &a.text[..60]
        );
        // Their cache keys are one too, and keep no more than that part; the lexer keeps a
        // span for the literals in that part only (400,001 in the text).
        let (qa, qb) = (query(&long("AND y = 1")), query(&long("OR z")));
        let key = fingerprint_key(&qa.text, &qa.literals);
        assert_eq!(key, fingerprint_key(&qb.text, &qb.literals));
        assert!(key.len() <= FINGERPRINT_MAX_BYTES, "{}", key.len());
        assert!(
            qa.literals.len() <= FINGERPRINT_MAX_BYTES / 2,
            "{}",
            qa.literals.len()
        );
        // Shorter than the bound: read whole.
        assert_ne!(
            fingerprint("SELECT 1 AND y = 1").id,
            fingerprint("SELECT 1 OR z").id
        );
        // Cut at a character, never inside one.
        let wide = format!("SELECT '{}'", "é".repeat(FINGERPRINT_MAX_BYTES));
        assert_eq!(fingerprint(&wide).text, "select ?");
    }
}

//! Classifier predicates: the `WHEN` of `CREATE CLASSIFIER`, a boolean over what sluice knows
//! of a statement before it runs (who sent it, from where, what kind it is, its text and the
//! tags in its comments), and their canonical text.
//!
//! `Display` prints a predicate so that it parses back to the same tree: attributes lower-case,
//! values single-quoted with ClickHouse's escapes, keywords upper-case, and parentheses exactly
//! where the tree needs them (`OR` binds loosest, then `AND`, then `NOT`; a right operand of
//! the same operator is parenthesized, since the parser reads chains left to right).

use std::fmt::{self, Write as _};

use crate::ast::Literal;

/// What a predicate can ask of a statement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Attribute {
    /// The user it was sent as.
    User,
    /// The database named at connection start.
    Database,
    /// The `application_name` start-up parameter (or a later `SET application_name`).
    ApplicationName,
    /// The client's IP address (NULL on a Unix socket); `=`, `<>` and `IN` match CIDR blocks.
    ClientAddr,
    /// `'select'`, `'insert'`, `'update'`, `'delete'`, `'ddl'` or `'utility'`.
    StatementKind,
    /// The statement's text (without its `SETTINGS` tail).
    Query,
    /// `tag('key')`: the value of `key` in a SQLCommenter-style comment (`/* key='v' */`).
    Tag(String),
}

impl Attribute {
    /// The attribute named by a bare word, if it is one (`tag` takes an argument: not here).
    pub fn from_name(name: &str) -> Option<Attribute> {
        Some(match name.to_ascii_lowercase().as_str() {
            "user" => Attribute::User,
            "database" => Attribute::Database,
            "application_name" => Attribute::ApplicationName,
            "client_addr" => Attribute::ClientAddr,
            "statement_kind" => Attribute::StatementKind,
            "query" => Attribute::Query,
            _ => return None,
        })
    }

    /// The attribute names, for error messages.
    pub const NAMES: [&'static str; 7] = [
        "user",
        "database",
        "application_name",
        "client_addr",
        "statement_kind",
        "query",
        "tag('key')",
    ];
}

impl fmt::Display for Attribute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attribute::User => f.write_str("user"),
            Attribute::Database => f.write_str("database"),
            Attribute::ApplicationName => f.write_str("application_name"),
            Attribute::ClientAddr => f.write_str("client_addr"),
            Attribute::StatementKind => f.write_str("statement_kind"),
            Attribute::Query => f.write_str("query"),
            Attribute::Tag(key) => write!(f, "tag({})", Literal::String(key.clone())),
        }
    }
}

/// A comparison of an attribute with one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Comparison {
    Eq,
    NotEq,
    /// SQL `LIKE`: `%` any run, `_` one character, `\` escapes; case-sensitive.
    Like,
    /// `LIKE` ignoring case.
    ILike,
    /// `~`: the value is a regular expression that must match somewhere in the attribute.
    Regex,
}

impl Comparison {
    fn symbol(self) -> &'static str {
        match self {
            Comparison::Eq => "=",
            Comparison::NotEq => "<>",
            Comparison::Like => "LIKE",
            Comparison::ILike => "ILIKE",
            Comparison::Regex => "~",
        }
    }
}

/// A classifier's condition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Predicate {
    Compare {
        attribute: Attribute,
        op: Comparison,
        value: String,
    },
    /// `attribute [NOT] IN ('a', 'b', …)`.
    In {
        attribute: Attribute,
        values: Vec<String>,
        negated: bool,
    },
    /// `attribute IS [NOT] NULL`: whether the statement has the attribute at all.
    IsNull {
        attribute: Attribute,
        negated: bool,
    },
    And(Box<Predicate>, Box<Predicate>),
    Or(Box<Predicate>, Box<Predicate>),
    Not(Box<Predicate>),
}

impl Predicate {
    /// Binding strength, loosest first: what needs parentheses where.
    fn precedence(&self) -> u8 {
        match self {
            Predicate::Or(..) => 1,
            Predicate::And(..) => 2,
            Predicate::Not(_) => 3,
            _ => 4,
        }
    }

    /// The attributes it reads, each once, in the order first read.
    pub fn attributes(&self) -> Vec<&Attribute> {
        let mut out = Vec::new();
        self.visit(&mut |p| {
            let a = match p {
                Predicate::Compare { attribute, .. }
                | Predicate::In { attribute, .. }
                | Predicate::IsNull { attribute, .. } => attribute,
                _ => return,
            };
            if !out.contains(&a) {
                out.push(a);
            }
        });
        out
    }

    /// Calls `f` on every node, parents before children, left before right.
    pub fn visit<'a>(&'a self, f: &mut impl FnMut(&'a Predicate)) {
        f(self);
        match self {
            Predicate::And(a, b) | Predicate::Or(a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Predicate::Not(a) => a.visit(f),
            _ => {}
        }
    }

    fn fmt_operand(&self, f: &mut fmt::Formatter<'_>, parenthesize: bool) -> fmt::Result {
        if parenthesize {
            write!(f, "({self})")
        } else {
            write!(f, "{self}")
        }
    }
}

impl fmt::Display for Predicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quoted = |s: &str| Literal::String(s.to_string()).to_string();
        match self {
            Predicate::Compare {
                attribute,
                op,
                value,
            } => write!(f, "{attribute} {} {}", op.symbol(), quoted(value)),
            Predicate::In {
                attribute,
                values,
                negated,
            } => {
                write!(f, "{attribute} {}IN (", if *negated { "NOT " } else { "" })?;
                for (i, v) in values.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(&quoted(v))?;
                }
                f.write_char(')')
            }
            Predicate::IsNull { attribute, negated } => {
                write!(
                    f,
                    "{attribute} IS {}NULL",
                    if *negated { "NOT " } else { "" }
                )
            }
            Predicate::And(a, b) | Predicate::Or(a, b) => {
                let own = self.precedence();
                a.fmt_operand(f, a.precedence() < own)?;
                f.write_str(if own == 1 { " OR " } else { " AND " })?;
                b.fmt_operand(f, b.precedence() <= own)
            }
            Predicate::Not(a) => {
                f.write_str("NOT ")?;
                a.fmt_operand(f, a.precedence() < 3)
            }
        }
    }
}

/// The tags of a statement: the `key='value'` pairs of its `/* … */` comments, as
/// [SQLCommenter](https://google.github.io/sqlcommenter/spec/) writes them (`,`-separated,
/// values single-quoted, `\'` for a quote, keys and values %-encoded; spaces around them are
/// allowed). Comments inside string literals are not comments; a piece that is not
/// `key=value` is skipped; the first value of a key wins. Tags are what the client says about
/// itself: route on them, but trust `user` for anything a client must not choose.
pub fn tags(text: &str) -> Vec<(String, String)> {
    // Only a text with a comment is lexed at all.
    if !text.contains("/*") {
        return Vec::new();
    }
    #[derive(Default)]
    struct Comments(Vec<std::ops::Range<usize>>);
    impl crate::statement::Tokens for Comments {
        fn token(&mut self, _kind: crate::statement::TokenKind, _span: std::ops::Range<usize>) {}
        fn comment(&mut self, span: std::ops::Range<usize>) {
            self.0.push(span);
        }
    }
    let mut comments = Comments::default();
    crate::statement::lex(text, &mut comments);
    tags_of_comments(text, &comments.0)
}

/// The tags in the `/* … */` comments at `spans` of `text` (see [`tags`]).
pub(crate) fn tags_of_comments(
    text: &str,
    spans: &[std::ops::Range<usize>],
) -> Vec<(String, String)> {
    let mut tags: Vec<(String, String)> = Vec::new();
    for span in spans {
        let Some(comment) = text.get(span.clone()) else {
            continue;
        };
        let inner = comment
            .strip_prefix("/*")
            .map(|c| c.strip_suffix("*/").unwrap_or(c))
            .unwrap_or("");
        for (k, v) in comment_tags(inner) {
            if !tags.iter().any(|(have, _)| *have == k) {
                tags.push((k, v));
            }
        }
    }
    tags
}

/// `key='value', key2='v2'` → pairs; pieces that are not `key=value` are skipped.
fn comment_tags(inner: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let bytes = inner.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // One piece: up to a `,` outside quotes.
        let start = i;
        let mut quoted = false;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' if quoted => i += 1,
                b'\'' => quoted = !quoted,
                b',' if !quoted => break,
                _ => {}
            }
            i += 1;
        }
        let piece = &inner[start..i.min(inner.len())];
        i += 1;
        let Some((key, value)) = piece.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let value = value.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            continue;
        }
        let value = match value.strip_prefix('\'') {
            Some(v) => match v.strip_suffix('\'') {
                Some(v) => v.replace("\\'", "'"),
                None => continue,
            },
            None if !value.is_empty() && !value.contains(char::is_whitespace) => value.to_string(),
            None => continue,
        };
        out.push((percent_decode(key), percent_decode(&value)));
    }
    out
}

/// `%XX` → the byte; anything else as written (invalid UTF-8 is replaced).
fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_come_from_sqlcommenter_comments_only() {
        let t = tags("SELECT 1 /*team='billing',route='%2Fapi%2Fv1',quote='it\\'s'*/");
        assert_eq!(
            t,
            [
                ("team".to_string(), "billing".to_string()),
                ("route".to_string(), "/api/v1".to_string()),
                ("quote".to_string(), "it's".to_string())
            ]
        );
        assert_eq!(
            tags("/* team = 'ops' */ SELECT 1 /* team='other', just a note */"),
            [("team".to_string(), "ops".to_string())]
        );
        assert!(tags("SELECT '/* team=''billing'' */'").is_empty());
        assert!(tags("SELECT 1 -- team='billing'").is_empty());
        assert!(tags("SELECT 1 /* unterminated team='x'").len() <= 1);
        assert_eq!(
            tags("SELECT 1 /*a=1,b='%zz'*/"),
            [
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "%zz".to_string())
            ]
        );
    }

    fn cmp(attribute: Attribute, value: &str) -> Box<Predicate> {
        Box::new(Predicate::Compare {
            attribute,
            op: Comparison::Eq,
            value: value.into(),
        })
    }

    #[test]
    fn parentheses_only_where_the_tree_needs_them() {
        let a = cmp(Attribute::User, "a");
        let b = cmp(Attribute::Tag("team".into()), "b'c");
        let c = cmp(Attribute::Database, "c");
        let p = Predicate::And(Box::new(Predicate::Or(a.clone(), b.clone())), c.clone());
        assert_eq!(
            p.to_string(),
            r"(user = 'a' OR tag('team') = 'b\'c') AND database = 'c'"
        );
        let p = Predicate::Or(a.clone(), Box::new(Predicate::Or(b.clone(), c.clone())));
        assert_eq!(
            p.to_string(),
            r"user = 'a' OR (tag('team') = 'b\'c' OR database = 'c')"
        );
        let p = Predicate::Not(Box::new(Predicate::And(a, c)));
        assert_eq!(p.to_string(), "NOT (user = 'a' AND database = 'c')");
    }
}

//! Recursive-descent parser for the workload dialect over sqlparser's tokens.
//!
//! Naming follows sqlparser: `parse_x` returns a `Result`, `parse_keyword(s)` consumes only on a
//! match and returns whether it did, `expect_x` fails with a syntax error on a miss, `peek_x`
//! never consumes. The only recursion is a classifier's predicate, bounded by
//! [`MAX_PREDICATE_DEPTH`]; input size is bounded by [`MAX_INPUT_BYTES`].

use sqlparser::dialect::{ClickHouseDialect, Dialect};
use sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer, Whitespace};

use crate::ast::{Attribute, Comparison, Predicate};
use crate::ast::{
    CreateClassifier, CreateOptions, CreateResource, CreateWorkload, DiskRef, DropEntity,
    EntityKind, Literal, ResourceOperation, SettingChange, Statement,
};
use crate::error::{Error, ErrorCode, Position, Result};

/// How deep a classifier's predicate may nest: parentheses, `NOT`s and `AND`/`OR` chains
/// (a chain of n terms is n - 1 levels). Evaluating and printing a predicate recurse once per
/// level, so this bounds their stack; a long list of alternatives belongs in `IN (…)`.
pub const MAX_PREDICATE_DEPTH: usize = 256;

/// The largest script or statement sluice will read (ClickHouse's `max_query_size` plays this
/// role there). Larger input is a `SYNTAX_ERROR` rather than unbounded work.
pub const MAX_INPUT_BYTES: usize = 16 * 1024 * 1024;

/// ClickHouse's lexical rules on top of sqlparser's ClickHouse dialect: bare identifiers may start
/// with digits (`03232_disk`), which in turn rules out `1_000`-style digit separators in the
/// tokenizer (the parser reads a word of digits and underscores as a number instead).
#[derive(Debug, Default, Clone, Copy)]
pub struct SluiceDialect;

impl Dialect for SluiceDialect {
    fn is_identifier_start(&self, ch: char) -> bool {
        ClickHouseDialect {}.is_identifier_start(ch)
    }
    fn is_identifier_part(&self, ch: char) -> bool {
        ClickHouseDialect {}.is_identifier_part(ch)
    }
    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        ch == '"' || ch == '`'
    }
    fn supports_string_literal_backslash_escape(&self) -> bool {
        true
    }
    fn supports_numeric_prefix(&self) -> bool {
        true
    }
    fn supports_numeric_literal_underscores(&self) -> bool {
        false
    }
}

/// One statement of a script: its text as `sluice check` echoes it (`--` comments dropped,
/// whitespace runs collapsed to one space) and what parsing it gave.
#[derive(Debug, Clone)]
pub struct ScriptStatement {
    pub text: String,
    pub result: Result<Statement>,
}

/// Parses exactly one statement (an optional trailing `;` is allowed).
pub fn parse_statement(sql: &str) -> Result<Statement> {
    let mut items = parse_script(sql);
    match items.len() {
        0 => Err(syntax_error(Position { line: 1, column: 1 }, "empty query")),
        1 => items.remove(0).result,
        _ => Err(Error::new(
            ErrorCode::SyntaxError,
            format!(
                "Syntax error: multi-statement input: expected one statement, got {}",
                items.len()
            ),
        )),
    }
}

/// Splits a script at top-level `;` and parses each statement. Empty statements (only
/// whitespace and comments) are skipped. Input that cannot be tokenized (an unterminated quote,
/// say) ends the script with one error item holding the rest of the text.
pub fn parse_script(sql: &str) -> Vec<ScriptStatement> {
    if sql.len() > MAX_INPUT_BYTES {
        return vec![ScriptStatement {
            text: collapse_whitespace(first_chars(sql, 80)) + " …",
            result: Err(Error::new(
                ErrorCode::SyntaxError,
                format!(
                    "Max query size exceeded: {} bytes, the maximum is {MAX_INPUT_BYTES}",
                    sql.len()
                ),
            )),
        }];
    }
    let dialect = SluiceDialect;
    let mut tokens = Vec::new();
    let failure = Tokenizer::new(&dialect, sql)
        .tokenize_with_location_into_buf(&mut tokens)
        .err();
    let source = SourceMap::new(sql);
    // On a tokenizer failure `tokens` holds what came before it; only the statements closed by a
    // `;` before the failure are whole.
    let split_end = match failure {
        None => tokens.len(),
        Some(_) => tokens
            .iter()
            .rposition(|t| t.token == Token::SemiColon)
            .map_or(0, |p| p + 1),
    };
    let mut out = Vec::new();
    let mut push = |stmt: &[TokenWithSpan], end: Option<Location>| {
        if stmt.iter().any(|t| !is_trivia(&t.token)) {
            out.push(ScriptStatement {
                text: source.display_text(stmt),
                result: Parser::new(stmt, end).parse_statement(),
            });
        }
    };
    let mut start = 0;
    for i in 0..split_end {
        if tokens[i].token == Token::SemiColon {
            push(&tokens[start..i], Some(tokens[i].span.start));
            start = i + 1;
        }
    }
    match failure {
        None => push(&tokens[start..], None),
        Some(e) => {
            let from = split_end
                .checked_sub(1)
                .map_or(0, |i| source.offset(tokens[i].span.end));
            out.push(ScriptStatement {
                text: collapse_whitespace(&sql[from..]),
                result: Err(syntax_error(
                    position(e.location),
                    strip_location(&e.message),
                )),
            });
        }
    }
    out
}

/// A query with its `SETTINGS name = value, …` tail taken off (ClickHouse's query-level
/// settings, which sluice honours and the engine never sees).
#[derive(Debug, Clone, PartialEq)]
pub struct QueryMarkup {
    /// The query text without the tail (and without a trailing `;`).
    pub query: String,
    /// The settings, in written order.
    pub settings: Vec<(String, Literal)>,
}

/// Whether `text` contains `needle`, ASCII case ignored; no allocation (it runs on every query).
pub fn mentions(text: &str, needle: &str) -> bool {
    mention_places(text, needle).next().is_some()
}

/// Where `needle` starts in `text`, ASCII case ignored, each place in turn (overlapping ones
/// too); no allocation. An empty needle is at 0 only.
pub fn mention_places<'a>(text: &'a str, needle: &'a str) -> impl Iterator<Item = usize> + 'a {
    let bytes = text.as_bytes();
    let needle = needle.as_bytes();
    let first = needle.first().copied();
    let rest = needle.get(1..).unwrap_or_default();
    let mut from = Some(0);
    std::iter::from_fn(move || {
        let Some(first) = first else {
            return from.take();
        };
        let (lower, upper) = (first.to_ascii_lowercase(), first.to_ascii_uppercase());
        // The first byte alone rules out almost every place: jump from one of its places to
        // the next (memchr's vector search), and compare the rest only there.
        loop {
            let start = from?;
            let at = start + memchr::memchr2(lower, upper, bytes.get(start..)?)?;
            let after = at + 1;
            from = Some(after);
            match bytes.get(after..after + rest.len()) {
                Some(candidate) if candidate.eq_ignore_ascii_case(rest) => return Some(at),
                Some(_) => {}
                None => {
                    from = None;
                    return None;
                }
            }
        }
    })
}

/// Takes a `SETTINGS name = literal {, name = literal}` tail off a query. The tail is the last
/// top-level `SETTINGS` word after which only such a list (and an optional `;`) follows; a
/// `SETTINGS` that is followed by anything else (a column alias, say) is left in place. Text
/// that does not tokenize is returned unchanged, for the engine to report.
pub fn split_settings(sql: &str) -> Result<QueryMarkup> {
    let unchanged = || QueryMarkup {
        query: sql.to_string(),
        settings: Vec::new(),
    };
    // Most queries have no tail: they are not tokenized at all (this runs on every query,
    // up to three times per extended-protocol round trip).
    if sql.len() > MAX_INPUT_BYTES || !mentions(sql, "settings") {
        return Ok(unchanged());
    }
    let mut tokens = Vec::new();
    if Tokenizer::new(&SluiceDialect, sql)
        .tokenize_with_location_into_buf(&mut tokens)
        .is_err()
    {
        return Ok(unchanged());
    }
    let mut depth = 0i64;
    let mut candidate = None;
    for (i, t) in tokens.iter().enumerate() {
        match &t.token {
            Token::LParen | Token::LBracket => depth += 1,
            Token::RParen | Token::RBracket => depth -= 1,
            Token::Word(w)
                if depth == 0
                    && w.quote_style.is_none()
                    && w.value.eq_ignore_ascii_case("SETTINGS") =>
            {
                candidate = Some(i);
            }
            _ => {}
        }
    }
    let Some(at) = candidate else {
        return Ok(unchanged());
    };
    let tail: Vec<TokenWithSpan> = tokens[at + 1..]
        .iter()
        .filter(|t| t.token != Token::SemiColon)
        .cloned()
        .collect();
    let mut parser = Parser::new(&tail, None);
    let mut settings = Vec::new();
    loop {
        let Ok(name) = parser.parse_identifier() else {
            return Ok(unchanged());
        };
        if parser.expect_token(&Token::Eq, "=").is_err() {
            return Ok(unchanged());
        }
        let value = parser.parse_literal()?;
        settings.push((name, value));
        if parser.peek() == Some(&Token::Comma) {
            parser.pos += 1;
            continue;
        }
        break;
    }
    if parser.peek().is_some() {
        return Ok(unchanged());
    }
    let source = SourceMap::new(sql);
    let cut = source.offset(tokens[at].span.start);
    Ok(QueryMarkup {
        query: sql[..cut].trim_end().to_string(),
        settings,
    })
}

fn strip_location(message: &str) -> &str {
    message.split(" at Line:").next().unwrap_or(message)
}

fn is_trivia(t: &Token) -> bool {
    matches!(t, Token::Whitespace(_) | Token::EOF)
}

fn position(l: Location) -> Position {
    Position {
        line: l.line,
        column: l.column,
    }
}

fn syntax_error(at: Position, what: &str) -> Error {
    Error::new(
        ErrorCode::SyntaxError,
        format!(
            "Syntax error at line {}, column {}: {what}",
            at.line, at.column
        ),
    )
    .with_position(at)
}

/// Collapses every run of whitespace to one space and trims the ends.
pub fn collapse_whitespace(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The first `n` characters of `text` (a slice: no character-by-character copy), for the
/// texts a log, an error message or a system table shows cut.
pub fn first_chars(text: &str, n: usize) -> &str {
    if text.len() <= n {
        return text; // no more bytes than n, so no more characters
    }
    match text.char_indices().nth(n) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// Maps tokenizer locations (1-based line, column in characters) back to byte offsets.
struct SourceMap<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
    /// Lines that are pure ASCII, where a column is a byte offset (the common case, and the
    /// fast one).
    line_ascii: Vec<bool>,
}

impl<'a> SourceMap<'a> {
    fn new(text: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        let line_ascii = line_starts
            .iter()
            .enumerate()
            .map(|(i, &start)| {
                let end = line_starts.get(i + 1).copied().unwrap_or(text.len());
                text.as_bytes()[start..end].is_ascii()
            })
            .collect();
        SourceMap {
            text,
            line_starts,
            line_ascii,
        }
    }

    fn offset(&self, l: Location) -> usize {
        let line = (l.line as usize).saturating_sub(1);
        let Some(&start) = self.line_starts.get(line) else {
            return self.text.len();
        };
        let col = (l.column as usize).saturating_sub(1);
        if self.line_ascii[line] {
            // Past the end of an ASCII line can only be the next line's start or the end of
            // the text; step back to a char boundary so a slice can never panic.
            let mut at = (start + col).min(self.text.len());
            while !self.text.is_char_boundary(at) {
                at -= 1;
            }
            return at;
        }
        let rest = &self.text[start..];
        start + rest.char_indices().nth(col).map_or(rest.len(), |(i, _)| i)
    }

    /// The statement's source text without `--` comments, whitespace collapsed.
    fn display_text(&self, tokens: &[TokenWithSpan]) -> String {
        let is_line_comment = |t: &TokenWithSpan| {
            matches!(
                t.token,
                Token::Whitespace(Whitespace::SingleLineComment { .. })
            )
        };
        // Block comments are kept in the echo (the ClickHouse oracle keeps them too).
        let shown = |t: &TokenWithSpan| {
            !is_trivia(&t.token)
                || matches!(t.token, Token::Whitespace(Whitespace::MultiLineComment(_)))
        };
        let first = tokens.iter().position(shown);
        let last = tokens.iter().rposition(shown);
        let (Some(first), Some(last)) = (first, last) else {
            return String::new();
        };
        let tokens = &tokens[first..=last];
        if !tokens.iter().any(is_line_comment) {
            let from = self.offset(tokens[0].span.start);
            let to = self.offset(tokens[tokens.len() - 1].span.end);
            return collapse_whitespace(&self.text[from..to.max(from)]);
        }
        let mut s = String::new();
        for t in tokens {
            if is_line_comment(t) {
                s.push(' ');
            } else {
                s.push_str(&self.text[self.offset(t.span.start)..self.offset(t.span.end)]);
            }
        }
        collapse_whitespace(&s)
    }
}

struct Parser<'a> {
    /// The statement's tokens without whitespace and comments.
    tokens: Vec<&'a TokenWithSpan>,
    pos: usize,
    /// Where the statement ends (the `;`), for errors at the end of input.
    end: Option<Location>,
}

impl<'a> Parser<'a> {
    fn new(tokens: &'a [TokenWithSpan], end: Option<Location>) -> Self {
        Parser {
            tokens: tokens.iter().filter(|t| !is_trivia(&t.token)).collect(),
            pos: 0,
            end,
        }
    }

    fn peek(&self) -> Option<&'a Token> {
        self.tokens.get(self.pos).map(|t| &t.token)
    }

    fn peek_nth(&self, n: usize) -> Option<&'a Token> {
        self.tokens.get(self.pos + n).map(|t| &t.token)
    }

    fn here(&self) -> Position {
        match self.tokens.get(self.pos) {
            Some(t) => position(t.span.start),
            None => match (self.end, self.tokens.last()) {
                (Some(end), _) => position(end),
                (None, Some(last)) => position(last.span.end),
                (None, None) => Position { line: 1, column: 1 },
            },
        }
    }

    /// A syntax error at the current token, listing what would have been accepted.
    fn expected(&self, what: &[&str]) -> Error {
        let found = match self.peek() {
            Some(t) => format!("unexpected {t}"),
            None => "unexpected end of query".to_string(),
        };
        let list = if what.len() == 1 {
            format!("expected {}", what[0])
        } else {
            format!("expected one of: {}", what.join(", "))
        };
        syntax_error(self.here(), &format!("{found}, {list}"))
    }

    fn peek_keyword_at(&self, n: usize, kw: &str) -> bool {
        matches!(self.peek_nth(n), Some(Token::Word(w)) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(kw))
    }

    #[must_use]
    fn parse_keyword(&mut self, kw: &str) -> bool {
        self.parse_keywords(&[kw])
    }

    /// Consumes the keyword sequence only if all of it is there.
    #[must_use]
    fn parse_keywords(&mut self, kws: &[&str]) -> bool {
        if kws
            .iter()
            .enumerate()
            .all(|(i, kw)| self.peek_keyword_at(i, kw))
        {
            self.pos += kws.len();
            true
        } else {
            false
        }
    }

    fn expect_keyword(&mut self, kw: &str) -> Result<()> {
        if self.parse_keyword(kw) {
            Ok(())
        } else {
            Err(self.expected(&[kw]))
        }
    }

    fn expect_token(&mut self, token: &Token, name: &str) -> Result<()> {
        if self.peek() == Some(token) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.expected(&[name]))
        }
    }

    fn expect_end(&self, alternatives: &[&str]) -> Result<()> {
        if self.peek().is_none() {
            Ok(())
        } else {
            let mut all = alternatives.to_vec();
            all.push("end of query");
            Err(self.expected(&all))
        }
    }

    /// A bare, back-quoted or double-quoted identifier.
    fn parse_identifier(&mut self) -> Result<String> {
        match self.peek() {
            // ClickHouse rejects an empty quoted identifier as a syntax error.
            Some(Token::Word(w))
                if matches!(w.quote_style, None | Some('`') | Some('"')) && !w.value.is_empty() =>
            {
                self.pos += 1;
                Ok(w.value.clone())
            }
            _ => Err(self.expected(&["identifier"])),
        }
    }

    fn parse_statement(&mut self) -> Result<Statement> {
        if self.parse_keyword("CREATE") {
            let or_replace = self.parse_keywords(&["OR", "REPLACE"]);
            if self.parse_keyword("WORKLOAD") {
                self.parse_create_workload(or_replace)
            } else if self.parse_keyword("RESOURCE") {
                self.parse_create_resource(or_replace)
            } else if self.parse_keyword("CLASSIFIER") {
                self.parse_create_classifier(or_replace)
            } else if or_replace {
                Err(self.expected(&["WORKLOAD", "RESOURCE", "CLASSIFIER"]))
            } else {
                Err(self.expected(&["OR REPLACE", "WORKLOAD", "RESOURCE", "CLASSIFIER"]))
            }
        } else if self.parse_keyword("DROP") {
            let kind = if self.parse_keyword("WORKLOAD") {
                EntityKind::Workload
            } else if self.parse_keyword("RESOURCE") {
                EntityKind::Resource
            } else if self.parse_keyword("CLASSIFIER") {
                EntityKind::Classifier
            } else {
                return Err(self.expected(&["WORKLOAD", "RESOURCE", "CLASSIFIER"]));
            };
            let if_exists = self.parse_keywords(&["IF", "EXISTS"]);
            let name = self.parse_identifier()?;
            let on_cluster = self.parse_on_cluster()?;
            self.expect_end(if on_cluster.is_some() {
                &[]
            } else {
                &["ON CLUSTER"]
            })?;
            Ok(Statement::Drop(DropEntity {
                kind,
                if_exists,
                name,
                on_cluster,
            }))
        } else {
            Err(self.expected(&["CREATE", "DROP"]))
        }
    }

    /// After `CREATE [OR REPLACE] WORKLOAD|RESOURCE`: `[IF NOT EXISTS] name [ON CLUSTER c]`.
    /// As in ClickHouse, `IF NOT EXISTS` is only tried without `OR REPLACE`.
    fn parse_create_head(&mut self, or_replace: bool) -> Result<(CreateOptions, String)> {
        let if_not_exists = !or_replace && self.parse_keywords(&["IF", "NOT", "EXISTS"]);
        let name = self.parse_identifier()?;
        let on_cluster = self.parse_on_cluster()?;
        Ok((
            CreateOptions {
                or_replace,
                if_not_exists,
                on_cluster,
            },
            name,
        ))
    }

    fn parse_on_cluster(&mut self) -> Result<Option<String>> {
        if !self.parse_keyword("ON") {
            return Ok(None);
        }
        self.expect_keyword("CLUSTER")?;
        match self.peek() {
            Some(Token::SingleQuotedString(s)) => {
                self.pos += 1;
                Ok(Some(s.clone()))
            }
            _ => self.parse_identifier().map(Some),
        }
    }

    fn parse_create_workload(&mut self, or_replace: bool) -> Result<Statement> {
        let (options, name) = self.parse_create_head(or_replace)?;
        let parent = if self.parse_keyword("IN") {
            Some(self.parse_identifier()?)
        } else {
            None
        };
        let mut settings = Vec::new();
        if self.parse_keyword("SETTINGS") {
            loop {
                settings.push(self.parse_setting()?);
                if self.peek() != Some(&Token::Comma) {
                    break;
                }
                self.pos += 1;
            }
        }
        let mut rest: Vec<&str> = Vec::new();
        if settings.is_empty() {
            if parent.is_none() {
                if options.on_cluster.is_none() {
                    rest.push("ON CLUSTER");
                }
                rest.push("IN");
            }
            rest.push("SETTINGS");
        } else {
            rest.push(",");
            rest.push("FOR");
        }
        self.expect_end(&rest)?;
        Ok(Statement::CreateWorkload(CreateWorkload {
            options,
            name,
            parent,
            settings,
        }))
    }

    fn parse_create_resource(&mut self, or_replace: bool) -> Result<Statement> {
        let (options, name) = self.parse_create_head(or_replace)?;
        if self.peek() != Some(&Token::LParen) {
            return Err(self.expected(if options.on_cluster.is_some() {
                &["("]
            } else {
                &["ON CLUSTER", "("]
            }));
        }
        self.pos += 1;
        let mut operations = Vec::new();
        loop {
            operations.push(self.parse_resource_operation()?);
            match self.peek() {
                Some(Token::Comma) => self.pos += 1,
                Some(Token::RParen) => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.expected(&[",", ")"])),
            }
        }
        self.expect_end(&[])?;
        // ClickHouse rejects mixed units while parsing, with one message for every mix.
        let unit = operations[0].unit();
        if operations.iter().any(|op| op.unit() != unit) {
            return Err(Error::bad_arguments(
                "Resource definition could not mix CPU and IO operations",
            ));
        }
        Ok(Statement::CreateResource(CreateResource {
            options,
            name,
            operations,
        }))
    }

    fn parse_create_classifier(&mut self, or_replace: bool) -> Result<Statement> {
        let (options, name) = self.parse_create_head(or_replace)?;
        if !self.parse_keyword("WORKLOAD") {
            return Err(self.expected(if options.on_cluster.is_some() {
                &["WORKLOAD"]
            } else {
                &["ON CLUSTER", "WORKLOAD"]
            }));
        }
        let workload = self.parse_identifier()?;
        self.expect_keyword("WHEN")?;
        let (predicate, _) = self.parse_or(0)?;
        let rank = if self.parse_keyword("RANK") {
            match self.parse_literal()? {
                Literal::UInt(v) if v <= i64::MAX as u64 => v as i64,
                Literal::Int(v) => v,
                other => {
                    return Err(Error::bad_arguments(format!(
                        "RANK takes an integer, got {other} ({})",
                        other.type_name()
                    )))
                }
            }
        } else {
            0
        };
        let dry_run = self.parse_keywords(&["DRY", "RUN"]);
        let mut rest = vec!["AND", "OR"];
        if !dry_run {
            if rank == 0 {
                rest.push("RANK");
            }
            rest.push("DRY RUN");
        }
        self.expect_end(&rest)?;
        Ok(Statement::CreateClassifier(CreateClassifier {
            options,
            name,
            workload,
            predicate,
            rank,
            dry_run,
        }))
    }

    /// `and {OR and}`, with the depth of the tree it built. `depth` is how deep the caller's
    /// tree already is at this point.
    fn parse_or(&mut self, depth: usize) -> Result<(Predicate, usize)> {
        self.parse_chain(depth, "OR", Self::parse_and, Predicate::Or)
    }

    fn parse_and(&mut self, depth: usize) -> Result<(Predicate, usize)> {
        self.parse_chain(depth, "AND", Self::parse_not, Predicate::And)
    }

    /// `operand {keyword operand}`, read left to right into a left-deep tree.
    fn parse_chain(
        &mut self,
        depth: usize,
        keyword: &str,
        operand: fn(&mut Self, usize) -> Result<(Predicate, usize)>,
        join: fn(Box<Predicate>, Box<Predicate>) -> Predicate,
    ) -> Result<(Predicate, usize)> {
        let (mut left, mut height) = operand(self, depth)?;
        while self.parse_keyword(keyword) {
            let (right, right_height) = operand(self, depth)?;
            height = height.max(right_height) + 1;
            self.check_depth(depth + height)?;
            left = join(Box::new(left), Box::new(right));
        }
        Ok((left, height))
    }

    fn parse_not(&mut self, depth: usize) -> Result<(Predicate, usize)> {
        if self.parse_keyword("NOT") {
            self.check_depth(depth + 1)?;
            let (inner, height) = self.parse_not(depth + 1)?;
            return Ok((Predicate::Not(Box::new(inner)), height + 1));
        }
        if self.peek() == Some(&Token::LParen) {
            self.pos += 1;
            self.check_depth(depth + 1)?;
            let inner = self.parse_or(depth + 1)?;
            self.expect_token(&Token::RParen, ")")?;
            return Ok(inner);
        }
        self.parse_comparison().map(|p| (p, 1))
    }

    fn check_depth(&self, depth: usize) -> Result<()> {
        if depth > MAX_PREDICATE_DEPTH {
            return Err(Error::new(
                ErrorCode::TooDeepAst,
                format!("AST is too deep: the classifier's predicate nests more than {MAX_PREDICATE_DEPTH} levels; put alternatives in IN (…) lists"),
            )
            .with_position(self.here()));
        }
        Ok(())
    }

    fn parse_attribute(&mut self) -> Result<Attribute> {
        if let Some(Token::Word(w)) = self.peek() {
            if w.quote_style.is_none() {
                if w.value.eq_ignore_ascii_case("tag") && self.peek_nth(1) == Some(&Token::LParen) {
                    self.pos += 2;
                    let key = self.parse_string()?;
                    self.expect_token(&Token::RParen, ")")?;
                    return Ok(Attribute::Tag(key));
                }
                if let Some(a) = Attribute::from_name(&w.value) {
                    self.pos += 1;
                    return Ok(a);
                }
            }
        }
        Err(self.expected(&Attribute::NAMES))
    }

    fn parse_string(&mut self) -> Result<String> {
        match self.peek() {
            Some(Token::SingleQuotedString(s)) => {
                self.pos += 1;
                Ok(s.clone())
            }
            _ => Err(self.expected(&["string literal"])),
        }
    }

    fn parse_comparison(&mut self) -> Result<Predicate> {
        let attribute = self.parse_attribute()?;
        let compare = |op, value| Predicate::Compare {
            attribute: attribute.clone(),
            op,
            value,
        };
        let op = match self.peek() {
            Some(Token::Eq) => Some(Comparison::Eq),
            Some(Token::Neq) => Some(Comparison::NotEq),
            Some(Token::Tilde) => Some(Comparison::Regex),
            _ => None,
        };
        if let Some(op) = op {
            self.pos += 1;
            return Ok(compare(op, self.parse_string()?));
        }
        if self.parse_keyword("IS") {
            let negated = self.parse_keyword("NOT");
            self.expect_keyword("NULL")?;
            return Ok(Predicate::IsNull { attribute, negated });
        }
        let negated = self.parse_keyword("NOT");
        let found = if self.parse_keyword("LIKE") {
            compare(Comparison::Like, self.parse_string()?)
        } else if self.parse_keyword("ILIKE") {
            compare(Comparison::ILike, self.parse_string()?)
        } else if self.parse_keyword("IN") {
            self.expect_token(&Token::LParen, "(")?;
            let mut values = vec![self.parse_string()?];
            while self.peek() == Some(&Token::Comma) {
                self.pos += 1;
                values.push(self.parse_string()?);
            }
            self.expect_token(&Token::RParen, ")")?;
            return Ok(Predicate::In {
                attribute,
                values,
                negated,
            });
        } else if negated {
            return Err(self.expected(&["LIKE", "ILIKE", "IN"]));
        } else {
            return Err(self.expected(&["=", "<>", "~", "LIKE", "ILIKE", "IN", "IS"]));
        };
        Ok(if negated {
            Predicate::Not(Box::new(found))
        } else {
            found
        })
    }

    fn parse_resource_operation(&mut self) -> Result<ResourceOperation> {
        if self.parse_keyword("READ") {
            return self.parse_disk().map(ResourceOperation::Read);
        }
        if self.parse_keyword("WRITE") {
            return self.parse_disk().map(ResourceOperation::Write);
        }
        if self.parse_keywords(&["MASTER", "THREAD"]) {
            return Ok(ResourceOperation::MasterThread);
        }
        if self.parse_keywords(&["WORKER", "THREAD"]) {
            return Ok(ResourceOperation::WorkerThread);
        }
        if self.parse_keyword("QUERY") {
            return Ok(ResourceOperation::Query);
        }
        if self.parse_keywords(&["MEMORY", "RESERVATION"]) {
            return Ok(ResourceOperation::MemoryReservation);
        }
        Err(self.expected(&[
            "READ",
            "WRITE",
            "MASTER THREAD",
            "WORKER THREAD",
            "QUERY",
            "MEMORY RESERVATION",
        ]))
    }

    fn parse_disk(&mut self) -> Result<DiskRef> {
        if self.parse_keywords(&["ANY", "DISK"]) {
            return Ok(DiskRef::Any);
        }
        if self.parse_keyword("DISK") {
            return self.parse_identifier().map(DiskRef::Named);
        }
        Err(self.expected(&["DISK", "ANY DISK"]))
    }

    fn parse_setting(&mut self) -> Result<SettingChange> {
        let name = self.parse_identifier()?;
        self.expect_token(&Token::Eq, "=")?;
        let value = self.parse_literal()?;
        let resource = if self.parse_keyword("FOR") {
            Some(self.parse_identifier()?)
        } else {
            None
        };
        Ok(SettingChange {
            name,
            value,
            resource,
        })
    }

    /// A literal as ClickHouse's `ParserLiteral` reads it: numbers (optionally signed; `0x..`,
    /// `1_000`, `1e100`, `inf`, `nan`), strings, `NULL`, `true`, `false`.
    fn parse_literal(&mut self) -> Result<Literal> {
        const WHAT: &[&str] = &["number", "string literal", "NULL", "true", "false"];
        let negative = match self.peek() {
            Some(Token::Minus) => {
                self.pos += 1;
                true
            }
            Some(Token::Plus) => {
                self.pos += 1;
                false
            }
            _ => {
                let literal = match self.peek() {
                    Some(Token::SingleQuotedString(s)) => Some(Literal::String(s.clone())),
                    Some(Token::Word(w)) if w.quote_style.is_none() => {
                        match w.value.to_ascii_lowercase().as_str() {
                            "null" => Some(Literal::Null),
                            "true" => Some(Literal::Bool(true)),
                            "false" => Some(Literal::Bool(false)),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                if let Some(l) = literal {
                    self.pos += 1;
                    return Ok(l);
                }
                false
            }
        };
        let Some(number) = self.peek().and_then(number_text) else {
            return Err(self.expected(if negative { &["number"] } else { WHAT }));
        };
        self.pos += 1;
        Ok(number_literal(&number, negative))
    }
}

/// The text of a numeric token, or `None` if the token is not a number. Digit separators are
/// removed and hexadecimal is marked with a `0x` prefix.
fn number_text(t: &Token) -> Option<String> {
    match t {
        Token::Number(s, false) => Some(s.clone()),
        Token::HexStringLiteral(s) if !s.is_empty() => Some(format!("0x{s}")),
        Token::Word(w) if w.quote_style.is_none() => {
            let v = w.value.as_str();
            let lower = v.to_ascii_lowercase();
            if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
                return Some(lower);
            }
            // `1_000`: the tokenizer reads a digit-led word, ClickHouse a number.
            let separated = v
                .split('_')
                .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()));
            (separated && v.contains('_')).then(|| v.replace('_', ""))
        }
        _ => None,
    }
}

fn number_literal(text: &str, negative: bool) -> Literal {
    let integer = if let Some(hex) = text.strip_prefix("0x") {
        u64::from_str_radix(hex, 16).ok()
    } else if text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u64>().ok()
    } else {
        None
    };
    match (integer, negative) {
        (Some(v), false) => Literal::UInt(v),
        (Some(0), true) => Literal::UInt(0),
        (Some(v), true) if v <= i64::MAX as u64 + 1 => {
            Literal::Int((v as i128).wrapping_neg() as i64)
        }
        _ => {
            let v = if let Some(hex) = text.strip_prefix("0x") {
                // Only reached when the hex literal overflows 64 bits.
                hex.chars().fold(0f64, |acc, c| {
                    acc * 16.0 + c.to_digit(16).unwrap_or(0) as f64
                })
            } else {
                text.parse::<f64>().unwrap_or(f64::NAN)
            };
            Literal::Float(if negative { -v } else { v })
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn first_chars_cuts_at_a_character_boundary() {
        use super::first_chars;
        assert_eq!(first_chars("select 1", 100), "select 1");
        assert_eq!(first_chars("select 1", 6), "select");
        assert_eq!(first_chars("ééé", 2), "éé");
        assert_eq!(first_chars("ééé", 3), "ééé");
        assert_eq!(first_chars("", 0), "");
    }

    use super::*;

    fn one(sql: &str) -> Statement {
        match parse_statement(sql) {
            Ok(s) => s,
            Err(e) => panic!("{sql}: {e}"),
        }
    }

    fn err(sql: &str) -> Error {
        match parse_statement(sql) {
            Ok(s) => panic!("{sql} parsed as {s:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn workload_round_trips_to_clickhouse_text() {
        let s = one("create or replace workload IF_x in `all` settings weight = 9, priority = -1 for q, max_memory = '1Gi'");
        assert_eq!(
            s.to_string(),
            "CREATE WORKLOAD IF_x IN `all` SETTINGS weight = 9, priority = -1 FOR q, max_memory = '1Gi'"
        );
        let s = one("CREATE WORKLOAD IF NOT EXISTS production IN all");
        assert_eq!(s.to_string(), "CREATE WORKLOAD production IN `all`");
    }

    #[test]
    fn digit_led_names_and_disks() {
        let s = one("CREATE OR REPLACE RESOURCE 03232_resource_1 (WRITE DISK 03232_disk_1, READ DISK 03232_disk_1)");
        assert_eq!(
            s.to_string(),
            "CREATE RESOURCE `03232_resource_1` (WRITE DISK `03232_disk_1`, READ DISK `03232_disk_1`)"
        );
    }

    #[test]
    fn literals_are_typed_like_clickhouse() {
        let lit = |v: &str| match one(&format!("CREATE WORKLOAD w SETTINGS x = {v}")) {
            Statement::CreateWorkload(c) => c.settings[0].value.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(lit("1"), Literal::UInt(1));
        assert_eq!(lit("-1"), Literal::Int(-1));
        assert_eq!(lit("+5"), Literal::UInt(5));
        assert_eq!(lit("0x10"), Literal::UInt(16));
        assert_eq!(lit("1_000"), Literal::UInt(1000));
        assert_eq!(lit("1.5"), Literal::Float(1.5));
        assert_eq!(lit("1e19"), Literal::Float(1e19));
        assert_eq!(
            lit("18446744073709551616"),
            Literal::Float(18446744073709551616.0)
        );
        assert_eq!(lit("-9223372036854775808"), Literal::Int(i64::MIN));
        assert_eq!(lit("Infinity"), Literal::Float(f64::INFINITY));
        assert_eq!(lit("-inf"), Literal::Float(f64::NEG_INFINITY));
        assert!(matches!(lit("nan"), Literal::Float(v) if v.is_nan()));
        assert_eq!(lit("'a''b\\n'"), Literal::String("a'b\n".into()));
        assert_eq!(lit("NULL"), Literal::Null);
        assert_eq!(lit("TRUE"), Literal::Bool(true));
    }

    #[test]
    fn or_replace_with_if_not_exists_is_a_syntax_error() {
        let e = err("CREATE OR REPLACE WORKLOAD IF NOT EXISTS h IN all");
        assert_eq!(e.code, ErrorCode::SyntaxError);
        assert_eq!(
            e.position,
            Some(Position {
                line: 1,
                column: 31
            })
        );
    }

    #[test]
    fn syntax_errors_say_where_and_what() {
        let e = err("CREATE WORKLOAD w SETTINGS");
        assert_eq!(e.code, ErrorCode::SyntaxError);
        assert!(e.message.contains("expected identifier"), "{e}");
        let e = err("CREATE RESOURCE r ()");
        assert!(e.message.contains("line 1, column 20"), "{e}");
        let e = err("CREATE WORKLOAD w SETTINGS a = b");
        assert!(e.message.contains("expected one of: number"), "{e}");
        let e = err("CREATE RESOURCE r (READ DISK d, MASTER THREAD)");
        assert_eq!(e.code, ErrorCode::BadArguments);
    }

    #[test]
    fn classifiers_parse_to_their_canonical_text() {
        let s = one("create or replace classifier billing workload prod when tag('team') = 'billing' and (user in ('a', 'b') or application_name ilike 'metabase%') and not query ~ '^EXPLAIN' rank 10 dry run");
        assert_eq!(
            s.to_string(),
            "CREATE CLASSIFIER billing WORKLOAD prod WHEN tag('team') = 'billing' AND (user IN ('a', 'b') OR application_name ILIKE 'metabase%') AND NOT query ~ '^EXPLAIN' RANK 10 DRY RUN"
        );
        let s = one("CREATE CLASSIFIER c WORKLOAD w WHEN client_addr NOT IN ('10.0.0.0/8') AND database IS NOT NULL RANK -1");
        assert_eq!(
            s.to_string(),
            "CREATE CLASSIFIER c WORKLOAD w WHEN client_addr NOT IN ('10.0.0.0/8') AND database IS NOT NULL RANK -1"
        );
        assert_eq!(
            one("DROP CLASSIFIER IF EXISTS c").to_string(),
            "DROP CLASSIFIER IF EXISTS c"
        );
        let e = err("CREATE CLASSIFIER c WORKLOAD w WHEN usr = 'a'");
        assert!(e.message.contains("expected one of: user, database"), "{e}");
        let e = err("CREATE CLASSIFIER c WORKLOAD w WHEN user = 1");
        assert!(e.message.contains("expected string literal"), "{e}");
        let e = err("CREATE CLASSIFIER c WORKLOAD w WHEN user = 'a' RANK 'x'");
        assert_eq!(e.code, ErrorCode::BadArguments);
        let e = err("CREATE CLASSIFIER c WHEN user = 'a'");
        assert!(
            e.message.contains("expected one of: ON CLUSTER, WORKLOAD"),
            "{e}"
        );
    }

    #[test]
    fn predicates_nest_boundedly() {
        let deep = format!(
            "CREATE CLASSIFIER c WORKLOAD w WHEN {}user = 'a'{}",
            "(".repeat(100_000),
            ")".repeat(100_000)
        );
        assert_eq!(err(&deep).code, ErrorCode::TooDeepAst);
        let nots = format!(
            "CREATE CLASSIFIER c WORKLOAD w WHEN {}user = 'a'",
            "NOT ".repeat(300)
        );
        assert_eq!(err(&nots).code, ErrorCode::TooDeepAst);
        let chain = format!(
            "CREATE CLASSIFIER c WORKLOAD w WHEN user = 'a'{}",
            " OR user = 'b'".repeat(MAX_PREDICATE_DEPTH + 1)
        );
        assert_eq!(err(&chain).code, ErrorCode::TooDeepAst);
        let fits = format!(
            "CREATE CLASSIFIER c WORKLOAD w WHEN user = 'a'{}",
            " OR user = 'b'".repeat(MAX_PREDICATE_DEPTH - 1)
        );
        assert!(parse_statement(&fits).is_ok());
    }

    #[test]
    fn mention_places_are_every_start_in_turn() {
        let places = |text, needle| mention_places(text, needle).collect::<Vec<_>>();
        assert_eq!(
            places("system.a, SYSTEM.b, xsystem.c", "system."),
            [0, 10, 21]
        );
        assert_eq!(places("aaa", "aa"), [0, 1]);
        assert_eq!(places("abc", ""), [0]);
        assert_eq!(places("abc", "abcd"), Vec::<usize>::new());
        assert_eq!(places("", "a"), Vec::<usize>::new());
        // Places far into a long text (searched in vector steps).
        let long = format!("{}System.x {}system.y", "-".repeat(60), "+".repeat(70));
        assert_eq!(places(&long, "system."), [60, 139]);
        // Past its last place a search ends, however often asked.
        let mut it = mention_places("ab ab", "ab");
        assert_eq!(
            (it.next(), it.next(), it.next(), it.next()),
            (Some(0), Some(3), None, None)
        );
    }

    #[test]
    fn mentions_ignores_ascii_case_only() {
        assert!(mentions("select 1 SeTtInGs workload = 'x'", "settings"));
        assert!(mentions("SELECT * FROM SYSTEM.processes", "system."));
        assert!(!mentions("SELECT 1", "settings"));
        assert!(!mentions("SELECT * FROM system_processes", "system."));
        assert!(!mentions("set", "settings"));
        // A near miss just before it, the needle at the very end, a one-byte needle.
        assert!(mentions("SELECT sesettings", "settings"));
        assert!(mentions("x SETTINGS", "settings"));
        assert!(!mentions("x SETTING", "settings"));
        assert!(mentions("a;", ";"));
    }

    #[test]
    fn scripts_split_on_semicolons_and_drop_line_comments() {
        let items = parse_script(
            "-- setup\nCREATE WORKLOAD all; /* keep */ CREATE   WORKLOAD a IN all -- c\n SETTINGS weight=2;\n;DROP x",
        );
        let texts: Vec<_> = items.iter().map(|i| i.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "CREATE WORKLOAD all",
                "/* keep */ CREATE WORKLOAD a IN all SETTINGS weight=2",
                "DROP x"
            ]
        );
        assert!(items[2].result.is_err());
    }

    #[test]
    fn settings_tails_are_taken_off_queries() {
        let m = split_settings("SELECT 1 SETTINGS workload = 'prod', max_threads = 4;")
            .expect("splits");
        assert_eq!(m.query, "SELECT 1");
        assert_eq!(
            m.settings,
            [
                ("workload".to_string(), Literal::String("prod".into())),
                ("max_threads".to_string(), Literal::UInt(4))
            ]
        );
        // Not a tail: inside parentheses, an alias, a string.
        for q in [
            "SELECT (SELECT 1 SETTINGS workload = 'x')",
            "SELECT 1 AS settings",
            "SELECT 'SETTINGS workload = 1'",
            "SELECT settings FROM t",
        ] {
            assert_eq!(split_settings(q).expect("splits").query, q, "{q}");
        }
        let m = split_settings("select a from t where b = 1 settings reserve_memory = '80Mi'")
            .expect("splits");
        assert_eq!(m.query, "select a from t where b = 1");
        assert_eq!(m.settings[0].1, Literal::String("80Mi".into()));
    }

    #[test]
    fn non_ascii_text_is_echoed_and_located_by_characters() {
        let items = parse_script("CREATE WORKLOAD `üñí`;\nCREATE WORKLOAD `ß` IN `üñí` SETTINGS é");
        assert_eq!(items[0].text, "CREATE WORKLOAD `üñí`");
        assert_eq!(items[1].text, "CREATE WORKLOAD `ß` IN `üñí` SETTINGS é");
        let e = items[1].result.as_ref().err().map(|e| e.position);
        assert_eq!(
            e,
            Some(Some(Position {
                line: 2,
                column: 39
            }))
        );
    }

    #[test]
    fn unterminated_quote_fails_the_rest_only() {
        let items = parse_script("CREATE WORKLOAD a; CREATE WORKLOAD 'b");
        assert_eq!(items.len(), 2);
        assert!(items[0].result.is_ok());
        assert_eq!(
            items[1].result.as_ref().map_err(|e| e.code),
            Err(ErrorCode::SyntaxError)
        );
        assert_eq!(items[1].text, "CREATE WORKLOAD 'b");
        let items = parse_script("CREATE WORKLOAD `a");
        assert_eq!(items.len(), 1);
    }
}

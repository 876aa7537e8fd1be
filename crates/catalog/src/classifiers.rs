//! Classifiers, compiled: the ranked rules that pick a statement's workload when it does not
//! name one (`CREATE CLASSIFIER`, sluice's own).
//!
//! A rule compiles once, when its statement is applied: regular expressions are built (with a
//! bounded size), CIDR blocks and statement kinds are checked, `LIKE` patterns are read. What
//! is left for each statement is comparisons and compiled matchers (`LIKE` patterns become
//! anchored regular expressions, so `'%orders%'` is a substring search); BENCHMARKS.md has
//! what a hundred rules cost a statement.
//!
//! [`Rules::classify`] tries the rules by rank (highest first), then name; the first live rule
//! that matches routes the statement. Dry-run rules ranked before it that match count a
//! would-be match and route nothing. Predicates use SQL's three-valued logic: an attribute the
//! statement does not have (no `application_name`, no such tag, a Unix-socket client's
//! `client_addr`) is NULL, a comparison with NULL is unknown, and only a predicate that is
//! true matches (`IS NULL` asks about absence directly).
//!
//! Each compiled rule carries its match counters. They are statistics, not definitions, so
//! they are atomics shared by every catalog snapshot that holds the same rule; replacing a
//! rule starts its counters again.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_sql::{
    Attribute, Comparison, CreateClassifier, Error, Predicate, Result, StatementKind,
};

/// The most memory one classifier's regular expression may compile to (the `regex` crate's
/// `size_limit`; also the lazy DFA's cache bound). A larger one is refused at DDL time.
pub const MAX_REGEX_BYTES: usize = 1 << 20;

/// What sluice knows of a statement when it classifies it.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub user: &'a str,
    pub database: Option<&'a str>,
    pub application_name: Option<&'a str>,
    pub client_addr: Option<IpAddr>,
    pub statement_kind: StatementKind,
    /// The statement's text (without its `SETTINGS` tail).
    pub query: &'a str,
    /// Its SQLCommenter tags ([`sluice_sql::tags`]); read only when [`Rules::reads_tags`].
    pub tags: &'a [(String, String)],
}

/// [`Facts`] that own their text: kept with a statement a rule placed while it waits, to
/// classify it again when that rule is replaced or dropped.
#[derive(Debug, Clone)]
pub struct OwnedFacts {
    pub user: String,
    pub database: Option<String>,
    pub application_name: Option<String>,
    pub client_addr: Option<IpAddr>,
    pub statement_kind: StatementKind,
    pub query: String,
    pub tags: Vec<(String, String)>,
}

impl OwnedFacts {
    pub fn of(facts: &Facts<'_>) -> OwnedFacts {
        OwnedFacts {
            user: facts.user.to_string(),
            database: facts.database.map(str::to_string),
            application_name: facts.application_name.map(str::to_string),
            client_addr: facts.client_addr,
            statement_kind: facts.statement_kind,
            query: facts.query.to_string(),
            tags: facts.tags.to_vec(),
        }
    }

    pub fn facts(&self) -> Facts<'_> {
        Facts {
            user: &self.user,
            database: self.database.as_deref(),
            application_name: self.application_name.as_deref(),
            client_addr: self.client_addr,
            statement_kind: self.statement_kind,
            query: &self.query,
            tags: &self.tags,
        }
    }
}

/// How often a rule matched (for a dry-run rule: would have), and when last.
#[derive(Debug, Default)]
pub struct RuleStats {
    matches: AtomicU64,
    /// Microseconds since the Unix epoch; 0: never.
    last_match_us: AtomicU64,
}

impl RuleStats {
    pub fn matches(&self) -> u64 {
        self.matches.load(Ordering::Relaxed)
    }

    pub fn last_match(&self) -> Option<SystemTime> {
        match self.last_match_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(UNIX_EPOCH + std::time::Duration::from_micros(us)),
        }
    }

    fn count(&self) {
        self.matches.fetch_add(1, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        self.last_match_us.store(now.max(1), Ordering::Relaxed);
    }
}

/// One compiled classifier.
#[derive(Debug)]
pub struct Rule {
    pub name: String,
    pub workload: String,
    pub rank: i64,
    pub dry_run: bool,
    /// The predicate as written (canonical text), for `system.classifiers`.
    pub predicate: String,
    pub stats: RuleStats,
    test: Node,
    /// The matchers on `query`, in slot order: [`Rules`] runs all of a catalog's at once, in
    /// one pass over the text, rather than one pass each.
    query_matchers: Vec<regex::Regex>,
}

#[derive(Debug)]
enum Node {
    Test { attribute: Attribute, test: Test },
    IsNull { attribute: Attribute, negated: bool },
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Not(Box<Node>),
}

#[derive(Debug)]
enum Test {
    /// `=` / `IN` (negated: `<>` / `NOT IN`).
    Equals { values: Vec<String>, negated: bool },
    /// `client_addr` `=` / `IN` (negated: `<>` / `NOT IN`): inside any of the blocks.
    Within { nets: Vec<Net>, negated: bool },
    /// A `LIKE` / `ILIKE` pattern that is a literal with `%` at either end or none: compared
    /// directly, without a regular expression (the common `'grafana%'`, `'%orders%'`).
    Literal(LiteralLike),
    /// `LIKE` / `ILIKE` and `~` alike: a compiled regular expression. On `query`, `slot` is
    /// its place among the rule's query matchers ([`Rule::query_matchers`]).
    Matches {
        re: regex::Regex,
        slot: Option<usize>,
    },
}

/// An IP block: `10.0.0.0/8`, `::1` (a single address is a full-length block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    /// Reads `a.b.c.d[/n]` or an IPv6 address with an optional `/n`.
    pub fn parse(text: &str) -> Option<Net> {
        let (addr, prefix) = match text.trim().split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
            None => (text.trim().parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Net { addr, prefix })
    }

    /// Whether `ip` is in the block. An IPv4 client seen as an IPv4-mapped IPv6 address
    /// (`::ffff:10.1.2.3`, a dual-stack listener) matches IPv4 blocks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let bits = |a: IpAddr| -> (u128, u32) {
            match a {
                IpAddr::V4(v) => (u32::from(v) as u128, 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        };
        let ((net, width), (addr, addr_width)) = (bits(self.addr), bits(ip));
        if width != addr_width {
            return false;
        }
        let shift = width - self.prefix as u32;
        shift == width || (net >> shift) == (addr >> shift)
    }
}

/// A literal `LIKE` pattern: where the literal must be, and whether case is ignored (only for
/// ASCII literals; on a non-ASCII text the regular expression decides, for Unicode folding).
#[derive(Debug)]
struct LiteralLike {
    literal: String,
    at_start: bool,
    at_end: bool,
    ignore_case: bool,
    /// The same pattern as a regular expression, for what the fast path cannot answer.
    fallback: regex::Regex,
}

impl LiteralLike {
    /// `pattern` as a literal test, if it is one: no `_` or `\\`, and `%` only at the ends.
    fn new(pattern: &str, ignore_case: bool, fallback: &regex::Regex) -> Option<LiteralLike> {
        let body = pattern.strip_prefix('%');
        let at_start = body.is_none();
        let body = body.unwrap_or(pattern);
        let trimmed = body.strip_suffix('%');
        let at_end = trimmed.is_none();
        let literal = trimmed.unwrap_or(body);
        if literal.contains(['%', '_', '\\']) || (ignore_case && !literal.is_ascii()) {
            return None;
        }
        // Case-insensitive containment is left to the regex engine's literal search.
        if ignore_case && !at_start && !at_end {
            return None;
        }
        Some(LiteralLike {
            literal: literal.to_string(),
            at_start,
            at_end,
            ignore_case,
            fallback: fallback.clone(),
        })
    }

    fn matches(&self, text: &str) -> bool {
        let l = self.literal.as_bytes();
        let t = text.as_bytes();
        if !self.ignore_case {
            return match (self.at_start, self.at_end) {
                (true, true) => t == l,
                (true, false) => t.starts_with(l),
                (false, true) => t.ends_with(l),
                (false, false) => text.contains(self.literal.as_str()),
            };
        }
        if !text.is_ascii() {
            return self.fallback.is_match(text);
        }
        match (self.at_start, self.at_end) {
            (true, true) => t.eq_ignore_ascii_case(l),
            (true, false) => t.len() >= l.len() && t[..l.len()].eq_ignore_ascii_case(l),
            (false, true) => t.len() >= l.len() && t[t.len() - l.len()..].eq_ignore_ascii_case(l),
            (false, false) => self.fallback.is_match(text),
        }
    }
}

/// A `LIKE` pattern (`%` any run, `_` one character, `\\` escapes the next character) as the
/// anchored regular expression it means: the regex engine's literal search makes
/// `'%orders%'` a substring scan, with no allocation per statement.
fn like_regex(pattern: &str, ignore_case: bool) -> std::result::Result<regex::Regex, regex::Error> {
    let mut re = String::with_capacity(pattern.len() + 8);
    re.push_str(if ignore_case { "(?is)" } else { "(?s)" });
    // A leading or trailing `%` is no anchor rather than `.*` against one: `'%orders%'` is
    // then a plain substring search (an escaped `\\%` at the end is a literal, and anchors).
    let body = pattern.strip_prefix('%').unwrap_or_else(|| {
        re.push('^');
        pattern
    });
    let trailing_any = body.ends_with('%') && !body.ends_with("\\%");
    let body = if trailing_any {
        &body[..body.len() - 1]
    } else {
        body
    };
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '%' => re.push_str(".*"),
            '_' => re.push('.'),
            '\\' => {
                let literal = chars.next().unwrap_or('\\');
                re.push_str(&regex::escape(literal.encode_utf8(&mut [0; 4])));
            }
            c => re.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        }
    }
    if !trailing_any {
        re.push('$');
    }
    regex::RegexBuilder::new(&re)
        .size_limit(MAX_REGEX_BYTES)
        .dfa_size_limit(MAX_REGEX_BYTES)
        .build()
}

const STATEMENT_KINDS: [&str; 6] = ["select", "insert", "update", "delete", "ddl", "utility"];

impl Rule {
    /// Compiles a classifier: fails with BAD_ARGUMENTS on a regular expression that does not
    /// compile (or is too large), a `client_addr` value that is not an address or block, or a
    /// `statement_kind` value that is not a kind.
    pub fn compile(c: &CreateClassifier) -> Result<Rule> {
        let mut query_matchers = Vec::new();
        let test = compile_node(&c.name, &c.predicate, &mut query_matchers)?;
        Ok(Rule {
            name: c.name.clone(),
            workload: c.workload.clone(),
            rank: c.rank,
            dry_run: c.dry_run,
            predicate: c.predicate.to_string(),
            stats: RuleStats::default(),
            test,
            query_matchers,
        })
    }

    /// Whether the rule's predicate is true for `facts`.
    pub fn matches(&self, facts: &Facts<'_>) -> bool {
        let alone = Scan::default();
        eval(&self.test, facts, &alone, 0) == Some(true)
    }
}

/// The query matchers of every rule, run together: one pass over a statement's text answers
/// them all. Made on the first rule that needs it, once per statement.
#[derive(Debug, Default)]
struct Scan<'r> {
    set: Option<&'r regex::RegexSet>,
    matched: std::cell::OnceCell<regex::SetMatches>,
}

impl Scan<'_> {
    /// Whether matcher `index` of the set matches `query`; `None` without a set.
    fn is_match(&self, index: usize, query: &str) -> Option<bool> {
        let set = self.set?;
        Some(
            self.matched
                .get_or_init(|| set.matches(query))
                .matched(index),
        )
    }
}

fn compile_node(name: &str, p: &Predicate, query_matchers: &mut Vec<regex::Regex>) -> Result<Node> {
    let bad = |what: String| Error::bad_arguments(format!("Classifier '{name}': {what}"));
    Ok(match p {
        Predicate::And(a, b) => Node::And(
            Box::new(compile_node(name, a, query_matchers)?),
            Box::new(compile_node(name, b, query_matchers)?),
        ),
        Predicate::Or(a, b) => Node::Or(
            Box::new(compile_node(name, a, query_matchers)?),
            Box::new(compile_node(name, b, query_matchers)?),
        ),
        Predicate::Not(a) => Node::Not(Box::new(compile_node(name, a, query_matchers)?)),
        Predicate::IsNull { attribute, negated } => Node::IsNull {
            attribute: attribute.clone(),
            negated: *negated,
        },
        Predicate::Compare {
            attribute,
            op,
            value,
        } => {
            let test = match op {
                Comparison::Eq | Comparison::NotEq => {
                    equals(&bad, attribute, std::slice::from_ref(value), *op == Comparison::NotEq)?
                }
                Comparison::Like | Comparison::ILike => {
                    let ignore_case = *op == Comparison::ILike;
                    let re = like_regex(value, ignore_case).map_err(|e| match e {
                        regex::Error::CompiledTooBig(limit) => bad(format!(
                            "the pattern '{value}' compiles to more than {limit} bytes; simplify it"
                        )),
                        e => bad(format!("invalid LIKE pattern '{value}': {e}")),
                    })?;
                    match LiteralLike::new(value, ignore_case, &re) {
                        Some(literal) => Test::Literal(literal),
                        None => matcher(attribute, query_matchers, re),
                    }
                }
                Comparison::Regex => matcher(
                    attribute,
                    query_matchers,
                    regex::RegexBuilder::new(value)
                        .size_limit(MAX_REGEX_BYTES)
                        .dfa_size_limit(MAX_REGEX_BYTES)
                        .build()
                        .map_err(|e| match e {
                            regex::Error::CompiledTooBig(limit) => bad(format!(
                                "the regular expression '{value}' compiles to more than {limit} bytes; simplify it"
                            )),
                            e => bad(format!("invalid regular expression '{value}': {e}")),
                        })?,
                ),
            };
            Node::Test {
                attribute: attribute.clone(),
                test,
            }
        }
        Predicate::In {
            attribute,
            values,
            negated,
        } => Node::Test {
            attribute: attribute.clone(),
            test: equals(&bad, attribute, values, *negated)?,
        },
    })
}

/// A matcher test; one on `query` also takes the next slot among the rule's query matchers.
fn matcher(
    attribute: &Attribute,
    query_matchers: &mut Vec<regex::Regex>,
    re: regex::Regex,
) -> Test {
    let slot = (*attribute == Attribute::Query).then(|| {
        query_matchers.push(re.clone());
        query_matchers.len() - 1
    });
    Test::Matches { re, slot }
}

fn equals(
    bad: &impl Fn(String) -> Error,
    attribute: &Attribute,
    values: &[String],
    negated: bool,
) -> Result<Test> {
    match attribute {
        Attribute::ClientAddr => {
            let nets = values
                .iter()
                .map(|v| {
                    Net::parse(v).ok_or_else(|| {
                        bad(format!("'{v}' is not an IP address or CIDR block (write '10.0.0.0/8' or '::1')"))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Test::Within { nets, negated })
        }
        Attribute::StatementKind => {
            let values = values
                .iter()
                .map(|v| {
                    let lower = v.to_ascii_lowercase();
                    if STATEMENT_KINDS.contains(&lower.as_str()) {
                        Ok(lower)
                    } else {
                        Err(bad(format!(
                            "'{v}' is not a statement kind; statement_kind is one of {}",
                            STATEMENT_KINDS.join(", ")
                        )))
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Test::Equals { values, negated })
        }
        _ => Ok(Test::Equals {
            values: values.to_vec(),
            negated,
        }),
    }
}

/// The attribute's value as text (`None`: NULL). `client_addr` as text only for `LIKE`/`~`.
fn text_of<'a>(attribute: &Attribute, facts: &Facts<'a>) -> Option<std::borrow::Cow<'a, str>> {
    use std::borrow::Cow;
    Some(match attribute {
        Attribute::User => Cow::Borrowed(facts.user),
        Attribute::Database => Cow::Borrowed(facts.database?),
        Attribute::ApplicationName => Cow::Borrowed(facts.application_name?),
        Attribute::ClientAddr => Cow::Owned(facts.client_addr?.to_string()),
        Attribute::StatementKind => Cow::Borrowed(facts.statement_kind.name()),
        Attribute::Query => Cow::Borrowed(facts.query),
        Attribute::Tag(key) => Cow::Borrowed(
            facts
                .tags
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())?,
        ),
    })
}

/// Three-valued: `None` is unknown (a NULL attribute compared). `scan` answers query
/// matchers from the catalog-wide set, where this rule's start at `base`.
fn eval(node: &Node, facts: &Facts<'_>, scan: &Scan<'_>, base: usize) -> Option<bool> {
    match node {
        Node::And(a, b) => match eval(a, facts, scan, base) {
            Some(false) => Some(false),
            left => match (left, eval(b, facts, scan, base)?) {
                (_, false) => Some(false),
                (Some(true), true) => Some(true),
                _ => None,
            },
        },
        Node::Or(a, b) => match eval(a, facts, scan, base) {
            Some(true) => Some(true),
            left => match (left, eval(b, facts, scan, base)) {
                (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            },
        },
        Node::Not(a) => eval(a, facts, scan, base).map(|v| !v),
        Node::IsNull { attribute, negated } => {
            let null = match attribute {
                Attribute::ClientAddr => facts.client_addr.is_none(),
                other => text_of(other, facts).is_none(),
            };
            Some(null != *negated)
        }
        Node::Test { attribute, test } => match test {
            Test::Within { nets, negated } => {
                let ip = facts.client_addr?;
                Some(nets.iter().any(|n| n.contains(ip)) != *negated)
            }
            Test::Equals { values, negated } => {
                let v = text_of(attribute, facts)?;
                Some(values.iter().any(|x| *x == v) != *negated)
            }
            Test::Literal(like) => Some(like.matches(&text_of(attribute, facts)?)),
            Test::Matches { re, slot } => {
                if let Some(found) = slot.and_then(|i| scan.is_match(base + i, facts.query)) {
                    return Some(found);
                }
                Some(re.is_match(&text_of(attribute, facts)?))
            }
        },
    }
}

/// Every classifier of a catalog, compiled and in the order they are tried.
#[derive(Debug, Default, Clone)]
pub struct Rules {
    /// By rank (highest first), then name.
    rules: Vec<Arc<Rule>>,
    /// Every rule's query matchers in one set (`None`: no rule has any, or together they are
    /// too large, and each is run alone); rule i's start at `bases[i]`.
    query_set: Option<Arc<regex::RegexSet>>,
    bases: Vec<usize>,
    /// Rules that can only match one of a few values of an attribute (a top-level
    /// `attr = 'v'` or `attr IN (…)` conjunct), by attribute and value: a statement's value
    /// picks its candidates in one lookup, and the other keyed rules are skipped unevaluated.
    keys: Arc<Vec<KeyIndex>>,
    /// The rules no [`KeyIndex`] holds, as a bitset in trying order: always candidates.
    unkeyed: Vec<u64>,
}

/// The rules keyed by one attribute's values.
#[derive(Debug)]
struct KeyIndex {
    attribute: Attribute,
    by_value: std::collections::HashMap<String, Vec<usize>>,
}

/// The attribute and values a rule requires: the first positive `=` / `IN` on a text
/// attribute (not `query`, not `client_addr`) among its top-level `AND` conjuncts.
fn key_of(node: &Node) -> Option<(&Attribute, &[String])> {
    match node {
        Node::And(a, b) => key_of(a).or_else(|| key_of(b)),
        Node::Test {
            attribute,
            test:
                Test::Equals {
                    values,
                    negated: false,
                },
        } if !matches!(attribute, Attribute::Query | Attribute::ClientAddr) => {
            Some((attribute, values))
        }
        _ => None,
    }
}

/// Which rules may match a statement: the keyed ones its values pick, and every unkeyed one.
/// A bitset over the rules in trying order, on the stack for up to 256 rules (it is made for
/// every statement).
enum Candidates {
    Inline([u64; 4]),
    Heap(Vec<u64>),
}

impl Candidates {
    /// Starts from `words` (the unkeyed rules).
    fn from(words: &[u64]) -> Candidates {
        if words.len() <= 4 {
            let mut inline = [0u64; 4];
            inline[..words.len()].copy_from_slice(words);
            Candidates::Inline(inline)
        } else {
            Candidates::Heap(words.to_vec())
        }
    }

    fn words(&mut self) -> &mut [u64] {
        match self {
            Candidates::Inline(w) => w,
            Candidates::Heap(w) => w,
        }
    }

    fn insert(&mut self, i: usize) {
        self.words()[i / 64] |= 1 << (i % 64);
    }

    fn contains(&self, i: usize) -> bool {
        let words: &[u64] = match self {
            Candidates::Inline(w) => w,
            Candidates::Heap(w) => w,
        };
        words[i / 64] & (1 << (i % 64)) != 0
    }
}

impl Rules {
    pub(crate) fn new(mut rules: Vec<Arc<Rule>>) -> Rules {
        rules.sort_by(|a, b| b.rank.cmp(&a.rank).then_with(|| a.name.cmp(&b.name)));
        let mut bases = Vec::with_capacity(rules.len());
        let mut patterns = Vec::new();
        for rule in &rules {
            bases.push(patterns.len());
            patterns.extend(rule.query_matchers.iter().map(|re| re.as_str().to_string()));
        }
        let query_set = (!patterns.is_empty())
            .then(|| {
                regex::RegexSetBuilder::new(&patterns)
                    .size_limit(MAX_REGEX_BYTES * 8)
                    .dfa_size_limit(MAX_REGEX_BYTES * 8)
                    .build()
                    .ok()
            })
            .flatten()
            .map(Arc::new);
        let mut keys: Vec<KeyIndex> = Vec::new();
        let mut keyed = vec![false; rules.len()];
        for (i, rule) in rules.iter().enumerate() {
            let Some((attribute, values)) = key_of(&rule.test) else {
                continue;
            };
            let at = match keys.iter().position(|k| k.attribute == *attribute) {
                Some(at) => at,
                None => {
                    keys.push(KeyIndex {
                        attribute: attribute.clone(),
                        by_value: Default::default(),
                    });
                    keys.len() - 1
                }
            };
            for v in values {
                let list = keys[at].by_value.entry(v.clone()).or_default();
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
            keyed[i] = true;
        }
        let mut unkeyed = vec![0u64; rules.len().div_ceil(64)];
        for (i, _) in keyed.iter().enumerate().filter(|(_, k)| !**k) {
            unkeyed[i / 64] |= 1 << (i % 64);
        }
        Rules {
            rules,
            query_set,
            bases,
            keys: Arc::new(keys),
            unkeyed,
        }
    }

    /// The rules worth evaluating for `facts`.
    fn candidates(&self, facts: &Facts<'_>) -> Candidates {
        let mut bits = Candidates::from(&self.unkeyed);
        for key in self.keys.iter() {
            let Some(value) = text_of(&key.attribute, facts) else {
                continue;
            };
            if let Some(list) = key.by_value.get(value.as_ref()) {
                for &i in list {
                    bits.insert(i);
                }
            }
        }
        bits
    }

    /// Whether rule `i` (in trying order) matches, its query matchers answered by `scan`.
    fn matches(&self, i: usize, facts: &Facts<'_>, scan: &Scan<'_>) -> bool {
        eval(&self.rules[i].test, facts, scan, self.bases[i]) == Some(true)
    }

    fn scan(&self) -> Scan<'_> {
        Scan {
            set: self.query_set.as_deref(),
            matched: std::cell::OnceCell::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// In the order they are tried.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Rule>> {
        self.rules.iter()
    }

    /// Classifies a statement and counts it: the first live rule that matches routes it
    /// (`None`: no rule matched; it runs in the default); each dry-run rule ranked before that
    /// one that matches counts a would-be match and is reported to `on_dry_run`.
    pub fn classify(
        &self,
        facts: &Facts<'_>,
        mut on_dry_run: impl FnMut(&Rule),
    ) -> Option<&Arc<Rule>> {
        let scan = self.scan();
        let candidates = self.candidates(facts);
        for (i, rule) in self.rules.iter().enumerate() {
            if !candidates.contains(i) || !self.matches(i, facts, &scan) {
                continue;
            }
            rule.stats.count();
            if rule.dry_run {
                on_dry_run(rule);
                continue;
            }
            return Some(rule);
        }
        None
    }

    /// The live rule that would route `facts`, counting nothing (to classify a waiting
    /// statement again after the rules changed).
    pub fn route(&self, facts: &Facts<'_>) -> Option<&Arc<Rule>> {
        let scan = self.scan();
        let candidates = self.candidates(facts);
        (0..self.rules.len())
            .find(|&i| {
                !self.rules[i].dry_run && candidates.contains(i) && self.matches(i, facts, &scan)
            })
            .map(|i| &self.rules[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(predicate: &str) -> Result<Rule> {
        let sql = format!("CREATE CLASSIFIER c WORKLOAD w WHEN {predicate}");
        match sluice_sql::parse_statement(&sql)? {
            sluice_sql::Statement::CreateClassifier(c) => Rule::compile(&c),
            other => panic!("{other:?}"),
        }
    }

    fn facts() -> Facts<'static> {
        Facts {
            user: "alice",
            database: Some("shop"),
            application_name: None,
            client_addr: Some("10.1.2.3".parse().expect("ip")),
            statement_kind: StatementKind::Select,
            query: "SELECT * FROM orders /* team='billing' */",
            tags: &[],
        }
    }

    #[test]
    fn predicates_over_a_table_of_inputs() {
        let tags = [("team".to_string(), "billing".to_string())];
        let base = Facts {
            tags: &tags,
            ..facts()
        };
        let v6 = Facts {
            client_addr: Some("::ffff:10.1.2.3".parse().expect("ip")),
            ..base
        };
        let socket = Facts {
            client_addr: None,
            ..base
        };
        let metabase = Facts {
            application_name: Some("Metabase v0.50"),
            ..base
        };
        // (predicate, facts, matches)
        let table: &[(&str, &Facts<'_>, bool)] = &[
            ("user = 'alice'", &base, true),
            ("user = 'Alice'", &base, false),
            ("user <> 'bob'", &base, true),
            ("user IN ('bob', 'alice')", &base, true),
            ("user NOT IN ('bob', 'alice')", &base, false),
            ("client_addr = '10.0.0.0/8'", &base, true),
            ("client_addr = '10.1.2.3'", &base, true),
            ("client_addr = '10.1.2.4/32'", &base, false),
            (
                "client_addr IN ('192.168.0.0/16', '10.1.0.0/16')",
                &base,
                true,
            ),
            ("client_addr = '10.0.0.0/8'", &v6, true),
            ("client_addr = '0.0.0.0/0'", &base, true),
            ("client_addr = '::/0'", &base, false),
            ("client_addr <> '10.0.0.0/8'", &base, false),
            // A Unix socket has no address: NULL, so neither = nor <> holds.
            ("client_addr = '10.0.0.0/8'", &socket, false),
            ("client_addr <> '10.0.0.0/8'", &socket, false),
            ("client_addr IS NULL", &socket, true),
            ("client_addr LIKE '10.%'", &base, true),
            ("statement_kind = 'SELECT'", &base, true),
            ("statement_kind IN ('insert', 'update')", &base, false),
            ("query ~ '(?i)from\\\\s+orders'", &base, true),
            ("query ~ '^INSERT'", &base, false),
            ("query LIKE 'SELECT%orders%'", &base, true),
            ("query LIKE 'select%'", &base, false),
            ("query ILIKE 'select%'", &base, true),
            ("query LIKE 'SELECT _ FROM%'", &base, true),
            ("query LIKE '%100\\%%'", &base, false),
            ("tag('team') = 'billing'", &base, true),
            ("tag('team') = 'ops'", &base, false),
            ("tag('missing') = 'x'", &base, false),
            ("tag('missing') <> 'x'", &base, false),
            ("NOT tag('missing') = 'x'", &base, false),
            ("tag('missing') IS NULL", &base, true),
            ("tag('team') IS NOT NULL", &base, true),
            // Unknown OR true is true; unknown AND false is false.
            ("application_name = 'x' OR user = 'alice'", &base, true),
            ("NOT (application_name = 'x' AND user = 'bob')", &base, true),
            ("application_name ILIKE 'metabase%'", &metabase, true),
            ("application_name ILIKE 'metabase%'", &base, false),
            ("database = 'shop' AND NOT user IN ('bob')", &base, true),
        ];
        for (predicate, facts, expected) in table {
            let r = rule(predicate).unwrap_or_else(|e| panic!("{predicate}: {e}"));
            assert_eq!(r.matches(facts), *expected, "{predicate}");
            // The same through a rule set, whose query matchers run in one pass, beside
            // another rule's (so its slots start past 0).
            let other = rule("query ~ 'never' OR query LIKE 'nor this'").expect("compiles");
            let rules = Rules::new(vec![Arc::new(other), Arc::new(r)]);
            assert_eq!(
                rules.route(facts).is_some(),
                *expected,
                "{predicate} in a set"
            );
        }
    }

    #[test]
    fn bad_values_are_refused_when_the_rule_is_created() {
        for (predicate, says) in [
            (
                "client_addr = '10.0.0.0/33'",
                "not an IP address or CIDR block",
            ),
            (
                "client_addr IN ('10.0.0.1', 'localhost')",
                "'localhost' is not an IP",
            ),
            (
                "statement_kind = 'merge'",
                "statement_kind is one of select",
            ),
            ("query ~ '(unclosed'", "invalid regular expression"),
            ("query ~ '\\w{1000}{1000}'", "compiles to more than"),
        ] {
            let e = rule(predicate).err().map(|e| (e.code, e.message));
            assert!(
                e.as_ref()
                    .is_some_and(|(code, m)| *code == sluice_sql::ErrorCode::BadArguments
                        && m.contains(says)),
                "{predicate}: {e:?}"
            );
        }
    }

    /// Past 256 rules the candidate set lives on the heap; keyed and unkeyed rules alike are
    /// found wherever they rank.
    #[test]
    fn many_rules_keyed_and_unkeyed_are_all_found() {
        let mut rules = Vec::new();
        for i in 0..300 {
            let predicate = if i == 280 {
                "database = 'shop' OR user = 'nobody'".to_string()
            } else {
                format!("user = 'u{i}'")
            };
            let sql = format!(
                "CREATE CLASSIFIER r{i:03} WORKLOAD w{i} WHEN {predicate} RANK {}",
                1000 - i
            );
            match sluice_sql::parse_statement(&sql) {
                Ok(sluice_sql::Statement::CreateClassifier(c)) => {
                    rules.push(Arc::new(Rule::compile(&c).expect("compiles")))
                }
                other => panic!("{other:?}"),
            }
        }
        let rules = Rules::new(rules);
        let route = |user: &'static str, database: Option<&'static str>| {
            let facts = Facts {
                user,
                database,
                ..facts()
            };
            rules.route(&facts).map(|r| r.workload.clone())
        };
        assert_eq!(route("u299", None).as_deref(), Some("w299"));
        assert_eq!(route("u3", Some("shop")).as_deref(), Some("w3"));
        assert_eq!(route("u290", Some("shop")).as_deref(), Some("w280"));
        assert_eq!(route("nobody", None).as_deref(), Some("w280"));
        assert_eq!(route("carol", None), None);
    }

    #[test]
    fn rules_are_tried_by_rank_then_name_and_dry_runs_only_count() {
        let compile = |sql: &str| match sluice_sql::parse_statement(sql) {
            Ok(sluice_sql::Statement::CreateClassifier(c)) => {
                Arc::new(Rule::compile(&c).expect("compiles"))
            }
            other => panic!("{other:?}"),
        };
        let rules = Rules::new(vec![
            compile("CREATE CLASSIFIER b WORKLOAD wb WHEN user = 'alice'"),
            compile("CREATE CLASSIFIER a WORKLOAD wa WHEN user = 'alice'"),
            compile("CREATE CLASSIFIER top WORKLOAD wt WHEN user = 'bob' RANK 5"),
            compile("CREATE CLASSIFIER try WORKLOAD wx WHEN database = 'shop' RANK 9 DRY RUN"),
        ]);
        let order: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(order, ["try", "top", "a", "b"]);
        let mut dry = Vec::new();
        let routed = rules.classify(&facts(), |r| dry.push(r.name.clone()));
        assert_eq!(routed.map(|r| r.workload.as_str()), Some("wa"));
        assert_eq!(dry, ["try"]);
        let counts: Vec<u64> = rules.iter().map(|r| r.stats.matches()).collect();
        assert_eq!(counts, [1, 0, 1, 0]);
        assert!(rules
            .iter()
            .next()
            .is_some_and(|r| r.stats.last_match().is_some()));
        // Routing again for a waiting statement counts nothing.
        assert_eq!(rules.route(&facts()).map(|r| r.name.as_str()), Some("a"));
        assert_eq!(rules.iter().map(|r| r.stats.matches()).sum::<u64>(), 2);
        let nobody = Facts {
            user: "carol",
            database: None,
            ..facts()
        };
        assert!(rules.classify(&nobody, |_| {}).is_none());
    }
}

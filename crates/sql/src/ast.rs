//! The dialect's statements and their canonical text.
//!
//! `Display` prints what ClickHouse stores as `create_query` (`ASTCreateWorkloadQuery::formatImpl`
//! and friends, after `normalizeCreateWorkloadEntityQuery`): `OR REPLACE`, `IF NOT EXISTS` and
//! `ON CLUSTER` are dropped, names are back-quoted when [`quote_identifier`] says so, settings keep
//! their written order and duplicates, and values print as ClickHouse's `FieldVisitorToString`.
//! Whatever `Display` prints parses back to the same statement, normalized.

use std::fmt::{self, Write as _};

/// A literal value in `SETTINGS name = value`, typed the way ClickHouse's `ParserLiteral` types it.
#[derive(Debug, Clone)]
pub enum Literal {
    /// A non-negative integer that fits in 64 bits (also `0x..` and `1_000`).
    UInt(u64),
    /// A negative integer that fits in `i64`.
    Int(i64),
    /// Anything with a point or an exponent, integers too large for 64 bits, `inf`, `nan`.
    Float(f64),
    String(String),
    Null,
    Bool(bool),
}

impl PartialEq for Literal {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Literal::UInt(a), Literal::UInt(b)) => a == b,
            (Literal::Int(a), Literal::Int(b)) => a == b,
            // Bitwise, so that NaN equals itself and -0.0 differs from 0.0: this is equality of
            // what was written, not numeric equality.
            (Literal::Float(a), Literal::Float(b)) => {
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
            }
            (Literal::String(a), Literal::String(b)) => a == b,
            (Literal::Null, Literal::Null) => true,
            (Literal::Bool(a), Literal::Bool(b)) => a == b,
            _ => false,
        }
    }
}

impl Literal {
    /// ClickHouse's name for the literal's type, as used in `BAD_GET` messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Literal::UInt(_) => "UInt64",
            Literal::Int(_) => "Int64",
            Literal::Float(_) => "Float64",
            Literal::String(_) => "String",
            Literal::Null => "Null",
            Literal::Bool(_) => "Bool",
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::UInt(v) => write!(f, "{v}"),
            Literal::Int(v) => write!(f, "{v}"),
            Literal::Float(v) => {
                // ClickHouse marks an integral float with a trailing point (`1e19` prints as
                // `10000000000000000000.`) so that it reads back as a float.
                let text = format_float(*v);
                f.write_str(&text)?;
                if text.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
                    f.write_char('.')?;
                }
                Ok(())
            }
            Literal::String(s) => write_quoted_string(f, s),
            Literal::Null => f.write_str("NULL"),
            Literal::Bool(b) => f.write_str(if *b { "true" } else { "false" }),
        }
    }
}

/// Formats a float the way ClickHouse prints a `Float64` value: the shortest digits that round
/// trip, positional between 1e-6 and 1e21, exponential (`1e21`, `1e-7`, `1.5e300`) outside,
/// `inf`, `-inf`, `nan`. This is the text `system.scheduler` shows for `weight` or `max_speed`.
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d[.ddd]e<exp>`.
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i32;
    // The value is 0.<digits> × 10^n.
    let n = exp + 1;
    let mut out = String::new();
    if v < 0.0 {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        write!(out, "e{}", n - 1).ok();
    }
    out
}

fn write_quoted_string(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_char('\'')?;
    for c in s.chars() {
        match c {
            '\'' => f.write_str("\\'")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\t' => f.write_str("\\t")?,
            '\r' => f.write_str("\\r")?,
            '\0' => f.write_str("\\0")?,
            '\u{8}' => f.write_str("\\b")?,
            '\u{c}' => f.write_str("\\f")?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('\'')
}

/// Whether ClickHouse writes this name without back-quotes (`backQuoteIfNeed`): it must look like
/// `[A-Za-z_][A-Za-z0-9_]*` and not be one of the words that would read as a keyword there.
pub fn is_bare_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !["null", "all", "distinct", "table", "select"]
            .iter()
            .any(|w| name.eq_ignore_ascii_case(w))
}

/// A name as ClickHouse prints it in `create_query`: bare, or back-quoted. A back-quote inside
/// the name is doubled (ClickHouse itself would print `` \` ``; both read back the same in
/// ClickHouse, and the doubled form is what sluice's tokenizer reads; see docs/compat.md).
#[derive(Debug, Clone, Copy)]
pub struct QuotedIdent<'a>(pub &'a str);

impl fmt::Display for QuotedIdent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if is_bare_identifier(self.0) {
            return f.write_str(self.0);
        }
        f.write_char('`')?;
        for c in self.0.chars() {
            if c == '`' {
                f.write_char('`')?;
            }
            f.write_char(c)?;
        }
        f.write_char('`')
    }
}

/// `name = value [FOR resource]` in a workload's `SETTINGS`.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingChange {
    /// Written raw, never quoted (ClickHouse does the same).
    pub name: String,
    pub value: Literal,
    /// `FOR resource`: the setting applies to that resource only.
    pub resource: Option<String>,
}

impl fmt::Display for SettingChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}", self.name, self.value)?;
        if let Some(r) = &self.resource {
            write!(f, " FOR {}", QuotedIdent(r))?;
        }
        Ok(())
    }
}

/// Clauses that do not survive normalization, kept so the catalog can act on them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateOptions {
    pub or_replace: bool,
    pub if_not_exists: bool,
    pub on_cluster: Option<String>,
}

/// ```text
/// CREATE [OR REPLACE] WORKLOAD [IF NOT EXISTS] name [ON CLUSTER c] [IN parent]
///     [SETTINGS name = literal [FOR resource] {, name = literal [FOR resource]}]
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CreateWorkload {
    pub options: CreateOptions,
    pub name: String,
    pub parent: Option<String>,
    pub settings: Vec<SettingChange>,
}

impl fmt::Display for CreateWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CREATE WORKLOAD {}", QuotedIdent(&self.name))?;
        if let Some(p) = &self.parent {
            write!(f, " IN {}", QuotedIdent(p))?;
        }
        for (i, s) in self.settings.iter().enumerate() {
            f.write_str(if i == 0 { " SETTINGS " } else { ", " })?;
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

/// A disk named in a resource's operation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DiskRef {
    Named(String),
    Any,
}

/// One operation a resource covers, in `CREATE RESOURCE r (op, …)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ResourceOperation {
    Read(DiskRef),
    Write(DiskRef),
    MasterThread,
    WorkerThread,
    Query,
    MemoryReservation,
}

/// What a resource's requests cost: one unit per resource, fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CostUnit {
    IoByte,
    CpuNanosecond,
    QuerySlot,
    MemoryByte,
}

impl CostUnit {
    /// The name `system.resources.unit` shows.
    pub fn name(self) -> &'static str {
        match self {
            CostUnit::IoByte => "IOByte",
            CostUnit::CpuNanosecond => "CPUNanosecond",
            CostUnit::QuerySlot => "QuerySlot",
            CostUnit::MemoryByte => "MemoryByte",
        }
    }

    /// Space-shared resources (memory) are allocated and evicted; the others are time-shared.
    pub fn is_space_shared(self) -> bool {
        self == CostUnit::MemoryByte
    }
}

impl ResourceOperation {
    pub fn unit(&self) -> CostUnit {
        match self {
            ResourceOperation::Read(_) | ResourceOperation::Write(_) => CostUnit::IoByte,
            ResourceOperation::MasterThread | ResourceOperation::WorkerThread => {
                CostUnit::CpuNanosecond
            }
            ResourceOperation::Query => CostUnit::QuerySlot,
            ResourceOperation::MemoryReservation => CostUnit::MemoryByte,
        }
    }
}

impl fmt::Display for ResourceOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let disk = |f: &mut fmt::Formatter<'_>, kind: &str, d: &DiskRef| match d {
            DiskRef::Named(n) => write!(f, "{kind} DISK {}", QuotedIdent(n)),
            DiskRef::Any => write!(f, "{kind} ANY DISK"),
        };
        match self {
            ResourceOperation::Read(d) => disk(f, "READ", d),
            ResourceOperation::Write(d) => disk(f, "WRITE", d),
            ResourceOperation::MasterThread => f.write_str("MASTER THREAD"),
            ResourceOperation::WorkerThread => f.write_str("WORKER THREAD"),
            ResourceOperation::Query => f.write_str("QUERY"),
            ResourceOperation::MemoryReservation => f.write_str("MEMORY RESERVATION"),
        }
    }
}

/// ```text
/// CREATE [OR REPLACE] RESOURCE [IF NOT EXISTS] name [ON CLUSTER c] (operation {, operation})
/// ```
/// The parser guarantees `operations` is non-empty and of one [`CostUnit`].
#[derive(Debug, Clone, PartialEq)]
pub struct CreateResource {
    pub options: CreateOptions,
    pub name: String,
    pub operations: Vec<ResourceOperation>,
}

impl CreateResource {
    pub fn unit(&self) -> CostUnit {
        self.operations
            .first()
            .map_or(CostUnit::IoByte, ResourceOperation::unit)
    }
}

impl fmt::Display for CreateResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CREATE RESOURCE {} (", QuotedIdent(&self.name))?;
        for (i, op) in self.operations.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{op}")?;
        }
        f.write_char(')')
    }
}

/// ```text
/// CREATE [OR REPLACE] CLASSIFIER [IF NOT EXISTS] name [ON CLUSTER c] WORKLOAD target
///     WHEN predicate [RANK n] [DRY RUN]
/// ```
/// sluice's own (ClickHouse has no classifiers): statements the predicate matches run in
/// `workload` unless they name one themselves. Rules are tried by rank, highest first, then
/// by name; the first that matches decides. A dry-run rule only counts what it would match.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateClassifier {
    pub options: CreateOptions,
    pub name: String,
    pub workload: String,
    pub predicate: Predicate,
    /// `RANK n` (0 when not written).
    pub rank: i64,
    pub dry_run: bool,
}

impl fmt::Display for CreateClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CREATE CLASSIFIER {} WORKLOAD {} WHEN {}",
            QuotedIdent(&self.name),
            QuotedIdent(&self.workload),
            self.predicate
        )?;
        if self.rank != 0 {
            write!(f, " RANK {}", self.rank)?;
        }
        if self.dry_run {
            f.write_str(" DRY RUN")?;
        }
        Ok(())
    }
}

/// Which kind of entity a statement names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntityKind {
    Workload,
    Resource,
    Classifier,
}

impl EntityKind {
    pub fn keyword(self) -> &'static str {
        match self {
            EntityKind::Workload => "WORKLOAD",
            EntityKind::Resource => "RESOURCE",
            EntityKind::Classifier => "CLASSIFIER",
        }
    }
}

/// ```text
/// DROP WORKLOAD|RESOURCE|CLASSIFIER [IF EXISTS] name [ON CLUSTER c]
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DropEntity {
    pub kind: EntityKind,
    pub if_exists: bool,
    pub name: String,
    pub on_cluster: Option<String>,
}

impl fmt::Display for DropEntity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DROP {} ", self.kind.keyword())?;
        if self.if_exists {
            f.write_str("IF EXISTS ")?;
        }
        write!(f, "{}", QuotedIdent(&self.name))
    }
}

/// A statement of the workload dialect.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    CreateWorkload(CreateWorkload),
    CreateResource(CreateResource),
    CreateClassifier(CreateClassifier),
    Drop(DropEntity),
}

impl Statement {
    /// The statement as ClickHouse stores it: `OR REPLACE`, `IF NOT EXISTS`, `ON CLUSTER` gone.
    /// (`IF EXISTS` of a drop is kept; drops are never stored.)
    pub fn normalized(&self) -> Statement {
        let mut s = self.clone();
        match &mut s {
            Statement::CreateWorkload(c) => c.options = CreateOptions::default(),
            Statement::CreateResource(c) => c.options = CreateOptions::default(),
            Statement::CreateClassifier(c) => c.options = CreateOptions::default(),
            Statement::Drop(d) => d.on_cluster = None,
        }
        s
    }

    pub fn on_cluster(&self) -> Option<&str> {
        match self {
            Statement::CreateWorkload(c) => c.options.on_cluster.as_deref(),
            Statement::CreateResource(c) => c.options.on_cluster.as_deref(),
            Statement::CreateClassifier(c) => c.options.on_cluster.as_deref(),
            Statement::Drop(d) => d.on_cluster.as_deref(),
        }
    }
}

impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Statement::CreateWorkload(c) => c.fmt(f),
            Statement::CreateResource(c) => c.fmt(f),
            Statement::CreateClassifier(c) => c.fmt(f),
            Statement::Drop(d) => d.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_clickhouse() {
        // Each pair was read off ClickHouse 26.9 (system.scheduler and create_query).
        for (v, text) in [
            (1e19, "10000000000000000000"),
            (1e20, "100000000000000000000"),
            (1e21, "1e21"),
            (1e22, "1e22"),
            (0.000001, "0.000001"),
            (1e-7, "1e-7"),
            (1.2345678901234569e23, "1.2345678901234569e23"),
            (2.5, "2.5"),
            (2e9, "2000000000"),
            (-100.5, "-100.5"),
            (9223372036854775807.0, "9223372036854776000"),
        ] {
            assert_eq!(format_float(v), text, "{v}");
        }
        assert_eq!(Literal::Float(1e19).to_string(), "10000000000000000000.");
        assert_eq!(Literal::Float(2.5).to_string(), "2.5");
        assert_eq!(Literal::Float(1e21).to_string(), "1e21");
    }

    #[test]
    fn quoting_follows_back_quote_if_need() {
        assert_eq!(QuotedIdent("all").to_string(), "`all`");
        assert_eq!(QuotedIdent("ALL").to_string(), "`ALL`");
        assert_eq!(QuotedIdent("03232_disk").to_string(), "`03232_disk`");
        assert_eq!(QuotedIdent("production").to_string(), "production");
        assert_eq!(QuotedIdent("Mixed Case").to_string(), "`Mixed Case`");
        assert_eq!(QuotedIdent("a`b").to_string(), "`a``b`");
    }

    #[test]
    fn strings_escape_like_clickhouse() {
        assert_eq!(Literal::String("1Gi".into()).to_string(), "'1Gi'");
        assert_eq!(
            Literal::String("x'y\\z\n".into()).to_string(),
            r"'x\'y\\z\n'"
        );
    }
}

// ---- Classifier predicates ----
//
// Classifier predicates: the `WHEN` of `CREATE CLASSIFIER`, a boolean over what sluice knows
// of a statement before it runs (who sent it, from where, what kind it is, its text and the
// tags in its comments), and their canonical text.
// `Display` prints a predicate so that it parses back to the same tree: attributes lower-case,
// values single-quoted with ClickHouse's escapes, keywords upper-case, and parentheses exactly
// where the tree needs them (`OR` binds loosest, then `AND`, then `NOT`; a right operand of
// the same operator is parenthesized, since the parser reads chains left to right).

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

#[cfg(test)]
mod predicate_tests {
    use super::*;

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

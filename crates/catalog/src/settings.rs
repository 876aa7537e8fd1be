//! Workload settings: names and aliases, typing and units, and resolution per resource.
//!
//! Mirrors ClickHouse's `WorkloadSettings::initFromChanges` (reference §3): each change is read
//! into one of two bags, `regular` (no `FOR`) or `specific` (`FOR` this resource); changes `FOR`
//! other resources are skipped; within a bag a later change wins; the resolved value is
//! `specific ?? regular ?? default`.

use sluice_sql::{format_float, CostUnit, Error, ErrorCode, Literal, Result, SettingChange};

/// "Unlimited" for integer limits, as ClickHouse stores it.
pub const UNLIMITED: i64 = i64::MAX;

/// How a setting's value is read from its literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ValueKind {
    /// `getFloat64`: numbers, or a string with a size suffix; finite; not negative.
    Float,
    /// `getInt64`: integers (UInt64 saturated), or a string with a size suffix; not negative.
    Int,
    /// `safeGet<Int64>`: integers only (UInt64 reinterpreted), negatives allowed.
    Ordinal,
}

/// Every workload setting ClickHouse 26.9 accepts, with its aliases (the 24.10 names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Weight,
    Priority,
    Precedence,
    MaxIoRequests,
    MaxBytesInflight,
    MaxBytesPerSecond,
    MaxBurstBytes,
    MaxConcurrentThreads,
    MaxConcurrentThreadsRatioToCores,
    MaxCpus,
    MaxCpuShare,
    MaxBurstCpuSeconds,
    MaxConcurrentQueries,
    MaxQueriesPerSecond,
    MaxBurstQueries,
    MaxWaitingQueries,
    MaxMemory,
    MaxMemoryRatio,
    /// sluice's own: the share of its parent's dequeues a workload keeps while a sibling of
    /// higher priority has work (0 to 1; 0, the default, is ClickHouse's strict priority).
    OutrankedShare,
}

impl Setting {
    pub const ALL: [Setting; 19] = [
        Setting::Weight,
        Setting::Priority,
        Setting::Precedence,
        Setting::MaxIoRequests,
        Setting::MaxBytesInflight,
        Setting::MaxBytesPerSecond,
        Setting::MaxBurstBytes,
        Setting::MaxConcurrentThreads,
        Setting::MaxConcurrentThreadsRatioToCores,
        Setting::MaxCpus,
        Setting::MaxCpuShare,
        Setting::MaxBurstCpuSeconds,
        Setting::MaxConcurrentQueries,
        Setting::MaxQueriesPerSecond,
        Setting::MaxBurstQueries,
        Setting::MaxWaitingQueries,
        Setting::MaxMemory,
        Setting::MaxMemoryRatio,
        Setting::OutrankedShare,
    ];

    /// The canonical name and its aliases.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Setting::Weight => &["weight"],
            Setting::Priority => &["priority"],
            Setting::Precedence => &["precedence"],
            Setting::MaxIoRequests => &["max_io_requests", "max_requests"],
            Setting::MaxBytesInflight => &["max_bytes_inflight", "max_cost"],
            Setting::MaxBytesPerSecond => &["max_bytes_per_second", "max_speed"],
            Setting::MaxBurstBytes => &["max_burst_bytes", "max_burst"],
            Setting::MaxConcurrentThreads => &["max_concurrent_threads"],
            Setting::MaxConcurrentThreadsRatioToCores => &["max_concurrent_threads_ratio_to_cores"],
            Setting::MaxCpus => &["max_cpus"],
            Setting::MaxCpuShare => &["max_cpu_share"],
            Setting::MaxBurstCpuSeconds => &["max_burst_cpu_seconds"],
            Setting::MaxConcurrentQueries => &["max_concurrent_queries"],
            Setting::MaxQueriesPerSecond => &["max_queries_per_second"],
            Setting::MaxBurstQueries => &["max_burst_queries"],
            Setting::MaxWaitingQueries => &["max_waiting_queries"],
            Setting::MaxMemory => &["max_memory"],
            Setting::MaxMemoryRatio => &["max_memory_ratio"],
            Setting::OutrankedShare => &["outranked_share"],
        }
    }

    pub fn name(self) -> &'static str {
        self.names()[0]
    }

    /// Setting names are case-sensitive in ClickHouse.
    pub fn from_name(name: &str) -> Option<Setting> {
        Setting::ALL.into_iter().find(|s| s.names().contains(&name))
    }

    fn kind(self) -> ValueKind {
        match self {
            Setting::Priority | Setting::Precedence => ValueKind::Ordinal,
            Setting::MaxIoRequests
            | Setting::MaxBytesInflight
            | Setting::MaxConcurrentThreads
            | Setting::MaxConcurrentQueries
            | Setting::MaxWaitingQueries
            | Setting::MaxMemory => ValueKind::Int,
            _ => ValueKind::Float,
        }
    }

    /// The resource units this setting has an effect on (others ignore it silently).
    pub fn applies_to(self, unit: CostUnit) -> bool {
        use CostUnit::*;
        match self {
            Setting::Weight => true,
            Setting::Priority => unit != MemoryByte,
            Setting::Precedence => unit == MemoryByte,
            Setting::MaxIoRequests
            | Setting::MaxBytesInflight
            | Setting::MaxBytesPerSecond
            | Setting::MaxBurstBytes => unit == IoByte,
            Setting::MaxConcurrentThreads
            | Setting::MaxConcurrentThreadsRatioToCores
            | Setting::MaxCpus
            | Setting::MaxCpuShare
            | Setting::MaxBurstCpuSeconds => unit == CpuNanosecond,
            Setting::MaxConcurrentQueries
            | Setting::MaxQueriesPerSecond
            | Setting::MaxBurstQueries => unit == QuerySlot,
            Setting::MaxWaitingQueries => matches!(unit, QuerySlot | MemoryByte),
            Setting::MaxMemory | Setting::MaxMemoryRatio => unit == MemoryByte,
            Setting::OutrankedShare => unit != MemoryByte,
        }
    }

    /// Whether the setting is sluice's own (ClickHouse 26.9 has no such setting; strict mode
    /// refuses it).
    pub fn is_extension(self) -> bool {
        self == Setting::OutrankedShare
    }
}

/// A setting's value after typing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Float(f64),
    Int(i64),
}

fn bad_get(literal: &Literal, requested: &str) -> Error {
    Error::new(
        ErrorCode::BadGet,
        format!(
            "Bad get: has {}, requested {requested}",
            literal.type_name()
        ),
    )
}

fn negative(shown: &str, setting: &str) -> Error {
    Error::bad_arguments(format!(
        "Unexpected negative value {shown} for workload setting '{setting}'"
    ))
}

/// Reads an integer with an optional size suffix the way ClickHouse's `parseWithSizeSuffix<Int64>`
/// does: `k M G T` are powers of 1000, `Ki Mi Gi Ti` powers of 1024, nothing may follow, no
/// fractions. Overflow wraps, as ClickHouse's `readIntText` does.
pub fn parse_with_size_suffix(s: &str) -> Result<i64> {
    if s.is_empty() {
        return Err(Error::new(
            ErrorCode::AttemptToReadAfterEof,
            "Attempt to read after eof",
        ));
    }
    let b = s.as_bytes();
    let mut i = 0;
    let mut sign: i64 = 1;
    if b[0] == b'-' || b[0] == b'+' {
        sign = if b[0] == b'-' { -1 } else { 1 };
        i = 1;
    }
    let mut v: i64 = 0;
    while i < b.len() && b[i].is_ascii_digit() {
        v = v.wrapping_mul(10).wrapping_add(i64::from(b[i] - b'0'));
        i += 1;
    }
    v = v.wrapping_mul(sign);
    if i < b.len() {
        let power = match b[i] {
            b'k' | b'K' => Some(1u32),
            b'M' => Some(2),
            b'G' => Some(3),
            b'T' => Some(4),
            _ => None,
        };
        if let Some(p) = power {
            i += 1;
            let base: i64 = if i < b.len() && b[i] == b'i' {
                i += 1;
                1024
            } else {
                1000
            };
            v = v.wrapping_mul(base.wrapping_pow(p));
        }
    }
    if i < b.len() {
        let rest = &s[i..];
        return Err(Error::new(
            ErrorCode::CannotParseInputAssertionFailed,
            format!(
                "Cannot parse input: expected 'eof' before: '{}'",
                rest.replace('\\', "\\\\").replace('\'', "\\'")
            ),
        ));
    }
    Ok(v)
}

/// Types one change's value. `name` is the setting as written (an alias stays an alias in
/// messages, as in ClickHouse).
fn read_value(setting: Setting, name: &str, literal: &Literal) -> Result<Value> {
    match setting.kind() {
        ValueKind::Float => {
            let v = match literal {
                Literal::UInt(v) => *v as f64,
                Literal::Int(v) => *v as f64,
                Literal::String(s) => parse_with_size_suffix(s)? as f64,
                Literal::Float(v) if v.is_finite() => *v,
                Literal::Float(v) => {
                    return Err(Error::new(
                        ErrorCode::CannotParseNumber,
                        format!(
                        "Float setting value must be finite, got {} for workload setting '{name}'",
                        format_float(*v)
                    ),
                    ))
                }
                other => return Err(bad_get(other, "Float64")),
            };
            if v < 0.0 {
                return Err(match literal {
                    Literal::Float(_) => Error::bad_arguments(format!(
                        "Unexpected negative Float64 value for workload setting '{name}'"
                    )),
                    _ => negative(&format_float(v), name),
                });
            }
            Ok(Value::Float(v))
        }
        ValueKind::Int => {
            let v = match literal {
                Literal::UInt(v) => i64::try_from(*v).unwrap_or(i64::MAX),
                Literal::Int(v) => *v,
                Literal::String(s) => parse_with_size_suffix(s)?,
                // ClickHouse's Field reads a Bool as the integer 0 or 1 here (not as a Float64).
                Literal::Bool(b) => i64::from(*b),
                other => return Err(bad_get(other, "Int64")),
            };
            if v < 0 {
                return Err(negative(&v.to_string(), name));
            }
            Ok(Value::Int(v))
        }
        ValueKind::Ordinal => match literal {
            // ClickHouse's Field lets UInt64 be read as Int64 bit for bit.
            Literal::UInt(v) => Ok(Value::Int(*v as i64)),
            Literal::Int(v) => Ok(Value::Int(*v)),
            Literal::Bool(b) => Ok(Value::Int(i64::from(*b))),
            other => Err(bad_get(other, "Int64")),
        },
    }
}

/// Settings of one workload, resolved for one resource (or for none: only the changes
/// without `FOR`). Integer limits use [`UNLIMITED`]; "0 means unlimited" is already applied.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSettings {
    pub weight: f64,
    pub priority: i64,
    pub precedence: i64,
    pub max_io_requests: i64,
    pub max_bytes_inflight: i64,
    pub max_bytes_per_second: f64,
    pub max_burst_bytes: f64,
    pub max_concurrent_threads: i64,
    pub max_concurrent_threads_ratio_to_cores: f64,
    pub max_cpus: f64,
    pub max_cpu_share: f64,
    pub max_burst_cpu_seconds: f64,
    pub max_concurrent_queries: i64,
    pub max_queries_per_second: f64,
    pub max_burst_queries: f64,
    pub max_waiting_queries: i64,
    pub max_memory: i64,
    pub max_memory_ratio: f64,
    pub outranked_share: f64,
}

impl Default for WorkloadSettings {
    fn default() -> Self {
        WorkloadSettings {
            weight: 1.0,
            priority: 0,
            precedence: 0,
            max_io_requests: UNLIMITED,
            max_bytes_inflight: UNLIMITED,
            max_bytes_per_second: 0.0,
            max_burst_bytes: 0.0,
            max_concurrent_threads: UNLIMITED,
            max_concurrent_threads_ratio_to_cores: 0.0,
            max_cpus: 0.0,
            max_cpu_share: 0.0,
            max_burst_cpu_seconds: 1.0,
            max_concurrent_queries: UNLIMITED,
            max_queries_per_second: 0.0,
            max_burst_queries: 0.0,
            max_waiting_queries: UNLIMITED,
            max_memory: UNLIMITED,
            max_memory_ratio: 0.0,
            outranked_share: 0.0,
        }
    }
}

impl WorkloadSettings {
    /// Types and validates `changes` and resolves them for `resource` (`None`: only the changes
    /// without `FOR` are read, which is how ClickHouse validates a statement before it looks at
    /// the resources it names). Errors come in the order of the changes.
    pub fn resolve(changes: &[SettingChange], resource: Option<&str>) -> Result<Self> {
        let mut regular: Vec<(Setting, Value)> = Vec::new();
        let mut specific: Vec<(Setting, Value)> = Vec::new();
        for change in changes
            .iter()
            .filter(|c| !crate::lanes::is_lane_setting(&c.name))
        {
            let bag = match (&change.resource, resource) {
                (None, _) => &mut regular,
                (Some(r), Some(target)) if r == target => &mut specific,
                _ => continue,
            };
            let setting = Setting::from_name(&change.name).ok_or_else(|| {
                Error::bad_arguments(format!("Unknown workload setting '{}'", change.name))
            })?;
            let value = read_value(setting, &change.name, &change.value)?;
            bag.push((setting, value));
        }
        let lookup = |s: Setting| -> Option<Value> {
            let last =
                |bag: &[(Setting, Value)]| bag.iter().rev().find(|(k, _)| *k == s).map(|(_, v)| *v);
            last(&specific).or_else(|| last(&regular))
        };
        let float = |s: Setting, default: f64| match lookup(s) {
            Some(Value::Float(v)) => v,
            Some(Value::Int(v)) => v as f64,
            None => default,
        };
        // Zero means unlimited for semaphore and queue limits.
        let limit = |s: Setting| match lookup(s) {
            Some(Value::Int(v)) if v > 0 => v,
            _ => UNLIMITED,
        };
        let ordinal = |s: Setting| match lookup(s) {
            Some(Value::Int(v)) => v,
            _ => 0,
        };
        let d = WorkloadSettings::default();
        let max_bytes_per_second = float(Setting::MaxBytesPerSecond, 0.0);
        let max_queries_per_second = float(Setting::MaxQueriesPerSecond, 0.0);
        let settings = WorkloadSettings {
            weight: float(Setting::Weight, d.weight),
            priority: ordinal(Setting::Priority),
            precedence: ordinal(Setting::Precedence),
            max_io_requests: limit(Setting::MaxIoRequests),
            max_bytes_inflight: limit(Setting::MaxBytesInflight),
            max_bytes_per_second,
            // The burst defaults to one second's worth of the rate.
            max_burst_bytes: float(Setting::MaxBurstBytes, max_bytes_per_second),
            max_concurrent_threads: limit(Setting::MaxConcurrentThreads),
            max_concurrent_threads_ratio_to_cores: float(
                Setting::MaxConcurrentThreadsRatioToCores,
                0.0,
            ),
            max_cpus: float(Setting::MaxCpus, 0.0),
            max_cpu_share: float(Setting::MaxCpuShare, 0.0),
            max_burst_cpu_seconds: float(Setting::MaxBurstCpuSeconds, d.max_burst_cpu_seconds),
            max_concurrent_queries: limit(Setting::MaxConcurrentQueries),
            max_queries_per_second,
            max_burst_queries: float(Setting::MaxBurstQueries, max_queries_per_second),
            max_waiting_queries: limit(Setting::MaxWaitingQueries),
            max_memory: limit(Setting::MaxMemory),
            max_memory_ratio: float(Setting::MaxMemoryRatio, 0.0),
            outranked_share: float(Setting::OutrankedShare, 0.0),
        };
        if settings.outranked_share > 1.0 {
            return Err(Error::bad_arguments(format!(
                "outranked_share is a fraction of the parent's dequeues, from 0 to 1: got {}",
                format_float(settings.outranked_share)
            )));
        }
        // ClickHouse checks the weight when it builds a node from these settings.
        if settings.weight <= 0.0 {
            return Err(Error::new(
                ErrorCode::InvalidSchedulerNode,
                format!(
                    "Zero, negative and non-finite node weights are not allowed: {}",
                    // -0.0 prints as 0, as in ClickHouse.
                    format_float(settings.weight + 0.0)
                ),
            ));
        }
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sql::{parse_statement, Statement};

    fn changes(sql: &str) -> Vec<SettingChange> {
        match parse_statement(&format!("CREATE WORKLOAD w SETTINGS {sql}")) {
            Ok(Statement::CreateWorkload(c)) => c.settings,
            other => panic!("{other:?}"),
        }
    }

    fn code(sql: &str, resource: Option<&str>) -> ErrorCode {
        match WorkloadSettings::resolve(&changes(sql), resource) {
            Ok(s) => panic!("{sql} gave {s:?}"),
            Err(e) => e.code,
        }
    }

    #[test]
    fn size_suffixes() {
        assert_eq!(parse_with_size_suffix("2Gi"), Ok(2147483648));
        assert_eq!(parse_with_size_suffix("10Mi"), Ok(10485760));
        assert_eq!(parse_with_size_suffix("1G"), Ok(1_000_000_000));
        assert_eq!(parse_with_size_suffix("5k"), Ok(5000));
        assert_eq!(parse_with_size_suffix("100"), Ok(100));
        assert_eq!(parse_with_size_suffix("-5"), Ok(-5));
        for bad in ["213MB", "1.5G", " 5", "1P"] {
            assert_eq!(
                parse_with_size_suffix(bad).map_err(|e| e.code),
                Err(ErrorCode::CannotParseInputAssertionFailed),
                "{bad}"
            );
        }
        assert_eq!(
            parse_with_size_suffix("").map_err(|e| e.code),
            Err(ErrorCode::AttemptToReadAfterEof)
        );
    }

    #[test]
    fn for_bags_and_burst_defaults() {
        let c = changes(
            "max_bytes_inflight = 1000000, max_bytes_inflight = 2000000 FOR x, max_speed = 100",
        );
        let none = WorkloadSettings::resolve(&c, None).unwrap_or_default();
        assert_eq!(none.max_bytes_inflight, 1000000);
        assert_eq!(none.max_burst_bytes, 100.0);
        let x = WorkloadSettings::resolve(&c, Some("x")).unwrap_or_default();
        assert_eq!(x.max_bytes_inflight, 2000000);
        let y = WorkloadSettings::resolve(&c, Some("y")).unwrap_or_default();
        assert_eq!(y.max_bytes_inflight, 1000000);
        let z =
            WorkloadSettings::resolve(&changes("max_io_requests = 0"), None).unwrap_or_default();
        assert_eq!(z.max_io_requests, UNLIMITED);
    }

    #[test]
    fn errors_match_clickhouse_codes() {
        assert_eq!(code("priority = 'invalid_value'", None), ErrorCode::BadGet);
        assert_eq!(code("weight = 0", None), ErrorCode::InvalidSchedulerNode);
        assert_eq!(code("weight = -1", None), ErrorCode::BadArguments);
        assert_eq!(code("max_speed = -1", None), ErrorCode::BadArguments);
        assert_eq!(code("unknown_setting = 42", None), ErrorCode::BadArguments);
        assert_eq!(code("max_io_requests = 1.5", None), ErrorCode::BadGet);
        assert_eq!(code("max_cpus = inf", None), ErrorCode::CannotParseNumber);
        assert_eq!(code("weight = NULL", None), ErrorCode::BadGet);
        assert_eq!(
            code("max_memory = '213MB'", None),
            ErrorCode::CannotParseInputAssertionFailed
        );
        assert_eq!(
            code("weight = -1 FOR q", Some("q")),
            ErrorCode::BadArguments
        );
        // Changes for other resources are not looked at.
        assert!(WorkloadSettings::resolve(&changes("weight = -1 FOR q"), None).is_ok());
    }
}

//! The settings sluice reads from a client: a query's `SETTINGS` tail (each value read as
//! ClickHouse 26.9 reads its setting's type, with its codes) and the `-c` settings of a
//! start-up's `options`; which of them are sluice's own ([`KNOWN_SETTINGS`]), the rest being
//! the engine's or the upstream's.

use std::time::Duration;

use sluice_sql::{Error, ErrorCode, Literal, Result};

/// Query-level settings sluice honours (the `SETTINGS` tail).
#[derive(Debug, Default)]
pub(crate) struct QuerySettings {
    pub(crate) workload: Option<String>,
    pub(crate) max_threads: Option<usize>,
    pub(crate) max_execution_time: Option<Duration>,
    /// `workload_admission_timeout_ms`: `Some(ZERO)` is "no limit", written explicitly.
    pub(crate) admission_timeout: Option<Duration>,
    /// `use_concurrency_control = 0`: CPU slots are not asked for (ClickHouse's bypass).
    pub(crate) no_concurrency_control: bool,
    /// `reserve_memory`: bytes the statement's allocation must be admitted with.
    pub(crate) reserve_memory: u64,
    /// `max_memory_usage`: the most the statement may hold (0: no cap).
    pub(crate) max_memory_usage: u64,
}

pub(crate) const KNOWN_SETTINGS: &[&str] = &[
    "workload",
    "workload_admission_timeout_ms",
    "max_threads",
    "reserve_memory",
    "max_memory_usage",
    "max_execution_time",
    "use_concurrency_control",
];

/// A query's `SETTINGS`, each value read as ClickHouse 26.9 reads a value of its setting's
/// type, refused with ClickHouse's code where ClickHouse refuses it (the codes are checked
/// against ClickHouse itself: `tests/query_settings/settings.expected`).
pub(crate) fn query_settings(settings: &[(String, Literal)]) -> Result<QuerySettings> {
    let mut out = QuerySettings::default();
    for (name, value) in settings {
        if !KNOWN_SETTINGS.contains(&name.as_str()) {
            return Err(Error::new(
                ErrorCode::UnknownSetting,
                format!(
                    "Unknown setting '{name}'; sluice honours: {}",
                    KNOWN_SETTINGS.join(", ")
                ),
            ));
        }
        let mut read = || -> Result<()> {
            match name.as_str() {
                "workload" => out.workload = Some(setting_string(value)?),
                // `0` and `'auto'`: as many as the workload grants.
                "max_threads" => out.max_threads = Some(setting_uint(value, true)? as usize),
                "workload_admission_timeout_ms" => {
                    out.admission_timeout =
                        Some(Duration::from_millis(setting_uint(value, false)?));
                }
                // Seconds; zero or less is no limit.
                "max_execution_time" => {
                    let s = setting_seconds(value)?;
                    out.max_execution_time = (s > 0.0).then(|| Duration::from_secs_f64(s));
                }
                "use_concurrency_control" => out.no_concurrency_control = !setting_bool(value)?,
                "reserve_memory" => out.reserve_memory = setting_uint(value, false)?,
                "max_memory_usage" => out.max_memory_usage = setting_uint(value, false)?,
                _ => unreachable!("every known setting is handled"),
            }
            Ok(())
        };
        // A bad value for a parameter, to a Postgres client.
        read().map_err(|e| e.with_sqlstate("22023"))?;
    }
    Ok(out)
}

/// A String setting's value: any other literal is ClickHouse's BAD_GET.
fn setting_string(value: &Literal) -> Result<String> {
    let has = match value {
        Literal::String(s) => return Ok(s.clone()),
        Literal::UInt(_) => "UInt64",
        Literal::Int(_) => "Int64",
        Literal::Float(_) => "Float64",
        Literal::Bool(_) => "Bool",
        Literal::Null => "Null",
    };
    Err(Error::new(
        ErrorCode::BadGet,
        format!("Bad get: has {has}, requested String"),
    ))
}

/// An unsigned setting's value (`UInt64`; `auto`: `MaxThreads`, where `'auto'` is 0): a float
/// is truncated, a string read with its size suffix (`'10G'`, `'1Gi'`).
fn setting_uint(value: &Literal, auto: bool) -> Result<u64> {
    let out_of_range = || {
        Error::new(
            ErrorCode::CannotConvertType,
            "Cannot convert out of range floating point value to integer type",
        )
    };
    match value {
        Literal::UInt(v) => Ok(*v),
        Literal::Bool(b) => Ok(u64::from(*b)),
        Literal::Int(v) => Err(Error::new(
            ErrorCode::CannotConvertType,
            format!("Field value {v} is out of range of unsigned long type"),
        )),
        Literal::Float(v) if v.is_finite() && *v > -1.0 && *v < u64::MAX as f64 => Ok(*v as u64),
        Literal::Float(_) => Err(out_of_range()),
        Literal::String(s) if auto && s.eq_ignore_ascii_case("auto") => Ok(0),
        Literal::String(s) if s.starts_with('-') => Err(Error::new(
            ErrorCode::CannotParseNumber,
            "Unsigned type must not contain '-' symbol",
        )),
        Literal::String(s) => sluice_catalog::parse_with_size_suffix(s).map(|v| v as u64),
        Literal::Null => Err(Error::new(
            ErrorCode::CannotConvertType,
            "Invalid value NULL of the setting, which needs unsigned long",
        )),
    }
}

/// A `Seconds` setting's value: any number (a negative one too); a string must be one.
fn setting_seconds(value: &Literal) -> Result<f64> {
    match value {
        Literal::UInt(v) => Ok(*v as f64),
        Literal::Int(v) => Ok(*v as f64),
        Literal::Float(v) => Ok(*v),
        Literal::Bool(b) => Ok(f64::from(u8::from(*b))),
        Literal::String(s) => {
            let s = s.trim();
            let number_end = s
                .char_indices()
                .find(|&(i, c)| {
                    !(c.is_ascii_digit()
                        || c == '.'
                        || ((c == '-' || c == '+') && i == 0)
                        || ((c == 'e' || c == 'E') && i > 0))
                })
                .map_or(s.len(), |(i, _)| i);
            match s[..number_end].parse::<f64>() {
                Ok(_) if number_end < s.len() => Err(Error::new(
                    ErrorCode::CannotParseInputAssertionFailed,
                    format!(
                        "Cannot parse input: expected 'eof' before: '{}'",
                        &s[number_end..]
                    ),
                )),
                Ok(v) => Ok(v),
                Err(_) => Err(Error::new(
                    ErrorCode::CannotParseNumber,
                    format!("Cannot read floating point value here: {s}"),
                )),
            }
        }
        Literal::Null => Err(Error::new(
            ErrorCode::CannotConvertType,
            "Invalid value NULL of the setting, which needs double",
        )),
    }
}

/// A `Bool` setting's value: 0 or 1 (as a number or `true`/`false`), or a string ClickHouse
/// reads as one.
fn setting_bool(value: &Literal) -> Result<bool> {
    match value {
        Literal::Bool(b) => Ok(*b),
        Literal::UInt(v @ (0 | 1)) => Ok(*v == 1),
        Literal::UInt(v) => Err(Error::new(
            ErrorCode::CannotConvertType,
            format!("Field value {v} is out of range of bool type"),
        )),
        Literal::Int(v) => Err(Error::new(
            ErrorCode::CannotConvertType,
            format!("Field value {v} is out of range of bool type"),
        )),
        Literal::Float(v) if *v == 0.0 || *v == 1.0 => Ok(*v == 1.0),
        Literal::Float(_) => Err(Error::new(
            ErrorCode::CannotConvertType,
            "Cannot convert out of range floating point value to integer type",
        )),
        Literal::String(s) => match s.to_ascii_lowercase().as_str() {
            "1" | "true" => Ok(true),
            "0" | "false" => Ok(false),
            _ => Err(Error::new(
                ErrorCode::CannotParseBool,
                format!("Cannot parse bool from string '{s}'"),
            )),
        },
        Literal::Null => Err(Error::new(
            ErrorCode::CannotConvertType,
            "Invalid value NULL of the setting, which needs bool",
        )),
    }
}

/// The settings in a start-up packet's `options` (`-c name=value`, `--name=value`), names
/// lower-cased.
pub(crate) fn startup_settings(options: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut parts = options.split_whitespace();
    while let Some(part) = parts.next() {
        let assignment = if part == "-c" {
            parts.next().unwrap_or("")
        } else {
            part.trim_start_matches("--").trim_start_matches("-c")
        };
        if let Some((k, v)) = assignment.split_once('=') {
            out.push((k.to_ascii_lowercase(), v.to_string()));
        }
    }
    out
}

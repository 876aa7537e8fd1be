//! sluice's own workload settings, beyond ClickHouse's: the lanes a query runs in.
//!
//! - `demote_after` (a duration: seconds as a number, or `'500ms'`, `'20s'`, `'5m'`, `'1h'`):
//!   a query still running after this long is moved, with everything it holds, to
//!   `demote_to` (a leaf workload). A soft deadline: the query is never stopped or restarted.
//! - `relearn_after` (an integer ≥ 1, default 5): a statement once demoted is admitted straight
//!   into `demote_to` until this many of its runs in a row finish within `demote_after`.
//! - `max_execution_time` (a duration): the hard limit. A query still running after it fails
//!   with `TIMEOUT_EXCEEDED`; the query setting of the same name wins over the workload's.
//!
//! A workload's lane settings hold for the queries of every leaf below it; a leaf's own
//! setting wins over an ancestor's ([`Catalog::lanes`](crate::Catalog::lanes)). They are one
//! per workload: `FOR resource` is refused on them. [`check`] holds the catalog-wide rules
//! (targets exist and are leaves, deadlines come with targets, no demotion returns where it
//! started), run on every change.

use std::time::Duration;

use sluice_sql::{Error, ErrorCode, Literal, Result, SettingChange};

use crate::Catalog;

/// The names of sluice's lane settings.
pub const LANE_SETTINGS: [&str; 4] = [
    "demote_after",
    "demote_to",
    "relearn_after",
    "max_execution_time",
];

/// The default of `relearn_after`.
pub const DEFAULT_RELEARN_AFTER: u32 = 5;

/// Whether `name` is one of sluice's lane settings (not ClickHouse's).
pub fn is_lane_setting(name: &str) -> bool {
    LANE_SETTINGS.contains(&name)
}

/// The lane settings one workload writes itself (each `None` when it does not).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnLanes {
    pub demote_after: Option<Duration>,
    pub demote_to: Option<String>,
    pub relearn_after: Option<u32>,
    pub max_execution_time: Option<Duration>,
}

/// The lane settings in force for a leaf's queries, after inheritance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lanes {
    /// The soft deadline and where it sends a query; `None` when the leaf has none (or its
    /// inherited target is the leaf itself).
    pub demotion: Option<Demotion>,
    /// The hard limit, when the workload sets one.
    pub max_execution_time: Option<Duration>,
}

/// Where and when a query is demoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demotion {
    pub after: Duration,
    pub to: String,
    pub relearn_after: u32,
}

impl OwnLanes {
    /// Reads the lane settings among `changes` (a later change wins), validating each.
    pub fn read(changes: &[SettingChange]) -> Result<OwnLanes> {
        let mut out = OwnLanes::default();
        for change in changes.iter().filter(|c| is_lane_setting(&c.name)) {
            if let Some(resource) = &change.resource {
                return Err(Error::bad_arguments(format!(
                    "Workload setting '{}' is one per workload, not per resource: remove 'FOR {resource}'",
                    change.name
                )));
            }
            match change.name.as_str() {
                "demote_after" => {
                    out.demote_after = Some(positive_duration(&change.name, &change.value)?)
                }
                "max_execution_time" => {
                    out.max_execution_time = Some(positive_duration(&change.name, &change.value)?)
                }
                "demote_to" => match &change.value {
                    Literal::String(s) if !s.is_empty() => out.demote_to = Some(s.clone()),
                    other => {
                        return Err(Error::bad_arguments(format!(
                            "Workload setting 'demote_to' takes a workload name as a string, like demote_to = 'slow'; got {other}"
                        )))
                    }
                },
                _ => {
                    let n = match &change.value {
                        Literal::UInt(n) if *n >= 1 => u32::try_from(*n).unwrap_or(u32::MAX),
                        other => {
                            return Err(Error::bad_arguments(format!(
                                "Workload setting 'relearn_after' takes a whole number of runs, at least 1; got {other}"
                            )))
                        }
                    };
                    out.relearn_after = Some(n);
                }
            }
        }
        Ok(out)
    }
}

/// A duration as a lane setting takes it: seconds as a number, or a string with a unit (`ms`,
/// `s`, `m`, `h`; a bare number in a string is seconds). Must be greater than zero.
pub fn parse_duration(name: &str, value: &Literal) -> Result<Duration> {
    let bad = |why: &str| {
        Error::bad_arguments(format!(
            "Workload setting '{name}' takes a duration — seconds, or a string like '500ms', '20s', '5m', '1h' — {why}; got {value}"
        ))
    };
    let seconds = match value {
        Literal::UInt(n) => *n as f64,
        Literal::Float(f) => *f,
        Literal::Int(_) => return Err(bad("not negative")),
        Literal::String(s) => {
            let s = s.trim();
            let split = s
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(s.len());
            let (number, unit) = s.split_at(split);
            let number: f64 = number.parse().map_err(|_| bad("a number first"))?;
            let scale = match unit.trim() {
                "ms" => 0.001,
                "" | "s" | "sec" => 1.0,
                "m" | "min" => 60.0,
                "h" => 3600.0,
                _ => return Err(bad("with a unit of ms, s, m or h")),
            };
            number * scale
        }
        _ => return Err(bad("as a number or a string")),
    };
    if !seconds.is_finite() || seconds > 1e9 {
        return Err(bad("of at most 10^9 seconds"));
    }
    Ok(Duration::from_secs_f64(seconds.max(0.0)))
}

fn positive_duration(name: &str, value: &Literal) -> Result<Duration> {
    let d = parse_duration(name, value)?;
    if d.is_zero() {
        return Err(Error::bad_arguments(format!(
            "Workload setting '{name}' must be greater than zero; to have none, leave it out"
        )));
    }
    Ok(d)
}

/// The lane settings `workload` writes or inherits: for each, the nearest of it and its
/// ancestors that writes it decides.
fn inherited(catalog: &Catalog, workload: &str) -> Result<OwnLanes> {
    let mut own = OwnLanes::default();
    for name in std::iter::once(workload).chain(catalog.ancestors(workload)) {
        let Some(w) = catalog.workload(name) else {
            continue;
        };
        let theirs = OwnLanes::read(&w.settings)?;
        own.demote_after = own.demote_after.or(theirs.demote_after);
        own.demote_to = own.demote_to.or(theirs.demote_to);
        own.relearn_after = own.relearn_after.or(theirs.relearn_after);
        own.max_execution_time = own.max_execution_time.or(theirs.max_execution_time);
    }
    Ok(own)
}

/// The settings of `workload` resolved with its ancestors' (see [`inherited`]).
pub(crate) fn resolve(catalog: &Catalog, workload: &str) -> Lanes {
    // Validated when stored: a stored workload's settings always read.
    let own = inherited(catalog, workload).unwrap_or_default();
    let demotion = match (own.demote_after, own.demote_to) {
        (Some(after), Some(to)) if to != workload => Some(Demotion {
            after,
            to,
            relearn_after: own.relearn_after.unwrap_or(DEFAULT_RELEARN_AFTER),
        }),
        _ => None,
    };
    Lanes {
        demotion,
        max_execution_time: own.max_execution_time,
    }
}

/// The catalog-wide rules on lane settings, checked after each change (on the candidate
/// snapshot, so a refused change leaves nothing behind):
/// - `demote_to` names an existing workload that is a leaf;
/// - every leaf has both `demote_after` and `demote_to` in force, or neither;
/// - following demotions from any leaf never comes back to a workload already passed.
pub(crate) fn check(catalog: &Catalog) -> Result<()> {
    for w in catalog.workloads() {
        let own = OwnLanes::read(&w.settings)?;
        if let Some(target) = &own.demote_to {
            match catalog.get(target).map(|s| &s.entity) {
                Some(crate::Entity::Workload(_)) => {}
                Some(_) => {
                    return Err(Error::bad_arguments(format!(
                        "Workload '{}' demotes to '{target}', which is a resource, not a workload",
                        w.name
                    )))
                }
                None => {
                    return Err(Error::bad_arguments(format!(
                        "Workload '{}' demotes to workload '{target}' that doesn't exist; create '{target}' first",
                        w.name
                    )))
                }
            }
            if catalog.children_of(target).next().is_some() {
                return Err(Error::new(
                    ErrorCode::InvalidSchedulerNode,
                    format!(
                        "Workload '{}' demotes to '{target}', which has children; queries run in leaf workloads only, so demote_to must name a leaf",
                        w.name
                    ),
                ));
            }
        }
    }
    for leaf in catalog
        .workloads()
        .filter(|w| catalog.children_of(&w.name).next().is_none())
    {
        let own = inherited(catalog, &leaf.name)?;
        match (&own.demote_after, &own.demote_to) {
            (Some(_), None) => {
                return Err(Error::bad_arguments(format!(
                    "Workload '{}' has demote_after but nowhere to demote to: set demote_to = 'a leaf workload' beside it",
                    leaf.name
                )))
            }
            (None, Some(to)) => {
                return Err(Error::bad_arguments(format!(
                    "Workload '{}' demotes to '{to}' but has no demote_after: set demote_after = '20s' (or any duration) beside it",
                    leaf.name
                )))
            }
            _ => {}
        }
        let mut path = vec![leaf.name.clone()];
        let mut at = leaf.name.clone();
        while let Some(next) = resolve(catalog, &at).demotion.map(|d| d.to) {
            if path.contains(&next) {
                path.push(next);
                return Err(Error::bad_arguments(format!(
                    "Demotion cycles are not allowed: {}",
                    path.join(" → ")
                )));
            }
            path.push(next.clone());
            at = next;
        }
    }
    Ok(())
}

/// The workloads whose own `demote_to` names `target`.
pub(crate) fn demoting_to<'a>(catalog: &'a Catalog, target: &'a str) -> Vec<&'a str> {
    catalog
        .workloads()
        .filter(|w| {
            OwnLanes::read(&w.settings)
                .ok()
                .and_then(|l| l.demote_to)
                .as_deref()
                == Some(target)
        })
        .map(|w| w.name.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(sql: &str) -> Result<Catalog> {
        let mut c = Catalog::new();
        for stmt in sluice_sql::parse_script(sql) {
            c.apply_mut(&stmt.result?)?;
        }
        Ok(c)
    }

    fn error(sql: &str) -> String {
        match catalog(sql) {
            Ok(_) => panic!("accepted: {sql}"),
            Err(e) => e.message,
        }
    }

    const TREE: &str =
        "CREATE WORKLOAD all; CREATE WORKLOAD fast IN all; CREATE WORKLOAD slow IN all;";

    #[test]
    fn durations_read_as_seconds_or_with_units() {
        let d = |v: Literal| parse_duration("demote_after", &v);
        assert_eq!(d(Literal::UInt(20)), Ok(Duration::from_secs(20)));
        assert_eq!(d(Literal::Float(0.25)), Ok(Duration::from_millis(250)));
        for (s, want) in [
            ("500ms", Duration::from_millis(500)),
            ("20s", Duration::from_secs(20)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("1.5s", Duration::from_millis(1500)),
            ("30", Duration::from_secs(30)),
        ] {
            assert_eq!(d(Literal::String(s.into())), Ok(want), "{s}");
        }
        for bad in ["", "s", "5 parsecs", "-1s", "1e400"] {
            assert!(d(Literal::String(bad.into())).is_err(), "{bad}");
        }
        assert!(d(Literal::Int(-1)).is_err());
        assert!(d(Literal::Null).is_err());
    }

    #[test]
    fn a_leaf_inherits_and_overrides_its_ancestors_lanes() {
        let c = catalog(&format!(
            "{TREE} CREATE OR REPLACE WORKLOAD all SETTINGS demote_after = '20s', demote_to = 'slow', max_execution_time = '1h';
             CREATE WORKLOAD other IN all SETTINGS demote_after = 5, relearn_after = 2"
        ))
        .expect("valid");
        let fast = resolve(&c, "fast");
        assert_eq!(
            fast.demotion,
            Some(Demotion {
                after: Duration::from_secs(20),
                to: "slow".into(),
                relearn_after: DEFAULT_RELEARN_AFTER
            })
        );
        assert_eq!(fast.max_execution_time, Some(Duration::from_secs(3600)));
        // The target inherits a deadline that points at itself: no demotion there.
        assert_eq!(resolve(&c, "slow").demotion, None);
        let other = resolve(&c, "other").demotion.expect("demotes");
        assert_eq!(
            (other.after, other.relearn_after),
            (Duration::from_secs(5), 2)
        );
    }

    #[test]
    fn targets_must_exist_be_leaves_and_never_loop() {
        assert!(error(&format!(
            "{TREE} CREATE WORKLOAD x IN all SETTINGS demote_after = 1, demote_to = 'nowhere'"
        ))
        .contains("doesn't exist"));
        assert!(error(&format!(
            "{TREE} CREATE WORKLOAD x IN all SETTINGS demote_after = 1, demote_to = 'all'"
        ))
        .contains("has children"));
        assert!(error(&format!(
            "{TREE} CREATE OR REPLACE WORKLOAD fast IN all SETTINGS demote_after = 1"
        ))
        .contains("nowhere to demote to"));
        assert!(error(&format!(
            "{TREE} CREATE OR REPLACE WORKLOAD fast IN all SETTINGS demote_to = 'slow'"
        ))
        .contains("no demote_after"));
        assert!(error(&format!(
            "{TREE} CREATE OR REPLACE WORKLOAD fast IN all SETTINGS demote_after = 1, demote_to = 'slow';
             CREATE OR REPLACE WORKLOAD slow IN all SETTINGS demote_after = 1, demote_to = 'fast'"
        ))
        .contains("fast → slow → fast"));
        assert!(error(&format!(
            "{TREE} CREATE OR REPLACE WORKLOAD fast IN all SETTINGS demote_after = 1 FOR q, demote_to = 'slow'"
        ))
        .contains("not per resource"));
        assert!(error(&format!(
            "{TREE} CREATE OR REPLACE WORKLOAD fast IN all SETTINGS relearn_after = 0"
        ))
        .contains("at least 1"));
        assert!(error(&format!(
            "{TREE} CREATE OR REPLACE WORKLOAD fast IN all SETTINGS demote_after = 0, demote_to = 'slow'"
        ))
        .contains("greater than zero"));
    }

    #[test]
    fn a_stored_catalog_loads_whatever_order_its_lanes_need() {
        // The root demotes to a leaf below it: the root's file names a workload loaded after it.
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = crate::DiskStorage::open(dir.path()).expect("opens");
        let mut c = Catalog::new();
        for stmt in sluice_sql::parse_script(&format!(
            "{TREE} CREATE OR REPLACE WORKLOAD all SETTINGS demote_after = '20s', demote_to = 'slow'"
        )) {
            if let Some(change) = c.apply_mut(&stmt.result.expect("parses")).expect("valid") {
                storage.persist(&change).expect("persists");
            }
        }
        let loaded = storage.load(Catalog::new()).expect("loads");
        assert_eq!(
            loaded.lanes("fast").demotion.map(|d| d.to),
            Some("slow".into())
        );
        // A stored catalog that breaks a lane rule does not load.
        std::fs::remove_file(dir.path().join("workloads/workload_slow.sql")).expect("rm");
        let e = storage.load(Catalog::new()).expect_err("slow is gone");
        assert!(e.message.contains("doesn't exist"), "{}", e.message);
    }

    #[test]
    fn a_target_cannot_gain_children_or_be_dropped() {
        let setup = format!(
            "{TREE} CREATE OR REPLACE WORKLOAD fast IN all SETTINGS demote_after = 1, demote_to = 'slow';"
        );
        assert!(error(&format!("{setup} CREATE WORKLOAD under IN slow")).contains("has children"));
        let e = error(&format!("{setup} DROP WORKLOAD slow"));
        assert!(e.contains("referenced by: fast"), "{e}");
        // Once nothing demotes there, it goes.
        catalog(&format!(
            "{setup} CREATE OR REPLACE WORKLOAD fast IN all; DROP WORKLOAD slow"
        ))
        .expect("dropped");
    }
}

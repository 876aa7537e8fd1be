//! The demand a node of a fleet publishes in etcd (`PREFIX/fleet/demand/NODE`, written by
//! its share keeper, `fleet.rs`) and how `system.nodes` shows it and the shares: the text's
//! one format, read and written here only.
//!
//! One line per limit: `kind<TAB>workload<TAB>count<TAB>more` (`kind` a
//! [`LimitKind::name`]; `count` the queries waiting and running under a limit of slots, the
//! use of a rate in thousandths of a query per second, the queries in a bounded queue; `more`
//! 1 when the node wants more of the limit).

use std::collections::BTreeMap;

use sluice_sched::LimitKind;

/// A node's demand as published, by limit: (count, wants more).
pub type Published = BTreeMap<(LimitKind, String), (i64, bool)>;

/// One line of the text.
pub fn line(kind: LimitKind, workload: &str, count: i64, more: bool) -> String {
    format!("{}\t{workload}\t{count}\t{}\n", kind.name(), u8::from(more))
}

/// A node's published demand, read.
pub fn parse_demand(text: &str) -> Published {
    text.lines()
        .filter_map(|line| {
            let (kind, rest) = line.split_once('\t')?;
            let kind = [LimitKind::Slots, LimitKind::Rate, LimitKind::Waiting]
                .into_iter()
                .find(|k| k.name() == kind)?;
            let mut fields = rest.rsplitn(3, '\t');
            let (more, count, workload) = (fields.next()?, fields.next()?, fields.next()?);
            Some((
                (kind, workload.to_string()),
                (count.parse().ok()?, more == "1"),
            ))
        })
        .collect()
}

/// A node's published demand as `system.nodes` shows it: `workload=count` for slots,
/// `workload rate=x/s`, `workload waiting=n`, and ` (waiting)` when it wants more.
pub fn demand_shown(text: &str) -> Vec<String> {
    parse_demand(text)
        .into_iter()
        .map(|((kind, workload), (count, more))| {
            let more = if more { " (waiting)" } else { "" };
            format!("{}{more}", shown(kind.name(), &workload, count))
        })
        .collect()
}

/// One limit's amount as `system.nodes` shows it.
fn shown(kind: &str, workload: &str, amount: i64) -> String {
    match kind {
        "rate" => format!("{workload} rate={}/s", amount as f64 / 1000.0),
        "waiting" => format!("{workload} waiting={amount}"),
        _ => format!("{workload}={amount}"),
    }
}

/// A share as `system.nodes` shows it, from its limit's key in etcd.
pub fn share_shown(key: &str, amount: i64) -> String {
    match sluice_cluster::parse_limit_key(key) {
        Some((kind, workload)) => shown(kind, &workload, amount),
        None => format!("{key}={amount}"),
    }
}

/// Whether a node's published demand says it has queries waiting for slots or a queue's
/// place (a rate's waiters change no one's counts).
pub fn someone_waits(text: &str) -> bool {
    parse_demand(text)
        .iter()
        .any(|((kind, _), (_, more))| *more && *kind != LimitKind::Rate)
}

/// The limits a node's published demand says it wants more of.
pub fn wanting(text: &str) -> Vec<(LimitKind, String)> {
    parse_demand(text)
        .into_iter()
        .filter(|(_, (_, more))| *more)
        .map(|(limit, _)| limit)
        .collect()
}

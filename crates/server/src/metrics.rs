//! Prometheus metrics: per resource and workload, the queries waiting and in flight, admitted,
//! rejected and demoted, and a histogram of admission wait times; the registry of series and
//! its text form (served at `GET /metrics` by [`crate::http`]).
//!
//! Counted by the server around each admission (not read from the schedulers), so the series
//! continue across catalog changes that replace a resource's scheduler.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds of the wait-time buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0,
];

/// The counters of one (resource, workload) pair. Atomics: a query updates its series
/// without the registry's lock, which it takes once to find the series.
#[derive(Debug, Default)]
pub struct Series {
    waiting: AtomicI64,
    in_flight: AtomicI64,
    admitted: AtomicU64,
    rejected: AtomicU64,
    demoted: AtomicU64,
    /// Count per bucket (not cumulative), and one more for +Inf.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    wait_sum_ns: AtomicU64,
}

impl Series {
    /// A query starts waiting; the guard counts it until it is dropped.
    pub fn waiting(self: &Arc<Self>) -> Gauge {
        Gauge::up(self, |s| &s.waiting)
    }

    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Relaxed);
    }

    /// A query of this workload overran `demote_after` and was moved to its `demote_to`.
    pub fn demoted(&self) {
        self.demoted.fetch_add(1, Relaxed);
    }

    /// A query was admitted after `waited`; the guard counts it in flight until dropped.
    pub fn admitted(self: &Arc<Self>, waited: Duration) -> Gauge {
        let secs = waited.as_secs_f64();
        self.admitted.fetch_add(1, Relaxed);
        self.wait_sum_ns
            .fetch_add(waited.as_nanos().min(u128::from(u64::MAX)) as u64, Relaxed);
        let bucket = BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Relaxed);
        Gauge::up(self, |s| &s.in_flight)
    }

    /// Something held in this series without an admission of its own (a query moved into the
    /// workload, a worker thread taken while free): counted in flight until dropped.
    pub fn held(self: &Arc<Self>) -> Gauge {
        Gauge::up(self, |s| &s.in_flight)
    }
}

/// Holds one unit of a gauge of a series (waiting, in flight) until dropped.
#[derive(Debug)]
pub struct Gauge {
    series: Arc<Series>,
    gauge: fn(&Series) -> &AtomicI64,
}

impl Gauge {
    fn up(series: &Arc<Series>, gauge: fn(&Series) -> &AtomicI64) -> Gauge {
        gauge(series).fetch_add(1, Relaxed);
        Gauge {
            series: series.clone(),
            gauge,
        }
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        (self.gauge)(&self.series).fetch_sub(1, Relaxed);
    }
}

/// A metric family: name, type, help, and its value in a series.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Series) -> String,
);

/// The series of every (resource, workload) pair that has seen a query, and the fleet's.
#[derive(Debug, Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<String, BTreeMap<String, Arc<Series>>>>,
    /// In a fleet: what its share keeper did (`crate::fleet`).
    pub fleet: FleetCounters,
}

/// The fleet's events on this node, counted by its share keeper.
#[derive(Debug, Default)]
pub struct FleetCounters {
    /// Set once the node is in a fleet (the fleet's series are shown from then on).
    pub active: std::sync::atomic::AtomicBool,
    pub fences_passed: AtomicU64,
    pub leases_replaced: AtomicU64,
    pub shares_grown: AtomicU64,
    pub shares_lowered: AtomicU64,
    /// Rounds of the keeper that failed or were cut short (etcd did not answer).
    pub rounds_failed: AtomicU64,
    /// Changes of the fleet's catalog this node could not apply.
    pub catalog_failures: AtomicU64,
    /// Statements stopped because this node's fence passed (`[cluster] cancel_at_fence`).
    pub cancelled_at_fence: AtomicU64,
    /// DDL statements that failed for etcd (unreachable, without quorum, too slow to apply).
    pub ddl_refused: AtomicU64,
    /// This node's share of each limited workload, as stored in etcd.
    pub shares: Mutex<BTreeMap<String, i64>>,
}

impl Metrics {
    /// The series of `workload` in `resource` (made on first use).
    pub fn series(&self, resource: &str, workload: &str) -> Arc<Series> {
        let mut all = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = all.get(resource).and_then(|r| r.get(workload)) {
            return s.clone();
        }
        all.entry(resource.to_string())
            .or_default()
            .entry(workload.to_string())
            .or_default()
            .clone()
    }

    /// Queries in flight in each workload of `resource` (workloads with none left out).
    pub fn in_flight(&self, resource: &str) -> Vec<(String, i64)> {
        let all = self.series.lock().unwrap_or_else(|p| p.into_inner());
        all.get(resource)
            .into_iter()
            .flatten()
            .map(|(w, s)| (w.clone(), s.in_flight.load(Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let series: Vec<(String, String, Arc<Series>)> = self
            .series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flat_map(|(r, ws)| ws.iter().map(|(w, s)| (r.clone(), w.clone(), s.clone())))
            .collect();
        let mut out = String::new();
        let labels = |r: &str, w: &str| {
            format!(
                "resource=\"{}\",workload=\"{}\"",
                escape_label(r),
                escape_label(w)
            )
        };
        let families: [Family; 5] = [
            (
                "sluice_queries_waiting",
                "gauge",
                "Queries waiting for admission.",
                |s| s.waiting.load(Relaxed).to_string(),
            ),
            (
                "sluice_queries_in_flight",
                "gauge",
                "Queries admitted and not yet finished.",
                |s| s.in_flight.load(Relaxed).to_string(),
            ),
            (
                "sluice_queries_admitted_total",
                "counter",
                "Queries admitted.",
                |s| s.admitted.load(Relaxed).to_string(),
            ),
            (
                "sluice_queries_rejected_total",
                "counter",
                "Queries rejected with SERVER_OVERLOADED (max_waiting_queries).",
                |s| s.rejected.load(Relaxed).to_string(),
            ),
            (
                "sluice_queries_demoted_total",
                "counter",
                "Queries of this workload moved to its demote_to after running past demote_after.",
                |s| s.demoted.load(Relaxed).to_string(),
            ),
        ];
        for (name, kind, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (r, w, s) in &series {
                let _ = writeln!(out, "{name}{{{}}} {}", labels(r, w), value(s));
            }
        }
        self.render_fleet(&mut out);
        let name = "sluice_admission_wait_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from a query's arrival to its admission.\n# TYPE {name} histogram"
        );
        for (r, w, s) in &series {
            let l = labels(r, w);
            let mut cumulative = 0;
            for (i, bound) in BUCKETS.iter().enumerate() {
                cumulative += s.buckets[i].load(Relaxed);
                let _ = writeln!(out, "{name}_bucket{{{l},le=\"{bound}\"}} {cumulative}");
            }
            cumulative += s.buckets[BUCKETS.len()].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {cumulative}");
            let sum = s.wait_sum_ns.load(Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "{name}_sum{{{l}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{l}}} {cumulative}");
        }
        out
    }
}

impl Metrics {
    fn render_fleet(&self, out: &mut String) {
        let f = &self.fleet;
        if !f.active.load(Relaxed) {
            return;
        }
        let counters: [(&str, &str, &AtomicU64); 8] = [
            ("sluice_fleet_fences_passed_total", "Times this node's fence passed: its lease was in doubt, and it admitted nothing on the fleet's limits until it was renewed.", &f.fences_passed),
            ("sluice_fleet_leases_replaced_total", "Times this node's lease was lost (expired) and it joined the fleet again under a new one.", &f.leases_replaced),
            ("sluice_fleet_shares_grown_total", "Growths of this node's shares of the fleet's limits, stored in etcd.", &f.shares_grown),
            ("sluice_fleet_shares_lowered_total", "Lowerings of this node's shares of the fleet's limits, stored in etcd.", &f.shares_lowered),
            ("sluice_fleet_keeper_rounds_failed_total", "Rounds of the share keeper that failed or were cut short (etcd did not answer).", &f.rounds_failed),
            ("sluice_fleet_catalog_apply_failures_total", "Changes of the fleet's catalog this node could not apply (it reads the catalog whole again and retries, backing off to 10 s; the log says why).", &f.catalog_failures),
            ("sluice_fleet_cancelled_at_fence_total", "Statements this node stopped because its fence passed ([cluster] cancel_at_fence).", &f.cancelled_at_fence),
            ("sluice_fleet_ddl_refused_total", "DDL statements on this node that failed for etcd (KEEPER_EXCEPTION: unreachable, without quorum, or a change not applied in time).", &f.ddl_refused),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Relaxed)
            );
        }
        let name = "sluice_fleet_share";
        let _ = writeln!(
            out,
            "# HELP {name} This node's share of a workload's limit across the fleet, as stored in etcd: limit=\"slots\" (max_concurrent_queries), \"rate\" (max_queries_per_second, in queries per second; the burst in proportion), \"waiting\" (max_waiting_queries).\n# TYPE {name} gauge"
        );
        for (key, share) in f.shares.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let Some((kind, workload)) = sluice_cluster::parse_limit_key(key) else {
                continue;
            };
            let value = if kind == "rate" {
                *share as f64 / 1000.0
            } else {
                *share as f64
            };
            let _ = writeln!(
                out,
                "{name}{{workload=\"{}\",limit=\"{kind}\"}} {value}",
                escape_label(&workload)
            );
        }
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_guards_count() {
        let m = Arc::new(Metrics::default());
        let prod = m.series("slots", "prod");
        let waiting = prod.waiting();
        let a = m.series("slots", "prod").admitted(Duration::from_millis(3));
        let b = prod.admitted(Duration::from_secs(100));
        prod.rejected();
        let text = m.render();
        assert!(
            text.contains("sluice_queries_waiting{resource=\"slots\",workload=\"prod\"} 1"),
            "{text}"
        );
        assert!(text.contains("sluice_queries_in_flight{resource=\"slots\",workload=\"prod\"} 2"));
        assert!(
            text.contains("sluice_queries_rejected_total{resource=\"slots\",workload=\"prod\"} 1")
        );
        assert!(text.contains("le=\"0.001\"} 0"));
        assert!(text.contains("le=\"0.005\"} 1"));
        assert!(text.contains("le=\"60\"} 1"));
        assert!(text.contains("le=\"+Inf\"} 2"));
        drop((waiting, a, b));
        let text = m.render();
        assert!(text.contains("sluice_queries_waiting{resource=\"slots\",workload=\"prod\"} 0"));
        assert!(text.contains("sluice_queries_in_flight{resource=\"slots\",workload=\"prod\"} 0"));
        assert!(
            text.contains("sluice_queries_admitted_total{resource=\"slots\",workload=\"prod\"} 2")
        );
    }
}

//! Prometheus metrics: per resource and workload, the queries waiting and in flight, admitted
//! and rejected, and a histogram of admission wait times; served as text on `[metrics] listen`
//! at `GET /metrics`.
//!
//! Counted by the server around each admission (not read from the schedulers), so the series
//! continue across catalog changes that replace a resource's scheduler.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::state::Shared;

/// Upper bounds of the wait-time buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Default, Clone)]
struct Series {
    waiting: i64,
    in_flight: i64,
    admitted: u64,
    rejected: u64,
    /// Count per bucket (not cumulative), and one more for +Inf.
    buckets: [u64; BUCKETS.len() + 1],
    wait_sum: f64,
}

type Key = (String, String);

/// A metric family: name, type, help, and its value in a series.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Series) -> String,
);

/// The counters of every (resource, workload) pair that has seen a query.
#[derive(Debug, Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<Key, Series>>,
}

impl Metrics {
    fn with(&self, resource: &str, workload: &str, f: impl FnOnce(&mut Series)) {
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        f(series
            .entry((resource.to_string(), workload.to_string()))
            .or_default());
    }

    /// A query starts waiting; the guard counts it until it is dropped.
    pub fn waiting(self: &Arc<Self>, resource: &str, workload: &str) -> Waiting {
        self.with(resource, workload, |s| s.waiting += 1);
        Waiting {
            metrics: self.clone(),
            key: (resource.to_string(), workload.to_string()),
        }
    }

    pub fn rejected(&self, resource: &str, workload: &str) {
        self.with(resource, workload, |s| s.rejected += 1);
    }

    /// A query was admitted after `waited`; the guard counts it in flight until dropped.
    pub fn admitted(
        self: &Arc<Self>,
        resource: &str,
        workload: &str,
        waited: Duration,
    ) -> InFlight {
        let secs = waited.as_secs_f64();
        self.with(resource, workload, |s| {
            s.admitted += 1;
            s.in_flight += 1;
            s.wait_sum += secs;
            let bucket = BUCKETS
                .iter()
                .position(|b| secs <= *b)
                .unwrap_or(BUCKETS.len());
            s.buckets[bucket] += 1;
        });
        InFlight {
            metrics: self.clone(),
            key: (resource.to_string(), workload.to_string()),
        }
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let series = self
            .series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut out = String::new();
        let labels = |(r, w): &Key| {
            format!(
                "resource=\"{}\",workload=\"{}\"",
                escape_label(r),
                escape_label(w)
            )
        };
        let families: [Family; 4] = [
            (
                "sluice_queries_waiting",
                "gauge",
                "Queries waiting for admission.",
                |s| s.waiting.to_string(),
            ),
            (
                "sluice_queries_in_flight",
                "gauge",
                "Queries admitted and not yet finished.",
                |s| s.in_flight.to_string(),
            ),
            (
                "sluice_queries_admitted_total",
                "counter",
                "Queries admitted.",
                |s| s.admitted.to_string(),
            ),
            (
                "sluice_queries_rejected_total",
                "counter",
                "Queries rejected with SERVER_OVERLOADED (max_waiting_queries).",
                |s| s.rejected.to_string(),
            ),
        ];
        for (name, kind, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (key, s) in &series {
                let _ = writeln!(out, "{name}{{{}}} {}", labels(key), value(s));
            }
        }
        let name = "sluice_admission_wait_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from a query's arrival to its admission.\n# TYPE {name} histogram"
        );
        for (key, s) in &series {
            let l = labels(key);
            let mut cumulative = 0;
            for (i, bound) in BUCKETS.iter().enumerate() {
                cumulative += s.buckets[i];
                let _ = writeln!(out, "{name}_bucket{{{l},le=\"{bound}\"}} {cumulative}");
            }
            cumulative += s.buckets[BUCKETS.len()];
            let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {cumulative}");
            let _ = writeln!(out, "{name}_sum{{{l}}} {}", s.wait_sum);
            let _ = writeln!(out, "{name}_count{{{l}}} {cumulative}");
        }
        out
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Counts a query as waiting while it lives.
#[derive(Debug)]
pub struct Waiting {
    metrics: Arc<Metrics>,
    key: Key,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let (r, w) = &self.key;
        self.metrics.with(r, w, |s| s.waiting -= 1);
    }
}

/// Counts a query as in flight while it lives.
#[derive(Debug)]
pub struct InFlight {
    metrics: Arc<Metrics>,
    key: Key,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let (r, w) = &self.key;
        self.metrics.with(r, w, |s| s.in_flight -= 1);
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` completes. One request per
/// connection; anything else gets 404, oversized requests 431.
pub async fn serve_metrics(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (mut socket, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("metrics: accept failed: {e}");
                    continue;
                }
            },
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() <= 8192 {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let line = String::from_utf8_lossy(&request);
            let line = line.lines().next().unwrap_or_default();
            let (status, body) = if request.len() > 8192 {
                ("431 Request Header Fields Too Large", String::new())
            } else if line.starts_with("GET /metrics ") || line == "GET /metrics" {
                ("200 OK", shared.metrics.render())
            } else {
                (
                    "404 Not Found",
                    "sluice serves metrics at GET /metrics\n".into(),
                )
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_guards_count() {
        let m = Arc::new(Metrics::default());
        let waiting = m.waiting("slots", "prod");
        let a = m.admitted("slots", "prod", Duration::from_millis(3));
        let b = m.admitted("slots", "prod", Duration::from_secs(100));
        m.rejected("slots", "prod");
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

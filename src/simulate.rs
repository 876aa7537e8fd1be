//! `sluice simulate`: reading traces (sluice's CSV, or a `system.query_log` export), making
//! synthetic ones (`--generate reports`), and printing what the scheduler did with them.
//! The replay itself is `sluice_server::simulate`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use sluice_catalog::Catalog;
use sluice_sched::Machine;
use sluice_server::simulate::{simulate, Arrival, Fate, Outcome};

/// The columns of sluice's own trace format.
pub const TRACE_HEADER: [&str; 6] = [
    "arrival_s",
    "user",
    "application",
    "workload",
    "statement",
    "service_s",
];

/// Reads a trace: sluice's CSV (`arrival_s,user,application,workload,statement,service_s`) or
/// a `system.query_log` export with a header (`COPY (SELECT * FROM system.query_log) TO
/// STDOUT WITH (FORMAT csv, HEADER)`), where arrivals are `arrived` and service times
/// `run_ms` (as they ran then, not alone), and the workload is `initial_workload`.
pub fn read_trace(path: &Path) -> anyhow::Result<Vec<Arrival>> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(false)
        .from_path(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let header: Vec<String> = reader
        .headers()
        .with_context(|| format!("{}: no header line", path.display()))?
        .iter()
        .map(str::to_string)
        .collect();
    let column = |name: &str| header.iter().position(|h| h == name);
    let query_log = column("arrived").is_some() && column("run_ms").is_some();
    let need = |name: &str| {
        column(name).with_context(|| {
            format!(
                "{}: no column '{name}'; a trace has the columns {} (or is a system.query_log export with its header)",
                path.display(),
                TRACE_HEADER.join(",")
            )
        })
    };
    let mut out = Vec::new();
    // A query log's arrivals, as timestamps: made relative to the earliest once all are read.
    let mut stamps: Vec<chrono::NaiveDateTime> = Vec::new();
    for (n, record) in reader.records().enumerate() {
        let line = n + 2;
        let record = record.with_context(|| format!("{} line {line}", path.display()))?;
        let field = |i: usize| record.get(i).unwrap_or("").to_string();
        let seconds = |i: usize, scale: f64| -> anyhow::Result<Duration> {
            let v: f64 = field(i).trim().parse().with_context(|| {
                format!(
                    "{} line {line}: '{}' is not a number",
                    path.display(),
                    field(i)
                )
            })?;
            if !(v.is_finite() && v >= 0.0) {
                bail!(
                    "{} line {line}: '{}' is not a duration",
                    path.display(),
                    field(i)
                );
            }
            Ok(Duration::from_secs_f64(v * scale))
        };
        let arrival = if query_log {
            let text = field(need("arrived")?);
            let at = chrono::NaiveDateTime::parse_from_str(text.trim(), "%Y-%m-%d %H:%M:%S%.f")
                .with_context(|| {
                    format!(
                        "{} line {line}: '{text}' is not a timestamp",
                        path.display()
                    )
                })?;
            stamps.push(at);
            let workload = field(need("initial_workload")?);
            Arrival {
                at: Duration::ZERO,
                user: field(need("user")?),
                application: String::new(),
                workload: (!workload.is_empty()).then_some(workload),
                statement: field(need("query")?),
                service: seconds(need("run_ms")?, 0.001)?,
            }
        } else {
            let workload = field(need("workload")?);
            Arrival {
                at: seconds(need("arrival_s")?, 1.0)?,
                user: field(need("user")?),
                application: field(need("application")?),
                workload: (!workload.is_empty()).then_some(workload),
                statement: field(need("statement")?),
                service: seconds(need("service_s")?, 1.0)?,
            }
        };
        out.push(arrival);
    }
    if let Some(first) = stamps.iter().min().copied() {
        for (arrival, at) in out.iter_mut().zip(&stamps) {
            arrival.at = (*at - first).to_std().unwrap_or_default();
        }
    }
    // A query log lists statements as they finished; replay them as they arrived.
    out.sort_by_key(|a| a.at);
    Ok(out)
}

/// What `--generate reports` makes.
#[derive(Debug, Clone, Copy)]
pub struct ReportsTrace {
    pub queries: usize,
    pub hours: f64,
    pub seed: u64,
    /// Multiplies every time (arrivals and service): 0.04 turns a 20 s deadline into 0.8 s.
    pub scale: f64,
}

/// A synthetic day of library reports, after the Evergreen consortiums' figures: service
/// times with p50 ≈ 3 s, p75 ≈ 7 s, p90 ≈ 16 s (a log-normal, σ = 1.31, capped at 30 min),
/// one per report type (a type's runs vary ±10%), arriving at random over `hours`. All ask
/// for workload `reports`.
pub fn generate_reports(spec: ReportsTrace) -> String {
    let mut rng = SplitMix(spec.seed);
    let types = (spec.queries / 8).max(1);
    let medians: Vec<f64> = (0..types)
        .map(|_| (3f64.ln() + 1.306 * rng.normal()).exp().min(1800.0))
        .collect();
    let mut arrivals: Vec<f64> = (0..spec.queries)
        .map(|_| rng.uniform() * spec.hours * 3600.0)
        .collect();
    arrivals.sort_by(f64::total_cmp);
    let mut out = TRACE_HEADER.join(",");
    out.push('\n');
    for (i, at) in arrivals.into_iter().enumerate() {
        let kind = (rng.uniform() * types as f64) as usize % types;
        let service = medians[kind] * (0.1 * rng.normal()).exp();
        let _ = writeln!(
            out,
            "{:.3},reports,scheduler,reports,\"SELECT * FROM report_{kind} WHERE run = {i}\",{:.3}",
            at * spec.scale,
            service * spec.scale
        );
    }
    out
}

/// splitmix64: small, seedable, and the same on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// In [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u = self.uniform().max(f64::MIN_POSITIVE);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// The figures of one group of statements.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub n: usize,
    pub wait: [Duration; 3],
    pub done: [Duration; 3],
    pub per_hour: f64,
    pub peak_queue: Option<usize>,
    pub demoted: usize,
    pub rejected: usize,
    pub timed_out: usize,
}

fn quantiles(mut v: Vec<Duration>) -> [Duration; 3] {
    v.sort_unstable();
    let at = |q: f64| {
        if v.is_empty() {
            Duration::ZERO
        } else {
            v[((v.len() - 1) as f64 * q).round() as usize]
        }
    };
    [at(0.5), at(0.9), at(0.99)]
}

fn figures(fates: &[&Fate], trace: &[Arrival], peak_queue: Option<usize>) -> Figures {
    let served: Vec<&&Fate> = fates
        .iter()
        .filter(|f| f.outcome != Outcome::Rejected)
        .collect();
    let first = fates
        .iter()
        .map(|f| trace[f.index].at)
        .min()
        .unwrap_or_default();
    let last = fates
        .iter()
        .map(|f| trace[f.index].at + f.completed)
        .max()
        .unwrap_or_default();
    let span = (last.saturating_sub(first)).as_secs_f64().max(1e-9);
    Figures {
        n: fates.len(),
        wait: quantiles(served.iter().map(|f| f.waited).collect()),
        done: quantiles(served.iter().map(|f| f.completed).collect()),
        per_hour: served.iter().filter(|f| f.outcome == Outcome::Ok).count() as f64 * 3600.0 / span,
        peak_queue,
        demoted: fates.iter().filter(|f| f.demoted).count(),
        rejected: fates
            .iter()
            .filter(|f| f.outcome == Outcome::Rejected)
            .count(),
        timed_out: fates
            .iter()
            .filter(|f| f.outcome == Outcome::TimedOut)
            .count(),
    }
}

/// Each statement's fate, one line each, in trace order (`--each`).
pub fn each(fates: &[Fate], trace: &[Arrival]) -> String {
    let mut out = String::from(
        "  #  arrival  admitted in   ended in      waited    done  outcome  statement\n",
    );
    for f in fates {
        let a = &trace[f.index];
        let outcome = match f.outcome {
            Outcome::Ok if f.demoted => "demoted",
            Outcome::Ok => "ok",
            Outcome::Rejected => "rejected",
            Outcome::TimedOut => "timeout",
        };
        let _ = writeln!(
            out,
            "{:>3}  {:>7}  {:<12}  {:<12}  {:>6}  {:>6}  {:<7}  {}",
            f.index + 1,
            duration(a.at),
            f.admitted_in,
            f.ended_in,
            duration(f.waited),
            duration(f.completed),
            outcome,
            a.statement.chars().take(60).collect::<String>()
        );
    }
    out
}

/// Figures by group name.
pub type Groups = Vec<(String, Figures)>;

/// Per group (each workload asked for, then fast and slow by service time): the figures; and
/// the fates they come from.
pub fn report(
    catalog: &Catalog,
    machine: Machine,
    trace: &[Arrival],
    fast_under: Duration,
) -> anyhow::Result<(Groups, Vec<Fate>)> {
    let (fates, peaks) = simulate(catalog, machine, trace).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut groups: BTreeMap<String, Vec<&Fate>> = BTreeMap::new();
    for f in &fates {
        groups
            .entry(format!("workload {}", f.requested))
            .or_default()
            .push(f);
    }
    let mut out: Vec<(String, Figures)> = groups
        .iter()
        .map(|(name, fs)| {
            // The highest peak among the queues its statements waited in (its own, its lanes).
            let lanes: std::collections::BTreeSet<&str> =
                fs.iter().map(|f| f.admitted_in.as_str()).collect();
            let peak = lanes
                .iter()
                .map(|l| peaks.get(*l).copied().unwrap_or(0))
                .max();
            (name.clone(), figures(fs, trace, peak))
        })
        .collect();
    let secs = fast_under.as_secs_f64();
    for (name, fast) in [
        (format!("fast (alone ≤ {secs}s)"), true),
        (format!("slow (alone > {secs}s)"), false),
    ] {
        let fs: Vec<&Fate> = fates
            .iter()
            .filter(|f| (f.service <= fast_under) == fast)
            .collect();
        if !fs.is_empty() {
            out.push((name, figures(&fs, trace, None)));
        }
    }
    Ok((out, fates))
}

fn duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s == 0.0 {
        "0".to_string()
    } else if s < 1.0 {
        format!("{:.0}ms", s * 1000.0)
    } else if s < 120.0 {
        format!("{s:.2}s")
    } else {
        format!("{:.1}m", s / 60.0)
    }
}

/// The table `sluice simulate` prints: one row per group and script.
pub fn table(results: &[(String, Groups)]) -> String {
    let mut rows: Vec<Vec<String>> = vec![[
        "group",
        "script",
        "n",
        "wait p50",
        "wait p90",
        "wait p99",
        "done p50",
        "done p90",
        "done p99",
        "per hour",
        "peak queue",
        "demoted",
        "rejected",
        "timed out",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()];
    let mut groups: Vec<&str> = Vec::new();
    for (_, figures) in results {
        for (g, _) in figures {
            if !groups.contains(&g.as_str()) {
                groups.push(g);
            }
        }
    }
    for g in groups {
        for (script, figures) in results {
            let Some((_, f)) = figures.iter().find(|(name, _)| name == g) else {
                continue;
            };
            rows.push(vec![
                g.to_string(),
                script.clone(),
                f.n.to_string(),
                duration(f.wait[0]),
                duration(f.wait[1]),
                duration(f.wait[2]),
                duration(f.done[0]),
                duration(f.done[1]),
                duration(f.done[2]),
                format!("{:.0}", f.per_hour),
                f.peak_queue.map_or("-".into(), |p| p.to_string()),
                f.demoted.to_string(),
                f.rejected.to_string(),
                f.timed_out.to_string(),
            ]);
        }
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, v)| {
                if c < 2 {
                    format!("{v:<w$}", w = widths[c])
                } else {
                    format!("{v:>w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_reports_follow_the_consortiums_percentiles() {
        let trace = generate_reports(ReportsTrace {
            queries: 20_000,
            hours: 24.0,
            seed: 7,
            scale: 1.0,
        });
        let mut service: Vec<f64> = trace
            .lines()
            .skip(1)
            .map(|l| l.rsplit(',').next().unwrap_or("0").parse().unwrap_or(0.0))
            .collect();
        service.sort_by(f64::total_cmp);
        let q = |p: f64| service[(service.len() as f64 * p) as usize];
        // Seed figures: p50 2.5–3.5 s, p75 6–9 s, p90 15–16.5 s (wide bands: 2,500 types).
        assert!((2.0..4.5).contains(&q(0.5)), "p50 {}", q(0.5));
        assert!((5.0..10.5).contains(&q(0.75)), "p75 {}", q(0.75));
        assert!((11.0..22.0).contains(&q(0.9)), "p90 {}", q(0.9));
        // The same seed, the same trace.
        let again = generate_reports(ReportsTrace {
            queries: 20_000,
            hours: 24.0,
            seed: 7,
            scale: 1.0,
        });
        assert_eq!(trace, again);
    }
}

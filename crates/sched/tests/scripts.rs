//! The scheduler runtime's behaviour as data-driven scripts (`testdata/*.txt`), in the spirit of
//! CockroachDB's `pkg/util/admission/testdata`. Each case is a command, `----`, and the output
//! it must give; cases are separated by a blank line, `#` starts a comment. Run with
//! `REWRITE=1` to write the outputs the code gives now into the files (then read the diff).
//!
//! Commands (time is virtual: tokio's clock is paused):
//! - `catalog` + DDL lines: the catalog (a QUERY resource `q` is there from the start) is
//!   changed and compiled; the first builds the scheduler, later ones hand over to a new one
//!   (`ResourceScheduler::succeed`), as a live catalog change does.
//!   `catalog R` runs the tree of resource `R` instead (declared in the DDL).
//! - `acquire NAME WORKLOAD [cost=N]`: a request; says whether it was granted or waits.
//! - `try NAME WORKLOAD`: a request granted now or not at all (CPU worker slots): `granted`
//!   or `not free`, and then nothing of it stays queued.
//! - `release NAME` / `cancel NAME`: drops a granted request's permit / a waiting request.
//! - `move NAME WORKLOAD`: moves a granted request to another leaf without releasing it.
//! - `requeue NAME WORKLOAD`: moves a waiting request to another leaf's queue (arrival order
//!   kept).
//! - `fill PREFIX WORKLOAD N`: N requests `PREFIX1` … `PREFIXN`; says how many were granted.
//! - `serve N`: N times, releases the oldest granted request (one dequeue each, under a
//!   concurrency limit); says how many of the N dequeues went to each workload, and for up
//!   to 20 the names in grant order.
//! - `resize NAME COST`: changes the cost a granted request holds.
//! - `advance DURATION` (`250ms`, `2s`): moves virtual time on.
//! - `print`: every node's live state.
//!
//! A `catalog R` whose resource is a `MEMORY RESERVATION` runs its space-shared tree
//! ([`MemoryScheduler`]) instead, with allocations (sizes in bytes, `Ki`/`Mi`/`Gi` allowed):
//! - `allocate NAME WORKLOAD [SIZE]`: an allocation reserving SIZE (default 0); says whether
//!   it was admitted or waits.
//! - `grow NAME BYTES` / `shrink NAME BYTES`: a running allocation's growth (which may evict a
//!   victim, or fail) or shrink.
//! - `free NAME`: drops an allocation, pending or running.
//! - `move NAME WORKLOAD`: moves a running allocation with its bytes.
//! - `print`: every node's `allocated`, `allocations`, `pending` and counters, then the size of
//!   each running allocation.
//!
//! After each command, requests whose wait ended are listed (`NAME: granted`, or the error),
//! then allocations admitted (`NAME: admitted`) or failed, then victims (`NAME: evicted`: the
//! kill switch was thrown; the script then drops the victim's allocation, as its statement does
//! when it stops).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sluice_catalog::Catalog;
use sluice_sched::{
    compile, Acquire, Allocation, KillSwitch, Machine, MemoryScheduler, PendingAllocation, Permit,
    ResourceScheduler, TokioClock,
};
use sluice_sql::{parse_script, CostUnit};

const MACHINE: Machine = Machine {
    cores: 4,
    memory: 1 << 34,
};

enum Request {
    Waiting(Acquire),
    Granted(Permit),
}

enum Memory {
    Pending(PendingAllocation),
    Running(Allocation),
}

struct Script {
    catalog: Catalog,
    scheduler: Option<ResourceScheduler>,
    /// Requests by name, in the order they were made.
    requests: Vec<(String, Request)>,
    memory: Option<MemoryScheduler>,
    /// Allocations by name, in the order they were made.
    allocations: Vec<(String, Memory)>,
    /// Names whose kill switch was thrown, in order (filled outside the scheduler's lock).
    victims: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Script {
    fn new() -> Script {
        let mut catalog = Catalog::new();
        for item in parse_script("CREATE RESOURCE q (QUERY)") {
            catalog
                .apply_mut(&item.result.expect("parses"))
                .expect("applies");
        }
        Script {
            catalog,
            scheduler: None,
            requests: Vec::new(),
            memory: None,
            allocations: Vec::new(),
            victims: Arc::default(),
        }
    }

    fn memory(&self) -> Result<&MemoryScheduler, String> {
        self.memory
            .as_ref()
            .ok_or_else(|| "no memory catalog yet".to_string())
    }

    fn running(&self, name: &str) -> Result<&Allocation, String> {
        match self.allocations.iter().find(|(n, _)| n == name) {
            Some((_, Memory::Running(a))) => Ok(a),
            Some((_, Memory::Pending(_))) => Err(format!("{name} is pending")),
            None => Err(format!("no allocation {name}")),
        }
    }

    fn kill_switch(&self, name: &str) -> KillSwitch {
        let (victims, name) = (self.victims.clone(), name.to_string());
        Arc::new(move |_| victims.lock().expect("victims").push(name.clone()))
    }

    fn scheduler(&self) -> Result<&ResourceScheduler, String> {
        self.scheduler
            .as_ref()
            .ok_or_else(|| "no catalog yet".to_string())
    }

    fn request(&mut self, name: &str) -> Result<&mut Request, String> {
        self.requests
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r)
            .ok_or_else(|| format!("no request {name}"))
    }

    fn granted(&mut self, name: &str) -> Result<&mut Permit, String> {
        match self.request(name)? {
            Request::Granted(p) => Ok(p),
            Request::Waiting(_) => Err(format!("{name} is not granted")),
        }
    }

    async fn run(&mut self, command: &str, body: &[String]) -> Vec<String> {
        let words: Vec<&str> = command.split_whitespace().collect();
        let mut out = match self.command(&words, body).await {
            Ok(lines) => lines,
            Err(e) => vec![format!("error: {e}")],
        };
        out.extend(self.resolved());
        out
    }

    async fn command(&mut self, words: &[&str], body: &[String]) -> Result<Vec<String>, String> {
        match words {
            ["catalog", rest @ ..] => {
                let resource = rest.first().copied().unwrap_or("q");
                let mut catalog = self.catalog.clone();
                for item in parse_script(&body.join("\n")) {
                    let stmt = item.result.map_err(|e| e.to_string())?;
                    catalog.apply_mut(&stmt).map_err(|e| e.to_string())?;
                }
                let trees = compile(&catalog, MACHINE).map_err(|e| e.to_string())?;
                let tree = trees
                    .tree(resource)
                    .ok_or_else(|| format!("no tree {resource}"))?;
                if tree.unit == CostUnit::MemoryByte {
                    self.memory = Some(match &self.memory {
                        None => MemoryScheduler::new(tree),
                        Some(old) => old.succeed(tree),
                    });
                    self.catalog = catalog;
                    return Ok(vec!["ok".into()]);
                }
                self.scheduler = Some(match &self.scheduler {
                    None => ResourceScheduler::new(tree, Arc::new(TokioClock)),
                    Some(old) => old.succeed(tree),
                });
                self.catalog = catalog;
                settle().await;
                Ok(vec!["ok".into()])
            }
            ["acquire", name, workload, rest @ ..] => {
                let cost = match rest {
                    [] => 1,
                    [c] => c
                        .strip_prefix("cost=")
                        .and_then(|c| c.parse().ok())
                        .ok_or("acquire NAME WORKLOAD [cost=N]")?,
                    _ => return Err("acquire NAME WORKLOAD [cost=N]".into()),
                };
                let mut acquire = self
                    .scheduler()?
                    .acquire(workload, cost)
                    .map_err(|e| e.to_string())?;
                let line = match poll_once(&mut acquire) {
                    Some(Ok(permit)) => {
                        self.requests
                            .push((name.to_string(), Request::Granted(permit)));
                        format!("{name}: granted")
                    }
                    Some(Err(e)) => format!("{name}: {e}"),
                    None => {
                        let line = format!("{name}: waiting in {}", acquire.queue_path());
                        self.requests
                            .push((name.to_string(), Request::Waiting(acquire)));
                        line
                    }
                };
                Ok(vec![line])
            }
            ["try", name, workload] => {
                let line = match self.scheduler()?.try_acquire(workload, 1) {
                    Some(permit) => {
                        self.requests
                            .push((name.to_string(), Request::Granted(permit)));
                        format!("{name}: granted")
                    }
                    None => format!("{name}: not free"),
                };
                Ok(vec![line])
            }
            ["release", name] => {
                self.granted(name)?;
                self.requests.retain(|(n, _)| n != name);
                Ok(vec![])
            }
            ["cancel", name] => {
                if !matches!(self.request(name)?, Request::Waiting(_)) {
                    return Err(format!("{name} is not waiting"));
                }
                self.requests.retain(|(n, _)| n != name);
                Ok(vec![])
            }
            ["allocate", name, workload, rest @ ..] => {
                let size = match rest {
                    [] => 0,
                    [size] => parse_bytes(size).ok_or("allocate NAME WORKLOAD [SIZE]")?,
                    _ => return Err("allocate NAME WORKLOAD [SIZE]".into()),
                };
                let kill = self.kill_switch(name);
                let mut pending = self
                    .memory()?
                    .allocate(workload, size, kill)
                    .map_err(|e| e.to_string())?;
                let line = match poll_future(&mut pending) {
                    Some(Ok(allocation)) => {
                        self.allocations
                            .push((name.to_string(), Memory::Running(allocation)));
                        format!("{name}: admitted")
                    }
                    Some(Err(e)) => format!("{name}: {e}"),
                    None => {
                        self.allocations
                            .push((name.to_string(), Memory::Pending(pending)));
                        format!("{name}: waiting")
                    }
                };
                Ok(vec![line])
            }
            ["grow", name, bytes] => {
                let bytes = parse_bytes(bytes).ok_or("grow NAME BYTES")?;
                Ok(match self.running(name)?.try_grow(bytes) {
                    Ok(()) => vec![],
                    Err(e) => vec![format!("{name}: {e}")],
                })
            }
            ["shrink", name, bytes] => {
                let bytes = parse_bytes(bytes).ok_or("shrink NAME BYTES")?;
                self.running(name)?.shrink(bytes);
                Ok(vec![])
            }
            ["free", name] => {
                if !self.allocations.iter().any(|(n, _)| n == name) {
                    return Err(format!("no allocation {name}"));
                }
                self.allocations.retain(|(n, _)| n != name);
                Ok(vec![])
            }
            ["move", name, workload] if self.allocations.iter().any(|(n, _)| n == name) => {
                self.running(name)?
                    .move_to(workload)
                    .map_err(|e| e.to_string())?;
                Ok(vec![])
            }
            ["move", name, workload] => {
                let scheduler = self.scheduler()?.clone();
                self.granted(name)?
                    .move_to(&scheduler, workload)
                    .map_err(|e| e.to_string())?;
                Ok(vec![])
            }
            ["requeue", name, workload] => {
                let Request::Waiting(acquire) = self.request(name)? else {
                    return Err(format!("{name} is not waiting"));
                };
                match acquire.move_to(workload) {
                    Ok(true) => Ok(vec![]),
                    Ok(false) => Ok(vec![format!("{name}: nothing to move")]),
                    Err(e) => Err(e.to_string()),
                }
            }
            ["fill", prefix, workload, n] => {
                let n: usize = n.parse().map_err(|_| "fill PREFIX WORKLOAD N")?;
                let scheduler = self.scheduler()?.clone();
                let mut granted = 0;
                for i in 1..=n {
                    let mut acquire = scheduler.acquire(workload, 1).map_err(|e| e.to_string())?;
                    let request = match poll_once(&mut acquire) {
                        Some(Ok(permit)) => {
                            granted += 1;
                            Request::Granted(permit)
                        }
                        Some(Err(e)) => return Err(e.to_string()),
                        None => Request::Waiting(acquire),
                    };
                    self.requests.push((format!("{prefix}{i}"), request));
                }
                Ok(vec![format!("{prefix}: {granted} of {n} granted")])
            }
            ["serve", n] => {
                let n: usize = n.parse().map_err(|_| "serve N")?;
                let mut order = Vec::new();
                let mut by_workload: BTreeMap<String, usize> = BTreeMap::new();
                for _ in 0..n {
                    let Some(oldest) = self
                        .requests
                        .iter()
                        .position(|(_, r)| matches!(r, Request::Granted(_)))
                    else {
                        break;
                    };
                    self.requests.remove(oldest);
                    // A fresh coop budget: tokio's oneshot answers Pending after 128 ready
                    // polls in one task poll, which would hide grants from `resolved`.
                    tokio::task::yield_now().await;
                    for line in self.resolved() {
                        let name = line.trim_end_matches(": granted").to_string();
                        let workload = match self.request(&name) {
                            Ok(Request::Granted(p)) => p.workload().unwrap_or("").to_string(),
                            _ => "(failed)".into(),
                        };
                        *by_workload.entry(workload).or_default() += 1;
                        order.push(name);
                    }
                }
                let counts: Vec<String> = by_workload
                    .iter()
                    .map(|(w, c)| format!("{w}={c}"))
                    .collect();
                let mut out = vec![format!("{} dequeues: {}", order.len(), counts.join(" "))];
                if order.len() <= 20 {
                    out.push(format!("order: {}", order.join(" ")));
                }
                Ok(out)
            }
            ["resize", name, cost] => {
                let cost: i64 = cost.parse().map_err(|_| "resize NAME COST")?;
                let scheduler = self.scheduler()?.clone();
                self.granted(name)?
                    .set_cost(&scheduler, cost)
                    .map_err(|e| e.to_string())?;
                Ok(vec![])
            }
            ["advance", duration] => {
                let duration = parse_duration(duration).ok_or("advance 250ms | 2s")?;
                tokio::time::advance(duration).await;
                settle().await;
                Ok(vec![])
            }
            ["print"] if self.memory.is_some() && self.scheduler.is_none() => {
                Ok(self.print_memory()?)
            }
            ["print"] => Ok(self.print()?),
            _ => Err(format!("unknown command {words:?}")),
        }
    }

    /// Waiting requests that have been granted or failed since the last look.
    fn resolved(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut failed = Vec::new();
        for (name, request) in &mut self.requests {
            let Request::Waiting(acquire) = request else {
                continue;
            };
            match poll_once(acquire) {
                Some(Ok(permit)) => {
                    out.push(format!("{name}: granted"));
                    *request = Request::Granted(permit);
                }
                Some(Err(e)) => {
                    out.push(format!("{name}: {e}"));
                    failed.push(name.clone());
                }
                None => {}
            }
        }
        self.requests.retain(|(n, _)| !failed.contains(n));
        let mut failed = Vec::new();
        for (name, allocation) in &mut self.allocations {
            let Memory::Pending(pending) = allocation else {
                continue;
            };
            match poll_future(pending) {
                Some(Ok(running)) => {
                    out.push(format!("{name}: admitted"));
                    *allocation = Memory::Running(running);
                }
                Some(Err(e)) => {
                    out.push(format!("{name}: {e}"));
                    failed.push(name.clone());
                }
                None => {}
            }
        }
        let victims = std::mem::take(&mut *self.victims.lock().expect("victims"));
        for name in &victims {
            out.push(format!("{name}: evicted"));
        }
        self.allocations
            .retain(|(n, _)| !failed.contains(n) && !victims.contains(n));
        if !victims.is_empty() {
            // What the victims' frees admitted.
            out.extend(self.resolved());
        }
        out
    }

    fn print_memory(&self) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for node in self.memory()?.nodes() {
            let st = &node.stats;
            let mut line = format!(
                "{} {} allocated={} allocations={}",
                node.path, node.type_name, node.allocated, node.allocations
            );
            if let Some(p) = node.pending {
                line += &format!(" pending={p}");
            }
            line += &format!(
                " admits={} removes={} increases={} decreases={} killers={} victims={} rejects={}",
                st.admits,
                st.removes,
                st.increases,
                st.decreases,
                st.killers,
                st.victims,
                st.rejects
            );
            out.push(line);
        }
        for (name, allocation) in &self.allocations {
            if let Memory::Running(a) = allocation {
                out.push(format!("size {name}: {}", a.size()));
            }
        }
        Ok(out)
    }

    fn print(&self) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for node in self.scheduler()?.nodes() {
            let mut line = format!("{} {}", node.path, node.type_name);
            if let Some(q) = node.queue_length {
                line += &format!(" queued={q}");
            }
            if let (Some(r), Some(c)) = (node.inflight_requests, node.inflight_cost) {
                line += &format!(" inflight={r} cost={c}");
            }
            if let Some(t) = node.tokens {
                line += &format!(" tokens={t:.2}");
            }
            line += &format!(" dequeued={}", node.stats.dequeued_requests);
            out.push(line);
        }
        let held: BTreeMap<&str, String> = self
            .requests
            .iter()
            .filter_map(|(n, r)| match r {
                Request::Granted(p) => Some((
                    n.as_str(),
                    format!(
                        "{} cost={}",
                        p.workload().unwrap_or("(unlimited)"),
                        p.cost()
                    ),
                )),
                Request::Waiting(_) => None,
            })
            .collect();
        for (name, what) in held {
            out.push(format!("held {name}: {what}"));
        }
        Ok(out)
    }
}

fn poll_once(acquire: &mut Acquire) -> Option<sluice_sql::Result<Permit>> {
    poll_future(acquire)
}

fn poll_future<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(future).poll(&mut cx) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    }
}

/// `100`, `64Ki`, `2Mi`, `1Gi`.
fn parse_bytes(s: &str) -> Option<i64> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => s.split_at(at),
        None => (s, ""),
    };
    let unit = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return None,
    };
    digits.parse::<i64>().ok()?.checked_mul(unit)
}

fn parse_duration(s: &str) -> Option<Duration> {
    if let Some(ms) = s.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    s.strip_suffix('s')?
        .parse::<f64>()
        .ok()
        .map(Duration::from_secs_f64)
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// One case of a script file.
struct Case {
    /// The comment lines just above it (kept by `REWRITE`).
    comments: Vec<String>,
    command: String,
    body: Vec<String>,
    expected: Vec<String>,
}

fn parse_cases(text: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut lines = text.lines().peekable();
    let mut comments = Vec::new();
    while let Some(line) = lines.next() {
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with('#') {
            comments.push(line.to_string());
            continue;
        }
        let command = line.to_string();
        let mut body = Vec::new();
        for line in lines.by_ref() {
            if line == "----" {
                break;
            }
            body.push(line.to_string());
        }
        let mut expected = Vec::new();
        while let Some(line) = lines.peek() {
            if line.trim().is_empty() {
                break;
            }
            expected.push(line.to_string());
            lines.next();
        }
        cases.push(Case {
            comments: std::mem::take(&mut comments),
            command,
            body,
            expected,
        });
    }
    cases
}

fn render(cases: &[Case], outputs: &[Vec<String>], original: &str) -> String {
    // The file's leading comment block stands apart (a blank line after it).
    let header: Vec<&str> = original
        .lines()
        .take_while(|l| l.starts_with('#'))
        .collect();
    let mut out: String = header.iter().map(|l| format!("{l}\n")).collect();
    if !out.is_empty() {
        out.push('\n');
    }
    for (i, (case, output)) in cases.iter().zip(outputs).enumerate() {
        let skip = if i == 0 { header.len() } else { 0 };
        for line in case.comments.iter().skip(skip) {
            out += line;
            out.push('\n');
        }
        out += &case.command;
        out.push('\n');
        for line in &case.body {
            out += line;
            out.push('\n');
        }
        out += "----\n";
        for line in output {
            out += line;
            out.push('\n');
        }
        out.push('\n');
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

#[tokio::test(start_paused = true)]
async fn scheduler_scripts() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no scripts in {}", dir.display());
    let rewrite = std::env::var_os("REWRITE").is_some();
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("script");
        let cases = parse_cases(&text);
        let mut script = Script::new();
        let mut outputs = Vec::new();
        for case in &cases {
            let output = script.run(&case.command, &case.body).await;
            if output != case.expected {
                failures.push(format!(
                    "{}: `{}`\n  expected: {:?}\n  got:      {:?}",
                    file.display(),
                    case.command,
                    case.expected,
                    output
                ));
            }
            outputs.push(output);
        }
        if rewrite {
            std::fs::write(file, render(&cases, &outputs, &text)).expect("rewrite");
        }
    }
    if !rewrite {
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

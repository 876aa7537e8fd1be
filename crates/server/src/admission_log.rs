//! `server.admission_log`: a file of every QUERY slot granted and given back, one line each,
//! `admit|release UNIX_MICROS NODE QUERY_ID WORKLOAD`, appended as it happens, and of every
//! wait in a QUERY queue, `wait|unwait …` (the `unwait` at the instant the request left the
//! queue, when the scheduler says: see `Permit::dequeued_at`); in a fleet also
//! `fence UNIX_MICROS NODE 0 -` when the node's fence passed. Several nodes'
//! logs merged by time show how many queries a fleet ran at once (the fleet's tests count
//! from it); off unless configured.
//!
//! Each grant is written just after the scheduler granted it, each release just before the
//! slot is given back: a logged interval lies within the real one, so the next query a
//! released slot admits on this node is logged after the release.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// The log file of this node.
#[derive(Debug)]
pub struct AdmissionLog {
    file: Mutex<std::fs::File>,
    node: String,
}

/// One granted slot, logged as given back when dropped (just before the permit it stands
/// beside).
#[derive(Debug)]
pub struct Logged {
    log: Arc<AdmissionLog>,
    query_id: u64,
    workload: Arc<str>,
}

impl AdmissionLog {
    /// Opens (appends to) `path`; `node` names this node in each line.
    pub fn open(path: &Path, node: &str) -> std::io::Result<Arc<AdmissionLog>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Arc::new(AdmissionLog {
            file: Mutex::new(file),
            node: node.to_string(),
        }))
    }

    fn line(&self, what: &str, query_id: u64, workload: &str) {
        self.line_at(SystemTime::now(), what, query_id, workload);
    }

    fn line_at(&self, at: SystemTime, what: &str, query_id: u64, workload: &str) {
        let micros = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
        let line = format!("{what} {micros} {} {query_id} {workload}\n", self.node);
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(line.as_bytes()) {
            tracing::warn!("server.admission_log: {e}");
        }
    }

    /// Logs a slot granted to statement `query_id` of `workload`, at `at` (the scheduler's
    /// clock: when it left its queue) or now.
    pub fn admitted(
        self: &Arc<Self>,
        query_id: u64,
        workload: &Arc<str>,
        at: Option<tokio::time::Instant>,
    ) -> Logged {
        self.line_at(since(at), "admit", query_id, workload);
        Logged {
            log: self.clone(),
            query_id,
            workload: workload.clone(),
        }
    }
}

/// One request waiting in a QUERY queue, logged as no longer waiting when dropped or
/// [`Waited::dequeued`].
#[derive(Debug)]
pub struct Waited {
    log: Arc<AdmissionLog>,
    query_id: u64,
    workload: Arc<str>,
    ended: bool,
}

impl Waited {
    /// The request left its queue at `at` (the scheduler's clock), or now when unknown.
    pub fn dequeued(mut self, at: Option<tokio::time::Instant>) {
        self.log
            .line_at(since(at), "unwait", self.query_id, &self.workload);
        self.ended = true;
    }
}

/// The wall-clock time of `at` on the scheduler's clock (now when `None`).
fn since(at: Option<tokio::time::Instant>) -> SystemTime {
    let ago = at.map_or(std::time::Duration::ZERO, |at| {
        tokio::time::Instant::now().saturating_duration_since(at)
    });
    SystemTime::now() - ago
}

impl Drop for Waited {
    fn drop(&mut self) {
        if !self.ended {
            self.log.line("unwait", self.query_id, &self.workload);
        }
    }
}

impl AdmissionLog {
    /// Logs that statement `query_id` waits in `workload`'s QUERY queue (the line is written
    /// just after it was queued: within the real wait).
    pub fn waits(self: &Arc<Self>, query_id: u64, workload: &Arc<str>) -> Waited {
        self.line("wait", query_id, workload);
        Waited {
            log: self.clone(),
            query_id,
            workload: workload.clone(),
            ended: false,
        }
    }

    /// Logs that this node's fleet fence passed at `at` (a line `fence MICROS NODE 0 -`): from
    /// then on its running queries no longer count against the fleet's limits (docs/fleet.md).
    pub fn fenced(&self, at: SystemTime) {
        self.line_at(at, "fence", 0, "-");
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.log.line("release", self.query_id, &self.workload);
    }
}

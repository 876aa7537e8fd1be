//! What a statement leaves behind when it ends, however it ends: its `system.query_log` row
//! and, once admitted, its run in the learned lanes' book ([`crate::lanes`]).
//!
//! A [`RunRecord`] is made when a statement arrives and travels with it: into the rows stream
//! that carries its result, or it stays with the statement's future. Its `Drop` writes the
//! record, so a statement that fails, is cancelled, or whose client vanishes is recorded
//! exactly like one that finishes.

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use sluice_catalog::Demotion;
use sluice_sql::{first_chars, Error, ErrorCode, Fingerprint};

use crate::lanes::Run;
use crate::query_log::{Outcome, Row};
use crate::registry::Grant;
use crate::state::Shared;

/// A statement on its way, to be recorded when it ends.
#[derive(Debug)]
pub struct RunRecord {
    shared: Arc<Shared>,
    query_id: u64,
    user: Arc<str>,
    /// Where it was admitted (a learned lane, or the workload it asked for).
    initial_workload: Arc<str>,
    fingerprint: Arc<Fingerprint>,
    /// Its first 2,000 characters (see [`RunRecord::new`]).
    query: Arc<str>,
    arrived: SystemTime,
    arrived_at: Instant,
    admitted: Option<(Instant, Arc<Mutex<Grant>>)>,
    /// The classifier that placed it, as of its admission.
    classifier: Option<String>,
    /// The deadline of the workload it asked for: what its run is judged by for learning.
    judged_by: Option<Demotion>,
    rows: u64,
    outcome: Option<Outcome>,
}

impl RunRecord {
    pub fn new(
        shared: Arc<Shared>,
        query_id: u64,
        user: &Arc<str>,
        initial_workload: &Arc<str>,
        fingerprint: Arc<Fingerprint>,
        query: &Arc<str>,
        judged_by: Option<Demotion>,
    ) -> RunRecord {
        // Most statements are shorter: their text is shared with `system.processes`.
        let kept = first_chars(query, 2_000);
        let query = if kept.len() == query.len() {
            query.clone()
        } else {
            Arc::from(kept)
        };
        RunRecord {
            shared,
            query_id,
            user: user.clone(),
            initial_workload: initial_workload.clone(),
            fingerprint,
            query,
            arrived: SystemTime::now(),
            arrived_at: Instant::now(),
            admitted: None,
            classifier: None,
            judged_by,
            rows: 0,
            outcome: None,
        }
    }

    /// Registered in `system.processes` as `query_id`.
    pub fn set_query_id(&mut self, query_id: u64) {
        self.query_id = query_id;
    }

    /// When it arrived (the clock read once for its record and its process entry).
    pub fn arrived_at(&self) -> Instant {
        self.arrived_at
    }

    /// Admitted at `at`, holding `grant`, placed by `classifier` (if a classifier placed it).
    pub fn admitted(&mut self, at: Instant, grant: Arc<Mutex<Grant>>, classifier: Option<String>) {
        self.admitted = Some((at, grant));
        self.classifier = classifier;
    }

    pub fn add_rows(&mut self, n: usize) {
        self.rows += n as u64;
    }

    /// Finished: all rows sent, or the command done (`rows` affected, when it says).
    pub fn finished(&mut self) {
        self.outcome.get_or_insert(Outcome::Ok);
    }

    /// Ended by `error` (the first error counts).
    /// The upstream answered the statement with an error (`sqlstate`): a cancel, or a failure
    /// of the statement itself.
    pub fn failed_upstream(&mut self, sqlstate: &str) {
        self.outcome.get_or_insert(match sqlstate {
            "57014" => Outcome::Cancelled,
            _ => Outcome::Error("UPSTREAM_ERROR"),
        });
    }

    pub fn failed(&mut self, error: &Error) {
        self.outcome.get_or_insert(match error.code {
            ErrorCode::QueryWasCancelled => Outcome::Cancelled,
            code => Outcome::Error(code.name()),
        });
    }
}

impl Drop for RunRecord {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or(Outcome::Cancelled);
        let now = Instant::now();
        let (queued, run_ms, workload, demoted) = match &self.admitted {
            Some((at, grant)) => {
                let grant = grant.lock().unwrap_or_else(|p| p.into_inner());
                (
                    at.duration_since(self.arrived_at),
                    now.duration_since(*at).as_millis() as u64,
                    grant.workload.clone(),
                    grant.demoted.is_some(),
                )
            }
            None => (
                now.duration_since(self.arrived_at),
                0,
                self.initial_workload.clone(),
                false,
            ),
        };
        if self.admitted.is_some() {
            let fast = outcome == Outcome::Ok
                && !demoted
                && self
                    .judged_by
                    .as_ref()
                    .is_none_or(|d| u128::from(run_ms) < d.after.as_millis());
            let run = Run {
                ms: run_ms,
                demoted_to: demoted.then(|| workload.to_string()),
                fast,
                relearn_after: self
                    .judged_by
                    .as_ref()
                    .map_or(sluice_catalog::lanes::DEFAULT_RELEARN_AFTER, |d| {
                        d.relearn_after
                    }),
            };
            if let Err(e) = self
                .shared
                .lanes
                .record(&self.fingerprint, &self.query, run)
            {
                tracing::warn!("learned lanes not saved: {e}");
            }
        }
        self.shared.query_log.push(Row {
            query_id: self.query_id,
            user: self.user.clone(),
            workload,
            initial_workload: self.initial_workload.clone(),
            classifier: self.classifier.take(),
            fingerprint: crate::query_log::FingerprintId::new(&self.fingerprint.id),
            arrived: self.arrived,
            admitted: self.admitted.as_ref().map(|_| self.arrived + queued),
            queued_ms: queued.as_millis() as u64,
            run_ms,
            outcome,
            demoted,
            rows: self.rows,
            query: self.query.clone(),
        });
    }
}

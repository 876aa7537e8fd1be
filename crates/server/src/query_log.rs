//! `system.query_log`: one row per finished statement that went through admission, newest
//! kept. It is what an operator tunes lanes from, and what `sluice simulate` replays.
//!
//! Bounded: at most `server.query_log_size` rows (default [`DEFAULT_SIZE`]) are kept in
//! memory; the oldest goes first. 0 keeps none.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Rows kept when the config says nothing.
pub const DEFAULT_SIZE: usize = 10_000;

/// How a statement ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Stopped by a cancel request, or its client went away.
    Cancelled,
    /// Failed, with this ClickHouse code name.
    Error(&'static str),
}

impl Outcome {
    pub fn name(&self) -> &str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Cancelled => "cancelled",
            Outcome::Error(code) => code,
        }
    }
}

/// One finished statement.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub query_id: u64,
    // Shared with the statement's other records, not copied (see `crate::state::Process`).
    pub user: Arc<str>,
    /// Where it ended (after any demotion or move).
    pub workload: Arc<str>,
    /// Where it was admitted.
    pub initial_workload: Arc<str>,
    /// The classifier that placed it (as of its admission), if one did.
    pub classifier: Option<String>,
    /// Its fingerprint's id (only the id: a fingerprint holds the whole normalized text, which
    /// for a huge statement the log's rows would keep alive many times over).
    pub fingerprint: FingerprintId,
    /// When it arrived.
    pub arrived: SystemTime,
    /// When it was admitted (`None`: it never was).
    pub admitted: Option<SystemTime>,
    pub queued_ms: u64,
    pub run_ms: u64,
    pub outcome: Outcome,
    /// Demoted while it ran.
    pub demoted: bool,
    pub rows: u64,
    /// Its first 2,000 characters.
    pub query: Arc<str>,
}

/// A fingerprint's id (16 hex digits, [`sluice_sql::Fingerprint::id`]) held in place: a row
/// per statement costs no allocation for it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FingerprintId {
    len: u8,
    bytes: [u8; 16],
}

impl FingerprintId {
    /// `id`'s first 16 bytes (all of an id; a longer string is cut at a character boundary).
    pub fn new(id: &str) -> FingerprintId {
        let mut end = id.len().min(16);
        while !id.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0; 16];
        bytes[..end].copy_from_slice(&id.as_bytes()[..end]);
        FingerprintId {
            len: end as u8,
            bytes,
        }
    }

    pub fn as_str(&self) -> &str {
        // Whole characters were copied in `new`.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::fmt::Debug for FingerprintId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// The last rows, oldest first.
#[derive(Debug)]
pub struct QueryLog {
    size: usize,
    rows: Mutex<VecDeque<Row>>,
}

impl QueryLog {
    pub fn new(size: usize) -> QueryLog {
        QueryLog {
            size,
            rows: Mutex::new(VecDeque::with_capacity(size.min(1024))),
        }
    }

    pub fn push(&self, row: Row) {
        if self.size == 0 {
            return;
        }
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        while rows.len() >= self.size {
            rows.pop_front();
        }
        rows.push_back(row);
    }

    pub fn rows(&self) -> Vec<Row> {
        self.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(query_id: u64) -> Row {
        Row {
            query_id,
            user: "u".into(),
            workload: "w".into(),
            initial_workload: "w".into(),
            classifier: None,
            fingerprint: FingerprintId::new(""),
            arrived: SystemTime::UNIX_EPOCH,
            admitted: None,
            queued_ms: 0,
            run_ms: 0,
            outcome: Outcome::Ok,
            demoted: false,
            rows: 0,
            query: "".into(),
        }
    }

    #[test]
    fn keeps_the_newest_rows_up_to_its_size() {
        let log = QueryLog::new(3);
        for id in 1..=5 {
            log.push(row(id));
        }
        let ids: Vec<u64> = log.rows().iter().map(|r| r.query_id).collect();
        assert_eq!(ids, [3, 4, 5]);
        let none = QueryLog::new(0);
        none.push(row(1));
        assert!(none.rows().is_empty());
    }

    #[test]
    fn a_fingerprint_id_is_kept_whole_and_a_longer_string_cut_at_a_character() {
        let id = sluice_sql::fingerprint("SELECT 1").id;
        assert_eq!(FingerprintId::new(&id).as_str(), id);
        assert_eq!(FingerprintId::new("").as_str(), "");
        // 15 ASCII bytes, then a two-byte character that does not fit whole.
        let long = format!("{}é", "a".repeat(15));
        assert_eq!(FingerprintId::new(&long).as_str(), "a".repeat(15));
    }
}

//! Learned lanes: what the server remembers of each statement fingerprint's runs, and the lane
//! a fingerprint is sent to once it has been demoted.
//!
//! A fingerprint whose run was demoted (it overran its workload's `demote_after`) is remembered
//! with the lane it was demoted to; its later runs from a workload that demotes to that lane
//! are admitted straight into it. After `relearn_after` runs in a row that finish within the
//! deadline, it is forgotten (a report that got faster goes back to the fast lane). An
//! operator may pin a fingerprint to a lane (`PIN FINGERPRINT 'id' TO WORKLOAD w`): pinned
//! runs go there whatever workload they asked for, and nothing unpins them but
//! `FORGET FINGERPRINT 'id'`.
//!
//! Durable: every change of a lane (learned, forgotten, pinned) rewrites
//! `<data-dir>/fingerprints.tsv` atomically, so a restart keeps the lanes. Run statistics
//! (runs, durations) are kept in memory beside them and saved with the next lane change.
//! At most [`MAX_FINGERPRINTS`] fingerprints are kept; past that the least recently run one
//! without a lane goes.
//!
//! In a fleet the lanes are the fleet's: every change of a lane made here is handed to
//! whoever follows [`LaneBook::changes`] (the fleet stores it in etcd), and the other nodes'
//! changes come back through [`LaneBook::adopt`]. Run statistics stay per node.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use sluice_sql::{Error, ErrorCode, Fingerprint, Result};

/// Fingerprints kept in memory at most.
pub const MAX_FINGERPRINTS: usize = 10_000;

/// Run times kept per fingerprint for its percentiles.
const RECENT_RUNS: usize = 128;

const FILE: &str = "fingerprints.tsv";
const HEADER: &str =
    "# sluice learned lanes: fingerprint, lane, pinned, runs, demotions, last_ms, sample_query";

/// What is known of one fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    pub sample_query: String,
    pub runs: u64,
    pub demotions: u64,
    pub last_ms: u64,
    /// The most recent run times, newest last.
    recent: VecDeque<u64>,
    /// Where its runs are admitted, when learned or pinned.
    pub lane: Option<String>,
    pub pinned: bool,
    /// Runs in a row that finished within the deadline since the lane was learned.
    fast_streak: u32,
    /// Bumped with each run: which fingerprint ran least recently.
    last_seen: u64,
}

impl Entry {
    /// The `q`-quantile (0..=1) of the recent run times, in ms.
    pub fn quantile_ms(&self, q: f64) -> Option<u64> {
        if self.recent.is_empty() {
            return None;
        }
        let mut sorted: Vec<u64> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let rank = ((sorted.len() as f64 - 1.0) * q).round() as usize;
        sorted.get(rank).copied()
    }

    /// One more finished run: `true` when what the book saves changed (relearned fast).
    fn note_run(
        &mut self,
        fingerprint: &Fingerprint,
        clock: u64,
        sample_query: &str,
        run: &Run,
    ) -> bool {
        if self.sample_query.is_empty() {
            self.sample_query = sluice_sql::first_chars(sample_query, 1000).to_string();
        }
        self.runs += 1;
        self.last_ms = run.ms;
        self.last_seen = clock;
        self.recent.push_back(run.ms);
        if self.recent.len() > RECENT_RUNS {
            self.recent.pop_front();
        }
        let mut changed = false;
        if run.demoted_to.is_some() {
            // Learned when it was demoted ([`LaneBook::demoted`]); a slow run breaks a streak.
            self.fast_streak = 0;
        } else if self.lane.is_some() && !self.pinned {
            if run.fast {
                self.fast_streak += 1;
                if self.fast_streak >= run.relearn_after {
                    tracing::info!(fingerprint = %fingerprint.id, "relearned: runs fast again");
                    self.lane = None;
                    self.fast_streak = 0;
                    changed = true;
                }
            } else {
                self.fast_streak = 0;
            }
        }
        changed
    }
}

/// How one run ended, for the book.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// From admission to the end.
    pub ms: u64,
    /// The lane it was demoted to, when it was.
    pub demoted_to: Option<String>,
    /// Finished within its deadline (not demoted, and not failed).
    pub fast: bool,
    /// The origin workload's `relearn_after`.
    pub relearn_after: u32,
}

/// The learned lanes of one data dir.
#[derive(Debug)]
pub struct LaneBook {
    /// Where the lanes are saved; `None`: kept in memory only (`sluice simulate`).
    path: Option<PathBuf>,
    state: Mutex<State>,
    /// Fingerprints with a lane: while there are none, [`LaneBook::lane`] takes no lock.
    with_lane: AtomicUsize,
    /// In a fleet: where this node's changes of a lane go (see the module docs).
    changes: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<LaneChange>>,
}

/// A change of a fingerprint's lane: its id, and its lane and whether it is pinned there
/// (`None`: forgotten).
pub type LaneChange = (String, Option<(String, bool)>);

#[derive(Debug, Default)]
struct State {
    entries: BTreeMap<String, Entry>,
    clock: u64,
}

impl LaneBook {
    /// Opens the book of `data_dir`, reading the lanes a previous run saved.
    pub fn open(data_dir: &Path) -> Result<LaneBook> {
        let path = data_dir.join(FILE);
        let mut state = State::default();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for (n, line) in text.lines().enumerate() {
                    if line.starts_with('#') || line.trim().is_empty() {
                        continue;
                    }
                    let (id, entry) = parse_line(line).ok_or_else(|| {
                        Error::new(
                            ErrorCode::CorruptedData,
                            format!(
                                "{} line {}: not a learned lane (fingerprint, lane, pinned, runs, demotions, last_ms, sample_query separated by tabs); fix or delete the line",
                                path.display(),
                                n + 1
                            ),
                        )
                    })?;
                    state.entries.insert(id, entry);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::new(
                    ErrorCode::InternalError,
                    format!("cannot read {}: {e}", path.display()),
                ))
            }
        }
        let with_lane = state.entries.len();
        Ok(LaneBook {
            path: Some(path),
            state: Mutex::new(state),
            with_lane: AtomicUsize::new(with_lane),
            changes: std::sync::OnceLock::new(),
        })
    }

    /// A book that saves nothing (a simulation's).
    pub fn in_memory() -> LaneBook {
        LaneBook {
            path: None,
            state: Mutex::default(),
            with_lane: AtomicUsize::new(0),
            changes: std::sync::OnceLock::new(),
        }
    }

    /// From now on, every change of a lane made on this node (learned, relearned, pinned,
    /// forgotten), in order; `None` when someone follows them already.
    pub fn changes(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<LaneChange>> {
        let (sender, changes) = tokio::sync::mpsc::unbounded_channel();
        self.changes.set(sender).ok()?;
        Some(changes)
    }

    fn changed(&self, id: &str, lane: Option<(String, bool)>) {
        if let Some(changes) = self.changes.get() {
            let _ = changes.send((id.to_string(), lane));
        }
    }

    /// Takes a change of a lane another node of the fleet made (not handed on again). Whether
    /// it changed anything here.
    pub fn adopt(&self, id: &str, lane: Option<(String, bool)>) -> Result<bool> {
        let mut state = self.lock();
        let now = state
            .entries
            .get(id)
            .and_then(|e| e.lane.clone().map(|l| (l, e.pinned)));
        if now == lane {
            return Ok(false);
        }
        let entry = state.entries.entry(id.to_string()).or_default();
        entry.fast_streak = 0;
        match lane {
            Some((lane, pinned)) => {
                entry.lane = Some(lane);
                entry.pinned = pinned;
            }
            None => {
                entry.lane = None;
                entry.pinned = false;
            }
        }
        self.save(&state)?;
        Ok(true)
    }

    /// Every fingerprint with a lane: (id, lane, pinned).
    pub fn lanes(&self) -> Vec<(String, String, bool)> {
        self.lock()
            .entries
            .iter()
            .filter_map(|(id, e)| Some((id.clone(), e.lane.clone()?, e.pinned)))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lane fingerprint `id` is admitted to, and whether it is pinned there.
    pub fn lane(&self, id: &str) -> Option<(String, bool)> {
        if self.with_lane.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let state = self.lock();
        let entry = state.entries.get(id)?;
        entry.lane.clone().map(|lane| (lane, entry.pinned))
    }

    /// Records one finished run of `fingerprint`.
    pub fn record(&self, fingerprint: &Fingerprint, sample_query: &str, run: Run) -> Result<()> {
        let mut state = self.lock();
        state.clock += 1;
        let clock = state.clock;
        // Known already, most often: one lookup.
        let changed = match state.entries.get_mut(&fingerprint.id) {
            Some(entry) => entry.note_run(fingerprint, clock, sample_query, &run),
            None => {
                if state.entries.len() >= MAX_FINGERPRINTS {
                    let oldest = state
                        .entries
                        .iter()
                        .filter(|(_, e)| e.lane.is_none())
                        .min_by_key(|(_, e)| e.last_seen)
                        .map(|(id, _)| id.clone());
                    match oldest {
                        Some(id) => {
                            state.entries.remove(&id);
                        }
                        None => return Ok(()), // every kept one has a lane: keep those, learn no more
                    }
                }
                state
                    .entries
                    .entry(fingerprint.id.clone())
                    .or_default()
                    .note_run(fingerprint, clock, sample_query, &run)
            }
        };
        if changed {
            // Relearned: runs fast again.
            self.changed(&fingerprint.id, None);
            self.save(&state)?;
        }
        Ok(())
    }

    /// A run of `fingerprint` was just demoted to `to`: from now on its runs are admitted there
    /// (unless it is pinned elsewhere). Learned at once, not when the run ends, so the next run
    /// — maybe already arriving — goes to the slow lane.
    pub fn demoted(&self, fingerprint: &Fingerprint, sample_query: &str, to: &str) -> Result<()> {
        let mut state = self.lock();
        state.clock += 1;
        let clock = state.clock;
        let entry = state.entries.entry(fingerprint.id.clone()).or_default();
        if entry.sample_query.is_empty() {
            entry.sample_query = sluice_sql::first_chars(sample_query, 1000).to_string();
        }
        entry.demotions += 1;
        entry.fast_streak = 0;
        entry.last_seen = clock;
        if entry.pinned || entry.lane.as_deref() == Some(to) {
            return Ok(());
        }
        tracing::info!(fingerprint = %fingerprint.id, lane = %to, "learned: runs slow");
        entry.lane = Some(to.to_string());
        self.changed(&fingerprint.id, Some((to.to_string(), false)));
        self.save(&state)
    }

    /// Pins fingerprint `id` to `workload` (its runs go there until forgotten).
    pub fn pin(&self, id: &str, workload: &str) -> Result<()> {
        let mut state = self.lock();
        let entry = state.entries.entry(id.to_string()).or_default();
        entry.lane = Some(workload.to_string());
        entry.pinned = true;
        entry.fast_streak = 0;
        self.changed(id, Some((workload.to_string(), true)));
        self.save(&state)
    }

    /// Forgets fingerprint `id`'s lane (learned or pinned). Whether it had one.
    pub fn forget(&self, id: &str) -> Result<bool> {
        let mut state = self.lock();
        let had = match state.entries.get_mut(id) {
            Some(e) if e.lane.is_some() => {
                e.lane = None;
                e.pinned = false;
                e.fast_streak = 0;
                true
            }
            _ => false,
        };
        if had {
            self.changed(id, None);
            self.save(&state)?;
        }
        Ok(had)
    }

    /// Every fingerprint known, by id.
    pub fn entries(&self) -> Vec<(String, Entry)> {
        self.lock()
            .entries
            .iter()
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect()
    }

    /// Writes the fingerprints with a lane (the others are statistics only).
    fn save(&self, state: &State) -> Result<()> {
        let with_lane = state.entries.values().filter(|e| e.lane.is_some()).count();
        self.with_lane.store(with_lane, Ordering::Relaxed);
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut text = String::from(HEADER);
        text.push('\n');
        for (id, e) in &state.entries {
            let Some(lane) = &e.lane else { continue };
            text.push_str(&format!(
                "{id}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                escape(lane),
                e.pinned,
                e.runs,
                e.demotions,
                e.last_ms,
                escape(&e.sample_query)
            ));
        }
        sluice_catalog::write_atomically(path, text.as_bytes())
    }
}

/// Where a statement is admitted instead of the workload it asked for: the lane its
/// fingerprint is pinned to, or the lane it was learned to need when the workload it asked
/// for demotes there (`demotion`); `None`: where it asked. A user pinned to a workload (`user_pinned`) stays in it; a lane that is
/// no longer a leaf of `catalog` (dropped, or given children since) is not used.
pub fn lane_for(
    book: &LaneBook,
    catalog: &sluice_catalog::Catalog,
    user_pinned: bool,
    demotion: Option<&sluice_catalog::Demotion>,
    fingerprint: &Fingerprint,
) -> Option<String> {
    let lane = match book.lane(&fingerprint.id) {
        Some((lane, true)) if !user_pinned => lane,
        Some((lane, false)) if demotion.is_some_and(|d| d.to == lane) => lane,
        _ => return None,
    };
    if catalog.workload(&lane).is_none() || catalog.children_of(&lane).next().is_some() {
        return None;
    }
    Some(lane)
}

fn parse_line(line: &str) -> Option<(String, Entry)> {
    let mut f = line.split('\t');
    let id = f.next()?.to_string();
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let lane = unescape(f.next()?);
    let pinned = f.next()?.parse().ok()?;
    let runs = f.next()?.parse().ok()?;
    let demotions = f.next()?.parse().ok()?;
    let last_ms = f.next()?.parse().ok()?;
    let sample_query = unescape(f.next()?);
    if f.next().is_some() || lane.is_empty() {
        return None;
    }
    Some((
        id,
        Entry {
            sample_query,
            runs,
            demotions,
            last_ms,
            lane: Some(lane),
            pinned,
            ..Entry::default()
        },
    ))
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('\t', "\\t")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ms: u64, demoted_to: Option<&str>) -> Run {
        Run {
            ms,
            demoted_to: demoted_to.map(str::to_string),
            fast: demoted_to.is_none(),
            relearn_after: 2,
        }
    }

    #[test]
    fn a_demoted_fingerprint_is_learned_kept_across_a_reopen_and_relearned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fp = sluice_sql::fingerprint("SELECT * FROM big WHERE day = '2026-01-01'");
        let book = LaneBook::open(dir.path()).expect("opens");
        book.record(&fp, "SELECT …\twith a tab", run(10, None))
            .expect("records");
        assert_eq!(book.lane(&fp.id), None);
        book.demoted(&fp, "x", "slow").expect("learns");
        assert_eq!(book.lane(&fp.id), Some(("slow".into(), false)));
        book.record(&fp, "x", run(30_000, Some("slow")))
            .expect("records");

        let book = LaneBook::open(dir.path()).expect("reopens");
        assert_eq!(book.lane(&fp.id), Some(("slow".into(), false)));
        // Statistics are saved with lane changes: as they were when it was learned.
        let (_, entry) = book.entries().remove(0);
        assert_eq!(
            (entry.runs, entry.demotions, entry.sample_query.as_str()),
            (1, 1, "SELECT …\twith a tab")
        );
        // Two fast runs in a row (relearn_after = 2) forget it; a slow one between resets.
        book.record(&fp, "x", run(5, None)).expect("records");
        let mut slow_between = run(5, None);
        slow_between.fast = false;
        book.record(&fp, "x", slow_between).expect("records");
        book.record(&fp, "x", run(5, None)).expect("records");
        assert!(book.lane(&fp.id).is_some(), "the streak was broken");
        book.record(&fp, "x", run(5, None)).expect("records");
        assert_eq!(book.lane(&fp.id), None);
        assert_eq!(
            LaneBook::open(dir.path()).expect("reopens").lane(&fp.id),
            None
        );
    }

    #[test]
    fn pins_hold_until_forgotten_and_bad_files_say_where() {
        let dir = tempfile::tempdir().expect("tempdir");
        let book = LaneBook::open(dir.path()).expect("opens");
        let fp = sluice_sql::fingerprint("SELECT 1");
        book.pin(&fp.id, "slow").expect("pins");
        for _ in 0..5 {
            book.record(&fp, "SELECT 1", run(1, None)).expect("records");
        }
        assert_eq!(book.lane(&fp.id), Some(("slow".into(), true)));
        assert!(book.forget(&fp.id).expect("forgets"));
        assert!(!book.forget(&fp.id).expect("forgets"));
        assert_eq!(book.lane(&fp.id), None);

        std::fs::write(dir.path().join(FILE), "not a lane\n").expect("write");
        let e = LaneBook::open(dir.path()).expect_err("corrupt");
        assert!(e.message.contains("line 1"), "{}", e.message);
    }
}

//! Properties of both runtimes over random trees, arrivals, cancellations, moves and catalog
//! changes: no limit is passed by a grant or an admission, nothing leaks, and every request
//! still waiting is granted once everything before it is gone.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use sluice_catalog::Catalog;
use sluice_sched::{
    compile, Acquire, Allocation, Clock, Machine, MemoryScheduler, PendingAllocation, Permit,
    ResourceScheduler, TokioClock,
};
use sluice_sql::parse_script;

const MACHINE: Machine = Machine {
    cores: 4,
    memory: 1 << 34,
};
const LEAVES: [&str; 3] = ["a", "b", "c"];

/// A two-level tree over leaves a, b (under team) and c, with the given limits (0: none).
fn ddl(root: u8, team: u8, leaf_a: u8, weight_c: u8, prio_c: i8) -> String {
    let limit = |n: u8| {
        if n == 0 {
            String::new()
        } else {
            format!(
                " SETTINGS max_concurrent_queries = {n}, max_memory = {}",
                u32::from(n) * 10
            )
        }
    };
    format!(
        "CREATE OR REPLACE WORKLOAD all{};
         CREATE OR REPLACE WORKLOAD team IN all{};
         CREATE OR REPLACE WORKLOAD a IN team{};
         CREATE OR REPLACE WORKLOAD b IN team;
         CREATE OR REPLACE WORKLOAD c IN all SETTINGS weight = {}, priority = {prio_c}, precedence = {prio_c}",
        limit(root),
        limit(team),
        limit(leaf_a),
        weight_c.max(1),
    )
}

fn trees(catalog: &mut Catalog, ddl: &str) -> sluice_sched::SchedulerTrees {
    for item in parse_script(ddl) {
        catalog
            .apply_mut(&item.result.expect("parses"))
            .expect("applies");
    }
    compile(catalog, MACHINE).expect("compiles")
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(usize),
    Release(usize),
    Cancel(usize),
    Move(usize, usize),
    Reconfigure(u8, u8, u8, u8, i8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize).prop_map(Op::Acquire),
        3 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (any::<usize>(), 0..3usize).prop_map(|(i, w)| Op::Move(i, w)),
        1 => (0..4u8, 0..3u8, 0..3u8, 1..4u8, -1..2i8)
            .prop_map(|(r, t, a, w, p)| Op::Reconfigure(r, t, a, w, p)),
    ]
}

fn poll<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(f).poll(&mut cx) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Moves every future of `waiting` that is ready into `done`; keeps the rest waiting. Fails on
/// the first that ended in an error (no wait may fail in these runs).
fn settle<F, T>(waiting: &mut Vec<F>, done: &mut Vec<T>) -> Result<(), String>
where
    F: Future<Output = sluice_sql::Result<T>> + Unpin,
{
    let mut still = Vec::new();
    for mut f in waiting.drain(..) {
        match poll(&mut f) {
            Some(Ok(v)) => done.push(v),
            Some(Err(e)) => return Err(format!("a wait failed: {e}")),
            None => still.push(f),
        }
    }
    *waiting = still;
    Ok(())
}

/// `inflight_requests` of every inflight_limit, by path, with its limit.
fn inflight(
    s: &ResourceScheduler,
    trees: &sluice_sched::SchedulerTrees,
) -> Vec<(String, i64, i64)> {
    let limits: std::collections::HashMap<String, i64> = trees
        .rows()
        .into_iter()
        .filter_map(|r| Some((r.path.clone(), r.max_requests()?)))
        .collect();
    s.nodes()
        .into_iter()
        .filter_map(|n| Some((n.path.clone(), n.inflight_requests?, *limits.get(&n.path)?)))
        .collect()
}

/// A clock the test moves by hand.
#[derive(Debug)]
struct HandClock(std::sync::Mutex<tokio::time::Instant>);

impl Clock for HandClock {
    fn now(&self) -> tokio::time::Instant {
        *self.0.lock().expect("clock")
    }
}

/// Every node type the time-shared runtime has, on the paths to leaves a, b and c: caps,
/// a rate limit with a small burst, weights, priorities and an outranked share.
const IDLE_GRANT_TREE: &str = "CREATE RESOURCE q (QUERY);
     CREATE WORKLOAD all SETTINGS max_concurrent_queries = 3, max_queries_per_second = 2, max_burst_queries = 2;
     CREATE WORKLOAD team IN all SETTINGS priority = 0;
     CREATE WORKLOAD a IN team SETTINGS weight = 3, max_concurrent_queries = 1;
     CREATE WORKLOAD b IN team;
     CREATE WORKLOAD c IN all SETTINGS priority = 1, outranked_share = 0.5, max_waiting_queries = 2";

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A request that finds the tree idle is granted without taking the queue; that shortcut
    /// must leave every node exactly as enqueue and dispatch would (counters, vruntimes,
    /// tokens, throughput, credit), grant the same requests and refuse the same ones. Two
    /// schedulers of one tree, one with the shortcut off, run the same operations.
    #[test]
    fn idle_grants_change_what_the_queue_would(ops in proptest::collection::vec((op(), 0..3u64), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("rt");
        let _guard = rt.enter();
        let clock = Arc::new(HandClock(std::sync::Mutex::new(tokio::time::Instant::now())));
        let trees = trees(&mut Catalog::new(), IDLE_GRANT_TREE);
        let tree = trees.tree("q").expect("q");
        let fast = ResourceScheduler::new(tree, clock.clone());
        let queued = ResourceScheduler::new(tree, clock.clone()).without_idle_grants();
        let mut granted: [Vec<Permit>; 2] = [Vec::new(), Vec::new()];
        let mut waiting: [Vec<Acquire>; 2] = [Vec::new(), Vec::new()];
        for (op, tick) in ops {
            *clock.0.lock().expect("clock") += std::time::Duration::from_millis(250 * tick);
            for (side, s) in [&fast, &queued].into_iter().enumerate() {
                match &op {
                    Op::Acquire(w) => {
                        if let Ok(acquire) = s.acquire(LEAVES[*w], 1) {
                            waiting[side].push(acquire);
                        }
                    }
                    Op::Release(i) if !granted[side].is_empty() => {
                        let n = granted[side].len();
                        granted[side].remove(i % n);
                    }
                    Op::Cancel(i) if !waiting[side].is_empty() => {
                        let n = waiting[side].len();
                        waiting[side].remove(i % n);
                    }
                    Op::Move(i, w) if !granted[side].is_empty() => {
                        let n = granted[side].len();
                        granted[side][i % n].move_to(s, LEAVES[*w]).expect("moves to a leaf");
                    }
                    _ => {}
                }
                settle(&mut waiting[side], &mut granted[side]).map_err(TestCaseError::fail)?;
            }
            prop_assert_eq!(granted[0].len(), granted[1].len(), "granted after {:?}", op);
            prop_assert_eq!(waiting[0].len(), waiting[1].len(), "waiting after {:?}", op);
            prop_assert_eq!(fast.nodes(), queued.nodes(), "nodes after {:?}", op);
        }
    }

    /// Query slots: a grant never takes an inflight_limit past its max (moves and lowered
    /// limits may leave it over; then nothing more is granted there until it is back under);
    /// at the end, with every permit and wait dropped, nothing is held or queued; and every
    /// request still waiting when the held ones are released is granted.
    #[test]
    fn time_shared_runtime_keeps_limits_and_leaks_nothing(ops in proptest::collection::vec(op(), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("rt");
        let _guard = rt.enter();
        let mut catalog = Catalog::new();
        let mut current = trees(&mut catalog, &format!("CREATE RESOURCE q (QUERY); {}", ddl(2, 1, 1, 1, 0)));
        let mut s = ResourceScheduler::new(current.tree("q").expect("q"), Arc::new(TokioClock));
        let mut granted: Vec<Permit> = Vec::new();
        let mut waiting: Vec<Acquire> = Vec::new();
        for op in ops {
            let before = inflight(&s, &current);
            let mut moved = false;
            match op {
                Op::Acquire(w) => match s.acquire(LEAVES[w], 1) {
                    Ok(acquire) => waiting.push(acquire),
                    Err(e) => prop_assert!(false, "acquire failed: {e}"),
                },
                Op::Release(i) if !granted.is_empty() => { granted.remove(i % granted.len()); }
                Op::Cancel(i) if !waiting.is_empty() => { waiting.remove(i % waiting.len()); }
                Op::Move(i, w) if !granted.is_empty() => {
                    let n = granted.len();
                    granted[i % n].move_to(&s, LEAVES[w]).expect("moves to a leaf");
                    moved = true;
                }
                Op::Reconfigure(r, t, a, w, p) => {
                    current = trees(&mut catalog, &ddl(r, t, a, w, p));
                    s = s.succeed(current.tree("q").expect("q"));
                    moved = true; // running requests keep counting under lowered limits
                }
                _ => {}
            }
            // Collect what was granted meanwhile.
            settle(&mut waiting, &mut granted).map_err(TestCaseError::fail)?;
            if !moved {
                for ((path, now, max), (_, then, _)) in inflight(&s, &current).iter().zip(&before) {
                    prop_assert!(now <= max || now <= then, "{path}: {now} in flight, max {max}, was {then}");
                }
            }
        }
        // Release everything held: every waiter is granted in turn (none is lost).
        for _ in 0..1000 {
            if waiting.is_empty() { break; }
            granted.clear();
            settle(&mut waiting, &mut granted).map_err(TestCaseError::fail)?;
            prop_assert!(!granted.is_empty() || waiting.is_empty(), "waiters left with nothing held: {}", waiting.len());
        }
        granted.clear();
        for (path, n, _) in inflight(&s, &current) {
            prop_assert_eq!(n, 0, "{} leaked", path);
        }
        prop_assert_eq!(s.waiting(), 0);
    }

    /// Memory: allocations admitted, grown, shrunk, moved and dropped under random catalog
    /// changes; the root's `allocated` always equals the bytes the live allocations hold, and
    /// with everything dropped nothing is allocated or pending.
    #[test]
    fn space_shared_runtime_accounts_every_byte(ops in proptest::collection::vec(op(), 1..60), sizes in proptest::collection::vec(0..25i64, 60)) {
        let mut catalog = Catalog::new();
        let current = trees(&mut catalog, &format!("CREATE RESOURCE mem (MEMORY RESERVATION); {}", ddl(4, 3, 2, 1, 0)));
        let mut s = MemoryScheduler::new(current.tree("mem").expect("mem"));
        let mut running: Vec<Allocation> = Vec::new();
        let mut pending: Vec<PendingAllocation> = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            let size = sizes[step % sizes.len()];
            match op {
                Op::Acquire(w) => {
                    if let Ok(p) = s.allocate(LEAVES[w], size, Arc::new(|_| {})) {
                        pending.push(p);
                    }
                }
                Op::Release(i) if !running.is_empty() => {
                    let n = running.len();
                    if size % 2 == 0 {
                        running.remove(i % n);
                    } else {
                        let _ = running[i % n].try_grow(size);
                        running[i % n].shrink(size / 3);
                    }
                }
                Op::Cancel(i) if !pending.is_empty() => { pending.remove(i % pending.len()); }
                Op::Move(i, w) if !running.is_empty() => {
                    let n = running.len();
                    running[i % n].move_to(LEAVES[w]).expect("moves to a leaf");
                }
                Op::Reconfigure(r, t, a, w, p) => {
                    let next = trees(&mut catalog, &ddl(r + 1, t + 1, a + 1, w, p));
                    s = s.succeed(next.tree("mem").expect("mem"));
                }
                _ => {}
            }
            settle(&mut pending, &mut running).map_err(TestCaseError::fail)?;
            let held: i64 = running.iter().map(Allocation::size).sum();
            let root = s.nodes().into_iter().find(|n| n.path == "/all").expect("root");
            prop_assert_eq!(root.allocated, held);
        }
        drop(running);
        // Admitted as the running ones left, in the tree's order: drop each as it comes.
        for _ in 0..pending.len() {
            let mut admitted = Vec::new();
            settle(&mut pending, &mut admitted).map_err(TestCaseError::fail)?;
            drop(admitted);
        }
        drop(pending);
        for n in s.nodes() {
            prop_assert_eq!(n.allocated, 0, "{} leaked", n.path);
            prop_assert_eq!(n.pending.unwrap_or(0), 0);
        }
    }
}

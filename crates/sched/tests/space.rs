//! The space-shared (memory) nodes at work: admission order (FIFO in a leaf, precedence, then
//! max-min fair by weight), limits that make allocations wait, growth, eviction by
//! ClickHouse's rules, queue limits, and catalog changes that keep every allocation.

use std::sync::{Arc, Mutex};

use sluice_catalog::Catalog;
use sluice_sched::{compile, Allocation, KillSwitch, Machine, MemoryScheduler, PendingAllocation};
use sluice_sql::{parse_script, Error, ErrorCode};

const MACHINE: Machine = Machine {
    cores: 4,
    memory: 1 << 34,
};

fn tree(ddl: &str) -> sluice_sched::ResourceTree {
    let mut catalog = Catalog::new();
    for item in parse_script(&format!("CREATE RESOURCE mem (MEMORY RESERVATION); {ddl}")) {
        catalog
            .apply_mut(&item.result.expect("parses"))
            .expect("applies");
    }
    let trees = compile(&catalog, MACHINE).expect("compiles");
    trees.tree("mem").expect("tree mem").clone()
}

/// Who was killed, in order.
#[derive(Default, Clone)]
struct Kills(Arc<Mutex<Vec<String>>>);

impl Kills {
    fn switch(&self, name: &str) -> KillSwitch {
        let (kills, name) = (self.0.clone(), name.to_string());
        Arc::new(move |e: Error| {
            assert_eq!(e.code, ErrorCode::ResourceLimitExceeded);
            kills.lock().expect("lock").push(name.clone());
        })
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("lock"))
    }
}

fn admitted(mut pending: PendingAllocation) -> Result<Allocation, PendingAllocation> {
    if !pending.is_admitted() {
        return Err(pending);
    }
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match std::pin::Pin::new(&mut pending).poll(&mut cx) {
        std::task::Poll::Ready(Ok(a)) => Ok(a),
        other => panic!("admitted but {other:?}"),
    }
}

use std::future::Future;

/// `allocated` of the node at `path`.
fn allocated(s: &MemoryScheduler, path: &str) -> i64 {
    s.nodes()
        .into_iter()
        .find(|n| n.path == path)
        .unwrap_or_else(|| panic!("no node {path}"))
        .allocated
}

#[test]
fn a_limit_makes_reservations_wait_in_order_and_admits_them_as_memory_frees() {
    let s = MemoryScheduler::new(&tree(
        "CREATE WORKLOAD all SETTINGS max_memory = 100; CREATE WORKLOAD w IN all",
    ));
    let kills = Kills::default();
    let a = admitted(s.allocate("w", 60, kills.switch("a")).expect("a")).expect("fits");
    let b = s.allocate("w", 50, kills.switch("b")).expect("b");
    let c = s.allocate("w", 10, kills.switch("c")).expect("c");
    // b does not fit, and c (which would) waits behind it: FIFO in a leaf.
    let b = admitted(b).expect_err("waits");
    let c = admitted(c).expect_err("waits behind b");
    assert!(
        kills.take().is_empty(),
        "a pending allocation never evicts its own workload's"
    );
    // Larger than the limit on its own: refused at once.
    let e = s
        .allocate("w", 101, kills.switch("x"))
        .expect_err("too big");
    assert_eq!(e.code, ErrorCode::ResourceLimitExceeded);
    assert!(
        e.message.contains("exceeds the limit of 100"),
        "{}",
        e.message
    );
    a.shrink(20);
    // 40 + 50 fits now, and c behind it too: 100 of 100.
    let b = admitted(b).expect("b after a shrinks");
    let c = admitted(c).expect("c behind b");
    assert_eq!(allocated(&s, "/all"), 100);
    drop((a, b, c));
    assert_eq!(allocated(&s, "/all"), 0, "nothing held");
    let node = s
        .nodes()
        .into_iter()
        .find(|n| n.path == "/all")
        .expect("all");
    assert_eq!((node.stats.admits, node.stats.removes), (3, 3));
}

#[test]
fn max_waiting_queries_refuses_pending_allocations_past_it() {
    let s = MemoryScheduler::new(&tree(
        "CREATE WORKLOAD all SETTINGS max_memory = 10; CREATE WORKLOAD w IN all SETTINGS max_waiting_queries = 1",
    ));
    let kills = Kills::default();
    let _a = admitted(s.allocate("w", 10, kills.switch("a")).expect("a")).expect("fits");
    let _b = s.allocate("w", 5, kills.switch("b")).expect("queued");
    let e = s.allocate("w", 5, kills.switch("c")).expect_err("full");
    assert_eq!(e.code, ErrorCode::ServerOverloaded);
    let queue = s
        .nodes()
        .into_iter()
        .find(|n| n.path.ends_with("/w/queue"))
        .expect("queue");
    assert_eq!((queue.pending, queue.stats.rejects), (Some(1), 1));
}

#[test]
fn admission_goes_by_precedence_then_max_min_fair_by_weight() {
    let s = MemoryScheduler::new(&tree(
        "CREATE WORKLOAD all SETTINGS max_memory = 100;
         CREATE WORKLOAD prod IN all SETTINGS precedence = -1;
         CREATE WORKLOAD etl IN all SETTINGS weight = 3;
         CREATE WORKLOAD adhoc IN all SETTINGS weight = 1",
    ));
    let kills = Kills::default();
    let hold = admitted(
        s.allocate("adhoc", 100, kills.switch("hold"))
            .expect("hold"),
    )
    .expect("fits");
    // Waiting: two of etl, two of adhoc, then one of prod (which arrives last).
    let etl1 = s.allocate("etl", 30, kills.switch("etl1")).expect("etl1");
    let adhoc1 = s
        .allocate("adhoc", 10, kills.switch("adhoc1"))
        .expect("adhoc1");
    let prod = s.allocate("prod", 20, kills.switch("prod")).expect("prod");
    // A pending allocation of higher precedence evicts lower precedence (adhoc's hold); the
    // pending ones of etl and adhoc evicted nobody (equal precedence, or their own workload).
    assert_eq!(kills.take(), ["hold"]);
    drop(hold);
    // prod first (lowest precedence value), then the fair pair: adhoc has 0 allocated / 1,
    // etl 0 / 3 — a tie broken by order; after etl1's 30 (10 per weight) adhoc goes next.
    let prod = admitted(prod).expect("prod first");
    let etl1 = admitted(etl1).expect("etl");
    let adhoc1 = admitted(adhoc1).expect("adhoc");
    assert_eq!(allocated(&s, "/all"), 60);
    drop((prod, etl1, adhoc1));
}

#[test]
fn eviction_follows_clickhouses_rules() {
    let s = MemoryScheduler::new(&tree(
        "CREATE WORKLOAD all SETTINGS max_memory = 100;
         CREATE WORKLOAD prod IN all SETTINGS precedence = -1;
         CREATE WORKLOAD dev IN all SETTINGS precedence = 1",
    ));
    let kills = Kills::default();
    let dev_small =
        admitted(s.allocate("dev", 0, kills.switch("dev_small")).expect("d")).expect("0 runs");
    let dev_big =
        admitted(s.allocate("dev", 0, kills.switch("dev_big")).expect("d")).expect("0 runs");
    dev_small.try_grow(20).expect("fits");
    dev_big.try_grow(60).expect("fits");
    let prod = admitted(s.allocate("prod", 0, kills.switch("prod")).expect("p")).expect("0 runs");
    prod.try_grow(10).expect("fits: 90 of 100");
    // prod grows past the limit: the victim is in dev (highest precedence value), its largest.
    prod.try_grow(30).expect("granted, evicting");
    assert_eq!(kills.take(), ["dev_big"]);
    // dev grows past it: lower precedence never evicts higher, and nothing else is there.
    let e = dev_small.try_grow(60).expect_err("no victim for dev");
    assert_eq!(e.code, ErrorCode::ResourceLimitExceeded);
    assert!(kills.take().is_empty());
    // The evicted one's next growth fails; what it frees as it stops lets others in.
    assert!(dev_big.try_grow(1).is_err());
    drop(dev_big);
    dev_small
        .try_grow(30)
        .expect("fits once the victim is gone");
    // A pending dev allocation cannot evict anyone (its own workload, or higher precedence).
    let waiting = s
        .allocate("dev", 50, kills.switch("waiting"))
        .expect("queued");
    let waiting = admitted(waiting).expect_err("waits");
    assert!(kills.take().is_empty());
    // A pending prod allocation may evict lower precedence.
    let prod2 = s
        .allocate("prod", 40, kills.switch("prod2"))
        .expect("queued");
    drop(admitted(prod2).expect_err("waits for the victim"));
    assert_eq!(kills.take(), ["dev_small"]);
    drop(waiting);
    let victims: u64 = s
        .nodes()
        .into_iter()
        .filter(|n| n.path == "/all")
        .map(|n| n.stats.victims)
        .sum();
    assert!(victims >= 1);
    drop((prod, dev_small));
    assert_eq!(allocated(&s, "/all"), 0);
}

#[test]
fn a_catalog_change_keeps_running_and_pending_allocations() {
    let s = MemoryScheduler::new(&tree(
        "CREATE WORKLOAD all SETTINGS max_memory = 100; CREATE WORKLOAD w IN all",
    ));
    let kills = Kills::default();
    let a = admitted(s.allocate("w", 80, kills.switch("a")).expect("a")).expect("fits");
    let b = s.allocate("w", 50, kills.switch("b")).expect("queued");
    // The limit is raised and a sibling appears: a keeps counting, b is admitted.
    let next = s.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_memory = 200; CREATE WORKLOAD w IN all; CREATE WORKLOAD v IN all",
    ));
    let b = admitted(b).expect("admitted under the new limit");
    assert_eq!(allocated(&next, "/all"), 130);
    a.shrink(30);
    assert_eq!(allocated(&next, "/all"), 100);
    drop((a, b));
    assert_eq!(allocated(&next, "/all"), 0);
    // A pending allocation whose workload is gone fails.
    let hold =
        admitted(next.allocate("v", 200, kills.switch("hold")).expect("hold")).expect("fits");
    let c = next.allocate("v", 10, kills.switch("c")).expect("queued");
    let last = next.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_memory = 200; CREATE WORKLOAD w IN all",
    ));
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut c = c;
    match std::pin::Pin::new(&mut c).poll(&mut cx) {
        std::task::Poll::Ready(Err(e)) => assert_eq!(e.code, ErrorCode::InvalidSchedulerNode),
        other => panic!("{other:?}"),
    }
    drop(hold);
    assert_eq!(allocated(&last, "/all"), 0);
}

#[test]
fn a_running_allocation_moves_with_its_bytes() {
    let s = MemoryScheduler::new(&tree(
        "CREATE WORKLOAD all SETTINGS max_memory = 100;
         CREATE WORKLOAD fast IN all SETTINGS max_memory = 50;
         CREATE WORKLOAD slow IN all SETTINGS max_memory = 30",
    ));
    let kills = Kills::default();
    let a = admitted(s.allocate("fast", 40, kills.switch("a")).expect("a")).expect("fits");
    let waiting = s.allocate("slow", 20, kills.switch("w")).expect("queued");
    let waiting = admitted(waiting).expect("fits");
    // a moves to slow: slow now holds 60 of its 30 (past its limit, as a moved slot may be),
    // fast 0; the root never saw the bytes leave.
    a.move_to("slow").expect("moves");
    assert_eq!(allocated(&s, "/all"), 60);
    assert_eq!(allocated(&s, "/all/limit/p0_fair/fast"), 0);
    assert_eq!(allocated(&s, "/all/limit/p0_fair/slow"), 60);
    // New admissions in slow wait until it is back under.
    let next =
        admitted(s.allocate("slow", 5, kills.switch("n")).expect("queued")).expect_err("waits");
    assert!(a.move_to("all").is_err(), "not to a workload with children");
    drop(a);
    let next = admitted(next).expect("slow is back under: 20 + 5 of 30");
    drop((waiting, next));
    assert_eq!(allocated(&s, "/all"), 0);
}

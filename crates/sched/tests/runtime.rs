//! The time-shared scheduler nodes at work, in tokio's paused (virtual) time: caps, order,
//! fairness, rates, queue limits, cancellation, and that nothing leaks.

use std::sync::Arc;
use std::time::Duration;

use sluice_catalog::Catalog;
use sluice_sched::{compile, LimitKind, Machine, Permit, ResourceScheduler, TokioClock};
use sluice_sql::{parse_script, ErrorCode};

const MACHINE: Machine = Machine {
    cores: 4,
    memory: 1 << 34,
};

/// A scheduler for the QUERY resource `q` of the catalog `ddl` builds.
fn scheduler(ddl: &str) -> ResourceScheduler {
    let mut catalog = Catalog::new();
    for item in parse_script(&format!("CREATE RESOURCE q (QUERY); {ddl}")) {
        let stmt = item.result.expect("parses");
        catalog.apply_mut(&stmt).expect("applies");
    }
    let trees = compile(&catalog, MACHINE).expect("compiles");
    ResourceScheduler::new(trees.tree("q").expect("tree q"), Arc::new(TokioClock))
}

/// The tree of QUERY resource `q` for the catalog `ddl` builds.
fn tree(ddl: &str) -> sluice_sched::ResourceTree {
    let mut catalog = Catalog::new();
    for item in parse_script(&format!("CREATE RESOURCE q (QUERY); {ddl}")) {
        let stmt = item.result.expect("parses");
        catalog.apply_mut(&stmt).expect("applies");
    }
    let trees = compile(&catalog, MACHINE).expect("compiles");
    trees.tree("q").expect("tree q").clone()
}

/// Lets spawned timers and woken tasks run.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn node<'a>(nodes: &'a [sluice_sched::NodeState], path: &str) -> &'a sluice_sched::NodeState {
    nodes
        .iter()
        .find(|n| n.path == path)
        .unwrap_or_else(|| panic!("no node {path}"))
}

/// Nothing waits and nothing is held anywhere.
fn assert_idle(s: &ResourceScheduler) {
    assert_eq!(s.waiting(), 0);
    for n in s.nodes() {
        assert!(n.queue_length.unwrap_or(0) == 0, "{} still queues", n.path);
        assert!(
            n.inflight_requests.unwrap_or(0) == 0,
            "{} still holds",
            n.path
        );
        assert!(
            n.inflight_cost.unwrap_or(0) == 0,
            "{} still holds cost",
            n.path
        );
    }
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_capped_and_waiters_go_in_order() {
    let s = scheduler("CREATE WORKLOAD all SETTINGS max_concurrent_queries = 2");
    let mut waits: Vec<_> = (0..5)
        .map(|_| s.acquire("all", 1).expect("enqueues"))
        .collect();
    let granted: Vec<bool> = waits.iter_mut().map(|a| a.is_granted()).collect();
    assert_eq!(granted, [true, true, false, false, false]);
    assert_eq!(waits[2].queue_path(), "/all/semaphore/fifo");
    let mut held: Vec<Permit> = Vec::new();
    for a in waits.drain(..2) {
        held.push(a.await.expect("granted"));
    }
    assert_eq!(
        node(&s.nodes(), "/all/semaphore").inflight_requests,
        Some(2)
    );
    // Each release lets exactly the oldest waiter in.
    for expected_next in 2..5 {
        held.remove(0);
        let granted: Vec<bool> = waits.iter_mut().map(|a| a.is_granted()).collect();
        assert_eq!(
            granted.iter().filter(|g| **g).count(),
            1,
            "after a release, one more runs"
        );
        assert!(granted[0], "the oldest waiter ({expected_next}) goes first");
        held.push(waits.remove(0).await.expect("granted"));
        assert_eq!(
            node(&s.nodes(), "/all/semaphore").inflight_requests,
            Some(2)
        );
    }
    drop(held);
    assert_idle(&s);
}

#[tokio::test(start_paused = true)]
async fn priority_orders_waiting_queries_strictly() {
    let s = scheduler(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
         CREATE WORKLOAD hi IN all SETTINGS priority = 0;
         CREATE WORKLOAD lo IN all SETTINGS priority = 1",
    );
    let first = s
        .acquire("lo", 1)
        .expect("enqueues")
        .await
        .expect("granted");
    let mut order = Vec::new();
    let mut waits = vec![
        ("lo1", s.acquire("lo", 1).expect("enqueues")),
        ("hi1", s.acquire("hi", 1).expect("enqueues")),
        ("lo2", s.acquire("lo", 1).expect("enqueues")),
        ("hi2", s.acquire("hi", 1).expect("enqueues")),
    ];
    drop(first);
    while !waits.is_empty() {
        let i = waits
            .iter_mut()
            .position(|(_, a)| a.is_granted())
            .expect("one is granted");
        let (name, a) = waits.remove(i);
        order.push(name);
        drop(a.await.expect("granted"));
    }
    assert_eq!(order, ["hi1", "hi2", "lo1", "lo2"]);
    assert_idle(&s);
}

#[tokio::test(start_paused = true)]
async fn weights_share_a_contended_slot_three_to_one() {
    let s = scheduler(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
         CREATE WORKLOAD heavy IN all SETTINGS weight = 3;
         CREATE WORKLOAD light IN all SETTINGS weight = 1",
    );
    let mut permit = Some(
        s.acquire("heavy", 1)
            .expect("enqueues")
            .await
            .expect("granted"),
    );
    // Both stay backlogged: 400 waiters each.
    let mut waits: Vec<(&str, _)> = Vec::new();
    for _ in 0..400 {
        waits.push(("heavy", s.acquire("heavy", 1).expect("enqueues")));
        waits.push(("light", s.acquire("light", 1).expect("enqueues")));
    }
    let (mut heavy, mut light) = (0, 0);
    for _ in 0..400 {
        permit.take();
        let i = waits
            .iter_mut()
            .position(|(_, a)| a.is_granted())
            .expect("granted");
        let (name, a) = waits.remove(i);
        if name == "heavy" {
            heavy += 1
        } else {
            light += 1
        }
        permit = Some(a.await.expect("granted"));
    }
    assert_eq!(heavy + light, 400);
    let ratio = f64::from(heavy) / f64::from(light);
    assert!((2.85..=3.15).contains(&ratio), "{heavy}:{light}");
    drop(permit);
    drop(waits);
    assert_idle(&s);
    assert!(node(&s.nodes(), "/all/semaphore/p0_fair")
        .system_vruntime
        .is_some());
}

#[tokio::test(start_paused = true)]
async fn query_rate_never_exceeds_burst_plus_rate_times_t() {
    let s = scheduler(
        "CREATE WORKLOAD all SETTINGS max_queries_per_second = 10, max_burst_queries = 5",
    );
    let start = tokio::time::Instant::now();
    let mut waits: Vec<_> = (0..40)
        .map(|_| s.acquire("all", 1).expect("enqueues"))
        .collect();
    let mut started: Vec<Duration> = Vec::new();
    while !waits.is_empty() {
        let mut i = 0;
        while i < waits.len() {
            if waits[i].is_granted() {
                drop(waits.remove(i).await.expect("granted"));
                started.push(start.elapsed());
            } else {
                i += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        settle().await;
    }
    // In every window [a, b]: starts ≤ burst + rate × (b − a), plus the one request that may
    // overdraw the bucket.
    for (i, a) in started.iter().enumerate() {
        for (j, b) in started.iter().enumerate().skip(i) {
            let window = (*b - *a).as_secs_f64();
            let count = (j - i + 1) as f64;
            assert!(
                count <= 5.0 + 10.0 * window + 1.0,
                "{count} starts in {window}s"
            );
        }
    }
    // ClickHouse's bucket admits while tokens ≥ 0 and charges after: the burst plus the one
    // request that overdraws go at once.
    assert_eq!(
        started.iter().filter(|t| t.is_zero()).count(),
        6,
        "the burst goes at once"
    );
    let last = started.last().expect("some").as_secs_f64();
    assert!(
        (3.4..=3.7).contains(&last),
        "35 more at 10/s take 3.5s, took {last}"
    );
    assert_idle(&s);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_rejects_with_server_overloaded() {
    let s = scheduler(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1;
         CREATE WORKLOAD w IN all SETTINGS max_waiting_queries = 1",
    );
    let running = s.acquire("w", 1).expect("enqueues").await.expect("granted");
    let waiting = s.acquire("w", 1).expect("enqueues");
    let e = s.acquire("w", 1).expect_err("the queue is full");
    assert_eq!(e.code, ErrorCode::ServerOverloaded);
    assert_eq!(
        e.to_string(),
        "Workload limit `max_waiting_queries` has been reached: 1 of 1. (SERVER_OVERLOADED)"
    );
    assert_eq!(
        node(&s.nodes(), "/all/semaphore/w/fifo")
            .stats
            .rejected_requests,
        1
    );
    drop(running);
    drop(waiting.await.expect("granted"));
    assert_idle(&s);
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_waiter_removes_it_and_a_granted_drop_releases() {
    let s = scheduler("CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1");
    let running = s
        .acquire("all", 1)
        .expect("enqueues")
        .await
        .expect("granted");
    let cancelled = s.acquire("all", 1).expect("enqueues");
    let mut next = s.acquire("all", 1).expect("enqueues");
    assert_eq!(s.waiting(), 2);
    drop(cancelled);
    assert_eq!(s.waiting(), 1);
    // What system.scheduler shows: the cancelled request no longer counts as queued.
    assert_eq!(
        node(&s.nodes(), "/all/semaphore/fifo").queue_length,
        Some(1)
    );
    assert_eq!(
        node(&s.nodes(), "/all/semaphore/fifo")
            .stats
            .canceled_requests,
        1
    );
    drop(running);
    assert!(
        next.is_granted(),
        "the cancelled request must not take the slot"
    );
    // Granted but never polled: dropping the future gives the slot back.
    drop(next);
    assert_idle(&s);
    let again = s
        .acquire("all", 1)
        .expect("enqueues")
        .await
        .expect("granted");
    drop(again);
    assert_idle(&s);
}

#[tokio::test(start_paused = true)]
async fn only_leaves_link_and_unknown_workloads_run_unlimited() {
    let s = scheduler(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1; CREATE WORKLOAD leaf IN all",
    );
    let e = s.acquire("all", 1).expect_err("all has children");
    assert_eq!(e.code, ErrorCode::InvalidSchedulerNode);
    assert!(s.has_workload("leaf") && !s.has_workload("nobody"));
    let held = s
        .acquire("leaf", 1)
        .expect("enqueues")
        .await
        .expect("granted");
    let free: Vec<Permit> = futures_unlimited(&s, 3).await;
    assert!(free.iter().all(Permit::is_unlimited));
    drop((held, free));
    assert_idle(&s);
}

async fn futures_unlimited(s: &ResourceScheduler, n: usize) -> Vec<Permit> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            s.acquire("nobody", 1)
                .expect("unlimited")
                .await
                .expect("granted"),
        );
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_waiter_in_a_task_is_woken_by_a_release() {
    let s = scheduler("CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1");
    let held = s
        .acquire("all", 1)
        .expect("enqueues")
        .await
        .expect("granted");
    let s2 = s.clone();
    let task = tokio::spawn(async move {
        let permit = s2
            .acquire("all", 1)
            .expect("enqueues")
            .await
            .expect("granted");
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(permit);
    });
    settle().await;
    assert_eq!(s.waiting(), 1);
    drop(held);
    task.await.expect("task ends");
    assert_idle(&s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_on_real_threads_never_exceeds_the_cap_and_leaks_nothing() {
    use std::sync::atomic::{AtomicI64, Ordering};
    let s = scheduler("CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8; CREATE WORKLOAD a IN all; CREATE WORKLOAD b IN all SETTINGS weight = 2");
    let running = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let (s, running, peak) = (s.clone(), running.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            let workload = if i % 2 == 0 { "a" } else { "b" };
            for round in 0..20u32 {
                let acquire = s.acquire(workload, 1).expect("enqueues");
                // A third of the attempts give up while waiting (a client that disconnects).
                let permit = if (i + round) % 3 == 0 {
                    match tokio::time::timeout(Duration::from_micros(50), acquire).await {
                        Ok(p) => p.expect("granted"),
                        Err(_) => continue,
                    }
                } else {
                    acquire.await.expect("granted")
                };
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                running.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= 8,
        "observed {peak} queries running under a cap of 8"
    );
    assert!(peak >= 2, "the test must actually contend (peak {peak})");
    assert_idle(&s);
    let nodes = s.nodes();
    let semaphore = node(&nodes, "/all/semaphore");
    assert!(
        semaphore.stats.dequeued_requests > 2000,
        "{:?}",
        semaphore.stats
    );
    let canceled: u64 = nodes.iter().map(|n| n.stats.canceled_requests).sum();
    eprintln!(
        "peak {peak}, granted {}, abandoned while waiting {canceled}",
        semaphore.stats.dequeued_requests
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_tree_takes_over_what_is_in_flight_and_waiting() {
    let before = "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 2; \
                  CREATE WORKLOAD a IN all; CREATE WORKLOAD b IN all";
    let old = scheduler(before);
    let mut held: Vec<Permit> = Vec::new();
    for _ in 0..2 {
        held.push(
            old.acquire("a", 1)
                .expect("enqueues")
                .await
                .expect("granted"),
        );
    }
    let mut waits: Vec<_> = (0..4)
        .map(|i| {
            old.acquire(if i < 3 { "a" } else { "b" }, 1)
                .expect("enqueues")
        })
        .collect();
    assert!(waits.iter_mut().all(|w| !w.is_granted()));

    // The limit goes up to 3: one more may run, not three more (the two in flight count).
    let new = old.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 3; \
         CREATE WORKLOAD a IN all; CREATE WORKLOAD b IN all",
    ));
    let granted: Vec<bool> = waits.iter_mut().map(|w| w.is_granted()).collect();
    assert_eq!(granted.iter().filter(|g| **g).count(), 1, "{granted:?}");
    assert_eq!(
        node(&new.nodes(), "/all/semaphore").inflight_requests,
        Some(3)
    );
    assert_eq!(old.waiting(), 0, "the old scheduler keeps nothing waiting");
    assert_eq!(new.waiting(), 3);
    // Requests sent to the old scheduler go to the new one.
    let mut late = old.acquire("b", 1).expect("forwarded");
    assert!(!late.is_granted());
    assert_eq!(new.waiting(), 4);
    drop(late);
    assert_eq!(new.waiting(), 3);

    // A permit of the old tree, released, frees a slot in the new one.
    held.remove(0);
    let granted: Vec<bool> = waits.iter_mut().map(|w| w.is_granted()).collect();
    assert_eq!(granted.iter().filter(|g| **g).count(), 2, "{granted:?}");
    // A moved waiter that is cancelled leaves the new queue.
    let last = waits.pop().expect("b waits");
    drop(last);
    assert_eq!(new.waiting(), 1);

    // The limit drops to 1, and workload b disappears.
    let newer = new.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1; CREATE WORKLOAD a IN all",
    ));
    let mut permits = Vec::new();
    for w in waits.drain(..) {
        let mut w = w;
        if w.is_granted() {
            permits.push(w.await.expect("granted"));
        } else {
            // Still waiting in the newest tree, behind 1 + 2 in flight.
            assert_eq!(newer.waiting(), 1);
            assert_eq!(
                node(&newer.nodes(), "/all/semaphore").inflight_requests,
                Some(3)
            );
            // Releases anywhere in the chain reach the newest tree: three must go before it runs.
            held.clear();
            assert!(!w.is_granted());
            permits.remove(0);
            assert!(!w.is_granted());
            permits.clear();
            settle().await;
            let p = w.await.expect("granted at last");
            assert_eq!(
                node(&newer.nodes(), "/all/semaphore").inflight_requests,
                Some(1)
            );
            drop(p);
        }
    }
    assert_idle(&newer);
}

#[tokio::test(start_paused = true)]
async fn waiters_whose_workload_is_gone_fail_and_a_retired_resource_fails_its_waiters() {
    let old = scheduler(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1; CREATE WORKLOAD gone IN all; \
         CREATE WORKLOAD stays IN all",
    );
    let held = old
        .acquire("stays", 1)
        .expect("enqueues")
        .await
        .expect("granted");
    let gone = old.acquire("gone", 1).expect("enqueues");
    let stays = old.acquire("stays", 1).expect("enqueues");
    let new = old.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1; CREATE WORKLOAD stays IN all",
    ));
    let e = gone.await.expect_err("its queue is gone");
    assert_eq!(e.code, ErrorCode::InvalidSchedulerNode);
    assert_eq!(new.waiting(), 1);
    new.retire();
    let e = stays.await.expect_err("resource retired");
    assert_eq!(e.code, ErrorCode::InvalidSchedulerNode);
    drop(held);
    assert_idle(&new);
    assert_idle(&old);
}

#[tokio::test(start_paused = true)]
async fn a_throttler_keeps_its_tokens_across_a_change() {
    let old =
        scheduler("CREATE WORKLOAD all SETTINGS max_queries_per_second = 1, max_burst_queries = 2");
    // The burst (2, plus ClickHouse's one in debt) is spent.
    for _ in 0..3 {
        drop(
            old.acquire("all", 1)
                .expect("enqueues")
                .await
                .expect("granted"),
        );
    }
    let mut next = old.acquire("all", 1).expect("enqueues");
    assert!(!next.is_granted());
    // A change that keeps the rate must not hand out a fresh burst.
    let new = old.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_queries_per_second = 1, max_burst_queries = 5",
    ));
    assert!(!next.is_granted(), "a catalog change refilled the bucket");
    tokio::time::advance(Duration::from_millis(1100)).await;
    settle().await;
    assert!(next.is_granted());
    drop(next);
    drop(new);
}

/// In a fleet a limit lets through only the node's share, only while its fence holds; a
/// catalog change keeps the share; a new limit starts with none.
#[tokio::test(start_paused = true)]
async fn in_a_fleet_a_limit_admits_its_share_while_the_fence_holds() {
    let s = scheduler("CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8;");
    let fence = sluice_sched::Fence::new();
    s.join_fleet(fence.clone());
    // No share yet, and no lease: nothing passes.
    let mut first = s.acquire("all", 1).expect("queues");
    assert!(!first.is_granted());
    s.set_share("all", LimitKind::Slots, 8, 2);
    settle().await;
    assert!(!first.is_granted(), "granted without a lease");
    fence.hold_until(tokio::time::Instant::now() + Duration::from_secs(5));
    s.wake();
    settle().await;
    assert!(first.is_granted());
    let second = s.acquire("all", 1).expect("granted");
    let mut third = s.acquire("all", 1).expect("queues");
    settle().await;
    assert!(!third.is_granted(), "a third passed a share of 2");
    assert_eq!(s.limits()[0].requests, 2);
    // Past the fence: a freed slot is not reused.
    tokio::time::advance(Duration::from_secs(6)).await;
    drop(second);
    settle().await;
    assert!(!third.is_granted(), "admitted past the fence");
    fence.hold_until(tokio::time::Instant::now() + Duration::from_secs(5));
    s.wake();
    settle().await;
    assert!(third.is_granted());
    // A catalog change keeps the share (2: one more waits); a new limit has none.
    let next = s.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8; CREATE WORKLOAD x IN all SETTINGS max_concurrent_queries = 1;",
    ));
    let mut fourth = next.acquire("x", 1).expect("queues");
    settle().await;
    assert!(!fourth.is_granted());
    next.set_share("all", LimitKind::Slots, 8, 3);
    settle().await;
    assert!(!fourth.is_granted(), "x has no share yet");
    next.set_share("x", LimitKind::Slots, 1, 1);
    settle().await;
    assert!(fourth.is_granted());
    let shares: Vec<(String, i64)> = next
        .limits()
        .into_iter()
        .map(|l| (l.workload, l.share))
        .collect();
    assert_eq!(shares, vec![("all".into(), 3), ("x".into(), 1)]);
    drop((first, third, fourth));
}

/// In a fleet a catalog change that lowers a limit scales this node's share down with it at
/// once (every node alike, so shares that fit the old limit fit the new one as soon as each
/// node has the change, whatever its keeper's round waits for); one that raises it keeps the
/// share. A share reckoned on the old limit is not raised on the new one; it may lower.
#[tokio::test(start_paused = true)]
async fn in_a_fleet_a_lowered_limit_scales_the_share_down_with_it() {
    let shares = |s: &ResourceScheduler| -> Vec<(LimitKind, i64)> {
        s.limits().into_iter().map(|l| (l.kind, l.share)).collect()
    };
    let s = scheduler(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8, max_waiting_queries = 10;",
    );
    let fence = sluice_sched::Fence::new();
    s.join_fleet(fence.clone());
    fence.hold_until(tokio::time::Instant::now() + Duration::from_secs(60));
    s.set_share("all", LimitKind::Slots, 8, 3);
    s.set_share("all", LimitKind::Waiting, 10, 3);
    let mut running: Vec<sluice_sched::Acquire> = (0..3)
        .map(|_| s.acquire("all", 1).expect("granted"))
        .collect();
    settle().await;
    assert!(running.iter_mut().all(|a| a.is_granted()));
    let next = s.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 4, max_waiting_queries = 5;",
    ));
    // 3 of 8 is 1 of 4 (1.5 rounded down); 3 of 10 waiting is 1 of 5.
    assert_eq!(
        shares(&next),
        vec![(LimitKind::Slots, 1), (LimitKind::Waiting, 1)]
    );
    // What runs goes on; nothing more is admitted until fewer than the share run.
    let mut fourth = next.acquire("all", 1).expect("waits");
    running.truncate(1);
    settle().await;
    assert!(!fourth.is_granted(), "admitted past the scaled share");
    running.clear();
    settle().await;
    assert!(fourth.is_granted());
    // Reckoned on the old limit of 8: not raised; lowered.
    assert!(!next.set_share("all", LimitKind::Slots, 8, 3));
    assert_eq!(shares(&next)[0], (LimitKind::Slots, 1));
    assert!(next.set_share("all", LimitKind::Slots, 8, 0));
    assert_eq!(shares(&next)[0], (LimitKind::Slots, 0));
    assert!(next.set_share("all", LimitKind::Slots, 4, 2));
    // Raised again: the share is kept.
    let last = next.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8, max_waiting_queries = 10;",
    ));
    assert_eq!(
        shares(&last),
        vec![(LimitKind::Slots, 2), (LimitKind::Waiting, 1)]
    );
    drop(fourth);
    // A rate's share (thousandths of a request per second) alike.
    let rate = scheduler(
        "CREATE WORKLOAD all SETTINGS max_queries_per_second = 10, max_burst_queries = 10;",
    );
    rate.join_fleet(fence.clone());
    rate.set_share("all", LimitKind::Rate, 10_000, 3_000);
    let halved = rate.succeed(&tree(
        "CREATE WORKLOAD all SETTINGS max_queries_per_second = 5, max_burst_queries = 10;",
    ));
    assert_eq!(shares(&halved), vec![(LimitKind::Rate, 1_500)]);
}

/// In a fleet a throttler refills at the node's share of the rate and keeps at most the burst
/// in the same proportion; no share (or a passed fence) lets nothing through.
#[tokio::test(start_paused = true)]
async fn in_a_fleet_a_rate_admits_its_share_of_the_rate_and_the_burst() {
    let s = scheduler(
        "CREATE WORKLOAD all SETTINGS max_queries_per_second = 10, max_burst_queries = 10;",
    );
    let fence = sluice_sched::Fence::new();
    s.join_fleet(fence.clone());
    fence.hold_until(tokio::time::Instant::now() + Duration::from_secs(60));
    let mut waiting: Vec<sluice_sched::Acquire> = (0..40)
        .map(|_| s.acquire("all", 1).expect("queues"))
        .collect();
    settle().await;
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    let granted = |w: &mut Vec<sluice_sched::Acquire>| {
        let before = w.len();
        w.retain_mut(|a| !a.is_granted());
        before - w.len()
    };
    assert_eq!(granted(&mut waiting), 0, "admitted on no share");
    let rate = s
        .limits()
        .into_iter()
        .find(|l| l.kind == LimitKind::Rate)
        .expect("a rate limit");
    assert_eq!((rate.max_requests, rate.share), (10_000, 0));
    // Half the rate: 5 a second, the first at once (tokens start at none; a request passes
    // while they are not negative).
    s.set_share("all", LimitKind::Rate, 10_000, 5_000);
    let mut admitted = 0;
    for _ in 0..20 {
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
        admitted += granted(&mut waiting);
    }
    assert!((10..=11).contains(&admitted), "{admitted} in 2 s at 5/s");
    // Down to 1 a second.
    s.set_share("all", LimitKind::Rate, 10_000, 1_000);
    let mut admitted = 0;
    for _ in 0..30 {
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
        admitted += granted(&mut waiting);
    }
    assert!((2..=4).contains(&admitted), "{admitted} in 3 s at 1/s");
    // Past the fence nothing passes.
    tokio::time::advance(Duration::from_secs(60)).await;
    settle().await;
    granted(&mut waiting);
    tokio::time::advance(Duration::from_secs(3)).await;
    settle().await;
    assert_eq!(granted(&mut waiting), 0, "admitted past the fence");
}

/// In a fleet a bounded queue takes no more than the node's share of `max_waiting_queries`;
/// the error says so; a catalog change keeps the share.
#[tokio::test(start_paused = true)]
async fn in_a_fleet_a_queue_holds_its_share_of_the_waiting() {
    let ddl = "CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1, max_waiting_queries = 10;";
    let s = scheduler(ddl);
    let fence = sluice_sched::Fence::new();
    s.join_fleet(fence.clone());
    fence.hold_until(tokio::time::Instant::now() + Duration::from_secs(60));
    s.set_share("all", LimitKind::Slots, 1, 1);
    let mut running = s.acquire("all", 1).expect("granted");
    settle().await;
    assert!(running.is_granted());
    let refused = s.acquire("all", 1).expect_err("no share of the waiting");
    assert_eq!(refused.code, ErrorCode::ServerOverloaded);
    assert!(refused.message.contains("share"), "{}", refused.message);
    s.set_share("all", LimitKind::Waiting, 10, 2);
    let a = s.acquire("all", 1).expect("waits");
    let b = s.acquire("all", 1).expect("waits");
    assert!(
        s.acquire("all", 1).is_err(),
        "a third waited on a share of 2"
    );
    let next = s.succeed(&tree(ddl));
    assert!(next.acquire("all", 1).is_err(), "the share was lost");
    next.set_share("all", LimitKind::Waiting, 10, 3);
    let c = next.acquire("all", 1).expect("waits");
    let waiting = next
        .limits()
        .into_iter()
        .find(|l| l.kind == LimitKind::Waiting)
        .expect("a waiting limit");
    assert_eq!((waiting.requests, waiting.share), (3, 3));
    drop((running, a, b, c));
}

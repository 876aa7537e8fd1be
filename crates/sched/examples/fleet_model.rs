//! A model of the fleet's share protocol at sizes no test starts (issue 37): N nodes, one
//! limit L, closed-loop clients whose demand jumps from node to node every two seconds, in
//! virtual milliseconds. Each node runs the keeper's rules (`sluice-server`'s `fleet.rs`): it
//! publishes its demand, divides the limit with the real [`allot`], lowers a share in its
//! scheduler first and in etcd after (never below what runs), grows it in etcd first (a
//! growth lands only if the shares stay within L), and wakes on every change the watch shows
//! and every 20 ms. etcd is a central record whose writes land `ETCD_MS` after they are sent
//! and are seen by the others (and answered) `ETCD_MS` later.
//!
//! It reports how much capacity sits unused while demand exceeds the limit (stranded, jumps
//! included), how long after a jump the new demand's nodes run 95% of L (follow), the most ever admitted at once
//! (never above L), and etcd writes per second.
//!
//!     cargo run --release -p sluice-sched --example fleet_model [NODES…]   (default 3 10 100)

use std::collections::BTreeMap;

use sluice_catalog::Catalog;
use sluice_sched::fleet::{allot, Demand};
use sluice_sched::{compile, Machine};
use sluice_sql::parse_script;

const QUERY_MS: u64 = 20;
const TICK_MS: u64 = 20;
const ETCD_MS: u64 = 2;
const PHASE_MS: u64 = 2_000;
const PHASES: u64 = 30;

/// A write in flight to etcd: lands at `lands`, answered at `answered`.
struct Write {
    lands: u64,
    answered: u64,
    kind: WriteKind,
}

#[derive(Clone, Copy)]
enum WriteKind {
    Demand(i64),
    Lower(i64),
    Grow(i64),
}

#[derive(Default)]
struct Node {
    clients: i64,
    waiting: i64,
    /// Finish times of the queries running.
    running: Vec<u64>,
    /// Its share as etcd holds it, and as it knows it.
    stored: i64,
    known: i64,
    cap: i64,
    published: i64,
    write: Option<Write>,
    next_round: u64,
}

struct Outcome {
    stranded: f64,
    follow_p50: u64,
    follow_p99: u64,
    most: i64,
    writes_per_s: f64,
}

fn model(nodes: usize, limit: i64, seed: u64) -> Outcome {
    let ddl = format!(
        "CREATE RESOURCE q (QUERY); CREATE WORKLOAD all SETTINGS max_concurrent_queries = {limit};"
    );
    let mut catalog = Catalog::new();
    for item in parse_script(&ddl) {
        catalog
            .apply_mut(&item.result.expect("parses"))
            .expect("applies");
    }
    let trees = compile(
        &catalog,
        Machine {
            cores: 4,
            memory: 1 << 30,
        },
    )
    .expect("compiles");
    let tree = trees.tree("q").expect("tree").clone();
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i:03}")).collect();
    let mut fleet: Vec<Node> = (0..nodes)
        .map(|i| Node {
            next_round: i as u64 % TICK_MS,
            ..Node::default()
        })
        .collect();
    // What the watch shows the others: demand by node, visible from a time on.
    let mut visible: Vec<i64> = vec![0; nodes];
    let mut rng = seed;
    let mut random = move |n: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    let (mut unused, mut demanded_ms, mut most, mut writes) = (0f64, 0u64, 0i64, 0u64);
    let mut follows = Vec::new();
    let mut phase_began = 0;
    let mut followed = true;
    let hot = (nodes / 5).max(1);
    for t in 0..PHASES * PHASE_MS {
        if t % PHASE_MS == 0 {
            // Demand jumps: `hot` nodes, twice the limit between them.
            for node in fleet.iter_mut() {
                node.clients = 0;
                node.waiting = 0;
            }
            for _ in 0..hot {
                let at = random(nodes as u64) as usize;
                fleet[at].clients += (2 * limit + hot as i64 - 1) / hot as i64;
            }
            phase_began = t;
            followed = false;
        }
        let mut changed = false;
        // Queries end; their clients ask again; the waiting are admitted within the cap.
        for node in fleet.iter_mut() {
            node.running.retain(|&end| end > t);
            // Each client has one query, waiting or running (none once its node goes cold).
            node.waiting = (node.clients - node.running.len() as i64).max(0);
            while node.waiting > 0 && (node.running.len() as i64) < node.cap {
                node.waiting -= 1;
                node.running.push(t + QUERY_MS);
            }
        }
        // etcd: writes land (a growth only within the limit) and are answered.
        for i in 0..nodes {
            let Some((lands, answered, kind)) = fleet[i]
                .write
                .as_ref()
                .map(|w| (w.lands, w.answered, w.kind))
            else {
                continue;
            };
            if lands == t {
                let others: i64 = (0..nodes)
                    .filter(|&j| j != i)
                    .map(|j| fleet[j].stored)
                    .sum();
                let node = &mut fleet[i];
                match kind {
                    WriteKind::Demand(d) => visible[i] = d,
                    WriteKind::Lower(to) => node.stored = to,
                    WriteKind::Grow(to) => node.stored = to.min(limit - others).max(node.stored),
                }
                changed = true;
            }
            if answered == t {
                let node = &mut fleet[i];
                node.write = None;
                if let WriteKind::Grow(_) = kind {
                    node.known = node.stored;
                    node.cap = node.stored;
                }
            }
        }
        // Keepers: every TICK, and at once on a change the watch showed.
        let demand: Demand = names
            .iter()
            .zip(&visible)
            .map(|(n, d)| (n.clone(), BTreeMap::from([("all".to_string(), *d)])))
            .collect();
        let mut division = None;
        for i in 0..nodes {
            let node = &fleet[i];
            if node.write.is_some() || !(changed || t >= node.next_round) {
                continue;
            }
            let division = division
                .get_or_insert_with(|| allot(&tree, &names, &demand, t / PHASE_MS))
                .get("all")
                .cloned()
                .unwrap_or_default();
            let node = &mut fleet[i];
            node.next_round = t + TICK_MS;
            let wanted = (node.waiting + node.running.len() as i64).min(limit);
            let (lands, answered) = (t + ETCD_MS, t + 2 * ETCD_MS);
            if wanted != node.published {
                node.published = wanted;
                node.write = Some(Write {
                    lands,
                    answered,
                    kind: WriteKind::Demand(wanted),
                });
                writes += 1;
                continue;
            }
            let target = division.get(&names[i]).copied().unwrap_or(0);
            if target < node.known {
                node.cap = target;
                let to = target.max(node.running.len() as i64);
                if to < node.known {
                    node.known = to;
                    node.write = Some(Write {
                        lands,
                        answered,
                        kind: WriteKind::Lower(to),
                    });
                    writes += 1;
                }
            } else if target > node.known {
                node.write = Some(Write {
                    lands,
                    answered,
                    kind: WriteKind::Grow(target),
                });
                writes += 1;
            }
        }
        let running: i64 = fleet.iter().map(|n| n.running.len() as i64).sum();
        // The queries of this phase's demand (the last phase's still finishing are not).
        let serving: i64 = fleet
            .iter()
            .filter(|n| n.clients > 0)
            .map(|n| n.running.len() as i64)
            .sum();
        let demanded: i64 = fleet.iter().map(|n| n.clients).sum();
        most = most.max(running);
        assert!(
            running <= limit,
            "{running} running at once (limit {limit}) at {t} ms"
        );
        if demanded >= limit {
            unused += (limit - running) as f64;
            demanded_ms += 1;
        }
        if !followed && serving as f64 >= 0.95 * limit as f64 {
            follows.push(t - phase_began);
            followed = true;
        }
    }
    follows.sort_unstable();
    let pick = |q: f64| {
        follows
            .get(((follows.len().max(1) - 1) as f64 * q) as usize)
            .copied()
            .unwrap_or(u64::MAX)
    };
    Outcome {
        stranded: unused / (demanded_ms.max(1) as f64 * limit as f64),
        follow_p50: pick(0.5),
        follow_p99: pick(0.99),
        most,
        writes_per_s: writes as f64 / (PHASES * PHASE_MS) as f64 * 1000.0,
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![3, 10, 100]
    } else {
        sizes
    };
    println!("| nodes | limit | stranded while demand ≥ limit | 95% of the limit again after a jump, p50 / p99 | most at once | etcd writes/s |");
    println!("|---|---|---|---|---|---|");
    for nodes in sizes {
        let limit = 8 * nodes as i64 / 3 + 8;
        let o = model(nodes, limit, 42);
        println!(
            "| {nodes} | {limit} | {:.1}% | {} / {} ms | {} | {:.0} |",
            o.stranded * 100.0,
            o.follow_p50,
            o.follow_p99,
            o.most,
            o.writes_per_s
        );
    }
}

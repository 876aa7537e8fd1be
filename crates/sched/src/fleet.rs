//! Dividing the `inflight_limit`s of a time-shared tree (the QUERY resource's
//! `max_concurrent_queries`) among the nodes of a fleet.
//!
//! Each node publishes its demand: for each leaf workload, the queries it has waiting and
//! running. Every node runs [`allot`] on the same published demand and the same tree and so
//! reaches the same division: the slots of each limited workload go first to demand, in the
//! order one node's scheduler would grant them if the whole fleet's queries were queued on it
//! (strict priority between children of different `priority`, slots in proportion to
//! `weight` among children of one priority, nested limits respected), and what demand leaves
//! of a limit is spread evenly over the live nodes, so that a query arriving anywhere on an
//! idle fleet is admitted at once, without asking etcd.
//!
//! [`allot`] says where slots *should* be; it guarantees nothing. What holds the limit is
//! the share protocol (`sluice-cluster`'s share book): a node uses only the share etcd
//! granted it, and a share grows only by a transaction that keeps the shares' sum within the
//! limit. A division computed on a stale view costs only promptness.
//!
//! `outranked_share` is not divided (its credits are per node): across nodes, priority is
//! strict.

use std::collections::BTreeMap;

use crate::tree::{Node, NodeKind, ResourceTree};

/// Per node name, per leaf workload: queries waiting and running there.
pub type Demand = BTreeMap<String, BTreeMap<String, i64>>;

/// Per limited workload, per node: the slots that node should hold.
pub type Allotment = BTreeMap<String, BTreeMap<String, i64>>;

/// A workload of the tree, as the division sees it.
#[derive(Debug)]
struct Workload {
    name: String,
    weight: f64,
    priority: i64,
    /// `max_requests` of its `inflight_limit`, if it has one.
    limit: Option<i64>,
    children: Vec<Workload>,
}

fn workload(node: &Node) -> Workload {
    let mut out = Workload {
        name: node.basename.clone(),
        weight: if node.weight > 0.0 { node.weight } else { 1.0 },
        priority: node.priority,
        limit: None,
        children: Vec::new(),
    };
    // Below a workload: its throttler, its semaphore, then a queue or the nodes grouping
    // its children (which are workloads again).
    fn below(node: &Node, out: &mut Workload) {
        for child in &node.children {
            match child.kind {
                NodeKind::Workload => out.children.push(workload(child)),
                NodeKind::InflightLimit { max_requests, .. } => {
                    out.limit = Some(out.limit.map_or(max_requests, |l| l.min(max_requests)));
                    below(child, out);
                }
                _ => below(child, out),
            }
        }
    }
    below(node, &mut out);
    out
}

/// Where each limited workload's slots should be, given every node's demand (see the module
/// docs). `nodes`: the fleet's live members; demand of other names is ignored. `turn` rotates
/// which nodes get the odd slots of a division that does not come out even (one node more
/// than another when three share eight): the fleet passes a number that all nodes agree on
/// and that changes every few seconds, so that clients of every node get the same service
/// over time.
pub fn allot(tree: &ResourceTree, nodes: &[String], demand: &Demand, turn: u64) -> Allotment {
    let mut out = Allotment::new();
    let Some(root) = &tree.root else { return out };
    if nodes.is_empty() {
        return out;
    }
    let root = workload(root);
    let count = nodes.len();
    let mut state = Division {
        remaining: BTreeMap::new(),
        given: BTreeMap::new(),
        under: BTreeMap::new(),
        place: nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    n.clone(),
                    (i + count - (turn % count as u64) as usize) % count,
                )
            })
            .collect(),
    };
    for node in nodes {
        for (leaf, wanted) in demand.get(node).into_iter().flatten() {
            if *wanted > 0 {
                state
                    .remaining
                    .insert((leaf.clone(), node.clone()), *wanted);
            }
        }
    }
    while state.give(&root).is_some() {}
    collect(&root, nodes, &state, turn, &mut out);
    out
}

struct Division {
    /// Demand not yet given a slot, per (leaf, node).
    remaining: BTreeMap<(String, String), i64>,
    /// Slots given, per (leaf, node).
    given: BTreeMap<(String, String), i64>,
    /// Slots given anywhere below each workload.
    under: BTreeMap<String, i64>,
    /// Each node's place in this turn's order (ties go to the earlier place).
    place: BTreeMap<String, usize>,
}

impl Division {
    fn under(&self, w: &str) -> i64 {
        self.under.get(w).copied().unwrap_or(0)
    }

    /// Gives one slot below `w`, as a scheduler would dequeue: the leaf and node it went to.
    fn give(&mut self, w: &Workload) -> Option<(String, String)> {
        if w.limit.is_some_and(|l| self.under(&w.name) >= l) {
            return None;
        }
        let given = if w.children.is_empty() {
            // The node with demand left that holds the fewest slots of this leaf (ties: the
            // earlier place in this turn's order).
            let node = self
                .remaining
                .iter()
                .filter(|((leaf, _), left)| *leaf == w.name && **left > 0)
                .map(|((_, node), _)| node.clone())
                .min_by_key(|node| {
                    (
                        self.given
                            .get(&(w.name.clone(), node.clone()))
                            .copied()
                            .unwrap_or(0),
                        self.place.get(node).copied().unwrap_or(usize::MAX),
                    )
                })?;
            let key = (w.name.clone(), node.clone());
            *self.remaining.get_mut(&key)? -= 1;
            *self.given.entry(key).or_default() += 1;
            (w.name.clone(), node)
        } else {
            // Strict priority between groups; within one, the child furthest below its
            // weight's proportion of the group's slots first.
            let mut children: Vec<&Workload> = w.children.iter().collect();
            children.sort_by(|a, b| {
                a.priority.cmp(&b.priority).then_with(|| {
                    let (ra, rb) = (
                        self.under(&a.name) as f64 / a.weight,
                        self.under(&b.name) as f64 / b.weight,
                    );
                    ra.total_cmp(&rb).then_with(|| a.name.cmp(&b.name))
                })
            });
            children.into_iter().find_map(|c| self.give(c))?
        };
        *self.under.entry(w.name.clone()).or_default() += 1;
        Some(given)
    }

    /// Slots given below `w` at `node`.
    fn at(&self, w: &Workload, node: &str) -> i64 {
        if w.children.is_empty() {
            self.given
                .get(&(w.name.clone(), node.to_string()))
                .copied()
                .unwrap_or(0)
        } else {
            w.children.iter().map(|c| self.at(c, node)).sum()
        }
    }
}

/// Each limited workload's slots per node: what demand was given, and the rest spread evenly
/// (the first nodes of a rotation that starts at a place of the workload's own, moved on each
/// `turn`, so that one node does not get every odd slot of every workload).
fn collect(w: &Workload, nodes: &[String], state: &Division, turn: u64, out: &mut Allotment) {
    if let Some(limit) = w.limit {
        let mut shares: BTreeMap<String, i64> =
            nodes.iter().map(|n| (n.clone(), state.at(w, n))).collect();
        let left = (limit - state.under(&w.name)).max(0);
        let count = nodes.len() as i64;
        let start = w
            .name
            .bytes()
            .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize))
            .wrapping_add(turn as usize);
        for (i, node) in nodes.iter().enumerate() {
            let place = ((i + nodes.len() - start % nodes.len()) % nodes.len()) as i64;
            let extra = left / count + i64::from(place < left % count);
            *shares.get_mut(node).expect("every node has a share") += extra;
        }
        out.insert(w.name.clone(), shares);
    }
    for child in &w.children {
        collect(child, nodes, state, turn, out);
    }
}

/// Divides a limit that is not a number of slots — a rate (`max_queries_per_second`, in
/// thousandths) or a number of waiters (`max_waiting_queries`) — over the live `nodes` by
/// what each wants: `(amount, more)`, where `more` says the node would use more than it
/// holds (its queries wait on the rate; its queue refused some). Max-min fair: a node that
/// wants more gets an equal level of what is left once every node that wants a bounded
/// amount has it; what nobody wants is spread evenly, so that a node with no demand still
/// holds something to admit its first query with. Units left by rounding go to the nodes
/// first in the `turn`'s order (see [`allot`]). The shares sum to `limit` (less when there
/// are no nodes).
pub fn divide(
    limit: i64,
    nodes: &[String],
    wants: &BTreeMap<String, (i64, bool)>,
    turn: u64,
) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    if nodes.is_empty() || limit <= 0 {
        return nodes.iter().map(|n| (n.clone(), 0)).collect();
    }
    let want = |n: &String| wants.get(n).copied().unwrap_or((0, false));
    let limit_f = limit as f64;
    let bounded: f64 = nodes
        .iter()
        .filter(|n| !want(n).1)
        .map(|n| want(n).0.max(0) as f64)
        .sum();
    let unbounded = nodes.iter().filter(|n| want(n).1).count();
    let mut given: BTreeMap<String, f64> = BTreeMap::new();
    if unbounded == 0 && bounded <= limit_f {
        // Everyone has what it wants; the rest evenly.
        let spare = (limit_f - bounded) / nodes.len() as f64;
        for n in nodes {
            given.insert(n.clone(), want(n).0.max(0) as f64 + spare);
        }
    } else {
        // Water-filling: the level at which the shares sum to the limit, where a node that
        // wants more wants without bound.
        let mut caps: Vec<f64> = nodes
            .iter()
            .map(|n| {
                let (amount, more) = want(n);
                if more {
                    f64::INFINITY
                } else {
                    amount.max(0) as f64
                }
            })
            .collect();
        caps.sort_by(f64::total_cmp);
        let (mut left, mut level) = (limit_f, 0.0);
        for (i, cap) in caps.iter().enumerate() {
            let rest = (caps.len() - i) as f64;
            if *cap * rest >= left {
                level = left / rest;
                break;
            }
            left -= cap;
            level = *cap;
        }
        for n in nodes {
            let (amount, more) = want(n);
            let cap = if more {
                f64::INFINITY
            } else {
                amount.max(0) as f64
            };
            given.insert(n.clone(), cap.min(level));
        }
    }
    let count = nodes.len();
    let mut order: Vec<(usize, &String)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| ((i + count - (turn % count as u64) as usize) % count, n))
        .collect();
    order.sort();
    let mut sum = 0;
    for n in nodes {
        let share = given[n].floor() as i64;
        sum += share;
        out.insert(n.clone(), share);
    }
    // Rounding's remainder, one unit each in the turn's order (to those that want more first).
    let mut left = limit - sum;
    for wanting in [true, false] {
        for (_, n) in &order {
            if left <= 0 {
                break;
            }
            if want(n).1 == wanting {
                *out.get_mut(*n).expect("every node has a share") += 1;
                left -= 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{compile, Machine};
    use sluice_catalog::Catalog;

    fn tree(ddl: &str) -> ResourceTree {
        let mut catalog = Catalog::new();
        for item in sluice_sql::parse_script(ddl) {
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
        trees.tree("q").expect("the query resource").clone()
    }

    fn demand(rows: &[(&str, &str, i64)]) -> Demand {
        let mut out = Demand::new();
        for (node, leaf, n) in rows {
            out.entry(node.to_string())
                .or_default()
                .insert(leaf.to_string(), *n);
        }
        out
    }

    fn nodes() -> Vec<String> {
        vec!["a".into(), "b".into(), "c".into()]
    }

    #[test]
    fn an_idle_fleet_spreads_a_limit_evenly_and_demand_takes_it_over() {
        let t = tree(
            "CREATE RESOURCE q (QUERY); CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8;",
        );
        let idle = allot(&t, &nodes(), &Demand::new(), 0);
        assert_eq!(idle["all"].values().sum::<i64>(), 8);
        assert!(
            idle["all"].values().all(|s| (2..=3).contains(s)),
            "{idle:?}"
        );
        let busy = allot(&t, &nodes(), &demand(&[("b", "all", 20)]), 0);
        assert_eq!(busy["all"]["b"], 8);
        // The odd slots of an even split go round with the turn.
        let mut got: BTreeMap<String, i64> = BTreeMap::new();
        for turn in 0..3 {
            for (node, share) in &allot(
                &t,
                &nodes(),
                &demand(&[("a", "all", 9), ("b", "all", 9), ("c", "all", 9)]),
                turn,
            )["all"]
            {
                *got.entry(node.clone()).or_default() += share;
            }
        }
        assert!(got.values().all(|s| *s == 8), "{got:?}");
        let split = allot(
            &t,
            &nodes(),
            &demand(&[("a", "all", 2), ("b", "all", 20)]),
            0,
        );
        assert_eq!(
            (split["all"]["a"], split["all"]["b"], split["all"]["c"]),
            (2, 6, 0)
        );
    }

    #[test]
    fn weights_and_priorities_hold_across_nodes() {
        let t = tree(
            "CREATE RESOURCE q (QUERY); CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8; \
             CREATE WORKLOAD x IN all SETTINGS weight = 3; CREATE WORKLOAD y IN all SETTINGS weight = 1;",
        );
        let a = allot(&t, &nodes(), &demand(&[("a", "x", 50), ("b", "y", 50)]), 0);
        assert_eq!((a["all"]["a"], a["all"]["b"]), (6, 2), "{a:?}");
        let t = tree(
            "CREATE RESOURCE q (QUERY); CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8; \
             CREATE WORKLOAD high IN all SETTINGS priority = 0; CREATE WORKLOAD low IN all SETTINGS priority = 1;",
        );
        let a = allot(
            &t,
            &nodes(),
            &demand(&[("a", "high", 5), ("b", "low", 50)]),
            0,
        );
        assert_eq!((a["all"]["a"], a["all"]["b"]), (5, 3), "{a:?}");
        let a = allot(
            &t,
            &nodes(),
            &demand(&[("a", "high", 50), ("b", "low", 50)]),
            0,
        );
        assert_eq!((a["all"]["a"], a["all"]["b"]), (8, 0), "{a:?}");
    }

    #[test]
    fn nested_limits_are_divided_each_within_its_own() {
        let t = tree(
            "CREATE RESOURCE q (QUERY); CREATE WORKLOAD all SETTINGS max_concurrent_queries = 8; \
             CREATE WORKLOAD x IN all SETTINGS max_concurrent_queries = 2; CREATE WORKLOAD y IN all;",
        );
        let a = allot(&t, &nodes(), &demand(&[("a", "x", 50), ("b", "y", 50)]), 0);
        assert_eq!((a["all"]["a"], a["all"]["b"]), (2, 6), "{a:?}");
        assert_eq!(a["x"]["a"], 2, "{a:?}");
        assert_eq!(a["x"].values().sum::<i64>(), 2);
        for shares in a.values() {
            assert!(shares.values().all(|s| *s >= 0));
        }
    }

    fn wants(rows: &[(&str, i64, bool)]) -> BTreeMap<String, (i64, bool)> {
        rows.iter()
            .map(|(n, a, m)| (n.to_string(), (*a, *m)))
            .collect()
    }

    #[test]
    fn a_rate_is_divided_max_min_fair_and_what_nobody_wants_evenly() {
        let nodes = nodes();
        // Nobody wants anything: evenly, the odd unit by turn.
        let idle = divide(10_000, &nodes, &wants(&[]), 0);
        assert_eq!(idle.values().sum::<i64>(), 10_000);
        assert!(
            idle.values().all(|v| (3_333..=3_334).contains(v)),
            "{idle:?}"
        );
        // One node uses 5/s and wants no more: it keeps that, the rest evenly.
        let one = divide(10_000, &nodes, &wants(&[("a", 5_000, false)]), 0);
        assert!((6_666..=6_667).contains(&one["a"]), "{one:?}");
        assert_eq!(one.values().sum::<i64>(), 10_000);
        // b wants more; a uses 3/s and c 1/s: they keep that, b has the rest.
        let two = divide(
            10_000,
            &nodes,
            &wants(&[("a", 3_000, false), ("b", 2_000, true), ("c", 1_000, false)]),
            0,
        );
        assert_eq!((two["a"], two["b"], two["c"]), (3_000, 6_000, 1_000));
        // a uses more than the level b is brought to: both at the level.
        let level = divide(
            10_000,
            &nodes,
            &wants(&[("a", 5_000, false), ("b", 2_000, true), ("c", 1_000, false)]),
            0,
        );
        assert_eq!((level["a"], level["b"], level["c"]), (4_500, 4_500, 1_000));
        // Two want more: they split what the bounded one leaves.
        let three = divide(
            10_000,
            &nodes,
            &wants(&[("a", 9_000, true), ("b", 0, true), ("c", 1_000, false)]),
            1,
        );
        assert_eq!((three["a"], three["b"], three["c"]), (4_500, 4_500, 1_000));
        // Bounded demand above the limit: the level cuts the largest.
        let over = divide(
            9,
            &nodes,
            &wants(&[("a", 8, false), ("b", 2, false), ("c", 1, false)]),
            2,
        );
        assert_eq!((over["a"], over["b"], over["c"]), (6, 2, 1));
        // Rounding never goes over, whatever the turn.
        for turn in 0..6 {
            let d = divide(7, &nodes, &wants(&[("a", 1, true), ("b", 1, true)]), turn);
            assert_eq!(d.values().sum::<i64>(), 7, "{d:?}");
            assert_eq!(d["c"], 0, "{d:?}");
        }
    }
}

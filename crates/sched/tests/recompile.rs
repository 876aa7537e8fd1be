//! `recompile` from the previous trees must equal a full `compile`, whatever the change; and it
//! must actually share the subtrees a change did not touch.

use std::sync::Arc;

use proptest::prelude::*;
use sluice_catalog::{Catalog, Change};
use sluice_sched::{compile, recompile, Machine};
use sluice_sql::parse_statement;

const MACHINE: Machine = Machine {
    cores: 4,
    memory: 1 << 34,
};

fn apply(c: &Catalog, sql: &str) -> Option<Catalog> {
    apply_change(c, sql).map(|(next, _)| next)
}

/// The new snapshot and the change, when the statement applied and changed something.
fn apply_change(c: &Catalog, sql: &str) -> Option<(Catalog, Change)> {
    let stmt = parse_statement(sql).ok()?;
    match c.apply(&stmt).ok()? {
        (next, Some(change)) => Some((next, change)),
        (_, None) => None,
    }
}

/// One random DDL statement over a small name space, so that statements often collide with
/// existing entities, re-parent, replace and drop.
fn statement(op: u8, a: u8, b: u8, s: u8) -> String {
    let settings = [
        "weight = 2",
        "priority = 1",
        "priority = -1, precedence = 2",
        "max_concurrent_queries = 3",
        "max_io_requests = 4 FOR io",
        "max_memory = '1Gi'",
        "max_queries_per_second = 5",
        "max_concurrent_threads = 2, max_cpus = 1",
    ];
    let (a, b, s) = (a % 8, b % 8, settings[usize::from(s) % settings.len()]);
    match op % 8 {
        0 | 1 => format!(
            "CREATE WORKLOAD w{a} IN {} SETTINGS {s}",
            if b == 0 {
                "root".into()
            } else {
                format!("w{b}")
            }
        ),
        2 | 3 => format!(
            "CREATE OR REPLACE WORKLOAD w{a} IN {} SETTINGS {s}",
            if b == 0 {
                "root".into()
            } else {
                format!("w{b}")
            }
        ),
        4 => format!("DROP WORKLOAD w{a}"),
        5 => "CREATE OR REPLACE WORKLOAD root SETTINGS max_concurrent_queries = 9".into(),
        6 => [
            "CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD)",
            "DROP RESOURCE cpu",
            "CREATE OR REPLACE RESOURCE io (READ ANY DISK)",
        ][usize::from(b) % 3]
            .into(),
        _ => format!("CREATE WORKLOAD w{a} IN root"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn recompile_equals_compile(ops in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()), 1..60)) {
        let mut catalog = Catalog::new();
        for sql in ["CREATE RESOURCE io (READ DISK d)", "CREATE RESOURCE q (QUERY)", "CREATE RESOURCE m (MEMORY RESERVATION)", "CREATE WORKLOAD root"] {
            catalog = apply(&catalog, sql).expect("setup applies");
        }
        let mut trees = compile(&catalog, MACHINE).expect("compiles");
        for (op, a, b, s) in ops {
            let Some((next, change)) = apply_change(&catalog, &statement(op, a, b, s)) else { continue };
            let incremental = recompile(&trees, &catalog, &next, &change, MACHINE).expect("recompiles");
            let full = compile(&next, MACHINE).expect("compiles");
            prop_assert_eq!(&incremental.trees.iter().map(|t| (&t.resource, &t.root)).collect::<Vec<_>>(),
                            &full.trees.iter().map(|t| (&t.resource, &t.root)).collect::<Vec<_>>());
            catalog = next;
            trees = incremental;
        }
    }
}

#[test]
fn unchanged_siblings_are_shared() {
    let mut c = Catalog::new();
    for sql in [
        "CREATE RESOURCE q (QUERY)",
        "CREATE WORKLOAD root",
        "CREATE WORKLOAD a IN root",
        "CREATE WORKLOAD b IN root SETTINGS weight = 2",
    ] {
        c = apply(&c, sql).expect("applies");
    }
    let before = compile(&c, MACHINE).expect("compiles");
    let (next, change) = apply_change(
        &c,
        "CREATE OR REPLACE WORKLOAD a IN root SETTINGS max_concurrent_queries = 1",
    )
    .expect("applies");
    let after = recompile(&before, &c, &next, &change, MACHINE).expect("recompiles");
    let node = |trees: &sluice_sched::SchedulerTrees, name: &str| {
        let root = trees.tree("q").and_then(|t| t.root.clone()).expect("root");
        let mut found = None;
        root.walk("", &mut |path, n| {
            if path.ends_with(&format!("/{name}")) {
                found = Some(n as *const _);
            }
        });
        found.expect("node exists")
    };
    assert_eq!(
        node(&before, "b"),
        node(&after, "b"),
        "b did not change and must be shared"
    );
    assert_ne!(
        node(&before, "a"),
        node(&after, "a"),
        "a changed and must be rebuilt"
    );
    let root_of =
        |t: &sluice_sched::SchedulerTrees| t.tree("q").and_then(|t| t.root.clone()).expect("root");
    assert!(!Arc::ptr_eq(&root_of(&before), &root_of(&after)));
}

//! Catalog-scale costs: parse, validate and compile a catalog of 1,000 workloads over 4
//! resources; apply one CREATE OR REPLACE to it (and recompile the trees). Targets (issue 2): the whole
//! catalog under 50 ms, one change under 1 ms. Results go in BENCHMARKS.md.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice_catalog::Catalog;
use sluice_sched::{compile, recompile, Machine};
use sluice_sql::{parse_script, parse_statement};

const MACHINE: Machine = Machine {
    cores: 16,
    memory: 64 << 30,
};

/// 4 resources and 1,000 workloads: a root, 3 levels of teams (10 × 10 groups) and leaves with a
/// mix of priorities, weights and limits for every resource kind.
fn script() -> String {
    let mut s = String::from(
        "CREATE RESOURCE io (READ DISK s3, WRITE DISK s3);\n\
         CREATE RESOURCE cpu (MASTER THREAD, WORKER THREAD);\n\
         CREATE RESOURCE query (QUERY);\n\
         CREATE RESOURCE memory (MEMORY RESERVATION);\n\
         CREATE WORKLOAD all SETTINGS max_concurrent_queries = 500, max_memory = '64Gi', max_io_requests = 1000 FOR io;\n",
    );
    let mut n = 1;
    for t in 0..10 {
        s += &format!("CREATE WORKLOAD team{t} IN all SETTINGS priority = {}, weight = {}, max_concurrent_threads = 64;\n", t % 3, t + 1);
        n += 1;
        for g in 0..10 {
            s += &format!("CREATE WORKLOAD team{t}_g{g} IN team{t} SETTINGS weight = {}, max_queries_per_second = 100, precedence = {};\n", g + 1, g % 2);
            n += 1;
        }
    }
    let mut leaf = 0;
    while n < 1000 {
        let (t, g) = (leaf % 10, (leaf / 10) % 10);
        s += &format!(
            "CREATE WORKLOAD leaf{leaf} IN team{t}_g{g} SETTINGS priority = {}, weight = {}, max_concurrent_queries = {}, max_memory = '{}Mi', max_bytes_per_second = '{}Mi' FOR io;\n",
            leaf % 4, leaf % 7 + 1, leaf % 5 + 1, 64 + leaf % 100, 10 + leaf % 50
        );
        leaf += 1;
        n += 1;
    }
    s
}

fn build(script: &str) -> Catalog {
    let mut catalog = Catalog::new();
    for item in parse_script(script) {
        let stmt = item.result.expect("the benchmark script parses");
        // In place, as loading a data dir and `sluice check` do.
        catalog
            .apply_mut(&stmt)
            .expect("the benchmark script applies");
    }
    catalog
}

fn benches(c: &mut Criterion) {
    let script = script();
    let catalog = build(&script);
    assert_eq!(catalog.workloads().count(), 1000);

    c.bench_function("catalog_1000/parse_validate_compile", |b| {
        b.iter(|| {
            let catalog = build(black_box(&script));
            compile(&catalog, MACHINE).expect("compiles")
        })
    });
    c.bench_function("catalog_1000/parse_only", |b| {
        b.iter(|| parse_script(black_box(&script)))
    });
    c.bench_function("catalog_1000/compile_only", |b| {
        b.iter(|| compile(black_box(&catalog), MACHINE).expect("compiles"))
    });

    let change = parse_statement(
        "CREATE OR REPLACE WORKLOAD leaf500 IN team3_g7 SETTINGS priority = 1, weight = 3, max_concurrent_queries = 2",
    )
    .expect("parses");
    c.bench_function("catalog_1000/create_or_replace/apply", |b| {
        b.iter(|| catalog.apply(black_box(&change)).expect("applies"))
    });
    // What a live server does per DDL statement: a new snapshot, then new trees that share
    // every subtree the change did not touch.
    let trees = compile(&catalog, MACHINE).expect("compiles");
    c.bench_function("catalog_1000/create_or_replace/apply_and_recompile", |b| {
        b.iter(|| {
            let (next, change) = catalog.apply(black_box(&change)).expect("applies");
            let change = change.expect("the statement changes the catalog");
            recompile(&trees, &catalog, &next, &change, MACHINE).expect("recompiles")
        })
    });
    c.bench_function(
        "catalog_1000/create_or_replace/apply_and_full_compile",
        |b| {
            b.iter(|| {
                let (next, _) = catalog.apply(black_box(&change)).expect("applies");
                compile(&next, MACHINE).expect("compiles")
            })
        },
    );
}

criterion_group!(catalog_benches, benches);
criterion_main!(catalog_benches);

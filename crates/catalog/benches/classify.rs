//! What classifiers cost a statement: 100 rules of mixed predicates (users, IN lists,
//! application names with ILIKE, CIDR blocks, statement kinds, LIKE and regular expressions on
//! the text, comment tags), tried in rank order against one statement, tags read from its
//! comments read beforehand (the server reads them with the statement's fingerprint, once per
//! distinct text on a connection; `tags` measures that alone). Target (issue 10): under 2 µs
//! per statement. Results go in BENCHMARKS.md.

use std::net::IpAddr;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice_catalog::{Catalog, Facts};
use sluice_sql::{parse_script, StatementKind};

/// 100 rules, ten of each of ten shapes, ranked so that every shape is interleaved.
fn catalog() -> Catalog {
    let mut ddl = String::from("CREATE WORKLOAD all; CREATE WORKLOAD w IN all;\n");
    for i in 0..100 {
        let predicate = match i % 10 {
            0 => format!("user = 'user{i}'"),
            1 => format!("user IN ('a{i}', 'b{i}', 'c{i}', 'd{i}')"),
            2 => format!("application_name ILIKE 'tool{i}%'"),
            3 => format!("client_addr = '10.{i}.0.0/16'"),
            4 => format!("statement_kind = 'insert' AND user = 'loader{i}'"),
            5 => format!("query LIKE '%table_{i}%'"),
            6 => format!("query ~ '(?i)^select .* from t{i}\\\\b'"),
            7 => format!("tag('team') = 'team{i}'"),
            8 => format!("tag('route') LIKE '/api/v{i}/%' OR database = 'db{i}'"),
            _ => format!("NOT user = 'admin' AND application_name = 'app{i}'"),
        };
        ddl += &format!(
            "CREATE CLASSIFIER r{i:03} WORKLOAD w WHEN {predicate} RANK {};\n",
            1000 - i
        );
    }
    let mut catalog = Catalog::new();
    for item in parse_script(&ddl) {
        catalog
            .apply_mut(&item.result.expect("parses"))
            .expect("applies");
    }
    assert_eq!(catalog.rules().iter().count(), 100);
    catalog
}

const QUERY: &str = "SELECT customer_id, sum(amount) FROM orders WHERE created_at > now() - INTERVAL '1 day' GROUP BY 1 /* team='analysts',route='/reports/daily' */";

/// The statement as the server sees it: an analyst's psql session from a LAN address.
fn facts<'a>(query: &'a str, tags: &'a [(String, String)], addr: IpAddr) -> Facts<'a> {
    Facts {
        user: "analyst",
        database: Some("shop"),
        application_name: Some("psql"),
        client_addr: Some(addr),
        statement_kind: StatementKind::Select,
        query,
        tags,
    }
}

fn classify(c: &mut Criterion) {
    let catalog = catalog();
    let rules = catalog.rules();
    let addr = IpAddr::from([192, 168, 1, 20]);
    let mut group = c.benchmark_group("classify");
    // No rule matches: all 100 are tried (the worst case).
    let tags = sluice_sql::tags(QUERY);
    group.bench_function("100_rules_no_match", |b| {
        b.iter(|| {
            black_box(
                rules
                    .classify(&facts(black_box(QUERY), &tags, addr), |_| {})
                    .is_some(),
            )
        })
    });
    // The 50th rule matches (by its tag).
    let query = QUERY.replace("team='analysts'", "team='team57'");
    let tags = sluice_sql::tags(&query);
    group.bench_function("100_rules_match_at_50", |b| {
        b.iter(|| {
            black_box(
                rules
                    .classify(&facts(black_box(&query), &tags, addr), |_| {})
                    .map(|r| r.rank),
            )
        })
    });
    group.bench_function("tags", |b| b.iter(|| sluice_sql::tags(black_box(QUERY))));
    group.finish();
}

criterion_group!(benches, classify);
criterion_main!(benches);

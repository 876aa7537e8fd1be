//! The `--dump` text: the three system tables (and `system.classifiers` when there are any) as ClickHouse's TSV shows them once unescaped
//! (NULL as `\N`, arrays as `['a','b']`, floats in shortest round-trip form), each section a
//! `== system.<table>` line, a header row, and rows in byte-wise order.

use std::fmt::Write as _;

use sluice_catalog::{resource_disks, Catalog};
use sluice_sched::{compile, Machine};
use sluice_sql::{format_float, Result};

fn array(items: &[&str]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")))
        .collect();
    format!("[{}]", quoted.join(","))
}

fn nullable<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "\\N".to_string(), |v| v.to_string())
}

pub fn dump(catalog: &Catalog, machine: Machine) -> Result<String> {
    let mut out = String::new();
    out.push_str("== system.workloads\nname\tparent\tcreate_query\n");
    for w in catalog.workloads() {
        let _ = writeln!(
            out,
            "{}\t{}\t{}",
            w.name,
            w.parent.as_deref().unwrap_or(""),
            w
        );
    }
    out.push_str("== system.resources\nname\tread_disks\twrite_disks\tunit\tcreate_query\n");
    for r in catalog.resources() {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}",
            r.name,
            array(&resource_disks(r, true)),
            array(&resource_disks(r, false)),
            r.unit().name(),
            r
        );
    }
    out.push_str("== system.scheduler\nresource\tpath\ttype\tweight\tpriority\tprecedence\tmax_requests\tmax_cost\tmax_speed\tmax_burst\n");
    let trees = compile(catalog, machine)?;
    for row in trees.rows() {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            row.resource,
            row.path,
            row.node.kind.type_name(),
            format_float(row.node.weight),
            row.node.priority,
            row.node.precedence,
            nullable(row.max_requests()),
            nullable(row.max_cost()),
            nullable(row.max_speed().map(format_float)),
            nullable(row.max_burst().map(format_float)),
        );
    }
    // sluice's own: only when there are any, so a ClickHouse-only catalog dumps exactly as
    // ClickHouse does.
    if !catalog.rules().is_empty() {
        out.push_str(
            "== system.classifiers\nname\tworkload\trank\tdry_run\tpredicate\tcreate_query\n",
        );
        for c in catalog.classifiers() {
            let sluice_catalog::Entity::Classifier(c) = &c.entity else {
                continue;
            };
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}",
                c.name,
                c.workload,
                c.rank,
                u8::from(c.dry_run),
                c.predicate,
                c
            );
        }
    }
    Ok(out)
}

//! Differential tests against ClickHouse 26.9.
//!
//! Each `NAME.sql` in `tests/differential/` and `grammar/examples/` has a `NAME.expected` that
//! ClickHouse itself produced
//! (`tests/differential/generate.py`, run by hand under the oracle venv; never by the suite).
//! `sluice check --dump` must print the same, line for line, with the machine pinned to what
//! ClickHouse saw (`machine.txt`). Two allowances, both about message text only:
//! - syntax errors must have the code `SYNTAX_ERROR`, but the message is sluice's own;
//! - "It is referenced by: …" lists names in ClickHouse's hash-set order; they are compared as sets.

use std::path::{Path, PathBuf};
use std::process::Command;

fn differential_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential")
}

fn machine() -> (String, String) {
    let text =
        std::fs::read_to_string(differential_dir().join("machine.txt")).expect("machine.txt");
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("machine.txt has no {key}"))
            .to_string()
    };
    (get("cores"), get("memory"))
}

/// The comparable form of one output line.
fn normalize(line: &str) -> String {
    if let Some(rest) = line.strip_prefix("ERROR SYNTAX_ERROR:") {
        let _ = rest;
        return "ERROR SYNTAX_ERROR".to_string();
    }
    if let Some((head, names)) = line.split_once("It is referenced by: ") {
        let names = names.trim_end_matches(". (BAD_ARGUMENTS)");
        let mut list: Vec<&str> = names.split(' ').collect();
        list.sort();
        return format!("{head}It is referenced by: {}", list.join(" "));
    }
    line.to_string()
}

#[test]
fn sluice_check_dump_matches_clickhouse() {
    let (cores, memory) = machine();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut scripts: Vec<PathBuf> = [differential_dir(), root.join("grammar/examples")]
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).expect("script directory"))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    scripts.sort();
    assert!(
        scripts.len() >= 50,
        "expected at least 40 scripts, found {}",
        scripts.len()
    );
    let mut failures = Vec::new();
    for script in &scripts {
        let expected_path = script.with_extension("expected");
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["check", "--dump", "--cores", &cores, "--memory", &memory])
            .arg(script)
            .output()
            .expect("runs sluice");
        let actual = String::from_utf8_lossy(&out.stdout);
        let all_ok = !expected.lines().any(|l| l.starts_with("ERROR "));
        assert_eq!(
            out.status.code(),
            Some(if all_ok { 0 } else { 1 }),
            "{}: exit status; stderr: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let (a, e): (Vec<String>, Vec<String>) = (
            actual.lines().map(normalize).collect(),
            expected.lines().map(normalize).collect(),
        );
        if a != e {
            let first = a
                .iter()
                .zip(&e)
                .position(|(x, y)| x != y)
                .unwrap_or(a.len().min(e.len()));
            failures.push(format!(
                "{}: first difference at line {}\n  sluice:     {}\n  clickhouse: {}",
                script.file_name().unwrap_or_default().to_string_lossy(),
                first + 1,
                a.get(first).map_or("<end>", |s| s.as_str()),
                e.get(first).map_or("<end>", |s| s.as_str()),
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scripts differ from ClickHouse:\n{}",
        failures.len(),
        scripts.len(),
        failures.join("\n")
    );
}

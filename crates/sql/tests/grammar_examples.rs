//! Every script in `grammar/examples` parses, and each statement's canonical text parses back to
//! the same statement (normalized).

use std::path::Path;

use sluice_sql::{parse_script, parse_statement};

#[test]
fn grammar_examples_parse_and_round_trip() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../grammar/examples");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("grammar/examples") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "sql") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        for item in parse_script(&text) {
            let stmt = item
                .result
                .unwrap_or_else(|e| panic!("{}: {}: {e}", path.display(), item.text));
            let printed = stmt.to_string();
            let reparsed = parse_statement(&printed)
                .unwrap_or_else(|e| panic!("{}: {printed}: {e}", path.display()));
            assert_eq!(reparsed, stmt.normalized(), "{}: {printed}", path.display());
            count += 1;
        }
    }
    assert!(count > 50, "only {count} statements in grammar/examples");
}

//! Every script in `grammar/examples` parses, and each statement's canonical text parses back to
//! the same statement (normalized). The differential scripts are read too: their statements that
//! parse must round-trip as well (some are there to be syntax errors).

use std::path::Path;

use sluice_sql::{parse_script, parse_statement};

#[test]
fn grammar_examples_parse_and_round_trip() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut count = 0;
    for (dir, must_parse) in [("grammar/examples", true), ("tests/differential", false)] {
        for entry in std::fs::read_dir(root.join(dir)).expect(dir) {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "sql") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            count += round_trip_script(&path, &text, must_parse);
        }
    }
    assert!(count > 400, "only {count} statements round-tripped");
}

fn round_trip_script(path: &Path, text: &str, must_parse: bool) -> usize {
    let mut count = 0;
    for item in parse_script(text) {
        let stmt = match item.result {
            Ok(stmt) => stmt,
            Err(e) if must_parse => panic!("{}: {}: {e}", path.display(), item.text),
            Err(_) => continue,
        };
        let printed = stmt.to_string();
        let reparsed = parse_statement(&printed)
            .unwrap_or_else(|e| panic!("{}: {printed}: {e}", path.display()));
        assert_eq!(reparsed, stmt.normalized(), "{}: {printed}", path.display());
        count += 1;
    }
    count
}

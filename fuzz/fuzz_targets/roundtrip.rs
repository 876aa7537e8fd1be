//! parse → print → parse: whatever parses, prints to text that parses back to the same
//! (normalized) statement, and printing is idempotent.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for item in sluice_sql::parse_script(text) {
        let Ok(stmt) = item.result else { continue };
        let printed = stmt.to_string();
        let reparsed = sluice_sql::parse_statement(&printed)
            .unwrap_or_else(|e| panic!("printed text does not parse: {printed:?}: {e}"));
        assert_eq!(reparsed, stmt.normalized(), "printed: {printed:?}");
        assert_eq!(reparsed.to_string(), printed);
    }
});

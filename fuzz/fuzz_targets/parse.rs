//! Any bytes: the parser returns, never panics, and each statement's echo text is bounded.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        for item in sluice_sql::parse_script(text) {
            assert!(item.text.len() <= text.len() + 2);
        }
    }
});

//! Arbitrary bytes through the loader's own parse path never panic; the fast
//! reader agrees with serde_norway whenever it answers; a file that loads
//! survives a save/load round trip and compiles or fails cleanly.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use ppp::policy::{Engine, parse_global, parse_global_slow, parse_sandbox};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("policies.yaml");
    let _ = parse_sandbox(path, text);
    let loaded = parse_global(path, text);
    let slow = parse_global_slow(path, text);
    assert_eq!(loaded.as_ref().ok(), slow.as_ref().ok(), "fast and serde_norway readers disagree");
    let Ok(file) = loaded else { return };
    let saved = serde_norway::to_string(&file).expect("a loaded file serializes");
    let back = parse_global(path, &saved).unwrap_or_else(|e| panic!("saved file does not load: {e}\n{saved}"));
    assert_eq!(back, file);
    if let Ok(engine) = Engine::build(file.default, file.rules, vec![]) {
        let _ = engine.decide(None, Some("api.example.com"), Some([10, 0, 0, 1].into()), 443);
    }
});

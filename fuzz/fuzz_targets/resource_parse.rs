//! Any string either fails to parse, or parses to a resource whose printed
//! form parses back to the same resource.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ppp::policy::{Resource, Target};

fuzz_target!(|s: &str| {
    if let Ok(r) = Resource::parse(s) {
        let printed = r.to_string();
        let again = Resource::parse(&printed).unwrap_or_else(|e| panic!("`{s}` printed as `{printed}`, which fails: {e}"));
        assert_eq!(again, r, "`{s}` printed as `{printed}`");
        assert_eq!(again.to_string(), printed);
    }
    // The target grammar shares code paths; it must not panic either.
    let _ = Target::parse(s);
});

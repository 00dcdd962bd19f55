//! Arbitrary bytes through the kit loader never panic: as `kit.yaml` (strict
//! decode, then every check, with `source` files served from memory) and as
//! a kit zip. A kit that loads packs, and its pack loads back to the same kit.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use ppp::kit::{manifest, pack, source};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("kit.yaml");
    if let Ok(m) = manifest::parse(path, data)
        && let Ok(kit) = manifest::check(path, &m, data.to_vec(), |_| Ok(b"file".to_vec()))
    {
        let zip = pack::pack(&kit).expect("a loaded kit packs");
        let back = source::load_zip_bytes(Path::new("kit.zip"), &zip).expect("a packed kit loads");
        assert_eq!(back.rules, kit.rules);
        assert_eq!(back.files.len(), kit.files.len());
    }
    let _ = source::load_zip_bytes(Path::new("kit.zip"), data);
});

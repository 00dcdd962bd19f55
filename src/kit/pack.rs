//! `ppp kit pack`: a kit as a deterministic zip.
//!
//! The same kit always packs to the same bytes, so a digest names a kit
//! version and a re-pack shows no spurious change: the archive holds only
//! `kit.yaml` (verbatim) and the files its `source` entries name, sorted by
//! name, each with the DOS epoch (1980-01-01 00:00) as its time, mode 0644,
//! deflate at a fixed level, and no extra fields (the zip crate writes the
//! extended-timestamp field only when asked, and we never ask).

use std::io::Write as _;

use anyhow::Result;
use zip::write::SimpleFileOptions;

use super::manifest::{Kit, MANIFEST, normalize};

/// The kit's archive bytes.
pub fn pack(kit: &Kit) -> Result<Vec<u8>> {
    let mut entries: Vec<(String, &[u8])> = vec![(MANIFEST.to_owned(), kit.manifest_bytes.as_slice())];
    for f in &kit.files {
        if let Some(source) = &f.source {
            let name = normalize(source);
            if !entries.iter().any(|(n, _)| *n == name) {
                entries.push((name, f.bytes.as_slice()));
            }
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(6))
        .last_modified_time(zip::DateTime::default())
        .unix_permissions(0o644)
        .large_file(false);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, bytes) in entries {
        zip.start_file(name, options)?;
        zip.write_all(bytes)?;
    }
    Ok(zip.finish()?.into_inner())
}

/// `<name>-<version>.zip`.
pub fn default_file_name(kit: &Kit) -> String {
    format!("{}-{}.zip", kit.name(), kit.version())
}

//! Where a kit comes from: a directory, a `.zip` made by `ppp kit pack`, a
//! git URL (`git+https://…`, `file://…`, `….git`), or an OCI reference.
//!
//! A zip is read in memory, never extracted: its entries are looked up by
//! name, so an entry named `../x` or a symlink entry has nowhere to go. A
//! git URL is cloned (`--depth 1`) into a temporary directory that is gone
//! when loading returns; the kit's file contents are held in memory.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::manifest::{self, Kit, MANIFEST, MAX_FILE_BYTES, MAX_FILES, MAX_MANIFEST_BYTES, MAX_TOTAL_BYTES, normalize};
use crate::error::fail;
use crate::exec::{self, Invocation};

/// A kit and the reference it was loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub reference: String,
    pub kit: Kit,
}

/// What a reference names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    Dir(PathBuf),
    Zip(PathBuf),
    Git(String),
    Oci(String),
}

/// Classify a reference. A path that exists wins; then git URLs; anything
/// else that looks like `registry/name:tag` is OCI.
pub fn classify(reference: &str) -> Result<Reference> {
    let path = Path::new(reference);
    if path.is_dir() {
        return Ok(Reference::Dir(path.to_owned()));
    }
    if path.is_file() {
        return Ok(Reference::Zip(path.to_owned()));
    }
    if let Some(url) = reference.strip_prefix("git+") {
        return Ok(Reference::Git(url.to_owned()));
    }
    let git_scheme = ["https://", "http://", "ssh://", "git://", "file://"].iter().any(|s| reference.starts_with(s));
    if reference.starts_with("git@")
        || (git_scheme && reference.to_ascii_lowercase().ends_with(".git"))
        || reference.starts_with("file://")
    {
        return Ok(Reference::Git(reference.to_owned()));
    }
    let looks_oci = reference.contains('/') && !reference.starts_with(['.', '/']) && !reference.contains("://");
    if looks_oci {
        return Ok(Reference::Oci(reference.to_owned()));
    }
    Err(fail(format!("kit `{reference}` was not found"))
        .hint("pass a kit directory, a .zip from `ppp kit pack`, a git URL (`git+https://…`) or an OCI reference")
        .code(2)
        .into())
}

/// Load and check the kit `reference` names. Touches no ppp state.
pub fn load(reference: &str) -> Result<Loaded> {
    let kit = match classify(reference)? {
        Reference::Dir(dir) => manifest::load_dir(&dir)?,
        Reference::Zip(file) => load_zip(&file)?,
        Reference::Git(url) => load_git(&url)?,
        Reference::Oci(r) => load_oci(&r)?,
    };
    Ok(Loaded { reference: reference.to_owned(), kit })
}

/// Load a kit from a zip file, in memory.
/// Pull an OCI kit (with the registry's credentials from ppp's secret
/// store, when any) and load its zip from memory; nothing is written.
fn load_oci(reference: &str) -> Result<Kit> {
    let target = super::oci::Target::parse(reference)?;
    // ppp's directories come from the environment, as for every command;
    // a store that cannot be opened means anonymous access.
    let credentials = crate::dirs::Dirs::from_env()
        .ok()
        .and_then(|dirs| crate::secret::Store::open(&dirs).ok())
        .map(|store| store.registry(target.registry()))
        .transpose()?
        .flatten();
    let pulled = super::oci::pull(&target, credentials.as_ref())?;
    load_zip_bytes(Path::new(reference), &pulled.zip)
}

pub fn load_zip(file: &Path) -> Result<Kit> {
    let bytes = manifest::read_bounded(file, manifest::MAX_ARCHIVE_BYTES, "kit archive")?;
    load_zip_bytes(file, &bytes)
}

/// Load a kit from a zip's bytes; `file` names it in errors.
pub fn load_zip_bytes(file: &Path, bytes: &[u8]) -> Result<Kit> {
    let bad =
        |why: String| -> anyhow::Error { fail(format!("invalid kit archive `{}`: {why}", file.display())).into() };
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| bad(e.to_string()))?;
    if zip.len() > MAX_FILES + 1 {
        return Err(bad(format!("more than {} entries", MAX_FILES + 1)));
    }
    let mut entries: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut total = 0u64;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| bad(e.to_string()))?;
        let name = entry.name().to_owned();
        if entry.is_dir() {
            continue;
        }
        if entry.unix_mode().is_some_and(|m| m & 0o170_000 == 0o120_000) {
            return Err(bad(format!("entry `{}` is a symlink", name.escape_debug())));
        }
        if entry.enclosed_name().is_none() || name.starts_with('/') || name.split('/').any(|s| s == "..") {
            return Err(bad(format!("entry `{}` is not a plain relative path", name.escape_debug())));
        }
        let max = if name == MANIFEST { MAX_MANIFEST_BYTES } else { MAX_FILE_BYTES };
        let mut data = Vec::new();
        (&mut entry).take(max + 1).read_to_end(&mut data).map_err(|e| bad(format!("entry `{name}`: {e}")))?;
        if data.len() as u64 > max {
            return Err(bad(format!("entry `{}` is larger than the limit", name.escape_debug())));
        }
        total += data.len() as u64;
        if total > MAX_TOTAL_BYTES + MAX_MANIFEST_BYTES {
            return Err(bad("its entries add up to more than the limit".to_owned()));
        }
        entries.insert(name, data);
    }
    let manifest_bytes =
        entries.get(MANIFEST).cloned().ok_or_else(|| bad(format!("it has no `{MANIFEST}` at the top")))?;
    let shown = file.join(MANIFEST);
    let m = manifest::parse(&shown, &manifest_bytes)?;
    manifest::check(&shown, &m, manifest_bytes, |source| {
        let key = normalize(source);
        entries
            .get(&key)
            .cloned()
            .ok_or_else(|| fail(format!("kit file `{source}` is not in the archive `{}`", file.display())).into())
    })
}

/// Clone a git URL (`--depth 1`) into a temporary directory and load it.
fn load_git(url: &str) -> Result<Kit> {
    let tmp = tempfile::Builder::new().prefix("ppp-kit-").tempdir().context("could not make a temporary directory")?;
    let dest = tmp.path().join("kit");
    // No hooks or submodules run: a clone only fetches. `--` keeps a URL
    // starting with `-` from being read as an option.
    let inv = Invocation::new("git")
        .args(["clone", "--quiet", "--depth", "1", "--no-recurse-submodules", "--"])
        .arg(url)
        .arg(&dest)
        .env("GIT_TERMINAL_PROMPT", "0")
        .timeout(Duration::from_secs(5 * 60));
    exec::run(&inv).map_err(|e| {
        anyhow::Error::new(e)
            .context(fail(format!("could not clone kit `{url}`")).hint("check the URL with `git clone` by hand"))
    })?;
    manifest::load_dir(&dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_classified() {
        assert_eq!(classify("git+https://example.com/k").unwrap(), Reference::Git("https://example.com/k".into()));
        assert_eq!(classify("file:///srv/kit").unwrap(), Reference::Git("file:///srv/kit".into()));
        assert_eq!(classify("https://h/x/kit.git").unwrap(), Reference::Git("https://h/x/kit.git".into()));
        assert_eq!(classify("ghcr.io/acme/kit:1.0.0").unwrap(), Reference::Oci("ghcr.io/acme/kit:1.0.0".into()));
        assert!(classify("./no-such-kit").is_err());
        assert_eq!(normalize("./a//b"), "a/b");
    }
}

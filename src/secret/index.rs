//! `$PPP_DATA/secrets-index.json`: which secrets exist, in which scope, for
//! which hosts, and in which backend each value lives. Never a value.
//!
//! Keychains cannot list their items, so `ppp secret ls` reads this file, and
//! every read goes to the backend recorded here, so an entry stays reachable
//! when auto-detection would now pick the other backend. Writers hold
//! `state.lock` (the [`Store`](crate::secret::Store) takes it).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::error::fail;
use crate::secret::services::Header;
use crate::secret::{Entry, Kind, Scope, command, validate};
use crate::state;

/// On-disk format version.
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    entries: Vec<Entry>,
}

/// The index, loaded.
#[derive(Debug)]
pub(crate) struct Index {
    path: PathBuf,
    pub(crate) entries: Vec<Entry>,
}

impl Index {
    /// Read the index; a missing file is an empty index.
    pub(crate) fn load(path: &Path) -> Result<Index> {
        let Some(text) = state::read_optional(path)? else {
            return Ok(Index { path: path.to_owned(), entries: Vec::new() });
        };
        let file: File = state::parse_json(path, &text)?;
        if file.version != VERSION {
            return Err(fail(format!(
                "`{}` has format version {}, this ppp reads {VERSION}",
                path.display(),
                file.version
            ))
            .hint("upgrade ppp")
            .into());
        }
        for e in &file.entries {
            check(e).with_context(|| {
                format!("`{}` lists an invalid entry `{}` ({} scope)", path.display(), e.name, e.scope)
            })?;
        }
        let mut index = Index { path: path.to_owned(), entries: file.entries };
        index.sort();
        Ok(index)
    }

    /// Write the index atomically (0600). The caller holds `state.lock`.
    pub(crate) fn save(&mut self) -> Result<()> {
        self.sort();
        let file = File { version: VERSION, entries: std::mem::take(&mut self.entries) };
        let result = state::write_json(&self.path, &file);
        self.entries = file.entries;
        result
    }

    pub(crate) fn find(&self, scope: &Scope, name: &str, kind: Kind) -> Option<&Entry> {
        self.entries.iter().find(|e| e.is(scope, name, kind))
    }

    /// Add `entry`, replacing the one with the same scope, name and kind;
    /// returns the replaced one.
    pub(crate) fn upsert(&mut self, entry: Entry) -> Option<Entry> {
        let old = self.remove(&entry.scope, &entry.name, entry.kind);
        self.entries.push(entry);
        old
    }

    pub(crate) fn remove(&mut self, scope: &Scope, name: &str, kind: Kind) -> Option<Entry> {
        let i = self.entries.iter().position(|e| e.is(scope, name, kind))?;
        Some(self.entries.remove(i))
    }

    /// Global first, then sandboxes by name; services before custom secrets.
    fn sort(&mut self) {
        self.entries.sort_by(|a, b| {
            let key = |e: &Entry| {
                (matches!(e.scope, Scope::Sandbox(_)), e.scope.to_string(), e.kind == Kind::Custom, e.name.clone())
            };
            key(a).cmp(&key(b))
        });
    }
}

/// An entry read from disk is as valid as one the store would write: a
/// hand-edited index must not smuggle in a wildcard host or a bad header.
fn check(e: &Entry) -> Result<()> {
    if let Scope::Sandbox(s) = &e.scope {
        validate::sandbox(s)?;
    }
    match e.kind {
        Kind::Service => validate::service(&e.name)?,
        Kind::Registry => {
            if e.scope != Scope::Global || validate::registry(&e.name)? != e.name {
                return Err(fail(format!("registry entry `{}` must be global and in canonical form", e.name)).into());
            }
        }
        Kind::Custom => {
            validate::placeholder(&e.name)?;
            if e.placeholder.as_deref() != Some(e.name.as_str()) {
                return Err(fail("a custom entry's placeholder must equal its name").into());
            }
        }
    }
    for h in &e.hosts {
        if validate::host(h)? != *h {
            return Err(fail(format!("host `{h}` is not in canonical form (lower case, no trailing dot)")).into());
        }
    }
    if let Some(h) = &e.header {
        Header::parse(h)?;
    }
    if let Some(v) = &e.env {
        validate::env_var(v)?;
    }
    match (&e.command, e.refresh) {
        (None, None) => {}
        (Some(argv), Some(secs)) => {
            if e.kind == Kind::Registry || argv.is_empty() || argv[0].is_empty() {
                return Err(fail("a command secret needs a program, and registry credentials cannot have one").into());
            }
            let d = std::time::Duration::from_secs(secs);
            if !(command::MIN_REFRESH..=command::MAX_REFRESH).contains(&d) {
                return Err(fail(format!("refresh `{secs}` is out of range")).into());
            }
        }
        _ => return Err(fail("`command` and `refresh` go together").into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Backend;
    use time::macros::datetime;

    fn entry(scope: Scope, name: &str, kind: Kind) -> Entry {
        Entry {
            scope,
            name: name.to_owned(),
            kind,
            hosts: vec!["api.example.com".to_owned()],
            header: (kind == Kind::Service).then(|| "authorization: Bearer".to_owned()),
            placeholder: (kind == Kind::Custom).then(|| name.to_owned()),
            env: None,
            backend: Backend::File,
            created_at: datetime!(2025-01-02 03:04:05 UTC),
            command: None,
            refresh: None,
        }
    }

    #[test]
    fn round_trip_sorted_and_stable_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets-index.json");
        let mut idx = Index::load(&path).unwrap();
        assert!(idx.entries.is_empty());
        idx.upsert(entry(Scope::Sandbox("b".into()), "svc", Kind::Service));
        idx.upsert(entry(Scope::Global, "PPP_TOKEN_X", Kind::Custom));
        idx.upsert(entry(Scope::Global, "svc", Kind::Service));
        let mut replaced = entry(Scope::Global, "svc", Kind::Service);
        replaced.backend = Backend::Keychain;
        assert_eq!(idx.upsert(replaced).unwrap().backend, Backend::File);
        idx.save().unwrap();

        let text = std::fs::read_to_string(&path).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json["entries"][0],
            serde_json::json!({
                "scope": "global", "name": "svc", "kind": "service", "hosts": ["api.example.com"],
                "header": "authorization: Bearer", "backend": "keychain",
                "created_at": "2025-01-02T03:04:05Z"
            })
        );
        assert_eq!(json["entries"][1]["placeholder"], "PPP_TOKEN_X");
        assert_eq!(json["entries"][2]["scope"], "b");

        let back = Index::load(&path).unwrap();
        assert_eq!(back.entries, idx.entries);
        assert!(back.find(&Scope::Sandbox("b".into()), "svc", Kind::Service).is_some());
        assert!(back.find(&Scope::Sandbox("b".into()), "svc", Kind::Custom).is_none());
    }

    #[test]
    fn bad_files_name_the_file_and_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets-index.json");
        std::fs::write(&path, "{\"version\": 1,\n \"entries\": [}").unwrap();
        let err = format!("{:#}", Index::load(&path).unwrap_err());
        assert!(err.contains("line 2"), "{err}");

        let mut bad = entry(Scope::Global, "svc", Kind::Service);
        bad.hosts = vec!["*.example.com".into()];
        let text = serde_json::to_string(&File { version: 1, entries: vec![bad] }).unwrap();
        std::fs::write(&path, text).unwrap();
        let err = format!("{:#}", Index::load(&path).unwrap_err());
        assert!(err.contains("invalid entry `svc`") && err.contains("*.example.com"), "{err}");

        std::fs::write(&path, "{\"version\": 9, \"entries\": []}").unwrap();
        assert!(format!("{:#}", Index::load(&path).unwrap_err()).contains("version 9"));

        std::fs::write(&path, "{\"version\": 1, \"entries\": [{\"scope\": \"custom\"}]}").unwrap();
        let err = format!("{:#}", Index::load(&path).unwrap_err());
        assert!(err.contains("reserved"), "{err}");
    }
}

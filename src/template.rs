//! Templates: a sandbox's machine disk saved as a compressed qcow2 under
//! `$PPP_CACHE/templates/`, listed in `templates.json`, exported to and
//! imported from a tar (the qcow2 plus `template.json`).
//!
//! This module owns the index and the disk files. It never registers a
//! template whose disk is not complete and checked: disks are written to a
//! temp name and renamed, and the index is written atomically under
//! `state.lock` only after that.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::state;

/// The index file in the templates directory.
pub const INDEX: &str = "templates.json";
/// The metadata member of an exported tar.
pub const META: &str = "template.json";
/// The disk member of an exported tar.
pub const DISK: &str = "disk.qcow2";
/// Converting or packing a disk of many GiB takes a while.
const DISK_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// One saved template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// The name users give it (`opencode-default`).
    pub tag: String,
    /// The first 12 hex digits of the disk's sha256.
    pub id: String,
    /// The sandbox it was saved from.
    pub source: Option<String>,
    /// The agent of that sandbox.
    pub agent: Option<String>,
    /// The disk file's size in bytes.
    pub size: u64,
    /// The disk file's sha256, in hex.
    pub sha256: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

impl Template {
    /// The disk file's name in the templates directory.
    pub fn file_name(&self) -> String {
        format!("{}.qcow2", self.id)
    }

    /// Where the disk is.
    pub fn disk(&self, dirs: &Dirs) -> PathBuf {
        dirs.templates().join(self.file_name())
    }
}

/// `templates.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    pub templates: Vec<Template>,
}

impl Index {
    /// Read the index; a missing file is an empty index.
    pub fn load(dirs: &Dirs) -> Result<Index> {
        let path = dirs.templates().join(INDEX);
        match state::read_optional(&path)? {
            Some(text) => Ok(state::parse_json(&path, &text)?),
            None => Ok(Index::default()),
        }
    }

    /// Write the index; the caller holds `state.lock`.
    pub fn save_locked(&self, dirs: &Dirs) -> Result<()> {
        state::create_private_dir(&dirs.templates())?;
        state::write_json(&dirs.templates().join(INDEX), self)
    }

    /// The template with this tag, else the one whose id is or starts with
    /// `key` (at least 4 digits, and only when one matches).
    pub fn find(&self, key: &str) -> Option<&Template> {
        if let Some(t) = self.templates.iter().find(|t| t.tag == key) {
            return Some(t);
        }
        if key.len() < 4 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut hits = self.templates.iter().filter(|t| t.id.starts_with(key));
        match (hits.next(), hits.next()) {
            (Some(t), None) => Some(t),
            _ => None,
        }
    }
}

/// A tag must be usable as a word in commands and JSON; it cannot look like
/// a path (those are image references, see [`resolve`]).
pub fn validate_tag(tag: &str) -> Result<()> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(fail(format!("invalid template tag `{tag}`"))
            .hint("use letters, digits, `.`, `_` and `-`, starting with a letter or digit")
            .code(2)
            .into())
    }
}

/// What `-t VALUE` means for `machine init --image`: a saved template's
/// disk, or anything else passed through verbatim as an image reference
/// (as `sbx` does).
pub fn resolve(dirs: &Dirs, value: &str) -> Result<(PathBuf, Option<Template>)> {
    let index = Index::load(dirs)?;
    match index.find(value) {
        Some(t) => {
            let disk = t.disk(dirs);
            if !disk.is_file() {
                return Err(fail(format!("template `{}` has no disk at `{}`", t.tag, disk.display()))
                    .hint(format!("remove it with `ppp template rm {}` and save or load it again", t.tag))
                    .into());
            }
            Ok((disk, Some(t.clone())))
        }
        None => Ok((PathBuf::from(value), None)),
    }
}

/// Where a machine's disk is. `podman machine inspect` (podman 5 and 6)
/// does not report it, but names the provider's `ConfigDir`, which holds
/// the machine config `<Name>.json` (podman's `MachineConfig`) whose
/// `ImagePath.Path` is the disk. The error says which step failed.
pub fn image_path_from_config(inspect_json: &str) -> Result<PathBuf, String> {
    let v: serde_json::Value =
        serde_json::from_str(inspect_json.trim()).map_err(|e| format!("its output is not JSON: {e}"))?;
    let first = if v.is_array() { v.get(0).unwrap_or(&serde_json::Value::Null) } else { &v };
    let dir = first.pointer("/ConfigDir/Path").and_then(serde_json::Value::as_str);
    let name = first.get("Name").and_then(serde_json::Value::as_str);
    let (Some(dir), Some(name)) = (dir, name) else {
        return Err("it names no `ConfigDir.Path` and `Name`".into());
    };
    if name.contains('/') || name.starts_with('.') {
        return Err(format!("it names the machine `{name}`, which is not a file name"));
    }
    let path = Path::new(dir).join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("`{}` cannot be read: {e}", path.display()))?;
    config_image_path(&text).ok_or_else(|| format!("`{}` has no `ImagePath.Path`", path.display()))
}

/// `ImagePath.Path` of a podman machine config.
fn config_image_path(config_json: &str) -> Option<PathBuf> {
    let v: serde_json::Value = serde_json::from_str(config_json.trim()).ok()?;
    v.pointer("/ImagePath/Path").and_then(serde_json::Value::as_str).filter(|s| !s.is_empty()).map(PathBuf::from)
}

/// `qemu-img convert -c -O qcow2 SRC DST`: a compressed copy of the disk.
pub fn convert(src: &Path, dst: &Path) -> Invocation {
    Invocation::new(qemu_img()).args(["convert", "-c", "-O", "qcow2"]).arg(src).arg(dst).timeout(DISK_TIMEOUT)
}

/// `qemu-img check -f qcow2 FILE`: the disk is a sound qcow2. The format
/// is given, not probed, and [`info`] has ruled out a backing file first
/// (check would open it).
pub fn check(file: &Path) -> Invocation {
    Invocation::new(qemu_img()).args(["check", "-f", "qcow2"]).arg(file).timeout(DISK_TIMEOUT)
}

/// `qemu-img info --output=json FILE`, which does not open backing files.
pub fn info(file: &Path) -> Invocation {
    Invocation::new(qemu_img()).args(["info", "--output=json"]).arg(file).timeout(DISK_TIMEOUT)
}

/// Why `qemu-img info` output is not a disk ppp may hand to a VM, if it is
/// not: it must be a qcow2 standing alone. A backing file or data file
/// names a host path the VM would then read (an imported template could
/// point it at `~/.ssh`).
pub fn unsafe_disk(info_json: &str) -> Option<String> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(info_json) else {
        return Some("`qemu-img info` printed no JSON".into());
    };
    match v.get("format").and_then(serde_json::Value::as_str) {
        Some("qcow2") => {}
        Some(other) => return Some(format!("the disk is {other}, not qcow2")),
        None => return Some("`qemu-img info` names no format".into()),
    }
    for key in ["backing-filename", "full-backing-filename"] {
        if let Some(b) = v.get(key).and_then(serde_json::Value::as_str) {
            return Some(format!("the disk has a backing file `{b}`"));
        }
    }
    if let Some(d) = v.pointer("/format-specific/data/data-file").and_then(serde_json::Value::as_str) {
        return Some(format!("the disk has an external data file `{d}`"));
    }
    None
}

fn qemu_img() -> PathBuf {
    exec::find_on_path("qemu-img").unwrap_or_else(|| PathBuf::from("qemu-img"))
}

/// `tar -cf OUT -C DIR MEMBERS…`. The tar binary rather than a crate: it
/// writes the multi-GiB disk sparse-aware and streaming, needs no new
/// dependency, and is on every host podman machines run on.
pub fn pack(out: &Path, dir: &Path, members: &[&str]) -> Invocation {
    Invocation::new("tar").arg("--sparse").arg("-cf").arg(out).arg("-C").arg(dir).args(members).timeout(DISK_TIMEOUT)
}

/// `tar -tf FILE`: the members, checked before anything is extracted.
pub fn list(file: &Path) -> Invocation {
    Invocation::new("tar").arg("-tf").arg(file).timeout(DISK_TIMEOUT)
}

/// `tar -xf FILE -C DIR MEMBERS…`, owned by the caller and with no modes
/// from the archive.
pub fn unpack(file: &Path, dir: &Path, members: &[&str]) -> Invocation {
    Invocation::new("tar")
        .args(["--no-same-owner", "--no-same-permissions", "-xf"])
        .arg(file)
        .arg("-C")
        .arg(dir)
        .args(members)
        .timeout(DISK_TIMEOUT)
}

/// The sha256 of a file, in hex; `progress` is told each chunk's size.
pub fn sha256_file(path: &Path, progress: &dyn Fn(u64)) -> Result<String> {
    let mut f = fs_err::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("could not read `{}`", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        progress(n as u64);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The id of a disk with this sha256.
pub fn id_of(sha256: &str) -> String {
    sha256.chars().take(12).collect()
}

/// Under `state.lock`: move the checked disk `staged` (in the templates
/// directory) to its final name and add `t` to the index, replacing any
/// template with the same tag. Returns the template it replaced.
pub fn register(dirs: &Dirs, staged: &Path, t: &Template) -> Result<Option<Template>> {
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut index = Index::load(dirs)?;
    let dst = t.disk(dirs);
    // The id is the content's digest: a disk already at `dst` is this one,
    // listed under some tag, and must outlive a failed index write.
    let existed = dst.is_file();
    state::persist_file(staged, &dst)?;
    let old = index.templates.iter().position(|o| o.tag == t.tag).map(|i| index.templates.remove(i));
    index.templates.push(t.clone());
    if let Err(e) = index.save_locked(dirs) {
        if !existed {
            let _ = std::fs::remove_file(&dst);
        }
        return Err(e);
    }
    if let Some(o) = &old
        && o.id != t.id
        && !index.templates.iter().any(|x| x.id == o.id)
    {
        let _ = std::fs::remove_file(o.disk(dirs));
    }
    Ok(old)
}

/// Under `state.lock`: drop the template `key` (tag or id) from the index,
/// then its disk when no other tag shares it.
pub fn remove(dirs: &Dirs, key: &str) -> Result<Template> {
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut index = Index::load(dirs)?;
    let t = index.find(key).cloned().ok_or_else(|| unknown(key))?;
    index.templates.retain(|o| o.tag != t.tag);
    index.save_locked(dirs)?;
    if !index.templates.iter().any(|o| o.id == t.id) {
        match std::fs::remove_file(t.disk(dirs)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                eprintln!("warning: could not remove `{}`: {e}", t.disk(dirs).display());
            }
            _ => {}
        }
    }
    Ok(t)
}

/// The error for a tag or id ppp does not know.
pub fn unknown(key: &str) -> anyhow::Error {
    fail(format!("no template with tag or id `{key}`")).hint("list templates with `ppp template ls`").code(2).into()
}

/// A temp name in the templates directory (same filesystem, so the final
/// rename is atomic), removed on drop unless kept.
pub struct Staged {
    path: PathBuf,
}

impl Staged {
    /// A new temp name `.<what>-<uuid>.tmp` in the templates directory.
    pub fn new(dirs: &Dirs, what: &str) -> Result<Staged> {
        state::create_private_dir(&dirs.templates())?;
        Ok(Staged { path: dirs.templates().join(format!(".{what}-{}.tmp", uuid::Uuid::new_v4().simple())) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if self.path.is_dir() {
            let _ = std::fs::remove_dir_all(&self.path);
        } else {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(tag: &str, id: &str) -> Template {
        Template {
            tag: tag.into(),
            id: id.into(),
            source: None,
            agent: None,
            size: 1,
            sha256: format!("{id}00"),
            created_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn find_by_tag_then_unique_id_prefix() {
        let i = Index { templates: vec![t("a", "abcdef012345"), t("b", "abcd99999999"), t("c", "0123456789ab")] };
        assert_eq!(i.find("a").unwrap().id, "abcdef012345");
        assert_eq!(i.find("0123").unwrap().tag, "c");
        assert_eq!(i.find("abcdef").unwrap().tag, "a");
        assert!(i.find("abcd").is_none(), "ambiguous prefix");
        assert!(i.find("012").is_none(), "too short");
        assert!(i.find("nope").is_none());
    }

    #[test]
    fn only_a_standalone_qcow2_is_a_safe_disk() {
        // Trimmed `qemu-img info --output=json` of qemu-img 7.2.
        let plain = r#"{"format": "qcow2", "filename": "a.qcow2",
            "format-specific": {"type": "qcow2", "data": {"compat": "1.1", "corrupt": false}}}"#;
        assert_eq!(unsafe_disk(plain), None);
        let backed = r#"{"format": "qcow2", "backing-filename-format": "raw",
            "full-backing-filename": "/home/u/.ssh/id_ed25519", "backing-filename": "/home/u/.ssh/id_ed25519"}"#;
        assert_eq!(unsafe_disk(backed).unwrap(), "the disk has a backing file `/home/u/.ssh/id_ed25519`");
        let data = r#"{"format": "qcow2",
            "format-specific": {"type": "qcow2", "data": {"data-file": "/etc/shadow", "data-file-raw": false}}}"#;
        assert_eq!(unsafe_disk(data).unwrap(), "the disk has an external data file `/etc/shadow`");
        assert_eq!(unsafe_disk(r#"{"format": "raw"}"#).unwrap(), "the disk is raw, not qcow2");
        assert!(unsafe_disk("{}").is_some());
        assert!(unsafe_disk("qemu-img: error").is_some());
    }

    #[test]
    fn image_path_of_a_machine_config() {
        assert_eq!(
            config_image_path(r#"{"Name":"m","ImagePath":{"Path":"/d/disk.qcow2","Symlink":""}}"#),
            Some(PathBuf::from("/d/disk.qcow2"))
        );
        assert_eq!(config_image_path(r#"{"Name":"m","ImagePath":{"Path":""}}"#), None);
        assert_eq!(config_image_path(r#"{"Name":"m"}"#), None);
        assert_eq!(config_image_path("not json"), None);
    }

    #[test]
    fn image_path_from_podman5_machine_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.json"), r#"{"Name":"m","ImagePath":{"Path":"/disks/m-amd64.qcow2"}}"#)
            .unwrap();
        let inspect = format!(r#"[{{"Name":"m","ConfigDir":{{"Path":"{}"}}}}]"#, dir.path().display());
        assert_eq!(image_path_from_config(&inspect), Ok(PathBuf::from("/disks/m-amd64.qcow2")));
        let missing = format!(r#"[{{"Name":"x","ConfigDir":{{"Path":"{}"}}}}]"#, dir.path().display());
        assert!(image_path_from_config(&missing).unwrap_err().contains("x.json` cannot be read"));
        let escape = format!(r#"[{{"Name":"../m","ConfigDir":{{"Path":"{}/sub"}}}}]"#, dir.path().display());
        assert!(image_path_from_config(&escape).unwrap_err().contains("not a file name"));
        assert_eq!(image_path_from_config(r#"[{"Name":"m"}]"#).unwrap_err(), "it names no `ConfigDir.Path` and `Name`");
        std::fs::write(dir.path().join("m.json"), r#"{"Name":"m"}"#).unwrap();
        assert!(image_path_from_config(&inspect).unwrap_err().ends_with("m.json` has no `ImagePath.Path`"));
    }

    #[test]
    fn tags() {
        for ok in ["opencode-default", "a", "v1.2_x"] {
            validate_tag(ok).unwrap();
        }
        for bad in ["", "-x", "a/b", "a b", "../x"] {
            assert!(validate_tag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn builders() {
        let c = convert(Path::new("/s"), Path::new("/d"));
        assert!(c.to_string().ends_with("convert -c -O qcow2 /s /d"), "{c}");
        assert_eq!(id_of("0123456789abcdef"), "0123456789ab");
    }
}

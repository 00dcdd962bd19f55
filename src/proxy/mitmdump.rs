//! mitmdump itself: finding or installing the pinned mitmproxy in ppp's own
//! venv, the command line that starts it, and the addon file it loads.
//!
//! Everything here builds [`Invocation`]s as data; the few that must run to
//! answer a question (is this Python new enough, which mitmproxy is this)
//! go through [`exec::run`]. Starting and supervising the long-running
//! mitmdump is the supervisor's job, not this module's.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::assets::{ADDON_ENTRY, Addon};
use crate::dirs::Dirs;
use crate::env;
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::sandbox::POOL_START;
use crate::state;
use crate::versions;

/// How long a `--version` or Python probe may take. mitmdump imports a lot
/// before it answers; a cold start is a second or two.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// `pip install mitmproxy` takes about 20 s on a good network.
const PIP_TIMEOUT: Duration = Duration::from_secs(15 * 60);
const VENV_TIMEOUT: Duration = Duration::from_secs(3 * 60);

/// Python minor versions tried by name on PATH and in pyenv, newest first.
const PYTHON_MINORS: &[&str] = &["3.13", "3.12"];

/// What the mitmdump command needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The mitmdump executable.
    pub mitmdump: PathBuf,
    /// Ports to listen on, as [`listen_ports`] returns them.
    pub ports: Vec<u16>,
    /// Port → claim id, as the port registry has them: they name the key
    /// files (see [`key_file`]).
    pub claims: BTreeMap<u16, String>,
    /// The address the WireGuard servers bind (`listen_host`).
    pub listen_host: IpAddr,
    /// Directory of the key files.
    pub wg_dir: PathBuf,
    /// The addon script.
    pub addon: PathBuf,
    /// mitmproxy's confdir (its CA lives there).
    pub confdir: PathBuf,
    /// PEM bundle for upstream verification.
    pub upstream_ca: PathBuf,
    /// Further `--set name=value` options, in order.
    pub sets: Vec<(String, String)>,
}

impl Spec {
    /// A spec with ppp's standard paths under `dirs` for the ports the
    /// registry claims, with their claim ids from the registry (none when
    /// it cannot be read: the daemon reads it just before and stops on an
    /// error), listening on the default address.
    pub fn new(
        dirs: &Dirs,
        mitmdump: PathBuf,
        claimed: impl IntoIterator<Item = u16>,
        addon: PathBuf,
        upstream_ca: PathBuf,
    ) -> Self {
        Self {
            mitmdump,
            ports: listen_ports(claimed),
            claims: crate::sandbox::PortRegistry::load(dirs).map(|r| r.claims).unwrap_or_default(),
            listen_host: crate::config::DEFAULT_LISTEN_HOST,
            wg_dir: dirs.wg(),
            addon,
            confdir: dirs.mitmproxy_confdir(),
            upstream_ca,
            sets: Vec::new(),
        }
    }

    /// The key file of `port`.
    pub fn keys(&self, port: u16) -> PathBuf {
        key_file(&self.wg_dir, port, self.claims.get(&port).map(String::as_str))
    }
}

/// The key file of `port` under its claim `claim`: `keys-<port>-<claim>.conf`,
/// or `keys-<port>.conf` for a port with no claim (the idle base port, or a
/// claim older than claim ids). mitmdump writes a missing one with fresh
/// keys; a new claim id is a new file, so a port claimed again gets new keys
/// and its former holder's `wg0.conf` no longer handshakes (ADR 0018).
pub fn key_file(wg_dir: &Path, port: u16, claim: Option<&str>) -> PathBuf {
    match claim {
        Some(c) => wg_dir.join(format!("keys-{port}-{c}.conf")),
        None => wg_dir.join(format!("keys-{port}.conf")),
    }
}

/// The ports mitmdump listens on: those the registry claims, sorted, or the
/// base port alone when none is. Never the whole pool: one busy port in it
/// made mitmdump exit, and the guests then bypassed the proxy (spec A.8).
pub fn listen_ports(claimed: impl IntoIterator<Item = u16>) -> Vec<u16> {
    let mut ports: Vec<u16> = claimed.into_iter().collect();
    ports.sort_unstable();
    ports.dedup();
    if ports.is_empty() {
        ports.push(POOL_START);
    }
    ports
}

/// The `--mode` value of each port: `wireguard:<key file>@<port>`, the key
/// file as [`key_file`] names it for the port's claim in `claims`.
///
/// The daemon's start command and the addon's run-time `mode` update both
/// come from here: mitmproxy keeps a running server only when its spec is
/// unchanged, so the two must agree to the byte, or an update would restart
/// every server and drop every tunnel. A port claimed again has a new key
/// file, so its spec changes and mitmproxy stops that one server and starts
/// it again with new keys (`Servers.update` stops removed specs before it
/// starts new ones, so the port is free).
pub fn modes(wg_dir: &Path, ports: &[u16], claims: &BTreeMap<u16, String>) -> Vec<String> {
    ports
        .iter()
        .map(|&port| {
            let keys = key_file(wg_dir, port, claims.get(&port).map(String::as_str));
            format!("wireguard:{}@{port}", keys.to_string_lossy())
        })
        .collect()
}

/// The ports mitmdump should listen on now, from the port registry.
pub fn wanted_ports(dirs: &Dirs) -> Result<Vec<u16>> {
    Ok(listen_ports(crate::sandbox::PortRegistry::load(dirs)?.ports.keys().copied()))
}

/// The `--mode` list mitmdump should have now, from the port registry.
pub fn wanted_modes(dirs: &Dirs) -> Result<Vec<String>> {
    let registry = crate::sandbox::PortRegistry::load(dirs)?;
    Ok(modes(&dirs.wg(), &listen_ports(registry.ports.keys().copied()), &registry.claims))
}

/// Create the directories `spec` names for mitmdump to write into, private
/// (0700): the confdir holds mitmproxy's CA key, the key directory the
/// WireGuard keys. The key files themselves are left to mitmdump.
pub fn prepare(spec: &Spec) -> Result<()> {
    state::create_private_dir(&spec.wg_dir)?;
    state::tighten_dir(&spec.confdir)
}

/// The long-running mitmdump, as data. Run [`prepare`] first.
///
/// Key files are not created here: mitmdump writes a missing one with fresh
/// keys, while an empty or invalid one makes it refuse to start.
pub fn command(spec: &Spec) -> Invocation {
    let mut inv = Invocation::new(&spec.mitmdump);
    for mode in modes(&spec.wg_dir, &spec.ports, &spec.claims) {
        inv = inv.arg("--mode").arg(mode);
    }
    inv = inv.arg("-s").arg(&spec.addon);
    let set = |name: &str, value: &OsString| {
        let mut s = OsString::from(format!("{name}="));
        s.push(value);
        s
    };
    inv = inv
        .arg("--set")
        .arg(set("confdir", &spec.confdir.clone().into_os_string()))
        // Policy decisions (and mitm.it) happen before any upstream connection.
        .arg("--set")
        .arg("connection_strategy=lazy")
        // Only where the guests' datagrams arrive (gvproxy: loopback), so
        // a copy of a guest's config is of no use from anywhere else.
        .arg("--set")
        .arg(format!("listen_host={}", spec.listen_host))
        .arg("--set")
        .arg(set("ssl_verify_upstream_trusted_ca", &spec.upstream_ca.clone().into_os_string()));
    for (name, value) in &spec.sets {
        inv = inv.arg("--set").arg(format!("{name}={value}"));
    }
    // Client configs go to stdout; buffered, they would sit unseen in a
    // file until mitmdump exits.
    inv.env("PYTHONUNBUFFERED", "1")
        // mitmproxy_rs gives every guest TCP connection two 64 KiB smoltcp
        // buffers from calloc. glibc serves those from its heaps and zeroes
        // a reused chunk whole, so each held connection cost its full
        // 128 KiB, and kept it while the guest left the socket half open
        // after ppp closed it (2,000 such grew mitmdump by 216 MiB, issue 22
        // point 4). Mapped on their own (64 KiB and up), they are fresh
        // zero pages that cost only what the connection really carried, and
        // go back to the kernel when it closes.
        .env("MALLOC_MMAP_THRESHOLD_", "65536")
}

/// Write the addon's files into a directory named by their SHA-256 and
/// return the path of its entry file, the one `mitmdump -s` loads. A
/// directory already there with the same files is reused, so a restart
/// with the same addon does not touch the disk, and a new ppp never
/// overwrites an addon a running mitmdump still imports from. The whole
/// package appears at once (written in a temp directory, then renamed):
/// the entry file imports its modules from beside it, so they must be the
/// ones it was written with (assets/addon/addon.py, `_load_package`).
pub fn write_addon(dirs: &Dirs, addon: &Addon) -> Result<PathBuf> {
    if !addon.files.iter().any(|(p, _)| p == ADDON_ENTRY) {
        anyhow::bail!("the addon has no entry file `{ADDON_ENTRY}`");
    }
    let mut h = Sha256::new();
    for (path, bytes) in &addon.files {
        // Lengths first, so that no two sets of files hash alike.
        h.update((path.len() as u64).to_le_bytes());
        h.update(path.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    let hex = h.finalize().iter().take(8).fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    });
    let root = dirs.addon_dir();
    let dir = root.join(format!("addon-{hex}"));
    let entry = dir.join(ADDON_ENTRY);
    if addon.files.iter().all(|(p, bytes)| std::fs::read(dir.join(p)).is_ok_and(|old| old == *bytes)) {
        return Ok(entry);
    }
    state::create_private_dir(&root)?;
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-addon-")
        .tempdir_in(&root)
        .with_context(|| format!("could not create a temp directory in `{}`", root.display()))?;
    for (rel, bytes) in &addon.files {
        let rel_path = Path::new(rel);
        if !rel_path.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
            anyhow::bail!("the addon file `{rel}` is not a plain relative path");
        }
        state::write_atomic_mode(&tmp.path().join(rel_path), bytes, 0o600)?;
    }
    if dir.exists() {
        // A damaged copy (a file edited or missing): moved aside whole,
        // then replaced, never patched file by file.
        let old = root.join(format!(".old-addon-{hex}-{}", std::process::id()));
        std::fs::rename(&dir, &old).with_context(|| format!("could not move `{}` aside", dir.display()))?;
        let _ = std::fs::remove_dir_all(&old);
    }
    let written = tmp.keep();
    std::fs::rename(&written, &dir)
        .with_context(|| format!("could not rename `{}` to `{}`", written.display(), dir.display()))?;
    // The rename is durable only once the directory entry is.
    std::fs::File::open(&root)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("could not sync directory `{}`", root.display()))?;
    Ok(entry)
}

/// `mitmdump --version`.
pub fn version_command(mitmdump: &Path) -> Invocation {
    Invocation::new(mitmdump).arg("--version").timeout(PROBE_TIMEOUT)
}

/// The version on the `Mitmproxy: X` line of `mitmdump --version`.
pub fn parse_version(output: &str) -> Option<&str> {
    output.lines().find_map(|l| l.trim().strip_prefix("Mitmproxy:")).map(str::trim).filter(|v| !v.is_empty())
}

/// The mitmproxy version `mitmdump` reports. The whole output is read:
/// cutting it short makes mitmdump print a `BrokenPipe` traceback.
/// The mitmproxy version recorded in the venv `mitmdump` belongs to: the
/// `mitmproxy-<version>.dist-info` directory pip writes. `None` when
/// `mitmdump` is not in a venv or the metadata is not there.
pub fn venv_version(mitmdump: &Path) -> Option<String> {
    let venv = mitmdump.parent()?.parent()?;
    if !venv.join("pyvenv.cfg").is_file() {
        return None;
    }
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    let mut found = None;
    for py in lib.flatten() {
        let Ok(entries) = std::fs::read_dir(py.path().join("site-packages")) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if let Some(v) = name.strip_prefix("mitmproxy-").and_then(|r| r.strip_suffix(".dist-info")) {
                // Two versions side by side is a damaged venv: let the
                // slow path decide.
                if found.replace(v.to_owned()).is_some() {
                    return None;
                }
            }
        }
    }
    found
}

pub fn installed_version(mitmdump: &Path) -> Result<String> {
    let out = exec::run(&version_command(mitmdump))?;
    parse_version(&out.stdout).map(ToOwned::to_owned).ok_or_else(|| {
        fail(format!("`{} --version` printed no `Mitmproxy:` line", mitmdump.display()))
            .hint("is this really mitmdump?")
            .into()
    })
}

/// Fail unless `mitmdump` is mitmproxy `want`.
pub fn check_version(mitmdump: &Path, want: &str) -> Result<()> {
    // Asking mitmdump costs a Python start-up (about half a second), paid on
    // every `daemon start`; a venv's package metadata answers the same
    // question from the file system.
    if venv_version(mitmdump).as_deref() == Some(want) {
        return Ok(());
    }
    let have = installed_version(mitmdump)?;
    if have == want {
        Ok(())
    } else {
        Err(fail(format!("`{}` is mitmproxy {have}, but ppp needs {want}", mitmdump.display()))
            .hint(format!("unset `{}` to let ppp install its own, or point it at mitmproxy {want}", env::PPP_MITMDUMP))
            .into())
    }
}

/// Runs `python` and prints its `(major, minor)`. The imports fail on a
/// Python that cannot build a venv with pip (Debian splits ensurepip out).
pub fn python_probe(python: &Path) -> Invocation {
    Invocation::new(python)
        .args(["-c", "import sys, ensurepip, ssl, venv; print(sys.version_info[:2])"])
        .timeout(PROBE_TIMEOUT)
}

/// `(3, 13)` → `(3, 13)`: what [`python_probe`] prints.
pub fn parse_python_version(out: &str) -> Option<(u32, u32)> {
    let inner = out.trim().strip_prefix('(')?.strip_suffix(')')?;
    let (a, b) = inner.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

fn python_min() -> (u32, u32) {
    parse_python_version(&format!("({})", versions::python_min().replace('.', ","))).expect("versions.env")
}

/// True when `python` runs and is new enough. pyenv shims are on PATH but
/// fail unless their version is selected, hence running every candidate.
pub fn python_ok(python: &Path) -> bool {
    exec::run(&python_probe(python))
        .ok()
        .and_then(|o| parse_python_version(&o.stdout))
        .is_some_and(|v| v >= python_min())
}

/// What the searches read from the environment, so tests can supply it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    /// `PPP_MITMDUMP`.
    pub mitmdump: Option<PathBuf>,
    /// `PPP_PYTHON`.
    pub python: Option<PathBuf>,
    /// `PATH`.
    pub path: Option<OsString>,
    /// `$PYENV_ROOT`, else `~/.pyenv`.
    pub pyenv_root: Option<PathBuf>,
}

impl Lookup {
    /// Read from any variable lookup.
    pub fn resolve(var: impl Fn(&str) -> Option<OsString>) -> Self {
        let nonempty = |k: &str| var(k).filter(|v| !v.is_empty());
        Self {
            mitmdump: nonempty(env::PPP_MITMDUMP).map(PathBuf::from),
            python: nonempty(env::PPP_PYTHON).map(PathBuf::from),
            path: nonempty("PATH"),
            pyenv_root: nonempty(env::PYENV_ROOT)
                .map(PathBuf::from)
                .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".pyenv"))),
        }
    }

    /// Read from the process environment.
    pub fn from_env() -> Self {
        Self::resolve(|k| std::env::var_os(k))
    }
}

/// Pythons to try, in order: `python3.13`, `python3.12` on PATH (every
/// match, not just the first, since a shim may shadow a real one), then
/// pyenv builds of 3.13 and 3.12, newest patch release first. `PPP_PYTHON`
/// is not here: an explicit choice is used or fails, never skipped.
pub fn python_candidates(lookup: &Lookup) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for minor in PYTHON_MINORS {
        let name = format!("python{minor}");
        if let Some(path) = &lookup.path {
            out.extend(std::env::split_paths(path).map(|d| d.join(&name)).filter(|p| p.is_file()));
        }
    }
    if let Some(root) = &lookup.pyenv_root {
        let versions: Vec<String> = std::fs::read_dir(root.join("versions"))
            .map(|rd| rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        for minor in PYTHON_MINORS {
            let prefix = format!("{minor}.");
            let mut builds: Vec<&String> = versions.iter().filter(|v| v.starts_with(&prefix)).collect();
            builds.sort_by_key(|v| std::cmp::Reverse(version_key(v)));
            out.extend(builds.into_iter().map(|v| root.join("versions").join(v).join("bin").join("python3")));
        }
    }
    out
}

/// `3.12.10` sorts after `3.12.9`; a suffix (`3.13.0t`) counts its digits.
fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap_or(0)).collect()
}

/// The Python to build the venv with.
pub fn find_python(lookup: &Lookup) -> Result<PathBuf> {
    let min = versions::python_min();
    if let Some(p) = &lookup.python {
        if python_ok(p) {
            return Ok(p.clone());
        }
        return Err(fail(format!(
            "`{}` ({}) is not a working Python >= {min} with venv, ensurepip and ssl",
            p.display(),
            env::PPP_PYTHON
        ))
        .hint(format!("point `{}` at a Python >= {min}, or unset it to let ppp search", env::PPP_PYTHON))
        .into());
    }
    let candidates = python_candidates(lookup);
    if let Some(p) = candidates.iter().find(|p| python_ok(p)) {
        return Ok(p.clone());
    }
    let mut tried: Vec<String> = PYTHON_MINORS.iter().map(|m| format!("`python{m}` on PATH")).collect();
    if let Some(root) = &lookup.pyenv_root {
        tried.extend(PYTHON_MINORS.iter().map(|m| format!("`{}/versions/{m}.*`", root.display())));
    }
    tried.extend(candidates.iter().map(|p| format!("`{}`", p.display())));
    tried.dedup();
    Err(fail(format!("found no working Python >= {min} (tried {})", tried.join(", ")))
        .hint(format!("install Python {min} or newer with its venv module, or set `{}` to one", env::PPP_PYTHON))
        .into())
}

/// `python -m venv VENV`.
pub fn venv_command(python: &Path, venv: &Path) -> Invocation {
    Invocation::new(python).args(["-m", "venv"]).arg(venv).timeout(VENV_TIMEOUT)
}

/// The venv's pip installing mitmproxy `version`.
pub fn pip_install_command(venv: &Path, version: &str) -> Invocation {
    Invocation::new(venv.join("bin").join("python"))
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("mitmproxy=={version}"))
        .timeout(PIP_TIMEOUT)
}

/// The mitmdump to run, from the process environment: see [`ensure_with`].
pub fn ensure(dirs: &Dirs, progress: impl FnMut(&str)) -> Result<PathBuf> {
    ensure_with(dirs, &Lookup::from_env(), progress)
}

/// The mitmdump to run: `PPP_MITMDUMP` if set (checked to be the pinned
/// version), else `$PPP_DATA/venv/bin/mitmdump`, installing or replacing the
/// venv when its mitmdump is missing or another version. Says what it does
/// through `progress`.
pub fn ensure_with(dirs: &Dirs, lookup: &Lookup, mut progress: impl FnMut(&str)) -> Result<PathBuf> {
    let want = versions::mitmproxy();
    if let Some(m) = &lookup.mitmdump {
        check_version(m, want).with_context(|| format!("cannot use `{}` from `{}`", m.display(), env::PPP_MITMDUMP))?;
        return Ok(m.clone());
    }
    let venv = dirs.venv();
    let mitmdump = dirs.venv_mitmdump();
    // Two ppp processes must not build the same venv at once.
    let _lock = state::Lock::acquire(&dirs.venv_lock())?;
    if mitmdump.is_file() {
        if venv_version(&mitmdump).as_deref() == Some(want) {
            return Ok(mitmdump);
        }
        match installed_version(&mitmdump) {
            Ok(v) if v == want => return Ok(mitmdump),
            Ok(v) => progress(&format!("replacing mitmproxy {v} in `{}` with {want}", venv.display())),
            Err(e) => progress(&format!("replacing the broken venv `{}`: {e}", venv.display())),
        }
    }
    if venv.exists() {
        // Never delete a directory that is not a venv: the path may be
        // wrong, and that removal cannot be undone.
        let empty = std::fs::read_dir(&venv).is_ok_and(|mut d| d.next().is_none());
        if !empty && !venv.join("pyvenv.cfg").is_file() {
            return Err(fail(format!("`{}` exists but is not a Python venv; not replacing it", venv.display()))
                .hint("move it away, then run the command again")
                .into());
        }
        fs_err::remove_dir_all(&venv)?;
    }
    let python = find_python(lookup)?;
    progress(&format!("creating `{}` with `{}`", venv.display(), python.display()));
    state::create_private_dir(&dirs.data)?;
    exec::run(&venv_command(&python, &venv)).context("could not create the mitmproxy venv")?;
    progress(&format!("installing mitmproxy {want} (about 20 s)"));
    if let Err(e) = exec::run(&pip_install_command(&venv, want)) {
        return Err(fail(format!("could not install mitmproxy {want}: {e}"))
            .hint("pip must reach PyPI (or the index pip is configured for); check the network, then run again")
            .into());
    }
    // No closing message: the caller ends the last step as done.
    check_version(&mitmdump, want).context("the fresh venv is not usable")?;
    Ok(mitmdump)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dirs(tmp: &Path) -> Dirs {
        Dirs { config: tmp.join("c"), data: tmp.join("d"), cache: tmp.join("k") }
    }

    fn argv(inv: &Invocation) -> String {
        let mut s = inv.program.display().to_string();
        for a in &inv.args {
            let _ = write!(s, "\n  {}", a.to_string_lossy());
        }
        for (k, v) in &inv.env {
            let _ = write!(s, "\nenv {}={}", k.to_string_lossy(), v.to_string_lossy());
        }
        s
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// A port claimed again has a new key file, so its `--mode` changes and
    /// mitmproxy restarts that server with new keys; the others keep theirs.
    #[test]
    fn a_new_claim_changes_only_its_own_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        crate::sandbox::with_registry(&d, |r| r.allocate("a")).unwrap();
        crate::sandbox::with_registry(&d, |r| r.allocate("b")).unwrap();
        let before = wanted_modes(&d).unwrap();
        crate::sandbox::with_registry(&d, |r| Ok(r.free("a"))).unwrap();
        crate::sandbox::with_registry(&d, |r| r.allocate("c")).unwrap();
        let after = wanted_modes(&d).unwrap();
        assert_ne!(before[0], after[0], "51820 was claimed again");
        assert_eq!(before[1], after[1], "51821 keeps its server");
        assert!(after[0].ends_with("@51820") && after[0].contains("/keys-51820-"), "{}", after[0]);
    }

    #[test]
    fn only_claimed_ports_or_the_base_port() {
        assert_eq!(listen_ports([]), [51820]);
        assert_eq!(listen_ports([51825, 51821, 51825]), [51821, 51825]);
    }

    #[test]
    fn command_line() {
        let d = Dirs { config: "/c".into(), data: "/data/ppp".into(), cache: "/k".into() };
        let mut spec = Spec::new(
            &d,
            "/venv/bin/mitmdump".into(),
            [51822, 51820],
            d.addon_dir().join("addon-0123.py"),
            d.upstream_ca(),
        );
        spec.sets.push(("console_eventlog_verbosity".into(), "info".into()));
        spec.claims.insert(51822, "0123456789abcdef".into());
        insta::assert_snapshot!(argv(&command(&spec)), @r"
        /venv/bin/mitmdump
          --mode
          wireguard:/data/ppp/wg/keys-51820.conf@51820
          --mode
          wireguard:/data/ppp/wg/keys-51822-0123456789abcdef.conf@51822
          -s
          /data/ppp/addon/addon-0123.py
          --set
          confdir=/data/ppp/mitmproxy
          --set
          connection_strategy=lazy
          --set
          listen_host=127.0.0.1
          --set
          ssl_verify_upstream_trusted_ca=/data/ppp/wg/upstream-ca.pem
          --set
          console_eventlog_verbosity=info
        env PYTHONUNBUFFERED=1
        env MALLOC_MMAP_THRESHOLD_=65536
        ");
        assert_eq!(spec.keys(51822), Path::new("/data/ppp/wg/keys-51822-0123456789abcdef.conf"));
        let empty = Spec::new(&d, "m".into(), [], "a.py".into(), "ca.pem".into());
        assert_eq!(command(&empty).args.iter().filter(|a| *a == "--mode").count(), 1);
    }

    #[test]
    fn install_commands() {
        let venv = Path::new("/data/ppp/venv");
        insta::assert_snapshot!(argv(&venv_command(Path::new("/usr/bin/python3.13"), venv)), @r"
        /usr/bin/python3.13
          -m
          venv
          /data/ppp/venv
        ");
        insta::assert_snapshot!(argv(&pip_install_command(venv, "12.2.3")), @r"
        /data/ppp/venv/bin/python
          -m
          pip
          install
          --quiet
          --disable-pip-version-check
          mitmproxy==12.2.3
        ");
    }

    #[test]
    fn addon_is_content_addressed() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        let addon = |text: &'static str| {
            Addon::from_files([
                ("addon.py", b"import ppp_addon\n".as_slice()),
                ("ppp_addon/__init__.py", text.as_bytes()),
            ])
        };
        let a = write_addon(&d, &addon("A = 1\n")).unwrap();
        let b = write_addon(&d, &addon("A = 2\n")).unwrap();
        // A change in any module is a new directory: the entry file's
        // siblings are always the ones it was written with.
        assert_ne!(a, b);
        assert_eq!(a.file_name().unwrap(), "addon.py");
        let dir = a.parent().unwrap();
        assert_eq!(dir.parent().unwrap(), d.addon_dir());
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let hex = name.strip_prefix("addon-").unwrap();
        assert!(hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
        let module = dir.join("ppp_addon/__init__.py");
        assert_eq!(std::fs::read(&module).unwrap(), b"A = 1\n");
        assert_eq!(std::fs::read(b.parent().unwrap().join("ppp_addon/__init__.py")).unwrap(), b"A = 2\n");
        let before = std::fs::metadata(&module).unwrap().modified().unwrap();
        assert_eq!(write_addon(&d, &addon("A = 1\n")).unwrap(), a);
        assert_eq!(std::fs::metadata(&module).unwrap().modified().unwrap(), before);
        // A damaged module, or a missing one, is repaired: the whole
        // directory is written again.
        std::fs::write(&module, b"junk").unwrap();
        assert_eq!(write_addon(&d, &addon("A = 1\n")).unwrap(), a);
        assert_eq!(std::fs::read(&module).unwrap(), b"A = 1\n");
        std::fs::remove_file(&module).unwrap();
        assert_eq!(write_addon(&d, &addon("A = 1\n")).unwrap(), a);
        assert_eq!(std::fs::read(&module).unwrap(), b"A = 1\n");
        // Nothing is left behind but the two addons.
        let mut left: Vec<_> =
            std::fs::read_dir(d.addon_dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left.len(), 2, "{left:?}");
        // No entry file, or a path out of the directory: refused.
        assert!(write_addon(&d, &Addon::from_files([("x.py", b"".as_slice())])).is_err());
        let escape = Addon::from_files([("addon.py", b"".as_slice()), ("../x.py", b"".as_slice())]);
        assert!(write_addon(&d, &escape).is_err());
    }

    #[test]
    fn version_parsing() {
        let out = "Mitmproxy: 12.2.3\nPython:    3.13.0\nOpenSSL:   OpenSSL 3.5.0\nPlatform:  Linux\n";
        assert_eq!(parse_version(out), Some("12.2.3"));
        assert_eq!(parse_version("Python: 3.13\n"), None);
        assert_eq!(parse_python_version("(3, 13)\n"), Some((3, 13)));
        assert_eq!(parse_python_version("3.13"), None);
        assert_eq!(python_min(), (3, 12));
    }

    #[test]
    fn wrong_version_is_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = script(tmp.path(), "mitmdump", "echo 'Mitmproxy: 1.0.0'; echo 'Python: 3.13.0'");
        let err = check_version(&fake, "12.2.3").unwrap_err();
        let (text, _) = crate::error::render(&err);
        assert!(text.contains("is mitmproxy 1.0.0, but ppp needs 12.2.3"), "{text}");
        check_version(&fake, "1.0.0").unwrap();
        let lookup = Lookup { mitmdump: Some(fake), ..Lookup::default() };
        let (text, _) = crate::error::render(&ensure_with(&dirs(tmp.path()), &lookup, |_| {}).unwrap_err());
        assert!(text.contains("PPP_MITMDUMP") && text.contains("1.0.0"), "{text}");
    }

    #[test]
    fn python_search_order_and_shims() {
        let tmp = tempfile::tempdir().unwrap();
        let bin1 = tmp.path().join("bin1");
        let bin2 = tmp.path().join("bin2");
        let root = tmp.path().join("pyenv");
        for d in [&bin1, &bin2] {
            std::fs::create_dir_all(d).unwrap();
        }
        // A pyenv shim: on PATH, but fails when run.
        script(&bin1, "python3.13", "echo 'pyenv: python3.13: command not found' >&2; exit 127");
        let old = script(&bin2, "python3.12", "echo '(3, 11)'");
        for v in ["3.12.9", "3.12.10", "3.13.0", "3.11.7"] {
            let d = root.join("versions").join(v).join("bin");
            std::fs::create_dir_all(&d).unwrap();
            let (a, b) = v.split_once('.').unwrap();
            let minor = b.split('.').next().unwrap();
            script(&d, "python3", &format!("echo '({a}, {minor})'"));
        }
        let path = std::env::join_paths([&bin1, &bin2]).unwrap();
        let lookup = Lookup { path: Some(path), pyenv_root: Some(root.clone()), ..Lookup::default() };
        let v = |s: &str| root.join("versions").join(s).join("bin/python3");
        assert_eq!(
            python_candidates(&lookup),
            [bin1.join("python3.13"), old.clone(), v("3.13.0"), v("3.12.10"), v("3.12.9")]
        );
        // The shim fails and the PATH python3.12 is really 3.11.
        assert_eq!(find_python(&lookup).unwrap(), v("3.13.0"));

        // An explicit PPP_PYTHON that is too old is an error, not a fall-through.
        let explicit = Lookup { python: Some(old), ..lookup.clone() };
        let (text, _) = crate::error::render(&find_python(&explicit).unwrap_err());
        assert!(text.contains("PPP_PYTHON") && text.contains(">= 3.12"), "{text}");

        // Nothing found: say what was tried and point at PPP_PYTHON.
        let none = Lookup { pyenv_root: Some(tmp.path().join("nope")), path: Some(bin1.into()), ..Lookup::default() };
        let (text, _) = crate::error::render(&find_python(&none).unwrap_err());
        assert!(text.contains("`python3.13` on PATH") && text.contains("nope/versions/3.12.*"), "{text}");
        assert!(text.contains("hint:") && text.contains("PPP_PYTHON"), "{text}");
    }

    #[test]
    fn lookup_from_variables() {
        let l = Lookup::resolve(|k| match k {
            "HOME" => Some("/home/u".into()),
            "PPP_MITMDUMP" => Some("".into()),
            _ => None,
        });
        assert_eq!(l.pyenv_root, Some(PathBuf::from("/home/u/.pyenv")));
        assert_eq!(l.mitmdump, None);
    }

    #[test]
    fn a_directory_that_is_not_a_venv_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        std::fs::create_dir_all(d.venv()).unwrap();
        std::fs::write(d.venv().join("precious.txt"), "x").unwrap();
        let (text, _) = crate::error::render(&ensure_with(&d, &Lookup::default(), |_| {}).unwrap_err());
        assert!(text.contains("is not a Python venv"), "{text}");
        assert!(d.venv().join("precious.txt").exists());
    }
}

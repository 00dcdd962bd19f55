//! What `ppp setup` checks and how it fixes what it can. [`detect`] looks
//! (it runs probes such as `podman --version` but changes nothing) and
//! returns a [`Report`]: one [`Check`] per row of the table, each with the
//! [`Fix`] setup may offer. Applying a fix, with the statement of what will
//! change printed before, is `cmd::setup`'s job.
//!
//! Commands a fix runs are built here as data ([`Invocation`]) so the exact
//! command lines can be tested and printed for a user to run by hand.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use serde::Serialize;
use sha2::Digest as _;

use crate::dirs::Dirs;
use crate::exec::{self, Invocation};
use crate::policy::{self, Preset};
use crate::proxy::mitmdump;
use crate::sandbox::image;
use crate::secret::{self, Backend, Kind, Scope, Settings, Store};
use crate::{agent, env, podman, versions};

/// Debian and Ubuntu's directory of local trust anchors.
pub const DEBIAN_ANCHORS: &str = "/usr/local/share/ca-certificates";
/// Fedora's (and RHEL's) directory of local trust anchors.
pub const FEDORA_ANCHORS: &str = "/etc/pki/ca-trust/source/anchors";
/// The name mitmproxy's CA gets among the anchors; Debian only reads `.crt`.
pub const ANCHOR_NAME: &str = "ppp-mitmproxy.crt";
/// macOS: the login keychain, relative to HOME.
pub const MACOS_LOGIN_KEYCHAIN: &str = "Library/Keychains/login.keychain-db";

const TRUST_TIMEOUT: Duration = Duration::from_secs(120);

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    /// In place.
    Ok,
    /// Worth knowing; nothing needs doing.
    Note,
    /// Not in place, and `ppp setup` can fix it.
    Fixable,
    /// Not in place, and only the user can fix it (see the hint).
    Problem,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Ok => "ok",
            Level::Note => "note",
            Level::Fixable => "fixable",
            Level::Problem => "problem",
        })
    }
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Short stable name: `podman`, `python`, `mitmproxy`, `secret store`,
    /// `api keys`, `mitmproxy ca`, `policy`, `image <agent>`.
    pub name: String,
    pub level: Level,
    pub detail: String,
    /// Whether ppp needs this to run a sandbox; only required checks decide
    /// the exit code.
    pub required: bool,
    /// What the user can do by hand.
    pub hint: Option<String>,
    /// What `ppp setup` can do about it.
    #[serde(skip)]
    pub fix: Option<Fix>,
}

impl Check {
    fn new(name: impl Into<String>, level: Level, detail: impl Into<String>) -> Self {
        Self { name: name.into(), level, detail: detail.into(), required: true, hint: None, fix: None }
    }

    fn optional(mut self) -> Self {
        self.required = false;
        self
    }

    fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    fn fix(mut self, fix: Fix) -> Self {
        self.fix = Some(fix);
        self
    }

    /// Whether nothing is left to do for this check.
    #[must_use]
    pub fn done(&self) -> bool {
        matches!(self.level, Level::Ok | Level::Note)
    }
}

/// A change `ppp setup` can make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    /// Build ppp's venv and install the pinned mitmproxy in it.
    InstallMitmproxy { venv: PathBuf, python: PathBuf },
    /// Write the global policy from a preset.
    InitPolicy { path: PathBuf },
    /// Make the host trust mitmproxy's CA.
    TrustCa(Trust),
    /// Store these keys found in the environment: (service, variable).
    ImportSecrets(Vec<(&'static str, &'static str)>),
}

impl Fix {
    /// What will change, said before it changes.
    #[must_use]
    pub fn statement(&self) -> String {
        match self {
            Fix::InstallMitmproxy { venv, python } => format!(
                "will create the Python venv `{}` with `{}` and install mitmproxy {} into it with pip (from PyPI, \
                 about 20 s)",
                venv.display(),
                python.display(),
                versions::mitmproxy()
            ),
            Fix::InitPolicy { path } => {
                format!("will write the global network policy `{}` from a preset (default `balanced`)", path.display())
            }
            Fix::TrustCa(t) => t.statement(),
            Fix::ImportSecrets(found) => {
                let what: Vec<String> = found.iter().map(|(s, v)| format!("`{s}` (from {v})")).collect();
                format!("will store {} in the secret store, for every sandbox", what.join(", "))
            }
        }
    }
}

/// How the host comes to trust mitmproxy's CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Copy the PEM into the distro's anchors directory, then refresh the
    /// system store. Needs root.
    Linux { pem: PathBuf, dest: PathBuf, update: Invocation },
    /// Add it to the login keychain as a trusted root (macOS asks for the
    /// user's password itself).
    Macos { add: Invocation },
}

impl Trust {
    /// What will change.
    #[must_use]
    pub fn statement(&self) -> String {
        match self {
            Trust::Linux { pem, dest, update } => format!(
                "will copy mitmproxy's CA `{}` to `{}` and run `{update}`, so this host trusts it system-wide",
                pem.display(),
                dest.display()
            ),
            Trust::Macos { add } => {
                format!("will add mitmproxy's CA to your login keychain as a trusted root: `{add}`")
            }
        }
    }

    /// The shell lines a user runs to do it by hand.
    #[must_use]
    pub fn manual(&self) -> Vec<String> {
        match self {
            Trust::Linux { pem, dest, update } => vec![
                format!("sudo install -m 0644 {} {}", pem.display(), dest.display()),
                format!("sudo {}", invocation_line(update)),
            ],
            Trust::Macos { add } => vec![invocation_line(add)],
        }
    }

    /// Whether this needs root, which ppp does not gain by itself.
    #[must_use]
    pub fn needs_root(&self) -> bool {
        matches!(self, Trust::Linux { .. })
    }
}

/// `inv` as a shell line with the program's full path.
fn invocation_line(inv: &Invocation) -> String {
    let mut s = inv.program.display().to_string();
    for a in &inv.args {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    /// True when every check ppp needs is in place.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.checks.iter().filter(|c| c.required).all(Check::done)
    }

    /// The check called `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// The report as a table.
    #[must_use]
    pub fn table(&self) -> String {
        let rows: Vec<Vec<String>> =
            self.checks.iter().map(|c| vec![c.name.clone(), c.level.to_string(), c.detail.clone()]).collect();
        crate::output::table(&["CHECK", "STATUS", "DETAIL"], &rows)
    }
}

/// What detection reads besides the files under `dirs`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--import-secrets`: offer to store keys found in the environment.
    pub import_secrets: bool,
}

/// Look at everything ppp needs, changing nothing.
#[must_use]
pub fn detect(dirs: &Dirs, opts: &Options) -> Report {
    let lookup = mitmdump::Lookup::from_env();
    let (mitm, venv_ok) = mitmproxy_check(dirs, &lookup);
    let found = detect_podman();
    let usable = found.as_ref().and_then(|(p, v)| {
        v.filter(|v| *v >= podman::Version { major: podman::MIN.0, minor: podman::MIN.1, patch: 0 }).map(|_| p.clone())
    });
    let mut checks = vec![podman_check(found)];
    let provider = match usable {
        Some(program) => {
            let (check, provider) = machine_check(program);
            checks.push(check);
            provider
        }
        None => None,
    };
    let podman_path = podman::program().unwrap_or_default();
    if let Some(c) = hypervisor_check(provider.as_deref().unwrap_or(podman::default_provider()), &podman_path) {
        checks.push(c);
    }
    checks.extend([python_check(dirs, &lookup, venv_ok), mitm]);
    let settings = Settings::from_env();
    checks.push(store_check(settings.as_ref().ok()));
    checks.push(keys_check(dirs, opts));
    checks.push(ca_check(dirs));
    checks.push(policy_check(dirs));
    let global = policy::load_global(&dirs.global_policy()).ok().flatten();
    for a in agent::AGENTS {
        checks.push(match image::choose(a, |k| std::env::var(k).ok()) {
            Ok(image::Choice::Given { image, var }) => image_check(a.name, &image, Some(var), global.as_ref()),
            Ok(image::Choice::Build(r)) => {
                let state = image::cache_state(dirs, &r);
                build_check(a.name, &r, &state, global.as_ref())
            }
            Err(e) => Check::new(format!("image {}", a.name), Level::Problem, format!("{e:#}"))
                .hint(format!("fix or unset {}", a.containerfile_var()))
                .optional(),
        });
    }
    Report { checks }
}

/// The registry host an image reference pulls from (`docker.io` for a
/// name with no registry part, as podman's short names resolve there by
/// default; its API is `registry-1.docker.io`).
#[must_use]
pub fn registry_of(image: &str) -> String {
    let first = image.split('/').next().unwrap_or_default();
    let has_registry = image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let host = if has_registry { first.split(':').next().unwrap_or(first) } else { "docker.io" };
    if host == "docker.io" { "registry-1.docker.io".to_owned() } else { host.to_owned() }
}

/// An agent's image row: the image is pulled in the VM, through the proxy,
/// at the first run; what can fail here is the policy refusing its
/// registry. Optional: only the agents a user runs matter.
fn image_check(agent: &str, image: &str, var: Option<String>, global: Option<&policy::GlobalFile>) -> Check {
    let name = format!("image {agent}");
    let from = var.map(|v| format!(" (from {v})")).unwrap_or_default();
    let registry = registry_of(image);
    let Some(g) = global else {
        return Check::new(name, Level::Note, format!("{image}{from}; pulled in the VM at the first run")).optional();
    };
    let allowed = policy::Engine::build(g.default, g.rules.clone(), Vec::new())
        .is_ok_and(|e| e.decide(None, Some(&registry), None, 443).verdict == policy::Verdict::Allow);
    if allowed {
        Check::new(name, Level::Ok, format!("{image}{from}; the policy allows {registry}, where the VM pulls it"))
            .optional()
    } else {
        Check::new(
            name,
            Level::Problem,
            format!("{image}{from}: the policy denies {registry}, so the VM cannot pull it"),
        )
        .hint(format!("`ppp policy allow network {registry}` (and its blob storage host, if it redirects)"))
        .optional()
    }
}

/// An agent's image row when ppp builds it: whether the host's cache has
/// it (the next sandbox loads it) or the first sandbox will build it, and
/// whether the policy lets that build fetch what ppp's Containerfiles
/// need. Optional: only the agents a user runs matter.
fn build_check(agent: &str, r: &image::Recipe, state: &image::Cached, global: Option<&policy::GlobalFile>) -> Check {
    let name = format!("image {agent}");
    let what = format!("{} from {}", r.tag(), r.source);
    let build_hint = format!("`ppp setup --build-images {agent}` builds it now, in a VM of its own");
    match state {
        image::Cached::Valid { bytes } => {
            return Check::new(name, Level::Ok, format!("{what}; cached ({} MiB)", bytes.div_ceil(1 << 20))).optional();
        }
        image::Cached::Corrupt(why) => {
            return Check::new(
                name,
                Level::Note,
                format!("{what}; the cached copy is unusable ({why}), so the next sandbox builds it again"),
            )
            .hint(build_hint)
            .optional();
        }
        image::Cached::Missing => {}
    }
    // A Containerfile of the user's fetches from hosts ppp cannot know.
    let embedded = r.source.starts_with("ppp's embedded");
    let denied: Vec<&str> = match global {
        Some(g) if embedded => {
            let engine = policy::Engine::build(g.default, g.rules.clone(), Vec::new()).ok();
            image::BUILD_HOSTS
                .iter()
                .copied()
                .filter(|h| {
                    !engine
                        .as_ref()
                        .is_some_and(|e| e.decide(None, Some(h), None, 443).verdict == policy::Verdict::Allow)
                })
                .collect()
        }
        _ => Vec::new(),
    };
    if denied.is_empty() {
        return Check::new(name, Level::Note, format!("{what}; not built yet: the first sandbox builds it in its VM"))
            .hint(build_hint)
            .optional();
    }
    let allow: Vec<String> = denied.iter().map(|h| format!("`ppp policy allow network {h}`")).collect();
    Check::new(
        name,
        Level::Problem,
        format!("{what}; not built yet, and the policy denies {}, which the build needs", denied.join(", ")),
    )
    .hint(format!("{}, then {build_hint}", allow.join(", ")))
    .optional()
}

/// The machine row: whether podman answers `machine info` (it refuses
/// root on Linux), and its provider.
fn machine_check(program: PathBuf) -> (Check, Option<String>) {
    match exec::run(&podman::machine_info(program)) {
        Ok(out) => {
            let provider = podman::parse_provider(&out.stdout).unwrap_or_else(|| podman::default_provider().to_owned());
            (Check::new("machine", Level::Ok, format!("provider {provider}")), Some(provider))
        }
        Err(exec::ExecError::Failed { stderr, .. }) if podman::refuses_root(&stderr) => {
            let f = podman::root_refusal();
            let hint = "run ppp as your own user: Podman Machine runs rootless, and ppp needs no root";
            (Check::new("machine", Level::Problem, f.to_string()).hint(hint), None)
        }
        Err(e) => (
            Check::new("machine", Level::Problem, format!("`podman machine info` failed: {e}"))
                .hint("check `podman machine info` by hand"),
            None,
        ),
    }
}

/// The hypervisor row: the program the provider runs machines with.
fn hypervisor_check(provider: &str, podman: &Path) -> Option<Check> {
    let (program, install) = podman::hypervisor(provider)?;
    Some(match podman::find_helper(&program, podman) {
        Some(p) => Check::new("hypervisor", Level::Ok, format!("`{}` ({provider})", p.display())),
        None => Check::new("hypervisor", Level::Problem, format!("`{program}` not found ({provider})")).hint(install),
    })
}

/// podman's path and version, if found (the version `None` if unreadable).
fn detect_podman() -> Option<(PathBuf, Option<podman::Version>)> {
    let program = podman::program().filter(|p| p.is_file())?;
    let version = exec::run(&podman::version_json(program.clone()))
        .ok()
        .and_then(|o| podman::parse_version_json(&o.stdout))
        .or_else(|| {
            exec::run(&podman::version(program.clone()))
                .ok()
                .and_then(|o| podman::parse_version(&o.stdout))
                .and_then(|v| podman::Version::parse(&v))
        });
    Some((program, version))
}

/// The podman row: missing or older than 5.5 is a problem (no `machine
/// cp`); older than 6.0 is a note (no `--import-native-ca`).
#[must_use]
pub fn podman_check(found: Option<(PathBuf, Option<podman::Version>)>) -> Check {
    let tested = versions::podman_tested();
    let install = "install Podman (https://podman.io/docs/installation), or set PPP_PODMAN to its path";
    let Some((path, version)) = found else {
        return Check::new("podman", Level::Problem, "not found").hint(install);
    };
    let Some(v) = version else {
        return Check::new("podman", Level::Problem, format!("`{}` did not report its version", path.display()))
            .hint(install);
    };
    let at = |major, minor| v >= podman::Version { major, minor, patch: 0 };
    if !at(podman::MIN.0, podman::MIN.1) {
        Check::new("podman", Level::Problem, format!("{v} is older than 5.0: no Podman Machine as ppp drives it"))
            .hint(format!("upgrade Podman to 5.0 or newer (ppp is tested with {tested})"))
    } else if !at(5, 5) {
        Check::new(
            "podman",
            Level::Note,
            format!(
                "{v} (tested with {tested}); older than 5.5: no `machine cp`, so `ppp cp` copies only files, \
                 and only into a sandbox"
            ),
        )
    } else if !at(6, 0) {
        Check::new(
            "podman",
            Level::Note,
            format!("{v} (tested with {tested}); older than 6.0: no `machine init --import-native-ca`"),
        )
    } else {
        Check::new("podman", Level::Ok, format!("{v} (tested with {tested})"))
    }
}

/// The mitmproxy row, and whether ppp has a usable mitmdump.
fn mitmproxy_check(dirs: &Dirs, lookup: &mitmdump::Lookup) -> (Check, bool) {
    let want = versions::mitmproxy();
    if let Some(m) = &lookup.mitmdump {
        return match mitmdump::check_version(m, want) {
            Ok(()) => (
                Check::new("mitmproxy", Level::Ok, format!("{want} at `{}` ({})", m.display(), env::PPP_MITMDUMP)),
                true,
            ),
            Err(e) => (
                Check::new("mitmproxy", Level::Problem, format!("`{}` ({}): {e:#}", m.display(), env::PPP_MITMDUMP))
                    .hint(format!(
                        "unset `{}` to let ppp install its own, or point it at mitmproxy {want}",
                        env::PPP_MITMDUMP
                    )),
                false,
            ),
        };
    }
    let path = dirs.venv_mitmdump();
    let have = if path.is_file() {
        mitmdump::venv_version(&path).or_else(|| mitmdump::installed_version(&path).ok())
    } else {
        None
    };
    match have {
        Some(v) if v == want => {
            (Check::new("mitmproxy", Level::Ok, format!("{want} in `{}`", dirs.venv().display())), true)
        }
        other => {
            let what = match other {
                Some(v) => format!("mitmproxy {v} in `{}`, but ppp needs {want}", dirs.venv().display()),
                None if path.is_file() => format!("`{}` does not run", path.display()),
                None => format!("{want} is not installed in `{}`", dirs.venv().display()),
            };
            let check = match mitmdump::find_python(lookup) {
                Ok(python) => Check::new("mitmproxy", Level::Fixable, what)
                    .fix(Fix::InstallMitmproxy { venv: dirs.venv(), python }),
                Err(_) => Check::new("mitmproxy", Level::Problem, what)
                    .hint(format!("install Python {} or newer, then run `ppp setup` again", versions::python_min())),
            };
            (check, false)
        }
    }
}

/// The Python row: needed only to build the venv.
fn python_check(dirs: &Dirs, lookup: &mitmdump::Lookup, venv_ok: bool) -> Check {
    let min = versions::python_min();
    if lookup.mitmdump.is_some() {
        return Check::new("python", Level::Ok, format!("not needed: `{}` is set", env::PPP_MITMDUMP));
    }
    match mitmdump::find_python(lookup) {
        Ok(p) => Check::new("python", Level::Ok, format!(">= {min} at `{}`", p.display())),
        Err(e) if venv_ok => Check::new(
            "python",
            Level::Note,
            format!("no Python >= {min} found; needed only to rebuild `{}`", dirs.venv().display()),
        )
        .hint(format!("{e:#}")),
        Err(e) => Check::new("python", Level::Problem, format!("no Python >= {min} with venv, ensurepip and ssl"))
            .hint(format!("install Python {min} or newer, or set `{}` to one ({e:#})", env::PPP_PYTHON)),
    }
}

/// The secret store row: the keychain, or the age file store.
fn store_check(settings: Option<&Settings>) -> Check {
    let name = "secret store";
    let Some(settings) = settings else {
        return Check::new(name, Level::Problem, format!("`{}` is not `keychain` or `file`", env::PPP_SECRET_BACKEND))
            .hint(format!("set `{}` to `keychain` or `file`, or unset it", env::PPP_SECRET_BACKEND));
    };
    match (settings.backend, secret::keychain_status()) {
        (Some(Backend::File), _) => {
            Check::new(name, Level::Ok, format!("age file store (`{}=file`)", env::PPP_SECRET_BACKEND))
        }
        (_, Ok(())) => Check::new(name, Level::Ok, "OS keychain"),
        (Some(Backend::Keychain), Err(why)) => {
            Check::new(name, Level::Problem, format!("`{}=keychain`, but the keychain: {why}", env::PPP_SECRET_BACKEND))
                .hint(format!("start and unlock the keychain, or set `{}=file`", env::PPP_SECRET_BACKEND))
        }
        (None, Err(why)) => {
            Check::new(name, Level::Note, format!("age file store in use; the OS keychain does not answer: {why}"))
        }
    }
}

/// The API keys row: what is stored, and what the environment holds.
fn keys_check(dirs: &Dirs, opts: &Options) -> Check {
    let name = "api keys";
    let store = match Store::open(dirs) {
        Ok(s) => s,
        Err(e) => return Check::new(name, Level::Note, format!("cannot open the secret store: {e:#}")).optional(),
    };
    let stored: Vec<String> = store
        .list()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.scope == Scope::Global && e.kind == Kind::Service)
        .map(|e| e.name)
        .collect();
    let pending: Vec<(&'static str, &'static str)> = secret::services::all()
        .iter()
        .filter(|s| !stored.iter().any(|n| n == s.name))
        .filter_map(|s| crate::cmd::secret::from_env(s.env_vars).map(|(var, _)| (s.name, var)))
        .collect();
    let found = pending.iter().map(|(s, v)| format!("{v} ({s})")).collect::<Vec<_>>().join(", ");
    if !pending.is_empty() && opts.import_secrets {
        Check::new(name, Level::Fixable, format!("not stored yet: {found}")).optional().fix(Fix::ImportSecrets(pending))
    } else if !pending.is_empty() {
        Check::new(name, Level::Note, format!("the environment holds keys not stored yet: {found}"))
            .optional()
            .hint("`ppp setup --import-secrets` stores them")
    } else if stored.is_empty() {
        Check::new(name, Level::Note, "none stored")
            .optional()
            .hint("store one with `ppp secret set -g anthropic` (or `ppp setup --import-secrets`)")
    } else {
        Check::new(name, Level::Ok, format!("stored: {}", stored.join(", "))).optional()
    }
}

/// `$PPP_DATA/mitmproxy/mitmproxy-ca-cert.pem`: written by mitmdump on the
/// daemon's first start.
#[must_use]
pub fn ca_pem(dirs: &Dirs) -> PathBuf {
    dirs.mitmproxy_confdir().join("mitmproxy-ca-cert.pem")
}

/// The DER bytes of every certificate in a PEM text.
#[must_use]
pub fn pem_certs(text: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut body: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line == "-----BEGIN CERTIFICATE-----" {
            body = Some(String::new());
        } else if line == "-----END CERTIFICATE-----" {
            if let Some(b) = body.take()
                && let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b)
            {
                out.push(der);
            }
        } else if let Some(b) = &mut body {
            b.push_str(line);
        }
    }
    out
}

/// `AB:CD:…`, the SHA-256 fingerprint of a DER certificate.
#[must_use]
pub fn fingerprint(der: &[u8]) -> String {
    sha2::Sha256::digest(der).iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// The file in `dir` holding the certificate `der`, compared by content.
#[must_use]
pub fn anchor_holding(dir: &Path, der: &[u8]) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).collect();
    entries.sort();
    entries
        .into_iter()
        .filter(|p| p.is_file())
        .find(|p| std::fs::read_to_string(p).is_ok_and(|t| pem_certs(&t).iter().any(|c| c.as_slice() == der)))
}

/// The Linux trust store to use: `PPP_CA_ANCHORS` or the distro's anchors
/// directory (Fedora's when it exists, else Debian's), and the command that
/// refreshes the system bundle from it.
#[must_use]
pub fn linux_trust(pem: &Path, var: impl Fn(&str) -> Option<String>) -> Trust {
    let fedora = Path::new(FEDORA_ANCHORS).is_dir();
    let anchors = var(env::PPP_CA_ANCHORS)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(if fedora { FEDORA_ANCHORS } else { DEBIAN_ANCHORS }), PathBuf::from);
    let (name, args): (&str, &[&str]) =
        if fedora { ("update-ca-trust", &["extract"]) } else { ("update-ca-certificates", &[]) };
    // Non-root PATHs often lack the sbin directories these live in.
    let program = exec::find_on_path(name)
        .or_else(|| ["/usr/sbin", "/usr/bin", "/sbin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.is_file()))
        .unwrap_or_else(|| PathBuf::from(name));
    Trust::Linux {
        pem: pem.to_owned(),
        dest: anchors.join(ANCHOR_NAME),
        update: Invocation::new(program).args(args.iter().copied()).timeout(TRUST_TIMEOUT),
    }
}

fn security() -> PathBuf {
    exec::find_on_path("security").unwrap_or_else(|| PathBuf::from("/usr/bin/security"))
}

/// macOS: `security verify-cert -c PEM`, which succeeds only for a trusted
/// (self-signed) CA.
#[must_use]
pub fn macos_verify(pem: &Path) -> Invocation {
    Invocation::new(security()).args(["verify-cert", "-c"]).arg(pem).timeout(Duration::from_secs(30))
}

/// macOS: add `pem` to the login keychain as a trusted root.
#[must_use]
pub fn macos_trust(home: &Path, pem: &Path) -> Trust {
    let add = Invocation::new(security())
        .args(["add-trusted-cert", "-r", "trustRoot", "-k"])
        .arg(home.join(MACOS_LOGIN_KEYCHAIN))
        .arg(pem)
        .timeout(TRUST_TIMEOUT);
    Trust::Macos { add }
}

/// The host-trust row for mitmproxy's CA.
fn ca_check(dirs: &Dirs) -> Check {
    let name = "mitmproxy ca";
    let pem = ca_pem(dirs);
    let Ok(text) = std::fs::read_to_string(&pem) else {
        return Check::new(
            name,
            Level::Note,
            "not created yet: created on first daemon start; run `ppp setup` again then",
        )
        .optional();
    };
    let Some(der) = pem_certs(&text).into_iter().next() else {
        return Check::new(name, Level::Note, format!("`{}` holds no certificate", pem.display())).optional();
    };
    let fp = fingerprint(&der);
    let short = &fp[..fp.len().min(23)];
    if cfg!(target_os = "macos") {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        let trust = macos_trust(&home, &pem);
        return if exec::run(&macos_verify(&pem)).is_ok() {
            Check::new(name, Level::Ok, format!("trusted by this Mac (SHA-256 {short}…)")).optional()
        } else {
            let manual = trust.manual().join(" && ");
            Check::new(name, Level::Fixable, format!("not trusted by this Mac (SHA-256 {short}…)"))
                .optional()
                .hint(format!("run `{manual}`"))
                .fix(Fix::TrustCa(trust))
        };
    }
    if !cfg!(target_os = "linux") {
        return Check::new(name, Level::Note, "host trust is not checked on this OS").optional();
    }
    let trust = linux_trust(&pem, |k| std::env::var(k).ok());
    let Trust::Linux { dest, .. } = &trust else { unreachable!("linux_trust is Linux") };
    let anchors = dest.parent().unwrap_or(Path::new("/"));
    if let Some(found) = anchor_holding(anchors, &der) {
        Check::new(name, Level::Ok, format!("trusted: `{}` (SHA-256 {short}…)", found.display())).optional()
    } else {
        let manual = trust.manual().join(" && ");
        Check::new(name, Level::Fixable, format!("not in `{}` (SHA-256 {short}…)", anchors.display()))
            .optional()
            .hint(format!("run `ppp setup` as root, or `{manual}`"))
            .fix(Fix::TrustCa(trust))
    }
}

/// The global policy row.
fn policy_check(dirs: &Dirs) -> Check {
    let path = dirs.global_policy();
    match policy::load_global(&path) {
        Ok(None) => Check::new("policy", Level::Fixable, "no global policy: every connection is denied")
            .hint("choose a preset with `ppp policy init balanced` (or `allow-all`, `deny-all`)")
            .fix(Fix::InitPolicy { path }),
        Ok(Some(f)) => match f.preset {
            Some(p) => Check::new("policy", Level::Ok, format!("preset `{p}`, default {}", f.default)),
            None => Check::new(
                "policy",
                Level::Ok,
                format!("no preset; {} own rules, default {}", f.rules.len(), f.default),
            ),
        },
        Err(e) => {
            Check::new("policy", Level::Problem, format!("{e:#}")).hint(format!("fix or remove `{}`", path.display()))
        }
    }
}

/// The presets offered, in the order a prompt lists them.
pub const PRESETS: [Preset; 3] = [Preset::Balanced, Preset::AllowAll, Preset::DenyAll];

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nAAEC\nAw==\n-----END CERTIFICATE-----\n";

    #[test]
    fn podman_versions() {
        let v = |s: &str| Some((PathBuf::from("/bin/podman"), podman::Version::parse(s)));
        assert_eq!(podman_check(None).level, Level::Problem);
        let old = podman_check(v("4.3.1"));
        assert_eq!(old.level, Level::Problem);
        assert!(old.detail.contains("older than 5.0"), "{}", old.detail);
        // Debian trixie's podman: works, without `machine cp`.
        let trixie = podman_check(v("5.4.2"));
        assert_eq!(trixie.level, Level::Note);
        assert!(trixie.detail.contains("no `machine cp`"), "{}", trixie.detail);
        let mid = podman_check(v("5.5.0"));
        assert_eq!(mid.level, Level::Note);
        assert!(mid.detail.contains("--import-native-ca"), "{}", mid.detail);
        assert_eq!(podman_check(v("6.0.1")).level, Level::Ok);
        assert_eq!(podman_check(Some(("/bin/podman".into(), None))).level, Level::Problem);
    }

    #[test]
    fn registries_of_images() {
        assert_eq!(registry_of("ghcr.io/ppp-sandbox/opencode:0.1.0"), "ghcr.io");
        assert_eq!(registry_of("localhost:5000/agent:dev"), "localhost");
        assert_eq!(registry_of("registry.example:5000/a/b"), "registry.example");
        assert_eq!(registry_of("ubuntu:24.04"), "registry-1.docker.io");
        assert_eq!(registry_of("library/ubuntu"), "registry-1.docker.io");
        assert_eq!(registry_of("docker.io/library/ubuntu"), "registry-1.docker.io");
    }

    #[test]
    fn image_rows_follow_the_policy() {
        let deny_all = policy::GlobalFile::from_preset(Preset::DenyAll);
        let c = image_check("opencode", "ghcr.io/x/y:1", None, Some(&deny_all));
        assert_eq!(c.level, Level::Problem);
        assert!(c.hint.as_deref().unwrap().contains("ppp policy allow network ghcr.io"), "{c:?}");
        let allow_all = policy::GlobalFile::from_preset(Preset::AllowAll);
        assert_eq!(image_check("opencode", "ghcr.io/x/y:1", None, Some(&allow_all)).level, Level::Ok);
        assert_eq!(image_check("opencode", "ghcr.io/x/y:1", None, None).level, Level::Note);
    }

    #[test]
    fn pem_and_fingerprint() {
        let certs = pem_certs(&format!("junk\n{PEM}{PEM}"));
        assert_eq!(certs, [vec![0, 1, 2, 3], vec![0, 1, 2, 3]]);
        assert_eq!(fingerprint(&[]).len(), 32 * 3 - 1);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(anchor_holding(dir.path(), &[0, 1, 2, 3]), None);
        std::fs::write(dir.path().join("other.crt"), "-----BEGIN CERTIFICATE-----\nAAE=\n-----END CERTIFICATE-----\n")
            .unwrap();
        // Same certificate, other line breaks: found by content.
        std::fs::write(dir.path().join("x.crt"), "-----BEGIN CERTIFICATE-----\nAAECAw==\n-----END CERTIFICATE-----\n")
            .unwrap();
        assert_eq!(anchor_holding(dir.path(), &[0, 1, 2, 3]), Some(dir.path().join("x.crt")));
    }

    #[test]
    fn trust_commands() {
        let t = linux_trust(Path::new("/d/ca.pem"), |k| (k == env::PPP_CA_ANCHORS).then(|| "/anchors".to_owned()));
        let Trust::Linux { dest, update, .. } = &t else { panic!() };
        assert_eq!(dest, Path::new("/anchors/ppp-mitmproxy.crt"));
        assert!(t.needs_root());
        let manual = t.manual();
        assert_eq!(manual[0], "sudo install -m 0644 /d/ca.pem /anchors/ppp-mitmproxy.crt");
        assert!(manual[1].starts_with("sudo /") && manual[1].contains("update-ca-"), "{manual:?}");
        assert!(t.statement().contains(&format!("run `{update}`")), "{}", t.statement());

        let m = macos_trust(Path::new("/Users/me"), Path::new("/d/ca.pem"));
        assert!(!m.needs_root());
        let Trust::Macos { add } = &m else { panic!() };
        let args: Vec<String> = add.args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args,
            ["add-trusted-cert", "-r", "trustRoot", "-k", "/Users/me/Library/Keychains/login.keychain-db", "/d/ca.pem"]
        );
        let verify: Vec<String> =
            macos_verify(Path::new("/d/ca.pem")).args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(verify, ["verify-cert", "-c", "/d/ca.pem"]);
    }

    #[test]
    fn readiness_counts_required_checks_only() {
        let r = Report {
            checks: vec![
                Check::new("a", Level::Ok, ""),
                Check::new("b", Level::Note, ""),
                Check::new("c", Level::Fixable, "").optional(),
            ],
        };
        assert!(r.ready());
        let r = Report { checks: vec![Check::new("policy", Level::Fixable, "")] };
        assert!(!r.ready());
        assert_eq!(r.table(), "CHECK   STATUS   DETAIL\npolicy  fixable\n");
    }
}

//! `ppp diagnose`: one report of what a bug report needs (host, tool
//! versions, keychain, machines, sandboxes, daemon, log tails, port registry
//! and policy summary), with every stored secret redacted. The JSON form is a
//! contract for CI smoke jobs, documented field by field in
//! `docs/diagnose.md`; bump [`SCHEMA_VERSION`] on any incompatible change.
//!
//! Collecting never fails and never hangs: a section that cannot be read is
//! left empty and named in `errors`, and every external probe (podman,
//! mitmdump, Python, the keychain) runs under a timeout. The report is turned
//! into JSON and redacted *as JSON* before any format is rendered from it, so
//! no output format can skip the redaction.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, ExecError};
use crate::podman;
use crate::policy::{self, Verdict};
use crate::proxy::mitmdump;
use crate::sandbox::{self, PortRegistry};
use crate::secret::{self, Value};
use crate::{env, versions};

/// The version of the JSON report's shape.
pub const SCHEMA_VERSION: u32 = 1;
/// How long one external probe may take unless [`env::PPP_PROBE_TIMEOUT`]
/// says otherwise. A machine that does not answer in this time is reported
/// as such, not waited for.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many lines of `proxy.log` the report carries.
pub const LOG_LINES: usize = 100;
/// How many flows of `flows.jsonl` the report carries.
pub const FLOWS: usize = 100;
/// How much of the end of `proxy.log` is read to find [`LOG_LINES`] lines:
/// the log grows without bound and diagnose must stay quick.
const LOG_TAIL_BYTES: u64 = 256 * 1024;
/// What replaces a secret in the report.
pub const REDACTED: &str = secret::value::REDACTED;

/// Everything `ppp diagnose` reports. Field meanings are in
/// `docs/diagnose.md`. Enum-like fields are strings so that a report whose
/// strings were redacted always reads back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub generated_at: String,
    pub host: Host,
    pub ppp: Ppp,
    pub podman: Tool,
    pub mitmdump: Tool,
    pub python: Tool,
    pub keychain: Keychain,
    /// The `PPP_*` and related variables that are set (see [`env::ALL`]).
    pub environment: BTreeMap<String, String>,
    pub machines: Machines,
    /// The WireGuard endpoint host the guests are given, and what decided
    /// it; `null` when `PPP_ENDPOINT_HOST` is not an address (see `errors`).
    pub endpoint: Option<crate::proxy::endpoint::Endpoint>,
    pub sandboxes: Vec<Sandbox>,
    pub daemon: Option<Daemon>,
    pub port_registry: Vec<PortEntry>,
    pub policy: Option<PolicySummary>,
    pub proxy_log: LogTail,
    /// The last [`FLOWS`] flows, oldest first, as `flows.jsonl` holds them.
    pub flows: Vec<Json>,
    pub redaction: Redaction,
    pub errors: Vec<SectionError>,
}

/// The host platform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    pub os: String,
    pub arch: String,
}

/// ppp itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ppp {
    pub version: String,
    /// The git revision the binary was built from (build.rs); none when it
    /// was not built from a git checkout.
    pub git_revision: Option<String>,
}

/// How asking an external program went: `ok`, `missing` (not installed or
/// not found), `timed_out` or `failed`.
pub mod probe {
    pub const OK: &str = "ok";
    pub const MISSING: &str = "missing";
    pub const TIMED_OUT: &str = "timed_out";
    pub const FAILED: &str = "failed";
}

/// A program ppp drives, as found on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    pub found: bool,
    pub path: Option<String>,
    pub version: Option<String>,
    /// What ppp expects: the tested podman, the pinned mitmproxy, the
    /// minimum Python.
    pub expected: String,
    /// One of the [`probe`] words.
    pub probe: String,
    pub error: Option<String>,
}

/// The OS keychain and the secret store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keychain {
    pub available: bool,
    /// One of the [`probe`] words.
    pub probe: String,
    /// Why the keychain does not answer.
    pub error: Option<String>,
    /// Where new secrets go (`keychain` or `file`); `None` when the store
    /// could not be opened.
    pub backend: Option<String>,
    /// How many secrets the index lists, by backend.
    pub secrets: BTreeMap<String, usize>,
    /// Secrets from a command whose last run failed: `name (scope): why`,
    /// never the command's output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command_failures: Vec<String>,
}

/// `podman machine list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machines {
    /// One of the [`probe`] words.
    pub probe: String,
    pub error: Option<String>,
    pub list: Vec<Machine>,
}

/// One Podman Machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    pub name: String,
    /// The podman home it is in: `user` (the user's own) or `own` (a
    /// sandbox's, under ppp's data directory).
    #[serde(default)]
    pub home: String,
    /// `running`, `starting` or `stopped`.
    pub state: String,
    pub vm_type: Option<String>,
    pub last_up: Option<String>,
}

/// One sandbox: its record, its machine and its tunnel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    pub name: String,
    pub agent: String,
    /// The status recorded in `sandbox.json`.
    pub status: String,
    pub created_at: String,
    pub workspace: Vec<String>,
    pub machine_name: String,
    /// `running`, `starting`, `stopped`, `broken` (its gvproxy or qemu is
    /// gone, see `machine_problem`), `missing` (podman has no such
    /// machine) or `unknown` (podman did not answer).
    pub machine_state: String,
    /// Why a `broken` machine cannot work, and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_problem: Option<String>,
    /// The image the agent container runs (null: not recorded yet, or a
    /// record older than issue 24).
    #[serde(default)]
    pub image: Option<String>,
    /// Where that image came from: `built` (in this VM), `cached` (loaded
    /// from the host's image cache), `pulled` (`PPP_<AGENT>_IMAGE`) or
    /// `template` (the template's disk held it).
    #[serde(default)]
    pub image_origin: Option<String>,
    pub port: u16,
    /// Whether the port registry gives this port to this sandbox.
    pub registered: bool,
    /// Whether the running mitmdump has a WireGuard server on the port.
    pub listening: bool,
    /// `active`, `idle` or `none`; `unknown` when the daemon state could not
    /// be read.
    pub tunnel: String,
    pub last_seen: Option<String>,
    /// What the workspace guard reported: files the agent created or
    /// changed that can run code on the host (ADR 0036), newest last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_changes: Option<String>,
}

/// The daemon, as `ppp daemon status --json` shows it (its per-sandbox
/// tunnels are in [`Sandbox`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Daemon {
    pub running: bool,
    pub pid: Option<u32>,
    pub mitmdump_pid: Option<u32>,
    pub mitmdump_alive: bool,
    pub ports: Vec<u16>,
    pub started_at: Option<String>,
    pub restarts: u32,
    pub last_restart: Option<String>,
    pub last_log_line: Option<String>,
}

/// One line of the port registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortEntry {
    pub port: u16,
    pub sandbox: String,
}

/// The policy in numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicySummary {
    /// Whether `policies.yaml` exists; without it the default is `deny`.
    pub file: bool,
    pub default: String,
    pub preset: Option<String>,
    pub global: RuleCounts,
    /// Every sandbox directory with a `policy.yaml`, by name.
    pub sandboxes: Vec<SandboxRules>,
}

/// How many rules, and of which verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleCounts {
    pub total: usize,
    pub allow: usize,
    pub deny: usize,
}

/// A sandbox's own rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRules {
    pub name: String,
    #[serde(flatten)]
    pub rules: RuleCounts,
}

/// The end of `proxy.log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogTail {
    pub path: String,
    pub exists: bool,
    /// The last [`LOG_LINES`] lines, oldest first.
    pub lines: Vec<String>,
}

/// What was done to keep secrets out of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redaction {
    /// How many stored secret values were read and redacted wherever they
    /// appear.
    pub secrets_redacted: usize,
    /// How many listed secrets could not be read (so could only be caught by
    /// the key-shape heuristic).
    pub secrets_unreadable: usize,
}

/// A section that could not be collected, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionError {
    pub section: String,
    pub message: String,
}

/// The probe timeout from [`env::PPP_PROBE_TIMEOUT`] (seconds, fractions
/// allowed), else [`DEFAULT_PROBE_TIMEOUT`].
pub fn probe_timeout(value: Option<OsString>) -> Result<Duration> {
    let Some(v) = value.filter(|v| !v.is_empty()) else { return Ok(DEFAULT_PROBE_TIMEOUT) };
    let text = v.to_string_lossy();
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            fail(format!("`{}` is `{text}`, not a number of seconds", env::PPP_PROBE_TIMEOUT))
                .hint("use a number of seconds greater than 0 and at most 3600, such as `10`")
                .code(2)
                .into()
        })
}

/// Collect the report, redacted. `timeout` bounds each external probe.
pub fn collect(dirs: &Dirs, timeout: Duration) -> Result<Report> {
    let deadline = Instant::now() + timeout;
    // The keychain is asked in-process (D-Bus, Security.framework), where no
    // child can be killed: it gets a thread of its own, abandoned if it does
    // not answer by the deadline.
    let (tx, rx) = mpsc::channel();
    let store_dirs = dirs.clone();
    std::thread::spawn(move || {
        let _ = tx.send(secrets(&store_dirs));
    });
    let mut errors = Vec::new();
    let program = podman::program();
    let (podman_tool, machines, mitm, python) = std::thread::scope(|s| {
        let version = s.spawn(|| podman_probe(program.clone(), timeout));
        let list = s.spawn(|| machines_probe(program.clone(), timeout));
        let mitm = s.spawn(|| mitmdump_probe(dirs, timeout));
        let python = s.spawn(|| python_probe(&mitmdump::Lookup::from_env(), timeout));
        (joined(version), joined(list), joined(mitm), joined(python))
    });
    let store = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(s) => s,
        Err(_) => Secrets::timed_out(timeout),
    };

    // The provider of the machines podman lists, else this platform's default.
    let provider =
        machines.list.iter().find_map(|m| m.vm_type.clone()).unwrap_or_else(|| podman::default_provider().to_owned());
    let endpoint = section(&mut errors, "endpoint", || crate::proxy::endpoint::current(dirs, &provider));
    let status = section(&mut errors, "daemon", || crate::proxy::status::status_report(dirs));
    let registry = section(&mut errors, "port_registry", || PortRegistry::load(dirs)).unwrap_or_default();
    let records = section(&mut errors, "sandboxes", || sandbox::load_all(dirs)).unwrap_or_default();
    // Each sandbox's own home, listed after the user's (each bounded).
    let mut machines = machines;
    let own = program.as_ref().map(|p| crate::sandbox::machine::list_homes(p, dirs, &records, Some(timeout), false));
    if let Some(own) = &own {
        for (_, m) in own.all() {
            machines.list.push(Machine {
                home: "own".to_owned(),
                state: m.state().to_owned(),
                name: m.name.clone(),
                vm_type: m.vm_type.clone(),
                last_up: m.last_up.clone(),
            });
        }
        for (name, e) in &own.errors {
            let line = format!("sandbox `{name}`'s podman home: {e}");
            machines.error = Some(machines.error.take().map_or(line.clone(), |prev| format!("{prev}; {line}")));
        }
    }
    let mut sandboxes = merge(records, &machines, own.as_ref(), &registry, status.as_ref());
    for s in &mut sandboxes {
        s.workspace_changes = sandbox::guard::reports(dirs, &s.name);
    }
    let policy = section(&mut errors, "policy", || policy_summary(dirs));
    let proxy_log = section(&mut errors, "proxy_log", || log_tail(&dirs.proxy_log(), LOG_LINES)).unwrap_or(LogTail {
        path: dirs.proxy_log().display().to_string(),
        exists: false,
        lines: Vec::new(),
    });
    // Kept as the guest sent them: every format escapes them on the way
    // out (`output::print`, `output::json`, the issue body file), and a CI
    // job reading `-o json` gets the real values.
    let flows =
        section(&mut errors, "flows", || policy::flowlog::tail(&dirs.flows_log(), FLOWS, None)).unwrap_or_default();
    if let Some(e) = &store.error {
        errors.push(SectionError { section: "secrets".to_owned(), message: e.clone() });
    }

    let report = Report {
        schema_version: SCHEMA_VERSION,
        generated_at: now(),
        host: Host { os: std::env::consts::OS.to_owned(), arch: std::env::consts::ARCH.to_owned() },
        ppp: Ppp {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            git_revision: Some(crate::versions::GIT_REVISION).filter(|r| *r != "unknown").map(str::to_owned),
        },
        podman: podman_tool,
        mitmdump: mitm,
        python,
        keychain: store.keychain,
        environment: env::ALL
            .iter()
            .filter_map(|k| std::env::var_os(k).map(|v| ((*k).to_owned(), v.to_string_lossy().into_owned())))
            .collect(),
        machines,
        endpoint,
        sandboxes,
        daemon: status.map(|s| Daemon {
            running: s.running,
            pid: s.pid,
            mitmdump_pid: s.mitmdump_pid,
            mitmdump_alive: s.mitmdump_alive,
            ports: s.ports,
            started_at: s.started_at,
            restarts: s.restarts,
            last_restart: s.last_restart,
            last_log_line: s.last_log_line,
        }),
        port_registry: registry.ports.into_iter().map(|(port, sandbox)| PortEntry { port, sandbox }).collect(),
        policy,
        proxy_log,
        flows,
        redaction: Redaction { secrets_redacted: store.values.len(), secrets_unreadable: store.unreadable },
        errors,
    };
    Redactor::new(store.values).report(&report)
}

fn joined<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Run one section, turning its failure into an entry of `errors`.
fn section<T>(errors: &mut Vec<SectionError>, name: &str, f: impl FnOnce() -> Result<T>) -> Option<T> {
    match f() {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(SectionError { section: name.to_owned(), message: format!("{e:#}") });
            None
        }
    }
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

/// A probe's word and message for an exec failure.
fn exec_failure(e: &ExecError) -> (&'static str, String) {
    match e {
        ExecError::NotFound { .. } => (probe::MISSING, e.to_string()),
        ExecError::TimedOut { .. } => (probe::TIMED_OUT, e.to_string()),
        _ => (probe::FAILED, e.to_string()),
    }
}

fn missing(path: Option<String>, expected: &str, error: String) -> Tool {
    Tool {
        found: false,
        path,
        version: None,
        expected: expected.to_owned(),
        probe: probe::MISSING.to_owned(),
        error: Some(error),
    }
}

/// podman's path and version: `podman version --format json`, falling back
/// to `podman --version` for a podman that lacks the first.
fn podman_probe(program: Option<PathBuf>, timeout: Duration) -> Tool {
    let expected = format!("tested with {}", versions::podman_tested());
    let Some(program) = program else {
        return missing(None, &expected, format!("podman is not on PATH and `{}` is not set", env::PPP_PODMAN));
    };
    let path = Some(display(&program));
    let first = exec::run(&podman::version_json(program.clone()).timeout(timeout));
    let out = match first {
        Ok(o) => podman::parse_version_json(&o.stdout).map(|v| v.to_string()).ok_or(o.stdout),
        Err(e @ (ExecError::NotFound { .. } | ExecError::TimedOut { .. })) => {
            let (word, message) = exec_failure(&e);
            return Tool {
                found: word != probe::MISSING,
                path,
                version: None,
                expected,
                probe: word.to_owned(),
                error: Some(message),
            };
        }
        Err(e) => Err(e.to_string()),
    };
    let out = out.or_else(|_| match exec::run(&podman::version(program.clone()).timeout(timeout)) {
        Ok(o) => podman::parse_version(&o.stdout)
            .ok_or_else(|| format!("could not read a version from `{}`", o.stdout.trim())),
        Err(e) => Err(e.to_string()),
    });
    match out {
        Ok(v) => Tool { found: true, path, version: Some(v), expected, probe: probe::OK.to_owned(), error: None },
        Err(message) => {
            Tool { found: true, path, version: None, expected, probe: probe::FAILED.to_owned(), error: Some(message) }
        }
    }
}

fn machines_probe(program: Option<PathBuf>, timeout: Duration) -> Machines {
    let Some(program) = program else {
        return Machines {
            probe: probe::MISSING.to_owned(),
            error: Some("podman was not found".to_owned()),
            list: Vec::new(),
        };
    };
    match exec::run(&podman::machine_list(program, &podman::Home::User).timeout(timeout)) {
        Ok(o) => match podman::parse_machine_list(&o.stdout) {
            Ok(list) => Machines {
                probe: probe::OK.to_owned(),
                error: None,
                list: list
                    .into_iter()
                    .map(|m| Machine {
                        home: "user".to_owned(),
                        state: m.state().to_owned(),
                        name: m.name,
                        vm_type: m.vm_type,
                        last_up: m.last_up,
                    })
                    .collect(),
            },
            Err(e) => Machines {
                probe: probe::FAILED.to_owned(),
                error: Some(format!("could not parse `podman machine list` output: {e}")),
                list: Vec::new(),
            },
        },
        Err(e) => {
            let (word, message) = exec_failure(&e);
            Machines { probe: word.to_owned(), error: Some(message), list: Vec::new() }
        }
    }
}

/// The mitmdump the daemon would run: `PPP_MITMDUMP`, else ppp's venv. The
/// venv's package metadata answers without starting Python.
fn mitmdump_probe(dirs: &Dirs, timeout: Duration) -> Tool {
    let expected = versions::mitmproxy().to_owned();
    let path = std::env::var_os(env::PPP_MITMDUMP)
        .filter(|v| !v.is_empty())
        .map_or_else(|| dirs.venv_mitmdump(), PathBuf::from);
    if !path.is_file() {
        return missing(
            Some(display(&path)),
            &expected,
            format!("`{}` does not exist; `ppp daemon start` installs it", path.display()),
        );
    }
    if let Some(v) = mitmdump::venv_version(&path) {
        return Tool {
            found: true,
            path: Some(display(&path)),
            version: Some(v),
            expected,
            probe: probe::OK.to_owned(),
            error: None,
        };
    }
    let (version, word, error) = match exec::run(&mitmdump::version_command(&path).timeout(timeout)) {
        Ok(o) => match mitmdump::parse_version(&o.stdout) {
            Some(v) => (Some(v.to_owned()), probe::OK, None),
            None => (None, probe::FAILED, Some("`mitmdump --version` printed no `Mitmproxy:` line".to_owned())),
        },
        Err(e) => {
            let (word, message) = exec_failure(&e);
            (None, word, Some(message))
        }
    };
    Tool { found: word != probe::MISSING, path: Some(display(&path)), version, expected, probe: word.to_owned(), error }
}

/// The Python `ppp daemon start` would build the venv with: `PPP_PYTHON`,
/// else the first working candidate, each asked under `timeout`.
fn python_probe(lookup: &mitmdump::Lookup, timeout: Duration) -> Tool {
    let min = versions::python_min();
    let expected = format!(">= {min}");
    let want = mitmdump::parse_python_version(&format!("({})", min.replace('.', ","))).unwrap_or((3, 12));
    let ask = |p: &Path| -> std::result::Result<String, (&'static str, String)> {
        let out = exec::run(&mitmdump::python_probe(p).timeout(timeout)).map_err(|e| exec_failure(&e))?;
        match mitmdump::parse_python_version(&out.stdout) {
            Some(v) if v >= want => Ok(format!("{}.{}", v.0, v.1)),
            Some(v) => Err((probe::FAILED, format!("`{}` is Python {}.{}", p.display(), v.0, v.1))),
            None => Err((probe::FAILED, format!("`{}` printed no version", p.display()))),
        }
    };
    let ok = |p: &Path, v: String| Tool {
        found: true,
        path: Some(display(p)),
        version: Some(v),
        expected: expected.clone(),
        probe: probe::OK.to_owned(),
        error: None,
    };
    if let Some(p) = &lookup.python {
        return match ask(p) {
            Ok(v) => ok(p, v),
            Err((word, message)) => Tool {
                found: word != probe::MISSING,
                path: Some(display(p)),
                version: None,
                expected,
                probe: word.to_owned(),
                error: Some(format!("{message} ({})", env::PPP_PYTHON)),
            },
        };
    }
    let mut timed_out = None;
    for p in mitmdump::python_candidates(lookup) {
        match ask(&p) {
            Ok(v) => return ok(&p, v),
            Err((word, message)) if word == probe::TIMED_OUT => timed_out = timed_out.or(Some(message)),
            Err(_) => {}
        }
    }
    match timed_out {
        Some(message) => Tool {
            found: false,
            path: None,
            version: None,
            expected,
            probe: probe::TIMED_OUT.to_owned(),
            error: Some(message),
        },
        None => missing(None, &expected, format!("found no working Python {expected} with venv, ensurepip and ssl")),
    }
}

/// The keychain's state and every readable stored secret value.
struct Secrets {
    keychain: Keychain,
    values: Vec<Value>,
    unreadable: usize,
    error: Option<String>,
}

impl Secrets {
    fn timed_out(timeout: Duration) -> Secrets {
        let message = format!("the OS keychain did not answer within {} s", timeout.as_secs_f64());
        Secrets {
            keychain: Keychain {
                available: false,
                probe: probe::TIMED_OUT.to_owned(),
                error: Some(message.clone()),
                backend: None,
                secrets: BTreeMap::new(),
                command_failures: Vec::new(),
            },
            values: Vec::new(),
            unreadable: 0,
            error: Some(format!("{message}; stored secrets could not be read, so only key-shaped text is redacted")),
        }
    }
}

fn secrets(dirs: &Dirs) -> Secrets {
    let status = secret::keychain_status();
    let mut keychain = Keychain {
        available: status.is_ok(),
        probe: if status.is_ok() { probe::OK } else { probe::FAILED }.to_owned(),
        error: status.err(),
        backend: None,
        secrets: BTreeMap::new(),
        command_failures: Vec::new(),
    };
    let listed = secret::Store::open(dirs).and_then(|store| {
        keychain.backend = Some(store.backend().to_string());
        let entries = store.list()?;
        Ok((store, entries))
    });
    let (store, entries) = match listed {
        Ok(x) => x,
        Err(e) => {
            return Secrets {
                keychain,
                values: Vec::new(),
                unreadable: 0,
                error: Some(format!("{e:#}; only key-shaped text is redacted")),
            };
        }
    };
    let status = secret::command::load_status(&dirs.secret_status());
    for e in entries.iter().filter(|e| e.command.is_some()) {
        if let Some(st) = status.get(&e.key())
            && let Some(why) = &st.error
            && st.last_failure > st.last_refresh
        {
            keychain.command_failures.push(format!("`{}` ({} scope): its command failed: {why}", e.name, e.scope));
        }
    }
    let mut values = Vec::new();
    let mut unreadable = 0;
    let mut first_error = None;
    for e in &entries {
        *keychain.secrets.entry(e.backend.to_string()).or_default() += 1;
        match store.get(&e.scope, &e.name, e.kind) {
            Ok(Some(v)) => values.push(v),
            Ok(None) => {}
            Err(err) => {
                unreadable += 1;
                first_error.get_or_insert_with(|| format!("{err:#}"));
            }
        }
    }
    let error = first_error.map(|e| format!("{unreadable} stored secret(s) could not be read for redaction: {e}"));
    Secrets { keychain, values, unreadable, error }
}

/// Join the records with podman's machines, the registry and the daemon.
fn merge(
    records: Vec<sandbox::Record>,
    machines: &Machines,
    own: Option<&crate::sandbox::machine::Listing>,
    registry: &PortRegistry,
    status: Option<&crate::proxy::status::Status>,
) -> Vec<Sandbox> {
    records
        .into_iter()
        .map(|r| {
            let machine_problem = own
                .and_then(|l| l.machine_of(&r).ok().flatten())
                .and_then(|m| m.broken.as_deref())
                .map(|why| crate::sandbox::machine::broken_hint(&r.name, why));
            let machine_state = if r.podman_run.is_some() {
                match own.map(|l| l.machine_of(&r)) {
                    Some(Ok(Some(m))) => m.state(),
                    Some(Ok(None)) => "missing",
                    Some(Err(())) | None => "unknown",
                }
            } else if machines.probe == probe::OK {
                machines
                    .list
                    .iter()
                    .find(|m| m.home == "user" && m.name == r.machine_name)
                    .map_or("missing", |m| m.state.as_str())
            } else {
                "unknown"
            }
            .to_owned();
            let port = status.and_then(|s| s.sandboxes.iter().find(|p| p.name == r.name && p.port == r.port));
            let tunnel = match (status, port) {
                (None, _) => "unknown".to_owned(),
                (Some(_), None) => "none".to_owned(),
                (Some(_), Some(p)) => {
                    serde_json::to_value(p.tunnel).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
                }
            };
            Sandbox {
                registered: registry.ports.get(&r.port) == Some(&r.name),
                listening: port.is_some_and(|p| p.listening),
                last_seen: port.and_then(|p| p.last_seen.clone()),
                tunnel,
                machine_state,
                machine_problem,
                status: r.status.to_string(),
                created_at: r.created_at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
                name: r.name,
                agent: r.agent,
                workspace: r.workspace,
                machine_name: r.machine_name,
                image: r.image,
                image_origin: r.image_origin.map(|o| o.to_string()),
                port: r.port,
                workspace_changes: None,
            }
        })
        .collect()
}

fn counts(rules: &[policy::Rule]) -> RuleCounts {
    let allow = rules.iter().filter(|r| r.decision == Verdict::Allow).count();
    RuleCounts { total: rules.len(), allow, deny: rules.len() - allow }
}

/// The global default and rule counts, and each sandbox directory's.
fn policy_summary(dirs: &Dirs) -> Result<PolicySummary> {
    let global = policy::load_global(&dirs.global_policy())?;
    let mut sandboxes = Vec::new();
    let root = dirs.sandboxes();
    match std::fs::read_dir(&root) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.with_context(|| format!("could not list `{}`", root.display()))?;
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if let Some(f) = policy::load_sandbox(&dirs.sandbox_policy(&name))? {
                    sandboxes.push(SandboxRules { name, rules: counts(&f.rules) });
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("could not list `{}`", root.display())),
    }
    sandboxes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(PolicySummary {
        file: global.is_some(),
        default: global.as_ref().map_or(policy::DEFAULT_WITHOUT_FILE, |g| g.default).to_string(),
        preset: global.as_ref().and_then(|g| g.preset).map(|p| p.as_str().to_owned()),
        global: global.as_ref().map(|g| counts(&g.rules)).unwrap_or_default(),
        sandboxes,
    })
}

/// The last `n` lines of `path`, read from its last [`LOG_TAIL_BYTES`].
pub fn log_tail(path: &Path, n: usize) -> Result<LogTail> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut tail = LogTail { path: display(path), exists: false, lines: Vec::new() };
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(tail),
        Err(e) => return Err(e).with_context(|| format!("could not read `{}`", path.display())),
    };
    tail.exists = true;
    let len = f.metadata().with_context(|| format!("could not read `{}`", path.display()))?.len();
    let start = len.saturating_sub(LOG_TAIL_BYTES);
    f.seek(SeekFrom::Start(start)).with_context(|| format!("could not read `{}`", path.display()))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).with_context(|| format!("could not read `{}`", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().collect();
    // The first line read from the middle of the file is only its end.
    if start > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    let skip = lines.len().saturating_sub(n);
    // proxy.log holds what the guest sent (a refused Host, a DNS name), and
    // these lines reach the user's terminal: never as they are.
    tail.lines = lines[skip..].iter().map(|l| crate::proxy::status::shown_log_line(l)).collect();
    Ok(tail)
}

/// Replaces stored secret values, and text shaped like an API key, with
/// [`REDACTED`].
pub struct Redactor {
    values: Vec<Value>,
}

impl Redactor {
    /// A redactor for these stored values.
    pub fn new(values: Vec<Value>) -> Redactor {
        Redactor { values: values.into_iter().filter(|v| !v.is_empty()).collect() }
    }

    /// `report` with every string redacted. Object keys are redacted only in
    /// the flows, whose shape ppp does not fix; the report's own keys are not
    /// secrets.
    pub fn report(&self, report: &Report) -> Result<Report> {
        let mut v = serde_json::to_value(report)?;
        if let Json::Object(map) = &mut v {
            for (k, field) in map.iter_mut() {
                self.json(field, k == "flows");
            }
        }
        serde_json::from_value(v).context("the redacted report no longer reads back")
    }

    /// Redact every string in `v`; object keys too when `keys`.
    pub fn json(&self, v: &mut Json, keys: bool) {
        match v {
            Json::String(s) => *s = self.text(s),
            Json::Array(items) => items.iter_mut().for_each(|i| self.json(i, keys)),
            Json::Object(map) => {
                if keys {
                    let old = std::mem::take(map);
                    for (k, mut field) in old {
                        self.json(&mut field, keys);
                        map.insert(self.text(&k), field);
                    }
                } else {
                    map.values_mut().for_each(|f| self.json(f, keys));
                }
            }
            _ => {}
        }
    }

    /// `text` with stored values, then key-shaped tokens, redacted.
    pub fn text(&self, text: &str) -> String {
        redact_keys(&self.redact_values(text))
    }

    fn redact_values(&self, text: &str) -> String {
        // Mark every byte any value covers (overlapping matches included),
        // then replace each marked run once, so one replacement can never
        // create or split another match.
        let mut mask = vec![false; text.len()];
        for v in &self.values {
            let needle = v.expose();
            let mut from = 0;
            while let Some(i) = text[from..].find(needle) {
                let at = from + i;
                mask[at..at + needle.len()].fill(true);
                from = at + text[at..].chars().next().map_or(1, char::len_utf8);
            }
        }
        if !mask.contains(&true) {
            return text.to_owned();
        }
        let mut out = String::with_capacity(text.len());
        let mut in_run = false;
        for (i, c) in text.char_indices() {
            if mask[i] {
                if !in_run {
                    out.push_str(REDACTED);
                }
                in_run = true;
            } else {
                in_run = false;
                out.push(c);
            }
        }
        out
    }
}

/// Whether a token (letters, digits, `-`, `_`) looks like an API key: the
/// shapes `ppp secret` refuses as names, at least 12 characters, and not a
/// UUID (rule ids are not secret and help to read a flow).
fn looks_like_key(token: &str) -> bool {
    token.len() >= 12 && !is_uuid(token) && secret::validate::looks_like_secret(token)
}

fn is_uuid(token: &str) -> bool {
    let groups: Vec<&str> = token.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Replace key-shaped tokens in `text`.
pub fn redact_keys(text: &str) -> String {
    let is_token = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(|c: char| !is_token(c)).unwrap_or(rest.len());
        let (token, after) = rest.split_at(end);
        if looks_like_key(token) {
            out.push_str(REDACTED);
        } else {
            out.push_str(token);
        }
        let Some(c) = after.chars().next() else { break };
        out.push(c);
        rest = &after[c.len_utf8()..];
    }
    out
}

/// The human report: short sections, the logs cut to their last lines.
pub fn render_table(r: &Report) -> String {
    const SHOWN: usize = 20;
    let mut out = String::new();
    let _ = writeln!(out, "ppp diagnose (schema {}), {}", r.schema_version, r.generated_at);
    let _ = writeln!(out, "\nhost");
    let _ = writeln!(
        out,
        "  ppp       {}{}",
        r.ppp.version,
        r.ppp.git_revision.as_ref().map(|g| format!(" ({g})")).unwrap_or_default()
    );
    let _ = writeln!(out, "  platform  {}/{}", r.host.os, r.host.arch);
    let _ = writeln!(out, "  podman    {}", tool_text(&r.podman));
    let _ = writeln!(out, "  mitmdump  {}", tool_text(&r.mitmdump));
    let _ = writeln!(out, "  python    {}", tool_text(&r.python));
    let _ = writeln!(out, "  keychain  {}", keychain_text(&r.keychain));
    if !r.environment.is_empty() {
        let _ = writeln!(out, "\nenvironment");
        for (k, v) in &r.environment {
            let _ = writeln!(out, "  {k}={v}");
        }
    }
    let _ = writeln!(out, "\nmachines");
    if r.machines.probe == probe::OK {
        let rows: Vec<Vec<String>> = r
            .machines
            .list
            .iter()
            .map(|m| vec![m.name.clone(), m.state.clone(), m.vm_type.clone().unwrap_or_else(|| "-".to_owned())])
            .collect();
        out.push_str(&indent(&crate::output::table(&["NAME", "STATE", "VM TYPE"], &rows)));
    } else {
        let _ = writeln!(out, "  {}", r.machines.error.as_deref().unwrap_or(&r.machines.probe));
    }
    let _ = writeln!(
        out,
        "  WireGuard endpoint host: {}",
        r.endpoint.as_ref().map_or_else(|| "unknown (see errors)".to_owned(), |e| format!("{} ({})", e.host, e.source))
    );
    let _ = writeln!(out, "\nsandboxes");
    if r.sandboxes.is_empty() {
        let _ = writeln!(out, "  none");
    } else {
        let rows: Vec<Vec<String>> = r
            .sandboxes
            .iter()
            .map(|s| {
                vec![
                    s.name.clone(),
                    s.agent.clone(),
                    s.status.clone(),
                    s.machine_state.clone(),
                    s.port.to_string(),
                    s.tunnel.clone(),
                ]
            })
            .collect();
        out.push_str(&indent(&crate::output::table(
            &["NAME", "AGENT", "RECORDED", "MACHINE", "PORT", "TUNNEL"],
            &rows,
        )));
        for s in &r.sandboxes {
            if let Some(changes) = &s.workspace_changes {
                let _ = writeln!(out, "\nworkspace changes reported for `{}`", s.name);
                out.push_str(&indent(changes));
            }
        }
    }
    let _ = writeln!(out, "\ndaemon");
    let _ = writeln!(out, "  {}", daemon_text(r.daemon.as_ref()));
    let _ = writeln!(out, "\nport registry");
    if r.port_registry.is_empty() {
        let _ = writeln!(out, "  empty");
    } else {
        let rows: Vec<Vec<String>> =
            r.port_registry.iter().map(|p| vec![p.port.to_string(), p.sandbox.clone()]).collect();
        out.push_str(&indent(&crate::output::table(&["PORT", "SANDBOX"], &rows)));
    }
    let _ = writeln!(out, "\npolicy");
    for line in policy_lines(r.policy.as_ref()) {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "\nproxy log ({})", shown(r.proxy_log.lines.len(), SHOWN, "lines"));
    for l in r.proxy_log.lines.iter().rev().take(SHOWN).rev() {
        let _ = writeln!(out, "  {l}");
    }
    let _ = writeln!(out, "\nflows ({})", shown(r.flows.len(), SHOWN, "flows"));
    if !r.flows.is_empty() {
        let rows: Vec<Vec<String>> = r.flows.iter().rev().take(SHOWN).rev().map(flow_row).collect();
        out.push_str(&indent(&crate::output::table(
            &["TIME", "SANDBOX", "DECISION", "METHOD", "HOST", "STATUS"],
            &rows,
        )));
    }
    if !r.errors.is_empty() {
        let _ = writeln!(out, "\nerrors");
        for e in &r.errors {
            let _ = writeln!(out, "  {}: {}", e.section, e.message);
        }
    }
    out
}

fn shown(have: usize, limit: usize, what: &str) -> String {
    if have > limit {
        format!("last {limit} of {have} {what}; `-o json` has them all")
    } else {
        format!("{have} {what}")
    }
}

fn indent(text: &str) -> String {
    text.lines().fold(String::new(), |mut out, l| {
        let _ = writeln!(out, "  {l}");
        out
    })
}

fn tool_text(t: &Tool) -> String {
    let path = t.path.as_deref().map(|p| format!(" ({p})")).unwrap_or_default();
    match (t.probe.as_str(), &t.version) {
        (probe::OK, Some(v)) => format!("{v}{path}; expected {}", t.expected),
        (probe::MISSING, _) => format!("not found{path}"),
        (probe::TIMED_OUT, _) => format!("did not answer{path}: {}", t.error.as_deref().unwrap_or("timed out")),
        _ => format!("unknown version{path}: {}", t.error.as_deref().unwrap_or("failed")),
    }
}

fn keychain_text(k: &Keychain) -> String {
    let state = if k.available {
        "available".to_owned()
    } else {
        format!("not available ({})", k.error.as_deref().unwrap_or(&k.probe))
    };
    let backend = k.backend.as_deref().map(|b| format!("; new secrets go to the {b} store")).unwrap_or_default();
    let stored: usize = k.secrets.values().sum();
    let failed: String = k.command_failures.iter().flat_map(|f| ["; ", f.as_str()]).collect();
    format!("{state}{backend}; {stored} secret(s) stored{failed}")
}

fn daemon_text(d: Option<&Daemon>) -> String {
    match d {
        None => "unknown (see errors)".to_owned(),
        Some(d) if !d.running => "not running".to_owned(),
        Some(d) => format!(
            "running (pid {}), mitmdump {}, ports {}, {} restart(s)",
            d.pid.unwrap_or(0),
            match (d.mitmdump_pid, d.mitmdump_alive) {
                (Some(p), true) => format!("running (pid {p})"),
                (Some(p), false) => format!("not running (last pid {p})"),
                (None, _) => "restarting".to_owned(),
            },
            if d.ports.is_empty() {
                "-".to_owned()
            } else {
                d.ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
            },
            d.restarts
        ),
    }
}

fn policy_lines(p: Option<&PolicySummary>) -> Vec<String> {
    let Some(p) = p else { return vec!["unknown (see errors)".to_owned()] };
    let rules = |c: &RuleCounts| format!("{} rule(s): {} allow, {} deny", c.total, c.allow, c.deny);
    let mut lines = vec![format!(
        "default {}{}{}; global {}",
        p.default,
        p.preset.as_deref().map(|s| format!(" (preset {s})")).unwrap_or_default(),
        if p.file { "" } else { ", no policies.yaml" },
        rules(&p.global)
    )];
    lines.extend(p.sandboxes.iter().map(|s| format!("sandbox {}: {}", s.name, rules(&s.rules))));
    lines
}

fn flow_row(f: &Json) -> Vec<String> {
    let s = |k: &str| match f.get(k) {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Null) | None => "-".to_owned(),
        Some(v) => v.to_string(),
    };
    let host = match f.get("port").and_then(Json::as_u64) {
        Some(p) => format!("{}:{p}", s("host")),
        None => s("host"),
    };
    vec![s("timestamp"), s("sandbox"), s("decision"), s("method"), host, s("status")]
}

/// Markdown to paste into a GitHub issue: a summary table, the sections,
/// and the logs folded away in `<details>`.
pub fn render_github_issue(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "### ppp diagnose\n");
    let _ = writeln!(out, "| | |\n|---|---|");
    let row = |out: &mut String, k: &str, v: &str| {
        let _ = writeln!(out, "| {k} | {} |", cell(v));
    };
    row(
        &mut out,
        "ppp",
        &format!("{}{}", r.ppp.version, r.ppp.git_revision.as_ref().map(|g| format!(" ({g})")).unwrap_or_default()),
    );
    row(&mut out, "platform", &format!("{}/{}", r.host.os, r.host.arch));
    row(&mut out, "podman", &tool_text(&r.podman));
    row(&mut out, "mitmdump", &tool_text(&r.mitmdump));
    row(&mut out, "python", &tool_text(&r.python));
    row(&mut out, "keychain", &keychain_text(&r.keychain));
    row(&mut out, "daemon", &daemon_text(r.daemon.as_ref()));
    row(&mut out, "policy", &policy_lines(r.policy.as_ref()).join("; "));
    row(&mut out, "generated", &r.generated_at);

    let _ = writeln!(out, "\n#### Machines\n");
    if r.machines.probe == probe::OK {
        let rows: Vec<Vec<String>> = r
            .machines
            .list
            .iter()
            .map(|m| vec![m.name.clone(), m.state.clone(), m.vm_type.clone().unwrap_or_default()])
            .collect();
        out.push_str(&md_table(&["name", "state", "VM type"], &rows));
    } else {
        let _ = writeln!(out, "{}", cell(r.machines.error.as_deref().unwrap_or(&r.machines.probe)));
    }
    let _ = writeln!(out, "\n#### Sandboxes\n");
    let rows: Vec<Vec<String>> = r
        .sandboxes
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.agent.clone(),
                s.status.clone(),
                s.machine_state.clone(),
                s.port.to_string(),
                if s.registered { "yes" } else { "no" }.to_owned(),
                s.tunnel.clone(),
            ]
        })
        .collect();
    out.push_str(&md_table(&["name", "agent", "recorded", "machine", "port", "registered", "tunnel"], &rows));
    let _ = writeln!(out, "\n#### Port registry\n");
    let rows: Vec<Vec<String>> = r.port_registry.iter().map(|p| vec![p.port.to_string(), p.sandbox.clone()]).collect();
    out.push_str(&md_table(&["port", "sandbox"], &rows));
    if !r.errors.is_empty() {
        let _ = writeln!(out, "\n#### Errors\n");
        for e in &r.errors {
            let _ = writeln!(out, "- `{}`: {}", e.section, e.message.replace('\n', " "));
        }
    }
    let log = r.proxy_log.lines.join("\n");
    details(&mut out, &format!("proxy.log (last {} lines)", r.proxy_log.lines.len()), "text", &log);
    let flows: Vec<String> = r.flows.iter().map(Json::to_string).collect();
    details(&mut out, &format!("flows.jsonl (last {} flows)", r.flows.len()), "json", &flows.join("\n"));
    out
}

fn details(out: &mut String, summary: &str, lang: &str, body: &str) {
    // A fence longer than any backtick run in the body cannot be closed by it.
    let longest = body.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    let _ = writeln!(out, "\n<details><summary>{summary}</summary>\n\n{fence}{lang}\n{body}\n{fence}\n\n</details>");
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn md_table(header: &[&str], rows: &[Vec<String>]) -> String {
    if rows.is_empty() {
        return "none\n".to_owned();
    }
    let mut out = format!("| {} |\n|{}\n", header.join(" | "), "---|".repeat(header.len()));
    for r in rows {
        let _ = writeln!(out, "| {} |", r.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_values_overlapping_and_adjacent() {
        let r = Redactor::new(vec![Value::new("abab".to_owned()), Value::new("xyz".to_owned())]);
        assert_eq!(r.text("1 ababab 2"), "1 [redacted] 2");
        assert_eq!(r.text("ababxyz!"), "[redacted]!");
        assert_eq!(r.text("nothing here"), "nothing here");
        // A value that is a word of the replacement does not eat it.
        let r = Redactor::new(vec![Value::new("red".to_owned()), Value::new("acted".to_owned())]);
        assert_eq!(r.text("red acted"), "[redacted] [redacted]");
    }

    #[test]
    fn redacts_key_shaped_tokens_only() {
        assert_eq!(redact_keys("auth: Bearer sk-proj-abcdefghij123"), "auth: Bearer [redacted]");
        assert_eq!(redact_keys("token=ghp_aaaaBBBBcccc1234;"), "token=[redacted];");
        assert_eq!(redact_keys("x AbCd1234EfGh5678IjKl9012 y"), "x [redacted] y");
        // Hosts, paths, timestamps, short words and UUIDs stay.
        let keep = "GET api.example.com:443 /home/u/ppp-test-a1b2c3 2026-11-29T10:00:00Z sk- \
                    6f1c3a2e-9b4d-4e8a-a1f0-0c2b3d4e5f60 ünïcode";
        assert_eq!(redact_keys(keep), keep);
    }

    #[test]
    fn probe_timeout_from_env() {
        assert_eq!(probe_timeout(None).unwrap(), DEFAULT_PROBE_TIMEOUT);
        assert_eq!(probe_timeout(Some("".into())).unwrap(), DEFAULT_PROBE_TIMEOUT);
        assert_eq!(probe_timeout(Some("2".into())).unwrap(), Duration::from_secs(2));
        assert_eq!(probe_timeout(Some("0.5".into())).unwrap(), Duration::from_millis(500));
        for bad in ["0", "-1", "soon", "inf", "NaN"] {
            assert!(probe_timeout(Some(bad.into())).is_err(), "{bad}");
        }
    }

    #[test]
    fn log_tail_reads_only_the_end() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("proxy.log");
        let t = log_tail(&p, 3).unwrap();
        assert!(!t.exists && t.lines.is_empty());
        let mut body = "x".repeat(400 * 1024);
        body.push('\n');
        for i in 0..10 {
            let _ = writeln!(body, "line {i}");
        }
        std::fs::write(&p, &body).unwrap();
        let t = log_tail(&p, 3).unwrap();
        assert_eq!(t.lines, ["line 7", "line 8", "line 9"]);
        let t = log_tail(&p, 100).unwrap();
        assert_eq!(t.lines.len(), 10, "the cut first line is dropped");
        // A URL's query is cut: it often carries a credential.
        std::fs::write(&p, "10.0.0.1:5: GET https://198.18.0.10/q?access_token=SEKRET HTTP/2.0\n").unwrap();
        assert_eq!(log_tail(&p, 3).unwrap().lines, ["10.0.0.1:5: GET https://198.18.0.10/q?\u{2026} HTTP/2.0"]);
        // What the guest sent is in proxy.log; never on the terminal as is.
        std::fs::write(&p, "ppp: [red] denied HTTP evil\u{1b}]0;pwned\u{7}\u{202e}.test: blocked\n").unwrap();
        let t = log_tail(&p, 3).unwrap();
        assert!(!t.lines[0].chars().any(crate::output::hides_text) && t.lines[0].contains("pwned"), "{:?}", t.lines);
    }

    #[test]
    fn markdown_fence_outgrows_the_body() {
        let mut out = String::new();
        details(&mut out, "s", "text", "a ``` b");
        assert!(out.contains("\n````text\na ``` b\n````\n"), "{out}");
    }
}

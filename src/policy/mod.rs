//! The network-policy rules engine: resource syntax, rule files, presets and
//! the compiled [`Engine`] that answers "may this sandbox reach this host?".
//!
//! Pure: nothing here spawns processes or talks to the daemon. The only I/O is
//! reading and atomically writing the two policy files ([`file`]) and reading
//! the tail of `flows.jsonl` ([`flowlog`]). Commands build on this module;
//! they never match hosts themselves, so precedence lives in one place.
//!
//! Precedence (spec §5.5): the rules are the global rules followed by the
//! sandbox's rules. A matching deny wins, else a matching allow, else the
//! global default. See `docs/policy.md` for the grammar and the index design.

mod engine;
mod file;
pub mod flowlog;
pub mod follow;
pub mod http;
pub mod limits;
mod preset;
pub mod record;
pub mod replay;
mod resource;
pub mod suggest;
mod target;
mod wildcard;

use serde::{Deserialize, Serialize};
use std::fmt;

pub(crate) use engine::normalize_host;
pub use engine::{Decision, Engine, Flow, HttpDecision, MAX_CHAIN, Matched, Refusal, is_internal, is_name};
pub use file::{
    GlobalFile, SandboxFile, load_global, load_sandbox, parse_global, parse_global_slow, parse_sandbox, save_global,
    save_sandbox,
};
pub use limits::{FlowLimits, Limits};
pub use preset::Preset;
pub use resource::{Resource, ResourceError, ResourceKind};
pub use target::{DEFAULT_PORT, Target};

/// What a rule, or the default, says about a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
    // Only a default, never a rule's: hold the flow until the user answers
    // (`ppp policy approval`), deny when nobody does in time. (A plain
    // comment: a doc comment would become clap's help for the value.)
    Ask,
}

impl Verdict {
    /// The lower-case word used in files, JSON and output.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Ask => "ask",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who put a rule there. `org` from the spec is stubbed and not representable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Added by the user with `ppp policy allow|deny`.
    Local,
    /// Added by a kit.
    Kit,
    /// Seeded by `ppp policy init <preset>`.
    Preset,
    /// Written by `ppp policy approval allow|deny --sandbox|--global`.
    Approval,
}

impl Source {
    /// The lower-case word used in files and output.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Local => "local",
            Source::Kit => "kit",
            Source::Preset => "preset",
            Source::Approval => "approval",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a rule: a network rule decides whether a host may be
/// reached at all; an HTTP rule (ADR 0050) decides methods and paths on a
/// host the network rules allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleType {
    Network,
    Http,
}

impl fmt::Display for RuleType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuleType::Network => "network",
            RuleType::Http => "http",
        })
    }
}

/// Which file a matched rule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Global,
    Sandbox,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Global => "global",
            Scope::Sandbox => "sandbox",
        })
    }
}

/// One rule as stored in a policy file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub id: uuid::Uuid,
    #[serde(deserialize_with = "rule_decision")]
    pub decision: Verdict,
    #[serde(rename = "type")]
    pub kind: RuleType,
    pub resource: Resource,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: time::OffsetDateTime,
    pub source: Source,
    /// Which kit added the rule (`kit:<name>`), for `source: kit` rules:
    /// re-adding the kit replaces exactly these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kit: Option<String>,
    /// Body-size limits for flows this (allow) rule lets through, over the
    /// policy files' ([`limits`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<limits::Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<limits::Size>,
    /// An HTTP rule's methods (`[GET, HEAD]`, or `[ANY]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// An HTTP rule's path glob (`/repos/org/**`), canonical itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `false`: a TLS connection this (allow) rule lets through is spliced
    /// to the upstream as plain TCP, not intercepted (ADR 0051), so the
    /// guest sees the upstream's own certificate and nothing is injected.
    /// Only on allow rules; the files refuse it on a deny rule.
    #[serde(default = "inspected", skip_serializing_if = "is_inspected")]
    pub inspect: bool,
}

/// A rule inspects unless it says `inspect: false`.
fn inspected() -> bool {
    true
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
fn is_inspected(inspect: &bool) -> bool {
    *inspect
}

/// A rule decides; only the default may leave the decision to the user.
fn rule_decision<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Verdict, D::Error> {
    match Verdict::deserialize(d)? {
        Verdict::Ask => Err(serde::de::Error::custom(
            "a rule's decision is `allow` or `deny`; `ask` is only a default (`ppp policy default ask`)",
        )),
        v => Ok(v),
    }
}

impl Rule {
    /// A new network rule with a fresh v4 id, created now.
    #[must_use]
    pub fn new(decision: Verdict, resource: Resource, source: Source) -> Rule {
        // Whole seconds: sub-second digits add noise to a hand-edited file
        // and nothing orders rules by time.
        let now = time::OffsetDateTime::now_utc();
        let created_at = now.replace_nanosecond(0).unwrap_or(now);
        Rule {
            id: uuid::Uuid::new_v4(),
            decision,
            kind: RuleType::Network,
            resource,
            created_at,
            source,
            kit: None,
            upload: None,
            download: None,
            methods: None,
            path: None,
            inspect: true,
        }
    }

    /// A new HTTP rule (ADR 0050): `methods` on paths matching `path` of the
    /// hosts `resource` names. Checked as a file's rule is ([`Rule::check`]).
    pub fn new_http(
        decision: Verdict,
        resource: Resource,
        methods: Vec<String>,
        path: String,
        source: Source,
    ) -> Result<Rule, String> {
        let mut r = Rule::new(decision, resource, source);
        r.kind = RuleType::Http;
        r.methods = Some(methods);
        r.path = Some(path);
        r.check()?;
        Ok(r)
    }

    /// What serde cannot check field by field: an HTTP rule has a host
    /// pattern (no address, range or regex: the host is the name that
    /// SNI, Host and target agreed on), methods and a canonical path; a
    /// network rule has neither. The error names the field.
    pub fn check(&self) -> Result<(), String> {
        match self.kind {
            RuleType::Network => {
                if self.methods.is_some() {
                    return Err("field `methods`: only an HTTP rule (`type: http`) has methods".to_owned());
                }
                if self.path.is_some() {
                    return Err("field `path`: only an HTTP rule (`type: http`) has a path".to_owned());
                }
            }
            RuleType::Http => {
                if !matches!(
                    self.resource.kind(),
                    ResourceKind::Host | ResourceKind::Wildcard | ResourceKind::Glob | ResourceKind::Any
                ) {
                    return Err(format!(
                        "field `resource`: `{}` is not a host pattern; an HTTP rule names hosts (no address, range or regex)",
                        self.resource
                    ));
                }
                let Some(methods) = &self.methods else {
                    return Err("field `methods`: an HTTP rule needs methods (`[GET, HEAD]`, or `[ANY]`)".to_owned());
                };
                http::check_methods(methods).map_err(|e| format!("field `methods`: {e}"))?;
                let Some(path) = &self.path else {
                    return Err("field `path`: an HTTP rule needs a path (`/repos/org/**`)".to_owned());
                };
                http::check_rule_path(path).map_err(|e| format!("field `path`: {e}"))?;
                if self.upload.is_some() || self.download.is_some() {
                    return Err("field `upload`/`download`: limits belong on the network rule".to_owned());
                }
                if !self.inspect {
                    // Its requests are what it decides: a spliced connection
                    // has none ppp could read (ADR 0050, 0051).
                    return Err("field `inspect`: an HTTP rule decides on requests, so its connections are inspected"
                        .to_owned());
                }
            }
        }
        Ok(())
    }

    /// The limits this rule sets.
    #[must_use]
    pub fn limits(&self) -> Limits {
        Limits { upload: self.upload, download: self.download }
    }
}

/// The rule id flows.jsonl records for a flow a learning sandbox made that
/// no rule decided (ADR 0048).
pub const LEARNED: &str = "learned";

/// The policy default when `policies.yaml` does not exist: fail closed
/// (ADR 0005).
pub const DEFAULT_WITHOUT_FILE: Verdict = Verdict::Deny;

/// How long a request held by an `ask` default waits for the user, when the
/// global file does not say: long enough to read a notification and answer,
/// short enough that an agent's client has not given up yet.
pub const APPROVAL_TIMEOUT: u32 = 60;

/// Build the engine from the global file (absent: deny by default) and every
/// sandbox directory's `policy.yaml`.
pub fn load_engine(dirs: &crate::dirs::Dirs) -> anyhow::Result<Engine> {
    let (global, sandboxes) = load_files(dirs)?;
    engine_from(global, sandboxes)
}

/// The global file, if any, and each sandbox's by name.
pub type Files = (Option<GlobalFile>, Vec<(String, SandboxFile)>);

/// The policy files as they are on disk: the global one (if any) and every
/// sandbox's that exists.
pub fn load_files(dirs: &crate::dirs::Dirs) -> anyhow::Result<Files> {
    use anyhow::Context as _;
    let global = load_global(&dirs.global_policy())?;
    let mut sandboxes = Vec::new();
    let root = dirs.sandboxes();
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((global, sandboxes)),
        Err(e) => return Err(e).with_context(|| format!("could not list `{}`", root.display())),
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("could not list `{}`", root.display()))?;
        // Sandbox names are ASCII by validation; anything else is not ppp's.
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Some(f) = load_sandbox(&dirs.sandbox_policy(&name))? {
            sandboxes.push((name, f));
        }
    }
    // Directory order is the file system's; the engine does not care, but
    // a deterministic order keeps errors and output stable.
    sandboxes.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((global, sandboxes))
}

/// The sandboxes whose file says `learn: true` (ADR 0048), by name.
pub fn learning(dirs: &crate::dirs::Dirs) -> anyhow::Result<Vec<String>> {
    let (_, files) = load_files(dirs)?;
    Ok(files.into_iter().filter(|(_, f)| f.learn).map(|(n, _)| n).collect())
}

/// The engine for these files: what [`load_engine`] builds from disk, and
/// what `ppp policy replay` builds with a candidate in place of one file.
pub fn engine_from(global: Option<GlobalFile>, files: Vec<(String, SandboxFile)>) -> anyhow::Result<Engine> {
    let (default, global, global_limits, timeout) = match global {
        Some(f) => {
            let limits = f.limits();
            (f.default, f.rules, limits, f.approval_timeout)
        }
        None => (DEFAULT_WITHOUT_FILE, Vec::new(), Limits::default(), None),
    };
    let mut sandboxes = Vec::new();
    let mut limits = Vec::new();
    let mut defaults = Vec::new();
    let mut learning = Vec::new();
    for (name, f) in files {
        if !f.limits().is_empty() {
            limits.push((name.clone(), f.limits()));
        }
        if let Some(d) = f.default {
            defaults.push((name.clone(), d));
        }
        if f.learn {
            learning.push(name.clone());
        }
        sandboxes.push((name, f.rules));
    }
    Ok(Engine::build(default, global, sandboxes)?
        .with_limits(global_limits, limits)
        .with_defaults(defaults, timeout)
        .with_learning(learning))
}

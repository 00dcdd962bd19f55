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
mod preset;
mod resource;
mod target;

use serde::{Deserialize, Serialize};
use std::fmt;

pub use engine::{Decision, Engine, Matched};
pub use file::{
    GlobalFile, SandboxFile, load_global, load_sandbox, parse_global, parse_global_slow, parse_sandbox, save_global,
    save_sandbox,
};
pub use preset::Preset;
pub use resource::{Resource, ResourceError, ResourceKind};
pub use target::{DEFAULT_PORT, Target};

/// What a rule, or the default, says about a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
}

impl Verdict {
    /// The lower-case word used in files, JSON and output.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
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
}

impl Source {
    /// The lower-case word used in files and output.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Local => "local",
            Source::Kit => "kit",
            Source::Preset => "preset",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a rule. Only network rules exist in v1; the field is kept in
/// the file so filesystem rules can be added without a format change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleType {
    Network,
}

impl fmt::Display for RuleType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("network")
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
    pub decision: Verdict,
    #[serde(rename = "type")]
    pub kind: RuleType,
    pub resource: Resource,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: time::OffsetDateTime,
    pub source: Source,
}

impl Rule {
    /// A new network rule with a fresh v4 id, created now.
    #[must_use]
    pub fn new(decision: Verdict, resource: Resource, source: Source) -> Rule {
        // Whole seconds: sub-second digits add noise to a hand-edited file
        // and nothing orders rules by time.
        let now = time::OffsetDateTime::now_utc();
        let created_at = now.replace_nanosecond(0).unwrap_or(now);
        Rule { id: uuid::Uuid::new_v4(), decision, kind: RuleType::Network, resource, created_at, source }
    }
}

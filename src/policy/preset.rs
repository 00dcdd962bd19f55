//! The three starting points for `ppp policy init`, and the one table of
//! hosts the `balanced` preset allows. Changing what `balanced` allows means
//! editing [`BALANCED`] and nothing else.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Resource, Rule, Source, Verdict};

/// A named starting policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// Default allow, no rules.
    AllowAll,
    /// Default deny; allow LLM APIs, package registries, code hosts and OS mirrors.
    Balanced,
    /// Default deny, no rules.
    DenyAll,
}

/// What `balanced` allows, grouped by why. Resources are checked by a test,
/// so a typo fails the build's tests rather than a user's `ppp policy init`.
pub(crate) const BALANCED: &[(&str, &[&str])] = &[
    (
        "LLM APIs",
        &[
            "api.anthropic.com",
            "api.openai.com",
            "generativelanguage.googleapis.com",
            "api.groq.com",
            "api.mistral.ai",
            "openrouter.ai",
            "api.x.ai",
            "api.studio.nebius.com",
            "api.studio.nebius.ai",
        ],
    ),
    (
        "package registries",
        &[
            "pypi.org",
            "files.pythonhosted.org",
            "registry.npmjs.org",
            "registry.yarnpkg.com",
            "crates.io",
            "static.crates.io",
            "index.crates.io",
            "proxy.golang.org",
            "sum.golang.org",
            "rubygems.org",
            "index.rubygems.org",
            "repo.maven.apache.org",
            "repo1.maven.org",
        ],
    ),
    ("code hosts", &["github.com", "**.github.com", "*.githubusercontent.com", "gitlab.com", "bitbucket.org"]),
    // The VM fetches images through the proxy: the base image of ppp's own
    // agent images is on Docker Hub (podman's default for short names too),
    // and ghcr.io serves blobs from pkg-containers.githubusercontent.com,
    // a code host above. Nothing publishes ppp's agent images: ppp builds
    // them (docs/images.md).
    (
        "container registries",
        &["ghcr.io", "registry-1.docker.io", "auth.docker.io", "production.cloudflare.docker.com"],
    ),
    (
        "OS mirrors",
        &[
            "deb.debian.org",
            "security.debian.org",
            "archive.ubuntu.com",
            "security.ubuntu.com",
            "ports.ubuntu.com",
            "dl-cdn.alpinelinux.org",
            "mirrors.fedoraproject.org",
            "download.fedoraproject.org",
        ],
    ),
];

impl Preset {
    /// The verdict when no rule matches.
    #[must_use]
    pub fn default_verdict(self) -> Verdict {
        match self {
            Preset::AllowAll => Verdict::Allow,
            Preset::Balanced | Preset::DenyAll => Verdict::Deny,
        }
    }

    /// The preset's rules, with fresh ids, `source: preset`.
    #[must_use]
    pub fn rules(self) -> Vec<Rule> {
        match self {
            Preset::AllowAll | Preset::DenyAll => Vec::new(),
            Preset::Balanced => BALANCED
                .iter()
                .flat_map(|(_, hosts)| hosts.iter())
                .map(|h| {
                    let r = Resource::parse(h).expect("BALANCED holds valid resources");
                    Rule::new(Verdict::Allow, r, Source::Preset)
                })
                .collect(),
        }
    }

    /// The kebab-case name used on the command line and in files.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::AllowAll => "allow-all",
            Preset::Balanced => "balanced",
            Preset::DenyAll => "deny-all",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Engine;
    use clap::ValueEnum;

    #[test]
    fn names() {
        for (p, name) in
            [(Preset::AllowAll, "allow-all"), (Preset::Balanced, "balanced"), (Preset::DenyAll, "deny-all")]
        {
            assert_eq!(p.to_string(), name);
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{name}\""));
            assert_eq!(Preset::from_str(name, false).unwrap(), p);
        }
    }

    #[test]
    fn defaults_and_rules() {
        assert_eq!(Preset::AllowAll.default_verdict(), Verdict::Allow);
        assert_eq!(Preset::DenyAll.default_verdict(), Verdict::Deny);
        assert_eq!(Preset::Balanced.default_verdict(), Verdict::Deny);
        assert!(Preset::AllowAll.rules().is_empty());
        assert!(Preset::DenyAll.rules().is_empty());
        let rules = Preset::Balanced.rules();
        assert!(rules.iter().all(|r| r.decision == Verdict::Allow && r.source == Source::Preset));
        let mut ids: Vec<_> = rules.iter().map(|r| r.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), rules.len());
        let mut resources: Vec<_> = rules.iter().map(|r| r.resource.to_string()).collect();
        resources.sort();
        let n = resources.len();
        resources.dedup();
        assert_eq!(resources.len(), n, "no duplicates in BALANCED");
    }

    #[test]
    fn balanced_allows_the_usual_suspects() {
        let p = Preset::Balanced;
        let e = Engine::build(p.default_verdict(), p.rules(), vec![]).unwrap();
        let allowed = [
            "api.anthropic.com",
            "api.openai.com",
            "generativelanguage.googleapis.com",
            "files.pythonhosted.org",
            "static.crates.io",
            "github.com",
            "codeload.github.com",
            "objects.githubusercontent.com",
            "deb.debian.org",
            "ghcr.io",
            "pkg-containers.githubusercontent.com",
            "registry-1.docker.io",
        ];
        for h in allowed {
            assert_eq!(e.decide(None, Some(h), None, 443).verdict, Verdict::Allow, "{h}");
        }
        for h in ["example.com", "evil-github.com", "a.b.githubusercontent.com", "169.254.169.254"] {
            assert_eq!(e.decide(None, Some(h), None, 443).verdict, Verdict::Deny, "{h}");
        }
    }
}

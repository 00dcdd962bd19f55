//! The agent registry: which agents ppp can run, in which image, with which
//! command, and which API-key variables they get placeholders for.
//!
//! A placeholder (`ppp-proxy-managed`) is what the agent's CLI sees in its
//! key variable, so it starts; the proxy swaps in the real key on the way
//! out. Real keys never enter the sandbox.

use anyhow::Result;

use crate::error::fail;

/// What an agent's key variables are set to inside the sandbox.
pub const PLACEHOLDER: &str = "ppp-proxy-managed";

/// One agent ppp knows how to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agent {
    /// The name users type: `ppp run opencode .`.
    pub name: &'static str,
    /// The command run in the container; agent arguments follow it.
    pub command: &'static [&'static str],
    /// Variables set to [`PLACEHOLDER`] so the CLI finds "a key".
    pub key_vars: &'static [&'static str],
    /// Other variables the container gets.
    pub env: &'static [(&'static str, &'static str)],
    /// The template tag `ppp template save` suggests for this agent.
    pub template_tag: &'static str,
    /// The Containerfile its image is built from, under `assets/`.
    pub containerfile: &'static str,
}

/// Every agent, in the order help texts list them.
pub const AGENTS: &[Agent] = &[
    Agent {
        name: "opencode",
        command: &["opencode"],
        // opencode talks to many providers; each gets a placeholder so
        // whichever the user configured starts.
        key_vars: &["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENROUTER_API_KEY"],
        env: &[("OPENCODE_SANDBOX", "1")],
        template_tag: "opencode-default",
        containerfile: "opencode.Containerfile",
    },
    Agent {
        name: "claude",
        command: &["claude"],
        key_vars: &["ANTHROPIC_API_KEY"],
        env: &[("DISABLE_AUTOUPDATER", "1")],
        template_tag: "claude-default",
        containerfile: "claude.Containerfile",
    },
    Agent {
        name: "codex",
        command: &["codex"],
        key_vars: &["OPENAI_API_KEY"],
        env: &[],
        template_tag: "codex-default",
        containerfile: "codex.Containerfile",
    },
    Agent {
        name: "gemini",
        command: &["gemini"],
        key_vars: &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        env: &[],
        template_tag: "gemini-default",
        containerfile: "gemini.Containerfile",
    },
];

/// The agent called `name`, or an error listing the known ones.
pub fn find(name: &str) -> Result<&'static Agent> {
    AGENTS.iter().find(|a| a.name == name).ok_or_else(|| {
        let known: Vec<&str> = AGENTS.iter().map(|a| a.name).collect();
        fail(format!("unknown agent `{name}`"))
            .hint(format!("ppp runs these agents: {}", known.join(", ")))
            .code(2)
            .into()
    })
}

impl Agent {
    /// The image the user named in `PPP_<AGENT>_IMAGE` (a mirror, or their
    /// own build), which wins over the one ppp builds; `None` when unset.
    pub fn image_override(&self, var: impl Fn(&str) -> Option<String>) -> Option<String> {
        var(&self.image_var()).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
    }

    /// `PPP_OPENCODE_IMAGE` for opencode.
    pub fn image_var(&self) -> String {
        format!("PPP_{}_IMAGE", self.name.to_ascii_uppercase())
    }

    /// `PPP_OPENCODE_CONTAINERFILE` for opencode: a Containerfile ppp
    /// builds the agent's image from instead of its embedded one.
    pub fn containerfile_var(&self) -> String {
        format!("PPP_{}_CONTAINERFILE", self.name.to_ascii_uppercase())
    }

    /// The Containerfile ppp embeds for this agent (`assets/<agent>.Containerfile`).
    pub fn embedded_containerfile(&self) -> Vec<u8> {
        crate::assets::get(self.containerfile).unwrap_or_default()
    }

    /// The container's environment: placeholders for the agent's key
    /// variables and for `extra` (custom secrets' variables), then its own
    /// settings. Sorted by name, so the podman command line is stable.
    pub fn container_env(&self, extra: &[(String, String)]) -> Vec<(String, String)> {
        let mut env: std::collections::BTreeMap<String, String> =
            self.key_vars.iter().map(|k| ((*k).to_owned(), PLACEHOLDER.to_owned())).collect();
        env.extend(extra.iter().cloned());
        env.extend(self.env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        env.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_complete() {
        let names: Vec<&str> = AGENTS.iter().map(|a| a.name).collect();
        assert_eq!(names, ["opencode", "claude", "codex", "gemini"]);
        for a in AGENTS {
            assert!(!a.command.is_empty() && !a.key_vars.is_empty(), "{}", a.name);
            assert!(crate::assets::get(a.containerfile).is_some(), "{} is embedded", a.containerfile);
        }
        let err = find("copilot").unwrap_err().to_string();
        assert!(err.contains("unknown agent `copilot`"), "{err}");
    }

    /// The images cannot be built here (no container registry), so their
    /// recipes are checked for what ppp relies on.
    #[test]
    fn containerfiles_have_what_the_sandbox_needs() {
        for a in AGENTS {
            let text = String::from_utf8(crate::assets::get(a.containerfile).unwrap()).unwrap();
            for needed in
                ["git", "openssh-client", "ca-certificates", "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt"]
            {
                assert!(text.contains(needed), "{}: {needed}", a.containerfile);
            }
            let user = text.lines().rev().find_map(|l| l.strip_prefix("USER ")).unwrap_or("root");
            assert!(user != "root" && user != "0", "{} runs as {user}", a.containerfile);
            let code: String = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
            assert!(!code.contains("sudo"), "{} installs no sudo", a.containerfile);
            let cmd = format!("CMD [\"{}\"]", a.command[0]);
            assert!(text.contains(&cmd), "{}: {cmd}", a.containerfile);
        }
    }

    #[test]
    fn image_override_and_env() {
        let oc = find("opencode").unwrap();
        assert_eq!(oc.image_var(), "PPP_OPENCODE_IMAGE");
        assert_eq!(oc.containerfile_var(), "PPP_OPENCODE_CONTAINERFILE");
        assert_eq!(oc.image_override(|_| None), None);
        assert_eq!(oc.image_override(|_| Some("  ".into())), None, "blank is unset");
        assert_eq!(
            oc.image_override(|k| (k == "PPP_OPENCODE_IMAGE").then(|| "localhost/oc:dev".to_owned())).as_deref(),
            Some("localhost/oc:dev")
        );
        let env = find("claude").unwrap().container_env(&[("JIRA_TOKEN".into(), "PPP_JIRA".into())]);
        assert_eq!(
            env,
            [
                ("ANTHROPIC_API_KEY".to_owned(), PLACEHOLDER.to_owned()),
                ("DISABLE_AUTOUPDATER".to_owned(), "1".to_owned()),
                ("JIRA_TOKEN".to_owned(), "PPP_JIRA".to_owned()),
            ]
        );
    }
}

//! Podman as data: functions that build `podman …` invocations and parse
//! what podman prints. Nothing here spawns a process; `exec` does that.
//!
//! The binary is `$PPP_PODMAN` if set, else `podman` on PATH.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::env;
use crate::exec::{self, Invocation};

/// `machine list` can be slow while a VM boots; never hang `ppp ls` on it.
const LIST_TIMEOUT: Duration = Duration::from_secs(20);

/// The podman binary, if one can be found.
pub fn program() -> Option<PathBuf> {
    exec::resolve_program(env::PPP_PODMAN, "podman")
}

/// `podman machine list --format json`.
pub fn machine_list(program: PathBuf) -> Invocation {
    Invocation::new(program).args(["machine", "list", "--format", "json"]).timeout(LIST_TIMEOUT)
}

/// `podman --version`.
pub fn version(program: PathBuf) -> Invocation {
    Invocation::new(program).arg("--version").timeout(Duration::from_secs(10))
}

/// One row of `podman machine list --format json`. Podman emits more
/// fields; only the ones ppp reads are here, and all are optional except the
/// name so a newer podman that drops one does not break `ppp ls`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Machine {
    pub name: String,
    #[serde(default)]
    pub running: bool,
    #[serde(default)]
    pub starting: bool,
    #[serde(default, rename = "VMType")]
    pub vm_type: Option<String>,
    #[serde(default, rename = "LastUp")]
    pub last_up: Option<String>,
}

impl Machine {
    /// The state word ppp shows for this machine.
    pub fn state(&self) -> &'static str {
        if self.running {
            "running"
        } else if self.starting {
            "starting"
        } else {
            "stopped"
        }
    }
}

/// Parse `machine list --format json`. Podman marks the default machine
/// with a trailing `*` in some versions; strip it.
pub fn parse_machine_list(json: &str) -> Result<Vec<Machine>, serde_json::Error> {
    let trimmed = json.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let mut machines: Vec<Machine> = serde_json::from_str(trimmed)?;
    for m in &mut machines {
        if let Some(stripped) = m.name.strip_suffix('*') {
            m.name = stripped.to_owned();
        }
    }
    Ok(machines)
}

/// Pull the version number out of `podman version 5.8.1`.
pub fn parse_version(text: &str) -> Option<String> {
    text.split_whitespace().last().filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit())).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_list_invocation() {
        let inv = machine_list("/usr/bin/podman".into());
        assert_eq!(inv.to_string(), "podman machine list --format json");
    }

    #[test]
    fn parses_machine_list() {
        let json = r#"[{"Name":"podman-machine-default*","Default":true,"Running":false,"Starting":false,"VMType":"qemu","CPUs":2},
                       {"Name":"ppp-red-fox","Running":true,"LastUp":"Currently running","VMType":"applehv"}]"#;
        let ms = parse_machine_list(json).unwrap();
        assert_eq!(ms[0].name, "podman-machine-default");
        assert_eq!(ms[0].state(), "stopped");
        assert_eq!(ms[1].state(), "running");
        assert!(parse_machine_list("").unwrap().is_empty());
        assert!(parse_machine_list("not json").is_err());
    }

    #[test]
    fn parses_version() {
        assert_eq!(parse_version("podman version 5.8.1\n").as_deref(), Some("5.8.1"));
        assert_eq!(parse_version("garbage"), None);
    }
}

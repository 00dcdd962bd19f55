//! `$PPP_CONFIG/config.yaml`: settings that outlive one command: the log
//! levels of ppp itself ("general") and of mitmdump ("proxy"), and where
//! mitmdump's WireGuard servers listen.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::dirs::Dirs;
use crate::state;

/// The whole file. Unknown keys are refused so a typo is reported with its
/// line instead of being ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub log: Levels,
    #[serde(default, skip_serializing_if = "Wireguard::is_default")]
    pub wireguard: Wireguard,
    #[serde(default, skip_serializing_if = "WorkspaceGuard::is_default")]
    pub workspace: WorkspaceGuard,
    #[serde(default, skip_serializing_if = "Sandboxes::is_default")]
    pub sandboxes: Sandboxes,
}

/// Bounds on sandboxes as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sandboxes {
    /// The most sandboxes that may run at once; a start past it is refused
    /// (`run`, `create`). Unset, only the host's memory bounds them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
}

impl Sandboxes {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `workspace:`: the guard over the files in a workspace that make code
/// run on the host (ADR 0036). Read when a sandbox's agent starts, and
/// by `ppp stop`, `rm`, `ls` and `diagnose`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceGuard {
    /// Move what the agent created or changed aside instead of only
    /// reporting it, and exit non-zero, as `--strict` does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strict: bool,
    /// More paths, relative to each workspace, to mount read-only when
    /// they exist and to report (or, strict, move aside) when changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protect: Vec<RelPath>,
    /// Sandboxes with no guard: the agent can then plant git hooks, git
    /// configuration and editor tasks that run on this host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unprotected: Vec<String>,
}

impl WorkspaceGuard {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A path inside a workspace: relative, plain names only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RelPath(String);

impl RelPath {
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RelPath {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let trimmed = s.trim_end_matches('/');
        let plain = !trimmed.is_empty()
            && std::path::Path::new(trimmed).components().all(|c| matches!(c, std::path::Component::Normal(_)));
        if plain {
            Ok(RelPath(trimmed.to_owned()))
        } else {
            Err(format!("`{s}` is not a path inside the workspace (relative, no `..`), such as `.husky` or `Makefile`"))
        }
    }
}

impl From<RelPath> for String {
    fn from(p: RelPath) -> String {
        p.0
    }
}

/// Where the guests' WireGuard traffic arrives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wireguard {
    /// The address mitmdump's WireGuard servers bind (`listen_host`). The
    /// default is the host's loopback: Podman Machine's gvproxy delivers a
    /// guest's datagrams to `192.168.127.254` from the host's `127.0.0.1`
    /// (its NAT table maps the host alias to `127.0.0.1`), so nothing else
    /// on the network can reach the servers (ADR 0018). Read when the
    /// daemon starts.
    #[serde(default = "default_listen_host")]
    pub listen_host: IpAddr,
    /// The address the guests send their WireGuard datagrams to
    /// (`endpoint_host`): the host as the VM sees it. Unset, the provider
    /// decides (gvproxy's `192.168.127.254` on every podman provider);
    /// `PPP_ENDPOINT_HOST` wins over it. Read when a sandbox is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_host: Option<IpAddr>,
}

/// The default WireGuard listen address: loopback.
pub const DEFAULT_LISTEN_HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn default_listen_host() -> IpAddr {
    DEFAULT_LISTEN_HOST
}

impl Default for Wireguard {
    fn default() -> Self {
        Self { listen_host: DEFAULT_LISTEN_HOST, endpoint_host: None }
    }
}

impl Wireguard {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// How much a log says. Defined here, where it is stored, rather than in
/// `cli`: the daemon reads it from config.yaml and must not depend on the
/// command line. `ValueEnum` lets `cli` take it as an argument as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// Log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Levels {
    /// mitmdump's event log (`termlog_verbosity`).
    #[serde(default = "default_proxy")]
    pub proxy: LogLevel,
    /// ppp's own diagnostics.
    #[serde(default = "default_general")]
    pub general: LogLevel,
}

fn default_proxy() -> LogLevel {
    LogLevel::Info
}

fn default_general() -> LogLevel {
    LogLevel::Warn
}

impl Default for Levels {
    fn default() -> Self {
        Self { proxy: default_proxy(), general: default_general() }
    }
}

/// Load `config.yaml`; defaults when it does not exist. A malformed file is
/// an error naming its line.
pub fn load(dirs: &Dirs) -> Result<Config> {
    let path = dirs.config_file();
    match state::read_optional(&path)? {
        None => Ok(Config::default()),
        Some(text) if text.trim().is_empty() => Ok(Config::default()),
        Some(text) => Ok(state::parse_yaml(&path, &text)?),
    }
}

/// Write `config.yaml` atomically. The caller holds `state.lock`.
pub fn save(dirs: &Dirs, config: &Config) -> Result<()> {
    state::write_yaml(&dirs.config_file(), config)
}

/// The word mitmproxy's `termlog_verbosity` takes for `level` (it has no
/// `trace`; `debug` is its most verbose).
pub fn mitmproxy_level(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug | LogLevel::Trace => "debug",
    }
}

/// The tracing filter directive for ppp's own log at `level`.
pub fn tracing_directive(level: LogLevel) -> String {
    let word = match level {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
        LogLevel::Trace => "trace",
    };
    format!("ppp={word}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs { config: tmp.path().join("c"), data: tmp.path().join("d"), cache: tmp.path().join("k") };
        assert_eq!(load(&dirs).unwrap(), Config::default());
        std::fs::create_dir_all(&dirs.config).unwrap();
        std::fs::write(dirs.config_file(), "log:\n  proxy: debug\n").unwrap();
        let c = load(&dirs).unwrap();
        assert_eq!((c.log.proxy, c.log.general), (LogLevel::Debug, LogLevel::Warn));
        std::fs::write(dirs.config_file(), "log:\n  proxy: loud\n").unwrap();
        let err = format!("{:#}", load(&dirs).unwrap_err());
        assert!(err.contains("config.yaml` line 2"), "{err}");
        assert_eq!(mitmproxy_level(LogLevel::Trace), "debug");
    }

    #[test]
    fn wireguard_listens_on_loopback_unless_told() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs { config: tmp.path().join("c"), data: tmp.path().join("d"), cache: tmp.path().join("k") };
        assert_eq!(load(&dirs).unwrap().wireguard.listen_host.to_string(), "127.0.0.1");
        std::fs::create_dir_all(&dirs.config).unwrap();
        std::fs::write(dirs.config_file(), "wireguard:\n  listen_host: 192.168.127.254\n").unwrap();
        assert_eq!(load(&dirs).unwrap().wireguard.listen_host.to_string(), "192.168.127.254");
        std::fs::write(dirs.config_file(), "wireguard:\n  endpoint_host: 10.1.2.3\n").unwrap();
        let wg = load(&dirs).unwrap().wireguard;
        assert_eq!(
            (wg.listen_host.to_string(), wg.endpoint_host),
            ("127.0.0.1".into(), Some("10.1.2.3".parse().unwrap()))
        );
        std::fs::write(dirs.config_file(), "wireguard:\n  listen_host: everywhere\n").unwrap();
        let err = format!("{:#}", load(&dirs).unwrap_err());
        assert!(err.contains("config.yaml` line 2"), "{err}");
        // Saving the defaults does not write the section.
        save(&dirs, &Config::default()).unwrap();
        assert!(!std::fs::read_to_string(dirs.config_file()).unwrap().contains("wireguard"));
    }

    #[test]
    fn workspace_guard_paths_are_inside_the_workspace() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs { config: tmp.path().join("c"), data: tmp.path().join("d"), cache: tmp.path().join("k") };
        std::fs::create_dir_all(&dirs.config).unwrap();
        std::fs::write(
            dirs.config_file(),
            "workspace:\n  strict: true\n  protect: [.husky/, Makefile]\n  unprotected: [scratch]\n",
        )
        .unwrap();
        let w = load(&dirs).unwrap().workspace;
        assert!(w.strict);
        assert_eq!(w.protect.iter().map(RelPath::as_str).collect::<Vec<_>>(), [".husky", "Makefile"]);
        assert_eq!(w.unprotected, ["scratch"]);
        for bad in ["/etc/passwd", "../up", "a/../../b", "''"] {
            std::fs::write(dirs.config_file(), format!("workspace:\n  protect:\n    - {bad}\n")).unwrap();
            let err = format!("{:#}", load(&dirs).unwrap_err());
            assert!(err.contains("config.yaml` line 3") && err.contains("not a path inside"), "{bad}: {err}");
        }
    }
}

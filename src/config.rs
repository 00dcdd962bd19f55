//! `$PPP_CONFIG/config.yaml`: settings that outlive one command, today the
//! log levels of ppp itself ("general") and of mitmdump ("proxy").

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::cli::LogLevel;
use crate::dirs::Dirs;
use crate::state;

/// The whole file. Unknown keys are refused so a typo is reported with its
/// line instead of being ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub log: Levels,
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
}

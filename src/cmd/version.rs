//! `ppp version`: ppp's own version and git revision, the podman and
//! mitmdump it would drive, and the host platform and machine provider.
//! Each probe has a timeout, so a hung podman cannot hang `ppp version`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use super::Ctx;
use crate::cli::VersionArgs;
use crate::exec::{self, Invocation};
use crate::{env, podman};

/// A tool ppp drives, as found on this host.
#[derive(Debug, Serialize)]
pub struct Tool {
    pub path: PathBuf,
    /// `None` when the tool was found but its version could not be read.
    pub version: Option<String>,
}

/// Everything `ppp version` reports.
#[derive(Debug, Serialize)]
pub struct Report {
    pub ppp: &'static str,
    /// The git revision ppp was built from, or `unknown`.
    pub revision: &'static str,
    pub podman: Option<Tool>,
    pub mitmdump: Option<Tool>,
    pub platform: Platform,
    pub provider: String,
}

/// Host OS and CPU architecture.
#[derive(Debug, Serialize)]
pub struct Platform {
    pub os: &'static str,
    pub arch: &'static str,
}

/// Run `ppp version`.
pub fn run(args: &VersionArgs, ctx: &Ctx) -> Result<ExitCode> {
    let report = collect(ctx);
    if args.json {
        crate::output::json(&report)?;
    } else {
        crate::output::print(&render(&report))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Probe the tools. podman and mitmdump are asked in parallel: mitmdump's
/// Python start-up dominates and need not add to podman's.
pub fn collect(ctx: &Ctx) -> Report {
    let mitm_path = exec::resolve_program(env::PPP_MITMDUMP, "mitmdump")
        .or_else(|| ctx.dirs().ok().map(crate::dirs::Dirs::venv_mitmdump).filter(|p| p.exists()));
    let mitm = std::thread::spawn(move || {
        mitm_path.map(|path| {
            let inv = Invocation::new(&path).arg("--version").timeout(Duration::from_secs(30));
            let version = exec::run(&inv).ok().and_then(|o| parse_mitmdump_version(&o.stdout));
            Tool { path, version }
        })
    });
    let podman = podman::program().map(|path| {
        let version = exec::run(&podman::version(path.clone())).ok().and_then(|o| podman::parse_version(&o.stdout));
        Tool { path, version }
    });
    let mitmdump = mitm.join().unwrap_or(None);
    let provider = provider(
        std::env::consts::OS,
        std::env::var("CONTAINERS_MACHINE_PROVIDER").ok().as_deref(),
        podman.as_ref().and_then(|t| t.version.as_deref()),
    );
    Report {
        ppp: env!("CARGO_PKG_VERSION"),
        revision: crate::versions::GIT_REVISION,
        podman,
        mitmdump,
        platform: Platform { os: std::env::consts::OS, arch: std::env::consts::ARCH },
        provider,
    }
}

/// The Podman Machine provider podman will pick: the
/// `CONTAINERS_MACHINE_PROVIDER` override, else the platform default
/// (macOS moved from applehv to libkrun in podman 6).
pub fn provider(os: &str, over: Option<&str>, podman_version: Option<&str>) -> String {
    if let Some(p) = over.filter(|p| !p.is_empty()) {
        return p.to_lowercase();
    }
    let major = podman_version.and_then(|v| v.split('.').next()?.parse::<u32>().ok());
    match os {
        "macos" if major.is_some_and(|m| m < 6) => "applehv",
        "macos" => "libkrun",
        "windows" => "wsl",
        _ => "qemu",
    }
    .to_owned()
}

/// `Mitmproxy: 12.2.3` → `12.2.3`.
pub fn parse_mitmdump_version(text: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix("Mitmproxy:")).map(|v| v.trim().to_owned())
}

/// The human-readable report.
pub fn render(r: &Report) -> String {
    let tool = |t: &Option<Tool>| match t {
        None => "not found".to_owned(),
        Some(Tool { path, version: Some(v) }) => format!("{v} ({})", path.display()),
        Some(Tool { path, version: None }) => format!("unknown version ({})", path.display()),
    };
    format!(
        "ppp {}\nrevision: {}\npodman:   {}\nmitmdump: {}\nplatform: {}/{}\nprovider: {}\n",
        r.ppp,
        r.revision,
        tool(&r.podman),
        tool(&r.mitmdump),
        r.platform.os,
        r.platform.arch,
        r.provider
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers() {
        assert_eq!(provider("linux", None, None), "qemu");
        assert_eq!(provider("macos", None, Some("5.8.1")), "applehv");
        assert_eq!(provider("macos", None, Some("6.0.1")), "libkrun");
        assert_eq!(provider("windows", None, None), "wsl");
        assert_eq!(provider("windows", Some("HyperV"), None), "hyperv");
    }

    #[test]
    fn mitmdump_version() {
        let out = "Mitmproxy: 12.2.3\nPython:    3.13.0\nOpenSSL:   OpenSSL 3.4\n";
        assert_eq!(parse_mitmdump_version(out).as_deref(), Some("12.2.3"));
    }
}

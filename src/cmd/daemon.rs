//! `ppp daemon …`: start, stop and inspect the proxy daemon. The daemon
//! itself lives in [`crate::proxy::supervisor`]; this module finds
//! mitmdump, detaches, waits for readiness and prints.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use super::Ctx;
use crate::cli::{DaemonCommand, DaemonStartArgs, LogLevelArgs, LogLevelSet, LogTarget};
use crate::config::LogLevel;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::proxy::{mitmdump, supervisor};
use crate::sandbox::PortRegistry;
use crate::{output, policy};

/// How long `start -d` waits for the daemon to be ready, and `stop` for it
/// to be gone. mitmdump's first start imports a lot of Python.
const READY_DEADLINE: Duration = Duration::from_secs(90);
const STOP_DEADLINE: Duration = Duration::from_secs(30);

/// Run `ppp daemon …`.
pub fn run(cmd: &DaemonCommand, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    match cmd {
        DaemonCommand::Start(a) => start(dirs, a, ctx),
        DaemonCommand::Stop => stop(dirs),
        DaemonCommand::Status(a) => status(dirs, a.json),
        DaemonCommand::LogLevel(a) => log_level(dirs, a),
    }
}

fn start(dirs: &Dirs, args: &DaemonStartArgs, ctx: &Ctx) -> Result<ExitCode> {
    if let Some(preset) = args.policy
        && policy::load_global(&dirs.global_policy())?.is_none()
    {
        let _lock = crate::state::Lock::acquire(&dirs.state_lock())?;
        if policy::load_global(&dirs.global_policy())?.is_none() {
            policy::save_global(&dirs.global_policy(), &policy::GlobalFile::from_preset(preset))?;
            eprintln!("created the global policy from preset `{preset}`");
        }
    }
    if supervisor::is_running(dirs)? {
        let pid = supervisor::load_record(dirs)?.map_or_else(|| "?".to_owned(), |r| r.pid.to_string());
        output::println(&format!("the ppp daemon is already running (pid {pid})"))?;
        return Ok(ExitCode::SUCCESS);
    }
    // Each message from ensure() starts the next step of the venv install.
    let mut steps = ctx.progress().sequence();
    let mitm = mitmdump::ensure(dirs, |msg| steps.next(msg))?;
    steps.finish();
    if args.detach {
        return start_detached(dirs);
    }
    eprintln!("ppp daemon running in the foreground (pid {}); Ctrl-C stops it", std::process::id());
    let opts = supervisor::Options { mitmdump: mitm, addon: crate::assets::addon() };
    if !supervisor::run(dirs, &opts)? {
        output::println("the ppp daemon is already running")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Re-run `ppp daemon start` in the background and wait until it serves.
fn start_detached(dirs: &Dirs) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("could not locate the ppp executable")?;
    crate::state::create_private_dir(&dirs.data)?;
    let log_path = dirs.daemon_log();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("could not open `{}`", log_path.display()))?;
    // Where this start's own lines begin in the log, to lift its error.
    let offset = log.metadata().map_or(0, |m| m.len());
    let mut child = exec::spawn_detached(&Invocation::new(exe).args(["daemon", "start"]), &log)?;
    let deadline = Instant::now() + READY_DEADLINE;
    // The daemon to wait for: ours, unless another start won the race for
    // the lock (ours then exits 0 at once) and that one is the daemon.
    let mut pid = Some(child.id());
    loop {
        if pid.is_some()
            && let Some(status) = child.try_wait()?
        {
            if !(status.success() && supervisor::is_running(dirs)?) {
                let what = format!("the daemon exited during start-up ({status})");
                let see = format!("see `{}` and `{}`", log_path.display(), dirs.proxy_log().display());
                // The child's own error (with its cause and hint) is in the
                // log; it is what the user needs, not just that it exited.
                return Err(match crate::error::from_rendered(&log_since(&log_path, offset), &see) {
                    Some(e) => e.context(what),
                    None => fail(what).hint(see).into(),
                });
            }
            pid = None;
        }
        if let Some(rec) = ready(dirs, pid)? {
            output::println(&format!(
                "ppp daemon started (pid {}, mitmdump pid {}, WireGuard ports {})",
                rec.pid,
                rec.mitmdump_pid.unwrap_or(0),
                ports_text(&rec.ports)
            ))?;
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() > deadline {
            return Err(fail(format!("the daemon was not ready within {} s", READY_DEADLINE.as_secs()))
                .hint(format!("see `{}`", dirs.proxy_log().display()))
                .into());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// What `path` gained past `offset`, at most its last 64 KiB.
fn log_since(path: &std::path::Path, offset: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map_or(0, |m| m.len());
    let from = offset.max(len.saturating_sub(64 * 1024));
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_ok() {
        let _ = f.take(64 * 1024).read_to_end(&mut buf);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// The record of the daemon `pid` (any running daemon for `None`) once
/// its mitmdump runs, every client config is captured and the socket
/// answers. A record left by an earlier daemon never counts.
fn ready(dirs: &Dirs, pid: Option<u32>) -> Result<Option<supervisor::Record>> {
    let Some(rec) = supervisor::load_record(dirs)? else { return Ok(None) };
    let ours = match pid {
        Some(p) => rec.pid == p,
        None => supervisor::is_running(dirs)?,
    };
    if !ours || !rec.ready || rec.mitmdump_pid.is_none() {
        return Ok(None);
    }
    let socket_up = std::os::unix::net::UnixStream::connect(dirs.secret_socket()).is_ok();
    Ok(socket_up.then_some(rec))
}

fn ports_text(ports: &[u16]) -> String {
    ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
}

/// `daemon log-level [TARGET] [LEVEL]` and `daemon log-level set TARGET LEVEL`.
fn log_level(dirs: &Dirs, args: &LogLevelArgs) -> Result<ExitCode> {
    let (target, level) = match &args.set {
        Some(LogLevelSet::Set { target, level }) => (*target, Some(*level)),
        None => (args.target, args.level),
    };
    let Some(level) = level else {
        let c = crate::config::load(dirs)?;
        let word = |l: LogLevel| serde_json::to_value(l).ok().and_then(|v| v.as_str().map(str::to_owned));
        let mut text = String::new();
        if target != LogTarget::General {
            let _ = writeln!(text, "proxy:   {}", word(c.log.proxy).unwrap_or_default());
        }
        if target != LogTarget::Proxy {
            let _ = writeln!(text, "general: {}", word(c.log.general).unwrap_or_default());
        }
        output::print(&text)?;
        return Ok(ExitCode::SUCCESS);
    };
    let proxy_changes = {
        let _lock = crate::state::Lock::acquire(&dirs.state_lock())?;
        let mut c = crate::config::load(dirs)?;
        let before = c.log.proxy;
        if target != LogTarget::General {
            c.log.proxy = level;
        }
        if target != LogTarget::Proxy {
            c.log.general = level;
        }
        crate::config::save(dirs, &c)?;
        c.log.proxy != before
    };
    let applied = if supervisor::is_running(dirs)? {
        let rec = supervisor::load_record(dirs)?;
        match rec.and_then(|r| i32::try_from(r.pid).ok()) {
            Some(pid) => {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGHUP)
                    .with_context(|| format!("could not signal the daemon (pid {pid})"))?;
                if proxy_changes {
                    // mitmdump reads its verbosity only at start.
                    "; the running daemon restarts mitmdump to apply it: open connections are cut, \
                     and each sandbox's tunnel is back within about 20 s"
                } else {
                    "; the running daemon applies it now"
                }
            }
            None => "; it applies when the daemon next starts",
        }
    } else {
        "; it applies when the daemon next starts"
    };
    let what = match target {
        LogTarget::Proxy => "proxy log level",
        LogTarget::General => "general log level",
        LogTarget::All => "log levels",
    };
    let word = serde_json::to_value(level)?.as_str().unwrap_or_default().to_owned();
    output::println(&format!("{what} set to {word}{applied}"))?;
    Ok(ExitCode::SUCCESS)
}

fn stop(dirs: &Dirs) -> Result<ExitCode> {
    match supervisor::stop(dirs, STOP_DEADLINE)? {
        supervisor::Stopped::Nothing => output::println("the ppp daemon is not running")?,
        supervisor::Stopped::Orphan(pid) => output::println(&format!(
            "the ppp daemon was not running; stopped the mitmdump it left behind (pid {pid}), its ports are free"
        ))?,
        supervisor::Stopped::Daemon(rec) => {
            output::println(&format!("ppp daemon stopped; ports {} are free", ports_text(&rec.ports)))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `daemon status` reports (its `--json` form), also part of
/// `ppp diagnose`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    /// Whether a daemon holds `daemon.lock`.
    pub running: bool,
    pub pid: Option<u32>,
    pub mitmdump_pid: Option<u32>,
    pub mitmdump_alive: bool,
    /// The WireGuard ports the running mitmdump listens on.
    pub ports: Vec<u16>,
    /// Every sandbox in the port registry and its tunnel.
    pub sandboxes: Vec<SandboxPort>,
    pub started_at: Option<String>,
    pub restarts: u32,
    pub last_restart: Option<String>,
    pub last_log_line: Option<String>,
    /// With no daemon running: a mitmdump a dead daemon left behind, still
    /// serving its ports (`daemon stop` stops it).
    pub orphan_mitmdump_pid: Option<u32>,
}

/// A sandbox's pool port as the daemon sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxPort {
    pub name: String,
    pub port: u16,
    /// Whether the running mitmdump has a WireGuard server on the port.
    pub listening: bool,
    /// Whether the tunnel carried a connection lately.
    pub tunnel: Tunnel,
    /// When the tunnel last carried a connection (RFC 3339), if ever in
    /// this mitmdump's records.
    pub last_seen: Option<String>,
}

/// A sandbox's tunnel as the host sees it. mitmproxy does not report
/// WireGuard handshakes, so the host side judges by traffic: a tunnel that
/// carried a connection within [`ACTIVE_WINDOW`] is active. WireGuard itself
/// drops a session that long unused, so "idle" also means the next packet
/// starts with a fresh handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tunnel {
    /// A connection within the window.
    Active,
    /// Connections before, none within the window.
    Idle,
    /// No connection on record, or no server to carry one.
    None,
}

/// WireGuard's `REJECT_AFTER_TIME`: a session unused this long is gone.
const ACTIVE_WINDOW: f64 = 180.0;

/// The tunnel state from the last connection time and the current time
/// (both seconds since the epoch).
fn tunnel_state(listening: bool, last_seen: Option<f64>, now: f64) -> Tunnel {
    match last_seen {
        Some(t) if listening && now - t <= ACTIVE_WINDOW => Tunnel::Active,
        Some(_) if listening => Tunnel::Idle,
        _ => Tunnel::None,
    }
}

/// `tunnels.json` as the addon writes it: port -> last connection time.
/// Unreadable means unknown, never an error: status must always answer.
fn last_seen(dirs: &Dirs) -> std::collections::BTreeMap<u16, f64> {
    #[derive(serde::Deserialize)]
    struct File {
        last_seen: std::collections::BTreeMap<u16, f64>,
    }
    crate::state::read_optional(&dirs.tunnels_file())
        .ok()
        .flatten()
        .and_then(|t| serde_json::from_str::<File>(&t).ok())
        .map(|f| f.last_seen)
        .unwrap_or_default()
}

fn rfc3339(epoch_secs: f64) -> Option<String> {
    #[allow(clippy::cast_possible_truncation, reason = "whole seconds of a timestamp")]
    let secs = epoch_secs.floor() as i64;
    time::OffsetDateTime::from_unix_timestamp(secs).ok()?.format(&time::format_description::well_known::Rfc3339).ok()
}

/// The daemon's state from its record, the port registry and
/// `tunnels.json`, without asking the daemon: status must answer even when
/// the daemon is wedged.
pub fn status_report(dirs: &Dirs) -> Result<Status> {
    let running = supervisor::is_running(dirs)?;
    let rec = if running { supervisor::load_record(dirs)? } else { None };
    let mitmdump_pid = rec.as_ref().and_then(|r| r.mitmdump_pid);
    let mitmdump_alive = mitmdump_pid.and_then(|p| i32::try_from(p).ok()).is_some_and(supervisor::alive);
    let ports = rec.as_ref().map(|r| r.ports.clone()).unwrap_or_default();
    let seen = last_seen(dirs);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let sandboxes = PortRegistry::load(dirs)?
        .ports
        .into_iter()
        .map(|(port, name)| {
            let listening = mitmdump_alive && ports.contains(&port);
            let last = seen.get(&port).copied();
            SandboxPort {
                name,
                port,
                listening,
                tunnel: tunnel_state(listening, last, now),
                last_seen: last.and_then(rfc3339),
            }
        })
        .collect();
    let last_log_line = last_line(&dirs.proxy_log())?;
    Ok(Status {
        running,
        pid: rec.as_ref().map(|r| r.pid),
        mitmdump_pid,
        mitmdump_alive,
        ports,
        sandboxes,
        started_at: rec.as_ref().map(|r| r.started_at.clone()),
        restarts: rec.as_ref().map_or(0, |r| r.restarts),
        last_restart: rec.as_ref().and_then(|r| r.last_restart.clone()),
        last_log_line,
        orphan_mitmdump_pid: if running { None } else { supervisor::orphan(dirs)? },
    })
}

fn status(dirs: &Dirs, json: bool) -> Result<ExitCode> {
    let s = status_report(dirs)?;
    if json {
        output::json(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = if s.running {
        format!(
            "daemon:    running (pid {})\nmitmdump:  {}\nports:     {}\nrestarts:  {}\n",
            s.pid.unwrap_or(0),
            match (s.mitmdump_pid, s.mitmdump_alive) {
                (Some(p), true) => format!("running (pid {p})"),
                (Some(p), false) => format!("not running (last pid {p})"),
                (None, _) => "restarting".to_owned(),
            },
            ports_text(&s.ports),
            s.restarts
        )
    } else if let Some(p) = s.orphan_mitmdump_pid {
        format!(
            "daemon:    not running\nmitmdump:  still running (pid {p}), left behind by a daemon that died; \
             it still serves the ports it had\nhint:      `ppp daemon stop` stops it, `ppp daemon start -d` replaces it\n"
        )
    } else {
        "daemon:    not running\n".to_owned()
    };
    for sb in &s.sandboxes {
        let state = match (sb.listening, sb.tunnel) {
            (false, _) => "no server".to_owned(),
            (true, Tunnel::Active) => "tunnel active".to_owned(),
            (true, Tunnel::Idle) => format!("tunnel idle since {}", sb.last_seen.as_deref().unwrap_or("?")),
            (true, Tunnel::None) => "no tunnel yet".to_owned(),
        };
        let _ = writeln!(text, "sandbox:   {} on port {} ({state})", sb.name, sb.port);
    }
    if let Some(l) = &s.last_log_line {
        let _ = writeln!(text, "last log:  {l}");
    }
    output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The last non-empty line of `path`, read from its last 64 KiB: the proxy
/// log grows without bound and status must stay instant.
fn last_line(path: &std::path::Path) -> Result<Option<String>> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("could not read `{}`", path.display())),
    };
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    // proxy.log holds what the guest sent (a refused Host, a DNS name) and
    // URLs with their queries: shown on the user's terminal, so never as is.
    Ok(text.lines().rev().find(|l| !l.trim().is_empty()).map(crate::diagnose::shown_log_line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnel_state_by_last_connection() {
        let now = 1_000_000.0;
        assert_eq!(tunnel_state(true, Some(now - 5.0), now), Tunnel::Active);
        assert_eq!(tunnel_state(true, Some(now - ACTIVE_WINDOW), now), Tunnel::Active);
        assert_eq!(tunnel_state(true, Some(now - ACTIVE_WINDOW - 1.0), now), Tunnel::Idle);
        assert_eq!(tunnel_state(true, None, now), Tunnel::None);
        // No server: whatever happened before, there is no tunnel now.
        assert_eq!(tunnel_state(false, Some(now - 1.0), now), Tunnel::None);
    }

    #[test]
    fn last_line_reads_only_the_end() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("proxy.log");
        assert_eq!(last_line(&p).unwrap(), None);
        let mut body = "x".repeat(200 * 1024);
        body.push_str("\nfirst\nlast line\n\n");
        std::fs::write(&p, body).unwrap();
        assert_eq!(last_line(&p).unwrap().as_deref(), Some("last line"));
        std::fs::write(&p, "ppp: [red] denied HTTP evil\u{1b}]0;pwned\u{7}.test: blocked\n").unwrap();
        let l = last_line(&p).unwrap().unwrap();
        assert!(!l.chars().any(crate::output::hides_text) && l.contains("pwned"), "{l:?}");
    }
}

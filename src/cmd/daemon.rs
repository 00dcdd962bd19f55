//! `ppp daemon …`: start, stop and inspect the proxy daemon. The daemon
//! itself lives in [`crate::proxy::supervisor`]; this module finds
//! mitmdump, detaches, waits for readiness and prints.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::Ctx;
use crate::cli::{DaemonCommand, DaemonStartArgs, LogLevelArgs, LogLevelSet, LogTarget};
use crate::config::LogLevel;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::proxy::status::{Tunnel, status_report};
use crate::proxy::{mitmdump, supervisor};
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

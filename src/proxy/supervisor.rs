//! The ppp daemon: keeps one mitmdump running with one WireGuard server per
//! claimed port, serves the Unix socket for as long as it runs, captures the
//! client configs mitmdump prints, and restarts it with bounded backoff when
//! it dies.
//!
//! Liveness is an exclusive `flock` on `$PPP_DATA/daemon.lock`, held for the
//! daemon's whole life: unlike a pid file it cannot go stale, because the
//! kernel drops it when the process dies, however it dies.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio::signal::unix::{SignalKind, signal};

use crate::dirs::Dirs;
use crate::exec;
use crate::proxy::{clientconf, mitmdump, socket, trust};
use crate::sandbox::{self, PortRegistry};
use crate::secret::Store;
use crate::state;

/// Longest wait between restarts of a mitmdump that keeps dying.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A mitmdump that ran this long before dying was healthy: start the
/// backoff over.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// How long mitmdump may take to print every client config. With 80 ports
/// it needs 2.5–4 s; a loaded machine gets ample slack.
const CONFIG_DEADLINE: Duration = Duration::from_secs(60);
/// How often proxy.log is read while client configs are awaited, and
/// otherwise. Reading nothing new costs one `read` call.
const TAIL_BUSY: Duration = Duration::from_millis(25);
const TAIL_IDLE: Duration = Duration::from_millis(250);
/// The most proxy.log read at once; a busy log is caught up in steps.
const TAIL_CHUNK: u64 = 1 << 20;
/// How long mitmdump gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// proxy.log is rotated past this size (one older file, `proxy.log.1`, is
/// kept): a guest decides how much mitmdump logs.
const PROXY_LOG_MAX: u64 = 16 << 20;

/// `$PPP_DATA/daemon.json`: what `ppp daemon status` reports. Rewritten
/// atomically on every change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The supervisor's pid.
    pub pid: u32,
    /// The current mitmdump's pid, if one runs.
    pub mitmdump_pid: Option<u32>,
    /// The WireGuard ports mitmdump listens on.
    pub ports: Vec<u16>,
    /// When the supervisor started (RFC 3339).
    pub started_at: String,
    /// Whether the current mitmdump's client configs have all been captured:
    /// the daemon is ready for tunnels.
    #[serde(default)]
    pub ready: bool,
    /// How many times mitmdump was restarted after dying.
    pub restarts: u32,
    /// When and why the last restart happened.
    pub last_restart: Option<String>,
}

/// Load `daemon.json`; `None` when absent.
pub fn load_record(dirs: &Dirs) -> Result<Option<Record>> {
    let path = dirs.daemon_record();
    match state::read_optional(&path)? {
        None => Ok(None),
        Some(text) => Ok(Some(state::parse_json(&path, &text)?)),
    }
}

/// Whether a daemon holds the lock right now.
pub fn is_running(dirs: &Dirs) -> Result<bool> {
    state::Lock::is_held(&dirs.daemon_lock())
}

/// What the daemon needs to start mitmdump.
#[derive(Debug, Clone)]
pub struct Options {
    /// The mitmdump executable (already checked to be the pinned version).
    pub mitmdump: PathBuf,
    /// The addon's files; written to a content-addressed directory.
    pub addon: crate::assets::Addon,
}

/// Run the daemon in the foreground until SIGTERM or SIGINT. Returns
/// `Ok(false)` without doing anything when another daemon already runs.
pub fn run(dirs: &Dirs, opts: &Options) -> Result<bool> {
    let Some(lock) = state::Lock::try_acquire(&dirs.daemon_lock())? else {
        return Ok(false);
    };
    // A supervisor killed with SIGKILL leaves its mitmdump behind, holding
    // the WireGuard ports; stop it before starting a new one.
    stop_orphan(dirs)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    let result = runtime.block_on(supervise(dirs, opts));
    // The lock is released only after mitmdump is gone and the files are
    // tidied, so `daemon stop` can wait on it.
    let _ = std::fs::remove_file(dirs.proxy_pid());
    drop(lock);
    result.map(|()| true)
}

async fn supervise(dirs: &Dirs, opts: &Options) -> Result<()> {
    let listener = socket::bind(dirs)?;
    let store = Store::open(dirs)?;
    let shared = Arc::new(socket::State::new(dirs.clone(), store)?);
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = {
        let shared = Arc::clone(&shared);
        let mut rx = stop_tx.subscribe();
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = rx.wait_for(|stop| *stop).await;
            };
            socket::serve(listener, shared, shutdown).await
        })
    };

    let addon = mitmdump::write_addon(dirs, &opts.addon)?;
    let upstream_ca = trust::export(dirs, &trust::Source::from_env())?;
    let mut record = Record { pid: std::process::id(), started_at: now(), ..Record::default() };
    let mut term = signal(SignalKind::terminate()).context("could not watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("could not watch SIGINT")?;
    let mut hup = signal(SignalKind::hangup()).context("could not watch SIGHUP")?;
    let mut backoff = Duration::from_secs(1);

    let mut reloads = shared.subscribe();
    let outcome: Result<()> = 'outer: loop {
        let mut ports = mitmdump::wanted_ports(dirs)?;
        let config = configured(dirs);
        let levels = config.log;
        crate::set_log_level(levels.general);
        let mut spec =
            mitmdump::Spec::new(dirs, opts.mitmdump.clone(), ports.clone(), addon.clone(), upstream_ca.clone());
        spec.listen_host = config.wireguard.listen_host;
        // What the addon's `modes` request must match for nothing to restart.
        let mut modes = mitmdump::modes(&spec.wg_dir, &spec.ports, &spec.claims);
        let mut claims = spec.claims.clone();
        spec.sets.push(("termlog_verbosity".to_owned(), crate::config::mitmproxy_level(levels.proxy).to_owned()));
        // The addon finds the socket, the port registry and flows.jsonl here.
        spec.sets.push(("ppp_state_dir".to_owned(), dirs.data.display().to_string()));
        // At 2 and above mitmdump prints request headers, injected keys
        // included, into proxy.log.
        spec.sets.push(("flow_detail".to_owned(), "1".to_owned()));
        mitmdump::prepare(&spec)?;
        let log_path = dirs.proxy_log();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&log_path)
            .with_context(|| format!("could not open `{}`", log_path.display()))?;
        let offset = log.metadata().map_or(0, |m| m.len());
        let mut child = exec::spawn_logged(&mitmdump::command(&spec), &log)?;
        let started = Instant::now();
        record.mitmdump_pid = child.id();
        record.ready = false;
        record.ports.clone_from(&ports);
        state::write_atomic(&dirs.proxy_pid(), format!("{}\n", child.id().unwrap_or(0)).as_bytes())?;
        state::write_json(&dirs.daemon_record(), &record)?;
        tracing::info!("mitmdump {} listening on {ports:?}", child.id().unwrap_or(0));
        let mut tail = Tail::new(log_path.clone(), offset);
        let mut confs = clientconf::load(dirs).unwrap_or_default();
        // When the current set of ports was asked for; its configs are due
        // within CONFIG_DEADLINE of this.
        let mut asked = Instant::now();
        let mut warned = false;
        // Whether the servers changed at run time since this mitmdump
        // started: only then is a bind failure the restart race below.
        let mut changed = false;
        reloads.mark_unchanged();

        let status = loop {
            let pause = if record.ready { TAIL_IDLE } else { TAIL_BUSY };
            tokio::select! {
                () = tokio::time::sleep(pause) => {
                    let fresh = tail.poll()?;
                    if std::mem::take(&mut tail.bind_failed) && changed {
                        // A port claimed again gets its server started
                        // again with new keys, right after the old one was
                        // stopped; mitmproxy_rs can report it stopped
                        // before the UDP socket is free, and the new bind
                        // fails (EADDRINUSE) with no retry. A new mitmdump
                        // binds every port afresh, and the guests' tunnels
                        // handshake again by themselves.
                        tracing::warn!("a WireGuard server could not bind its port at run time; restarting mitmdump");
                        stop_child(&mut child).await?;
                        break None;
                    }
                    if !fresh.is_empty() {
                        confs.extend(fresh);
                        clientconf::save(dirs, &confs)?;
                        write_wg0s(dirs, &confs, &tail.seen)?;
                    }
                    // Not while configs are awaited: the tail must see them.
                    if record.ready && rotate_log(&log_path, PROXY_LOG_MAX)? {
                        tail.pos = 0;
                    }
                    if !record.ready && live(dirs, &ports, &claims, &tail.seen).len() == ports.len() {
                        record.ready = true;
                        state::write_json(&dirs.daemon_record(), &record)?;
                        tracing::info!("captured client configs for {ports:?}");
                    } else if !record.ready && !warned && asked.elapsed() > CONFIG_DEADLINE {
                        warned = true;
                        let up = live(dirs, &ports, &claims, &tail.seen);
                        let missing: Vec<u16> = ports.iter().copied().filter(|p| !up.contains(p)).collect();
                        tracing::warn!(
                            "mitmdump printed no client config for {missing:?} within {} s; see `{}`",
                            CONFIG_DEADLINE.as_secs(),
                            log_path.display()
                        );
                    }
                }
                status = child.wait() => break Some(status),
                _ = term.recv() => break 'outer stop_child(&mut child).await,
                _ = int.recv() => break 'outer stop_child(&mut child).await,
                _ = reloads.changed() => {
                    // A reload may follow a port claimed or freed. The addon
                    // moves mitmdump's servers to the same list (the `modes`
                    // request); here the record and the capture follow.
                    // A sandbox may also have claimed a port that is
                    // already served (the base port): its wg0.conf is due.
                    if let Err(e) = write_wg0s(dirs, &confs, &tail.seen) {
                        tracing::warn!("could not write wg0.conf files: {e:#}");
                    }
                    // A port claimed again keeps its number but gets a new
                    // key file: its mode changes, and its config is due
                    // again (the printed one must match the new keys).
                    match PortRegistry::load(dirs).map(|r| {
                        let now = mitmdump::listen_ports(r.ports.keys().copied());
                        (mitmdump::modes(&dirs.wg(), &now, &r.claims), now, r.claims)
                    }) {
                        Ok((now_modes, now, now_claims)) if now_modes != modes => {
                            tracing::info!("WireGuard servers: {ports:?} -> {now:?}");
                            tail.seen.retain(|p, _| now.contains(p));
                            ports = now;
                            modes = now_modes;
                            claims = now_claims;
                            record.ports.clone_from(&ports);
                            record.ready = false;
                            asked = Instant::now();
                            warned = false;
                            changed = true;
                            state::write_json(&dirs.daemon_record(), &record)?;
                            write_wg0s(dirs, &confs, &tail.seen)?;
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!("could not read the port registry: {e:#}"),
                    }
                }
                _ = hup.recv() => {
                    match shared.reload() {
                        Ok(g) => tracing::info!("reloaded on SIGHUP (generation {g})"),
                        Err(e) => tracing::warn!("reload on SIGHUP failed: {e:#}"),
                    }
                    let now = configured(dirs).log;
                    crate::set_log_level(now.general);
                    if now.proxy != levels.proxy {
                        // mitmdump reads its verbosity at start; a planned
                        // restart applies the new one and is not a crash.
                        tracing::info!("restarting mitmdump to apply proxy log level {:?}", now.proxy);
                        stop_child(&mut child).await?;
                        break None;
                    }
                }
                _ = stop_rx.changed() => {}
            }
        };
        let Some(status) = status else { continue };
        let why = match status {
            Ok(s) => format!("mitmdump exited ({s})"),
            Err(e) => format!("could not wait for mitmdump: {e}"),
        };
        if started.elapsed() > HEALTHY_RUN {
            backoff = Duration::from_secs(1);
        }
        record.restarts += 1;
        record.last_restart = Some(format!("{} {why}", now()));
        record.mitmdump_pid = None;
        record.ready = false;
        state::write_json(&dirs.daemon_record(), &record)?;
        tracing::warn!("{why}; restarting in {} s", backoff.as_secs());
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = term.recv() => break Ok(()),
            _ = int.recv() => break Ok(()),
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    };
    record.mitmdump_pid = None;
    record.ready = false;
    let _ = state::write_json(&dirs.daemon_record(), &record);
    let _ = stop_tx.send(true);
    server.await.context("the socket server task failed")??;
    outcome
}

/// SIGTERM mitmdump, then SIGKILL after the grace period.
async fn stop_child(child: &mut tokio::process::Child) -> Result<()> {
    if let Some(pid) = child.id() {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid.cast_signed()), nix::sys::signal::Signal::SIGTERM);
    }
    if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
        tracing::warn!("mitmdump did not stop within {} s; killing it", STOP_GRACE.as_secs());
        child.kill().await.context("could not kill mitmdump")?;
    }
    Ok(())
}

/// Follows mitmdump's output in `proxy.log` for the client config blocks
/// it prints: all of them at start, and one more whenever a server is added
/// at run time.
struct Tail {
    path: PathBuf,
    /// Where the next read starts.
    pos: u64,
    /// Port → the guest key of the last config this mitmdump printed for
    /// it (a server started again prints a new one).
    seen: BTreeMap<u16, String>,
    /// Whether mitmdump logged a WireGuard server that failed to bind.
    bind_failed: bool,
}

impl Tail {
    fn new(path: PathBuf, pos: u64) -> Self {
        Self { path, pos, seen: BTreeMap::new(), bind_failed: false }
    }

    /// The configs printed since the last call. Only whole lines are read,
    /// and the last few are read again next time, so a block cut in two by
    /// the read is still seen whole.
    fn poll(&mut self) -> Result<BTreeMap<u16, clientconf::ClientConf>> {
        let mut f = File::open(&self.path).with_context(|| format!("could not read `{}`", self.path.display()))?;
        f.seek(SeekFrom::Start(self.pos))?;
        let mut bytes = Vec::new();
        (&mut f).take(TAIL_CHUNK).read_to_end(&mut bytes)?;
        let full = bytes.len() as u64 == TAIL_CHUNK;
        let Some(end) = bytes.iter().rposition(|b| *b == b'\n').map(|i| i + 1) else {
            // One line longer than a chunk is not a config; skip past it.
            if full {
                self.pos += TAIL_CHUNK;
            }
            return Ok(BTreeMap::new());
        };
        let text = String::from_utf8_lossy(&bytes[..end]);
        let found = clientconf::parse(&text);
        // mitmproxy's words for it: "WireGuard server failed to listen on
        // HOST:PORT with [Errno 98] …".
        self.bind_failed |= text.contains("WireGuard server failed to listen on");
        // The next read starts a block's length before the end, so a block
        // still being printed is read again whole.
        let keep_from = text.match_indices('\n').rev().nth(clientconf::MAX_BLOCK_LINES + 2).map_or(0, |(i, _)| i + 1);
        let advance = if keep_from == 0 && full { end } else { keep_from };
        self.pos += advance as u64;
        let fresh = found
            .into_iter()
            .filter(|(port, conf)| {
                self.seen.insert(*port, conf.private_key.clone()).as_ref() != Some(&conf.private_key)
            })
            .collect();
        Ok(fresh)
    }
}

/// Rotate the log at `path` once it is over `max` bytes: its content moves
/// to `<path>.1` (replacing the older one) and the file is emptied in
/// place, because mitmdump keeps writing to it (`O_APPEND`) for as long as it
/// runs. What mitmdump appends while the content is copied is carried over;
/// a line written between that and the truncation is lost. Whether it
/// rotated.
fn rotate_log(path: &std::path::Path, max: u64) -> Result<bool> {
    let ctx = || format!("could not rotate `{}`", path.display());
    if std::fs::metadata(path).with_context(ctx)?.len() <= max {
        return Ok(false);
    }
    let old = crate::policy::flowlog::rotated(path);
    let mut tmp = old.as_os_str().to_owned();
    tmp.push(".tmp");
    let copied = std::fs::copy(path, &tmp).with_context(ctx)?;
    std::fs::rename(&tmp, &old).with_context(ctx)?;
    let mut f = OpenOptions::new().read(true).append(true).open(path).with_context(ctx)?;
    f.seek(SeekFrom::Start(copied)).with_context(ctx)?;
    let mut rest = Vec::new();
    f.read_to_end(&mut rest).with_context(ctx)?;
    f.set_len(0).with_context(ctx)?;
    std::io::Write::write_all(&mut f, &rest).with_context(ctx)?;
    Ok(true)
}

/// Render `wg0.conf` for every sandbox that holds a port whose config this
/// mitmdump printed with the keys of the sandbox's own claim (a config a
/// former holder of the port got is never written). The endpoint is the
/// gvproxy host alias, as a Podman Machine guest sees the host.
fn write_wg0s(dirs: &Dirs, confs: &BTreeMap<u16, clientconf::ClientConf>, seen: &BTreeMap<u16, String>) -> Result<()> {
    let registry = PortRegistry::load(dirs)?;
    let ports: Vec<u16> = registry.ports.keys().copied().collect();
    let up = live(dirs, &ports, &registry.claims, seen);
    for (port, name) in &registry.ports {
        if let Some(conf) = confs.get(port).filter(|c| up.contains(port) && seen.get(port) == Some(&c.private_key)) {
            let text = clientconf::render_wg0(conf, sandbox::inner_ip(*port), clientconf::PODMAN_HOST_ALIAS, *port);
            state::write_atomic(&dirs.sandbox_wg_conf(name), text.as_bytes())?;
        }
    }
    Ok(())
}

/// Stop a mitmdump a dead supervisor left running, identified by
/// `proxy.pid` and confirmed by its command line, so a recycled pid is
/// never signalled.
/// The mitmdump named by `proxy.pid`, if it still runs. With no daemon
/// holding `daemon.lock`, that is one left behind by a daemon that died
/// (SIGKILL gives it no chance to stop its child), still serving every
/// WireGuard port it had.
pub fn orphan(dirs: &Dirs) -> Result<Option<u32>> {
    if is_running(dirs)? {
        return Ok(None);
    }
    proxy_pid_alive(dirs)
}

fn proxy_pid_alive(dirs: &Dirs) -> Result<Option<u32>> {
    let Some(text) = state::read_optional(&dirs.proxy_pid())? else {
        return Ok(None);
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return Ok(None);
    };
    Ok((pid > 0 && alive(pid) && is_mitmdump(pid)).then(|| pid.unsigned_abs()))
}

/// Stop a mitmdump left behind by a dead daemon; its pid, if there was one.
/// Called with `daemon.lock` held (by a starting daemon, or by
/// `daemon stop` and `reset` when no daemon runs).
pub fn stop_orphan(dirs: &Dirs) -> Result<Option<u32>> {
    let Some(found) = proxy_pid_alive(dirs)? else {
        return Ok(None);
    };
    let Ok(pid) = i32::try_from(found) else { return Ok(None) };
    tracing::warn!("stopping mitmdump {pid}, left behind by a daemon that died");
    let pid = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while alive(pid.as_raw()) {
        if Instant::now() > deadline {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_file(dirs.proxy_pid());
    Ok(Some(found))
}

/// Stop a running daemon: SIGTERM, then wait until it and its mitmdump
/// are gone (so the WireGuard ports are free). Returns its last record, or
/// `None` when no daemon was running.
pub fn stop(dirs: &Dirs, deadline: Duration) -> Result<Stopped> {
    if !is_running(dirs)? {
        // No daemon: holding its lock keeps one from starting meanwhile.
        let Some(_lock) = state::Lock::try_acquire(&dirs.daemon_lock())? else {
            return Ok(Stopped::Nothing);
        };
        return Ok(stop_orphan(dirs)?.map_or(Stopped::Nothing, Stopped::Orphan));
    }
    let rec = load_record(dirs)?
        .ok_or_else(|| crate::error::fail("the daemon is running but left no `daemon.json`").hint("stop it by hand"))?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(rec.pid).context("bad pid in daemon.json")?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
        .with_context(|| format!("could not signal the daemon (pid {})", rec.pid))?;
    let end = Instant::now() + deadline;
    let mitm = rec.mitmdump_pid.and_then(|p| i32::try_from(p).ok());
    while is_running(dirs)? || mitm.is_some_and(alive) {
        if Instant::now() > end {
            return Err(crate::error::fail(format!(
                "the daemon (pid {}) did not stop within {} s",
                rec.pid,
                deadline.as_secs()
            ))
            .into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Stopped::Daemon(rec))
}

/// What `stop` stopped.
#[derive(Debug)]
pub enum Stopped {
    /// The daemon, with its last record.
    Daemon(Record),
    /// No daemon, but the mitmdump (this pid) a dead one left behind.
    Orphan(u32),
    Nothing,
}

/// Whether `pid` names a live process.
pub fn alive(pid: i32) -> bool {
    pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

fn is_mitmdump(pid: i32) -> bool {
    let inv =
        exec::Invocation::new("ps").args(["-p", &pid.to_string(), "-o", "command="]).timeout(Duration::from_secs(5));
    exec::run(&inv).is_ok_and(|o| o.stdout.contains("mitmdump"))
}

/// config.yaml; a malformed file keeps the defaults and says why, rather
/// than stopping the proxy.
fn configured(dirs: &Dirs) -> crate::config::Config {
    crate::config::load(dirs).unwrap_or_else(|e| {
        tracing::warn!("{e:#}; using the default settings");
        crate::config::Config::default()
    })
}

/// The ports whose config this mitmdump printed with the keys of the
/// port's current key file: the servers a guest can use now.
fn live(
    dirs: &Dirs,
    ports: &[u16],
    claims: &BTreeMap<u16, String>,
    seen: &BTreeMap<u16, String>,
) -> std::collections::BTreeSet<u16> {
    ports
        .iter()
        .copied()
        .filter(|&p| {
            let keys = mitmdump::key_file(&dirs.wg(), p, claims.get(&p).map(String::as_str));
            seen.get(&p).is_some_and(|printed| clientconf::client_key_of(&keys).as_ref() == Some(printed))
        })
        .collect()
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or_else(|_| time::OffsetDateTime::now_utc())
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_rotates_in_place_past_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.log");
        // Held open for appending, as mitmdump's stdout is.
        let mut writer = OpenOptions::new().create(true).append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut writer, b"one\ntwo\n").unwrap();
        assert!(!rotate_log(&path, 100).unwrap(), "small enough");
        std::io::Write::write_all(&mut writer, &b"x".repeat(200)).unwrap();
        std::io::Write::write_all(&mut writer, b"\n").unwrap();
        assert!(rotate_log(&path, 100).unwrap());
        let old = std::fs::read_to_string(dir.path().join("proxy.log.1")).unwrap();
        assert!(old.starts_with("one\ntwo\nxxx") && old.len() == 209, "{old}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        std::io::Write::write_all(&mut writer, b"after\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after\n", "the writer goes on at the start");
        assert!(!dir.path().join("proxy.log.1.tmp").exists());
    }
}

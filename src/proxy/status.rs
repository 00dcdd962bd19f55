//! The daemon's state as `ppp daemon status`, `ppp diagnose` and the
//! dashboard show it: read from the daemon's record, the port registry,
//! `tunnels.json` and the end of `proxy.log`, never by asking the daemon,
//! so a wedged daemon cannot stall them. Below the commands that print it.

use anyhow::{Context, Result};
use serde::Serialize;

use super::supervisor;
use crate::dirs::Dirs;
use crate::sandbox::PortRegistry;

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
    Ok(text.lines().rev().find(|l| !l.trim().is_empty()).map(shown_log_line))
}

/// A `proxy.log` line as ppp shows it: through [`crate::output::printable`]
/// (it holds what the guest sent: a refused Host, a DNS name), and with the
/// query string of every URL in it cut to `?…`. mitmdump logs each flow's
/// URL whole, and a query often carries a credential (`?access_token=…`, a
/// presigned URL's signature) that a pasted report must not.
pub fn shown_log_line(line: &str) -> String {
    let line = crate::output::printable(line);
    if !line.contains("://") || !line.contains('?') {
        return line.into_owned();
    }
    let mut out = String::with_capacity(line.len());
    for (i, word) in line.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        match word.find('?') {
            Some(q) if word.contains("://") => {
                out.push_str(&word[..q]);
                out.push_str("?\u{2026}");
            }
            _ => out.push_str(word),
        }
    }
    out
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

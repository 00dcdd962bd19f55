//! What the dashboard shows, read from the sandbox records, `podman machine
//! list`, the daemon's tunnel activity (`tunnels.json`), the end of
//! `flows.jsonl` and today's LLM usage (`usage.jsonl`). Read-only; it runs
//! on the poller thread, never the UI thread, because podman can take
//! seconds to answer.

use std::net::Ipv4Addr;

use serde_json::Value;

use crate::dirs::Dirs;
use crate::policy::{flowlog, follow};
use crate::proxy::status::{self, Tunnel};
use crate::sandbox;

/// How many of the newest flows are read at each refresh. "Recent denials"
/// means denials among these (the flow views are fed by
/// [`flows::watch`](super::flows::watch) instead). The tail reads
/// backwards, so this costs a read or two whatever the log's size.
pub const FLOW_TAIL: usize = 1000;

/// One sandbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub name: String,
    pub agent: String,
    /// The merged state, as `ppp ls` shows it (`running`, `stopped`, …).
    pub state: String,
    /// The VM's CPUs and memory (MiB), as created.
    pub cpus: u32,
    pub memory_mib: u64,
    /// Published ports, `-` for none.
    pub ports: String,
    pub workspace: String,
    pub inner_ip: Ipv4Addr,
    pub tunnel: Link,
    /// Denied flows among the last [`FLOW_TAIL`].
    pub denials: usize,
    /// Its policy file says `learn: true` (ADR 0048).
    pub learning: bool,
    /// LLM tokens today (UTC) as `ppp ls` shows them (`12.3k`, `~` in
    /// front when some are estimated), `-` for none.
    pub tokens: String,
}

/// A sandbox's tunnel in the dashboard's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Carried a connection within WireGuard's session lifetime.
    Up,
    /// Served, but quiet for longer than that.
    Idle,
    /// No server, or never used.
    Down,
}

impl Link {
    /// The word shown in the TUNNEL column.
    pub fn label(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Idle => "idle",
            Self::Down => "down",
        }
    }
}

/// One line of `flows.jsonl`, reduced to what the flow view shows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Flow {
    pub sandbox: String,
    /// `HH:MM:SS` of the flow's UTC timestamp.
    pub time: String,
    pub kind: String,
    pub method: String,
    pub host: String,
    pub port: String,
    pub status: String,
    pub denied: bool,
    pub rule: String,
    /// The request path, without its query; `-` for other kinds.
    pub path: String,
    /// Bytes sent and received, in short units (`1.5KiB`).
    pub up: String,
    pub down: String,
    /// How long the flow took (`830ms`); `-` from an older addon.
    pub duration: String,
}

impl Flow {
    /// Read a flow-log object; missing fields show as `-`, so a flow from an
    /// older addon still lists.
    pub fn from_json(v: &Value) -> Flow {
        // Hosts, methods and paths are the guest's bytes: no control
        // characters reach the terminal.
        let text = |k: &str| match v.get(k) {
            Some(Value::String(s)) if !s.is_empty() => crate::output::printable(s).into_owned(),
            Some(Value::Number(n)) => n.to_string(),
            _ => "-".to_owned(),
        };
        let num = |k: &str| v.get(k).and_then(Value::as_u64);
        let stamp = text("timestamp");
        let time = stamp.get(11..19).map_or_else(|| stamp.clone(), str::to_owned);
        Flow {
            sandbox: text("sandbox"),
            time,
            kind: text("kind"),
            method: text("method"),
            host: text("host"),
            port: text("port"),
            status: text("status"),
            denied: v.get("decision").and_then(Value::as_str) == Some("deny"),
            rule: text("matched_rule"),
            path: crate::output::printable(follow::path(v).filter(|p| !p.is_empty()).unwrap_or("-")).into_owned(),
            up: num("bytes_out").map_or_else(|| "-".to_owned(), follow::size),
            down: num("bytes_in").map_or_else(|| "-".to_owned(), follow::size),
            duration: num("duration_ms").map_or_else(|| "-".to_owned(), follow::duration),
        }
    }
}

/// Everything one refresh read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub sandboxes: Vec<Sandbox>,
    /// The newest flows of every sandbox, oldest first.
    pub flows: Vec<Flow>,
    pub daemon_running: bool,
    /// What could not be read (podman failing, a malformed record); shown
    /// under the list instead of failing the dashboard.
    pub warnings: Vec<String>,
}

/// Read everything once. Never fails: what cannot be read becomes a warning
/// and the rest is still shown.
pub fn gather(dirs: &Dirs) -> Snapshot {
    let mut warnings = Vec::new();
    let records = sandbox::load_all(dirs).unwrap_or_else(|e| {
        warnings.push(format!("{e:#}"));
        Vec::new()
    });
    let listing =
        if records.is_empty() { None } else { crate::cmd::ls::listing(dirs, &records, &mut |w| warnings.push(w)) };
    // The daemon's own view of each sandbox's tunnel, as `daemon status`
    // shows it; read from files, so a wedged daemon cannot stall this.
    let daemon = status::status_report(dirs).map_err(|e| warnings.push(format!("daemon status: {e:#}"))).ok();
    let tunnels: std::collections::BTreeMap<&str, Tunnel> =
        daemon.as_ref().map(|d| d.sandboxes.iter().map(|s| (s.name.as_str(), s.tunnel)).collect()).unwrap_or_default();
    let flows: Vec<Flow> = flowlog::tail(&dirs.flows_log(), FLOW_TAIL, None)
        .unwrap_or_else(|e| {
            warnings.push(format!("flow log: {e:#}"));
            Vec::new()
        })
        .iter()
        .map(Flow::from_json)
        .collect();
    let learning = crate::policy::learning(dirs).unwrap_or_else(|e| {
        warnings.push(format!("{e:#}"));
        Vec::new()
    });
    let today = crate::cmd::ls::usage_today(dirs, &mut |w| warnings.push(format!("usage log: {w}")));
    let sandboxes = crate::cmd::ls::merge(records, listing.as_ref())
        .into_iter()
        .map(|row| {
            let r = row.record;
            let ports = if r.published.is_empty() {
                "-".to_owned()
            } else {
                r.published.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
            };
            let tunnel = match tunnels.get(r.name.as_str()) {
                Some(Tunnel::Active) => Link::Up,
                Some(Tunnel::Idle) => Link::Idle,
                Some(Tunnel::None) | None => Link::Down,
            };
            let denials = flows.iter().filter(|f| f.denied && f.sandbox == r.name).count();
            let learning = learning.contains(&r.name);
            let tokens = crate::usage::report::tokens_cell(today.get(&r.name));
            Sandbox {
                name: r.name,
                agent: r.agent,
                state: row.state,
                cpus: r.cpus,
                memory_mib: r.memory,
                ports,
                workspace: r.workspace.join(","),
                inner_ip: r.inner_ip,
                tunnel,
                denials,
                learning,
                tokens,
            }
        })
        .collect();
    let daemon_running = daemon.as_ref().is_some_and(|d| d.running);
    Snapshot { sandboxes, flows, daemon_running, warnings }
}

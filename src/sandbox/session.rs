//! The agent's session: the container that runs the agent in the VM
//! (mounts, published ports, kit variables, dropped capabilities) and the
//! loop that keeps it attached to the terminal, starting it again when a
//! kit changes the sandbox (ADR 0015).

use anyhow::Result;

use super::guard;
use super::provision::GUEST_CA_BUNDLE;
use super::workspace::guest_workspaces;
use super::{Published, Record};
use crate::agent::{self, Agent};
use crate::dirs::Dirs;
use crate::exec::{self, Invocation, Stdin};
use crate::podman::Podman;

/// Where the agent container finds the VM's CA bundle
/// ([`GUEST_CA_BUNDLE`]): the path Debian-family images read.
const CONTAINER_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The agent container's label holding the record's `agent_generation`
/// it was made from.
pub const GENERATION_LABEL: &str = "ppp.generation";

/// The name of the container that runs a sandbox's agent in its VM.
#[must_use]
pub fn agent_container(sandbox: &str) -> String {
    format!("ppp-agent-{sandbox}")
}

/// The kit files to bind into the agent container, read-only at their VM
/// paths: every path a kit installed, except those the container sees
/// already (inside a workspace) or that another mount owns (podman refuses
/// two mounts on one destination).
fn kit_mounts(rec: &Record, taken: &[String]) -> Vec<String> {
    let under = |path: &str, dir: &str| {
        path == dir || path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/') || dir.ends_with('/'))
    };
    let mut paths: Vec<&String> = rec.kit_files.values().flat_map(|files| files.keys()).collect();
    paths.sort();
    paths.dedup();
    paths.into_iter().filter(|p| !taken.iter().any(|t| under(p, t))).map(|p| format!("{p}:{p}:ro")).collect()
}

/// The container that runs the agent, as an ssh invocation into the VM.
#[allow(clippy::too_many_arguments)] // each is one part of the run line
pub fn agent_invocation(
    podman: &Podman,
    rec: &Record,
    agent: &Agent,
    image: &str,
    extra_env: &[(String, String)],
    agent_args: &[String],
    tty: bool,
    guard_mounts: &[String],
) -> Invocation {
    let mut line: Vec<String> = ["podman", "run", "--rm", "-i"].iter().map(|s| (*s).to_owned()).collect();
    if tty {
        line.push("-t".into());
    }
    line.extend(["--name".into(), agent_container(&rec.name)]);
    // What the container was made from, so `kit add` can tell whether it
    // is out of date (ADR 0015).
    line.extend(["--label".into(), format!("{GENERATION_LABEL}={}", rec.agent_generation)]);
    // Nothing in the container may change the VM's network (the kill
    // switch lives there) or send raw packets.
    for cap in ["NET_ADMIN", "NET_RAW"] {
        line.extend(["--cap-drop".into(), cap.into()]);
    }
    line.extend(["--security-opt".into(), "no-new-privileges".into()]);
    for g in guest_workspaces(rec) {
        line.extend(["-v".into(), format!("{g}:{g}")]);
    }
    // Over the writable workspaces: git's hooks and configuration
    // read-only, each git directory pinned (ADR 0036).
    for m in guard_mounts {
        line.extend(["-v".into(), m.clone()]);
    }
    line.extend(["-v".into(), format!("{GUEST_CA_BUNDLE}:{CONTAINER_CA_BUNDLE}:ro")]);
    let mut taken = guest_workspaces(rec);
    taken.push(CONTAINER_CA_BUNDLE.to_owned());
    for m in kit_mounts(rec, &taken) {
        line.extend(["-v".into(), m]);
    }
    for p in &rec.published {
        line.extend(["-p".into(), publish_flag(p)]);
    }
    if let Some(first) = guest_workspaces(rec).first() {
        line.extend(["-w".into(), first.clone()]);
    }
    // Kit variables first: the agent's own and the secrets' placeholders
    // win over a kit's, so a kit cannot unset a key placeholder.
    let mut env: Vec<(String, String)> = rec.kit_env.values().flat_map(Clone::clone).collect();
    env.extend(extra_env.iter().cloned());
    for (k, v) in agent.container_env(&env) {
        line.extend(["-e".into(), format!("{k}={v}")]);
    }
    line.push(image.to_owned());
    line.extend(agent.command.iter().map(|s| (*s).to_owned()));
    line.extend(agent_args.iter().cloned());
    podman.ssh(&rec.machine_name, &line).stdin(Stdin::Inherit)
}

/// The `-p` value podman run takes for a published port: podman knows tcp
/// and udp, so the 4/6 variants bind their family's address only.
fn publish_flag(p: &Published) -> String {
    let proto = if p.protocol.starts_with("udp") { "udp" } else { "tcp" };
    let ip = p.host_ip.clone().unwrap_or_else(|| "127.0.0.1".into());
    let ip = if ip.contains(':') { format!("[{ip}]") } else { ip };
    format!("{ip}:{}:{}/{proto}", p.host_port, p.sandbox_port)
}

/// Run the agent attached to this terminal until it ends for good, with
/// the workspace guard of `config.yaml` (ADR 0036): what the agent created
/// or changed that runs on the host is reported on stderr. Returns the
/// agent's last exit code.
pub fn run_agent(
    dirs: &Dirs,
    podman: &Podman,
    rec: Record,
    agent_args: &[String],
    tty: bool,
    quiet: bool,
) -> Result<i32> {
    let settings = guard::Settings::for_sandbox(&crate::config::load(dirs)?, &rec.name);
    Ok(run_guarded(dirs, podman, rec, agent_args, tty, quiet, &settings)?.0)
}

/// Run the agent attached to this terminal until it ends for good. When a
/// kit restarts it (`ppp kit add` bumps `agent_generation`, then stops the
/// container; ADR 0015), it starts again from the new record, with the
/// same arguments. Before it starts and after it ends, the workspace guard
/// checks the workspace; the report goes to stderr, even with `-q`.
/// Returns the agent's last exit code, and whether `settings.strict`
/// moved something aside.
#[allow(clippy::too_many_arguments)] // run_agent's, plus the guard's settings
pub fn run_guarded(
    dirs: &Dirs,
    podman: &Podman,
    rec: Record,
    agent_args: &[String],
    tty: bool,
    quiet: bool,
    settings: &guard::Settings,
) -> Result<(i32, bool)> {
    let agent = agent::find(&rec.agent)?;
    // What provisioning put in the VM; a record older than issue 24 has
    // none, and gets what ppp would choose now.
    let image = match &rec.image {
        Some(i) => i.clone(),
        None => super::image::choose(agent, |k| std::env::var(k).ok())?.image(),
    };
    let podman = &super::podman_for(podman, dirs, &rec);
    let (mounts, earlier) = guard::before_agent(dirs, &rec, settings)?;
    let mut moved = report(earlier);
    let mut rec = rec;
    loop {
        let env = custom_env(dirs, &rec.name);
        let code = exec::run_attached(&agent_invocation(podman, &rec, agent, &image, &env, agent_args, tty, &mounts))?;
        match super::load(dirs, &rec.name)? {
            Some(now) if now.agent_generation != rec.agent_generation => {
                if !quiet {
                    eprintln!("ppp: a kit changed sandbox `{}`; starting the agent again", rec.name);
                }
                rec = now;
            }
            // Any other end of the agent is the end of the session.
            _ => {
                moved |= report(guard::check(dirs, &rec, settings)?);
                return Ok((code, moved));
            }
        }
    }
}

/// Print a guard check's report; whether it moved something aside.
pub fn report(outcome: Option<guard::Outcome>) -> bool {
    let Some(o) = outcome else { return false };
    eprint!("{}", o.text);
    o.moved
}

/// Placeholders for custom secrets that name a variable (`secret set
/// --env`), for this sandbox and global.
pub fn custom_env(dirs: &Dirs, sandbox: &str) -> Vec<(String, String)> {
    let Ok(store) = crate::secret::Store::open(dirs) else { return Vec::new() };
    store
        .list()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| match &e.scope {
            crate::secret::Scope::Global => true,
            crate::secret::Scope::Sandbox(s) => s == sandbox,
        })
        .filter_map(|e| Some((e.env?, e.placeholder?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kit_files_are_mounted_once_unless_already_visible_or_taken() {
        let rec: Record = serde_json::from_value(serde_json::json!({
            "name": "red", "agent": "opencode", "workspace": ["/home/me/app"], "status": "running",
            "created_at": "2026-01-01T00:00:00Z", "cpus": 1, "memory": 2048, "port": 51820,
            "inner_ip": "10.0.0.1", "machine_name": "ppp-red",
            "kit_files": {
                "a": {"/opt/t/bin/tool": "sha256:1", "/home/me/app/.toolrc": "sha256:2",
                      "/etc/ssl/certs/ca-certificates.crt": "sha256:3"},
                "b": {"/opt/t/bin/tool": "sha256:4", "/home/me/application/x": "sha256:5"},
            },
        }))
        .unwrap();
        let taken = ["/home/me/app".to_owned(), CONTAINER_CA_BUNDLE.to_owned()];
        assert_eq!(
            kit_mounts(&rec, &taken),
            ["/home/me/application/x:/home/me/application/x:ro", "/opt/t/bin/tool:/opt/t/bin/tool:ro"]
        );
    }

    #[test]
    fn published_ports_as_podman_takes_them() {
        let p = Published { host_ip: Some("::1".into()), host_port: 8080, sandbox_port: 3000, protocol: "tcp6".into() };
        assert_eq!(publish_flag(&p), "[::1]:8080:3000/tcp");
        let p = Published { host_ip: None, host_port: 5353, sandbox_port: 53, protocol: "udp".into() };
        assert_eq!(publish_flag(&p), "127.0.0.1:5353:53/udp");
    }
}

//! What a create owns and how it is undone: the claim (name, port and
//! record, taken under `state.lock`) and the rollback that gives back
//! exactly what a failed create made. `forget` is also how `rm` ends.

use std::time::Duration;

use anyhow::{Context, Result};
use time::OffsetDateTime;

use super::request::Request;
use super::workspace::clone_path;
use super::{PortRegistry, Record, Status};
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec;
use crate::podman::{Machine, Podman};
use crate::proxy::{self, supervisor};
use crate::state;

/// What `claim` made, so a rollback can undo exactly that.
pub(super) struct Claim {
    pub(super) record: Record,
}

/// Under `state.lock`: pick the name, take a port, write the record.
pub(super) fn claim(dirs: &Dirs, req: &Request, all: &[Machine]) -> Result<Claim> {
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut registry = PortRegistry::load(dirs)?;
    let exists = |n: &str| dirs.sandbox_record(n).exists() || all.iter().any(|m| m.name == super::machine_name(n));
    let name = match &req.name {
        Some(n) => {
            if exists(n) {
                return Err(fail(format!("a sandbox named `{n}` already exists"))
                    .hint(format!("attach to it with `ppp run --name {n} {} …`, or pick another name", req.agent.name))
                    .code(2)
                    .into());
            }
            n.clone()
        }
        None => super::names::generate(|n| exists(n) || registry.port_of(n).is_some())
            .ok_or_else(|| fail("could not find a free sandbox name").hint("pass one with `--name`"))?,
    };
    let port = registry.allocate(&name)?;
    let record = Record {
        name: name.clone(),
        agent: req.agent.name.to_owned(),
        workspace: req.workspace.iter().map(|p| p.display().to_string()).collect(),
        status: Status::Creating,
        created_at: OffsetDateTime::now_utc().replace_nanosecond(0).unwrap_or_else(|_| OffsetDateTime::now_utc()),
        cpus: req.cpus,
        memory: req.memory_mib,
        port,
        inner_ip: super::inner_ip(port),
        kit_refs: Vec::new(),
        kit_env: std::collections::BTreeMap::new(),
        kit_files: std::collections::BTreeMap::new(),
        agent_generation: 0,
        template_tag: req.template.clone(),
        machine_name: super::machine_name(&name),
        published: Vec::new(),
        clone: req.clone.then(|| clone_path(&req.workspace[0].display().to_string())),
        image: None,
        image_origin: None,
        podman_run: Some(dirs.podman_runtime(&name, Dirs::runtime_base().as_deref())),
        boot_id: None,
    };
    state::create_private_dir(&dirs.sandbox(&name))?;
    // The port is saved before the record: a crash in between leaves a
    // port held by a name with no sandbox, which `rm` frees; the reverse
    // would leave a sandbox whose port another could take.
    registry.save_locked(dirs)?;
    super::save_locked(dirs, &record)?;
    Ok(Claim { record })
}

/// Undo a failed create, so that ppp's state is as it was: the machine,
/// the port, the record, and the daemon if this create started it and no
/// sandbox is left for it to serve. The machine log stays where the
/// error's hint points (`ppp rm NAME` removes it); without `sandbox.json`
/// the directory is not a sandbox.
pub(super) fn rollback(dirs: &Dirs, podman: &Podman, claim: &Claim, made_machine: bool, started_daemon: bool) {
    let name = &claim.record.name;
    let podman = &super::podman_for(podman, dirs, &claim.record);
    if made_machine && let Err(e) = exec::run(&podman.rm(&claim.record.machine_name)) {
        eprintln!("warning: could not remove machine `{}`: {e}", claim.record.machine_name);
    }
    if let Err(e) = forget(dirs, name, Keep::Log) {
        eprintln!("warning: could not remove the state of `{name}`: {e:#}");
    }
    let idle = PortRegistry::load(dirs).is_ok_and(|r| r.ports.is_empty());
    if started_daemon && idle {
        if let Err(e) = supervisor::stop(dirs, Duration::from_secs(30)) {
            eprintln!("warning: could not stop the ppp daemon this create started: {e:#}");
        }
    } else {
        let _ = proxy::notify_reload(dirs);
    }
}

fn remove_tree(p: &std::path::Path) -> Result<()> {
    match std::fs::remove_dir_all(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("could not remove `{}`", p.display()))
        }
        _ => Ok(()),
    }
}

/// What [`forget`] leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// Nothing: the sandbox is removed (`rm`).
    Nothing,
    /// The machine log and anything ppp did not write (a policy prepared
    /// with `policy allow --sandbox`): a create that failed.
    Log,
}

/// Under `state.lock`: free the port, then remove the sandbox's files.
pub(super) fn forget(dirs: &Dirs, name: &str, keep: Keep) -> Result<()> {
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    // The machine's own podman home goes with it (its machine was removed
    // first); the user's podman home is never touched.
    if let Some(run) = super::load(dirs, name)?.and_then(|r| r.podman_run) {
        remove_tree(&run)?;
    }
    remove_tree(&dirs.sandbox_podman(name))?;
    let mut registry = PortRegistry::load(dirs)?;
    let keys = registry.port_of(name).map(|port| proxy::mitmdump::key_file(&dirs.wg(), port, registry.claim_of(port)));
    if registry.free(name).is_some() {
        registry.save_locked(dirs)?;
    }
    // The claim's keys die with it: the next claim of the port gets a new
    // file (mitmdump read this one when it started the server, which the
    // reload this is followed by stops).
    if let Some(keys) = keys
        && let Err(e) = std::fs::remove_file(&keys)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        eprintln!("warning: could not remove `{}`: {e}", keys.display());
    }
    let dir = dirs.sandbox(name);
    if keep == Keep::Log {
        for f in ["sandbox.json", "wg0.conf", "wg0.guest.conf", "provision.sh"] {
            match std::fs::remove_file(dir.join(f)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("could not remove `{}`", dir.join(f).display()));
                }
                _ => {}
            }
        }
        Ok(())
    } else {
        // The sandbox's own secrets go with it; global ones stay.
        match crate::secret::Store::open(dirs)
            .and_then(|store| store.remove_scope(&crate::secret::Scope::Sandbox(name.to_owned()), &lock))
        {
            Ok(0) => {}
            Ok(n) => eprintln!("ppp: removed {n} secret(s) scoped to `{name}`"),
            Err(e) => eprintln!("warning: could not remove the secrets scoped to `{name}`: {e:#}"),
        }
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("could not remove `{}`", dir.display()))
            }
            _ => Ok(()),
        }
    }
}

//! Apply a checked kit to a sandbox: check its secrets, then record its
//! rules, environment and files (under `state.lock`, atomically), then
//! install the files and run its startup commands in the VM, then restart
//! the agent container if what it is made from changed.
//!
//! Applying is idempotent: a kit's rules carry `kit: kit:<name>` and are
//! kept as they are when the kit asks for the same rules again (same ids,
//! same times, so the file does not change), else replaced; its variables
//! and file digests are stored under its name; files are installed with
//! `install -m`, which overwrites. Startup commands run every time: a kit
//! must write them to be safe to repeat (docs/kits.md says so).
//!
//! The agent container cannot simply be `podman restart`ed: that keeps its
//! old variables and mounts. Instead the record's `agent_generation` is
//! bumped, and a container labelled with an older one is stopped; the
//! `ppp run` session attached to it sees the new generation and starts the
//! agent again from the new record (ADR 0015).

use std::io::Write as _;

use anyhow::Result;

use super::Loaded;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::podman::Podman;
use crate::policy::{self, Rule, SandboxFile, Source};
use crate::sandbox::{self, Record, lifecycle};
use crate::state;

/// Where kit files wait in the VM before `install` puts them in place.
const GUEST_STAGING: &str = "/tmp/ppp/kit";

/// Check every secret `kits` need for `sandbox` (which may not exist yet:
/// then only global secrets count). The error names the first missing one.
pub fn check_secrets(dirs: &Dirs, sandbox: Option<&str>, kits: &[&Loaded]) -> Result<()> {
    let needed: Vec<(&str, &str)> = kits
        .iter()
        .flat_map(|l| l.kit.manifest.spec.secrets.iter().map(move |s| (l.kit.name(), s.service.as_str())))
        .collect();
    if needed.is_empty() {
        return Ok(());
    }
    let store = crate::secret::Store::open(dirs)?;
    for (kit, service) in needed {
        if !store.is_set(sandbox, service)? {
            let scope = sandbox.map_or_else(|| "-g ".to_owned(), |s| format!("--sandbox {s} "));
            return Err(fail(format!("kit `{kit}` needs the secret `{service}`, which is not stored"))
                .hint(format!("store it with `ppp secret set {scope}{service}`; nothing was applied"))
                .into());
        }
    }
    Ok(())
}

/// A kit asked for with `--kit` when a sandbox is created: checked with
/// the other requests before anything is made, applied once it is verified.
impl lifecycle::Extension for Loaded {
    fn describe(&self) -> String {
        format!("kit `{}` {}", self.kit.name(), self.kit.version())
    }

    fn check(&self, dirs: &Dirs, sandbox: Option<&str>) -> Result<()> {
        check_secrets(dirs, sandbox, &[self])
    }

    fn apply(&self, dirs: &Dirs, podman: &Podman, rec: &Record) -> Result<()> {
        apply(dirs, podman, rec, self).map(drop)
    }
}

/// Apply `kit` to the sandbox `rec` on its running machine.
pub fn apply(dirs: &Dirs, podman: &Podman, rec: &Record, loaded: &Loaded) -> Result<Record> {
    // Every podman call for the sandbox runs in its podman home.
    let podman = &crate::sandbox::podman_for(podman, dirs, rec);
    let kit = &loaded.kit;
    check_secrets(dirs, Some(&rec.name), &[loaded])?;
    let running = crate::sandbox::machine::list(podman)?.into_iter().any(|m| m.name == rec.machine_name && m.running);
    if !running && (!kit.files.is_empty() || !kit.manifest.spec.startup.is_empty()) {
        return Err(fail(format!(
            "sandbox `{}` is not running, so kit `{}` cannot install its files",
            rec.name,
            kit.name()
        ))
        .hint(format!("start it with `ppp run --name {} {} …`, then add the kit again", rec.name, rec.agent))
        .into());
    }
    // Rules first: a startup command may need the network the kit allows.
    let rec = record(dirs, &rec.name, loaded)?;
    crate::proxy::reload_or_warn(dirs);
    let in_vm = || -> Result<()> {
        install_files(dirs, podman, &rec, loaded)?;
        for (i, s) in kit.manifest.spec.startup.iter().enumerate() {
            crate::sandbox::machine::run_logged(
                dirs,
                &rec.name,
                &podman.ssh(&rec.machine_name, &s.command).timeout(std::time::Duration::from_secs(10 * 60)),
                &format!("kit `{}` startup command {}", kit.name(), i + 1),
            )?;
        }
        if running {
            restart_agent(dirs, podman, &rec)?;
        }
        Ok(())
    };
    // Applying converges, so the way out of a half-applied kit is to apply
    // it again once the cause is fixed; say so rather than undo.
    in_vm().map_err(|e| {
        e.context(fail(format!("kit `{}` is only partly applied to sandbox `{}`", kit.name(), rec.name)).hint(format!(
            "its rules and variables are recorded; once the cause is fixed, `ppp kit add {} {}` finishes it",
            rec.name, loaded.reference
        )))
    })?;
    Ok(rec)
}

/// Under `state.lock`: the kit's rules into the sandbox policy, its
/// environment, file digests and reference into `sandbox.json`. Files that
/// would not change are not written. `agent_generation` goes up when the
/// agent container's definition (variables, files) changed.
fn record(dirs: &Dirs, name: &str, loaded: &Loaded) -> Result<Record> {
    let kit = &loaded.kit;
    let id = kit.id();
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut rec = sandbox::load(dirs, name)?
        .ok_or_else(|| fail(format!("no sandbox named `{name}`")).hint("list sandboxes with `ppp ls`").code(2))?;
    let path = dirs.sandbox_policy(name);
    let mut file = policy::load_sandbox(&path)?.unwrap_or_default();
    let mine = |r: &Rule| r.source == Source::Kit && r.kit.as_deref() == Some(id.as_str());
    let current: Vec<_> = file.rules.iter().filter(|r| mine(r)).map(|r| (r.decision, r.resource.clone())).collect();
    if current != kit.rules {
        file.rules.retain(|r| !mine(r));
        for (decision, resource) in &kit.rules {
            let mut rule = Rule::new(*decision, resource.clone(), Source::Kit);
            rule.kit = Some(id.clone());
            file.rules.push(rule);
        }
        save_policy(&path, &file)?;
    }
    let before = rec.clone();
    if kit.env().is_empty() {
        rec.kit_env.remove(kit.name());
    } else {
        rec.kit_env.insert(kit.name().to_owned(), kit.env().clone());
    }
    let files = file_digests(&kit.files);
    if files.is_empty() {
        rec.kit_files.remove(kit.name());
    } else {
        rec.kit_files.insert(kit.name().to_owned(), files);
    }
    if rec.kit_env != before.kit_env || rec.kit_files != before.kit_files {
        rec.agent_generation += 1;
    }
    if !rec.kit_refs.contains(&loaded.reference) {
        rec.kit_refs.push(loaded.reference.clone());
    }
    if rec != before {
        sandbox::save_locked(dirs, &rec)?;
    }
    Ok(rec)
}

/// Guest path to `sha256:<hex>` of the file's mode (four octal digits and
/// a newline) and content: equal digests mean an identical installed file.
fn file_digests(files: &[super::File]) -> std::collections::BTreeMap<String, String> {
    files
        .iter()
        .map(|f| {
            let mut buf = format!("{:04o}\n", f.mode).into_bytes();
            buf.extend_from_slice(&f.bytes);
            (f.path.clone(), super::oci::digest(&buf))
        })
        .collect()
}

fn save_policy(path: &std::path::Path, file: &SandboxFile) -> Result<()> {
    policy::save_sandbox(path, file)
}

/// Copy each file to the VM's staging directory, then `sudo install` it
/// in place with its mode (creating parent directories).
fn install_files(dirs: &Dirs, podman: &Podman, rec: &Record, loaded: &Loaded) -> Result<()> {
    let kit = &loaded.kit;
    if kit.files.is_empty() {
        return Ok(());
    }
    let machine = &rec.machine_name;
    let run = |inv: &crate::exec::Invocation, what: &str| {
        crate::sandbox::machine::run_logged(dirs, &rec.name, inv, &format!("kit `{}`: {what}", kit.name()))
    };
    run(&podman.ssh(machine, &["mkdir", "-p", "-m", "0700", GUEST_STAGING]), "preparing the VM")?;
    let staging = tempfile::Builder::new()
        .prefix("kit-")
        .tempdir_in(dirs.sandbox(&rec.name))
        .map_err(|e| fail(format!("could not make a temporary directory: {e}")))?;
    for (i, f) in kit.files.iter().enumerate() {
        let local = staging.path().join(format!("{i}"));
        let mut out = std::fs::File::create(&local)?;
        out.write_all(&f.bytes)?;
        out.sync_all()?;
        let guest = format!("{GUEST_STAGING}/{}-{i}", kit.name());
        run(&podman.copy_in(&local, machine, &guest), &format!("copying `{}`", f.path))?;
        let mode = format!("{:04o}", f.mode);
        run(
            &podman.ssh(machine, &["sudo", "install", "-D", "-m", &mode, &guest, &f.path]),
            &format!("installing `{}`", f.path),
        )?;
        run(&podman.ssh(machine, &["rm", "-f", &guest]), "cleaning up")?;
    }
    Ok(())
}

/// Stop the agent container if it exists and was made from an older
/// `agent_generation` than the record's (its label says which); the
/// `ppp run` session attached to it starts it again from the record (see
/// the module comment). Comparing with the container's own label, not
/// with what this apply changed, also catches up after an apply that
/// failed half-way and one that raced a restart.
fn restart_agent(dirs: &Dirs, podman: &Podman, rec: &Record) -> Result<()> {
    use crate::sandbox::session::{GENERATION_LABEL, agent_container};
    let script = format!(
        "if podman container exists \"$1\" && \
         [ \"$(podman container inspect --format '{{{{index .Config.Labels \"{GENERATION_LABEL}\"}}}}' \"$1\")\" != \"$2\" ]; \
         then podman stop -t 10 \"$1\" >/dev/null; fi"
    );
    let generation = rec.agent_generation.to_string();
    crate::sandbox::machine::run_logged(
        dirs,
        &rec.name,
        &podman.ssh(&rec.machine_name, &["sh", "-c", &script, "sh", &agent_container(&rec.name), &generation]),
        "restarting the agent container",
    )
}

//! A sandbox's life: create (claim a port, bring up its WireGuard server,
//! init and start its own Podman Machine, provision, verify, apply the
//! extensions asked for), reattach, stop, and remove. This file puts the
//! steps in order; each step lives beside it: [`super::request`],
//! `claim` (and rollback), [`super::machine`], [`super::provision`],
//! [`super::workspace`], [`super::verify`], and [`super::session`] for
//! the agent once the sandbox is handed over.
//!
//! Long steps (booting a VM, provisioning) run without `state.lock`; the
//! lock is taken only to change state files, so other commands are never
//! blocked behind a VM boot. Every failure after the port is claimed rolls
//! back what was created, so nothing is left half made.
//!
//! Nothing here knows what builds on sandboxes: kits reach a new sandbox
//! as [`Extension`]s the command passes in.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::claim::{Keep, claim, forget, rollback};
use super::machine;
use super::provision::provision;
use super::request::Request;
use super::ui::Ui;
use super::verify::verify;
use super::workspace::{clone_into, clone_remote, guest_path};
use super::{PortRegistry, Record, Status};
use crate::agent;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::podman::{InitSpec, Podman};
use crate::proxy::{self, supervisor};
use crate::state;

/// How long a new WireGuard server may take to print its config.
const WG0_DEADLINE: Duration = Duration::from_secs(60);

/// Something a new sandbox gets once it is verified, before it is handed
/// over: a kit, today. Defined here and implemented above (`kit/`), so the
/// lifecycle creates sandboxes without knowing what builds on them.
pub trait Extension {
    /// How progress names it, e.g. "kit `tools` 0.1.0".
    fn describe(&self) -> String;
    /// Refuse, before anything is created, what could not be applied to the
    /// sandbox `sandbox` (`None` while its name is not chosen yet).
    fn check(&self, dirs: &Dirs, sandbox: Option<&str>) -> Result<()>;
    /// Apply it to the new sandbox, running and verified.
    fn apply(&self, dirs: &Dirs, podman: &Podman, rec: &Record) -> Result<()>;
}

/// Create a sandbox and hand it over verified, with `extensions` applied in
/// order; returns its record.
pub fn create(dirs: &Dirs, podman: &Podman, req: &Request, extensions: &[&dyn Extension], ui: Ui) -> Result<Record> {
    // A saved template's disk, or (a tag ppp does not know) an image
    // reference passed to podman as it is. Resolved before anything is made.
    let mut from_saved = false;
    let image = match &req.template {
        Some(t) => {
            let (disk, saved) = crate::template::resolve(dirs, t)?;
            from_saved = saved.is_some();
            if let Some(from) = saved.as_ref().and_then(|s| s.agent.as_deref()).filter(|a| *a != req.agent.name) {
                // It works (provisioning pulls what is missing), but the
                // point of a template, an image already in place, is lost.
                eprintln!(
                    "warning: template `{t}` was saved from a sandbox running {from}, not {}; its image will be pulled",
                    req.agent.name
                );
            }
            Some(disk)
        }
        None => None,
    };
    // Checked before anything is created: the machine would not start
    // without its hypervisor, nor past the bounds on running sandboxes
    // (checked again, under the start lock, just before it starts), and the
    // daemon not without mitmproxy (installed now if missing, which needs
    // Python).
    podman.check_hypervisor()?;
    // The user's own podman home: a machine there already named like the
    // new sandbox's is not ppp's to take.
    let all = machine::list(podman)?;
    machine::admit(dirs, podman, "", req.memory_mib, true)?;
    if !supervisor::is_running(dirs)? {
        proxy::mitmdump::ensure(dirs, |msg| ui.note(msg)).context("the sandbox's proxy needs mitmproxy")?;
    }
    for e in extensions {
        e.check(dirs, req.name.as_deref())?;
    }
    let claim = claim(dirs, req, &all)?;
    let name = claim.record.name.clone();
    // From here on every podman call is in the sandbox's own home.
    let podman = &super::podman_for(podman, dirs, &claim.record);
    ui.note(&format!("creating sandbox `{name}` (WireGuard port {})", claim.record.port));
    let mut made_machine = false;
    let mut started_daemon = false;
    // Ctrl-C reaches podman (same process group) and ends the step it is
    // in; ppp itself stays alive to roll back, and stops between steps.
    let interrupt = Interrupt::catch();
    let result = (|| -> Result<Record> {
        started_daemon = ensure_daemon(dirs, ui)?;
        interrupt.check()?;
        wait_for_wg0(dirs, &name, claim.record.port)?;
        let machine_name = &claim.record.machine_name;
        machine::prepare_home(&podman.home)?;
        // The image ppp keeps (fetched by the first sandbox's init), unless
        // a template gives its own.
        let fetches = image.is_none() && machine::cached_image(dirs, podman).is_none();
        let image = image.or_else(|| machine::cached_image(dirs, podman));
        let spec = InitSpec {
            name: machine_name.clone(),
            cpus: req.cpus,
            memory_mib: req.memory_mib,
            disk_gib: req.disk_gib,
            image,
            // A cloned workspace is not mounted: the VM works on its own copy.
            volumes: req
                .workspace
                .iter()
                .filter(|_| !req.clone)
                .map(|p| {
                    let host = p.display().to_string();
                    let guest = guest_path(&host);
                    if guest != host {
                        eprintln!(
                            "warning: `{host}` cannot be mounted at the same path; the sandbox sees it at `{guest}`"
                        );
                    }
                    (host, guest)
                })
                .collect(),
        };
        interrupt.check()?;
        ui.timed(&format!("initialising machine `{machine_name}`"), || {
            machine::run_logged(dirs, &name, &podman.init(&spec), "podman machine init")
        })?;
        made_machine = true;
        if fetches && let Err(e) = machine::keep_image(dirs, podman) {
            eprintln!("warning: could not keep the machine image for the next sandboxes: {e:#}");
        }
        interrupt.check()?;
        {
            let _start = machine::start_lock(dirs)?;
            machine::admit(dirs, podman, &name, req.memory_mib, true)?;
            machine::start(dirs, podman, &name, machine_name, ui)?;
            set_boot_id(dirs, &name, machine::boot_id(podman, machine_name))?;
        }
        interrupt.check()?;
        provision(dirs, podman, &claim.record, req.image.to_pull(), ui)?;
        interrupt.check()?;
        // No agent has run in this VM yet, so a build here may be cached;
        // a saved template's disk comes from a sandbox an agent has used (a
        // machine image given as `-t` is as fresh as podman's own).
        let pristine = !from_saved;
        let (image, origin) = super::image::ensure(dirs, podman, &claim.record, &req.image, pristine, ui)?;
        let origin = origin.or(req.template.as_ref().map(|_| super::ImageOrigin::Template));
        let record = set_image(dirs, &name, &image, origin)?;
        interrupt.check()?;
        if let Some(guest) = &claim.record.clone {
            clone_into(dirs, podman, &claim.record, &req.workspace[0], guest, ui)?;
        }
        interrupt.check()?;
        verify(dirs, podman, &record, ui)?;
        for e in extensions {
            interrupt.check()?;
            ui.timed(&format!("applying {}", e.describe()), || e.apply(dirs, podman, &record))?;
        }
        interrupt.check()?;
        set_status(dirs, &name, Status::Running)
    })();
    let result = result.map_err(|e| if interrupt.caught() { e.context(fail("interrupted")) } else { e });
    match result {
        Ok(rec) => Ok(rec),
        Err(e) => {
            ui.note(&format!("creating `{name}` failed; removing what was made"));
            rollback(dirs, podman, &claim, made_machine, started_daemon);
            // Said even with -q: the name was printed nowhere else.
            eprintln!("ppp: sandbox `{name}` was not created");
            Err(e)
        }
    }
}

/// SIGINT caught for the life of this value instead of ending ppp.
struct Interrupt {
    flag: std::sync::Arc<std::sync::atomic::AtomicBool>,
    id: Option<signal_hook::SigId>,
}

impl Interrupt {
    fn catch() -> Self {
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let id = signal_hook::flag::register(signal_hook::consts::SIGINT, flag.clone()).ok();
        Self { flag, id }
    }

    fn caught(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn check(&self) -> Result<()> {
        if self.caught() { Err(fail("interrupted").into()) } else { Ok(()) }
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Start the daemon if it is not running (true: this call started it);
/// otherwise ask it to reload, so it serves a port claimed since it started.
fn ensure_daemon(dirs: &Dirs, ui: Ui) -> Result<bool> {
    if supervisor::is_running(dirs)? {
        if let proxy::Reload::Failed(why) = proxy::notify_reload(dirs) {
            return Err(fail(format!("the ppp daemon did not reload: {why}"))
                .hint("restart it with `ppp daemon stop && ppp daemon start -d`")
                .into());
        }
        return Ok(false);
    }
    ui.timed("starting the ppp daemon", || {
        let me = std::env::current_exe().context("could not find the ppp executable")?;
        let inv = Invocation::new(me).args(["daemon", "start", "-d"]).timeout(Duration::from_secs(15 * 60));
        let generic = "see `ppp daemon status` and `ppp daemon start` for details";
        exec::run(&inv).map(drop).map_err(|e| {
            // `ppp daemon start -d` printed its error, cause and hint; keep
            // them all (the exec error alone shows only its last line).
            let cause = match &e {
                exec::ExecError::Failed { stderr, .. } => crate::error::from_rendered(stderr, generic),
                _ => None,
            };
            match cause {
                Some(c) => c.context("could not start the ppp daemon").context("the sandbox needs the ppp daemon"),
                None => anyhow::Error::new(e)
                    .context("could not start the ppp daemon")
                    .context(fail("the sandbox needs the ppp daemon").hint(generic)),
            }
        })
    })?;
    Ok(true)
}

/// Wait until the daemon serves `port` and has written the sandbox's
/// `wg0.conf`.
fn wait_for_wg0(dirs: &Dirs, name: &str, port: u16) -> Result<()> {
    let end = Instant::now() + WG0_DEADLINE;
    loop {
        let rec = supervisor::load_record(dirs)?;
        if dirs.sandbox_wg_conf(name).exists() && rec.is_some_and(|r| r.ready && r.ports.contains(&port)) {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(fail(format!(
                "the ppp daemon has no WireGuard server on port {port} after {} s",
                WG0_DEADLINE.as_secs()
            ))
            .hint(format!("see `ppp daemon status` and `{}`", dirs.proxy_log().display()))
            .into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Bring an existing sandbox back: start its machine if needed, make sure
/// the daemon serves it, provision again (idempotent) and verify.
pub fn reattach(dirs: &Dirs, podman: &Podman, name: &str, ui: Ui) -> Result<Record> {
    let rec = super::load(dirs, name)?.ok_or_else(|| unknown(name))?;
    let podman = &super::podman_for(podman, dirs, &rec);
    // Held until the machine is up: a disk being copied must not change.
    let _disk = machine::disk_lease(dirs, name)?;
    let all = machine::list(podman)?;
    let vm = all.iter().find(|m| m.name == rec.machine_name).ok_or_else(|| {
        fail(format!("sandbox `{name}` has no machine `{}` any more", rec.machine_name))
            .hint(format!("remove it with `ppp rm -f {name}` and create it again"))
    })?;
    ensure_daemon(dirs, ui)?;
    wait_for_wg0(dirs, name, rec.port)?;
    let mut running = vm.running;
    if let Some(why) = &vm.broken {
        // Its gvproxy or qemu is gone: only a fresh start brings it back.
        ui.note(&format!("the machine of `{name}` is broken ({why}): stopping it first"));
        stop_machine(dirs, podman, name, &rec.machine_name)?;
        running = false;
    }
    if running && lost_its_mounts(podman, &rec) {
        // A reboot from inside the guest: the machine runs, its workspace
        // is not mounted, and only podman's own start mounts it again.
        ui.timed(&format!("the VM of `{name}` rebooted by itself and lost the workspace: restarting it"), || {
            machine::run_logged(dirs, name, &podman.stop(&rec.machine_name), "podman machine stop")
        })?;
        running = false;
    }
    if !running {
        let _start = machine::start_lock(dirs)?;
        machine::admit(dirs, podman, name, rec.memory, rec.podman_run.is_some())?;
        machine::start(dirs, podman, name, &rec.machine_name, ui)?;
        set_boot_id(dirs, name, machine::boot_id(podman, &rec.machine_name))?;
    }
    let choice = super::image::choose(agent::find(&rec.agent)?, |k| std::env::var(k).ok())?;
    provision(dirs, podman, &rec, choice.to_pull(), ui)?;
    // An agent has run here: a build is used, never cached for others.
    let (image, origin) = super::image::ensure(dirs, podman, &rec, &choice, false, ui)?;
    let rec = set_image(dirs, name, &image, origin)?;
    verify(dirs, podman, &rec, ui)?;
    set_status(dirs, name, Status::Running)
}

/// Stop a sandbox's machine; its port stays its own.
pub fn stop(dirs: &Dirs, podman: &Podman, name: &str, ui: Ui) -> Result<()> {
    let rec = super::load(dirs, name)?.ok_or_else(|| unknown(name))?;
    let podman = &super::podman_for(podman, dirs, &rec);
    ui.timed(&format!("stopping `{name}`"), || {
        stop_machine(dirs, podman, name, &rec.machine_name)?;
        set_status(dirs, name, Status::Stopped)?;
        Ok(())
    })
}

/// Stop sandbox `name`'s machine and leave nothing of it running. When
/// podman's stop fails on a machine that cannot work any more (its gvproxy
/// or its qemu gone: podman 5.4.2 then stops qemu and fails on "unable to
/// clean up gvproxy"), ppp says why and finishes the stop itself: it ends
/// what is left by the pids podman recorded (see [`machine::Remains`]).
/// A machine podman lists stopped whose gvproxy outlived its qemu is
/// finished the same way.
fn stop_machine(dirs: &Dirs, podman: &Podman, name: &str, machine_name: &str) -> Result<()> {
    let find = |all: Vec<crate::podman::Machine>| all.into_iter().find(|m| m.name == machine_name);
    let before = find(machine::list(podman)?);
    let running = before.as_ref().is_some_and(|m| m.running || m.starting);
    if let Some(why) = before.as_ref().and_then(|m| m.broken.as_deref()) {
        eprintln!("warning: machine `{machine_name}` of `{name}` is broken: {why}");
    }
    if running && let Err(e) = machine::run_logged(dirs, name, &podman.stop(machine_name), "podman machine stop") {
        let now = machine::list(podman).ok().and_then(find);
        let still = now.as_ref().is_some_and(|m| m.running || m.starting);
        let remains = machine::remains(&podman.home, machine_name, &podman.provider);
        let why = remains.as_ref().and_then(|r| r.broken(still)).or_else(|| before.and_then(|m| m.broken));
        match why {
            None if still => return Err(e),
            why => eprintln!(
                "warning: {e}\n  machine `{machine_name}` {}; ppp finishes the stop",
                why.map_or_else(|| "is down all the same".to_owned(), |w| format!("cannot work: {w}"))
            ),
        }
    }
    let remains = machine::remains(&podman.home, machine_name, &podman.provider);
    for line in remains.map(|r| r.reap()).unwrap_or_default() {
        eprintln!("warning: {line}");
        let _ = writeln!(machine::open_log(dirs, name)?, "# ppp: {line}");
    }
    Ok(())
}

/// Remove a sandbox: its machine (even an unresponsive one with `force`),
/// its port, its state.
pub fn remove(dirs: &Dirs, podman: Option<&Podman>, name: &str, force: bool, ui: Ui) -> Result<()> {
    let rec = super::load(dirs, name)?;
    let machine = rec.as_ref().map_or_else(|| super::machine_name(name), |r| r.machine_name.clone());
    let in_home = rec.as_ref().zip(podman).map(|(r, p)| super::podman_for(p, dirs, r));
    let podman = in_home.as_ref().or(podman);
    if rec.is_none() && PortRegistry::load(dirs)?.port_of(name).is_none() {
        // What a failed create kept: its log (and a policy prepared for the
        // name, which stays for the next attempt).
        let log = dirs.sandbox_machine_log(name);
        if log.exists() {
            std::fs::remove_file(&log).with_context(|| format!("could not remove `{}`", log.display()))?;
            let _ = std::fs::remove_dir(dirs.sandbox(name)); // only if now empty
            ui.note(&format!("removed the log of a failed create of `{name}`"));
            return Ok(());
        }
        return Err(unknown(name));
    }
    ui.timed(&format!("removing `{name}`"), || {
        if let Some(podman) = podman {
            // When podman cannot list machines, try removing anyway.
            let listed = machine::list(podman).map(|all| all.into_iter().find(|m| m.name == machine));
            let exists = listed.as_ref().map_or(true, Option::is_some);
            // A broken machine is stopped first, as `ppp stop` would:
            // podman's own stop inside `rm` fails on it.
            if let Ok(Some(m)) = &listed
                && m.broken.is_some()
                && let Err(e) = stop_machine(dirs, podman, name, &machine)
            {
                eprintln!("warning: could not stop broken machine `{machine}`: {e:#}");
            }
            if exists && let Err(e) = exec::run(&podman.rm(&machine)) {
                if !force {
                    return Err(anyhow::Error::new(e).context(
                        fail(format!("could not remove machine `{machine}`")).hint(format!(
                            "`ppp rm -f {name}` removes the sandbox's state even when its machine does not answer"
                        )),
                    ));
                }
                eprintln!("warning: could not remove machine `{machine}`: {e}; removing the sandbox's state anyway");
            }
            // Nothing of it may outlive its home (which goes next): a gvproxy
            // whose qemu died is not podman's `rm`'s to end.
            let remains = machine::remains(&podman.home, &machine, &podman.provider);
            for line in remains.map(|r| r.reap()).unwrap_or_default() {
                eprintln!("warning: {line}");
            }
        } else if !force {
            return Err(fail("podman was not found, so the sandbox's machine cannot be removed")
                .hint(format!("`ppp rm -f {name}` removes the sandbox's state anyway"))
                .into());
        }
        if let Some(r) = rec.as_ref().filter(|r| r.clone.is_some())
            && let Some(ws) = r.workspace.first()
        {
            let inv = Invocation::new("git").args(["-C", ws, "remote", "remove", &clone_remote(name)]);
            if let Err(e) = exec::run(&inv.timeout(Duration::from_secs(30))) {
                eprintln!("warning: could not remove the remote `{}` from `{ws}`: {e}", clone_remote(name));
            }
        }
        forget(dirs, name, Keep::Nothing)?;
        let _ = proxy::notify_reload(dirs);
        Ok(())
    })
}

fn unknown(name: &str) -> anyhow::Error {
    fail(format!("no sandbox named `{name}`")).hint("list sandboxes with `ppp ls`").code(2).into()
}

/// Under `state.lock`: record the image a sandbox's agent runs and where
/// it came from (`None`: it was in the VM already, so the origin stays).
fn set_image(dirs: &Dirs, name: &str, image: &str, origin: Option<super::ImageOrigin>) -> Result<Record> {
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut rec = super::load(dirs, name)?.ok_or_else(|| unknown(name))?;
    if rec.image.as_deref() != Some(image) || origin.is_some() {
        rec.image_origin = origin;
    }
    rec.image = Some(image.to_owned());
    super::save_locked(dirs, &rec)?;
    Ok(rec)
}

/// Under `state.lock`: set a sandbox's status.
/// Whether the guest rebooted by itself since podman started it, and so
/// lost the workspace mounts: podman mounts them over ssh at `machine
/// start` only, and still calls the machine running. Judged on both the
/// boot id (a new boot) and the first mount (not a mount point), so a
/// machine started outside ppp, whose mounts podman made, is left alone.
fn lost_its_mounts(podman: &Podman, rec: &Record) -> bool {
    let (Some(was), Some(ws)) = (rec.boot_id.as_deref(), super::workspace::guest_workspaces(rec).into_iter().next())
    else {
        return false;
    };
    if rec.clone.is_some() || machine::boot_id(podman, &rec.machine_name).is_none_or(|now| now == was) {
        return false;
    }
    let inv = podman.ssh(&rec.machine_name, &["mountpoint", "-q", &ws]).timeout(Duration::from_secs(60));
    matches!(exec::output(&inv), Ok((code, _)) if code != 0)
}

/// Under `state.lock`: record the boot id podman's start left the guest in.
fn set_boot_id(dirs: &Dirs, name: &str, boot_id: Option<String>) -> Result<Record> {
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut rec = super::load(dirs, name)?.ok_or_else(|| unknown(name))?;
    rec.boot_id = boot_id;
    super::save_locked(dirs, &rec)?;
    Ok(rec)
}

fn set_status(dirs: &Dirs, name: &str, status: Status) -> Result<Record> {
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut rec = super::load(dirs, name)?.ok_or_else(|| unknown(name))?;
    rec.status = status;
    super::save_locked(dirs, &rec)?;
    Ok(rec)
}

//! A sandbox's Podman Machine: the machines podman knows, starting one
//! where the provider runs one at a time, the disk lease `template save`
//! holds, and running podman with its output kept in `machine.log`.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;

use anyhow::{Context, Result};

use super::lifecycle::Ui;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::podman::{self, Machine, Podman};
use crate::state;

/// The machines podman knows, or an error naming the podman failure.
pub fn list(podman: &Podman) -> Result<Vec<Machine>> {
    let out = exec::run(&podman.list())?;
    podman::parse_machine_list(&out.stdout).context("could not parse `podman machine list --format json`")
}

/// Refuse to start `machine` while another machine runs, where podman
/// runs one machine at a time (every provider but WSL). Said before podman
/// is asked, naming the running one and how to stop it.
pub fn ensure_can_start(podman: &Podman, machine: &str, all: &[Machine]) -> Result<()> {
    if podman.allows_many_running() {
        return Ok(());
    }
    let Some(other) = all.iter().find(|m| m.name != machine && (m.running || m.starting)) else {
        return Ok(());
    };
    Err(one_vm_error(podman, &other.name))
}

fn one_vm_error(podman: &Podman, running: &str) -> anyhow::Error {
    let how = running
        .strip_prefix(super::MACHINE_PREFIX)
        .map_or_else(|| format!("`podman machine stop {running}`"), |sandbox| format!("`ppp stop {sandbox}`"));
    fail(format!(
        "machine `{running}` is running, and podman's {} provider runs only one machine at a time",
        podman.provider
    ))
    .hint(format!("stop the running one first: {how}"))
    .into()
}

/// Start a machine, turning podman's one-VM refusal into ppp's message.
pub(super) fn start(dirs: &Dirs, podman: &Podman, name: &str, machine: &str, ui: Ui) -> Result<()> {
    ui.timed(&format!("starting machine `{machine}`"), || {
        let log = open_log(dirs, name)?;
        let (code, out) = exec::output(&podman.start(machine))?;
        let _ = writeln!(&log, "$ {}\n{}{}", podman.start(machine), out.stdout, out.stderr);
        if code == 0 {
            return Ok(());
        }
        if podman::is_one_vm_refusal(&out.stderr) {
            let running = list(podman)
                .ok()
                .and_then(|all| all.into_iter().find(|m| m.name != machine && (m.running || m.starting)))
                .map_or_else(|| "another machine".to_owned(), |m| m.name);
            return Err(one_vm_error(podman, &running));
        }
        Err(fail(format!("`{}` failed: {}", podman.start(machine), last_line(&out.stderr)))
            .hint(format!("see `{}`", dirs.sandbox_machine_log(name).display()))
            .into())
    })
}

/// The sandbox's disk lock, or an error when `ppp template save` holds it
/// (a flock: a save that dies lets go of it).
pub fn disk_lease(dirs: &Dirs, name: &str) -> Result<state::Lock> {
    state::Lock::try_acquire(&dirs.sandbox_disk_lock(name))?.ok_or_else(|| {
        fail(format!("sandbox `{name}` is being saved as a template; its machine must not start meanwhile"))
            .hint("wait for `ppp template save` to finish, then try again")
            .into()
    })
}

pub(super) fn open_log(dirs: &Dirs, name: &str) -> Result<std::fs::File> {
    let path = dirs.sandbox_machine_log(name);
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("could not open `{}`", path.display()))
}

/// Run `inv` with its output in machine.log; a failure names `what` and
/// quotes the last line it printed.
pub(crate) fn run_logged(dirs: &Dirs, name: &str, inv: &Invocation, what: &str) -> Result<()> {
    let log = open_log(dirs, name)?;
    let _ = writeln!(&log, "$ {inv}");
    let code = exec::run_to_log(inv, &log)?;
    if code == 0 {
        return Ok(());
    }
    let text = std::fs::read_to_string(dirs.sandbox_machine_log(name)).unwrap_or_default();
    Err(fail(format!("{what} failed (`{inv}` exited with status {code}): {}", last_line(&text)))
        .hint(format!("see `{}`", dirs.sandbox_machine_log(name).display()))
        .into())
}

pub(super) fn last_line(text: &str) -> &str {
    text.lines().rev().find(|l| !l.trim().is_empty()).map_or("", str::trim)
}

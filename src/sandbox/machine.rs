//! A sandbox's Podman Machine: the machines podman knows in every home,
//! whether a start may go ahead (the host's memory, the configured cap, and
//! podman's one-machine rule in the user's own home), each sandbox's own
//! podman home and the machine image they share, the disk lease `template
//! save` holds, and running podman with its output kept in `machine.log`.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::Record;
use super::ui::Ui;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::podman::{self, Home, Machine, Podman};
use crate::state;

/// The machines podman knows in `podman`'s home, or an error naming the
/// podman failure.
pub fn list(podman: &Podman) -> Result<Vec<Machine>> {
    let out = exec::run(&podman.list())?;
    let mut all =
        podman::parse_machine_list(&out.stdout).context("could not parse `podman machine list --format json`")?;
    for m in &mut all {
        judge(&podman.home, m, &podman.provider);
    }
    Ok(all)
}

/// Set `m.broken` from what ppp sees of its processes (ppp's own homes
/// only; a machine still starting is left alone).
fn judge(home: &Home, m: &mut Machine, provider: &str) {
    if m.starting && !m.running {
        return;
    }
    let provider = m.vm_type.clone().unwrap_or_else(|| provider.to_owned());
    m.broken = remains(home, &m.name, &provider).and_then(|r| r.broken(m.running));
}

/// What ppp sees of one process podman recorded for a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// No pid file (never started, or podman cleaned up).
    NoFile,
    /// A pid file naming no process of this machine: it died (a pid
    /// reused by another process counts as dead).
    Gone(i32),
    /// Alive, and its command line names this home's runtime directory.
    Alive(i32),
}

/// The processes podman recorded for one machine of a ppp home, as found.
#[derive(Debug, Clone)]
pub struct Remains {
    runtime: PathBuf,
    machine: String,
    provider: String,
    pub gvproxy: Seen,
    pub qemu: Seen,
}

/// Podman's pid files of `machine` in `home`. Only ppp's own homes: there
/// ppp chose the runtime directory, so the files are where it looks, and a
/// pid is taken as the machine's only when its process names that
/// directory (its sockets and pid file are in it), never by a program's
/// name.
pub fn remains(home: &Home, machine: &str, provider: &str) -> Option<Remains> {
    let Home::Own(h) = home else { return None };
    let seen = |what: podman::MachineProcess| {
        if !what.runs_on(provider) {
            return Seen::NoFile;
        }
        let Ok(text) = std::fs::read_to_string(what.pid_file(&h.runtime, machine)) else { return Seen::NoFile };
        match text.trim().parse::<i32>() {
            Ok(pid) if pid > 1 && is_ours(pid, &h.runtime) => Seen::Alive(pid),
            Ok(pid) => Seen::Gone(pid),
            Err(_) => Seen::Gone(0),
        }
    };
    Some(Remains {
        runtime: h.runtime.clone(),
        machine: machine.to_owned(),
        provider: provider.to_owned(),
        gvproxy: seen(podman::MachineProcess::Gvproxy),
        qemu: seen(podman::MachineProcess::Qemu),
    })
}

/// Whether `pid` is alive and one of the machine's own: its command line
/// names the home's runtime directory (where its sockets and pid file are).
fn is_ours(pid: i32, runtime: &Path) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
        return false;
    }
    if cfg!(target_os = "linux") {
        // A zombie has an empty command line: dead for this purpose.
        let needle = runtime.as_os_str().as_encoded_bytes();
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
    } else {
        true
    }
}

impl Remains {
    /// Why the machine cannot work, if it cannot, given whether podman
    /// lists it running: running without its gvproxy (no network, no
    /// management channel) or without its qemu; or listed stopped (its qemu
    /// died outside podman) with its gvproxy or qemu still there.
    pub fn broken(&self, running: bool) -> Option<String> {
        use podman::MachineProcess::Gvproxy;
        if running {
            if Gvproxy.runs_on(&self.provider) && !matches!(self.gvproxy, Seen::Alive(_)) {
                return Some(format!("its gvproxy{} is gone: the VM has no network", pid_words(self.gvproxy)));
            }
            if let Seen::Gone(_) = self.qemu {
                return Some(format!("its qemu{} is gone", pid_words(self.qemu)));
            }
            return None;
        }
        match (self.qemu, self.gvproxy) {
            (Seen::Alive(pid), _) => Some(format!("podman lists it stopped, yet its qemu (pid {pid}) still runs")),
            (_, Seen::Alive(pid)) => Some(format!(
                "its VM is gone (podman lists it stopped; qemu died outside podman), yet its gvproxy (pid {pid}) still runs"
            )),
            _ => None,
        }
    }

    /// Whether nothing of the machine is left running.
    pub fn is_clear(&self) -> bool {
        !matches!(self.gvproxy, Seen::Alive(_)) && !matches!(self.qemu, Seen::Alive(_))
    }

    /// End what is left of the machine, by the pids podman recorded (each
    /// checked to be the machine's own, see [`remains`]): SIGTERM, then
    /// SIGKILL after 10 s; then remove the pid files that name no live
    /// process, as podman's own cleanup would (a stale `gvproxy.pid` fails
    /// podman's next stop). Returns a line for each process ended.
    pub fn reap(&self) -> Vec<String> {
        use podman::MachineProcess::{Gvproxy, Qemu};
        let mut said = Vec::new();
        // qemu first: without it, gvproxy serves nothing.
        for (what, seen) in [(Qemu, self.qemu), (Gvproxy, self.gvproxy)] {
            if let Seen::Alive(pid) = seen {
                let target = nix::unistd::Pid::from_raw(pid);
                let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM);
                let end = std::time::Instant::now() + Duration::from_secs(10);
                while is_ours(pid, &self.runtime) && std::time::Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if is_ours(pid, &self.runtime) {
                    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
                }
                said.push(format!("ended {} (pid {pid}), left behind by machine `{}`", what.name(), self.machine));
            }
            let file = what.pid_file(&self.runtime, &self.machine);
            let pid = std::fs::read_to_string(&file).ok().and_then(|t| t.trim().parse::<i32>().ok());
            if pid.is_some_and(|p| !is_ours(p, &self.runtime)) || (file.exists() && pid.is_none()) {
                let _ = std::fs::remove_file(&file);
            }
        }
        said
    }
}

/// What `ls` and `diagnose` say of sandbox `name` whose machine is broken
/// for the reason `why`, with what to do.
pub fn broken_hint(name: &str, why: &str) -> String {
    format!(
        "sandbox `{name}`'s machine is broken: {why}\n\
         hint: `ppp stop {name}` ends what is left of it; `ppp run --name {name} …` starts it again, \
         `ppp rm {name}` removes it"
    )
}

fn pid_words(seen: Seen) -> String {
    match seen {
        Seen::Gone(pid) | Seen::Alive(pid) if pid > 0 => format!(" (pid {pid})"),
        _ => String::new(),
    }
}

/// What podman lists in every home ppp uses: the user's own, and each
/// sandbox's.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The user's own podman home (sandboxes of an earlier ppp, and
    /// machines that are not ppp's); `None` when podman did not answer.
    pub user: Option<Vec<Machine>>,
    /// Each sandbox in a home of its own: its machine, if podman lists one.
    pub own: BTreeMap<String, Option<Machine>>,
    /// Why a home could not be listed, by sandbox (`""`: the user's home).
    pub errors: BTreeMap<String, String>,
}

impl Listing {
    /// Sandbox `rec`'s machine: `Ok(None)` when its home has none,
    /// `Err(())` when its home could not be listed.
    #[allow(clippy::result_unit_err)] // "not known" needs no more words
    pub fn machine_of(&self, rec: &Record) -> Result<Option<&Machine>, ()> {
        if rec.podman_run.is_some() {
            match self.own.get(&rec.name) {
                Some(m) => Ok(m.as_ref()),
                None => Err(()),
            }
        } else {
            self.user.as_ref().map(|ms| ms.iter().find(|m| m.name == rec.machine_name)).ok_or(())
        }
    }

    /// Every machine listed, with the sandbox whose home it is in (`None`:
    /// the user's home).
    pub fn all(&self) -> Vec<(Option<&str>, &Machine)> {
        let user = self.user.iter().flatten().map(|m| (None, m));
        let own = self.own.iter().filter_map(|(n, m)| m.as_ref().map(|m| (Some(n.as_str()), m)));
        user.chain(own).collect()
    }
}

/// List every home: the user's, and that of each of `records` that has one
/// (a few at a time, each bounded by `machine list`'s timeout). `timeout`
/// overrides that bound (diagnose's probe).
pub fn list_all(program: &Path, dirs: &Dirs, records: &[Record], timeout: Option<std::time::Duration>) -> Listing {
    list_homes(program, dirs, records, timeout, true)
}

/// [`list_all`], the user's home left out unless `with_user`.
pub fn list_homes(
    program: &Path,
    dirs: &Dirs,
    records: &[Record],
    timeout: Option<std::time::Duration>,
    with_user: bool,
) -> Listing {
    let ask = |home: &Home| -> Result<Vec<Machine>, String> {
        let mut inv = podman::machine_list(program.to_owned(), home);
        if let Some(t) = timeout {
            inv = inv.timeout(t);
        }
        let out = exec::run(&inv).map_err(|e| e.to_string())?;
        podman::parse_machine_list(&out.stdout).map_err(|e| format!("could not parse `{inv}` output: {e}"))
    };
    let own: Vec<&Record> = records.iter().filter(|r| r.podman_run.is_some()).collect();
    let mut listing = Listing::default();
    // Eight at a time: `machine list` is quick, but each is a process.
    let mut results: Vec<Answer> = Vec::new();
    std::thread::scope(|s| {
        let user = with_user.then(|| s.spawn(|| ask(&Home::User)));
        for chunk in own.chunks(8) {
            let handles: Vec<_> =
                chunk.iter().map(|r| (r.name.clone(), s.spawn(|| ask(&super::home(dirs, r))))).collect();
            for (name, h) in handles {
                results.push((Some(name), h.join().unwrap_or_else(|_| Err("listing panicked".to_owned()))));
            }
        }
        if let Some(user) = user {
            results.push((None, user.join().unwrap_or_else(|_| Err("listing panicked".to_owned()))));
        }
    });
    for (name, result) in results {
        match (name, result) {
            (None, Ok(ms)) => listing.user = Some(ms),
            (None, Err(e)) => {
                listing.errors.insert(String::new(), e);
            }
            (Some(n), Ok(ms)) => {
                let rec = records.iter().find(|r| r.name == n);
                let machine = rec.map(|r| r.machine_name.clone());
                let mut m = ms.into_iter().find(|m| Some(&m.name) == machine.as_ref());
                if let (Some(m), Some(r)) = (m.as_mut(), rec) {
                    judge(&super::home(dirs, r), m, podman::default_provider());
                }
                listing.own.insert(n, m);
            }
            (Some(n), Err(e)) => {
                listing.errors.insert(n, e);
            }
        }
    }
    listing
}

/// Whose home (`None`: the user's) and what podman said of it.
type Answer = (Option<String>, Result<Vec<Machine>, String>);

/// Held from the check that a sandbox may start until its machine is up,
/// so two starts at once cannot both fit under the bounds.
pub fn start_lock(dirs: &Dirs) -> Result<state::Lock> {
    state::Lock::acquire(&dirs.start_lock())
}

/// Refuse to start sandbox `rec` (memory `memory_mib`) when:
/// - the configured cap (`sandboxes.max_running`) is reached;
/// - the running sandboxes' memory and its own would be more than the
///   host has, or its own more than the host can give now (see
///   [`super::host::HostMemory`]);
/// - it lives in the user's own podman home and another machine runs
///   there, where podman runs one machine at a time (every provider but
///   WSL): podman's own rule, said before podman is asked.
///
/// Each says which sandboxes run and how to stop one.
pub fn admit(dirs: &Dirs, podman: &Podman, name: &str, memory_mib: u64, own_home: bool) -> Result<()> {
    let records = super::load_all(dirs)?;
    let listing = list_all(&podman.program, dirs, &records, None);
    if let Some(e) = listing.errors.get("")
        && !own_home
    {
        return Err(fail(format!("podman could not list the machines in your podman home: {e}")).into());
    }
    let running: Vec<&Record> = records
        .iter()
        .filter(|r| r.name != name)
        .filter(|r| listing.machine_of(r).is_ok_and(|m| m.is_some_and(|m| m.running || m.starting)))
        .collect();
    // The pre-check of a new sandbox runs before it has a name.
    let name = if name.is_empty() { "the new sandbox" } else { name };
    let shown = if name == "the new sandbox" { name.to_owned() } else { format!("sandbox `{name}`") };
    let names = || running.iter().map(|r| format!("`{}`", r.name)).collect::<Vec<_>>().join(", ");
    let stop_hint = || match running.first() {
        Some(r) => format!("stop one first: `ppp stop {}`", r.name),
        None => "stop a VM first".to_owned(),
    };
    let config = crate::config::load(dirs)?;
    if let Some(cap) = config.sandboxes.max_running
        && running.len() >= usize::try_from(cap).unwrap_or(usize::MAX)
    {
        if running.is_empty() {
            return Err(fail(format!(
                "`sandboxes.max_running` in `{}` is 0: no sandbox may run",
                dirs.config_file().display()
            ))
            .hint("raise `sandboxes.max_running`, or remove it")
            .into());
        }
        return Err(fail(format!(
            "{} sandbox(es) are running ({}), and `sandboxes.max_running` in `{}` allows {cap}",
            running.len(),
            names(),
            dirs.config_file().display()
        ))
        .hint(format!("{}, or raise `sandboxes.max_running`", stop_hint()))
        .into());
    }
    if let Some(host) = super::host::host_memory() {
        let committed: u64 = running.iter().map(|r| r.memory).sum();
        if committed + memory_mib > host.total_mib {
            return Err(fail(format!(
                "{shown} needs {memory_mib} MiB of memory; with the {committed} MiB of the {} running \
                 ({}), that is {} MiB, more than this host has ({} MiB)",
                running.len(),
                names(),
                committed + memory_mib,
                host.total_mib
            ))
            .hint(format!("{}, or give it less with `-m`", stop_hint()))
            .into());
        }
        if memory_mib > host.available_mib {
            return Err(fail(format!(
                "{shown} needs {memory_mib} MiB of memory and this host has {} MiB available now \
                 (of {} MiB)",
                host.available_mib, host.total_mib
            ))
            .hint(if running.is_empty() {
                "free memory, or give it less with `-m`".to_owned()
            } else {
                format!("{}, or give it less with `-m`", stop_hint())
            })
            .into());
        }
    }
    if !own_home && !podman.allows_many_running() {
        let machine = super::machine_name(name);
        if let Some(other) = listing.user.iter().flatten().find(|m| m.name != machine && (m.running || m.starting)) {
            return Err(one_vm_error(podman, &other.name));
        }
    }
    Ok(())
}

fn one_vm_error(podman: &Podman, running: &str) -> anyhow::Error {
    let how = running
        .strip_prefix(super::MACHINE_PREFIX)
        .map_or_else(|| format!("`podman machine stop {running}`"), |sandbox| format!("`ppp stop {sandbox}`"));
    fail(format!(
        "machine `{running}` is running in your podman home, and podman's {} provider runs only one machine \
         at a time there",
        podman.provider
    ))
    .hint(format!("stop the running one first: {how}"))
    .into()
}

/// Make a sandbox's own podman home: its directories, private to the user.
/// The runtime directory may be in `/tmp`: one that exists and is not
/// this user's alone is refused, since its sockets reach the VM.
pub fn prepare_home(home: &Home) -> Result<()> {
    let Home::Own(h) = home else { return Ok(()) };
    for d in [&h.config, &h.data] {
        state::create_private_dir(d)?;
    }
    state::create_private_dir(&h.runtime)?;
    let meta =
        std::fs::symlink_metadata(&h.runtime).with_context(|| format!("could not read `{}`", h.runtime.display()))?;
    if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0 {
        return Err(fail(format!(
            "`{}` (the sandbox machine's socket directory) is not a directory of yours alone",
            h.runtime.display()
        ))
        .hint("remove it, or set XDG_RUNTIME_DIR to a directory only you can write")
        .into());
    }
    Ok(())
}

/// The machine image ppp keeps for `podman`'s provider and version, if it
/// has fetched one: passed to `machine init --image`, so each sandbox's
/// home does not download it again.
pub fn cached_image(dirs: &Dirs, podman: &Podman) -> Option<PathBuf> {
    let dir = image_dir(dirs, podman);
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).filter(|p| is_image(p)).collect();
    files.sort();
    files.pop()
}

fn image_dir(dirs: &Dirs, podman: &Podman) -> PathBuf {
    dirs.machine_images().join(format!("{}-{}.{}", podman.provider, podman.version.major, podman.version.minor))
}

fn is_image(p: &Path) -> bool {
    p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// After `machine init` fetched podman's default image into a sandbox's
/// own home, keep it in ppp's cache (a hard link where the cache is on the
/// same file system, else a copy): the home goes with its sandbox, the
/// cache stays for every other.
pub fn keep_image(dirs: &Dirs, podman: &Podman) -> Result<()> {
    let Some(cache) = podman.home.image_cache_dir(&podman.provider) else { return Ok(()) };
    let Some(src) = std::fs::read_dir(&cache)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| is_image(p))
        .max_by_key(|p| p.metadata().map_or(0, |m| m.len()))
    else {
        return Ok(());
    };
    let dir = image_dir(dirs, podman);
    state::create_private_dir(&dir)?;
    let name = src.file_name().map(ToOwned::to_owned).unwrap_or_default();
    let tmp = dir.join(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(&src, &tmp).is_err() {
        std::fs::copy(&src, &tmp).with_context(|| format!("could not copy `{}` into ppp's cache", src.display()))?;
    }
    std::fs::rename(&tmp, dir.join(name)).with_context(|| format!("could not write into `{}`", dir.display()))
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
            // Only in the user's own home (a sandbox's home holds one
            // machine): another there started since ppp checked.
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

/// The guest kernel's boot id (`None` when the guest does not answer).
pub(super) fn boot_id(podman: &Podman, machine: &str) -> Option<String> {
    let inv = podman.ssh(machine, &["cat", "/proc/sys/kernel/random/boot_id"]).timeout(Duration::from_secs(60));
    let (code, out) = exec::output(&inv).ok()?;
    let id = out.stdout.trim();
    (code == 0 && !id.is_empty()).then(|| id.to_owned())
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

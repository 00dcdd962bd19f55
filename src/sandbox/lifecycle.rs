//! A sandbox's life: create (claim a port, bring up its WireGuard server,
//! init and start its own Podman Machine, provision, verify), attach the
//! agent, stop, and remove.
//!
//! Long steps (booting a VM, provisioning) run without `state.lock`; the
//! lock is taken only to change state files, so other commands are never
//! blocked behind a VM boot. Every failure after the port is claimed rolls
//! back what was created, so nothing is left half made.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::{PortRegistry, Published, Record, Status};
use crate::agent::{self, Agent};
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, Invocation, Stdin};
use crate::podman::{self, InitSpec, Machine, Podman};
use crate::progress;
use crate::proxy::{self, supervisor};
use crate::state;

/// Where provisioning files go inside the VM.
const GUEST_DIR: &str = "/tmp/ppp";
/// The CA bundle provision.sh exports for containers (their own trust store
/// does not know mitmproxy's CA).
const GUEST_CA_BUNDLE: &str = "/var/lib/ppp/ca-bundle.pem";
/// Where the agent container finds that bundle: the path Debian-family
/// images read.
const CONTAINER_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// How long a new WireGuard server may take to print its config.
const WG0_DEADLINE: Duration = Duration::from_secs(60);
const PROVISION_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const VERIFY_TIMEOUT: Duration = Duration::from_secs(3 * 60);
/// The probe the handover check expects the proxy to refuse, when the
/// policy denies it: a reserved name on a documentation address.
const PROBE_HOST: &str = "ppp-verify.invalid";
const PROBE_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(192, 0, 2, 1);

/// Progress on stderr: a spinner (or plain lines off a terminal) per long
/// step; silent with `-q`. See [`crate::progress`].
#[derive(Debug, Clone, Copy)]
pub struct Ui {
    pub quiet: bool,
}

impl Ui {
    /// Start a timed step; the caller ends it with `.done()` on success.
    fn step(self, what: &str) -> progress::Step {
        progress::Progress::detect(self.quiet).start(what)
    }

    /// Run `f` as one timed step, ended as done when it succeeds.
    fn timed<T>(self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let step = self.step(what);
        let result = f();
        if result.is_ok() {
            step.done();
        }
        result
    }

    /// An untimed line.
    fn note(self, what: &str) {
        progress::Progress::detect(self.quiet).note(what);
    }
}

/// What the user asked for, as given: nothing checked yet. The command
/// fills it from its arguments; [`Request::new`] checks it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    /// The agent's name.
    pub agent: String,
    /// Workspace directories; the first is the workdir.
    pub paths: Vec<PathBuf>,
    pub name: Option<String>,
    /// Clone the (single) workspace repository instead of mounting it.
    pub clone: bool,
    /// 0 means all the host's CPUs.
    pub cpus: u32,
    /// Binary units such as `8g`; `None` for the default.
    pub memory: Option<String>,
    /// Binary units such as `100g`; `None` for the default.
    pub disk_size: Option<String>,
    /// A template's tag or id, or an image.
    pub template: Option<String>,
}

/// A validated request to create a sandbox. Building it touches nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub agent: &'static Agent,
    /// Absolute, existing workspace directories; the first is the workdir.
    pub workspace: Vec<PathBuf>,
    pub name: Option<String>,
    pub cpus: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
    pub image: String,
    pub template: Option<String>,
    /// `--clone`: clone the (single) workspace repository into the VM
    /// instead of mounting it.
    pub clone: bool,
}

impl Request {
    /// Check everything that can be checked before anything is created:
    /// the agent, the paths, the name, the sizes.
    pub fn new(spec: &Spec) -> Result<Request> {
        let agent = agent::find(&spec.agent)?;
        let mut workspace = Vec::new();
        for p in &spec.paths {
            let abs = std::fs::canonicalize(p).map_err(|e| {
                // "No such file or directory (os error 2)" is the usual
                // case; said in words, the OS text for anything else.
                let why = if e.kind() == std::io::ErrorKind::NotFound {
                    "it does not exist".to_owned()
                } else {
                    e.to_string()
                };
                fail(format!("workspace `{}` cannot be used: {why}", p.display()))
                    .hint("pass a directory that exists, e.g. `.`")
                    .code(2)
            })?;
            if !abs.is_dir() {
                return Err(fail(format!("workspace `{}` is not a directory", p.display())).code(2).into());
            }
            if spec.clone {
                git_toplevel(&abs)?;
            }
            workspace.push(abs);
        }
        if let Some(name) = &spec.name {
            super::validate_name(name)?;
        }
        // Said plainly rather than ignored: a sandbox without the
        // template the user asked for is not what they asked for.
        if spec.clone && spec.paths.len() != 1 {
            return Err(fail("`--clone` takes exactly one PATH: the repository to clone").code(2).into());
        }
        if spec.template.as_deref().is_some_and(str::is_empty) {
            return Err(fail("`--template` needs a tag, an id or an image").code(2).into());
        }
        let memory_mib = match &spec.memory {
            Some(m) => podman::parse_mib(m).ok_or_else(|| {
                fail(format!("invalid memory size `{m}`")).hint("use binary units such as `8g` or `512MiB`").code(2)
            })?,
            None => default_memory_mib(host_memory_mib()),
        };
        if memory_mib < podman::MIN_MEMORY_MIB {
            return Err(fail(format!(
                "{memory_mib} MiB of memory is too little for a sandbox VM; the minimum is {} MiB",
                podman::MIN_MEMORY_MIB
            ))
            .hint("pass e.g. `-m 4g`")
            .code(2)
            .into());
        }
        if let Some(host) = host_memory_mib()
            && memory_mib > host
        {
            return Err(fail(format!("{memory_mib} MiB of memory is more than this host has ({host} MiB)"))
                .hint("pass a smaller `-m`, or leave it out for half the host's memory")
                .code(2)
                .into());
        }
        let disk_gib = match &spec.disk_size {
            Some(d) => podman::parse_gib(d).ok_or_else(|| {
                fail(format!("invalid disk size `{d}`")).hint("use binary units such as `100g`").code(2)
            })?,
            None => podman::DEFAULT_DISK_GIB,
        };
        let host_cpus = std::thread::available_parallelism().map_or(2, |n| u32::try_from(n.get()).unwrap_or(2));
        let cpus = if spec.cpus == 0 { host_cpus } else { spec.cpus };
        if cpus > host_cpus {
            // podman refuses this too, but only after ppp has claimed a port.
            return Err(fail(format!("{cpus} CPUs is more than this host has ({host_cpus})"))
                .hint("pass a smaller `--cpus`, or 0 for all of them")
                .code(2)
                .into());
        }
        let image = agent.image(|k| std::env::var(k).ok());
        Ok(Request {
            agent,
            workspace,
            name: spec.name.clone(),
            cpus,
            memory_mib,
            disk_gib,
            image,
            template: spec.template.clone(),
            clone: spec.clone,
        })
    }
}

/// Where a workspace appears in the VM and the container: at the same path
/// when podman's `-v SRC:DST` can carry it, else under `/workspace`
/// (a `:` or `,` in the path would be read as a separator).
pub fn guest_path(host: &str) -> String {
    if host.starts_with('/') && !host.contains([':', ',']) {
        host.to_owned()
    } else {
        let base = host.rsplit(['/', '\\']).find(|s| !s.is_empty()).unwrap_or("workspace");
        format!("/workspace/{}", base.replace([':', ','], "_"))
    }
}

/// The workspace directories as the VM sees them: the clone, or the mounts.
fn guest_workspaces(rec: &Record) -> Vec<String> {
    match &rec.clone {
        Some(c) => vec![c.clone()],
        None => rec.workspace.iter().map(|w| guest_path(w)).collect(),
    }
}

/// Where `--clone` puts a repository in the VM.
pub fn clone_path(host: &str) -> String {
    let base = host.rsplit('/').find(|s| !s.is_empty()).unwrap_or("workspace");
    format!("/home/core/workspace/{base}")
}

/// The top of the git repository `dir` is in, or an error saying it is not
/// one (`--clone` needs a repository).
fn git_toplevel(dir: &std::path::Path) -> Result<String> {
    let inv = Invocation::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--show-toplevel"])
        .timeout(Duration::from_secs(30));
    exec::run(&inv).map(|o| o.stdout.trim().to_owned()).map_err(|e| {
        fail(format!("`{}` is not a git repository, so it cannot be cloned: {e}", dir.display()))
            .hint("drop `--clone` to mount the directory instead")
            .code(2)
            .into()
    })
}

/// The host remote that points into a sandbox's clone.
pub fn clone_remote(name: &str) -> String {
    format!("sandbox-{name}")
}

/// The remote's URL: git's `ext::` transport running git's own pack
/// commands in the VM over `podman machine ssh`, so fetch and push need no
/// ssh keys or ports of their own.
pub fn clone_url(podman: &Podman, machine: &str, guest: &str) -> String {
    // ext:: splits on spaces; `%` starts its placeholders.
    let esc = |s: &str| s.replace('%', "%%").replace(' ', "\\ ");
    format!("ext::{} machine ssh {} -- %S {}", esc(&podman.program.display().to_string()), esc(machine), esc(guest))
}

/// Clone the host repository into the VM (a bundle copied in, so the VM
/// needs no access to the host's remotes), and add the host remote
/// `sandbox-<name>` pointing back at it.
fn clone_into(dirs: &Dirs, podman: &Podman, rec: &Record, host: &std::path::Path, guest: &str, ui: Ui) -> Result<()> {
    ui.timed(&format!("cloning `{}` into the sandbox at `{guest}`", host.display()), || {
    let bundle = dirs.sandbox(&rec.name).join("workspace.bundle");
    let git =
        |args: &[&str]| Invocation::new("git").arg("-C").arg(host).args(args).timeout(Duration::from_secs(10 * 60));
    exec::run(&git(&["bundle", "create", &bundle.display().to_string(), "--all"])).map_err(|e| {
        anyhow::Error::new(e).context(
            fail(format!("could not bundle `{}` for the sandbox", host.display()))
                .hint("`--clone` needs a repository with at least one commit"),
        )
    })?;
    let machine = &rec.machine_name;
    let in_guest = format!("{GUEST_DIR}/workspace.bundle");
    run_logged(dirs, &rec.name, &podman.copy_in(&bundle, machine, &in_guest), "copying the repository")?;
    let parent = guest.rsplit_once('/').map_or("/", |(p, _)| p);
    run_logged(
        dirs,
        &rec.name,
        &podman.ssh(machine, &["sh", "-c", "mkdir -p \"$1\" && rm -rf \"$2\" && git clone --quiet \"$3\" \"$2\" && git -C \"$2\" remote remove origin", "sh", parent, guest, &in_guest]),
        "cloning the repository in the VM",
    )?;
    let _ = std::fs::remove_file(&bundle);
    let remote = clone_remote(&rec.name);
    let url = clone_url(podman, machine, guest);
    // A remote left by an earlier sandbox of the same name is replaced.
    let _ = exec::run(&git(&["remote", "remove", &remote]));
    exec::run(&git(&["remote", "add", &remote, &url]))?;
    // ext:: is off by default; `user` allows it for remotes the user
    // configured, never for URLs that submodules bring in.
    exec::run(&git(&["config", "protocol.ext.allow", "user"]))?;
    Ok(())
    })
}

/// Half the host's memory, at most 32 GiB, at least podman's floor.
pub fn default_memory_mib(host_mib: Option<u64>) -> u64 {
    host_mib.map_or(4096, |h| (h / 2).min(podman::MAX_DEFAULT_MEMORY_MIB)).max(podman::MIN_MEMORY_MIB)
}

/// The host's memory in MiB, if it can be read.
fn host_memory_mib() -> Option<u64> {
    if cfg!(target_os = "linux") {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib / 1024)
    } else {
        let out =
            exec::run(&Invocation::new("sysctl").args(["-n", "hw.memsize"]).timeout(Duration::from_secs(5))).ok()?;
        out.stdout.trim().parse::<u64>().ok().map(|b| b / (1024 * 1024))
    }
}

/// The machines podman knows, or an error naming the podman failure.
pub fn machines(podman: &Podman) -> Result<Vec<Machine>> {
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
    let image = match &req.template {
        Some(t) => {
            let (disk, saved) = crate::template::resolve(dirs, t)?;
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
    // without its hypervisor, nor while another runs, and the daemon not
    // without mitmproxy (installed now if missing, which needs Python).
    podman.check_hypervisor()?;
    let all = machines(podman)?;
    ensure_can_start(podman, "", &all)?;
    if !supervisor::is_running(dirs)? {
        proxy::mitmdump::ensure(dirs, |msg| ui.note(msg)).context("the sandbox's proxy needs mitmproxy")?;
    }
    for e in extensions {
        e.check(dirs, req.name.as_deref())?;
    }
    let claim = claim(dirs, req, &all)?;
    let name = claim.record.name.clone();
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
        let machine = &claim.record.machine_name;
        let spec = InitSpec {
            name: machine.clone(),
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
        ui.timed(&format!("initialising machine `{machine}`"), || {
            run_logged(dirs, &name, &podman.init(&spec), "podman machine init")
        })?;
        made_machine = true;
        interrupt.check()?;
        start_machine(dirs, podman, &name, machine, ui)?;
        interrupt.check()?;
        provision(dirs, podman, &claim.record, &req.image, ui)?;
        interrupt.check()?;
        if let Some(guest) = &claim.record.clone {
            clone_into(dirs, podman, &claim.record, &req.workspace[0], guest, ui)?;
        }
        interrupt.check()?;
        verify(dirs, podman, &claim.record, ui)?;
        for e in extensions {
            interrupt.check()?;
            ui.timed(&format!("applying {}", e.describe()), || e.apply(dirs, podman, &claim.record))?;
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

/// What `claim` made, so a rollback can undo exactly that.
struct Claim {
    record: Record,
}

/// Under `state.lock`: pick the name, take a port, write the record.
fn claim(dirs: &Dirs, req: &Request, all: &[Machine]) -> Result<Claim> {
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
fn rollback(dirs: &Dirs, podman: &Podman, claim: &Claim, made_machine: bool, started_daemon: bool) {
    let name = &claim.record.name;
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

/// What [`forget`] leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Nothing: the sandbox is removed (`rm`).
    Nothing,
    /// The machine log and anything ppp did not write (a policy prepared
    /// with `policy allow --sandbox`): a create that failed.
    Log,
}

/// Under `state.lock`: free the port, then remove the sandbox's files.
fn forget(dirs: &Dirs, name: &str, keep: Keep) -> Result<()> {
    let lock = state::Lock::acquire(&dirs.state_lock())?;
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

/// Start a machine, turning podman's one-VM refusal into ppp's message.
fn start_machine(dirs: &Dirs, podman: &Podman, name: &str, machine: &str, ui: Ui) -> Result<()> {
    ui.timed(&format!("starting machine `{machine}`"), || {
        let log = open_log(dirs, name)?;
        let (code, out) = exec::output(&podman.start(machine))?;
        let _ = writeln!(&log, "$ {}\n{}{}", podman.start(machine), out.stdout, out.stderr);
        if code == 0 {
            return Ok(());
        }
        if podman::is_one_vm_refusal(&out.stderr) {
            let running = machines(podman)
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

/// Copy provision.sh into the VM and run it with wg0.conf on its standard
/// input; its output goes to the sandbox's machine.log. The config, which
/// holds the guest's WireGuard key, is never staged in a file in the VM:
/// provision.sh keeps it on tmpfs only (ADR 0018).
pub fn provision(dirs: &Dirs, podman: &Podman, rec: &Record, image: &str, ui: Ui) -> Result<()> {
    ui.timed(&format!("provisioning `{}` (WireGuard, kill switch, CA, agent image)", rec.name), || {
        let machine = &rec.machine_name;
        let script = dirs.sandbox(&rec.name).join("provision.sh");
        state::write_atomic(&script, &crate::assets::provision())?;
        run_logged(
            dirs,
            &rec.name,
            &podman.ssh(machine, &["mkdir", "-p", "-m", "0700", GUEST_DIR]),
            "preparing the VM",
        )?;
        run_logged(
            dirs,
            &rec.name,
            &podman.copy_in(&script, machine, &format!("{GUEST_DIR}/provision.sh")),
            "copying provision.sh",
        )?;
        // The daemon renders wg0.conf with gvproxy's alias; this machine's
        // provider and the user's overrides decide the host it really uses.
        let endpoint = proxy::endpoint::current(dirs, &podman.provider)?;
        let wg0 = dirs.sandbox_wg_conf(&rec.name);
        let text = std::fs::read_to_string(&wg0).with_context(|| format!("could not read `{}`", wg0.display()))?;
        let guest_conf = dirs.sandbox_guest_wg_conf(&rec.name);
        state::write_atomic_mode(&guest_conf, proxy::endpoint::rewrite(&text, &endpoint.host).as_bytes(), 0o600)?;
        let up = podman
            .ssh(machine, &provision_argv("up", &["--wg-conf", "-", "--image", image]))
            .stdin(Stdin::File(guest_conf.clone()))
            .timeout(PROVISION_TIMEOUT);
        let log = open_log(dirs, &rec.name)?;
        let _ = writeln!(&log, "# WireGuard endpoint host {} ({})", endpoint.host, endpoint.source);
        let _ = writeln!(&log, "$ {up}");
        let code = exec::run_to_log(&up, &log);
        // It holds the guest's key: gone as soon as the guest has read it.
        let _ = std::fs::remove_file(&guest_conf);
        let code = code?;
        if code != 0 {
            let text = std::fs::read_to_string(dirs.sandbox_machine_log(&rec.name)).unwrap_or_default();
            let why = text
                .lines()
                .rev()
                .find_map(|l| {
                    l.split_once("ppp-provision: FAILED").map(|(_, r)| r.trim_start_matches([' ', ':']).to_owned())
                })
                .unwrap_or_else(|| format!("provision.sh exited with status {code}"));
            return Err(fail(format!("provisioning failed: {why}"))
                .hint(format!("see `{}`", dirs.sandbox_machine_log(&rec.name).display()))
                .into());
        }
        Ok(())
    })
}

/// `sudo bash /tmp/ppp/provision.sh VERB ARGS…`.
fn provision_argv(verb: &str, rest: &[&str]) -> Vec<String> {
    let mut line: Vec<String> = ["sudo", "bash"].iter().map(|s| (*s).to_owned()).collect();
    line.push(format!("{GUEST_DIR}/provision.sh"));
    line.push(verb.to_owned());
    line.extend(rest.iter().map(|s| (*s).to_owned()));
    line
}

/// One handover check's result, as provision.sh's `verify` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub outcome: Outcome,
    pub name: String,
    pub detail: String,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Fail,
    Skip,
}

/// Parse `verify` output: `ok NAME`, `fail NAME: WHY`, `skip NAME: WHY`.
pub fn parse_checks(text: &str) -> Vec<Check> {
    text.lines()
        .filter_map(|l| {
            let (word, rest) = l.trim().split_once(' ')?;
            let outcome = match word {
                "ok" => Outcome::Ok,
                "fail" => Outcome::Fail,
                "skip" => Outcome::Skip,
                _ => return None,
            };
            let (name, detail) = rest.split_once(':').map_or((rest, ""), |(n, d)| (n, d.trim()));
            Some(Check { outcome, name: name.trim().to_owned(), detail: detail.to_owned() })
        })
        .collect()
}

/// The checks every handover must pass.
pub const CHECKS: &[&str] = &["handshake", "no-direct-egress", "policy-denies", "ca-trusted", "no-secret-in-env"];

/// Verify the sandbox from inside before the agent gets it.
///
/// The guest runs four checks itself; the fifth, `no-secret-in-env`, is
/// decided here: the guest reports its processes' environment as digests
/// salted with a value ppp picks, and ppp compares them with its own
/// secrets' digests. Only the salt goes in, so nothing derived from a
/// secret ever enters the VM (issue 11 point 6; ADR 0018).
pub fn verify(dirs: &Dirs, podman: &Podman, rec: &Record, ui: Ui) -> Result<()> {
    ui.timed(&format!("verifying `{}` before handover", rec.name), || {
        let salt = uuid::Uuid::new_v4().simple().to_string();
        let mut args: Vec<String> = vec!["--salt".into(), salt.clone()];
        if probe_is_denied(dirs, &rec.name) {
            args.extend([
                "--denied-url".into(),
                format!("http://{PROBE_HOST}/"),
                "--denied-connect-to".into(),
                format!("{PROBE_HOST}:80:{PROBE_IP}:80"),
            ]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let inv = podman.ssh(&rec.machine_name, &provision_argv("verify", &refs)).timeout(VERIFY_TIMEOUT);
        let (code, out) = exec::output(&inv)?;
        let mut checks = parse_checks(&out.stdout);
        // This verdict is the host's alone, whatever the guest printed.
        checks.retain(|c| c.name != ENV_CHECK);
        checks.push(env_check(&parse_env_report(&out.stdout), &secret_digests(dirs, &salt)));
        let log = open_log(dirs, &rec.name)?;
        // The env report is hundreds of digests nobody reads; the log
        // keeps the verdicts.
        let shown = checks.iter().fold(String::new(), |mut s, c| {
            let _ = writeln!(s, "{c}");
            s
        });
        let _ = writeln!(&log, "$ provision.sh verify\n{shown}{}", out.stderr);
        if checks.iter().any(|c| c.name == ENV_CHECK && c.outcome == Outcome::Fail) {
            // What the guest did print, for whoever reads the log (bounded).
            let tail: String = out.stdout.lines().rev().take(20).collect::<Vec<_>>().join("\n");
            let _ = writeln!(&log, "(last lines of the report, newest first)\n{tail}");
        }
        let failed: Vec<&Check> = checks.iter().filter(|c| c.outcome == Outcome::Fail).collect();
        let missing: Vec<&&str> = CHECKS.iter().filter(|n| !checks.iter().any(|c| c.name == **n)).collect();
        if code == 0 && failed.is_empty() && missing.is_empty() {
            return Ok(());
        }
        let why = if let Some(c) = failed.first() {
            format!("check `{}` failed: {}", c.name, c.detail)
        } else if let Some(n) = missing.first() {
            format!("check `{n}` did not report (verify exited with status {code})")
        } else {
            format!("verify exited with status {code}: {}", last_line(&out.stderr))
        };
        Err(fail(format!("sandbox `{}` failed its handover checks: {why}", rec.name))
            .hint(format!("see `{}`; the agent was not started", dirs.sandbox_machine_log(&rec.name).display()))
            .into())
    })
}

impl std::fmt::Display for Check {
    /// The line as provision.sh prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let word = match self.outcome {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Skip => "skip",
        };
        if self.detail.is_empty() {
            write!(f, "{word} {}", self.name)
        } else {
            write!(f, "{word} {}: {}", self.name, self.detail)
        }
    }
}

/// The check ppp decides from the guest's environment report.
const ENV_CHECK: &str = "no-secret-in-env";

/// What the guest said about its environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvReport {
    /// Salted digest (lower-case hex) → where the guest found that value.
    pub digests: Vec<(String, String)>,
    /// Whether the closing `env-end` line came: without it the report was
    /// cut short and proves nothing.
    pub complete: bool,
}

/// The most a guest's `where` text may add to an error message: the
/// guest chooses it, so it is cut and limited to printable ASCII.
const WHERE_MAX: usize = 200;

/// Parse the `env <hex> <where>` and `env-end <n>` lines of `verify`.
pub fn parse_env_report(text: &str) -> EnvReport {
    let mut report = EnvReport::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("env ") {
            let (hex, place) = rest.split_once(' ').unwrap_or((rest, ""));
            if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                let place: String =
                    place.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').take(WHERE_MAX).collect();
                report.digests.push((hex.to_ascii_lowercase(), place));
            }
        } else if line.starts_with("env-end ") {
            report.complete = true;
        }
    }
    report
}

/// The `no-secret-in-env` check: no value in the guest's report has the
/// salted digest of a stored secret. A failure names where the guest found
/// it, never the value.
pub fn env_check(report: &EnvReport, secrets: &std::collections::BTreeSet<String>) -> Check {
    let name = ENV_CHECK.to_owned();
    if !report.complete {
        return Check {
            outcome: Outcome::Fail,
            name,
            detail: "the guest's environment report was missing or cut short".into(),
        };
    }
    let hits: Vec<&str> =
        report.digests.iter().filter(|(d, _)| secrets.contains(d)).map(|(_, place)| place.as_str()).collect();
    if hits.is_empty() {
        Check { outcome: Outcome::Ok, name, detail: String::new() }
    } else {
        Check {
            outcome: Outcome::Fail,
            name,
            detail: format!("a secret value is in the environment of {}", hits.join(", ")),
        }
    }
}

/// Whether the policy denies the handover probe for `sandbox`. A policy
/// that allows everything leaves nothing to probe; `verify` then skips it.
fn probe_is_denied(dirs: &Dirs, sandbox: &str) -> bool {
    crate::policy::load_engine(dirs).is_ok_and(|e| {
        e.decide(Some(sandbox), Some(PROBE_HOST), Some(PROBE_IP.into()), 80).verdict == crate::policy::Verdict::Deny
    })
}

/// SHA-256 of salt‖value for every stored secret, hex, computed on the host
/// and compared here: they never leave the host. A store that cannot be
/// read gives none (the proxy cannot inject from it either).
fn secret_digests(dirs: &Dirs, salt: &str) -> std::collections::BTreeSet<String> {
    let Ok(store) = crate::secret::Store::open(dirs) else { return std::collections::BTreeSet::new() };
    let Ok(entries) = store.list() else { return std::collections::BTreeSet::new() };
    entries
        .iter()
        .filter_map(|e| store.get(&e.scope, &e.name, e.kind).ok().flatten())
        .map(|v| salted_digest(salt, v.expose()))
        .collect()
}

/// Lower-case hex SHA-256 of `salt` followed by `value`, as provision.sh's
/// `sha256sum` of the same bytes prints it.
pub fn salted_digest(salt: &str, value: &str) -> String {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update(value.as_bytes());
    format!("{:x}", h.finalize())
}

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
pub fn agent_invocation(
    podman: &Podman,
    rec: &Record,
    agent: &Agent,
    image: &str,
    extra_env: &[(String, String)],
    agent_args: &[String],
    tty: bool,
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

/// Run the agent attached to this terminal until it ends for good. When a
/// kit restarts it (`ppp kit add` bumps `agent_generation`, then stops the
/// container; ADR 0015), it starts again from the new record, with the
/// same arguments. Returns the agent's last exit code.
pub fn run_agent(
    dirs: &Dirs,
    podman: &Podman,
    rec: Record,
    agent_args: &[String],
    tty: bool,
    quiet: bool,
) -> Result<i32> {
    let agent = agent::find(&rec.agent)?;
    let image = agent.image(|k| std::env::var(k).ok());
    let mut rec = rec;
    loop {
        let env = custom_env(dirs, &rec.name);
        let code = exec::run_attached(&agent_invocation(podman, &rec, agent, &image, &env, agent_args, tty))?;
        match super::load(dirs, &rec.name)? {
            Some(now) if now.agent_generation != rec.agent_generation => {
                if !quiet {
                    eprintln!("ppp: a kit changed sandbox `{}`; starting the agent again", rec.name);
                }
                rec = now;
            }
            // Any other end of the agent is the end of the session.
            _ => return Ok(code),
        }
    }
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

/// Bring an existing sandbox back: start its machine if needed, make sure
/// the daemon serves it, provision again (idempotent) and verify.
pub fn reattach(dirs: &Dirs, podman: &Podman, name: &str, ui: Ui) -> Result<Record> {
    let rec = super::load(dirs, name)?.ok_or_else(|| unknown(name))?;
    // Held until the machine is up: a disk being copied must not change.
    let _disk = disk_lease(dirs, name)?;
    let all = machines(podman)?;
    let machine = all.iter().find(|m| m.name == rec.machine_name).ok_or_else(|| {
        fail(format!("sandbox `{name}` has no machine `{}` any more", rec.machine_name))
            .hint(format!("remove it with `ppp rm -f {name}` and create it again"))
    })?;
    ensure_daemon(dirs, ui)?;
    wait_for_wg0(dirs, name, rec.port)?;
    if !machine.running {
        ensure_can_start(podman, &rec.machine_name, &all)?;
        start_machine(dirs, podman, name, &rec.machine_name, ui)?;
    }
    let image = agent::find(&rec.agent)?.image(|k| std::env::var(k).ok());
    provision(dirs, podman, &rec, &image, ui)?;
    verify(dirs, podman, &rec, ui)?;
    set_status(dirs, name, Status::Running)
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

/// Stop a sandbox's machine; its port stays its own.
pub fn stop(dirs: &Dirs, podman: &Podman, name: &str, ui: Ui) -> Result<()> {
    let rec = super::load(dirs, name)?.ok_or_else(|| unknown(name))?;
    ui.timed(&format!("stopping `{name}`"), || {
        let running = machines(podman)?.into_iter().any(|m| m.name == rec.machine_name && (m.running || m.starting));
        if running {
            run_logged(dirs, name, &podman.stop(&rec.machine_name), "podman machine stop")?;
        }
        set_status(dirs, name, Status::Stopped)?;
        Ok(())
    })
}

/// Remove a sandbox: its machine (even an unresponsive one with `force`),
/// its port, its state.
pub fn remove(dirs: &Dirs, podman: Option<&Podman>, name: &str, force: bool, ui: Ui) -> Result<()> {
    let rec = super::load(dirs, name)?;
    let machine = rec.as_ref().map_or_else(|| super::machine_name(name), |r| r.machine_name.clone());
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
            let exists = machines(podman).map_or(true, |all| all.iter().any(|m| m.name == machine));
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

/// Under `state.lock`: set a sandbox's status.
fn set_status(dirs: &Dirs, name: &str, status: Status) -> Result<Record> {
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut rec = super::load(dirs, name)?.ok_or_else(|| unknown(name))?;
    rec.status = status;
    super::save_locked(dirs, &rec)?;
    Ok(rec)
}

fn open_log(dirs: &Dirs, name: &str) -> Result<std::fs::File> {
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

fn last_line(text: &str) -> &str {
    text.lines().rev().find(|l| !l.trim().is_empty()).map_or("", str::trim)
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

    #[test]
    fn workspaces_are_mirrored_when_they_can_be() {
        assert_eq!(guest_path("/home/me/src/app"), "/home/me/src/app");
        assert_eq!(guest_path("/home/me/a:b"), "/workspace/a_b");
        assert_eq!(guest_path("/srv/x,y/"), "/workspace/x_y");
        assert_eq!(guest_path("C:\\Users\\me\\app"), "/workspace/app");
    }

    #[test]
    fn memory_default_is_half_capped_and_floored() {
        assert_eq!(default_memory_mib(Some(16 * 1024)), 8 * 1024);
        assert_eq!(default_memory_mib(Some(256 * 1024)), 32 * 1024);
        assert_eq!(default_memory_mib(Some(2048)), podman::MIN_MEMORY_MIB);
        assert_eq!(default_memory_mib(None), 4096);
    }

    #[test]
    fn verify_output_parses() {
        let text = "noise\nok handshake\nfail no-direct-egress: connected to 192.168.127.1:80\nskip policy-denies: nothing denied\n";
        let checks = parse_checks(text);
        assert_eq!(checks.len(), 3);
        assert_eq!(checks[1].outcome, Outcome::Fail);
        assert_eq!(checks[1].name, "no-direct-egress");
        assert_eq!(checks[1].detail, "connected to 192.168.127.1:80");
        assert_eq!(checks[2].outcome, Outcome::Skip);
    }

    #[test]
    fn the_env_check_is_decided_on_the_host() {
        let salt = "00112233445566778899aabbccddeeff";
        let key = "sk-ant-REAL";
        let hit = salted_digest(salt, key);
        let other = salted_digest(salt, "/home/core");
        let secrets: std::collections::BTreeSet<String> = [hit.clone()].into();
        let text = format!(
            "ok handshake\nenv {other} pid 1 variable HOME\nenv {} pid 42 variable LEAKY, pid 43 variable X\x1b[2J and 3 more\nenv-end 2\n",
            hit.to_ascii_uppercase()
        );
        let report = parse_env_report(&text);
        assert!(report.complete);
        let c = env_check(&report, &secrets);
        assert_eq!(c.outcome, Outcome::Fail);
        assert_eq!(
            c.detail,
            "a secret value is in the environment of pid 42 variable LEAKY, pid 43 variable X[2J and 3 more"
        );
        assert!(!c.to_string().contains(key));
        // Nothing stored, or nothing matching: ok.
        assert_eq!(env_check(&report, &std::collections::BTreeSet::new()).outcome, Outcome::Ok);
        // A report without its end proves nothing.
        let cut = parse_env_report(&format!("env {other} pid 1 variable HOME\n"));
        assert_eq!(env_check(&cut, &secrets).outcome, Outcome::Fail);
        assert_eq!(env_check(&parse_env_report("ok no-secret-in-env\n"), &secrets).outcome, Outcome::Fail);
    }
}

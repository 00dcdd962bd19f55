//! Podman as data: functions that build `podman …` invocations and parse
//! what podman prints. Nothing here spawns a process; `exec` does that.
//!
//! The binary is `$PPP_PODMAN` if set, else `podman` on PATH. Flags are
//! chosen from the version podman reports, never from a fixed list
//! (`--import-native-ca` is 6.0+, `machine cp` is 5.5+).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::env;
use crate::error::fail;
use crate::exec::{self, Invocation, Stdin};

/// `machine list` can be slow while a VM boots; never hang `ppp ls` on it.
const LIST_TIMEOUT: Duration = Duration::from_secs(20);
/// `machine init` downloads the machine image the first time.
const INIT_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const START_TIMEOUT: Duration = Duration::from_secs(5 * 60);
const STOP_TIMEOUT: Duration = Duration::from_secs(2 * 60);
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The smallest `--memory` podman machines boot with, in MiB. Podman's
/// own default is 2048; Fedora CoreOS needs about 1.5 GiB to boot and pull
/// an image, so less is refused before podman is asked.
pub const MIN_MEMORY_MIB: u64 = 1536;
/// The most memory ppp gives a sandbox by default, in MiB (32 GiB).
pub const MAX_DEFAULT_MEMORY_MIB: u64 = 32 * 1024;
/// Podman's default disk size, in GiB.
pub const DEFAULT_DISK_GIB: u64 = 100;

/// The podman binary, if one can be found.
pub fn program() -> Option<PathBuf> {
    exec::resolve_program(env::PPP_PODMAN, "podman")
}

/// A podman version, compared numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    /// Parse `6.0.1`, `5.5.0-rc1` or `5.8`.
    pub fn parse(text: &str) -> Option<Version> {
        let core = text.trim().trim_start_matches('v').split(['-', '+', ' ']).next()?;
        let mut parts = core.split('.').map(str::parse::<u32>);
        let major = parts.next()?.ok()?;
        let minor = parts.next().unwrap_or(Ok(0)).ok()?;
        let patch = parts.next().unwrap_or(Ok(0)).ok()?;
        Some(Version { major, minor, patch })
    }

    const fn at_least(self, major: u32, minor: u32) -> bool {
        self.major > major || (self.major == major && self.minor >= minor)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The oldest podman ppp works with: Podman Machine as ppp drives it (its
/// JSON, `machine info`, the qemu provider's layout) is podman 5's.
pub const MIN: (u32, u32) = (5, 0);

/// Whether podman's error says it will not run as root (`podman machine`
/// refuses root on Linux).
pub fn refuses_root(stderr: &str) -> bool {
    stderr.contains("as root")
}

/// The error for a podman that refuses root.
pub fn root_refusal() -> crate::error::Failure {
    fail("podman refuses to run `podman machine` as root")
        .hint("run ppp as your own user: Podman Machine runs rootless, and ppp needs no root")
}

/// Where podman looks for helper programs before `PATH`: containers.conf's
/// `helper_binaries_dir` defaults on Linux and macOS (Homebrew's and the
/// macOS installer's directories), besides `libexec/podman` next to podman
/// itself (see [`find_helper`]).
pub const HELPER_DIRS: [&str; 8] = [
    "/usr/local/libexec/podman",
    "/usr/local/lib/podman",
    "/usr/libexec/podman",
    "/usr/lib/podman",
    "/opt/podman/bin",
    "/opt/homebrew/opt/podman/libexec/podman",
    "/opt/homebrew/bin",
    "/usr/local/opt/podman/libexec/podman",
];

/// The program `provider` runs machines with and how to install it, where
/// ppp can check it (hyperv and wsl are part of Windows).
pub fn hypervisor(provider: &str) -> Option<(String, String)> {
    match provider {
        "qemu" => {
            let arch = std::env::consts::ARCH;
            let pkg = if arch == "aarch64" { "arm" } else { "x86" };
            Some((
                format!("qemu-system-{arch}"),
                format!(
                    "install QEMU: `sudo apt install qemu-system-{pkg}` (Debian, Ubuntu) or \
                     `sudo dnf install qemu-system-{pkg}-core` (Fedora)"
                ),
            ))
        }
        "applehv" => Some(("vfkit".to_owned(), "install vfkit: `brew install vfkit`".to_owned())),
        "libkrun" => Some(("krunkit".to_owned(), "install krunkit: `brew install slp/krunkit/krunkit`".to_owned())),
        _ => None,
    }
}

/// Whether `machine init` needs `--user-mode-networking` for the endpoint
/// host to exist: only on WSL, whose default networking has no gvproxy.
pub fn needs_user_mode_networking(provider: &str) -> bool {
    provider.eq_ignore_ascii_case("wsl")
}

/// Where podman (at `podman`) would find the helper `name`: its helper
/// directories, `../libexec/podman` beside its own binary, then `PATH`.
pub fn find_helper(name: &str, podman: &Path) -> Option<PathBuf> {
    let beside = podman.parent().map(|bin| bin.join("../libexec/podman"));
    HELPER_DIRS
        .iter()
        .map(PathBuf::from)
        .chain(beside)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .or_else(|| exec::find_on_path(name))
}

/// Where a podman keeps its machines. Podman finds its machines (and
/// refuses a second running one, `checkExclusiveActiveVM`) in the
/// directories its environment names, so a home is a set of variables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Home {
    /// The user's own: podman runs with ppp's environment as it is. Where
    /// sandboxes made before ppp gave each its own home live.
    #[default]
    User,
    /// A home ppp made for one sandbox (see [`crate::dirs::Dirs::podman_home`]).
    Own(OwnHome),
}

/// The directories of a podman home of ppp's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnHome {
    /// `XDG_CONFIG_HOME`: machine configs (`containers/podman/machine/<provider>`).
    pub config: PathBuf,
    /// `XDG_DATA_HOME`: disks, ssh keys, podman's image cache.
    pub data: PathBuf,
    /// Sockets (gvproxy, qmp, ready, API): `XDG_RUNTIME_DIR` on Linux,
    /// `TMPDIR` on macOS. Short, for the 108-byte (104 on macOS) limit of a
    /// Unix socket's path.
    pub runtime: PathBuf,
}

/// The longest path a Unix socket may have (without its NUL): 108 bytes of
/// `sun_path` on Linux, 104 on macOS and the BSDs.
pub const SUN_PATH_MAX: usize = if cfg!(target_os = "linux") { 107 } else { 103 };

/// The most podman adds to its runtime directory for a socket of a machine
/// named `machine`: `podman/<machine>-gvproxy.sock` and
/// `podman/qmp_<machine>.sock` (pkg/machine/vmconfigs/sockets.go,
/// qemu/command/command.go).
pub fn socket_suffix_len(machine: &str) -> usize {
    "/podman/".len() + machine.len() + "-gvproxy.sock".len().max("qmp_.sock".len())
}

/// The processes podman runs for a machine and records by pid file in its
/// runtime directory (`$XDG_RUNTIME_DIR/podman` on Linux): `gvproxy.pid`
/// (one per home: pkg/machine/shim/networking.go, `AppendToNewVMFile
/// ("gvproxy.pid")`) and qemu's `<machine>_vm.pid` (pkg/machine/qemu,
/// `-pidfile`). Checked against podman 5.4.2's binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineProcess {
    Gvproxy,
    Qemu,
}

impl MachineProcess {
    pub const fn name(self) -> &'static str {
        match self {
            MachineProcess::Gvproxy => "gvproxy",
            MachineProcess::Qemu => "qemu",
        }
    }

    /// Its pid file for `machine` under the runtime directory `runtime`.
    pub fn pid_file(self, runtime: &Path, machine: &str) -> PathBuf {
        let dir = runtime.join("podman");
        match self {
            MachineProcess::Gvproxy => dir.join("gvproxy.pid"),
            MachineProcess::Qemu => dir.join(format!("{machine}_vm.pid")),
        }
    }

    /// Whether `provider` runs it: gvproxy on every provider but WSL and
    /// Hyper-V (`UseProviderNetworkSetup`), qemu on qemu only.
    pub fn runs_on(self, provider: &str) -> bool {
        match self {
            MachineProcess::Gvproxy => !matches!(provider.to_ascii_lowercase().as_str(), "wsl" | "hyperv"),
            MachineProcess::Qemu => provider.eq_ignore_ascii_case("qemu"),
        }
    }
}

impl Home {
    /// The variables podman runs with in this home, for the OS `os`
    /// (`std::env::consts::OS`). Podman reads `XDG_CONFIG_HOME` and
    /// `XDG_DATA_HOME` on Linux and macOS (containers/storage's homedir);
    /// its runtime directory is `XDG_RUNTIME_DIR` on Linux and `TMPDIR` on
    /// macOS and FreeBSD (pkg/machine/env/dir_*.go).
    pub fn env(&self, os: &str) -> Vec<(&'static str, PathBuf)> {
        let Home::Own(h) = self else { return Vec::new() };
        let runtime = if os == "linux" { "XDG_RUNTIME_DIR" } else { "TMPDIR" };
        vec![("XDG_CONFIG_HOME", h.config.clone()), ("XDG_DATA_HOME", h.data.clone()), (runtime, h.runtime.clone())]
    }

    /// How `ppp ls` names it.
    pub fn describe(&self) -> String {
        match self {
            Home::User => "user".to_owned(),
            Home::Own(_) => "own".to_owned(),
        }
    }

    /// Podman's machine config directory in this home for `provider`, if
    /// it is one of ppp's (the user's depends on variables ppp does not set).
    pub fn machine_config_dir(&self, provider: &str) -> Option<PathBuf> {
        match self {
            Home::User => None,
            Home::Own(h) => Some(h.config.join("containers/podman/machine").join(provider)),
        }
    }

    /// Podman's image cache in this home for `provider` (ppp's homes only).
    pub fn image_cache_dir(&self, provider: &str) -> Option<PathBuf> {
        match self {
            Home::User => None,
            Home::Own(h) => Some(h.data.join("containers/podman/machine").join(provider).join("cache")),
        }
    }
}

/// The podman ppp talks to: its program, version and machine provider, and
/// the home every invocation built from it runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Podman {
    pub program: PathBuf,
    pub version: Version,
    /// `qemu`, `applehv`, `libkrun`, `hyperv` or `wsl`.
    pub provider: String,
    /// Where its machines are: every invocation carries this home's
    /// variables (see [`Podman::in_home`]).
    pub home: Home,
}

impl Podman {
    /// Find podman and ask it for its version and provider.
    pub fn detect() -> Result<Podman> {
        const INSTALL: &str = "install Podman (https://podman.io/docs/installation), or set PPP_PODMAN to its path; \
                               `ppp setup` checks everything ppp needs";
        let program = program().ok_or_else(|| fail("podman was not found").hint(INSTALL))?;
        if !program.is_file() {
            return Err(fail(format!("podman was not found at `{}` (PPP_PODMAN)", program.display()))
                .hint(INSTALL)
                .into());
        }
        let out = exec::run(&version_json(program.clone()))
            .or_else(|_| exec::run(&version(program.clone())))
            .with_context(|| format!("could not ask `{}` for its version", program.display()))?;
        let version = parse_version_json(&out.stdout)
            .or_else(|| parse_version(&out.stdout).and_then(|v| Version::parse(&v)))
            .ok_or_else(|| fail(format!("could not read podman's version from `{}`", out.stdout.trim())))?;
        if !version.at_least(MIN.0, MIN.1) {
            return Err(fail(format!(
                "podman {version} is too old: ppp needs Podman Machine as podman {}.{} and later have it",
                MIN.0, MIN.1
            ))
            .hint(format!("upgrade Podman (ppp is tested with {})", crate::versions::podman_tested()))
            .into());
        }
        let info = exec::run(&machine_info(program.clone())).map_err(|e| {
            let as_root = matches!(&e, exec::ExecError::Failed { stderr, .. } if refuses_root(stderr));
            let err = anyhow::Error::new(e)
                .context(format!("could not ask `{}` for its machine provider", program.display()));
            if as_root { err.context(root_refusal()) } else { err }
        })?;
        let provider = parse_provider(&info.stdout).unwrap_or_else(|| default_provider().to_owned());
        Ok(Podman { program, version, provider, home: Home::User })
    }

    /// Fails when the program the provider runs VMs with is not installed.
    /// podman itself would say so only at `machine start`, after a machine
    /// was made; ppp checks before it makes anything.
    pub fn check_hypervisor(&self) -> Result<()> {
        match hypervisor(&self.provider) {
            Some((program, install)) if find_helper(&program, &self.program).is_none() => Err(fail(format!(
                "`{program}` was not found: Podman's {} provider runs each machine with it",
                self.provider
            ))
            .hint(install)
            .into()),
            _ => Ok(()),
        }
    }

    /// Whether podman can run more than one machine at once. Only WSL can;
    /// the qemu, applehv, libkrun and hyperv providers refuse a second.
    pub fn allows_many_running(&self) -> bool {
        self.provider.eq_ignore_ascii_case("wsl")
    }

    /// `machine init --import-native-ca` exists from podman 6.0.
    pub fn can_import_native_ca(&self) -> bool {
        self.version.at_least(6, 0)
    }

    /// `machine cp` exists from podman 5.5.
    pub fn has_machine_cp(&self) -> bool {
        self.version.at_least(5, 5)
    }

    /// The same podman in `home`: what every command for one sandbox's
    /// machine is built from.
    #[must_use]
    pub fn in_home(&self, home: Home) -> Podman {
        Podman { home, ..self.clone() }
    }

    /// Every invocation starts here, so each carries its home's variables.
    fn inv(&self) -> Invocation {
        in_home(Invocation::new(&self.program), &self.home)
    }

    /// `podman machine init NAME …`.
    pub fn init(&self, spec: &InitSpec) -> Invocation {
        let mut inv = self.inv().args(["machine", "init", &spec.name]);
        if self.can_import_native_ca() {
            inv = inv.arg("--import-native-ca");
        }
        // WSL's own networking has no gvproxy, so no host alias for the
        // WireGuard endpoint (see proxy::endpoint).
        if needs_user_mode_networking(&self.provider) {
            inv = inv.arg("--user-mode-networking");
        }
        inv = inv
            .args(["--cpus", &spec.cpus.to_string()])
            .args(["--memory", &spec.memory_mib.to_string()])
            .args(["--disk-size", &spec.disk_gib.to_string()]);
        for (host, guest) in &spec.volumes {
            inv = inv.arg("--volume").arg(format!("{host}:{guest}"));
        }
        if let Some(image) = &spec.image {
            inv = inv.arg("--image").arg(image);
        }
        inv.timeout(INIT_TIMEOUT)
    }

    /// `podman machine start NAME`.
    pub fn start(&self, name: &str) -> Invocation {
        self.inv().args(["machine", "start", name]).timeout(START_TIMEOUT)
    }

    /// `podman machine stop NAME`.
    pub fn stop(&self, name: &str) -> Invocation {
        self.inv().args(["machine", "stop", name]).timeout(STOP_TIMEOUT)
    }

    /// `podman machine rm -f NAME`: no prompt; also removes a machine that
    /// no longer answers.
    pub fn rm(&self, name: &str) -> Invocation {
        self.inv().args(["machine", "rm", "-f", name]).timeout(STOP_TIMEOUT)
    }

    /// `podman machine list --format json`, in this podman's home.
    pub fn list(&self) -> Invocation {
        machine_list(self.program.clone(), &self.home)
    }

    /// `podman machine inspect NAME`.
    pub fn inspect(&self, name: &str) -> Invocation {
        self.inv().args(["machine", "inspect", name]).timeout(QUERY_TIMEOUT)
    }

    /// `podman machine ssh NAME`: a login shell in the machine.
    pub fn shell(&self, name: &str) -> Invocation {
        self.inv().args(["machine", "ssh", name])
    }

    /// `podman machine ssh NAME -- ARGV…`, with every argument quoted for
    /// the guest's shell: podman joins them with spaces and the guest parses
    /// the line again, like OpenSSH.
    pub fn ssh(&self, name: &str, argv: &[impl AsRef<str>]) -> Invocation {
        let mut inv = self.inv().args(["machine", "ssh", name, "--"]);
        for a in argv {
            inv = inv.arg(shell_quote(a.as_ref()));
        }
        inv
    }

    /// Copy a host file into the machine: `machine cp` where podman has it,
    /// else the file piped into `cat` over ssh.
    pub fn copy_in(&self, src: &Path, name: &str, dst: &str) -> Invocation {
        if self.has_machine_cp() {
            let mut target = std::ffi::OsString::from(format!("{name}:"));
            target.push(dst);
            self.inv().args(["machine", "cp"]).arg(src).arg(target).timeout(START_TIMEOUT)
        } else {
            self.ssh(name, &["sh", "-c", &format!("cat > {}", shell_quote(dst))])
                .stdin(Stdin::File(src.to_owned()))
                .timeout(START_TIMEOUT)
        }
    }

    /// Copy a file out of the machine: `machine cp` where podman has it.
    /// Before 5.5 the caller pipes `cat` over ssh into the file itself.
    pub fn copy_out(&self, name: &str, src: &str, dst: &Path) -> Option<Invocation> {
        self.has_machine_cp()
            .then(|| self.inv().args(["machine", "cp", &format!("{name}:{src}")]).arg(dst).timeout(START_TIMEOUT))
    }
}

/// What `machine init` creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitSpec {
    pub name: String,
    pub cpus: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
    /// A machine image (a template's disk) instead of podman's default.
    pub image: Option<PathBuf>,
    /// Host directories mounted in the VM, `(host, guest)`; the same path
    /// wherever podman can carry it, so the agent sees familiar paths.
    pub volumes: Vec<(String, String)>,
}

/// The provider podman picks by default on this platform.
pub const fn default_provider() -> &'static str {
    if cfg!(target_os = "macos") {
        "libkrun"
    } else if cfg!(target_os = "windows") {
        "wsl"
    } else {
        "qemu"
    }
}

/// Quote `arg` for a POSIX shell: unchanged when it is plainly safe, else
/// in single quotes with each `'` spelled `'\''`.
pub fn shell_quote(arg: &str) -> String {
    let safe = !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if safe { arg.to_owned() } else { format!("'{}'", arg.replace('\'', r"'\''")) }
}

/// `podman machine list --format json` in `home`.
pub fn machine_list(program: PathBuf, home: &Home) -> Invocation {
    in_home(Invocation::new(program), home).args(["machine", "list", "--format", "json"]).timeout(LIST_TIMEOUT)
}

/// `inv` with `home`'s variables.
fn in_home(inv: Invocation, home: &Home) -> Invocation {
    home.env(std::env::consts::OS).into_iter().fold(inv, |inv, (k, v)| inv.env(k, v))
}

/// `podman --version`.
pub fn version(program: PathBuf) -> Invocation {
    Invocation::new(program).arg("--version").timeout(Duration::from_secs(10))
}

/// `podman version --format json`.
pub fn version_json(program: PathBuf) -> Invocation {
    Invocation::new(program).args(["version", "--format", "json"]).timeout(Duration::from_secs(10))
}

/// `podman machine info --format json`.
pub fn machine_info(program: PathBuf) -> Invocation {
    Invocation::new(program).args(["machine", "info", "--format", "json"]).timeout(QUERY_TIMEOUT)
}

/// One row of `podman machine list --format json`. Podman emits more
/// fields; only the ones ppp reads are here, and all are optional except the
/// name so a newer podman that drops one does not break `ppp ls`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Machine {
    pub name: String,
    #[serde(default)]
    pub running: bool,
    #[serde(default)]
    pub starting: bool,
    #[serde(default, rename = "VMType")]
    pub vm_type: Option<String>,
    #[serde(default, rename = "LastUp")]
    pub last_up: Option<String>,
    /// Why the machine cannot work although podman may call it running
    /// (its gvproxy or its qemu is gone): not podman's, ppp's own finding
    /// from the pid files podman keeps (see `sandbox::machine::remains`).
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none", rename = "Broken")]
    pub broken: Option<String>,
}

impl Machine {
    /// The state word ppp shows for this machine.
    pub fn state(&self) -> &'static str {
        if self.broken.is_some() {
            "broken"
        } else if self.running {
            "running"
        } else if self.starting {
            "starting"
        } else {
            "stopped"
        }
    }
}

/// Parse `machine list --format json`. Podman marks the default machine
/// with a trailing `*` in some versions; strip it.
pub fn parse_machine_list(json: &str) -> Result<Vec<Machine>, serde_json::Error> {
    let trimmed = json.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let mut machines: Vec<Machine> = serde_json::from_str(trimmed)?;
    for m in &mut machines {
        if let Some(stripped) = m.name.strip_suffix('*') {
            m.name = stripped.to_owned();
        }
    }
    Ok(machines)
}

/// Pull the version number out of `podman version 5.8.1`.
pub fn parse_version(text: &str) -> Option<String> {
    text.split_whitespace().last().filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit())).map(str::to_owned)
}

/// The client version in `podman version --format json`.
pub fn parse_version_json(text: &str) -> Option<Version> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    Version::parse(v.pointer("/Client/Version")?.as_str()?)
}

/// `Host.VMType` in `podman machine info --format json`.
pub fn parse_provider(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    v.pointer("/Host/VMType")?.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

/// Whether podman's error says it refused to start a second machine.
pub fn is_one_vm_refusal(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("only one vm can be active") || s.contains("already running or starting")
}

/// Sizes in binary units (`8g`, `512MiB`, `1.5GiB`, `2048` = MiB) as MiB.
pub fn parse_mib(text: &str) -> Option<u64> {
    parse_bytes(text, 1024 * 1024).map(|b| b / (1024 * 1024))
}

/// Sizes in binary units as GiB, rounded up (`100g`, `50GiB`, `512m`).
pub fn parse_gib(text: &str) -> Option<u64> {
    const GIB: u64 = 1024 * 1024 * 1024;
    parse_bytes(text, GIB).map(|b| b.div_ceil(GIB))
}

/// A size in bytes; a bare number is in units of `bare`.
pub(crate) fn parse_bytes(text: &str, bare: u64) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let scale: u64 = match unit.as_str() {
        "" => bare,
        "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    if num.is_empty() || num.matches('.').count() > 1 {
        return None;
    }
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    let whole: u64 = whole.parse().ok()?;
    let mut bytes = whole.checked_mul(scale)?;
    if !frac.is_empty() {
        // Exact decimal fraction of the unit, without floating point.
        let digits = u32::try_from(frac.len()).ok()?;
        let f: u64 = frac.parse().ok()?;
        bytes = bytes.checked_add(f.checked_mul(scale)? / 10u64.checked_pow(digits)?)?;
    }
    (bytes > 0).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hypervisor is found where podman finds it: beside podman in
    /// `../libexec/podman` (a podman installed under a prefix), not only on
    /// PATH; a provider with nothing to check (wsl) needs nothing.
    #[test]
    fn helpers_are_found_beside_podman() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("bin")).unwrap();
        std::fs::create_dir_all(d.path().join("libexec/podman")).unwrap();
        let helper = d.path().join("libexec/podman/ppp-test-helper");
        std::fs::write(&helper, "").unwrap();
        let podman = d.path().join("bin/podman");
        let found = find_helper("ppp-test-helper", &podman).unwrap();
        assert_eq!(found.canonicalize().unwrap(), helper.canonicalize().unwrap());
        assert!(find_helper("ppp-no-such-helper", &podman).is_none());
        assert!(hypervisor("wsl").is_none());
        let (qemu, install) = hypervisor("qemu").unwrap();
        assert!(qemu.starts_with("qemu-system-") && install.contains("apt install qemu-system-"), "{install}");
    }

    fn podman(version: &str, provider: &str) -> Podman {
        Podman {
            program: "/usr/bin/podman".into(),
            version: Version::parse(version).unwrap(),
            provider: provider.into(),
            home: Home::User,
        }
    }

    #[test]
    fn builds_list_invocation() {
        let inv = machine_list("/usr/bin/podman".into(), &Home::User);
        assert_eq!(inv.to_string(), "podman machine list --format json");
        assert!(inv.env.is_empty(), "the user's home is podman's environment as it is");
    }

    /// Every invocation from a podman in a home of ppp's carries that home,
    /// and the variables are the ones podman reads on each OS.
    #[test]
    fn every_invocation_carries_its_home() {
        let home = Home::Own(OwnHome { config: "/d/c".into(), data: "/d/d".into(), runtime: "/r/x".into() });
        let p = podman("6.0.1", "qemu").in_home(home.clone());
        let want: Vec<(std::ffi::OsString, std::ffi::OsString)> =
            home.env(std::env::consts::OS).into_iter().map(|(k, v)| (k.into(), v.into_os_string())).collect();
        assert_eq!(want.len(), 3);
        let spec =
            InitSpec { name: "ppp-a".into(), cpus: 1, memory_mib: 2048, disk_gib: 10, image: None, volumes: vec![] };
        for inv in [
            p.init(&spec),
            p.start("ppp-a"),
            p.stop("ppp-a"),
            p.rm("ppp-a"),
            p.list(),
            p.inspect("ppp-a"),
            p.ssh("ppp-a", &["true"]),
            p.copy_in(Path::new("/x"), "ppp-a", "/y"),
            p.copy_out("ppp-a", "/y", Path::new("/x")).unwrap(),
        ] {
            assert_eq!(inv.env, want, "{inv}");
        }
        let linux: Vec<_> = home.env("linux").into_iter().map(|(k, _)| k).collect();
        assert_eq!(linux, ["XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR"]);
        let mac: Vec<_> = home.env("macos").into_iter().map(|(k, _)| k).collect();
        assert_eq!(mac, ["XDG_CONFIG_HOME", "XDG_DATA_HOME", "TMPDIR"]);
        assert_eq!(home.machine_config_dir("qemu").unwrap(), Path::new("/d/c/containers/podman/machine/qemu"));
        assert!(Home::User.machine_config_dir("qemu").is_none());
    }

    #[test]
    fn parses_machine_list() {
        let json = r#"[{"Name":"podman-machine-default*","Default":true,"Running":false,"Starting":false,"VMType":"qemu","CPUs":2},
                       {"Name":"ppp-red-fox","Running":true,"LastUp":"Currently running","VMType":"applehv"}]"#;
        let ms = parse_machine_list(json).unwrap();
        assert_eq!(ms[0].name, "podman-machine-default");
        assert_eq!(ms[0].state(), "stopped");
        assert_eq!(ms[1].state(), "running");
        assert!(parse_machine_list("").unwrap().is_empty());
        assert!(parse_machine_list("not json").is_err());
    }

    #[test]
    fn parses_versions_and_provider() {
        assert_eq!(parse_version("podman version 5.8.1\n").as_deref(), Some("5.8.1"));
        assert_eq!(parse_version("garbage"), None);
        assert_eq!(parse_version_json(r#"{"Client":{"Version":"6.0.1"}}"#), Version::parse("6.0.1"));
        assert_eq!(Version::parse("5.5.0-rc1"), Some(Version { major: 5, minor: 5, patch: 0 }));
        assert_eq!(Version::parse("x"), None);
        assert_eq!(parse_provider(r#"{"Host":{"VMType":"applehv"}}"#).as_deref(), Some("applehv"));
        assert_eq!(parse_provider("{}"), None);
    }

    #[test]
    fn flags_follow_the_version() {
        let spec = InitSpec {
            name: "ppp-a".into(),
            cpus: 2,
            memory_mib: 4096,
            disk_gib: 50,
            image: None,
            volumes: vec![("/home/me/src".into(), "/home/me/src".into())],
        };
        assert_eq!(
            podman("6.0.1", "qemu").init(&spec).to_string(),
            "podman machine init ppp-a --import-native-ca --cpus 2 --memory 4096 --disk-size 50 --volume /home/me/src:/home/me/src"
        );
        assert_eq!(
            podman("5.8.0", "qemu").init(&spec).to_string(),
            "podman machine init ppp-a --cpus 2 --memory 4096 --disk-size 50 --volume /home/me/src:/home/me/src"
        );
        let new = podman("5.5.0", "qemu").copy_in(Path::new("/tmp/x.sh"), "ppp-a", "/tmp/ppp/x.sh");
        assert_eq!(new.to_string(), "podman machine cp /tmp/x.sh ppp-a:/tmp/ppp/x.sh");
        let old = podman("5.4.2", "qemu").copy_in(Path::new("/tmp/x.sh"), "ppp-a", "/tmp/ppp/x.sh");
        assert_eq!(old.to_string(), "podman machine ssh ppp-a -- sh -c 'cat > /tmp/ppp/x.sh'");
        assert_eq!(old.stdin, Stdin::File("/tmp/x.sh".into()));
        assert!(podman("5.4.2", "qemu").copy_out("ppp-a", "/a", Path::new("/b")).is_none());
    }

    #[test]
    fn one_running_machine_except_on_wsl() {
        assert!(!podman("6.0.1", "qemu").allows_many_running());
        assert!(!podman("6.0.1", "libkrun").allows_many_running());
        assert!(podman("6.0.1", "wsl").allows_many_running());
        assert!(is_one_vm_refusal("Error: only one VM can be active at a time"));
        assert!(!is_one_vm_refusal("Error: machine not found"));
    }

    /// Where podman 5.4.2 keeps the pid files ppp reads (names from its
    /// binary), and on which providers each process exists.
    #[test]
    fn machine_pid_files_are_podmans() {
        let run = Path::new("/run/user/1000/ppp-ab");
        assert_eq!(MachineProcess::Gvproxy.pid_file(run, "ppp-a"), run.join("podman/gvproxy.pid"));
        assert_eq!(MachineProcess::Qemu.pid_file(run, "ppp-a"), run.join("podman/ppp-a_vm.pid"));
        assert!(MachineProcess::Gvproxy.runs_on("qemu") && MachineProcess::Gvproxy.runs_on("applehv"));
        assert!(!MachineProcess::Gvproxy.runs_on("wsl") && !MachineProcess::Gvproxy.runs_on("hyperv"));
        assert!(MachineProcess::Qemu.runs_on("qemu") && !MachineProcess::Qemu.runs_on("libkrun"));
    }

    #[test]
    fn only_wsl_needs_user_mode_networking() {
        assert!(needs_user_mode_networking("wsl"));
        assert!(needs_user_mode_networking("WSL"));
        assert!(!needs_user_mode_networking("qemu"));
    }

    #[test]
    fn ssh_quotes_every_argument_for_the_guest_shell() {
        let inv = podman("6.0.1", "qemu").ssh("ppp-a", &["printf", "%s\\n", "a b", "it's", "", "$HOME"]);
        let args: Vec<String> = inv.args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args,
            ["machine", "ssh", "ppp-a", "--", "printf", "'%s\\n'", "'a b'", r"'it'\''s'", "''", "'$HOME'"]
        );
    }

    #[test]
    fn quoting_round_trips_through_a_real_shell() {
        let tricky = ["a b", "it's", "", "$(touch /tmp/ppp-pwned)", "\"q\"", "tab\there", "new\nline", "*", "~"];
        let line: Vec<String> = tricky.iter().map(|a| shell_quote(a)).collect();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("for a in {}; do printf '[%s]' \"$a\"; done", line.join(" ")))
            .output()
            .unwrap();
        let want = tricky.iter().fold(String::new(), |mut w, a| {
            w.push('[');
            w.push_str(a);
            w.push(']');
            w
        });
        assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    }

    #[test]
    fn sizes_in_binary_units() {
        assert_eq!(parse_mib("8g"), Some(8192));
        assert_eq!(parse_mib("8G"), Some(8192));
        assert_eq!(parse_mib("512MiB"), Some(512));
        assert_eq!(parse_mib("1.5GiB"), Some(1536));
        assert_eq!(parse_mib("2048"), Some(2048));
        assert_eq!(parse_mib("1t"), Some(1024 * 1024));
        assert_eq!(parse_gib("100g"), Some(100));
        assert_eq!(parse_gib("512m"), Some(1));
        assert_eq!(parse_gib("50"), Some(50));
        for bad in ["", "g", "8x", "-1g", "1.2.3g", "0", "0g", "99999999999999999999t"] {
            assert_eq!(parse_mib(bad), None, "{bad}");
        }
    }
}

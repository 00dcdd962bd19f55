//! The real-VM rig (issue 13, 23) for any test that needs a real podman
//! machine: podman 5.4 from a trixie root, gvproxy, qemu (KVM where the
//! guest kernel boots on it, else TCG: tests/vm/bin/qemu-system-x86_64
//! decides), a Debian guest with its own kernel and systemd. See
//! docs/harness.md, "The real VM".
//!
//! `Rig::provisioned(name)` gives a sandbox that `ppp run` booted,
//! provisioned and ran the stand-in agent in (exit 7), with the agent image
//! in the test's registry. Include it beside `netns.rs` and `sandbox_env.rs`:
//!
//! ```ignore
//! #[path = "support/netns.rs"] mod netns;
//! #[path = "support/sandbox_env.rs"] mod sandbox_env;
//! #[path = "support/vm.rs"] mod vm;
//! ```
//!
//! Safety: ppp, and so podman, gvproxy and qemu, run in the test's host
//! namespace, which has no route out; gvproxy NATs the guest to nothing but
//! the test's own veths. The registry runs in the upstream's namespace.

#![allow(dead_code, unreachable_pub)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::netns::{self, UPSTREAM_IP, describe, wait_until};
use crate::sandbox_env::{Env, setup_policy};

/// The podman user of the trixie root (tests/vm/enter.sh's `VM_UID`).
pub const VM_UID: u32 = 1000;

/// Where the registry listens, in the upstream's namespace.
pub const REGISTRY_PORT: u16 = 5000;

/// The stand-in agent: proves the workspace mount by writing into it, shows
/// what it sees, and exits 7.
pub const AGENT: &str = r#"#!/bin/sh
echo "vm-agent args: $*"
echo "vm-agent cwd: $(pwd) as $(id -u)"
echo "written by the agent in the VM" > from-agent.txt || ls -ld .
# Issue 26, as an agent would: plant a hook and git config (refused: mounted
# read-only), and an .envrc (cannot be prevented: reported by ppp run).
if [ -d .git ]; then
  if (echo 'touch /tmp/planted' > .git/hooks/pre-commit) 2>/dev/null; then echo "vm-agent hook: written"; else echo "vm-agent hook: refused"; fi
  if (printf '[core]\n\thooksPath = /tmp\n' >> .git/config) 2>/dev/null; then echo "vm-agent config: written"; else echo "vm-agent config: refused"; fi
  if (echo "agent $$" > .git/agent-object) 2>/dev/null; then echo "vm-agent git-dir: writable"; else echo "vm-agent git-dir: refused"; fi
  rm -f .git/agent-object
  # The agent's normal work still works: a commit, and a push to the bare
  # remote the host made in the workspace (remote `origin`).
  if command -v git >/dev/null; then
    echo "agent change $$" > agent-change.txt
    if git add agent-change.txt && git -c user.name=agent -c user.email=agent@ppp.test commit -qm "by the agent"; then echo "vm-agent commit: ok"; else echo "vm-agent commit: failed"; fi
    if [ -d remote.git ]; then
      if git push -q origin HEAD:refs/heads/from-agent; then echo "vm-agent push: ok"; else echo "vm-agent push: failed"; fi
    fi
  else
    echo "vm-agent git: missing"
  fi
fi
echo "echo planted by the agent $$" > .envrc

code=$(curl -sS -m 60 -o /dev/null -w '%{http_code}' https://echo.test/agent-tls)
echo "vm-agent tls: $code"
exit 7
"#;

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The images' directory: `PPP_VM_DIR` (set by `make test-vm`), else built
/// (or found in the cache) by build-image.sh. No KVM is a failure with a hint.
pub fn vm_dir() -> PathBuf {
    assert!(
        Path::new("/dev/kvm").exists(),
        "/dev/kvm is missing: the real-VM test needs KVM (it runs TCG where KVM cannot boot the guest, \
         but podman's qemu provider refuses to start without /dev/kvm)\n\
         hint: run it where (nested) virtualisation is on"
    );
    let qemu_img = Command::new("sh").args(["-c", "command -v qemu-img"]).output().unwrap();
    assert!(
        qemu_img.status.success(),
        "qemu-img is missing: the real-VM test builds its guest image with it\nhint: run scripts/install-test-deps.sh"
    );
    if let Some(dir) = std::env::var_os("PPP_VM_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let out = Command::new(repo().join("tests/vm/build-image.sh")).stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "tests/vm/build-image.sh failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().unwrap().trim())
}

/// A real sandbox and what it stands on.
pub struct Rig {
    pub env: Env,
    pub dir: PathBuf,
    /// `PPP_VM_STATE`: the podman user's home and runtime dir.
    pub state: PathBuf,
    /// The agent image, as the guest pulls it.
    pub image: String,
    /// What the qemu wrapper chose, and why.
    pub accel: String,
    /// What the first `ppp run` printed (the agent's lines).
    pub first_run: String,
    /// The sandbox [`Rig::provisioned`] made: the one [`Rig::podman`] and
    /// [`Rig::guest`] talk to (in its own podman home).
    pub name: String,
    registry: Child,
}

impl Rig {
    /// The rig with nothing booted yet: images built, registry up, agent
    /// image pushed, the accelerator chosen (and printed).
    pub fn new() -> Rig {
        let dir = vm_dir();
        let mut env = Env::new("qemu");
        // virtiofsd and podman run as uid 1000 and must reach the workspace.
        std::fs::set_permissions(env.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // A real user owns their workspace, and podman (so virtiofsd) runs
        // as that user: the guest's core has the same uid, and the agent's
        // container root is core. A root-owned workspace (the test runs as
        // root) would show as nobody in the container, and rootless
        // virtiofsd cannot create files as another owner.
        std::os::unix::fs::chown(env.ws(), Some(VM_UID), Some(VM_UID)).unwrap();
        let state = env.root().join("vm-state");
        let image = format!("{}:{REGISTRY_PORT}/ppp/agent:latest", netns::UPSTREAM_NAME);
        env.extra = vec![
            ("PPP_PODMAN".into(), repo().join("tests/vm/podman").display().to_string()),
            ("PPP_VM_DIR".into(), dir.display().to_string()),
            ("PPP_VM_STATE".into(), state.display().to_string()),
            ("PPP_OPENCODE_IMAGE".into(), image.clone()),
        ];
        if let Ok(accel) = std::env::var("PPP_VM_ACCEL") {
            env.extra.push(("PPP_VM_ACCEL".into(), accel));
        }
        let registry = registry(&env);
        let mut rig = Rig {
            env,
            dir,
            state,
            image,
            accel: String::new(),
            first_run: String::new(),
            name: String::new(),
            registry,
        };
        let probe = rig.enter(&["/opt/ppp-test/bin/qemu-system-x86_64", "ppp-accel"]);
        assert!(probe.status.success(), "the qemu wrapper's probe: {}", describe(&probe));
        String::from_utf8_lossy(&probe.stdout).trim().clone_into(&mut rig.accel);
        eprintln!("real VM: accelerator {}", rig.accel);

        // The agent image: one layer over 10 MiB, pushed from the host namespace.
        let agent = rig.env.root().join("agent.sh");
        std::fs::write(&agent, AGENT).unwrap();
        let out = Command::new("ip")
            .args(["netns", "exec", &rig.env.topo.host_ns()])
            .arg(repo().join("tests/vm/agent-image.sh"))
            .arg(&agent)
            .arg(format!("{UPSTREAM_IP}:{REGISTRY_PORT}/ppp/agent:latest"))
            .envs(rig.env.extra.iter().cloned())
            .output()
            .unwrap();
        assert!(out.status.success(), "agent-image.sh: {}", describe(&out));
        rig
    }

    /// A sandbox `name` that `ppp run` booted, provisioned and ran the agent
    /// in (exit 7): the function other real-VM tests start from.
    pub fn provisioned(name: &str) -> Rig {
        let mut rig = Rig::new();
        name.clone_into(&mut rig.name);
        setup_policy(&rig.env, name);
        let started = std::time::Instant::now();
        let out = rig.run_agent(name);
        eprintln!(
            "real VM: `ppp run` (init, boot, provision, agent) took {:.0?}: {}",
            started.elapsed(),
            timed_steps(&out)
        );
        assert_eq!(out.status.code(), Some(7), "{}", rig.explain(name, &out));
        rig.first_run = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        rig
    }

    /// `ppp run --name NAME --template <the Debian image> opencode WS -- hello vm`.
    /// The Debian guest image, as the trixie root sees it (enter.sh binds it
    /// there): ppp passes a `--template` it does not know to podman as the
    /// machine image, which is what a user with a local image does.
    pub fn run_agent(&self, name: &str) -> Output {
        self.run_agent_with(name, &[])
    }

    /// [`Rig::run_agent`] with `flags` (e.g. `--cpus 1 -m 1536`) before the agent.
    pub fn run_agent_with(&self, name: &str, flags: &[&str]) -> Output {
        let ws = self.env.ws();
        let mut argv = vec!["run", "--name", name, "--template", "/opt/ppp-vm/disk.qcow2"];
        argv.extend_from_slice(flags);
        argv.extend_from_slice(&["opencode", &ws, "--", "hello", "vm"]);
        self.env.run(&argv)
    }

    /// A failed command with machine.log and the console's tail.
    pub fn explain(&self, name: &str, out: &Output) -> String {
        format!(
            "{}\nmachine.log:\n{}\nconsole (tail):\n{}",
            describe(out),
            std::fs::read_to_string(self.env.dirs().sandbox_machine_log(name)).unwrap_or_default(),
            tail(&self.console(name), 60)
        )
    }

    /// Sandbox `name`'s serial console (the qemu wrapper writes one per machine).
    pub fn console(&self, name: &str) -> PathBuf {
        self.state.join(format!("home/qemu-console-ppp-{name}.log"))
    }

    /// The variables of sandbox `name`'s podman home, as ppp gives them to
    /// podman (enter.sh maps them onto the podman user's); none once the
    /// sandbox is gone (the podman user's own home).
    pub fn home_of(&self, name: &str) -> Vec<(String, String)> {
        match ppp::sandbox::load(&self.env.dirs(), name) {
            Ok(Some(_)) => self.env.home_vars(name),
            _ => Vec::new(),
        }
    }

    /// A command of the trixie root (tests/vm/enter.sh), in the host namespace.
    pub fn enter(&self, argv: &[&str]) -> Output {
        self.enter_with(&[], argv)
    }

    /// [`Rig::enter`] with `vars` (a podman home's) on top.
    pub fn enter_with(&self, vars: &[(String, String)], argv: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.env.topo.host_ns()])
            .arg(repo().join("tests/vm/enter.sh"))
            .args(argv)
            .env_clear()
            .envs(self.env.extra.iter().cloned())
            .envs(vars.iter().cloned())
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap()
    }

    /// `podman ARGS` of the trixie root in the provisioned sandbox's podman
    /// home, as ppp calls it; must succeed.
    pub fn podman(&self, args: &[&str]) -> String {
        self.podman_in(&self.name, args)
    }

    /// `podman ARGS` in sandbox `name`'s podman home; must succeed.
    pub fn podman_in(&self, name: &str, args: &[&str]) -> String {
        let mut words = vec!["podman"];
        words.extend_from_slice(args);
        let out = self.enter_with(&self.home_of(name), &words);
        assert!(out.status.success(), "podman {args:?} ({name}'s home): {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sh -c SCRIPT` in the guest as core, through podman directly (not ppp).
    pub fn guest(&self, script: &str) -> Output {
        self.guest_in(&self.name, script)
    }

    /// [`Rig::guest`] in sandbox `name`'s machine.
    pub fn guest_in(&self, name: &str, script: &str) -> Output {
        let machine = format!("ppp-{name}");
        self.enter_with(
            &self.home_of(name),
            &["podman", "machine", "ssh", &machine, "--", &shell_quote(&["sh", "-c", script])],
        )
    }

    /// The pid podman recorded for the provisioned sandbox's `what`
    /// (`gvproxy` or `qemu`) in its runtime directory.
    pub fn machine_pid(&self, what: &str) -> u32 {
        self.machine_pid_in(&self.name, what)
    }

    /// [`Rig::machine_pid`] of sandbox `name`: podman 5.4's `gvproxy.pid`
    /// and `<machine>_vm.pid` in the runtime directory ppp gave its home.
    pub fn machine_pid_in(&self, name: &str, what: &str) -> u32 {
        let rec = ppp::sandbox::load(&self.env.dirs(), name).unwrap().expect("the sandbox exists");
        let dir = rec.podman_run.expect("the sandbox has its own podman home").join("podman");
        let file = match what {
            "gvproxy" => dir.join("gvproxy.pid"),
            "qemu" => dir.join(format!("ppp-{name}_vm.pid")),
            other => panic!("no pid file for {other}"),
        };
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            panic!("{}: {e}; the directory has {:?}", file.display(), std::fs::read_dir(&dir).map(Iterator::count))
        });
        text.trim().parse().unwrap()
    }
}

/// The timed steps a ppp command printed (`ppp: … done in …`: podman's
/// init and start, provisioning, the image, verify), joined by ` | `.
pub fn timed_steps(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("ppp: ") && l.contains(" done in "))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Whether process `pid` is alive (a zombie is not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit(") ").next().is_some_and(|r| !r.starts_with('Z')))
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.env.run(&["rm", "--all", "-f"]);
        let _ = self.registry.kill();
        let _ = self.registry.wait();
    }
}

/// Shell-quote words for `podman machine ssh`, which joins them with spaces.
pub fn shell_quote(words: &[&str]) -> String {
    words.iter().map(|w| format!("'{}'", w.replace('\'', r"'\''"))).collect::<Vec<_>>().join(" ")
}

/// A curl that shows egress is closed: it timed out (exit 28: the kill
/// switch dropped its SYN, which TCP retries) or the kernel refused to send
/// (EPERM from the output hook). Anything else, a refusal included, means
/// packets left.
pub fn blocked(out: &Output) -> bool {
    let err = String::from_utf8_lossy(&out.stderr);
    out.status.code() == Some(28) || err.contains("not permitted") || err.contains("timed out")
}

/// Debian's docker-registry with the upstream's certificate (for echo.test),
/// in the upstream's namespace.
fn registry(env: &Env) -> Child {
    let d = env.root().join("registry");
    std::fs::create_dir_all(&d).unwrap();
    let up = env.root().join("upstream");
    let config = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {UPSTREAM_IP}:{REGISTRY_PORT}\n  tls:\n    certificate: {}\n    key: {}\n",
        d.join("storage").display(),
        up.join("srv.pem").display(),
        up.join("srv.key").display()
    );
    std::fs::write(d.join("config.yml"), config).unwrap();
    let log = std::fs::File::create(d.join("registry.log")).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", &env.topo.upstream_ns(), "docker-registry", "serve"])
        .arg(d.join("config.yml"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("docker-registry starts (scripts/install-test-deps.sh installs it)");
    wait_until("the registry to listen", netns::DEADLINE, || {
        let out = env.topo.exec(&env.topo.upstream_ns(), &["ss", "-Htln", &format!("sport = :{REGISTRY_PORT}")]);
        !String::from_utf8_lossy(&out.stdout).trim().is_empty()
    });
    child
}

pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

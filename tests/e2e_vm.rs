//! The real thing (issue 13): ppp against a real `podman machine` (podman
//! 5.4.2, gvproxy, qemu, a KVM guest with its own kernel), not the fake.
//! What it adds over `e2e_sandbox`: the real ssh path, virtiofs, kernel
//! WireGuard, nftables in a guest whose containers sit behind netavark, and
//! the guest's podman pulling the agent image through the tunnel.
//!
//! Built once from Debian packages by `tests/vm/build-image.sh` (a trixie root
//! for podman, a guest image), entered by `tests/vm/enter.sh`; see
//! docs/harness.md, "The real VM". Run by `make test-vm`, which builds the
//! images first.
//!
//! Safety: ppp, and so podman, gvproxy and qemu, run in the test's host
//! namespace, which has no route out; gvproxy NATs the guest to nothing but
//! the test's own veths. The registry runs in the upstream's namespace.

#[path = "support/netns.rs"]
mod netns;

#[path = "support/sandbox_env.rs"]
mod sandbox_env;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use netns::{UPSTREAM_IP, describe, run_ok, wait_until};
use sandbox_env::{Env, setup_policy};
use serde_json::Value;

/// Where the registry listens, in the upstream's namespace.
const REGISTRY_PORT: u16 = 5000;

/// The stand-in agent: proves the workspace mount by writing into it, shows
/// what it sees, and exits 7.
const AGENT: &str = r#"#!/bin/sh
echo "vm-agent args: $*"
echo "vm-agent cwd: $(pwd)"
echo "written by the agent in the VM" > from-agent.txt
code=$(curl -sS -m 20 -o /dev/null -w '%{http_code}' https://echo.test/agent-tls)
echo "vm-agent tls: $code"
exit 7
"#;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The images' directory: `PPP_VM_DIR` (set by `make test-vm`), else built
/// (or found in the cache) by build-image.sh. No KVM is a failure with a hint.
fn vm_dir() -> PathBuf {
    assert!(
        Path::new("/dev/kvm").exists(),
        "/dev/kvm is missing: the real-VM test needs KVM\n\
         hint: run it where (nested) virtualisation is on; `make test-vm` runs only this test"
    );
    if let Some(dir) = std::env::var_os("PPP_VM_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let out = Command::new(repo().join("tests/vm/build-image.sh")).stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "tests/vm/build-image.sh failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().unwrap().trim())
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

/// `podman ARGS` of the trixie root, as ppp calls it.
fn podman(env: &Env, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", &env.topo.host_ns()])
        .arg(repo().join("tests/vm/podman"))
        .args(args)
        .env_clear()
        .envs(env.extra.iter().cloned())
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap();
    assert!(out.status.success(), "podman {args:?}: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "boots a real VM (minutes, root, /dev/kvm): run `make test-vm`"]
fn a_real_podman_machine_from_run_to_rm() {
    let dir = vm_dir();
    let mut env = Env::new("qemu");
    // virtiofsd and podman run as uid 1000 and must reach the workspace.
    std::fs::set_permissions(env.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = env.root().join("vm-state");
    let image = format!("{}:{REGISTRY_PORT}/ppp/agent:latest", netns::UPSTREAM_NAME);
    env.extra = vec![
        ("PPP_PODMAN".into(), repo().join("tests/vm/podman").display().to_string()),
        ("PPP_VM_DIR".into(), dir.display().to_string()),
        ("PPP_VM_STATE".into(), state.display().to_string()),
        ("PPP_OPENCODE_IMAGE".into(), image.clone()),
    ];
    setup_policy(&env, "vm");
    let mut reg = registry(&env);

    // The agent image: one layer over 10 MiB, pushed from the host namespace.
    let agent = env.root().join("agent.sh");
    std::fs::write(&agent, AGENT).unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &env.topo.host_ns()])
        .arg(repo().join("tests/vm/agent-image.sh"))
        .arg(&agent)
        .arg(format!("{UPSTREAM_IP}:{REGISTRY_PORT}/ppp/agent:latest"))
        .envs(env.extra.iter().cloned())
        .output()
        .unwrap();
    assert!(out.status.success(), "agent-image.sh: {}", describe(&out));

    // 1. run: init, start, provision, verify, agent container up; the agent
    //    writes into the workspace through virtiofs.
    // The Debian guest image, as the trixie root sees it (enter.sh binds it
    // there): ppp passes a `--template` it does not know to podman as the
    // machine image, which is what a user with a local image does.
    let out = env.run(&[
        "run",
        "--name",
        "vm",
        "--template",
        "/opt/ppp-vm/disk.qcow2",
        "opencode",
        &env.ws(),
        "--",
        "hello",
        "vm",
    ]);
    let console = state.join("home/qemu-console.log");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}\nmachine.log:\n{}\nconsole (tail):\n{}",
        describe(&out),
        std::fs::read_to_string(env.dirs().sandbox_machine_log("vm")).unwrap_or_default(),
        tail(&console, 60)
    );
    assert!(text.contains("vm-agent args: hello vm"), "{text}");
    assert!(text.contains("vm-agent tls: 200"), "the container trusts the proxy's CA: {text}");
    let written = Path::new(&env.ws()).join("from-agent.txt");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "written by the agent in the VM\n");
    let log = std::fs::read_to_string(env.dirs().sandbox_machine_log("vm")).unwrap();
    for check in ["ok handshake", "ok no-direct-egress", "ok policy-denies", "ok ca-trusted"] {
        assert!(log.contains(check), "{check} in machine.log:\n{log}");
    }
    assert!(log.contains("# WireGuard endpoint host 192.168.127.254 (provider qemu)"), "{log}");

    // 2. The guest: kernel WireGuard, the kill switch, DNS through the tunnel,
    //    bodies that need the MTU right.
    let link = env.ok(&["exec", "vm", "--", "ip", "-d", "link", "show", "wg0"]);
    assert!(link.contains("wireguard"), "kernel WireGuard: {link}");
    let table = env.ok(&["exec", "vm", "--", "sudo", "nft", "list", "table", "inet", "ppp"]);
    assert!(table.contains("hook output") && table.contains("hook forward"), "{table}");
    let resolv = env.ok(&["exec", "vm", "--", "cat", "/etc/resolv.conf"]);
    assert!(resolv.contains("10.0.0.53"), "{resolv}");
    let routes = env.ok(&["exec", "vm", "--", "ip", "route", "show", "default"]);
    assert!(routes.contains("wg0") && routes.contains("quickack 1"), "{routes}");
    for size in [1400, 65536] {
        let cmd = format!(
            "head -c {size} /dev/zero | tr '\\0' x | curl -sS -m 30 --data-binary @- -o /dev/null -w '%{{http_code}}' https://echo.test/mtu-{size}"
        );
        assert_eq!(env.ok(&["exec", "vm", "--", "sh", "-c", &cmd]), "200", "{size}-byte body");
    }
    assert_eq!(env.denied_status("vm"), "403");

    // 3. The image came through the tunnel, its big layer whole.
    let size = env.ok(&["exec", "vm", "--", "podman", "image", "inspect", "--format", "{{.Size}}", &image]);
    assert!(size.trim().parse::<u64>().unwrap() > 10 * 1024 * 1024, "{size}");

    // 4. With wg0 gone, nothing leaves: not the VM, not a bridged container.
    env.ok(&["exec", "vm", "--", "sudo", "ip", "link", "del", "wg0"]);
    let direct = format!("http://{UPSTREAM_IP}/direct");
    let out = env.run(&["exec", "vm", "--", "curl", "-sS", "-m", "5", &direct]);
    assert!(!out.status.success(), "direct egress from the VM must fail: {}", describe(&out));
    let out = env.run(&[
        "exec",
        "vm",
        "--",
        "podman",
        "run",
        "--rm",
        "--network",
        "bridge",
        &image,
        "curl",
        "-sS",
        "-m",
        "5",
        &direct,
    ]);
    assert!(!out.status.success(), "direct egress from a container must fail: {}", describe(&out));

    // 5. stop, run --name (re-provisions, wg0 back), cp both ways, rm.
    env.ok(&["stop", "vm"]);
    assert_eq!(env.ls()[0]["state"], "stopped");
    let out = env.run(&["run", "--name", "vm", "opencode", &env.ws()]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(env.ok(&["exec", "vm", "--", "ip", "-d", "link", "show", "wg0"]).contains("wireguard"));
    let file = env.root().join("note.txt");
    std::fs::write(&file, "from the host\n").unwrap();
    env.ok(&["cp", file.to_str().unwrap(), "vm:/tmp/note.txt"]);
    assert_eq!(env.ok(&["exec", "vm", "--", "cat", "/tmp/note.txt"]), "from the host\n");
    let back = env.root().join("back.txt");
    env.ok(&["cp", "vm:/tmp/note.txt", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "from the host\n");

    // 6. diagnose and ls see the real machine.
    let report: Value = serde_json::from_str(&env.ok(&["diagnose", "-o", "json"])).unwrap();
    let machines = report["machines"]["list"].as_array().unwrap();
    assert!(machines.iter().any(|m| m["name"] == "ppp-vm" && m["vm_type"] == "qemu"), "{machines:?}");
    assert_eq!(report["endpoint"]["host"], "192.168.127.254");
    assert_eq!(env.ls()[0]["state"], "running");

    env.ok(&["rm", "-f", "vm"]);
    assert!(env.ls().is_empty());
    assert!(!podman(&env, &["machine", "list", "--format", "json"]).contains("ppp-vm"));
    let _ = reg.kill();
    let _ = reg.wait();
    // Nothing of the machine is left running.
    let leftovers = run_ok(&["sh", "-c", &format!("pgrep -af '{}' || true", state.display())]);
    assert!(leftovers.trim().is_empty(), "{leftovers}");
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

//! The real thing (issues 13, 23): ppp against a real `podman machine`
//! (podman 5.4.2, gvproxy, qemu under KVM or TCG, a guest with its own kernel
//! and systemd), not the fake. What it adds over `e2e_sandbox`: the real ssh
//! path, virtiofs, kernel WireGuard, nftables and conntrack in a guest whose
//! containers sit behind netavark, real systemd ordering at boot, and the
//! guest's podman pulling the agent image through the tunnel.
//!
//! The rig is tests/support/vm.rs (reusable by other real-VM tests).
//! It runs in `make test` (under TCG where KVM cannot boot the guest);
//! `make test-vm` runs this file alone. See docs/harness.md, "The real VM".

#[path = "support/netns.rs"]
mod netns;

#[path = "support/sandbox_env.rs"]
mod sandbox_env;

#[path = "support/vm.rs"]
mod vm;

use std::path::Path;

use netns::{UPSTREAM_IP, describe};
use serde_json::Value;
use vm::{Rig, blocked};

#[test]
fn a_real_podman_machine_from_run_to_rm() {
    // 1. run: init, start, provision (through the kill switch: the session
    //    that loads it survives), verify, the agent; it writes into the
    //    workspace through virtiofs.
    let rig = Rig::provisioned("vm");
    let (env, state, image) = (&rig.env, rig.state.clone(), rig.image.clone());
    let log = std::fs::read_to_string(env.dirs().sandbox_machine_log("vm")).unwrap();
    for check in ["ok handshake", "ok no-direct-egress", "ok policy-denies", "ok ca-trusted"] {
        assert!(log.contains(check), "{check} in machine.log:\n{log}");
    }
    assert!(log.contains("# WireGuard endpoint host 192.168.127.254 (provider qemu)"), "{log}");
    assert!(!log.contains("ppp-provision: alive"), "heartbeats stay out of machine.log:\n{log}");
    let written = Path::new(&env.ws()).join("from-agent.txt");
    assert_eq!(
        std::fs::read_to_string(&written).unwrap_or_default(),
        "written by the agent in the VM\n",
        "the agent's write through virtiofs; ppp run printed:\n{}",
        rig.first_run
    );

    // Issue 26: the .envrc the agent planted (nothing can prevent a new
    // file) is reported when `ppp run` ends.
    assert!(
        rig.first_run.contains("created or changed files that can run code on this host")
            && rig.first_run.contains(".envrc"),
        "the planted .envrc reported at the end of ppp run:\n{}",
        rig.first_run
    );

    // The management channel is let through and nothing else: a guest
    // process (core, then root) reaches neither gvproxy's gateway on other
    // ports, nor its host side (the host alias, podman's ssh port there),
    // nor, with source port 22 (the ssh allowance), anything at all.
    let inspect: Value = serde_json::from_str(&rig.podman(&["machine", "inspect", "ppp-vm"])).unwrap();
    let ssh_port = inspect[0]["SSHConfig"]["Port"].as_u64().unwrap();
    let targets = [
        "http://192.168.127.1:80/".to_owned(),
        "http://192.168.127.1:53/".to_owned(),
        "http://192.168.127.1:22/".to_owned(),
        format!("http://192.168.127.254:{ssh_port}/"),
        "http://192.168.127.254:80/".to_owned(),
        format!("http://{UPSTREAM_IP}:80/direct"),
    ];
    for url in &targets {
        for sudo in [&[][..], &["sudo"][..]] {
            let mut argv: Vec<&str> = vec!["exec", "vm", "--"];
            argv.extend_from_slice(sudo);
            argv.extend_from_slice(&["curl", "-sS", "-m", "5", "--interface", "ens3", url]);
            let out = env.run(&argv);
            assert!(blocked(&out), "{sudo:?} curl {url} must be dropped: {}", describe(&out));
        }
        // sshd holds port 22 on every address, so a second socket cannot bind
        // it: stop nothing, take a raw socket, send a SYN from port 22 out of
        // the uplink (bound to it, as the curls are: by the routes, the
        // upstream's address goes into the tunnel, which is allowed).
        let syn = format!(
            "import socket,struct\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_TCP)\n\
             s.setsockopt(socket.SOL_SOCKET,socket.SO_BINDTODEVICE,b'ens3')\n\
             h=struct.pack('!HHIIBBHHH',22,{port},1,0,5<<4,2,64240,0,0)\n\
             try:\n  s.sendto(h,('{host}',0)); print('sent')\n\
             except PermissionError: print('eperm')\n",
            host = url.split('/').nth(2).unwrap().split(':').next().unwrap(),
            port = url.split('/').nth(2).unwrap().split(':').nth(1).unwrap()
        );
        let out = env.run(&["exec", "vm", "--", "sudo", "python3", "-c", &syn]);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("eperm"),
            "a SYN from port 22 to {url} must be refused by the output hook: {}",
            describe(&out)
        );
    }
    // And the channel itself still works, new sessions and all.
    assert_eq!(env.ok(&["exec", "vm", "--", "echo", "still here"]), "still here\n");

    // Containers on the host network and on the bridge reach the world only
    // through the tunnel.
    for net in ["host", "bridge"] {
        let run = |args: &[&str]| {
            // The CA bundle as ppp mounts it for the agent: a plain
            // container does not trust mitmproxy's CA otherwise.
            let ca = "/var/lib/ppp/ca-bundle.pem:/etc/ssl/certs/ca-certificates.crt:ro";
            let mut argv = vec!["exec", "vm", "--", "podman", "run", "--rm", "--network", net, "-v", ca, &image];
            argv.extend_from_slice(args);
            env.run(&argv)
        };
        let out =
            run(&["curl", "-sS", "-m", "30", "-o", "/dev/null", "-w", "%{http_code}", "https://echo.test/via-tunnel"]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "200",
            "--network {net} through the tunnel: {}",
            describe(&out)
        );
        let out = run(&["curl", "-sS", "-m", "5", "--connect-to", "x:80:192.168.127.1:80", "http://x/"]);
        assert!(!out.status.success(), "--network {net} to gvproxy's gateway: {}", describe(&out));
        let out = run(&["curl", "-sS", "-m", "5", &format!("http://192.168.127.254:{ssh_port}/")]);
        assert!(!out.status.success(), "--network {net} to the host side: {}", describe(&out));
    }

    // The machine stopped and started outside ppp, by the real podman: the
    // kill switch is in force before the network (systemd's own order), no
    // tunnel, and nothing leaves, from the VM or from a bridged container.
    rig.podman(&["machine", "stop", "ppp-vm"]);
    rig.podman(&["machine", "start", "ppp-vm"]);
    closed_after_boot(&rig, &image, "after boot", "direct");
    let out = rig.run_agent("vm");
    assert_eq!(out.status.code(), Some(7), "ppp run on top: {}", rig.explain("vm", &out));

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
    // 200 MiB through kernel WireGuard inside gvproxy's 1500-byte link, whole.
    let big: u64 = 200 * 1024 * 1024;
    let want = std::process::Command::new("sh")
        .args(["-c", &format!("head -c {big} /dev/zero | sha256sum")])
        .output()
        .unwrap();
    let want = String::from_utf8_lossy(&want.stdout).split_whitespace().next().unwrap().to_owned();
    let started = std::time::Instant::now();
    let got = env.run(&[
        "exec",
        "vm",
        "--",
        "sh",
        "-c",
        &format!("curl -sS -m 1500 https://echo.test/chunked/{big} | sha256sum"),
    ]);
    eprintln!("real VM: 200 MiB through the tunnel took {:.0?}", started.elapsed());
    assert!(
        String::from_utf8_lossy(&got.stdout).starts_with(&want),
        "200 MiB download, sha256 {want}: {}",
        describe(&got)
    );

    // 3. The image came through the tunnel, its big layer whole.
    let size = env.ok(&["exec", "vm", "--", "podman", "image", "inspect", "--format", "{{.Size}}", &image]);
    assert!(size.trim().parse::<u64>().unwrap() > 10 * 1024 * 1024, "{size}");

    // 3b. A reboot from inside the guest (issue 23.3, 22.5): with the
    //     tunnel up before it, the guest comes back with the kill switch in
    //     force before the network and no wg0; nothing leaves, from the VM
    //     or a bridged container, until ppp provisions it again (`ppp run`).
    let boot_before = String::from_utf8_lossy(&rig.guest("cat /proc/sys/kernel/random/boot_id").stdout).into_owned();
    let out = rig.guest("sudo systemd-run --on-active=2 systemctl reboot");
    assert!(out.status.success(), "reboot scheduled in the guest: {}", describe(&out));
    let rebooted = std::time::Instant::now();
    let mut came_back = false;
    while rebooted.elapsed() < std::time::Duration::from_secs(600) {
        std::thread::sleep(std::time::Duration::from_secs(5));
        let out = rig.guest("cat /proc/sys/kernel/random/boot_id");
        let id = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && !id.trim().is_empty() && id != boot_before {
            came_back = true;
            break;
        }
    }
    eprintln!(
        "real VM: reboot from inside the guest: back in {:.0?} ({})",
        rebooted.elapsed(),
        rig.podman(&["machine", "inspect", "--format", "{{.State}}", "ppp-vm"]).trim()
    );
    assert!(came_back, "the guest came back from its reboot:\nconsole (tail):\n{}", vm::tail(&rig.console("vm"), 60));
    closed_after_boot(&rig, &image, "after the reboot", "direct-after-reboot");
    let out = rig.guest("curl -sS -m 10 -o /dev/null -w '%{http_code}' https://echo.test/after-reboot");
    assert!(!out.status.success(), "no tunnel until ppp provisions again: {}", describe(&out));
    let out = rig.run_agent("vm");
    assert_eq!(out.status.code(), Some(7), "ppp run after the reboot: {}", rig.explain("vm", &out));
    let code = env.ok(&[
        "exec",
        "vm",
        "--",
        "curl",
        "-sS",
        "-m",
        "30",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "https://echo.test/after-reboot-run",
    ]);
    assert_eq!(code, "200", "the tunnel after ppp run re-provisioned the rebooted guest");

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

    // 5. stop, run --name (re-provisions, wg0 back), cp in (and out: refused
    //    on podman 5.4), rm.
    env.ok(&["stop", "vm"]);
    assert_eq!(env.ls()[0]["state"], "stopped");
    // Issue 26 on the real VM: the workspace is a git repository now; the
    // agent's hook and config writes fail (read-only binds over virtiofs),
    // the rest of .git stays writable. (The .envrc it writes again has the
    // same bytes as in the first run, which reported it: no change now.)
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(["-c", "safe.directory=*", "-C", &env.ws()])
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", env.root())
            .output()
            .unwrap()
    };
    assert!(git(&["init", "-q"]).status.success());
    // A bare remote in the workspace for the agent's push (its `origin`,
    // set by the host: the agent cannot write .git/config).
    let remote = Path::new(&env.ws()).join("remote.git");
    let out = std::process::Command::new("git").args(["init", "-q", "--bare"]).arg(&remote).output().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(git(&["remote", "add", "origin", "./remote.git"]).status.success());
    assert!(std::process::Command::new("chown").args(["-R", "1000:1000", &env.ws()]).status().unwrap().success());
    let config_before = std::fs::read_to_string(Path::new(&env.ws()).join(".git/config")).unwrap();
    let out = env.run(&["run", "--name", "vm", "opencode", &env.ws()]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for want in [
        "vm-agent hook: refused",
        "vm-agent config: refused",
        "vm-agent git-dir: writable",
        "vm-agent commit: ok",
        "vm-agent push: ok",
    ] {
        assert!(text.contains(want), "{want} in the agent's run on the real VM: {}", describe(&out));
    }
    assert!(!Path::new(&env.ws()).join(".git/hooks/pre-commit").exists(), "no hook planted");
    assert_eq!(std::fs::read_to_string(Path::new(&env.ws()).join(".git/config")).unwrap(), config_before);
    // The agent's commit is in the workspace's history and in the remote.
    let log = git(&["log", "--format=%s", "-1"]);
    assert_eq!(String::from_utf8_lossy(&log.stdout).trim(), "by the agent", "{}", describe(&log));
    let pushed = std::process::Command::new("git")
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(&remote)
        .args(["log", "--format=%s", "-1", "from-agent"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&pushed.stdout).trim(), "by the agent", "{}", describe(&pushed));
    // The host's git afterwards runs nothing planted.
    std::fs::write(Path::new(&env.ws()).join("README"), "hello\n").unwrap();
    assert!(git(&["add", "README"]).status.success());
    let c = git(&["-c", "user.name=h", "-c", "user.email=h@h", "commit", "-qm", "host"]);
    assert!(c.status.success(), "{}", describe(&c));
    assert!(!Path::new("/tmp/planted").exists(), "a planted hook ran on the host");
    assert!(env.ok(&["exec", "vm", "--", "ip", "-d", "link", "show", "wg0"]).contains("wireguard"));
    let file = env.root().join("note.txt");
    std::fs::write(&file, "from the host\n").unwrap();
    env.ok(&["cp", file.to_str().unwrap(), "vm:/tmp/note.txt"]);
    assert_eq!(env.ok(&["exec", "vm", "--", "cat", "/tmp/note.txt"]), "from the host\n");
    // Out of the machine needs `podman machine cp` (podman 5.5); the rig's
    // podman is 5.4.2, where ppp refuses with the reason and a hint rather
    // than copy half a file by some other way.
    let back = env.root().join("back.txt");
    let out = env.run(&["cp", "vm:/tmp/note.txt", back.to_str().unwrap()]);
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("podman 5.4.2 cannot copy out of a machine")
            && String::from_utf8_lossy(&out.stderr).contains("hint: upgrade podman"),
        "cp out of the VM on podman 5.4: {}",
        describe(&out)
    );
    assert!(!back.exists(), "nothing written on a refused copy");

    // 6. diagnose and ls see the real machine.
    let report: Value = serde_json::from_str(&env.ok(&["diagnose", "-o", "json"])).unwrap();
    let machines = report["machines"]["list"].as_array().unwrap();
    assert!(machines.iter().any(|m| m["name"] == "ppp-vm" && m["vm_type"] == "qemu"), "{machines:?}");
    assert_eq!(report["endpoint"]["host"], "192.168.127.254");
    assert_eq!(env.ls()[0]["state"], "running");

    // 7. Kill gvproxy while a download streams in the guest: the download
    //    fails (the tunnel is gone with the link; nothing else leaves), ppp
    //    reports the machine broken, and stop and rm still clean up. The
    //    guest reports on its serial console (the management channel went
    //    with gvproxy).
    let console = rig.console("vm");
    let script = format!(
        "curl -sS -m 900 --speed-limit 1 --speed-time 20 -o /dev/null -w '%{{size_download}}' https://echo.test/chunked/8000000000 >/tmp/dl.size 2>/tmp/dl.err; \
         echo \"ppp-dl rc=$? bytes=$(cat /tmp/dl.size)\" >/dev/ttyS0; \
         curl -sS -m 5 http://{UPSTREAM_IP}/direct-after-gvproxy >/dev/null 2>&1; echo \"ppp-direct rc=$?\" >/dev/ttyS0"
    );
    env.ok(&["exec", "vm", "--", "sudo", "systemd-run", "--unit", "ppp-dl", "sh", "-c", &script]);
    std::thread::sleep(std::time::Duration::from_secs(15));
    let gvproxy = rig.machine_pid("gvproxy");
    let qemu = rig.machine_pid("qemu");
    let run_dir = ppp::sandbox::load(&env.dirs(), "vm").unwrap().unwrap().podman_run.unwrap();
    let out = std::process::Command::new("kill").args(["-9", &gvproxy.to_string()]).output().unwrap();
    assert!(out.status.success(), "kill gvproxy: {}", describe(&out));
    let killed = std::time::Instant::now();
    let mut dl = String::new();
    while killed.elapsed() < std::time::Duration::from_secs(240) {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if text.contains("ppp-direct rc=") {
            dl = text
                .lines()
                .filter(|l| l.contains("ppp-dl rc=") || l.contains("ppp-direct rc="))
                .collect::<Vec<_>>()
                .join(" | ");
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    eprintln!("real VM: after gvproxy was killed, the guest said: {dl}");
    assert!(
        dl.contains("ppp-dl rc=") && !dl.contains("ppp-dl rc=0 "),
        "the download fails: {dl:?}\nconsole:\n{}",
        vm::tail(&console, 30)
    );
    assert!(dl.contains("ppp-direct rc=") && !dl.contains("ppp-direct rc=0"), "no direct egress: {dl:?}");
    let seen = std::fs::read_to_string(&env.upstream.requests_log).unwrap_or_default();
    assert!(!seen.contains("direct-after"), "nothing reached the upstream directly: {seen}");
    let out = env.run(&["ls", "--json"]);
    let ls: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("real VM: ppp ls after gvproxy died: {} {}", ls[0]["state"], ls[0]["machine"]);
    assert_eq!(ls[0]["state"], "broken", "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hint: `ppp stop vm`"), "{}", describe(&out));
    let report: Value = serde_json::from_str(&env.ok(&["diagnose", "-o", "json"])).unwrap();
    let sandbox = &report["sandboxes"][0];
    assert_eq!(sandbox["machine_state"], "broken", "{sandbox}");
    assert!(sandbox["machine_problem"].as_str().unwrap_or_default().contains("gvproxy"), "{sandbox}");
    let out = env.run(&["stop", "vm"]);
    eprintln!("real VM: ppp stop after gvproxy died: {}", describe(&out));
    assert!(out.status.success(), "ppp stop after gvproxy died: {}", describe(&out));
    assert_eq!(env.ls()[0]["state"], "stopped");
    assert!(!vm::alive(qemu) && !vm::alive(gvproxy), "qemu {qemu} or gvproxy {gvproxy} outlived ppp stop");
    env.ok(&["rm", "-f", "vm"]);
    assert!(env.ls().is_empty());
    assert!(!env.dirs().sandbox_podman("vm").exists(), "the sandbox's podman home is gone");
    assert!(!rig.podman(&["machine", "list", "--format", "json"]).contains("ppp-vm"));
    // Nothing of the machine is left running.
    // pgrep directly: through `sh -c`, the shell's own command line matched.
    for dir in [&state, &run_dir] {
        let leftovers = std::process::Command::new("pgrep").arg("-af").arg(dir).output().unwrap();
        assert!(leftovers.stdout.is_empty(), "{}", describe(&leftovers));
    }
    assert!(!run_dir.exists(), "the sandbox's podman runtime dir is gone");
    let ws = env.ws();
    let virtiofsd = std::process::Command::new("pgrep").arg("-af").arg("virtiofsd").output().unwrap();
    assert!(!String::from_utf8_lossy(&virtiofsd.stdout).contains(&ws), "virtiofsd left: {}", describe(&virtiofsd));
}

/// A boot outside ppp (podman's own start, a reboot from inside the guest)
/// comes up closed, in systemd's real order: the kill switch active before
/// `network-pre.target` and that before `systemd-networkd`, its table
/// loaded and no wg0, and direct egress to `/{path}` refused from the VM
/// and from a bridged container.
fn closed_after_boot(rig: &Rig, image: &str, when: &str, path: &str) {
    let order = rig.guest(
        "systemctl show -p ActiveEnterTimestampMonotonic --value ppp-killswitch.service network-pre.target systemd-networkd.service",
    );
    let stamps: Vec<u64> =
        String::from_utf8_lossy(&order.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert!(
        stamps.len() == 3 && stamps[0] > 0 && stamps[0] <= stamps[1] && stamps[1] <= stamps[2],
        "{when}: kill switch, then network-pre.target, then systemd-networkd: {}",
        describe(&order)
    );
    let out = rig.guest("sudo nft list table inet ppp >/dev/null && ! ip link show wg0 2>/dev/null && echo closed");
    assert!(String::from_utf8_lossy(&out.stdout).contains("closed"), "{when}: {}", describe(&out));
    let out = rig.guest(&format!("curl -sS -m 5 http://{UPSTREAM_IP}/{path}"));
    assert!(blocked(&out), "direct egress right {when}: {}", describe(&out));
    let out = rig.guest(&format!("podman run --rm --network bridge {image} curl -sS -m 5 http://{UPSTREAM_IP}/{path}"));
    assert!(!out.status.success(), "a bridged container right {when}: {}", describe(&out));
}

//! `assets/provision.sh` (as embedded in ppp) run for real inside a
//! hand-built guest: a network namespace joined by veth to the test host
//! namespace where `ppp daemon start -d` runs mitmdump, plus private mount and
//! pid namespaces in which `/etc`, `/var/lib` and
//! `/usr/local/share/ca-certificates` are overlays (upper layers in the test's
//! temp dir), and `/tmp`, `/run/wireguard`, `/dev/shm` are tmpfs, so every
//! write the script makes stays private. `podman` is a stub that records
//! `pull` calls.
//!
//! Addresses: the guest's uplink `enp0s1` is `192.168.127.2/24` with a
//! default route via `192.168.127.1`; the host side of the veth carries
//! `192.168.127.1` and `192.168.127.254`, the endpoint the daemon renders into
//! `wg0.conf`. All of them live only on veths this test made, in namespaces
//! with no route out (see docs/harness.md, "The safety rule").

#[path = "support/netns.rs"]
mod netns;

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Instant;

use netns::{Daemon, HOST_UPSTREAM_IP, Topology, UPSTREAM_IP, Upstream, describe, run_ok, wait_until};
use serde_json::Value;

const NAME: &str = "vm1";
const PORT: u16 = 51820;
const IMAGE: &str = "ghcr.io/ppp-sandbox/opencode:0.1.0";
const GUEST_IP: &str = "192.168.127.2";
const GATEWAY: &str = "192.168.127.1";
const ENDPOINT: &str = "192.168.127.254";
const UPLINK: &str = "enp0s1";
const GUEST_PATH: &str = "/tmp/ppp-bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Where the denied name points: routed to the upstream namespace by the
/// host namespace only, and nothing listens there (the address rule for
/// the upstream's own address would allow any name that resolves to it).
const DENIED_IP: &str = "198.18.0.99";
/// The user ppp's `sudo` comes from; the stub podman records who pulled.
const SSH_USER: &str = "nobody";

/// The hand-built guest: guest 1 of the topology, re-addressed like a
/// Podman Machine VM, with an init process holding private mount and pid
/// namespaces. Every command runs through `nsenter` into those.
struct Vm {
    /// `unshare`, parent of the guest's pid 1.
    init: Child,
    /// The guest's pid 1, as the root pid namespace sees it.
    pid: u32,
    /// Upper layers and work dirs of the overlays.
    dir: PathBuf,
}

impl Vm {
    fn start(topo: &Topology) -> Self {
        let (g, h) = (topo.guest_ns(1), topo.host_ns());
        let hv = topo.host_veth(1);
        // The uplink as a Podman Machine guest has it.
        run_ok(&["ip", "-n", &g, "link", "set", "veth0", "down"]);
        run_ok(&["ip", "-n", &g, "link", "set", "veth0", "name", UPLINK]);
        run_ok(&["ip", "-n", &g, "addr", "flush", "dev", UPLINK]);
        run_ok(&["ip", "-n", &g, "addr", "add", &format!("{GUEST_IP}/24"), "dev", UPLINK]);
        run_ok(&["ip", "-n", &g, "link", "set", UPLINK, "up"]);
        run_ok(&["ip", "-n", &g, "route", "add", "default", "via", GATEWAY, "dev", UPLINK]);
        // The host side plays gvproxy's gateway and host alias.
        run_ok(&["ip", "-n", &h, "addr", "flush", "dev", &hv]);
        run_ok(&["ip", "-n", &h, "addr", "add", &format!("{GATEWAY}/24"), "dev", &hv]);
        run_ok(&["ip", "-n", &h, "addr", "add", &format!("{ENDPOINT}/24"), "dev", &hv]);
        // gvproxy's NAT, played by the test: the host alias is the host's
        // loopback, where the daemon's WireGuard servers listen.
        run_ok(&["ip", "netns", "exec", &h, "sysctl", "-qw", &format!("net.ipv4.conf.{hv}.route_localnet=1")]);
        run_ok(&[
            "ip",
            "netns",
            "exec",
            &h,
            "nft",
            &format!(
                "add table ip gvproxy; add chain ip gvproxy pre {{ type nat hook prerouting priority dstnat; }}; \
                 add rule ip gvproxy pre iifname \"{hv}\" ip daddr {ENDPOINT} dnat to 127.0.0.1"
            ),
        ]);
        // Replies to a guest that bypasses the tunnel (only when a test turns
        // host forwarding on).
        run_ok(&["ip", "-n", &topo.upstream_ns(), "route", "add", "192.168.127.0/24", "via", "10.251.0.1"]);

        let dir = topo.path().join("vm");
        for d in ["etc-up", "etc-work", "lib-up", "lib-work", "ca-up", "ca-work"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::create_dir_all("/run/wireguard").unwrap();
        std::fs::create_dir_all("/run/ppp").unwrap();
        let d = dir.display();
        // Overlays first (their layers are under the real /tmp), then the
        // guest's own /tmp hides the machine's.
        let setup = format!(
            "set -e\n\
             mount --make-rprivate /\n\
             mount -t overlay ppp-etc -o lowerdir=/etc,upperdir={d}/etc-up,workdir={d}/etc-work /etc\n\
             mount -t overlay ppp-lib -o lowerdir=/var/lib,upperdir={d}/lib-up,workdir={d}/lib-work /var/lib\n\
             mount -t overlay ppp-ca -o lowerdir=/usr/local/share/ca-certificates,upperdir={d}/ca-up,workdir={d}/ca-work \
             /usr/local/share/ca-certificates\n\
             mount -t tmpfs -o mode=0755 ppp-wg /run/wireguard\n\
             mount -t tmpfs -o mode=0755 ppp-run /run/ppp\n\
             mount -t tmpfs -o mode=1777 ppp-shm /dev/shm\n\
             mount -t tmpfs -o mode=1777 ppp-tmp /tmp\n\
             touch /run/wireguard/.ready\n\
             while :; do sleep 1000 & wait; done\n"
        );
        let init = Command::new("ip")
            .args(["netns", "exec", &g, "unshare", "--mount", "--pid", "--fork", "--mount-proc", "bash", "-c", &setup])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(topo.path().join("vm-init.err")).unwrap())
            .spawn()
            .expect("the guest init starts");
        let parent = init.id();
        let mut pid = 0;
        wait_until("the guest's pid 1", netns::DEADLINE, || {
            pid = child_of(parent).unwrap_or(0);
            pid != 0
        });
        let vm = Self { init, pid, dir };
        wait_until("the guest's mounts", netns::DEADLINE, || {
            vm.sh("test -e /run/wireguard/.ready && test -d /tmp && ! test -e /tmp/ppp").status.success()
        });
        vm
    }

    /// `argv` inside the guest (network, mount and pid namespaces), with a
    /// clean environment, as root.
    fn exec(&self, env: &[(&str, &str)], argv: &[&str]) -> Output {
        let pid = self.pid.to_string();
        let mut c = Command::new("nsenter");
        c.args(["-t", &pid, "-n", "-m", "-p", "--", "env", "-i", &format!("PATH={GUEST_PATH}"), "HOME=/root"]);
        for (k, v) in env {
            c.arg(format!("{k}={v}"));
        }
        c.args(argv).stdin(Stdio::null()).output().unwrap()
    }

    fn run(&self, argv: &[&str]) -> Output {
        self.exec(&[], argv)
    }

    fn sh(&self, script: &str) -> Output {
        self.run(&["sh", "-c", script])
    }

    fn ok(&self, argv: &[&str]) -> String {
        let out = self.run(argv);
        assert!(out.status.success(), "guest `{}`: {}", argv.join(" "), describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Write `content` to `path` inside the guest, as `podman machine cp` would.
    fn put(&self, path: &str, content: &[u8], mode: u32) {
        let pid = self.pid.to_string();
        let script = format!("mkdir -p \"$(dirname {path})\" && cat > {path} && chmod {mode:o} {path}");
        let mut child = Command::new("nsenter")
            .args(["-t", &pid, "-n", "-m", "-p", "--", "sh", "-c", &script])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(content).unwrap();
        assert!(child.wait().unwrap().success(), "could not write {path} in the guest");
    }

    /// `bash /tmp/ppp/provision.sh ARGS` as `sudo` from the ssh user runs
    /// it. Like `podman machine ssh`, the words are joined with spaces and
    /// parsed again by a shell, so each is shell-quoted, as ppp does.
    fn provision(&self, args: &[&str]) -> Output {
        let line = ["bash", "/tmp/ppp/provision.sh"].iter().chain(args).map(|a| shell_quote(a)).collect::<Vec<_>>();
        self.exec(&[("SUDO_USER", SSH_USER)], &["sh", "-c", &line.join(" ")])
    }

    /// `up` as ppp runs it: wg0.conf (what [`deliver`] was given) on stdin.
    fn up(&self) -> Output {
        self.up_with(IMAGE)
    }

    fn up_with(&self, image: &str) -> Output {
        let line = ["bash", "/tmp/ppp/provision.sh", "up", "--wg-conf", "-", "--image", image]
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ");
        let pid = self.pid.to_string();
        Command::new("nsenter")
            .args(["-t", &pid, "-n", "-m", "-p", "--", "env", "-i", &format!("PATH={GUEST_PATH}"), "HOME=/root"])
            .arg(format!("SUDO_USER={SSH_USER}"))
            .args(["sh", "-c", &line])
            .stdin(std::fs::File::open(self.dir.with_file_name("vm-wg0.conf")).unwrap())
            .output()
            .unwrap()
    }

    fn curl(&self, args: &[&str]) -> (String, String) {
        let mut full = vec!["curl", "-sS", "-m", "10", "-o", "-", "-w", "\n%{http_code}"];
        full.extend_from_slice(args);
        let out = self.run(&full);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
        (format!("{body}{}", String::from_utf8_lossy(&out.stderr)), code.to_owned())
    }

    fn latest_handshake(&self) -> u64 {
        let out = self.ok(&["wg", "show", "wg0", "latest-handshakes"]);
        out.split_whitespace().nth(1).and_then(|t| t.parse().ok()).unwrap_or(0)
    }

    /// The `podman` calls the stub recorded.
    fn podman_calls(&self) -> Vec<String> {
        let out = self.run(&["cat", "/tmp/ppp-rec/podman.log"]);
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Killing the guest's pid 1 ends every process in its pid namespace.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.pid).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.init.kill();
        let _ = self.init.wait();
    }
}

/// `s` in single quotes for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The first process whose parent is `parent`.
fn child_of(parent: u32) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(candidate) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{candidate}/stat")) else { continue };
        let its_parent =
            stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if its_parent == Some(parent) {
            return Some(candidate);
        }
    }
    None
}

/// A stub `podman` on the guest's PATH: appends `<user> <argv>` per call.
/// A pull of an image whose name contains `fail-me` fails.
const PODMAN_STUB: &str = "#!/bin/sh\nprintf '%s %s\\n' \"$(id -un)\" \"$*\" >> /tmp/ppp-rec/podman.log\n\
                           case \"$*\" in *fail-me*) echo 'stub: pull failed' >&2; exit 125;; esac\n";

/// What ppp does before it calls the script: /tmp/ppp and the script
/// copied in; wg0.conf is kept on the host side for [`Vm::up`] to feed on
/// stdin. Plus the test's podman stub.
fn deliver(vm: &Vm, wg0: &str) {
    vm.ok(&["mkdir", "-p", "-m", "0755", "/tmp/ppp", "/tmp/ppp-bin"]);
    vm.ok(&["mkdir", "-p", "-m", "0777", "/tmp/ppp-rec"]);
    vm.ok(&["chmod", "0777", "/tmp/ppp-rec"]);
    vm.put("/tmp/ppp/provision.sh", &ppp::assets::provision(), 0o644);
    std::fs::write(vm.dir.with_file_name("vm-wg0.conf"), wg0).unwrap();
    vm.put("/tmp/ppp-bin/podman", PODMAN_STUB.as_bytes(), 0o755);
}

/// `verify`'s check lines, without the environment report.
fn check_lines(stdout: &str) -> Vec<&str> {
    stdout.lines().filter(|l| !l.starts_with("env ") && !l.starts_with("env-end ")).collect()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn sha256_hex(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_owned()
}

fn resolve(name: &str, port: u16) -> String {
    format!("{name}:{port}:{UPSTREAM_IP}")
}

/// Field order = drop order: the guest, then the daemon, then the rest.
struct Rig {
    vm: Vm,
    daemon: Daemon,
    upstream: Upstream,
    /// The daemon resolves names with the test DNS server (a name counts
    /// only where it resolves).
    _etc: netns::NetnsEtc,
    topo: Topology,
}

fn rig() -> Rig {
    netns::require_env();
    let topo = Topology::new(1);
    let upstream = Upstream::start(&topo);
    let etc = netns::NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[(NAME, PORT)]);
    let dirs = daemon.dirs();
    // The default: the servers listen on loopback, where gvproxy (played
    // by the rig's NAT) delivers the guest's datagrams.
    std::fs::create_dir_all(dirs.config.clone()).unwrap();
    std::fs::write(dirs.config_file(), "wireguard:\n  listen_host: 127.0.0.1\n").unwrap();
    // 198.18.0.0/15 is not public: the rebinding defence needs the address rule.
    daemon.ok(&["policy", "allow", "network", "--sandbox", NAME, "echo.test,198.18.0.10"]);
    daemon.start(&topo, &upstream);
    wait_until("the daemon to write wg0.conf", netns::DEADLINE, || dirs.sandbox_wg_conf(NAME).exists());
    let vm = Vm::start(&topo);
    Rig { vm, daemon, upstream, _etc: etc, topo }
}

#[test]
fn provision_up_verify_and_the_kill_switch() {
    let start = Instant::now();
    let rig = rig();
    eprintln!("rig: {:?}", start.elapsed());
    let vm = &rig.vm;
    let wg0 = std::fs::read_to_string(rig.daemon.dirs().sandbox_wg_conf(NAME)).unwrap();
    assert!(wg0.contains(&format!("Endpoint = {ENDPOINT}:{PORT}")), "{wg0}");
    deliver(vm, &wg0);

    // First run: every step, in order.
    let t = Instant::now();
    let out = vm.up();
    let log = text(&out);
    assert!(out.status.success(), "up failed: {}", describe(&out));
    eprintln!("first up took {:?}", t.elapsed());
    for n in 1..=9 {
        assert!(log.contains(&format!("ppp-provision: step {n}/9 ")), "step {n} missing:\n{log}");
    }
    assert!(log.contains("userspace wireguard-go"), "{log}");
    assert!(log.contains(&format!("uplink {UPLINK}, gateway {GATEWAY}")), "{log}");

    // wg0 with a handshake; the routes.
    assert_ne!(vm.latest_handshake(), 0, "wg0 has a handshake");
    let routes = vm.ok(&["ip", "-4", "route", "show"]);
    assert!(routes.lines().any(|l| l.starts_with("default dev wg0") && l.contains("quickack 1")), "{routes}");
    assert!(routes.contains(&format!("{ENDPOINT} via {GATEWAY} dev {UPLINK}")), "{routes}");
    // wg0.conf installed as is, 0600, on tmpfs only: nothing on the disk
    // (the overlays' upper layers are what the script wrote) holds the key.
    assert_eq!(vm.ok(&["cat", "/run/ppp/wg0.conf"]), wg0);
    assert_eq!(vm.ok(&["stat", "-c", "%a %U", "/run/ppp/wg0.conf"]).trim(), "600 root");
    let key = wg0.lines().find_map(|l| l.strip_prefix("PrivateKey = ")).unwrap().to_owned();
    let on_disk = Command::new("grep").args(["-rlF", &key]).arg(&vm.dir).output().unwrap();
    assert_eq!(on_disk.status.code(), Some(1), "the key is on the guest's disk: {}", describe(&on_disk));
    let tmp = vm.ok(&["sh", "-c", "grep -rlF \"$0\" /tmp || true", &key]);
    assert!(tmp.trim().is_empty(), "a staged copy of the key is left in the guest: {tmp}");
    // The kill switch.
    let table = vm.ok(&["nft", "list", "table", "inet", "ppp"]);
    assert_eq!(table.matches("policy drop").count(), 2, "output and forward drop by default:\n{table}");
    assert!(table.contains(&format!("ip daddr {ENDPOINT} udp dport {PORT} accept")), "{table}");
    assert!(table.contains("meta nfproto ipv6 drop"), "{table}");
    // DHCP may reach the gateway (and broadcast) only, not any address.
    assert!(
        table.contains(&format!("ip daddr {{ {GATEWAY}, 255.255.255.255 }} udp sport 68 udp dport 67 accept")),
        "{table}"
    );
    // Persisted for boot: the ruleset in /etc and a unit that loads it
    // before the network, enabled.
    let saved = vm.ok(&["cat", "/etc/ppp/killswitch.nft"]);
    assert!(saved.contains("policy drop") && saved.contains(&format!("udp dport {PORT} accept")), "{saved}");
    let unit = vm.ok(&["cat", "/etc/systemd/system/sysinit.target.wants/ppp-killswitch.service"]);
    for line in ["DefaultDependencies=no", "Before=network-pre.target shutdown.target", "ExecStart="] {
        assert!(unit.contains(line), "{line} in\n{unit}");
    }
    assert!(unit.contains(" -f /etc/ppp/killswitch.nft"), "{unit}");
    // DNS through the tunnel, in a regular file.
    let resolv = vm.ok(&["cat", "/etc/resolv.conf"]);
    assert!(resolv.lines().any(|l| l == "nameserver 10.0.0.53"), "{resolv}");
    assert!(vm.run(&["test", "!", "-L", "/etc/resolv.conf"]).status.success());
    // The CA: the daemon's own, trusted by curl without -k.
    let ca = std::fs::read_to_string(rig.daemon.data().join("mitmproxy/mitmproxy-ca-cert.pem")).unwrap();
    let trusted = vm.ok(&["cat", "/usr/local/share/ca-certificates/ppp-mitmproxy.crt"]);
    assert_eq!(trusted.trim(), ca.trim());
    vm.ok(&["curl", "-fsS", "-m", "10", "--connect-to", "mitm.it:443:10.0.0.53:443", "https://mitm.it/cert/pem"]);
    // The system bundle, with that CA, exported for the agent container.
    let bundle = vm.dir.join("lib-up/ppp/ca-bundle.pem");
    assert_eq!(std::fs::metadata(&bundle).unwrap().permissions().mode() & 0o777, 0o644);
    let exported = std::fs::read_to_string(&bundle).unwrap();
    assert_eq!(exported, vm.ok(&["cat", "/etc/ssl/certs/ca-certificates.crt"]));
    let body: String = ca.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(exported.lines().collect::<String>().contains(&body), "the bundle holds mitmproxy's CA");
    // IPv6 off, and persisted.
    for k in ["all", "default"] {
        let v = vm.ok(&["sysctl", "-n", &format!("net.ipv6.conf.{k}.disable_ipv6")]);
        assert_eq!(v.trim(), "1", "{k}");
    }
    let sysctl = vm.ok(&["cat", "/etc/sysctl.d/99-ppp.conf"]);
    assert!(sysctl.contains("net.ipv6.conf.all.disable_ipv6 = 1"), "{sysctl}");
    // One pull, as the ssh user, then the marker.
    assert_eq!(vm.podman_calls(), vec![format!("{SSH_USER} pull {IMAGE}")]);
    assert_eq!(vm.ok(&["cat", "/var/lib/ppp/.provisioned"]), IMAGE);

    // The attack on the listen address: the same valid config, aimed at
    // another address of the host (here the gateway address on the host's
    // veth, as a LAN peer would use the host's LAN address), gets no
    // handshake: the servers listen only on loopback, where gvproxy's NAT
    // delivers the host alias (ADR 0018).
    deliver(vm, &wg0.replace(&format!("Endpoint = {ENDPOINT}:"), &format!("Endpoint = {GATEWAY}:")));
    let out = vm.up();
    let last = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned();
    assert!(
        last.starts_with("ppp-provision: FAILED at step 5/9 (tunnel wg0): no WireGuard handshake"),
        "a server answered on {GATEWAY}: {}",
        describe(&out)
    );
    deliver(vm, &wg0);

    // Second run: succeeds, tunnel back up, no second pull.
    let t = Instant::now();
    let out = vm.up();
    assert!(out.status.success(), "second up failed: {}", describe(&out));
    eprintln!("second up took {:?}", t.elapsed());
    assert!(text(&out).contains("already pulled"), "{}", text(&out));
    assert_eq!(vm.podman_calls().len(), 1, "no second pull: {:?}", vm.podman_calls());
    assert_ne!(vm.latest_handshake(), 0);
    // A failed pull fails step 9 and leaves the marker alone; the next run
    // with the provisioned image does not pull.
    let out = vm.up_with("example.test/fail-me:1");
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let last = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("ppp-provision: FAILED at step 9/9 (agent image example.test/fail-me:1): "), "{last}");
    assert_eq!(vm.ok(&["cat", "/var/lib/ppp/.provisioned"]), IMAGE);
    let out = vm.up();
    assert!(out.status.success(), "up after a failed pull: {}", describe(&out));
    assert_eq!(vm.podman_calls().len(), 2, "{:?}", vm.podman_calls());

    // Through the proxy: an allowed host over HTTP and HTTPS (system trust),
    // a denied one gets the proxy's 403.
    let (body, code) = vm.curl(&["--resolve", &resolve("echo.test", 80), "http://echo.test/allowed"]);
    assert_eq!(code, "200", "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["client"].as_str().map(|c| c.starts_with(&HOST_UPSTREAM_IP.to_string())), Some(true), "{echo}");
    let (body, code) = vm.curl(&["--resolve", &resolve("echo.test", 443), "https://echo.test/allowed-tls"]);
    assert_eq!(code, "200", "HTTPS with the system trust store: {body}");
    let (body, code) = vm.curl(&["--resolve", &format!("denied.test:80:{DENIED_IP}"), "http://denied.test/"]);
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("ppp policy allow network --sandbox vm1 denied.test"), "{body}");

    // verify: the guest's four checks ok, then its environment as digests
    // salted with what the host sent (the host compares; ADR 0018).
    let salt = "5a175a175a175a175a175a175a175a17".to_owned();
    let secret = "sk-ant-provision-SECRET-0123456789";
    let leaked = sha256_hex(format!("{salt}{secret}").as_bytes());
    let verify_args = [
        "verify",
        "--denied-url",
        "http://denied.test/",
        "--denied-connect-to",
        &format!("denied.test:80:{DENIED_IP}:80"),
        "--salt",
        &salt,
    ];
    let t = Instant::now();
    let out = vm.provision(&verify_args);
    eprintln!("verify took {:?}", t.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "verify: {}", describe(&out));
    assert_eq!(
        check_lines(&stdout),
        ["ok handshake", "ok no-direct-egress", "ok policy-denies", "ok ca-trusted"],
        "{}",
        describe(&out)
    );
    let report = ppp::sandbox::verify::parse_env_report(&stdout);
    assert!(report.complete && !report.digests.is_empty(), "{stdout}");
    assert!(!report.digests.iter().any(|(d, _)| *d == leaked), "no process holds the secret yet");
    // Without --denied-url policy-denies is skipped, nothing else changes.
    let out = vm.provision(&["verify", "--salt", &salt]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("skip policy-denies: "), "{}", describe(&out));

    // A process in the guest holding the secret shows up in the report,
    // named by pid and variable, never by value.
    let pid = vm.pid.to_string();
    let mut leak = Command::new("nsenter")
        .args(["-t", &pid, "-n", "-m", "-p", "--", "env", "-i", &format!("LEAKY_TOKEN={secret}"), "sleep", "600"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the leaking process", netns::DEADLINE, || {
        vm.sh("grep -qa LEAKY_TOKEN /proc/[0-9]*/environ 2>/dev/null").status.success()
    });
    let out = vm.provision(&verify_args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the guest does not judge its own env: {}", describe(&out));
    let report = ppp::sandbox::verify::parse_env_report(&stdout);
    let (_, place) = report.digests.iter().find(|(d, _)| *d == leaked).unwrap_or_else(|| panic!("{stdout}"));
    assert!(place.contains("variable LEAKY_TOKEN") && place.contains("pid "), "{place}");
    let secrets = [leaked.clone()].into();
    let check = ppp::sandbox::verify::env_check(&report, &secrets);
    assert_eq!(check.outcome, ppp::sandbox::verify::Outcome::Fail, "{check}");
    assert!(!text(&out).contains(secret), "the value is never printed: {}", describe(&out));
    // nsenter forked the process into the guest's pid namespace: kill it
    // there, by the pid the report named.
    let guest_pid = place.split("pid ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().to_owned();
    vm.ok(&["kill", "-KILL", &guest_pid]);
    let _ = leak.wait();

    eprintln!("up to here: {:?}", start.elapsed());
    // The kill switch. First show that a direct path exists: with host
    // forwarding on, the kill switch removed and a route of its own, root in
    // the guest reaches the upstream without mitmproxy.
    rig.topo.host_forwarding(true);
    vm.ok(&["ip", "route", "replace", &format!("{UPSTREAM_IP}/32"), "via", GATEWAY, "dev", UPLINK]);
    vm.ok(&["nft", "delete", "table", "inet", "ppp"]);
    let (body, code) = vm.curl(&[&format!("http://{UPSTREAM_IP}/direct")]);
    assert_eq!(code, "200", "the direct path works without the kill switch: {body}");
    let direct = rig.upstream.requests().into_iter().find(|r| r["path"] == "/direct").unwrap();
    assert!(direct["client"].as_str().unwrap().starts_with(GUEST_IP), "{direct}");
    let out = vm.provision(&["verify", "--salt", &salt]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("fail no-direct-egress: nftables table inet ppp"),
        "{}",
        describe(&out)
    );

    // Re-provision: the table is back, and the same route no longer works.
    let out = vm.up();
    assert!(out.status.success(), "third up: {}", describe(&out));
    vm.ok(&["ip", "route", "replace", &format!("{UPSTREAM_IP}/32"), "via", GATEWAY, "dev", UPLINK]);
    let (_, code) = vm.curl(&["-m", "2", &format!("http://{UPSTREAM_IP}/blocked")]);
    assert_ne!(code, "200");
    // verify's probes look at behaviour, not only at the table: a table that
    // exists but lets everything out fails.
    vm.ok(&["nft", "insert", "rule", "inet", "ppp", "output", "accept"]);
    let out = vm.provision(&["verify", "--salt", &salt]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        stdout.lines().any(|l| l.starts_with("fail no-direct-egress: ") && l.contains("was answered")),
        "{}",
        describe(&out)
    );
    let out = vm.up();
    assert!(out.status.success(), "fourth up: {}", describe(&out));
    assert!(!vm.ok(&["nft", "list", "chain", "inet", "ppp", "output"]).contains("\t\taccept\n"), "rule replaced");
    // With wg0 gone and a default route straight to the gateway, nothing
    // leaves either.
    vm.ok(&["ip", "link", "del", "wg0"]);
    vm.ok(&["ip", "route", "replace", "default", "via", GATEWAY, "dev", UPLINK]);
    let (_, code) = vm.curl(&["-m", "2", &format!("http://{UPSTREAM_IP}/after-del")]);
    assert_ne!(code, "200");
    let (_, code) = vm.curl(&["-m", "2", "--resolve", &resolve("echo.test", 80), "http://echo.test/after-del-3"]);
    assert_ne!(code, "200");
    let seen: Vec<Value> = rig.upstream.requests().iter().map(|r| r["path"].clone()).collect();
    for p in ["/blocked", "/after-del", "/after-del-3"] {
        assert!(!seen.contains(&Value::from(p)), "{p} reached the upstream: {seen:?}");
    }
    eprintln!("kill switch done: {:?}", start.elapsed());
    // verify reports the missing tunnel.
    let out = vm.provision(&verify_args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success());
    assert!(stdout.lines().any(|l| l.starts_with("fail handshake: ")), "{}", describe(&out));
    assert!(stdout.lines().any(|l| l == "ok no-direct-egress"), "{}", describe(&out));
    assert_eq!(check_lines(&stdout).len(), 4, "one line per check: {stdout}");

    eprintln!("verify without wg0 done: {:?}", start.elapsed());
    // Provisioning again brings it all back (what ppp does when wg0 is not up).
    let out = vm.up();
    assert!(out.status.success(), "up after losing wg0: {}", describe(&out));
    let out = vm.provision(&verify_args);
    assert!(out.status.success(), "verify after recovery: {}", describe(&out));
    assert_eq!(vm.podman_calls().len(), 2, "{:?}", vm.podman_calls());
    eprintln!("all done: {:?}", start.elapsed());
}

#[test]
fn provision_refuses_bad_configs_and_bad_usage() {
    netns::require_env();
    let topo = Topology::new(1);
    let vm = Vm::start(&topo);
    let good = "[Interface]\nPrivateKey = aGVsbG8taGVsbG8taGVsbG8taGVsbG8taGVsbG8tMTI=\nAddress = 10.0.0.1/32\n\
                Table = off\n\n[Peer]\nPublicKey = aGVsbG8taGVsbG8taGVsbG8taGVsbG8taGVsbG8tMTI=\n\
                AllowedIPs = 0.0.0.0/0\nEndpoint = 192.168.127.254:51820\n";
    let with_dns = good.replace("Table = off\n", "Table = off\nDNS = 10.0.0.53\n");
    deliver(&vm, &with_dns);
    let out = vm.up();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let log = text(&out);
    assert!(
        log.lines().any(|l| l.starts_with("ppp-provision: FAILED at step 2/9") && l.contains("'DNS =' line")),
        "{log}"
    );
    assert_eq!(vm.ok(&["ls", "-A", "/run/ppp"]), "", "nothing installed, nothing staged");

    deliver(&vm, &good.replace("Table = off\n", ""));
    let out = vm.up();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(text(&out).contains("lacks 'Table = off'"), "{}", describe(&out));

    for bad in [
        // `--image` is optional (ppp builds its own images, issue 24);
        // `--wg-conf` is not.
        &["up", "--image", "x"][..],
        &["verify"][..],
        &["verify", "--salt", "not-hex"][..],
        &["frobnicate"][..],
        &["up", "--image", "x", "--wg-conf"][..],
    ] {
        let out = vm.provision(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", describe(&out));
        assert!(text(&out).contains("usage"), "{bad:?}: {}", describe(&out));
    }
    // No firewall or route was touched by any of this.
    assert!(!vm.run(&["nft", "list", "table", "inet", "ppp"]).status.success());
    let routes = vm.ok(&["ip", "-4", "route", "show", "default"]);
    assert!(routes.contains(&format!("via {GATEWAY}")), "{routes}");

    // A good config with no server behind it: the run fails at the
    // handshake, and the guest is left closed, not open.
    deliver(&vm, good);
    let out = vm.up();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let last = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("ppp-provision: FAILED at step 5/9 (tunnel wg0): no WireGuard handshake"), "{last}");
    let table = vm.ok(&["nft", "list", "table", "inet", "ppp"]);
    assert_eq!(table.matches("policy drop").count(), 2, "{table}");
    let probe = vm.run(&["curl", "-sS", "-m", "2", "-o", "/dev/null", &format!("http://{GATEWAY}:80/")]);
    assert_eq!(probe.status.code(), Some(28), "the gateway is unreachable (dropped): {}", describe(&probe));
}

/// The script is clean under `bash -n` and shellcheck.
#[test]
fn provision_script_lints_clean() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/provision.sh");
    assert_eq!(std::fs::read(&script).unwrap(), ppp::assets::provision(), "the embedded script is the file");
    let out = Command::new("bash").arg("-n").arg(&script).output().unwrap();
    assert!(out.status.success(), "bash -n: {}", describe(&out));
    let out = Command::new("shellcheck").arg(&script).output().unwrap_or_else(|e| {
        panic!("shellcheck could not run ({e}); run `make test-deps` (scripts/install-test-deps.sh)")
    });
    assert!(out.status.success(), "shellcheck: {}", describe(&out));
}

/// A container network behind the guest, as podman's bridge makes one:
/// `ctr0` in the guest (10.88.0.1/24), the container's `eth0` in a namespace
/// of its own (10.88.0.2/24), forwarding on and masquerade in the guest.
/// Its traffic crosses the guest's FORWARD hook, not OUTPUT.
struct Container {
    ns: String,
}

impl Container {
    fn start(topo: &Topology) -> Self {
        let g = topo.guest_ns(1);
        let ns = format!("{}-c", topo.prefix);
        run_ok(&["ip", "netns", "add", &ns]);
        let c = Self { ns };
        run_ok(&["ip", "-n", &g, "link", "add", "ctr0", "type", "veth", "peer", "name", "eth0", "netns", &c.ns]);
        run_ok(&["ip", "-n", &g, "addr", "add", "10.88.0.1/24", "dev", "ctr0"]);
        run_ok(&["ip", "-n", &g, "link", "set", "ctr0", "up"]);
        run_ok(&["ip", "-n", &c.ns, "link", "set", "lo", "up"]);
        run_ok(&["ip", "-n", &c.ns, "addr", "add", "10.88.0.2/24", "dev", "eth0"]);
        run_ok(&["ip", "-n", &c.ns, "link", "set", "eth0", "up"]);
        run_ok(&["ip", "-n", &c.ns, "route", "add", "default", "via", "10.88.0.1"]);
        run_ok(&["ip", "netns", "exec", &g, "sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        // What netavark adds: masquerade for the container subnet.
        run_ok(&[
            "ip",
            "netns",
            "exec",
            &g,
            "nft",
            "add table ip ctrnat; add chain ip ctrnat post { type nat hook postrouting priority srcnat; }; \
             add rule ip ctrnat post ip saddr 10.88.0.0/24 oifname != \"ctr0\" masquerade",
        ]);
        c
    }

    fn curl(&self, args: &[&str]) -> (String, String) {
        let mut full =
            vec!["ip", "netns", "exec", &self.ns, "curl", "-sS", "-m", "5", "-o", "-", "-w", "\n%{http_code}"];
        full.extend_from_slice(args);
        let out = netns::run(&full);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
        (format!("{body}{}", String::from_utf8_lossy(&out.stderr)), code.to_owned())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = netns::run(&["ip", "netns", "del", &self.ns]);
    }
}

#[test]
fn container_traffic_is_forwarded_only_through_the_tunnel() {
    let rig = rig();
    let vm = &rig.vm;
    let container = Container::start(&rig.topo);
    deliver(vm, &std::fs::read_to_string(rig.daemon.dirs().sandbox_wg_conf(NAME)).unwrap());
    let out = vm.up();
    assert!(out.status.success(), "up: {}", describe(&out));

    // Through the tunnel and the proxy, under the sandbox's policy.
    let (body, code) = container.curl(&["--resolve", &resolve("echo.test", 80), "http://echo.test/from-container"]);
    assert_eq!(code, "200", "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert!(echo["client"].as_str().unwrap().starts_with(&HOST_UPSTREAM_IP.to_string()), "{echo}");
    let (body, code) = container.curl(&["--resolve", &format!("denied.test:80:{DENIED_IP}"), "http://denied.test/"]);
    assert_eq!(code, "403", "{body}");

    // A direct path exists: without the kill switch, with host forwarding
    // and a route of the guest's own, the container reaches the upstream.
    rig.topo.host_forwarding(true);
    vm.ok(&["ip", "route", "replace", &format!("{UPSTREAM_IP}/32"), "via", GATEWAY, "dev", UPLINK]);
    vm.ok(&["nft", "delete", "table", "inet", "ppp"]);
    let (body, code) = container.curl(&[&format!("http://{UPSTREAM_IP}/container-direct")]);
    assert_eq!(code, "200", "the direct path works without the kill switch: {body}");
    let direct = rig.upstream.requests().into_iter().find(|r| r["path"] == "/container-direct").unwrap();
    assert!(direct["client"].as_str().unwrap().starts_with(GUEST_IP), "{direct}");

    // The kill switch's forward chain closes it, with wg0 up and with it gone.
    let out = vm.up();
    assert!(out.status.success(), "second up: {}", describe(&out));
    vm.ok(&["ip", "route", "replace", &format!("{UPSTREAM_IP}/32"), "via", GATEWAY, "dev", UPLINK]);
    let (_, code) = container.curl(&["-m", "2", &format!("http://{UPSTREAM_IP}/container-blocked")]);
    assert_ne!(code, "200");
    vm.ok(&["ip", "link", "del", "wg0"]);
    vm.ok(&["ip", "route", "replace", "default", "via", GATEWAY, "dev", UPLINK]);
    let (_, code) =
        container.curl(&["-m", "2", "--resolve", &resolve("echo.test", 80), "http://echo.test/container-nowg"]);
    assert_ne!(code, "200");
    let seen: Vec<Value> = rig.upstream.requests().iter().map(|r| r["path"].clone()).collect();
    for p in ["/container-blocked", "/container-nowg"] {
        assert!(!seen.contains(&Value::from(p)), "{p} reached the upstream: {seen:?}");
    }
}

//! Network-namespace fixtures for the end-to-end tests: a test "host"
//! namespace where mitmdump runs, guest namespaces with real `wireguard-go`,
//! and an upstream namespace with an HTTP/HTTPS echo server.
//!
//! Safety: nothing here ever touches the root namespace's network. Every link
//! is created inside a namespace this module made, the host namespace has no
//! default route and no link to the root namespace, and every address is one
//! assigned to our own veths. Names carry a per-run prefix, so parallel tests
//! and leftovers of a crashed run never collide. Tear-down lives in `Drop`:
//! kill by pid, wait (with a deadline) for the pid to go, delete the
//! namespaces, then make sure no link with the prefix is left.
//!
//! Addresses (each topology has its own namespaces, so parallel runs reuse them):
//! guest `i` veth is `10.251.i.2/30`, its host side `10.251.i.1/30` (the
//! WireGuard endpoint); the upstream veth is `10.251.0.2/30`, host side
//! `10.251.0.1/30`; the upstream serves on `198.18.0.10`, routed only by the
//! host namespace, via the upstream veth.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The upstream echo server's address, reachable only inside a topology.
pub const UPSTREAM_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
/// The host namespace's side of the upstream veth: what the upstream sees
/// as the client of every request that went through mitmproxy.
pub const HOST_UPSTREAM_IP: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 1);
/// The name on the upstream's TLS certificate.
pub const UPSTREAM_NAME: &str = "echo.test";
/// The attacker's server: a LAN address a user could plausibly allow, in a
/// namespace of its own ([`Topology::attacker_ns`]), and a second address
/// there that no rule allows.
pub const ATTACKER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 9);
pub const ATTACKER_IP2: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 10);
/// The service host whose key ppp injects, played by the upstream.
pub const SERVICE_NAME: &str = "api.anthropic.com";
/// The other LLM providers' hosts the upstream plays (`tests/e2e_usage.rs`).
pub const OPENAI_NAME: &str = "api.openai.com";
pub const GEMINI_NAME: &str = "generativelanguage.googleapis.com";
/// The name the attacker holds a valid certificate for.
pub const ATTACKER_NAME: &str = "attacker.test";
/// How long a fixture waits for anything to come up or go away.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Poll `cond` every 20 ms until it holds; panic naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < end, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run `argv`, capturing its output.
pub fn run(argv: &[&str]) -> Output {
    Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("`{}` could not run: {e}", argv.join(" ")))
}

/// Run `argv`, require success, return stdout.
pub fn run_ok(argv: &[&str]) -> String {
    let out = run(argv);
    assert!(out.status.success(), "`{}` failed: {}", argv.join(" "), describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Status, stdout and stderr of `out`, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Fail loudly (never skip) when not root, a tool is missing or the venv's
/// mitmdump is not there.
pub fn require_env() {
    require_root_and_tools();
    let m = mitmdump_path();
    assert!(m.is_file(), "mitmdump not found at `{}`; run `make test-deps` or set PPP_TEST_MITMDUMP", m.display());
}

/// Fail loudly (never skip) when not root or a network tool is missing.
pub fn require_root_and_tools() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "the end-to-end network tests need root (CAP_NET_ADMIN, CAP_SYS_ADMIN); run them as root, as CI does"
    );
    for tool in ["ip", "nft", "nsenter", "wireguard-go", "wg", "curl", "openssl", "dig", "bash"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().unwrap();
        assert!(found.status.success(), "`{tool}` is missing; run `make test-deps` (scripts/install-test-deps.sh)");
    }
    assert!(Path::new("/dev/net/tun").exists(), "`/dev/net/tun` is missing: wireguard-go needs it");
}

/// `$PPP_TEST_MITMDUMP`, else the default venv under `target/`.
pub fn mitmdump_path() -> PathBuf {
    std::env::var_os("PPP_TEST_MITMDUMP")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin/mitmdump"), PathBuf::from)
}

/// The test venv's python, next to its mitmdump.
pub fn venv_python() -> PathBuf {
    mitmdump_path().with_file_name("python")
}

/// SIGTERM `pid`, wait until `child` exits; SIGKILL after `grace`.
fn stop_child(child: &mut Child, grace: Duration) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
    let _ = kill(pid, Signal::SIGTERM);
    let end = Instant::now() + grace;
    while Instant::now() < end {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Whether `pid` is still running (a zombie counts as gone).
fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_none_or(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn unique_prefix() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let random = std::collections::hash_map::RandomState::new();
    let h = std::hash::BuildHasher::hash_one(&random, (std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    // "pt" + 6 hex: 8 bytes, leaving room for "h12" within IFNAMSIZ (15).
    format!("pt{:06x}", h & 0xff_ffff)
}

/// The namespaces and veths of one test: a host namespace, `n` guests and an upstream.
pub struct Topology {
    pub prefix: String,
    pub dir: tempfile::TempDir,
    pub n_guests: u8,
}

impl Topology {
    /// Create the namespaces and veths, loopback up, addresses and routes set.
    pub fn new(n_guests: u8) -> Self {
        require_env();
        Self::build(n_guests)
    }

    /// The same topology for tests that bring no mitmdump (the fake podman's
    /// own tests): only root and the network tools are required.
    pub fn without_mitmdump(n_guests: u8) -> Self {
        require_root_and_tools();
        Self::build(n_guests)
    }

    fn build(n_guests: u8) -> Self {
        assert!(n_guests <= 99, "0 to 99 guests");
        let dir = tempfile::Builder::new().prefix("ppp-e2e-").tempdir().unwrap();
        // Whoever creates `<prefix>-h` owns the prefix: `ip netns add` fails
        // on an existing name, so a (very unlikely) clash picks another
        // prefix instead of tearing down someone else's namespaces.
        let prefix = (0..8)
            .map(|_| unique_prefix())
            .find(|p| run(&["ip", "netns", "add", &format!("{p}-h")]).status.success())
            .expect("`ip netns add` keeps failing; is this root with CAP_SYS_ADMIN?");
        let topo = Self { prefix, dir, n_guests };
        // From here on, a panic drops `topo`, which deletes whatever was made.
        let h = topo.host_ns();
        let u = topo.upstream_ns();
        for ns in topo.namespaces() {
            if ns != h {
                run_ok(&["ip", "netns", "add", &ns]);
            }
            run_ok(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        // The host namespace forwards nothing unless a test asks for it.
        run_ok(&["ip", "netns", "exec", &h, "sysctl", "-qw", "net.ipv4.ip_forward=0"]);

        // Upstream: veth created inside the host namespace, peer moved into the
        // upstream one; the root namespace never sees either end.
        let hu = format!("{}hu", topo.prefix);
        run_ok(&["ip", "-n", &h, "link", "add", &hu, "type", "veth", "peer", "name", "veth0", "netns", &u]);
        run_ok(&["ip", "-n", &h, "addr", "add", "10.251.0.1/30", "dev", &hu]);
        run_ok(&["ip", "-n", &h, "link", "set", &hu, "up"]);
        run_ok(&["ip", "-n", &u, "addr", "add", "10.251.0.2/30", "dev", "veth0"]);
        run_ok(&["ip", "-n", &u, "addr", "add", &format!("{UPSTREAM_IP}/32"), "dev", "veth0"]);
        run_ok(&["ip", "-n", &u, "link", "set", "veth0", "up"]);
        // Replies to guests matter only when a test turns host forwarding on.
        run_ok(&["ip", "-n", &u, "route", "add", "10.251.0.0/16", "via", "10.251.0.1"]);
        run_ok(&["ip", "-n", &h, "route", "add", "198.18.0.0/24", "via", "10.251.0.2", "dev", &hu]);

        // The attacker's namespace, joined to the host namespace like the
        // upstream: ATTACKER_IP and ATTACKER_IP2 on its veth.
        let a = topo.attacker_ns();
        let ha = format!("{}ha", topo.prefix);
        run_ok(&["ip", "-n", &h, "link", "add", &ha, "type", "veth", "peer", "name", "veth0", "netns", &a]);
        run_ok(&["ip", "-n", &h, "addr", "add", "10.251.250.1/30", "dev", &ha]);
        run_ok(&["ip", "-n", &h, "link", "set", &ha, "up"]);
        run_ok(&["ip", "-n", &a, "addr", "add", "10.251.250.2/30", "dev", "veth0"]);
        for ip in [ATTACKER_IP, ATTACKER_IP2] {
            run_ok(&["ip", "-n", &a, "addr", "add", &format!("{ip}/32"), "dev", "veth0"]);
        }
        run_ok(&["ip", "-n", &a, "link", "set", "veth0", "up"]);
        run_ok(&["ip", "-n", &a, "route", "add", "10.251.0.0/16", "via", "10.251.250.1"]);
        run_ok(&["ip", "-n", &h, "route", "add", "10.77.0.0/24", "via", "10.251.250.2", "dev", &ha]);

        for i in 1..=n_guests {
            let g = topo.guest_ns(i);
            let hv = topo.host_veth(i);
            run_ok(&["ip", "-n", &h, "link", "add", &hv, "type", "veth", "peer", "name", "veth0", "netns", &g]);
            run_ok(&["ip", "-n", &h, "addr", "add", &format!("{}/30", topo.endpoint(i)), "dev", &hv]);
            run_ok(&["ip", "-n", &h, "link", "set", &hv, "up"]);
            run_ok(&["ip", "-n", &g, "addr", "add", &format!("{}/30", topo.guest_veth_ip(i)), "dev", "veth0"]);
            run_ok(&["ip", "-n", &g, "link", "set", "veth0", "up"]);
        }
        topo
    }

    pub fn host_ns(&self) -> String {
        format!("{}-h", self.prefix)
    }
    pub fn upstream_ns(&self) -> String {
        format!("{}-u", self.prefix)
    }
    pub fn attacker_ns(&self) -> String {
        format!("{}-a", self.prefix)
    }
    pub fn guest_ns(&self, i: u8) -> String {
        format!("{}-g{i}", self.prefix)
    }
    /// The host-namespace end of guest `i`'s veth.
    pub fn host_veth(&self, i: u8) -> String {
        format!("{}h{i}", self.prefix)
    }
    /// The WireGuard endpoint guest `i` talks to: the host side of its veth.
    pub fn endpoint(&self, i: u8) -> Ipv4Addr {
        assert!((1..=self.n_guests).contains(&i), "no guest {i} in this topology");
        Ipv4Addr::new(10, 251, i, 1)
    }
    /// Guest `i`'s own veth address.
    pub fn guest_veth_ip(&self, i: u8) -> Ipv4Addr {
        assert!((1..=self.n_guests).contains(&i), "no guest {i} in this topology");
        Ipv4Addr::new(10, 251, i, 2)
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Run `argv` in namespace `ns` (`ip netns exec`), one of this topology's.
    pub fn exec(&self, ns: &str, argv: &[&str]) -> Output {
        assert!(self.namespaces().iter().any(|n| n == ns), "`{ns}` is not a namespace of this topology");
        let mut full = vec!["ip", "netns", "exec", ns];
        full.extend_from_slice(argv);
        run(&full)
    }

    /// Turn IPv4 forwarding in the host namespace on or off (off by default).
    /// With it on, the host routes like a real one would, which is what the
    /// bypass test needs to show the kill switch is what stops a guest.
    pub fn host_forwarding(&self, on: bool) {
        let v = format!("net.ipv4.ip_forward={}", u8::from(on));
        run_ok(&["ip", "netns", "exec", &self.host_ns(), "sysctl", "-qw", &v]);
    }

    fn namespaces(&self) -> Vec<String> {
        let mut all = vec![self.host_ns(), self.upstream_ns(), self.attacker_ns()];
        all.extend((1..=self.n_guests).map(|i| self.guest_ns(i)));
        all
    }
}

/// Namespaces and root-namespace links whose names start with `prefix`.
pub fn leftovers(prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in run_ok(&["ip", "netns", "list"]).lines() {
        if line.starts_with(prefix) {
            found.push(format!("netns {line}"));
        }
    }
    for line in run_ok(&["ip", "-o", "link", "show"]).lines() {
        if let Some(name) = line.split(": ").nth(1) {
            let name = name.split('@').next().unwrap_or(name);
            if name.starts_with(prefix) {
                found.push(format!("link {name}"));
            }
        }
    }
    found
}

impl Drop for Topology {
    fn drop(&mut self) {
        // The fixtures below stop their own processes; this catches anything a
        // test started in our namespaces and leaked. Only pids inside
        // namespaces we made are touched.
        let mut pids = Vec::new();
        for ns in self.namespaces() {
            let out = run(&["ip", "netns", "pids", &ns]);
            pids.extend(String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
        for &p in &pids {
            let _ = kill(Pid::from_raw(i32::try_from(p).unwrap()), Signal::SIGKILL);
        }
        let end = Instant::now() + DEADLINE;
        while pids.iter().any(|&p| pid_alive(p)) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        for ns in self.namespaces() {
            let _ = run(&["ip", "netns", "del", &ns]);
        }
        // A deleted namespace can leave its veth behind for a moment.
        let end = Instant::now() + DEADLINE;
        loop {
            let left = leftovers(&self.prefix);
            if left.is_empty() || Instant::now() >= end {
                for l in left {
                    if let Some(link) = l.strip_prefix("link ") {
                        let _ = run(&["ip", "link", "del", link]);
                    }
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One server's client config, as mitmdump printed it.
#[derive(Clone, Debug)]
pub struct ClientConf {
    pub private_key: String,
    pub server_public_key: String,
    pub port: u16,
    /// The `Address` mitmdump suggested (the same for every server).
    pub address: String,
}

/// Every client config block in mitmdump's stdout, keyed by `Endpoint` port.
///
/// A block sits between two 60-hyphen fences; the opening one carries a
/// `[HH:MM:SS.mmm] ` prefix, the closing one does not. Blocks come in any order.
pub fn parse_client_confs(stdout: &str) -> BTreeMap<u16, ClientConf> {
    let fence = "-".repeat(60);
    let mut confs = BTreeMap::new();
    let mut block: Option<BTreeMap<String, String>> = None;
    for line in stdout.lines() {
        let line = line.trim_end();
        match block.as_mut() {
            None if line.ends_with(&fence) => block = Some(BTreeMap::new()),
            None => {}
            Some(fields) if line == fence => {
                let get = |k: &str| fields.get(k).cloned();
                let port = get("Endpoint").and_then(|e| e.rsplit_once(':').and_then(|(_, p)| p.parse().ok()));
                if let (Some(private_key), Some(server_public_key), Some(port)) =
                    (get("PrivateKey"), get("PublicKey"), port)
                {
                    let address = get("Address").unwrap_or_default();
                    confs.insert(port, ClientConf { private_key, server_public_key, port, address });
                }
                block = None;
            }
            Some(fields) => {
                if let Some((k, v)) = line.split_once(" = ") {
                    fields.insert(k.trim().to_owned(), v.trim().to_owned());
                }
            }
        }
    }
    confs
}

/// mitmdump in WireGuard mode, one server per port, in the host namespace.
pub struct Mitmdump {
    child: Child,
    pub confs: BTreeMap<u16, ClientConf>,
    pub confdir: PathBuf,
    /// Where the `keys-<port>.conf` files live (for hot-added servers too).
    pub keys_dir: PathBuf,
    pub stdout_log: PathBuf,
    pub stderr_log: PathBuf,
}

impl Mitmdump {
    /// Start mitmdump with one `--mode wireguard:<keys>@<port>` per port, and
    /// wait until every port's client config has been printed.
    pub fn start(topo: &Topology, ports: &[u16], confdir: &Path, extra_args: &[&str]) -> Self {
        let keys = topo.path().join("keys");
        std::fs::create_dir_all(&keys).unwrap();
        std::fs::create_dir_all(confdir).unwrap();
        let stdout_log = topo.path().join("mitmdump.out");
        let stderr_log = topo.path().join("mitmdump.err");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &topo.host_ns()]).arg(mitmdump_path());
        for p in ports {
            cmd.arg("--mode").arg(format!("wireguard:{}@{p}", keys.join(format!("keys-{p}.conf")).display()));
        }
        cmd.arg("--set")
            .arg(format!("confdir={}", confdir.display()))
            .args(["--set", "connection_strategy=lazy"])
            // Names resolve through the upstream's test DNS server only: never
            // the machine's resolver or its hosts file.
            .args(["--set", &format!("dns_name_servers={UPSTREAM_IP}"), "--set", "dns_use_hosts_file=false"])
            .args(extra_args)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_log).unwrap())
            .stderr(std::fs::File::create(&stderr_log).unwrap());
        let child = cmd.spawn().expect("mitmdump starts");
        let mut m =
            Self { child, confs: BTreeMap::new(), confdir: confdir.to_owned(), keys_dir: keys, stdout_log, stderr_log };
        let end = Instant::now() + DEADLINE;
        loop {
            m.confs = parse_client_confs(&std::fs::read_to_string(&m.stdout_log).unwrap_or_default());
            if ports.iter().all(|p| m.confs.contains_key(p)) {
                break;
            }
            if let Ok(Some(status)) = m.child.try_wait() {
                panic!("mitmdump exited early ({status}):\n{}", m.logs());
            }
            assert!(Instant::now() < end, "mitmdump printed no config for every port in {DEADLINE:?}:\n{}", m.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait until a client config for `port` has been printed (a server added
    /// at run time prints one too), and return it.
    pub fn wait_conf(&mut self, port: u16) -> ClientConf {
        let end = Instant::now() + DEADLINE;
        loop {
            self.confs = parse_client_confs(&self.stdout());
            if let Some(c) = self.confs.get(&port) {
                return c.clone();
            }
            assert!(Instant::now() < end, "no client config for port {port} in {DEADLINE:?}:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The client config for `port`.
    pub fn conf(&self, port: u16) -> &ClientConf {
        &self.confs[&port]
    }

    /// The CA that mitmproxy signs its leaf certificates with.
    pub fn ca_cert(&self) -> PathBuf {
        self.confdir.join("mitmproxy-ca-cert.pem")
    }

    /// Stdout so far (client configs, then one entry per flow).
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_log).unwrap_or_default()
    }

    /// Both logs, for assertion messages.
    pub fn logs(&self) -> String {
        let err = std::fs::read_to_string(&self.stderr_log).unwrap_or_default();
        format!("--- mitmdump stdout\n{}--- mitmdump stderr\n{err}", self.stdout())
    }

    /// SIGTERM and wait until the process is gone (it takes a few seconds).
    pub fn stop(&mut self) {
        stop_child(&mut self.child, DEADLINE);
    }
}

impl Drop for Mitmdump {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A guest: a namespace with `wireguard-go` on wg0, routes and a kill switch.
pub struct Guest {
    wg: Child,
    pub ns: String,
    pub index: u8,
    pub endpoint: Ipv4Addr,
    pub port: u16,
    /// wg0's address, `10.0.0.<index>`.
    pub inner_ip: Ipv4Addr,
    nft_table: String,
    dir: PathBuf,
}

impl Guest {
    /// Bring up guest `i` with `conf`'s keys, talking to `endpoint(i):port`.
    /// `port` is normally `conf.port`; a test may point it elsewhere.
    pub fn up(topo: &Topology, i: u8, conf: &ClientConf, port: u16) -> Self {
        let ns = topo.guest_ns(i);
        let dir = topo.path().join(format!("g{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        // The mount point must exist; each guest mounts a private tmpfs on it
        // (in its own mount namespace), because wireguard-go's control socket
        // `/run/wireguard/wg0.sock` would otherwise collide between guests.
        std::fs::create_dir_all("/run/wireguard").unwrap();
        let log = std::fs::File::create(dir.join("wireguard-go.log")).unwrap();
        let wg = Command::new("ip")
            .args(["netns", "exec", &ns, "sh", "-c"])
            .arg(format!("mount -t tmpfs {}-wg /run/wireguard && exec wireguard-go -f wg0", topo.prefix))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("wireguard-go starts");
        let mut g = Self {
            wg,
            ns,
            index: i,
            endpoint: topo.endpoint(i),
            port,
            inner_ip: Ipv4Addr::new(10, 0, 0, i),
            nft_table: format!("{}_egress", topo.prefix),
            dir,
        };
        wait_until("wireguard-go to create wg0", DEADLINE, || {
            if let Ok(Some(status)) = g.wg.try_wait() {
                panic!("wireguard-go exited early ({status}): {}", g.wg_log());
            }
            g.wg_cmd(&["show", "wg0"]).status.success()
        });
        let setconf = g.dir.join("wg0.setconf");
        std::fs::write(
            &setconf,
            format!(
                "[Interface]\nPrivateKey = {}\n\n[Peer]\nPublicKey = {}\nAllowedIPs = 0.0.0.0/0\nEndpoint = {}:{port}\n",
                conf.private_key, conf.server_public_key, g.endpoint
            ),
        )
        .unwrap();
        let out = g.wg_cmd(&["setconf", "wg0", setconf.to_str().unwrap()]);
        assert!(out.status.success(), "wg setconf failed: {}", describe(&out));
        let n = g.ns.clone();
        run_ok(&["ip", "-n", &n, "addr", "add", &format!("{}/32", g.inner_ip), "dev", "wg0"]);
        run_ok(&["ip", "-n", &n, "link", "set", "wg0", "mtu", "1420", "up"]);
        run_ok(&["ip", "-n", &n, "route", "replace", &format!("{}/32", g.endpoint), "dev", "veth0"]);
        // quickack: without it keep-alive requests stall ~40 ms (Nagle in
        // mitmproxy's userspace TCP against the guest's delayed ACKs).
        run_ok(&["ip", "-n", &n, "route", "replace", "default", "dev", "wg0", "quickack", "1"]);
        g.kill_switch_on();
        g
    }

    /// Run `argv` inside the guest's network namespace.
    pub fn run(&self, argv: &[&str]) -> Output {
        let mut full = vec!["ip", "netns", "exec", self.ns.as_str()];
        full.extend_from_slice(argv);
        run(&full)
    }

    /// Run `argv` in the guest with `resolv` bind-mounted on /etc/resolv.conf,
    /// in a mount namespace of its own (the bind never reaches the machine).
    pub fn run_with_resolv(&self, resolv: &Path, argv: &[&str]) -> Output {
        let mount = format!("mount --bind {} /etc/resolv.conf && exec \"$@\"", resolv.display());
        let mut full = vec!["ip", "netns", "exec", self.ns.as_str(), "sh", "-c", mount.as_str(), "sh"];
        full.extend_from_slice(argv);
        run(&full)
    }

    /// Run `wg <args>` in wireguard-go's mount namespace (where its socket is).
    pub fn wg_cmd(&self, args: &[&str]) -> Output {
        let pid = self.wg.id().to_string();
        let mut full = vec!["nsenter", "-t", pid.as_str(), "-m", "-n", "wg"];
        full.extend_from_slice(args);
        run(&full)
    }

    /// `curl -sS -m 10 <args>` in the guest.
    pub fn curl(&self, args: &[&str]) -> Output {
        let mut full = vec!["curl", "-sS", "-m", "10"];
        full.extend_from_slice(args);
        self.run(&full)
    }

    /// The peer's latest handshake (unix seconds), 0 when there was none.
    pub fn latest_handshake(&self) -> u64 {
        let out = self.wg_cmd(&["show", "wg0", "latest-handshakes"]);
        assert!(out.status.success(), "wg show failed: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).split_whitespace().nth(1).and_then(|t| t.parse().ok()).unwrap_or(0)
    }

    /// Send one packet into the tunnel, which makes wireguard-go handshake.
    pub fn nudge(&self) {
        let _ = self.curl(&["-m", "1", "-o", "/dev/null", &format!("http://{UPSTREAM_IP}:9/")]);
    }

    /// Poll for a handshake, nudging the tunnel meanwhile; true if one happened.
    pub fn handshake_within(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut next_nudge = Instant::now();
        while Instant::now() < end {
            if self.latest_handshake() != 0 {
                return true;
            }
            if Instant::now() >= next_nudge {
                // A UDP packet to the tunnel without waiting on any answer.
                let _ = self.run(&["bash", "-c", &format!("echo x > /dev/udp/{UPSTREAM_IP}/9; true")]);
                next_nudge = Instant::now() + Duration::from_millis(500);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.latest_handshake() != 0
    }

    /// The nftables output chain that lets only loopback, wg0 and UDP to the
    /// endpoint's WireGuard port out (what a guest's provisioning installs).
    pub fn kill_switch_on(&self) {
        let rules = format!(
            "table inet {t} {{\n  chain out {{\n    type filter hook output priority 0; policy drop;\n    \
             oifname \"lo\" accept\n    oifname \"wg0\" accept\n    \
             oifname \"veth0\" ip daddr {ep} udp dport {port} accept\n  }}\n}}\n",
            t = self.nft_table,
            ep = self.endpoint,
            port = self.port
        );
        let f = self.dir.join("killswitch.nft");
        std::fs::write(&f, rules).unwrap();
        let out = self.run(&["nft", "-f", f.to_str().unwrap()]);
        assert!(out.status.success(), "nft failed: {}", describe(&out));
    }

    /// Remove the kill switch, as root in the guest could.
    pub fn kill_switch_off(&self) {
        let out = self.run(&["nft", "delete", "table", "inet", &self.nft_table]);
        assert!(out.status.success(), "nft delete failed: {}", describe(&out));
    }

    /// Replace wg0's address (the spoof test), keeping the default route.
    pub fn set_inner_ip(&mut self, ip: Ipv4Addr) {
        run_ok(&["ip", "-n", &self.ns, "addr", "flush", "dev", "wg0"]);
        run_ok(&["ip", "-n", &self.ns, "addr", "add", &format!("{ip}/32"), "dev", "wg0"]);
        run_ok(&["ip", "-n", &self.ns, "route", "replace", "default", "dev", "wg0", "quickack", "1"]);
        self.inner_ip = ip;
    }

    pub fn wg_pid(&self) -> u32 {
        self.wg.id()
    }

    fn wg_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("wireguard-go.log")).unwrap_or_default()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        stop_child(&mut self.wg, DEADLINE);
    }
}

/// The HTTP/HTTPS echo server in the upstream namespace
/// (`tests/support/upstream.py`), with its own test CA.
pub struct Upstream {
    child: Child,
    /// The test CA that signed the upstream's certificate.
    pub ca_cert: PathBuf,
    /// One JSON line per request the upstream received.
    pub requests_log: PathBuf,
    /// The DNS server's names, `{name: ipv4}`; see [`Upstream::set_name`].
    pub zone: PathBuf,
    /// One JSON line per DNS query: name, qtype, answer.
    pub dns_log: PathBuf,
    stderr_log: PathBuf,
}

impl Upstream {
    /// Make a test CA and a certificate for [`UPSTREAM_NAME`] (and the IP),
    /// start the echo server on 80 and 443, and wait until it listens.
    pub fn start(topo: &Topology) -> Self {
        // It also plays api.anthropic.com, the service whose key ppp
        // injects, and the other LLM providers ppp meters (e2e_usage).
        Self::start_in(
            topo,
            &topo.upstream_ns(),
            "upstream",
            &[UPSTREAM_IP],
            &[UPSTREAM_NAME, SERVICE_NAME, OPENAI_NAME, GEMINI_NAME],
            None,
        )
    }

    /// A second server in the upstream namespace on `ip`, a public address
    /// (routed only inside the test's namespaces), with a certificate for
    /// `names` from `upstream`'s CA; `upstream`'s DNS answers them with
    /// `ip`. For flows that must not be internal: an `ask` default holds
    /// only those, since an internal address always needs its own rule.
    pub fn start_public(topo: &Topology, upstream: &Upstream, ip: Ipv4Addr, names: &[&str]) -> Self {
        let (h, u) = (topo.host_ns(), topo.upstream_ns());
        let hu = format!("{}hu", topo.prefix);
        run_ok(&["ip", "-n", &u, "addr", "add", &format!("{ip}/32"), "dev", "veth0"]);
        run_ok(&["ip", "-n", &h, "route", "add", &format!("{ip}/32"), "via", "10.251.0.2", "dev", &hu]);
        for n in names {
            upstream.set_name(n, ip);
        }
        Self::start_in(topo, &u, "public", &[ip], names, Some(upstream))
    }

    /// The attacker's server in [`Topology::attacker_ns`], on [`ATTACKER_IP`]
    /// and [`ATTACKER_IP2`], with a certificate for [`ATTACKER_NAME`] that
    /// the upstream's CA signed: a name it really holds, which ppp's
    /// mitmdump verifies like any other.
    pub fn start_attacker(topo: &Topology, upstream: &Upstream) -> Self {
        Self::start_in(
            topo,
            &topo.attacker_ns(),
            "attacker",
            &[ATTACKER_IP, ATTACKER_IP2],
            &[ATTACKER_NAME],
            Some(upstream),
        )
    }

    fn start_in(
        topo: &Topology,
        ns: &str,
        tag: &str,
        ips: &[Ipv4Addr],
        names: &[&str],
        ca_of: Option<&Upstream>,
    ) -> Self {
        let d = topo.path().join(tag);
        std::fs::create_dir_all(&d).unwrap();
        let p = |f: &str| d.join(f).to_str().unwrap().to_owned();
        let (ca_key, ca_cert, key, csr, cert, ext) =
            (p("ca.key"), p("ca.pem"), p("srv.key"), p("srv.csr"), p("srv.pem"), p("srv.ext"));
        if let Some(u) = ca_of {
            let ud = u.ca_cert.parent().unwrap();
            std::fs::copy(ud.join("ca.key"), &ca_key).unwrap();
            std::fs::copy(&u.ca_cert, &ca_cert).unwrap();
        } else {
            run_ok(&[
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &ca_key,
                "-out",
                &ca_cert,
                "-days",
                "2",
                "-subj",
                "/CN=ppp e2e test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
        }
        run_ok(&[
            "openssl",
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={}", names[0]),
        ]);
        let mut extfile = String::new();
        writeln!(extfile, "basicConstraints=critical,CA:FALSE").unwrap();
        writeln!(extfile, "keyUsage=critical,digitalSignature").unwrap();
        writeln!(extfile, "extendedKeyUsage=serverAuth").unwrap();
        writeln!(extfile, "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid").unwrap();
        let sans: Vec<String> = ips.iter().map(|ip| format!("IP:{ip}")).collect();
        let dns: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
        writeln!(extfile, "subjectAltName={},{}", dns.join(","), sans.join(",")).unwrap();
        std::fs::write(&ext, extfile).unwrap();
        run_ok(&[
            "openssl",
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_cert,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
        let requests_log = d.join("requests.jsonl");
        let zone = d.join("zone.json");
        let dns_log = d.join("dns.jsonl");
        let zone_map: serde_json::Map<String, serde_json::Value> =
            names.iter().map(|n| ((*n).to_owned(), ips[0].to_string().into())).collect();
        std::fs::write(&zone, serde_json::Value::Object(zone_map).to_string()).unwrap();
        let ready = d.join("ready");
        let stderr_log = d.join("upstream.err");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/upstream.py");
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(venv_python())
            .arg(script)
            .arg(ips.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
            .args([&cert, &key])
            .arg(&requests_log)
            .arg(&ready)
            .arg(&zone)
            .arg(&dns_log)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_log).unwrap())
            .spawn()
            .expect("the upstream echo server starts");
        let mut u = Self { child, ca_cert: PathBuf::from(ca_cert), requests_log, zone, dns_log, stderr_log };
        wait_until("the upstream echo server to listen", DEADLINE, || {
            if let Ok(Some(status)) = u.child.try_wait() {
                panic!("upstream.py exited early ({status}): {}", u.stderr());
            }
            ready.exists()
        });
        u
    }

    /// Every request received so far, as parsed JSON.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.requests_log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("upstream.py writes JSON lines"))
            .collect()
    }

    /// Make the test DNS server answer `name` with `ip` from now on
    /// (atomically: the server re-reads the zone on every query).
    pub fn set_name(&self, name: &str, ip: Ipv4Addr) {
        let mut zone: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&self.zone).unwrap()).unwrap();
        zone.insert(name.to_ascii_lowercase(), ip.to_string().into());
        let tmp = self.zone.with_extension("tmp");
        std::fs::write(&tmp, serde_json::Value::Object(zone).to_string()).unwrap();
        std::fs::rename(tmp, &self.zone).unwrap();
    }

    /// Make the test DNS server answer `name` with any zone value: an
    /// address, `"drop"`, `{"cname": target}`, `{"dname": target}`, with an
    /// optional `"additional": [name, address]` (see `upstream.py`).
    pub fn set_zone(&self, name: &str, value: serde_json::Value) {
        let mut zone: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&self.zone).unwrap()).unwrap();
        zone.insert(name.to_ascii_lowercase(), value);
        let tmp = self.zone.with_extension("tmp");
        std::fs::write(&tmp, serde_json::Value::Object(zone).to_string()).unwrap();
        std::fs::rename(tmp, &self.zone).unwrap();
    }

    /// Every DNS query received so far, as parsed JSON.
    pub fn dns_queries(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.dns_log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("upstream.py writes JSON lines"))
            .collect()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        stop_child(&mut self.child, DEADLINE);
    }
}

/// Whether `pid` still runs; for tests asserting on tear-down.
pub fn alive(pid: u32) -> bool {
    pid_alive(pid)
}

/// `/etc/netns/<host-ns>/`: what `ip netns exec <host-ns>` mounts over
/// `/etc/resolv.conf` and `/etc/hosts`, so the daemon's mitmdump resolves
/// with the upstream's test DNS server only. The namespace name is unique
/// per run; the directory is removed on drop.
pub struct NetnsEtc {
    dir: PathBuf,
}

impl NetnsEtc {
    pub fn new(topo: &Topology) -> Self {
        let dir = Path::new("/etc/netns").join(topo.host_ns());
        std::fs::create_dir_all(&dir).unwrap();
        let etc = NetnsEtc { dir };
        std::fs::write(etc.dir.join("resolv.conf"), format!("nameserver {UPSTREAM_IP}\n")).unwrap();
        std::fs::write(etc.dir.join("hosts"), "127.0.0.1 localhost\n").unwrap();
        etc
    }
}

impl Drop for NetnsEtc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// ppp's state dirs under `root` and the daemon started for them, stopped
/// on drop. `ppp` runs with a clean environment and the file secret store.
pub struct Daemon {
    pub root: PathBuf,
}

impl Daemon {
    /// Where every netns test's daemon starts: its state under `topo`, each
    /// of `sandboxes` holding the pool port it must get, and the deny-all
    /// preset. Not started: the caller adds its rules first.
    pub fn deny_all(topo: &Topology, sandboxes: &[(&str, u16)]) -> Daemon {
        let root = topo.path().join("ppp");
        std::fs::create_dir_all(&root).unwrap();
        let daemon = Daemon { root };
        for &(name, port) in sandboxes {
            assert_eq!(ppp::sandbox::with_registry(&daemon.dirs(), |r| r.allocate(name)).unwrap(), port);
        }
        daemon.ok(&["policy", "init", "deny-all"]);
        daemon
    }

    /// The client config the daemon captured for `port`.
    pub fn conf(&self, port: u16) -> ClientConf {
        let confs: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.data().join("wg/client-confs.json")).unwrap()).unwrap();
        let c = &confs[port.to_string()];
        ClientConf {
            private_key: c["private_key"].as_str().unwrap().to_owned(),
            server_public_key: c["public_key"].as_str().unwrap().to_owned(),
            port,
            address: c["address"].as_str().unwrap().to_owned(),
        }
    }

    pub fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    pub fn dirs(&self) -> ppp::dirs::Dirs {
        ppp::dirs::Dirs { config: self.root.join("config"), data: self.data(), cache: self.root.join("cache") }
    }

    /// `ppp ARGS` with these state dirs.
    pub fn ppp(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ppp"));
        c.env_clear()
            .env("HOME", &self.root)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("PPP_CONFIG", self.root.join("config"))
            .env("PPP_DATA", self.data())
            .env("PPP_CACHE", self.root.join("cache"))
            .env("PPP_SECRET_BACKEND", "file")
            .env("PPP_MITMDUMP", mitmdump_path())
            .args(args);
        c
    }

    /// `ppp ARGS`, required to succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.ppp(args).output().unwrap();
        assert!(out.status.success(), "ppp {args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ppp daemon start -d` inside the topology's host namespace, trusting
    /// only the upstream's test CA.
    pub fn start(&self, topo: &Topology, upstream: &Upstream) {
        // These guests reach the host namespace at its veths' addresses,
        // not through gvproxy's NAT to loopback: listen on all of them,
        // unless the test configured something else.
        let config = self.root.join("config/config.yaml");
        if !config.exists() {
            std::fs::create_dir_all(config.parent().unwrap()).unwrap();
            std::fs::write(&config, "wireguard:\n  listen_host: 0.0.0.0\n").unwrap();
        }
        let start = self.ppp(&["daemon", "start", "-d"]);
        let argv: Vec<String> = std::iter::once(start.get_program().to_string_lossy().into_owned())
            .chain(start.get_args().map(|a| a.to_string_lossy().into_owned()))
            .collect();
        let envs: Vec<(String, String)> = start
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_string_lossy().into_owned(), v?.to_string_lossy().into_owned())))
            .collect();
        let out = Command::new("ip")
            .env_clear()
            .envs(envs)
            .env("PPP_UPSTREAM_CA", &upstream.ca_cert)
            .args(["netns", "exec", &topo.host_ns()])
            .args(&argv)
            .output()
            .unwrap();
        assert!(out.status.success(), "daemon start: {}", describe(&out));
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.ppp(&["daemon", "stop"]).output();
    }
}

/// `VmRSS` and `VmHWM` (peak RSS) of `pid`, in KiB, from `/proc/<pid>/status`.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("could not read /proc/{pid}/status: {e}"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Start `pid`'s `VmHWM` over from its current RSS (`5` to `clear_refs`),
/// so a later `VmHWM` is the peak since now.
pub fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .unwrap_or_else(|e| panic!("could not reset the peak RSS of {pid}: {e}"));
}

/// `tests/support/flood.py`: what a hostile guest sends in the flood tests.
pub fn flood_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/flood.py")
}

impl Guest {
    /// Start `argv` in the guest in the background, stdout and stderr piped.
    pub fn spawn(&self, argv: &[&str]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("`{}` could not start in {}: {e}", argv.join(" "), self.ns))
    }
}

/// A `bytes` HTTPS download in guest `g` from `agent_servers.py`
/// (`echo.test:8443/download`), trusting only `ca`: MB/s. Fails unless
/// every byte arrived with a 200.
pub fn bench_download(g: &Guest, ca: &str, bytes: u64) -> f64 {
    let url = format!("https://{UPSTREAM_NAME}:8443/download?bytes={bytes}");
    let resolve = format!("{UPSTREAM_NAME}:8443:{UPSTREAM_IP}");
    let out = g.run(&[
        "curl",
        "-sS",
        "-m",
        "900",
        "--cacert",
        ca,
        "--resolve",
        &resolve,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_download} %{speed_download}",
        &url,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(f.get(..2), Some(&["200", bytes.to_string().as_str()][..]), "download: {}", describe(&out));
    f[2].parse::<f64>().unwrap() / 1e6
}

/// Start `tests/support/agent_servers.py` in the upstream namespace with the
/// upstream's certificate, its files in `<topo>/agent-servers`, and wait
/// until it listens. The caller kills the child.
pub fn start_agent_servers(topo: &Topology) -> (Child, PathBuf) {
    let dir = topo.path().join("agent-servers");
    std::fs::create_dir_all(dir.join("git")).unwrap();
    let up = topo.path().join("upstream");
    let ready = dir.join("ready");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/agent_servers.py");
    let mut child = Command::new("ip")
        .args(["netns", "exec", &topo.upstream_ns()])
        .arg(venv_python())
        .arg(script)
        .arg(UPSTREAM_IP.to_string())
        .args([up.join("srv.pem"), up.join("srv.key"), dir.clone(), ready.clone()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("servers.err")).unwrap())
        .spawn()
        .expect("agent_servers.py starts");
    wait_until("the agent servers to listen", DEADLINE, || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("agent_servers.py exited early ({status})");
        }
        ready.exists()
    });
    (child, dir)
}

//! The whole host data path for real: `ppp daemon start -d` (supervisor,
//! pinned mitmdump, ppp's embedded addon, the daemon socket) in the test's
//! host namespace, and two WireGuard guests with different policies.
//! Ports are claimed through the state module, as the lifecycle commands
//! will do. A third guest namespace is there for the tests that need a
//! misconfigured guest.
//!
//! The daemon's mitmdump resolves names (for DNS sent to 10.0.0.53 through
//! the tunnel) with the host's resolver, as in production. Here that is the
//! upstream namespace's test DNS server: `ip netns exec <host-ns>` bind-mounts
//! `/etc/netns/<host-ns>/resolv.conf` (and `hosts`) over `/etc`, so no query
//! ever reaches the machine's own resolver.

#[path = "support/netns.rs"]
mod netns;

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use netns::{Daemon, Guest, NetnsEtc, Topology, UPSTREAM_IP, Upstream, describe, wait_until};
use serde_json::Value;

const RED: u16 = 51820;
const BLUE: u16 = 51821;
const KEY: &str = "sk-ant-e2e-REAL-0123456789abcdef";

/// Fields drop in order: guests, then the daemon, then the rest.
struct Rig {
    guests: Vec<Guest>,
    daemon: Daemon,
    upstream: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

/// What these tests read from the daemon's state.
trait DaemonExt {
    fn conf(&self, port: u16) -> netns::ClientConf;
    fn status(&self) -> Value;
    fn flows(&self) -> Vec<Value>;
}

impl DaemonExt for Daemon {
    /// The client config the daemon captured for `port`.
    fn conf(&self, port: u16) -> netns::ClientConf {
        let confs: Value =
            serde_json::from_str(&std::fs::read_to_string(self.data().join("wg/client-confs.json")).unwrap()).unwrap();
        let c = &confs[port.to_string()];
        netns::ClientConf {
            private_key: c["private_key"].as_str().unwrap().to_owned(),
            server_public_key: c["public_key"].as_str().unwrap().to_owned(),
            port,
            address: c["address"].as_str().unwrap().to_owned(),
        }
    }

    fn status(&self) -> Value {
        serde_json::from_str(&self.ok(&["daemon", "status", "--json"])).unwrap()
    }

    fn flows(&self) -> Vec<Value> {
        std::fs::read_to_string(self.data().join("flows.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn rig() -> Rig {
    let topo = Topology::new(3);
    let upstream = Upstream::start(&topo);
    let etc = NetnsEtc::new(&topo);
    let root = topo.path().join("ppp");
    std::fs::create_dir_all(&root).unwrap();
    let daemon = Daemon { root };
    let dirs = daemon.dirs();
    assert_eq!(ppp::sandbox::with_registry(&dirs, |r| r.allocate("red")).unwrap(), RED);
    assert_eq!(ppp::sandbox::with_registry(&dirs, |r| r.allocate("blue")).unwrap(), BLUE);

    daemon.ok(&["policy", "init", "deny-all"]);
    // 198.18.0.0/15 is not a public range, so the DNS-rebinding defence
    // refuses names that resolve there unless an address rule allows it.
    daemon.ok(&["policy", "allow", "network", "--sandbox", "red", "echo.test,api.anthropic.com,198.18.0.10"]);
    // Names the DNS-answer test points at internal addresses.
    daemon.ok(&["policy", "allow", "network", "--sandbox", "red", "*.rebind.test"]);
    daemon.ok(&["policy", "allow", "network", "--sandbox", "blue", "api.anthropic.com"]);
    daemon.ok(&["secret", "set", "-g", "anthropic", "-t", KEY]);

    // mitmdump verifies upstream servers against the test CA only.
    daemon.start(&topo, &upstream);

    let mut rig = Rig { guests: Vec::new(), daemon, upstream, _etc: etc, topo };
    rig.guests = vec![
        Guest::up(&rig.topo, 1, &rig.daemon.conf(RED), RED),
        Guest::up(&rig.topo, 2, &rig.daemon.conf(BLUE), BLUE),
    ];
    for g in &rig.guests {
        assert!(g.handshake_within(netns::DEADLINE), "guest {} got no handshake", g.index);
    }
    rig
}

fn curl(g: &Guest, args: &[&str]) -> (String, String) {
    let mut full = vec!["-o", "-", "-w", "\n%{http_code}"];
    full.extend_from_slice(args);
    let out = g.curl(&full);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    (body.to_owned(), code.to_owned())
}

fn resolve(name: &str, port: u16) -> String {
    format!("{name}:{port}:{UPSTREAM_IP}")
}

fn contains_anywhere(root: &Path, needle: &str) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())) {
                hits.push(p);
            }
        }
    }
    hits
}

/// Pids of every process in network namespace `ns` (one of the topology's).
fn pids_in_netns(ns: &str) -> Vec<u32> {
    let target = std::fs::metadata(Path::new("/run/netns").join(ns)).unwrap();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if let Ok(m) = std::fs::metadata(e.path().join("ns/net"))
            && (m.dev(), m.ino()) == (target.dev(), target.ino())
        {
            pids.push(pid);
        }
    }
    pids
}

/// A long-lived process in guest `g` with the placeholder in its
/// environment, as an agent's process would have: something whose
/// environment a leaked key would show up in. Killed on drop.
struct GuestAgent {
    child: Child,
}

impl GuestAgent {
    fn start(g: &Guest) -> Self {
        let child = Command::new("ip")
            .args(["netns", "exec", &g.ns, "env", "ANTHROPIC_API_KEY=ppp-proxy-managed", "sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let agent = GuestAgent { child };
        // `ip netns exec` joins the namespace, then execs: same pid.
        wait_until("the agent process to be in the guest", netns::DEADLINE, || {
            pids_in_netns(&g.ns).contains(&agent.child.id())
        });
        agent
    }
}

impl Drop for GuestAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Nothing in guest `g` holds `KEY`: not the environment or command line of
/// any process in its network namespace (the agent stand-in and
/// wireguard-go among them), not the files the guest was set up from, not
/// its resolv.conf.
fn assert_key_never_in_guest(rig: &Rig, g: &Guest, agent: &GuestAgent) {
    let pids = pids_in_netns(&g.ns);
    for must in [agent.child.id(), g.wg_pid()] {
        assert!(pids.contains(&must), "pid {must} is not among the guest's processes {pids:?}");
    }
    let has = |b: &[u8], needle: &str| b.windows(needle.len()).any(|w| w == needle.as_bytes());
    let agent_env = std::fs::read(format!("/proc/{}/environ", agent.child.id())).unwrap();
    assert!(has(&agent_env, "ANTHROPIC_API_KEY=ppp-proxy-managed"), "the scan reads the guest's environments");
    for pid in pids {
        for what in ["environ", "cmdline"] {
            // A short-lived process may be gone by now; the two above are not.
            let Ok(b) = std::fs::read(format!("/proc/{pid}/{what}")) else { continue };
            assert!(!has(&b, KEY), "the key is in /proc/{pid}/{what} inside guest {}", g.ns);
        }
    }
    let guest_dir = rig.topo.path().join(format!("g{}", g.index));
    assert!(guest_dir.join("wg0.setconf").is_file(), "the guest's setup files are where the scan looks");
    let leaks = contains_anywhere(&guest_dir, KEY);
    assert!(leaks.is_empty(), "the key is in the guest's files {leaks:?}");
    let resolv = g.run(&["cat", "/etc/resolv.conf"]);
    assert!(resolv.status.success(), "{}", describe(&resolv));
    assert!(!has(&resolv.stdout, KEY), "the key is in the guest's resolv.conf");
}

#[test]
fn policy_secrets_and_live_changes_through_the_real_daemon() {
    netns::require_env();
    let rig = rig();
    let (red, blue) = (&rig.guests[0], &rig.guests[1]);
    let d = &rig.daemon;
    let agent = GuestAgent::start(red);

    // Per-sandbox policy over HTTP and HTTPS.
    let (body, code) = curl(red, &["--resolve", &resolve("echo.test", 80), "http://echo.test/hello"]);
    assert_eq!(code, "200", "red may reach echo.test: {body}");
    let ca = rig.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
    let (body, code) = curl(
        red,
        &["--cacert", ca.to_str().unwrap(), "--resolve", &resolve("echo.test", 443), "https://echo.test/tls"],
    );
    assert_eq!(code, "200", "red over HTTPS: {body}");
    let (body, code) = curl(blue, &["--resolve", &resolve("echo.test", 80), "http://echo.test/hello"]);
    assert_eq!(code, "403", "blue is denied: {body}");
    assert!(body.contains("ppp policy allow network --sandbox blue echo.test"), "{body}");
    let (_, code) =
        curl(blue, &["--cacert", ca.to_str().unwrap(), "--resolve", &resolve("echo.test", 443), "https://echo.test/"]);
    assert_ne!(code, "200", "blue is denied over TLS too");
    assert!(
        !rig.upstream.requests().iter().any(|r| r["path"] == "/" && r["tls"] == true),
        "a denied TLS connection never reaches upstream"
    );

    // The key is injected by the proxy; the guest only ever sent a placeholder.
    let (body, code) = curl(
        red,
        &[
            "-H",
            "x-api-key: ppp-proxy-managed",
            "--resolve",
            &resolve("api.anthropic.com", 80),
            "http://api.anthropic.com/v1/messages",
        ],
    );
    assert_eq!(code, "200", "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    let headers = echo["headers"].to_string().to_lowercase();
    assert!(headers.contains(&KEY.to_lowercase()), "upstream saw the real key: {headers}");
    assert!(!headers.contains("ppp-proxy-managed"), "the placeholder was replaced: {headers}");
    assert_key_never_in_guest(&rig, red, &agent);

    // Every flow is logged with its sandbox and decision, and no secret
    // value is in any file ppp or mitmdump wrote.
    wait_until("flows to be logged", netns::DEADLINE, || d.flows().len() >= 4);
    let flows = d.flows();
    assert!(
        flows.iter().any(|f| f["sandbox"] == "blue" && f["decision"] == "deny" && f["host"] == "echo.test"),
        "{flows:?}"
    );
    assert!(flows.iter().any(|f| f["sandbox"] == "red" && f["decision"] == "allow"), "{flows:?}");
    for f in ["flows.jsonl", "proxy.log"] {
        let len = std::fs::metadata(d.data().join(f)).map_or(0, |m| m.len());
        assert!(len > 0, "{f} is written under the data dir, so the scan below covers it");
    }
    let leaks: Vec<PathBuf> =
        contains_anywhere(&d.data(), KEY).into_iter().chain(contains_anywhere(&d.root.join("config"), KEY)).collect();
    assert!(leaks.is_empty(), "the key is in plaintext in {leaks:?}");
    let log = d.ok(&["policy", "log", "blue", "--json", "--limit", "5"]);
    assert!(log.contains("\"decision\":\"deny\""), "{log}");

    // A policy change applies to the next request, without a restart.
    let before: Value = serde_json::from_str(&d.ok(&["daemon", "status", "--json"])).unwrap();
    d.ok(&["policy", "deny", "network", "--sandbox", "red", "echo.test"]);
    let (body, code) = curl(red, &["--resolve", &resolve("echo.test", 80), "http://echo.test/again"]);
    assert_eq!(code, "403", "deny wins after the change: {body}");
    let after: Value = serde_json::from_str(&d.ok(&["daemon", "status", "--json"])).unwrap();
    assert_eq!(before["mitmdump_pid"], after["mitmdump_pid"], "no restart");
    assert_eq!(after["sandboxes"][0]["listening"], true);

    // Crash recovery: traffic resumes once the supervisor restarts mitmdump.
    let pid = i32::try_from(after["mitmdump_pid"].as_i64().unwrap()).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_until("mitmdump to come back", Duration::from_secs(60), || {
        let s: Value = serde_json::from_str(&d.ok(&["daemon", "status", "--json"])).unwrap();
        s["restarts"] == 1 && s["mitmdump_alive"] == true
    });
    wait_until("red's traffic to resume", Duration::from_secs(60), || {
        red.nudge();
        curl(red, &["--resolve", &resolve("api.anthropic.com", 80), "http://api.anthropic.com/ping"]).1 == "200"
    });
}

/// `dig @10.0.0.53 name A` in `g`, through the tunnel: mitmproxy answers
/// with the host's resolver (the test DNS server, see [`NetnsEtc`]).
fn dig(g: &Guest, name: &str) -> (String, std::process::Output) {
    let out = g.run(&["dig", "+time=3", "+tries=1", "@10.0.0.53", name, "A"]);
    (String::from_utf8_lossy(&out.stdout).into_owned(), out)
}

/// DNS rebinding on the DNS path. A guest that resolves a name to 127.0.0.1
/// talks to its own loopback: that connection never enters wg0, so no
/// connection check in the proxy can see it (and the guest's kernel gives
/// loopback addresses to `lo` before any route, so there is no honest way
/// to send it into the tunnel). What the proxy can do is refuse to hand the
/// address out: names red may reach, rebound to loopback, metadata and
/// private addresses, are answered REFUSED, and the refusal is logged.
fn dns_answers_rebound_to_internal_addresses_are_refused(rig: &Rig) {
    let red = &rig.guests[0];
    let d = &rig.daemon;
    // Internal, but an address rule allows it for red: answered.
    let (text, out) = dig(red, "echo.test");
    assert!(text.contains("status: NOERROR") && text.contains(&UPSTREAM_IP.to_string()), "{}", describe(&out));

    let cases = [
        ("lo.rebind.test", Ipv4Addr::LOCALHOST),
        ("meta.rebind.test", Ipv4Addr::new(169, 254, 169, 254)),
        ("lan.rebind.test", Ipv4Addr::new(10, 1, 2, 3)),
    ];
    for (name, ip) in cases {
        rig.upstream.set_name(name, ip);
        let (text, out) = dig(red, name);
        assert!(text.contains("status: REFUSED"), "{name} -> {ip} must be refused: {}", describe(&out));
        assert!(!text.contains(&ip.to_string()), "the internal address reached the guest: {text}");
        // The name itself is allowed: the test server was asked, so the
        // refusal is the answer check, not the query's policy.
        assert!(
            rig.upstream.dns_queries().iter().any(|q| q["name"] == name),
            "mitmproxy never resolved {name}: {:?}",
            rig.upstream.dns_queries()
        );
        wait_until(&format!("the refused answer for {name} in flows.jsonl"), netns::DEADLINE, || {
            d.flows().iter().any(|f| {
                f["host"] == name
                    && f["sandbox"] == "red"
                    && f["decision"] == "deny"
                    && f["reason"].as_str().is_some_and(|r| r.contains("rebinding") && r.contains(&ip.to_string()))
            })
        });
    }
    // A name under the same rule, pointing at an address red's rules allow, is answered.
    rig.upstream.set_name("ok.rebind.test", UPSTREAM_IP);
    let (text, out) = dig(red, "ok.rebind.test");
    assert!(text.contains("status: NOERROR") && text.contains(&UPSTREAM_IP.to_string()), "{}", describe(&out));
}

/// A guest with one sandbox's keys pointed at another sandbox's port gets no
/// tunnel: the server there does not know its key, so there is no
/// handshake, no request gets through, and nothing is logged for it. The
/// correctly configured guests keep working meanwhile.
#[test]
fn a_guest_on_another_sandboxs_port_gets_no_tunnel() {
    netns::require_env();
    let mut rig = rig();
    let wrong = Guest::up(&rig.topo, 3, &rig.daemon.conf(RED), BLUE);
    assert!(!wrong.handshake_within(Duration::from_secs(5)), "red's keys on blue's port got a handshake");
    assert_eq!(wrong.latest_handshake(), 0);
    let out = wrong.curl(&["-m", "5", "--resolve", &resolve("wrongport.test", 80), "http://wrongport.test/wrong-port"]);
    assert!(!out.status.success(), "a request without a tunnel went somewhere: {}", describe(&out));
    assert_eq!(wrong.latest_handshake(), 0, "the request did not bring a handshake either");
    rig.guests.push(wrong);

    let (body, code) = curl(&rig.guests[0], &["--resolve", &resolve("echo.test", 80), "http://echo.test/red-ok"]);
    assert_eq!(code, "200", "red still works: {body}");
    // Blue may reach nothing the upstream serves; its 403 shows its tunnel works.
    let (body, code) = curl(&rig.guests[1], &["--resolve", &resolve("echo.test", 80), "http://echo.test/blue-ok"]);
    assert_eq!(code, "403", "blue still reaches the proxy: {body}");
    assert!(body.contains("--sandbox blue"), "{body}");
    let d = &rig.daemon;
    // Both later flows are logged, so the wrong guest's would be by now.
    wait_until("red's and blue's flows", netns::DEADLINE, || {
        let flows = d.flows();
        flows.iter().any(|f| f["sandbox"] == "red" && f["host"] == "echo.test")
            && flows.iter().any(|f| f["sandbox"] == "blue" && f["host"] == "echo.test")
    });
    let flows = d.flows();
    assert!(!flows.iter().any(|f| f["host"] == "wrongport.test"), "a flow of the wrong guest was logged: {flows:?}");
    assert!(!rig.upstream.requests().iter().any(|r| r["path"] == "/wrong-port"), "it reached the upstream");
}

#[test]
fn defences_through_the_real_daemon() {
    netns::require_env();
    let mut rig = rig();
    let d = &rig.daemon;

    // DNS rebinding: an allowed name pointed at the metadata address is
    // refused. The host namespace has no route there, so even a failed
    // defence could not reach a real metadata service.
    let (body, code) =
        curl(&rig.guests[1], &["--resolve", "api.anthropic.com:80:169.254.169.254", "http://api.anthropic.com/latest"]);
    assert_eq!(code, "403", "rebinding to 169.254.169.254 is refused: {body}");
    assert!(body.contains("169.254.169.254"), "{body}");
    // The name is already allowed; the hint names what would have to be.
    assert!(body.contains("ppp policy allow network --sandbox blue 169.254.169.254\n"), "{body}");
    assert!(!body.contains("--sandbox blue api.anthropic.com"), "{body}");

    // Uploads over 1 MiB get 413, and nothing reaches the upstream.
    let big = rig.topo.path().join("big.bin");
    std::fs::write(&big, vec![b'x'; 2 * 1024 * 1024]).unwrap();
    let before = rig.upstream.requests().len();
    let (body, code) = curl(
        &rig.guests[0],
        &[
            "--data-binary",
            &format!("@{}", big.display()),
            "--resolve",
            &resolve("echo.test", 80),
            "http://echo.test/up",
        ],
    );
    assert_eq!(code, "413", "{body}");
    assert_eq!(rig.upstream.requests().len(), before, "the upload never reached upstream");

    // A DNS query for a denied name is refused, and the refusal logged.
    let out = rig.guests[1].run(&["dig", "+time=3", "+tries=1", "@10.0.0.53", "denied.example", "A"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("status: REFUSED"), "{}", describe(&out));
    wait_until("the DNS denial in flows.jsonl", netns::DEADLINE, || {
        d.flows().iter().any(|f| f["host"] == "denied.example" && f["decision"] == "deny")
    });

    dns_answers_rebound_to_internal_addresses_are_refused(&rig);

    // A guest that takes the other sandbox's inner address is still itself:
    // blue using red's 10.0.0.1 is still denied what red may reach.
    let red_ip = rig.guests[0].inner_ip;
    rig.guests[1].set_inner_ip(red_ip);
    let (body, code) = curl(&rig.guests[1], &["--resolve", &resolve("echo.test", 80), "http://echo.test/spoof"]);
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("--sandbox blue"), "identified as blue by its port: {body}");
    let (_, code) = curl(&rig.guests[0], &["--resolve", &resolve("echo.test", 80), "http://echo.test/real"]);
    assert_eq!(code, "200", "red is unaffected");
}

/// A sandbox that claims a port while the daemon runs gets its WireGuard
/// server without a restart, and loses it again when it frees the port;
/// the other sandboxes' tunnels carry on with the same handshake. `daemon
/// status` follows, tunnel activity included.
#[test]
fn servers_come_and_go_with_claimed_ports_through_the_real_daemon() {
    const GREEN: u16 = 51822;
    netns::require_env();
    let rig = rig();
    let d = &rig.daemon;
    // Blue's allowed name lives at a non-public test address, which the
    // rebinding defence refuses unless an address rule allows it.
    d.ok(&["policy", "allow", "network", "--sandbox", "blue", "198.18.0.10"]);
    let echo =
        |g: &Guest, path: &str| curl(g, &["--resolve", &resolve("echo.test", 80), &format!("http://echo.test{path}")]);
    let api = |g: &Guest| curl(g, &["--resolve", &resolve("api.anthropic.com", 80), "http://api.anthropic.com/v1"]);
    assert_eq!(echo(&rig.guests[0], "/red-before").1, "200");
    assert_eq!(api(&rig.guests[1]).1, "200");
    let shakes: Vec<u64> = rig.guests.iter().map(Guest::latest_handshake).collect();
    let before = d.status();
    assert_eq!(before["ports"], serde_json::json!([RED, BLUE]));
    wait_until("tunnel activity to be recorded", netns::DEADLINE, || {
        let s = d.status();
        s["sandboxes"][0]["tunnel"] == "active" && s["sandboxes"][1]["tunnel"] == "active"
    });

    // Hot add: claim a port, as `ppp create` will, and tell the daemon.
    let dirs = d.dirs();
    assert_eq!(ppp::sandbox::with_registry(&dirs, |r| r.allocate("green")).unwrap(), GREEN);
    d.ok(&["policy", "allow", "network", "--sandbox", "green", "echo.test,198.18.0.10"]);
    wait_until("green's wg0.conf and a ready daemon", Duration::from_secs(30), || {
        let s = d.status();
        dirs.sandbox_wg_conf("green").exists() && s["ports"] == serde_json::json!([RED, BLUE, GREEN])
    });
    let wg0 = std::fs::read_to_string(dirs.sandbox_wg_conf("green")).unwrap();
    assert!(wg0.contains(&format!("Endpoint = 192.168.127.254:{GREEN}")), "{wg0}");
    assert!(wg0.contains("Address = 10.0.0.4/32"), "{wg0}");
    let green = Guest::up(&rig.topo, 3, &d.conf(GREEN), GREEN);
    assert!(green.handshake_within(netns::DEADLINE), "green got no handshake");
    let (body, code) = echo(&green, "/green");
    assert_eq!(code, "200", "green may reach echo.test: {body}");
    wait_until("green's flow, named by its new port", netns::DEADLINE, || {
        d.flows().iter().any(|f| f["sandbox"] == "green" && f["host"] == "echo.test" && f["decision"] == "allow")
    });

    // The others were not disturbed: same mitmdump, same handshakes.
    assert_eq!(echo(&rig.guests[0], "/red-after-add").1, "200");
    assert_eq!(api(&rig.guests[1]).1, "200");
    let after = d.status();
    assert_eq!(after["mitmdump_pid"], before["mitmdump_pid"], "mitmdump was not restarted");
    assert_eq!(after["restarts"], 0);
    assert_eq!(after["sandboxes"][2]["name"], "green");
    assert_eq!(after["sandboxes"][2]["listening"], true);
    wait_until("green's tunnel to show as active", netns::DEADLINE, || {
        d.status()["sandboxes"][2]["tunnel"] == "active"
    });
    let text = d.ok(&["daemon", "status"]);
    assert!(text.contains("green on port 51822 (tunnel active)"), "{text}");

    // Hot remove: free the port and tell the daemon.
    assert_eq!(ppp::sandbox::with_registry(&dirs, |r| Ok(r.free("green"))).unwrap(), Some(GREEN));
    assert_eq!(ppp::proxy::notify_reload(&dirs), ppp::proxy::Reload::Done);
    let stopped = format!("WireGuard server at *:{GREEN} stopped");
    wait_until("green's server to stop", Duration::from_secs(30), || {
        std::fs::read_to_string(dirs.proxy_log()).unwrap_or_default().contains(&stopped)
    });
    let (_, code) = echo(&green, "/green-after-remove");
    assert_ne!(code, "200", "the removed server no longer carries green's traffic");
    assert_eq!(echo(&rig.guests[0], "/red-after-remove").1, "200");
    assert_eq!(api(&rig.guests[1]).1, "200");
    let last = d.status();
    assert_eq!(last["ports"], serde_json::json!([RED, BLUE]));
    assert_eq!(last["mitmdump_pid"], before["mitmdump_pid"], "mitmdump was not restarted");
    // WireGuard itself re-handshakes a session 120 s after its handshake
    // (REKEY_AFTER_TIME); on a loaded machine the test can run that long.
    // Any other new handshake means the tunnel was disturbed.
    for (g, before) in rig.guests.iter().zip(&shakes) {
        let now = g.latest_handshake();
        assert!(
            now == *before || now >= before + 120,
            "guest {} handshook again {} s after its first: its session did not survive",
            g.index,
            now.saturating_sub(*before)
        );
    }
    let seen: Vec<Value> = rig.upstream.requests().iter().map(|r| r["path"].clone()).collect();
    assert!(!seen.contains(&Value::from("/green-after-remove")), "{seen:?}");
}

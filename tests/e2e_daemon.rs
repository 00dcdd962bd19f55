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
    fn status(&self) -> Value;
    fn flows(&self) -> Vec<Value>;
}

impl DaemonExt for Daemon {
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
    let daemon = Daemon::deny_all(&topo, &[("red", RED), ("blue", BLUE)]);
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

    // The key is injected by the proxy, over verified TLS to the service's
    // host; the guest only ever sent a placeholder.
    let (body, code) = curl(
        red,
        &[
            "--cacert",
            ca.to_str().unwrap(),
            "-H",
            "x-api-key: ppp-proxy-managed",
            "--resolve",
            &resolve("api.anthropic.com", 443),
            "https://api.anthropic.com/v1/messages",
        ],
    );
    assert_eq!(code, "200", "{body}");
    let seen = rig.upstream.requests().into_iter().rfind(|r| r["path"] == "/v1/messages").expect("reached upstream");
    let headers = seen["headers"].to_string().to_lowercase();
    assert!(headers.contains(&KEY.to_lowercase()), "upstream saw the real key: {headers}");
    assert!(!headers.contains("ppp-proxy-managed"), "the placeholder was replaced: {headers}");
    // The upstream echoes the key back; ppp scrubs it before the guest sees it.
    assert!(!body.contains(KEY), "the key echoed in the response reached the guest: {body}");
    assert!(body.contains("[redacted by ppp]"), "{body}");
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
    rig.upstream.set_name("meta.rebind.test", Ipv4Addr::new(169, 254, 169, 254));
    let (body, code) =
        curl(&rig.guests[0], &["--resolve", "meta.rebind.test:80:169.254.169.254", "http://meta.rebind.test/latest"]);
    assert_eq!(code, "403", "rebinding to 169.254.169.254 is refused: {body}");
    assert!(body.contains("169.254.169.254"), "{body}");
    // The name is already allowed; the hint names what would have to be.
    assert!(body.contains("ppp policy allow network --sandbox red 169.254.169.254\n"), "{body}");
    assert!(!body.contains("--sandbox red meta.rebind.test"), "{body}");

    // Uploads over 1 MiB are refused (413, logged; the connection is closed
    // rather than the body read, ADR 0019), and nothing reaches the upstream.
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
    assert!(code == "413" || code == "000", "{code}: {body}");
    assert_eq!(rig.upstream.requests().len(), before, "the upload never reached upstream");
    wait_until("the 413 in flows.jsonl", netns::DEADLINE, || {
        d.flows().iter().any(|f| f["host"] == "echo.test" && f["status"] == 413)
    });

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

/// What an attack achieved: every check runs, and the test fails at the end
/// listing each defence that did not hold (on the code before the defences,
/// the list is the whole attack surface, not only the first hole).
#[derive(Default)]
struct Findings(std::cell::RefCell<Vec<String>>);

impl Findings {
    fn check(&self, held: bool, what: &str, detail: impl std::fmt::Display) {
        if !held {
            self.0.borrow_mut().push(format!("{what}: {detail}"));
        }
    }

    fn assert_none(self) {
        let found = self.0.into_inner();
        assert!(found.is_empty(), "{} attacks got through:\n{}", found.len(), found.join("\n"));
    }
}

/// Issue 11, points 1, 2, 3, 7 and 10 (scrubbing), as a hostile guest tries
/// them: every byte it sends is its own choice (address, SNI, Host, request
/// target, resolver), and none of that may steal the key or pick where an
/// allowed flow goes. The attacker's server sits in its own namespace at a
/// LAN address red's policy allows by a rule a user could plausibly have
/// (`10.77.0.9`), so a refusal below is the defence at work, not the
/// address being denied anyway.
#[test]
fn a_hostile_guest_cannot_steal_the_key_or_choose_where_bytes_go() {
    netns::require_env();
    let rig = rig();
    let attacker = Upstream::start_attacker(&rig.topo, &rig.upstream);
    let d = &rig.daemon;
    let red = &rig.guests[0];
    let f = Findings::default();
    d.ok(&[
        "policy",
        "allow",
        "network",
        "--sandbox",
        "red",
        &format!("{},{}", netns::ATTACKER_IP, netns::ATTACKER_NAME),
    ]);
    rig.upstream.set_name(netns::ATTACKER_NAME, netns::ATTACKER_IP);
    let ca = rig.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
    let ca = ca.to_str().unwrap();
    let last = |path: &str| rig.upstream.requests().into_iter().rfind(|r| r["path"] == path);

    // The LAN service itself works: the rule is real.
    let (body, code) = curl(red, &["http://10.77.0.9/lan"]);
    assert_eq!(code, "200", "the LAN rule lets red reach the attacker's server: {body}");

    // 1a. `Host: api.anthropic.com` sent to the allowed LAN address, in
    // clear text: the name does not resolve there, so it cannot vouch.
    let (body, code) = curl(red, &["-H", "Host: api.anthropic.com", "http://10.77.0.9/steal-plain"]);
    f.check(
        code == "403" && body.contains("does not resolve to 10.77.0.9"),
        "1a Host spoofed to an allowed address",
        &body,
    );
    f.check(!body.contains("ppp policy allow"), "1a hint", "allowing anything would not help");

    // 1b. TLS with SNI of a name the attacker holds a valid certificate for,
    // and the service's name in Host: SNI and Host disagree.
    let (body, code) = curl(
        red,
        &[
            "--cacert",
            ca,
            "--resolve",
            &format!("{}:443:{}", netns::ATTACKER_NAME, netns::ATTACKER_IP),
            "-H",
            "Host: api.anthropic.com",
            &format!("https://{}/steal-tls", netns::ATTACKER_NAME),
        ],
    );
    f.check(
        code == "403" && body.contains("different hosts"),
        "1b SNI of the attacker's name, Host of the service",
        &body,
    );

    // 1c. The service's own name and address, but plain HTTP: no key.
    let (body, code) = curl(red, &["--resolve", &resolve("api.anthropic.com", 80), "http://api.anthropic.com/plain"]);
    assert_eq!(code, "200", "{body}");
    let plain = last("/plain").expect("reached upstream");
    f.check(!plain.to_string().contains(KEY), "1c the key in clear text", &plain);

    // 1d. An absolute-form target naming another host inside TLS to an
    // allowed one is refused; one naming the same host is forwarded in
    // origin-form, so the upstream routes by the name that was decided.
    let tls_echo = |http: &str, target: &str| {
        let resolve = resolve("echo.test", 443);
        curl(red, &[http, "--cacert", ca, "--resolve", &resolve, "--request-target", target, "https://echo.test/"])
    };
    let (body, code) = tls_echo("--http1.1", "https://attacker.test/abs");
    f.check(code == "403", "1d absolute-form target of another host", &body);
    // HTTP/2: an absolute URI in :path would reach the HTTP/1 upstream as
    // an absolute-form target.
    let (body, code) = tls_echo("--http2", "https://attacker.test/abs2");
    f.check(code == "403", "1d HTTP/2 :path with another host", &body);
    let (body, code) = tls_echo("--http1.1", "https://echo.test/abs-ok");
    assert_eq!(code, "200", "{body}");
    let abs = rig.upstream.requests().into_iter().rfind(|r| r["path"].as_str().unwrap_or("").contains("abs-ok"));
    let abs = abs.expect("reached upstream");
    f.check(abs["path"] == "/abs-ok", "1d forwarded in absolute-form", &abs["path"]);

    // 1e. The name resolves where it is sent: an allowed name pointed at
    // the attacker's address by the guest (`--resolve`) is refused.
    let (body, code) =
        curl(red, &["--resolve", &format!("echo.test:80:{}", netns::ATTACKER_IP), "http://echo.test/pinned"]);
    f.check(code == "403", "1e an allowed name pinned to another address", &body);

    // 2. An address literal in Host does not replace the destination:
    // `Host: 10.77.0.9` (allowed) sent to 10.77.0.10 (not allowed).
    let (body, code) = curl(red, &["-H", "Host: 10.77.0.9", "http://10.77.0.10/literal"]);
    f.check(code == "403", "2 an allowed address literal in Host", &body);
    f.check(
        !attacker.requests().iter().any(|r| r["server"] == netns::ATTACKER_IP2.to_string()),
        "2 the request reached the address the guest chose",
        "10.77.0.10",
    );

    // 3. DNS goes only to ppp's resolver: a query straight to another
    // server is refused and never reaches it; a query through 10.0.0.53
    // reaches the upstream without the guest's EDNS option.
    let asked = rig.upstream.dns_queries().len();
    let out = red.run(&["dig", "+time=3", "+tries=1", &format!("@{UPSTREAM_IP}"), "echo.test", "A"]);
    f.check(
        String::from_utf8_lossy(&out.stdout).contains("status: REFUSED"),
        "3 DNS to another server",
        describe(&out),
    );
    f.check(rig.upstream.dns_queries().len() == asked, "3 the query reached the guest's chosen server", asked);
    let out = red.run(&["dig", "+time=3", "+tries=1", "@10.0.0.53", "+ednsopt=65001:deadbeef", "echo.test", "TXT"]);
    let txt = rig.upstream.dns_queries().into_iter().rfind(|q| q["qtype"] == 16);
    let txt = txt.unwrap_or_else(|| panic!("the TXT query was forwarded: {}", describe(&out)));
    f.check(txt["arcount"] == 0, "3 the guest's EDNS record was forwarded", &txt);

    // The legitimate request through the same tunnel still gets the key,
    // and the key the upstream echoes back is scrubbed (point 10).
    let (body, code) = curl(
        red,
        &["--cacert", ca, "--resolve", &resolve("api.anthropic.com", 443), "https://api.anthropic.com/v1/legit"],
    );
    assert_eq!(code, "200", "{body}");
    let legit = last("/v1/legit").expect("reached upstream");
    assert!(legit.to_string().contains(KEY), "the service got its key: {legit}");
    f.check(!body.contains(KEY), "10 the key echoed back reached the guest", &body);
    let stolen: Vec<_> = attacker.requests().into_iter().filter(|r| r.to_string().contains(KEY)).collect();
    f.check(stolen.is_empty(), "the attacker's server saw the key", format!("{stolen:?}"));

    // 7. The record shows the address and marks the name that did not
    // resolve there.
    let flows = d.flows();
    f.check(
        flows.iter().any(|f| f["host"] == "api.anthropic.com" && f["ip"] == "10.77.0.9" && f["resolved"] == false),
        "7 flows.jsonl marks the unresolved name",
        "no such record",
    );

    // 14. Other spellings that might make SNI and Host "agree" for the
    // check but not for the upstream: userinfo in Host, a percent-encoded
    // dot in an absolute-form target, TLS without SNI (an address as the
    // URL) carrying the service's Host. All refused.
    let anth = resolve("api.anthropic.com", 443);
    let (body, code) = curl(
        red,
        &[
            "--cacert",
            ca,
            "--resolve",
            &anth,
            "-H",
            "Host: attacker.test@api.anthropic.com",
            "https://api.anthropic.com/ui",
        ],
    );
    f.check(code != "200" && last("/ui").is_none(), "14 userinfo in Host", format!("{code} {body}"));
    let (body, code) = tls_echo("--http1.1", "https://echo%2etest/pct");
    let pct = rig.upstream.requests().into_iter().any(|r| r["path"].as_str().unwrap_or("").contains("pct"));
    f.check(code != "200" && !pct, "14 a percent-encoded dot in the target", format!("{code} {body}"));
    let (body, code) =
        curl(red, &["-k", "-H", "Host: api.anthropic.com", &format!("https://{}/no-sni", netns::ATTACKER_IP)]);
    f.check(code == "403", "14 TLS without SNI carrying the service's Host", &body);
    // `Host: <169.254.169.254 in decimal>` to an allowed address: a name
    // that does not resolve there, not the metadata address.
    let (body, code) = curl(red, &["-H", "Host: 2852039166", "http://10.77.0.9/decimal"]);
    f.check(code == "403", "14 a decimal address in Host", &body);
    // DNS over TCP to another server is refused like UDP.
    let asked = rig.upstream.dns_queries().len();
    let out = red.run(&["dig", "+tcp", "+time=3", "+tries=1", &format!("@{UPSTREAM_IP}"), "echo.test", "A"]);
    f.check(
        String::from_utf8_lossy(&out.stdout).contains("status: REFUSED"),
        "14 DNS over TCP to another server",
        describe(&out),
    );
    f.check(rig.upstream.dns_queries().len() == asked, "14 the TCP query reached the guest's server", asked);

    // 16. A credential in a query string: flows.jsonl drops queries, but
    // mitmdump logs each flow's URL whole to proxy.log, whose tail `ppp
    // diagnose` shows (and its github-issue format is made to be pasted).
    let (body, code) = curl(
        red,
        &["--cacert", ca, "--resolve", &resolve("echo.test", 443), "https://echo.test/q?access_token=SEKRETQUERY"],
    );
    assert_eq!(code, "200", "{body}");
    wait_until("the flow in proxy.log", netns::DEADLINE, || {
        std::fs::read_to_string(d.dirs().proxy_log()).is_ok_and(|l| l.contains("/q?"))
    });
    for format in ["table", "github-issue"] {
        let shown = d.ok(&["diagnose", "-o", format]);
        f.check(!shown.contains("SEKRETQUERY"), "16 a query string in `ppp diagnose`", format);
    }

    // 15. HTTP/2 connection coalescing: a connection made for the service
    // (its first stream gets the key) carries streams for other hosts.
    let out = red.run(&[
        netns::venv_python().to_str().unwrap(),
        netns::flood_script().to_str().unwrap(),
        "h2",
        &UPSTREAM_IP.to_string(),
        ca,
        "api.anthropic.com",
        "api.anthropic.com",
        "echo.test",
        netns::ATTACKER_NAME,
    ]);
    let streams: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    assert_eq!(streams[0]["status"], "200", "the connection's own host: {streams}");
    f.check(!streams[0]["body"].as_str().unwrap().contains(KEY), "15 the key echoed over HTTP/2", &streams[0]);
    for i in [1, 2] {
        f.check(streams[i]["status"] == "403", "15 a second :authority on a keyed HTTP/2 connection", &streams[i]);
    }
    let coalesced: Vec<_> =
        rig.upstream.requests().into_iter().filter(|r| r["path"] == "/h2-1" || r["path"] == "/h2-2").collect();
    f.check(coalesced.is_empty(), "15 a coalesced stream reached upstream", format!("{coalesced:?}"));
    f.check(
        !attacker.requests().iter().any(|r| r.to_string().contains(KEY)),
        "15 the attacker's server saw the key",
        "h2",
    );

    // 12. What the user's terminal shows: a Host whose bidi override makes
    // `policy log` read `google.com` (and an invisible character in the
    // path) is shown escaped.
    let (body, code) = curl(red, &["-H", "Host: \u{202e}moc.elgoog", "http://10.77.0.9/\u{200b}"]);
    f.check(code == "403", "12 a reversed Host to an allowed address", &body);
    let log = d.ok(&["policy", "log", "red"]);
    f.check(log.contains("moc.elgoog"), "12 the flow is logged", &log);
    f.check(
        !log.chars().any(|c| ppp::output::hides_text(c) && c != '\n'),
        "12 `policy log` printed a bidi override or invisible character",
        format!("{log:?}"),
    );

    // 13. The addon logs a refused Host to proxy.log as the guest sent it;
    // `ppp diagnose` and `ppp daemon status` show proxy.log's lines on the
    // user's terminal, so an escape sequence there would retitle it (or
    // worse).
    let (body, code) = curl(red, &["-H", "Host: evil\u{1b}]0;pwned\u{7}\u{1b}[2J.test", "http://10.77.0.9/esc"]);
    f.check(code == "403", "13 an escape sequence in Host", &body);
    let proxy_log = d.dirs().proxy_log();
    wait_until("the refusal in proxy.log", netns::DEADLINE, || {
        std::fs::read_to_string(&proxy_log).is_ok_and(|l| l.contains("denied HTTP evil"))
    });
    for args in [&["diagnose", "-o", "table"][..], &["daemon", "status"]] {
        let out = d.ppp(args).output().unwrap();
        let shown = String::from_utf8_lossy(&out.stdout);
        f.check(
            !shown.chars().any(|c| ppp::output::hides_text(c) && c != '\n'),
            &format!("13 `ppp {}` printed the guest's escape sequence", args.join(" ")),
            format!("{shown:?}"),
        );
        if args[0] == "diagnose" {
            f.check(shown.contains("denied HTTP evil"), "13 diagnose shows the refusal", format!("{shown:?}"));
        }
    }

    // 2 (cont.). Internal addresses need an address rule even under
    // allow-all: the attacker's second address, and the host's own.
    d.ok(&["policy", "init", "allow-all", "--force"]);
    let (body, code) = curl(red, &["-m", "5", "http://10.77.0.10/internal"]);
    f.check(code == "403" && body.contains("internal address"), "2 an internal address under allow-all", &body);
    let (body, code) = curl(red, &["-m", "5", "http://10.251.0.1:9/own"]);
    f.check(code == "403", "2 the host's own address under allow-all", &body);
    f.assert_none();
}

/// Issue 11 point 10: a reload that denies a destination cuts the streams
/// already open to it. Without that, a guest keeps a tunnel it opened while
/// the rule existed for as long as it likes.
#[test]
fn a_reload_that_denies_a_destination_cuts_its_open_streams() {
    netns::require_env();
    let rig = rig();
    let _attacker = Upstream::start_attacker(&rig.topo, &rig.upstream);
    let d = &rig.daemon;
    let red = &rig.guests[0];
    d.ok(&["policy", "allow", "network", "--sandbox", "red", &netns::ATTACKER_IP.to_string()]);
    // A raw TCP stream (not HTTP, so no per-request decision) that echoes:
    // it prints the first echo, then waits for a line on stdin to send
    // again, and reports what came back (nothing, once cut).
    let script = format!(
        "exec 3<>/dev/tcp/{}/7 && echo one >&3 && read -r -t 10 l <&3 && echo \"first:$l\" && read -r go && \
         echo two >&3 && if read -r -t 10 l <&3; then echo \"second:$l\"; else echo cut; fi",
        netns::ATTACKER_IP
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", &red.ns, "bash", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "first:one", "the stream works while the rule allows it");

    d.ok(&["policy", "rm", "network", "--sandbox", "red", "--resource", &netns::ATTACKER_IP.to_string()]);
    wait_until("the open stream to be logged as cut", netns::DEADLINE, || {
        d.flows()
            .iter()
            .any(|f| f["kind"] == "tcp" && f["ip"] == netns::ATTACKER_IP.to_string() && f["decision"] == "deny")
    });
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let _ = child.wait();
    assert_eq!(line.trim(), "cut", "the stream outlived the rule that allowed it");
}

/// `tests/support/agent_servers.py` in the upstream namespace, on the
/// upstream's address (8443 HTTPS, 8080 git), and an OCI registry on 5000,
/// stopped on drop.
struct AgentServers {
    child: Child,
    registry: Child,
    dir: PathBuf,
}

impl AgentServers {
    fn start(topo: &netns::Topology) -> Self {
        let (child, dir) = netns::start_agent_servers(topo);
        let up = topo.path().join("upstream");
        // An OCI registry (Debian's docker-registry) over TLS on :5000.
        let registry_bin = "/usr/bin/docker-registry";
        assert!(Path::new(registry_bin).exists(), "{registry_bin} is missing: run make test-deps");
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: \
                 {UPSTREAM_IP}:5000\n  tls:\n    certificate: {}\n    key: {}\n",
                dir.join("registry").display(),
                up.join("srv.pem").display(),
                up.join("srv.key").display()
            ),
        )
        .unwrap();
        let registry = Command::new("ip")
            .args(["netns", "exec", &topo.upstream_ns(), registry_bin, "serve"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.err")).unwrap())
            .spawn()
            .expect("docker-registry starts");
        let s = AgentServers { child, registry, dir };
        let upstream = topo.upstream_ns();
        wait_until("the registry to listen", netns::DEADLINE, || {
            netns::run(&[
                "ip",
                "netns",
                "exec",
                &upstream,
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{UPSTREAM_IP}/5000"),
            ])
            .status
            .success()
        });
        s
    }

    /// Put a layer blob of `size` bytes into repository `repo` the way a
    /// push leaves it on disk (the blob and the repository's link to it),
    /// and return its digest.
    fn layer(&self, repo: &str, size: usize) -> String {
        use sha2::Digest as _;
        let data: Vec<u8> = (0..251u8).cycle().take(size).collect();
        let hex = format!("{:x}", sha2::Sha256::digest(&data));
        let v2 = self.dir.join("registry/docker/registry/v2");
        let blob = v2.join(format!("blobs/sha256/{}/{hex}", &hex[..2]));
        std::fs::create_dir_all(&blob).unwrap();
        std::fs::write(blob.join("data"), data).unwrap();
        let link = v2.join(format!("repositories/{repo}/_layers/sha256/{hex}"));
        std::fs::create_dir_all(&link).unwrap();
        std::fs::write(link.join("link"), format!("sha256:{hex}")).unwrap();
        format!("sha256:{hex}")
    }

    /// A bare repository `name` under the git root holding one commit with
    /// `size` bytes of incompressible data, so its pack is that big.
    fn big_repo(&self, name: &str, size: usize) {
        let work = self.dir.join(format!("{name}-work"));
        std::fs::create_dir_all(&work).unwrap();
        let mut data = vec![0u8; size];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for b in &mut data {
            // xorshift: incompressible enough that the pack stays `size` big.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x.to_le_bytes()[0];
        }
        std::fs::write(work.join("blob.bin"), data).unwrap();
        let git = |args: &[&str], cwd: &Path| {
            let out = Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
                .args(args)
                .current_dir(cwd)
                .output()
                .unwrap();
            assert!(out.status.success(), "git {args:?}: {}", describe(&out));
        };
        git(&["init", "-q"], &work);
        git(&["add", "blob.bin"], &work);
        git(&["commit", "-qm", "big"], &work);
        let bare = self.dir.join("git").join(format!("{name}.git"));
        git(&["clone", "-q", "--bare", work.to_str().unwrap(), bare.to_str().unwrap()], &self.dir);
    }
}

impl Drop for AgentServers {
    fn drop(&mut self) {
        for c in [&mut self.child, &mut self.registry] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Issue 12: what agents really send and receive, through the real tunnel
/// with the real daemon and addon: an SSE stream whose events arrive one by
/// one, chunked uploads and downloads bigger than any old cap, `Expect:
/// 100-continue`, HTTP/1.1 pipelining, HTTP/2 from the guest, and a `git
/// clone` whose pack is over 50 MiB.
#[test]
fn agent_traffic_streams_through_the_tunnel() {
    netns::require_env();
    let rig = rig();
    let servers = AgentServers::start(&rig.topo);
    let red = &rig.guests[0];
    let ca = rig.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
    let ca = ca.to_str().unwrap();
    let tls = |host: &str| format!("{host}:8443:{UPSTREAM_IP}");

    // SSE: the server sends event 1, then waits for the test to have read
    // it. A proxy that buffers the response never hands event 1 over.
    let mut sse = Command::new("ip")
        .args(["netns", "exec", &red.ns, "curl", "-sS", "-N", "-m", "60", "--cacert", ca, "--resolve"])
        .arg(tls("echo.test"))
        .arg("https://echo.test:8443/sse?n=5&gate=sse-gate")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut events = std::io::BufReader::new(sse.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut events, &mut line).unwrap();
    assert_eq!(line.trim(), "data: 1", "the first event arrived before the stream ended");
    std::fs::write(servers.dir.join("sse-gate"), "").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut events, &mut rest).unwrap();
    assert!(sse.wait().unwrap().success());
    assert!(rest.contains("data: 5"), "{rest}");

    // A chunked download of 64 MiB (the old cap was 10 MiB, and chunked
    // bodies were buffered whole before it was checked).
    let out = red.curl(&[
        "--cacert",
        ca,
        "--resolve",
        &tls("echo.test"),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_download}",
        "https://echo.test:8443/download?bytes=67108864",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200 67108864", "{}", describe(&out));

    // A chunked upload of 16 MiB to the LLM API (its key is injected, so no
    // upload limit applies by default), and one with `Expect: 100-continue`.
    let big = rig.topo.path().join("conversation.bin");
    std::fs::write(&big, vec![b'c'; 16 << 20]).unwrap();
    let want = {
        use sha2::Digest as _;
        format!("{:x}", sha2::Sha256::digest(std::fs::read(&big).unwrap()))
    };
    for extra in [["-H", "Transfer-Encoding: chunked"], ["-H", "Expect: 100-continue"]] {
        let out = red.curl(&[
            "-m",
            "60",
            "--cacert",
            ca,
            "--resolve",
            &tls("api.anthropic.com"),
            extra[0],
            extra[1],
            "--data-binary",
            &format!("@{}", big.display()),
            "https://api.anthropic.com:8443/sink",
        ]);
        let body = String::from_utf8_lossy(&out.stdout);
        let got: Value = serde_json::from_str(&body).unwrap_or_else(|_| {
            let log = std::fs::read_to_string(rig.daemon.data().join("proxy.log")).unwrap_or_default();
            let err = std::fs::read_to_string(servers.dir.join("servers.err")).unwrap_or_default();
            panic!("{extra:?}: {}\nproxy.log:\n{log}\nservers.err:\n{err}", describe(&out))
        });
        assert_eq!((got["bytes"].as_u64(), got["sha256"].as_str()), (Some(16 << 20), Some(want.as_str())), "{extra:?}");
    }

    // HTTP/1.1 pipelining: two requests in one write, two answers in order.
    let pipelined = red.run(&[
        "bash",
        "-c",
        &format!(
            "exec 3<>/dev/tcp/{UPSTREAM_IP}/80; printf 'GET /p1 HTTP/1.1\\r\\nHost: echo.test\\r\\n\\r\\nGET /p2 HTTP/1.1\\r\\nHost: echo.test\\r\\nConnection: close\\r\\n\\r\\n' >&3; timeout 10 cat <&3"
        ),
    ]);
    let text = String::from_utf8_lossy(&pipelined.stdout);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 2, "{}", describe(&pipelined));
    assert!(text.find("\"/p1\"") < text.find("\"/p2\""), "{text}");

    // HTTP/2 from the guest (ALPN h2).
    let out = red.curl(&[
        "--http2",
        "--cacert",
        ca,
        "--resolve",
        &resolve("echo.test", 443),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{http_version}",
        "https://echo.test/h2",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200 2", "{}", describe(&out));

    // git clone over smart HTTP of a repository whose pack is over 50 MiB.
    servers.big_repo("big", 60 << 20);
    let clone = rig.topo.path().join("clone");
    // The guest resolves echo.test through ppp's resolver, as a
    // provisioned sandbox does.
    let resolv = rig.topo.path().join("resolv-tunnel.conf");
    std::fs::write(&resolv, "nameserver 10.0.0.53\n").unwrap();
    let out = red.run_with_resolv(
        &resolv,
        &["git", "clone", "-q", "http://echo.test:8080/git/big.git", clone.to_str().unwrap()],
    );
    assert!(out.status.success(), "git clone through the tunnel: {}", describe(&out));
    assert_eq!(std::fs::metadata(clone.join("blob.bin")).unwrap().len(), 60 << 20);

    // And a push back through the policy (issue 26, point 4: the agent's
    // commit and push still work; the workspace guard's side of it, the
    // commit in a guarded container, is e2e_vm's). git-http-backend takes a
    // push only where the repository says so.
    let bare = servers.dir.join("git/big.git");
    let set = Command::new("git").arg("--git-dir").arg(&bare).args(["config", "http.receivepack", "true"]).output();
    assert!(set.unwrap().status.success());
    std::fs::write(clone.join("from-guest.txt"), "pushed by the guest\n").unwrap();
    let dir = clone.to_str().unwrap();
    let id = ["-c", "user.name=guest", "-c", "user.email=guest@test", "-c", "safe.directory=*"];
    let add = [&["git", "-C", dir][..], &id, &["add", "from-guest.txt"]].concat();
    let commit = [&["git", "-C", dir][..], &id, &["commit", "-qm", "from the guest"]].concat();
    let push = [&["git", "-C", dir][..], &id, &["push", "-q", "origin", "HEAD:refs/heads/from-guest"]].concat();
    for argv in [&add, &commit, &push] {
        let out = red.run_with_resolv(&resolv, argv);
        assert!(out.status.success(), "{argv:?} through the tunnel: {}", describe(&out));
    }
    let shown = Command::new("git").arg("--git-dir").arg(&bare).args(["show", "from-guest:from-guest.txt"]).output();
    assert_eq!(String::from_utf8_lossy(&shown.unwrap().stdout), "pushed by the guest\n", "the push reached the remote");

    // An image layer of 100 MiB from an OCI registry, as the guest's podman
    // pulls it (the fake podman has no image store: the blob is what moves).
    let digest = servers.layer("ppp/agent", 100 << 20);
    let out = red.run(&[
        "bash",
        "-c",
        &format!(
            "curl -sS -m 120 --cacert {ca} --resolve echo.test:5000:{UPSTREAM_IP} \
             https://echo.test:5000/v2/ppp/agent/blobs/{digest} | sha256sum"
        ),
    ]);
    let got = String::from_utf8_lossy(&out.stdout);
    assert_eq!(got.split_whitespace().next(), digest.strip_prefix("sha256:"), "{}", describe(&out));
}

/// How much mitmdump may grow while one guest floods it (issue 11: 64 MiB).
const FLOOD_GROWTH_KIB: u64 = 64 * 1024;
/// What the big floods send: 4 GiB, as the issue names, unless
/// `PPP_TEST_FLOOD_BYTES` says otherwise (a smaller flood is enough to see
/// the unfixed proxy fail; the tunnel here carries ~16 MB/s).
fn flood_bytes() -> u64 {
    std::env::var("PPP_TEST_FLOOD_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(4 << 30)
}

/// What [`flood`] saw.
struct Flood {
    out: std::process::Output,
    /// mitmdump's peak RSS during the flood minus its RSS before, in KiB.
    growth_kib: u64,
    /// Whether the watch stopped the flood because mitmdump grew too much.
    stopped: bool,
    /// The other sandbox's requests during the flood: HTTP codes.
    probes: Vec<String>,
}

impl Flood {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    /// mitmdump stayed within its bound and blue worked all along.
    fn assert_bounded(&self, what: &str) {
        assert!(
            !self.stopped && self.growth_kib <= FLOOD_GROWTH_KIB,
            "{what}: mitmdump grew by {} MiB (limit {} MiB){}",
            self.growth_kib / 1024,
            FLOOD_GROWTH_KIB / 1024,
            if self.stopped { "; the flood was stopped there" } else { "" }
        );
        assert!(!self.probes.is_empty(), "{what}: the other sandbox was never probed");
        assert!(
            self.probes.iter().all(|c| c == "200"),
            "{what}: the other sandbox failed during the flood: {:?}",
            self.probes
        );
        eprintln!("{what}: mitmdump grew by {} KiB; {} probes by blue, all 200", self.growth_kib, self.probes.len());
    }
}

/// Blue may reach the upstream (its answers for api.anthropic.com live at
/// the test's non-public address), so it can show it keeps working.
fn blue_reaches_upstream(rig: &Rig) {
    rig.daemon.ok(&["policy", "allow", "network", "--sandbox", "blue", "198.18.0.10"]);
    let (body, code) = probe(&rig.guests[1]);
    assert_eq!(code, "200", "blue works before the flood: {body}");
}

fn probe(g: &Guest) -> (String, String) {
    curl(g, &["--resolve", &resolve("api.anthropic.com", 80), "http://api.anthropic.com/probe"])
}

/// Run `argv` in red (the attacker) while watching mitmdump's memory and
/// probing blue. The flood is killed if mitmdump grows past the bound (so
/// a run of the unfixed proxy fails instead of eating the machine's memory)
/// or runs past `timeout`.
fn flood(rig: &Rig, argv: &[&str], timeout: Duration) -> Flood {
    use std::sync::atomic::{AtomicBool, Ordering};
    let pid = u32::try_from(rig.daemon.status()["mitmdump_pid"].as_u64().unwrap()).unwrap();
    let (before, _) = netns::memory_kib(pid);
    netns::reset_peak(pid);
    let mut child = rig.guests[0].spawn(argv);
    let done = AtomicBool::new(false);
    let started = std::time::Instant::now();
    let (stopped, probes) = std::thread::scope(|s| {
        let prober = s.spawn(|| {
            let mut codes = Vec::new();
            while !done.load(Ordering::Relaxed) {
                codes.push(probe(&rig.guests[1]).1);
                std::thread::sleep(Duration::from_millis(250));
            }
            codes
        });
        let mut stopped = false;
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            let (rss, _) = netns::memory_kib(pid);
            if rss > before + FLOOD_GROWTH_KIB {
                stopped = true;
                let _ = child.kill();
                break;
            }
            if started.elapsed() > timeout {
                let _ = child.kill();
                done.store(true, Ordering::Relaxed);
                panic!("`{}` ran longer than {timeout:?}", argv.join(" "));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        done.store(true, Ordering::Relaxed);
        (stopped, prober.join().unwrap())
    });
    let out = child.wait_with_output().unwrap();
    let (_, peak) = netns::memory_kib(pid);
    eprintln!("`{}` took {:.1} s", argv.join(" "), started.elapsed().as_secs_f64());
    Flood { out, growth_kib: peak.saturating_sub(before), stopped, probes }
}

fn python() -> String {
    netns::venv_python().display().to_string()
}

/// Issue 11, point 4: `head -c 4G /dev/zero | curl -T - http://<any>/`, a
/// chunked upload of 4 GiB, to an allowed host (over the 1 MiB request
/// limit) and to a refused one. Neither is buffered: mitmdump stays within
/// its bound, the upload is cut off (the upstream never receives a whole
/// body), and the other sandbox keeps working meanwhile.
#[test]
fn a_4_gib_chunked_upload_does_not_grow_mitmdump() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    // The refused host's address is one red has no rule for; nothing serves it.
    for (host, ip, path) in
        [("echo.test", "198.18.0.10", "/upload-allowed"), ("refused-upload.test", "198.18.0.99", "/upload-refused")]
    {
        // The proxy closes the connection; the guest's side sees no reset
        // (see docs/addon.md), so curl stops at its own timeout.
        let cmd = format!(
            "head -c {} /dev/zero | curl -sS -m 30 -o /dev/null -w '%{{http_code}}' -T - \
             --resolve {host}:80:{ip} http://{host}{path}",
            flood_bytes()
        );
        let f = flood(&rig, &["sh", "-c", &cmd], Duration::from_secs(900));
        f.assert_bounded(&format!("a chunked upload to {host}"));
        assert_ne!(f.stdout(), "200", "the upload to {host} was cut off: {}", describe(&f.out));
        assert!(
            !rig.upstream.requests().iter().any(|r| r["path"] == path),
            "a whole body reached the upstream: {:?}",
            rig.upstream.requests()
        );
    }
    wait_until("both refusals in flows.jsonl", netns::DEADLINE, || {
        let flows = rig.daemon.flows();
        flows.iter().any(|f| {
            f["host"] == "echo.test"
                && f["status"] == 413
                && f["reason"].as_str().is_some_and(|r| r.contains("request body exceeds"))
        }) && flows.iter().any(|f| f["host"] == "refused-upload.test" && f["status"] == 403 && f["decision"] == "deny")
    });
}

/// Issue 11, point 4: a 4 GiB chunked download streams through to the
/// guest whole (no response limit by default, issue 12), and mitmdump holds
/// none of it: memory stays within the bound, the other sandbox works.
#[test]
fn a_4_gib_chunked_download_streams_through_with_bounded_memory() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    let bytes = flood_bytes();
    let url = format!("http://echo.test/chunked/{bytes}");
    let resolve = resolve("echo.test", 80);
    let argv = [
        "curl",
        "-sS",
        "-m",
        "900",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_download} %{speed_download}",
        "--resolve",
        &resolve,
        &url,
    ];
    let f = flood(&rig, &argv, Duration::from_secs(900));
    f.assert_bounded("a 4 GiB chunked download");
    let out = f.stdout();
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields.first().copied(), Some("200"), "{}", describe(&f.out));
    assert_eq!(fields.get(1).copied(), Some(bytes.to_string().as_str()), "the whole body arrived");
    eprintln!("download throughput: {} MB/s", fields[2].parse::<f64>().unwrap_or(0.0) / 1e6);
    wait_until("the download in flows.jsonl", netns::DEADLINE, || {
        rig.daemon.flows().iter().any(|f| f["host"] == "echo.test" && f["bytes_in"] == bytes)
    });
}

/// Issue 11, point 4: 4 GiB over one WebSocket, in 1 MiB messages. The
/// stream works end to end (the upstream counts every byte and answers a
/// text message), and mitmdump keeps none of the messages.
#[test]
fn a_4_gib_websocket_stream_does_not_grow_mitmdump() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    let script = netns::flood_script();
    let bytes = flood_bytes();
    let (total, msg) = (bytes.to_string(), (1u32 << 20).to_string());
    let ip = UPSTREAM_IP.to_string();
    let argv = [python(), script.display().to_string(), "ws".into(), ip, "echo.test".into(), total, msg];
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let f = flood(&rig, &argv, Duration::from_secs(900));
    f.assert_bounded("a 4 GiB WebSocket stream");
    let out: Value = serde_json::from_str(&f.stdout()).unwrap_or_else(|_| panic!("{}", describe(&f.out)));
    assert_eq!(out["reply"]["echo"], "done", "{out}");
    assert_eq!(out["reply"]["bytes"], bytes, "every byte went through: {out}");
    wait_until("the WebSocket's line in flows.jsonl", netns::DEADLINE, || {
        rig.daemon.flows().iter().any(|f| f["kind"] == "websocket" && f["bytes_out"].as_u64() >= Some(bytes))
    });
}

/// Issue 12: a WebSocket as agents use one (remote control, realtime
/// APIs): a ping answered by a pong, and large messages both ways, through
/// the real tunnel, each arriving whole.
#[test]
fn a_websocket_carries_pings_and_large_messages_both_ways() {
    netns::require_env();
    let rig = rig();
    let ip = UPSTREAM_IP.to_string();
    let (up, down) = (8u64 << 20, 12u64 << 20);
    let (got, all) =
        agent_client(&rig.guests[0], &["ws", &ip, "80", "echo.test", "-", &up.to_string(), &down.to_string()]);
    assert_eq!(got["pong"], "are you there", "{all}");
    assert_eq!(got["down"], down, "the large message down arrived whole: {all}");
    assert_eq!(got["echo"]["bytes"], up, "the large message up arrived whole: {all}");
    assert_eq!(got["echo"]["echo"], format!("big {down}"), "{all}");
}

/// Issue 11, point 4: 20 requests with 11 MB of headers each. Today they
/// grew mitmdump by 250 MB and went upstream; now each is refused (431, or
/// closed) once its header block passes 64 KiB, and nothing reaches the
/// upstream.
#[test]
fn huge_header_blocks_are_refused_before_they_are_buffered() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    let script = netns::flood_script();
    let ip = UPSTREAM_IP.to_string();
    let argv = [python(), script.display().to_string(), "headers".into(), ip, "echo.test".into()];
    let mut argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    argv.extend(["11000000", "20"]);
    let f = flood(&rig, &argv, Duration::from_secs(600));
    f.assert_bounded("20 requests with 11 MB of headers");
    let out: Value = serde_json::from_str(&f.stdout()).unwrap_or_else(|_| panic!("{}", describe(&f.out)));
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), 20, "{out}");
    for r in results {
        let r = r.as_str().unwrap();
        assert!(r.starts_with("HTTP/1.1 431") || r == "closed", "a huge header block was answered {r:?}");
    }
    assert!(results.iter().any(|r| r.as_str().unwrap().starts_with("HTTP/1.1 431")), "none said why: {out}");
    let reached: Vec<Value> = rig
        .upstream
        .requests()
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with("/big-headers")))
        .collect();
    assert!(reached.is_empty(), "{} huge requests reached the upstream", reached.len());
    // A normal request on a new connection still works.
    let (body, code) = curl(&rig.guests[0], &["--resolve", &resolve("echo.test", 80), "http://echo.test/after"]);
    assert_eq!(code, "200", "{body}");
}

/// Issue 11, points 3 and 4: 20,000 distinct refused DNS names from one
/// guest. mitmdump's caches stay bounded, the refusals are logged
/// throttled (not one line per query), a query sent to port 5353 is logged
/// with port 5353, and the other sandbox keeps working.
#[test]
fn a_flood_of_refused_dns_names_is_bounded_and_logged_throttled() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    let d = &rig.daemon;
    let out = rig.guests[0].run(&["dig", "+time=3", "+tries=1", "-p", "5353", "@10.0.0.53", "mdns.flood.test", "A"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("status: REFUSED"), "{}", describe(&out));
    wait_until("the 5353 refusal in flows.jsonl", netns::DEADLINE, || {
        d.flows().iter().any(|f| f["host"] == "mdns.flood.test" && f["port"] == 5353)
    });
    let lines_before = d.flows().len();
    let script = netns::flood_script();
    let argv = [python(), script.display().to_string(), "dns".into(), "10.0.0.53".into(), "53".into()];
    let mut argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    argv.extend(["n", "20000"]);
    // A tighter bound than the big floods: 20,000 names at the 1.8 KB
    // each they cost before are 35 MiB.
    let f = flood(&rig, &argv, Duration::from_secs(300));
    assert!(f.out.status.success(), "{}", describe(&f.out));
    f.assert_bounded("20,000 refused DNS names");
    assert!(f.growth_kib <= 16 * 1024, "mitmdump grew by {} KiB for 20,000 names", f.growth_kib);
    // The last queries are in by the time a query after them is answered.
    let out = rig.guests[0].run(&["dig", "+time=3", "+tries=1", "@10.0.0.53", "last.flood.test", "A"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("status: REFUSED"), "{}", describe(&out));
    let logged = d.flows().len() - lines_before;
    assert!(logged <= 2 * 120 + 10, "{logged} lines in flows.jsonl for 20,000 refused queries");
    let carried: u64 = d.flows().iter().filter_map(|f| f["suppressed"].as_u64()).sum();
    eprintln!("{logged} lines logged; {carried} refusals counted as suppressed so far");
}

/// An HTTP/2 request says it has a body only by not ending its stream with
/// its HEADERS: a GET with no Content-Length whose body streams on, sent
/// where ppp refuses it at the request (SNI of an allowed name, `Host` of
/// another). mitmproxy reads a refused request's whole body before it
/// answers; ppp fails the stream past 64 KiB instead of buffering 256 MiB.
#[test]
fn a_refused_http2_request_cannot_make_mitmdump_buffer_its_body() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    let ca = rig.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
    let cmd = format!(
        "head -c 256M /dev/zero | curl -sS -m 40 --http2 --cacert {ca} --resolve {resolve} \
         -H 'Host: attacker.test' -X GET -T - -o /dev/null -w '%{{http_version}} %{{http_code}}' https://echo.test/get-with-body",
        ca = ca.display(),
        resolve = resolve("echo.test", 443),
    );
    let f = flood(&rig, &["sh", "-c", &cmd], Duration::from_secs(120));
    eprintln!("curl: {}", describe(&f.out));
    f.assert_bounded("a 256 MiB body on a refused HTTP/2 GET");
    // 413 on the stream; curl then waits for window to send the rest, which
    // never comes, until its own -m.
    assert_eq!(f.stdout(), "2 413", "HTTP/2, and refused as too large: {}", describe(&f.out));
    assert!(
        !rig.upstream.requests().iter().any(|r| r["path"] == "/get-with-body"),
        "the refused request reached the upstream"
    );
}

/// Make the upstream's DNS server never answer `names`: a lookup of one
/// waits until the asker gives up.
fn silence(upstream: &Upstream, names: &[String]) {
    let mut zone: serde_json::Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(&upstream.zone).unwrap()).unwrap();
    for n in names {
        zone.insert(n.clone(), "drop".into());
    }
    let tmp = upstream.zone.with_extension("tmp");
    std::fs::write(&tmp, Value::Object(zone).to_string()).unwrap();
    std::fs::rename(tmp, &upstream.zone).unwrap();
}

/// A name the guest pinned itself (`--resolve`) costs the daemon a host
/// lookup, up to 750 ms when the name's DNS never answers. Red, under a
/// wildcard rule, opens 20 connections at once to such names: each waits
/// for its own lookup, and blue's request, made while they wait, completes
/// without waiting for them (ADR 0023). An ordering check: red's requests
/// are still pending when blue's is answered.
#[test]
fn names_that_never_resolve_stall_only_their_own_flows() {
    netns::require_env();
    let rig = rig();
    let d = &rig.daemon;
    d.ok(&["policy", "allow", "network", "--sandbox", "red", "*.silent.test"]);
    // Last, so blue's verdict is cached: blue's request needs no daemon.
    blue_reaches_upstream(&rig);
    let names: Vec<String> = (0..20).map(|i| format!("n{i}.silent.test")).collect();
    silence(&rig.upstream, &names);
    let mut red: Vec<Child> = names
        .iter()
        .map(|n| {
            let (pin, url) = (resolve(n, 80), format!("http://{n}/stalled"));
            rig.guests[0].spawn(&[
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-m",
                "120",
                "--resolve",
                &pin,
                &url,
            ])
        })
        .collect();
    wait_until("the daemon's first lookup of one of red's names", netns::DEADLINE, || {
        rig.upstream.dns_queries().iter().any(|q| q["name"].as_str().is_some_and(|n| n.ends_with(".silent.test")))
    });
    let (body, code) = curl(
        &rig.guests[1],
        &["-m", "120", "--resolve", &resolve("api.anthropic.com", 80), "http://api.anthropic.com/meanwhile"],
    );
    let pending = red.iter_mut().map(|c| c.try_wait().unwrap()).filter(Option::is_none).count();
    eprintln!("{pending} of red's {} requests still pending when blue's was answered", names.len());
    assert_eq!(code, "200", "blue's request: {body}");
    assert!(
        pending >= names.len() / 2,
        "blue's request waited for red's lookups: only {pending} of red's {} requests were still pending when it was answered",
        names.len()
    );
    for c in red {
        let out = c.wait_with_output().unwrap();
        // Refused: the names do not resolve to the address red chose.
        assert_eq!(String::from_utf8_lossy(&out.stdout), "403", "{}", describe(&out));
    }
    wait_until("each of red's refusals in flows.jsonl", netns::DEADLINE, || {
        d.flows().iter().filter(|f| f["sandbox"] == "red" && f["path"] == "/stalled").count() == names.len()
    });
}

/// Issue 11, point 4: datagrams as fast as the guest sends them, to ppp's
/// resolver and to a UDP service the policy allows. `mitmproxy_rs` queues a
/// UDP flow's datagrams until Python reads them, with no limit of its own,
/// and one Python loop reads fewer than a guest can send: mitmdump must
/// stay bounded anyway, and the other sandbox keep working.
#[test]
fn a_udp_flood_at_full_speed_is_bounded() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    rig.daemon.ok(&["policy", "allow", "network", "--sandbox", "red", "198.18.0.10:9999"]);
    let script = netns::flood_script().display().to_string();
    let py = python();
    for (ip, port) in [("10.0.0.53", "53"), ("198.18.0.10", "9999")] {
        let f = flood(&rig, &[&py, &script, "udp", ip, port, "10", "1200"], Duration::from_secs(120));
        eprintln!("{}", f.stdout());
        f.assert_bounded(&format!("a UDP flood to {ip}:{port}"));
    }
}

/// A guest that opens TCP connections and sends nothing (mitmproxy keeps
/// each for 10 minutes) gets at most `HELD_MAX` (256) of them open at once:
/// they have no upstream, so past it the oldest is closed and the closing
/// logged (issue 22, point 4; `MAX_CONNECTIONS`, 1,024, bounds those with
/// an upstream too). Once it closes them, it has room again, and the other
/// sandbox works throughout.
#[test]
fn a_guest_cannot_hoard_connections() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    let script = netns::flood_script().display().to_string();
    let py = python();
    let f = flood(&rig, &[&py, &script, "conns", "198.18.0.10", "80", "1100", "256"], Duration::from_secs(300));
    f.assert_bounded("1,100 idle TCP connections");
    let out: Value = serde_json::from_str(f.stdout().trim())
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&f.out.stderr)));
    assert_eq!(out["failed"], 0, "{out}");
    assert_eq!((out["held"].as_u64(), out["closed"].as_u64()), (Some(256), Some(844)), "{out}");
    assert!(out["after"].as_str().unwrap_or("").starts_with("HTTP/1.1 200"), "room again after closing: {out}");
    let refused: Vec<_> = rig
        .daemon
        .flows()
        .into_iter()
        .filter(|f| {
            f["reason"].as_str().is_some_and(|r| r.starts_with("more than 256 TCP connections with no upstream"))
        })
        .collect();
    assert_eq!(refused.len(), 1, "one line per address and minute: {refused:?}");
    assert_eq!((refused[0]["sandbox"].as_str(), refused[0]["port"].as_u64()), (Some("red"), Some(80)));
}

/// Blue's request latency (seconds, curl's `time_total`) over `n` requests.
fn latencies(g: &Guest, n: usize) -> Vec<f64> {
    let mut out: Vec<f64> = (0..n)
        .map(|_| {
            let o = g.curl(&[
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{time_total}",
                "--resolve",
                &resolve("api.anthropic.com", 80),
                "http://api.anthropic.com/latency",
            ]);
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let (code, t) = text.split_once(' ').unwrap_or(("", ""));
            assert_eq!(code, "200", "blue's request failed: {}", describe(&o));
            t.trim().parse().unwrap()
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

/// The `percent`th percentile of `sorted` (nearest rank).
fn pct(sorted: &[f64], percent: usize) -> f64 {
    sorted[(sorted.len() - 1) * percent / 100]
}

/// A benchmark, not a test (no timed assertion): blue's latency idle and
/// while red floods the proxy (a chunked download at full speed plus
/// refused DNS names), as ratios. Run by `bench/flood-latency.sh`.
#[test]
#[ignore = "a benchmark: run bench/flood-latency.sh"]
fn bench_other_sandbox_latency_under_a_flood() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    let n: usize = std::env::var("REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let kinds = std::env::var("FLOOD").unwrap_or_else(|_| "download,dns".to_owned());
    let blue = &rig.guests[1];
    let script = netns::flood_script().display().to_string();
    let py = python();
    let resolve_echo = resolve("echo.test", 80);
    let url = format!("http://echo.test/chunked/{}", 64u64 << 30);
    let mut ratios = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let idle = latencies(blue, n);
        let mut floods = Vec::new();
        if kinds.contains("download") {
            // FLOOD_RATE (curl's --limit-rate, e.g. 20M) shows how latency
            // follows the flood's speed; unset, the flood runs at full speed.
            let rate = std::env::var("FLOOD_RATE").unwrap_or_else(|_| "0".to_owned());
            floods.push(rig.guests[0].spawn(&[
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "flood %{speed_download} B/s\n",
                "--limit-rate",
                &rate,
                "--resolve",
                &resolve_echo,
                &url,
            ]));
        }
        if kinds.contains("dns") {
            let prefix = format!("b{round}-");
            floods.push(rig.guests[0].spawn(&[&py, &script, "dns", "10.0.0.53", "53", &prefix, "1000000"]));
        }
        std::thread::sleep(Duration::from_secs(2)); // the flood at full speed
        let busy = latencies(blue, n);
        for c in &mut floods {
            let _ = c.kill();
            let _ = c.wait();
        }
        let (r50, r90) = (pct(&busy, 50) / pct(&idle, 50), pct(&busy, 90) / pct(&idle, 90));
        println!(
            "round {round}: idle p50 {:.1} ms p90 {:.1} ms; flooded p50 {:.1} ms p90 {:.1} ms; ratio p50 {r50:.2} p90 {r90:.2}",
            pct(&idle, 50) * 1e3,
            pct(&idle, 90) * 1e3,
            pct(&busy, 50) * 1e3,
            pct(&busy, 90) * 1e3
        );
        ratios.0.push(r50);
        ratios.1.push(r90);
    }
    ratios.0.sort_by(f64::total_cmp);
    ratios.1.sort_by(f64::total_cmp);
    println!(
        "median of {rounds} rounds: flooded/idle latency p50 {:.2}, p90 {:.2} (goal <= 2.00)",
        pct(&ratios.0, 50),
        pct(&ratios.1, 50)
    );
}

/// `tests/support/agent_clients.py MODE ARGS` in guest `g` with the venv's
/// python (it needs `h2`); its JSON, and the whole output for messages.
fn agent_client(g: &Guest, args: &[&str]) -> (Value, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/agent_clients.py");
    let (py, script) = (python(), script.display().to_string());
    let mut cmd = vec![py.as_str(), script.as_str()];
    cmd.extend_from_slice(args);
    let out = g.run(&cmd);
    let v = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap_or(Value::Null);
    (v, describe(&out))
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest as _;
    format!("{:x}", sha2::Sha256::digest(s.as_bytes()))
}

/// Issue 12: SSE from the LLM API itself, whose key ppp injects (so the
/// response is scrubbed for the key as it streams). The server sends event
/// 2 only once the test has read event 1: a proxy that holds an event back
/// until more bytes come never hands event 1 over, and curl gives up.
#[test]
fn sse_events_arrive_one_by_one_when_a_key_is_injected() {
    netns::require_env();
    let rig = rig();
    let servers = AgentServers::start(&rig.topo);
    let red = &rig.guests[0];
    let ca = rig.daemon.data().join("mitmproxy/mitmproxy-ca-cert.pem");
    let mut sse = Command::new("ip")
        .args(["netns", "exec", &red.ns, "curl", "-sS", "-N", "-m", "20", "--cacert"])
        .arg(&ca)
        .args(["--resolve", &format!("api.anthropic.com:8443:{UPSTREAM_IP}")])
        .args(["-H", "x-api-key: ppp-proxy-managed"])
        .arg("https://api.anthropic.com:8443/sse?n=3&gate=key-sse-gate")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut events = std::io::BufReader::new(sse.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut events, &mut line).unwrap();
    std::fs::write(servers.dir.join("key-sse-gate"), "").unwrap();
    assert_eq!(
        line.trim(),
        "data: 1",
        "event 1 never reached the guest while the stream was open (the upstream sends event 2 only after it)"
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut events, &mut rest).unwrap();
    assert!(sse.wait().unwrap().success());
    assert!(rest.contains("data: 3"), "{rest}");
}

/// Issue 12: an SSE stream (MCP over SSE, remote control) that stays silent
/// for 6 minutes, then sends an event. Nothing on the way (mitmproxy, its
/// userspace TCP, the WireGuard session, which rekeys every 2 minutes) may
/// drop it. curl sends no TCP keep-alives, so the connection is really
/// idle. `PPP_TEST_SSE_IDLE` (seconds) shortens it while developing.
#[test]
fn an_sse_stream_idle_for_six_minutes_still_delivers() {
    netns::require_env();
    let idle: u64 = std::env::var("PPP_TEST_SSE_IDLE").ok().and_then(|v| v.parse().ok()).unwrap_or(360);
    let rig = rig();
    let servers = AgentServers::start(&rig.topo);
    let red = &rig.guests[0];
    let ca = rig.daemon.data().join("mitmproxy/mitmproxy-ca-cert.pem");
    let mut sse = Command::new("ip")
        .args(["netns", "exec", &red.ns, "curl", "-sS", "-N", "--no-keepalive", "-m"])
        .arg((idle + 60).to_string())
        .arg("--cacert")
        .arg(&ca)
        .args(["--resolve", &format!("echo.test:8443:{UPSTREAM_IP}")])
        .arg(format!("https://echo.test:8443/sse-idle?idle={idle}&tag=idle"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut events = std::io::BufReader::new(sse.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut events, &mut line).unwrap();
    assert_eq!(line.trim(), "data: hello");
    assert!(!servers.dir.join("idle-resumed").exists(), "the first event arrived only after the silence");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut events, &mut rest).unwrap();
    let out = sse.wait_with_output().unwrap();
    assert!(servers.dir.join("idle-resumed").exists(), "the upstream never ended its silence: {}", describe(&out));
    assert!(
        rest.contains("data: after-idle"),
        "the event after {idle} s of silence never arrived: {rest:?}; {}\nproxy.log:\n{}",
        describe(&out),
        std::fs::read_to_string(rig.daemon.data().join("proxy.log")).unwrap_or_default()
    );
    assert!(out.status.success(), "{}", describe(&out));
}

/// Issue 12: HTTP/2 to the upstream (an h2-only server), and a gRPC-style
/// bidirectional stream: each message goes out only once the echo of the
/// one before came back, so it works only if the request streams upstream
/// while the response streams back; trailers end it. The key is injected
/// on both.
#[test]
fn http2_to_the_upstream_and_grpc_style_bidirectional_streaming() {
    netns::require_env();
    let rig = rig();
    let servers = AgentServers::start(&rig.topo);
    let red = &rig.guests[0];
    let ca = rig.daemon.data().join("mitmproxy/mitmproxy-ca-cert.pem");
    let ca = ca.to_str().unwrap();
    let ip = UPSTREAM_IP.to_string();
    let key = sha256_hex(KEY);
    let err = || std::fs::read_to_string(servers.dir.join("servers.err")).unwrap_or_default();

    let (got, all) = agent_client(red, &["h2-get", &ip, "8444", "api.anthropic.com", ca, "/h2"]);
    assert_eq!((got["alpn"].as_str(), got["status"].as_str()), (Some("h2"), Some("200")), "{all}\n{}", err());
    let body: Value = serde_json::from_str(got["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["protocol"], "h2", "the upstream was reached over HTTP/2: {body}");
    assert_eq!(body["key_sha256"], key.as_str(), "the key was injected: {body}");

    // First to a host ppp injects nothing into (what mitmproxy itself
    // carries), then to the LLM API, whose key goes in and whose response
    // is scrubbed for it as it streams.
    for host in ["echo.test", "api.anthropic.com"] {
        let (got, all) = agent_client(red, &["h2-bidi", &ip, "8444", host, ca, "5"]);
        assert!(got["error"].is_null(), "{host}: {all}\nservers.err:\n{}", err());
        let want: Vec<String> = (1..=5).map(|i| format!("ping {i}")).collect();
        assert_eq!(got["echoes"], serde_json::json!(want), "{host}: {all}");
        assert_eq!(got["trailers"]["grpc-status"], "0", "{host}: the trailers reached the guest: {all}");
        if host == "api.anthropic.com" {
            assert_eq!(got["headers"]["x-key-sha256"], key.as_str(), "the key was injected: {all}");
        }
    }
}

/// The attack on mitmproxy's HTTP/2 send buffers: a guest that keeps its
/// own receive window at 0 on a /bidi stream (the upstream echoes what it
/// gets) and pushes data up for 45 s. mitmproxy 12.2.3 queues what it may
/// not send (`BufferedH2Connection.stream_buffers`) with no limit of its
/// own; here TCP backpressure further along stalls the sender after a few
/// MB (docs/addon.md, known gaps). A guard: mitmdump stays bounded, and
/// the other sandbox keeps working.
#[test]
fn an_http2_client_that_never_reads_cannot_grow_mitmdump() {
    netns::require_env();
    let rig = rig();
    blue_reaches_upstream(&rig);
    let _servers = AgentServers::start(&rig.topo);
    let ca = rig.daemon.data().join("mitmproxy/mitmproxy-ca-cert.pem");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/agent_clients.py");
    let (py, script, ip) = (python(), script.display().to_string(), UPSTREAM_IP.to_string());
    let total = (flood_bytes() / 4).to_string();
    let argv = [py.as_str(), &script, "h2-hog", &ip, "8444", "echo.test", ca.to_str().unwrap(), &total, "45"];
    let f = flood(&rig, &argv, Duration::from_secs(120));
    eprintln!("{}", f.stdout());
    f.assert_bounded("an HTTP/2 stream whose client never reads");
}

/// Where the benchmark's bare mitmdump listens, and the host's own
/// wireguard-go (the "wireguard-go alone" path).
const BENCH_BARE: u16 = 51830;
const BENCH_WG: u16 = 51899;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Put every thread of `pid` on `cpus` (a taskset list).
fn pin(pid: u32, cpus: &str) {
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let tid = t.file_name().to_string_lossy().into_owned();
        netns::run(&["taskset", "-p", "-c", cpus, &tid]);
    }
}

/// `wg ...` with stdin, for keys.
fn wg_key(args: &[&str], stdin: &str) -> String {
    use std::io::Write as _;
    let mut c = Command::new("wg").args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "wg {args:?}: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Point guest `g`'s wg0 at another server (the peer is replaced, so the
/// next packet makes a fresh handshake), and wait for the handshake.
fn repoint(g: &Guest, dir: &Path, private_key: &str, server_public_key: &str, port: u16) {
    let f = dir.join(format!("repoint-{port}.setconf"));
    std::fs::write(
        &f,
        format!(
            "[Interface]\nPrivateKey = {private_key}\n\n[Peer]\nPublicKey = {server_public_key}\n\
             AllowedIPs = 0.0.0.0/0\nEndpoint = {}:{port}\n",
            g.endpoint
        ),
    )
    .unwrap();
    let out = g.wg_cmd(&["setconf", "wg0", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(g.handshake_within(netns::DEADLINE), "guest {} got no handshake on port {port}", g.index);
}

/// wireguard-go as the host's end of a plain tunnel (no proxy): the host
/// namespace routes what comes out of it to the upstream. Killed on drop.
struct HostWireguard {
    child: Child,
    public_key: String,
}

impl HostWireguard {
    fn start(topo: &netns::Topology, guest_public_key: &str, guest_ip: Ipv4Addr) -> Self {
        let h = topo.host_ns();
        let child = Command::new("ip")
            .args(["netns", "exec", &h, "sh", "-c"])
            .arg(format!("mount -t tmpfs {}-hwg /run/wireguard && exec wireguard-go -f wgb", topo.prefix))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        let wg = |args: &[&str]| {
            let mut full = vec!["nsenter", "-t", pid.as_str(), "-m", "-n", "wg"];
            full.extend_from_slice(args);
            netns::run(&full)
        };
        wait_until("the host's wireguard-go", netns::DEADLINE, || wg(&["show", "wgb"]).status.success());
        let private_key = wg_key(&["genkey"], "");
        let public_key = wg_key(&["pubkey"], &private_key);
        let f = topo.path().join("wgb.setconf");
        std::fs::write(
            &f,
            format!(
                "[Interface]\nPrivateKey = {private_key}\nListenPort = {BENCH_WG}\n\n[Peer]\n\
                 PublicKey = {guest_public_key}\nAllowedIPs = {guest_ip}/32\n"
            ),
        )
        .unwrap();
        let out = wg(&["setconf", "wgb", f.to_str().unwrap()]);
        assert!(out.status.success(), "{}", describe(&out));
        netns::run_ok(&["ip", "-n", &h, "addr", "add", "10.0.0.254/32", "dev", "wgb"]);
        netns::run_ok(&["ip", "-n", &h, "link", "set", "wgb", "mtu", "1420", "up"]);
        netns::run_ok(&["ip", "-n", &h, "route", "add", &format!("{guest_ip}/32"), "dev", "wgb"]);
        // The upstream's replies to the tunnel's inner addresses.
        netns::run_ok(&["ip", "-n", &topo.upstream_ns(), "route", "add", "10.0.0.0/24", "via", "10.251.0.1"]);
        HostWireguard { child, public_key }
    }
}

impl Drop for HostWireguard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one path (ppp, bare mitmdump, ...) did in one round.
#[derive(Default, Clone)]
struct PathRun {
    /// Per-event SSE latency, ms, sorted.
    sse: Vec<f64>,
    sse_first: f64,
    down_mbs: f64,
    down_growth_kib: u64,
    up_mbs: f64,
    up_growth_kib: u64,
}

/// mitmdump's peak RSS growth while `f` runs (KiB), when there is one.
fn growth<T>(pid: Option<u32>, f: impl FnOnce() -> T) -> (T, u64) {
    let before = pid.map(|p| {
        let (rss, _) = netns::memory_kib(p);
        netns::reset_peak(p);
        rss
    });
    let out = f();
    let g = pid.zip(before).map_or(0, |(p, b)| netns::memory_kib(p).1.saturating_sub(b));
    (out, g)
}

/// An upload of `file` to the LLM API stand-in, with the placeholder key:
/// MB/s; the upstream must have received every byte, and `key` when given.
fn bench_upload(g: &Guest, ca: &str, file: &Path, sha: &str, key: Option<&str>) -> f64 {
    let resolve = format!("api.anthropic.com:8443:{UPSTREAM_IP}");
    let data = format!("@{}", file.display());
    let out = g.run(&[
        "curl",
        "-sS",
        "-m",
        "600",
        "--cacert",
        ca,
        "--resolve",
        &resolve,
        "-H",
        "x-api-key: ppp-proxy-managed",
        "-H",
        "content-type: application/json",
        "--data-binary",
        &data,
        "-w",
        "\n%{speed_upload}",
        "https://api.anthropic.com:8443/sink",
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, speed) = text.rsplit_once('\n').unwrap_or_default();
    let got: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("upload: {}", describe(&out)));
    assert_eq!(got["sha256"], sha, "the upstream received the whole body: {got}");
    if let Some(k) = key {
        assert_eq!(got["key_sha256"], sha256_hex(k).as_str(), "the key was injected: {got}");
    }
    speed.trim().parse::<f64>().unwrap() / 1e6
}

/// One /sse-ticks stream: per-event latencies (ms, in arrival order).
fn bench_sse(g: &Guest, ca: &str, n: usize, every_ms: u32) -> Vec<f64> {
    let path = format!("/sse-ticks?n={n}&every={}", f64::from(every_ms) / 1000.0);
    let ip = UPSTREAM_IP.to_string();
    let (got, all) = agent_client(g, &["sse", &ip, "8443", "api.anthropic.com", ca, &path]);
    let lat: Vec<f64> =
        got["lat_ms"].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
    assert_eq!(lat.len(), n, "every event arrived: {all}");
    lat
}

/// KiB as MiB, for printing.
fn mib(kib: u64) -> f64 {
    f64::from(u32::try_from(kib).unwrap_or(u32::MAX)) / 1024.0
}

/// One round of the benchmark: ppp, bare mitmdump, and the download's MB/s
/// with no proxy, direct and through wireguard-go alone.
struct Round {
    ppp: PathRun,
    bare: PathRun,
    direct: f64,
    wg_only: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    pct(&v, 50)
}

/// A benchmark, not a test (no timed assertion), for issue 12: the traffic
/// agents make, through ppp (real daemon, mitmdump with ppp's addon, red's
/// tunnel) and through bare mitmdump with no addon in the same WireGuard
/// mode and topology (guest 3), side by side in one run, in `ROUNDS`
/// interleaved rounds (ppp first, then bare first, ...): SSE latency from
/// the upstream's write to the guest's read, a big HTTPS download (MB/s,
/// mitmdump's RSS growth), and an upload to the LLM API with the key
/// injected. Each round also times the download with no proxy: routed by
/// the host namespace ("direct"), and through a plain wireguard-go tunnel
/// routed the same way ("wireguard-go alone"). Both mitmdumps run on the
/// last CPU, everything else on the others (`PIN=0` turns that off). Run
/// by `bench/agent-traffic.sh`, which prints the lines starting `bench:`.
#[test]
#[ignore = "a benchmark: run bench/agent-traffic.sh"]
fn bench_agent_traffic() {
    netns::require_env();
    let rounds: usize = env_or("ROUNDS", 3);
    let bytes: u64 = env_or("BYTES", 1 << 30);
    let upload: usize = env_or("UPLOAD_BYTES", 64 << 20);
    let (events, every_ms): (usize, u32) = (env_or("SSE_EVENTS", 100), env_or("SSE_EVERY_MS", 50));
    let ncpu = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let pinned = ncpu >= 2 && env_or("PIN", 1) == 1;
    let (mitm_cpu, rest_cpus) = ((ncpu - 1).to_string(), format!("0-{}", ncpu.saturating_sub(2)));
    if pinned {
        // Before anything starts, so that every process of the rig inherits it.
        pin(std::process::id(), &rest_cpus);
    }
    let rig = rig();
    let _servers = AgentServers::start(&rig.topo);
    let topo = &rig.topo;
    let up_ca = rig.upstream.ca_cert.display().to_string();
    let ppp_ca = rig.daemon.data().join("mitmproxy/mitmproxy-ca-cert.pem").display().to_string();
    let bare = netns::Mitmdump::start(
        topo,
        &[BENCH_BARE],
        &topo.path().join("bare-mitmproxy"),
        &["--set", &format!("ssl_verify_upstream_trusted_ca={up_ca}"), "--set", "stream_large_bodies=1"],
    );
    let bare_ca = bare.ca_cert().display().to_string();
    let bare_conf = bare.conf(BENCH_BARE).clone();
    let g3 = Guest::up(topo, 3, &bare_conf, BENCH_BARE);
    assert!(g3.handshake_within(netns::DEADLINE), "guest 3 got no handshake with bare mitmdump");
    let red = &rig.guests[0];
    let ppp_pid = u32::try_from(rig.daemon.status()["mitmdump_pid"].as_u64().unwrap()).unwrap();
    if pinned {
        pin(ppp_pid, &mitm_cpu);
        pin(bare.pid(), &mitm_cpu);
    }
    let hwg = HostWireguard::start(topo, &wg_key(&["pubkey"], &bare_conf.private_key), g3.inner_ip);
    let file = topo.path().join("conversation.json");
    let body: Vec<u8> = (0..upload).map(|i| b"abcdefghijklmnopqrstuvwxyz0123456789 "[i % 37]).collect();
    std::fs::write(&file, &body).unwrap();
    let sha = {
        use sha2::Digest as _;
        format!("{:x}", sha2::Sha256::digest(&body))
    };
    drop(body);

    println!(
        "bench: {rounds} rounds; download {} MiB, upload {} MiB, SSE {events} events every {every_ms} ms; \
         mitmdumps pinned: {pinned}",
        bytes >> 20,
        upload >> 20
    );
    let mut runs: Vec<Round> = Vec::new();
    for round in 0..rounds {
        // No proxy: the host namespace routes guest 3's packets, first from
        // its veth ("direct"), then out of a plain wireguard-go tunnel.
        topo.host_forwarding(true);
        g3.kill_switch_off();
        let g3ns = g3.ns.clone();
        netns::run_ok(&["ip", "-n", &g3ns, "route", "add", &format!("{UPSTREAM_IP}/32"), "via", "10.251.3.1"]);
        let direct = netns::bench_download(&g3, &up_ca, bytes);
        netns::run_ok(&["ip", "-n", &g3ns, "route", "del", &format!("{UPSTREAM_IP}/32")]);
        repoint(&g3, topo.path(), &bare_conf.private_key, &hwg.public_key, BENCH_WG);
        let wg_only = netns::bench_download(&g3, &up_ca, bytes);
        repoint(&g3, topo.path(), &bare_conf.private_key, &bare_conf.server_public_key, BENCH_BARE);
        g3.kill_switch_on();
        topo.host_forwarding(false);

        let measure = |g: &Guest, ca: &str, pid: u32, key: Option<&str>| {
            let mut sse = bench_sse(g, ca, events, every_ms);
            let sse_first = sse[0];
            sse.sort_by(f64::total_cmp);
            let (down_mbs, down_growth_kib) = growth(Some(pid), || netns::bench_download(g, ca, bytes));
            let (up_mbs, up_growth_kib) = growth(Some(pid), || bench_upload(g, ca, &file, &sha, key));
            PathRun { sse, sse_first, down_mbs, down_growth_kib, up_mbs, up_growth_kib }
        };
        let (p, b) = if round % 2 == 0 {
            let p = measure(red, &ppp_ca, ppp_pid, Some(KEY));
            (p, measure(&g3, &bare_ca, bare.pid(), None))
        } else {
            let b = measure(&g3, &bare_ca, bare.pid(), None);
            (measure(red, &ppp_ca, ppp_pid, Some(KEY)), b)
        };
        for (name, r) in [("ppp", &p), ("bare mitmdump", &b)] {
            println!(
                "bench: round {round} {name:<13}  SSE p50 {:6.2} ms p99 {:6.2} ms first {:6.2} ms | download {:6.1} MB/s \
                 RSS +{:6.1} MiB | upload {:6.1} MB/s RSS +{:6.1} MiB",
                pct(&r.sse, 50),
                pct(&r.sse, 99),
                r.sse_first,
                r.down_mbs,
                mib(r.down_growth_kib),
                r.up_mbs,
                mib(r.up_growth_kib)
            );
        }
        println!(
            "bench: round {round} no proxy       download direct {direct:6.1} MB/s, wireguard-go alone {wg_only:6.1} MB/s"
        );
        runs.push(Round { ppp: p, bare: b, direct, wg_only });
    }
    let med = |f: &dyn Fn(&Round) -> f64| median(runs.iter().map(f).collect());
    let add50 = med(&|r| pct(&r.ppp.sse, 50) - pct(&r.bare.sse, 50));
    let add99 = med(&|r| pct(&r.ppp.sse, 99) - pct(&r.bare.sse, 99));
    let first = med(&|r| r.ppp.sse_first);
    let first_bare = med(&|r| r.bare.sse_first);
    let down_ratio = med(&|r| r.ppp.down_mbs / r.bare.down_mbs);
    let up_ratio = med(&|r| r.ppp.up_mbs / r.bare.up_mbs);
    let kib = |v: &dyn Fn(&Round) -> u64| runs.iter().map(v).max().unwrap_or(0);
    let (down_g, down_g_bare) = (kib(&|r| r.ppp.down_growth_kib), kib(&|r| r.bare.down_growth_kib));
    let (up_g, up_g_bare) = (kib(&|r| r.ppp.up_growth_kib), kib(&|r| r.bare.up_growth_kib));
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("bench: medians of {rounds} rounds (ratios per round, then the median)");
    println!(
        "bench: SSE added latency ppp - bare: p50 {add50:+.2} ms, p99 {add99:+.2} ms (goal p99 <= 5 ms: {})",
        verdict(add99 <= 5.0)
    );
    println!(
        "bench: SSE first event after the upstream's write: ppp {first:.2} ms, bare {first_bare:.2} ms (goal <= 20 ms: {})",
        verdict(first <= 20.0)
    );
    println!(
        "bench: download: ppp {:.1} MB/s, bare {:.1} MB/s, ratio {down_ratio:.2} (goal >= 0.90: {}); \
         direct {:.1} MB/s, wireguard-go alone {:.1} MB/s",
        med(&|r| r.ppp.down_mbs),
        med(&|r| r.bare.down_mbs),
        verdict(down_ratio >= 0.90),
        med(&|r| r.direct),
        med(&|r| r.wg_only)
    );
    println!(
        "bench: download: mitmdump RSS growth, worst round: ppp {:.1} MiB, bare {:.1} MiB (goal <= 64 MiB: {})",
        mib(down_g),
        mib(down_g_bare),
        verdict(down_g <= 64 * 1024)
    );
    println!(
        "bench: upload with the key injected: ppp {:.1} MB/s, bare {:.1} MB/s, ratio {up_ratio:.2}; RSS growth, worst \
         round: ppp {:.1} MiB, bare {:.1} MiB (goal <= 64 MiB: {})",
        med(&|r| r.ppp.up_mbs),
        med(&|r| r.bare.up_mbs),
        mib(up_g),
        mib(up_g_bare),
        verdict(up_g <= 64 * 1024)
    );
}

/// Issue 22, point 1: deny wins over every name a resolution goes through.
/// Red may reach `**.example` but not `denied.example` nor `**.bad.example`.
/// Names whose answers lead there through aliases (one CNAME, two, a CNAME
/// spelled in upper case with a trailing dot, a chain that passes a denied
/// name and ends on an allowed one, a DNAME, a chain of 20) are refused by
/// ppp's resolver with the chain logged, and a flow the guest pins to the
/// address itself (`--resolve`, the host's own resolution) gets a 403, over
/// HTTP and TLS; an alias through allowed names only is answered, and an A
/// record for a denied name in the additional section never reaches the
/// guest. On main the aliases were answered with the denied host's address
/// and the pinned request got 200 from it.
#[test]
fn deny_wins_through_cname_and_dname_chains() {
    netns::require_env();
    let rig = rig();
    let (d, red, up) = (&rig.daemon, &rig.guests[0], &rig.upstream);
    d.ok(&["policy", "allow", "network", "--sandbox", "red", "**.example"]);
    d.ok(&["policy", "deny", "network", "--sandbox", "red", "denied.example,**.bad.example"]);
    let ip = UPSTREAM_IP.to_string();
    for n in ["denied.example", "final.example", "www.bad.example", "y.bad.example", "l20.example"] {
        up.set_zone(n, ip.clone().into());
    }
    let cname = |t: &str| serde_json::json!({ "cname": t });
    up.set_zone("alias.example", cname("denied.example"));
    up.set_zone("two.example", cname("hop.example"));
    up.set_zone("hop.example", cname("denied.example"));
    up.set_zone("caps.example", cname("DENIED.Example."));
    up.set_zone("via.example", cname("x.bad.example"));
    up.set_zone("x.bad.example", cname("final.example"));
    up.set_zone("glob.example", cname("y.bad.example"));
    up.set_zone("dn.example", serde_json::json!({ "dname": "bad.example" }));
    for i in 0..20 {
        up.set_zone(&format!("l{i}.example"), cname(&format!("l{}.example", i + 1)));
    }
    up.set_zone("ok.example", cname("final.example"));
    up.set_zone("extra.example", serde_json::json!({ "cname": "final.example", "additional": ["denied.example", ip] }));

    let refused = [
        ("alias.example", "denied.example"),
        ("two.example", "denied.example"),
        ("caps.example", "denied.example"),
        ("via.example", "x.bad.example"),
        ("glob.example", "y.bad.example"),
        ("www.dn.example", "www.bad.example"),
        ("l0.example", "more than 16 aliases"),
    ];
    for (name, why) in refused {
        let (text, out) = dig(red, name);
        assert!(text.contains("status: REFUSED"), "{name} must be refused: {}", describe(&out));
        assert!(!text.contains(&ip), "the denied host's address reached the guest for {name}: {text}");
        wait_until(&format!("the refusal of {name} in flows.jsonl"), netns::DEADLINE, || {
            d.flows().iter().any(|f| {
                f["host"] == name
                    && f["kind"] == "dns"
                    && f["decision"] == "deny"
                    && f["reason"].as_str().is_some_and(|r| r.contains(why))
                    && (why.starts_with("more") || f["chain"].as_array().is_some_and(|c| c.iter().any(|n| n == why)))
            })
        });
    }
    let (text, out) = dig(red, "ok.example");
    assert!(text.contains("status: NOERROR") && text.contains(&ip), "{}", describe(&out));
    let (text, out) = dig(red, "extra.example");
    assert!(text.contains("status: NOERROR") && text.contains("final.example"), "{}", describe(&out));
    assert!(!text.contains("ADDITIONAL SECTION") || !text.contains("denied.example.\t"), "{text}");

    // The guest pins the address itself: the daemon's own resolution of
    // the name finds the chain.
    let ca = rig.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
    for name in ["alias.example", "two.example", "via.example", "www.dn.example"] {
        let (body, code) = curl(red, &["--resolve", &resolve(name, 80), &format!("http://{name}/through-alias")]);
        assert_eq!(code, "403", "{name}: {body}");
        assert!(body.contains("alias of"), "{name}: {body}");
        let (_, code) = curl(
            red,
            &[
                "--cacert",
                ca.to_str().unwrap(),
                "--resolve",
                &resolve(name, 443),
                &format!("https://{name}/through-alias"),
            ],
        );
        assert_ne!(code, "200", "{name} over TLS");
    }
    assert!(
        !up.requests().iter().any(|r| r["path"] == "/through-alias"),
        "a request through an alias of a denied host reached it"
    );
    let logged = d.flows();
    assert!(
        logged.iter().any(|f| f["host"] == "two.example"
            && f["kind"] == "http"
            && f["chain"]
                .as_array()
                .is_some_and(|c| c.iter().any(|n| n == "hop.example") && c.iter().any(|n| n == "denied.example"))),
        "the chain is logged with the flow: {logged:?}"
    );
    let (body, code) = curl(red, &["--resolve", &resolve("ok.example", 80), "http://ok.example/fine"]);
    assert_eq!(code, "200", "an alias through allowed names works: {body}");
    // Internal addresses reached through an alias are still refused.
    up.set_zone("inner.example", cname("meta.example"));
    up.set_name("meta.example", Ipv4Addr::new(169, 254, 169, 254));
    let (text, out) = dig(red, "inner.example");
    assert!(text.contains("status: REFUSED") && !text.contains("169.254.169.254"), "{}", describe(&out));
}

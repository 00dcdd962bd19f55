//! Proof tests for the end-to-end harness, with bare mitmdump (no ppp addon):
//! guests in network namespaces reach an upstream only through mitmproxy over
//! WireGuard, the kill switch closes the bypass, the listen port is the
//! identity, and tear-down leaves nothing behind. Later e2e tests build on the
//! same fixtures (`tests/support/netns.rs`, described in `docs/harness.md`).

#[path = "support/netns.rs"]
mod netns;

use std::net::Ipv4Addr;
use std::time::Duration;

use netns::{
    Guest, HOST_UPSTREAM_IP, Mitmdump, Topology, UPSTREAM_IP, UPSTREAM_NAME, Upstream, describe, leftovers, wait_until,
};
use serde_json::Value;

const P1: u16 = 51820;
const P2: u16 = 51821;
const DEADLINE: Duration = netns::DEADLINE;

/// Everything one test runs. Fields drop in order: guests, mitmdump,
/// upstream, then the topology that deletes the namespaces.
struct Rig {
    guests: Vec<Guest>,
    mitm: Mitmdump,
    upstream: Upstream,
    topo: Topology,
}

/// A topology with one guest per entry of `guest_ports` (guest `i` uses the
/// keys of `ports[i]` and talks to `guest_ports[i]`), one mitmdump serving
/// `ports`, and the upstream. `extra` adds mitmdump arguments.
fn rig(ports: &[u16], guest_ports: &[u16], extra: impl FnOnce(&Topology, &Upstream) -> Vec<String>) -> Rig {
    let topo = Topology::new(u8::try_from(guest_ports.len()).unwrap());
    let upstream = Upstream::start(&topo);
    let extra = extra(&topo, &upstream);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mitm = Mitmdump::start(&topo, ports, &topo.path().join("confdir"), &extra);
    let guests = guest_ports
        .iter()
        .enumerate()
        .map(|(i, &port)| {
            let i = u8::try_from(i + 1).unwrap();
            Guest::up(&topo, i, mitm.conf(ports[usize::from(i) - 1]), port)
        })
        .collect();
    Rig { guests, mitm, upstream, topo }
}

fn no_extra(_: &Topology, _: &Upstream) -> Vec<String> {
    Vec::new()
}

/// curl in `g`, require success, parse the echo.
fn echo(rig: &Rig, g: &Guest, args: &[&str]) -> Value {
    let out = g.curl(args);
    assert!(out.status.success(), "curl {args:?} in {} failed: {}\n{}", g.ns, describe(&out), rig.mitm.logs());
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not an echo ({e}): {}", describe(&out)))
}

fn upstream_saw(rig: &Rig, path: &str) -> bool {
    rig.upstream.requests().iter().any(|r| r["path"] == path)
}

#[test]
fn two_guests_on_two_ports_reach_the_upstream_through_mitmproxy() {
    let rig = rig(&[P1, P2], &[P1, P2], no_extra);
    for g in &rig.guests {
        assert!(g.handshake_within(DEADLINE), "no handshake for {} on port {}:\n{}", g.ns, g.port, rig.mitm.logs());
        let path = format!("/plain-g{}", g.index);
        let e = echo(&rig, g, &[&format!("http://{UPSTREAM_IP}{path}")]);
        assert_eq!(e["path"], path.as_str());
        assert_eq!(e["tls"], false);
        // Arrived from the host namespace's upstream veth: mitmproxy made the
        // connection, not the guest (10.251.i.2 or 10.0.0.i).
        assert_eq!(e["client"], HOST_UPSTREAM_IP.to_string());
        let line = format!("GET http://{UPSTREAM_IP}{path}");
        wait_until(&format!("mitmdump to log `{line}`"), DEADLINE, || rig.mitm.stdout().contains(&line));
    }
}

#[test]
fn https_is_intercepted_and_the_upstream_is_verified_against_the_test_ca() {
    let rig = rig(&[P1], &[P1], |_, up| {
        vec!["--set".into(), format!("ssl_verify_upstream_trusted_ca={}", up.ca_cert.display())]
    });
    let g = &rig.guests[0];
    let ca = rig.mitm.ca_cert();
    let ca = ca.to_str().unwrap();
    let resolve = format!("{UPSTREAM_NAME}:443:{UPSTREAM_IP}");
    let e = echo(&rig, g, &["--cacert", ca, "--resolve", &resolve, &format!("https://{UPSTREAM_NAME}/tls")]);
    assert_eq!(e["tls"], true);
    assert_eq!(e["path"], "/tls");
    assert_eq!(e["headers"]["Host"], UPSTREAM_NAME);
    assert_eq!(e["client"], HOST_UPSTREAM_IP.to_string());

    // The guest sees mitmproxy's certificate, not the upstream's: without
    // mitmproxy's CA the handshake fails.
    let out = g.curl(&["--resolve", &resolve, &format!("https://{UPSTREAM_NAME}/untrusted")]);
    assert!(!out.status.success(), "the guest trusted mitmproxy without its CA: {}", describe(&out));

    // mitmproxy really verifies the upstream: for a name the upstream's
    // certificate does not carry it answers 502, and no request reaches it.
    let other = "other.test";
    let out = g.curl(&[
        "--cacert",
        ca,
        "--resolve",
        &format!("{other}:443:{UPSTREAM_IP}"),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("https://{other}/mismatch"),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "502", "{}", describe(&out));
    assert!(!upstream_saw(&rig, "/mismatch"), "the upstream was reached despite a certificate mismatch");
}

#[test]
fn a_guest_cannot_bypass_the_tunnel() {
    let rig = rig(&[P1], &[P1], no_extra);
    let g = &rig.guests[0];
    let h = rig.topo.host_ns();
    assert_eq!(echo(&rig, g, &[&format!("http://{UPSTREAM_IP}/before")])["client"], HOST_UPSTREAM_IP.to_string());

    // Let the host route, as a real one does, so only the guest's kill switch
    // stands between a root-in-guest route change and the upstream.
    rig.topo.host_forwarding(true);
    let ep = g.endpoint.to_string();
    let out = g.run(&["ip", "route", "replace", "default", "via", &ep, "dev", "veth0"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = g.curl(&["-m", "3", &format!("http://{UPSTREAM_IP}/bypass-kill-switch")]);
    assert!(!out.status.success(), "the bypass got through the kill switch: {}", describe(&out));
    assert!(!upstream_saw(&rig, "/bypass-kill-switch"));

    // Control: without the kill switch the same route does reach the upstream
    // directly (from the guest's veth address, not mitmproxy's).
    g.kill_switch_off();
    let e = echo(&rig, g, &["-m", "5", &format!("http://{UPSTREAM_IP}/bypass-open")]);
    assert_eq!(e["client"], rig.topo.guest_veth_ip(1).to_string());
    assert!(!rig.mitm.stdout().contains("/bypass-open"), "the bypass went through mitmproxy after all");

    // With the host not forwarding (the fixture's default), even that fails.
    rig.topo.host_forwarding(false);
    let out = g.curl(&["-m", "3", &format!("http://{UPSTREAM_IP}/bypass-no-forward")]);
    assert!(!out.status.success(), "reached the upstream with forwarding off: {}", describe(&out));

    // Nothing outside the topology is reachable at all: the guest's only link
    // besides lo and wg0 is veth0, every route goes over veth0 to its peer or
    // into wg0, and the host namespace has no default route and no link that
    // leaves our namespaces.
    let links = |ns: &str| -> Vec<String> {
        let out = rig.topo.exec(ns, &["ip", "-o", "link", "show"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap().to_owned())
            .collect()
    };
    let mut guest_links = links(&g.ns);
    guest_links.sort();
    assert_eq!(guest_links, ["lo", "veth0", "wg0"]);
    let routes = String::from_utf8_lossy(&g.run(&["ip", "-4", "route", "show", "table", "all"]).stdout).into_owned();
    for r in routes.lines() {
        let ok = r.contains("dev lo")
            || r.contains("dev wg0")
            || (r.contains("dev veth0")
                && (r.contains(&format!("via {ep} ")) || r.starts_with("10.251.1.") || r.contains(" 10.251.1.")));
        assert!(ok, "guest route leads somewhere unexpected: `{r}`\n{routes}");
    }
    for l in links(&h) {
        assert!(l == "lo" || l.starts_with(&rig.topo.prefix), "host namespace link `{l}` is not ours");
    }
    for ns in [&h, &rig.topo.upstream_ns()] {
        let out = rig.topo.exec(ns, &["ip", "-4", "route", "show", "default"]);
        assert!(out.stdout.is_empty(), "{ns} has a default route: {}", describe(&out));
    }
}

#[test]
fn identity_is_the_listen_port_not_the_inner_address() {
    let mut rig = rig(&[P1, P2], &[P1, P2], |topo, _| {
        let addon = topo.path().join("identity.py");
        let log = topo.path().join("identity.jsonl");
        std::fs::write(
            &addon,
            format!(
                "import json\n\
                 def request(flow):\n    \
                     with open({log:?}, 'a') as f:\n        \
                         f.write(json.dumps({{'port': flow.client_conn.proxy_mode.listen_port(),\n            \
                         'peer': flow.client_conn.peername[0], 'path': flow.request.path}}) + '\\n')\n",
                log = log.display().to_string()
            ),
        )
        .unwrap();
        vec!["-s".into(), addon.display().to_string()]
    });
    let g1_ip = rig.guests[0].inner_ip;
    assert_eq!(g1_ip, Ipv4Addr::new(10, 0, 0, 1));
    rig.guests[1].set_inner_ip(g1_ip);
    echo(&rig, &rig.guests[0], &[&format!("http://{UPSTREAM_IP}/id-g1")]);
    echo(&rig, &rig.guests[1], &[&format!("http://{UPSTREAM_IP}/id-g2-spoofed")]);

    let log = rig.topo.path().join("identity.jsonl");
    let entries: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("no addon log ({e}):\n{}", rig.mitm.logs()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let find = |path: &str| entries.iter().find(|e| e["path"] == path).unwrap_or_else(|| panic!("{path}: {entries:?}"));
    let (e1, e2) = (find("/id-g1"), find("/id-g2-spoofed"));
    assert_eq!(e1["peer"], "10.0.0.1");
    assert_eq!(e2["peer"], "10.0.0.1", "the spoof did not take: {entries:?}");
    assert_eq!(e1["port"], P1);
    assert_eq!(e2["port"], P2, "the spoofed guest's flow arrived on the wrong port: {entries:?}");
}

#[test]
fn a_guest_pointed_at_another_guests_port_gets_no_handshake() {
    // Guest 2 has port P2's keys but talks to P1.
    let rig = rig(&[P1, P2], &[P1, P1], no_extra);
    let (g1, g2) = (&rig.guests[0], &rig.guests[1]);
    assert!(g1.handshake_within(DEADLINE), "control guest got no handshake:\n{}", rig.mitm.logs());
    // wireguard-go retries its handshake every 5 s: 7 s covers two attempts.
    assert!(!g2.handshake_within(Duration::from_secs(7)), "a guest with P2's keys shook hands on P1");
    let out = g2.curl(&["-m", "2", &format!("http://{UPSTREAM_IP}/wrong-port")]);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(!upstream_saw(&rig, "/wrong-port"));
}

#[test]
fn teardown_leaves_no_namespaces_links_or_processes() {
    let rig = rig(&[P1, P2], &[P1, P2], no_extra);
    let prefix = rig.topo.prefix.clone();
    let mut pids = vec![rig.mitm.pid(), rig.upstream.pid()];
    pids.extend(rig.guests.iter().map(Guest::wg_pid));
    echo(&rig, &rig.guests[1], &[&format!("http://{UPSTREAM_IP}/before-teardown")]);
    assert!(leftovers(&prefix).len() >= 4, "the namespaces should exist: {:?}", leftovers(&prefix));
    drop(rig);
    assert_eq!(leftovers(&prefix), Vec::<String>::new());
    for p in pids {
        assert!(!netns::alive(p), "pid {p} survived tear-down");
    }
}

#[test]
fn dns_through_the_tunnel_is_answered_by_the_test_dns_server_only() {
    let rig = rig(&[P1], &[P1], no_extra);
    let g = &rig.guests[0];
    let dig = |name: &str| {
        let out = g.run(&["dig", "+short", "+time=3", "+tries=1", "@10.0.0.53", name, "A"]);
        assert!(out.status.success(), "dig {name}: {}\n{}", describe(&out), rig.mitm.logs());
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(dig(UPSTREAM_NAME), UPSTREAM_IP.to_string());
    rig.upstream.set_name("later.test", Ipv4Addr::new(198, 18, 0, 10));
    assert_eq!(dig("later.test"), "198.18.0.10");
    // Not in the test zone: no answer. Every name was asked of the test server.
    assert_eq!(dig("absent.test"), "");
    let asked: Vec<Value> = rig.upstream.dns_queries().iter().map(|q| q["name"].clone()).collect();
    for name in [UPSTREAM_NAME, "later.test", "absent.test"] {
        assert!(asked.contains(&Value::from(name)), "mitmproxy did not ask the test DNS server for {name}: {asked:?}");
    }

    // A command with a private resolv.conf resolves names through the tunnel.
    let resolv = rig.topo.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.0.0.53\n").unwrap();
    let out = g.run_with_resolv(&resolv, &["curl", "-sS", "-m", "10", &format!("http://{UPSTREAM_NAME}/by-name")]);
    assert!(out.status.success(), "{}", describe(&out));
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["path"], "/by-name");
    assert_eq!(e["client"], HOST_UPSTREAM_IP.to_string());
}

/// Servers added and removed at run time (`ctx.options.update(mode=…)`, as
/// the daemon will do) start and stop without disturbing the tunnels of the
/// servers that stay: same handshake, requests keep flowing.
#[test]
fn hot_added_and_removed_servers_leave_established_tunnels_alone() {
    let topo = Topology::new(2);
    let upstream = Upstream::start(&topo);
    let addon = topo.path().join("modes.py");
    let keys = topo.path().join("keys");
    std::fs::write(
        &addon,
        format!(
            "from mitmproxy import ctx, http\n\
             def request(flow):\n    \
                 verb, _, port = flow.request.path.rpartition('/')\n    \
                 modes = [m for m in ctx.options.mode if not m.endswith('@' + port)]\n    \
                 if verb == '/test-modes/add':\n        \
                     modes.append('wireguard:{keys}/keys-' + port + '.conf@' + port)\n    \
                 elif verb != '/test-modes/remove':\n        \
                     return\n    \
                 ctx.options.update(mode=modes)\n    \
                 flow.response = http.Response.make(200, b'ok')\n",
            keys = keys.display()
        ),
    )
    .unwrap();
    let mut mitm = Mitmdump::start(&topo, &[P1], &topo.path().join("confdir"), &["-s", addon.to_str().unwrap()]);
    let g1 = Guest::up(&topo, 1, mitm.conf(P1), P1);
    let ok = |g: &Guest, path: &str, mitm: &Mitmdump| {
        let out = g.curl(&["-m", "5", &format!("http://{UPSTREAM_IP}{path}")]);
        assert!(out.status.success(), "{path} from {}: {}\n{}", g.ns, describe(&out), mitm.logs());
    };
    ok(&g1, "/before", &mitm);
    let shake = g1.latest_handshake();
    assert_ne!(shake, 0);

    ok(&g1, &format!("/test-modes/add/{P2}"), &mitm);
    let conf2 = mitm.wait_conf(P2);
    let g2 = Guest::up(&topo, 2, &conf2, P2);
    ok(&g2, "/on-added-server", &mitm);
    ok(&g1, "/after-add", &mitm);

    ok(&g1, &format!("/test-modes/remove/{P2}"), &mitm);
    let stopped = format!("WireGuard server at *:{P2} stopped");
    wait_until("the removed server to stop", DEADLINE, || mitm.logs().contains(&stopped));
    ok(&g1, "/after-remove", &mitm);
    let out = g2.curl(&["-m", "3", &format!("http://{UPSTREAM_IP}/on-removed-server")]);
    assert!(!out.status.success(), "the removed server still answered: {}", describe(&out));
    assert_eq!(g1.latest_handshake(), shake, "guest 1 had to handshake again: its tunnel did not survive");
    let seen: Vec<Value> = upstream.requests().iter().map(|r| r["path"].clone()).collect();
    for path in ["/before", "/on-added-server", "/after-add", "/after-remove"] {
        assert!(seen.contains(&Value::from(path)), "{path} never reached the upstream: {seen:?}");
    }
    assert!(!seen.contains(&Value::from("/on-removed-server")));
}

#[test]
fn client_config_blocks_parse_by_endpoint_port_in_any_order() {
    let fence = "-".repeat(60);
    let block = |key: &str, port: u16| {
        format!(
            "[11:37:42.593] {fence}\n[Interface]\nPrivateKey = priv{key}\nAddress = 10.0.0.1/32\nDNS = 10.0.0.53\n\n\
             [Peer]\nPublicKey = pub{key}\nAllowedIPs = 0.0.0.0/0\nEndpoint = 192.0.2.2:{port}\n{fence}\n"
        )
    };
    let out =
        format!("[11:37:42.590] HTTP(S) proxy listening\n{}{}[11:37:43.000] other\n", block("B", P2), block("A", P1));
    let confs = netns::parse_client_confs(&out);
    assert_eq!(confs.keys().copied().collect::<Vec<_>>(), [P1, P2]);
    assert_eq!((confs[&P1].private_key.as_str(), confs[&P1].server_public_key.as_str()), ("privA", "pubA"));
    assert_eq!((confs[&P2].private_key.as_str(), confs[&P2].server_public_key.as_str()), ("privB", "pubB"));
    // A block still being printed is not a config yet.
    let partial = block("C", 51822);
    assert!(netns::parse_client_confs(&partial[..partial.len() - 62]).is_empty());
}

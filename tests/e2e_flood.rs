//! Issue 22, points 3 and 4: what one guest's floods leave behind in the
//! one host mitmdump, through the real daemon and mitmdump on netns guests.
//! Memory is asserted only as wide bounds; `bench/guest-flood.sh` prints
//! the figures.

#[path = "support/netns.rs"]
mod netns;

use std::time::Duration;

use netns::{Daemon, Guest, NetnsEtc, Topology, Upstream, describe};

const RED: u16 = 51820;

/// Fields drop in order: guests, then the daemon, then the rest.
struct Rig {
    guests: Vec<Guest>,
    daemon: Daemon,
    _upstream: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

fn rig() -> Rig {
    let topo = Topology::new(1);
    let upstream = Upstream::start(&topo);
    let etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED)]);
    daemon.start(&topo, &upstream);
    let guests = vec![Guest::up(&topo, 1, &daemon.conf(RED), RED)];
    assert!(guests[0].handshake_within(netns::DEADLINE), "the guest got no handshake");
    Rig { guests, daemon, _upstream: upstream, _etc: etc, topo }
}

fn mitmdump_pid(d: &Daemon) -> u32 {
    let status: serde_json::Value = serde_json::from_str(&d.ok(&["daemon", "status", "--json"])).unwrap();
    u32::try_from(status["mitmdump_pid"].as_u64().unwrap()).unwrap()
}

/// `argv` run in the guest as `nobody` (no root needed for any of this).
fn as_nobody<'a>(argv: &[&'a str]) -> Vec<&'a str> {
    let mut full = vec!["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"];
    full.extend_from_slice(argv);
    full
}

/// mitmdump's RSS (KiB) once it has settled: the smallest of a few reads a
/// moment apart, after the guest's queries were all answered.
fn settled_rss(pid: u32) -> u64 {
    std::thread::sleep(Duration::from_secs(2));
    (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(200));
            netns::memory_kib(pid).0
        })
        .min()
        .unwrap()
}

/// Issue 22, point 3: two rounds of 20,000 distinct refused names from a
/// non-root process in the guest, all on one socket (one DNS "connection"
/// in mitmproxy, which kept every query's flow until it closed) and then
/// 2,000 each on a socket of its own (a new connection each, as getaddrinfo
/// does). The second round must add less than 8 MiB: what the first left
/// behind is freed, not kept per name. On the code before this change the
/// one-socket rounds grew mitmdump by about 30 MiB each.
#[test]
fn a_dns_flood_leaves_mitmdump_flat() {
    dns_rounds(&[("one socket", "20000")]);
}

/// The same from a socket per name: 2,000 UDP connections a round. On the
/// code before, mitmproxy kept each for 20 s (up to the 1,024 cap) and
/// mitmdump grew +14.8 MiB, then +9.6 MiB; now each closes 0.5 s after its
/// answer (`DNS_UDP_LINGER`).
#[test]
fn a_dns_flood_from_a_socket_per_name_leaves_mitmdump_flat() {
    dns_rounds(&[("a socket per name", "2000")]);
}

/// What closing answered DNS connections must not break: glibc's
/// getaddrinfo (A and AAAA in parallel on one socket, and one after the
/// other with `single-request`), and a client that asks several questions
/// on one socket, resends one before reading, and asks again after a pause
/// shorter than the linger.
#[test]
fn a_resolver_that_reuses_its_socket_keeps_working() {
    netns::require_env();
    let rig = rig();
    let want = netns::UPSTREAM_IP.to_string();
    // The address too: it is internal (198.18.0.0/15), so ppp's resolver
    // hands it out only with an address rule.
    rig.daemon.ok(&["policy", "allow", "network", "--sandbox", "red", &format!("{},{want}", netns::UPSTREAM_NAME)]);
    for options in ["timeout:2 attempts:2", "single-request timeout:2 attempts:2"] {
        let resolv = rig.topo.path().join("resolv-tunnel.conf");
        std::fs::write(&resolv, format!("nameserver 10.0.0.53\noptions {options}\n")).unwrap();
        let script = format!("for i in $(seq 20); do getent ahosts {} || exit 1; done", netns::UPSTREAM_NAME);
        let out = rig.guests[0].run_with_resolv(&resolv, &["sh", "-c", &script]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "getent with `{options}`: {}", describe(&out));
        assert_eq!(
            text.lines().filter(|l| l.starts_with(&want) && l.contains("STREAM")).count(),
            20,
            "{options}: {text}"
        );
    }
    let client = format!(
        r#"
import socket, struct, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
def q(i):
    return struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0) + b"".join(bytes([len(p)]) + p.encode() for p in "{name}".split(".")) + b"\0" + struct.pack(">HH", 1, 1)
got = set()
for i in range(1, 6):
    s.sendto(q(i), ("10.0.0.53", 53))
    if i == 3:
        s.sendto(q(i), ("10.0.0.53", 53))  # resent before reading
    while i not in got:
        a = s.recv(4096)
        assert a[3] & 0xF == 0, a  # NOERROR
        assert socket.inet_aton("{ip}") in a, a
        got.add(struct.unpack(">H", a[:2])[0])
    time.sleep(0.3)
print(sorted(got))
"#,
        name = netns::UPSTREAM_NAME,
        ip = want
    );
    let out = rig.guests[0].run(&["/usr/bin/python3", "-c", &client]);
    assert!(out.status.success(), "one socket, several questions: {}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[1, 2, 3, 4, 5]", "{}", describe(&out));
}

fn dns_rounds(modes: &[(&str, &str)]) {
    netns::require_env();
    let rig = rig();
    let pid = mitmdump_pid(&rig.daemon);
    // The system python: the venv's links a libpython under a path
    // `nobody` may not read; flood.py's DNS modes need only the stdlib.
    let py = "/usr/bin/python3".to_owned();
    let script = netns::flood_script().display().to_string();
    let mut figures = Vec::new();
    for &(mode, n) in modes {
        let start = settled_rss(pid);
        let mut after = Vec::new();
        for round in 0..2 {
            let prefix = format!("r{round}{}", if mode == "one socket" { "o" } else { "s" });
            let cmd = if mode == "one socket" { "dns" } else { "dns-sockets" };
            let out = rig.guests[0].run(&as_nobody(&[&py, &script, cmd, "10.0.0.53", "53", &prefix, n]));
            assert!(out.status.success(), "{mode}, round {round}: {}", describe(&out));
            // The last queries are in by the time a query after them is answered.
            let out = rig.guests[0].run(&["dig", "+time=3", "+tries=2", "@10.0.0.53", "last.flood.test", "A"]);
            assert!(String::from_utf8_lossy(&out.stdout).contains("status: REFUSED"), "{}", describe(&out));
            after.push(settled_rss(pid));
        }
        let (r1, r2) = (after[0].saturating_sub(start), after[1].saturating_sub(after[0]));
        eprintln!("{mode}: mitmdump {start} KiB; round 1 +{r1} KiB, round 2 +{r2} KiB");
        figures.push((mode, r1, r2));
    }
    for (mode, r1, r2) in figures {
        assert!(
            r2 < 8 * 1024,
            "{mode}: the second round of 20,000 refused names grew mitmdump by {r2} KiB (round 1: {r1} KiB)"
        );
        assert!(r1 < 16 * 1024, "{mode}: the first round of 20,000 refused names grew mitmdump by {r1} KiB");
    }
}

/// Issue 22, point 4: slowloris. 2,000 connections from one guest, each
/// with a request whose headers never end (a header line every 3 s, so no
/// idle timeout closes it), held 40 s; then the same again from a guest
/// that never closes its side when the proxy closes one (it keeps the
/// descriptor and never answers the FIN); 200 (under `HELD_MAX`) first,
/// for the cost of one held connection. While the 2,000 are held, what
/// mitmdump holds over where it had settled stays under 32 MiB, its peak
/// (the burst of connections the proxy refuses or closes) under 48 MiB,
/// and a new connection is still answered. On the code before, 2,000 grew
/// mitmdump by 72 MiB, then by 216 MiB from a guest keeping them
/// half-open, and the new connection was refused.
#[test]
fn held_connections_cost_a_sandbox_at_most_32_mib() {
    netns::require_env();
    let rig = rig();
    let pid = mitmdump_pid(&rig.daemon);
    let py = "/usr/bin/python3".to_owned();
    let script = netns::flood_script().display().to_string();
    let mut figures = Vec::new();
    let ip = netns::UPSTREAM_IP.to_string();
    let hold_secs = 40.0;
    // The 200 first, on a mitmdump that has not grown yet: after a flood
    // they fit in what it kept.
    for (n, keep) in [("200", "0"), ("2000", "0"), ("2000", "1")] {
        let start = settled_rss(pid);
        let began = std::time::Instant::now();
        let mut child = rig.guests[0].spawn(&[&py, &script, "slow", &ip, "echo.test", n, &hold_secs.to_string(), keep]);
        let (mut peak, mut held) = (start, start);
        while child.try_wait().unwrap().is_none() {
            let rss = netns::memory_kib(pid).0;
            peak = peak.max(rss);
            // Once the burst is over and before the guest lets go.
            let t = began.elapsed().as_secs_f64();
            if t > hold_secs - 10.0 && t < hold_secs - 2.0 {
                held = rss;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{n}, keep={keep}: {}", describe(&out));
        let result: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
        let (grew, kept) = (peak.saturating_sub(start), held.saturating_sub(start));
        eprintln!("slowloris {n}, keep={keep}: mitmdump {start} KiB, held +{kept} KiB, peak +{grew} KiB; {result}");
        figures.push((n, keep, kept, grew, result));
    }
    for (n, keep, kept, grew, result) in figures {
        let what = format!("{n} slowloris connections (keep={keep})");
        assert!(
            result["after"].as_str().is_some_and(|a| a.starts_with("HTTP/1.1 ")),
            "{what}: a new connection during the flood got no answer: {result}"
        );
        assert!(kept < 32 * 1024, "{what}: mitmdump held {kept} KiB more while they were held: {result}");
        assert!(grew < 48 * 1024, "{what}: mitmdump peaked {grew} KiB over where it had settled: {result}");
        if n == "200" {
            assert_eq!(result["open"], 200, "none of 200 is closed (HELD_MAX is 256): {result}");
            eprintln!("one held connection: about {} KiB", kept / 200);
        } else {
            assert_eq!(result["open"], 256, "HELD_MAX stay open: {result}");
        }
    }
}

/// What the held-connection bound must not touch: while the same guest
/// holds 1,500 slowloris connections, 40 kept-alive connections asked
/// again after 15 s idle, three 2 MiB responses read slowly (as an SSE
/// stream is) and a 4 MiB upload all complete, because each has its
/// upstream connection open and is never counted as held.
#[test]
fn a_legitimate_agent_is_unaffected_by_the_held_connection_bound() {
    netns::require_env();
    let rig = rig();
    let ip = netns::UPSTREAM_IP.to_string();
    rig.daemon.ok(&[
        "policy",
        "allow",
        "network",
        "--sandbox",
        "red",
        "--upload",
        "8MiB",
        &format!("{},{ip}", netns::UPSTREAM_NAME),
    ]);
    let py = "/usr/bin/python3".to_owned();
    let script = netns::flood_script().display().to_string();
    let mut flood = rig.guests[0].spawn(&[&py, &script, "slow", &ip, netns::UPSTREAM_NAME, "1500", "60", "0"]);
    // Once the flood's connections are all open (it holds them a minute),
    // as the flood says: a fixed sleep raced the opening burst on a busy
    // machine, and the agent's new connections met the burst's closing ones.
    let mut said = std::io::BufReader::new(flood.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("opened ") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut said, &mut line).unwrap();
        assert!(n > 0, "the flood ended before it had opened its connections");
    }
    eprintln!("the flood: {}", line.trim());
    // The closing burst (HELD_MAX's evictions) settles.
    std::thread::sleep(Duration::from_secs(3));
    let out = rig.guests[0].run(&[&py, &script, "agent", &ip, netns::UPSTREAM_NAME, "40", "3", &(4 << 20).to_string()]);
    assert!(out.status.success(), "{}", describe(&out));
    let got: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    eprintln!("the agent during the flood: {got}");
    let flood = {
        flood.kill().ok();
        flood.wait_with_output().unwrap()
    };
    let _ = flood;
    let keepalive = got["keepalive"].as_array().unwrap();
    assert_eq!(keepalive.len(), 40, "{got}");
    assert!(keepalive.iter().all(|k| k == &serde_json::json!([200, 200])), "{got}");
    assert_eq!(got["streams"], serde_json::json!([[200, true], [200, true], [200, true]]), "{got}");
    assert_eq!(got["upload"], serde_json::json!([200, true]), "{got}");
}

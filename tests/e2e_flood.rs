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
    _topo: Topology,
}

fn rig() -> Rig {
    let topo = Topology::new(1);
    let upstream = Upstream::start(&topo);
    let etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED)]);
    daemon.start(&topo, &upstream);
    let guests = vec![Guest::up(&topo, 1, &daemon.conf(RED), RED)];
    assert!(guests[0].handshake_within(netns::DEADLINE), "the guest got no handshake");
    Rig { guests, daemon, _upstream: upstream, _etc: etc, _topo: topo }
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

/// The same from a socket per name: 2,000 UDP connections a round, each
/// kept by mitmproxy for 20 s. Not fixed yet: measured +14.8 MiB, then
/// +9.6 MiB (about 5 KB per connection, still growing in round 2).
#[test]
#[ignore = "issue 22, point 3: a UDP connection per name still costs ~5 KB that round 2 does not reuse"]
fn a_dns_flood_from_a_socket_per_name_leaves_mitmdump_flat() {
    dns_rounds(&[("a socket per name", "2000")]);
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

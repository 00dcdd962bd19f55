//! Pass-through by rule (issue 30, point 2; ADR 0051), through the real
//! daemon and mitmdump on a netns guest: `ppp policy allow network HOST
//! --no-inspect` splices a TLS connection whose SNI names HOST, on an
//! address HOST resolves to, to that address unread. A client that trusts
//! only the upstream's own CA (a pinned certificate) gets through that way
//! and fails when the host is intercepted. The guest is the attacker: an SNI
//! naming the no-inspect host on another address, and no SNI at all, are
//! never spliced; a host with a secret is never spliced either, whether the
//! CLI was asked (it refuses) or the secret came another way (the daemon
//! inspects, and the key is injected).

#[path = "support/netns.rs"]
mod netns;

use std::net::Ipv4Addr;
use std::path::PathBuf;

use netns::{ATTACKER_IP, Daemon, Guest, NetnsEtc, Topology, Upstream, describe, wait_until};
use serde_json::Value;

const RED: u16 = 51820;
/// Public (not internal), so a name rule alone allows it; routed only
/// inside the test's namespaces.
const PUBLIC_IP: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 10);
/// The host a user would pass through: an OAuth login, a pinned API.
const PINNED: &str = "pinned.test";
/// Another name on the same server, allowed and inspected.
const PLAIN: &str = "plain.test";

/// Fields drop in order: the guest, then the daemon, then the rest.
struct Rig {
    guest: Guest,
    daemon: Daemon,
    public: Upstream,
    upstream: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

fn rig(rules: &[&[&str]]) -> Rig {
    netns::require_env();
    let topo = Topology::new(1);
    let upstream = Upstream::start(&topo);
    let public = Upstream::start_public(&topo, &upstream, PUBLIC_IP, &[PINNED, PLAIN]);
    let etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED)]);
    for args in rules {
        daemon.ok(args);
    }
    daemon.start(&topo, &upstream);
    let guest = Guest::up(&topo, 1, &daemon.conf(RED), RED);
    assert!(guest.handshake_within(netns::DEADLINE), "the guest got no handshake");
    Rig { guest, daemon, public, upstream, _etc: etc, topo }
}

/// What a curl in the guest ended with.
struct Got {
    /// curl's exit status: 0, 35 (TLS handshake failed), 60 (the peer's
    /// certificate did not verify), …
    code: i32,
    status: String,
    out: String,
}

impl Got {
    /// ppp refused it: its 403 (the TLS handshake is ppp's, so a client
    /// that trusts anything reads the denial), or no answer at all.
    fn refused(&self) -> bool {
        self.code != 0 || self.status == "403"
    }
}

impl Rig {
    /// The CA a pinned client trusts: the upstream's own, never ppp's.
    fn upstream_ca(&self) -> PathBuf {
        self.upstream.ca_cert.clone()
    }

    fn ppp_ca(&self) -> PathBuf {
        self.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem")
    }

    /// `curl https://NAME/PATH` from the guest, connecting to `to`, with
    /// `ca` as its only trust anchor (`None`: `-k`, trusting anything).
    fn get(&self, name: &str, to: Ipv4Addr, path: &str, ca: Option<&PathBuf>) -> Got {
        let resolve = format!("{name}:443:{to}");
        let url = format!("https://{name}{path}");
        let mut args = vec!["--resolve", &resolve, "-w", "\n%{http_code}"];
        let ca_text;
        match ca {
            Some(c) => {
                ca_text = c.to_str().unwrap().to_owned();
                args.extend(["--cacert", &ca_text]);
            }
            None => args.push("-k"),
        }
        args.push(&url);
        let out = self.guest.curl(&args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let status = text.rsplit_once('\n').map_or("", |(_, c)| c).trim().to_owned();
        Got { code: out.status.code().unwrap_or(-1), status, out: describe(&out) }
    }

    fn flows(&self) -> Vec<Value> {
        std::fs::read_to_string(self.daemon.data().join("flows.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The lines that say a connection was passed through unread.
    fn passed(&self) -> Vec<Value> {
        self.flows().into_iter().filter(|f| f["inspected"] == false).collect()
    }

    /// The request for `path` as `server` received it.
    fn received(server: &Upstream, path: &str) -> Option<Value> {
        server.requests().into_iter().rfind(|r| r["path"] == path)
    }
}

#[test]
fn a_pinned_client_gets_through_no_inspect_and_fails_when_inspected() {
    let rig = rig(&[&["policy", "allow", "network", "--sandbox", "red", PINNED, "--no-inspect"]]);
    let ca = rig.upstream_ca();
    let got = rig.get(PINNED, PUBLIC_IP, "/pinned/through", Some(&ca));
    assert_eq!((got.code, got.status.as_str()), (0, "200"), "spliced: the server's own certificate: {}", got.out);
    let r = Rig::received(&rig.public, "/pinned/through").expect("the request reached the server");
    assert!(r["tls"] == true, "{r}");
    wait_until("the pass-through in flows.jsonl", netns::DEADLINE, || !rig.passed().is_empty());
    let passed = rig.passed();
    assert_eq!(passed.len(), 1, "logged once: {passed:?}");
    let f = &passed[0];
    assert_eq!(
        (f["kind"].as_str(), f["host"].as_str(), f["decision"].as_str()),
        (Some("tls"), Some(PINNED), Some("allow"))
    );
    assert_eq!(f["ip"], PUBLIC_IP.to_string());
    assert!(f["matched_rule"].is_string(), "{f}");
    // No request line: the proxy never read one.
    assert!(
        !rig.flows().iter().any(|f| f["path"] == "/pinned/through"),
        "a spliced connection's requests are not seen: {:?}",
        rig.flows()
    );
    let ls = rig.daemon.ok(&["policy", "ls", "red"]);
    assert!(ls.contains("INSPECT") && ls.contains(" no"), "{ls}");

    // The same host allowed plainly (added again without the flag): read,
    // so a client that trusts only the server's CA refuses ppp's.
    rig.daemon.ok(&["policy", "allow", "network", "--sandbox", "red", PINNED]);
    let got = rig.get(PINNED, PUBLIC_IP, "/pinned/inspected", Some(&ca));
    assert_eq!(got.code, 60, "intercepted: the certificate is ppp's, not the server's: {}", got.out);
    assert!(Rig::received(&rig.public, "/pinned/inspected").is_none());
    let ppp_ca = rig.ppp_ca();
    let got = rig.get(PINNED, PUBLIC_IP, "/pinned/inspected-ok", Some(&ppp_ca));
    assert_eq!(got.status, "200", "{}", got.out);
    assert!(rig.flows().iter().any(|f| f["path"] == "/pinned/inspected-ok"), "an inspected request is logged");
    assert_eq!(rig.passed().len(), 1, "nothing else passed through");
}

/// The guest names the no-inspect host in its SNI but connects elsewhere:
/// to an address no rule allows, and to one an address rule allows. The
/// name does not resolve there, so the connection is refused; it is never
/// spliced to the address (a trust-anything client would then reach it).
#[test]
fn an_sni_naming_the_no_inspect_host_is_not_spliced_to_another_address() {
    let rig = rig(&[&["policy", "allow", "network", "--sandbox", "red", PINNED, "--no-inspect"]]);
    let attacker = Upstream::start_attacker(&rig.topo, &rig.upstream);
    let got = rig.get(PINNED, ATTACKER_IP, "/spoof/denied-address", None);
    assert!(got.refused(), "{}", got.out);
    assert!(Rig::received(&attacker, "/spoof/denied-address").is_none(), "never spliced to the attacker");

    rig.daemon.ok(&["policy", "allow", "network", "--sandbox", "red", &ATTACKER_IP.to_string()]);
    let got = rig.get(PINNED, ATTACKER_IP, "/spoof/allowed-address", None);
    assert!(got.refused(), "the name does not resolve to the allowed address, so its rule cannot vouch: {}", got.out);
    assert!(Rig::received(&attacker, "/spoof/allowed-address").is_none(), "never spliced to the attacker");
    // And to the upstream's own address, which serves the name but is not
    // where it resolves.
    rig.daemon.ok(&["policy", "allow", "network", "--sandbox", "red", &netns::UPSTREAM_IP.to_string()]);
    let got = rig.get(PINNED, netns::UPSTREAM_IP, "/spoof/upstream", None);
    assert!(got.refused(), "{}", got.out);
    assert!(Rig::received(&rig.upstream, "/spoof/upstream").is_none());
    assert!(rig.passed().is_empty(), "nothing passed through: {:?}", rig.passed());
}

/// Without an SNI there is no name for a no-inspect rule to be about: the
/// connection is intercepted (or refused) as before, even with the address
/// itself allowed `--no-inspect`.
#[test]
fn a_client_hello_without_sni_is_intercepted() {
    let ip = PUBLIC_IP.to_string();
    let rig = rig(&[&["policy", "allow", "network", "--sandbox", "red", &ip, "--no-inspect"]]);
    // curl sends no SNI for an address literal.
    let url = format!("https://{ip}/nosni/pinned");
    let ca = rig.upstream_ca();
    let out = rig.guest.curl(&["--cacert", ca.to_str().unwrap(), &url]);
    assert_eq!(
        out.status.code(),
        Some(60),
        "intercepted, so the server's CA does not verify ppp's: {}",
        describe(&out)
    );
    assert!(Rig::received(&rig.public, "/nosni/pinned").is_none());
    let out = rig.guest.curl(&["-k", "-w", "\n%{http_code}", &format!("https://{ip}/nosni/read")]);
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("200"), "{}", describe(&out));
    assert!(rig.flows().iter().any(|f| f["path"] == "/nosni/read"), "read by the proxy: {:?}", rig.flows());
    assert!(rig.passed().is_empty(), "nothing passed through: {:?}", rig.passed());
}

#[test]
fn a_host_with_a_secret_is_refused_no_inspect_either_way() {
    let rig = rig(&[]);
    let red = |a: &[&str]| rig.daemon.ppp(a).output().unwrap();
    rig.daemon.ok(&["secret", "set", "red", "pinned", "--host", PINNED, "--token", "sk-pinned-1234567890"]);
    let out = red(&["policy", "allow", "network", "--sandbox", "red", "*.test", "--no-inspect"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(err.contains("cannot be `--no-inspect`") && err.contains("`pinned` (red scope)"), "{err}");
    assert!(err.contains(PINNED), "{err}");
    assert!(!rig.daemon.ok(&["policy", "ls", "red"]).contains("*.test"), "nothing was added");

    // The other order: the rule first, then the secret.
    rig.daemon.ok(&["secret", "rm", "-f", "red", "pinned"]);
    rig.daemon.ok(&["policy", "allow", "network", "--sandbox", "red", "*.test", "--no-inspect"]);
    let out = red(&["secret", "set", "red", "pinned", "--host", PINNED, "--token", "sk-pinned-1234567890"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(err.contains(&format!("`{PINNED}` cannot get a secret")) && err.contains("--no-inspect"), "{err}");
    // Another sandbox's secret is no conflict with red's rule.
    rig.daemon.ok(&["secret", "set", "blue", "pinned", "--host", PINNED, "--token", "sk-pinned-1234567890"]);
}

/// A secret stored without the CLI's check (here with the store API, as a
/// script or an older ppp could) after the rule, with no reload: the daemon
/// inspects the host anyway, so the key is injected and nothing is spliced.
#[test]
fn the_daemon_inspects_a_no_inspect_host_once_a_secret_covers_it() {
    let rig = rig(&[&["policy", "allow", "network", "--sandbox", "red", PINNED, "--no-inspect"]]);
    let ca = rig.upstream_ca();
    let got = rig.get(PINNED, PUBLIC_IP, "/secret/before", Some(&ca));
    assert_eq!(got.status, "200", "spliced while no secret covers it: {}", got.out);

    let settings = ppp::secret::Settings { backend: Some(ppp::secret::Backend::File), age_identity: None };
    let store = ppp::secret::Store::open_with(&rig.daemon.dirs(), &settings).unwrap();
    let key = "sk-pinned-injected-0987654321";
    store
        .set_service(
            &ppp::secret::Scope::Sandbox("red".into()),
            "pinned",
            &[PINNED.to_owned()],
            &ppp::secret::Value::new(key.to_owned()),
        )
        .unwrap();

    let got = rig.get(PINNED, PUBLIC_IP, "/secret/pinned", Some(&ca));
    assert_eq!(got.code, 60, "inspected now: the pinned client refuses ppp's certificate: {}", got.out);
    assert!(Rig::received(&rig.public, "/secret/pinned").is_none(), "not spliced");
    let ppp_ca = rig.ppp_ca();
    let got = rig.get(PINNED, PUBLIC_IP, "/secret/injected", Some(&ppp_ca));
    assert_eq!(got.status, "200", "{}", got.out);
    let r = Rig::received(&rig.public, "/secret/injected").expect("the request reached the server");
    let auth = r["headers"].as_object().unwrap().iter().find(|(k, _)| k.eq_ignore_ascii_case("authorization"));
    assert_eq!(auth.and_then(|(_, v)| v.as_str()), Some(format!("Bearer {key}").as_str()), "the key is injected: {r}");
    assert_eq!(rig.passed().len(), 1, "only the connection before the secret passed through: {:?}", rig.passed());
}

const BLUE: u16 = 51821;
const BENCH_BARE: u16 = 51830;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn mib(kib: u64) -> f64 {
    f64::from(u32::try_from(kib).unwrap_or(u32::MAX)) / 1024.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// `netns::bench_download` in guest `g`, trusting `ca`: MB/s, and
/// mitmdump `pid`'s peak RSS growth (KiB) meanwhile.
fn download(g: &Guest, ca: &std::path::Path, bytes: u64, pid: u32) -> (f64, u64) {
    let (rss, _) = netns::memory_kib(pid);
    netns::reset_peak(pid);
    let mbs = netns::bench_download(g, ca.to_str().unwrap(), bytes);
    (mbs, netns::memory_kib(pid).1.saturating_sub(rss))
}

/// `bench/agent-traffic.sh` with `MODE=no-inspect`: a `BYTES` (1 GiB)
/// download through a `--no-inspect` host (red), through interception
/// (blue, the same host allowed plainly) and through bare mitmdump (no
/// addon), interleaved, `ROUNDS` rounds; MB/s, the ratios (goal: passed
/// through >= 1.5x intercepted) and mitmdump's peak RSS growth.
#[test]
#[ignore = "a benchmark: bench/agent-traffic.sh runs it"]
fn bench_no_inspect_download() {
    netns::require_env();
    let rounds: usize = env_or("ROUNDS", 3);
    let bytes: u64 = env_or("BYTES", 1 << 30);
    let topo = Topology::new(3);
    let upstream = Upstream::start(&topo);
    let _etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED), ("blue", BLUE)]);
    let (name, ip) = (netns::UPSTREAM_NAME, netns::UPSTREAM_IP.to_string());
    // The name's rule first: the first matching allow decides whether the
    // flow is inspected, and 198.18.0.10 (not public) needs its own rule.
    daemon.ok(&["policy", "allow", "network", "--sandbox", "red", name, "--no-inspect"]);
    daemon.ok(&["policy", "allow", "network", "--sandbox", "red", &ip]);
    daemon.ok(&["policy", "allow", "network", "--sandbox", "blue", &format!("{name},{ip}")]);
    daemon.start(&topo, &upstream);
    let (mut servers, _) = netns::start_agent_servers(&topo);
    let up_ca = upstream.ca_cert.clone();
    let bare = netns::Mitmdump::start(
        &topo,
        &[BENCH_BARE],
        &topo.path().join("bare-mitmproxy"),
        &["--set", &format!("ssl_verify_upstream_trusted_ca={}", up_ca.display()), "--set", "stream_large_bodies=1"],
    );
    let bare_ca = bare.ca_cert();
    let red = Guest::up(&topo, 1, &daemon.conf(RED), RED);
    let blue = Guest::up(&topo, 2, &daemon.conf(BLUE), BLUE);
    let g3 = Guest::up(&topo, 3, &bare.conf(BENCH_BARE).clone(), BENCH_BARE);
    for g in [&red, &blue, &g3] {
        assert!(g.handshake_within(netns::DEADLINE), "guest {} got no handshake", g.index);
    }
    let status: Value = serde_json::from_str(&daemon.ok(&["daemon", "status", "--json"])).unwrap();
    let ppp_pid = u32::try_from(status["mitmdump_pid"].as_u64().unwrap()).unwrap();
    let ppp_ca = topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
    println!(
        "bench: {rounds} rounds; download {} MiB through a --no-inspect host, interception, bare mitmdump",
        bytes >> 20
    );
    let mut runs = Vec::new();
    for round in 0..rounds {
        // Interleaved, the order turned each round, so drift hits all three.
        let mut order: Vec<(&str, &Guest, &std::path::Path, u32)> = vec![
            ("passed", &red, &up_ca, ppp_pid),
            ("inspected", &blue, &ppp_ca, ppp_pid),
            ("bare", &g3, &bare_ca, bare.pid()),
        ];
        if round % 2 == 1 {
            order.reverse();
        }
        let mut got = std::collections::BTreeMap::new();
        for (what, g, ca, pid) in order {
            let (mbs, kib) = download(g, ca, bytes, pid);
            println!("bench: round {round} {what:<9} {mbs:7.1} MB/s  mitmdump peak RSS +{:6.1} MiB", mib(kib));
            got.insert(what, (mbs, kib));
        }
        runs.push(got);
    }
    assert!(daemon.ok(&["policy", "log", "--json", "red"]).contains("\"inspected\":false"));
    let med = |what: &str| median(runs.iter().map(|r| r[what].0).collect());
    let worst = |what: &str| mib(runs.iter().map(|r| r[what].1).max().unwrap_or(0));
    let ratio = |a: &str, b: &str| median(runs.iter().map(|r| r[a].0 / r[b].0).collect());
    println!("bench: medians of {rounds} rounds (ratios per round, then the median)");
    println!(
        "bench: download: passed through {:.1} MB/s, intercepted {:.1} MB/s, bare mitmdump {:.1} MB/s",
        med("passed"),
        med("inspected"),
        med("bare")
    );
    let pass_ratio = ratio("passed", "inspected");
    println!(
        "bench: ratios: passed/intercepted {pass_ratio:.2} (goal >= 1.5: {}), passed/bare {:.2}, intercepted/bare {:.2}",
        if pass_ratio >= 1.5 { "met" } else { "NOT met" },
        ratio("passed", "bare"),
        ratio("inspected", "bare")
    );
    println!(
        "bench: mitmdump peak RSS growth, worst round: passed {:.1} MiB, intercepted {:.1} MiB, bare {:.1} MiB",
        worst("passed"),
        worst("inspected"),
        worst("bare")
    );
    let _ = servers.kill();
    let _ = servers.wait();
}

//! Learn mode end to end (issue 28): a learning sandbox's guest talks
//! through the real daemon and mitmdump (wireguard-go in network
//! namespaces) to several hosts no rule names, one host a key is injected
//! for, one a deny rule refuses and one internal address; `ppp policy
//! suggest` turns the log into a policy, `replay` of it shows nothing
//! newly denied, `apply` ends learning so a host outside it is refused at
//! the guest, and `apply --undo` puts learning back. The guest is the
//! attacker: learning must not open what a deny rule or the internal-
//! address defence refuses.

#[path = "support/netns.rs"]
mod netns;

use std::net::Ipv4Addr;

use netns::{Daemon, Guest, NetnsEtc, SERVICE_NAME, Topology, UPSTREAM_IP, Upstream, describe, wait_until};
use serde_json::Value;

const RED: u16 = 51820;
/// Public (not internal), so learning decides for it; routed only inside
/// the test's namespaces.
const PUBLIC_IP: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 10);
const LEARNED: [&str; 3] = ["one.learn.test", "two.learn.test", "three.learn.test"];
const DENIED: &str = "denied.learn.test";
const OUTSIDE: &str = "outside.learn.test";
/// Looked up through ppp's resolver and never connected to.
const DNS_ONLY: &str = "dnsonly.learn.test";
const KEY: &str = "sk-ant-learn-SECRET-7777777777777777";

/// Fields drop in order: the guest, then the daemon, then the rest.
struct Rig {
    guest: Guest,
    daemon: Daemon,
    upstream: Upstream,
    _public: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

fn rig() -> Rig {
    netns::require_env();
    let topo = Topology::new(1);
    let upstream = Upstream::start(&topo);
    let mut names: Vec<&str> = LEARNED.to_vec();
    names.extend([DENIED, OUTSIDE, DNS_ONLY]);
    let public = Upstream::start_public(&topo, &upstream, PUBLIC_IP, &names);
    let etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED)]);
    daemon.ok(&["policy", "deny", "network", DENIED]);
    // The key's service is on a non-public test address, which needs an
    // address rule: kept global, so applying red's file leaves it.
    daemon.ok(&["policy", "allow", "network", &format!("{SERVICE_NAME},{UPSTREAM_IP}")]);
    daemon.ok(&["secret", "set", "-g", "anthropic", "-t", KEY]);
    daemon.ok(&["policy", "learn", "red"]);
    daemon.start(&topo, &upstream);
    let guest = Guest::up(&topo, 1, &daemon.conf(RED), RED);
    assert!(guest.handshake_within(netns::DEADLINE), "the guest got no handshake");
    Rig { guest, daemon, upstream, _public: public, _etc: etc, topo }
}

impl Rig {
    /// `curl` in the guest: body and status code.
    fn curl(&self, args: &[&str]) -> (String, String) {
        let mut full = vec!["-o", "-", "-w", "\n%{http_code}"];
        full.extend_from_slice(args);
        let out = self.guest.curl(&full);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (body.to_owned(), code.trim().to_owned())
    }

    fn http(&self, name: &str, path: &str) -> (String, String) {
        let resolve = format!("{name}:80:{PUBLIC_IP}");
        self.curl(&["--resolve", &resolve, &format!("http://{name}{path}")])
    }

    fn flows(&self) -> Vec<Value> {
        std::fs::read_to_string(self.daemon.data().join("flows.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The last logged flow to `host`, once it is there.
    fn flow(&self, host: &str) -> Value {
        wait_until(&format!("a flow to {host} in flows.jsonl"), netns::DEADLINE, || {
            self.flows().iter().any(|f| f["host"] == host)
        });
        self.flows().into_iter().rfind(|f| f["host"] == host).unwrap()
    }
}

#[test]
fn learn_suggest_replay_apply_and_undo() {
    let rig = rig();
    // (`ppp ls` lists only sandboxes with a VM record; this one has none.)
    assert_eq!(rig.daemon.ok(&["policy", "learn"]), "red\n", "red is learning");

    // Learning: hosts no rule names pass, and are logged as `learned`.
    for host in LEARNED {
        let (body, code) = rig.http(host, "/learned");
        assert_eq!(code, "200", "{host} while learning: {body}");
        assert_eq!(rig.flow(host)["matched_rule"], "learned", "{host}");
    }
    // The key's host: the key reaches the upstream, never the guest.
    let ca = rig.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
    let resolve = format!("{SERVICE_NAME}:443:{UPSTREAM_IP}");
    let (body, code) = rig.curl(&[
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        "-H",
        "x-api-key: ppp-proxy-managed",
        &format!("https://{SERVICE_NAME}/v1/learn"),
    ]);
    assert_eq!(code, "200", "{body}");
    let seen = rig.upstream.requests().into_iter().rfind(|r| r["path"] == "/v1/learn").expect("reached upstream");
    let key = seen["headers"].as_object().unwrap().iter().find(|(k, _)| k.eq_ignore_ascii_case("x-api-key"));
    assert_eq!(key.and_then(|(_, v)| v.as_str()), Some(KEY), "injected: {seen}");
    assert_eq!(rig.flow(SERVICE_NAME)["injected"], true);

    // The record holds every kind of flow replay must decide again: an
    // allowed DNS question (by name, port 53, ppp's resolver as the
    // address) and an allowed TLS ClientHello (by SNI and destination).
    // Before issue 28's record fix neither was logged when allowed.
    let out = rig.guest.run(&["dig", "+time=3", "+tries=1", "+short", "@10.0.0.53", DNS_ONLY, "A"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), PUBLIC_IP.to_string(), "{}", describe(&out));
    let q = rig.flow(DNS_ONLY);
    assert_eq!(
        (&q["kind"], &q["ip"], &q["port"], &q["decision"], &q["matched_rule"]),
        (&"dns".into(), &"10.0.0.53".into(), &53.into(), &"allow".into(), &"learned".into()),
        "{q}"
    );
    let tls_host = LEARNED[1];
    let resolve = format!("{tls_host}:443:{PUBLIC_IP}");
    let (body, code) =
        rig.curl(&["--cacert", ca.to_str().unwrap(), "--resolve", &resolve, &format!("https://{tls_host}/tls")]);
    assert_eq!(code, "200", "{body}");
    let hello = rig
        .flows()
        .into_iter()
        .find(|f| f["kind"] == "tls" && f["host"] == tls_host)
        .unwrap_or_else(|| panic!("no TLS flow for {tls_host}: {:?}", rig.flows()));
    assert_eq!(
        (&hello["ip"], &hello["port"], &hello["decision"], &hello["matched_rule"]),
        (&PUBLIC_IP.to_string().into(), &443.into(), &"allow".into(), &"learned".into()),
        "{hello}"
    );
    assert!(hello.get("local").is_none(), "not one of the host's own addresses: {hello}");

    // What still refuses while learning: a deny rule, an internal address.
    let (body, code) = rig.http(DENIED, "/denied");
    assert_eq!(code, "403", "a deny rule wins over learning: {body}");
    assert_eq!(rig.flow(DENIED)["decision"], "deny");
    rig.upstream.set_name("meta.learn.test", Ipv4Addr::new(169, 254, 169, 254));
    let (body, code) = rig.curl(&["--resolve", "meta.learn.test:80:169.254.169.254", "http://meta.learn.test/latest"]);
    assert_eq!(code, "403", "an internal address is refused while learning: {body}");
    assert_eq!(rig.flow("meta.learn.test")["decision"], "deny");

    // Suggest: exactly what was used, the key's host marked.
    let suggestion = rig.daemon.ok(&["policy", "suggest", "red"]);
    for host in LEARNED.iter().chain([&SERVICE_NAME]) {
        assert!(suggestion.contains(host), "{host} suggested:\n{suggestion}");
    }
    for host in [DENIED, OUTSIDE, "meta.learn.test", "169.254.169.254"] {
        assert!(!suggestion.contains(host), "{host} not suggested:\n{suggestion}");
    }
    // Each rule follows its `# N flows, …` comment.
    let block = |resource: &str| {
        suggestion.split("\n# ").find(|b| b.contains(&format!("resource: {resource}\n"))).unwrap_or_default()
    };
    assert!(block(&format!("{SERVICE_NAME}:443")).contains("secret injected"), "key host marked:\n{suggestion}");
    assert!(!block(&format!("{}:80", LEARNED[0])).contains("secret injected"), "{suggestion}");
    assert!(block(&format!("{DNS_ONLY}:53")).contains("dns"), "the DNS-only name:\n{suggestion}");
    assert!(!suggestion.contains("10.0.0.53"), "the resolver is no destination:\n{suggestion}");
    assert!(block(&format!("{tls_host}:443")).contains("tls"), "{suggestion}");
    let file = rig.topo.path().join("red.yaml");
    std::fs::write(&file, &suggestion).unwrap();

    // Replay re-decides the DNS and TLS records: without their rules, the
    // question and the ClientHello would be newly denied.
    let smaller: String = suggestion
        .split("\n- ")
        .filter(|b| {
            !b.contains(&format!("resource: {DNS_ONLY}:53\n")) && !b.contains(&format!("resource: {tls_host}:443\n"))
        })
        .collect::<Vec<_>>()
        .join("\n- ");
    let smaller_file = rig.topo.path().join("smaller.yaml");
    std::fs::write(&smaller_file, &smaller).unwrap();
    let out = rig
        .daemon
        .ppp(&["policy", "replay", "--json", "--policy", smaller_file.to_str().unwrap(), "red"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let changed = |kind: &str, host: &str| {
        v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["change"] == "newly-denied" && c["kind"] == kind && c["host"] == host)
    };
    assert!(changed("dns", DNS_ONLY), "{v}");
    assert!(changed("tls", tls_host), "{v}");

    // Replay of the suggestion: nothing newly denied, exit 0.
    let out = rig.daemon.ppp(&["policy", "replay", "--policy", file.to_str().unwrap(), "red"]).output().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(" 0 newly denied"), "{}", describe(&out));

    // Apply: learning ends; the suggestion's hosts pass, one outside it
    // is refused at the guest.
    let out = rig.daemon.ok(&["policy", "apply", file.to_str().unwrap(), "--sandbox", "red"]);
    assert!(out.contains("not learning"), "{out}");
    let (body, code) = rig.http(LEARNED[0], "/after-apply");
    assert_eq!(code, "200", "a suggested host still passes: {body}");
    assert_eq!(rig.flow(LEARNED[0])["matched_rule"].as_str().map(str::len), Some(36), "by its rule now");
    let (body, code) = rig.http(OUTSIDE, "/after-apply");
    assert_eq!(code, "403", "outside the suggestion, refused: {body}");
    assert_eq!(rig.flow(OUTSIDE)["decision"], "deny");

    // Undo: learning again, so the outside host passes as `learned`.
    rig.daemon.ok(&["policy", "apply", "--undo", "--sandbox", "red"]);
    let (body, code) = rig.http(OUTSIDE, "/after-undo");
    assert_eq!(code, "200", "learning again after undo: {body}");
    assert_eq!(rig.flow(OUTSIDE)["matched_rule"], "learned");
    let (_, code) = rig.http(DENIED, "/after-undo");
    assert_eq!(code, "403", "the deny rule still wins");
}

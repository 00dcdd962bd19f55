//! Budgets enforced live (issue 27, point 4; ADR 0055), through the real
//! tunnel, daemon and mitmdump, with `e2e_usage`'s test upstream playing
//! api.anthropic.com and replaying recorded responses (`anthropic.json`
//! reports 12 + 30 = 42 tokens). A request past a budget gets a 429 in the
//! provider's own error shape and never reaches the upstream; a raise is
//! live; a restart keeps the count; an `ask` budget holds the request for
//! `ppp policy approval`; and the guest, which chooses every byte it sends,
//! cannot walk around its budget (HTTP/2, absolute-form, the Host's case, a
//! `--no-inspect` rule) or spend the key uncounted over cleartext.

#[path = "support/netns.rs"]
mod netns;

use std::process::Child;
use std::time::Duration;

use netns::{
    DEADLINE, Daemon, Guest, NetnsEtc, SERVICE_NAME, Topology, UPSTREAM_IP, UPSTREAM_NAME, Upstream, describe,
    wait_until,
};
use ppp::usage::record::{self, Record};

const RED: u16 = 51820;
const BLUE: u16 = 51821;
const PROMPT: &str = r#"{"model":"m","messages":[{"role":"user","content":"Hello"}]}"#;
const KEY: &str = "sk-ant-budget-test-0000";

/// Fields drop in order: the guests, then the daemon, then the rest.
struct Rig {
    guests: Vec<Guest>,
    daemon: Daemon,
    upstream: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.guests.clear();
    }
}

fn rig() -> Rig {
    netns::require_env();
    let topo = Topology::new(2);
    let upstream = Upstream::start(&topo);
    let etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED), ("blue", BLUE)]);
    let allowed = format!("{SERVICE_NAME},{UPSTREAM_NAME},{UPSTREAM_IP}");
    for s in ["red", "blue"] {
        daemon.ok(&["policy", "allow", "network", "--sandbox", s, &allowed]);
    }
    daemon.ok(&["secret", "set", "-g", "anthropic", "--token", KEY]);
    daemon.start(&topo, &upstream);
    let guests: Vec<Guest> = [(1, RED), (2, BLUE)]
        .into_iter()
        .map(|(i, port)| {
            let g = Guest::up(&topo, i, &daemon.conf(port), port);
            assert!(g.handshake_within(DEADLINE), "guest {i} got no handshake");
            g
        })
        .collect();
    Rig { guests, daemon, upstream, _etc: etc, topo }
}

impl Rig {
    fn red(&self) -> &Guest {
        &self.guests[0]
    }

    fn blue(&self) -> &Guest {
        &self.guests[1]
    }

    fn records(&self) -> Vec<Record> {
        record::read(&self.daemon.dirs().usage_log()).unwrap().records
    }

    /// Wait until usage.jsonl has `n` records: the budget counts a
    /// response once its record is written.
    fn wait_records(&self, n: usize) {
        wait_until(&format!("{n} usage records"), DEADLINE, || self.records().len() >= n);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(self.records().len(), n, "{:#?}", self.records());
    }

    /// The curl arguments for a POST from a guest to the provider.
    fn args(&self, scheme: &str, extra: &[&str]) -> Vec<String> {
        let ca = self.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
        let port = if scheme == "https" { 443 } else { 80 };
        let mut a: Vec<String> = [
            if extra.contains(&"--http2") { "--http2" } else { "--http1.1" },
            "--cacert",
            ca.to_str().unwrap(),
            "--resolve",
            &format!("{SERVICE_NAME}:{port}:{UPSTREAM_IP}"),
            "-H",
            "content-type: application/json",
            "-H",
            "x-fixture: anthropic.json",
            "--data-binary",
            PROMPT,
            "-w",
            "\n%{http_code}",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let url = format!("{scheme}://{SERVICE_NAME}/v1/messages");
        let mut it = extra.iter().filter(|h| **h != "--http2");
        while let Some(e) = it.next() {
            match *e {
                // What follows is the request target, sent as is.
                "--request-target" => a.extend(["--request-target".to_owned(), (*it.next().unwrap()).to_owned()]),
                h => a.extend(["-H".to_owned(), h.to_owned()]),
            }
        }
        a.push(url);
        a
    }

    /// POST from guest `g`; the status and body.
    fn post(&self, g: &Guest, scheme: &str, extra: &[&str]) -> (u16, String) {
        let args = self.args(scheme, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        split(&g.curl(&args).stdout)
    }

    /// POST in the background, for a request a budget holds.
    fn spawn(&self, g: &Guest) -> Child {
        let mut argv = vec!["curl".to_owned(), "-sS".to_owned(), "-m".to_owned(), "60".to_owned()];
        argv.extend(self.args("https", &[]));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        g.spawn(&argv)
    }

    /// The requests to the provider's metered path the upstream saw.
    fn upstream_saw(&self) -> Vec<serde_json::Value> {
        self.upstream.requests().into_iter().filter(|r| r["path"] == "/v1/messages").collect()
    }

    fn budget(&self, args: &[&str]) {
        let mut a = vec!["policy", "budget", "set"];
        a.extend(args);
        self.daemon.ok(&a);
    }

    fn last_flow(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.daemon.dirs().flows_log()).unwrap();
        serde_json::from_str(text.lines().rev().find(|l| l.contains("\"http\"")).unwrap()).unwrap()
    }

    fn pending(&self) -> Vec<serde_json::Value> {
        serde_json::from_str::<serde_json::Value>(&self.daemon.ok(&["policy", "approval", "ls", "--json"]))
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    /// Wait for the one request a budget holds; its entry.
    fn held(&self) -> serde_json::Value {
        wait_until("a request held by the budget", DEADLINE, || !self.pending().is_empty());
        let p = self.pending();
        assert_eq!(p.len(), 1, "{p:#?}");
        p[0].clone()
    }
}

/// The `x-api-key` an upstream request carried (any case).
fn key_of(r: &serde_json::Value) -> Option<String> {
    r["headers"]
        .as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("x-api-key"))
        .map(|(_, v)| v.as_str().unwrap_or_default().to_owned())
}

fn split(out: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(out).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn finish(c: Child) -> (u16, String) {
    let out = c.wait_with_output().unwrap();
    split(&out.stdout)
}

/// The Anthropic-dialect refusal: its message.
fn refused(code: u16, body: &str) -> String {
    assert_eq!(code, 429, "{body}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    v["error"]["message"].as_str().unwrap().to_owned()
}

#[test]
fn a_budget_is_enforced_live_and_cannot_be_walked_around() {
    let rig = rig();
    rig.budget(&["red", "--tokens", "80"]);
    // Requests 1 and 2 pass (0, then 42 used); the 3rd finds 84 ≥ 80.
    for n in 1..=2 {
        let (code, body) = rig.post(rig.red(), "https", &[]);
        assert_eq!(code, 200, "request {n}: {body}");
        rig.wait_records(n);
    }
    let (code, body) = rig.post(rig.red(), "https", &[]);
    let msg = refused(code, &body);
    assert!(msg.contains("daily token budget of sandbox `red`"), "{msg}");
    assert!(msg.contains("84 tokens of 80 tokens today"), "{msg}");
    assert!(msg.contains("ppp policy budget set red --tokens 160"), "{msg}");
    assert_eq!(rig.upstream_saw().len(), 2, "the refused request never left");
    assert!(rig.upstream_saw().iter().all(|r| key_of(r).as_deref() == Some(KEY)), "both carried the key");
    let f = rig.last_flow();
    assert_eq!((f["status"].as_u64(), f["decision"].as_str()), (Some(429), Some("deny")), "{f}");
    assert!(f["reason"].as_str().unwrap().starts_with("budget: ppp: the daily token budget"), "{f}");

    // Another sandbox is not counted against red's budget.
    let (code, body) = rig.post(rig.blue(), "https", &[]);
    assert_eq!(code, 200, "{body}");
    rig.wait_records(3);

    // Nothing the guest chooses about the request changes its count.
    let dodges: &[&[&str]] =
        &[&["--http2"], &["Host: API.Anthropic.COM"], &["--request-target", "https://api.anthropic.com/v1/messages"]];
    for d in dodges {
        let (code, body) = rig.post(rig.red(), "https", d);
        assert_ne!(code, 200, "{d:?} got through: {body}");
        assert!(code == 429 || code == 403, "{d:?}: {code} {body}");
    }
    assert_eq!(rig.upstream_saw().len(), 3, "none of the dodges reached the provider");
    // A pass-through rule for the provider's host (possible once no secret
    // is sent there: the guest could bring its own key): inspected all the
    // same, so still counted and refused.
    rig.daemon.ok(&["secret", "rm", "-g", "-f", "anthropic"]);
    rig.daemon.ok(&["policy", "allow", "network", "--sandbox", "red", SERVICE_NAME, "--no-inspect"]);
    let (code, body) = rig.post(rig.red(), "https", &[]);
    refused(code, &body);
    // Cleartext to the provider's name: never metered, and never given the
    // key either (its upstream is not verified), so it spends nothing of
    // the user's; it goes where the policy lets it, keyless.
    let before = rig.upstream.requests().len();
    let (code, _) = rig.post(rig.red(), "http", &[]);
    assert_eq!(code, 200);
    let all = rig.upstream.requests();
    assert_eq!(all.len(), before + 1);
    assert_eq!(key_of(all.last().unwrap()), None, "{:?}", all.last());
    rig.wait_records(3);

    // A raise is live: the next request passes, no restart.
    rig.budget(&["red", "--tokens", "1k"]);
    let (code, body) = rig.post(rig.red(), "https", &[]);
    assert_eq!(code, 200, "{body}");
    rig.wait_records(4);

    // A daemon restart keeps the count (red has used 126 today).
    rig.budget(&["red", "--tokens", "100"]);
    let (code, body) = rig.post(rig.red(), "https", &[]);
    refused(code, &body);
    rig.daemon.ok(&["daemon", "stop"]);
    rig.daemon.start(&rig.topo, &rig.upstream);
    wait_until("the tunnel after the restart", DEADLINE, || {
        rig.red().nudge();
        rig.post(rig.red(), "https", &[]).0 != 0
    });
    let (code, body) = rig.post(rig.red(), "https", &[]);
    refused(code, &body);
    rig.wait_records(4);

    // A global budget counts every sandbox together: blue, with 42 of its
    // own, is past a global 150 (168 in all).
    rig.budget(&["--global", "--tokens", "150"]);
    let (code, body) = rig.post(rig.blue(), "https", &[]);
    let msg = refused(code, &body);
    assert!(msg.contains("global daily token budget (all sandboxes together)"), "{msg}");
    assert!(msg.contains("ppp policy budget set --global --tokens 300"), "{msg}");
}

#[test]
fn an_ask_budget_holds_for_approval_and_a_cost_budget_prices() {
    let rig = rig();
    rig.budget(&["red", "--tokens", "40", "--ask"]);
    let (code, body) = rig.post(rig.red(), "https", &[]);
    assert_eq!(code, 200, "{body}");
    rig.wait_records(1);
    // Past it: held, listed as a budget's, and an allow lets it go.
    let c = rig.spawn(rig.red());
    let p = rig.held();
    assert!(p["budget"].as_str().unwrap().contains("daily token budget of sandbox `red`"), "{p}");
    let table = rig.daemon.ok(&["policy", "approval", "ls"]);
    assert!(table.contains("budget: api.anthropic.com:443"), "{table}");
    assert_eq!(rig.upstream_saw().len(), 1, "held, not sent");
    // A rule is no answer to a budget.
    let out =
        rig.daemon.ppp(&["policy", "approval", "allow", p["id"].as_str().unwrap(), "--sandbox"]).output().unwrap();
    assert!(!out.status.success(), "{}", describe(&out));
    rig.daemon.ok(&["policy", "approval", "allow", p["id"].as_str().unwrap()]);
    let (code, body) = finish(c);
    assert_eq!(code, 200, "{body}");
    assert_eq!(rig.upstream_saw().len(), 2);
    assert_eq!(key_of(&rig.upstream_saw()[1]).as_deref(), Some(KEY), "the key went in after the approval");
    rig.wait_records(2);
    // Raised once, to 80: 84 used, so the next is held again; deny is the 429.
    let c = rig.spawn(rig.red());
    let p = rig.held();
    assert!(p["budget"].as_str().unwrap().contains("raised once from 40 tokens"), "{p}");
    rig.daemon.ok(&["policy", "approval", "deny", p["id"].as_str().unwrap()]);
    let (code, body) = finish(c);
    refused(code, &body);
    assert_eq!(rig.upstream_saw().len(), 2);
    // Held again; raising the budget on the host releases it, no answer
    // needed: the reload checks the held requests again.
    let c = rig.spawn(rig.red());
    rig.held();
    rig.budget(&["red", "--tokens", "1k", "--ask"]);
    let (code, body) = finish(c);
    assert_eq!(code, 200, "{body}");
    assert!(rig.pending().is_empty());
    rig.wait_records(3);

    // A cost budget, priced with the built-in table: the three requests
    // cost more than a tenth of a cent together.
    rig.daemon.ok(&["policy", "budget", "rm", "red"]);
    rig.budget(&["red", "--cost", "0.0006", "--per", "total"]);
    let (code, body) = rig.post(rig.red(), "https", &[]);
    let msg = refused(code, &body);
    assert!(msg.contains("total cost budget of sandbox `red`"), "{msg}");
    assert!(!msg.contains("no price"), "the model has a price: {msg}");
    let ls = rig.daemon.ok(&["policy", "budget", "ls"]);
    assert!(!ls.contains("unpriced"), "{ls}");
    rig.budget(&["red", "--cost", "5", "--per", "total"]);
    let (code, body) = rig.post(rig.red(), "https", &[]);
    assert_eq!(code, 200, "{body}");
    rig.wait_records(4);

    // Nobody answers an `ask` budget: the 429 once the approval timeout
    // passes (the rules still allow the host, so only the budget holds).
    rig.daemon.ok(&["policy", "default", "ask", "--timeout", "2"]);
    rig.budget(&["red", "--tokens", "1", "--ask"]);
    let started = std::time::Instant::now();
    let (code, body) = rig.post(rig.red(), "https", &[]);
    refused(code, &body);
    assert!(started.elapsed() >= Duration::from_secs(2), "refused before the timeout");
    assert!(rig.pending().is_empty());
}

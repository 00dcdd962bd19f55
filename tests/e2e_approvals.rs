//! Approvals for real: an `ask` default holds a guest's request in the
//! real daemon and mitmdump (through wireguard-go in network namespaces)
//! until `ppp policy approval allow|deny` answers it, a timeout passes or
//! the daemon goes away. The guest is the attacker: its requests are the
//! ones held, and nothing it sends answers them.

#[path = "support/netns.rs"]
mod netns;
#[path = "support/tmux.rs"]
mod tmux;

use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use netns::{Daemon, Guest, NetnsEtc, Topology, Upstream, describe, wait_until};
use serde_json::Value;

const RED: u16 = 51820;
const BLUE: u16 = 51821;
/// Public (not internal), so the default decides for it; it is routed only
/// inside the test's namespaces.
const PUBLIC_IP: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 10);
const NAMES: [&str; 8] =
    ["open.test", "held.test", "secure.test", "retry.test", "slow.test", "many.test", "wanted.test", "carved.test"];

/// Fields drop in order: guests, then the daemon, then the rest.
struct Rig {
    guests: Vec<Guest>,
    daemon: Daemon,
    /// The server on [`PUBLIC_IP`], which the held requests go to.
    public: Upstream,
    _upstream: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

fn rig() -> Rig {
    let topo = Topology::new(2);
    let upstream = Upstream::start(&topo);
    let public = Upstream::start_public(&topo, &upstream, PUBLIC_IP, &NAMES);
    let etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED), ("blue", BLUE)]);
    daemon.ok(&["policy", "default", "ask"]);
    // A rule still decides before the default: this name is never held.
    daemon.ok(&["policy", "allow", "network", "--sandbox", "red", "open.test"]);
    daemon.start(&topo, &upstream);
    let mut rig = Rig { guests: Vec::new(), daemon, public, _upstream: upstream, _etc: etc, topo };
    rig.guests = vec![
        Guest::up(&rig.topo, 1, &rig.daemon.conf(RED), RED),
        Guest::up(&rig.topo, 2, &rig.daemon.conf(BLUE), BLUE),
    ];
    for g in &rig.guests {
        assert!(g.handshake_within(netns::DEADLINE), "guest {} got no handshake", g.index);
    }
    rig
}

/// `curl` in the guest, in the background: the request may be held.
fn spawn_curl(g: &Guest, args: &[&str]) -> Child {
    Command::new("ip")
        .args(["netns", "exec", &g.ns, "curl", "-sS", "-m", "60", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The body and status code of a finished [`spawn_curl`].
fn finish(c: Child) -> (String, String) {
    let out = c.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    (format!("{body}{}", String::from_utf8_lossy(&out.stderr)), code.to_owned())
}

fn http(name: &str, path: &str) -> Vec<String> {
    vec!["--resolve".into(), format!("{name}:80:{PUBLIC_IP}"), format!("http://{name}{path}")]
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn pending(d: &Daemon) -> Vec<Value> {
    serde_json::from_str::<Value>(&d.ok(&["policy", "approval", "ls", "--json"])).unwrap().as_array().unwrap().clone()
}

/// Wait for the held request to `host` with `path` (any path when None).
fn held(d: &Daemon, sandbox: &str, host: &str, path: Option<&str>) -> Value {
    let mut found = None;
    wait_until(&format!("{sandbox}'s request to {host} to be held"), netns::DEADLINE, || {
        found = pending(d)
            .into_iter()
            .find(|p| p["sandbox"] == sandbox && p["host"] == host && path.is_none_or(|x| p["path"] == x));
        found.is_some()
    });
    found.unwrap()
}

fn upstream_saw(rig: &Rig, path: &str) -> usize {
    rig.public.requests().iter().filter(|r| r["path"] == path).count()
}

#[test]
fn held_requests_wait_for_the_users_answer() {
    netns::require_env();
    let rig = rig();
    let (red, blue) = (&rig.guests[0], &rig.guests[1]);
    let d = &rig.daemon;

    // A rule decides before the default: not held.
    let (body, code) = finish(spawn_curl(red, &args(&http("open.test", "/ruled"))));
    assert_eq!(code, "200", "{body}");
    assert!(pending(d).is_empty());

    // --once: the request waits, then goes through, and upstream sees it once.
    let c = spawn_curl(red, &args(&http("held.test", "/once")));
    let p = held(d, "red", "held.test", Some("/once"));
    assert_eq!(p["method"], "GET");
    assert_eq!(p["port"], 80);
    assert_eq!(p["count"], 1);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(upstream_saw(&rig, "/once"), 0, "a held request does not reach upstream");
    let out = d.ppp(&["policy", "approval", "ls"]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("held.test:80") && table.contains("/once"), "{table}");
    d.ok(&["policy", "approval", "allow", p["id"].as_str().unwrap(), "--once"]);
    let (body, code) = finish(c);
    assert_eq!(code, "200", "{body}");
    assert_eq!(upstream_saw(&rig, "/once"), 1);
    assert!(pending(d).is_empty(), "the answered entry is gone");
    // Once means once: the next request is held again.
    let c = spawn_curl(red, &args(&http("held.test", "/again")));
    let p = held(d, "red", "held.test", Some("/again"));

    // --sandbox: a rule with source `approval`, for red only.
    d.ok(&["policy", "approval", "allow", p["id"].as_str().unwrap(), "--sandbox"]);
    assert_eq!(finish(c).1, "200");
    let rules = d.ok(&["policy", "ls", "red", "--source", "approval", "--json"]);
    assert!(rules.contains("held.test:80"), "{rules}");
    let (body, code) = finish(spawn_curl(red, &args(&http("held.test", "/third"))));
    assert_eq!(code, "200", "the rule lets the next request through unheld: {body}");
    assert!(pending(d).is_empty());
    // Blue has no such rule: held.
    let c = spawn_curl(blue, &args(&http("held.test", "/blue")));
    let p = held(d, "blue", "held.test", Some("/blue"));

    // deny: 403, never upstream.
    d.ok(&["policy", "approval", "deny", p["id"].as_str().unwrap()]);
    let (body, code) = finish(c);
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("denied by you"), "{body}");
    assert_eq!(upstream_saw(&rig, "/blue"), 0);
    // `policy rm --source approval` takes the lasting answers back.
    d.ok(&["policy", "rm", "network", "--sandbox", "red", "--source", "approval"]);
    let c = spawn_curl(red, &args(&http("held.test", "/after-rm")));
    let p = held(d, "red", "held.test", Some("/after-rm"));
    d.ok(&["policy", "approval", "deny", p["id"].as_str().unwrap()]);
    assert_eq!(finish(c).1, "403");

    // HTTPS is held at the ClientHello, by its SNI, before any upstream
    // connection; once allowed, the request inside goes on.
    let ca = rig.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
    let tls = [
        "--cacert".to_owned(),
        ca.display().to_string(),
        "--resolve".to_owned(),
        format!("secure.test:443:{PUBLIC_IP}"),
        "https://secure.test/tls".to_owned(),
    ];
    let c = spawn_curl(red, &args(&tls));
    let p = held(d, "red", "secure.test", None);
    assert_eq!(p["protocol"], "tls");
    assert_eq!(p["port"], 443);
    d.ok(&["policy", "approval", "allow", p["id"].as_str().unwrap()]);
    let (body, code) = finish(c);
    assert_eq!(code, "200", "{body}");
    assert_eq!(upstream_saw(&rig, "/tls"), 1);

    // A retry loop: identical requests are one entry with a count, and one
    // answer releases them all.
    let many: Vec<Child> = (0..5).map(|_| spawn_curl(red, &args(&http("retry.test", "/same")))).collect();
    wait_until("five identical requests to share an entry", netns::DEADLINE, || {
        pending(d).iter().any(|p| p["host"] == "retry.test" && p["count"] == 5)
    });
    assert_eq!(pending(d).len(), 1);
    let id = pending(d)[0]["id"].as_str().unwrap().to_owned();
    d.ok(&["policy", "approval", "allow", &id]);
    for c in many {
        assert_eq!(finish(c).1, "200");
    }
    assert_eq!(upstream_saw(&rig, "/same"), 5);

    // Nobody answers: 403 once the timeout passes, and the entry is gone.
    d.ok(&["policy", "default", "ask", "--timeout", "2"]);
    let started = Instant::now();
    let c = spawn_curl(red, &args(&http("slow.test", "/late")));
    held(d, "red", "slow.test", Some("/late"));
    let (body, code) = finish(c);
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("nobody answered"), "{body}");
    assert!(started.elapsed() >= Duration::from_secs(2), "denied before the timeout");
    assert!(pending(d).is_empty(), "a timed-out entry leaves the list");
    assert_eq!(upstream_saw(&rig, "/late"), 0);
    // An answer to it now is an error that says what happened.
    let out = d.ppp(&["policy", "approval", "allow", "00000000"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("approval ls"), "{}", describe(&out));
}

/// The attack: a request held under the `ask` default on a host with HTTP
/// rules, while the user writes an HTTP deny for exactly that path. The
/// deny wins, as a network deny would: the hold ends with a 403 (woken by
/// the reload), and an approval given to a request the deny covers cannot
/// let it through either. Before the fix the hold re-decided only the
/// network rules, and the user's yes sent the denied path upstream.
#[test]
fn an_http_deny_written_during_a_hold_wins_over_the_approval() {
    netns::require_env();
    let rig = rig();
    let red = &rig.guests[0];
    let d = &rig.daemon;
    // An HTTP allow under an `ask` default still asks (it opens no host).
    d.ok(&["policy", "allow", "http", "--sandbox", "red", "carved.test:80", "--method", "GET", "--path", "/repo/**"]);

    let c = spawn_curl(red, &args(&http("carved.test", "/repo/push")));
    let p = held(d, "red", "carved.test", Some("/repo/push"));
    // The user denies the path by an HTTP rule while the request waits.
    d.ok(&["policy", "deny", "http", "--sandbox", "red", "carved.test:80", "--method", "GET", "--path", "/repo/push"]);
    let (body, code) = finish(c);
    assert_eq!(code, "403", "the HTTP deny ends the hold: {body}");
    assert_eq!(upstream_saw(&rig, "/repo/push"), 0);
    let out = d.ppp(&["policy", "approval", "allow", p["id"].as_str().unwrap()]).output().unwrap();
    assert!(!out.status.success(), "the entry is gone: {}", describe(&out));

    // A path the deny does not cover is still the user's, and goes on yes.
    let c = spawn_curl(red, &args(&http("carved.test", "/repo/read")));
    let p = held(d, "red", "carved.test", Some("/repo/read"));
    d.ok(&["policy", "approval", "allow", p["id"].as_str().unwrap()]);
    let (body, code) = finish(c);
    assert_eq!(code, "200", "{body}");
    assert_eq!(upstream_saw(&rig, "/repo/read"), 1);
}

#[test]
fn fifty_held_requests_from_two_sandboxes_are_answered_each_as_told() {
    netns::require_env();
    let rig = rig();
    let d = &rig.daemon;
    let mut children = Vec::new();
    for i in 0..50 {
        let g = &rig.guests[i % 2];
        children.push((i, spawn_curl(g, &args(&http("many.test", &format!("/r{i}"))))));
    }
    wait_until("fifty requests to be held", Duration::from_secs(60), || pending(d).len() == 50);
    let list = pending(d);
    assert_eq!(list.iter().filter(|p| p["sandbox"] == "red").count(), 25);
    assert_eq!(list.iter().filter(|p| p["sandbox"] == "blue").count(), 25);
    for p in &list {
        let path = p["path"].as_str().unwrap();
        let i: usize = path[2..].parse().unwrap();
        assert_eq!(p["sandbox"], if i.is_multiple_of(2) { "red" } else { "blue" }, "{p}");
        let verb = if i.is_multiple_of(3) { "deny" } else { "allow" };
        d.ok(&["policy", "approval", verb, p["id"].as_str().unwrap()]);
    }
    for (i, c) in children {
        let (body, code) = finish(c);
        let want = if i.is_multiple_of(3) { "403" } else { "200" };
        assert_eq!(code, want, "request {i}: {body}");
        assert_eq!(upstream_saw(&rig, &format!("/r{i}")), usize::from(!i.is_multiple_of(3)), "request {i}");
    }
    assert!(pending(d).is_empty());
}

#[test]
fn the_guest_cannot_answer_its_own_requests_and_a_dead_daemon_fails_them_closed() {
    netns::require_env();
    let rig = rig();
    let red = &rig.guests[0];
    let d = &rig.daemon;
    let policy_before = std::fs::read(d.root.join("config/policies.yaml")).unwrap();
    let red_before = std::fs::read(d.data().join("sandboxes/red/policy.yaml")).unwrap();
    let c = spawn_curl(red, &args(&http("wanted.test", "/x")));
    let p = held(d, "red", "wanted.test", Some("/x"));
    let id = p["id"].as_str().unwrap();

    // What the guest can send: requests naming ppp's own host, the tunnel's
    // addresses, the daemon's words. None of it reaches the queue.
    let attempts: Vec<Vec<String>> = vec![
        vec![format!("http://mitm.it/approval/{id}/allow")],
        vec!["-X".into(), "POST".into(), format!("http://mitm.it/policy/approval/allow?id={id}")],
        vec!["-H".into(), "Host: mitm.it".into(), format!("http://{PUBLIC_IP}/approve/{id}")],
        vec!["--connect-timeout".into(), "3".into(), format!("http://10.0.0.1:8080/answer/{id}")],
        vec!["--connect-timeout".into(), "3".into(), format!("http://10.0.0.53/answer/{id}")],
    ];
    for a in &attempts {
        let (body, code) = finish(spawn_curl(red, &args(a)));
        assert_ne!(code, "200", "{a:?} answered 200: {body}");
    }
    // The guest's own retries only add to the count; and a raw line of the
    // daemon's protocol sent anywhere in the tunnel is just bytes to a
    // destination the policy holds or refuses.
    let line = format!("{{\"op\":\"answer\",\"id\":\"{id}\",\"verdict\":\"allow\"}}");
    let _ = red.run(&["bash", "-c", &format!("echo '{line}' > /dev/tcp/10.0.0.1/80")]);
    let still = held(d, "red", "wanted.test", Some("/x"));
    assert_eq!(still["id"], p["id"], "the entry is still waiting");
    assert_eq!(upstream_saw(&rig, "/x"), 0);
    assert_eq!(std::fs::read(d.root.join("config/policies.yaml")).unwrap(), policy_before, "policy unchanged");
    assert_eq!(
        std::fs::read(d.data().join("sandboxes/red/policy.yaml")).unwrap(),
        red_before,
        "sandbox policy unchanged"
    );

    // The daemon goes away while the request is held: it fails closed.
    let status: Value = serde_json::from_str(&d.ok(&["daemon", "status", "--json"])).unwrap();
    let pid = i32::try_from(status["pid"].as_i64().expect("daemon pid")).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let (body, code) = finish(c);
    assert_ne!(code, "200", "a held request went through when the daemon died: {body}");
    assert_eq!(upstream_saw(&rig, "/x"), 0, "a held request reached upstream after the daemon died");
}

/// The dashboard shows held requests as they arrive and answers them with
/// a key, on a real terminal (tmux).
#[test]
fn the_dashboard_answers_held_requests_with_a_key() {
    netns::require_env();
    let rig = rig();
    let (red, d) = (&rig.guests[0], &rig.daemon);
    let cmd = d.ppp(&["tui"]);
    let vars: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}='{}'", k.to_string_lossy(), v?.to_string_lossy())))
        .collect();
    let script = rig.topo.path().join("tui.sh");
    std::fs::write(
        &script,
        format!(
            "env -i {} TERM=\"$TERM\" {} tui\necho \"ppp exited with $?\"\n",
            vars.join(" "),
            cmd.get_program().to_string_lossy()
        ),
    )
    .unwrap();
    let t = tmux::Tmux::start(rig.topo.path(), 140, 30);
    t.keys(&[&format!("sh {}", script.display()), "Enter"]);
    t.wait_within(Duration::from_secs(30), "the dashboard", |s| s.contains("daemon running"));

    let c = spawn_curl(red, &args(&http("held.test", "/from-tui")));
    t.wait_within(netns::DEADLINE, "the waiting count in the title", |s| {
        s.contains("1 request waiting for approval (p)")
    });
    t.keys(&["p"]);
    t.wait_within(netns::DEADLINE, "the held request", |s| s.contains("held.test:80") && s.contains("/from-tui"));
    t.keys(&["a"]);
    let (body, code) = finish(c);
    assert_eq!(code, "200", "{body}");
    assert_eq!(upstream_saw(&rig, "/from-tui"), 1);
    t.wait_within(netns::DEADLINE, "the answer in the status line", |s| s.contains("allowed"));

    let c = spawn_curl(red, &args(&http("held.test", "/refused-in-tui")));
    t.wait_within(netns::DEADLINE, "the second request", |s| s.contains("/refused-in-tui"));
    t.keys(&["d"]);
    assert_eq!(finish(c).1, "403");
    assert_eq!(upstream_saw(&rig, "/refused-in-tui"), 0);
    t.keys(&["q"]);
    t.wait_within(Duration::from_secs(10), "ppp to exit", |s| s.contains("ppp exited with 0"));
}

/// A raw TCP stream (no HTTP, no TLS) is held at its start, with no bytes
/// to upstream until the answer; allowed once, it carries data both ways.
#[test]
fn a_raw_tcp_stream_is_held_at_its_start() {
    netns::require_env();
    let rig = rig();
    let (red, d) = (&rig.guests[0], &rig.daemon);
    let script = format!(
        "exec 3<>/dev/tcp/{PUBLIC_IP}/7 && echo hello >&3 && if read -r -t 50 l <&3; then echo \"got:$l\"; else echo none; fi"
    );
    let start = || {
        Command::new("ip")
            .args(["netns", "exec", &red.ns, "bash", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let held_stream = || {
        let mut p = None;
        wait_until("the TCP stream to be held", netns::DEADLINE, || {
            p = pending(d).into_iter().find(|p| p["protocol"] == "tcp" && p["port"] == 7);
            p.is_some()
        });
        p.unwrap()
    };
    let c = start();
    let p = held_stream();
    assert_eq!(p["ip"], PUBLIC_IP.to_string());
    assert!(p["method"].is_null() && p["path"].is_null(), "{p}");
    d.ok(&["policy", "approval", "allow", p["id"].as_str().unwrap()]);
    let out = c.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "got:hello", "{}", describe(&out));

    // Denied: the stream is cut, nothing echoes.
    let c = start();
    d.ok(&["policy", "approval", "deny", held_stream()["id"].as_str().unwrap()]);
    let out = c.wait_with_output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("got:hello"), "{}", describe(&out));
}

/// The read loop waits while a request is held: headers an `ask` default
/// holds, then a chunked body pushed behind them as fast as the tunnel
/// takes it. mitmproxy queues, without a limit, what a paused layer's
/// connection reads; so while the user has not answered mitmdump must not
/// read the body at all, and TCP backpressure must keep it in the guest.
/// On d08a563 without the wait in `drain_writers`, the guest's 256 MiB all
/// went into mitmdump's queue.
#[test]
fn a_body_pushed_behind_held_headers_stays_in_the_guest() {
    /// What the guest tries to push, and what may leave it while held.
    const TOTAL: u64 = 256 << 20;
    const BOUND: u64 = 32 << 20;
    netns::require_env();
    let rig = rig();
    let (red, d) = (&rig.guests[0], &rig.daemon);
    let status: Value = serde_json::from_str(&d.ok(&["daemon", "status", "--json"])).unwrap();
    let mitm = u32::try_from(status["mitmdump_pid"].as_i64().expect("mitmdump pid")).unwrap();
    netns::reset_peak(mitm);
    let (before, _) = netns::memory_kib(mitm);
    let mut c = Command::new("ip")
        .args(["netns", "exec", &red.ns])
        .arg(netns::venv_python())
        .arg(netns::flood_script())
        .args(["held", &PUBLIC_IP.to_string(), "held.test", &TOTAL.to_string(), "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let p = held(d, "red", "held.test", Some("/held-body"));
    assert_eq!(p["method"], "POST");
    let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let pushed: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let (_, peak) = netns::memory_kib(mitm);
    let sent = pushed["sent"].as_u64().unwrap();
    let grew = peak.saturating_sub(before) * 1024;
    eprintln!("while held: {} KiB left the guest, mitmdump's peak grew by {} KiB", sent >> 10, grew >> 10);
    assert!(
        pushed["stalled"] == true && sent < BOUND,
        "the guest pushed {} MiB of body behind held headers ({pushed}); mitmdump's peak grew by {} MiB",
        sent >> 20,
        grew >> 20
    );
    assert!(grew < BOUND, "mitmdump's peak grew by {} MiB while the request was held", grew >> 20);
    assert!(pending(d).iter().any(|q| q["id"] == p["id"]), "still held");
    assert_eq!(upstream_saw(&rig, "/held-body"), 0);

    // Denied: refused without the body ever going anywhere.
    d.ok(&["policy", "approval", "deny", p["id"].as_str().unwrap()]);
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let reply: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert!(!reply["reply"].as_str().unwrap().contains(" 200"), "{reply}");
    let _ = c.wait();
    assert_eq!(upstream_saw(&rig, "/held-body"), 0, "the held body reached upstream");
}

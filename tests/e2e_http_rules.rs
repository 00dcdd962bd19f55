//! HTTP rules (issue 30, point 1; ADR 0050) through the real daemon and
//! mitmdump, from WireGuard guests in network namespaces: methods and paths
//! allowed and denied over HTTPS through the tunnel, every canonicalisation
//! trick a guest can play with the path, method and names, a network deny
//! that an HTTP allow cannot open, and a connection ppp cannot inspect
//! refused on a host with HTTP rules.
//!
//! `red` has HTTP rules on `echo.test`; `blue` reaches the same upstream
//! with none, so every refusal is shown to be the rules' and not the rig's.

#[path = "support/netns.rs"]
mod netns;

use netns::{Daemon, Guest, NetnsEtc, Topology, UPSTREAM_IP, Upstream, describe, wait_until};
use serde_json::Value;

const RED: u16 = 51820;
const BLUE: u16 = 51821;

/// Fields drop in order: guests, then the daemon, then the rest.
struct Rig {
    guests: Vec<Guest>,
    daemon: Daemon,
    upstream: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

impl Rig {
    fn flows(&self) -> Vec<Value> {
        std::fs::read_to_string(self.daemon.data().join("flows.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn ca(&self) -> String {
        self.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem").display().to_string()
    }

    /// `curl` in guest `g` to `https://echo.test` (resolved to the
    /// upstream) with `args` and `url`: the body and the status.
    fn https(&self, g: usize, args: &[&str], url: &str) -> (String, String) {
        let ca = self.ca();
        let resolve = format!("echo.test:443:{UPSTREAM_IP}");
        let mut full = vec!["-o", "-", "-w", "\n%{http_code}", "--cacert", &ca, "--resolve", &resolve];
        // HTTP/1.1 unless the test asks for HTTP/2: curl would negotiate h2
        // through ALPN, and absolute-form and odd methods are HTTP/1's.
        if !args.contains(&"--http2") {
            full.push("--http1.1");
        }
        full.extend_from_slice(args);
        full.push(url);
        let out = self.guests[g].curl(&full);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
        (body.to_owned(), code.to_owned())
    }

    /// Whether the upstream saw a request whose raw path is `path`.
    fn reached(&self, path: &str) -> bool {
        self.upstream.requests().iter().any(|r| r["path"] == path)
    }
}

fn rig() -> Rig {
    let topo = Topology::new(2);
    let upstream = Upstream::start(&topo);
    let etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED), ("blue", BLUE)]);
    for s in ["red", "blue"] {
        // 198.18.0.0/15 is not public: the upstream's address needs its own
        // rule besides the name's (the rebinding defence).
        daemon.ok(&["policy", "allow", "network", "--sandbox", s, &format!("echo.test,denied.test,{UPSTREAM_IP}")]);
    }
    daemon.ok(&[
        "policy",
        "allow",
        "http",
        "--sandbox",
        "red",
        "echo.test",
        "--method",
        "GET,HEAD",
        "--path",
        "/repos/org/**",
    ]);
    daemon.ok(&[
        "policy",
        "deny",
        "http",
        "--sandbox",
        "red",
        "echo.test",
        "--method",
        "ANY",
        "--path",
        "/repos/org/secret/**",
    ]);
    // A network deny is the floor: this HTTP allow opens nothing.
    daemon.ok(&["policy", "deny", "network", "--sandbox", "red", "denied.test"]);
    daemon.ok(&["policy", "allow", "http", "--sandbox", "red", "denied.test", "--method", "ANY", "--path", "/**"]);
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

#[test]
fn methods_and_paths_are_decided_by_the_http_rules_whatever_the_guest_sends() {
    const RED_G: usize = 0;
    const BLUE_G: usize = 1;
    netns::require_env();
    let rig = rig();

    // Allowed: GET and HEAD under /repos/org/.
    let (body, code) = rig.https(RED_G, &[], "https://echo.test/repos/org/x?ref=main");
    assert_eq!(code, "200", "{body}");
    let (body, code) = rig.https(RED_G, &["-I"], "https://echo.test/repos/org/y");
    assert_eq!(code, "200", "{body}");
    // Logged with the HTTP rule that decided, the method and the path.
    wait_until("the allowed GET in flows.jsonl", netns::DEADLINE, || {
        rig.flows().iter().any(|f| {
            f["method"] == "GET"
                && f["path"] == "/repos/org/x"
                && f["decision"] == "allow"
                && f["matched_rule"].is_string()
        })
    });

    // A push (POST, PUT) and another org are denied, with the hint.
    for (args, url) in [
        (&["-X", "POST", "-d", "x"][..], "https://echo.test/repos/org/x"),
        (&["-X", "PUT", "-d", "x"][..], "https://echo.test/repos/org/push"),
        (&[][..], "https://echo.test/repos/other/x"),
    ] {
        let (body, code) = rig.https(RED_G, args, url);
        assert_eq!(code, "403", "{url} {args:?}: {body}");
        assert!(body.contains("no HTTP rule allows"), "{body}");
        assert!(body.contains("to allow: ppp policy allow http --sandbox red echo.test --method "), "{body}");
    }
    assert!(!rig.reached("/repos/org/push") && !rig.reached("/repos/other/x"), "a denied request went upstream");
    // The HTTP deny inside the allow wins.
    let (body, code) = rig.https(RED_G, &[], "https://echo.test/repos/org/secret/key");
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("HTTP rule"), "{body}");
    // blue has no HTTP rules: the same requests pass.
    let (body, code) = rig.https(BLUE_G, &["-X", "PUT", "-d", "x"], "https://echo.test/repos/other/x");
    assert_eq!(code, "200", "{body}");

    // Every trick on the path: refused, or decoded to what it means.
    for trick in [
        "/repos/org%2F..%2F..%2Fother/x",
        "/repos/org/%2e%2e/other/x",
        "/repos/org/%2E%2E%2Fother",
        "/repos/org/../other/x",
        "/repos/org/./../other",
        "/repos/org//x",
        "/repos/org;x=1/x",
        "/repos/org/x%00",
        "/repos/org/x%5C..%5Cother",
    ] {
        let url = format!("https://echo.test{trick}");
        let (body, code) = rig.https(RED_G, &["--path-as-is"], &url);
        assert_eq!(code, "403", "{trick}: {body}");
        assert!(body.contains("the path"), "{trick}: {body}");
        assert!(!rig.reached(trick), "{trick} reached the upstream");
    }
    let (body, code) = rig.https(RED_G, &["--path-as-is"], "https://echo.test/repos/%6Frg/decoded");
    assert_eq!(code, "200", "`%6F` is `o`: {body}");
    assert!(rig.reached("/repos/%6Frg/decoded"), "forwarded as sent");
    wait_until("the decoded path in flows.jsonl", netns::DEADLINE, || {
        rig.flows().iter().any(|f| f["path"] == "/repos/org/decoded" && f["decision"] == "allow")
    });

    // Absolute-form with the scheme and host in upper case: the same host,
    // the same rules.
    let (body, code) = rig.https(RED_G, &["--request-target", "HTTPS://ECHO.TEST/repos/org/abs"], "https://echo.test/");
    assert_eq!(code, "200", "{body}");
    let (body, code) =
        rig.https(RED_G, &["--request-target", "HTTPS://ECHO.TEST/repos/other/abs"], "https://echo.test/");
    assert_eq!(code, "403", "{body}");
    assert!(!rig.reached("/repos/other/abs"));

    // HTTP/2: `:path` decides; a Host that differs from `:authority` is
    // refused outright.
    let (body, code) = rig.https(RED_G, &["--http2"], "https://echo.test/repos/org/h2");
    assert_eq!(code, "200", "{body}");
    let (body, code) = rig.https(RED_G, &["--http2"], "https://echo.test/repos/other/h2");
    assert_eq!(code, "403", "{body}");
    let (body, code) = rig.https(RED_G, &["--http2", "-H", "Host: other.test"], "https://echo.test/repos/org/h2-host");
    assert_eq!(code, "403", "{body}");
    assert!(!rig.reached("/repos/other/h2") && !rig.reached("/repos/org/h2-host"));

    // A method the rules do not see: an override header, a lower-case method.
    for h in ["X-HTTP-Method-Override: DELETE", "X-HTTP-Method: PUT", "X-Method-Override: POST"] {
        let (body, code) = rig.https(RED_G, &["-H", h], "https://echo.test/repos/org/override");
        assert_eq!(code, "403", "{h}: {body}");
        assert!(body.contains("method-override"), "{body}");
    }
    let (body, code) = rig.https(RED_G, &["-X", "get"], "https://echo.test/repos/org/lower");
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("upper-case"), "{body}");
    assert!(!rig.reached("/repos/org/override") && !rig.reached("/repos/org/lower"));

    // A network deny beats an HTTP allow.
    let resolve = format!("denied.test:443:{UPSTREAM_IP}");
    let (body, code) = rig.https(RED_G, &["--resolve", &resolve], "https://denied.test/anything");
    assert_eq!(code, "403", "{body}");
    assert!(!rig.reached("/anything"));
}

/// A connection ppp cannot inspect (here raw TCP that is not HTTP) to a
/// host with HTTP rules is refused; the same to a sandbox whose host has
/// none passes. The connection has no name of its own: it belongs to the
/// name ppp's resolver answered the sandbox with its address.
#[test]
fn a_connection_ppp_cannot_inspect_is_refused_under_http_rules() {
    netns::require_env();
    let rig = rig();
    let line = |g: &Guest| {
        let dig = g.run(&["dig", "+time=3", "+tries=1", "@10.0.0.53", "echo.test", "A"]);
        assert!(String::from_utf8_lossy(&dig.stdout).contains(&UPSTREAM_IP.to_string()), "{}", describe(&dig));
        let script =
            format!("exec 3<>/dev/tcp/{UPSTREAM_IP}/7 || exit 1; echo raw-hello >&3; read -t 5 l <&3; echo \"got:$l\"");
        let out = g.run(&["timeout", "15", "bash", "-c", &script]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(line(&rig.guests[1]).contains("got:raw-hello"), "blue's raw TCP passes");
    let red = line(&rig.guests[0]);
    assert!(!red.contains("got:raw-hello"), "red's raw TCP to the HTTP-rule host got through: {red}");
    wait_until("the refused raw TCP in flows.jsonl", netns::DEADLINE, || {
        rig.flows().iter().any(|f| f["sandbox"] == "red" && f["kind"] == "tcp" && f["decision"] == "deny")
    });
}

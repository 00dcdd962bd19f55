//! Secrets are live (issue 22, point 2), as a guest would probe it: through
//! the real daemon and mitmdump, with a guest that has already talked to
//! the host (every cache warm) and keeps a kept-alive HTTP/1.1 connection
//! and an HTTP/2 connection open across every change. After each `ppp
//! secret set`, `set-custom` or `rm` returns, the very next request on a
//! new connection, on the kept-alive one and as a new HTTP/2 stream shows
//! the new state at the upstream; a rotated or removed value never shows
//! up again, not even on a connection hammered while the change is made.
//!
//! The service is `api.anthropic.com` over TLS, a real service's name: the
//! test's upstream holds a certificate for it and the test's DNS (in the
//! upstream namespace) answers it, so nothing leaves the namespaces.

#[path = "support/netns.rs"]
mod netns;

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use netns::{Daemon, Guest, NetnsEtc, SERVICE_NAME, Topology, UPSTREAM_IP, Upstream};
use serde_json::Value;

const RED: u16 = 51820;
/// The placeholder the guest sends in `x-custom`.
const CUSTOM: &str = "PPP_LIVE_TOKEN";

/// Fields drop in order: the probe, the guest, then the daemon, then the rest.
struct Rig {
    probe: Option<Probe>,
    guest: Option<Guest>,
    daemon: Daemon,
    upstream: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

/// `tests/support/secret_probe.py` in the guest: one JSON answer per command.
struct Probe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Probe {
    fn start(g: &Guest, ca: &Path) -> Probe {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/secret_probe.py");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &g.ns])
            .arg(netns::venv_python())
            .arg(script)
            .args([&UPSTREAM_IP.to_string(), "443", SERVICE_NAME, ca.to_str().unwrap()])
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("secret_probe.py starts in the guest");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Probe { child, stdin, stdout }
    }

    fn cmd(&mut self, line: &str) -> Value {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut out = String::new();
        self.stdout.read_line(&mut out).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("probe answered `{out}` to `{line}`: {e}"));
        assert!(v.get("error").is_none_or(Value::is_null), "probe `{line}`: {v}");
        v
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.probe.take();
        self.guest.take();
    }
}

fn rig() -> Rig {
    netns::require_env();
    let topo = Topology::new(1);
    let upstream = Upstream::start(&topo);
    let etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED)]);
    // 198.18.0.0/15 is not a public range: the rebinding defence wants an
    // address rule for the test upstream's address.
    daemon.ok(&["policy", "allow", "network", "--sandbox", "red", &format!("{SERVICE_NAME},{UPSTREAM_IP}")]);
    daemon.start(&topo, &upstream);
    let guest = Guest::up(&topo, 1, &daemon.conf(RED), RED);
    assert!(guest.handshake_within(netns::DEADLINE), "the guest got no handshake");
    let mut rig = Rig { probe: None, guest: Some(guest), daemon, upstream, _etc: etc, topo };
    let ca = rig.ca();
    rig.probe = Some(Probe::start(rig.guest.as_ref().unwrap(), &ca));
    rig
}

/// What the upstream received for one request: the header ppp injects and
/// the one whose placeholder it substitutes.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    key: Option<String>,
    custom: Option<String>,
}

fn header(request: &Value, name: &str) -> Option<String> {
    request["headers"]
        .as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.as_str().map(str::to_owned))
}

impl Rig {
    fn ca(&self) -> PathBuf {
        self.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem")
    }

    fn probe(&mut self) -> &mut Probe {
        self.probe.as_mut().unwrap()
    }

    /// What the upstream saw for `path`; the request must have arrived.
    fn seen(&self, path: &str) -> Seen {
        let requests = self.upstream.requests();
        let r = requests.iter().rfind(|r| r["path"] == path).unwrap_or_else(|| panic!("{path} never reached upstream"));
        Seen { key: header(r, "x-api-key"), custom: header(r, "x-custom") }
    }

    /// One request of each kind, tagged `step`; what the upstream saw for
    /// each. The kept-alive and HTTP/2 requests must stay on the
    /// connections opened at the start.
    fn each_kind(&mut self, step: &str, ports: &(u64, u64)) -> Vec<(&'static str, Seen)> {
        let mut out = Vec::new();
        for kind in ["new", "keep", "h2"] {
            let tag = format!("{step}-{kind}");
            let r = self.probe().cmd(&format!("{kind} {tag}"));
            assert_eq!(r["status"], 200, "{kind} request at step `{step}`: {r}");
            let port = r["port"].as_u64().unwrap();
            match kind {
                "keep" => assert_eq!(port, ports.0, "the kept-alive connection was reopened at `{step}`"),
                "h2" => assert_eq!(port, ports.1, "the HTTP/2 connection was reopened at `{step}`"),
                _ => {}
            }
            out.push((kind, self.seen(&format!("/live/{tag}"))));
        }
        out
    }
}

/// One change: its name, the `ppp` command, what the upstream must see
/// next, and the values it revokes.
type Step<'a> = (&'a str, Vec<&'a str>, Seen, Vec<&'a str>);

#[test]
fn secret_changes_apply_to_the_next_request_on_every_connection() {
    let mut rig = rig();
    // Warm every cache: the placeholder passes through unreplaced and no
    // key is injected while none is stored.
    let warm: Vec<u64> = ["keep", "h2"]
        .iter()
        .map(|k| {
            let r = rig.probe.as_mut().unwrap().cmd(&format!("{k} warm"));
            assert_eq!(r["status"], 200, "{r}");
            r["port"].as_u64().unwrap()
        })
        .collect();
    let ports = (warm[0], warm[1]);

    let g1 = "sk-ant-live-GLOBAL-1111111111111111";
    let s1 = "sk-ant-live-SANDBOX-2222222222222222";
    let s2 = "sk-ant-live-ROTATED-3333333333333333";
    let cg = "custom-live-GLOBAL-9999999999999999";
    let c1 = "custom-live-VALUE-4444444444444444";
    let c2 = "custom-live-ROTATED-5555555555555555";
    let mut failures = Vec::new();
    let mut gone: Vec<&str> = Vec::new();
    let steps: Vec<Step> = vec![
        ("none", vec![], Seen { key: Some("ppp-proxy-managed".into()), custom: Some(CUSTOM.into()) }, vec![]),
        (
            "set-global",
            vec!["secret", "set", "-g", "anthropic", "-t", g1],
            Seen { key: Some(g1.into()), custom: Some(CUSTOM.into()) },
            vec![],
        ),
        (
            "set-sandbox",
            vec!["secret", "set", "red", "anthropic", "-t", s1],
            Seen { key: Some(s1.into()), custom: Some(CUSTOM.into()) },
            vec![],
        ),
        (
            "set-custom-global",
            vec!["secret", "set-custom", "--placeholder", CUSTOM, "--host", SERVICE_NAME, "--value", cg],
            Seen { key: Some(s1.into()), custom: Some(cg.into()) },
            vec![],
        ),
        (
            "set-custom",
            vec!["secret", "set-custom", "red", "--placeholder", CUSTOM, "--host", SERVICE_NAME, "--value", c1],
            Seen { key: Some(s1.into()), custom: Some(c1.into()) },
            vec![],
        ),
        (
            "rotate-sandbox",
            vec!["secret", "set", "red", "anthropic", "-t", s2],
            Seen { key: Some(s2.into()), custom: Some(c1.into()) },
            vec![s1],
        ),
        (
            "rotate-custom",
            vec!["secret", "set-custom", "red", "--placeholder", CUSTOM, "--host", SERVICE_NAME, "--value", c2],
            Seen { key: Some(s2.into()), custom: Some(c2.into()) },
            vec![c1],
        ),
        (
            "rm-sandbox",
            vec!["secret", "rm", "-f", "red", "anthropic"],
            Seen { key: Some(g1.into()), custom: Some(c2.into()) },
            vec![s2],
        ),
        (
            "rm-custom",
            vec!["secret", "rm", "-f", "red", CUSTOM],
            Seen { key: Some(g1.into()), custom: Some(cg.into()) },
            vec![c2],
        ),
        (
            "rm-custom-global",
            vec!["secret", "rm", "-f", "-g", CUSTOM],
            Seen { key: Some(g1.into()), custom: Some(CUSTOM.into()) },
            vec![cg],
        ),
        (
            "rm-global",
            vec!["secret", "rm", "-f", "-g", "anthropic"],
            Seen { key: Some("ppp-proxy-managed".into()), custom: Some(CUSTOM.into()) },
            vec![g1],
        ),
    ];
    for (step, argv, want, revoked) in steps {
        if !argv.is_empty() {
            rig.daemon.ok(&argv);
        }
        gone.extend(revoked);
        let since = rig.upstream.requests().len();
        for (kind, seen) in rig.each_kind(step, &ports) {
            if seen != want {
                failures.push(format!("{step} on {kind}: upstream saw {seen:?}, wanted {want:?}"));
            }
        }
        for r in &rig.upstream.requests()[since..] {
            let text = r["headers"].to_string();
            for old in &gone {
                if text.contains(old) {
                    failures.push(format!("{step}: revoked value `{old}` reached upstream at {}", r["path"]));
                }
            }
        }
    }
    assert!(failures.is_empty(), "secrets are not live:\n{}", failures.join("\n"));
}

/// The requests the upstream saw on the hammer's connection, by number.
fn race_requests(rig: &Rig) -> Vec<(u64, String)> {
    rig.upstream
        .requests()
        .iter()
        .filter_map(|r| {
            let n = r["path"].as_str()?.strip_prefix("/race/")?.parse().ok()?;
            Some((n, header(r, "x-api-key").unwrap_or_default()))
        })
        .collect()
}

#[test]
fn a_request_racing_the_change_never_gets_the_old_key_after_the_cli_returned() {
    race("keep");
}

#[test]
fn an_http2_stream_racing_the_change_never_gets_the_old_key_after_the_cli_returned() {
    race("h2");
}

/// A connection of `kind` hammered with requests while the key is rotated,
/// then removed: no request started after a command returned carries a
/// value that command revoked.
fn race(kind: &str) {
    let mut rig = rig();
    let (k1, k2) = ("sk-ant-race-FIRST-6666666666666666", "sk-ant-race-SECOND-777777777777777");
    rig.daemon.ok(&["secret", "set", "-g", "anthropic", "-t", k1]);
    rig.probe().cmd(&format!("hammer {kind}"));
    // Requests flow (and every cache is warm) before the change.
    netns::wait_until("the hammer to reach upstream with the key", netns::DEADLINE, || {
        race_requests(&rig).iter().filter(|(_, k)| k == k1).count() >= 20
    });
    let mut marks = Vec::new();
    for (argv, old) in [
        (vec!["secret", "set", "-g", "anthropic", "-t", k2], vec![k1]),
        (vec!["secret", "rm", "-f", "-g", "anthropic"], vec![k1, k2]),
    ] {
        rig.daemon.ok(&argv);
        let next = rig.probe().cmd("mark")["next"].as_u64().unwrap();
        marks.push((next, old));
        netns::wait_until("the hammer to go on after the change", netns::DEADLINE, || {
            race_requests(&rig).iter().filter(|(n, _)| *n >= next).count() >= 20
        });
    }
    let stopped = rig.probe().cmd("stop");
    assert!(stopped["sent"].as_u64().unwrap() > 40, "{stopped}");
    let seen = race_requests(&rig);
    let mut bad = Vec::new();
    for (next, old) in &marks {
        for (n, k) in seen.iter().filter(|(n, _)| n >= next) {
            if old.contains(&k.as_str()) {
                bad.push(format!("/race/{n} (sent after the change #{next} returned) carried `{k}`"));
            }
        }
    }
    assert!(bad.is_empty(), "{kind}: a revoked key was injected after the CLI returned:\n{}", bad.join("\n"));
    assert!(seen.iter().any(|(n, k)| *n >= marks[0].0 && *n < marks[1].0 && k == k2), "the rotated key was used");
}

#[test]
fn a_revocation_holds_when_the_daemon_cannot_reload_the_policy() {
    let mut rig = rig();
    let k = "sk-ant-broken-POLICY-888888888888888";
    let warm: Vec<u64> =
        ["keep", "h2"].iter().map(|c| rig.probe().cmd(&format!("{c} warm"))["port"].as_u64().unwrap()).collect();
    let ports = (warm[0], warm[1]);
    rig.daemon.ok(&["secret", "set", "-g", "anthropic", "-t", k]);
    for (kind, seen) in rig.each_kind("with-key", &ports) {
        assert_eq!(seen.key.as_deref(), Some(k), "{kind}: the key is injected before the change");
    }
    // A policy file half-edited by hand: the daemon keeps its old policy
    // and says so; the secret change is saved all the same.
    let policy = rig.daemon.dirs().sandbox_policy("red");
    let mut text = std::fs::read_to_string(&policy).unwrap();
    text.push_str("\nnetwork: [this is not\n");
    std::fs::write(&policy, text).unwrap();
    let out = rig.daemon.ppp(&["secret", "rm", "-f", "-g", "anthropic"]).output().unwrap();
    assert!(out.status.success(), "{}", netns::describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("did not reload its policy"), "the failed reload is reported: {stderr}");
    assert!(stderr.contains("applies to the next request all the same"), "{stderr}");
    let mut failures = Vec::new();
    for (kind, seen) in rig.each_kind("after-rm", &ports) {
        if seen.key.as_deref() == Some(k) {
            failures.push(format!("{kind}: the removed key was injected"));
        }
    }
    assert!(failures.is_empty(), "revocation failed while the policy could not be reloaded:\n{}", failures.join("\n"));
}

/// The reported case: a custom placeholder for the service's own host, set
/// while the daemon runs, used where the agent puts its key. The user's
/// placeholder is substituted there; the service key stored for the host
/// does not overwrite it.
#[test]
fn a_custom_placeholder_in_the_key_header_is_substituted_not_overwritten() {
    let mut rig = rig();
    let (g, c) = ("sk-ant-service-KEY-aaaaaaaaaaaaaaaa", "custom-in-KEY-HEADER-bbbbbbbbbbbbbb");
    rig.daemon.ok(&["secret", "set", "-g", "anthropic", "-t", g]);
    let seen = |rig: &mut Rig, tag: &str| {
        let r = rig.probe().cmd(&format!("auth {tag}"));
        assert_eq!(r["status"], 200, "{r}");
        rig.seen(&format!("/live/{tag}")).key
    };
    assert_eq!(seen(&mut rig, "before").as_deref(), Some(g), "no such placeholder: the service key goes in");
    rig.daemon.ok(&["secret", "set-custom", "--placeholder", CUSTOM, "--host", SERVICE_NAME, "--value", c]);
    assert_eq!(seen(&mut rig, "custom").as_deref(), Some(c), "the user's placeholder is substituted in the key header");
    rig.daemon.ok(&["secret", "rm", "-f", "-g", CUSTOM]);
    assert_eq!(seen(&mut rig, "after").as_deref(), Some(g), "the placeholder removed: the service key again");
}

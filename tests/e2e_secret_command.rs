//! Secrets from a command (issue 30, point 3), through the real daemon and
//! mitmdump on a netns guest, TLS to the service host inside the test's
//! namespaces (as `tests/e2e_secrets_live.rs`): `ppp secret set anthropic
//! --command …` runs a script in the test's temp dir on the host, which
//! prints a token from a counter file and counts its runs there. The value
//! rotates after `--refresh` and after the service answers 401; a guest that
//! provokes 401s in a loop cannot make the host run the command in a loop; a
//! failing command gives a 503 that names the secret and nothing the command
//! printed.

#[path = "support/netns.rs"]
mod netns;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netns::{Daemon, Guest, NetnsEtc, SERVICE_NAME, Topology, UPSTREAM_IP, Upstream};

const RED: u16 = 51820;
/// What the failing command prints on stdout and stderr: neither may reach
/// the guest, flows.jsonl or the proxy log.
const LEAK_OUT: &str = "partial-output-LEAKED-1234567890";
const LEAK_ERR: &str = "stderr-token-LEAKED-0987654321";

struct Rig {
    guest: Option<Guest>,
    daemon: Daemon,
    upstream: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.guest.take();
    }
}

fn rig() -> Rig {
    netns::require_env();
    let topo = Topology::new(1);
    let upstream = Upstream::start(&topo);
    let etc = NetnsEtc::new(&topo);
    let daemon = Daemon::deny_all(&topo, &[("red", RED)]);
    daemon.ok(&["policy", "allow", "network", "--sandbox", "red", &format!("{SERVICE_NAME},{UPSTREAM_IP}")]);
    daemon.start(&topo, &upstream);
    let guest = Guest::up(&topo, 1, &daemon.conf(RED), RED);
    assert!(guest.handshake_within(netns::DEADLINE), "the guest got no handshake");
    Rig { guest: Some(guest), daemon, upstream, _etc: etc, topo }
}

impl Rig {
    fn dir(&self) -> PathBuf {
        let d = self.topo.path().join("cmd");
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A script that counts its runs in `count` and prints `tok-<n>-…`.
    fn token_script(&self) -> (String, PathBuf) {
        let dir = self.dir();
        let script = dir.join("token.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\nn=$(cat \"$1/count\" 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > \"$1/count\"\necho \
             \"tok-$n-command-secret-abcdef\"\n",
        )
        .unwrap();
        (format!("/bin/sh {} {}", script.display(), dir.display()), dir.join("count"))
    }

    /// One request from the guest; its status and body.
    fn get(&self, path: &str) -> (u16, String) {
        let ca = self.topo.path().join("ppp/data/mitmproxy/mitmproxy-ca-cert.pem");
        let resolve = format!("{SERVICE_NAME}:443:{UPSTREAM_IP}");
        let url = format!("https://{SERVICE_NAME}{path}");
        let out = self.guest.as_ref().unwrap().curl(&[
            "--cacert",
            ca.to_str().unwrap(),
            "--resolve",
            &resolve,
            "-H",
            "x-api-key: ppp-proxy-managed",
            "-w",
            "\n%{http_code}",
            &url,
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
        (code.trim().parse().unwrap_or_else(|_| panic!("curl {path}: {}", netns::describe(&out))), body.to_owned())
    }

    /// The key the upstream saw on the request for `path`.
    fn key(&self, path: &str) -> Option<String> {
        let requests = self.upstream.requests();
        let r = requests.iter().rfind(|r| r["path"] == path).unwrap_or_else(|| panic!("{path} never reached upstream"));
        r["headers"]
            .as_object()?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("x-api-key"))
            .and_then(|(_, v)| v.as_str().map(str::to_owned))
    }

    fn ok_get(&self, path: &str) -> Option<String> {
        let (code, body) = self.get(path);
        assert_eq!(code, 200, "{path}: {body}");
        self.key(path)
    }
}

fn runs(count: &Path) -> u64 {
    std::fs::read_to_string(count).map_or(0, |s| s.trim().parse().unwrap())
}

fn tok(n: u64) -> String {
    format!("tok-{n}-command-secret-abcdef")
}

#[test]
fn a_command_secret_is_injected_and_rotates_after_its_refresh() {
    let rig = rig();
    let (cmd, count) = rig.token_script();
    rig.daemon.ok(&["secret", "set", "-g", "anthropic", "--host", SERVICE_NAME, "--command", &cmd, "--refresh", "1s"]);
    assert_eq!(runs(&count), 0, "setting the secret runs nothing: the daemon runs it when a request needs it");
    assert_eq!(rig.ok_get("/live/first").as_deref(), Some(tok(1).as_str()));
    // Past the refresh interval: the daemon's value and the addon's cache
    // (which honours the daemon's ttl) are both stale.
    std::thread::sleep(Duration::from_millis(2200));
    assert_eq!(rig.ok_get("/live/second").as_deref(), Some(tok(2).as_str()), "rotated after --refresh");
    let ls = rig.daemon.ok(&["secret", "ls"]);
    assert!(ls.contains("command") && ls.contains("1s"), "{ls}");
    let json = rig.daemon.ok(&["secret", "ls", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["source"], "command", "{json}");
    assert_eq!(v[0]["refresh"], 1, "{json}");
    assert!(v[0]["last_refresh"].is_string(), "{json}");
    for text in [&ls, &json] {
        assert!(!text.contains("tok-") && !text.contains("token.sh"), "no value, no command line: {text}");
    }
    // The guest never sees the value.
    let (_, body) = rig.get("/live/third");
    assert!(!body.contains("tok-"), "the echoed key is scrubbed: {body}");
}

#[test]
fn a_401_refreshes_the_value_once_and_a_401_loop_does_not_run_the_command_in_a_loop() {
    let rig = rig();
    let (cmd, count) = rig.token_script();
    rig.daemon.ok(&["secret", "set", "-g", "anthropic", "--host", SERVICE_NAME, "--command", &cmd, "--refresh", "1h"]);
    assert_eq!(rig.ok_get("/live/a").as_deref(), Some(tok(1).as_str()));
    assert_eq!(rig.ok_get("/live/b").as_deref(), Some(tok(1).as_str()), "cached for its refresh interval");
    let (code, _) = rig.get("/401/rejected");
    assert_eq!(code, 401);
    assert_eq!(rig.key("/401/rejected").as_deref(), Some(tok(1).as_str()));
    assert_eq!(rig.ok_get("/live/c").as_deref(), Some(tok(2).as_str()), "rotated after the service's 401");
    // The attack: a guest that makes the service reject it again and again.
    let start = Instant::now();
    for i in 0..25 {
        let (code, _) = rig.get(&format!("/401/loop-{i}"));
        assert_eq!(code, 401);
    }
    let after = rig.ok_get("/live/d");
    let elapsed = start.elapsed().as_secs();
    // One early refresh per 30 s per secret: in the loop's time at most
    // `elapsed / 30 + 1` more runs (none when it took under 30 s).
    let bound = 2 + elapsed / 30 + 1;
    let n = runs(&count);
    assert!(n <= bound, "a 401 loop ran the command {n} times in {elapsed} s (bound {bound})");
    if elapsed < 30 {
        assert_eq!(n, 2, "no run for the loop's 401s within 30 s of the last early refresh");
        assert_eq!(after.as_deref(), Some(tok(2).as_str()));
    }
}

#[test]
fn a_failing_command_gives_a_503_naming_the_secret_and_nothing_it_printed() {
    let rig = rig();
    let dir = rig.dir();
    let script = dir.join("fail.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nn=$(cat \"$1/count\" 2>/dev/null || echo 0)\necho $((n+1)) > \"$1/count\"\necho \
             {LEAK_OUT}\necho {LEAK_ERR} >&2\nexit 3\n"
        ),
    )
    .unwrap();
    let count = dir.join("count");
    let cmd = format!("/bin/sh {} {}", script.display(), dir.display());
    rig.daemon.ok(&["secret", "set", "red", "anthropic", "--host", SERVICE_NAME, "--command", &cmd]);
    let start = Instant::now();
    let mut bodies = Vec::new();
    for i in 0..10 {
        let (code, body) = rig.get(&format!("/live/fail-{i}"));
        assert_eq!(code, 503, "{body}");
        bodies.push(body);
    }
    let elapsed = start.elapsed().as_secs();
    assert!(bodies[0].contains("`anthropic` (red scope)"), "the 503 names the secret: {}", bodies[0]);
    assert!(bodies[0].contains("exited with status 3"), "{}", bodies[0]);
    assert!(rig.upstream.requests().iter().all(|r| r["path"] != "/live/fail-0"), "nothing went upstream");
    // A failure is remembered for 10 s: a guest retrying cannot make the
    // host run the command per request.
    let n = runs(&count);
    assert!(n <= 1 + elapsed / 10 + 1, "the failing command ran {n} times for 10 requests in {elapsed} s");
    let data = rig.daemon.data();
    let flows = std::fs::read_to_string(data.join("flows.jsonl")).unwrap_or_default();
    let log = std::fs::read_to_string(data.join("proxy.log")).unwrap_or_default();
    let daemon_log = std::fs::read_to_string(data.join("daemon.log")).unwrap_or_default();
    assert!(daemon_log.contains("its command `/bin/sh` failed"), "the daemon logs the failure:\n{daemon_log}");
    let ls = rig.daemon.ok(&["secret", "ls"]);
    let status = std::fs::read_to_string(data.join("secret-status.json")).unwrap();
    for (what, text) in [
        ("a 503 body", &bodies.join("\n")),
        ("flows.jsonl", &flows),
        ("proxy.log", &log),
        ("daemon.log", &daemon_log),
        ("secret ls", &ls),
        ("secret-status.json", &status),
    ] {
        assert!(!text.contains(LEAK_OUT) && !text.contains(LEAK_ERR), "{what} holds what the command printed:\n{text}");
    }
    assert!(ls.contains("failed"), "secret ls shows the failure: {ls}");
    assert!(status.contains("exited with status 3"), "{status}");
    let diag = rig.daemon.ok(&["diagnose", "-o", "table"]);
    assert!(diag.contains("anthropic") && diag.contains("exited with status 3"), "ppp diagnose shows it:\n{diag}");
    assert!(!diag.contains(LEAK_OUT) && !diag.contains(LEAK_ERR), "{diag}");
}

//! `ppp policy log -f` end to end: a request from inside a sandbox's VM
//! goes through the real WireGuard tunnel and the daemon's mitmdump, whose
//! addon logs it, and the follower prints it within a second of the request
//! completing, with method, path (never the query), status, bytes and
//! duration. The sandbox runs on the fake podman, as in `e2e_sandbox.rs`.
//!
//! Needs root (namespaces); fails, never skips, without it.

#[path = "support/netns.rs"]
mod netns;
#[path = "support/sandbox_env.rs"]
mod sandbox_env;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sandbox_env::Env;
use serde_json::Value;

/// How soon a completed flow must be printed: the feature's promise.
const PROMISE: Duration = Duration::from_secs(1);
/// ppp's start and backlog on a debug build under load.
const START: Duration = Duration::from_secs(30);

#[test]
fn policy_log_follow_prints_a_flow_within_a_second_of_its_completion() {
    let env = Env::new("qemu");
    env.ok(&["policy", "init", "deny-all"]);
    env.ok(&["policy", "allow", "network", "--sandbox", "red", "echo.test,198.18.0.10"]);
    let out = env.ok(&["create", "--name", "red", "opencode", &env.ws()]);
    assert!(out.contains("created sandbox `red`"), "{out}");
    // One flow of red's in the log, so the backlog shows when -f is ready.
    assert_eq!(env.denied_status("red"), "403");

    let mut child = env
        .ppp(&["policy", "log", "-f", "--json", "--limit", "1", "red"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel::<String>();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = lines.recv_timeout(START).expect("the backlog line");
    assert!(first.contains("\"denied.test\""), "{first}");

    // An allowed HTTPS request with a query from inside the VM.
    let body =
        env.ok(&["exec", "red", "--", "curl", "-sS", "-m", "15", "https://echo.test/followed/path?sig=tok-e2e-5555"]);
    let done = Instant::now();
    assert!(body.contains("/followed/path"), "the upstream saw the request: {body}");
    let line = loop {
        let left = (done + PROMISE).saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).expect("the request's flow within a second of its completion");
        if line.contains("/followed/path") {
            break line;
        }
    };
    assert!(!line.contains("tok-e2e-5555"), "the query is never logged: {line}");
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (&v["sandbox"], &v["host"], &v["method"]),
        (&"red".into(), &"echo.test".into(), &"GET".into()),
        "{line}"
    );
    assert_eq!((&v["path"], &v["status"], &v["decision"]), (&"/followed/path".into(), &200.into(), &"allow".into()));
    assert!(v["bytes_in"].as_u64().is_some_and(|n| n > 0), "{line}");
    assert!(v["bytes_out"].as_u64().is_some(), "{line}");
    assert!(v["duration_ms"].as_u64().is_some(), "{line}");
    let logged = std::fs::read_to_string(env.dirs().flows_log()).unwrap();
    assert!(!logged.contains("tok-e2e-5555"), "nor written to flows.jsonl");

    // Ctrl-C ends it with 0.
    kill(Pid::from_raw(i32::try_from(child.id()).unwrap()), Signal::SIGINT).unwrap();
    let end = Instant::now() + START;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "ppp did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

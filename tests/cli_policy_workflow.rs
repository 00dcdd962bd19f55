//! `ppp policy suggest | replay | apply [--undo]` through the real binary
//! over a hand-written flow log (issue 28): which files apply and undo
//! write, replay's exit codes, and the error a malformed flow line or a
//! broken candidate gives (file, line, field, hint).

mod common;

use common::{World, ok, output};
use serde_json::Value;

/// Five flows of sandbox `red` made while learning, one denied by a rule,
/// and one of another sandbox that a `red` replay must not read.
const FLOWS: &str = concat!(
    r#"{"sandbox":"red","timestamp":"2026-05-01T12:00:00Z","kind":"http","host":"api.example.com","ip":"93.184.216.34","port":443,"method":"GET","path":"/v1","status":200,"decision":"allow","matched_rule":"learned","injected":true}"#,
    "\n",
    r#"{"sandbox":"red","timestamp":"2026-05-01T12:00:01Z","kind":"http","host":"api.example.com","ip":"93.184.216.34","port":443,"method":"POST","path":"/v1","status":200,"decision":"allow","matched_rule":"learned","injected":true}"#,
    "\n",
    r#"{"sandbox":"red","timestamp":"2026-05-01T12:00:02Z","kind":"tls","host":"cdn.example.org","ip":"93.184.216.35","port":443,"decision":"allow","matched_rule":"learned"}"#,
    "\n",
    r#"{"sandbox":"red","timestamp":"2026-05-01T12:00:03Z","kind":"tcp","host":"git.example.net","ip":"93.184.216.36","port":22,"decision":"allow","matched_rule":"learned"}"#,
    "\n",
    r#"{"sandbox":"red","timestamp":"2026-05-01T12:00:04Z","kind":"http","host":"evil.example.com","ip":"93.184.216.37","port":443,"decision":"deny","matched_rule":"deadbeef"}"#,
    "\n",
    r#"{"sandbox":"blue","timestamp":"2026-05-01T12:00:05Z","kind":"http","host":"only.blue.example","ip":"93.184.216.38","port":443,"decision":"allow","matched_rule":"learned"}"#,
    "\n",
);

fn world() -> World {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    std::fs::create_dir_all(w.data()).unwrap();
    std::fs::write(w.data().join("flows.jsonl"), FLOWS).unwrap();
    ok(&mut w.ppp(["policy", "learn", "red"]));
    w
}

fn policy_file(w: &World) -> std::path::PathBuf {
    w.data().join("sandboxes/red/policy.yaml")
}

fn prev_file(w: &World) -> std::path::PathBuf {
    w.data().join("sandboxes/red/policy.yaml.prev")
}

#[test]
fn suggest_replay_apply_and_undo_over_a_hand_written_log() {
    let w = world();
    let learning = std::fs::read_to_string(policy_file(&w)).unwrap();
    assert!(learning.contains("learn: true"), "{learning}");

    let suggestion = ok(&mut w.ppp(["policy", "suggest", "red"]));
    for host in ["api.example.com", "cdn.example.org", "git.example.net:22"] {
        assert!(suggestion.contains(host), "{host} suggested:\n{suggestion}");
    }
    assert!(!suggestion.contains("evil.example.com"), "a denied flow is not suggested:\n{suggestion}");
    assert!(!suggestion.contains("only.blue.example"), "another sandbox's flow is not read:\n{suggestion}");
    assert!(suggestion.to_lowercase().contains("inject"), "the secret host is marked:\n{suggestion}");
    // Deterministic: the same log gives the same bytes.
    assert_eq!(suggestion, ok(&mut w.ppp(["policy", "suggest", "red"])));
    let candidate = w.path().join("red.yaml");
    std::fs::write(&candidate, &suggestion).unwrap();

    // The suggestion keeps every learned flow: nothing newly denied, exit 0.
    let (code, out, err) = output(&mut w.ppp(["policy", "replay", "--policy", candidate.to_str().unwrap(), "red"]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("0 newly denied"), "{out}");
    let (code, out, _) =
        output(&mut w.ppp(["policy", "replay", "--json", "--policy", candidate.to_str().unwrap(), "red"]));
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["flows"], 5, "only red's flows: {v}");
    assert_eq!(v["newly_denied"], 0, "{v}");

    // A candidate without cdn.example.org: that flow would be denied, exit 3.
    let smaller: String =
        suggestion.split("\n- ").filter(|block| !block.contains("cdn.example.org")).collect::<Vec<_>>().join("\n- ");
    let smaller_file = w.path().join("smaller.yaml");
    std::fs::write(&smaller_file, &smaller).unwrap();
    let (code, out, _) =
        output(&mut w.ppp(["policy", "replay", "--json", "--policy", smaller_file.to_str().unwrap(), "red"]));
    assert_eq!(code, 3, "something would be denied: {out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["newly_denied"], 1, "{v}");

    // Apply: the file is in force, learning ends, the replaced one is kept.
    let out = ok(&mut w.ppp(["policy", "apply", candidate.to_str().unwrap(), "--sandbox", "red"]));
    assert!(out.contains("0 newly denied"), "apply shows the replay first: {out}");
    assert!(out.contains("not learning"), "{out}");
    assert_eq!(std::fs::read_to_string(policy_file(&w)).unwrap(), suggestion);
    assert_eq!(std::fs::read_to_string(prev_file(&w)).unwrap(), learning);
    let check = |host: &str| {
        let out = ok(&mut w.ppp(["policy", "check", "network", host, "--sandbox", "red", "--json"]));
        serde_json::from_str::<Value>(&out).unwrap()["decision"].as_str().unwrap().to_owned()
    };
    assert_eq!(check("api.example.com"), "allow");
    assert_eq!(check("elsewhere.example.com"), "deny", "outside the suggestion, learning over");

    // Undo puts learning back; a second undo redoes.
    ok(&mut w.ppp(["policy", "apply", "--undo", "--sandbox", "red"]));
    assert_eq!(std::fs::read_to_string(policy_file(&w)).unwrap(), learning);
    assert_eq!(std::fs::read_to_string(prev_file(&w)).unwrap(), suggestion);
    // Learning is back on, and `policy check` says so as the daemon would.
    assert!(std::fs::read_to_string(policy_file(&w)).unwrap().contains("learn: true"));
    assert_eq!(check("elsewhere.example.com"), "allow", "learning again");
    ok(&mut w.ppp(["policy", "apply", "--undo", "--sandbox", "red"]));
    assert_eq!(std::fs::read_to_string(policy_file(&w)).unwrap(), suggestion);
}

#[test]
fn undo_with_nothing_kept_says_so() {
    let w = world();
    let (code, _, err) = output(&mut w.ppp(["policy", "apply", "--undo", "--sandbox", "red"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nothing to undo") && err.contains("hint:"), "{err}");
    assert!(!prev_file(&w).exists());
}

#[test]
fn a_malformed_flow_line_names_file_line_and_field() {
    let w = world();
    let log = w.data().join("flows.jsonl");
    let mut text = FLOWS.to_owned();
    text.push_str(r#"{"sandbox":"red","decision":"allow","port":"https"}"#);
    text.push('\n');
    std::fs::write(&log, text).unwrap();
    let candidate = w.path().join("c.yaml");
    std::fs::write(&candidate, "rules: []\n").unwrap();
    for args in
        [vec!["policy", "suggest", "red"], vec!["policy", "replay", "--policy", candidate.to_str().unwrap(), "red"]]
    {
        let (code, out, err) = output(&mut w.ppp(&args));
        assert_eq!(code, 2, "bad input, not `would deny` (3): {args:?}: {out}{err}");
        assert!(err.contains(&format!("`{}` line 7, field `port`", log.display())), "{args:?}: {err}");
        assert!(err.contains("hint:"), "{err}");
    }
}

#[test]
fn a_broken_candidate_names_file_line_and_field() {
    let w = world();
    let candidate = w.path().join("broken.yaml");
    std::fs::write(&candidate, "rules:\n- type: network\n  resource: api.example.com\n  decision: perhaps\n").unwrap();
    let before = std::fs::read_to_string(policy_file(&w)).unwrap();
    for args in [
        vec!["policy", "replay", "--policy", candidate.to_str().unwrap(), "red"],
        vec!["policy", "apply", candidate.to_str().unwrap(), "--sandbox", "red"],
    ] {
        let (code, out, err) = output(&mut w.ppp(&args));
        // Bad input: 2 (the hint wrapper used to drop the code, exit 1),
        // never 0 nor replay's "would deny" 3.
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains("broken.yaml"), "{err}");
        assert!(err.contains("line 4") || err.contains(":4"), "names the line: {err}");
        assert!(err.contains("decision"), "names the field: {err}");
        assert!(err.contains("hint:"), "{err}");
    }
    assert_eq!(std::fs::read_to_string(policy_file(&w)).unwrap(), before, "a broken candidate changes nothing");
    assert!(!prev_file(&w).exists());
}

/// `policy check --sandbox S` decides with the daemon's engine: learning,
/// the sandbox's own default, and the internal-address defence. Before the
/// fix it built an engine from the rules alone: a learning sandbox's host
/// was `deny` by the global default, and `default: allow` in the sandbox
/// file was ignored.
#[test]
fn check_decides_as_the_daemon_would() {
    let w = world();
    ok(&mut w.ppp(["policy", "deny", "network", "evil.example.com", "--sandbox", "red"]));
    let check = |target: &str, sandbox: &str| -> Value {
        let out = ok(&mut w.ppp(["policy", "check", "network", target, "--sandbox", sandbox, "--json"]));
        serde_json::from_str(&out).unwrap()
    };
    // Learned: what the live daemon answers (and flows.jsonl records).
    let v = check("new.example.com", "red");
    assert_eq!(v["decision"], "allow", "{v}");
    assert_eq!(v["learned"], true, "{v}");
    assert_eq!(v["matched_rule"]["id"], "learned", "{v}");
    assert_eq!(v["default_used"], true, "learning stands in for the default, as the daemon says: {v}");
    let text = ok(&mut w.ppp(["policy", "check", "network", "new.example.com", "--sandbox", "red"]));
    assert!(text.starts_with("allow  new.example.com:443  by learning"), "{text}");
    // A deny rule still refuses while learning.
    let v = check("evil.example.com", "red");
    assert_eq!(v["decision"], "deny", "{v}");
    assert_eq!(v["matched_rule"]["resource"], "evil.example.com", "{v}");
    assert!(v.get("learned").is_none(), "{v}");
    // Internal addresses stay refused: learning is not an address rule.
    for target in ["169.254.169.254:80", "10.0.0.1", "127.0.0.1:22", "[::ffff:10.1.2.3]:443"] {
        let v = check(target, "red");
        assert_eq!(v["decision"], "deny", "{target}: {v}");
        assert_eq!(v["refused"]["kind"], "internal", "{target}: {v}");
        let (code, out, _) =
            output(&mut w.ppp(["policy", "check", "--exit-code", "network", target, "--sandbox", "red"]));
        assert_eq!(code, 1, "{target}: {out}");
        assert!(out.contains("internal-address defence"), "{out}");
    }
    // Another sandbox does not learn.
    assert_eq!(check("new.example.com", "blue")["decision"], "deny");
    // A sandbox's own default is the daemon's answer too.
    ok(&mut w.ppp(["policy", "default", "allow", "--sandbox", "blue"]));
    let v = check("new.example.com", "blue");
    assert_eq!(v["decision"], "allow", "the sandbox's own default: {v}");
    assert_eq!(v["default_used"], true, "{v}");
    let text = ok(&mut w.ppp(["policy", "check", "network", "new.example.com", "--sandbox", "blue"]));
    assert!(text.starts_with("allow  new.example.com:443  by the sandbox default `allow`"), "{text}");
    assert_eq!(check("169.254.169.254", "blue")["decision"], "deny", "a default allow opens no internal address");
}

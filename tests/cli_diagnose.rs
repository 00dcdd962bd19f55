//! `ppp diagnose`: the JSON contract (snapshot), the other formats, missing
//! and hanging tools, and redaction of stored secrets in every format.

#![allow(clippy::similar_names, reason = "short names read better in tests")]

mod common;

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{World, ok, output};
use serde_json::Value;

/// Stored with `ppp secret set`; not key-shaped, so only the store-based
/// redaction can catch it.
const STORED: &str = "hunter2-Plain-Value";
/// Never stored, but shaped like an API key: the heuristic must catch it.
const KEY_SHAPED: &str = "sk-ant-notstored-0123456789abcdef";

fn flow(sandbox: &str, host: &str, decision: &str, extra: &str) -> String {
    format!(
        r#"{{"sandbox":"{sandbox}","timestamp":"2026-11-29T10:0{n}:00Z","host":"{host}","port":443,"method":"GET","status":200,"decision":"{decision}","matched_rule":null{extra}}}"#,
        n = host.len() % 10
    )
}

/// A podman that answers like 5.8.1 with two ppp machines and one other.
fn fake_podman(w: &World) {
    w.fake(
        "podman",
        r#"case "$1 $2" in
"version --format") echo '{"Client":{"Version":"5.8.1"}}' ;;
"machine list") cat <<'JSON'
[{"Name":"podman-machine-default*","Running":false,"VMType":"qemu"},
 {"Name":"ppp-red-fox","Running":true,"VMType":"qemu","LastUp":"2026-11-29T10:00:00Z"},
 {"Name":"ppp-blue-owl","Running":false,"VMType":"qemu"}]
JSON
;;
*) echo "unexpected: $*" >&2; exit 1 ;;
esac"#,
    );
}

/// A Python 3.13 (what `PPP_PYTHON` points at) and a venv whose mitmproxy
/// metadata says the pinned version, so no probe depends on the host.
fn fake_python_and_venv(w: &World) -> std::path::PathBuf {
    let python = w.fake("python3.13", "echo '(3, 13)'");
    let venv = w.data().join("venv");
    let site = venv.join("lib/python3.13/site-packages");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::create_dir_all(site.join(format!("mitmproxy-{}.dist-info", ppp::versions::mitmproxy()))).unwrap();
    std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
    std::fs::write(venv.join("bin/mitmdump"), "#!/bin/sh\nexit 1\n").unwrap();
    python
}

/// A world with sandboxes, a registry, policies, a stored secret, and the
/// secret (and a key-shaped token) in proxy.log, flows.jsonl and a record.
fn populated() -> World {
    let w = World::new();
    fake_podman(&w);
    w.write_record("red-fox", 51820, "running");
    w.write_record("blue-owl", 51821, "stopped");
    w.write_record("gone", 51822, "stopped");
    std::fs::write(
        w.data().join("port-registry.json"),
        r#"{"ports":{"51820":"red-fox","51821":"blue-owl","51822":"gone"}}"#,
    )
    .unwrap();
    ok(&mut w.ppp(["policy", "allow", "network", "api.example.com,pypi.org"]));
    ok(&mut w.ppp(["policy", "deny", "network", "evil.example.com", "--sandbox", "red-fox"]));
    store_secret(&w, STORED);
    let mut log = String::new();
    for i in 0..150 {
        let _ = writeln!(log, "info: line {i}");
    }
    let _ = writeln!(log, "debug: injected authorization: Bearer {STORED} for api.openai.com");
    let _ = writeln!(log, "debug: client sent {KEY_SHAPED}");
    log.push_str("info: last line\n");
    std::fs::write(w.data().join("proxy.log"), log).unwrap();
    let mut flows = String::new();
    for i in 0..120 {
        flows.push_str(&flow("blue-owl", &format!("h{i}.example.com"), "allow", ""));
        flows.push('\n');
    }
    flows.push_str(&flow("red-fox", "api.openai.com", "allow", &format!(r#","note":"key {STORED}""#)));
    flows.push('\n');
    flows.push_str(&flow("red-fox", "evil.example.com", "deny", &format!(r#","{STORED}":"{KEY_SHAPED}""#)));
    flows.push('\n');
    std::fs::write(w.data().join("flows.jsonl"), flows).unwrap();
    w
}

fn store_secret(w: &World, value: &str) {
    let mut child = w
        .ppp(["secret", "set", "-g", "openai", "--password-stdin"])
        .env("PPP_SECRET_BACKEND", "file")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(format!("{value}\n").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `ppp diagnose -o FORMAT` in `w`, with host-independent tools.
fn diagnose(w: &World, python: &std::path::Path, format: &str) -> String {
    ok(w.ppp(["diagnose", "-o", format]).env("PPP_PYTHON", python).env("PPP_SECRET_BACKEND", "file"))
}

/// The fields that differ by host or run, replaced for the snapshot.
fn stable(w: &World, mut v: Value) -> String {
    v["generated_at"] = "[time]".into();
    // The build's git revision (build.rs), or none outside a checkout.
    let rev = ppp::versions::GIT_REVISION;
    assert_eq!(v["ppp"]["git_revision"], if rev == "unknown" { Value::Null } else { Value::from(rev) });
    v["ppp"]["git_revision"] = "[revision]".into();
    for k in ["available", "probe", "error"] {
        v["keychain"][k] = "[host]".into();
    }
    let text = serde_json::to_string_pretty(&v).unwrap();
    w.redact(&text)
        .replace(&format!("\"{}\"", std::env::consts::OS), "\"[os]\"")
        .replace(&format!("\"{}\"", std::env::consts::ARCH), "\"[arch]\"")
        .replace(&format!("\"{}\"", env!("CARGO_PKG_VERSION")), "\"[ppp version]\"")
        .replace(ppp::versions::mitmproxy(), "[pinned mitmproxy]")
        .replace(ppp::versions::podman_tested(), "[tested podman]")
        .replace(ppp::versions::python_min(), "[min python]")
}

#[test]
fn json_report_snapshot() {
    let w = populated();
    let python = fake_python_and_venv(&w);
    let v: Value = serde_json::from_str(&diagnose(&w, &python, "json")).unwrap();
    assert_eq!(v["schema_version"], 1);
    // Shape checks that hold whatever the snapshot says.
    assert_eq!(v["podman"]["found"], true);
    assert_eq!(v["podman"]["version"], "5.8.1");
    assert_eq!(v["mitmdump"]["version"], ppp::versions::mitmproxy());
    assert_eq!(v["python"]["version"], "3.13");
    assert_eq!(v["machines"]["list"][0]["name"], "podman-machine-default", "the default marker is stripped");
    let sandboxes = v["sandboxes"].as_array().unwrap();
    let states: Vec<(&str, &str)> =
        sandboxes.iter().map(|s| (s["name"].as_str().unwrap(), s["machine_state"].as_str().unwrap())).collect();
    assert_eq!(states, [("blue-owl", "stopped"), ("gone", "missing"), ("red-fox", "running")]);
    assert!(sandboxes.iter().all(|s| s["registered"] == true && s["tunnel"] == "none"));
    assert_eq!(v["port_registry"][0], serde_json::json!({"port": 51820, "sandbox": "red-fox"}));
    assert_eq!(v["policy"]["global"], serde_json::json!({"total": 2, "allow": 2, "deny": 0}));
    assert_eq!(v["policy"]["sandboxes"], serde_json::json!([{"name": "red-fox", "total": 1, "allow": 0, "deny": 1}]));
    assert_eq!(v["proxy_log"]["lines"].as_array().unwrap().len(), 100);
    assert_eq!(v["proxy_log"]["lines"][99], "info: last line");
    assert_eq!(v["flows"].as_array().unwrap().len(), 100);
    assert_eq!(v["flows"][99]["host"], "evil.example.com");
    assert_eq!(v["redaction"], serde_json::json!({"secrets_redacted": 1, "secrets_unreadable": 0}));
    assert_eq!(v["errors"], serde_json::json!([]));
    // The snapshot keeps the whole shape; the long tails are cut to their
    // last entries so it stays readable.
    let mut small = v.clone();
    small["proxy_log"]["lines"] = serde_json::json!(v["proxy_log"]["lines"].as_array().unwrap()[97..].to_vec());
    small["flows"] = serde_json::json!(v["flows"].as_array().unwrap()[98..].to_vec());
    insta::assert_snapshot!("diagnose_json", stable(&w, small));
}

#[test]
fn yaml_is_the_same_report() {
    let w = populated();
    let python = fake_python_and_venv(&w);
    let json: Value = serde_json::from_str(&diagnose(&w, &python, "json")).unwrap();
    let yaml: Value = serde_norway::from_str(&diagnose(&w, &python, "yaml")).unwrap();
    let strip = |mut v: Value| {
        v["generated_at"] = Value::Null;
        v
    };
    assert_eq!(strip(yaml), strip(json));
}

#[test]
fn table_and_github_issue_have_their_sections() {
    let w = populated();
    let python = fake_python_and_venv(&w);
    let table = diagnose(&w, &python, "table");
    for section in [
        "\nhost\n",
        "\nmachines\n",
        "\nsandboxes\n",
        "\ndaemon\n",
        "\nport registry\n",
        "\npolicy\n",
        "\nproxy log (",
        "\nflows (",
    ] {
        assert!(table.contains(section), "missing {section:?} in\n{table}");
    }
    assert!(table.contains("  podman    5.8.1 ("), "{table}");
    assert!(table.contains("  red-fox   opencode  running   running  51820  none"), "{table}");
    assert!(table.contains("  gone      opencode  stopped   missing  51822  none"), "{table}");
    assert!(table.contains("  51821  blue-owl\n"), "{table}");
    assert!(table.contains("sandbox red-fox: 1 rule(s): 0 allow, 1 deny"), "{table}");
    assert!(table.contains("proxy log (last 20 of 100 lines; `-o json` has them all)\n"), "{table}");
    assert!(table.contains("  info: last line\n"), "{table}");
    assert!(table.contains("evil.example.com:443"), "{table}");
    assert!(!table.contains("info: line 120\n"), "only the last 20 lines are shown:\n{table}");

    let md = diagnose(&w, &python, "github-issue");
    assert!(md.starts_with("### ppp diagnose\n"), "{md}");
    assert!(md.contains("| podman | 5.8.1 ("), "{md}");
    assert!(md.contains("| red-fox | opencode | running | running | 51820 | yes | none |"), "{md}");
    assert!(md.contains("<details><summary>proxy.log (last 100 lines)</summary>\n\n```text\n"), "{md}");
    assert!(md.contains("<details><summary>flows.jsonl (last 100 flows)</summary>"), "{md}");
    assert_eq!(md.matches("<details>").count(), md.matches("</details>").count());
    assert!(md.contains("info: last line\n```\n\n</details>"), "{md}");
}

/// A guest chooses the Host, SNI and DNS names that end up in `proxy.log`
/// and `flows.jsonl`. Whatever ppp prints from them, in every format, and
/// the issue body it writes, carries no control character but newline and
/// tab, and the JSON still holds the same value.
#[test]
fn a_guests_escape_sequences_never_reach_the_terminal() {
    let w = populated();
    let python = fake_python_and_venv(&w);
    let host = "x\u{1b}]0;owned\u{7}\u{9b}2J\r.example.com";
    let mut log = std::fs::read_to_string(w.data().join("proxy.log")).unwrap();
    let _ = writeln!(log, "info: GET http://{host}/ \u{1b}[1A\u{1b}[2K all clear");
    std::fs::write(w.data().join("proxy.log"), log).unwrap();
    let mut flows = std::fs::read_to_string(w.data().join("flows.jsonl")).unwrap();
    flows.push_str(
        &serde_json::json!({"sandbox": "red-fox", "timestamp": "2026-11-29T10:09:00Z", "host": host,
        "port": 443, "method": "GET\u{1b}[2J", "status": 403, "decision": "deny", "matched_rule": null})
        .to_string(),
    );
    flows.push('\n');
    std::fs::write(w.data().join("flows.jsonl"), flows).unwrap();
    let raw = |text: &str| text.chars().filter(|c| c.is_control() && *c != '\n' && *c != '\t').count();
    for format in ["table", "github-issue", "json", "yaml"] {
        let out = diagnose(&w, &python, format);
        assert_eq!(raw(&out), 0, "-o {format} printed control characters:\n{out}");
        assert!(out.contains("owned"), "-o {format} dropped the line instead of escaping it:\n{out}");
    }
    let json: Value = serde_json::from_str(&diagnose(&w, &python, "json")).unwrap();
    let last = json["flows"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["host"], host, "the JSON keeps the value");
    let status = ok(&mut w.ppp(["daemon", "status"]));
    assert!(status.contains("owned"), "{status}");
    assert_eq!(raw(&status), 0, "{status}");
    let upload = ok(w.ppp(["diagnose", "--upload"]).env("PPP_PYTHON", &python).env("PPP_SECRET_BACKEND", "file"));
    let file = std::fs::read_dir(w.data().join("diagnose")).unwrap().next().unwrap().unwrap().path();
    let body = std::fs::read_to_string(&file).unwrap();
    assert!(body.contains("owned"), "{upload}");
    assert_eq!(raw(&body), 0, "{}", file.display());
}

#[test]
fn secrets_never_appear_in_any_format() {
    let w = populated();
    let python = fake_python_and_venv(&w);
    // The secret also sits in a record and in the environment.
    w.write_record(STORED, 51830, "running");
    for format in ["json", "yaml", "table", "github-issue"] {
        let (code, out, err) = output(
            w.ppp(["diagnose", "-o", format])
                .env("PPP_PYTHON", &python)
                .env("PPP_SECRET_BACKEND", "file")
                .env("PPP_LOG", format!("debug,{STORED}")),
        );
        assert_eq!(code, 0, "{format}: {err}");
        assert!(!out.contains(STORED) && !err.contains(STORED), "{format} leaks the stored secret:\n{out}\n{err}");
        assert!(!out.contains(KEY_SHAPED), "{format} leaks the key-shaped token:\n{out}");
        assert!(!out.contains("hunter2"), "{format} leaks part of the secret:\n{out}");
        assert!(out.contains("[redacted]"), "{format}: nothing was redacted:\n{out}");
    }
    let v: Value = serde_json::from_str(&diagnose(&w, &python, "json")).unwrap();
    assert!(
        v["proxy_log"]["lines"]
            .as_array()
            .unwrap()
            .contains(&"debug: injected authorization: Bearer [redacted] for api.openai.com".into()),
        "{}",
        v["proxy_log"]
    );
    assert_eq!(v["flows"][99]["[redacted]"], "[redacted]", "keys of flows are redacted too");
    assert_eq!(v["environment"]["PPP_SECRET_BACKEND"], "file", "other values are left alone");
    let names: Vec<&str> = v["sandboxes"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["blue-owl", "gone", "[redacted]", "red-fox"], "the record named after the secret is listed");
}

#[test]
fn missing_podman_and_mitmdump_still_report() {
    let w = World::new();
    w.write_record("red-fox", 51820, "running");
    let (code, out, err) = output(w.ppp(["diagnose", "-o", "json"]).env("PPP_PYTHON", w.bin().join("python-nope")));
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    for tool in ["podman", "mitmdump", "python"] {
        assert_eq!(v[tool]["found"], false, "{tool}: {}", v[tool]);
        assert_eq!(v[tool]["probe"], "missing", "{tool}: {}", v[tool]);
        assert!(v[tool]["error"].is_string(), "{tool}: {}", v[tool]);
    }
    assert_eq!(v["machines"]["probe"], "missing");
    assert_eq!(v["sandboxes"][0]["machine_state"], "unknown");
    assert_eq!(v["sandboxes"][0]["registered"], false);
    // The other formats manage too.
    let table = ok(&mut w.ppp(["diagnose"]));
    assert!(table.contains("  podman    not found\n"), "{table}");
    assert!(table.contains("  mitmdump  not found ("), "{table}");
    // PPP_PODMAN naming a file that does not exist is missing, not an error.
    let (code, out, _) = output(w.ppp(["diagnose", "-o", "json"]).env("PPP_PODMAN", w.bin().join("nope")));
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["podman"]["found"], false);
    assert_eq!(v["machines"]["probe"], "missing");
}

#[test]
fn hanging_podman_is_reported_not_waited_for() {
    let w = World::new();
    w.write_record("red-fox", 51820, "running");
    w.fake("podman", "exec sleep 1000");
    let mut child = w
        .ppp(["diagnose", "-o", "json"])
        .env("PPP_PROBE_TIMEOUT", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A generous bound: this only tells "finished" from "hung".
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ppp diagnose hung on an unresponsive podman");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["podman"]["found"], true);
    assert_eq!(v["podman"]["probe"], "timed_out", "{}", v["podman"]);
    assert!(v["podman"]["error"].as_str().unwrap().contains("did not finish within"), "{}", v["podman"]);
    assert_eq!(v["machines"]["probe"], "timed_out", "{}", v["machines"]);
    assert_eq!(v["sandboxes"][0]["machine_state"], "unknown");
}

#[test]
fn bad_probe_timeout_is_a_usage_error() {
    let w = World::new();
    let (code, out, err) = output(w.ppp(["diagnose"]).env("PPP_PROBE_TIMEOUT", "soon"));
    assert_eq!(code, 2);
    assert_eq!(out, "");
    assert!(err.starts_with("error: `PPP_PROBE_TIMEOUT` is `soon`, not a number of seconds\nhint: "), "{err}");
}

/// `--upload` writes the github-issue form to a private file and prints
/// the exact `gh` command that files it; ppp sends nothing itself. Issue 14:
/// the flag was advertised and always failed.
#[test]
fn upload_writes_an_issue_body_and_prints_the_gh_command() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new();
    // gh on PATH: a stand-in that records being run, which it must not be.
    w.fake("gh", &format!("touch {}", w.path().join("gh-ran").display()));
    let (code, out, err) = output(&mut w.ppp(["diagnose", "--upload"]));
    assert_eq!(code, 0, "{err}");
    let first = out.lines().next().unwrap();
    let path = std::path::PathBuf::from(first.strip_prefix("wrote the report as a GitHub issue body to ").unwrap());
    assert!(path.starts_with(w.data().join("diagnose")), "{out}");
    let body = std::fs::read_to_string(&path).unwrap();
    assert!(body.starts_with("### ppp diagnose\n"), "the github-issue form: {body}");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        out.ends_with(&format!(
            "ppp sends nothing itself; to file it, run this in your clone of ppp's repository:\n  \
             gh issue create --title 'ppp diagnose: ppp {version}' --body-file {}\n",
            path.display()
        )),
        "{out}"
    );
    assert!(out.contains("read it before you share it"), "{out}");
    assert!(!w.path().join("gh-ran").exists(), "ppp never runs gh itself");

    // Without gh: the file, and how to file it by hand.
    std::fs::remove_file(w.bin().join("gh")).unwrap();
    let (code, out, err) = output(w.ppp(["diagnose", "--upload"]).env("PATH", w.bin()));
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("wrote the report as a GitHub issue body to "), "{out}");
    assert!(out.contains("open a new issue in ppp's repository and paste the file"), "{out}");
    assert!(!out.contains("gh issue create"), "{out}");

    // It is its own format: `-o` with it is a usage mistake.
    let (code, _, err) = output(&mut w.ppp(["diagnose", "--upload", "-o", "json"]));
    assert_eq!(code, 2, "{err}");
}

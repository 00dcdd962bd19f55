//! `ppp ls`: records on disk merged with a fake `podman machine list`.

#![allow(clippy::similar_names, clippy::many_single_char_names, reason = "short names read better in tests")]

mod common;

use common::{World, ok, output};

#[test]
fn lists_records_without_podman() {
    let w = World::new();
    w.write_record("red-fox", 51820, "running");
    w.write_record("blue-owl", 51821, "stopped");
    // A directory holding only a prepared policy is not a sandbox.
    std::fs::create_dir_all(w.data().join("sandboxes/later")).unwrap();
    std::fs::write(w.data().join("sandboxes/later/policy.yaml"), "rules: []\n").unwrap();

    let out = ok(&mut w.ppp(["ls"]));
    assert_eq!(
        out,
        "NAME      AGENT     STATUS   CPUS  MEMORY  PORTS  PODMAN  TOKENS  WORKSPACE\n\
         blue-owl  opencode  stopped  2     4G      -      user    -       /src/blue-owl\n\
         red-fox   opencode  running  2     4G      -      user    -       /src/red-fox\n"
    );
    assert_eq!(ok(&mut w.ppp(["ls", "-q"])), "blue-owl\nred-fox\n");
    let v: serde_json::Value = serde_json::from_str(&ok(&mut w.ppp(["ls", "--json"]))).unwrap();
    assert_eq!(v[1]["name"], "red-fox");
    assert_eq!(v[1]["port"], 51820);
    assert_eq!(v[1]["inner_ip"], "10.0.0.1");
    assert_eq!(v[1]["state"], "running");
    assert!(v[1]["machine"].is_null());
}

#[test]
fn merges_podman_machine_state() {
    let w = World::new();
    w.write_record("red-fox", 51820, "running");
    w.write_record("blue-owl", 51821, "running");
    w.write_record("gone", 51822, "stopped");
    let log = w.path().join("podman.argv");
    w.fake(
        "podman",
        &format!(
            r#"echo "$@" >> {log}
if [ "$1 $2" = "machine list" ]; then
cat <<'JSON'
[{{"Name":"podman-machine-default*","Running":true,"VMType":"qemu"}},
 {{"Name":"ppp-red-fox","Running":false,"Starting":false,"VMType":"qemu"}},
 {{"Name":"ppp-blue-owl","Running":true,"VMType":"qemu"}}]
JSON
fi"#,
            log = log.display()
        ),
    );
    let out = ok(&mut w.ppp(["ls"]));
    assert_eq!(
        out,
        "NAME      AGENT     STATUS   CPUS  MEMORY  PORTS  PODMAN  TOKENS  WORKSPACE\n\
         blue-owl  opencode  running  2     4G      -      user    -       /src/blue-owl\n\
         gone      opencode  missing  2     4G      -      user    -       /src/gone\n\
         red-fox   opencode  stopped  2     4G      -      user    -       /src/red-fox\n"
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "machine list --format json\n");
    let v: serde_json::Value = serde_json::from_str(&ok(&mut w.ppp(["ls", "--json"]))).unwrap();
    assert_eq!(v[2]["machine"]["Name"], "ppp-red-fox");
    assert_eq!(v[2]["status"], "running", "the record is reported as recorded");
    assert_eq!(v[2]["state"], "stopped", "the live state wins");
}

#[test]
fn podman_failure_falls_back_to_records() {
    let w = World::new();
    w.write_record("red-fox", 51820, "running");
    w.fake("podman", "echo 'cannot connect' >&2; exit 125");
    let (code, out, err) = output(&mut w.ppp(["ls"]));
    assert_eq!(code, 0);
    assert!(out.contains("red-fox  opencode  running"), "{out}");
    assert!(
        err.contains("warning: `podman machine list --format json` exited with status 125: cannot connect"),
        "{err}"
    );
}

#[test]
fn malformed_record_is_an_error_naming_file_and_line() {
    let w = World::new();
    let dir = w.data().join("sandboxes/bad");
    std::fs::create_dir_all(&dir).unwrap();
    let text = "{\n  \"name\": \"bad\",\n  \"agent\": \"opencode\",\n  oops\n}\n";
    std::fs::write(dir.join("sandbox.json"), text).unwrap();
    let (code, out, err) = output(&mut w.ppp(["ls"]));
    assert_eq!(code, 1);
    assert_eq!(out, "");
    let shown = w.redact(&err);
    assert!(
        shown.starts_with("error: `[ROOT]/data/sandboxes/bad/sandbox.json` line 4, column 3: key must be a string"),
        "{shown}"
    );
    assert_eq!(std::fs::read_to_string(dir.join("sandbox.json")).unwrap(), text, "file untouched");
}

#[test]
fn closed_pipe_is_not_an_error() {
    let w = World::new();
    // Far more output than a pipe buffer holds (64 KiB), so ppp is still
    // writing when `head` exits and really gets EPIPE.
    std::fs::create_dir_all(w.data()).unwrap();
    let line = serde_json::json!({"sandbox": "s", "timestamp": "t", "host": "x".repeat(200), "port": 443,
        "method": "GET", "status": 200, "decision": "allow", "matched_rule": null});
    let text = format!("{line}\n").repeat(5000);
    std::fs::write(w.data().join("flows.jsonl"), text).unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -o pipefail; {:?} policy log --limit 5000 -q | head -c 10 >/dev/null",
            env!("CARGO_BIN_EXE_ppp")
        ))
        .env("PPP_DATA", w.data())
        .env("PPP_CONFIG", w.config())
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ppp failed on a closed pipe: {:?} {err}", out.status);
    assert_eq!(err, "", "nothing on stderr");
}

/// Issue 27: each sandbox's LLM tokens today, from usage.jsonl (no daemon):
/// every kind together, `~` when some are estimated, `-` for none; an
/// earlier day's usage is not today's.
#[test]
fn tokens_today_come_from_the_usage_log() {
    use ppp::usage::record::{Record, Tokens, line};
    let w = World::new();
    w.write_record("red-fox", 51820, "running");
    w.write_record("blue-owl", 51821, "stopped");
    w.write_record("green-elk", 51822, "stopped");
    let now = time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap();
    let rec = |ts: &str, sandbox: &str, estimated: u64, input: u64, flow: Option<&str>| Record {
        ts: ts.into(),
        sandbox: sandbox.into(),
        provider: "anthropic".into(),
        model: "claude-sonnet-4-5".into(),
        requests: 1,
        estimated,
        tokens: Tokens { input, output: 2_000, cache_read: 300, cache_write: 0 },
        flow: flow.map(str::to_owned),
    };
    let text = [
        rec(&now, "red-fox", 0, 10_000, Some("f1")),
        rec(&now, "blue-owl", 1, 700, Some("f2")),
        rec("2020-01-01T00:00:00Z", "green-elk", 0, 5_000, None),
    ]
    .iter()
    .map(line)
    .collect::<String>();
    std::fs::create_dir_all(w.data()).unwrap();
    std::fs::write(w.data().join("usage.jsonl"), text).unwrap();
    let out = ok(&mut w.ppp(["ls"]));
    assert_eq!(
        out,
        "NAME       AGENT     STATUS   CPUS  MEMORY  PORTS  PODMAN  TOKENS  WORKSPACE\n\
         blue-owl   opencode  stopped  2     4G      -      user    ~3.0k   /src/blue-owl\n\
         green-elk  opencode  stopped  2     4G      -      user    -       /src/green-elk\n\
         red-fox    opencode  running  2     4G      -      user    12.3k   /src/red-fox\n"
    );
    let v: serde_json::Value = serde_json::from_str(&ok(&mut w.ppp(["ls", "--json"]))).unwrap();
    let tokens: Vec<u64> = v.as_array().unwrap().iter().map(|r| r["tokens_today"].as_u64().unwrap()).collect();
    assert_eq!(tokens, [3_000, 0, 12_300]);
}

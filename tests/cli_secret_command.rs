//! `ppp secret set --command` and `set-custom --command` on the command
//! line (issue 30, point 3): parsing, errors with error/cause/hint, what the
//! index keeps (the argv, mode 0600, no value in any backend), and what
//! `secret ls` shows (source, refresh, last refresh; never a value or the
//! command line). The daemon running the command is `tests/e2e_secret_command.rs`.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use common::{World, ok, output};
use serde_json::Value;

fn file(w: &World, args: &[&str]) -> Command {
    let mut c = w.ppp(args);
    c.env("PPP_SECRET_BACKEND", "file");
    c
}

#[test]
fn a_command_secret_is_stored_as_argv_with_no_value() {
    let w = World::new();
    let out = ok(&mut file(
        &w,
        &["secret", "set", "-g", "github", "--command", "sh -c 'gh auth token --host \"x y\"'", "--refresh", "55m"],
    ));
    assert!(out.contains("from a command") && out.contains("55m"), "{out}");
    let index = w.data().join("secrets-index.json");
    assert_eq!(std::fs::metadata(&index).unwrap().permissions().mode() & 0o777, 0o600);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    let e = &v["entries"][0];
    assert_eq!(e["command"], serde_json::json!(["sh", "-c", "gh auth token --host \"x y\""]), "{v}");
    assert_eq!(e["refresh"], 3300);
    assert!(!w.data().join("secrets.age").exists(), "no value is stored for a command secret");
    // Nothing is run by the CLI: no daemon, no output.
    let ls = ok(&mut file(&w, &["secret", "ls"]));
    let row = ls.lines().find(|l| l.contains("github")).unwrap_or_else(|| panic!("{ls}"));
    for want in ["command", "55m", "never"] {
        assert!(row.contains(want), "`{want}` in {row}");
    }
    assert!(!ls.contains("gh auth token"), "ls never shows the command line: {ls}");
    let json: Value = serde_json::from_str(&ok(&mut file(&w, &["secret", "ls", "--json"]))).unwrap();
    assert_eq!(json[0]["source"], "command");
    assert_eq!(json[0]["refresh"], 3300);
    assert_eq!(json[0]["last_refresh"], Value::Null);
    assert!(json[0].get("command").is_none(), "{json}");

    // The default interval, and a static secret's row.
    ok(&mut file(&w, &["secret", "set", "-g", "openai", "--command", "pass show openai"]));
    ok(&mut file(&w, &["secret", "set", "-g", "anthropic", "-t", "sk-ant-static-0123456789abcdef"]));
    let json: Value = serde_json::from_str(&ok(&mut file(&w, &["secret", "ls", "--json"]))).unwrap();
    let by = |n: &str| json.as_array().unwrap().iter().find(|e| e["name"] == n).unwrap().clone();
    assert_eq!(by("openai")["refresh"], 3600, "the default refresh is an hour");
    assert_eq!(by("anthropic")["source"], "static");
    assert!(by("anthropic").get("refresh").is_none());
    let ls = ok(&mut file(&w, &["secret", "ls"]));
    assert!(!ls.contains("sk-ant-static"), "{ls}");

    // Setting a static value over a command secret drops the command.
    ok(&mut file(&w, &["secret", "set", "-g", "github", "-t", "ghp_static_0123456789abcdefghij"]));
    let json: Value = serde_json::from_str(&ok(&mut file(&w, &["secret", "ls", "--json"]))).unwrap();
    assert_eq!(json.as_array().unwrap().iter().find(|e| e["name"] == "github").unwrap()["source"], "static");
    let text = std::fs::read_to_string(&index).unwrap();
    assert!(!text.contains("gh auth token"), "{text}");
}

#[test]
fn set_custom_takes_a_command_too() {
    let w = World::new();
    ok(&mut file(
        &w,
        &[
            "secret",
            "set-custom",
            "--placeholder",
            "PPP_JIRA_TOKEN",
            "--host",
            "jira.example.com",
            "--command",
            "op read op://vault/jira/token",
            "--refresh",
            "10m",
        ],
    ));
    let json: Value = serde_json::from_str(&ok(&mut file(&w, &["secret", "ls", "--json"]))).unwrap();
    assert_eq!(json[0]["kind"], "custom");
    assert_eq!(json[0]["source"], "command");
    assert_eq!(json[0]["refresh"], 600);
}

#[test]
fn bad_commands_and_refresh_intervals_say_what_and_how_to_fix() {
    let w = World::new();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--command", "gh auth token", "--refresh", "55"],
            &["`--refresh 55`", "has no unit", "hint: write a number and a unit"],
        ),
        (&["--command", "gh auth token", "--refresh", "0s"], &["`--refresh 0s`", "between 1 s and 7 days", "hint:"]),
        (&["--command", "gh auth token", "--refresh", "1w"], &["`w` is not a unit", "hint:"]),
        (&["--command", "gh auth token | tr -d x"], &["`--command` cannot be run", "`|`", "hint:", "sh -c"]),
        (&["--command", "gh 'auth"], &["unterminated ' quote", "hint: close the quote"]),
        (&["--command", "  "], &["the command is empty", "hint:"]),
    ];
    for (args, wants) in cases {
        let mut argv = vec!["secret", "set", "-g", "github"];
        argv.extend_from_slice(args);
        let (code, out, err) = output(&mut file(&w, &argv));
        assert_eq!(code, 2, "{argv:?}: {out}{err}");
        assert!(err.starts_with("error: "), "{argv:?}: {err}");
        for want in *wants {
            assert!(err.contains(want), "{argv:?}: `{want}` missing from:\n{err}");
        }
    }
    // clap refuses the combinations that mean nothing.
    for argv in [
        &["secret", "set", "-g", "github", "--command", "gh auth token", "-t", "x"][..],
        &["secret", "set", "-g", "github", "--refresh", "5m"][..],
        &["secret", "set", "--registry", "ghcr.io", "--command", "gh auth token"][..],
    ] {
        let (code, _, err) = output(&mut file(&w, argv));
        assert_eq!(code, 2, "{argv:?}: {err}");
    }
    assert!(!w.data().join("secrets-index.json").exists(), "nothing was stored");
}

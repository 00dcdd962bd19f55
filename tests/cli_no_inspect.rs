//! `ppp policy allow network HOST --no-inspect` through the real binary and
//! real files (ADR 0051): the rule's `inspect: false`, what `policy ls` and
//! `policy inspect` show, the refusal on a deny rule in a file, and the two
//! refusals between a no-inspect rule and a secret for one of its hosts.

mod common;

use common::{World, ok, output};
use serde_json::Value;

fn yaml(path: &std::path::Path) -> Value {
    serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `ppp ARGS` with the file secret store.
fn ppp(w: &World, args: &[&str]) -> std::process::Command {
    let mut c = w.ppp(args);
    c.env("PPP_SECRET_BACKEND", "file");
    c
}

#[test]
fn no_inspect_is_written_shown_and_turned_back_on_by_a_plain_allow() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    let id = ok(&mut w.ppp(["policy", "allow", "network", "login.example.com", "--no-inspect"])).trim().to_owned();
    let plain = ok(&mut w.ppp(["policy", "allow", "network", "api.example.com"])).trim().to_owned();
    let file = yaml(&w.config().join("policies.yaml"));
    assert_eq!(file["rules"][0]["inspect"], false);
    assert!(file["rules"][1].get("inspect").is_none(), "absent means inspected: {file:?}");

    let table = ok(&mut w.ppp(["policy", "ls"]));
    assert!(table.starts_with("ID        SCOPE   DECISION  RESOURCE           SOURCE  INSPECT\n"), "{table}");
    assert!(table.contains(&format!("{id}  global  allow     login.example.com  local   no\n")), "{table}");
    assert!(table.contains(&format!("{plain}  global  allow     api.example.com    local   yes\n")), "{table}");
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--json"]))).unwrap();
    assert_eq!(v["rules"][0]["inspect"], false);
    let text = ok(&mut w.ppp(["policy", "inspect", &id]));
    assert!(text.contains("inspect:    false (TLS passed through unread, nothing injected)\n"), "{text}");
    assert!(!ok(&mut w.ppp(["policy", "inspect", &plain])).contains("inspect:"));
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "inspect", &id, "--json"]))).unwrap();
    assert_eq!(v["inspect"], false);

    // Adding it again without the flag is the same rule, inspected again.
    assert_eq!(ok(&mut w.ppp(["policy", "allow", "network", "login.example.com"])).trim(), id);
    let file = yaml(&w.config().join("policies.yaml"));
    assert!(file["rules"][0].get("inspect").is_none(), "{file:?}");
    assert!(!ok(&mut w.ppp(["policy", "ls"])).contains("INSPECT"), "the column goes with the last such rule");
    // `--no-inspect` is an allow's: deny has no such flag.
    let (code, _, err) = output(&mut w.ppp(["policy", "deny", "network", "x.example", "--no-inspect"]));
    assert_eq!(code, 2, "{err}");
}

#[test]
fn inspect_false_on_a_deny_rule_names_file_line_and_field() {
    let w = World::new();
    let path = w.config().join("policies.yaml");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let text = "default: deny\nrules:\n  - id: 5b3c9a4e-8f7c-4d1e-9a2b-3c4d5e6f7a8b\n    decision: deny\n    type: network\n    resource: bad.example\n    created_at: 2026-11-29T10:00:00Z\n    source: local\n    inspect: false\n";
    std::fs::write(&path, text).unwrap();
    let (code, _, err) = output(&mut w.ppp(["policy", "ls"]));
    assert_eq!(code, 1, "{err}");
    let err = w.redact(&err);
    assert!(err.contains("`[ROOT]/config/policies.yaml` line 9, column 5: field `inspect`"), "{err}");
    assert!(err.contains("only an allow rule may say `inspect: false`"), "{err}");
    // Through serde too (a quoted value keeps the fast reader out).
    std::fs::write(&path, text.replace("source: local", "source: 'local'")).unwrap();
    let (_, _, err) = output(&mut w.ppp(["policy", "ls"]));
    assert!(w.redact(&err).contains("policies.yaml` line 9, column 5: field `inspect`"), "{err}");
    // On an allow rule the same file is fine.
    std::fs::write(&path, text.replace("decision: deny", "decision: allow")).unwrap();
    let (code, out, err) = output(&mut w.ppp(["policy", "ls"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("INSPECT") && out.contains(" no\n"), "{out}");
}

#[test]
fn a_secret_host_cannot_be_no_inspect_and_a_no_inspect_host_cannot_get_a_secret() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    ok(&mut ppp(&w, &["secret", "set", "anthropic", "--token", "sk-ant-test-1234567890"]));
    let (code, _, err) = output(&mut ppp(&w, &["policy", "allow", "network", "**.anthropic.com", "--no-inspect"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "error: `**.anthropic.com` cannot be `--no-inspect`: secret `anthropic` (global scope) is sent to \
             `api.anthropic.com`"
        ),
        "{err}"
    );
    assert!(err.contains("hint: allow it without `--no-inspect`, or remove the secret first"), "{err}");
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--json", "--source", "local"]))).unwrap();
    assert!(v["rules"].as_array().unwrap().is_empty(), "nothing added: {v}");
    // A global secret meets a sandbox's rule too; a rule for another host
    // does not conflict.
    let (code, _, _) =
        output(&mut ppp(&w, &["policy", "allow", "network", "--sandbox", "sb", "api.anthropic.com", "--no-inspect"]));
    assert_eq!(code, 1);
    ok(&mut ppp(&w, &["policy", "allow", "network", "login.example.com", "--no-inspect"]));

    // The other order: the rule exists, the secret is refused.
    let (code, _, err) = output(&mut ppp(
        &w,
        &["secret", "set", "sb", "idp", "--host", "login.example.com", "--token", "tok-1234567890abcdef"],
    ));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("error: `login.example.com` cannot get a secret: rule `"), "{err}");
    assert!(err.contains("(allow `login.example.com` --no-inspect, global) passes it through unread"), "{err}");
    let (code, _, err) = output(&mut ppp(
        &w,
        &[
            "secret",
            "set-custom",
            "sb",
            "--placeholder",
            "PLACEHOLDER_X",
            "--host",
            "login.example.com",
            "--value",
            "v-123456789",
        ],
    ));
    assert_eq!(code, 1, "custom secrets too: {err}");
    assert!(ok(&mut ppp(&w, &["secret", "ls", "--json"])).matches("\"name\"").count() == 1, "only anthropic");
}

/// HTTP rules decide on requests, which a pass-through hides: whichever of
/// the two comes second for a host is refused, with the other named, and
/// nothing is written (ADR 0050, 0051).
#[test]
fn an_http_rule_host_cannot_be_no_inspect_and_a_no_inspect_host_cannot_get_http_rules() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    ok(&mut w.ppp(["policy", "allow", "network", "api.example.com"]));
    ok(&mut w.ppp(["policy", "allow", "http", "api.example.com", "--method", "GET", "--path", "/repos/**"]));
    let before = std::fs::read_to_string(w.config().join("policies.yaml")).unwrap();
    let (code, _, err) = output(&mut w.ppp(["policy", "allow", "network", "api.example.com", "--no-inspect"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be both `--no-inspect` and under HTTP rules"), "{err}");
    assert_eq!(std::fs::read_to_string(w.config().join("policies.yaml")).unwrap(), before, "nothing written");
    // A global HTTP rule meets a sandbox's no-inspect rule too.
    let (code, _, err) =
        output(&mut w.ppp(["policy", "allow", "network", "api.example.com", "--no-inspect", "--sandbox", "red"]));
    assert_eq!(code, 2, "{err}");

    // The other order: the pass-through first, then the HTTP rule.
    ok(&mut w.ppp(["policy", "allow", "network", "login.example.com", "--no-inspect"]));
    let (code, _, err) =
        output(&mut w.ppp(["policy", "deny", "http", "login.example.com", "--method", "ANY", "--path", "/**"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`login.example.com` cannot be both"), "{err}");
    assert!(err.contains("ppp policy rm"), "the hint names the rule: {err}");
    // `--no-inspect` on an HTTP rule itself is refused.
    let (code, _, err) = output(&mut w.ppp([
        "policy",
        "allow",
        "http",
        "other.example.com",
        "--method",
        "GET",
        "--path",
        "/**",
        "--no-inspect",
    ]));
    assert_eq!(code, 2, "{err}");
}

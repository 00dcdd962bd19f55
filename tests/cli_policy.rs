//! `ppp policy …` end to end through the real binary and real files.

#![allow(clippy::similar_names, clippy::many_single_char_names, reason = "short names read better in tests")]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;

use common::{World, ok, output};
use serde_json::Value;

fn yaml(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::from_str(&text).unwrap()
}

fn check(w: &World, args: &[&str]) -> Value {
    let mut argv = vec!["policy", "check", "network", "--json"];
    argv.extend_from_slice(args);
    let out = ok(&mut w.ppp(&argv));
    assert_eq!(out.lines().count(), 1, "exactly one JSON object: {out}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn no_policy_denies_and_says_how_to_choose() {
    let w = World::new();
    let (code, out, err) = output(&mut w.ppp(["policy", "check", "network", "example.com", "--json"]));
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "target": "example.com", "host": "example.com", "ip": null, "port": 443, "sandbox": null,
            "decision": "deny", "matched_rule": null, "default_used": true
        })
    );
    assert!(err.contains("ppp policy init balanced"), "{err}");
    assert!(!w.config().join("policies.yaml").exists(), "check changes nothing");
}

#[test]
fn allow_deny_and_check() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    let out = ok(&mut w.ppp(["policy", "allow", "network", "**.example.com,api.other.io:8443,10.0.0.0/8"]));
    let ids: Vec<&str> = out.lines().collect();
    assert_eq!(ids.len(), 3, "{out}");
    for id in &ids {
        // The same 8-character form `policy ls` shows (issue 14).
        assert!(id.len() == 8 && id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    }
    let file = yaml(&w.config().join("policies.yaml"));
    assert_eq!(file["default"], "deny");
    assert_eq!(file["rules"][1]["resource"], "api.other.io:8443");
    assert_eq!(file["rules"][1]["type"], "network");
    assert_eq!(file["rules"][1]["source"], "local");
    assert_eq!(file["rules"][1]["decision"], "allow");
    assert_eq!(&file["rules"][1]["id"].as_str().unwrap()[..8], ids[1]);

    let v = check(&w, &["a.b.example.com"]);
    assert_eq!(v["decision"], "allow");
    assert!(v["matched_rule"]["id"].as_str().unwrap().starts_with(ids[0]), "{v}");
    assert_eq!(v["matched_rule"]["scope"], "global");
    assert_eq!(v["matched_rule"]["source"], "local");
    assert_eq!(v["matched_rule"]["resource"], "**.example.com");
    assert_eq!(v["default_used"], false);
    assert_eq!(check(&w, &["example.com"])["decision"], "deny", "`**.` needs a label below");
    assert_eq!(check(&w, &["API.other.io.:8443"])["decision"], "allow");
    assert_eq!(check(&w, &["api.other.io"])["decision"], "deny", "port 443 by default");
    let v = check(&w, &["10.1.2.3:22"]);
    assert_eq!(
        (v["decision"].as_str(), v["ip"].as_str(), v["host"].is_null()),
        (Some("allow"), Some("10.1.2.3"), true)
    );

    // Deny wins over allow.
    let deny = ok(&mut w.ppp(["policy", "deny", "network", "bad.example.com"]));
    let v = check(&w, &["bad.example.com"]);
    assert_eq!(v["decision"], "deny");
    assert!(v["matched_rule"]["id"].as_str().unwrap().starts_with(deny.trim()), "{v}");

    // Human output names the rule.
    let text = ok(&mut w.ppp(["policy", "check", "network", "bad.example.com"]));
    assert!(text.starts_with("deny  bad.example.com:443  by rule "), "{text}");
    let verbose = ok(&mut w.ppp(["policy", "check", "network", "bad.example.com", "-v"]));
    assert_eq!(verbose.lines().filter(|l| l.starts_with("  matches: ")).count(), 2, "{verbose}");
}

#[test]
fn bad_resources_add_nothing() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "balanced"]));
    let before = std::fs::read(w.config().join("policies.yaml")).unwrap();
    let cases: &[(&str, &str)] = &[
        ("a..b", "empty label"),
        ("example.com:70000", "70000"),
        ("10.0.0.0/33", "10.0.0.0/33"),
        ("exa mple.com", "whitespace"),
        ("^(unclosed$", "regex"),
        ("good.com,,other.com", "empty"),
        ("good.com,bad..com", "resource 2 of"),
    ];
    for (res, needle) in cases {
        let (code, out, err) = output(&mut w.ppp(["policy", "allow", "network", res]));
        assert_eq!(code, 2, "{res}: {err}");
        assert_eq!(out, "", "{res}");
        assert!(err.starts_with("error: "), "{res}: {err}");
        assert!(err.contains(needle), "{res}: expected `{needle}` in {err}");
    }
    let (_, _, err) = output(&mut w.ppp(["policy", "allow", "network", "10.0.0.1/8"]));
    assert!(err.contains("hint: ") && err.contains("10.0.0.0/8"), "{err}");
    assert_eq!(std::fs::read(w.config().join("policies.yaml")).unwrap(), before, "file untouched");
}

/// `ppp policy allow network "*.$DOMAIN"` with `DOMAIN` unset: `*.` must
/// not become `*` (every one-label host), nor `**.` become `**`.
#[test]
fn a_wildcard_with_no_domain_is_refused() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    let before = std::fs::read(w.config().join("policies.yaml")).unwrap();
    for res in ["*.", "**.", "*.:443", "example.com,*."] {
        let (code, out, err) = output(&mut w.ppp(["policy", "allow", "network", res]));
        assert_eq!(code, 2, "{res}: {err}");
        assert_eq!(out, "", "{res}");
        let bad = res.rsplit(',').next().unwrap();
        assert!(
            err.starts_with("error: ") && err.contains(&format!("`{bad}` has no domain after the wildcard")),
            "{res}: {err}"
        );
        assert!(
            err.contains("hint: name the domain, e.g. `*.example.com`; to match every host, write `**`"),
            "{res}: {err}"
        );
    }
    assert_eq!(std::fs::read(w.config().join("policies.yaml")).unwrap(), before, "file untouched");
    assert_eq!(check(&w, &["intranet"])["decision"], "deny");
}

#[test]
fn presets_are_idempotent_and_switching_needs_force() {
    let w = World::new();
    let out = ok(&mut w.ppp(["policy", "init", "balanced"]));
    assert!(out.contains("preset `balanced`: default deny"), "{out}");
    let path = w.config().join("policies.yaml");
    let first = std::fs::read(&path).unwrap();
    assert_eq!(yaml(&path)["preset"], "balanced");
    for host in ["api.anthropic.com", "pypi.org", "registry.npmjs.org", "github.com", "deb.debian.org"] {
        let v = check(&w, &[host]);
        assert_eq!(v["decision"], "allow", "{host}");
        assert_eq!(v["matched_rule"]["source"], "preset", "{host}");
    }
    assert_eq!(check(&w, &["evil.example"])["decision"], "deny");

    let again = ok(&mut w.ppp(["policy", "init", "balanced"]));
    assert!(again.contains("nothing changed"), "{again}");
    assert_eq!(std::fs::read(&path).unwrap(), first, "re-running init is a no-op");

    let local = ok(&mut w.ppp(["policy", "allow", "network", "mine.example"]));
    let (code, _, err) = output(&mut w.ppp(["policy", "init", "allow-all"]));
    assert_eq!(code, 1);
    assert!(err.contains("preset `balanced`") && err.contains("hint: pass -f"), "{err}");
    ok(&mut w.ppp(["policy", "init", "allow-all", "-f"]));
    let f = yaml(&path);
    assert_eq!((f["default"].as_str(), f["preset"].as_str()), (Some("allow"), Some("allow-all")));
    let rules = f["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "preset rules replaced, local kept");
    assert!(rules[0]["id"].as_str().unwrap().starts_with(local.trim()));
    assert_eq!(check(&w, &["evil.example"])["decision"], "allow");
}

#[test]
fn sandbox_policy_may_precede_the_sandbox() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "allow-all"]));
    let id = ok(&mut w.ppp(["policy", "deny", "network", "--sandbox", "later", "**"]));
    let path = w.data().join("sandboxes/later/policy.yaml");
    assert!(yaml(&path)["rules"][0]["id"].as_str().unwrap().starts_with(id.trim()));
    assert_eq!(check(&w, &["x.com"])["decision"], "allow", "other sandboxes unaffected");
    let v = check(&w, &["x.com", "--sandbox", "later"]);
    assert_eq!(v["decision"], "deny");
    assert_eq!(v["sandbox"], "later");
    assert_eq!(v["matched_rule"]["scope"], "sandbox");
    // A prepared policy does not make a sandbox.
    assert_eq!(ok(&mut w.ppp(["ls", "-q"])), "");
    let (code, _, err) = output(&mut w.ppp(["policy", "allow", "network", "--sandbox", "Bad_Name", "x.com"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid sandbox name `Bad_Name`"), "{err}");
}

#[test]
fn ls_inspect_rm_reset() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "balanced"]));
    let a = ok(&mut w.ppp(["policy", "allow", "network", "a.example"])).trim().to_owned();
    let d = ok(&mut w.ppp(["policy", "deny", "network", "d.example"])).trim().to_owned();
    let s = ok(&mut w.ppp(["policy", "allow", "network", "--sandbox", "sb", "s.example"])).trim().to_owned();

    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--source", "local", "--json"]))).unwrap();
    let ids: Vec<&str> = v["rules"].as_array().unwrap().iter().map(|r| &r["id"].as_str().unwrap()[..8]).collect();
    assert_eq!(ids, [a.as_str(), d.as_str()]);
    // `-q`, global or the command's own, prints the ids `allow` printed.
    assert_eq!(ok(&mut w.ppp(["policy", "ls", "--source", "local", "-q"])), format!("{a}\n{d}\n"));
    assert_eq!(ok(&mut w.ppp(["-q", "policy", "ls", "--source", "local"])), format!("{a}\n{d}\n"));
    assert_eq!((v["default"].as_str(), v["preset"].as_str()), (Some("deny"), Some("balanced")));
    let v: Value =
        serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "sb", "--source", "local", "--json"]))).unwrap();
    assert_eq!(v["rules"].as_array().unwrap().len(), 3);
    assert_eq!(v["rules"][2]["sandbox"], "sb");
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--decision", "deny", "--json"]))).unwrap();
    assert_eq!(v["rules"].as_array().unwrap().len(), 1);
    let v: Value =
        serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--include-inactive", "--source", "local", "--json"])))
            .unwrap();
    assert_eq!(v["rules"].as_array().unwrap().len(), 3);
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--source", "org", "--json"]))).unwrap();
    assert!(v["rules"].as_array().unwrap().is_empty(), "org is a stub");
    let table = ok(&mut w.ppp(["policy", "ls", "--source", "local"]));
    assert!(table.starts_with("ID        SCOPE   DECISION  RESOURCE   SOURCE\n"), "{table}");
    assert!(table.contains(&format!("{}  global  deny      d.example  local", &d[..8])), "{table}");
    assert!(
        table.ends_with(
            "default: deny (preset `balanced`)\nupload: 1MiB (default; none to hosts ppp injects a key into)\n\
             download: none (default)\n"
        ),
        "{table}"
    );

    let text = ok(&mut w.ppp(["policy", "inspect", &s]));
    assert!(text.contains(&format!("id:         {s}")) && text.contains("scope:      sandbox `sb`"), "{text}");
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "inspect", &a, "--json"]))).unwrap();
    assert_eq!((v["resource"].as_str(), v["scope"].as_str()), (Some("a.example"), Some("global")));
    let (code, _, err) = output(&mut w.ppp(["policy", "inspect", "ffffffff"]));
    assert_eq!(code, 2, "{err}");

    assert_eq!(ok(&mut w.ppp(["policy", "rm", "network", "--id", &a[..8]])).trim(), a);
    assert_eq!(ok(&mut w.ppp(["policy", "rm", "network", "--resource", "D.Example."])).trim(), d);
    let (code, _, err) = output(&mut w.ppp(["policy", "rm", "network", "--resource", "s.example"]));
    assert_eq!(code, 2);
    assert!(err.contains("no rule with resource `s.example` in the global policy"), "{err}");
    assert_eq!(ok(&mut w.ppp(["policy", "rm", "network", "--sandbox", "sb", "--resource", "s.example"])).trim(), s);

    ok(&mut w.ppp(["policy", "allow", "network", "x.example"]));
    ok(&mut w.ppp(["policy", "allow", "network", "--sandbox", "sb", "y.example"]));
    let (code, _, err) = output(&mut w.ppp(["policy", "reset"]));
    assert_eq!(code, 2, "no terminal, no -f: {err}");
    assert_eq!(ok(&mut w.ppp(["policy", "reset", "-f"])), "removed 2 rules\n");
    let v: Value =
        serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--include-inactive", "--source", "local", "--json"])))
            .unwrap();
    assert!(v["rules"].as_array().unwrap().is_empty());
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--json"]))).unwrap();
    assert!(!v["rules"].as_array().unwrap().is_empty(), "preset rules survive reset");
}

#[test]
fn malformed_policy_names_file_and_line_and_stays() {
    let w = World::new();
    let path = w.config().join("policies.yaml");
    let text = "default: deny\nrules:\n  - id: 5b3c9a4e-8f7c-4d1e-9a2b-3c4d5e6f7a8b\n    decision: allow\n    type: network\n    resource: \"a..b\"\n    created_at: 2026-11-29T10:00:00Z\n    source: local\n";
    std::fs::write(&path, text).unwrap();
    for args in
        [&["policy", "allow", "network", "x.com"][..], &["policy", "check", "network", "x.com"], &["policy", "ls"]]
    {
        let (code, _, err) = output(&mut w.ppp(args));
        assert_eq!(code, 1, "{args:?}");
        let err = w.redact(&err);
        assert!(err.contains("`[ROOT]/config/policies.yaml` line "), "{args:?}: {err}");
        assert!(err.contains("empty label"), "{args:?}: {err}");
    }
    std::fs::write(&path, "default: maybe\n").unwrap();
    let (_, _, err) = output(&mut w.ppp(["policy", "ls"]));
    assert!(w.redact(&err).contains("`[ROOT]/config/policies.yaml` line 1"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "default: maybe\n");
}

#[test]
fn init_adopts_a_file_made_by_allow() {
    let w = World::new();
    let (code, _, err) = output(&mut w.ppp(["policy", "allow", "network", "mine.example"]));
    assert_eq!(code, 0);
    assert!(err.contains("`ppp policy init` chooses a preset"), "{err}");
    // Following that advice must work without -f, and keep the rule.
    ok(&mut w.ppp(["policy", "init", "balanced"]));
    let f = yaml(&w.config().join("policies.yaml"));
    assert_eq!(f["preset"], "balanced");
    assert_eq!(check(&w, &["mine.example"])["matched_rule"]["source"], "local");
    assert_eq!(check(&w, &["pypi.org"])["matched_rule"]["source"], "preset");
}

#[test]
fn ipv6_targets_print_bracketed() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    ok(&mut w.ppp(["policy", "allow", "network", "[2001:db8::/32]:443"]));
    let text = ok(&mut w.ppp(["policy", "check", "network", "[2001:db8::1]:443"]));
    assert!(text.starts_with("allow  [2001:db8::1]:443  by rule "), "{text}");
    let v = check(&w, &["[2001:db8::1]:80"]);
    assert_eq!(
        (v["decision"].as_str(), v["ip"].as_str(), v["port"].as_u64()),
        (Some("deny"), Some("2001:db8::1"), Some(80))
    );
}

#[test]
fn sixteen_parallel_allows_leave_sixteen_rules() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    let children: Vec<_> = (0..16)
        .map(|i| {
            w.ppp(["policy", "allow", "network", &format!("h{i}.example")])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let f = yaml(&w.config().join("policies.yaml"));
    let mut res: Vec<String> =
        f["rules"].as_array().unwrap().iter().map(|r| r["resource"].as_str().unwrap().to_owned()).collect();
    res.sort();
    let mut want: Vec<String> = (0..16).map(|i| format!("h{i}.example")).collect();
    want.sort();
    assert_eq!(res, want);
    // No temp files were left beside it.
    let names: Vec<String> =
        std::fs::read_dir(w.config()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["policies.yaml"]);
}

#[test]
fn log_reads_the_tail() {
    let w = World::new();
    let mut text = String::new();
    for i in 0..500 {
        let sb = if i % 2 == 0 { "red" } else { "blue" };
        text.push_str(
            &serde_json::json!({"sandbox": sb, "timestamp": format!("2026-11-29T10:{:02}:{:02}Z", i / 60, i % 60),
                "host": format!("h{i}.example"), "port": 443, "method": "GET", "status": 200,
                "decision": "allow", "matched_rule": null})
            .to_string(),
        );
        text.push('\n');
    }
    std::fs::write(w.data().join("flows.jsonl"), text).unwrap();
    assert_eq!(ok(&mut w.ppp(["policy", "log", "--limit", "3", "-q"])), "h497.example\nh498.example\nh499.example\n");
    assert_eq!(ok(&mut w.ppp(["policy", "log", "blue", "--limit", "2", "-q"])), "h497.example\nh499.example\n");
    let json = ok(&mut w.ppp(["policy", "log", "red", "--limit", "1", "--json"]));
    assert!(json.starts_with("{\"sandbox\":\"red\",\"timestamp\":"), "keys keep the proxy's order: {json}");
    let v: Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["host"], "h498.example");
    let table = ok(&mut w.ppp(["policy", "log", "--limit", "1"]));
    assert_eq!(
        table,
        "TIME                  SANDBOX  DECISION  METHOD  DESTINATION       STATUS  UP  DOWN  DURATION  PATH\n\
         2026-11-29T10:08:19Z  blue     allow     GET     h499.example:443  200     -   -     -         -\n",
        "a line from an addon without bytes, duration and path shows dashes"
    );
    assert_eq!(ok(&mut w.ppp(["policy", "log", "--type", "filesystem", "-q"])), "");
    let empty = World::new();
    assert_eq!(ok(&mut empty.ppp(["policy", "log", "-q"])), "", "no flows yet");
}

/// A guest sending an allowed name to an address of its own choosing must
/// not look like normal traffic: the table shows the address connected to
/// and marks the flow whose address the name does not resolve to.
#[test]
fn log_shows_the_address_and_marks_a_misdirected_flow() {
    let w = World::new();
    let flows = [
        serde_json::json!({"sandbox": "red", "timestamp": "2026-11-29T10:00:00Z", "kind": "http",
            "host": "api.example.com", "ip": "203.0.113.7", "port": 443, "method": "POST", "path": "/v1/messages",
            "status": 200, "decision": "allow", "matched_rule": null, "bytes_out": 10, "bytes_in": 20480,
            "duration_ms": 1349, "resolved": true}),
        serde_json::json!({"sandbox": "red", "timestamp": "2026-11-29T10:00:01Z", "kind": "http",
            "host": "api.example.com", "ip": "10.77.0.9", "port": 80, "method": "GET", "status": 403,
            "decision": "deny", "matched_rule": null, "bytes_out": 0, "bytes_in": 0, "resolved": false}),
        serde_json::json!({"sandbox": "red", "timestamp": "2026-11-29T10:00:02Z", "kind": "tcp",
            "host": null, "ip": "2001:db8::9", "port": 22, "method": null, "status": null,
            "decision": "allow", "matched_rule": null, "bytes_out": 1, "bytes_in": 2}),
        serde_json::json!({"sandbox": "red", "timestamp": "2026-11-29T10:00:03Z", "kind": "http",
            "host": "10.77.0.9", "ip": "10.77.0.9", "port": 8080, "method": "GET", "status": 200,
            "decision": "allow", "matched_rule": null, "bytes_out": 1, "bytes_in": 2, "resolved": null}),
    ];
    let text: String = flows.iter().map(|f| f.to_string() + "\n").collect();
    std::fs::write(w.data().join("flows.jsonl"), &text).unwrap();
    insta::assert_snapshot!("log_table_marks_misdirected", ok(&mut w.ppp(["policy", "log"])));
    // `--json` passes every record through as the proxy wrote it.
    assert_eq!(ok(&mut w.ppp(["policy", "log", "--json"])), text);
    // No mark, no legend.
    std::fs::write(w.data().join("flows.jsonl"), flows[0].to_string() + "\n").unwrap();
    let table = ok(&mut w.ppp(["policy", "log"]));
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(!table.contains('!'), "{table}");
}

#[test]
fn mutations_ask_a_running_daemon_to_reload() {
    let w = World::new();
    let listener = UnixListener::bind(w.data().join("secret.sock")).unwrap();
    let server = std::thread::spawn(move || {
        let mut got = Vec::new();
        for _ in 0..2 {
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            (&s).write_all(b"{\"ok\":true}\n").unwrap();
            got.push(line);
        }
        got
    });
    ok(&mut w.ppp(["policy", "init", "balanced"]));
    ok(&mut w.ppp(["policy", "allow", "network", "x.example"]));
    assert_eq!(server.join().unwrap(), ["{\"op\":\"reload\"}\n", "{\"op\":\"reload\"}\n"]);
}

#[test]
fn rm_by_source_removes_one_kits_rules_then_all_kits() {
    let w = World::new();
    let t1 = "11111111-1111-4111-8111-111111111111";
    let t2 = "22222222-2222-4222-8222-222222222222";
    let other = "33333333-3333-4333-8333-333333333333";
    let local = "44444444-4444-4444-8444-444444444444";
    let rule = |id: &str, decision: &str, resource: &str, source: &str, kit: Option<&str>| {
        let kit = kit.map_or_else(String::new, |k| format!("  kit: {k}\n"));
        format!(
            "- id: {id}\n  decision: {decision}\n  type: network\n  resource: {resource}\n  \
             created_at: 2026-01-02T03:04:05Z\n  source: {source}\n{kit}"
        )
    };
    let text = format!(
        "rules:\n{}{}{}{}",
        rule(t1, "allow", "pypi.org", "kit", Some("kit:tools")),
        rule(local, "deny", "evil.example", "local", None),
        rule(other, "allow", "crates.io", "kit", Some("kit:other")),
        rule(t2, "deny", "files.pythonhosted.org", "kit", Some("kit:tools")),
    );
    let path = w.data().join("sandboxes/red/policy.yaml");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    let ids = |f: &Value| -> Vec<String> {
        f["rules"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&yaml(&path)), [t1, local, other, t2], "the hand-written file parses");

    let rm = |source: &str| w.ppp(["policy", "rm", "network", "--sandbox", "red", "--source", source]);
    assert_eq!(ok(&mut rm("kit:tools")), format!("{}\n{}\n", &t1[..8], &t2[..8]), "exactly kit:tools' rules");
    let f = yaml(&path);
    assert_eq!(ids(&f), [local, other]);
    assert_eq!(
        (f["rules"][1]["kit"].as_str(), f["rules"][1]["resource"].as_str()),
        (Some("kit:other"), Some("crates.io"))
    );
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "red", "--source", "kit", "--json"]))).unwrap();
    let listed: Vec<&str> = v["rules"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(listed, [other]);

    let (code, out, err) = output(&mut rm("kit:tools"));
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("error: no rule with source `kit:tools` in the policy of sandbox `red`"), "{err}");
    assert!(err.contains("hint: list rules with `ppp policy ls`"), "{err}");
    assert_eq!(ids(&yaml(&path)), [local, other], "a failed rm changes nothing");

    assert_eq!(ok(&mut rm("kit")), format!("{}\n", &other[..8]), "`kit` removes every kit's rules");
    assert_eq!(ids(&yaml(&path)), [local]);

    let (code, _, err) = output(&mut rm("org"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("source `org`") && err.contains("hint: ") && err.contains("no org policy source"), "{err}");
    let (code, _, err) = output(&mut rm("bogus"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid source `bogus`") && err.contains("`kit:NAME`"), "{err}");
    let (code, _, err) = output(&mut rm("kit:Bad_Name"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid source `kit:Bad_Name`"), "{err}");
    let (code, _, err) =
        output(&mut w.ppp(["policy", "rm", "network", "--sandbox", "red", "--id", local, "--source", "kit"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "clap refuses two selectors: {err}");
    let (code, _, err) = output(&mut w.ppp(["policy", "rm", "network", "--sandbox", "red"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--id <ID>|--resource <RESOURCE>|--source <SOURCE>"), "clap names all three: {err}");
    assert_eq!(ids(&yaml(&path)), [local], "refused commands change nothing");

    assert_eq!(ok(&mut rm("local")), format!("{}\n", &local[..8]));
    assert!(yaml(&path)["rules"].as_array().unwrap().is_empty());
}

#[test]
fn rm_by_source_in_the_global_policy() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "balanced"]));
    let a = ok(&mut w.ppp(["policy", "allow", "network", "a.example,b.example"]));
    let (code, _, err) = output(&mut w.ppp(["policy", "rm", "network", "--source", "kit"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no rule with source `kit` in the global policy"), "{err}");
    assert_eq!(ok(&mut w.ppp(["policy", "rm", "network", "--source", "local"])), a);
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--json"]))).unwrap();
    let rules = v["rules"].as_array().unwrap();
    assert!(!rules.is_empty() && rules.iter().all(|r| r["source"] == "preset"), "{v}");
    let n = rules.len();
    let out = ok(&mut w.ppp(["policy", "rm", "network", "--source", "preset"]));
    assert_eq!(out.lines().count(), n, "{out}");
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "ls", "--json"]))).unwrap();
    assert!(v["rules"].as_array().unwrap().is_empty(), "{v}");
}

/// `policy log` says in words that nothing is logged, and an unknown
/// sandbox is a usage mistake, not an empty table (issue 14). A removed
/// sandbox's connections stay readable by its name.
#[test]
fn log_says_when_nothing_is_logged_and_refuses_an_unknown_sandbox() {
    let w = World::new();
    assert_eq!(
        ok(&mut w.ppp(["policy", "log"])),
        "no connections logged yet: they appear here once a sandbox connects out\n"
    );
    assert_eq!(ok(&mut w.ppp(["policy", "log", "--json"])), "", "machine formats stay empty");
    assert_eq!(ok(&mut w.ppp(["policy", "log", "-q"])), "");
    assert_eq!(
        ok(&mut w.ppp(["policy", "log", "--type", "filesystem"])),
        "no filesystem flows: the proxy records network connections only\n"
    );
    let (code, out, err) = output(&mut w.ppp(["policy", "log", "ghost"]));
    assert_eq!((code, out.as_str()), (2, ""));
    assert_eq!(
        err,
        "error: no sandbox named `ghost`, and no connection from one is logged\n\
         hint: list sandboxes with `ppp ls`; `ppp policy log` alone shows every sandbox's connections\n"
    );
    w.stopped_sandbox("red");
    assert_eq!(ok(&mut w.ppp(["policy", "log", "red"])), "no connections logged for sandbox `red` yet\n");
    let line = serde_json::json!({"sandbox": "gone", "timestamp": "2026-12-01T10:00:00Z", "host": "x.example",
        "port": 443, "method": "GET", "status": 200, "decision": "allow", "matched_rule": null});
    std::fs::write(w.data().join("flows.jsonl"), format!("{line}\n")).unwrap();
    let table = ok(&mut w.ppp(["policy", "log", "gone"]));
    assert!(table.starts_with("TIME") && table.contains("gone") && table.contains("x.example:443"), "{table}");
    assert_eq!(ok(&mut w.ppp(["policy", "log", "red"])), "no connections logged for sandbox `red` yet\n");
}

/// `policy check --exit-code` lets a script test a decision: 1 on deny, 0
/// on allow; without it a deny is an answer and exits 0.
#[test]
fn check_exit_code_is_one_on_deny() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    ok(&mut w.ppp(["policy", "allow", "network", "ok.example"]));
    let run = |args: &[&str]| output(&mut w.ppp(args)).0;
    assert_eq!(run(&["policy", "check", "network", "no.example"]), 0);
    assert_eq!(run(&["policy", "check", "--exit-code", "network", "no.example"]), 1);
    assert_eq!(run(&["policy", "check", "--exit-code", "--json", "network", "no.example"]), 1);
    assert_eq!(run(&["policy", "check", "--exit-code", "network", "ok.example"]), 0);
    let (code, out, err) = output(&mut w.ppp(["policy", "check", "--exit-code", "network", "no.example"]));
    assert_eq!((code, err.as_str()), (1, ""), "a deny is no error: nothing on stderr");
    assert!(out.starts_with("deny  no.example:443  by the global default `deny`"), "{out}");
}

/// HTTP rules (ADR 0050): added, shown, checked and removed through the
/// CLI, with error, cause and hint for what is not one.
#[test]
fn http_rules_add_ls_inspect_check_rm() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    ok(&mut w.ppp(["policy", "allow", "network", "api.example.com"]));
    let id = ok(&mut w.ppp([
        "policy",
        "allow",
        "http",
        "api.example.com",
        "--method",
        "GET,HEAD",
        "--path",
        "/repos/org/**",
    ]));
    let id = id.trim().to_owned();
    // Adding it again is a no-op reporting the same id.
    let again = ok(&mut w.ppp([
        "policy",
        "allow",
        "http",
        "api.example.com",
        "--method",
        "GET,HEAD",
        "--path",
        "/repos/org/**",
    ]));
    assert_eq!(again.trim(), id);
    let deny = ok(&mut w.ppp([
        "policy",
        "deny",
        "http",
        "api.example.com",
        "--method",
        "ANY",
        "--path",
        "/repos/org/secret/**",
    ]));
    let file = yaml(&w.config().join("policies.yaml"));
    let rule = &file["rules"][1];
    assert_eq!((rule["type"].as_str(), rule["path"].as_str()), (Some("http"), Some("/repos/org/**")));
    assert_eq!(rule["methods"], serde_json::json!(["GET", "HEAD"]));

    let ls = ok(&mut w.ppp(["policy", "ls"]));
    assert!(ls.contains("api.example.com GET,HEAD /repos/org/**"), "{ls}");
    let only = ok(&mut w.ppp(["policy", "ls", "--type", "http", "-q"]));
    assert_eq!(only.lines().count(), 2, "{only}");
    let shown = ok(&mut w.ppp(["policy", "inspect", &id]));
    assert!(shown.contains("type:       http") && shown.contains("methods:    GET, HEAD"), "{shown}");
    assert!(shown.contains("path:       /repos/org/**"), "{shown}");

    let check = |m: &str, p: &str| -> Value {
        let out = ok(&mut w.ppp(["policy", "check", "http", "api.example.com", "--method", m, "--path", p, "--json"]));
        serde_json::from_str(&out).unwrap()
    };
    let v = check("GET", "/repos/%6Frg/x?y=1");
    assert_eq!(v["decision"], "allow", "{v}");
    assert_eq!(&v["matched_rule"]["id"].as_str().unwrap()[..8], id);
    assert_eq!(v["http"]["path"], "/repos/org/x");
    assert_eq!(check("POST", "/repos/org/x")["decision"], "deny");
    assert_eq!(check("GET", "/repos/org/secret/k")["matched_rule"]["id"].as_str().unwrap()[..8], *deny.trim());
    let v = check("GET", "/repos/org/%2e%2e/other");
    assert_eq!(v["decision"], "deny");
    assert!(v["http"]["refused"].as_str().unwrap().contains("`%2E`"), "{v}");
    // Exit codes as the network check's.
    let (code, out, _) = output(&mut w.ppp([
        "policy",
        "check",
        "http",
        "api.example.com",
        "--method",
        "PUT",
        "--path",
        "/repos/org/x",
        "--exit-code",
    ]));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("deny  api.example.com:443 PUT /repos/org/x  by the HTTP rules"), "{out}");
    assert!(out.contains("ppp policy allow http api.example.com --method PUT"), "{out}");
    // The network rule is the floor: no network allow, nothing to carve.
    ok(&mut w.ppp(["policy", "allow", "http", "closed.example.com", "--method", "ANY", "--path", "/**"]));
    let out = ok(&mut w.ppp(["policy", "check", "http", "closed.example.com", "--json"]));
    assert!(out.contains("\"decision\":\"deny\"") && out.contains("\"default_used\":true"), "{out}");

    // rm by resource removes only rules of the kind named.
    ok(&mut w.ppp(["policy", "rm", "http", "--resource", "api.example.com"]));
    let ls = ok(&mut w.ppp(["policy", "ls", "-q"]));
    assert_eq!(ls.lines().count(), 2, "the network rule and closed.example.com's stay: {ls}");
}

#[test]
fn bad_http_rules_are_refused_with_a_hint() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "init", "deny-all"]));
    for (args, needle) in [
        (&["api.example.com", "--path", "/x"][..], "needs `--method`"),
        (&["api.example.com", "--method", "get", "--path", "/x"][..], "`get` is not an upper-case method"),
        (&["api.example.com", "--method", "GET", "--path", "/a/../b"][..], "`..` segment"),
        (&["api.example.com", "--method", "GET", "--path", "/a%2Fb"][..], "contains `%`"),
        (&["api.example.com", "--method", "GET", "--path", "x"][..], "does not start with `/`"),
        (&["10.0.0.1", "--method", "GET", "--path", "/"][..], "not a host pattern"),
    ] {
        let mut argv = vec!["policy", "allow", "http"];
        argv.extend_from_slice(args);
        let (code, _, err) = output(&mut w.ppp(&argv));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(err.contains("hint:"), "{err}");
    }
    let (code, _, err) = output(&mut w.ppp(["policy", "allow", "network", "a.example.com", "--method", "GET"]));
    assert_eq!(code, 2);
    assert!(err.contains("`--method` and `--path` are for HTTP rules"), "{err}");
    assert_eq!(ok(&mut w.ppp(["policy", "ls", "-q"])).lines().count(), 0, "nothing was added");

    // In a file: the file, the rule's line and the field.
    let path = w.config().join("policies.yaml");
    std::fs::write(
        &path,
        "default: deny\nrules:\n- id: 16fd2706-8baf-433b-82eb-8c7fada847da\n  decision: allow\n  type: http\n  resource: api.example.com\n  methods: [GET]\n  path: /a//b\n  created_at: 2025-06-01T12:00:00Z\n  source: local\n",
    )
    .unwrap();
    let (code, _, err) = output(&mut w.ppp(["policy", "ls"]));
    assert_ne!(code, 0);
    assert!(
        err.contains("policies.yaml` line 3") && err.contains("field `path`") && err.contains("empty segment"),
        "{err}"
    );
}

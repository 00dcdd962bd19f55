//! `ppp policy budget set|ls|rm` (issue 27, point 4) through the real
//! binary and real files: what budgets.yaml holds after each change, the
//! use `ls` reads from usage.jsonl, the reload a running daemon is asked
//! for, and the errors for bad input.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;

use common::{World, ok, output};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

fn budgets(w: &World) -> String {
    std::fs::read_to_string(w.config().join("budgets.yaml")).unwrap()
}

/// A usage line of `sandbox` at `ts`.
fn usage_line(ts: &str, sandbox: &str, input: u64, output: u64, requests: u64) -> String {
    serde_json::json!({
        "ts": ts, "sandbox": sandbox, "provider": "anthropic", "model": "claude-sonnet-4-5",
        "requests": requests, "estimated": 0, "input": input, "output": output,
        "cache_read": 0, "cache_write": 0,
    })
    .to_string()
        + "\n"
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// The next UTC midnight, as `ls` prints a daily budget's reset.
fn tomorrow() -> String {
    now().date().next_day().unwrap().midnight().assume_utc().format(&Rfc3339).unwrap()
}

#[test]
fn set_writes_the_file_and_setting_again_replaces() {
    let w = World::new();
    let out = ok(&mut w.ppp(["policy", "budget", "set", "red", "--tokens", "2M"]));
    assert_eq!(out, "budget set: `red`: 2M tokens a day (UTC), refused past it\n");
    ok(&mut w.ppp(["policy", "budget", "set", "--cost", "$20", "--ask"]));
    ok(&mut w.ppp(["policy", "budget", "set", "red", "--tokens", "500k", "--per", "total"]));
    let out = ok(&mut w.ppp(["policy", "budget", "set", "red", "--tokens", "1.5M"]));
    assert_eq!(out, "budget changed: `red`: 1.5M tokens a day (UTC), refused past it\n");
    ok(&mut w.ppp(["policy", "budget", "set", "-g", "--tokens", "10000000", "--per", "total"]));
    insta::assert_snapshot!(budgets(&w), @r"
    budgets:
    - scope: red
      tokens: 1500000
      per: day
      on_exceed: deny
    - scope: global
      cost_usd: 20.0
      per: day
      on_exceed: ask
    - scope: red
      tokens: 500000
      per: total
      on_exceed: deny
    - scope: global
      tokens: 10000000
      per: total
      on_exceed: deny
    ");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(w.config().join("budgets.yaml")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn ls_shows_use_against_each_limit() {
    let w = World::new();
    let (code, out, _) = output(&mut w.ppp(["policy", "budget", "ls"]));
    assert_eq!((code, out.as_str()), (0, "no budgets; set one with `ppp policy budget set SANDBOX --tokens 2M`\n"));
    assert_eq!(ok(&mut w.ppp(["policy", "budget", "ls", "--json"])), "[]\n");

    ok(&mut w.ppp(["policy", "budget", "set", "red", "--tokens", "2k"]));
    ok(&mut w.ppp(["policy", "budget", "set", "red", "--tokens", "1M", "--per", "total"]));
    ok(&mut w.ppp(["policy", "budget", "set", "blue", "--tokens", "1M"]));
    ok(&mut w.ppp(["policy", "budget", "set", "--global", "--cost", "5", "--ask"]));
    let today = now().format(&Rfc3339).unwrap();
    let log = [
        // Today: red is past its 2k a day; blue used a little.
        usage_line(&today, "red", 1500, 600, 1),
        usage_line(&today, "blue", 100, 20, 1),
        // A roll-up of an earlier day: all time only.
        usage_line("2026-01-01T00:00:00Z", "red", 30_000, 4_000, 7),
        "not a record\n".to_owned(),
    ]
    .concat();
    std::fs::write(w.data().join("usage.jsonl"), log).unwrap();

    let (code, out, err) = output(&mut w.ppp(["policy", "budget", "ls"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.starts_with("warning: `") && err.ends_with("usage.jsonl`: 1 line skipped, not usage records\n"),
        "{err}"
    );
    insta::assert_snapshot!(out.replace(&tomorrow(), "[TOMORROW]"), @r"
    SCOPE   PER    LIMIT      USED           LEFT            PAST IT  RESETS
    red     day    2k tokens  2,100 tokens   0 tokens        deny     [TOMORROW]
    red     total  1M tokens  36,100 tokens  963,900 tokens  deny     never
    blue    day    1M tokens  120 tokens     999,880 tokens  deny     [TOMORROW]
    global  day    $5.00      $0.01          $4.99           ask      [TOMORROW]
    ");

    // Only the budgets that count blue's requests: its own and the global.
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "budget", "ls", "blue", "--json"]))).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v[0]["scope"], "blue");
    assert_eq!(v[1]["scope"], "global");
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "budget", "ls", "--json"]))).unwrap();
    let red_day = &v[0];
    assert_eq!(red_day["resets"], tomorrow());
    let mut red_day = red_day.clone();
    red_day["resets"] = Value::Null;
    insta::assert_json_snapshot!(red_day, @r#"
    {
      "scope": "red",
      "per": "day",
      "on_exceed": "deny",
      "tokens": 2000,
      "used": 2100,
      "left": 0,
      "exceeded": true,
      "requests": 1,
      "estimated": 0,
      "unpriced": 0,
      "resets": null
    }
    "#);
    assert_eq!(
        (v[1]["used"].as_u64(), v[1]["requests"].as_u64(), v[1]["resets"].is_null()),
        (Some(36_100), Some(8), true)
    );
    assert_eq!(
        (v[3]["cost_usd"].as_f64(), v[3]["unpriced"].as_u64(), v[3]["exceeded"].as_bool()),
        (Some(5.0), Some(0), Some(false))
    );
    // Priced with the built-in table: 1,600 input and 620 output tokens
    // of Claude Sonnet 4.5 at $3 and $15 a million.
    let cost = v[3]["used"].as_f64().unwrap();
    assert!((cost - 0.0141).abs() < 1e-9, "{cost}");
}

#[test]
fn rm_takes_a_scope_and_a_period() {
    let w = World::new();
    ok(&mut w.ppp(["policy", "budget", "set", "red", "--tokens", "2M"]));
    ok(&mut w.ppp(["policy", "budget", "set", "red", "--cost", "3"]));
    ok(&mut w.ppp(["policy", "budget", "set", "red", "--tokens", "9M", "--per", "total"]));
    ok(&mut w.ppp(["policy", "budget", "set", "--tokens", "20M"]));
    let out = ok(&mut w.ppp(["policy", "budget", "rm", "red", "--per", "day"]));
    assert_eq!(
        out,
        "budget removed: `red`: 2M tokens a day (UTC), refused past it\nbudget removed: `red`: $3.00 a day (UTC), refused past it\n"
    );
    let (code, out, err) = output(&mut w.ppp(["policy", "budget", "rm", "red", "--per", "day"]));
    assert_eq!((code, out.as_str()), (2, ""));
    assert_eq!(err, "error: there is no day budget for `red`\nhint: `ppp policy budget ls` lists the budgets\n");
    ok(&mut w.ppp(["policy", "budget", "rm", "-g"]));
    ok(&mut w.ppp(["policy", "budget", "rm", "red"]));
    assert_eq!(budgets(&w), "budgets: []\n");
    let (code, _, err) = output(&mut w.ppp(["policy", "budget", "rm"]));
    assert_eq!(
        (code, err.as_str()),
        (2, "error: there is no budget for global\nhint: `ppp policy budget ls` lists the budgets\n")
    );
}

#[test]
fn bad_input_is_refused_and_writes_nothing() {
    let w = World::new();
    let cases: &[(&[&str], i32, &str)] = &[
        (&["set", "red"], 2, "the following required arguments were not provided"),
        (&["set", "red", "--tokens", "1M", "--cost", "2"], 2, "cannot be used with"),
        (&["set", "red", "--tokens", "lots"], 2, "`lots` is not a token count (write e.g. `2000000`, `2M` or `500k`)"),
        (&["set", "red", "--tokens", "0"], 2, "`0` is zero tokens"),
        (&["set", "red", "--cost", "-1"], 2, "unexpected argument '-1'"),
        (&["set", "red", "--cost", "0"], 2, "`0` must be more than zero dollars"),
        (&["set", "red", "--tokens", "1M", "--per", "week"], 2, "invalid value 'week'"),
        (&["set", "-g", "red", "--tokens", "1M"], 2, "the argument '--global' cannot be used with '[SANDBOX]'"),
        (&["set", "Red", "--tokens", "1M"], 2, "error: invalid sandbox name `Red`"),
        (&["set", "global", "--tokens", "1M"], 2, "error: invalid sandbox name `global`: that name is reserved"),
        (&["ls", "x-"], 2, "error: invalid sandbox name `x-`"),
        (&["rm", "a_b"], 2, "error: invalid sandbox name `a_b`"),
    ];
    for (args, want, needle) in cases {
        let mut argv = vec!["policy", "budget"];
        argv.extend_from_slice(args);
        let (code, out, err) = output(&mut w.ppp(&argv));
        assert_eq!(code, *want, "{args:?}: {err}");
        assert_eq!(out, "", "{args:?}");
        assert!(err.contains(needle), "{args:?}: want {needle:?} in\n{err}");
    }
    assert!(!w.config().join("budgets.yaml").exists(), "nothing was written");
}

#[test]
fn a_broken_file_names_its_line_and_field_and_is_left_alone() {
    let w = World::new();
    let text =
        "budgets:\n  - scope: red\n    tokens: 2M\n    per: day\n  - scope: blue\n    cost_usd: cheap\n    per: day\n";
    std::fs::write(w.config().join("budgets.yaml"), text).unwrap();
    for args in [&["ls"][..], &["set", "red", "--tokens", "1M"], &["rm", "red"]] {
        let mut argv = vec!["policy", "budget"];
        argv.extend_from_slice(args);
        let (code, out, err) = output(&mut w.ppp(&argv));
        assert_eq!((code, out.as_str()), (1, ""), "{args:?}: {err}");
        assert_eq!(
            w.redact(&err),
            "error: `[ROOT]/config/budgets.yaml` line 6, column 15: budgets[1].cost_usd: invalid type: string \"cheap\", \
             expected an amount of US dollars such as 5 or 2.50\nhint: fix that line (docs/policy.md, \"Budgets\", shows \
             the format), or move the file away and set the budgets again with `ppp policy budget set`\n",
            "{args:?}"
        );
    }
    assert_eq!(budgets(&w), text, "the broken file is not rewritten");
}

#[test]
fn a_change_asks_a_running_daemon_to_reload() {
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
    ok(&mut w.ppp(["policy", "budget", "set", "red", "--tokens", "2M"]));
    // `ls` changes nothing, so it asks nothing.
    ok(&mut w.ppp(["policy", "budget", "ls"]));
    ok(&mut w.ppp(["policy", "budget", "rm", "red"]));
    assert_eq!(server.join().unwrap(), ["{\"op\":\"reload\"}\n", "{\"op\":\"reload\"}\n"]);
}

/// Every change holds `state.lock`: budgets set at once, each by its own
/// process, all land, and the file parses.
#[test]
fn eight_parallel_sets_leave_eight_budgets() {
    let w = World::new();
    let children: Vec<_> = (0..8)
        .map(|i| {
            w.ppp(["policy", "budget", "set", &format!("s{i}"), "--tokens", "1M"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let v: Value = serde_json::from_str(&ok(&mut w.ppp(["policy", "budget", "ls", "--json"]))).unwrap();
    let mut scopes: Vec<&str> = v.as_array().unwrap().iter().map(|b| b["scope"].as_str().unwrap()).collect();
    scopes.sort_unstable();
    assert_eq!(scopes, ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"]);
}

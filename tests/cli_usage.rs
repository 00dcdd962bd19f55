//! `ppp usage` (issue 27, point 3) on a usage.jsonl the test writes in
//! `$PPP_DATA`, as the daemon does: flow lines of today and yesterday,
//! a roll-up of a day ten days back, an estimated response, and a model no
//! price table prices. The table, `--json`, `--since`, `-q`, a named
//! sandbox, the user's price table and a bad one; and the dashboard's
//! TOKENS column on a real terminal (tmux; fails, never skips, without it).

#![allow(clippy::similar_names, clippy::many_single_char_names, reason = "short names read better in tests")]

mod common;
#[path = "support/tmux.rs"]
mod tmux;

use common::{World, ok, output};
use ppp::usage::record::{Record, Tokens, line};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

fn stamp(t: OffsetDateTime) -> String {
    t.replace_nanosecond(0).unwrap().format(&Rfc3339).unwrap()
}

fn rec(ts: &str, sandbox: &str, provider: &str, model: &str, requests: u64, tokens: [u64; 4], flow: bool) -> Record {
    let [input, output, cache_read, cache_write] = tokens;
    Record {
        ts: ts.into(),
        sandbox: sandbox.into(),
        provider: provider.into(),
        model: model.into(),
        requests,
        estimated: 0,
        tokens: Tokens { input, output, cache_read, cache_write },
        flow: flow.then(|| format!("{sandbox}-{ts}-{}", tokens[0])),
    }
}

/// The log, relative to now: what today, seven days and all time hold
/// does not depend on when the test runs (but for a run that straddles
/// midnight UTC between writing the log and reading it).
fn log() -> Vec<Record> {
    let now = OffsetDateTime::now_utc();
    let today = stamp(now);
    let yesterday = stamp(now - time::Duration::DAY);
    let ten_days_back = format!("{}T00:00:00Z", (now - time::Duration::days(10)).date());
    let sonnet = "claude-sonnet-4-5-20250929";
    let mut estimated = rec(&today, "red-fox", "anthropic", sonnet, 1, [800, 200, 0, 0], true);
    estimated.estimated = 1;
    vec![
        rec(&ten_days_back, "red-fox", "anthropic", sonnet, 30, [1_000_000, 200_000, 3_000_000, 100_000], false),
        rec(&yesterday, "red-fox", "anthropic", sonnet, 1, [20_000, 5_000, 0, 0], true),
        rec(&today, "red-fox", "anthropic", sonnet, 1, [12_000, 3_000, 40_000, 2_000], true),
        estimated,
        rec(&today, "blue-owl", "openai", "gpt-5-mini-2025-08-07", 1, [50_000, 10_000, 20_000, 0], true),
        rec(&yesterday, "green-elk", "mygateway", "llama-3.3-70b", 1, [9_000, 1_000, 0, 0], true),
    ]
}

fn world_with(records: &[Record], extra: &str) -> World {
    let w = World::new();
    let text: String = records.iter().map(line).collect();
    std::fs::write(w.data().join("usage.jsonl"), format!("{text}{extra}")).unwrap();
    w
}

#[test]
fn the_table_the_json_and_quiet() {
    let w = world_with(&log(), "");
    let (code, out, err) = output(&mut w.ppp(["usage"]));
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    insta::assert_snapshot!("table", w.redact(&out));

    let v: serde_json::Value = serde_json::from_str(&ok(&mut w.ppp(["usage", "--json"]))).unwrap();
    assert_eq!(v["currency"], "USD");
    assert_eq!(v["prices"], serde_json::json!([{"source": "built-in", "date": "2025-11-24"}]));
    assert!(v["windows"]["all"].is_null());
    assert!(v["windows"]["today"].as_str().unwrap().ends_with("T00:00:00Z"));
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let red = &rows[2];
    assert_eq!((red["sandbox"].as_str(), red["provider"].as_str()), (Some("red-fox"), Some("anthropic")));
    assert_eq!(red["today"]["tokens"], 58_000);
    assert_eq!(red["today"]["estimated"], 1);
    assert_eq!(red["week"]["requests"], 3);
    assert_eq!(red["all"]["requests"], 33);
    assert_eq!(red["all"]["cache_read"], 3_040_000);
    // 7.275 + 0.135 + 0.1005 + 0.0054 USD at Sonnet 4.5's list price.
    assert_eq!(red["all"]["cost"], 7.5159);
    let gateway = &rows[1];
    assert!(gateway["all"]["cost"].is_null(), "no price is null, never 0: {gateway}");
    assert_eq!(gateway["today"]["cost"], 0.0, "nothing used today costs nothing");

    let quiet = "blue-owl 80000\ngreen-elk 10000\nred-fox 4383000\n";
    assert_eq!(ok(&mut w.ppp(["usage", "-q"])), quiet);
    assert_eq!(ok(&mut w.ppp(["-q", "usage"])), quiet, "the global -q means the same");
}

#[test]
fn since_shows_one_window_with_each_kind() {
    let w = world_with(&log(), "");
    let out = ok(&mut w.ppp(["usage", "--since", "2d"]));
    insta::with_settings!({filters => vec![(r"since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "since [TIME]")]}, {
        insta::assert_snapshot!("since", w.redact(&out));
    });
    assert!(!out.contains("counts"), "no roll-up in two days: {out}");

    // From a midnight, a roll-up of that day counts, and nothing says
    // more; from mid-day, it counts whole and the table says so.
    let day = (OffsetDateTime::now_utc() - time::Duration::days(10)).date();
    let v: serde_json::Value =
        serde_json::from_str(&ok(&mut w.ppp(["usage", "red-fox", "--since", &day.to_string(), "--json"]))).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 1);
    assert_eq!(v["rows"][0]["since"]["requests"], 33);
    assert_eq!(v["whole_days"], serde_json::json!([]));
    let out = ok(&mut w.ppp(["usage", "red-fox", "--since", &format!("{day}T12:00:00Z")]));
    assert!(out.contains(&format!("the whole of {day} counts: past days are kept as daily totals")), "{out}");
    assert!(out.contains("33 (1 est.)"), "{out}");

    let (code, _, err) = output(&mut w.ppp(["usage", "--since", "last week"]));
    assert_eq!(code, 2);
    assert!(err.starts_with("error: `--since last week` is neither a time nor an age\nhint: "), "{err}");
    let (code, out, _) = output(&mut w.ppp(["usage", "--since", "2099-01-01"]));
    assert_eq!((code, out.as_str()), (0, "no LLM usage recorded since 2099-01-01T00:00:00Z\n"));
}

#[test]
fn a_named_sandbox() {
    let w = world_with(&log(), "");
    let out = ok(&mut w.ppp(["usage", "blue-owl"]));
    assert!(out.starts_with("SANDBOX   PROVIDER  MODEL "), "{out}");
    assert!(out.contains("\nblue-owl  openai    gpt-5-mini-2025-08-07  80,000  80,000  80,000    $0.03\n"), "{out}");
    assert!(!out.contains("TOTAL"), "one row needs no total: {out}");
    assert_eq!(ok(&mut w.ppp(["usage", "blue-owl", "-q"])), "blue-owl 80000\n");
    // A sandbox that exists but used nothing: an honest empty report.
    w.write_record("quiet-cat", 51830, "stopped");
    assert_eq!(ok(&mut w.ppp(["usage", "quiet-cat"])), "no LLM usage recorded for sandbox `quiet-cat`\n");
    // Neither a sandbox nor any usage of one: the usual mistake.
    let (code, out, err) = output(&mut w.ppp(["usage", "ghost"]));
    assert_eq!((code, out.as_str()), (2, ""));
    assert_eq!(
        err,
        "error: no sandbox named `ghost`, and no usage of one is recorded\n\
         hint: list sandboxes with `ppp ls`; `ppp usage` alone shows every sandbox's usage\n"
    );
}

#[test]
fn an_empty_log_says_so() {
    let w = World::new();
    let (code, out, err) = output(&mut w.ppp(["usage"]));
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(
        out,
        "no LLM usage recorded yet\n\
         hint: the proxy meters the responses of LLM providers (Anthropic, OpenAI, Gemini) as they pass; \
         a sandbox's tokens show here once its agent talks to one\n"
    );
    assert_eq!(ok(&mut w.ppp(["usage", "-q"])), "");
    let v: serde_json::Value = serde_json::from_str(&ok(&mut w.ppp(["usage", "--json"]))).unwrap();
    assert_eq!(v["rows"], serde_json::json!([]));
    assert_eq!(v["prices"], serde_json::json!([]));
}

#[test]
fn lines_that_are_not_records_are_skipped_with_a_warning() {
    let w = world_with(&log()[..1], "{\"ts\": \"torn\n");
    let (code, out, err) = output(&mut w.ppp(["usage", "-q"]));
    assert_eq!((code, out.as_str()), (0, "red-fox 4300000\n"));
    assert_eq!(w.redact(&err), "warning: 1 line of `[ROOT]/data/usage.jsonl` is not a usage record; skipped\n");
}

#[test]
fn the_user_s_prices_are_tried_first() {
    let w = world_with(&log(), "");
    std::fs::create_dir_all(w.config().join("usage")).unwrap();
    std::fs::write(
        w.config().join("usage/prices.yaml"),
        "# my gateway, and what we pay for Sonnet\n\
         date: 2026-11-30\n\
         currency: USD\n\
         prices:\n\
         \x20 - provider: mygateway\n\
         \x20   model: llama-*\n\
         \x20   input: 0.5\n\
         \x20   output: 1.5\n\
         \x20 - provider: anthropic\n\
         \x20   model: claude-sonnet-4-5*\n\
         \x20   input: 1\n\
         \x20   output: 5\n\
         \x20   cache_read: 0.1\n\
         \x20   cache_write: 1.25\n",
    )
    .unwrap();
    let out = ok(&mut w.ppp(["usage"]));
    insta::assert_snapshot!("user_prices", w.redact(&out));
    let v: serde_json::Value = serde_json::from_str(&ok(&mut w.ppp(["usage", "--json"]))).unwrap();
    let sources: Vec<String> =
        v["prices"].as_array().unwrap().iter().map(|t| w.redact(&format!("{} {}", t["source"], t["date"]))).collect();
    assert_eq!(sources, ["\"[ROOT]/config/usage/prices.yaml\" \"2026-11-30\"", "\"built-in\" \"2025-11-24\""]);
    assert_eq!(v["rows"][1]["all"]["cost"], 0.006);
}

#[test]
fn a_bad_price_file_names_its_line_and_field() {
    let w = world_with(&log(), "");
    std::fs::create_dir_all(w.config().join("usage")).unwrap();
    let text = "date: 2026-11-30\ncurrency: USD\nprices:\n  - provider: anthropic\n    model: claude-*\n    input: 1\n    output: five\n";
    std::fs::write(w.config().join("usage/prices.yaml"), text).unwrap();
    for args in [&["usage"][..], &["usage", "--json"], &["usage", "red-fox", "--since", "1d"]] {
        let (code, out, err) = output(&mut w.ppp(args));
        assert_eq!((code, out.as_str()), (1, ""), "{args:?}");
        assert_eq!(
            w.redact(&err),
            "error: `[ROOT]/config/usage/prices.yaml` line 7, column 13: prices[0].output: invalid type: string \
             \"five\", expected a price in USD per million tokens, such as `3` or `0.30`\n\
             hint: fix that line (`ppp usage --help` shows the format), or move \
             `[ROOT]/config/usage/prices.yaml` away to use the built-in prices\n",
            "{args:?}"
        );
    }
    // `-q` prices nothing, so a script counting tokens goes on.
    assert_eq!(ok(&mut w.ppp(["usage", "-q", "blue-owl"])), "blue-owl 80000\n");
    std::fs::write(w.config().join("usage/prices.yaml"), "date: 2026-11-30\ncurrency: EUR\n").unwrap();
    let (code, _, err) = output(&mut w.ppp(["usage"]));
    assert_eq!(code, 1);
    assert!(
        w.redact(&err).starts_with(
            "error: `[ROOT]/config/usage/prices.yaml` line 2, column 11: currency: `EUR` is not `USD`, the only \
             currency ppp prices in\n"
        ),
        "{err}"
    );
    // `ppp ls` does not price anything, so a bad price file does not stop it.
    w.write_record("red-fox", 51820, "stopped");
    assert!(ok(&mut w.ppp(["ls"])).contains("red-fox"));
}

/// The dashboard reads tokens today from the log at each refresh, as `ppp
/// ls` does: a response logged while it runs shows within the refresh.
#[test]
fn the_dashboard_shows_tokens_today_as_they_are_logged() {
    let now = stamp(OffsetDateTime::now_utc());
    let sonnet = "claude-sonnet-4-5-20250929";
    let w = world_with(&[rec(&now, "red", "anthropic", sonnet, 1, [10_000, 2_000, 300, 0], true)], "");
    w.write_record("red", 51820, "running");
    w.write_record("blue", 51821, "stopped");
    w.fake("podman", "echo '[]'");
    let script = w.path().join("tui.sh");
    std::fs::write(
        &script,
        format!(
            "env -i HOME='{home}' PATH='{bin}:/usr/bin:/bin' PPP_CONFIG='{config}' PPP_DATA='{data}' \
             PPP_CACHE='{cache}' PPP_PODMAN='{bin}/podman' TERM=\"$TERM\" {ppp} tui\n\
             echo \"ppp exited with $?\"\n",
            home = w.home().display(),
            bin = w.bin().display(),
            config = w.config().display(),
            data = w.data().display(),
            cache = w.cache().display(),
            ppp = env!("CARGO_BIN_EXE_ppp"),
        ),
    )
    .unwrap();
    let tmux = tmux::Tmux::start(w.path(), 140, 20);
    tmux.keys(&[&format!("sh {}", script.display()), "Enter"]);
    let deadline = std::time::Duration::from_secs(30);
    let row = |s: &str, name: &str| s.lines().find(|l| l.contains(&format!(" {name} "))).unwrap_or("").to_owned();
    let screen = tmux.wait_within(deadline, "red's tokens", |s| row(s, "red").contains("12.3k"));
    assert!(screen.contains("TOKENS"), "{screen}");
    assert!(row(&screen, "blue").contains(" 0       -      /src/blue"), "none is `-`: {screen}");

    let mut more = rec(&now, "red", "anthropic", sonnet, 1, [400, 0, 0, 0], true);
    more.estimated = 1;
    let mut f = std::fs::OpenOptions::new().append(true).open(w.data().join("usage.jsonl")).unwrap();
    std::io::Write::write_all(&mut f, line(&more).as_bytes()).unwrap();
    tmux.wait_within(deadline, "the estimated response", |s| row(s, "red").contains("~12.7k"));
    tmux.keys(&["q"]);
    let screen = tmux.wait_within(deadline, "ppp to exit", |s| s.contains("ppp exited with"));
    assert!(screen.contains("ppp exited with 0"), "{screen}");
}

//! How `ppp policy log` shows a flow, and `ppp policy log -f`, which keeps
//! printing flows as the proxy logs them. Reading and following the log is
//! [`crate::policy::follow`]'s; this module only chooses the columns and
//! prints.
//!
//! A followed table cannot be aligned on rows not seen yet, so its columns
//! get fixed minimum widths (widened by the rows printed first) and the
//! variable-width path comes last, where a long one misaligns nothing.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use serde_json::Value;

use crate::cli::FlowTypeFilter;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::policy::follow::{self, Follower};
use crate::{output, sandbox};

/// The columns of `policy log`, followed or not.
pub(super) const HEADER: [&str; 10] =
    ["TIME", "SANDBOX", "DECISION", "METHOD", "DESTINATION", "STATUS", "UP", "DOWN", "DURATION", "PATH"];

/// Narrowest a followed column is drawn, so most later rows still line up.
const MIN_WIDTHS: [usize; 10] = [20, 7, 8, 7, 36, 6, 7, 7, 8, 0];

/// A flow's field as a cell: `-` for missing or null.
pub(super) fn field(v: &Value, k: &str) -> String {
    match v.get(k) {
        None | Some(Value::Null) => "-".to_owned(),
        // The guest's bytes, on their way to a terminal.
        Some(Value::String(s)) => crate::output::printable(s).into_owned(),
        Some(other) => other.to_string(),
    }
}

/// A flow's DECISION cell: `learned` for what a learning sandbox was
/// allowed with no rule deciding (ADR 0048), else the decision.
pub(super) fn decision(f: &Value) -> String {
    if f.get("decision").and_then(Value::as_str) == Some("allow")
        && f.get("matched_rule").and_then(Value::as_str) == Some(crate::policy::LEARNED)
    {
        return crate::policy::LEARNED.to_owned();
    }
    field(f, "decision")
}

/// A flow's row under [`HEADER`]: sizes and durations in short units, the
/// path without its query ([`follow::scrub`]).
pub(super) fn row(f: &Value) -> Vec<String> {
    let num = |k: &str| f.get(k).and_then(Value::as_u64);
    // Hosts, methods and paths are the guest's bytes.
    let cells = vec![
        field(f, "timestamp"),
        field(f, "sandbox"),
        decision(f),
        field(f, "method"),
        super::destination(f),
        field(f, "status"),
        num("bytes_out").map_or_else(|| "-".to_owned(), follow::size),
        num("bytes_in").map_or_else(|| "-".to_owned(), follow::size),
        num("duration_ms").map_or_else(|| "-".to_owned(), follow::duration),
        follow::path(f).filter(|p| !p.is_empty()).unwrap_or("-").to_owned(),
    ];
    cells.into_iter().map(|c| crate::output::printable(&c).into_owned()).collect()
}

/// Column widths for a followed table: [`MIN_WIDTHS`], the header and
/// the rows printed first, whichever is widest.
fn widths(rows: &[Vec<String>]) -> Vec<usize> {
    let mut w: Vec<usize> = HEADER.iter().zip(MIN_WIDTHS).map(|(h, m)| h.chars().count().max(m)).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    w
}

/// One line of a followed table: every column but the last padded to its
/// width (a longer cell pushes the rest right), no trailing spaces.
fn line<S: AsRef<str>>(cells: &[S], widths: &[usize]) -> String {
    let mut s = String::new();
    for (i, c) in cells.iter().enumerate() {
        if i + 1 < cells.len() {
            let _ = write!(s, "{:<w$}  ", c.as_ref(), w = widths[i]);
        } else {
            s.push_str(c.as_ref());
        }
    }
    s.truncate(s.trim_end().len());
    s.push('\n');
    s
}

/// How flows are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Json,
    Hosts,
    Table,
}

/// The text for `flows` in `form`; `legend` says whether the misdirected
/// legend was printed yet, and is set once it is.
fn render(flows: &[Value], form: Form, widths: &[usize], legend: &mut bool) -> Result<String> {
    let mut text = String::new();
    for f in flows {
        match form {
            Form::Json => {
                text.push_str(&crate::output::json_line(f)?);
                text.push('\n');
            }
            Form::Hosts => {
                text.push_str(&field(f, "host"));
                text.push('\n');
            }
            Form::Table => text.push_str(&line(&row(f), widths)),
        }
    }
    if form == Form::Table && !*legend && flows.iter().any(super::misdirected) {
        text.push_str(super::MISDIRECTED_LEGEND);
        *legend = true;
    }
    Ok(text)
}

/// `ppp policy log -f`: the last `limit` flows, then each new one as it is
/// logged, until Ctrl-C (exit 0) or a closed stdout (exit 0, by way of the
/// broken-pipe error `main` maps).
pub(super) fn follow(
    dirs: &Dirs,
    sandbox_name: Option<&str>,
    json: bool,
    limit: usize,
    quiet: bool,
    kind: FlowTypeFilter,
) -> Result<ExitCode> {
    if let Some(s) = sandbox_name {
        sandbox::validate_name(s)?;
    }
    if kind == FlowTypeFilter::Filesystem {
        // Nothing would ever come: say so instead of waiting forever.
        if !json && !quiet {
            output::println("no filesystem flows: the proxy records network connections only")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let path = dirs.flows_log();
    let mut follower = Follower::at_end(&path).map_err(|e| anyhow::Error::new(e).context(open_error(&path)))?;
    let backlog = follower.backlog(limit, sandbox_name)?;
    // As without -f: a name with neither a sandbox nor a logged connection
    // is a mistake, and following it would wait for nothing.
    if let Some(s) = sandbox_name
        && backlog.is_empty()
        && sandbox::load(dirs, s)?.is_none()
        && follower.backlog(1, Some(s))?.is_empty()
    {
        return Err(fail(format!("no sandbox named `{s}`, and no connection from one is logged"))
            .hint("list sandboxes with `ppp ls`; `ppp policy log -f` alone follows every sandbox's connections")
            .code(2)
            .into());
    }
    let form = if json {
        Form::Json
    } else if quiet {
        Form::Hosts
    } else {
        Form::Table
    };
    let mut seen: Vec<Vec<String>> = backlog.iter().map(row).collect();
    if let Some(s) = sandbox_name {
        seen.push(vec![String::new(), s.to_owned()]);
    }
    let widths = widths(&seen);
    let mut legend = false;
    let mut text = if form == Form::Table { line(&HEADER, &widths) } else { String::new() };
    text.push_str(&render(&backlog, form, &widths, &mut legend)?);
    output::print(&text)?;

    // Caught rather than left to kill ppp, so the last batch is written
    // whole and the exit status is 0: stopping is how -f is meant to end.
    let stop = Arc::new(AtomicBool::new(false));
    let id = signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone()).ok();
    let result = (|| -> Result<()> {
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(follow::INTERVAL);
            let flows =
                follower.poll_flows(sandbox_name).map_err(|e| anyhow::Error::new(e).context(read_error(&path)))?;
            if !flows.is_empty() {
                output::print(&render(&flows, form, &widths, &mut legend)?)?;
            }
        }
        Ok(())
    })();
    if let Some(id) = id {
        signal_hook::low_level::unregister(id);
    }
    if follower.malformed > 0 {
        tracing::warn!(path = %path.display(), skipped = follower.malformed, "skipped malformed lines in the flow log");
    }
    result.map(|()| ExitCode::SUCCESS)
}

fn open_error(path: &std::path::Path) -> String {
    format!("could not open `{}`", path.display())
}

fn read_error(path: &std::path::Path) -> String {
    format!("could not read `{}`", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flows() -> Vec<Value> {
        vec![
            serde_json::json!({"sandbox": "red-fox", "timestamp": "2026-11-29T10:00:00Z", "kind": "http",
                "host": "api.example.com", "ip": "203.0.113.7", "port": 443, "method": "POST",
                "path": "/v1/messages", "status": 200, "decision": "allow", "matched_rule": null,
                "bytes_out": 1536, "bytes_in": 5_400_000, "duration_ms": 830, "resolved": true}),
            serde_json::json!({"sandbox": "red-fox", "timestamp": "2026-11-29T10:00:01Z", "kind": "http",
                "host": "api.example.com", "ip": "10.77.0.9", "port": 80, "method": "GET",
                "path": "/x?token=hidden", "status": 403, "decision": "deny", "matched_rule": null,
                "bytes_out": 0, "bytes_in": 0, "duration_ms": 2, "resolved": false}),
            serde_json::json!({"sandbox": "red-fox", "timestamp": "2026-11-29T10:00:02Z", "kind": "tcp",
                "host": null, "ip": "2001:db8::9", "port": 22, "method": null, "status": null,
                "decision": "allow", "matched_rule": null, "bytes_out": 1, "bytes_in": 2, "duration_ms": 125_000}),
            // An older addon's line: no path, no duration.
            serde_json::json!({"sandbox": "blue", "timestamp": "2026-11-29T10:00:03Z", "host": "old.example",
                "port": 443, "method": "GET", "status": 200, "decision": "allow", "matched_rule": null}),
        ]
    }

    #[test]
    fn followed_table_lines() {
        let flows = flows();
        let w = widths(&[]);
        let mut legend = false;
        let mut text = line(&HEADER, &w);
        text += &render(&flows[..1], Form::Table, &w, &mut legend).unwrap();
        text += &render(&flows[1..], Form::Table, &w, &mut legend).unwrap();
        assert!(legend);
        text += &render(&flows[1..2], Form::Table, &w, &mut legend).unwrap();
        assert!(!text.contains("hidden"), "{text}");
        insta::assert_snapshot!(text, @r"
        TIME                  SANDBOX  DECISION  METHOD   DESTINATION                           STATUS  UP       DOWN     DURATION  PATH
        2026-11-29T10:00:00Z  red-fox  allow     POST     api.example.com:443 (203.0.113.7)     200     1.5KiB   5.1MiB   830ms     /v1/messages
        2026-11-29T10:00:01Z  red-fox  deny      GET      api.example.com:80 (10.77.0.9) !      403     0B       0B       2ms       /x
        2026-11-29T10:00:02Z  red-fox  allow     -        [2001:db8::9]:22                      -       1B       2B       2m05s     -
        2026-11-29T10:00:03Z  blue     allow     GET      old.example:443                       200     -        -        -         -
        ! the address connected to is not one the name resolves to
        2026-11-29T10:00:01Z  red-fox  deny      GET      api.example.com:80 (10.77.0.9) !      403     0B       0B       2ms       /x
        ");
    }

    #[test]
    fn followed_json_and_hosts_are_one_line_per_flow() {
        let flows = flows();
        let mut legend = false;
        let json = render(&flows, Form::Json, &[], &mut legend).unwrap();
        assert_eq!(json.lines().count(), 4);
        for (l, f) in json.lines().zip(&flows) {
            assert_eq!(&serde_json::from_str::<Value>(l).unwrap(), f);
        }
        let hosts = render(&flows, Form::Hosts, &[], &mut legend).unwrap();
        assert_eq!(hosts, "api.example.com\napi.example.com\n-\nold.example\n");
        assert!(!legend, "only tables have a legend");
    }

    #[test]
    fn widths_grow_to_the_first_rows() {
        let long = vec!["t".into(), "a-very-long-sandbox-name".into()];
        let w = widths(&[long]);
        assert_eq!(w[1], 24);
        assert_eq!(w[0], 20);
        assert_eq!(w[3], 7);
    }
}

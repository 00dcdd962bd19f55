//! `ppp usage`: the tokens each sandbox's agent used at its LLM providers,
//! read from `$PPP_DATA/usage.jsonl` (which the daemon writes) and priced
//! from the price tables; no daemon is needed to read it.

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::UsageArgs;
use crate::error::fail;
use crate::usage::report::{self, Window};
use crate::usage::{price, record};

/// Run `ppp usage`.
pub fn run(args: &UsageArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    // Whole seconds, as the log's times are.
    let now = time::OffsetDateTime::now_utc().replace_nanosecond(0).unwrap_or_else(|_| time::OffsetDateTime::now_utc());
    let windows = match &args.since {
        Some(t) => vec![Window::Since(crate::policy::record::since(t, now)?)],
        None => vec![Window::Today, Window::Week, Window::All],
    };
    // `-q` shows tokens alone, so a price file being edited cannot break
    // a script that counts them.
    let prices = if args.quiet { price::Prices::built_in(dirs.usage_prices()) } else { price::load(dirs)? };
    let log = dirs.usage_log();
    let read = record::read(&log)?;
    if read.malformed > 0 {
        let (lines, are) =
            if read.malformed == 1 { ("line", "is not a usage record") } else { ("lines", "are not usage records") };
        eprintln!("warning: {} {lines} of `{}` {are}; skipped", read.malformed, log.display());
    }
    let mut records = read.records;
    let logged_any = !records.is_empty();
    if let Some(name) = &args.sandbox {
        records.retain(|r| &r.sandbox == name);
        // A removed sandbox's usage stays in the log and is still shown; a
        // name with neither a sandbox nor recorded usage is a mistake.
        if records.is_empty() && crate::sandbox::load(dirs, name)?.is_none() {
            return Err(fail(format!("no sandbox named `{name}`, and no usage of one is recorded"))
                .hint("list sandboxes with `ppp ls`; `ppp usage` alone shows every sandbox's usage")
                .code(2)
                .into());
        }
    }
    let report = report::build(&records, now, &windows, &prices);
    if args.json {
        crate::output::json(&report::json(&report, &prices))?;
    } else if args.quiet {
        crate::output::print(&report::render_quiet(&report))?;
    } else if report.rows.is_empty() {
        crate::output::print(&empty(args, logged_any, &windows, now))?;
    } else if args.since.is_some() {
        crate::output::print(&report::render_window(&report, &prices))?;
    } else {
        crate::output::print(&report::render_overview(&report, &prices))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What an empty report says: nothing at all is recorded yet, or nothing
/// for this sandbox, or nothing in this window.
fn empty(args: &UsageArgs, logged_any: bool, windows: &[Window], now: time::OffsetDateTime) -> String {
    let since = match windows {
        [w @ Window::Since(_)] => w
            .start(now)
            .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
            .map(|t| format!(" since {t}"))
            .unwrap_or_default(),
        _ => String::new(),
    };
    match &args.sandbox {
        _ if !logged_any => "no LLM usage recorded yet\n\
             hint: the proxy meters the responses of LLM providers (Anthropic, OpenAI, Gemini) as they pass; \
             a sandbox's tokens show here once its agent talks to one\n"
            .to_owned(),
        Some(name) => format!("no LLM usage recorded for sandbox `{name}`{since}\n"),
        None => format!("no LLM usage recorded{since}\n"),
    }
}

//! `ppp ls`: sandboxes from their `sandbox.json`, with the live machine
//! state merged in from `podman machine list` when podman is available,
//! and each sandbox's LLM tokens today from usage.jsonl.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;

use super::Ctx;
use crate::cli::LsArgs;
use crate::dirs::Dirs;
use crate::podman::{self, Machine};
use crate::sandbox::{self, Record, machine};
use crate::usage::report::Sum;

/// One sandbox as `ppp ls --json` prints it.
#[derive(Debug, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub record: Record,
    /// The merged state: the machine's live state when podman answered,
    /// `missing` when podman has no such machine, else the recorded status.
    pub state: String,
    /// What podman said about the machine, if it was asked.
    pub machine: Option<Machine>,
    /// The podman home the machine lives in: `own` (the sandbox's, under
    /// ppp's data directory) or `user` (the user's own, where an earlier
    /// ppp made it).
    pub home: String,
    /// The workspace guard (ADR 0036): `on`, `strict`, `off` or `clone`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protection: Option<crate::sandbox::guard::Protection>,
    /// The sandbox's policy file says `learn: true` (ADR 0048).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub learning: bool,
    /// LLM usage today (UTC), from usage.jsonl (issue 27); shown as its
    /// tokens, every kind together, `tokens_today` in JSON.
    #[serde(rename = "tokens_today", serialize_with = "total_tokens")]
    pub today: Option<Sum>,
}

#[expect(clippy::ref_option, reason = "serde's serialize_with passes the field by reference")]
fn total_tokens<S: serde::Serializer>(today: &Option<Sum>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(today.map_or(0, |t| t.tokens.total()))
}

/// Each sandbox's LLM usage today, read from usage.jsonl (no daemon
/// needed). A log that cannot be read is reported through `warn` and
/// leaves the column empty; lines that are not records are skipped (`ppp
/// usage` counts them).
pub fn usage_today(dirs: &Dirs, warn: &mut dyn FnMut(String)) -> BTreeMap<String, Sum> {
    match crate::usage::record::read(&dirs.usage_log()) {
        Ok(read) => crate::usage::report::today(&read.records, time::OffsetDateTime::now_utc()),
        Err(e) => {
            warn(format!("{e:#}"));
            BTreeMap::new()
        }
    }
}

/// Run `ppp ls`.
pub fn run(args: &LsArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let records = sandbox::load_all(dirs)?;
    if args.quiet {
        let mut names = String::new();
        for r in &records {
            names.push_str(&r.name);
            names.push('\n');
        }
        crate::output::print(&names)?;
        return Ok(ExitCode::SUCCESS);
    }
    let listing = if records.is_empty() { None } else { listing(dirs, &records, &mut |w| eprintln!("warning: {w}")) };
    let mut rows = merge(records, listing.as_ref());
    for r in &rows {
        if let Some(why) = r.machine.as_ref().and_then(|m| m.broken.as_deref()) {
            eprintln!("warning: {}", machine::broken_hint(&r.record.name, why));
        }
    }
    let config = crate::config::load(dirs)?;
    let learning = crate::policy::learning(dirs).unwrap_or_else(|e| {
        eprintln!("warning: {e:#}");
        Vec::new()
    });
    let today = usage_today(dirs, &mut |w| eprintln!("warning: {w}"));
    for r in &mut rows {
        r.today = today.get(&r.record.name).copied();
        r.learning = learning.contains(&r.record.name);
        r.protection =
            Some(crate::sandbox::guard::Settings::for_sandbox(&config, &r.record.name).protection(&r.record));
    }
    if args.json {
        crate::output::json(&rows)?;
    } else {
        crate::output::print(&render(&rows))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Ask podman for the machines in every home ppp uses. `None` when podman
/// is absent; a home podman fails for is reported through `warn` but does
/// not fail `ls`, whose records are still worth showing.
pub fn listing(dirs: &Dirs, records: &[Record], warn: &mut dyn FnMut(String)) -> Option<machine::Listing> {
    let Some(program) = podman::program() else {
        warn("podman was not found; showing recorded states".to_owned());
        return None;
    };
    let listing = machine::list_all(&program, dirs, records, None);
    for (home, e) in &listing.errors {
        // The user's home matters only when a sandbox lives there.
        if !home.is_empty() || records.iter().any(|r| r.podman_run.is_none()) {
            let whose = if home.is_empty() { "your podman home".to_owned() } else { format!("`{home}`'s podman home") };
            warn(format!("{e} ({whose}); showing recorded states"));
        }
    }
    Some(listing)
}

/// Join records with the machines of their homes. Machines ppp did not
/// create are ignored.
pub fn merge(records: Vec<Record>, listing: Option<&machine::Listing>) -> Vec<Row> {
    records
        .into_iter()
        .map(|record| {
            let found = listing.map(|l| l.machine_of(&record).map(Option::<&Machine>::cloned));
            let (state, machine) = match found {
                None | Some(Err(())) => (record.status.to_string(), None),
                Some(Ok(Some(m))) => (m.state().to_owned(), Some(m)),
                // Between the claim and `machine init` there is no machine yet.
                Some(Ok(None)) if record.status == sandbox::Status::Creating => ("creating".to_owned(), None),
                Some(Ok(None)) => ("missing".to_owned(), None),
            };
            let home = if record.podman_run.is_some() { "own" } else { "user" }.to_owned();
            Row { record, state, machine, home, protection: None, learning: false, today: None }
        })
        .collect()
}

/// Memory as `ppp ls` shows it: GiB when whole, else MiB.
pub fn memory(mib: u64) -> String {
    if mib.is_multiple_of(1024) { format!("{}G", mib / 1024) } else { format!("{mib}M") }
}

/// The table `ppp ls` prints.
pub fn render(rows: &[Row]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let ports = if r.record.published.is_empty() {
                "-".to_owned()
            } else {
                r.record.published.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
            };
            vec![
                r.record.name.clone(),
                r.record.agent.clone(),
                if r.learning { format!("{} (learning)", r.state) } else { r.state.clone() },
                r.record.cpus.to_string(),
                memory(r.record.memory),
                ports,
                r.home.clone(),
                crate::usage::report::tokens_cell(r.today.as_ref()),
                r.record.workspace.join(","),
            ]
        })
        .collect();
    let mut out = crate::output::table(
        &["NAME", "AGENT", "STATUS", "CPUS", "MEMORY", "PORTS", "PODMAN", "TOKENS", "WORKSPACE"],
        &body,
    );
    let running: Vec<&Row> = rows.iter().filter(|r| r.state == "running" || r.state == "starting").collect();
    if running.len() > 1 {
        let mib: u64 = running.iter().map(|r| r.record.memory).sum();
        let cpus: u32 = running.iter().map(|r| r.record.cpus).sum();
        let _ = writeln!(out, "{} running: {cpus} CPUs, {} of memory", running.len(), memory(mib));
    }
    out
}

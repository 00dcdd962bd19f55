//! `ppp policy budget set|ls|rm`: edit `$PPP_CONFIG/budgets.yaml` and show
//! each budget's use from usage.jsonl. The file, the sums and the check are
//! [`crate::usage::budget`] and [`crate::usage::totals`]; this module only
//! builds them from the arguments and prints. A change holds `state.lock`
//! and ends with a reload request to a running daemon, as a policy change
//! does.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;
use time::OffsetDateTime;

use crate::cli::{BudgetCommand, BudgetSetArgs};
use crate::dirs::Dirs;
use crate::error::fail;
use crate::usage::budget::{self, Budget, Limit, OnExceed, Period, Scope};
use crate::usage::record::Record;
use crate::usage::totals::{Totals, Use};
use crate::{output, proxy, sandbox, state};

/// Run `ppp policy budget …`.
pub(crate) fn run(dirs: &Dirs, cmd: &BudgetCommand) -> Result<ExitCode> {
    match cmd {
        BudgetCommand::Set(a) => set(dirs, a),
        BudgetCommand::Ls { sandbox, json } => ls(dirs, sandbox.as_deref(), *json),
        BudgetCommand::Rm { sandbox, global: _, per } => rm(dirs, sandbox.as_deref(), *per),
    }
}

/// The scope SANDBOX names; none (or `-g`, which clap keeps apart from
/// SANDBOX) is global.
fn scope(sandbox: Option<&str>) -> Result<Scope> {
    match sandbox {
        Some(s) => {
            sandbox::validate_name(s)?;
            Ok(Scope::Sandbox(s.to_owned()))
        }
        None => Ok(Scope::Global),
    }
}

/// `red`: 2M tokens a day, refused past it.
fn describe(b: &Budget) -> String {
    let whose = match &b.scope {
        Scope::Global => "global (all sandboxes together)".to_owned(),
        Scope::Sandbox(s) => format!("`{s}`"),
    };
    let per = match b.per {
        Period::Day => "a day (UTC)",
        Period::Total => "in total",
    };
    let past = match b.on_exceed {
        OnExceed::Deny => "refused past it",
        OnExceed::Ask => "held for approval past it",
    };
    format!("{whose}: {} {per}, {past}", b.limit.describe())
}

fn set(dirs: &Dirs, a: &BudgetSetArgs) -> Result<ExitCode> {
    let limit = match (a.tokens, a.cost) {
        (Some(n), _) => Limit::Tokens(n),
        (None, Some(x)) => Limit::CostUsd(x),
        // clap's `limit` group requires one; said again for a caller that
        // builds the arguments itself.
        (None, None) => return Err(fail("a budget needs `--tokens N` or `--cost USD`").code(2).into()),
    };
    let b = Budget {
        scope: scope(a.sandbox.as_deref())?,
        limit,
        per: a.per,
        on_exceed: if a.ask { OnExceed::Ask } else { OnExceed::Deny },
    };
    let path = dirs.budgets();
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut file = budget::load(&path)?;
    let replaced = file.set(b.clone());
    budget::save(&path, &file)?;
    drop(lock);
    proxy::reload_or_warn(dirs);
    output::println(&format!("budget {}: {}", if replaced { "changed" } else { "set" }, describe(&b)))?;
    Ok(ExitCode::SUCCESS)
}

fn rm(dirs: &Dirs, sandbox: Option<&str>, per: Option<Period>) -> Result<ExitCode> {
    let scope = scope(sandbox)?;
    let path = dirs.budgets();
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut file = budget::load(&path)?;
    let gone = file.remove(&scope, per);
    if gone.is_empty() {
        let what = per.map_or_else(String::new, |p| format!("{p} "));
        let whose = match &scope {
            Scope::Global => "global".to_owned(),
            Scope::Sandbox(s) => format!("`{s}`"),
        };
        return Err(fail(format!("there is no {what}budget for {whose}"))
            .hint("`ppp policy budget ls` lists the budgets")
            // As for `policy rm` of a rule that is not there: the command
            // line names something that does not exist (a usage mistake).
            .code(2)
            .into());
    }
    budget::save(&path, &file)?;
    drop(lock);
    proxy::reload_or_warn(dirs);
    for b in &gone {
        output::println(&format!("budget removed: {}", describe(b)))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One budget with its use, as `ls --json` prints it.
#[derive(Debug, Serialize)]
struct Listed {
    scope: String,
    per: Period,
    on_exceed: OnExceed,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost_usd: Option<f64>,
    /// In the limit's unit.
    used: serde_json::Value,
    /// In the limit's unit, never below zero.
    left: serde_json::Value,
    exceeded: bool,
    requests: u64,
    estimated: u64,
    unpriced: u64,
    /// RFC 3339, the next UTC midnight for a daily budget; `null` for a total.
    resets: Option<String>,
}

fn listed(b: &Budget, u: &Use, now: OffsetDateTime) -> Listed {
    let (tokens, cost_usd, used, left) = match b.limit {
        Limit::Tokens(n) => (Some(n), None, serde_json::json!(u.tokens), serde_json::json!(n.saturating_sub(u.tokens))),
        Limit::CostUsd(x) => {
            (None, Some(x), serde_json::json!(u.cost_usd), serde_json::json!((x - u.cost_usd).max(0.0)))
        }
    };
    let resets = (b.per == Period::Day).then(|| {
        let day = now.date().next_day().unwrap_or(now.date());
        day.midnight()
            .assume_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|_| day.to_string())
    });
    Listed {
        scope: b.scope.to_string(),
        per: b.per,
        on_exceed: b.on_exceed,
        tokens,
        cost_usd,
        used,
        left,
        exceeded: b.limit.reached_by(u),
        requests: u.requests,
        estimated: u.estimated,
        unpriced: u.unpriced,
        resets,
    }
}

fn ls(dirs: &Dirs, only: Option<&str>, json: bool) -> Result<ExitCode> {
    if let Some(s) = only {
        sandbox::validate_name(s)?;
    }
    let file = budget::load(&dirs.budgets())?;
    let shown: Vec<&Budget> = file.budgets.iter().filter(|b| only.is_none_or(|s| b.applies_to(s))).collect();
    let now = OffsetDateTime::now_utc();
    let prices = crate::usage::price::load(dirs)?;
    let (totals, malformed) = Totals::from_log(&dirs.usage_log(), now.date(), &|r: &Record| prices.usd(r))?;
    if malformed > 0 {
        let s = if malformed == 1 { "" } else { "s" };
        eprintln!("warning: `{}`: {malformed} line{s} skipped, not usage records", dirs.usage_log().display());
    }
    let rows: Vec<Listed> = shown.iter().map(|b| listed(b, &b.used(&totals, now.date()), now)).collect();
    if json {
        output::json(&rows)?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        output::println("no budgets; set one with `ppp policy budget set SANDBOX --tokens 2M`")?;
        return Ok(ExitCode::SUCCESS);
    }
    let cells: Vec<Vec<String>> = shown
        .iter()
        .zip(&rows)
        .map(|(b, r)| {
            let u = b.used(&totals, now.date());
            let mut used = b.limit.of(&u).describe_exact();
            if matches!(b.limit, Limit::CostUsd(_)) && u.unpriced > 0 {
                let _ = write!(used, " ({} unpriced)", u.unpriced);
            }
            let left = match b.limit {
                Limit::Tokens(n) => Limit::Tokens(n.saturating_sub(u.tokens)),
                Limit::CostUsd(x) => Limit::CostUsd((x - u.cost_usd).max(0.0)),
            };
            vec![
                r.scope.clone(),
                r.per.to_string(),
                b.limit.describe(),
                used,
                left.describe_exact(),
                r.on_exceed.to_string(),
                r.resets.clone().unwrap_or_else(|| "never".to_owned()),
            ]
        })
        .collect();
    output::print(&output::table(&["SCOPE", "PER", "LIMIT", "USED", "LEFT", "PAST IT", "RESETS"], &cells))?;
    Ok(ExitCode::SUCCESS)
}

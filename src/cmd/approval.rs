//! `ppp policy approval ls|allow|deny`: the requests an `ask` default holds
//! in the daemon, and the user's answers. The daemon keeps the queue
//! ([`crate::proxy::approvals`]); an answer that lasts (`--sandbox`,
//! `--global`) is a rule with source `approval`, written here under
//! `state.lock` like any other, so `policy ls` shows it and
//! `policy rm --source approval` takes it back.

use std::process::ExitCode;

use crate::cli::{ApprovalAnswerArgs, ApprovalCommand};
use crate::dirs::Dirs;
use crate::error::fail;
use crate::policy::{self, GlobalFile, Resource, ResourceKind, Rule, Source, Verdict};
use crate::proxy::protocol::Pending;
use crate::{output, proxy, state};
use anyhow::Result;

/// Run `ppp policy approval …`.
pub fn run(dirs: &Dirs, cmd: &ApprovalCommand) -> Result<ExitCode> {
    match cmd {
        ApprovalCommand::Ls { json, quiet } => ls(dirs, *json, *quiet),
        ApprovalCommand::Allow(a) => answer(dirs, Verdict::Allow, a),
        ApprovalCommand::Deny(a) => answer(dirs, Verdict::Deny, a),
    }
}

fn ls(dirs: &Dirs, json: bool, quiet: bool) -> Result<ExitCode> {
    let list = proxy::approvals(dirs)?;
    let list_ref = list.as_deref().unwrap_or_default();
    if json {
        output::println(&serde_json::to_string_pretty(list_ref)?)?;
    } else if quiet {
        for p in list_ref {
            output::println(&p.id)?;
        }
    } else if list_ref.is_empty() {
        eprintln!(
            "{}",
            if list.is_none() {
                "no requests are waiting: the daemon is not running"
            } else {
                "no requests are waiting for approval"
            }
        );
    } else {
        output::print(&table(list_ref))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The listing, one row per entry.
#[must_use]
pub fn table(list: &[Pending]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|p| {
            vec![
                p.id.clone(),
                p.sandbox.clone(),
                // A budget's hold says so: allowing it raises the budget,
                // it opens no host.
                if p.budget.is_some() { format!("budget: {}", p.target()) } else { p.target() },
                p.method.clone().unwrap_or_else(|| "-".into()),
                p.path.clone().unwrap_or_else(|| "-".into()),
                p.size.map_or_else(|| "-".into(), |s| s.to_string()),
                p.count.to_string(),
                format!("{}s", p.waiting_secs),
                format!("{}s", p.remaining_secs),
            ]
        })
        .collect();
    output::table(&["ID", "SANDBOX", "TARGET", "METHOD", "PATH", "SIZE", "COUNT", "WAITING", "LEFT"], &rows)
}

fn answer(dirs: &Dirs, verdict: Verdict, args: &ApprovalAnswerArgs) -> Result<ExitCode> {
    let not_pending = || {
        fail(format!(
            "no request with id `{}` is waiting: it was answered, timed out, or its client went away",
            args.id
        ))
        .hint("`ppp policy approval ls` lists the requests waiting now")
    };
    let Some(list) = proxy::approvals(dirs)? else {
        return Err(fail("no requests are waiting: the daemon is not running")
            .hint("`ppp daemon status` shows it; held requests end with the daemon")
            .into());
    };
    let Some(p) = list.into_iter().find(|p| p.id == args.id) else {
        return Err(not_pending().into());
    };
    if p.budget.is_some() && (args.sandbox || args.global) {
        return Err(fail(format!("request `{}` is held by a budget, not by the policy: no rule answers it", p.id))
            .hint(
                "answer it once (`ppp policy approval allow ID`), which raises the budget once, or raise the budget itself with `ppp policy budget set`",
            )
            .code(2)
            .into());
    }
    let rule = if args.sandbox || args.global { Some(write_rule(dirs, verdict, &p, args.global)?) } else { None };
    // After a rule, the reload has usually released the entry already.
    let released = match proxy::answer(dirs, &p.id, verdict)? {
        Some(n) => n,
        None if rule.is_some() => p.count,
        None => return Err(not_pending().into()),
    };
    let what = if verdict == Verdict::Allow { "allowed" } else { "denied" };
    eprintln!("{what} {} ({} request{} released)", p.target(), released, if released == 1 { "" } else { "s" });
    if let Some(id) = &rule {
        let scope = if args.global { "global".to_owned() } else { format!("sandbox `{}`", p.sandbox) };
        eprintln!("rule {id} ({verdict} {}, {scope}, source approval) decides it from now on", p.target());
    }
    Ok(ExitCode::SUCCESS)
}

/// Write the lasting answer as a rule for exactly the held target (host
/// and port) and reload; returns its short id.
fn write_rule(dirs: &Dirs, verdict: Verdict, p: &Pending, global: bool) -> Result<String> {
    let resource = lasting_resource(&p.target())?;
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    let add = |rules: &mut Vec<Rule>| -> uuid::Uuid {
        if let Some(r) = rules.iter().find(|r| r.decision == verdict && r.resource == resource) {
            return r.id;
        }
        let r = Rule::new(verdict, resource.clone(), Source::Approval);
        let id = r.id;
        rules.push(r);
        id
    };
    let id = if global {
        let path = dirs.global_policy();
        let mut file = policy::load_global(&path)?.unwrap_or_else(GlobalFile::without_file);
        let id = add(&mut file.rules);
        policy::save_global(&path, &file)?;
        id
    } else {
        let path = dirs.sandbox_policy(&p.sandbox);
        let mut file = policy::load_sandbox(&path)?.unwrap_or_default();
        let id = add(&mut file.rules);
        policy::save_sandbox(&path, &file)?;
        id
    };
    drop(lock);
    proxy::reload_or_warn(dirs);
    Ok(id.to_string()[..8].to_owned())
}

/// The resource of a lasting answer: exactly the held host or address and
/// its port. The host is the guest's text, and rule syntax in it (`**`, a
/// `*` label, a regex metacharacter) would make the rule cover far more
/// than the request the user answered: such a target is refused.
fn lasting_resource(target: &str) -> Result<Resource> {
    let refused =
        |why: String| fail(format!("cannot write a rule for `{target}`: {why}")).hint("answer it with --once instead");
    let resource = Resource::parse(target).map_err(|e| refused(e.to_string()))?;
    if !matches!(resource.kind(), ResourceKind::Host | ResourceKind::Ip) {
        return Err(
            refused("it is not one host or address, so a rule would cover more than this request".into()).into()
        );
    }
    Ok(resource)
}

#[cfg(test)]
mod tests {
    /// The guest chooses the held host: rule syntax in it must not turn
    /// one answer into a rule for everything.
    #[test]
    fn a_lasting_answer_covers_exactly_the_held_target() {
        for t in
            ["**:443", "*.evil.test:443", "api-*.evil.test:80", "x.evil.test|.*:443", "(.*):443", "a?.evil.test:80"]
        {
            let e = super::lasting_resource(t).expect_err(t);
            assert!(
                format!("{e:#}").contains("not one host or address") || format!("{e:#}").contains("cannot write"),
                "{t}: {e:#}"
            );
        }
        for t in ["held.test:80", "10.9.0.5:5432", "[2001:db8::1]:443"] {
            assert!(super::lasting_resource(t).is_ok(), "{t}");
        }
    }
}

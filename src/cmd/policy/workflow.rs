//! `ppp policy learn | suggest | replay | apply`: from the flows a sandbox
//! made to the policy it needs (ADR 0048). Grouping, replaying and the
//! public-suffix rule live in [`crate::policy::suggest`] and
//! [`crate::policy::replay`]; this module reads the files, holds
//! `state.lock` for every write, and prints.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, Result};

use crate::dirs::Dirs;
use crate::error::fail;
use crate::policy::{self, GlobalFile, SandboxFile, record, replay, suggest};
use crate::{output, proxy, sandbox, state};

/// Exit status of `replay` when something would be newly denied.
pub(crate) const WOULD_DENY: u8 = 3;

/// `ppp policy learn [SANDBOX] [--off]`.
pub(super) fn learn(dirs: &Dirs, name: Option<&str>, off: bool) -> Result<ExitCode> {
    let Some(name) = name else {
        if off {
            return Err(fail("--off needs the sandbox").hint("`ppp policy learn SANDBOX --off`").code(2).into());
        }
        let learning = policy::learning(dirs)?;
        if learning.is_empty() {
            output::println("no sandbox is learning; `ppp policy learn SANDBOX` or `ppp run --learn` starts")?;
        } else {
            output::print(&learning.iter().fold(String::new(), |acc, n| acc + n + "\n"))?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    set_learning(dirs, name, !off)?;
    if off {
        output::println(&format!("sandbox `{name}` stopped learning: its default decides again"))?;
    } else {
        output::println(&format!(
            "sandbox `{name}` is learning: what no rule decides is allowed and logged as `learned`\n\
             then: `ppp policy suggest {name} > {name}.yaml`, review, `ppp policy apply {name}.yaml --sandbox {name}`"
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Turn learning on or off in the sandbox's file, under `state.lock`,
/// and reload a running daemon.
pub(crate) fn set_learning(dirs: &Dirs, name: &str, on: bool) -> Result<()> {
    sandbox::validate_name(name)?;
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    let path = dirs.sandbox_policy(name);
    let mut file = policy::load_sandbox(&path)?.unwrap_or_default();
    if file.learn != on {
        file.learn = on;
        policy::save_sandbox(&path, &file)?;
    }
    drop(lock);
    proxy::reload_or_warn(dirs);
    Ok(())
}

/// Which flows a command reads.
struct Selection<'a> {
    sandbox: Option<&'a str>,
    since: Option<time::OffsetDateTime>,
    paths: Vec<PathBuf>,
}

impl<'a> Selection<'a> {
    fn new(dirs: &Dirs, sandbox: Option<&'a str>, since: Option<&str>, log: Option<&Path>) -> Result<Self> {
        if let Some(s) = sandbox {
            sandbox::validate_name(s)?;
        }
        let since = since.map(|t| record::since(t, time::OffsetDateTime::now_utc())).transpose()?;
        let paths = match log {
            Some(p) => {
                if !p.is_file() {
                    return Err(fail(format!("no flow log at `{}`", p.display()))
                        .hint("`--log` takes a flows.jsonl file; without it ppp reads its own")
                        .code(2)
                        .into());
                }
                vec![p.to_owned()]
            }
            None => record::files(&dirs.flows_log()),
        };
        Ok(Selection { sandbox, since, paths })
    }

    /// Every selected record, oldest first. A line that does not parse is
    /// an error naming its file, line and field.
    fn each(&self, mut f: impl FnMut(&record::Record<'_>)) -> Result<()> {
        record::stream(&self.paths, |path, n, line| {
            let r = record::parse(line).map_err(|bad| record::error(path, n, &bad))?;
            if let Some(s) = self.sandbox
                && r.sandbox.as_deref() != Some(s)
            {
                return Ok(());
            }
            if let Some(since) = self.since {
                let bad =
                    |why: &str| record::error(path, n, &record::Bad { field: Some("timestamp"), why: why.to_owned() });
                let Some(t) = r.timestamp.as_deref() else { return Err(bad("missing, and --since needs it")) };
                let Some(t) = r.time() else { return Err(bad(&format!("`{t}` is not an RFC 3339 time"))) };
                if t < since {
                    return Ok(());
                }
            }
            f(&r);
            Ok(())
        })
    }
}

/// `ppp policy suggest`.
pub(super) fn suggest(
    dirs: &Dirs,
    name: Option<&str>,
    since: Option<&str>,
    opts: suggest::Options,
    log: Option<&Path>,
) -> Result<ExitCode> {
    let sel = Selection::new(dirs, name, since, log)?;
    let mut g = suggest::Grouper::default();
    sel.each(|r| g.add(r))?;
    let (flows, skipped) = (g.flows, g.skipped);
    let rules = g.finish(opts);
    let whose = name.map_or_else(|| "every sandbox".to_owned(), |n| format!("sandbox `{n}`"));
    let mut header = format!("ppp policy suggest: {} rules from {flows} logged flows of {whose}", rules.len());
    if let Some(t) = since {
        let _ = write!(header, " since {t}");
    }
    header.push('\n');
    match name {
        Some(n) => {
            let _ = write!(
                header,
                "review, then: ppp policy replay --policy FILE {n} && ppp policy apply FILE --sandbox {n}"
            );
        }
        None => header.push_str("review, then: ppp policy replay --policy FILE && ppp policy apply FILE"),
    }
    output::print(&suggest::render(name, &header, &rules)?)?;
    if flows == 0 {
        eprintln!("note: no flows of {whose} are logged{}", if since.is_some() { " in that time" } else { "" });
    }
    if skipped > 0 {
        eprintln!("note: {skipped} allowed flows named a host that cannot be one exact rule, and are left out");
    }
    Ok(ExitCode::SUCCESS)
}

/// A candidate policy file, read and checked.
enum Candidate {
    Global(GlobalFile),
    Sandbox(String, SandboxFile),
}

fn read_candidate(path: &Path, sandbox: Option<&str>) -> Result<Candidate> {
    let text = fs_err::read_to_string(path).map_err(|e| {
        fail(format!("could not read the candidate policy `{}`", path.display())).hint(format!("{e}")).code(2)
    })?;
    let hint = "fix that line (docs/policy.md shows the format); `ppp policy suggest` writes a valid file";
    Ok(match sandbox {
        Some(s) => Candidate::Sandbox(
            s.to_owned(),
            policy::parse_sandbox(path, &text).map_err(|e| crate::error::hinted(fail(e.to_string()).code(2), hint))?,
        ),
        None => Candidate::Global(
            policy::parse_global(path, &text).map_err(|e| crate::error::hinted(fail(e.to_string()).code(2), hint))?,
        ),
    })
}

/// The engine with the candidate in place of its file.
fn engine_with(dirs: &Dirs, candidate: &Candidate) -> Result<policy::Engine> {
    let (mut global, mut files) = policy::load_files(dirs)?;
    match candidate {
        Candidate::Global(g) => global = Some(g.clone()),
        Candidate::Sandbox(name, f) => {
            files.retain(|(n, _)| n != name);
            files.push((name.clone(), f.clone()));
        }
    }
    policy::engine_from(global, files)
        .map_err(|e| fail(format!("the candidate does not compile: {e:#}")).code(2).into())
}

fn replay_summary(dirs: &Dirs, candidate: &Candidate, sel: &Selection<'_>) -> Result<replay::Summary> {
    let engine = engine_with(dirs, candidate)?;
    let mut summary = replay::Summary::default();
    sel.each(|r| {
        summary.add(&engine, r);
    })?;
    Ok(summary.finish())
}

/// The summary as text: the counts, then each changed destination.
fn render_summary(s: &replay::Summary) -> String {
    let mut out = format!(
        "{} flows replayed: {} newly denied, {} newly allowed, {} newly held, {} unchanged\n",
        s.flows, s.newly_denied, s.newly_allowed, s.newly_held, s.unchanged
    );
    if !s.changes.is_empty() {
        let rows: Vec<Vec<String>> = s
            .changes
            .iter()
            .map(|c| {
                let dest = match (&c.host, c.ip) {
                    (Some(h), Some(ip)) => format!("{h}:{} ({ip})", c.port),
                    (Some(h), None) => format!("{h}:{}", c.port),
                    (None, Some(ip)) if ip.is_ipv6() => format!("[{ip}]:{}", c.port),
                    (None, Some(ip)) => format!("{ip}:{}", c.port),
                    (None, None) => format!("-:{}", c.port),
                };
                vec![
                    match c.change {
                        replay::Change::NewlyDenied => "newly denied",
                        replay::Change::NewlyAllowed => "newly allowed",
                        replay::Change::NewlyHeld => "newly held",
                        replay::Change::Unchanged => "unchanged",
                    }
                    .to_owned(),
                    c.sandbox.clone().unwrap_or_else(|| "-".to_owned()),
                    c.kind.clone().unwrap_or_else(|| "-".to_owned()),
                    output::printable(&dest).into_owned(),
                    c.count.to_string(),
                    c.rule.clone().unwrap_or_else(|| "-".to_owned()),
                ]
            })
            .collect();
        out.push_str(&output::table(&["CHANGE", "SANDBOX", "KIND", "DESTINATION", "FLOWS", "RULE"], &rows));
        if s.changes_left_off > 0 {
            let _ = writeln!(out, "({} more changed flows not listed)", s.changes_left_off);
        }
    }
    out
}

/// `ppp policy replay`.
pub(super) fn replay(
    dirs: &Dirs,
    file: &Path,
    name: Option<&str>,
    since: Option<&str>,
    json: bool,
    log: Option<&Path>,
) -> Result<ExitCode> {
    let sel = Selection::new(dirs, name, since, log)?;
    let candidate = read_candidate(file, name)?;
    let s = replay_summary(dirs, &candidate, &sel)?;
    if json {
        output::println(&serde_json::to_string_pretty(&s)?)?;
    } else {
        output::print(&render_summary(&s))?;
    }
    Ok(if s.newly_denied > 0 { ExitCode::from(WOULD_DENY) } else { ExitCode::SUCCESS })
}

/// The policy file `apply` replaces, and where the one it replaced is kept.
fn target(dirs: &Dirs, name: Option<&str>) -> (PathBuf, PathBuf) {
    match name {
        Some(n) => (dirs.sandbox_policy(n), dirs.sandbox_policy_prev(n)),
        None => (dirs.global_policy(), dirs.global_policy_prev()),
    }
}

/// A file's text, or what stands for its absence: a sandbox without a
/// file has no rules; the global policy without one denies by default.
fn text_or_absent(path: &Path, name: Option<&str>) -> Result<String> {
    match state::read_optional(path)? {
        Some(t) => Ok(t),
        None if name.is_some() => Ok(serde_norway::to_string(&SandboxFile::default())?),
        None => Ok(serde_norway::to_string(&GlobalFile::without_file())?),
    }
}

/// `ppp policy apply FILE [--sandbox S]` and `ppp policy apply --undo`.
pub(super) fn apply(dirs: &Dirs, file: Option<&Path>, name: Option<&str>, undo: bool) -> Result<ExitCode> {
    if let Some(n) = name {
        sandbox::validate_name(n)?;
    }
    let (path, prev) = target(dirs, name);
    let whose = name.map_or_else(|| "the global policy".to_owned(), |n| format!("sandbox `{n}`'s policy"));
    let undo_cmd =
        name.map_or_else(|| "ppp policy apply --undo".to_owned(), |n| format!("ppp policy apply --undo --sandbox {n}"));
    if undo {
        let lock = state::Lock::acquire(&dirs.state_lock())?;
        let Some(before) = state::read_optional(&prev)? else {
            return Err(fail(format!("nothing to undo: no earlier version of {whose} is kept"))
                .hint(format!(
                    "`ppp policy apply FILE{}` keeps the file it replaces",
                    name.map_or(String::new(), |n| format!(" --sandbox {n}"))
                ))
                .code(2)
                .into());
        };
        // Checked, so a damaged kept file is not put in force.
        match name {
            Some(_) => drop(policy::parse_sandbox(&prev, &before)?),
            None => drop(policy::parse_global(&prev, &before)?),
        }
        let now = text_or_absent(&path, name)?;
        // Swapped: a second undo redoes.
        state::write_atomic(&prev, now.as_bytes())?;
        state::write_atomic(&path, before.as_bytes())?;
        drop(lock);
        proxy::reload_or_warn(dirs);
        output::println(&format!(
            "restored {whose} from `{}`; `{undo_cmd}` again puts back what was replaced",
            prev.display()
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let file = file.context("apply needs a FILE")?;
    let candidate = read_candidate(file, name)?;
    let text = fs_err::read_to_string(file)?;
    let sel = Selection::new(dirs, name, None, None)?;
    let s = replay_summary(dirs, &candidate, &sel)?;
    output::print(&render_summary(&s))?;
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    let old = text_or_absent(&path, name)?;
    state::write_atomic(&prev, old.as_bytes())?;
    state::write_atomic(&path, text.as_bytes())?;
    drop(lock);
    proxy::reload_or_warn(dirs);
    let rules = match &candidate {
        Candidate::Global(g) => g.rules.len(),
        Candidate::Sandbox(_, f) => f.rules.len(),
    };
    let learning = matches!(&candidate, Candidate::Sandbox(_, f) if f.learn);
    output::println(&format!(
        "applied `{}` to {whose}: {rules} rule{}{}; the previous file is kept as `{}` (`{undo_cmd}` restores it)",
        file.display(),
        if rules == 1 { "" } else { "s" },
        if name.is_some() && !learning { ", not learning" } else { "" },
        prev.display(),
    ))?;
    Ok(ExitCode::SUCCESS)
}

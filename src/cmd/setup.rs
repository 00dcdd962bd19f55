//! `ppp setup`: check everything ppp needs (see [`crate::setup`]), print
//! one table, then offer each fix it can make. Every fix first says what
//! will change; then it is asked about (on a terminal), applied (`--yes`),
//! or only described (neither: no terminal to ask on, so nothing changes).
//!
//! The exit code is 0 when everything ppp needs is in place at the end, else
//! 1, whichever way setup ran.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::ValueEnum;

use super::Ctx;
use crate::agent::{self, Agent};
use crate::cli::SetupArgs;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec;
use crate::podman::Podman;
use crate::policy::{self, GlobalFile, Preset, Source};
use crate::sandbox::image;
use crate::sandbox::lifecycle;
use crate::sandbox::request::{Request, Spec};
use crate::sandbox::ui::Ui;
use crate::setup::{self, Check, Fix, Level, Report, Trust};
use crate::{output, proxy, state};

/// How fixes are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `--yes`: apply every fix without asking.
    Yes,
    /// A terminal: ask before each fix.
    Ask,
    /// No terminal and no `--yes`: change nothing, say how to fix.
    Report,
}

/// Run `ppp setup`.
pub fn run(args: &SetupArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let mode = if args.yes {
        Mode::Yes
    } else if std::io::stdin().is_terminal() {
        Mode::Ask
    } else {
        Mode::Report
    };
    let opts = setup::Options { import_secrets: args.import_secrets };
    if let Some(agents) = &args.build_images {
        build_images(dirs, agents, ctx.ui())?;
    }
    let report = setup::detect(dirs, &opts);
    output::print(&report.table())?;
    let fixable: Vec<&Check> = report.checks.iter().filter(|c| c.level == Level::Fixable && c.fix.is_some()).collect();
    if fixable.is_empty() {
        return finish(&report);
    }
    output::println("")?;
    if mode == Mode::Report {
        output::println("nothing was changed: standard input is not a terminal and --yes was not given")?;
        for c in &fixable {
            let statement = c.fix.as_ref().map(Fix::statement).unwrap_or_default();
            output::println(&format!("  {}: `ppp setup --yes` {statement}", c.name))?;
        }
        output::println("run `ppp setup` on a terminal to choose fixes, or `ppp setup --yes` to apply them all")?;
        return finish(&report);
    }
    let mut changed = false;
    for c in fixable {
        match apply(dirs, c, mode) {
            Ok(did) => changed |= did,
            Err(e) => {
                // One failed fix must not hold back the others; the final
                // table and exit code show it.
                eprint!("{}", crate::error::render(&e.context(format!("could not fix `{}`", c.name))).0);
                changed = true;
            }
        }
    }
    if !changed {
        return finish(&report);
    }
    let after = setup::detect(dirs, &opts);
    output::println("")?;
    output::print(&after.table())?;
    finish(&after)
}

/// The sandbox `--build-images` builds in; removed when it is done.
const BUILD_SANDBOX: &str = "image-build";

/// `--build-images`: build the images of `names` (every agent when empty)
/// that ppp builds and the cache lacks, all in one new sandbox VM (no
/// agent ever runs there, so its builds may be cached), then remove it.
fn build_images(dirs: &Dirs, names: &[String], ui: Ui) -> Result<()> {
    let agents: Vec<&'static Agent> = if names.is_empty() {
        agent::AGENTS.iter().collect()
    } else {
        names.iter().map(|n| agent::find(n)).collect::<Result<_>>()?
    };
    let mut todo = Vec::new();
    for a in agents {
        match image::choose(a, |k| std::env::var(k).ok())? {
            image::Choice::Given { image, var } => {
                crate::progress::Progress::detect(ui.quiet)
                    .note(&format!("{} runs `{image}` ({var}); ppp builds nothing for it", a.name));
            }
            image::Choice::Build(r) => match image::verify(dirs, &r) {
                image::Cached::Valid { .. } => crate::progress::Progress::detect(ui.quiet).note(&format!(
                    "the {} image {} is cached already",
                    a.name,
                    r.tag()
                )),
                _ => todo.push((a, r)),
            },
        }
    }
    let Some((first, _)) = todo.first() else { return Ok(()) };
    let podman = Podman::detect()?;
    // The VM needs a workspace; an empty one shows it nothing of the host.
    let ws = tempfile::tempdir().context("could not make an empty workspace for the image build")?;
    let req = Request::new(&Spec {
        agent: first.name.to_owned(),
        paths: vec![ws.path().to_owned()],
        name: Some(BUILD_SANDBOX.to_owned()),
        ..Spec::default()
    })?;
    // Creating it builds (and caches) the first agent's image.
    let rec = lifecycle::create(dirs, &podman, &req, &[], ui)?;
    let built = todo.iter().skip(1).try_for_each(|(_, r)| {
        image::ensure(dirs, &podman, &rec, &image::Choice::Build(r.clone()), true, ui).map(drop)
    });
    let removed = lifecycle::remove(dirs, Some(&podman), BUILD_SANDBOX, true, ui);
    built?;
    removed
}

/// Print what is left to do and pick the exit code.
fn finish(report: &Report) -> Result<ExitCode> {
    let open: Vec<&Check> = report.checks.iter().filter(|c| !c.done()).collect();
    let hints: Vec<&Check> = report.checks.iter().filter(|c| c.hint.is_some() && c.level != Level::Ok).collect();
    if !hints.is_empty() {
        output::println("")?;
        for c in hints {
            output::println(&format!("hint: {}: {}", c.name, c.hint.as_deref().unwrap_or_default()))?;
        }
    }
    output::println("")?;
    if report.ready() {
        if open.is_empty() {
            output::println("everything is OK: ppp has all it needs; nothing to change")?;
        } else {
            let names: Vec<&str> = open.iter().map(|c| c.name.as_str()).collect();
            output::println(&format!("ppp has all it needs; optional: {}", names.join(", ")))?;
        }
        Ok(ExitCode::SUCCESS)
    } else {
        let names: Vec<&str> = open.iter().filter(|c| c.required).map(|c| c.name.as_str()).collect();
        output::println(&format!("not ready: {}", names.join(", ")))?;
        Ok(ExitCode::from(1))
    }
}

/// Offer one fix: say what will change, ask (in [`Mode::Ask`]), do it.
/// Returns whether anything changed.
fn apply(dirs: &Dirs, check: &Check, mode: Mode) -> Result<bool> {
    let Some(fix) = &check.fix else { return Ok(false) };
    if let Fix::TrustCa(t) = fix
        && t.needs_root()
        && !nix::unistd::geteuid().is_root()
    {
        output::println(&format!(
            "{}: changing the system trust store needs root, so ppp leaves it as it is; to trust ppp's CA, run:",
            check.name
        ))?;
        for line in t.manual() {
            output::println(&format!("  {line}"))?;
        }
        return Ok(false);
    }
    output::println(&format!("{}: {}", check.name, fix.statement()))?;
    if mode == Mode::Ask && !output::confirm("apply this fix?")? {
        output::println(&format!("{}: skipped; nothing changed", check.name))?;
        return Ok(false);
    }
    match fix {
        Fix::InstallMitmproxy { .. } => {
            crate::proxy::mitmdump::ensure(dirs, |m| {
                let _ = output::println(&format!("  {m}"));
            })?;
        }
        Fix::InitPolicy { .. } => {
            let preset = if mode == Mode::Ask { ask_preset()? } else { Preset::Balanced };
            init_policy(dirs, preset)?;
        }
        Fix::TrustCa(t) => trust(t)?,
        Fix::ImportSecrets(_) => {
            super::secret::import(dirs, None, true, false, false)?;
        }
    }
    Ok(true)
}

/// Ask which preset the global policy starts from; empty means `balanced`.
fn ask_preset() -> Result<Preset> {
    let names: Vec<&str> = setup::PRESETS.iter().map(|p| p.as_str()).collect();
    for _ in 0..3 {
        eprint!("preset [{}] (default balanced): ", names.join("/"));
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        let answer = answer.trim();
        if answer.is_empty() {
            return Ok(Preset::Balanced);
        }
        match Preset::from_str(answer, true) {
            Ok(p) => return Ok(p),
            Err(_) => eprintln!("`{answer}` is not a preset"),
        }
    }
    Err(fail("no preset chosen").hint(format!("choose one of: {}", names.join(", "))).into())
}

/// `ppp policy init PRESET` for a host without a global policy. A policy
/// written meanwhile by someone else is left alone.
fn init_policy(dirs: &Dirs, preset: Preset) -> Result<()> {
    let path = dirs.global_policy();
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    if policy::load_global(&path)?.is_some() {
        output::println(&format!("  `{}` appeared meanwhile; left as it is", path.display()))?;
        return Ok(());
    }
    let file = GlobalFile::from_preset(preset);
    policy::save_global(&path, &file)?;
    drop(lock);
    proxy::reload_or_warn(dirs);
    let n = file.rules.iter().filter(|r| r.source == Source::Preset).count();
    output::println(&format!(
        "  global policy set to preset `{preset}`: default {}, {n} preset rule{}",
        file.default,
        if n == 1 { "" } else { "s" }
    ))
}

/// Make the host trust mitmproxy's CA.
fn trust(t: &Trust) -> Result<()> {
    match t {
        Trust::Linux { pem, dest, update } => {
            if let Some(dir) = dest.parent() {
                fs_err::create_dir_all(dir)?;
            }
            fs_err::copy(pem, dest)?;
            {
                use std::os::unix::fs::PermissionsExt;
                fs_err::set_permissions(dest, std::fs::Permissions::from_mode(0o644))?;
            }
            output::println(&format!("  copied `{}` to `{}`", pem.display(), dest.display()))?;
            exec::run(update).context("could not refresh the system trust store")?;
            output::println(&format!("  ran `{update}`"))?;
        }
        Trust::Macos { add } => {
            // macOS asks for the user's password to change trust settings.
            let code = exec::run_attached(add)?;
            if code != 0 {
                return Err(fail(format!("`{add}` exited with status {code}")).into());
            }
            output::println(&format!("  ran `{add}`"))?;
        }
    }
    Ok(())
}

//! `ppp run`: create a sandbox (or reattach to `--name`), then run the
//! agent in it on this terminal. The agent's exit code is ppp's; Ctrl-C
//! stops the agent and leaves the VM running. When `ppp kit add` changes
//! the sandbox meanwhile, the agent starts again with the kit.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::RunArgs;
use crate::podman::Podman;
use crate::sandbox;
use crate::sandbox::{lifecycle, session};

/// Run `ppp run`.
pub fn run(args: &RunArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let ui = ctx.ui();
    // Validated first: an unknown agent or a missing path is an error
    // before anything is created or started.
    let (req, kits) = super::create::request(&args.spec)?;
    // Before anything is created: the agent must not get ppp's own state.
    for ws in &req.workspace {
        dirs.check_workspace(ws)?;
    }
    let podman = Podman::detect()?;
    let existing = match &args.spec.name {
        Some(name) => sandbox::load(dirs, name)?,
        None => None,
    };
    let rec = match existing {
        Some(rec) => {
            if rec.agent != req.agent.name {
                return Err(crate::error::fail(format!(
                    "sandbox `{}` runs {}, not {}",
                    rec.name, rec.agent, req.agent.name
                ))
                .hint(format!("`ppp run --name {} {} …`", rec.name, rec.agent))
                .code(2)
                .into());
            }
            if let Some(t) = &args.spec.template {
                // The machine exists already; its disk is what it is.
                eprintln!("warning: `-t {t}` is ignored: sandbox `{}` exists and keeps its own disk", rec.name);
            }
            let mut rec = lifecycle::reattach(dirs, &podman, &rec.name, ui)?;
            // `--kit` on an existing sandbox applies like `ppp kit add`.
            for k in &kits {
                rec = crate::kit::apply(dirs, &podman, &rec, k)?;
            }
            rec
        }
        None => lifecycle::create(dirs, &podman, &req, &super::create::extensions(&kits), ui)?,
    };
    if args.learn {
        // Before the agent starts, so its first flow is learned.
        super::policy::workflow::set_learning(dirs, &rec.name, true)?;
        eprintln!(
            "sandbox `{0}` is learning: what no rule decides is allowed and logged as `learned`; \
             afterwards `ppp policy suggest {0}`",
            rec.name
        );
    }
    let tty = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let settings = super::stop::guard_settings(dirs, &rec.name, args.strict)?;
    let (code, moved) = session::run_guarded(dirs, &podman, rec, &args.agent_args, tty, ctx.quiet, &settings)?;
    // Files moved aside fail the run even when the agent succeeded: a
    // script must not carry on as if the workspace were as the agent left it.
    let code = if moved && code == 0 { 1 } else { code };
    Ok(ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1)))
}

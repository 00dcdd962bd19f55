//! `ppp create`: a sandbox, provisioned and verified, without starting the
//! agent. Prints the sandbox's name (only the name with `-q`).

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::CreateArgs;
use crate::podman::Podman;
use crate::sandbox::lifecycle::{self, Request};

/// Run `ppp create`.
pub fn run(args: &CreateArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let req = Request::new(&args.spec)?;
    // Before anything is created: the agent must not get ppp's own state.
    for ws in &req.workspace {
        dirs.check_workspace(ws)?;
    }
    let podman = Podman::detect()?;
    let rec = lifecycle::create(dirs, &podman, &req, ctx.ui())?;
    if ctx.quiet {
        crate::output::println(&rec.name)?;
    } else {
        crate::output::println(&format!(
            "created sandbox `{}` ({} on port {}); start the agent with `ppp run --name {} {} {}`",
            rec.name,
            rec.agent,
            rec.port,
            rec.name,
            rec.agent,
            rec.workspace.first().map_or(".", String::as_str)
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

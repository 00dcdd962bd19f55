//! `ppp stop`: stop sandboxes' machines. Each keeps its WireGuard port, so
//! `ppp run --name` brings it back as it was.

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::StopArgs;
use crate::podman::Podman;
use crate::sandbox::lifecycle;

/// Run `ppp stop`.
pub fn run(args: &StopArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    // Unknown names fail before any machine is touched.
    for name in &args.sandboxes {
        if crate::sandbox::load(dirs, name)?.is_none() {
            return Err(crate::error::fail(format!("no sandbox named `{name}`"))
                .hint("list sandboxes with `ppp ls`")
                .code(2)
                .into());
        }
    }
    let podman = Podman::detect()?;
    for name in &args.sandboxes {
        lifecycle::stop(dirs, &podman, name, ctx.ui())?;
        crate::output::println(&format!("stopped `{name}`"))?;
    }
    Ok(ExitCode::SUCCESS)
}

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
    let mut moved = false;
    for name in &args.sandboxes {
        lifecycle::stop(dirs, &podman, name, ctx.ui())?;
        crate::output::println(&format!("stopped `{name}`"))?;
        // Stopped first: nothing in the VM writes the workspace meanwhile.
        moved |= guard_check(dirs, name, args.strict)?;
    }
    Ok(if moved { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The workspace guard's settings for `sandbox`: config.yaml's, with
/// `--strict` on top (ADR 0036).
pub(super) fn guard_settings(
    dirs: &crate::dirs::Dirs,
    sandbox: &str,
    strict: bool,
) -> Result<crate::sandbox::guard::Settings> {
    let mut s = crate::sandbox::guard::Settings::for_sandbox(&crate::config::load(dirs)?, sandbox);
    s.strict |= strict;
    Ok(s)
}

/// Check `sandbox`'s workspace against its last snapshot and report on
/// stderr; whether `--strict` moved something aside.
pub(super) fn guard_check(dirs: &crate::dirs::Dirs, sandbox: &str, strict: bool) -> Result<bool> {
    let Some(rec) = crate::sandbox::load(dirs, sandbox)? else { return Ok(false) };
    let settings = guard_settings(dirs, sandbox, strict)?;
    if settings.protection(&rec) == crate::sandbox::guard::Protection::Off {
        return Ok(false);
    }
    Ok(crate::sandbox::session::report(crate::sandbox::guard::check(dirs, &rec, &settings)?))
}

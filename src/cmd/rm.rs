//! `ppp rm`: remove sandboxes: machine, port and state. `-f` skips the
//! question and removes the state even when the machine does not answer.

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::RmArgs;
use crate::podman::Podman;
use crate::sandbox::{self, PortRegistry, lifecycle};

/// Run `ppp rm`.
pub fn run(args: &RmArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let names: Vec<String> = if args.all {
        // Ports held by names with no record (a crash mid-create) go too.
        let mut all: Vec<String> = sandbox::load_all(dirs)?.into_iter().map(|r| r.name).collect();
        for name in PortRegistry::load(dirs)?.ports.into_values() {
            if !all.contains(&name) {
                all.push(name);
            }
        }
        // And the logs failed creates kept.
        for name in failed_creates(dirs) {
            if !all.contains(&name) {
                all.push(name);
            }
        }
        all
    } else {
        args.sandboxes.clone()
    };
    let registry = PortRegistry::load(dirs)?;
    for name in &names {
        if sandbox::load(dirs, name)?.is_none()
            && registry.port_of(name).is_none()
            && !dirs.sandbox_machine_log(name).exists()
        {
            return Err(crate::error::fail(format!("no sandbox named `{name}`"))
                .hint("list sandboxes with `ppp ls`")
                .code(2)
                .into());
        }
    }
    if names.is_empty() {
        crate::output::println("no sandboxes to remove")?;
        return Ok(ExitCode::SUCCESS);
    }
    if !args.force
        && !crate::output::confirm_or(
            &format!("remove {}?", names.join(", ")),
            &format!("`ppp rm -f {}`", if args.all { "--all".to_owned() } else { names.join(" ") }),
        )?
    {
        return Ok(ExitCode::from(1));
    }
    let podman = match Podman::detect() {
        Ok(p) => Some(p),
        Err(e) if args.force => {
            eprintln!("warning: {e:#}");
            None
        }
        Err(e) => return Err(e),
    };
    let mut moved = false;
    for name in &names {
        // Checked before the state (and its snapshot) goes; the machine may
        // still run, but its agent is the one whose writes are reported.
        moved |= super::stop::guard_check(dirs, name, args.strict)?;
        lifecycle::remove(dirs, podman.as_ref(), name, args.force, ctx.ui())?;
        crate::output::println(&format!("removed `{name}`"))?;
    }
    Ok(if moved { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Names whose directory holds only what a failed create kept (its log):
/// no `sandbox.json`.
fn failed_creates(dirs: &crate::dirs::Dirs) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dirs.sandboxes()) else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !dirs.sandbox_record(n).exists() && dirs.sandbox_machine_log(n).exists())
        .collect()
}

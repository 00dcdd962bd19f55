//! `ppp cp`: copy files between the host and a sandbox's VM; one side is
//! `SANDBOX:PATH`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::Ctx;
use crate::cli::CpArgs;
use crate::error::fail;
use crate::exec;
use crate::podman::Podman;
use crate::sandbox;

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side {
    Host(PathBuf),
    Sandbox { name: String, path: String },
}

/// `NAME:PATH` is a sandbox path when NAME is a valid sandbox name (so no
/// `/` or `.` before the colon); anything else is a host path, like
/// `./a:b` or `/tmp/x:y`.
pub fn parse_side(text: &str) -> Side {
    match text.split_once(':') {
        Some((name, path)) if sandbox::validate_name(name).is_ok() && !path.is_empty() => {
            Side::Sandbox { name: name.to_owned(), path: path.to_owned() }
        }
        _ => Side::Host(PathBuf::from(text)),
    }
}

/// Run `ppp cp`.
pub fn run(args: &CpArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let (src, dst) = (parse_side(&args.src), parse_side(&args.dst));
    let name = match (&src, &dst) {
        (Side::Host(_), Side::Host(_)) => {
            return Err(fail("neither side names a sandbox")
                .hint("write one side as `SANDBOX:PATH`, e.g. `ppp cp ./notes.md red-fox:/tmp/`")
                .code(2)
                .into());
        }
        (Side::Sandbox { .. }, Side::Sandbox { .. }) => {
            return Err(fail("both sides name a sandbox").hint("copy through the host in two steps").code(2).into());
        }
        (Side::Host(_), Side::Sandbox { name, .. }) | (Side::Sandbox { name, .. }, Side::Host(_)) => name,
    };
    let rec = sandbox::load(dirs, name)?
        .ok_or_else(|| fail(format!("no sandbox named `{name}`")).hint("list sandboxes with `ppp ls`").code(2))?;
    let podman = sandbox::podman_for(&Podman::detect()?, dirs, &rec);
    match (&src, &dst) {
        (Side::Host(from), Side::Sandbox { path, .. }) => {
            let from = if args.follow_link {
                std::fs::canonicalize(from).with_context(|| format!("could not resolve `{}`", from.display()))?
            } else {
                from.clone()
            };
            if !from.exists() && std::fs::symlink_metadata(&from).is_err() {
                return Err(fail(format!("`{}` does not exist", from.display())).code(2).into());
            }
            if from.is_dir() && !podman.has_machine_cp() {
                return Err(old_podman_dir(&podman));
            }
            exec::run(&podman.copy_in(&from, &rec.machine_name, path))?;
        }
        (Side::Sandbox { path, .. }, Side::Host(to)) => {
            let guest =
                if args.follow_link { resolve_in_guest(&podman, &rec.machine_name, path)? } else { path.clone() };
            let inv = podman.copy_out(&rec.machine_name, &guest, to).ok_or_else(|| {
                fail(format!("podman {} cannot copy out of a machine (`machine cp` arrived in 5.5)", podman.version))
                    .hint("upgrade podman")
            })?;
            exec::run(&inv)?;
        }
        _ => unreachable!("both-host and both-sandbox were refused above"),
    }
    Ok(ExitCode::SUCCESS)
}

fn old_podman_dir(podman: &Podman) -> anyhow::Error {
    fail(format!("podman {} cannot copy directories into a machine (`machine cp` arrived in 5.5)", podman.version))
        .hint("upgrade podman, or pack the directory with tar and copy the file")
        .into()
}

/// `readlink -f` in the guest, for `-L`.
fn resolve_in_guest(podman: &Podman, machine: &str, path: &str) -> Result<String> {
    let out = exec::run(&podman.ssh(machine, &["readlink", "-f", "--", path]))?;
    Ok(out.stdout.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides() {
        assert_eq!(parse_side("red-fox:/tmp/x"), Side::Sandbox { name: "red-fox".into(), path: "/tmp/x".into() });
        assert_eq!(parse_side("./a:b"), Side::Host("./a:b".into()));
        assert_eq!(parse_side("/tmp/x:y"), Side::Host("/tmp/x:y".into()));
        assert_eq!(parse_side("notes.md"), Side::Host("notes.md".into()));
        assert_eq!(parse_side("Red:/x"), Side::Host("Red:/x".into()));
        assert_eq!(parse_side("red:"), Side::Host("red:".into()));
    }
}

//! `ppp kit …`: validate, inspect and pack kits, and add one to a sandbox.
//! `push` and `pull` (OCI registries) are not available yet and say so.
//! The kit itself (schema, checks, sources, apply) lives in [`crate::kit`].

use std::process::ExitCode;

use anyhow::Result;
use serde_json::json;

use super::Ctx;
use crate::cli::KitCommand;
use crate::error::{Failure, fail};
use crate::kit::{self, Kit};

/// Run `ppp kit …`.
pub fn run(cmd: &KitCommand, ctx: &Ctx) -> Result<ExitCode> {
    match cmd {
        KitCommand::Validate { reference } => {
            let l = kit::load(reference)?;
            if !ctx.quiet {
                crate::output::println(&format!("kit `{}` {} is valid", l.kit.name(), l.kit.version()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        KitCommand::Inspect { reference, json } => {
            let l = kit::load(reference)?;
            if *json {
                crate::output::json(&summary(&l.kit))?;
            } else {
                crate::output::print(&text(&l.kit))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        KitCommand::Pack { directory, output } => {
            if !directory.is_dir() {
                return Err(fail(format!("`{}` is not a directory", directory.display()))
                    .hint("pass the directory that holds `kit.yaml`")
                    .code(2)
                    .into());
            }
            let k = kit::manifest::load_dir(directory)?;
            let bytes = kit::pack::pack(&k)?;
            let out = output.clone().unwrap_or_else(|| kit::pack::default_file_name(&k).into());
            // Not state: a plain file the user asked for, replaced whole.
            let tmp = tempfile::NamedTempFile::new_in(
                out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(".".as_ref()),
            )?;
            std::fs::write(tmp.path(), &bytes)?;
            tmp.persist(&out).map_err(|e| fail(format!("could not write `{}`: {}", out.display(), e.error)))?;
            if !ctx.quiet {
                crate::output::println(&format!("packed kit `{}` {} into `{}`", k.name(), k.version(), out.display()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        KitCommand::Add { sandbox, reference } => {
            let dirs = ctx.dirs()?;
            crate::sandbox::validate_name(sandbox)?;
            let l = kit::load(reference)?;
            let rec = crate::sandbox::load(dirs, sandbox)?.ok_or_else(|| {
                fail(format!("no sandbox named `{sandbox}`")).hint("list sandboxes with `ppp ls`").code(2)
            })?;
            let podman = crate::podman::Podman::detect()?;
            kit::apply(dirs, &podman, &rec, &l)?;
            if !ctx.quiet {
                crate::output::println(&format!("added kit `{}` {} to `{sandbox}`", l.kit.name(), l.kit.version()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        KitCommand::Pull { .. } => Err(Failure::not_available("kit pull").into()),
        KitCommand::Push { .. } => Err(Failure::not_available("kit push").into()),
    }
}

fn summary(k: &Kit) -> serde_json::Value {
    let spec = &k.manifest.spec;
    json!({
        "name": k.name(),
        "version": k.version(),
        "secrets": spec.secrets.iter().map(|s| &s.service).collect::<Vec<_>>(),
        "network": { "allow": spec.network.allow, "deny": spec.network.deny },
        "env": spec.env,
        "startup": spec.startup.iter().map(|s| &s.command).collect::<Vec<_>>(),
        "files": k.files.iter().map(|f| json!({
            "path": f.path,
            "mode": format!("{:04o}", f.mode),
            "size": f.bytes.len(),
            "source": f.source,
        })).collect::<Vec<_>>(),
    })
}

fn text(k: &Kit) -> String {
    use std::fmt::Write as _;
    let spec = &k.manifest.spec;
    let mut s = format!("name:     {}\nversion:  {}\n", k.name(), k.version());
    let list = |v: Vec<String>| if v.is_empty() { "-".to_owned() } else { v.join(", ") };
    let _ = writeln!(s, "secrets:  {}", list(spec.secrets.iter().map(|x| x.service.clone()).collect()));
    let _ = writeln!(s, "allow:    {}", list(spec.network.allow.clone()));
    let _ = writeln!(s, "deny:     {}", list(spec.network.deny.clone()));
    let _ = writeln!(s, "env:      {}", list(spec.env.keys().cloned().collect()));
    let _ = writeln!(s, "files:    {}", list(k.files.iter().map(|f| format!("{} ({:04o})", f.path, f.mode)).collect()));
    let _ = writeln!(s, "startup:  {}", list(spec.startup.iter().map(|x| x.command.join(" ")).collect()));
    s
}

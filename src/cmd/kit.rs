//! `ppp kit …`: validate, inspect and pack kits, and add one to a sandbox.
//! `push` and `pull` move kits through OCI registries ([`crate::kit::oci`]).
//! The kit itself (schema, checks, sources, apply) lives in [`crate::kit`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use serde_json::json;

use super::Ctx;
use crate::cli::KitCommand;
use crate::error::fail;
use crate::kit::{self, Kit, oci};
use crate::secret::{Store, Value};

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
            // Not state: a file to share, written whole and readable like
            // the one `kit pull` writes.
            crate::state::replace_file(&out, &bytes, 0o644)?;
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
        KitCommand::Push { directory, reference } => push(ctx, directory, reference),
        KitCommand::Pull { reference, output } => pull(ctx, reference, output.as_deref()),
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

/// The credentials stored for `target`'s registry, or `None` (anonymous).
fn credentials(ctx: &Ctx, target: &oci::Target) -> Result<Option<Value>> {
    let store = Store::open(ctx.dirs()?)?;
    let found = store.registry(target.registry())?;
    tracing::debug!(registry = target.registry(), with_credentials = found.is_some(), "registry auth");
    Ok(found)
}

/// `ppp kit push DIRECTORY REFERENCE`.
fn push(ctx: &Ctx, directory: &Path, reference: &str) -> Result<ExitCode> {
    let target = oci::Target::parse(reference)?;
    let zip = oci::pack_dir(directory)?;
    let creds = credentials(ctx, &target)?;
    let pushed = oci::push(&target, &zip, creds.as_ref())?;
    tracing::debug!(manifest = %pushed.manifest_url, "pushed");
    if !ctx.quiet {
        crate::output::println(&format!(
            "pushed `{}` ({}, {} bytes)",
            target.as_str(),
            pushed.layer_digest,
            zip.len()
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `ppp kit pull REFERENCE [-o FILE]`.
fn pull(ctx: &Ctx, reference: &str, output: Option<&Path>) -> Result<ExitCode> {
    let target = oci::Target::parse(reference)?;
    let path: PathBuf = output.map_or_else(|| target.default_file_name(), Path::to_path_buf);
    let creds = credentials(ctx, &target)?;
    let pulled = oci::pull(&target, creds.as_ref())?;
    crate::state::replace_file(&path, &pulled.zip, 0o644)?;
    if !ctx.quiet {
        crate::output::println(&format!(
            "wrote `{}` ({}, {} bytes)",
            path.display(),
            pulled.layer_digest,
            pulled.zip.len()
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

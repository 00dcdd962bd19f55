//! `ppp kit …`. `push` and `pull` move kits through OCI registries
//! ([`crate::kit::oci`]); the other verbs land with the kit format and
//! until then refuse plainly instead of pretending to work.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::KitCommand;
use crate::error::Failure;
use crate::kit::oci;
use crate::output;
use crate::secret::{Store, Value};

/// Run `ppp kit …`.
pub fn run(cmd: &KitCommand, ctx: &Ctx) -> Result<ExitCode> {
    match cmd {
        KitCommand::Push { directory, reference } => return push(ctx, directory, reference),
        KitCommand::Pull { reference, output } => return pull(ctx, reference, output.as_deref()),
        _ => {}
    }
    let verb = match cmd {
        KitCommand::Add { .. } => "kit add",
        KitCommand::Inspect { .. } => "kit inspect",
        KitCommand::Pack { .. } => "kit pack",
        KitCommand::Pull { .. } => "kit pull",
        KitCommand::Push { .. } => "kit push",
        KitCommand::Validate { .. } => "kit validate",
    };
    Err(Failure::not_available(verb).into())
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
    output::println(&format!("pushed `{}` ({}, {} bytes)", target.as_str(), pushed.layer_digest, zip.len()))?;
    Ok(ExitCode::SUCCESS)
}

/// `ppp kit pull REFERENCE [-o FILE]`.
fn pull(ctx: &Ctx, reference: &str, output: Option<&Path>) -> Result<ExitCode> {
    let target = oci::Target::parse(reference)?;
    let path: PathBuf = output.map_or_else(|| target.default_file_name(), Path::to_path_buf);
    let creds = credentials(ctx, &target)?;
    let pulled = oci::pull(&target, creds.as_ref())?;
    oci::write_file(&path, &pulled.zip)?;
    output::println(&format!("wrote `{}` ({}, {} bytes)", path.display(), pulled.layer_digest, pulled.zip.len()))?;
    Ok(ExitCode::SUCCESS)
}

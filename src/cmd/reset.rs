//! `ppp reset`: remove every sandbox (machines included), the templates,
//! kits, global policy and port registry, stop the daemon, and unless
//! `--preserve-secrets`, every stored secret.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use super::Ctx;
use crate::cli::ResetArgs;
use crate::podman::Podman;
use crate::proxy::supervisor;
use crate::sandbox::{self, PortRegistry, lifecycle};
use crate::{output, secret, state};

/// Run `ppp reset`.
pub fn run(args: &ResetArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let mut names: Vec<String> = sandbox::load_all(dirs)?.into_iter().map(|r| r.name).collect();
    for n in PortRegistry::load(dirs)?.ports.into_values() {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let what = format!(
        "remove {} sandbox(es) and their machines, templates, kits, the global policy{}, and stop the daemon",
        names.len(),
        if args.preserve_secrets { "" } else { ", every stored secret" }
    );
    if !args.force
        && !output::confirm_or(
            &format!("This will {what}. Continue?"),
            if args.preserve_secrets { "`ppp reset -f --preserve-secrets`" } else { "`ppp reset -f`" },
        )?
    {
        return Ok(ExitCode::from(1));
    }
    let podman = Podman::detect().map_err(|e| eprintln!("warning: {e:#}; removing state only")).ok();
    let ui = ctx.ui();
    for name in &names {
        if let Err(e) = lifecycle::remove(dirs, podman.as_ref(), name, true, ui) {
            eprintln!("warning: {e:#}");
        }
    }
    // Each sandbox went with its own podman home. A `ppp-` machine still in
    // the user's own home is named by no record here (another data
    // directory's, or one made by hand): said, not touched.
    if let Some(p) = &podman
        && let Ok(left) = sandbox::machine::list(p)
    {
        for m in left.iter().filter(|m| m.name.starts_with(sandbox::MACHINE_PREFIX)) {
            eprintln!(
                "note: machine `{}` in your podman home belongs to no sandbox here; `podman machine rm {}` removes it",
                m.name, m.name
            );
        }
    }
    supervisor::stop(dirs, Duration::from_secs(30))?;
    if !args.preserve_secrets {
        // Before the files go: the index says which keychain entries exist.
        let removed = remove_secrets(dirs)?;
        output::println(&format!("removed {removed} secret(s)"))?;
    }
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut doomed: Vec<PathBuf> = vec![
        dirs.sandboxes(),
        dirs.templates(),
        dirs.machine_images(),
        dirs.kits(),
        dirs.global_policy(),
        dirs.port_registry(),
        dirs.tunnels_file(),
    ];
    if !args.preserve_secrets {
        doomed.extend([dirs.secrets_file(), dirs.secrets_index()]);
    }
    for p in &doomed {
        remove_path(p)?;
    }
    output::println(&format!("ppp reset: removed {} sandbox(es)", names.len()))?;
    Ok(ExitCode::SUCCESS)
}

fn remove_path(p: &std::path::Path) -> Result<()> {
    let r = if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("could not remove `{}`", p.display()))
        }
        _ => Ok(()),
    }
}

/// Delete every secret the index lists from its store (keychain entries
/// included); the files go afterwards.
fn remove_secrets(dirs: &crate::dirs::Dirs) -> Result<usize> {
    let store = match secret::Store::open(dirs) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warning: could not open the secret store: {e:#}");
            return Ok(0);
        }
    };
    let mut n = 0;
    for e in store.list()? {
        match store.remove(&e.scope, &e.name, e.kind) {
            Ok(true) => n += 1,
            Ok(false) => {}
            Err(err) => eprintln!("warning: could not remove secret `{}`: {err:#}", e.name),
        }
    }
    Ok(n)
}

//! `ppp create`: a sandbox, provisioned and verified, without starting the
//! agent. Prints the sandbox's name (only the name with `-q`).

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::{CreateArgs, SandboxSpec};
use crate::podman::Podman;
use crate::sandbox::lifecycle::{self, Extension};
use crate::sandbox::request::{Request, Spec};

/// Run `ppp create`.
pub fn run(args: &CreateArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let (req, kits) = request(&args.spec)?;
    // Before anything is created: the agent must not get ppp's own state.
    for ws in &req.workspace {
        dirs.check_workspace(ws)?;
    }
    let podman = Podman::detect()?;
    let rec = lifecycle::create(dirs, &podman, &req, &extensions(&kits), ctx.ui())?;
    if ctx.quiet {
        crate::output::println(&rec.name)?;
    } else {
        crate::output::println(&format!(
            "created sandbox `{}` ({} on port {}); start the agent with `{}`",
            rec.name,
            rec.agent,
            rec.port,
            run_hint(&rec.name, &rec.agent, rec.workspace.first().map_or(".", String::as_str))
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The checked request for `spec` and its `--kit`s, loaded: everything
/// that can be refused before anything is made. The kits are loaded last,
/// as fetching one may take a while and a typo elsewhere should not wait
/// for it.
pub(super) fn request(spec: &SandboxSpec) -> Result<(Request, Vec<crate::kit::Loaded>)> {
    let req = Request::new(&Spec {
        agent: spec.agent.clone(),
        paths: spec.paths.clone(),
        name: spec.name.clone(),
        clone: spec.clone,
        cpus: spec.cpus,
        memory: spec.memory.clone(),
        disk_size: spec.disk_size.clone(),
        template: spec.template.clone(),
    })?;
    let kits = spec.kits.iter().map(|r| crate::kit::load(r)).collect::<Result<Vec<_>>>()?;
    Ok((req, kits))
}

/// The kits as what the lifecycle applies to a new sandbox.
pub(super) fn extensions(kits: &[crate::kit::Loaded]) -> Vec<&dyn Extension> {
    kits.iter().map(|k| k as &dyn Extension).collect()
}

/// The `ppp run` line that starts the agent, every word quoted as a POSIX
/// shell needs it: users paste it, and a workspace named `$(touch x)` must
/// reach ppp as that name, not run on the host.
fn run_hint(name: &str, agent: &str, workspace: &str) -> String {
    ["ppp", "run", "--name", name, agent, workspace].map(crate::podman::shell_quote).join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_run_hint_quotes_what_a_shell_would_expand() {
        assert_eq!(super::run_hint("red", "opencode", "/home/me/app"), "ppp run --name red opencode /home/me/app");
        assert_eq!(
            super::run_hint("red", "opencode", "/w/$(touch x) `id` it's ~ *"),
            r"ppp run --name red opencode '/w/$(touch x) `id` it'\''s ~ *'"
        );
    }
}

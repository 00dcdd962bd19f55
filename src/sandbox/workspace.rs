//! Where a sandbox's workspace is in its VM: mounted at the host's path
//! where podman can carry it, or, with `--clone`, a clone the host reaches
//! as the git remote `sandbox-<name>`.

use std::time::Duration;

use anyhow::Result;

use super::Record;
use super::machine::run_logged;
use super::provision::GUEST_DIR;
use super::ui::Ui;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::podman::Podman;

/// Where a workspace appears in the VM and the container: at the same path
/// when podman's `-v SRC:DST` can carry it, else under `/workspace`
/// (a `:` or `,` in the path would be read as a separator).
pub fn guest_path(host: &str) -> String {
    if host.starts_with('/') && !host.contains([':', ',']) {
        host.to_owned()
    } else {
        let base = host.rsplit(['/', '\\']).find(|s| !s.is_empty()).unwrap_or("workspace");
        format!("/workspace/{}", base.replace([':', ','], "_"))
    }
}

/// The workspace directories as the VM sees them: the clone, or the mounts.
pub(super) fn guest_workspaces(rec: &Record) -> Vec<String> {
    match &rec.clone {
        Some(c) => vec![c.clone()],
        None => rec.workspace.iter().map(|w| guest_path(w)).collect(),
    }
}

/// Where `--clone` puts a repository in the VM.
pub fn clone_path(host: &str) -> String {
    let base = host.rsplit('/').find(|s| !s.is_empty()).unwrap_or("workspace");
    format!("/home/core/workspace/{base}")
}

/// The host remote that points into a sandbox's clone.
pub fn clone_remote(name: &str) -> String {
    format!("sandbox-{name}")
}

/// The remote's URL: git's `ext::` transport running git's own pack
/// commands in the VM over `podman machine ssh`, so fetch and push need no
/// ssh keys or ports of their own.
pub fn clone_url(podman: &Podman, machine: &str, guest: &str) -> String {
    // ext:: splits on spaces; `%` starts its placeholders.
    let esc = |s: &str| s.replace('%', "%%").replace(' ', "\\ ");
    // git runs it outside ppp, so the machine's podman home goes in the URL.
    let home = podman.home.env(std::env::consts::OS).iter().fold(String::new(), |mut s, (k, v)| {
        use std::fmt::Write as _;
        let _ = write!(s, "{k}={} ", esc(&v.display().to_string()));
        s
    });
    let env = if home.is_empty() { String::new() } else { format!("env {home}") };
    format!(
        "ext::{env}{} machine ssh {} -- %S {}",
        esc(&podman.program.display().to_string()),
        esc(machine),
        esc(guest)
    )
}

/// Clone the host repository into the VM (a bundle copied in, so the VM
/// needs no access to the host's remotes), and add the host remote
/// `sandbox-<name>` pointing back at it.
pub(super) fn clone_into(
    dirs: &Dirs,
    podman: &Podman,
    rec: &Record,
    host: &std::path::Path,
    guest: &str,
    ui: Ui,
) -> Result<()> {
    let podman = &crate::sandbox::podman_for(podman, dirs, rec);
    ui.timed(&format!("cloning `{}` into the sandbox at `{guest}`", host.display()), || {
    let bundle = dirs.sandbox(&rec.name).join("workspace.bundle");
    let git =
        |args: &[&str]| Invocation::new("git").arg("-C").arg(host).args(args).timeout(Duration::from_secs(10 * 60));
    exec::run(&git(&["bundle", "create", &bundle.display().to_string(), "--all"])).map_err(|e| {
        anyhow::Error::new(e).context(
            fail(format!("could not bundle `{}` for the sandbox", host.display()))
                .hint("`--clone` needs a repository with at least one commit"),
        )
    })?;
    let machine = &rec.machine_name;
    let in_guest = format!("{GUEST_DIR}/workspace.bundle");
    run_logged(dirs, &rec.name, &podman.copy_in(&bundle, machine, &in_guest), "copying the repository")?;
    let parent = guest.rsplit_once('/').map_or("/", |(p, _)| p);
    run_logged(
        dirs,
        &rec.name,
        &podman.ssh(machine, &["sh", "-c", "mkdir -p \"$1\" && rm -rf \"$2\" && git clone --quiet \"$3\" \"$2\" && git -C \"$2\" remote remove origin", "sh", parent, guest, &in_guest]),
        "cloning the repository in the VM",
    )?;
    let _ = std::fs::remove_file(&bundle);
    let remote = clone_remote(&rec.name);
    let url = clone_url(podman, machine, guest);
    // A remote left by an earlier sandbox of the same name is replaced.
    let _ = exec::run(&git(&["remote", "remove", &remote]));
    exec::run(&git(&["remote", "add", &remote, &url]))?;
    // ext:: is off by default; `user` allows it for remotes the user
    // configured, never for URLs that submodules bring in.
    exec::run(&git(&["config", "protocol.ext.allow", "user"]))?;
    Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspaces_are_mirrored_when_they_can_be() {
        assert_eq!(guest_path("/home/me/src/app"), "/home/me/src/app");
        assert_eq!(guest_path("/home/me/a:b"), "/workspace/a_b");
        assert_eq!(guest_path("/srv/x,y/"), "/workspace/x_y");
        assert_eq!(guest_path("C:\\Users\\me\\app"), "/workspace/app");
    }
}

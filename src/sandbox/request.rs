//! A request to create a sandbox, checked before anything is created:
//! the agent, the workspace paths, the name, the sizes. Building one reads
//! the host (paths, memory, CPUs) and changes nothing.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::agent::{self, Agent};
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::podman;

/// What the user asked for, as given: nothing checked yet. The command
/// fills it from its arguments; [`Request::new`] checks it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    /// The agent's name.
    pub agent: String,
    /// Workspace directories; the first is the workdir.
    pub paths: Vec<PathBuf>,
    pub name: Option<String>,
    /// Clone the (single) workspace repository instead of mounting it.
    pub clone: bool,
    /// 0 means all the host's CPUs.
    pub cpus: u32,
    /// Binary units such as `8g`; `None` for the default.
    pub memory: Option<String>,
    /// Binary units such as `100g`; `None` for the default.
    pub disk_size: Option<String>,
    /// A template's tag or id, or an image.
    pub template: Option<String>,
}

/// A validated request to create a sandbox. Building it touches nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub agent: &'static Agent,
    /// Absolute, existing workspace directories; the first is the workdir.
    pub workspace: Vec<PathBuf>,
    pub name: Option<String>,
    pub cpus: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
    /// The agent's image: the one `PPP_<AGENT>_IMAGE` names, or a build.
    pub image: super::image::Choice,
    pub template: Option<String>,
    /// `--clone`: clone the (single) workspace repository into the VM
    /// instead of mounting it.
    pub clone: bool,
}

impl Request {
    /// Check everything that can be checked before anything is created:
    /// the agent, the paths, the name, the sizes.
    pub fn new(spec: &Spec) -> Result<Request> {
        let agent = agent::find(&spec.agent)?;
        let mut workspace = Vec::new();
        for p in &spec.paths {
            let abs = std::fs::canonicalize(p).map_err(|e| {
                // "No such file or directory (os error 2)" is the usual
                // case; said in words, the OS text for anything else.
                let why = if e.kind() == std::io::ErrorKind::NotFound {
                    "it does not exist".to_owned()
                } else {
                    e.to_string()
                };
                fail(format!("workspace `{}` cannot be used: {why}", p.display()))
                    .hint("pass a directory that exists, e.g. `.`")
                    .code(2)
            })?;
            if !abs.is_dir() {
                return Err(fail(format!("workspace `{}` is not a directory", p.display())).code(2).into());
            }
            if spec.clone {
                git_toplevel(&abs)?;
            }
            workspace.push(abs);
        }
        if let Some(name) = &spec.name {
            super::validate_name(name)?;
        }
        if spec.clone && spec.paths.len() != 1 {
            return Err(fail("`--clone` takes exactly one PATH: the repository to clone").code(2).into());
        }
        // Said plainly rather than ignored: a sandbox without the
        // template the user asked for is not what they asked for.
        if spec.template.as_deref().is_some_and(str::is_empty) {
            return Err(fail("`--template` needs a tag, an id or an image").code(2).into());
        }
        let memory_mib = match &spec.memory {
            Some(m) => podman::parse_mib(m).ok_or_else(|| {
                fail(format!("invalid memory size `{m}`")).hint("use binary units such as `8g` or `512MiB`").code(2)
            })?,
            None => default_memory_mib(host_memory_mib()),
        };
        if memory_mib < podman::MIN_MEMORY_MIB {
            return Err(fail(format!(
                "{memory_mib} MiB of memory is too little for a sandbox VM; the minimum is {} MiB",
                podman::MIN_MEMORY_MIB
            ))
            .hint("pass e.g. `-m 4g`")
            .code(2)
            .into());
        }
        if let Some(host) = host_memory_mib()
            && memory_mib > host
        {
            return Err(fail(format!("{memory_mib} MiB of memory is more than this host has ({host} MiB)"))
                .hint("pass a smaller `-m`, or leave it out for half the host's memory")
                .code(2)
                .into());
        }
        let disk_gib = match &spec.disk_size {
            Some(d) => podman::parse_gib(d).ok_or_else(|| {
                fail(format!("invalid disk size `{d}`")).hint("use binary units such as `100g`").code(2)
            })?,
            None => podman::DEFAULT_DISK_GIB,
        };
        let host_cpus = std::thread::available_parallelism().map_or(2, |n| u32::try_from(n.get()).unwrap_or(2));
        let cpus = if spec.cpus == 0 { host_cpus } else { spec.cpus };
        if cpus > host_cpus {
            // podman refuses this too, but only after ppp has claimed a port.
            return Err(fail(format!("{cpus} CPUs is more than this host has ({host_cpus})"))
                .hint("pass a smaller `--cpus`, or 0 for all of them")
                .code(2)
                .into());
        }
        let image = super::image::choose(agent, |k| std::env::var(k).ok())?;
        Ok(Request {
            agent,
            workspace,
            name: spec.name.clone(),
            cpus,
            memory_mib,
            disk_gib,
            image,
            template: spec.template.clone(),
            clone: spec.clone,
        })
    }
}

/// The top of the git repository `dir` is in, or an error saying it is not
/// one (`--clone` needs a repository).
fn git_toplevel(dir: &std::path::Path) -> Result<String> {
    let inv = Invocation::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--show-toplevel"])
        .timeout(Duration::from_secs(30));
    exec::run(&inv).map(|o| o.stdout.trim().to_owned()).map_err(|e| {
        fail(format!("`{}` is not a git repository, so it cannot be cloned: {e}", dir.display()))
            .hint("drop `--clone` to mount the directory instead")
            .code(2)
            .into()
    })
}

/// Half the host's memory, at most 32 GiB, at least podman's floor.
pub fn default_memory_mib(host_mib: Option<u64>) -> u64 {
    host_mib.map_or(4096, |h| (h / 2).min(podman::MAX_DEFAULT_MEMORY_MIB)).max(podman::MIN_MEMORY_MIB)
}

/// The host's memory in MiB, if it can be read.
fn host_memory_mib() -> Option<u64> {
    super::host::host_memory().map(|m| m.total_mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_default_is_half_capped_and_floored() {
        assert_eq!(default_memory_mib(Some(16 * 1024)), 8 * 1024);
        assert_eq!(default_memory_mib(Some(256 * 1024)), 32 * 1024);
        assert_eq!(default_memory_mib(Some(2048)), podman::MIN_MEMORY_MIB);
        assert_eq!(default_memory_mib(None), 4096);
    }
}

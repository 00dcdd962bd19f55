//! Where ppp keeps its files. Every path ppp reads or writes is derived here,
//! so the on-disk layout (spec §5.8) lives in exactly one place.
//!
//! Three roots, each overridable by an environment variable:
//! - config: `$PPP_CONFIG`, else `$XDG_CONFIG_HOME/ppp`, else `~/.config/ppp`
//! - data:   `$PPP_DATA`,   else `$XDG_DATA_HOME/ppp`,   else `~/.local/share/ppp`
//! - cache:  `$PPP_CACHE`,  else `$XDG_CACHE_HOME/ppp`,  else `~/.cache/ppp`
//!
//! This module only computes paths; it never creates or touches them (it
//! reads links to compare a workspace with them, never more).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::env;

/// The host's resolver configuration and hosts file, which the daemon reads
/// for its own lookups of a flow's name (`proxy::dns`).
pub const RESOLV_CONF: &str = "/etc/resolv.conf";
pub const HOSTS: &str = "/etc/hosts";

/// The resolved roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    pub config: PathBuf,
    pub data: PathBuf,
    pub cache: PathBuf,
}

impl Dirs {
    /// Resolve the roots from the process environment.
    pub fn from_env() -> Result<Self> {
        Self::resolve(|k| std::env::var_os(k))
    }

    /// Resolve the roots from any variable lookup. Pure, so it can be tested
    /// without touching the process environment.
    pub fn resolve(var: impl Fn(&str) -> Option<OsString>) -> Result<Self> {
        let nonempty = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let home = nonempty("HOME");
        let root = |over: &str, xdg: &str, fallback: &[&str]| -> Result<PathBuf> {
            if let Some(p) = nonempty(over) {
                return absolute(over, p);
            }
            if let Some(p) = nonempty(xdg) {
                // The XDG spec says relative values are invalid and must be ignored.
                if p.is_absolute() {
                    return Ok(p.join("ppp"));
                }
            }
            if let Some(h) = &home {
                Ok(fallback.iter().fold(h.clone(), |acc, c| acc.join(c)).join("ppp"))
            } else {
                let what = over.trim_start_matches("PPP_").to_lowercase();
                Err(crate::error::fail(format!("cannot locate ppp's {what} directory"))
                    .hint(format!("set `{over}`, `{xdg}` or `HOME`"))
                    .into())
            }
        };
        Ok(Self {
            config: root(env::PPP_CONFIG, "XDG_CONFIG_HOME", &[".config"])?,
            data: root(env::PPP_DATA, "XDG_DATA_HOME", &[".local", "share"])?,
            cache: root(env::PPP_CACHE, "XDG_CACHE_HOME", &[".cache"])?,
        })
    }

    /// `$PPP_CONFIG/config.yaml`: CLI settings.
    pub fn config_file(&self) -> PathBuf {
        self.config.join("config.yaml")
    }
    /// `$PPP_CONFIG/policies.yaml`: the global network policy.
    pub fn global_policy(&self) -> PathBuf {
        self.config.join("policies.yaml")
    }
    /// `$PPP_CONFIG/policies.yaml.prev`: the file the last `ppp policy
    /// apply` replaced, for `--undo`.
    pub fn global_policy_prev(&self) -> PathBuf {
        self.config.join("policies.yaml.prev")
    }
    /// `$PPP_CONFIG/usage/prices.yaml`: the user's LLM prices, tried before
    /// the built-in table (`usage::price`).
    pub fn usage_prices(&self) -> PathBuf {
        self.config.join("usage/prices.yaml")
    }
    /// `$PPP_CONFIG/budgets.yaml`: the token and cost budgets (issue 27;
    /// `usage::budget`), beside the policy files but not in them (ADR 0055).
    pub fn budgets(&self) -> PathBuf {
        self.config.join("budgets.yaml")
    }
    /// `$PPP_CONFIG/age-identity.txt`: the key of the file secret store.
    /// Kept in the config root, away from `secrets.age`, so that a copy of the
    /// data directory alone never carries both lock and key.
    pub fn age_identity(&self) -> PathBuf {
        self.config.join("age-identity.txt")
    }
    /// `$PPP_DATA/sandboxes`: one directory per sandbox.
    pub fn sandboxes(&self) -> PathBuf {
        self.data.join("sandboxes")
    }
    /// `$PPP_DATA/sandboxes/<name>`.
    pub fn sandbox(&self, name: &str) -> PathBuf {
        self.sandboxes().join(name)
    }
    /// `$PPP_DATA/sandboxes/<name>/sandbox.json`.
    pub fn sandbox_record(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("sandbox.json")
    }
    /// `$PPP_DATA/sandboxes/<name>/policy.yaml`.
    pub fn sandbox_policy(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("policy.yaml")
    }
    /// `$PPP_DATA/sandboxes/<name>/policy.yaml.prev`: the file the last
    /// `ppp policy apply --sandbox` replaced, for `--undo`.
    pub fn sandbox_policy_prev(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("policy.yaml.prev")
    }
    /// `$PPP_DATA/sandboxes/<name>/wg0.conf`.
    pub fn sandbox_wg_conf(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("wg0.conf")
    }
    /// `$PPP_DATA/sandboxes/<name>/wg0.guest.conf`: `wg0.conf` with the
    /// endpoint host this machine reaches the host at, kept only while
    /// provisioning reads it.
    pub fn sandbox_guest_wg_conf(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("wg0.guest.conf")
    }
    /// `$PPP_DATA/sandboxes/<name>/machine.log`.
    pub fn sandbox_machine_log(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("machine.log")
    }
    /// `$PPP_DATA/sandboxes/<name>/workspace-guard.json`: the snapshot of
    /// the workspace's watched paths the next check compares with.
    pub fn sandbox_guard(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("workspace-guard.json")
    }
    /// `$PPP_DATA/sandboxes/<name>/workspace-guard.log`: every report of
    /// what the agent changed, for `ppp diagnose`.
    pub fn sandbox_guard_log(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("workspace-guard.log")
    }
    /// `$PPP_DATA/sandboxes/<name>/disk.lock`: held by `template save`
    /// while it copies the machine's disk, so nothing starts the machine.
    pub fn sandbox_disk_lock(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("disk.lock")
    }
    /// `$PPP_DATA/sandboxes/<name>/podman`: the sandbox's own podman home
    /// (its machine's config and data; sockets are in `run`, see
    /// [`Dirs::podman_runtime`]).
    pub fn sandbox_podman(&self, name: &str) -> PathBuf {
        self.sandbox(name).join("podman")
    }
    /// The podman home of sandbox `name` whose sockets are in `runtime`
    /// (recorded when it was made, see [`Dirs::podman_runtime`]).
    pub fn podman_home(&self, name: &str, runtime: &Path) -> crate::podman::OwnHome {
        crate::podman::OwnHome {
            config: self.sandbox_podman(name).join("config"),
            data: self.sandbox_podman(name).join("data"),
            runtime: runtime.to_owned(),
        }
    }
    /// Where a new sandbox's machine keeps its sockets: `ppp-<10 hex>`
    /// (a digest of the data root and the name, so two ppp data roots never
    /// share one) in `runtime_base` (`$XDG_RUNTIME_DIR`, else `/tmp`). Not
    /// under the data root, which may be long: podman appends up to
    /// [`crate::podman::socket_suffix_len`] bytes, and a socket's path may
    /// not pass [`crate::podman::SUN_PATH_MAX`]; where the base is too long
    /// for that, `/tmp` (always short enough for a valid name) is used.
    pub fn podman_runtime(&self, name: &str, runtime_base: Option<&Path>) -> PathBuf {
        use sha2::Digest as _;
        let digest = sha2::Sha256::new()
            .chain_update(self.data.as_os_str().as_encoded_bytes())
            .chain_update([0])
            .chain_update(name.as_bytes())
            .finalize();
        let leaf = digest.iter().take(5).fold(String::from("ppp-"), |mut s, b| {
            use std::fmt::Write as _;
            let _ = write!(s, "{b:02x}");
            s
        });
        let machine_len = crate::podman::socket_suffix_len(&format!("ppp-{name}"));
        let fits = |base: &Path| base.join(&leaf).as_os_str().len() + machine_len <= crate::podman::SUN_PATH_MAX;
        match runtime_base.filter(|b| b.is_absolute() && fits(b)) {
            Some(base) => base.join(leaf),
            None => Path::new("/tmp").join(leaf),
        }
    }
    /// The runtime base [`Dirs::podman_runtime`] starts from: podman's own
    /// choice on Linux (`$XDG_RUNTIME_DIR`, private to the user); on macOS
    /// `$TMPDIR` is long (`/var/folders/…`), so none.
    pub fn runtime_base() -> Option<PathBuf> {
        if cfg!(target_os = "linux") {
            std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()).map(PathBuf::from)
        } else {
            None
        }
    }
    /// `$PPP_CACHE/machine-images`: machine images podman fetched once,
    /// passed to every later `machine init --image`.
    pub fn machine_images(&self) -> PathBuf {
        self.cache.join("machine-images")
    }
    /// `$PPP_DATA/port-registry.json`: WireGuard port to sandbox.
    pub fn port_registry(&self) -> PathBuf {
        self.data.join("port-registry.json")
    }
    /// `$PPP_DATA/state.lock`: held by every state mutation.
    pub fn state_lock(&self) -> PathBuf {
        self.data.join("state.lock")
    }
    /// `$PPP_DATA/start.lock`: held from the check that a sandbox may start
    /// (memory, the cap) until its machine is up.
    pub fn start_lock(&self) -> PathBuf {
        self.data.join("start.lock")
    }
    /// `$PPP_DATA/flows.jsonl`: one JSON object per proxied flow.
    pub fn flows_log(&self) -> PathBuf {
        self.data.join("flows.jsonl")
    }
    /// `$PPP_DATA/usage.jsonl`: the tokens metered per response (issue 27;
    /// `usage::record`), written by the daemon alone.
    pub fn usage_log(&self) -> PathBuf {
        self.data.join("usage.jsonl")
    }
    /// `$PPP_CONFIG/usage/providers.yaml`: the user's LLM providers, added
    /// to the built-in ones or replacing one by name (`usage::provider`).
    pub fn usage_providers(&self) -> PathBuf {
        self.config.join("usage/providers.yaml")
    }
    /// `$PPP_DATA/proxy.log`: mitmdump's captured output.
    pub fn proxy_log(&self) -> PathBuf {
        self.data.join("proxy.log")
    }
    /// `$PPP_DATA/proxy.pid`.
    pub fn proxy_pid(&self) -> PathBuf {
        self.data.join("proxy.pid")
    }
    /// `$PPP_DATA/daemon.pid`: the supervisor's pid.
    pub fn daemon_pid(&self) -> PathBuf {
        self.data.join("daemon.pid")
    }
    /// `$PPP_DATA/daemon.lock`: held by the running daemon for its whole life.
    pub fn daemon_lock(&self) -> PathBuf {
        self.data.join("daemon.lock")
    }
    /// `$PPP_DATA/daemon.json`: the running daemon's pids, ports and restarts.
    pub fn daemon_record(&self) -> PathBuf {
        self.data.join("daemon.json")
    }
    /// `$PPP_DATA/daemon.log`: a detached daemon's own output.
    pub fn daemon_log(&self) -> PathBuf {
        self.data.join("daemon.log")
    }
    /// `$PPP_DATA/generation`: the daemon's policy generation, for the addon.
    pub fn generation_file(&self) -> PathBuf {
        self.data.join("generation")
    }
    /// `$PPP_DATA/tunnels.json`: when each WireGuard server last carried a
    /// connection, written by the addon.
    pub fn tunnels_file(&self) -> PathBuf {
        self.data.join("tunnels.json")
    }
    /// `$PPP_DATA/tui.log`: what `ppp tui` would otherwise print over its
    /// screen (warnings, logs), kept while the dashboard owns the terminal.
    pub fn tui_log(&self) -> PathBuf {
        self.data.join("tui.log")
    }
    /// `$PPP_DATA/secret.sock`: the daemon's Unix socket.
    pub fn secret_socket(&self) -> PathBuf {
        self.data.join("secret.sock")
    }
    /// `$PPP_DATA/secrets.age`: the file secret store.
    pub fn secrets_file(&self) -> PathBuf {
        self.data.join("secrets.age")
    }
    /// `$PPP_DATA/secrets-index.json`: names of stored secrets, never values.
    pub fn secrets_index(&self) -> PathBuf {
        self.data.join("secrets-index.json")
    }
    /// `$PPP_DATA/secret-status.json`: when the daemon last ran each command
    /// secret's command, and how it failed; never a value or an output.
    pub fn secret_status(&self) -> PathBuf {
        self.data.join("secret-status.json")
    }
    /// `$PPP_DATA/wg`: WireGuard key files and captured client configs.
    pub fn wg(&self) -> PathBuf {
        self.data.join("wg")
    }
    /// `$PPP_DATA/wg/keys-<port>.conf`.
    pub fn wg_keys(&self, port: u16) -> PathBuf {
        self.wg().join(format!("keys-{port}.conf"))
    }
    /// `$PPP_DATA/wg/client-confs.json`.
    pub fn wg_client_confs(&self) -> PathBuf {
        self.wg().join("client-confs.json")
    }
    /// `$PPP_DATA/wg/upstream-ca.pem`: the host trust store exported for
    /// mitmproxy's upstream verification (spec A.6).
    pub fn upstream_ca(&self) -> PathBuf {
        self.wg().join("upstream-ca.pem")
    }
    /// `$PPP_DATA/mitmproxy`: mitmproxy's confdir (its CA), kept out of
    /// `~/.mitmproxy`.
    pub fn mitmproxy_confdir(&self) -> PathBuf {
        self.data.join("mitmproxy")
    }
    /// `$PPP_DATA/addon`: addon files, each named by a hash of its content.
    pub fn addon_dir(&self) -> PathBuf {
        self.data.join("addon")
    }
    /// `$PPP_DATA/venv.lock`: held while the venv is checked or built.
    pub fn venv_lock(&self) -> PathBuf {
        self.data.join("venv.lock")
    }
    /// `$PPP_DATA/venv`: ppp's own Python venv holding the pinned mitmproxy.
    pub fn venv(&self) -> PathBuf {
        self.data.join("venv")
    }
    /// `$PPP_DATA/venv/bin/mitmdump`.
    pub fn venv_mitmdump(&self) -> PathBuf {
        self.venv().join("bin").join("mitmdump")
    }
    /// `$PPP_DATA/kits`: cached kit artifacts.
    pub fn kits(&self) -> PathBuf {
        self.data.join("kits")
    }
    /// `$PPP_CACHE/templates`: saved templates.
    pub fn templates(&self) -> PathBuf {
        self.cache.join("templates")
    }
    /// `$PPP_CACHE/images`: agent images ppp built, saved as OCI archives
    /// so later sandboxes load them instead of building again.
    pub fn image_cache(&self) -> PathBuf {
        self.cache.join("images")
    }
    /// `$PPP_CACHE/images/<agent>-<hash>.oci.tar`: one built image.
    pub fn image_archive(&self, agent: &str, hash: &str) -> PathBuf {
        self.image_cache().join(format!("{agent}-{hash}.oci.tar"))
    }
    /// `$PPP_CACHE/images/<agent>-<hash>.oci.tar.sha256`: the archive's
    /// digest and size, written after the archive; an archive without a
    /// matching one is never loaded.
    pub fn image_archive_sum(&self, agent: &str, hash: &str) -> PathBuf {
        self.image_cache().join(format!("{agent}-{hash}.oci.tar.sha256"))
    }
    /// `$PPP_CACHE/images/<agent>-<hash>.lock`: held while the archive is
    /// written, checked or read, so two sandboxes never see half of one.
    pub fn image_archive_lock(&self, agent: &str, hash: &str) -> PathBuf {
        self.image_cache().join(format!("{agent}-{hash}.lock"))
    }
}

impl Dirs {
    /// Refuse a workspace that is, holds or lies inside one of ppp's roots
    /// (`~` holds them all by default). The workspace is mounted read-write
    /// into the sandbox, so the agent could read the file store's secrets
    /// and rewrite its own policy, keys and records there. Both sides are
    /// compared with symlinks resolved, so a link to `~` is `~`.
    pub fn check_workspace(&self, workspace: &Path) -> Result<()> {
        let ws = resolve_existing(workspace);
        for (what, root) in [("config", &self.config), ("data", &self.data), ("cache", &self.cache)] {
            let root = resolve_existing(root);
            let cause = if ws == root {
                format!("it is ppp's {what} directory")
            } else if root.starts_with(&ws) {
                format!("it contains ppp's {what} directory `{}`", root.display())
            } else if ws.starts_with(&root) {
                format!("it is inside ppp's {what} directory `{}`", root.display())
            } else {
                continue;
            };
            return Err(anyhow::anyhow!(cause).context(
                crate::error::fail(format!("workspace `{}` cannot be used", workspace.display()))
                    .hint(
                        "mount a project directory instead, e.g. `~/src/app`: the agent can change its \
                         workspace, and ppp's directories hold its policy, keys and secrets",
                    )
                    .code(2),
            ));
        }
        Ok(())
    }
}

/// `p` with symlinks resolved as far as it exists: its longest existing
/// ancestor canonicalised, the rest appended. A root that ppp has not
/// created yet is still compared where it will be.
fn resolve_existing(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut cur = p;
    loop {
        if let Ok(c) = std::fs::canonicalize(cur) {
            return rest.iter().rev().fold(c, |acc, name| acc.join(name));
        }
        // `..` has no file name: such a path is compared as written.
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                cur = parent;
            }
            _ => return p.to_owned(),
        }
    }
}

fn absolute(var: &str, p: PathBuf) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p);
    }
    // A relative override would silently move state when the working
    // directory changes, so anchor it once, here, at resolution time.
    let cwd = std::env::current_dir()
        .map_err(|e| anyhow::anyhow!("`{var}` is relative and the working directory is unknown: {e}"))?;
    Ok(cwd.join(p))
}

/// True when `p` lies inside `root` (lexically).
pub fn is_within(p: &Path, root: &Path) -> bool {
    p.starts_with(root)
}

/// The user's home directory (`HOME`), for the `~/` git expands in its
/// configuration's paths.
#[must_use]
pub fn user_home() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|v| !v.is_empty()).map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(vars: &[(&str, &str)]) -> Dirs {
        let map: HashMap<String, OsString> = vars.iter().map(|(k, v)| ((*k).to_owned(), OsString::from(v))).collect();
        Dirs::resolve(|k| map.get(k).cloned()).unwrap()
    }

    #[test]
    fn home_fallbacks() {
        let d = resolve(&[("HOME", "/home/u")]);
        assert_eq!(d.config, PathBuf::from("/home/u/.config/ppp"));
        assert_eq!(d.data, PathBuf::from("/home/u/.local/share/ppp"));
        assert_eq!(d.cache, PathBuf::from("/home/u/.cache/ppp"));
    }

    #[test]
    fn xdg_then_ppp_overrides() {
        let d = resolve(&[
            ("HOME", "/home/u"),
            ("XDG_CONFIG_HOME", "/x/c"),
            ("XDG_DATA_HOME", "relative/ignored"),
            ("PPP_CACHE", "/p/cache"),
        ]);
        assert_eq!(d.config, PathBuf::from("/x/c/ppp"));
        assert_eq!(d.data, PathBuf::from("/home/u/.local/share/ppp"));
        assert_eq!(d.cache, PathBuf::from("/p/cache"));
        assert_eq!(d.sandbox_policy("a"), PathBuf::from("/home/u/.local/share/ppp/sandboxes/a/policy.yaml"));
        assert_eq!(d.wg_keys(51820), PathBuf::from("/home/u/.local/share/ppp/wg/keys-51820.conf"));
    }

    #[test]
    fn a_workspace_holding_or_inside_ppps_dirs_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        std::fs::create_dir_all(home.join(".local/share/ppp/sandboxes")).unwrap();
        std::fs::create_dir_all(home.join("src/app")).unwrap();
        std::fs::create_dir_all(t.path().join("cache")).unwrap();
        std::os::unix::fs::symlink(&home, t.path().join("link")).unwrap();
        let dirs = Dirs {
            // The config root does not exist yet: compared where it will be.
            config: home.join(".config/ppp"),
            // Through a link: resolved before comparing.
            data: t.path().join("link/.local/share/ppp"),
            cache: t.path().join("cache"),
        };
        let refused = |ws: &Path| {
            let err = dirs.check_workspace(ws).expect_err(&ws.display().to_string());
            crate::error::render(&err)
        };
        let home_c = std::fs::canonicalize(&home).unwrap();
        let (text, code) = refused(&home);
        assert_eq!(code, 2);
        assert!(text.starts_with(&format!("error: workspace `{}` cannot be used\n", home.display())), "{text}");
        assert!(
            text.contains(&format!(
                "caused by: it contains ppp's config directory `{}`",
                home_c.join(".config/ppp").display()
            )),
            "{text}"
        );
        assert!(text.contains("hint: mount a project directory instead"), "{text}");
        assert!(refused(&t.path().join("link")).0.contains("it contains ppp's config directory"));
        assert!(refused(&home.join(".local")).0.contains("it contains ppp's data directory"));
        assert!(refused(&home.join(".local/share/ppp")).0.contains("it is ppp's data directory"));
        assert!(
            refused(&t.path().join("link/.local/share/ppp/sandboxes")).0.contains("it is inside ppp's data directory")
        );
        assert!(refused(&t.path().join("cache")).0.contains("it is ppp's cache directory"));
        assert!(refused(t.path()).0.contains("it contains"));
        dirs.check_workspace(&home.join("src/app")).unwrap();
        dirs.check_workspace(&home.join("src")).unwrap();
        // A sibling whose name merely starts like a root is not inside it.
        std::fs::create_dir_all(t.path().join("cache2")).unwrap();
        dirs.check_workspace(&t.path().join("cache2")).unwrap();
    }

    /// A sandbox's sockets fit `sun_path` whatever the data root's length,
    /// the longest name included; two data roots never share a directory.
    #[test]
    fn podman_sockets_fit_with_a_long_data_root() {
        let long = format!("/{}", "d".repeat(200));
        let a = Dirs { config: "/c".into(), data: long.clone().into(), cache: "/k".into() };
        let b = Dirs { config: "/c".into(), data: "/other".into(), cache: "/k".into() };
        let name = "n".repeat(crate::sandbox::MAX_NAME_LEN);
        let machine = crate::sandbox::machine_name(&name);
        for base in [None, Some(Path::new("/run/user/1000")), Some(Path::new(long.as_str()))] {
            let rt = a.podman_runtime(&name, base);
            assert!(
                rt.as_os_str().len() + crate::podman::socket_suffix_len(&machine) <= crate::podman::SUN_PATH_MAX,
                "{}",
                rt.display()
            );
            assert!(!rt.starts_with(&long), "{}", rt.display());
        }
        assert!(a.podman_runtime("x", Some(Path::new("/run/user/1000"))).starts_with("/run/user/1000"));
        assert_ne!(a.podman_runtime("x", None), b.podman_runtime("x", None));
        assert_ne!(a.podman_runtime("x", None), a.podman_runtime("y", None));
        assert!(a.podman_home("x", Path::new("/r")).config.starts_with(a.sandbox("x")));
    }

    #[test]
    fn no_home_is_an_error() {
        let err = Dirs::resolve(|_| None).unwrap_err();
        let (text, _) = crate::error::render(&err);
        assert_eq!(
            text,
            "error: cannot locate ppp's config directory\nhint: set `PPP_CONFIG`, `XDG_CONFIG_HOME` or `HOME`\n"
        );
    }
}

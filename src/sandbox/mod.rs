//! Sandbox state on disk: one `sandbox.json` per sandbox and the WireGuard
//! port registry that maps pool ports to sandboxes.
//!
//! Reading is lock-free (every file is replaced atomically, so a reader sees
//! the old or the new version, never a mix). Every mutation takes
//! `state.lock`; the `*_locked` functions expect the caller to hold it.
//!
//! This file holds the state alone, so that `proxy` reads the registry
//! without depending on the lifecycle. What is done with the state lives in
//! the submodules, a layer above `proxy`: [`lifecycle`] (create, reattach,
//! stop, remove) and the steps it puts in order. They never name `kit`:
//! kits build on sandboxes (see [`lifecycle::Extension`]).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

mod claim;
pub mod guard;
pub mod host;
pub mod image;
pub mod lifecycle;
pub mod machine;
pub mod names;
pub mod provision;
pub mod request;
pub mod session;
pub mod ui;
pub mod verify;
pub mod workspace;

use crate::dirs::Dirs;
use crate::error::fail;
use crate::state;

/// First port of the WireGuard pool.
pub const POOL_START: u16 = 51820;
/// Last port of the WireGuard pool (inclusive): 80 sandboxes.
pub const POOL_END: u16 = 51899;
/// Every machine ppp creates starts with this, so ppp never touches one it
/// did not create.
pub const MACHINE_PREFIX: &str = "ppp-";
/// Longest sandbox name. Machine names, socket paths and interface names are
/// derived from it; 48 keeps all of them well inside their limits.
pub const MAX_NAME_LEN: usize = 48;
/// Names that would collide with key prefixes in the secret store.
pub const RESERVED_NAMES: &[&str] = &["custom", "global", "registry"];

/// Lifecycle states recorded in `sandbox.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Creating,
    Created,
    Running,
    Stopped,
    Failed,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Creating => "creating",
            Self::Created => "created",
            Self::Running => "running",
            Self::Stopped => "stopped",
            Self::Failed => "failed",
        })
    }
}

/// A port published from the sandbox to the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    pub host_port: u16,
    pub sandbox_port: u16,
    pub protocol: String,
}

impl std::fmt::Display for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(ip) = &self.host_ip {
            write!(f, "{ip}:")?;
        }
        write!(f, "{}->{}/{}", self.host_port, self.sandbox_port, self.protocol)
    }
}

/// `$PPP_DATA/sandboxes/<name>/sandbox.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    pub agent: String,
    /// Host directories mounted into the sandbox; the first is the workdir.
    pub workspace: Vec<String>,
    pub status: Status,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    pub cpus: u32,
    /// MiB, as podman takes it.
    pub memory: u64,
    /// The WireGuard pool port; identifies the sandbox at the proxy.
    pub port: u16,
    pub inner_ip: Ipv4Addr,
    #[serde(default)]
    pub kit_refs: Vec<String>,
    /// Environment for the agent container from applied kits, by kit name
    /// (so re-adding a kit replaces its own variables only).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kit_env: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    /// Files applied kits installed in the VM, by kit name: guest path to a
    /// digest of mode and content. They are bind-mounted into the agent
    /// container; a changed digest means the container must start again
    /// (`install` replaces the file, and a bind mount keeps the old one).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kit_files: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    /// Bumped whenever a kit changes what the agent container is made
    /// from. A `ppp run` session whose agent stops sees the new value and
    /// starts the agent again with the new definition.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub agent_generation: u64,
    #[serde(default)]
    pub template_tag: Option<String>,
    pub machine_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published: Vec<Published>,
    /// With `--clone`: where the workspace's clone lives in the VM (the
    /// host repository has a remote `sandbox-<name>` pointing at it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<String>,
    /// The image the agent container runs, set once provisioning has it
    /// in the VM (`None` in a record older than issue 24, or mid-create).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Where that image came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_origin: Option<ImageOrigin>,
    /// Where the machine's sockets are, when it lives in a podman home of
    /// its own (`sandboxes/<name>/podman`, see [`home`]). Absent in a
    /// record an earlier ppp wrote: that machine is in the user's own
    /// podman home, where it stays (ADR 0030).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub podman_run: Option<std::path::PathBuf>,
    /// The guest kernel's boot id when podman last started the machine
    /// (and mounted the workspace). A different one later means the guest
    /// rebooted by itself, which podman does not see and after which
    /// nothing mounts the workspace again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// How the agent's image reached a sandbox's VM (`ppp diagnose` shows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageOrigin {
    /// `PPP_<AGENT>_IMAGE` named it; provisioning pulled it.
    Pulled,
    /// Built in this VM from the agent's Containerfile.
    Built,
    /// Loaded from the host's image cache, without a network fetch.
    Cached,
    /// Already in the VM: the template's disk held it.
    Template,
}

impl std::fmt::Display for ImageOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pulled => "pulled",
            Self::Built => "built",
            Self::Cached => "cached",
            Self::Template => "template",
        })
    }
}

/// The podman home sandbox `rec`'s machine lives in.
pub fn home(dirs: &Dirs, rec: &Record) -> crate::podman::Home {
    match &rec.podman_run {
        Some(run) => crate::podman::Home::Own(dirs.podman_home(&rec.name, run)),
        None => crate::podman::Home::User,
    }
}

/// `podman` in sandbox `rec`'s home: what every command for its machine is
/// built from.
pub fn podman_for(podman: &crate::podman::Podman, dirs: &Dirs, rec: &Record) -> crate::podman::Podman {
    podman.in_home(home(dirs, rec))
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Check a sandbox name: lowercase letters, digits and `-`, starting with a
/// letter or digit. Names become machine names, keychain keys and paths.
pub fn validate_name(name: &str) -> Result<()> {
    let bad = |why: &str| -> anyhow::Error {
        fail(format!("invalid sandbox name `{name}`: {why}"))
            .hint("use lowercase letters, digits and `-`, e.g. `my-project`")
            .code(2)
            .into()
    };
    if name.is_empty() {
        return Err(bad("it is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(bad(&format!("it is longer than {MAX_NAME_LEN} characters")));
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Err(bad("it may contain only lowercase letters, digits and `-`"));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(bad("it must start and end with a letter or digit"));
    }
    if RESERVED_NAMES.contains(&name) {
        return Err(bad("that name is reserved"));
    }
    Ok(())
}

/// The Podman Machine name of a sandbox. Always prefixed, so the mapping is
/// one-to-one and never lands on a machine ppp did not create.
pub fn machine_name(name: &str) -> String {
    format!("{MACHINE_PREFIX}{name}")
}

/// Addresses in 10.0.0.0/24 that the tunnel itself uses, so no sandbox may
/// have them: the network address, 10.0.0.1 (the `Address` every
/// mitmproxy WireGuard server prints for its client, so a guest run from an
/// unedited config would share it), 10.0.0.53 (mitmproxy's DNS server and
/// where provisioning reaches `mitm.it`; `dns_resolver.py` and
/// `next_layer.py` single it out) and the broadcast address. mitmproxy's
/// own end of the tunnel has no 10.0.0.x address: its smoltcp interface
/// answers any IP (`set_any_ip`, `mitmproxy_rs`'s `network/tcp.rs`).
pub const TUNNEL_ADDRESSES: [Ipv4Addr; 4] =
    [Ipv4Addr::new(10, 0, 0, 0), Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 53), Ipv4Addr::new(10, 0, 0, 255)];

/// The inner tunnel address for a pool port: the pool's N-th port (from 0)
/// gets the N-th address of 10.0.0.2 upward that is not one of
/// [`TUNNEL_ADDRESSES`], so 51820 is 10.0.0.2 and 51899 is 10.0.0.82.
pub fn inner_ip(port: u16) -> Ipv4Addr {
    debug_assert!((POOL_START..=POOL_END).contains(&port));
    let index = usize::from(port.saturating_sub(POOL_START));
    (2..=254u8)
        .map(|n| Ipv4Addr::new(10, 0, 0, n))
        .filter(|ip| !TUNNEL_ADDRESSES.contains(ip))
        .nth(index)
        .expect("the pool has 80 ports and 10.0.0.0/24 has 250 free addresses")
}

/// Load one sandbox record; `None` if the sandbox does not exist.
pub fn load(dirs: &Dirs, name: &str) -> Result<Option<Record>> {
    let path = dirs.sandbox_record(name);
    load_path(&path)
}

fn load_path(path: &Path) -> Result<Option<Record>> {
    match state::read_optional(path)? {
        None => Ok(None),
        Some(text) => Ok(Some(state::parse_json(path, &text)?)),
    }
}

/// Every sandbox record, sorted by name. A malformed record is an error that
/// names the file and line; nothing is rewritten.
pub fn load_all(dirs: &Dirs) -> Result<Vec<Record>> {
    let root = dirs.sandboxes();
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("could not read `{}`", root.display())),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("could not read `{}`", root.display()))?;
        // A directory without sandbox.json holds only a prepared policy
        // (`policy allow --sandbox` before `create`); it is not a sandbox yet.
        if let Some(rec) = load_path(&entry.path().join("sandbox.json"))? {
            out.push(rec);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Write a record atomically. The caller holds `state.lock`.
pub fn save_locked(dirs: &Dirs, rec: &Record) -> Result<()> {
    state::write_json(&dirs.sandbox_record(&rec.name), rec)
}

/// `$PPP_DATA/port-registry.json`: which sandbox holds which pool port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortRegistry {
    /// Port → sandbox name. A `BTreeMap` keeps the file stable and sorted.
    pub ports: BTreeMap<u16, String>,
    /// Port → the id of its current claim, which names the port's WireGuard
    /// key file (`keys-<port>-<claim>.conf`). Every claim gets a new id, so
    /// mitmdump's server for the port starts again with keys of its own and
    /// a former holder's `wg0.conf` is worth nothing (issue 11 point 5, ADR
    /// 0018). A port without one (a registry older than this) keeps
    /// `keys-<port>.conf` until it is claimed again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<u16, String>,
}

impl PortRegistry {
    /// Load the registry; an absent file is an empty registry.
    pub fn load(dirs: &Dirs) -> Result<Self> {
        let path = dirs.port_registry();
        match state::read_optional(&path)? {
            None => Ok(Self::default()),
            Some(text) => Ok(state::parse_json(&path, &text)?),
        }
    }

    /// Write the registry atomically. The caller holds `state.lock`.
    pub fn save_locked(&self, dirs: &Dirs) -> Result<()> {
        state::write_json(&dirs.port_registry(), self)
    }

    /// The port held by `name`, if any.
    pub fn port_of(&self, name: &str) -> Option<u16> {
        self.ports.iter().find(|(_, n)| *n == name).map(|(p, _)| *p)
    }

    /// Give `name` a port: its existing one, else the lowest free port, so a
    /// freed port is reused first.
    pub fn allocate(&mut self, name: &str) -> Result<u16> {
        if let Some(p) = self.port_of(name) {
            return Ok(p);
        }
        let port = (POOL_START..=POOL_END).find(|p| !self.ports.contains_key(p)).ok_or_else(|| {
            fail(format!("all {} WireGuard ports ({POOL_START}-{POOL_END}) are in use", POOL_END - POOL_START + 1))
                .hint("remove sandboxes you no longer need with `ppp rm`")
        })?;
        self.ports.insert(port, name.to_owned());
        self.claims.insert(port, new_claim_id());
        Ok(port)
    }

    /// Release `name`'s port. Returns the port it held.
    pub fn free(&mut self, name: &str) -> Option<u16> {
        let port = self.port_of(name)?;
        self.ports.remove(&port);
        self.claims.remove(&port);
        Some(port)
    }

    /// The claim id of `port`, if it has one.
    pub fn claim_of(&self, port: u16) -> Option<&str> {
        self.claims.get(&port).map(String::as_str)
    }
}

/// A fresh claim id: 16 random hex digits (64 bits), enough that two
/// claims of one port never share a key file.
fn new_claim_id() -> String {
    let mut id = uuid::Uuid::new_v4().simple().to_string();
    id.truncate(16);
    id
}

/// Take `state.lock`, run `f` on the registry, and save it if `f` succeeded.
pub fn with_registry<T>(dirs: &Dirs, f: impl FnOnce(&mut PortRegistry) -> Result<T>) -> Result<T> {
    let _lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut reg = PortRegistry::load(dirs)?;
    let out = f(&mut reg)?;
    reg.save_locked(dirs)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(tmp: &Path) -> Dirs {
        Dirs { config: tmp.join("c"), data: tmp.join("d"), cache: tmp.join("k") }
    }

    #[test]
    fn names() {
        for ok in ["a", "red-fox", "x1", &"a".repeat(MAX_NAME_LEN)] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "custom", "a b", &"a".repeat(MAX_NAME_LEN + 1)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(machine_name("red-fox"), "ppp-red-fox");
        assert_eq!(machine_name("ppp-x"), "ppp-ppp-x");
    }

    #[test]
    fn inner_ips_follow_ports() {
        assert_eq!(inner_ip(51820), Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(inner_ip(51870), Ipv4Addr::new(10, 0, 0, 52));
        assert_eq!(inner_ip(51871), Ipv4Addr::new(10, 0, 0, 54));
        assert_eq!(inner_ip(51899), Ipv4Addr::new(10, 0, 0, 82));
    }

    /// Issue 11 point 8: the 53rd port got 10.0.0.53, the tunnel's DNS and
    /// `mitm.it` address. Claims every port of the pool, as 80 `create`s
    /// would, and checks each one's address.
    #[test]
    fn no_claimed_port_gets_a_tunnel_address() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..=(POOL_END - POOL_START) {
            let port = with_registry(&d, |r| r.allocate(&format!("s{i}"))).unwrap();
            let ip = inner_ip(port);
            assert!(!TUNNEL_ADDRESSES.contains(&ip), "port {port} got the tunnel's own {ip}");
            assert_eq!(ip.octets()[..3], [10, 0, 0], "port {port} got {ip}, outside 10.0.0.0/24");
            assert!(seen.insert(ip), "port {port} got {ip} twice");
        }
        assert_eq!(seen.len(), 80);
        assert!(with_registry(&d, |r| r.allocate("one-more")).is_err());
    }

    #[test]
    fn allocation_reuses_freed_ports_and_exhausts() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        assert_eq!(with_registry(&d, |r| r.allocate("a")).unwrap(), 51820);
        assert_eq!(with_registry(&d, |r| r.allocate("b")).unwrap(), 51821);
        assert_eq!(with_registry(&d, |r| r.allocate("a")).unwrap(), 51820, "idempotent");
        let of_a = PortRegistry::load(&d).unwrap().claims[&51820].clone();
        assert_eq!(with_registry(&d, |r| Ok(r.free("a"))).unwrap(), Some(51820));
        assert!(!PortRegistry::load(&d).unwrap().claims.contains_key(&51820), "the claim goes with the port");
        let first = PortRegistry::load(&d).unwrap().claims[&51821].clone();
        assert_eq!(with_registry(&d, |r| r.allocate("b")).unwrap(), 51821);
        assert_eq!(PortRegistry::load(&d).unwrap().claims[&51821], first, "the same claim keeps its id");
        assert_eq!(with_registry(&d, |r| r.allocate("c")).unwrap(), 51820, "freed port reused");
        let reg = PortRegistry::load(&d).unwrap();
        assert_eq!(reg.claims.len(), 2);
        assert_ne!(reg.claim_of(51820), reg.claim_of(51821));
        assert_ne!(reg.claim_of(51820), Some(of_a.as_str()), "a port claimed again gets new keys");
        let mut reg = PortRegistry::load(&d).unwrap();
        for i in 0..78 {
            reg.allocate(&format!("s{i}")).unwrap();
        }
        let err = reg.allocate("overflow").unwrap_err();
        assert!(err.to_string().contains("all 80 WireGuard ports"), "{err}");
    }

    #[test]
    fn parallel_allocations_are_distinct() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let d = d.clone();
                std::thread::spawn(move || with_registry(&d, |r| r.allocate(&format!("s{i}"))).unwrap())
            })
            .collect();
        let mut ports: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 16);
        assert_eq!(PortRegistry::load(&d).unwrap().ports.len(), 16);
    }

    #[test]
    fn malformed_record_names_file_and_line_and_is_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        let p = d.sandbox_record("x");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let text = "{\n  \"name\": \"x\",\n  \"agent\": 7\n}\n";
        std::fs::write(&p, text).unwrap();
        let err = format!("{:#}", load_all(&d).unwrap_err());
        assert!(err.contains("sandbox.json` line 3"), "{err}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), text);
    }
}

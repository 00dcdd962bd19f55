//! The secret store: API keys and custom substitutions that ppp's daemon
//! injects into outbound requests, so they never enter a guest.
//!
//! Values live in the OS keychain ([`keychain`]) or, where no keychain is
//! reachable, in an age-encrypted file ([`file`]). A name-only index
//! ([`index`]) lists what exists and records which backend holds each entry.
//! [`services`] knows the built-in providers and how their headers are formed.
//!
//! Store keys (keychain service names, with user `ppp`):
//!
//! | secret                     | key                                |
//! |----------------------------|------------------------------------|
//! | global service             | `ppp.<service>`                    |
//! | sandbox service            | `ppp.<sandbox>.<service>`          |
//! | global custom secret       | `ppp.custom.<placeholder>`         |
//! | sandbox custom secret      | `ppp.<sandbox>.custom.<placeholder>` |
//!
//! No name contains a dot and the sandbox names that would collide are
//! reserved ([`RESERVED_SANDBOX_NAMES`]), so every key has one reading.
//!
//! A value is a [`Value`]: it never reaches output, logs, errors or `Debug`.
//! This module never prints; it returns data and errors to its callers.

pub mod command;
mod file;
mod index;
mod keychain;
pub mod services;
pub mod validate;
pub mod value;

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::dirs::Dirs;
use crate::env::{PPP_AGE_IDENTITY, PPP_SECRET_BACKEND};
use crate::error::fail;
use crate::state::Lock;

pub use services::{Header, ServiceSpec};
pub use validate::RESERVED_SANDBOX_NAMES;
pub use value::Value;

use file::FileStore;
use index::Index;

/// Failures callers branch on. They sit in the `anyhow` chain of the errors
/// the store returns; find them with `err.downcast_ref::<secret::Error>()`
/// or [`is_unavailable`]. The detailed cause and a hint sit below them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No keychain answers, or it is locked: the daemon's `locked` reply.
    #[error("the OS keychain is not reachable")]
    KeychainUnavailable,
    /// The keychain answered but the operation failed.
    #[error("the OS keychain failed")]
    Keychain,
    /// The age file exists but cannot be decrypted (no identity, wrong
    /// identity, damaged): also the daemon's `locked` reply.
    #[error("the secret file `{}` cannot be decrypted", .0.display())]
    FileLocked(PathBuf),
}

/// True when `err` means the store holding a secret cannot be read right
/// now (keychain unreachable or locked, age file undecryptable), as opposed
/// to the secret not existing or a bug.
#[must_use]
pub fn is_unavailable(err: &anyhow::Error) -> bool {
    matches!(err.downcast_ref::<Error>(), Some(Error::KeychainUnavailable | Error::FileLocked(_)))
}

/// Whose secret: every sandbox's, or one sandbox's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    Global,
    Sandbox(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Global => f.write_str("global"),
            Scope::Sandbox(name) => f.write_str(name),
        }
    }
}

/// `"global"` or a valid sandbox name; the inverse of `Display`.
impl FromStr for Scope {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Scope> {
        if s == "global" {
            return Ok(Scope::Global);
        }
        validate::sandbox(s)?;
        Ok(Scope::Sandbox(s.to_owned()))
    }
}

impl Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Scope, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|e: anyhow::Error| serde::de::Error::custom(format!("{e:#}")))
    }
}

/// What a secret is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// An API key injected as a header for a service's hosts.
    Service,
    /// A value substituted for a placeholder in headers to its hosts.
    Custom,
    /// Credentials ppp itself sends to an OCI registry (`ppp kit push/pull`):
    /// `user:password` or a bearer token. Always global, never injected
    /// into a sandbox's traffic. The name is the registry `host[:port]`.
    Registry,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Service => "service",
            Kind::Custom => "custom",
            Kind::Registry => "registry",
        })
    }
}

/// Where a value lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The OS keychain (Secret Service, macOS Keychain, Windows Credential Manager).
    Keychain,
    /// The age-encrypted `$PPP_DATA/secrets.age`.
    File,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Keychain => "keychain",
            Backend::File => "file",
        })
    }
}

impl FromStr for Backend {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Backend> {
        match s {
            "keychain" => Ok(Backend::Keychain),
            "file" => Ok(Backend::File),
            _ => Err(fail(format!("`{s}` is not a secret backend")).hint("use `keychain` or `file`").into()),
        }
    }
}

/// One line of the index: a secret's name and metadata, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub scope: Scope,
    /// The service name, or for a custom secret its placeholder.
    pub name: String,
    pub kind: Kind,
    /// Hosts the secret may be sent to (canonical: lower case, no trailing dot).
    pub hosts: Vec<String>,
    /// For services: the header's textual form ([`Header`]), such as
    /// `x-api-key` or `authorization: Bearer`. `None` for custom secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// For custom secrets: the text replaced by the value (equals `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
    /// For custom secrets: a variable the guest gets, set to the placeholder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Where the value lives; reads always go here.
    pub backend: Backend,
    /// When the current value was stored (setting it again resets this).
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// For a secret from a command: its argv, run by the daemon on the host
    /// ([`command`]). No backend holds a value for such an entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// For a secret from a command: how long a value is used (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<u64>,
}

/// Where a secret's value comes from, for [`Store::set_service_from`].
#[derive(Debug)]
pub enum Source<'a> {
    /// A value stored in a backend.
    Static(&'a Value),
    /// The output of `argv`, run by the daemon, cached for `refresh`.
    Command { argv: Vec<String>, refresh: std::time::Duration },
}

impl Entry {
    /// This entry's store key, such as `ppp.my-box.anthropic`.
    #[must_use]
    pub fn key(&self) -> String {
        key(&self.scope, &self.name, self.kind)
    }

    fn is(&self, scope: &Scope, name: &str, kind: Kind) -> bool {
        self.kind == kind && self.name == name && self.scope == *scope
    }

    /// Whether the secret may be sent to `host`.
    #[must_use]
    pub fn allows_host(&self, host: &str) -> bool {
        let host = services::canonical_host(host);
        self.hosts.iter().any(|h| *h == host)
    }

    /// The header a service entry injects into requests to `host`; `None`
    /// for custom secrets and for hosts the entry does not list.
    #[must_use]
    pub fn header_rule(&self, host: &str) -> Option<Header> {
        if self.kind != Kind::Service || !self.allows_host(host) {
            return None;
        }
        let spec = services::builtin(&self.name);
        let host = services::canonical_host(host);
        if let Some(h) = spec.and_then(|s| s.host_header(&host)) {
            return Some(h.clone());
        }
        match &self.header {
            // The index is validated on load, so this parses.
            Some(text) => Header::parse(text).ok(),
            None => Some(spec.map_or(Header::BEARER, |s| s.header.clone())),
        }
    }

    /// The header name and value to inject into a request for `host`, given
    /// this entry's `value`. Pure: the daemon calls it after
    /// [`Store::lookup_entry`].
    #[must_use]
    pub fn header_for(&self, host: &str, value: &Value) -> Option<(String, Value)> {
        self.header_rule(host).map(|h| h.render(value))
    }
}

/// Every secret's index entry, read without opening a store (no keychain
/// probe): for checks that need only names and hosts, such as whether a
/// host has a secret (ADR 0051).
pub fn entries(dirs: &Dirs) -> Result<Vec<Entry>> {
    Ok(Index::load(&dirs.secrets_index())?.entries)
}

/// The store key for a secret; see the module docs for the layout.
#[must_use]
pub fn key(scope: &Scope, name: &str, kind: Kind) -> String {
    match (scope, kind) {
        (Scope::Global, Kind::Service) => format!("ppp.{name}"),
        (Scope::Sandbox(s), Kind::Service) => format!("ppp.{s}.{name}"),
        (Scope::Global, Kind::Custom) => format!("ppp.custom.{name}"),
        (Scope::Sandbox(s), Kind::Custom) => format!("ppp.{s}.custom.{name}"),
        // Registry credentials are global only ([`Store::set_registry`]); the
        // sandbox name `registry` is reserved so this key has one reading.
        (_, Kind::Registry) => format!("ppp.registry.{name}"),
    }
}

/// A header to inject, found by [`Store::header_for`].
#[derive(Debug)]
pub struct Injection {
    /// The scope whose key was used.
    pub scope: Scope,
    /// Lower-case header name.
    pub header: String,
    pub value: Value,
    /// For a value from a command: how long it may still be cached.
    pub ttl: Option<std::time::Duration>,
}

/// A placeholder and what replaces it, found by [`Store::substitutions`].
#[derive(Debug)]
pub struct Substitution {
    pub scope: Scope,
    pub placeholder: String,
    pub value: Value,
    /// For a value from a command: how long it may still be cached.
    pub ttl: Option<std::time::Duration>,
}

/// How to open the store; [`Settings::from_env`] reads the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `PPP_SECRET_BACKEND`: force a backend for new writes; `None` probes.
    pub backend: Option<Backend>,
    /// `PPP_AGE_IDENTITY`: the age identity file; `None` means
    /// `$PPP_CONFIG/age-identity.txt`, created on first write.
    pub age_identity: Option<PathBuf>,
}

impl Settings {
    /// Read `PPP_SECRET_BACKEND` and `PPP_AGE_IDENTITY`.
    pub fn from_env() -> Result<Settings> {
        Settings::resolve(|k| std::env::var_os(k))
    }

    /// [`Settings::from_env`] over any variable lookup. Empty means unset.
    pub fn resolve(var: impl Fn(&str) -> Option<OsString>) -> Result<Settings> {
        let nonempty = |k: &str| var(k).filter(|v| !v.is_empty());
        let backend = match nonempty(PPP_SECRET_BACKEND) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .unwrap_or("")
                    .trim()
                    .parse()
                    .with_context(|| format!("`{PPP_SECRET_BACKEND}` is `{}`", v.to_string_lossy()))?,
            ),
        };
        let age_identity = match nonempty(PPP_AGE_IDENTITY) {
            None => None,
            // Anchored once, like the `PPP_*` roots, so a later chdir cannot
            // move it.
            Some(p) => Some(
                std::path::absolute(PathBuf::from(p))
                    .with_context(|| format!("could not resolve `{PPP_AGE_IDENTITY}`"))?,
            ),
        };
        Ok(Settings { backend, age_identity })
    }
}

/// Whether the OS keychain answers, for `ppp diagnose`.
#[must_use]
pub fn keychain_available() -> bool {
    keychain::probe().is_ok()
}

/// Why the OS keychain does not answer (`Err`), for `ppp diagnose`.
pub fn keychain_status() -> std::result::Result<(), String> {
    keychain::probe()
}

/// The secret store.
///
/// Reads take no lock: every file is replaced atomically. Each mutating
/// method takes `state.lock` itself, for the whole read-modify-write of the
/// index and the age file, so callers must **not** hold `state.lock` when
/// they call one (flock is per open file, so a second acquire in the same
/// process waits forever). The one exception, for callers that already hold
/// it, is [`Store::remove_scope`].
#[derive(Debug)]
pub struct Store {
    dirs: Dirs,
    backend: Backend,
    file: FileStore,
    /// Values of command secrets, run and cached here (the daemon's store).
    commands: command::Cache,
}

impl Store {
    /// Open the store with settings from the environment. See
    /// [`Store::open_with`].
    pub fn open(dirs: &Dirs) -> Result<Store> {
        Store::open_with(dirs, &Settings::from_env()?)
    }

    /// Open the store: pick the backend for new writes (the forced one, else
    /// the keychain when it answers a probe, else the file). Creates no
    /// file; the first write does.
    pub fn open_with(dirs: &Dirs, settings: &Settings) -> Result<Store> {
        let backend = match settings.backend {
            Some(Backend::File) => Backend::File,
            Some(Backend::Keychain) => {
                if let Err(detail) = keychain::probe() {
                    return Err(anyhow::Error::new(
                        fail(detail)
                            .hint("unset `PPP_SECRET_BACKEND` or set it to `file` to use the age-encrypted file store"),
                    )
                    .context(Error::KeychainUnavailable)
                    .context(format!("`{PPP_SECRET_BACKEND}` is `keychain`, but the keychain cannot be used")));
                }
                Backend::Keychain
            }
            None => match keychain::probe() {
                Ok(()) => Backend::Keychain,
                Err(detail) => {
                    tracing::debug!("the OS keychain is not reachable ({detail}); using the file store");
                    Backend::File
                }
            },
        };
        let (identity, given) = match &settings.age_identity {
            Some(p) => (p.clone(), true),
            None => (dirs.age_identity(), false),
        };
        Ok(Store {
            dirs: dirs.clone(),
            backend,
            file: FileStore::new(dirs.secrets_file(), identity, given),
            commands: command::Cache::new(dirs.secret_status()),
        })
    }

    /// The backend new writes go to.
    #[must_use]
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Store a service's API key. For a built-in service `hosts` may be
    /// empty (its default hosts); given hosts replace the defaults. Any other
    /// service needs hosts and gets `authorization: Bearer`. Replaces an
    /// existing value in the same scope. Takes `state.lock`.
    pub fn set_service(&self, scope: &Scope, service: &str, hosts: &[String], value: &Value) -> Result<()> {
        self.set_service_with_header(scope, service, hosts, None, value)
    }

    /// [`Store::set_service`] with an explicit header for a service ppp does
    /// not know (or to override a built-in's). Takes `state.lock`.
    pub fn set_service_with_header(
        &self,
        scope: &Scope,
        service: &str,
        hosts: &[String],
        header: Option<&Header>,
        value: &Value,
    ) -> Result<()> {
        self.set_service_from(scope, service, hosts, header, Source::Static(value))
    }

    /// [`Store::set_service_with_header`] from any [`Source`]. Takes
    /// `state.lock`.
    pub fn set_service_from(
        &self,
        scope: &Scope,
        service: &str,
        hosts: &[String],
        header: Option<&Header>,
        source: Source<'_>,
    ) -> Result<()> {
        check_scope(scope)?;
        validate::service(service)?;
        let spec = services::builtin(service);
        let mut hosts = validate::hosts(hosts)?;
        if hosts.is_empty() {
            let Some(spec) = spec else {
                return Err(fail(format!("`{service}` is not a built-in service, so its hosts must be given"))
                    .hint(format!(
                        "name each API host, e.g. `--host api.{service}.example`; built-in services: {}",
                        services::all().iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
                    ))
                    .into());
            };
            hosts = spec.hosts.iter().map(|h| (*h).to_owned()).collect();
        }
        let header = header.or(spec.map(|s| &s.header)).map_or_else(|| Header::BEARER.to_string(), Header::to_string);
        let entry = Entry {
            scope: scope.clone(),
            name: service.to_owned(),
            kind: Kind::Service,
            hosts,
            header: Some(header),
            placeholder: None,
            env: None,
            backend: self.backend,
            created_at: now(),
            command: None,
            refresh: None,
        };
        self.put(entry, source).with_context(|| format!("could not store secret `{service}` ({scope} scope)"))
    }

    /// Store a custom secret: `placeholder` in request headers to `hosts` is
    /// replaced by `value`. `env` names a variable the guest gets, set to the
    /// placeholder. Takes `state.lock`.
    pub fn set_custom(
        &self,
        scope: &Scope,
        placeholder: &str,
        hosts: &[String],
        env: Option<&str>,
        value: &Value,
    ) -> Result<()> {
        self.set_custom_from(scope, placeholder, hosts, env, Source::Static(value))
    }

    /// [`Store::set_custom`] from any [`Source`]. Takes `state.lock`.
    pub fn set_custom_from(
        &self,
        scope: &Scope,
        placeholder: &str,
        hosts: &[String],
        env: Option<&str>,
        source: Source<'_>,
    ) -> Result<()> {
        check_scope(scope)?;
        validate::placeholder(placeholder)?;
        if let Some(e) = env {
            validate::env_var(e)?;
        }
        let hosts = validate::hosts(hosts)?;
        if hosts.is_empty() {
            return Err(fail(format!("custom secret `{placeholder}` needs at least one host"))
                .hint("name each host the value may be sent to, e.g. `--host jira.example.com`")
                .into());
        }
        let entry = Entry {
            scope: scope.clone(),
            name: placeholder.to_owned(),
            kind: Kind::Custom,
            hosts,
            header: None,
            placeholder: Some(placeholder.to_owned()),
            env: env.map(str::to_owned),
            backend: self.backend,
            created_at: now(),
            command: None,
            refresh: None,
        };
        self.put(entry, source)
            .with_context(|| format!("could not store custom secret `{placeholder}` ({scope} scope)"))
    }

    /// Store credentials for the OCI registry `host` (`host[:port]`):
    /// `user:password`, or a bearer token. Takes `state.lock`.
    pub fn set_registry(&self, host: &str, value: &Value) -> Result<()> {
        let host = validate::registry(host)?;
        let entry = Entry {
            scope: Scope::Global,
            name: host.clone(),
            kind: Kind::Registry,
            hosts: Vec::new(),
            header: None,
            placeholder: None,
            env: None,
            backend: self.backend,
            created_at: now(),
            command: None,
            refresh: None,
        };
        self.put(entry, Source::Static(value))
            .with_context(|| format!("could not store credentials for registry `{host}`"))
    }

    /// The credentials stored for the OCI registry `host`, if any.
    pub fn registry(&self, host: &str) -> Result<Option<Value>> {
        let host = validate::registry(host)?;
        self.get(&Scope::Global, &host, Kind::Registry)
    }

    /// The stored value of one secret in exactly `scope`; `None` when it is
    /// not set, or when it comes from a command: only the injection paths
    /// (the daemon) run a secret's command, never a listing or a report.
    pub fn get(&self, scope: &Scope, name: &str, kind: Kind) -> Result<Option<Value>> {
        check_name(scope, name, kind)?;
        let index = self.index()?;
        match index.find(scope, name, kind) {
            Some(e) if e.command.is_some() => Ok(None),
            Some(e) => self.read(e).map(|v| v.map(|(v, _)| v)),
            None => Ok(None),
        }
    }

    /// A 401 from `host` to a request from `sandbox` that carried a key:
    /// the command secret that covers `host` (the one [`Store::header_for_host`]
    /// would use, and every custom one for the host) is run again on the
    /// next request, at most once per [`command::STALE_MIN`]. Returns how
    /// many were dropped. Never runs a command itself.
    pub fn stale(&self, sandbox: Option<&str>, host: &str) -> Result<usize> {
        let index = self.index()?;
        let mut dropped = 0;
        let mut service_seen = false;
        for scope in scopes(sandbox)? {
            for e in index.entries.iter().filter(|e| e.scope == scope) {
                let covers = match e.kind {
                    Kind::Service if !service_seen => e.header_rule(host).is_some(),
                    Kind::Custom => e.allows_host(host),
                    _ => false,
                };
                if !covers {
                    continue;
                }
                if e.kind == Kind::Service {
                    service_seen = true;
                }
                if e.command.is_some() && self.commands.stale(e) {
                    dropped += 1;
                }
            }
        }
        Ok(dropped)
    }

    /// A service's key for `sandbox`: the sandbox's own, else the global one.
    pub fn lookup(&self, sandbox: Option<&str>, service: &str) -> Result<Option<(Scope, Value)>> {
        Ok(self.lookup_entry(sandbox, service)?.map(|(e, v)| (e.scope, v)))
    }

    /// Whether `sandbox` has a key for `service` (its own, else the global
    /// one), from the index alone: a key from a command counts without its
    /// command being run (only the daemon runs those).
    pub fn is_set(&self, sandbox: Option<&str>, service: &str) -> Result<bool> {
        validate::service(service)?;
        let index = self.index()?;
        Ok(scopes(sandbox)?.iter().any(|scope| index.find(scope, service, Kind::Service).is_some()))
    }

    /// [`Store::lookup`], with the index entry that was used, so the caller
    /// can ask it [`Entry::header_for`].
    pub fn lookup_entry(&self, sandbox: Option<&str>, service: &str) -> Result<Option<(Entry, Value)>> {
        validate::service(service)?;
        let index = self.index()?;
        for scope in scopes(sandbox)? {
            if let Some(e) = index.find(&scope, service, Kind::Service)
                && let Some((v, _)) = self.read(e)?
            {
                return Ok(Some((e.clone(), v)));
            }
        }
        Ok(None)
    }

    /// The header to inject into a request from `sandbox` to `host` for
    /// `service`: the sandbox's key if it covers `host`, else the global
    /// key if that does. What the daemon answers the addon with.
    pub fn header_for(&self, sandbox: Option<&str>, service: &str, host: &str) -> Result<Option<Injection>> {
        validate::service(service)?;
        self.first_header(sandbox, host, |e| e.name == service)
    }

    /// The header for whichever service key covers `host`: the sandbox's
    /// keys first, then the global ones. This is what the proxy asks, so a
    /// service stored with its own `--host` is injected without the addon
    /// knowing any host → service table.
    pub fn header_for_host(&self, sandbox: Option<&str>, host: &str) -> Result<Option<Injection>> {
        self.first_header(sandbox, host, |_| true)
    }

    fn first_header(
        &self,
        sandbox: Option<&str>,
        host: &str,
        wanted: impl Fn(&Entry) -> bool,
    ) -> Result<Option<Injection>> {
        let index = self.index()?;
        for scope in scopes(sandbox)? {
            for e in index.entries.iter().filter(|e| e.scope == scope && e.kind == Kind::Service && wanted(e)) {
                let Some(rule) = e.header_rule(host) else {
                    continue;
                };
                if let Some((v, ttl)) = self.read(e)? {
                    let (header, value) = rule.render(&v);
                    return Ok(Some(Injection { scope, header, value, ttl }));
                }
            }
        }
        Ok(None)
    }

    /// Whether any secret, service key or custom, would be sent with a
    /// request from `sandbox` to `host` (its own or a global one), from the
    /// index alone: a command is never run for this. Such a host must be
    /// intercepted, so the key can be injected and the placeholder replaced
    /// (ADR 0051).
    pub fn covers(&self, sandbox: Option<&str>, host: &str) -> Result<bool> {
        let index = self.index()?;
        let scopes = scopes(sandbox)?;
        Ok(index.entries.iter().any(|e| {
            scopes.contains(&e.scope)
                && match e.kind {
                    Kind::Service => e.header_rule(host).is_some(),
                    Kind::Custom => e.allows_host(host),
                    Kind::Registry => false,
                }
        }))
    }

    /// Every custom secret that applies to a request from `sandbox` to
    /// `host`. A sandbox's placeholder shadows a global one of the same
    /// name. Longest placeholder first, so one that contains another is
    /// replaced before it.
    pub fn substitutions(&self, sandbox: Option<&str>, host: &str) -> Result<Vec<Substitution>> {
        let index = self.index()?;
        let mut out: Vec<Substitution> = Vec::new();
        for scope in scopes(sandbox)? {
            for e in index.entries.iter().filter(|e| e.kind == Kind::Custom && e.scope == scope) {
                if !e.allows_host(host) || out.iter().any(|s| s.placeholder == e.name) {
                    continue;
                }
                if let Some((value, ttl)) = self.read(e)? {
                    out.push(Substitution { scope: scope.clone(), placeholder: e.name.clone(), value, ttl });
                }
            }
        }
        out.sort_by(|a, b| b.placeholder.len().cmp(&a.placeholder.len()).then(a.placeholder.cmp(&b.placeholder)));
        Ok(out)
    }

    /// Delete one secret; `false` when it was not set. Takes `state.lock`.
    pub fn remove(&self, scope: &Scope, name: &str, kind: Kind) -> Result<bool> {
        check_name(scope, name, kind)?;
        let _lock = self.lock()?;
        let mut index = self.index()?;
        let key = key(scope, name, kind);
        let Some(entry) = index.find(scope, name, kind) else {
            // Not listed, but a crash between writing a value and writing the
            // index can leave one behind: clear it, quietly, if it is there.
            return Ok(self.delete(self.backend, &key).unwrap_or(false));
        };
        self.delete(entry.backend, &key)
            .with_context(|| format!("could not remove secret `{name}` ({scope} scope)"))?;
        index.remove(scope, name, kind);
        index.save()?;
        Ok(true)
    }

    /// Delete every secret of `scope` (for `ppp rm <sandbox>`); returns how
    /// many. The caller holds `state.lock` and proves it with `held`.
    pub fn remove_scope(&self, scope: &Scope, held: &Lock) -> Result<usize> {
        check_scope(scope)?;
        anyhow::ensure!(
            held.path() == self.dirs.state_lock(),
            "internal error: `remove_scope` needs `{}` held, got `{}`",
            self.dirs.state_lock().display(),
            held.path().display()
        );
        let mut index = self.index()?;
        let doomed: Vec<Entry> = index.entries.iter().filter(|e| e.scope == *scope).cloned().collect();
        let mut first_err = None;
        let mut removed = 0;
        for e in &doomed {
            match self.delete(e.backend, &e.key()) {
                Ok(_) => {
                    index.remove(&e.scope, &e.name, e.kind);
                    removed += 1;
                }
                Err(err) => {
                    first_err.get_or_insert(err.context(format!("could not remove secret `{}`", e.name)));
                }
            }
        }
        if removed > 0 {
            index.save()?;
        }
        match first_err {
            Some(err) => Err(err),
            None => Ok(removed),
        }
    }

    /// Every secret, from the index alone (no backend is asked). Global
    /// first, then sandboxes by name.
    pub fn list(&self) -> Result<Vec<Entry>> {
        Ok(self.index()?.entries)
    }

    /// The index entry of one secret.
    pub fn entry(&self, scope: &Scope, name: &str, kind: Kind) -> Result<Option<Entry>> {
        check_name(scope, name, kind)?;
        Ok(self.index()?.find(scope, name, kind).cloned())
    }

    /// Whether a secret is set, from the index alone.
    pub fn exists(&self, scope: &Scope, name: &str, kind: Kind) -> Result<bool> {
        Ok(self.entry(scope, name, kind)?.is_some())
    }

    fn index(&self) -> Result<Index> {
        Index::load(&self.dirs.secrets_index())
    }

    fn lock(&self) -> Result<Lock> {
        Lock::acquire(&self.dirs.state_lock())
    }

    /// Write the value, then the index; then drop a copy left in the other
    /// backend. A crash between the steps leaves at worst an unlisted value,
    /// which the next set overwrites and `remove` clears.
    /// A command source stores no value: its argv goes into the index
    /// (0600) and a static value left in a backend from before is dropped.
    fn put(&self, mut entry: Entry, source: Source<'_>) -> Result<()> {
        if let Source::Static(value) = source {
            value.check()?;
        }
        let _lock = self.lock()?;
        let mut index = self.index()?;
        let key = entry.key();
        let from_command = match source {
            Source::Static(value) => {
                match self.backend {
                    Backend::Keychain => keychain::set(&key, value)?,
                    Backend::File => self.file.set(&key, value)?,
                }
                false
            }
            Source::Command { argv, refresh } => {
                entry.command = Some(argv);
                entry.refresh = Some(refresh.as_secs());
                true
            }
        };
        let new_backend = entry.backend;
        let old = index.upsert(entry);
        index.save()?;
        if let Some(old) = old
            && (from_command && old.command.is_none() || old.backend != new_backend && old.command.is_none())
            && let Err(e) = self.delete(old.backend, &key)
        {
            // The new value is stored and listed; failing now would suggest
            // otherwise. The stale copy is unreachable through ppp.
            tracing::warn!("could not remove the old copy of `{key}` from the {}: {e:#}", old.backend);
        }
        Ok(())
    }

    /// The value of `e` and, for a command secret, how long it may be
    /// cached. A command secret's command runs here (when its cached value
    /// is older than its refresh interval).
    fn read(&self, e: &Entry) -> Result<Option<(Value, Option<std::time::Duration>)>> {
        if e.command.is_some() {
            let (v, ttl) = self.commands.get(e)?;
            return Ok(Some((v, Some(ttl))));
        }
        let key = e.key();
        let value = match e.backend {
            Backend::Keychain => keychain::get(&key),
            Backend::File => self.file.get(&key),
        }
        .with_context(|| format!("could not read secret `{}` ({} scope) from the {}", e.name, e.scope, e.backend))?;
        if value.is_none() {
            tracing::warn!("the index lists `{key}` in the {} but it is not there", e.backend);
        }
        Ok(value.map(|v| (v, None)))
    }

    fn delete(&self, backend: Backend, key: &str) -> Result<bool> {
        match backend {
            Backend::Keychain => keychain::delete(key),
            Backend::File => self.file.remove(key),
        }
    }
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc().replace_nanosecond(0).unwrap_or_else(|_| OffsetDateTime::now_utc())
}

fn check_scope(scope: &Scope) -> Result<()> {
    match scope {
        Scope::Global => Ok(()),
        Scope::Sandbox(s) => validate::sandbox(s),
    }
}

fn check_name(scope: &Scope, name: &str, kind: Kind) -> Result<()> {
    check_scope(scope)?;
    match kind {
        Kind::Service => validate::service(name),
        Kind::Custom => validate::placeholder(name),
        Kind::Registry if *scope != Scope::Global => {
            Err(fail("registry credentials are global; they cannot belong to one sandbox").into())
        }
        Kind::Registry => validate::registry(name).map(drop),
    }
}

/// The scopes to search for `sandbox`, most specific first.
fn scopes(sandbox: Option<&str>) -> Result<Vec<Scope>> {
    let mut out = Vec::with_capacity(2);
    if let Some(s) = sandbox {
        validate::sandbox(s)?;
        out.push(Scope::Sandbox(s.to_owned()));
    }
    out.push(Scope::Global);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_keys_are_global_and_keep_the_port() {
        assert_eq!(key(&Scope::Global, "localhost:5000", Kind::Registry), "ppp.registry.localhost:5000");
        assert!(check_name(&Scope::Global, "ghcr.io", Kind::Registry).is_ok());
        assert!(check_name(&Scope::Sandbox("red-fox".into()), "ghcr.io", Kind::Registry).is_err());
    }

    fn sb(s: &str) -> Scope {
        Scope::Sandbox(s.to_owned())
    }

    #[test]
    fn key_layout() {
        assert_eq!(key(&Scope::Global, "anthropic", Kind::Service), "ppp.anthropic");
        assert_eq!(key(&sb("opencode-my-app"), "usai", Kind::Service), "ppp.opencode-my-app.usai");
        assert_eq!(key(&Scope::Global, "PPP_JIRA_TOKEN", Kind::Custom), "ppp.custom.PPP_JIRA_TOKEN");
        assert_eq!(key(&sb("box"), "PPP_JIRA_TOKEN", Kind::Custom), "ppp.box.custom.PPP_JIRA_TOKEN");
    }

    #[test]
    fn scope_and_backend_text() {
        assert_eq!(Scope::Global.to_string(), "global");
        assert_eq!(sb("box").to_string(), "box");
        assert_eq!("global".parse::<Scope>().unwrap(), Scope::Global);
        assert_eq!("box".parse::<Scope>().unwrap(), sb("box"));
        assert!("custom".parse::<Scope>().is_err());
        assert!("a.b".parse::<Scope>().is_err());
        assert_eq!(Backend::Keychain.to_string(), "keychain");
        assert_eq!("file".parse::<Backend>().unwrap(), Backend::File);
        assert!("File".parse::<Backend>().is_err());
        assert_eq!(Kind::Custom.to_string(), "custom");
    }

    #[test]
    fn settings_from_variables() {
        let s = Settings::resolve(|k| match k {
            "PPP_SECRET_BACKEND" => Some("file".into()),
            "PPP_AGE_IDENTITY" => Some("/k/id.txt".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(s, Settings { backend: Some(Backend::File), age_identity: Some("/k/id.txt".into()) });
        assert_eq!(Settings::resolve(|_| Some("".into())).unwrap(), Settings::default());
        let err = Settings::resolve(|k| (k == "PPP_SECRET_BACKEND").then(|| "vault".into())).unwrap_err();
        let (text, _) = crate::error::render(&err);
        assert!(text.starts_with("error: `PPP_SECRET_BACKEND` is `vault`"), "{text}");
        assert!(text.contains("hint: use `keychain` or `file`"), "{text}");
    }

    fn entry(name: &str, hosts: &[&str], header: Option<&str>) -> Entry {
        Entry {
            scope: Scope::Global,
            name: name.to_owned(),
            kind: Kind::Service,
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            header: header.map(str::to_owned),
            placeholder: None,
            env: None,
            backend: Backend::File,
            created_at: OffsetDateTime::UNIX_EPOCH,
            command: None,
            refresh: None,
        }
    }

    #[test]
    fn entry_header_for() {
        let v = Value::new("tok".to_owned());
        let got = |e: &Entry, host: &str| e.header_for(host, &v).map(|(n, v)| format!("{n}: {}", v.expose()));

        let usai = entry("usai", &["api.gsa.usai.gov"], Some("authorization: Bearer"));
        assert_eq!(got(&usai, "api.gsa.usai.gov").unwrap(), "authorization: Bearer tok");
        assert_eq!(got(&usai, "API.GSA.USAI.GOV.").unwrap(), "authorization: Bearer tok");
        assert_eq!(got(&usai, "evil.example"), None);

        let raw = entry("corp", &["llm.corp.example"], Some("X-Key"));
        assert_eq!(got(&raw, "llm.corp.example").unwrap(), "x-key: tok");

        // A built-in with the user's own hosts keeps its header, and github's
        // git host keeps Basic auth.
        let gh = entry("github", &["github.com", "ghe.corp.example"], Some("authorization: Bearer"));
        assert_eq!(got(&gh, "ghe.corp.example").unwrap(), "authorization: Bearer tok");
        assert_eq!(got(&gh, "github.com").unwrap(), "authorization: Basic eC1hY2Nlc3MtdG9rZW46dG9r");
        assert_eq!(got(&gh, "api.github.com"), None, "hosts given replace the defaults");

        let mut custom = entry("PPP_TOKEN_X", &["a.example"], None);
        custom.kind = Kind::Custom;
        assert_eq!(got(&custom, "a.example"), None, "custom secrets are substituted, not injected");
    }

    /// The addon drops its secret cache when `secrets-index.json` changes
    /// (docs/adr/0040): every change to the store must rewrite it, even
    /// one that leaves the index's text as it was.
    #[test]
    fn every_change_rewrites_the_index() {
        use std::os::unix::fs::MetadataExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs { config: tmp.path().join("c"), data: tmp.path().join("d"), cache: tmp.path().join("k") };
        std::fs::create_dir_all(&dirs.data).unwrap();
        std::fs::create_dir_all(&dirs.config).unwrap();
        let store = Store::open_with(&dirs, &Settings { backend: Some(Backend::File), age_identity: None }).unwrap();
        let stamp = || {
            let m = std::fs::metadata(dirs.secrets_index()).unwrap();
            (m.ino(), m.mtime_nsec(), m.mtime(), m.size())
        };
        let v = |s: &str| Value::new(s.to_owned());
        let red = Scope::Sandbox("red".into());
        let hosts = ["a.example".to_owned()];
        store.set_service(&Scope::Global, "anthropic", &[], &v("k1")).unwrap();
        let mut last = stamp();
        let mut changed = |what: &str| {
            let now = stamp();
            assert_ne!(now, last, "{what} left the index as it was");
            last = now;
        };
        store.set_service(&Scope::Global, "anthropic", &[], &v("k1")).unwrap();
        changed("setting the same value again");
        store.set_service(&red, "anthropic", &[], &v("k2")).unwrap();
        changed("a sandbox's key");
        store.set_custom(&Scope::Global, "PPP_TOKEN_A", &hosts, None, &v("c1")).unwrap();
        changed("a custom secret");
        store.set_custom(&Scope::Global, "PPP_TOKEN_A", &hosts, None, &v("c2")).unwrap();
        changed("a rotated custom secret");
        assert!(store.remove(&red, "anthropic", Kind::Service).unwrap());
        changed("a removal");
        store.set_custom(&red, "PPP_TOKEN_B", &hosts, None, &v("c3")).unwrap();
        changed("a sandbox's custom secret");
        let lock = Lock::acquire(&dirs.state_lock()).unwrap();
        assert_eq!(store.remove_scope(&red, &lock).unwrap(), 1);
        changed("removing a sandbox's secrets");
    }

    /// Only the injection path runs a secret's command: listing, `get`
    /// (diagnose's redaction) and `is_set` (a kit's check) never do. A 401
    /// drops the value at most once per `STALE_MIN`.
    #[test]
    fn only_injection_runs_a_secret_command() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs { config: tmp.path().join("c"), data: tmp.path().join("d"), cache: tmp.path().join("k") };
        std::fs::create_dir_all(&dirs.data).unwrap();
        let store = Store::open_with(&dirs, &Settings { backend: Some(Backend::File), age_identity: None }).unwrap();
        let runs = tmp.path().join("runs");
        let script = format!("echo x >> {}; wc -l < {} | tr -d ' ' | sed 's/^/tok-/'", runs.display(), runs.display());
        let argv = vec!["/bin/sh".to_owned(), "-c".to_owned(), script];
        let source = Source::Command { argv, refresh: std::time::Duration::from_secs(3600) };
        store.set_service_from(&Scope::Global, "anthropic", &[], None, source).unwrap();
        let count = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
        assert!(store.is_set(Some("red"), "anthropic").unwrap());
        assert!(store.get(&Scope::Global, "anthropic", Kind::Service).unwrap().is_none());
        assert_eq!(store.list().unwrap()[0].command.as_ref().unwrap()[0], "/bin/sh");
        assert_eq!(count(), 0, "nothing ran yet");
        let inject = || store.header_for_host(Some("red"), "api.anthropic.com").unwrap().unwrap();
        let first = inject();
        assert_eq!(first.value.expose(), "tok-1");
        assert!(first.ttl.is_some_and(|t| t.as_secs() > 3590));
        assert_eq!(inject().value.expose(), "tok-1", "cached");
        assert_eq!(store.stale(Some("red"), "api.anthropic.com").unwrap(), 1);
        assert_eq!(inject().value.expose(), "tok-2");
        for _ in 0..5 {
            assert_eq!(store.stale(Some("red"), "api.anthropic.com").unwrap(), 0, "rate-limited");
            assert_eq!(inject().value.expose(), "tok-2");
        }
        assert_eq!(store.stale(None, "evil.example").unwrap(), 0);
        assert_eq!(count(), 2);
    }

    #[test]
    fn typed_errors_survive_context() {
        let err = anyhow::Error::new(fail("dbus said no"))
            .context(Error::KeychainUnavailable)
            .context("could not read secret `x`");
        assert!(is_unavailable(&err));
        let err = anyhow::Error::new(fail("x")).context(Error::Keychain);
        assert!(!is_unavailable(&err));
        assert!(!is_unavailable(&anyhow::anyhow!("other")));
    }
}

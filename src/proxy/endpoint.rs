//! Where a guest's WireGuard client sends its datagrams: the host's
//! mitmdump as the guest sees it. Decided per podman machine provider,
//! overridable by `PPP_ENDPOINT_HOST` and `wireguard.endpoint_host` in
//! config.yaml (in that order), and shown by `ppp diagnose`. Pure: the
//! caller reads the environment and the config file.
//!
//! Every provider of podman 5.4 puts gvproxy between the guest and the host
//! (read in podman's `pkg/machine`): qemu through a unix socket
//! (`-netdev stream`), applehv and libkrun through vfkit/krunkit's
//! unixgram, hyperv through a Hyper-V vsock. gvproxy answers the guest at
//! its host alias `192.168.127.254` and NATs it to the host's `127.0.0.1`,
//! where mitmdump listens by default (ADR 0018). WSL is the exception: its
//! guest sits on WSL's own NAT, where the host's loopback is out of reach,
//! unless the machine has user-mode networking (gvproxy again). ppp creates
//! WSL machines with `--user-mode-networking` for that reason (see
//! [`crate::podman::needs_user_mode_networking`]), so the alias holds there
//! too.

use std::fmt::Write as _;
use std::net::IpAddr;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::error::fail;

/// gvproxy's host alias: the host as every podman machine guest sees it.
pub const GVPROXY_HOST_ALIAS: &str = "192.168.127.254";

/// The endpoint host in use, and what decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// An IP address, written into the guest's `wg0.conf` as the `Endpoint`.
    pub host: String,
    /// `env PPP_ENDPOINT_HOST`, `config.yaml wireguard.endpoint_host`, or
    /// `provider <name>`.
    pub source: String,
}

/// The provider's own endpoint host: gvproxy's alias on qemu, applehv,
/// libkrun, hyperv and (with user-mode networking) wsl. A provider ppp does
/// not know yet (a podman newer than ppp) gets the alias too: podman has no
/// other path from a guest to the host today. One function, so that a
/// provider that differs has one place to say so.
pub fn default_for(_provider: &str) -> &'static str {
    GVPROXY_HOST_ALIAS
}

/// The endpoint host for `provider`: `env` (the value of
/// `PPP_ENDPOINT_HOST`, if set) wins over `config` (config.yaml), which wins
/// over the provider's default. A value that is not an IP address is an
/// error: WireGuard resolves a name once, at `wg setconf`, through whatever
/// DNS the guest has before the tunnel is up.
pub fn resolve(provider: &str, env: Option<&str>, config: Option<IpAddr>) -> Result<Endpoint> {
    if let Some(text) = env.map(str::trim).filter(|t| !t.is_empty()) {
        let ip: IpAddr = text.parse().map_err(|_| {
            anyhow::Error::new(fail(format!("`{text}` is not an IP address"))).context(
                fail(format!("could not read `{}`", crate::env::PPP_ENDPOINT_HOST)).hint(format!(
                    "set `{}` to the address the VM reaches the host at, e.g. {GVPROXY_HOST_ALIAS}, or unset it",
                    crate::env::PPP_ENDPOINT_HOST
                )),
            )
        })?;
        return Ok(Endpoint { host: ip.to_string(), source: format!("env {}", crate::env::PPP_ENDPOINT_HOST) });
    }
    if let Some(ip) = config {
        return Ok(Endpoint { host: ip.to_string(), source: "config.yaml wireguard.endpoint_host".to_owned() });
    }
    Ok(Endpoint { host: default_for(provider).to_owned(), source: format!("provider {provider}") })
}

/// `resolve` with the process's own `PPP_ENDPOINT_HOST` and the config
/// file's `wireguard.endpoint_host`.
pub fn current(dirs: &crate::dirs::Dirs, provider: &str) -> Result<Endpoint> {
    let env = std::env::var(crate::env::PPP_ENDPOINT_HOST).ok();
    let config = crate::config::load(dirs)?.wireguard.endpoint_host;
    resolve(provider, env.as_deref(), config)
}

/// `wg0.conf` with its `Endpoint` host replaced by `host` (the port is
/// kept). The daemon renders the file with gvproxy's alias; the command
/// that provisions a machine knows its provider and the overrides.
pub fn rewrite(wg0: &str, host: &str) -> String {
    let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_owned() };
    let mut out = String::with_capacity(wg0.len());
    for line in wg0.lines() {
        match line.split_once('=') {
            Some((key, value)) if key.trim() == "Endpoint" => {
                let port = value.trim().rsplit_once(':').map_or("", |(_, p)| p);
                let _ = write!(out, "Endpoint = {host}:{port}");
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_podman_provider_reaches_the_host_through_gvproxy() {
        for p in ["qemu", "applehv", "libkrun", "hyperv", "wsl", "QEMU", "something-new"] {
            assert_eq!(default_for(p), "192.168.127.254", "{p}");
        }
    }

    #[test]
    fn env_beats_config_beats_provider() {
        let cfg: Option<IpAddr> = Some("10.9.8.7".parse().unwrap());
        let e = resolve("qemu", Some("172.20.0.1"), cfg).unwrap();
        assert_eq!((e.host.as_str(), e.source.as_str()), ("172.20.0.1", "env PPP_ENDPOINT_HOST"));
        let e = resolve("qemu", None, cfg).unwrap();
        assert_eq!((e.host.as_str(), e.source.as_str()), ("10.9.8.7", "config.yaml wireguard.endpoint_host"));
        // An empty variable counts as unset.
        let e = resolve("hyperv", Some(" "), None).unwrap();
        assert_eq!((e.host.as_str(), e.source.as_str()), ("192.168.127.254", "provider hyperv"));
        let e = resolve("qemu", Some("fd00::1"), None).unwrap();
        assert_eq!(e.host, "fd00::1");
    }

    #[test]
    fn a_name_is_refused_with_a_hint() {
        let err = resolve("qemu", Some("host.containers.internal"), None).unwrap_err();
        let (text, _) = crate::error::render(&err);
        assert!(text.contains("`host.containers.internal` is not an IP address"), "{text}");
        assert!(text.contains("PPP_ENDPOINT_HOST"), "{text}");
        assert!(text.contains("hint:"), "{text}");
    }

    #[test]
    fn rewrite_keeps_the_port_and_everything_else() {
        let conf = "[Interface]\nPrivateKey = k\nAddress = 10.0.0.2/32\nTable = off\n\n[Peer]\n\
                    PublicKey = p\nAllowedIPs = 0.0.0.0/0\nEndpoint = 192.168.127.254:51821\n";
        let out = rewrite(conf, "10.1.2.3");
        assert_eq!(out, conf.replace("192.168.127.254:51821", "10.1.2.3:51821"));
        assert!(rewrite(conf, "fd00::1").contains("Endpoint = [fd00::1]:51821\n"));
        assert_eq!(rewrite(conf, "192.168.127.254"), conf);
    }
}

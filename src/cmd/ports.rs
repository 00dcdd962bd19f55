//! `ppp ports`: list, publish and unpublish ports from a sandbox's agent
//! container to the host. Published ports are kept in sandbox.json and go
//! on the agent container's command line (`-p`, rendered by the sandbox
//! lifecycle) every time it starts; podman machine forwards a container's
//! published ports to the host.

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::PortsArgs;
use crate::error::fail;
use crate::sandbox::{self, Published};
use crate::{output, state};

/// A parsed `[[HOST_IP:]HOST_PORT:]SANDBOX_PORT[/PROTOCOL]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub host_ip: Option<IpAddr>,
    pub host_port: Option<u16>,
    pub sandbox_port: u16,
    pub protocol: String,
}

const PROTOCOLS: &[&str] = &["tcp", "tcp4", "tcp6", "udp", "udp4", "udp6"];

/// Parse a publish spec; the error says which part is wrong.
pub fn parse_spec(text: &str) -> Result<Spec> {
    let bad = |why: String| -> anyhow::Error {
        fail(format!("invalid port spec `{text}`: {why}"))
            .hint("use `[[HOST_IP:]HOST_PORT:]SANDBOX_PORT[/PROTOCOL]`, e.g. `8080:3000` or `127.0.0.1:8080:3000/tcp`")
            .code(2)
            .into()
    };
    let (addr, protocol) = match text.rsplit_once('/') {
        Some((a, p)) => (a, p.to_ascii_lowercase()),
        None => (text, "tcp".to_owned()),
    };
    if !PROTOCOLS.contains(&protocol.as_str()) {
        return Err(bad(format!("unknown protocol `{protocol}` (use one of {})", PROTOCOLS.join(", "))));
    }
    let port = |p: &str, what: &str| -> Result<u16> {
        p.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(|| bad(format!("{what} `{p}` is not a port (1-65535)")))
    };
    // An IPv6 host address is bracketed: `[::1]:8080:3000`.
    let (host_ip, rest) = if let Some(r) = addr.strip_prefix('[') {
        let (ip, rest) = r.split_once("]:").ok_or_else(|| bad("unclosed `[`".into()))?;
        (Some(ip.parse::<IpAddr>().map_err(|_| bad(format!("`{ip}` is not an IP address")))?), rest)
    } else {
        let parts: Vec<&str> = addr.split(':').collect();
        match parts.len() {
            1 | 2 => (None, addr),
            3 => (
                Some(parts[0].parse::<IpAddr>().map_err(|_| bad(format!("`{}` is not an IP address", parts[0])))?),
                &addr[parts[0].len() + 1..],
            ),
            _ => return Err(bad("too many `:`".into())),
        }
    };
    let (host_port, sandbox_port) = match rest.split_once(':') {
        Some((h, s)) => (Some(port(h, "host port")?), port(s, "sandbox port")?),
        None => (None, port(rest, "sandbox port")?),
    };
    Ok(Spec { host_ip, host_port, sandbox_port, protocol })
}

impl Spec {
    /// Whether `p` is what this spec names (for `--unpublish`): the sandbox
    /// port and protocol, and the host side where given.
    fn matches(&self, p: &Published) -> bool {
        p.sandbox_port == self.sandbox_port
            && p.protocol == self.protocol
            && self.host_port.is_none_or(|h| h == p.host_port)
            && self.host_ip.is_none_or(|ip| p.host_ip.as_deref() == Some(&ip.to_string()))
    }
}

/// A free host port on `ip` for `protocol`, from the kernel.
fn ephemeral(ip: IpAddr, protocol: &str) -> Result<u16> {
    let port = if protocol.starts_with("udp") {
        std::net::UdpSocket::bind((ip, 0))?.local_addr()?.port()
    } else {
        std::net::TcpListener::bind((ip, 0))?.local_addr()?.port()
    };
    Ok(port)
}

/// Whether another program already holds `ip:port`. Checked now because
/// podman would only fail when the agent next starts, far from the command
/// that caused it. Only "in use" counts: a privileged port refused to a
/// normal user may still work for podman's port forwarder.
fn in_use(ip: IpAddr, port: u16, protocol: &str) -> bool {
    let bound = if protocol.starts_with("udp") {
        std::net::UdpSocket::bind((ip, port)).map(drop)
    } else {
        std::net::TcpListener::bind((ip, port)).map(drop)
    };
    matches!(bound, Err(e) if e.kind() == std::io::ErrorKind::AddrInUse)
}

/// Run `ppp ports`.
pub fn run(args: &PortsArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let publish: Vec<Spec> = args.publish.iter().map(|s| parse_spec(s)).collect::<Result<_>>()?;
    let unpublish: Vec<Spec> = args.unpublish.iter().map(|s| parse_spec(s)).collect::<Result<_>>()?;
    let unknown = || fail(format!("no sandbox named `{}`", args.sandbox)).hint("list sandboxes with `ppp ls`").code(2);
    let rec = if publish.is_empty() && unpublish.is_empty() {
        sandbox::load(dirs, &args.sandbox)?.ok_or_else(unknown)?
    } else {
        let _lock = state::Lock::acquire(&dirs.state_lock())?;
        let mut rec = sandbox::load(dirs, &args.sandbox)?.ok_or_else(unknown)?;
        for u in &unpublish {
            let before = rec.published.len();
            rec.published.retain(|p| !u.matches(p));
            if rec.published.len() == before {
                return Err(fail(format!("`{}` publishes nothing matching that spec", rec.name))
                    .hint(format!("see `ppp ports {}`", rec.name))
                    .code(2)
                    .into());
            }
        }
        for p in &publish {
            let ip = p.host_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
            let host_port = match p.host_port {
                Some(h) => h,
                None => ephemeral(ip, &p.protocol)?,
            };
            let entry = Published {
                host_ip: Some(ip.to_string()),
                host_port,
                sandbox_port: p.sandbox_port,
                protocol: p.protocol.clone(),
            };
            if let Some(clash) = rec.published.iter().find(|q| q.host_port == host_port && q.protocol == entry.protocol)
            {
                return Err(fail(format!("host port {host_port}/{} is already published as {clash}", entry.protocol))
                    .hint(format!(
                        "remove it first with `ppp ports {} --unpublish {}:{}/{}`",
                        rec.name, clash.host_port, clash.sandbox_port, clash.protocol
                    ))
                    .code(2)
                    .into());
            }
            if p.host_port.is_some() && in_use(ip, host_port, &entry.protocol) {
                return Err(fail(format!(
                    "host port {host_port}/{} on {ip} is already in use by another program",
                    entry.protocol
                ))
                .hint(format!(
                    "choose another host port, or give only the sandbox port to get a free one: `ppp ports {} --publish {}`",
                    rec.name, p.sandbox_port
                ))
                .into());
            }
            rec.published.push(entry);
        }
        sandbox::save_locked(dirs, &rec)?;
        if !args.json {
            eprintln!("ppp: published ports apply when the agent next starts (`ppp run --name {}`)", rec.name);
        }
        rec
    };
    if args.json {
        output::json(&rec.published)?;
    } else if rec.published.is_empty() {
        output::println(&format!("`{}` publishes no ports", rec.name))?;
    } else {
        let rows: Vec<Vec<String>> = rec
            .published
            .iter()
            .map(|p| {
                vec![
                    p.host_ip.clone().unwrap_or_else(|| "127.0.0.1".into()),
                    p.host_port.to_string(),
                    p.sandbox_port.to_string(),
                    p.protocol.clone(),
                ]
            })
            .collect();
        output::print(&output::table(&["HOST IP", "HOST PORT", "SANDBOX PORT", "PROTOCOL"], &rows))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let s = parse_spec("3000").unwrap();
        assert_eq!((s.host_ip, s.host_port, s.sandbox_port, s.protocol.as_str()), (None, None, 3000, "tcp"));
        let s = parse_spec("8080:3000/udp").unwrap();
        assert_eq!((s.host_port, s.sandbox_port, s.protocol.as_str()), (Some(8080), 3000, "udp"));
        let s = parse_spec("0.0.0.0:8080:3000/tcp6").unwrap();
        assert_eq!(s.host_ip, Some("0.0.0.0".parse().unwrap()));
        let s = parse_spec("[::1]:8080:3000").unwrap();
        assert_eq!(s.host_ip, Some("::1".parse().unwrap()));
        for (bad, why) in [
            ("0", "is not a port"),
            ("70000", "is not a port"),
            ("8080:x", "sandbox port `x`"),
            ("3000/sctp", "unknown protocol `sctp`"),
            ("nope:1:2", "`nope` is not an IP address"),
            ("1:2:3:4", "too many"),
        ] {
            let err = parse_spec(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}

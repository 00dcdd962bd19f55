//! What `ppp policy check` evaluates: one destination, written the way a
//! user would type it. Owns that small grammar; the engine takes the parts.

use std::fmt;
use std::net::IpAddr;

use serde::Serialize;

use super::ResourceError;

/// A destination to check: a host name or an address, and a port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    /// Lower-case, no trailing dot. `None` when the target is an address.
    pub host: Option<String>,
    pub ip: Option<IpAddr>,
    pub port: u16,
}

/// What a target's port is when it has none: flows are HTTPS by default.
pub const DEFAULT_PORT: u16 = 443;

fn err(m: String) -> ResourceError {
    ResourceError::new(m)
}

impl Target {
    /// `host[:port]`, `ip[:port]`, `[ipv6]:port`, `[ipv6]` or a bare IPv6
    /// address. The port defaults to 443.
    pub fn parse(s: &str) -> Result<Target, ResourceError> {
        if s.is_empty() {
            return Err(err("target is empty".into()));
        }
        if s.chars().any(char::is_whitespace) {
            return Err(err(format!("`{}` contains whitespace", s.escape_debug())));
        }
        if let Some((scheme, _)) = s.split_once("://") {
            return Err(err(format!("`{s}` is a URL, not a target"))
                .with_hint(format!("drop `{scheme}://` and any path, e.g. `example.com` or `example.com:8080`")));
        }
        let ip_only = |ip: IpAddr, port| Target { host: None, ip: Some(ip.to_canonical()), port };
        if let Some(rest) = s.strip_prefix('[') {
            let (inner, after) = rest.split_once(']').ok_or_else(|| err(format!("`{s}` has no closing `]`")))?;
            let ip: std::net::Ipv6Addr =
                inner.parse().map_err(|_| err(format!("`{inner}` is not a valid IPv6 address")))?;
            let port = match after {
                "" => DEFAULT_PORT,
                _ => port(s, after.strip_prefix(':').ok_or_else(|| err(format!("`{s}` has text after `]`")))?)?,
            };
            return Ok(ip_only(IpAddr::V6(ip), port));
        }
        if s.bytes().filter(|&b| b == b':').count() > 1 {
            let ip: std::net::Ipv6Addr = s.parse().map_err(|_| {
                err(format!("`{s}` is not a valid IPv6 address"))
                    .with_hint("an IPv6 address with a port is written in brackets, e.g. `[2001:db8::1]:443`")
            })?;
            return Ok(ip_only(IpAddr::V6(ip), DEFAULT_PORT));
        }
        let (host, port) = match s.split_once(':') {
            Some((h, p)) => (h, port(s, p)?),
            None => (s, DEFAULT_PORT),
        };
        if host.is_empty() {
            return Err(err(format!("`{s}` has no host")));
        }
        if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            let ip: std::net::Ipv4Addr =
                host.parse().map_err(|_| err(format!("`{host}` is not a valid IPv4 address")))?;
            return Ok(ip_only(IpAddr::V4(ip), port));
        }
        // A target is a concrete host: reuse the resource grammar's checks
        // and refuse anything that came out as a pattern.
        let h = host.strip_suffix('.').unwrap_or(host);
        if h.contains(['*', '?']) || h.contains(super::resource::REGEX_META) {
            return Err(err(format!("`{s}` is a pattern, not a host"))
                .with_hint("check a concrete host such as `api.example.com`"));
        }
        let r = super::Resource::parse(host)
            .map_err(|e| err(e.message().replace(&format!("`{host}`"), &format!("`{s}`"))))?;
        if r.kind() != super::ResourceKind::Host {
            return Err(err(format!("`{s}` is not a host or an address")));
        }
        Ok(Target { host: Some(r.to_string()), ip: None, port })
    }
}

fn port(orig: &str, p: &str) -> Result<u16, ResourceError> {
    if p.is_empty() {
        return Err(err(format!("`{orig}` has an empty port")));
    }
    match p.parse::<u32>() {
        _ if !p.bytes().all(|b| b.is_ascii_digit()) => Err(err(format!("port `{p}` in `{orig}` is not a number"))),
        Ok(n @ 1..=65535) => Ok(u16::try_from(n).expect("range checked")),
        _ => Err(err(format!("port `{p}` in `{orig}` is out of range")).with_hint("ports run from 1 to 65535")),
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, self.ip) {
            (Some(h), _) => write!(f, "{h}:{}", self.port),
            (None, Some(IpAddr::V6(a))) => write!(f, "[{a}]:{}", self.port),
            (None, Some(a)) => write!(f, "{a}:{}", self.port),
            (None, None) => write!(f, ":{}", self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        Target::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn forms() {
        let host = |h: &str, port| Target { host: Some(h.into()), ip: None, port };
        let ip = |a: &str, port| Target { host: None, ip: Some(a.parse().unwrap()), port };
        assert_eq!(t("Example.COM."), host("example.com", 443));
        assert_eq!(t("example.com:80"), host("example.com", 80));
        assert_eq!(t("localhost"), host("localhost", 443));
        assert_eq!(t("10.0.0.1"), ip("10.0.0.1", 443));
        assert_eq!(t("10.0.0.1:22"), ip("10.0.0.1", 22));
        assert_eq!(t("2001:db8::1"), ip("2001:db8::1", 443));
        assert_eq!(t("[2001:db8::1]:8443"), ip("2001:db8::1", 8443));
        assert_eq!(t("[2001:db8::1]"), ip("2001:db8::1", 443));
        assert_eq!(t("::ffff:10.0.0.1"), ip("10.0.0.1", 443));
        assert_eq!(t("[2001:db8::1]:8443").to_string(), "[2001:db8::1]:8443");
        assert_eq!(t("Example.com").to_string(), "example.com:443");
    }

    #[test]
    fn errors() {
        let cases = [
            ("", "target is empty"),
            ("a b", "`a b` contains whitespace"),
            ("example.com:", "`example.com:` has an empty port"),
            ("example.com:0", "port `0` in `example.com:0` is out of range"),
            ("example.com:x", "port `x` in `example.com:x` is not a number"),
            ("http://x.com", "`http://x.com` is a URL, not a target"),
            ("a..b:80", "`a..b:80` has an empty label"),
            ("*.example.com", "`*.example.com` is a pattern, not a host"),
            ("1.2.3.999", "`1.2.3.999` is not a valid IPv4 address"),
            ("[::1", "`[::1` has no closing `]`"),
            ("[zz::1]:80", "`zz::1` is not a valid IPv6 address"),
            ("[::1]x", "`[::1]x` has text after `]`"),
            ("2001:db8::1::2", "`2001:db8::1::2` is not a valid IPv6 address"),
            (":80", "`:80` has no host"),
            ("10.0.0.0/8", "`10.0.0.0/8` is not a host or an address"),
            ("**", "`**` is a pattern, not a host"),
        ];
        for (s, want) in cases {
            assert_eq!(Target::parse(s).unwrap_err().to_string(), want, "{s}");
        }
    }
}

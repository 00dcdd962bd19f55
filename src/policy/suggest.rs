//! `ppp policy suggest`: the least policy that allows what a sandbox was
//! seen to use, from its flow records. Pure: records in, rules and YAML
//! out, the same output for the same records (ids are derived from the
//! resource, times from the records).
//!
//! What goes in: allowed flows only (under learning that is everything no
//! deny rule or defence refused), not `builtin:` ones (ppp serves those
//! itself). Each destination becomes an exact rule:
//! - a name: `host:port` for every port it was seen on, plus `host:53`,
//!   because ppp's resolver decides a name's DNS questions on port 53 (a
//!   logged question counts there; the rule is added for a name used
//!   without one too, e.g. in a log written before questions were) (`--any-port`: one `host` rule);
//! - an address with no name, or the internal address a name went to
//!   (internal addresses need an address rule of their own): `ip:port`.
//!
//! The guest chose every name in the log, so a name becomes a rule only if
//! it parses as one exact host: never a wildcard, glob or regex (a logged
//! `**` must not become "allow everything").
//!
//! `--collapse` turns two or more siblings (`a.example.com`,
//! `b.example.com`) into `*.example.com`, only where the parent is itself
//! at or below a registrable domain by the public-suffix list: never
//! `*.com`, `*.co.uk`, `*.github.io`. Hosts a key was injected for stay
//! exact.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use anyhow::Result;
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

use super::record::Record;
use super::{GlobalFile, Resource, ResourceKind, Rule, RuleType, SandboxFile, Source, Verdict};

/// What `suggest` was asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Collapse siblings into `*.parent` where the public-suffix list allows.
    pub collapse: bool,
    /// One rule per host, any port.
    pub any_port: bool,
}

/// How often and when a destination was seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    pub count: u64,
    pub first: Option<OffsetDateTime>,
    pub last: Option<OffsetDateTime>,
    pub ports: BTreeSet<u16>,
    pub kinds: BTreeSet<String>,
    /// A key was injected into a request to it.
    pub injected: bool,
    /// Flows allowed because the sandbox was learning (not by a rule).
    pub learned: u64,
    /// The hosts a collapsed rule stands for.
    pub hosts: BTreeSet<String>,
}

impl Seen {
    fn add(&mut self, r: &Record<'_>, port: Option<u16>) {
        self.count += 1;
        if let Some(t) = r.time() {
            self.first = Some(self.first.map_or(t, |f| f.min(t)));
            self.last = Some(self.last.map_or(t, |l| l.max(t)));
        }
        self.ports.extend(port);
        if let Some(k) = r.kind.as_deref() {
            // Bounded: a kind is the addon's word, and at most a few exist.
            if self.kinds.len() < 8 {
                self.kinds.insert(k.to_owned());
            }
        }
        self.injected |= r.injected == Some(true);
        self.learned += u64::from(r.matched_rule.as_deref() == Some(super::LEARNED));
    }

    fn merge(&mut self, o: &Seen) {
        self.count += o.count;
        self.first = [self.first, o.first].into_iter().flatten().min();
        self.last = [self.last, o.last].into_iter().flatten().max();
        self.ports.extend(&o.ports);
        self.kinds.extend(o.kinds.iter().cloned());
        self.injected |= o.injected;
        self.learned += o.learned;
        self.hosts.extend(o.hosts.iter().cloned());
    }
}

/// One suggested rule and what it was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suggestion {
    pub resource: Resource,
    pub seen: Seen,
    /// The `host:53` rule that lets the name be resolved.
    pub dns: bool,
}

/// The records folded into destinations.
#[derive(Debug, Default)]
pub struct Grouper {
    hosts: BTreeMap<String, Seen>,
    addrs: BTreeMap<IpAddr, Seen>,
    /// Allowed flows whose name cannot be an exact rule.
    pub skipped: u64,
    /// Flows read (allowed or not).
    pub flows: u64,
}

impl Grouper {
    /// Fold one record in.
    pub fn add(&mut self, r: &Record<'_>) {
        self.flows += 1;
        if r.decision != Verdict::Allow || r.matched_rule.as_deref().is_some_and(|m| m.starts_with("builtin:")) {
            return;
        }
        // A DNS question is decided by its name on port 53 (whatever port
        // the guest sent to); its logged address is ppp's resolver, never
        // a destination to allow.
        let dns = r.kind.as_deref() == Some("dns");
        let addr = if dns { None } else { r.addr().map(|a| a.to_canonical()) };
        let port = if dns { Some(53) } else { r.port };
        let name = r.host.as_deref().filter(|h| super::is_name(h));
        if let Some(h) = name {
            let Some(host) = exact_host(h) else {
                self.skipped += 1;
                return;
            };
            self.hosts.entry(host).or_default().add(r, port);
            // A name on an internal address (or one of the host's own) got
            // through only by an address rule: the suggestion needs it too.
            if let Some(a) = addr.filter(|a| super::is_internal(*a) || r.local == Some(true)) {
                self.addrs.entry(a).or_default().add(r, port);
            }
            return;
        }
        // No name, or an address literal in its place.
        let literal = r.host.as_deref().and_then(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().ok());
        for a in [literal.map(|a| a.to_canonical()), addr].into_iter().flatten().collect::<BTreeSet<_>>() {
            self.addrs.entry(a).or_default().add(r, r.port);
        }
    }

    /// The suggested rules, in a stable order: names (by registrable
    /// domain, then name), then addresses.
    #[must_use]
    pub fn finish(self, opts: Options) -> Vec<Suggestion> {
        let mut hosts: BTreeMap<String, Seen> = self.hosts;
        for (h, s) in &mut hosts {
            s.hosts.insert(h.clone());
        }
        let mut named: Vec<(String, Seen)> = Vec::new();
        if opts.collapse {
            // Siblings by parent: `a.b.example.com` is a child of `b.example.com`.
            let mut by_parent: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (h, s) in &hosts {
                if let Some(parent) = collapsible_parent(h)
                    && !s.injected
                {
                    by_parent.entry(parent.to_owned()).or_default().push(h.clone());
                }
            }
            for (parent, children) in by_parent {
                if children.len() < 2 {
                    continue;
                }
                let mut seen = Seen::default();
                for c in &children {
                    if let Some(s) = hosts.remove(c) {
                        seen.merge(&s);
                    }
                }
                named.push((format!("*.{parent}"), seen));
            }
        }
        named.extend(hosts);
        named.sort_by(|a, b| {
            let key = |h: &str| registrable(h.trim_start_matches("*.")).to_owned();
            (key(&a.0), a.0.trim_start_matches("*."), &a.0).cmp(&(key(&b.0), b.0.trim_start_matches("*."), &b.0))
        });
        let mut out = Vec::new();
        for (name, seen) in named {
            let rules: Vec<(String, bool)> = if opts.any_port || seen.ports.is_empty() {
                vec![(name.clone(), false)]
            } else {
                let mut v: Vec<(String, bool)> = seen.ports.iter().map(|p| (format!("{name}:{p}"), false)).collect();
                if !seen.ports.contains(&53) {
                    v.push((format!("{name}:53"), true));
                }
                v
            };
            for (text, dns) in rules {
                if let Ok(resource) = Resource::parse(&text) {
                    out.push(Suggestion { resource, seen: seen.clone(), dns });
                }
            }
        }
        for (addr, seen) in self.addrs {
            let base = if addr.is_ipv6() { format!("[{addr}]") } else { addr.to_string() };
            let texts: Vec<String> = if opts.any_port || seen.ports.is_empty() {
                vec![addr.to_string()]
            } else {
                seen.ports.iter().map(|p| format!("{base}:{p}")).collect()
            };
            for text in texts {
                if let Ok(resource) = Resource::parse(&text) {
                    out.push(Suggestion { resource, seen: seen.clone(), dns: false });
                }
            }
        }
        out
    }
}

/// `h` as one exact host rule's text (lower case, no trailing dot), or
/// `None` when the guest's name would parse as anything wider.
fn exact_host(h: &str) -> Option<String> {
    let r = Resource::parse(h).ok()?;
    (r.kind() == ResourceKind::Host && r.port().is_none()).then(|| r.to_string())
}

/// The registrable domain of `host` by the public-suffix list
/// (`a.b.example.co.uk` → `example.co.uk`), or `host` itself when it has
/// none (a public suffix, a one-label name).
#[must_use]
pub fn registrable(host: &str) -> &str {
    match psl::domain(host.as_bytes()) {
        Some(d) => {
            let n = d.as_bytes().len();
            &host[host.len() - n..]
        }
        None => host,
    }
}

/// The parent `*.parent` may stand on for `host`: `host` without its first
/// label, when that is itself a registrable domain or below one. `None` for
/// `example.com` (parent `com`), `a.co.uk`, `user.github.io`.
#[must_use]
pub fn collapsible_parent(host: &str) -> Option<&str> {
    let (_, parent) = host.split_once('.')?;
    let domain = psl::domain(parent.as_bytes())?;
    // `domain` is a suffix of `parent`, so `parent` is at or below it.
    (domain.as_bytes().len() <= parent.len()).then_some(parent)
}

/// A rule id that depends only on the resource and where the file is for,
/// so the same records give the same file.
fn stable_id(scope: &str, resource: &Resource) -> uuid::Uuid {
    let digest = Sha256::digest(format!("ppp-suggest\0{scope}\0{resource}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.replace_nanosecond(0)
        .unwrap_or(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "?".to_owned())
}

/// One comment line saying how the rule was seen.
fn comment(s: &Suggestion) -> String {
    let mut c = String::new();
    if s.dns {
        c.push_str("# DNS for the name: ppp's resolver decides a name's questions on port 53\n");
        return c;
    }
    let _ = write!(c, "# {} flow{}", s.seen.count, if s.seen.count == 1 { "" } else { "s" });
    if s.seen.learned > 0 {
        let _ = write!(c, " ({} learned)", s.seen.learned);
    }
    if let (Some(f), Some(l)) = (s.seen.first, s.seen.last) {
        let _ = write!(c, ", first {}, last {}", rfc3339(f), rfc3339(l));
    }
    if !s.seen.kinds.is_empty() {
        let kinds: Vec<&str> = s.seen.kinds.iter().map(String::as_str).collect();
        let _ = write!(c, ", {}", kinds.join(" "));
    }
    if s.seen.injected {
        c.push_str(", secret injected");
    }
    c.push('\n');
    if s.seen.hosts.len() > 1 {
        let hosts: Vec<&str> = s.seen.hosts.iter().map(String::as_str).collect();
        let _ = writeln!(c, "# collapsed from {}", hosts.join(" "));
    }
    c
}

/// The rules, in the files' own format: `source: local`, ids from
/// [`stable_id`], `created_at` the last time the destination was seen.
#[must_use]
pub fn rules(scope: &str, suggestions: &[Suggestion]) -> Vec<Rule> {
    suggestions
        .iter()
        .map(|s| Rule {
            id: stable_id(scope, &s.resource),
            decision: Verdict::Allow,
            kind: RuleType::Network,
            resource: s.resource.clone(),
            created_at: s.seen.last.map_or(OffsetDateTime::UNIX_EPOCH, |t| t.replace_nanosecond(0).unwrap_or(t)),
            source: Source::Local,
            kit: None,
            upload: None,
            download: None,
            methods: None,
            path: None,
            // A suggestion never turns inspection off: that is a choice the
            // user makes for a host, knowing nothing is injected into it.
            inspect: true,
        })
        .collect()
}

/// The suggestion as a policy file: a sandbox's (`sandbox` given) or the
/// global one (`default: deny`), each rule after a comment saying how it
/// was seen. `header` goes on top as comment lines.
pub fn render(sandbox: Option<&str>, header: &str, suggestions: &[Suggestion]) -> Result<String> {
    let scope = sandbox.map_or_else(|| "global".to_owned(), |s| format!("sandbox:{s}"));
    let rules = rules(&scope, suggestions);
    let yaml = match sandbox {
        Some(_) => serde_norway::to_string(&SandboxFile { rules, ..SandboxFile::default() })?,
        None => serde_norway::to_string(&GlobalFile { rules, ..GlobalFile::without_file() })?,
    };
    let mut out = String::new();
    for l in header.lines() {
        let _ = writeln!(out, "# {l}");
    }
    let mut next = suggestions.iter();
    for line in yaml.lines() {
        // serde_norway writes each rule as a block item starting `- id:`.
        if line.starts_with("- id: ")
            && let Some(s) = next.next()
        {
            out.push_str(&comment(s));
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(host: Option<&str>, ip: &str, port: u16, kind: &str, extra: &str) -> String {
        let host = host.map_or("null".to_owned(), |h| format!("\"{h}\""));
        format!(
            r#"{{"sandbox":"s","timestamp":"2026-05-01T12:00:0{}Z","kind":"{kind}","host":{host},"ip":"{ip}","port":{port},"decision":"allow","matched_rule":"learned"{extra}}}"#,
            port % 10
        )
    }

    fn suggest(lines: &[String], opts: Options) -> Vec<String> {
        let mut g = Grouper::default();
        for l in lines {
            g.add(&super::super::record::parse(l.as_bytes()).unwrap());
        }
        g.finish(opts).iter().map(|s| s.resource.to_string()).collect()
    }

    #[test]
    fn exact_hosts_and_ports_with_dns_and_internal_addresses() {
        let lines = [
            rec(Some("api.example.com"), "93.184.216.34", 443, "http", ""),
            rec(Some("API.example.com."), "93.184.216.34", 443, "http", ""),
            rec(Some("api.example.com"), "93.184.216.34", 8443, "http", ""),
            // A name on an internal address passed only by an address rule.
            rec(Some("git.corp.test"), "10.1.2.3", 22, "tcp", ""),
            // No name; an IPv6 address.
            rec(None, "2001:db8::1", 443, "tcp", ""),
            // Denied and builtin flows are not what the sandbox needs.
            rec(Some("denied.example"), "93.184.216.35", 443, "http", "").replace("\"allow\"", "\"deny\""),
            rec(Some("mitm.it"), "10.0.0.1", 80, "http", "").replace("learned", "builtin:mitm.it"),
        ];
        assert_eq!(
            suggest(&lines, Options::default()),
            [
                "git.corp.test:22",
                "git.corp.test:53",
                "api.example.com:443",
                "api.example.com:8443",
                "api.example.com:53",
                "10.1.2.3:22",
                "[2001:db8::1]:443"
            ]
        );
        let any = Options { any_port: true, ..Options::default() };
        assert_eq!(suggest(&lines, any), ["git.corp.test", "api.example.com", "10.1.2.3", "2001:db8::1"]);
    }

    /// An allowed DNS question suggests `name:53` and nothing for the
    /// resolver's address it was logged with (10.0.0.53, or whatever the
    /// guest's port was); a name on one of the host's own addresses
    /// (`local`) needs its address rule too, as an internal one does.
    #[test]
    fn dns_questions_and_local_destinations() {
        let lines = [
            rec(Some("only.dns.example"), "10.0.0.53", 53, "dns", ""),
            rec(Some("odd.dns.example"), "10.0.0.53", 5353, "dns", ""),
            rec(Some("self.example.com"), "93.184.216.7", 443, "tls", r#","local":true"#),
        ];
        assert_eq!(
            suggest(&lines, Options::default()),
            [
                "odd.dns.example:53",
                "only.dns.example:53",
                "self.example.com:443",
                "self.example.com:53",
                "93.184.216.7:443"
            ]
        );
    }

    #[test]
    fn a_guest_chosen_name_never_becomes_a_wide_rule() {
        let lines = [
            rec(Some("**"), "93.184.216.34", 443, "http", ""),
            rec(Some("*.example.com"), "93.184.216.34", 443, "http", ""),
            rec(Some("^a|b$"), "93.184.216.34", 443, "http", ""),
            rec(Some("a?.example.com"), "93.184.216.34", 443, "http", ""),
            rec(Some("x.example.com:99"), "93.184.216.34", 443, "http", ""),
        ];
        let mut g = Grouper::default();
        for l in &lines {
            g.add(&super::super::record::parse(l.as_bytes()).unwrap());
        }
        assert_eq!(g.skipped, 5);
        assert!(g.finish(Options::default()).is_empty());
    }

    #[test]
    fn the_public_suffix_rule() {
        assert_eq!(registrable("a.b.example.co.uk"), "example.co.uk");
        assert_eq!(registrable("user.github.io"), "user.github.io");
        assert_eq!(registrable("api.echo.test"), "echo.test");
        assert_eq!(collapsible_parent("a.example.com"), Some("example.com"));
        assert_eq!(collapsible_parent("a.b.example.co.uk"), Some("b.example.co.uk"));
        for none in ["example.com", "example.co.uk", "user.github.io", "localhost", "a.com", "x.s3.amazonaws.com"] {
            assert_eq!(collapsible_parent(none), None, "{none}");
        }
    }

    #[test]
    fn collapse_only_siblings_below_a_registrable_domain_and_never_a_secret_host() {
        let h = |n: &str| rec(Some(n), "93.184.216.34", 443, "http", "");
        let lines = [
            h("a.example.com"),
            h("b.example.com"),
            h("example.com"),
            h("one.co.uk"),
            h("two.co.uk"),
            h("alice.github.io"),
            h("bob.github.io"),
            h("x.deep.example.org"),
            h("y.deep.example.org"),
            h("lonely.example.net"),
            rec(Some("api.secret.dev"), "93.184.216.34", 443, "http", r#","injected":true"#),
            h("www.secret.dev"),
        ];
        let opts = Options { collapse: true, any_port: true };
        assert_eq!(
            suggest(&lines, opts),
            [
                "alice.github.io",
                "bob.github.io",
                "*.example.com",
                "example.com",
                "lonely.example.net",
                "*.deep.example.org",
                "one.co.uk",
                "api.secret.dev",
                "www.secret.dev",
                "two.co.uk",
            ]
        );
        // Without --collapse every host stays exact.
        assert_eq!(suggest(&lines, Options { any_port: true, ..Options::default() }).len(), 12);
    }

    #[test]
    fn the_file_is_deterministic_and_loads_back() {
        let lines = [
            rec(Some("api.example.com"), "93.184.216.34", 443, "http", r#","injected":true"#),
            rec(Some("cdn.example.com"), "93.184.216.34", 443, "http", ""),
        ];
        let render_once = || {
            let mut g = Grouper::default();
            for l in &lines {
                g.add(&super::super::record::parse(l.as_bytes()).unwrap());
            }
            render(Some("s"), "from 2 flows", &g.finish(Options::default())).unwrap()
        };
        let text = render_once();
        assert_eq!(text, render_once());
        assert!(text.starts_with("# from 2 flows\n"), "{text}");
        assert!(text.contains("# 1 flow (1 learned), first 2026-05-01T12:00:03Z, last 2026-05-01T12:00:03Z, http, secret injected\n- id: "), "{text}");
        let f = super::super::parse_sandbox(std::path::Path::new("s.yaml"), &text).unwrap();
        let got: Vec<String> = f.rules.iter().map(|r| r.resource.to_string()).collect();
        assert_eq!(got, ["api.example.com:443", "api.example.com:53", "cdn.example.com:443", "cdn.example.com:53"]);
        assert!(!f.learn);
    }
}

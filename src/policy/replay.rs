//! `ppp policy replay`: recorded flows decided again by the one engine
//! ([`Engine::decide_flow`], what the daemon calls live) under a candidate
//! policy, and what would change. Pure: records and an engine in, counts
//! out; no second matcher, no I/O.
//!
//! What a record lets replay reproduce, and what it does not:
//! - the name, the destination address and port, the aliases its
//!   resolution went through (`chain`), and a name that did not resolve
//!   to its address (`resolved: false`): as the daemon judged them;
//! - a DNS record's question (the name, port 53, no address: the logged
//!   `ip` is the resolver's), as `dns_request` asks it;
//! - whether the destination was one of the host's own addresses
//!   (`local: true`, which the daemon tells the addon): judged as internal.
//!
//! Not reproduced: the addresses a DNS answer carried (the answer's
//! refusal is logged as its own denied `dns` line, replayed by its
//! question), and what a person answered to a held flow.
//!
//! Memory is flat: counts, plus at most [`MAX_CHANGES`] distinct changed
//! destinations (the rest counted in `changes_left_off`).

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::net::IpAddr;

use serde::Serialize;

use super::record::Record;
use super::{Engine, Flow, Verdict};

/// Distinct changed destinations kept for the report.
pub const MAX_CHANGES: usize = 1000;

/// How one flow fared under the candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    /// Allowed then, denied now.
    NewlyDenied,
    /// Denied then, allowed now.
    NewlyAllowed,
    /// Would wait for an answer now (an `ask` default).
    NewlyHeld,
    Unchanged,
}

/// A changed destination and how many flows to it changed so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Changed {
    pub change: Change,
    pub sandbox: Option<String>,
    pub kind: Option<String>,
    pub host: Option<String>,
    pub ip: Option<IpAddr>,
    pub port: u16,
    /// The candidate's rule that decided (its resource), if a rule did.
    pub rule: Option<String>,
    pub count: u64,
}

type Key = (Change, Option<String>, Option<String>, Option<String>, Option<IpAddr>, u16);

/// The running tally.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// Flows decided again.
    pub flows: u64,
    pub newly_denied: u64,
    pub newly_allowed: u64,
    pub newly_held: u64,
    pub unchanged: u64,
    /// Changed destinations, newly denied first.
    pub changes: Vec<Changed>,
    pub changes_left_off: u64,
    /// The changed destinations so far: key, the candidate's rule, count.
    #[serde(skip)]
    kept: Vec<(Key, Option<String>, u64)>,
    /// `kept` by the hash of its key, so a flow to a destination already
    /// kept is counted without building (allocating) its key.
    #[serde(skip)]
    index: HashMap<u64, Vec<usize>>,
    #[serde(skip)]
    hasher: std::collections::hash_map::RandomState,
}

impl Summary {
    /// Decide `r` again under `engine` and count it.
    pub fn add(&mut self, engine: &Engine, r: &Record<'_>) -> Change {
        let dns = r.kind.as_deref() == Some("dns");
        let port = r.port.unwrap_or(if dns { 53 } else { super::DEFAULT_PORT });
        let chain: Vec<String> = r.chain.iter().flatten().map(std::string::ToString::to_string).collect();
        let flow = Flow {
            sandbox: r.sandbox.as_deref(),
            host: r.host.as_deref(),
            // A DNS question is decided without an address (the logged one
            // is the resolver's); for an answer the address is not logged.
            ip: if dns { None } else { r.addr() },
            port: if dns { 53 } else { port },
            resolved: r.resolved.filter(|x| !x),
            local: r.local == Some(true),
            chain: &chain,
        };
        let (mut d, _) = engine.decide_flow(&flow);
        // An HTTP request is decided by its host's HTTP rules too, as the
        // daemon does (ADR 0050): with the logged method and path (the
        // canonical one for a host with HTTP rules, none when it was
        // refused, which refuses it again).
        if r.kind.as_deref() == Some("http")
            && d.verdict != Verdict::Deny
            && let Some(method) = r.method.as_deref()
        {
            let req = super::http::Request { method, path: r.path.as_deref().unwrap_or(""), overridden: false };
            if let Some(h) = engine.decide_http(flow.sandbox, flow.host, flow.port, &req)
                && (h.verdict == Verdict::Deny || d.verdict == Verdict::Allow)
            {
                d = super::Decision {
                    verdict: h.verdict,
                    matched_rule: h.matched_rule,
                    default_used: false,
                    learned: false,
                };
            }
        }
        // What the daemon does with `ask` where nobody can wait.
        let now = match (d.verdict, r.kind.as_deref()) {
            (Verdict::Ask, Some("dns")) => Verdict::Allow,
            (Verdict::Ask, Some("udp")) => Verdict::Deny,
            (v, _) => v,
        };
        let change = match (r.decision, now) {
            (Verdict::Allow, Verdict::Deny) => Change::NewlyDenied,
            (Verdict::Deny, Verdict::Allow) => Change::NewlyAllowed,
            (Verdict::Allow | Verdict::Deny, Verdict::Ask) => Change::NewlyHeld,
            _ => Change::Unchanged,
        };
        self.flows += 1;
        match change {
            Change::NewlyDenied => self.newly_denied += 1,
            Change::NewlyAllowed => self.newly_allowed += 1,
            Change::NewlyHeld => self.newly_held += 1,
            Change::Unchanged => {
                self.unchanged += 1;
                return change;
            }
        }
        let host = r.host.as_deref().map(super::normalize_host);
        let (sandbox, kind, host) = (r.sandbox.as_deref(), r.kind.as_deref(), host.as_deref());
        let ip = flow.ip.map(|a| a.to_canonical());
        // `Option<String>` hashes as `Option<&str>` does.
        let hash = self.hasher.hash_one((change, sandbox, kind, host, ip, flow.port));
        let slots = self.index.get(&hash).map(Vec::as_slice).unwrap_or_default();
        let same = |k: &Key| {
            k.0 == change
                && k.1.as_deref() == sandbox
                && k.2.as_deref() == kind
                && k.3.as_deref() == host
                && k.4 == ip
                && k.5 == flow.port
        };
        if let Some(&i) = slots.iter().find(|&&i| same(&self.kept[i].0)) {
            self.kept[i].2 += 1;
        } else if self.kept.len() < MAX_CHANGES {
            let key: Key =
                (change, sandbox.map(str::to_owned), kind.map(str::to_owned), host.map(str::to_owned), ip, flow.port);
            let rule = d.matched_rule.map(|m| m.rule.resource.to_string());
            self.index.entry(hash).or_default().push(self.kept.len());
            self.kept.push((key, rule, 1));
        } else {
            self.changes_left_off += 1;
        }
        change
    }

    /// The tally with its changes listed (newly denied first, then by
    /// sandbox, kind, host).
    #[must_use]
    pub fn finish(mut self) -> Summary {
        let mut kept = std::mem::take(&mut self.kept);
        self.index.clear();
        kept.sort_by(|a, b| a.0.cmp(&b.0));
        self.changes = kept
            .into_iter()
            .map(|((change, sandbox, kind, host, ip, port), rule, count)| Changed {
                change,
                sandbox,
                kind,
                host,
                ip,
                port,
                rule,
                count,
            })
            .collect();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Resource, Rule, Source};

    fn allow(r: &str) -> Rule {
        Rule::new(Verdict::Allow, Resource::parse(r).unwrap(), Source::Local)
    }

    fn line(host: &str, ip: &str, port: u16, kind: &str, decision: &str) -> String {
        format!(
            r#"{{"sandbox":"s","timestamp":"2026-05-01T12:00:00Z","kind":"{kind}","host":"{host}","ip":"{ip}","port":{port},"decision":"{decision}"}}"#
        )
    }

    fn replay(engine: &Engine, lines: &[String]) -> Summary {
        let mut s = Summary::default();
        for l in lines {
            s.add(engine, &crate::policy::record::parse(l.as_bytes()).unwrap());
        }
        s.finish()
    }

    #[test]
    fn the_engine_decides_again_with_the_live_defences() {
        let e =
            Engine::build(Verdict::Deny, vec![allow("api.example.com:443"), allow("new.example.com")], vec![]).unwrap();
        let lines = [
            line("api.example.com", "93.184.216.34", 443, "http", "allow"),
            line("api.example.com", "93.184.216.34", 8443, "http", "allow"),
            line("new.example.com", "93.184.216.34", 443, "http", "deny"),
            line("gone.example.com", "93.184.216.34", 443, "http", "allow"),
            line("gone.example.com", "93.184.216.34", 443, "http", "allow"),
            // An allowed name on an internal address: the rebinding
            // defence refuses it without an address rule.
            line("new.example.com", "10.1.2.3", 443, "http", "allow"),
            // A DNS question: decided on the name alone, port 53.
            line("new.example.com", "10.0.0.53", 53, "dns", "deny"),
        ];
        let s = replay(&e, &lines);
        assert_eq!((s.flows, s.newly_denied, s.newly_allowed, s.unchanged), (7, 4, 2, 1));
        let gone = s.changes.iter().find(|c| c.host.as_deref() == Some("gone.example.com")).unwrap();
        assert_eq!((gone.change, gone.count, gone.rule.as_deref()), (Change::NewlyDenied, 2, None));
        let dns = s.changes.iter().find(|c| c.kind.as_deref() == Some("dns")).unwrap();
        assert_eq!((dns.change, dns.ip, dns.port), (Change::NewlyAllowed, None, 53));
        assert!(s.changes.iter().any(|c| c.ip == Some("10.1.2.3".parse().unwrap()) && c.change == Change::NewlyDenied));
    }

    /// `local: true` (the destination is one of the host's own addresses,
    /// public or not) replays as the daemon decided it: internal, so a
    /// host rule alone does not reach it. Without the flag in the record
    /// this replayed as "unchanged" (allowed).
    #[test]
    fn a_local_destination_replays_as_internal() {
        let e =
            Engine::build(Verdict::Deny, vec![allow("host.example.com"), allow("93.184.216.9:22")], vec![]).unwrap();
        let local =
            |host: &str, port: u16| line(host, "93.184.216.7", port, "tcp", "allow").replace('}', r#","local":true}"#);
        let lines = [
            local("host.example.com", 443),
            line("host.example.com", "93.184.216.7", 443, "tcp", "allow"),
            line("", "93.184.216.9", 22, "tcp", "allow").replace(r#""host":"","#, ""),
            line("", "93.184.216.9", 22, "tcp", "allow").replace(r#""host":"","#, "").replace('}', r#","local":true}"#),
        ];
        let s = replay(&e, &lines);
        assert_eq!((s.flows, s.newly_denied, s.unchanged), (4, 1, 3), "{s:?}");
        assert_eq!(s.changes[0].host.as_deref(), Some("host.example.com"));
    }

    /// ADR 0050: an HTTP line replays with its method and path under the
    /// host's HTTP rules; a line without a method (older, or not HTTP)
    /// replays on the network rules alone.
    #[test]
    fn http_lines_replay_under_the_http_rules() {
        let get = Rule::new_http(
            Verdict::Allow,
            Resource::parse("api.example.com").unwrap(),
            vec!["GET".into()],
            "/repos/org/**".into(),
            Source::Local,
        )
        .unwrap();
        let with = Engine::build(Verdict::Deny, vec![allow("api.example.com"), get], vec![]).unwrap();
        let without = Engine::build(Verdict::Deny, vec![allow("api.example.com")], vec![]).unwrap();
        let http = |method: &str, path: Option<&str>, decision: &str| {
            let path = path.map_or_else(|| "null".to_owned(), |p| format!("\"{p}\""));
            line("api.example.com", "93.184.216.34", 443, "http", decision)
                .replace('}', &format!(r#","method":"{method}","path":{path}}}"#))
        };
        let lines = [
            http("GET", Some("/repos/org/x"), "allow"),
            http("POST", Some("/repos/org/x"), "deny"),
            // A path the daemon could not canonicalise is logged as none.
            http("GET", None, "deny"),
            line("api.example.com", "93.184.216.34", 443, "tls", "allow"),
        ];
        let s = replay(&with, &lines);
        assert_eq!((s.flows, s.unchanged), (4, 4), "{s:?}");
        let s = replay(&without, &lines);
        assert_eq!((s.newly_allowed, s.unchanged), (2, 2), "{s:?}");
    }

    #[test]
    fn ask_is_held_except_where_the_daemon_cannot_wait() {
        let e = Engine::build(Verdict::Ask, vec![], vec![]).unwrap();
        let lines = [
            line("a.example.com", "93.184.216.34", 443, "http", "allow"),
            line("a.example.com", "93.184.216.34", 443, "udp", "allow"),
            line("a.example.com", "10.0.0.53", 53, "dns", "deny"),
        ];
        let s = replay(&e, &lines);
        assert_eq!((s.newly_held, s.newly_denied, s.newly_allowed), (1, 1, 1));
    }

    #[test]
    fn the_report_is_bounded() {
        let e = Engine::build(Verdict::Deny, vec![], vec![]).unwrap();
        let lines: Vec<String> = (0..MAX_CHANGES + 10)
            .map(|i| line(&format!("h{i}.example.com"), "93.184.216.34", 443, "http", "allow"))
            .collect();
        let s = replay(&e, &lines);
        assert_eq!((s.changes.len(), s.changes_left_off, s.newly_denied), (MAX_CHANGES, 10, (MAX_CHANGES + 10) as u64));
    }
}

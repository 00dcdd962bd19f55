//! The compiled, immutable rule set and the one function that evaluates it,
//! [`Engine::decide`]. Owns precedence (deny, then allow, then default) and
//! the indexes that keep a decision in the low microseconds at 10,000 rules.
//!
//! Each (scope, verdict) pair gets an [`Index`]; a query asks each index for
//! the lowest-numbered rule that matches, so "first matching rule" falls out
//! of taking a minimum rather than of scanning in order. The indexes:
//! - `**`: a list, in rule order;
//! - exact hosts, `*.base`, `**.base` and label globs: one hash map keyed by
//!   host suffix, probed once per suffix of the query host (`a.b.c` probes
//!   `a.b.c`, `b.c`, `c`, and the empty suffix for globs with no literal
//!   suffix), and only for suffixes no longer than the longest key;
//! - regexes: one multi-pattern automaton per index (what `RegexSet` is,
//!   built straight from the syntax trees kept at parse time);
//! - IPs and CIDRs: a hash map keyed by (prefix length, masked address),
//!   probed once per prefix length present, so at most 33 or 129 probes.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use regex_automata::util::syntax::Config as SyntaxConfig;
use regex_automata::{Input, MatchKind, PatternSet, meta};

use super::limits::{self, FlowLimits, Limits};
use super::resource::Pattern;
use super::wildcard::wildcard;
use super::{Rule, Scope, Verdict};

/// The outcome of [`Engine::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Decision<'a> {
    pub verdict: Verdict,
    /// The first matching rule of the winning verdict; `None` when the
    /// default decided.
    pub matched_rule: Option<Matched<'a>>,
    pub default_used: bool,
    /// The sandbox is learning and no rule decided: allowed in place of
    /// the default, and logged as `learned` (ADR 0048).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub learned: bool,
}

impl Decision<'_> {
    /// Whether an allowed TLS connection is intercepted: always, unless the
    /// allow rule that won says `inspect: false` (ADR 0051). A default, a
    /// learned flow, an approval and every refusal inspect (or refuse).
    /// The daemon may still force inspection (a secret for the host); this
    /// is only what the rules say.
    #[must_use]
    pub fn inspect(&self) -> bool {
        match self.matched_rule {
            Some(m) if self.verdict == Verdict::Allow => m.rule.inspect,
            _ => true,
        }
    }
}

/// A rule that decided, and which file it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Matched<'a> {
    pub rule: &'a Rule,
    pub scope: Scope,
}

/// Global and per-sandbox rules compiled for matching. Immutable; share it
/// between threads behind an `Arc` and rebuild it when the files change.
#[derive(Debug)]
pub struct Engine {
    default: Verdict,
    global: Compiled,
    sandboxes: HashMap<String, Compiled>,
    /// Body-size limits the policy files set ([`super::limits`]).
    global_limits: Limits,
    sandbox_limits: HashMap<String, Limits>,
    /// Sandboxes whose file sets a default of its own.
    sandbox_defaults: HashMap<String, Verdict>,
    /// Sandboxes whose file says `learn: true`.
    learning: HashSet<String>,
    approval_timeout: u32,
    /// Some file has an HTTP rule ([`Engine::has_http_rules`]).
    any_http: bool,
}

#[derive(Debug)]
struct Compiled {
    rules: Vec<Rule>,
    deny: Index,
    allow: Index,
    /// The HTTP rules (ADR 0050), in file order, each with an index of its
    /// one host pattern: the same host matching as network rules, and few
    /// enough rules that asking each is cheaper than another index kind.
    http: Vec<(u32, Index)>,
}

/// A rule's position in its scope's list and its port restriction. Lists of
/// entries are kept in ascending `order`, so the first port match is the
/// lowest-numbered match in that list.
#[derive(Debug, Clone, Copy)]
struct Entry {
    order: u32,
    port: Option<u16>,
}

/// Rules anchored at one host suffix.
#[derive(Debug, Default)]
struct Bucket {
    /// The suffix is the whole host.
    exact: Vec<Entry>,
    /// `*.suffix`: exactly one label before it.
    one: Vec<Entry>,
    /// `**.suffix`: one or more labels before it.
    deep: Vec<Entry>,
    /// Label globs whose wildcard-free tail is this suffix.
    globs: Vec<Glob>,
}

/// `[**.]g1.g2.….gn.suffix` where each `gi` is a label pattern.
#[derive(Debug)]
struct Glob {
    entry: Entry,
    /// Starts with `**`: at least one extra label before `labels`.
    deep: bool,
    /// The label patterns just before the suffix, leftmost first.
    labels: Vec<Box<[u8]>>,
}

#[derive(Debug)]
struct Regexes {
    /// All of an index's regexes as one multi-pattern automaton; pattern
    /// `i` is `entries[i]`.
    set: meta::Regex,
    entries: Vec<Entry>,
}

#[derive(Debug, Default)]
struct Index {
    any: Vec<Entry>,
    hosts: HashMap<Box<str>, Bucket>,
    /// Most labels in any key of `hosts`; longer suffixes cannot hit.
    max_key_labels: usize,
    regexes: Option<Regexes>,
    /// Keyed by (is IPv6, prefix length, masked address as u128).
    nets: HashMap<(bool, u8, u128), Vec<Entry>>,
    v4_lens: Vec<u8>,
    v6_lens: Vec<u8>,
}

/// The query, normalised once and shared by the four index lookups.
struct Query<'q> {
    host: Option<Cow<'q, str>>,
    /// Byte offset of each label's start in `host`.
    starts: Vec<usize>,
    ips: [Option<IpAddr>; 2],
    port: u16,
}

impl Engine {
    /// Compile the rules. Fails only on a regex that parses but cannot be
    /// compiled (size limits), or on a sandbox listed twice.
    pub fn build(default: Verdict, global: Vec<Rule>, sandboxes: Vec<(String, Vec<Rule>)>) -> Result<Engine> {
        let global = Compiled::new(global).context("could not compile the global rules")?;
        let mut map = HashMap::with_capacity(sandboxes.len());
        for (name, rules) in sandboxes {
            if map.contains_key(&name) {
                bail!("sandbox `{name}` is listed twice");
            }
            let c = Compiled::new(rules).with_context(|| format!("could not compile the rules of sandbox `{name}`"))?;
            map.insert(name, c);
        }
        let any_http = !global.http.is_empty() || map.values().any(|c: &Compiled| !c.http.is_empty());
        Ok(Engine {
            any_http,
            default,
            global,
            sandboxes: map,
            global_limits: Limits::default(),
            sandbox_limits: HashMap::new(),
            sandbox_defaults: HashMap::new(),
            learning: HashSet::new(),
            approval_timeout: super::APPROVAL_TIMEOUT,
        })
    }

    /// The engine with the policy files' limits.
    #[must_use]
    pub fn with_limits(mut self, global: Limits, sandboxes: Vec<(String, Limits)>) -> Engine {
        self.global_limits = global;
        self.sandbox_limits = sandboxes.into_iter().collect();
        self
    }

    /// The body-size limits for a flow `decision` allowed: its rule's, else
    /// the sandbox file's, else the global file's, else the defaults.
    #[must_use]
    pub fn limits(&self, sandbox: Option<&str>, decision: &Decision<'_>) -> FlowLimits {
        let rule = decision.matched_rule.map(|m| m.rule.limits());
        let sandbox = sandbox.and_then(|s| self.sandbox_limits.get(s)).copied();
        limits::resolve(rule, sandbox, self.global_limits)
    }

    /// The global default verdict.
    #[must_use]
    pub fn default_verdict(&self) -> Verdict {
        self.default
    }

    /// Evaluate a flow. `host` is the requested host name (any case, trailing
    /// dot allowed), `ip` the destination address; either may be absent. A
    /// `host` that is an IP literal is also matched as an address. An
    /// unknown `sandbox` has no rules of its own.
    #[must_use]
    pub fn decide(&self, sandbox: Option<&str>, host: Option<&str>, ip: Option<IpAddr>, port: u16) -> Decision<'_> {
        let q = Query::new(host, ip, port);
        let compiled = sandbox.and_then(|s| self.sandboxes.get(s));
        for verdict in [Verdict::Deny, Verdict::Allow] {
            // Global rules come first in the combined order, so a global match
            // is always the first match and the sandbox need not be asked.
            let scopes = [(Scope::Global, Some(&self.global)), (Scope::Sandbox, compiled)];
            for (scope, compiled) in scopes {
                let Some(c) = compiled else { continue };
                let index = if verdict == Verdict::Deny { &c.deny } else { &c.allow };
                if let Some(order) = index.first_match(&q) {
                    let rule = &c.rules[order as usize];
                    return Decision {
                        verdict,
                        matched_rule: Some(Matched { rule, scope }),
                        default_used: false,
                        learned: false,
                    };
                }
            }
        }
        if self.learning(sandbox) {
            // In place of the default, `ask` included: learning is for
            // finding out what an agent needs, with nobody answering.
            // Without a rule, the checks of `decide_flow` that need one
            // (internal addresses, rebinding) still refuse.
            return Decision { verdict: Verdict::Allow, matched_rule: None, default_used: true, learned: true };
        }
        Decision { verdict: self.default_for(sandbox), matched_rule: None, default_used: true, learned: false }
    }

    /// The engine with these sandboxes learning (their file's `learn:`).
    #[must_use]
    pub fn with_learning(mut self, sandboxes: impl IntoIterator<Item = String>) -> Engine {
        self.learning = sandboxes.into_iter().collect();
        self
    }

    /// Whether `sandbox` is learning: no rule decided means allowed and
    /// logged as `learned`.
    #[must_use]
    pub fn learning(&self, sandbox: Option<&str>) -> bool {
        sandbox.is_some_and(|s| self.learning.contains(s))
    }

    /// The engine with the sandboxes' own defaults and the global file's
    /// approval timeout.
    #[must_use]
    pub fn with_defaults(mut self, sandboxes: Vec<(String, Verdict)>, approval_timeout: Option<u32>) -> Engine {
        self.sandbox_defaults = sandboxes.into_iter().collect();
        self.approval_timeout = approval_timeout.unwrap_or(super::APPROVAL_TIMEOUT);
        self
    }

    /// What decides when no rule matches: the sandbox's own default, else
    /// the global one.
    #[must_use]
    pub fn default_for(&self, sandbox: Option<&str>) -> Verdict {
        sandbox.and_then(|s| self.sandbox_defaults.get(s)).copied().unwrap_or(self.default)
    }

    /// Seconds a request held by an `ask` default waits for an answer.
    #[must_use]
    pub fn approval_timeout(&self) -> u32 {
        self.approval_timeout
    }
}

/// What the HTTP rules say about one request ([`Engine::decide_http`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpDecision<'a> {
    pub verdict: Verdict,
    /// The HTTP rule that decided; `None` for a refusal before matching,
    /// or when no HTTP rule of the host covers the request.
    pub matched_rule: Option<Matched<'a>>,
    /// Refused before any rule was matched (a path that cannot be
    /// canonicalised, a lower-case method, an override header).
    pub refusal: Option<super::http::Refusal>,
    /// The canonical path, when there is one: what was matched, and what
    /// flows.jsonl records.
    pub path: Option<String>,
}

impl Engine {
    /// The HTTP rules of both scopes (global first, in file order) whose
    /// host pattern matches `host` on `port`.
    fn http_rules<'e>(&'e self, sandbox: Option<&str>, host: Option<&str>, port: u16) -> Vec<Matched<'e>> {
        let mut out = Vec::new();
        if host.is_none_or(|h| !is_name(h)) {
            return out;
        }
        let q = Query::new(host, None, port);
        let compiled = sandbox.and_then(|s| self.sandboxes.get(s));
        for (scope, c) in [(Scope::Global, Some(&self.global)), (Scope::Sandbox, compiled)] {
            let Some(c) = c else { continue };
            for (order, index) in &c.http {
                if index.first_match(&q).is_some() {
                    out.push(Matched { rule: &c.rules[*order as usize], scope });
                }
            }
        }
        out
    }

    /// Whether any file has an HTTP rule at all: without one, nothing
    /// about HTTP rules need be asked.
    #[must_use]
    pub fn has_http_rules(&self) -> bool {
        self.any_http
    }

    /// Whether any HTTP rule (of the global file or `sandbox`'s) covers
    /// `host` on `port`. A connection to such a host must be inspected:
    /// when ppp cannot see its requests (raw TCP, UDP/QUIC, TLS passed
    /// through uninspected) it is refused, since its paths and methods
    /// cannot be judged (ADR 0050). For the addon's `decide` reply, and for
    /// any code that decides to pass a connection through.
    #[must_use]
    pub fn http_rules_apply(&self, sandbox: Option<&str>, host: Option<&str>, port: u16) -> bool {
        !self.http_rules(sandbox, host, port).is_empty()
    }

    /// The HTTP rules' decision for a request to `host` (the name SNI,
    /// Host and target agreed on) that the network rules allowed, or
    /// `None` when no HTTP rule covers the host: then the network decision
    /// stands. Otherwise: a request ppp cannot judge exactly (see
    /// [`super::http::canonical_path`], [`super::http::is_method`], the
    /// override headers, CONNECT and `OPTIONS *`) is denied; a matching
    /// HTTP deny denies; else a matching HTTP allow allows; else denied.
    #[must_use]
    pub fn decide_http(
        &self,
        sandbox: Option<&str>,
        host: Option<&str>,
        port: u16,
        req: &super::http::Request<'_>,
    ) -> Option<HttpDecision<'_>> {
        use super::http::{self, Refusal};
        let rules = self.http_rules(sandbox, host, port);
        if rules.is_empty() {
            return None;
        }
        let refused = |r: Refusal, path: Option<String>| {
            Some(HttpDecision { verdict: Verdict::Deny, matched_rule: None, refusal: Some(r), path })
        };
        let path = match http::canonical_path(req.path) {
            Ok(p) => p,
            Err(_) if req.method == "CONNECT" || req.path == "*" || req.path.is_empty() => {
                return refused(Refusal::Target, None);
            }
            Err(why) => return refused(Refusal::Path(why), None),
        };
        if req.method == "CONNECT" {
            return refused(Refusal::Target, Some(path));
        }
        if !http::is_method(req.method) {
            return refused(Refusal::Method, Some(path));
        }
        if req.overridden {
            return refused(Refusal::Override, Some(path));
        }
        let hit = |m: &&Matched<'_>| {
            let r = m.rule;
            r.methods.as_deref().is_some_and(|ms| http::method_matches(ms, req.method))
                && r.path.as_deref().is_some_and(|g| http::path_matches(g, &path))
        };
        for verdict in [Verdict::Deny, Verdict::Allow] {
            if let Some(m) = rules.iter().filter(|m| m.rule.decision == verdict).find(hit) {
                return Some(HttpDecision { verdict, matched_rule: Some(*m), refusal: None, path: Some(path) });
            }
        }
        Some(HttpDecision { verdict: Verdict::Deny, matched_rule: None, refusal: None, path: Some(path) })
    }
}

/// A flow the proxy carries, as [`Engine::decide_flow`] judges it: what the
/// guest named (`host`: SNI, `Host`, `:authority`, a DNS question) and what
/// its bytes will really do (`ip`, `port`: the address mitmproxy connects to).
#[derive(Debug, Clone, Copy, Default)]
pub struct Flow<'a> {
    pub sandbox: Option<&'a str>,
    pub host: Option<&'a str>,
    pub ip: Option<IpAddr>,
    pub port: u16,
    /// Whether `host` resolves to `ip` (the host's own resolution, or an
    /// answer this sandbox got from ppp's resolver). `None`: not checked,
    /// as for a DNS answer, which *is* the resolution.
    pub resolved: Option<bool>,
    /// `ip` is one of the host's own addresses: internal whatever its range.
    pub local: bool,
    /// The other names the resolution of `host` went through (CNAME and
    /// DNAME owners and targets, in any order): a deny rule for any of them
    /// refuses the flow ([`Refusal::Alias`]), as one for `host` would.
    pub chain: &'a [String],
}

/// Names a resolution may go through before the flow is refused
/// ([`Refusal::LongChain`]): real CNAME chains are a few hops, and every
/// name costs a rule match.
pub const MAX_CHAIN: usize = 16;

/// Why [`Engine::decide_flow`] refused a flow that the rules alone allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "address", rename_all = "lowercase")]
pub enum Refusal {
    /// An allowed name on an internal address that no rule for the address
    /// allows (the DNS-rebinding defence).
    Rebinding(IpAddr),
    /// An internal address (or one of the host's own) that only the default
    /// allowed: internal addresses need an explicit address rule.
    Internal(IpAddr),
    /// The name does not resolve to the address the flow goes to, so the
    /// name's rule cannot vouch for it.
    Unresolved(IpAddr),
    /// A name the resolution went through (`flow.chain[i]`) is denied by a
    /// rule: an allowed alias must not lead to a denied host.
    Alias(usize),
    /// The resolution went through more than [`MAX_CHAIN`] names.
    LongChain,
}

impl Engine {
    /// [`Engine::decide`] for a flow the proxy carries, deciding on where its
    /// bytes go rather than on what the guest says:
    /// - a name (not an address literal) counts only if it resolves to the
    ///   destination (`flow.resolved == Some(false)` refuses, as
    ///   [`Refusal::Unresolved`]);
    /// - an address literal in place of the name does not replace the
    ///   destination: the literal and the destination must both be allowed;
    /// - an internal destination ([`is_internal`], or `flow.local`) passes
    ///   only when a rule for that address allows it (a default allow does
    ///   not open internal addresses; [`Refusal::Rebinding`] for a named
    ///   flow, [`Refusal::Internal`] otherwise).
    ///
    /// A deny by a rule wins over all of these and is returned as it is;
    /// so does a deny rule for any name in `flow.chain` (the aliases the
    /// name resolved through), returned with [`Refusal::Alias`]. Only rules
    /// count for the chain, not the default: the names a service's CNAMEs
    /// go through (its CDN's) are not the user's to list.
    #[must_use]
    pub fn decide_flow(&self, flow: &Flow<'_>) -> (Decision<'_>, Option<Refusal>) {
        let refused =
            |r| (Decision { verdict: Verdict::Deny, matched_rule: None, default_used: false, learned: false }, Some(r));
        if flow.chain.len() > MAX_CHAIN {
            return refused(Refusal::LongChain);
        }
        for (i, name) in flow.chain.iter().enumerate() {
            let d = self.decide(flow.sandbox, Some(name), None, flow.port);
            if d.verdict == Verdict::Deny && d.matched_rule.is_some() {
                return (d, Some(Refusal::Alias(i)));
            }
        }
        let host = flow.host.filter(|h| !normalize_host(h).is_empty());
        let dst = flow.ip.map(|a| a.to_canonical());
        if let Some(literal) = host.and_then(host_ip).map(|a| a.to_canonical()) {
            // `Host: 10.9.0.5` sent to another address: judge both.
            let mut last = None;
            for addr in [Some(literal), dst].into_iter().flatten() {
                let local = flow.local && Some(addr) == dst;
                let (d, r) = self.decide_address(flow.sandbox, addr, flow.port, local);
                if d.verdict == Verdict::Deny {
                    return (d, r);
                }
                last = Some((d, r));
            }
            return last.unwrap_or_else(|| (self.decide(flow.sandbox, None, None, flow.port), None));
        }
        let Some(host) = host else {
            return match dst {
                Some(addr) => self.decide_address(flow.sandbox, addr, flow.port, flow.local),
                None => (self.decide(flow.sandbox, None, None, flow.port), None),
            };
        };
        let d = self.decide(flow.sandbox, Some(host), dst, flow.port);
        let Some(addr) = dst else { return (d, None) };
        if d.verdict == Verdict::Deny {
            return (d, None);
        }
        if flow.resolved == Some(false) {
            return refused(Refusal::Unresolved(addr));
        }
        if is_internal(addr) || flow.local {
            let by_ip = self.decide(flow.sandbox, None, Some(addr), flow.port);
            if by_ip.verdict != Verdict::Allow || by_ip.matched_rule.is_none() {
                return refused(Refusal::Rebinding(addr));
            }
        }
        (d, None)
    }

    /// An address alone, with the internal-address rule.
    fn decide_address(
        &self,
        sandbox: Option<&str>,
        addr: IpAddr,
        port: u16,
        local: bool,
    ) -> (Decision<'_>, Option<Refusal>) {
        let d = self.decide(sandbox, None, Some(addr), port);
        // Neither a default allow nor a default ask reaches an internal
        // address: an approval must not open one the user cannot see is.
        if d.verdict != Verdict::Deny && d.matched_rule.is_none() && (local || is_internal(addr)) {
            return (
                Decision { verdict: Verdict::Deny, matched_rule: None, default_used: false, learned: false },
                Some(Refusal::Internal(addr)),
            );
        }
        (d, None)
    }
}

/// Whether `ip` is not a public address: loopback, unspecified, private
/// (RFC 1918, ULA), link-local (with the cloud metadata address
/// 169.254.169.254), CGNAT, benchmarking, documentation, reserved,
/// multicast and broadcast, and the IPv6 special ranges. IPv4-mapped IPv6
/// and NAT64's `64:ff9b::/96` are judged as the IPv4 address they carry;
/// IPv4-compatible `::/96` is internal. Wider than Python's `not is_global` where
/// they differ (all of `192.0.0.0/24` and `2001::/23`), never narrower.
#[must_use]
pub fn is_internal(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            a == 0
                || a == 10
                || a == 127
                || (a == 100 && (64..128).contains(&b))
                || (a == 169 && b == 254)
                || (a == 172 && (16..32).contains(&b))
                || (a == 192 && b == 0 && (c == 0 || c == 2))
                || (a == 192 && b == 168)
                || (a == 198 && (b == 18 || b == 19))
                || (a == 198 && b == 51 && c == 100)
                || (a == 203 && b == 0 && c == 113)
                || a >= 224
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                // NAT64's well-known prefix reaches the IPv4 address it
                // carries.
                let o = v6.octets();
                return is_internal(IpAddr::V4(std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15])));
            }
            // IPv4-compatible (deprecated; `sit0` tunnels it), `::` and `::1`.
            s[..6] == [0; 6]
                || v6.is_loopback()
                || v6.is_unspecified()
                || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
                || (s[0] == 0x100 && s[1] == 0 && s[2] == 0 && s[3] == 0)
                || (s[0] == 0x2001 && s[1] < 0x200)
                || (s[0] == 0x2001 && s[1] == 0xdb8)
                || s[0] == 0x2002
                || (s[0] == 0x3fff && s[1] < 0x1000)
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xff00) == 0xff00
        }
    }
}

impl Compiled {
    fn new(rules: Vec<Rule>) -> Result<Compiled> {
        let mut deny = IndexBuilder::default();
        let mut allow = IndexBuilder::default();
        let mut http = Vec::new();
        let count = u32::try_from(rules.len()).context("too many rules")?;
        for (order, rule) in (0..count).zip(&rules) {
            if rule.kind == super::RuleType::Http {
                // Never in the network indexes: an HTTP allow must not open
                // a host, nor an HTTP deny close all of it.
                rule.check().map_err(|e| anyhow::anyhow!("rule {}: {e}", rule.id))?;
                let mut one = IndexBuilder::default();
                one.add(order, rule);
                http.push((order, one.finish(&rules)?));
                continue;
            }
            let b = match rule.decision {
                Verdict::Deny => &mut deny,
                Verdict::Allow => &mut allow,
                // The files refuse it; a rule built in code must not either.
                Verdict::Ask => bail!("rule {} decides `ask`, which only a default may", rule.id),
            };
            b.add(order, rule);
        }
        let deny = deny.finish(&rules)?;
        let allow = allow.finish(&rules)?;
        Ok(Compiled { rules, deny, allow, http })
    }
}

#[derive(Default)]
struct IndexBuilder {
    index: Index,
    regexes: Vec<(u32, Option<u16>)>,
}

impl IndexBuilder {
    fn add(&mut self, order: u32, rule: &Rule) {
        let port = rule.resource.port();
        let entry = Entry { order, port };
        let ix = &mut self.index;
        match rule.resource.pattern() {
            Pattern::Any => ix.any.push(entry),
            Pattern::Exact(h) => bucket(ix, h).exact.push(entry),
            Pattern::Sub { base, deep: false } => bucket(ix, base).one.push(entry),
            Pattern::Sub { base, deep: true } => bucket(ix, base).deep.push(entry),
            Pattern::Glob(g) => {
                let mut labels: Vec<&str> = g.split('.').collect();
                let deep = labels[0] == "**";
                if deep {
                    labels.remove(0);
                }
                let literal = labels.iter().rev().take_while(|l| !l.contains(['*', '?'])).count();
                let split = labels.len() - literal;
                let suffix = labels[split..].join(".");
                let labels = labels[..split].iter().map(|l| l.as_bytes().into()).collect();
                bucket(ix, &suffix).globs.push(Glob { entry, deep, labels });
            }
            Pattern::Regex(..) => self.regexes.push((order, port)),
            Pattern::Ip(a) => add_net(ix, *a, if a.is_ipv4() { 32 } else { 128 }, entry),
            Pattern::Net(n) => add_net(ix, n.network(), n.prefix_len(), entry),
        }
    }

    fn finish(mut self, rules: &[Rule]) -> Result<Index> {
        if !self.regexes.is_empty() {
            let hir = |order: u32| match rules[order as usize].resource.pattern() {
                Pattern::Regex(_, parsed) => parsed.0.clone(),
                _ => unreachable!("only regex rules are collected"),
            };
            let hirs: Vec<_> = self.regexes.iter().map(|&(order, _)| hir(order)).collect();
            let set = regex_set(&hirs).or_else(|e| {
                // Name the rule: compile them one by one to find the culprit.
                for &(order, _) in &self.regexes {
                    if let Err(one) = regex_set(&[hir(order)]) {
                        let rule = &rules[order as usize];
                        bail!("regex `{}` (rule `{}`) does not compile: {one}", rule.resource, rule.id);
                    }
                }
                bail!("the regex rules do not compile together: {e}")
            })?;
            let entries = self.regexes.iter().map(|&(order, port)| Entry { order, port }).collect();
            self.index.regexes = Some(Regexes { set, entries });
        }
        self.index.v4_lens.sort_unstable();
        self.index.v6_lens.sort_unstable();
        Ok(self.index)
    }
}

/// One automaton for many regexes, reporting every pattern that matches.
/// The trees were parsed (bytes, no Unicode, case-insensitive, anchored) in
/// `resource.rs`; nothing here re-parses them.
fn regex_set(hirs: &[std::sync::Arc<regex_syntax::hir::Hir>]) -> Result<meta::Regex> {
    let refs: Vec<&regex_syntax::hir::Hir> = hirs.iter().map(|h| &**h).collect();
    meta::Builder::new()
        .configure(meta::Config::new().match_kind(MatchKind::All).utf8_empty(false))
        .syntax(SyntaxConfig::new().unicode(false).utf8(false).case_insensitive(true))
        .build_many_from_hir(&refs)
        .map_err(anyhow::Error::from)
}

fn bucket<'a>(ix: &'a mut Index, key: &str) -> &'a mut Bucket {
    ix.max_key_labels = ix.max_key_labels.max(label_count(key));
    ix.hosts.entry(key.into()).or_default()
}

fn add_net(ix: &mut Index, addr: IpAddr, len: u8, entry: Entry) {
    let (v6, lens) = match addr {
        IpAddr::V4(_) => (false, &mut ix.v4_lens),
        IpAddr::V6(_) => (true, &mut ix.v6_lens),
    };
    if !lens.contains(&len) {
        lens.push(len);
    }
    ix.nets.entry((v6, len, masked(addr, len))).or_default().push(entry);
}

/// `addr` with all but the first `len` bits cleared, widened to u128.
fn masked(addr: IpAddr, len: u8) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a) & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)),
        IpAddr::V6(a) => u128::from(a) & u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0),
    }
}

fn label_count(s: &str) -> usize {
    if s.is_empty() { 0 } else { s.bytes().filter(|&b| b == b'.').count() + 1 }
}

impl<'q> Query<'q> {
    fn new(host: Option<&'q str>, ip: Option<IpAddr>, port: u16) -> Self {
        let host = host.map(normalize_host).filter(|h| !h.is_empty());
        let mut starts = Vec::new();
        if let Some(h) = &host {
            starts.push(0);
            starts.extend(h.bytes().enumerate().filter(|&(_, b)| b == b'.').map(|(i, _)| i + 1));
        }
        // Compare IPv4-mapped IPv6 as IPv4, or `::ffff:10.0.0.1` would slip
        // past a deny on `10.0.0.0/8`.
        let literal = host.as_deref().and_then(host_ip).map(|a| a.to_canonical());
        Query { host, starts, ips: [ip.map(|a| a.to_canonical()), literal], port }
    }

    /// Label `i` of the host.
    fn label(&self, i: usize) -> &str {
        let h = self.host.as_deref().unwrap_or_default();
        let end = self.starts.get(i + 1).map_or(h.len(), |&s| s - 1);
        &h[self.starts[i]..end]
    }
}

/// Lower-case without a trailing dot, borrowing when already so.
pub(crate) fn normalize_host(h: &str) -> Cow<'_, str> {
    let h = h.strip_suffix('.').unwrap_or(h);
    if h.bytes().any(|b| b.is_ascii_uppercase()) { Cow::Owned(h.to_ascii_lowercase()) } else { Cow::Borrowed(h) }
}

/// Whether `h` names a host: not empty, and not an address literal.
#[must_use]
pub fn is_name(h: &str) -> bool {
    !normalize_host(h).is_empty() && host_ip(h).is_none()
}

/// A host that is an IP literal, with or without IPv6 brackets.
fn host_ip(h: &str) -> Option<IpAddr> {
    let first = *h.as_bytes().first()?;
    if !(first.is_ascii_hexdigit() || first == b':' || first == b'[') {
        return None;
    }
    let inner = h.strip_prefix('[').and_then(|s| s.strip_suffix(']')).unwrap_or(h);
    inner.parse().ok()
}

/// Lower `best` to the first entry in `entries` that allows `port`.
fn scan(entries: &[Entry], port: u16, best: &mut u32) {
    for e in entries {
        if e.order >= *best {
            return;
        }
        if e.port.is_none_or(|p| p == port) {
            *best = e.order;
            return;
        }
    }
}

impl Index {
    /// The lowest-numbered rule in this index that matches `q`.
    fn first_match(&self, q: &Query<'_>) -> Option<u32> {
        let mut best = u32::MAX;
        scan(&self.any, q.port, &mut best);
        if let Some(host) = &q.host {
            self.match_host(q, host, &mut best);
            if let Some(rx) = &self.regexes
                && rx.entries[0].order < best
            {
                let input = Input::new(host.as_bytes());
                // `is_match` needs no allocation and "no" is the common answer.
                if rx.set.is_match(input.clone()) {
                    let mut matched = PatternSet::new(rx.set.pattern_len());
                    rx.set.which_overlapping_matches(&input, &mut matched);
                    for pid in matched.iter() {
                        let e = rx.entries[pid.as_usize()];
                        if e.order >= best {
                            break;
                        }
                        if e.port.is_none_or(|p| p == q.port) {
                            best = e.order;
                            break;
                        }
                    }
                }
            }
        }
        if !self.nets.is_empty() {
            for ip in q.ips.iter().flatten() {
                self.match_ip(*ip, q.port, &mut best);
            }
        }
        (best != u32::MAX).then_some(best)
    }

    fn match_host(&self, q: &Query<'_>, host: &str, best: &mut u32) {
        if self.hosts.is_empty() {
            return;
        }
        let n = q.starts.len();
        // Suffix k starts at label k; k == n is the empty suffix.
        let first = n.saturating_sub(self.max_key_labels);
        for k in first..=n {
            let suffix = if k == n { "" } else { &host[q.starts[k]..] };
            if suffix.is_empty() && k != n {
                // A host ending in an empty label (`a.b..`): this is not the
                // root bucket, whose globs count labels from the very end.
                continue;
            }
            let Some(b) = self.hosts.get(suffix) else { continue };
            if k == 0 {
                scan(&b.exact, q.port, best);
                continue;
            }
            if k == 1 {
                scan(&b.one, q.port, best);
            }
            scan(&b.deep, q.port, best);
            for g in &b.globs {
                if g.entry.order >= *best {
                    break;
                }
                if g.entry.port.is_some_and(|p| p != q.port) {
                    continue;
                }
                let need = g.labels.len();
                let fits = if g.deep { k > need } else { k == need };
                if fits && g.labels.iter().enumerate().all(|(j, pat)| label_matches(pat, q.label(k - need + j))) {
                    *best = g.entry.order;
                    break;
                }
            }
        }
    }

    fn match_ip(&self, ip: IpAddr, port: u16, best: &mut u32) {
        let (v6, lens) = match ip {
            IpAddr::V4(_) => (false, &self.v4_lens),
            IpAddr::V6(_) => (true, &self.v6_lens),
        };
        for &len in lens {
            if let Some(entries) = self.nets.get(&(v6, len, masked(ip, len))) {
                scan(entries, port, best);
            }
        }
    }
}

/// Glob match of one label: `*` is any run of characters, `?` exactly one.
/// Labels never contain `.`, so neither can cross into the next label.
fn label_matches(pat: &[u8], label: &str) -> bool {
    if label.is_ascii() {
        wildcard(pat, label.as_bytes())
    } else {
        // `?` is one character, not one byte, in the rare non-ASCII host.
        let chars: Vec<char> = label.chars().collect();
        wildcard(pat, &chars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Resource, Source};

    fn rule(decision: Verdict, r: &str) -> Rule {
        Rule::new(decision, Resource::parse(r).unwrap(), Source::Local)
    }
    fn allow(r: &str) -> Rule {
        rule(Verdict::Allow, r)
    }
    fn deny(r: &str) -> Rule {
        rule(Verdict::Deny, r)
    }

    /// Only the winning allow rule's `inspect: false` turns inspection off
    /// (ADR 0051): not a deny over it, not the default, not a refusal, not
    /// an allow listed before it.
    #[test]
    fn only_the_winning_allow_rule_turns_inspection_off() {
        let pass = |r: &str| Rule { inspect: false, ..allow(r) };
        let e = Engine::build(
            Verdict::Allow,
            vec![pass("login.test"), deny("bad.login.test"), allow("11.0.0.10"), pass("*.login.test")],
            vec![],
        )
        .unwrap();
        let flow =
            |h: &'static str, ip: &str| Flow { host: Some(h), ip: ip.parse().ok(), port: 443, ..Flow::default() };
        let inspect = |f: Flow<'_>| e.decide_flow(&f).0.inspect();
        assert!(!inspect(flow("login.test", "93.184.216.34")));
        assert!(inspect(flow("bad.login.test", "93.184.216.34")), "denied");
        assert!(inspect(flow("other.test", "93.184.216.34")), "the default");
        // The address rule comes before `*.login.test`: it wins, and inspects.
        assert!(inspect(flow("a.login.test", "11.0.0.10")));
        assert!(!inspect(flow("a.login.test", "93.184.216.34")));
        let mut unresolved = flow("login.test", "93.184.216.34");
        unresolved.resolved = Some(false);
        assert!(inspect(unresolved), "refused");
    }

    /// Does a lone allow rule `r` match `target` (host or IP, port 443 unless given)?
    fn hits(r: &str, host: &str, port: u16) -> bool {
        let e = Engine::build(Verdict::Deny, vec![allow(r)], vec![]).unwrap();
        let ip = host.parse().ok();
        let host = if ip.is_some() { None } else { Some(host) };
        e.decide(None, host, ip, port).verdict == Verdict::Allow
    }

    fn http(decision: Verdict, host: &str, methods: &[&str], path: &str) -> Rule {
        let methods = methods.iter().map(|m| (*m).to_owned()).collect();
        Rule::new_http(decision, Resource::parse(host).unwrap(), methods, path.to_owned(), Source::Local).unwrap()
    }

    fn req<'a>(method: &'a str, path: &'a str) -> crate::policy::http::Request<'a> {
        crate::policy::http::Request { method, path, overridden: false }
    }

    /// ADR 0050: HTTP rules carve inside a network allow, never open a host
    /// and never close one that has no HTTP rule.
    #[test]
    fn http_rules_carve_inside_the_network_allow() {
        let global = vec![
            allow("api.example.com"),
            http(Verdict::Allow, "api.example.com", &["GET", "HEAD"], "/repos/org/**"),
            http(Verdict::Deny, "api.example.com", &["ANY"], "/repos/org/secret/**"),
            http(Verdict::Allow, "closed.example.com", &["ANY"], "/**"),
        ];
        let sandbox = vec![http(Verdict::Allow, "*.example.com", &["POST"], "/repos/org/*/pulls")];
        let e = Engine::build(Verdict::Deny, global.clone(), vec![("s".into(), sandbox.clone())]).unwrap();
        // The HTTP allow does not open a host in the network decision.
        assert_eq!(e.decide(None, Some("closed.example.com"), None, 443).verdict, Verdict::Deny);
        assert_eq!(e.decide(None, Some("other.example.com"), None, 443).verdict, Verdict::Deny);
        assert!(e.http_rules_apply(None, Some("API.example.com."), 443));
        assert!(!e.http_rules_apply(None, Some("other.example.com"), 443));
        assert!(e.http_rules_apply(Some("s"), Some("other.example.com"), 443));
        assert!(!e.http_rules_apply(None, Some("10.0.0.1"), 443));
        assert_eq!(e.decide_http(None, Some("other.example.com"), 443, &req("DELETE", "/x")), None);

        let d = e.decide_http(None, Some("api.example.com"), 443, &req("GET", "/repos/org/x?y=1")).unwrap();
        assert_eq!(
            (d.verdict, d.matched_rule.unwrap().rule.id, d.path.as_deref()),
            (Verdict::Allow, global[1].id, Some("/repos/org/x"))
        );
        let d = e.decide_http(None, Some("api.example.com"), 443, &req("GET", "/repos/org/secret/k")).unwrap();
        assert_eq!((d.verdict, d.matched_rule.unwrap().rule.id), (Verdict::Deny, global[2].id));
        for (m, p) in [("POST", "/repos/org/x"), ("GET", "/repos/other/x"), ("GET", "/")] {
            let d = e.decide_http(None, Some("api.example.com"), 443, &req(m, p)).unwrap();
            assert_eq!((d.verdict, d.matched_rule, d.refusal), (Verdict::Deny, None, None), "{m} {p}");
        }
        // The sandbox's HTTP allow adds to the global ones for that sandbox.
        let d = e.decide_http(Some("s"), Some("api.example.com"), 443, &req("POST", "/repos/org/x/pulls")).unwrap();
        assert_eq!((d.verdict, d.matched_rule.unwrap().scope), (Verdict::Allow, Scope::Sandbox));
        let d = e.decide_http(None, Some("api.example.com"), 443, &req("POST", "/repos/org/x/pulls")).unwrap();
        assert_eq!(d.verdict, Verdict::Deny);
    }

    /// Every trick of the guest is refused, or decoded into what it means.
    #[test]
    fn http_tricks() {
        use crate::policy::http::Refusal;
        let e = Engine::build(
            Verdict::Deny,
            vec![allow("api.example.com"), http(Verdict::Allow, "api.example.com", &["GET"], "/repos/org/**")],
            vec![],
        )
        .unwrap();
        let ask = |m: &str, p: &str, o: bool| {
            e.decide_http(
                None,
                Some("api.example.com"),
                443,
                &crate::policy::http::Request { method: m, path: p, overridden: o },
            )
            .unwrap()
        };
        for p in [
            "/repos/org%2Fx/../../other",
            "/repos/org/%2e%2e/other",
            "/repos/org/../other",
            "/repos//org/x",
            "/repos/org;x=1/x",
            "/repos/org/x#y",
            "/repos/org\\x",
        ] {
            let d = ask("GET", p, false);
            assert!(matches!(d.refusal, Some(Refusal::Path(_))) && d.verdict == Verdict::Deny, "{p}: {d:?}");
        }
        assert_eq!(ask("GET", "/repos/%6Frg/x", false).verdict, Verdict::Allow);
        assert_eq!(ask("get", "/repos/org/x", false).refusal, Some(Refusal::Method));
        assert_eq!(ask("GET", "/repos/org/x", true).refusal, Some(Refusal::Override));
        assert_eq!(ask("OPTIONS", "*", false).refusal, Some(Refusal::Target));
        assert_eq!(ask("CONNECT", "", false).refusal, Some(Refusal::Target));
        assert_eq!(ask("CONNECT", "/repos/org/x", false).refusal, Some(Refusal::Target));
    }

    #[test]
    fn http_rules_need_a_host_pattern() {
        for bad in ["10.0.0.1", "10.0.0.0/8", "^a\\.b$"] {
            let r = Rule::new_http(
                Verdict::Allow,
                Resource::parse(bad).unwrap(),
                vec!["GET".into()],
                "/".into(),
                Source::Local,
            );
            assert!(r.unwrap_err().contains("not a host pattern"), "{bad}");
        }
        assert!(
            Rule::new_http(
                Verdict::Allow,
                Resource::parse("a.b:8443").unwrap(),
                vec!["GET".into()],
                "/".into(),
                Source::Local
            )
            .is_ok()
        );
    }

    #[test]
    fn internal_addresses() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "198.18.0.99",
            "192.0.2.7",
            "203.0.113.9",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b:1::1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["1.1.1.1", "93.184.216.34", "100.128.0.1", "172.32.0.1", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }

    /// An IPv4 address inside IPv6 that a host's network turns back into
    /// IPv4: NAT64's well-known prefix (`64:ff9b::/96`, DNS64 answers and
    /// the NAT gateway of an IPv6-only cloud subnet) reaches the embedded
    /// address, so `64:ff9b::a9fe:a9fe` is the metadata service there; and
    /// the deprecated IPv4-compatible `::/96` goes out through `sit0`'s
    /// automatic tunnel. NAT64 is judged by the address it carries;
    /// `::/96`, which nothing legitimate uses, is internal whatever it
    /// carries.
    #[test]
    fn ipv4_embedded_in_nat64_or_compatible_ipv6_is_judged_as_ipv4() {
        for ip in ["64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "64:ff9b::7f00:1", "::a00:1", "::a9fe:a9fe", "::5db8:d822"] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        // A public address through NAT64 is what an IPv6-only host uses.
        assert!(!is_internal("64:ff9b::5db8:d822".parse().unwrap()));
        let e = Engine::build(Verdict::Allow, vec![], vec![]).unwrap();
        let (d, r) = e.decide_flow(&flow(Some("meta.test"), "64:ff9b::a9fe:a9fe", 80));
        assert_eq!(d.verdict, Verdict::Deny, "{r:?}");
        assert_eq!(e.decide_flow(&flow(None, "64:ff9b::a00:1", 80)).0.verdict, Verdict::Deny);
    }

    /// Issue 22: an allowed alias whose resolution goes through a denied
    /// name is refused, whatever the spelling and wherever in the chain;
    /// names only the default denies do not refuse it (a CDN's CNAMEs);
    /// a chain past `MAX_CHAIN` is refused.
    #[test]
    fn a_deny_rule_for_any_name_in_the_chain_wins() {
        let e = Engine::build(
            Verdict::Deny,
            vec![allow("**.example"), deny("denied.example"), deny("**.bad.example")],
            vec![],
        )
        .unwrap();
        let chain = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let with = with_chain;
        for c in [
            chain(&["denied.example"]),
            chain(&["hop.example", "DENIED.example."]),
            chain(&["hop.example", "denied.example", "final.example"]),
            chain(&["x.y.bad.example"]),
        ] {
            let (d, r) = e.decide_flow(&with(&c));
            assert_eq!(d.verdict, Verdict::Deny, "{c:?}");
            assert!(
                matches!(r, Some(Refusal::Alias(i)) if c[i].to_lowercase().contains("bad") || c[i].to_lowercase().starts_with("denied")),
                "{c:?} {r:?}"
            );
            assert!(d.matched_rule.is_some());
        }
        // Names under no rule (the default denies them) do not refuse it.
        let c = chain(&["edge.cdn.test", "final.example"]);
        assert_eq!(e.decide_flow(&with(&c)), (e.decide(None, Some("alias.example"), None, 443), None));
        let long: Vec<String> = (0..=MAX_CHAIN).map(|i| format!("h{i}.example")).collect();
        assert_eq!(e.decide_flow(&with(&long)).1, Some(Refusal::LongChain));
        assert_eq!(e.decide_flow(&with(&long[..MAX_CHAIN])).0.verdict, Verdict::Allow);
    }

    fn with_chain(c: &[String]) -> Flow<'_> {
        Flow { chain: c, ..flow(Some("alias.example"), "93.184.216.34", 443) }
    }

    fn flow<'a>(host: Option<&'a str>, ip: &str, port: u16) -> Flow<'a> {
        Flow { host, ip: Some(ip.parse().unwrap()), port, resolved: Some(true), ..Flow::default() }
    }

    #[test]
    fn an_allowed_name_on_an_internal_address_needs_a_rule_for_the_address() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // A name allowed by a rule, another only by the default.
        for default in [Verdict::Deny, Verdict::Allow] {
            let e = Engine::build(default, vec![allow("ok.test"), allow("10.9.0.0/16")], vec![]).unwrap();
            let (d, r) = e.decide_flow(&flow(Some("ok.test"), "127.0.0.1", 443));
            assert_eq!((d.verdict, r), (Verdict::Deny, Some(Refusal::Rebinding(ip("127.0.0.1")))), "{default}");
            assert!(d.matched_rule.is_none() && !d.default_used);
            // Mapped IPv6 is judged, and reported, as the IPv4 address.
            assert_eq!(
                e.decide_flow(&flow(Some("ok.test"), "::ffff:169.254.169.254", 80)).1,
                Some(Refusal::Rebinding(ip("169.254.169.254")))
            );
            // An address rule opens it; a public address needs nothing more.
            for addr in ["10.9.0.5", "93.184.216.34"] {
                let (d, r) = e.decide_flow(&flow(Some("ok.test"), addr, 443));
                assert_eq!((d.verdict, r), (Verdict::Allow, None), "{addr}");
            }
            // The host's own address is internal whatever its range.
            let mut own = flow(Some("ok.test"), "93.184.216.34", 443);
            own.local = true;
            assert_eq!(e.decide_flow(&own).1, Some(Refusal::Rebinding(ip("93.184.216.34"))));
        }
        // Denied names stay denied as they were, with their rule.
        let e = Engine::build(Verdict::Allow, vec![deny("bad.test")], vec![]).unwrap();
        let (d, r) = e.decide_flow(&flow(Some("bad.test"), "10.0.0.1", 443));
        assert_eq!((d.verdict, r, d.matched_rule.is_some()), (Verdict::Deny, None, true));
        // With a default allow, a name on an internal address is refused.
        let (d, r) = e.decide_flow(&flow(Some("any.test"), "10.0.0.1", 443));
        assert_eq!((d.verdict, r), (Verdict::Deny, Some(Refusal::Rebinding(ip("10.0.0.1")))));
    }

    #[test]
    fn internal_addresses_need_an_address_rule_even_under_a_default_allow() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let e = Engine::build(Verdict::Allow, vec![allow("10.9.0.5")], vec![]).unwrap();
        for addr in ["127.0.0.1", "169.254.169.254", "10.1.2.3", "100.64.0.1", "fd00::1", "::ffff:192.168.0.1"] {
            let (d, r) = e.decide_flow(&flow(None, addr, 80));
            assert_eq!((d.verdict, r), (Verdict::Deny, Some(Refusal::Internal(ip(addr).to_canonical()))), "{addr}");
        }
        assert_eq!(e.decide_flow(&flow(None, "10.9.0.5", 80)).0.verdict, Verdict::Allow);
        assert_eq!(e.decide_flow(&flow(None, "93.184.216.34", 80)).0.verdict, Verdict::Allow);
        let mut own = flow(None, "93.184.216.34", 80);
        own.local = true;
        assert_eq!(e.decide_flow(&own).1, Some(Refusal::Internal(ip("93.184.216.34"))));
    }

    /// Under an `ask` default nothing internal is ever left to the user: a
    /// flow that would be held is one an approval could let through, so
    /// every way of naming an internal address (no name, a literal in the
    /// name, a name resolving there, the host's own address, IPv4-mapped
    /// IPv6) is refused before it could be held. Only an address rule opens
    /// one.
    #[test]
    fn an_approval_can_never_open_an_internal_address_under_ask() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let e = Engine::build(Verdict::Ask, vec![allow("10.9.0.5"), allow("named.test")], vec![]).unwrap();
        for addr in ["127.0.0.1", "169.254.169.254", "10.1.2.3", "100.64.0.1", "fd00::1", "::ffff:10.1.2.3", "::1"] {
            let want = ip(addr).to_canonical();
            let (d, r) = e.decide_flow(&flow(None, addr, 80));
            assert_eq!((d.verdict, r), (Verdict::Deny, Some(Refusal::Internal(want))), "{addr} unnamed");
            // A name no rule covers (the default would ask) resolving there.
            let (d, r) = e.decide_flow(&flow(Some("new.test"), addr, 80));
            assert_eq!((d.verdict, r), (Verdict::Deny, Some(Refusal::Rebinding(want))), "{addr} named");
            // A name a rule allows resolving there: still the address's call.
            let (d, r) = e.decide_flow(&flow(Some("named.test"), addr, 80));
            assert_eq!((d.verdict, r), (Verdict::Deny, Some(Refusal::Rebinding(want))), "{addr} allowed name");
            // The address as the name, sent to a public address that asks.
            let (d, r) = e.decide_flow(&flow(Some(addr), "93.184.216.34", 80));
            assert_eq!((d.verdict, r), (Verdict::Deny, Some(Refusal::Internal(want))), "{addr} as Host");
        }
        // The host's own public address counts as internal too.
        let mut own = flow(None, "93.184.216.34", 80);
        own.local = true;
        assert_eq!(e.decide_flow(&own).1, Some(Refusal::Internal(ip("93.184.216.34"))));
        // A public address is what the default asks about, and an address
        // rule still opens its internal address without asking.
        assert_eq!(e.decide_flow(&flow(None, "93.184.216.34", 80)).0.verdict, Verdict::Ask);
        assert_eq!(e.decide_flow(&flow(Some("new.test"), "93.184.216.34", 80)).0.verdict, Verdict::Ask);
        assert_eq!(e.decide_flow(&flow(None, "10.9.0.5", 80)).0.verdict, Verdict::Allow);
    }

    #[test]
    fn an_address_literal_as_the_name_does_not_replace_the_destination() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let e = Engine::build(Verdict::Deny, vec![allow("10.9.0.5")], vec![]).unwrap();
        // `curl -H 'Host: 10.9.0.5' http://169.254.169.254/`: the real
        // destination is judged too.
        let (d, r) = e.decide_flow(&flow(Some("10.9.0.5"), "169.254.169.254", 80));
        assert_eq!(d.verdict, Verdict::Deny, "{r:?}");
        // And the literal: an allowed destination with a denied literal.
        let (d, _) = e.decide_flow(&flow(Some("10.1.1.1"), "10.9.0.5", 80));
        assert_eq!(d.verdict, Verdict::Deny);
        // Both allowed (the same address): allowed by its rule.
        let (d, r) = e.decide_flow(&flow(Some("[::ffff:10.9.0.5]"), "10.9.0.5", 80));
        assert_eq!((d.verdict, r, d.matched_rule.is_some()), (Verdict::Allow, None, true));
        // Under a default allow the internal literal still needs its rule.
        let e = Engine::build(Verdict::Allow, vec![], vec![]).unwrap();
        let (d, r) = e.decide_flow(&flow(Some("127.0.0.1"), "93.184.216.34", 80));
        assert_eq!((d.verdict, r), (Verdict::Deny, Some(Refusal::Internal(ip("127.0.0.1")))));
    }

    #[test]
    fn a_name_counts_only_where_it_resolves() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let e = Engine::build(Verdict::Deny, vec![allow("api.test"), allow("10.77.0.9")], vec![]).unwrap();
        let mut f = flow(Some("api.test"), "10.77.0.9", 80);
        f.resolved = Some(false);
        // The address is allowed by its own rule, but the name cannot vouch
        // for it: `Host: api.test` sent to 10.77.0.9 is refused.
        assert_eq!(
            e.decide_flow(&f),
            (
                Decision { verdict: Verdict::Deny, matched_rule: None, default_used: false, learned: false },
                Some(Refusal::Unresolved(ip("10.77.0.9")))
            )
        );
        f.resolved = Some(true);
        assert_eq!(e.decide_flow(&f).0.verdict, Verdict::Allow);
        // Not checked (a DNS answer is the resolution itself).
        f.resolved = None;
        assert_eq!(e.decide_flow(&f).0.verdict, Verdict::Allow);
        // A name the rules deny stays a rule's deny, resolved or not.
        let e = Engine::build(Verdict::Allow, vec![deny("bad.test")], vec![]).unwrap();
        let mut f = flow(Some("bad.test"), "93.184.216.34", 443);
        f.resolved = Some(false);
        let (d, r) = e.decide_flow(&f);
        assert_eq!((d.verdict, r, d.matched_rule.is_some()), (Verdict::Deny, None, true));
    }

    /// Learning (ADR 0048) replaces only the default: a deny rule, an
    /// internal address, a name rebound to one, an alias of a denied name
    /// and an unresolved name are refused exactly as without it.
    #[test]
    fn learning_allows_only_what_the_default_would_have_decided() {
        let e = Engine::build(Verdict::Ask, vec![deny("blocked.test"), allow("ok.test")], vec![("s".into(), vec![])])
            .unwrap()
            .with_learning(["s".to_owned()]);
        assert!(e.learning(Some("s")) && !e.learning(Some("t")) && !e.learning(None));
        let (d, r) = e.decide_flow(&in_s(Some("new.test"), "93.184.216.34", 443));
        assert_eq!((d.verdict, d.learned, d.matched_rule.is_none(), r), (Verdict::Allow, true, true, None));
        // A rule's allow is the rule's, not learned.
        let (d, _) = e.decide_flow(&in_s(Some("ok.test"), "93.184.216.34", 443));
        assert_eq!((d.verdict, d.learned), (Verdict::Allow, false));
        let (d, _) = e.decide_flow(&in_s(Some("blocked.test"), "93.184.216.34", 443));
        assert_eq!((d.verdict, d.learned), (Verdict::Deny, false));
        for addr in ["10.1.2.3", "127.0.0.1", "169.254.169.254", "::ffff:10.1.2.3"] {
            let want = addr.parse::<IpAddr>().unwrap().to_canonical();
            assert_eq!(e.decide_flow(&in_s(None, addr, 80)).1, Some(Refusal::Internal(want)), "{addr}");
            assert_eq!(e.decide_flow(&in_s(Some("new.test"), addr, 80)).1, Some(Refusal::Rebinding(want)), "{addr}");
        }
        let chain = ["blocked.test".to_owned()];
        let mut aliased = in_s(Some("new.test"), "93.184.216.34", 443);
        aliased.chain = &chain;
        assert_eq!(e.decide_flow(&aliased).1, Some(Refusal::Alias(0)));
        let mut unresolved = in_s(Some("new.test"), "93.184.216.34", 443);
        unresolved.resolved = Some(false);
        assert_eq!(e.decide_flow(&unresolved).0.verdict, Verdict::Deny);
        // Another sandbox still gets the default.
        let mut other = in_s(Some("new.test"), "93.184.216.34", 443);
        other.sandbox = Some("t");
        assert_eq!(e.decide_flow(&other).0.verdict, Verdict::Ask);
    }

    fn in_s<'a>(host: Option<&'a str>, ip: &str, port: u16) -> Flow<'a> {
        Flow { sandbox: Some("s"), ..flow(host, ip, port) }
    }

    #[test]
    fn double_star_matches_everything() {
        let e = Engine::build(Verdict::Deny, vec![allow("**")], vec![]).unwrap();
        assert_eq!(e.decide(None, Some("x.y"), None, 1).verdict, Verdict::Allow);
        assert_eq!(e.decide(None, None, Some("10.1.1.1".parse().unwrap()), 80).verdict, Verdict::Allow);
        assert_eq!(e.decide(None, None, None, 80).verdict, Verdict::Allow);
        assert!(hits("**:443", "example.com", 443));
        assert!(!hits("**:443", "example.com", 80));
    }

    #[test]
    fn exact_host() {
        assert!(hits("example.com", "example.com", 443));
        assert!(hits("example.com", "example.com", 8080), "any port");
        assert!(hits("example.com", "EXAMPLE.Com", 443), "case-insensitive");
        assert!(hits("example.com", "example.com.", 443), "trailing dot");
        assert!(hits("Example.COM.", "example.com", 443));
        assert!(!hits("example.com", "www.example.com", 443));
        assert!(!hits("example.com", "example.co", 443));
        assert!(!hits("example.com", "xexample.com", 443));
    }

    #[test]
    fn one_label_wildcard() {
        assert!(hits("*.example.com", "a.example.com", 443));
        assert!(hits("*.example.com", "A.Example.COM.", 443));
        assert!(!hits("*.example.com", "a.b.example.com", 443));
        assert!(!hits("*.example.com", "example.com", 443));
        assert!(!hits("*.example.com", "aexample.com", 443));
    }

    #[test]
    fn deep_wildcard() {
        assert!(hits("**.example.com", "a.example.com", 443));
        assert!(hits("**.example.com", "a.b.c.example.com", 443));
        assert!(!hits("**.example.com", "example.com", 443));
        assert!(!hits("**.example.com", "example.org", 443));
    }

    #[test]
    fn label_globs() {
        assert!(hits("api-*.example.com", "api-.example.com", 443), "`*` may be empty");
        assert!(hits("api-*.example.com", "api-eu1.example.com", 443));
        assert!(!hits("api-*.example.com", "api.example.com", 443));
        assert!(!hits("api-*.example.com", "api-eu.x.example.com", 443), "`*` stays in its label");
        assert!(hits("ex?mple.com", "example.com", 443));
        assert!(hits("ex?mple.com", "exxmple.com", 443));
        assert!(!hits("ex?mple.com", "exmple.com", 443), "`?` is exactly one character");
        assert!(!hits("ex?mple.com", "ex.mple.com", 443), "`?` is not a dot");
        assert!(hits("*.*.example.com", "a.b.example.com", 443));
        assert!(!hits("*.*.example.com", "a.example.com", 443));
        assert!(hits("**.api-*.example.com", "x.api-1.example.com", 443));
        assert!(hits("**.api-*.example.com", "x.y.api-1.example.com", 443));
        assert!(!hits("**.api-*.example.com", "api-1.example.com", 443));
        assert!(hits("*", "localhost", 443));
        assert!(!hits("*", "a.b", 443));
        assert!(hits("*.co?", "a.com", 443), "no literal suffix");
        assert!(!hits("*.?", "a.b..", 443), "`a.b.` has three labels, the last empty");
        assert!(hits("*.*.*", "a.b..", 443));
        assert!(hits("a*b*c.d", "aXbYbZc.d", 443), "backtracking");
        assert!(hits("?.d", "é.d", 443), "`?` is one character, not one byte");
    }

    #[test]
    fn regex() {
        assert!(hits(r"^api\d+\.example\.com$", "api12.example.com", 443));
        assert!(hits(r"api\d+\.example\.com", "API12.EXAMPLE.COM", 443), "case-insensitive");
        assert!(!hits(r"api\d+\.example\.com", "xapi12.example.com", 443), "anchored at the start");
        assert!(!hits(r"api\d+\.example\.com", "api12.example.com.evil", 443), "anchored at the end");
        assert!(hits("(foo|bar).com", "bar.com", 443), "alternation stays anchored");
        assert!(!hits("(foo|bar).com", "xbar.com", 443));
        assert!(!hits("foo|bar", "foox", 443));
        assert!(hits(r"\d+\.example\.com:8080", "1.example.com", 8080));
        assert!(!hits(r"\d+\.example\.com:8080", "1.example.com", 443));
    }

    #[test]
    fn addresses() {
        assert!(hits("10.0.0.1", "10.0.0.1", 443));
        assert!(!hits("10.0.0.1", "10.0.0.2", 443));
        assert!(hits("10.0.0.0/8", "10.255.1.2", 443));
        assert!(!hits("10.0.0.0/8", "11.0.0.1", 443));
        assert!(hits("0.0.0.0/0", "1.2.3.4", 443));
        assert!(hits("2001:db8::/32", "2001:db8:1::5", 443));
        assert!(!hits("2001:db8::/32", "2001:db9::5", 443));
        assert!(hits("::/0", "::1", 443));
        assert!(!hits("::/0", "1.2.3.4", 443));
        assert!(hits("[2001:db8::1]:443", "2001:db8::1", 443));
        assert!(!hits("[2001:db8::1]:443", "2001:db8::1", 80));
        assert!(hits("[2001:db8::/32]:443", "2001:db8::7", 443));
        assert!(hits("10.0.0.0/8:22", "10.1.1.1", 22));
        assert!(!hits("10.0.0.0/8:22", "10.1.1.1", 443));
        // IPv4-mapped IPv6 is compared as IPv4, both ways.
        assert!(hits("10.0.0.0/8", "::ffff:10.9.9.9", 443));
        assert!(hits("::ffff:10.0.0.0/104", "10.9.9.9", 443));
    }

    #[test]
    fn host_or_ip() {
        let e = Engine::build(Verdict::Deny, vec![allow("10.0.0.0/8"), allow("example.com")], vec![]).unwrap();
        let ip = Some("10.1.2.3".parse().unwrap());
        let other = Some("192.0.2.1".parse().unwrap());
        assert_eq!(e.decide(None, Some("unknown.org"), ip, 443).verdict, Verdict::Allow, "ip matches");
        assert_eq!(e.decide(None, Some("example.com"), other, 443).verdict, Verdict::Allow, "host matches");
        assert_eq!(e.decide(None, Some("unknown.org"), other, 443).verdict, Verdict::Deny);
        assert_eq!(e.decide(None, Some("10.1.2.3"), None, 443).verdict, Verdict::Allow, "IP literal host");
        assert_eq!(e.decide(None, None, None, 443).verdict, Verdict::Deny);
        assert_eq!(e.decide(None, Some(""), None, 443).verdict, Verdict::Deny);
    }

    #[test]
    fn ports() {
        assert!(hits("example.com:443", "example.com", 443));
        assert!(!hits("example.com:443", "example.com", 80));
        assert!(hits("*.example.com:8443", "a.example.com", 8443));
        assert!(!hits("*.example.com:8443", "a.example.com", 443));
        assert!(!hits("api-*.example.com:1", "api-1.example.com", 2));
    }

    #[test]
    fn precedence_and_matched_rule() {
        let global = vec![allow("**.example.com"), allow("a.example.com"), deny("b.example.com")];
        let sandbox = vec![deny("a.example.com"), allow("c.example.com"), allow("c.example.com")];
        let e = Engine::build(Verdict::Deny, global.clone(), vec![("s".into(), sandbox.clone())]).unwrap();

        // First matching allow, in global file order.
        let d = e.decide(None, Some("a.example.com"), None, 443);
        assert_eq!((d.verdict, d.default_used), (Verdict::Allow, false));
        let m = d.matched_rule.unwrap();
        assert_eq!((m.rule.id, m.scope), (global[0].id, Scope::Global));

        // A sandbox deny beats a global allow.
        let d = e.decide(Some("s"), Some("a.example.com"), None, 443);
        assert_eq!(d.verdict, Verdict::Deny);
        let m = d.matched_rule.unwrap();
        assert_eq!((m.rule.id, m.scope), (sandbox[0].id, Scope::Sandbox));

        // A global deny beats everything, and is reported as global.
        let d = e.decide(Some("s"), Some("b.example.com"), None, 443);
        assert_eq!((d.verdict, d.matched_rule.unwrap().rule.id), (Verdict::Deny, global[2].id));

        // Global allows come before sandbox allows.
        let d = e.decide(Some("s"), Some("c.example.com"), None, 443);
        assert_eq!(d.matched_rule.unwrap().rule.id, global[0].id);

        // The default, and other sandboxes' rules do not apply.
        let d = e.decide(Some("other"), Some("x.org"), None, 443);
        assert_eq!((d.verdict, d.default_used, d.matched_rule), (Verdict::Deny, true, None));
        let d = e.decide(Some("other"), Some("a.example.com"), None, 443);
        assert_eq!(d.verdict, Verdict::Allow);

        let e = Engine::build(Verdict::Allow, vec![], vec![]).unwrap();
        let d = e.decide(None, Some("x.org"), None, 443);
        assert_eq!((d.verdict, d.default_used), (Verdict::Allow, true));
    }

    #[test]
    fn first_match_across_index_kinds() {
        // The first rule in order wins even when it lives in a slower index.
        let rules = vec![allow(r"a\.example\.com"), allow("*.example.com"), allow("a.example.com"), allow("**")];
        let e = Engine::build(Verdict::Deny, rules.clone(), vec![]).unwrap();
        assert_eq!(e.decide(None, Some("a.example.com"), None, 1).matched_rule.unwrap().rule.id, rules[0].id);
        let rules = vec![allow(r"a\.example\.com:2"), allow("a.example.com:3"), allow("*.example.com")];
        let e = Engine::build(Verdict::Deny, rules.clone(), vec![]).unwrap();
        assert_eq!(e.decide(None, Some("a.example.com"), None, 3).matched_rule.unwrap().rule.id, rules[1].id);
        assert_eq!(e.decide(None, Some("a.example.com"), None, 4).matched_rule.unwrap().rule.id, rules[2].id);
    }

    #[test]
    fn build_errors() {
        let err = Engine::build(Verdict::Deny, vec![], vec![("s".into(), vec![]), ("s".into(), vec![])]).unwrap_err();
        assert_eq!(err.to_string(), "sandbox `s` is listed twice");
        // Parses, but exceeds the compiled size limit.
        let huge = deny("(a{1000}){1000}");
        let err = Engine::build(Verdict::Deny, vec![allow("x.com"), huge.clone()], vec![]).unwrap_err();
        let chain = format!("{err:#}");
        assert!(chain.contains(&format!("rule `{}`", huge.id)), "{chain}");
    }

    #[test]
    fn engine_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Engine>();
    }
}

//! The wire format of the daemon's socket (`$PPP_DATA/secret.sock`): one
//! JSON object per line each way, a request with an `"op"`, a reply with
//! `"ok"`. Pure: no I/O, so the server ([`super::socket`]), the CLI's
//! reload client and tests all share these types. See
//! `docs/adr/0007-daemon-socket-protocol.md` for the operations.
//!
//! A request may carry an `"id"` (any JSON value); the reply echoes it, so a
//! client that pipelines requests on one persistent connection can match
//! replies without relying on order (they do come back in order).
//!
//! Secret values travel as [`Value`], so a `Debug` of a reply never prints
//! one; the only place they become text is the serializer here.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::policy::{Scope, Source, Verdict};
use crate::secret::Value;

/// The longest request line the server reads, newline excluded. Requests
/// are a few hundred bytes; the bound keeps a runaway client from making the
/// daemon buffer without limit.
pub const MAX_LINE: usize = 64 * 1024;

/// One request, by its `"op"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// The header to inject for `service`, or with no (or an empty) service,
    /// the custom substitutions for `host`.
    Secret {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        service: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
        host: String,
    },
    /// The header to inject into a request to `host`, from whichever
    /// service key covers that host (sandbox scope first).
    Inject {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
        host: String,
    },
    /// `host` answered 401 to a request that carried a key: a secret from a
    /// command that covers it is run again on the next request (at most
    /// once per `secret::command::STALE_MIN` per secret, whatever the guest
    /// provokes). Acknowledged with `{"ok":true}`.
    Stale {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
        host: String,
    },
    /// Evaluate a flow against the policy.
    Decide {
        #[serde(default)]
        sandbox: Option<String>,
        #[serde(default)]
        host: Option<String>,
        #[serde(default)]
        ip: Option<IpAddr>,
        port: u16,
        /// What the addon saw. Rules match on host, ip and port; a `dns`
        /// decision (a question or its answer) skips the check that the
        /// name resolves to `ip`, since the answer is the resolution.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        protocol: Option<Protocol>,
        /// For a DNS answer: the other names it went through (CNAME and
        /// DNAME owners and targets). A deny rule for any refuses it. For
        /// other flows the daemon finds the chain itself.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        chain: Vec<String>,
        /// For an HTTP request (ADR 0050): its method, for the HTTP rules
        /// of the host. Without it only the network rules decide, and the
        /// reply's `http_rules` says whether HTTP rules cover the host.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
        /// The raw path mitmproxy forwards (origin-form, or HTTP/2's
        /// `:path`), each byte as one char (latin-1); the daemon
        /// canonicalises it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// The request carries a method-override header
        /// ([`crate::policy::http::OVERRIDE_HEADERS`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        overridden: bool,
    },
    /// The current reload generation.
    Generation,
    /// Re-read the policy files and bump the generation.
    Reload,
    /// The `--mode` list mitmdump should run now, one WireGuard server per
    /// claimed port; the addon applies it when the generation moves.
    Modes,
    /// Hold a flow the policy leaves to the user (an `ask` default) until
    /// it is answered, times out, or a new rule decides it; the reply is a
    /// decision. The connection carries nothing else: any further byte, or
    /// its end, withdraws the request.
    Hold {
        sandbox: String,
        #[serde(default)]
        host: Option<String>,
        #[serde(default)]
        ip: Option<IpAddr>,
        port: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        protocol: Option<Protocol>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
        /// The URL path, without its query.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// The body size the request declared.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
    },
    /// Hold a metered request past a budget with `on_exceed: ask` (ADR
    /// 0055) until the user answers it, it times out, or a reload decides
    /// it; the reply is a `meter` reply whose `over` is absent when the
    /// request may go on (the daemon raised the budget once) and present
    /// when it gets the 429. Like `hold`, the connection carries nothing
    /// else.
    #[serde(rename = "budget_hold")]
    BudgetHold {
        sandbox: String,
        host: String,
        #[serde(default)]
        port: u16,
        method: String,
        /// The raw path, as for `meter`.
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
    },
    /// The requests held now.
    Approvals,
    /// Release (or refuse) every request waiting on entry `approval` (not
    /// `id`, which every request may carry for pipelining).
    Answer { approval: String, verdict: Verdict },
    /// The addresses ppp's own resolver (10.0.0.53 in the tunnel) answered
    /// `sandbox` for `name`: a later flow to `name` may go to these.
    Resolved {
        sandbox: String,
        name: String,
        addrs: Vec<IpAddr>,
        /// The answer's TTL in seconds; kept at least a few minutes.
        #[serde(default)]
        ttl: u32,
        /// The other names the answer went through (CNAME and DNAME): a
        /// later flow is judged with them, under the policy of its time.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        chain: Vec<String>,
    },
    /// Whether the responses to this HTTP request are metered (issue 27,
    /// ADR 0053): asked only for a request whose upstream TLS was verified
    /// for `host` (the addon's `secret_ok`). `path` is the raw path, as
    /// for `decide`; the daemon canonicalises and matches it.
    Meter {
        sandbox: String,
        host: String,
        #[serde(default)]
        port: u16,
        method: String,
        path: String,
    },
    /// What a metered response reported (or, `estimated`, what was
    /// estimated from its bytes): one line of usage.jsonl, written once
    /// per `flow`. Acknowledged with `{"ok":true}`.
    Usage {
        sandbox: String,
        provider: String,
        #[serde(default)]
        model: String,
        #[serde(default)]
        input: u64,
        #[serde(default)]
        output: u64,
        #[serde(default)]
        cache_read: u64,
        #[serde(default)]
        cache_write: u64,
        #[serde(default)]
        estimated: bool,
        flow: String,
    },
}

/// A `meter` reply's payload: the provider that matched and where its
/// responses put the usage. A struct with named fields, so that a later
/// fact about the request (a budget crossed) is one more field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meter {
    pub provider: String,
    pub dialect: crate::usage::provider::Dialect,
    pub usage: crate::usage::provider::Fields,
    #[serde(default)]
    pub input_includes_cache_read: bool,
    /// A budget this request would go past (ADR 0055): what to answer
    /// instead of sending it on. Absent when it may go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over: Option<Over>,
}

/// The answer to a request past a budget, in the provider's error shape
/// ([`crate::usage::budget::refusal`]), and whether the budget asks the
/// user first (`on_exceed: ask`): then the addon holds the request with
/// `budget_hold` and sends this only when the user refuses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Over {
    pub status: u16,
    /// Name and value pairs.
    pub headers: Vec<(String, String)>,
    /// The JSON body, as text.
    pub body: String,
    /// The sentence the flow log records.
    pub message: String,
    #[serde(default)]
    pub ask: bool,
}

impl Over {
    /// The refusal for `ex` in `dialect`.
    #[must_use]
    pub fn new(ex: &crate::usage::budget::Exceeded, dialect: crate::usage::provider::Dialect) -> Over {
        let r = crate::usage::budget::refusal(ex, dialect);
        Over {
            status: r.status,
            headers: r.headers.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            body: r.body.to_string(),
            message: ex.message(),
            ask: ex.budget.on_exceed == crate::usage::budget::OnExceed::Ask,
        }
    }
}

impl From<&crate::usage::provider::Provider> for Meter {
    fn from(p: &crate::usage::provider::Provider) -> Self {
        Meter {
            provider: p.name.clone(),
            dialect: p.dialect,
            usage: p.usage.clone(),
            input_includes_cache_read: p.input_includes_cache_read,
            over: None,
        }
    }
}

/// The layer a decision was asked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
    Dns,
    Http,
    Tls,
}

/// One pending entry as `ppp policy approval ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub id: String,
    pub sandbox: String,
    pub host: Option<String>,
    pub ip: Option<IpAddr>,
    pub port: u16,
    pub protocol: Option<Protocol>,
    pub method: Option<String>,
    pub path: Option<String>,
    /// The body size the request declared, when it did.
    pub size: Option<u64>,
    /// Held by a budget (ADR 0055), not by the policy: the budget's
    /// message. Allowing it raises that budget once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// How many identical requests wait on this entry.
    pub count: usize,
    /// Seconds since the first of them arrived.
    pub waiting_secs: u64,
    /// Seconds until the oldest is denied for lack of an answer.
    pub remaining_secs: u64,
}

impl Pending {
    /// `host:port`, or the address when the guest named no host.
    #[must_use]
    pub fn target(&self) -> String {
        match (&self.host, self.ip) {
            // An IPv6 literal in brackets: `2001:db8::1:80` is itself an
            // address, and a rule written from it would name another one.
            (Some(h), _) if h.parse::<std::net::Ipv6Addr>().is_ok() => format!("[{h}]:{}", self.port),
            (Some(h), _) => format!("{h}:{}", self.port),
            (None, Some(IpAddr::V6(a))) => format!("[{a}]:{}", self.port),
            (None, Some(a)) => format!("{a}:{}", self.port),
            (None, None) => format!("?:{}", self.port),
        }
    }
}

/// Why a request failed: the `"reason"` of an `"ok": false` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// No secret for this service, sandbox and host.
    NoSecret,
    /// The store holding the secret cannot be read now (keychain locked or
    /// unreachable, age file undecryptable).
    Locked,
    /// The line is not JSON, or not a known request.
    BadRequest,
    /// The line exceeds [`MAX_LINE`]; the server closes the connection.
    TooLarge,
    /// A reload found a malformed policy file; the old policy stays.
    BadPolicy,
    /// The peer runs as another user; the server closes the connection.
    Forbidden,
    /// A secret's command failed; the detail names the secret (never the
    /// command's output), and the flow gets a 503 that says so.
    CommandFailed,
    /// Anything else went wrong inside the daemon.
    Internal,
    /// `answer` named an id no request waits on (answered, timed out).
    NotPending,
    /// A reason this version does not know (a newer daemon).
    #[serde(other)]
    Unknown,
}

/// One custom secret to substitute, in a `secret` reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Substitution {
    pub placeholder: String,
    #[serde(with = "exposed")]
    pub value: Value,
    /// Seconds the value may be cached, for a value from a command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u64>,
}

/// The rule that decided, in a `decide` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatchedRule {
    pub id: String,
    pub decision: Verdict,
    pub resource: String,
    pub scope: Scope,
    /// Absent for the `learned` pseudo-rule, which no file holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
}

impl MatchedRule {
    /// What decided a flow of a learning sandbox that no rule decided: the
    /// id `learned` (not a rule's uuid, like the addon's own
    /// `builtin:mitm.it`) is what flows.jsonl records as its rule.
    #[must_use]
    pub fn learned() -> MatchedRule {
        MatchedRule {
            id: crate::policy::LEARNED.to_owned(),
            decision: Verdict::Allow,
            resource: "**".to_owned(),
            scope: Scope::Sandbox,
            source: None,
        }
    }
}

impl From<&crate::policy::Matched<'_>> for MatchedRule {
    fn from(m: &crate::policy::Matched<'_>) -> Self {
        Self {
            id: m.rule.id.to_string(),
            decision: m.rule.decision,
            resource: m.rule.resource.to_string(),
            scope: m.scope,
            source: Some(m.rule.source),
        }
    }
}

/// A `decide` reply's payload. Its flags are independent facts the wire
/// carries one by one, not a state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(clippy::struct_excessive_bools)]
pub struct Decision {
    pub verdict: Verdict,
    pub matched_rule: Option<MatchedRule>,
    pub default_used: bool,
    /// The generation of the policy that decided; cache until it changes.
    pub generation: u64,
    /// Set when the DNS-rebinding defence denied: the allowed name's
    /// internal address, which needs a rule of its own
    /// ([`crate::policy::Engine::decide_flow`]).
    pub rebinding: Option<std::net::IpAddr>,
    /// Set when the name does not resolve to the flow's address.
    pub unresolved: Option<std::net::IpAddr>,
    /// Set when an internal address (or one of the host's own) was allowed
    /// only by the default: it needs an address rule.
    pub internal: Option<std::net::IpAddr>,
    /// Set when a name the resolution went through (a CNAME or DNAME) is
    /// denied by a rule: that name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Set when the resolution went through more names than ppp follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_chain: Option<usize>,
    /// The names the host's own resolution went through, when it was
    /// asked (logged with the flow).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chain: Vec<String>,
    /// For an allowed flow: its body-size limits and where each came from.
    pub limits: Option<crate::policy::FlowLimits>,
    /// For a `hold` reply: what the wait ended with.
    pub approval: Option<Held>,
    /// The destination is one of the host's own addresses
    /// ([`crate::policy::Flow::local`]): the addon logs it, so that
    /// `ppp policy replay` judges the flow as the daemon did (ADR 0048).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub local: bool,
    /// HTTP rules cover the host ([`crate::policy::Engine::http_rules_apply`]):
    /// a connection whose requests ppp cannot see (raw TCP, UDP, TLS passed
    /// through) must be refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub http_rules: bool,
    /// Set when the HTTP rules decided a request (`decide` with a method).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpOutcome>,
    /// `false`: an allowed TLS connection is spliced to its destination
    /// unread (ADR 0051). Only when the winning allow rule says
    /// `inspect: false`, the flow names a host, and no secret (nor HTTP
    /// rule) needs to see inside it. Absent means true.
    #[serde(default = "yes", skip_serializing_if = "Clone::clone")]
    pub inspect: bool,
    /// A metered provider answers on the host (issue 27): the addon asks
    /// `meter` for each of its requests, and only for those, so a request
    /// to any other host costs no round trip.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metered: bool,
}

fn yes() -> bool {
    true
}

/// How the HTTP rules decided a request; the rule, if one matched, is the
/// reply's `matched_rule`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpOutcome {
    /// Refused before any rule was matched: why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// The canonical path that was matched, bounded for the flow log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// How a held request ended, in a `hold` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The entry it waited on; none when it was refused at once.
    pub id: Option<String>,
    pub outcome: HeldOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeldOutcome {
    /// `ppp policy approval allow`.
    Allowed,
    /// `ppp policy approval deny`.
    Denied,
    /// Nobody answered in time.
    Timeout,
    /// The sandbox had too many requests waiting.
    Full,
    /// A changed policy decided it (the reply's rule, or a new default).
    Policy,
}

impl Decision {
    /// The refusal's address in its wire field.
    pub fn set_refusal(&mut self, r: Option<crate::policy::Refusal>, chain: &[String]) {
        use crate::policy::Refusal;
        match r {
            Some(Refusal::Alias(i)) => self.alias = chain.get(i).cloned(),
            Some(Refusal::LongChain) => self.long_chain = Some(chain.len()),
            Some(Refusal::Rebinding(a)) => self.rebinding = Some(a),
            Some(Refusal::Unresolved(a)) => self.unresolved = Some(a),
            Some(Refusal::Internal(a)) => self.internal = Some(a),
            None => {}
        }
    }
}

/// A reply, without its optional echoed id.
#[derive(Debug, Clone)]
// A reply lives for one line's write or read; boxing the decision would
// cost an allocation per decision to save a few bytes on the stack.
#[allow(clippy::large_enum_variant)]
pub enum Response {
    /// `secret` with a service: inject `header: value`; `ttl`: seconds it
    /// may be cached, for a value from a command.
    Header { header: String, value: Value, ttl: Option<u64> },
    /// `secret` without a service: replace each placeholder.
    Substitutions(Vec<Substitution>),
    /// `decide`.
    Decision(Decision),
    /// `generation` and `reload`.
    Generation(u64),
    /// `modes`.
    Modes(Vec<String>),
    /// `approvals`.
    Approvals(Vec<Pending>),
    /// `answer`: how many waiting requests it released.
    Released(usize),
    /// `meter`: the provider metering the request, or `None` (`null`).
    Meter(Option<Meter>),
    /// `{"ok":true}` and nothing else: what a bare acknowledgement (an older
    /// or stand-in daemon) sends.
    Ack,
    /// `{"ok":false,…}`.
    Error { reason: Reason, detail: Option<String> },
}

impl Response {
    /// An error reply with a detail.
    pub fn error(reason: Reason, detail: impl Into<String>) -> Response {
        Response::Error { reason, detail: Some(detail.into()) }
    }

    /// True for every reply but [`Response::Error`].
    pub fn is_ok(&self) -> bool {
        !matches!(self, Response::Error { .. })
    }

    /// The reply as one line, newline included. `id` is echoed when given.
    pub fn to_line(&self, id: Option<&serde_json::Value>) -> String {
        let mut w = Wire { ok: self.is_ok(), id: id.cloned(), ..Wire::default() };
        match self {
            Response::Header { header, value, ttl } => {
                w.header = Some(header.clone());
                w.value = Some(value.clone());
                w.ttl = *ttl;
            }
            Response::Substitutions(s) => w.substitutions = Some(s.clone()),
            Response::Decision(d) => {
                w.verdict = Some(d.verdict);
                w.matched_rule = Some(d.matched_rule.clone());
                w.default_used = Some(d.default_used);
                w.generation = Some(d.generation);
                w.rebinding = d.rebinding;
                w.unresolved = d.unresolved;
                w.internal = d.internal;
                w.alias.clone_from(&d.alias);
                w.long_chain = d.long_chain;
                w.chain.clone_from(&d.chain);
                w.local = d.local;
                w.http_rules = d.http_rules;
                w.http.clone_from(&d.http);
                w.inspect = (!d.inspect).then_some(false);
                w.metered = d.metered;
                w.limits = d.limits;
                w.approval.clone_from(&d.approval);
            }
            Response::Approvals(p) => w.approvals = Some(p.clone()),
            Response::Released(n) => w.released = Some(*n),
            Response::Meter(m) => w.meter = Some(m.clone()),
            Response::Generation(g) => w.generation = Some(*g),
            Response::Modes(m) => w.modes = Some(m.clone()),
            Response::Ack => {}
            Response::Error { reason, detail } => {
                w.reason = Some(*reason);
                w.detail.clone_from(detail);
            }
        }
        // Only strings, numbers and enums: serializing cannot fail.
        let mut line = serde_json::to_string(&w).unwrap_or_else(|_| r#"{"ok":false,"reason":"internal"}"#.to_owned());
        line.push('\n');
        line
    }

    /// Parse a reply line (client side). Returns the reply and its echoed id.
    pub fn parse(line: &str) -> Result<(Response, Option<serde_json::Value>), serde_json::Error> {
        let w: Wire = serde_json::from_str(line)?;
        let id = w.id;
        let r = if !w.ok {
            Response::Error { reason: w.reason.unwrap_or(Reason::Unknown), detail: w.detail }
        } else if let (Some(header), Some(value)) = (w.header, w.value) {
            Response::Header { header, value, ttl: w.ttl }
        } else if let Some(s) = w.substitutions {
            Response::Substitutions(s)
        } else if let (Some(verdict), Some(generation)) = (w.verdict, w.generation) {
            Response::Decision(Decision {
                verdict,
                matched_rule: w.matched_rule.flatten(),
                default_used: w.default_used.unwrap_or(false),
                generation,
                rebinding: w.rebinding,
                unresolved: w.unresolved,
                internal: w.internal,
                alias: w.alias,
                long_chain: w.long_chain,
                chain: w.chain,
                limits: w.limits,
                approval: w.approval,
                local: w.local,
                http_rules: w.http_rules,
                http: w.http,
                inspect: w.inspect.unwrap_or(true),
                metered: w.metered,
            })
        } else if let Some(p) = w.approvals {
            Response::Approvals(p)
        } else if let Some(n) = w.released {
            Response::Released(n)
        } else if let Some(m) = w.meter {
            Response::Meter(m)
        } else if let Some(g) = w.generation {
            Response::Generation(g)
        } else if let Some(m) = w.modes {
            Response::Modes(m)
        } else {
            Response::Ack
        };
        Ok((r, id))
    }
}

/// Split a request line into its optional `"id"` and the request. The id
/// is returned even when the request is bad, so the error reply carries it.
pub fn parse_request(line: &[u8]) -> (Option<serde_json::Value>, Result<Request, serde_json::Error>) {
    let mut map = match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(line) {
        Ok(m) => m,
        Err(e) => return (None, Err(e)),
    };
    let id = map.remove("id");
    (id, serde_json::from_value(serde_json::Value::Object(map)))
}

/// Every field any reply has, for (de)serializing the flat JSON object.
// `matched_rule` has three states on the wire: absent (not a decision),
// `null` (the default decided) and a rule.
#[allow(clippy::option_option, clippy::struct_excessive_bools)]
#[derive(Default, Serialize, Deserialize)]
struct Wire {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "exposed_opt")]
    value: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    substitutions: Option<Vec<Substitution>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    verdict: Option<Verdict>,
    // Outer option: field present; inner: `null` when the default decided.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    matched_rule: Option<Option<MatchedRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default_used: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rebinding: Option<std::net::IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unresolved: Option<std::net::IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    internal: Option<std::net::IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    long_chain: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    chain: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    local: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    http_rules: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    metered: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    http: Option<HttpOutcome>,
    /// Only `false` is written (a pass-through, ADR 0051).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inspect: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limits: Option<crate::policy::FlowLimits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approval: Option<Held>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    modes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approvals: Option<Vec<Pending>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    released: Option<usize>,
    // Outer option: field present; inner: `null` when nothing meters it.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    meter: Option<Option<Meter>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<serde_json::Value>,
}

#[allow(clippy::option_option)]
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// The one place a secret becomes reply text.
mod exposed {
    use super::Value;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Value, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.expose())
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        String::deserialize(d).map(Value::new)
    }
}

mod exposed_opt {
    use super::Value;
    use serde::{Deserialize, Deserializer, Serializer};

    #[allow(clippy::ref_option)] // serde's `with` passes `&Option<T>`.
    pub(super) fn serialize<S: Serializer>(v: &Option<Value>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(v.expose()),
            None => s.serialize_none(),
        }
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
        Option::<String>::deserialize(d).map(|o| o.map(Value::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(line: &str) -> Result<Request, String> {
        parse_request(line.as_bytes()).1.map_err(|e| e.to_string())
    }

    #[test]
    fn requests_parse() {
        assert_eq!(req(r#"{"op":"reload"}"#).unwrap(), Request::Reload);
        assert_eq!(req(r#"{"op":"generation"}"#).unwrap(), Request::Generation);
        assert_eq!(
            req(r#"{"op":"secret","service":"anthropic","sandbox":"red-fox","host":"api.anthropic.com"}"#).unwrap(),
            Request::Secret {
                service: Some("anthropic".into()),
                sandbox: Some("red-fox".into()),
                host: "api.anthropic.com".into()
            }
        );
        assert_eq!(
            req(r#"{"op":"decide","sandbox":"red-fox","host":null,"ip":"1.2.3.4","port":443,"protocol":"tls"}"#)
                .unwrap(),
            Request::Decide {
                sandbox: Some("red-fox".into()),
                host: None,
                ip: Some("1.2.3.4".parse().unwrap()),
                port: 443,
                protocol: Some(Protocol::Tls),
                chain: vec![],
                method: None,
                path: None,
                overridden: false,
            }
        );
        assert_eq!(
            req(r#"{"op":"decide","sandbox":"s","host":"a.b","ip":"1.2.3.4","port":443,"protocol":"http","method":"GET","path":"/x?y","overridden":true}"#)
                .unwrap(),
            Request::Decide {
                sandbox: Some("s".into()),
                host: Some("a.b".into()),
                ip: Some("1.2.3.4".parse().unwrap()),
                port: 443,
                protocol: Some(Protocol::Http),
                chain: vec![],
                method: Some("GET".into()),
                path: Some("/x?y".into()),
                overridden: true,
            }
        );
        let (id, r) = parse_request(br#"{"id":7,"op":"generation"}"#);
        assert_eq!((id, r.unwrap()), (Some(serde_json::json!(7)), Request::Generation));
    }

    #[test]
    fn bad_requests_are_errors() {
        for bad in [
            "",
            "{",
            "[]",
            r#"{"op":"fly"}"#,
            r#"{"service":"x","host":"h"}"#,
            r#"{"op":"decide","port":70000}"#,
            r#"{"op":"decide","port":1,"ip":"1.2.3"}"#,
            r#"{"op":"decide","port":1,"protocol":"sctp"}"#,
            r#"{"op":"secret","host":"h","hots":1}"#,
            r#"{"op":"secret","service":"x"}"#,
        ] {
            assert!(req(bad).is_err(), "{bad}");
        }
        let (id, r) = parse_request(br#"{"id":"a","op":"fly"}"#);
        assert_eq!(id, Some(serde_json::json!("a")));
        assert!(r.is_err());
    }

    #[test]
    fn replies_round_trip_and_redact() {
        let r = Response::Header { header: "x-api-key".into(), value: Value::new("sk-secret".into()), ttl: None };
        let line = r.to_line(None);
        assert_eq!(line, "{\"ok\":true,\"header\":\"x-api-key\",\"value\":\"sk-secret\"}\n");
        assert!(!format!("{r:?}").contains("sk-secret"));
        let (back, id) = Response::parse(&line).unwrap();
        assert!(id.is_none());
        assert!(
            matches!(back, Response::Header { ref header, ref value, .. } if header == "x-api-key" && value.expose() == "sk-secret")
        );

        let d = Response::Decision(Decision {
            verdict: Verdict::Deny,
            matched_rule: None,
            default_used: true,
            generation: 3,
            rebinding: None,
            unresolved: None,
            internal: None,
            alias: None,
            long_chain: None,
            chain: vec![],
            limits: None,
            approval: None,
            local: false,
            http_rules: false,
            http: None,
            inspect: true,
            metered: false,
        });
        let line = d.to_line(Some(&serde_json::json!(1)));
        assert_eq!(
            line,
            "{\"ok\":true,\"verdict\":\"deny\",\"matched_rule\":null,\"default_used\":true,\"generation\":3,\"id\":1}\n"
        );
        assert!(
            matches!(Response::parse(&line).unwrap().0, Response::Decision(x) if x.generation == 3 && x.matched_rule.is_none())
        );

        // A hold reply says how the wait ended.
        let held = Response::Decision(Decision {
            verdict: Verdict::Allow,
            matched_rule: None,
            default_used: true,
            generation: 3,
            rebinding: None,
            unresolved: None,
            internal: None,
            alias: None,
            long_chain: None,
            chain: vec![],
            limits: None,
            approval: Some(Held { id: Some("0badc0de".into()), outcome: HeldOutcome::Allowed }),
            local: false,
            http_rules: true,
            http: Some(HttpOutcome { refusal: None, path: Some("/repos/org/x".into()) }),
            inspect: true,
            metered: false,
        });
        let line = held.to_line(None);
        assert!(line.contains("\"approval\":{\"id\":\"0badc0de\",\"outcome\":\"allowed\"}"), "{line}");
        assert!(line.contains("\"http_rules\":true,\"http\":{\"path\":\"/repos/org/x\"}"), "{line}");
        assert!(matches!(Response::parse(&line).unwrap().0, Response::Decision(x) if x.http_rules && x.http.is_some()));
        assert!(!line.contains("inspect"), "absent unless off: {line}");
        // A pass-through says so, and reads back (ADR 0051).
        let Response::Decision(mut passed) = held else { unreachable!() };
        passed.inspect = false;
        let line = Response::Decision(passed).to_line(None);
        assert!(line.contains("\"inspect\":false"), "{line}");
        assert!(matches!(Response::parse(&line).unwrap().0, Response::Decision(x) if !x.inspect));
        assert!(matches!(Response::parse(&line).unwrap().0, Response::Decision(x) if x.approval.is_some()));
        assert_eq!(Response::Released(2).to_line(None), "{\"ok\":true,\"released\":2}\n");
        assert!(
            matches!(Response::parse("{\"ok\":true,\"approvals\":[]}").unwrap().0, Response::Approvals(p) if p.is_empty())
        );
        assert_eq!(
            req(r#"{"op":"answer","approval":"0badc0de","verdict":"deny","id":7}"#).unwrap(),
            Request::Answer { approval: "0badc0de".into(), verdict: Verdict::Deny }
        );

        let e = Response::Error { reason: Reason::NoSecret, detail: None };
        assert_eq!(e.to_line(None), "{\"ok\":false,\"reason\":\"no-secret\"}\n");
        assert_eq!(Response::Generation(4).to_line(None), "{\"ok\":true,\"generation\":4}\n");
        assert!(matches!(Response::parse("{\"ok\":true}").unwrap().0, Response::Ack));
        assert!(matches!(
            Response::parse(r#"{"ok":false,"reason":"from-the-future"}"#).unwrap().0,
            Response::Error { reason: Reason::Unknown, .. }
        ));
        let s = Response::Substitutions(vec![Substitution {
            placeholder: "P".into(),
            value: Value::new("v".into()),
            ttl: None,
        }]);
        assert_eq!(s.to_line(None), "{\"ok\":true,\"substitutions\":[{\"placeholder\":\"P\",\"value\":\"v\"}]}\n");
    }

    #[test]
    fn meter_and_usage_round_trip() {
        assert_eq!(
            req(r#"{"op":"meter","sandbox":"red","host":"api.anthropic.com","port":443,"method":"POST","path":"/v1/messages"}"#)
                .unwrap(),
            Request::Meter {
                sandbox: "red".into(),
                host: "api.anthropic.com".into(),
                port: 443,
                method: "POST".into(),
                path: "/v1/messages".into()
            }
        );
        assert!(matches!(
            req(r#"{"op":"usage","sandbox":"red","provider":"openai","input":3,"estimated":true,"flow":"f"}"#).unwrap(),
            Request::Usage { input: 3, output: 0, estimated: true, .. }
        ));
        assert!(req(r#"{"op":"usage","sandbox":"red","provider":"openai"}"#).is_err(), "a flow id is required");
        let none = Response::Meter(None).to_line(None);
        assert_eq!(none, "{\"ok\":true,\"meter\":null}\n");
        assert!(matches!(Response::parse(&none).unwrap().0, Response::Meter(None)));
        let p = crate::usage::provider::Providers::builtin();
        let m = Meter::from(&p.all()[0]);
        let line = Response::Meter(Some(m.clone())).to_line(Some(&serde_json::json!(2)));
        assert!(line.starts_with("{\"ok\":true,\"meter\":{\"provider\":\"anthropic\",\"dialect\":\"anthropic\",\"usage\":{\"model\":[\"message.model\""), "{line}");
        assert!(matches!(Response::parse(&line).unwrap(), (Response::Meter(Some(back)), Some(_)) if back == m));
    }

    #[test]
    fn a_meter_reply_carries_the_budget_a_request_is_past() {
        use crate::usage::budget::{self, Budget, Budgets, Limit, OnExceed, Period, Raises};
        use crate::usage::record::{Record, Tokens};
        use crate::usage::totals::Totals;
        let now = time::macros::datetime!(2026-12-03 22:00:00 UTC);
        let rec = Record {
            ts: "2026-12-03T10:00:00Z".into(),
            sandbox: "red".into(),
            provider: "anthropic".into(),
            model: "m".into(),
            requests: 1,
            estimated: 0,
            tokens: Tokens { input: 100, ..Tokens::default() },
            flow: None,
        };
        let totals = Totals::from_records([&rec], now.date(), &|_: &Record| None);
        let mut b = Budget {
            scope: "red".parse().unwrap(),
            limit: Limit::Tokens(100),
            per: Period::Day,
            on_exceed: OnExceed::Deny,
        };
        let ex = |b: &Budget| {
            budget::check(&Budgets { budgets: vec![b.clone()] }, &totals, &Raises::default(), "red", now).unwrap()
        };
        let over = Over::new(&ex(&b), crate::usage::provider::Dialect::Anthropic);
        assert_eq!((over.status, over.ask), (429, false));
        assert_eq!(
            over.headers,
            [("content-type".to_owned(), "application/json".to_owned()), ("retry-after".to_owned(), "7200".to_owned())]
        );
        let body: serde_json::Value = serde_json::from_str(&over.body).unwrap();
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["message"], over.message.as_str());
        assert!(over.message.contains("ppp policy budget set red --tokens 200"), "{}", over.message);
        b.on_exceed = OnExceed::Ask;
        let ask = Over::new(&ex(&b), crate::usage::provider::Dialect::Openai);
        assert!(ask.ask && ask.body.contains("insufficient_quota"), "{ask:?}");

        let p = crate::usage::provider::Providers::builtin();
        let m = Meter { over: Some(over.clone()), ..Meter::from(&p.all()[0]) };
        let line = Response::Meter(Some(m.clone())).to_line(None);
        assert!(
            line.contains("\"over\":{\"status\":429,\"headers\":[[\"content-type\",\"application/json\"]"),
            "{line}"
        );
        assert!(matches!(Response::parse(&line).unwrap().0, Response::Meter(Some(back)) if back == m));
        // No budget crossed: no `over` on the wire at all.
        let plain = Response::Meter(Some(Meter::from(&p.all()[0]))).to_line(None);
        assert!(!plain.contains("over"), "{plain}");

        assert_eq!(
            req(r#"{"op":"budget_hold","sandbox":"red","host":"api.anthropic.com","port":443,"method":"POST","path":"/v1/messages","size":12}"#)
                .unwrap(),
            Request::BudgetHold {
                sandbox: "red".into(),
                host: "api.anthropic.com".into(),
                port: 443,
                method: "POST".into(),
                path: "/v1/messages".into(),
                size: Some(12),
            }
        );
        assert!(req(r#"{"op":"budget_hold","sandbox":"red","host":"h"}"#).is_err(), "method and path are required");
    }

    #[test]
    fn a_target_parses_back_as_what_was_held() {
        let mut p = Pending {
            id: "0".into(),
            sandbox: "s".into(),
            host: Some("2001:db8::1".into()),
            ip: None,
            port: 80,
            protocol: None,
            method: None,
            path: None,
            size: None,
            budget: None,
            count: 1,
            waiting_secs: 0,
            remaining_secs: 0,
        };
        assert_eq!(p.target(), "[2001:db8::1]:80");
        // A policy hold says nothing of budgets; a budget's hold names it.
        assert!(!serde_json::to_string(&p).unwrap().contains("budget"));
        let mut b = p.clone();
        b.budget = Some("ppp: the daily token budget of sandbox `s` is used up".into());
        let back: Pending = serde_json::from_str(&serde_json::to_string(&b).unwrap()).unwrap();
        assert_eq!(back, b);
        let r = crate::policy::Resource::parse(&p.target()).unwrap();
        assert_eq!(r.port(), Some(80));
        p.host = Some("api.example.com".into());
        assert_eq!(p.target(), "api.example.com:80");
        p.host = None;
        p.ip = Some("10.0.0.1".parse().unwrap());
        assert_eq!(p.target(), "10.0.0.1:80");
    }
}

//! `ppp policy …`: edit and query network policy. Matching itself lives in
//! [`crate::policy`]; this module only loads files, calls the engine and
//! prints. Every mutation holds `state.lock` and ends with a reload request
//! to a running daemon.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use serde::Serialize;

use super::Ctx;
use crate::cli::{
    FlowTypeFilter, PolicyAddArgs, PolicyCommand, PolicyDefaultArgs, PolicyLimitsArgs, RuleKind, RuleTypeFilter,
    SourceFilter, SourceSelector,
};
use crate::dirs::Dirs;
use crate::error::fail;
use crate::policy::{
    self, Engine, FlowLimits, GlobalFile, Limits, Preset, Resource, Rule, Scope, Source, Target, Verdict, flowlog,
};
use crate::proxy::protocol::MatchedRule;
use crate::{output, proxy, sandbox, state};

mod budget;
mod flows;
pub(crate) mod no_inspect;
pub(crate) mod workflow;

/// Run `ppp policy …`.
pub fn run(cmd: &PolicyCommand, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    match cmd {
        PolicyCommand::Init { preset, force } => init(dirs, *preset, *force),
        PolicyCommand::Allow(a) => {
            let limits = Limits { upload: a.upload, download: a.download };
            add(dirs, Verdict::Allow, &a.rule, limits, !a.no_inspect)
        }
        PolicyCommand::Deny(a) => add(dirs, Verdict::Deny, a, Limits::default(), true),
        PolicyCommand::Limits(a) => limits(dirs, a),
        PolicyCommand::Default(a) => default(dirs, a),
        PolicyCommand::Budget(c) => budget::run(dirs, c),
        PolicyCommand::Approval(a) => super::approval::run(dirs, a),
        PolicyCommand::Check { kind, target, method, path, sandbox, json, verbose, exit_code } => {
            let http = (*kind == RuleKind::Http).then_some((method.as_str(), path.as_str()));
            let verdict = check(dirs, target, sandbox.as_deref(), http, *json, *verbose)?;
            // `--exit-code` makes the answer testable in scripts, as
            // `git diff --exit-code` does: 1 on deny. Without it a deny is
            // an answer, not a failure.
            Ok(if *exit_code && verdict == Verdict::Deny { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
        PolicyCommand::Ls { sandbox, decision, source, kind, include_inactive, json, wide, quiet } => {
            let filter = Filter { decision: *decision, source: *source, kind: *kind };
            let form = if *json {
                Form::Json
            } else if *quiet {
                Form::Ids
            } else {
                Form::Table
            };
            ls(dirs, sandbox.as_deref(), &filter, *include_inactive, form, *wide)
        }
        PolicyCommand::Inspect { id, json } => inspect(dirs, id, *json),
        PolicyCommand::Log { sandbox, json, limit, quiet, kind, follow: true } => {
            flows::follow(dirs, sandbox.as_deref(), *json, *limit, *quiet, *kind)
        }
        PolicyCommand::Log { sandbox, json, limit, quiet, kind, follow: false } => {
            log(dirs, sandbox.as_deref(), *json, *limit, *quiet, *kind)
        }
        PolicyCommand::Learn { sandbox, off } => workflow::learn(dirs, sandbox.as_deref(), *off),
        PolicyCommand::Suggest { sandbox, since, collapse, any_port, log } => workflow::suggest(
            dirs,
            sandbox.as_deref(),
            since.as_deref(),
            policy::suggest::Options { collapse: *collapse, any_port: *any_port },
            log.as_deref(),
        ),
        PolicyCommand::Replay { policy, sandbox, since, json, log } => {
            workflow::replay(dirs, policy, sandbox.as_deref(), since.as_deref(), *json, log.as_deref())
        }
        PolicyCommand::Apply { file, sandbox, undo } => {
            workflow::apply(dirs, file.as_deref(), sandbox.as_deref(), *undo)
        }
        PolicyCommand::Reset { force } => reset(dirs, *force),
        PolicyCommand::Rm { kind, sandbox, id, resource, source } => {
            rm(dirs, *kind, sandbox.as_deref(), id.as_deref(), resource.as_deref(), source.as_deref())
        }
    }
}

/// The hint shown wherever the absence of a global policy matters.
const NO_POLICY_HINT: &str = "no global policy exists, so everything is denied; choose a preset with \
                              `ppp policy init balanced` (or `allow-all`, `deny-all`)";

fn init(dirs: &Dirs, preset: Preset, force: bool) -> Result<ExitCode> {
    let path = dirs.global_policy();
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    let current = policy::load_global(&path)?;
    let next = match current {
        Some(f) if f.preset == Some(preset) && f.default == preset.default_verdict() => {
            output::println(&format!("the global policy already uses preset `{preset}`; nothing changed"))?;
            return Ok(ExitCode::SUCCESS);
        }
        // A file made by `policy allow|deny` before any preset was chosen:
        // choosing one now is what the note after that command suggested.
        Some(mut f) if f.preset.is_none() && f.rules.iter().all(|r| r.source != Source::Preset) => {
            let mut rules = preset.rules();
            rules.append(&mut f.rules);
            GlobalFile { default: preset.default_verdict(), preset: Some(preset), rules, ..f }
        }
        Some(f) if !force => {
            let what = f.preset.map_or_else(|| "hand-made rules".to_owned(), |p| format!("preset `{p}`"));
            return Err(fail(format!("the global policy already uses {what}"))
                .hint(format!("pass -f to switch to `{preset}`; your own and kit rules are kept"))
                .into());
        }
        Some(mut f) => {
            f.rules.retain(|r| r.source != Source::Preset);
            let mut rules = preset.rules();
            rules.append(&mut f.rules);
            GlobalFile { default: preset.default_verdict(), preset: Some(preset), rules, ..f }
        }
        None => GlobalFile::from_preset(preset),
    };
    policy::save_global(&path, &next)?;
    drop(lock);
    proxy::reload_or_warn(dirs);
    let presets = next.rules.iter().filter(|r| r.source == Source::Preset).count();
    output::println(&format!(
        "global policy set to preset `{preset}`: default {}, {presets} preset rule{}",
        next.default,
        if presets == 1 { "" } else { "s" }
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// A usage error (exit 2) worded `msg`, carrying the parser's hint.
fn bad_input(msg: String, e: &policy::ResourceError) -> anyhow::Error {
    let f = fail(msg).code(2);
    match e.hint() {
        Some(h) => f.hint(h).into(),
        None => f.into(),
    }
}

/// Parse every comma-separated resource before touching anything, so one
/// bad item adds nothing.
fn parse_resources(list: &str) -> Result<Vec<Resource>> {
    let mut out = Vec::new();
    for (i, item) in list.split(',').enumerate() {
        let r = Resource::parse(item).map_err(|e| {
            let msg = if list.contains(',') {
                format!("resource {} of `{list}`: {}", i + 1, e.message())
            } else {
                e.message().to_owned()
            };
            bad_input(msg, &e)
        })?;
        out.push(r);
    }
    Ok(out)
}

/// The rules `policy allow|deny` adds, checked before anything is written:
/// network rules, or HTTP rules with their methods and path. `inspect:
/// false` only for `policy allow network --no-inspect` (ADR 0051).
fn new_rules(decision: Verdict, args: &PolicyAddArgs, limits: Limits, inspect: bool) -> Result<Vec<Rule>> {
    let resources = parse_resources(&args.resources)?;
    match args.kind {
        RuleKind::Network => {
            if args.method.is_some() || args.path.is_some() {
                return Err(fail("`--method` and `--path` are for HTTP rules")
                    .hint(format!("write `ppp policy {decision} http {} --method GET --path '/**'`", args.resources))
                    .code(2)
                    .into());
            }
            Ok(resources
                .into_iter()
                .map(|resource| {
                    let mut rule = Rule::new(decision, resource, Source::Local);
                    rule.upload = limits.upload;
                    rule.download = limits.download;
                    rule.inspect = inspect;
                    rule
                })
                .collect())
        }
        RuleKind::Http => {
            let hint = format!(
                "for example `ppp policy {decision} http api.example.com --method GET,HEAD --path '/repos/org/**'`"
            );
            let (Some(methods), Some(path)) = (&args.method, &args.path) else {
                return Err(fail("an HTTP rule needs `--method` (ANY for every method) and `--path`")
                    .hint(hint)
                    .code(2)
                    .into());
            };
            if !inspect {
                return Err(fail(
                    "`--no-inspect` is for network rules: an HTTP rule decides on requests, which ppp must read",
                )
                .hint(format!(
                    "`ppp policy allow network {} --no-inspect` passes a host through unread",
                    args.resources
                ))
                .code(2)
                .into());
            }
            if !limits.is_empty() {
                return Err(fail("limits belong on the network rule, not on an HTTP rule")
                    .hint(format!("`ppp policy allow network {} --upload …`", args.resources))
                    .code(2)
                    .into());
            }
            let methods: Vec<String> = methods.split(',').map(|m| m.trim().to_owned()).collect();
            let mut out = Vec::new();
            for resource in resources {
                let rule =
                    Rule::new_http(decision, resource, methods.clone(), path.clone(), Source::Local).map_err(|e| {
                        // The file's field names, as the command line spells them.
                        let e = e
                            .replace("field `methods`", "`--method`")
                            .replace("field `path`", "`--path`")
                            .replace("field `resource`: ", "");
                        fail(format!("invalid HTTP rule: {e}")).hint(hint.clone()).code(2)
                    })?;
                out.push(rule);
            }
            Ok(out)
        }
    }
}

fn add(dirs: &Dirs, decision: Verdict, args: &PolicyAddArgs, limits: Limits, inspect: bool) -> Result<ExitCode> {
    let new = new_rules(decision, args, limits, inspect)?;
    // A pass-through and an HTTP rule for one host cannot stand together.
    let pairs = !inspect || matches!(args.kind, RuleKind::Http);
    if let Some(s) = &args.sandbox {
        sandbox::validate_name(s)?;
    }
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    if !inspect {
        // A secret set in a race with this command (its check is not under
        // this lock) is caught by the daemon, which inspects any host a
        // secret covers whatever the rule says.
        let refs: Vec<(Option<&str>, &Rule)> = new.iter().map(|r| (args.sandbox.as_deref(), r)).collect();
        let entries = crate::secret::entries(dirs)?;
        if let Some(c) = no_inspect::conflict(&refs, &no_inspect::keyed(&entries))? {
            return Err(c.refuse_rule());
        }
    }
    let mut created_file = false;
    let mut ids = Vec::new();
    let apply = |rules: &mut Vec<Rule>| {
        for rule in new {
            // Adding the same rule twice is a no-op that reports the
            // existing id, so scripts can re-run safely.
            // With --upload/--download it sets the existing rule's limits.
            // `--no-inspect` turns an existing rule's inspection off; only
            // adding it again without the flag turns it back on.
            if let Some(existing) = rules.iter_mut().find(|r| {
                r.decision == decision
                    && r.kind == rule.kind
                    && r.resource == rule.resource
                    && r.methods == rule.methods
                    && r.path == rule.path
                    && r.source == Source::Local
            }) {
                existing.upload = limits.upload.or(existing.upload);
                existing.download = limits.download.or(existing.download);
                existing.inspect = rule.inspect;
                ids.push(existing.id);
                continue;
            }
            ids.push(rule.id);
            rules.push(rule);
        }
    };
    if let Some(name) = &args.sandbox {
        let path = dirs.sandbox_policy(name);
        let mut file = policy::load_sandbox(&path)?.unwrap_or_default();
        apply(&mut file.rules);
        if pairs {
            no_inspect::check_http(dirs, Some(name), &file.rules)?;
        }
        policy::save_sandbox(&path, &file)?;
    } else {
        let path = dirs.global_policy();
        let mut file = if let Some(f) = policy::load_global(&path)? {
            f
        } else {
            created_file = true;
            GlobalFile::without_file()
        };
        apply(&mut file.rules);
        if pairs {
            no_inspect::check_http(dirs, None, &file.rules)?;
        }
        policy::save_global(&path, &file)?;
    }
    drop(lock);
    proxy::reload_or_warn(dirs);
    if created_file {
        eprintln!("note: created the global policy with default `deny`; `ppp policy init` chooses a preset");
    }
    output::print(&lines(ids.iter().map(short_id)))?;
    Ok(ExitCode::SUCCESS)
}

/// `ppp policy default`: set the global or a sandbox's default (and the
/// approval timeout), or show them.
fn default(dirs: &Dirs, args: &PolicyDefaultArgs) -> Result<ExitCode> {
    if let Some(s) = &args.sandbox {
        sandbox::validate_name(s)?;
        if args.timeout.is_some() {
            return Err(fail("--timeout is global: one timeout for every held request")
                .hint("drop --sandbox to set it: `ppp policy default ask --timeout SECONDS`")
                .code(2)
                .into());
        }
    }
    if args.verdict.is_some() || args.timeout.is_some() {
        let lock = state::Lock::acquire(&dirs.state_lock())?;
        if let Some(name) = &args.sandbox {
            let path = dirs.sandbox_policy(name);
            let mut file = policy::load_sandbox(&path)?.unwrap_or_default();
            file.default = args.verdict;
            policy::save_sandbox(&path, &file)?;
        } else {
            let path = dirs.global_policy();
            let mut file = policy::load_global(&path)?.unwrap_or_else(GlobalFile::without_file);
            if let Some(v) = args.verdict {
                file.default = v;
            }
            file.approval_timeout = args.timeout.or(file.approval_timeout);
            policy::save_global(&path, &file)?;
        }
        drop(lock);
        proxy::reload_or_warn(dirs);
    }
    let (global, _) = global_or_default(dirs)?;
    let own = match &args.sandbox {
        Some(name) => policy::load_sandbox(&dirs.sandbox_policy(name))?.and_then(|f| f.default),
        None => None,
    };
    let timeout = global.approval_timeout.unwrap_or(policy::APPROVAL_TIMEOUT);
    let in_force = own.unwrap_or(global.default);
    if args.json {
        let v = serde_json::json!({
            "default": in_force,
            "global": global.default,
            "sandbox": args.sandbox,
            "sandbox_default": own,
            "approval_timeout": timeout,
        });
        output::println(&serde_json::to_string_pretty(&v)?)?;
    } else {
        let from = match (&args.sandbox, own) {
            (Some(name), Some(_)) => format!("sandbox `{name}`"),
            (Some(_), None) => "global; the sandbox sets none".to_owned(),
            (None, _) => "global".to_owned(),
        };
        let mut text = format!("default: {in_force} ({from})\n");
        if in_force == Verdict::Ask || global.default == Verdict::Ask {
            let _ = writeln!(text, "approval timeout: {timeout}s");
        }
        output::print(&text)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `ppp policy limits`: set the global or a sandbox's limits, or show the
/// ones in force.
fn limits(dirs: &Dirs, args: &PolicyLimitsArgs) -> Result<ExitCode> {
    if let Some(s) = &args.sandbox {
        sandbox::validate_name(s)?;
    }
    let set = Limits { upload: args.upload, download: args.download };
    if !set.is_empty() {
        let lock = state::Lock::acquire(&dirs.state_lock())?;
        if let Some(name) = &args.sandbox {
            let path = dirs.sandbox_policy(name);
            let mut file = policy::load_sandbox(&path)?.unwrap_or_default();
            file.upload = set.upload.or(file.upload);
            file.download = set.download.or(file.download);
            policy::save_sandbox(&path, &file)?;
        } else {
            let path = dirs.global_policy();
            let mut file = policy::load_global(&path)?.unwrap_or_else(GlobalFile::without_file);
            file.upload = set.upload.or(file.upload);
            file.download = set.download.or(file.download);
            policy::save_global(&path, &file)?;
        }
        drop(lock);
        proxy::reload_or_warn(dirs);
    }
    let (global, _) = global_or_default(dirs)?;
    let sandbox = match &args.sandbox {
        Some(name) => policy::load_sandbox(&dirs.sandbox_policy(name))?.map(|f| f.limits()),
        None => None,
    };
    let applied = policy::limits::resolve(None, sandbox, global.limits());
    if args.json {
        output::json(&applied)?;
    } else {
        output::print(&describe_limits(&applied))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `upload: 1MiB (default; none to hosts ppp injects a key into)` and the
/// download line, as `policy limits` and `policy ls` show them.
fn describe_limits(l: &FlowLimits) -> String {
    use policy::limits::From;
    let one = |a: &policy::limits::Applied, default_note: &str| {
        let size = a.bytes.map_or_else(|| "none".to_owned(), |b| policy::limits::Size::Bytes(b).to_string());
        let from = match a.from {
            From::Rule => "rule",
            From::Sandbox => "sandbox",
            From::Global => "global",
            From::Default => default_note,
        };
        format!("{size} ({from})")
    };
    format!(
        "upload: {}\ndownload: {}\n",
        one(&l.upload, "default; none to hosts ppp injects a key into"),
        one(&l.download, "default")
    )
}

/// A rule id as every human-facing output shows it: its first 8
/// characters, which `inspect` and `rm --id` take back as a prefix. JSON and
/// `ls --wide` show the whole id.
fn short_id(id: &uuid::Uuid) -> String {
    id.to_string()[..8].to_owned()
}

/// One item per line.
fn lines<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let mut s = String::new();
    for i in items {
        let _ = writeln!(s, "{i}");
    }
    s
}

/// The global file, or the fail-closed stand-in when there is none.
fn global_or_default(dirs: &Dirs) -> Result<(GlobalFile, bool)> {
    Ok(match policy::load_global(&dirs.global_policy())? {
        Some(f) => (f, true),
        None => (GlobalFile::without_file(), false),
    })
}

fn sandbox_rules(dirs: &Dirs, name: &str) -> Result<Vec<Rule>> {
    Ok(policy::load_sandbox(&dirs.sandbox_policy(name))?.map(|f| f.rules).unwrap_or_default())
}

/// `policy check --json` output; the field set is a public contract (the
/// fields after `default_used` appear only when set, so the answer for a
/// plain rule or default reads as it always did).
#[derive(Debug, Serialize)]
struct CheckJson<'a> {
    target: &'a str,
    host: Option<&'a str>,
    ip: Option<String>,
    port: u16,
    sandbox: Option<&'a str>,
    decision: Verdict,
    matched_rule: Option<MatchedRule>,
    default_used: bool,
    /// The sandbox is learning and no rule decided (ADR 0048).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    learned: bool,
    /// A defence refused what the rules or the default let through (an
    /// internal address without its own rule).
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<policy::Refusal>,
    /// With `check http`, when HTTP rules cover the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    http: Option<HttpJson<'a>>,
}

/// What the HTTP rules made of the request, in `check --json`.
#[derive(Debug, Serialize)]
struct HttpJson<'a> {
    method: &'a str,
    /// The canonical path that was matched.
    path: Option<&'a str>,
    /// Refused before any rule was matched: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<String>,
}

/// Print the decision for `target`; returns it for `--exit-code`.
///
/// The engine is the daemon's: [`policy::engine_from`] over the global
/// file and the sandbox's (its rules, its `default:`, its limits, its
/// `learn:`), and [`Engine::decide_flow`], the call the daemon answers the
/// addon with, so an internal address is refused here as it is live. Only
/// the sandbox asked about is loaded: the others cannot change its answer,
/// and a broken file of theirs is not this question's error.
fn check(
    dirs: &Dirs,
    target: &str,
    sandbox_name: Option<&str>,
    http: Option<(&str, &str)>,
    json: bool,
    verbose: bool,
) -> Result<Verdict> {
    let t = Target::parse(target).map_err(|e| bad_input(format!("invalid target: {}", e.message()), &e))?;
    if http.is_some() && t.host.is_none() {
        return Err(fail(format!("`{target}` is an address; HTTP rules name hosts"))
            .hint("check a host name, e.g. `ppp policy check http api.example.com --method GET --path /`")
            .code(2)
            .into());
    }
    if let Some(s) = sandbox_name {
        sandbox::validate_name(s)?;
    }
    let global = policy::load_global(&dirs.global_policy())?;
    let exists = global.is_some();
    let file = match sandbox_name {
        Some(s) => policy::load_sandbox(&dirs.sandbox_policy(s))?,
        None => None,
    };
    let own_default = file.as_ref().and_then(|f| f.default);
    let global_rules = global.as_ref().map(|g| g.rules.clone()).unwrap_or_default();
    let local = file.as_ref().map(|f| f.rules.clone()).unwrap_or_default();
    let files = sandbox_name.zip(file).map(|(s, f)| vec![(s.to_owned(), f)]).unwrap_or_default();
    let engine = policy::engine_from(global, files)?;
    let flow =
        policy::Flow { sandbox: sandbox_name, host: t.host.as_deref(), ip: t.ip, port: t.port, ..Default::default() };
    let (mut d, refused) = engine.decide_flow(&flow);
    // The HTTP rules, as the daemon applies them: only under a network
    // decision that lets the request through (ADR 0050).
    let http_decision = match http {
        Some((method, path)) if d.verdict != Verdict::Deny => {
            let req = policy::http::Request { method, path, overridden: false };
            engine.decide_http(sandbox_name, t.host.as_deref(), t.port, &req)
        }
        _ => None,
    };
    if let Some(h) = &http_decision
        && (h.verdict == Verdict::Deny || d.verdict == Verdict::Allow)
    {
        d = policy::Decision { verdict: h.verdict, matched_rule: h.matched_rule, default_used: false, learned: false };
    }
    let matched = if d.learned { Some(MatchedRule::learned()) } else { d.matched_rule.as_ref().map(MatchedRule::from) };
    if json {
        let out = CheckJson {
            target,
            host: t.host.as_deref(),
            ip: t.ip.map(|ip| ip.to_string()),
            port: t.port,
            sandbox: sandbox_name,
            decision: d.verdict,
            matched_rule: matched,
            default_used: d.default_used,
            learned: d.learned,
            refused,
            http: http_decision.as_ref().map(|h| HttpJson {
                method: http.map(|(m, _)| m).unwrap_or_default(),
                path: h.path.as_deref(),
                refused: h.refusal.as_ref().map(ToString::to_string),
            }),
        };
        output::println(&serde_json::to_string(&out)?)?;
    } else {
        let endpoint = match (t.ip, &t.host) {
            (Some(std::net::IpAddr::V6(ip)), _) => format!("[{ip}]:{}", t.port),
            (Some(ip), _) => format!("{ip}:{}", t.port),
            (None, host) => format!("{}:{}", host.as_deref().unwrap_or_default(), t.port),
        };
        let endpoint = match http {
            Some((m, p)) => format!("{endpoint} {m} {p}"),
            None => endpoint,
        };
        let why = match (&d.matched_rule, refused) {
            (_, None) if http_decision.as_ref().is_some_and(|h| h.refusal.is_some()) => {
                format!(
                    "the HTTP rules' checks: {}",
                    http_decision
                        .as_ref()
                        .and_then(|h| h.refusal.as_ref())
                        .map(ToString::to_string)
                        .unwrap_or_default()
                )
            }
            (None, None) if http_decision.is_some() => format!(
                "the HTTP rules: the host has some and none allows this request (`ppp policy allow http {} --method {} --path …`)",
                t.host.as_deref().unwrap_or_default(),
                http.map(|(m, _)| m).unwrap_or_default()
            ),
            (_, Some(policy::Refusal::Internal(a) | policy::Refusal::Rebinding(a))) => {
                format!("the internal-address defence: `{a}` is internal and no rule for the address allows it")
            }
            (_, Some(r)) => format!("the proxy's defences ({r:?})"),
            (Some(m), None) => {
                format!(
                    "rule {} `{}` ({}, {})",
                    short_id(&m.rule.id),
                    describe_resource(m.rule),
                    m.scope,
                    m.rule.source
                )
            }
            (None, None) if d.learned => format!(
                "learning: no rule matches and sandbox `{}` is learning (`ppp policy learn --off`)",
                sandbox_name.unwrap_or_default()
            ),
            (None, None) if own_default.is_some() => format!("the sandbox default `{}`", d.verdict),
            (None, None) if exists => format!("the global default `{}`", d.verdict),
            (None, None) => "no policy exists".to_owned(),
        };
        output::println(&format!("{}  {endpoint}  by {why}", d.verdict))?;
        if verbose {
            let all: Vec<(Scope, &Rule)> = global_rules
                .iter()
                .map(|r| (Scope::Global, r))
                .chain(local.iter().map(|r| (Scope::Sandbox, r)))
                .collect();
            for (scope, rule) in all {
                // One tiny engine per rule: slow, but only for --verbose, and
                // it keeps matching in the engine rather than re-implemented.
                let single = Engine::build(Verdict::Deny, vec![rule.clone()], Vec::new())?;
                let hit = match rule.kind {
                    policy::RuleType::Network => {
                        single.decide(None, t.host.as_deref(), t.ip, t.port).matched_rule.is_some()
                    }
                    policy::RuleType::Http => http.is_some_and(|(method, path)| {
                        let req = policy::http::Request { method, path, overridden: false };
                        single
                            .decide_http(None, t.host.as_deref(), t.port, &req)
                            .is_some_and(|h| h.matched_rule.is_some())
                    }),
                };
                if hit {
                    output::println(&format!(
                        "  matches: {} {} `{}` ({scope}, {})",
                        short_id(&rule.id),
                        rule.decision,
                        describe_resource(rule),
                        rule.source
                    ))?;
                }
            }
        }
    }
    if !exists {
        eprintln!("hint: {NO_POLICY_HINT}");
    }
    Ok(d.verdict)
}

/// A rule's resource as output shows it: an HTTP rule's with its methods
/// and path (`api.example.com GET,HEAD /repos/org/**`).
fn describe_resource(r: &Rule) -> String {
    match (r.kind, &r.methods, &r.path) {
        (policy::RuleType::Http, Some(m), Some(p)) => format!("{} {} {p}", r.resource, m.join(",")),
        _ => r.resource.to_string(),
    }
}

/// How `policy ls` prints.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Table,
    /// `-q`: ids only, one a line, as the table shows them.
    Ids,
    Json,
}

struct Filter {
    decision: Option<Verdict>,
    source: Option<SourceFilter>,
    kind: Option<RuleTypeFilter>,
}

impl Filter {
    fn keep(&self, r: &Rule) -> bool {
        self.decision.is_none_or(|d| d == r.decision)
            && self.source.is_none_or(|s| s.source() == Some(r.source))
            && self.kind.is_none_or(|k| {
                r.kind
                    == match k {
                        RuleTypeFilter::Network => policy::RuleType::Network,
                        RuleTypeFilter::Http => policy::RuleType::Http,
                    }
            })
    }
}

/// A rule with where it lives, as `ls`/`inspect` print it.
#[derive(Debug, Serialize)]
struct Listed<'a> {
    #[serde(flatten)]
    rule: &'a Rule,
    scope: Scope,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct LsJson<'a> {
    default: Verdict,
    preset: Option<Preset>,
    policy_exists: bool,
    rules: Vec<Listed<'a>>,
}

/// Names of sandboxes that have a policy file, sorted.
fn sandboxes_with_policy(dirs: &Dirs) -> Result<Vec<String>> {
    let root = dirs.sandboxes();
    let mut names = Vec::new();
    match std::fs::read_dir(&root) {
        Ok(entries) => {
            for e in entries {
                let e = e.with_context(|| format!("could not read `{}`", root.display()))?;
                if e.path().join("policy.yaml").exists() {
                    names.push(e.file_name().to_string_lossy().into_owned());
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("could not read `{}`", root.display())),
    }
    names.sort();
    Ok(names)
}

fn ls(dirs: &Dirs, only: Option<&str>, filter: &Filter, all: bool, form: Form, wide: bool) -> Result<ExitCode> {
    if let Some(s) = only {
        sandbox::validate_name(s)?;
    }
    let (global, exists) = global_or_default(dirs)?;
    let names = match (only, all) {
        (Some(s), _) => vec![s.to_owned()],
        (None, true) => sandboxes_with_policy(dirs)?,
        (None, false) => Vec::new(),
    };
    let mut per_sandbox = Vec::new();
    for n in names {
        let rules = sandbox_rules(dirs, &n)?;
        per_sandbox.push((n, rules));
    }
    let mut listed: Vec<Listed<'_>> = global
        .rules
        .iter()
        .filter(|r| filter.keep(r))
        .map(|rule| Listed { rule, scope: Scope::Global, sandbox: None })
        .collect();
    for (name, rules) in &per_sandbox {
        listed.extend(rules.iter().filter(|r| filter.keep(r)).map(|rule| Listed {
            rule,
            scope: Scope::Sandbox,
            sandbox: Some(name),
        }));
    }
    let id = |r: &Rule| if wide { r.id.to_string() } else { short_id(&r.id) };
    match form {
        Form::Json => {
            output::json(&LsJson {
                default: global.default,
                preset: global.preset,
                policy_exists: exists,
                rules: listed,
            })?;
            return Ok(ExitCode::SUCCESS);
        }
        Form::Ids => {
            output::print(&lines(listed.iter().map(|l| id(l.rule))))?;
            return Ok(ExitCode::SUCCESS);
        }
        Form::Table => {}
    }
    // The column appears only when a rule has limits of its own.
    let any_limits = listed.iter().any(|l| !l.rule.limits().is_empty());
    // And this one only when a rule passes TLS through (ADR 0051).
    let any_no_inspect = listed.iter().any(|l| !l.rule.inspect);
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|l| {
            let mut row = vec![
                id(l.rule),
                l.sandbox.map_or_else(|| "global".to_owned(), ToOwned::to_owned),
                l.rule.decision.to_string(),
                describe_resource(l.rule),
                l.rule.source.to_string(),
            ];
            if any_limits {
                row.push(l.rule.limits().describe());
            }
            if any_no_inspect {
                let inspect = match (l.rule.decision, l.rule.inspect) {
                    (Verdict::Allow, true) => "yes",
                    (Verdict::Allow, false) => "no",
                    _ => "-",
                };
                row.push(inspect.to_owned());
            }
            if wide {
                row.push(fmt_time(l.rule.created_at));
            }
            row
        })
        .collect();
    let mut header = vec!["ID", "SCOPE", "DECISION", "RESOURCE", "SOURCE"];
    if any_limits {
        header.push("LIMITS");
    }
    if any_no_inspect {
        header.push("INSPECT");
    }
    if wide {
        header.push("CREATED");
    }
    let mut text = output::table(&header, &rows);
    let preset = global.preset.map(|p| format!(" (preset `{p}`)")).unwrap_or_default();
    let _ = writeln!(text, "default: {}{preset}", global.default);
    let sandbox_limits = match only {
        Some(s) => policy::load_sandbox(&dirs.sandbox_policy(s))?.map(|f| f.limits()),
        None => None,
    };
    for line in describe_limits(&policy::limits::resolve(None, sandbox_limits, global.limits())).lines() {
        let _ = writeln!(text, "{line}");
    }
    output::print(&text)?;
    if !exists {
        eprintln!("hint: {NO_POLICY_HINT}");
    }
    Ok(ExitCode::SUCCESS)
}

fn fmt_time(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// Where a rule was found.
struct Found {
    rule: Rule,
    scope: Scope,
    sandbox: Option<String>,
    file: PathBuf,
}

/// Every rule in every policy file, with its location.
fn all_rules(dirs: &Dirs) -> Result<Vec<Found>> {
    let mut out = Vec::new();
    let gpath = dirs.global_policy();
    if let Some(g) = policy::load_global(&gpath)? {
        out.extend(g.rules.into_iter().map(|rule| Found {
            rule,
            scope: Scope::Global,
            sandbox: None,
            file: gpath.clone(),
        }));
    }
    for name in sandboxes_with_policy(dirs)? {
        let path = dirs.sandbox_policy(&name);
        for rule in sandbox_rules(dirs, &name)? {
            out.push(Found { rule, scope: Scope::Sandbox, sandbox: Some(name.clone()), file: path.clone() });
        }
    }
    Ok(out)
}

/// Select rules whose id starts with `prefix`; more than one is ambiguous.
fn by_id_prefix<'a, T>(items: &'a [T], id: impl Fn(&T) -> String, prefix: &str) -> Result<Option<&'a T>> {
    let p = prefix.to_ascii_lowercase();
    if p.is_empty() {
        return Err(fail("the rule id is empty").code(2).into());
    }
    let hits: Vec<&T> = items.iter().filter(|x| id(x).starts_with(&p)).collect();
    match hits.len() {
        0 => Ok(None),
        1 => Ok(Some(hits[0])),
        n => Err(fail(format!("`{prefix}` matches {n} rules")).hint("give more characters of the id").code(2).into()),
    }
}

fn inspect(dirs: &Dirs, id: &str, json: bool) -> Result<ExitCode> {
    let rules = all_rules(dirs)?;
    let Some(f) = by_id_prefix(&rules, |f| f.rule.id.to_string(), id)? else {
        return Err(fail(format!("no rule has id `{id}`"))
            .hint("list rules with `ppp policy ls --include-inactive`")
            .code(2)
            .into());
    };
    if json {
        #[derive(Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            rule: &'a Rule,
            scope: Scope,
            sandbox: Option<&'a str>,
            file: &'a std::path::Path,
        }
        output::json(&Out { rule: &f.rule, scope: f.scope, sandbox: f.sandbox.as_deref(), file: &f.file })?;
    } else {
        let r = &f.rule;
        let scope = f.sandbox.as_ref().map_or_else(|| "global".to_owned(), |s| format!("sandbox `{s}`"));
        // Shown only when off, as the file writes it.
        let inspect = if r.inspect { "" } else { "inspect:    false (TLS passed through unread, nothing injected)\n" };
        output::print(&format!(
            "id:         {}\ndecision:   {}\ntype:       {}\nresource:   {}\nkind:       {}\n{}{inspect}source:     {}\nscope:      {scope}\ncreated_at: {}\nfile:       {}\n",
            r.id,
            r.decision,
            r.kind,
            r.resource,
            serde_json::to_value(r.resource.kind())?.as_str().unwrap_or_default(),
            match (&r.methods, &r.path) {
                (Some(m), Some(p)) => format!("methods:    {}\npath:       {p}\n", m.join(", ")),
                _ => String::new(),
            },
            r.source,
            fmt_time(r.created_at),
            f.file.display(),
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn log(
    dirs: &Dirs,
    sandbox_name: Option<&str>,
    json: bool,
    limit: usize,
    quiet: bool,
    kind: FlowTypeFilter,
) -> Result<ExitCode> {
    if let Some(s) = sandbox_name {
        sandbox::validate_name(s)?;
    }
    // The proxy records only network flows; there is no filesystem log.
    let mut flows = if kind == FlowTypeFilter::Filesystem {
        Vec::new()
    } else {
        flowlog::tail(&dirs.flows_log(), limit, sandbox_name)?
    };
    flows.iter_mut().for_each(policy::follow::scrub);
    // A removed sandbox's connections stay in the log and are still shown;
    // a name with neither a sandbox nor a logged connection is a mistake.
    if let Some(s) = sandbox_name
        && flows.is_empty()
        && sandbox::load(dirs, s)?.is_none()
        && flowlog::tail(&dirs.flows_log(), 1, Some(s))?.is_empty()
    {
        return Err(fail(format!("no sandbox named `{s}`, and no connection from one is logged"))
            .hint("list sandboxes with `ppp ls`; `ppp policy log` alone shows every sandbox's connections")
            .code(2)
            .into());
    }
    if flows.is_empty() && !json && !quiet {
        let why = match (kind, sandbox_name) {
            (FlowTypeFilter::Filesystem, _) => {
                "no filesystem flows: the proxy records network connections only".to_owned()
            }
            (_, Some(s)) => format!("no connections logged for sandbox `{s}` yet"),
            (_, None) => "no connections logged yet: they appear here once a sandbox connects out".to_owned(),
        };
        output::println(&why)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(s) = sandbox_name
        && !json
        && !quiet
        && policy::learning(dirs).unwrap_or_default().iter().any(|n| n == s)
    {
        eprintln!("note: sandbox `{s}` is learning: flows no rule decided are allowed, shown as `learned`");
    }
    let field = flows::field;
    let mut text = String::new();
    if json {
        for f in &flows {
            text.push_str(&output::json_line(f)?);
            text.push('\n');
        }
    } else if quiet {
        for f in &flows {
            text.push_str(&field(f, "host"));
            text.push('\n');
        }
    } else {
        let rows: Vec<Vec<String>> = flows.iter().map(flows::row).collect();
        text = output::table(&flows::HEADER, &rows);
        if flows.iter().any(misdirected) {
            text.push_str(MISDIRECTED_LEGEND);
        }
    }
    output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// Said under the table when a row carries the mark.
const MISDIRECTED_LEGEND: &str = "! the address connected to is not one the name resolves to\n";

/// True when the proxy checked the flow's address against what its name
/// resolves to and it was not among them (`"resolved": false`): a guest
/// sending an allowed name to an address of its own choosing.
fn misdirected(f: &serde_json::Value) -> bool {
    f.get("resolved") == Some(&serde_json::Value::Bool(false))
}

/// A flow's DESTINATION cell: the name and port, then the address actually
/// connected to when it says more than the name (`api.example.com:443
/// (10.77.0.9)`), then ` !` when that address is not one the name resolves
/// to. The address is shown because a name alone hides where the bytes went.
fn destination(f: &serde_json::Value) -> String {
    let text = |k: &str| f.get(k).and_then(serde_json::Value::as_str).filter(|s| !s.is_empty());
    let host = text("host");
    let ip = text("ip");
    let port = match f.get("port") {
        Some(serde_json::Value::Number(n)) => format!(":{n}"),
        _ => String::new(),
    };
    // IPv6 in brackets, so the port is not read as part of the address.
    let addr = |a: &str| if a.contains(':') { format!("[{a}]") } else { a.to_owned() };
    let mut cell = match (host, ip) {
        (Some(h), Some(a)) if h != a && h.trim_matches(['[', ']']) != a => format!("{h}{port} ({a})"),
        (_, Some(a)) => format!("{}{port}", addr(a)),
        (Some(h), None) => format!("{h}{port}"),
        (None, None) => format!("-{port}"),
    };
    if misdirected(f) {
        cell.push_str(" !");
    }
    cell
}

fn reset(dirs: &Dirs, force: bool) -> Result<ExitCode> {
    if !force
        && !output::confirm_or("remove every rule you added, globally and in every sandbox?", "`ppp policy reset -f`")?
    {
        output::println("nothing changed")?;
        return Ok(ExitCode::SUCCESS);
    }
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    let mut removed = 0;
    let gpath = dirs.global_policy();
    if let Some(mut g) = policy::load_global(&gpath)? {
        let before = g.rules.len();
        g.rules.retain(|r| r.source != Source::Local);
        if g.rules.len() != before {
            removed += before - g.rules.len();
            policy::save_global(&gpath, &g)?;
        }
    }
    for name in sandboxes_with_policy(dirs)? {
        let path = dirs.sandbox_policy(&name);
        if let Some(mut f) = policy::load_sandbox(&path)? {
            let before = f.rules.len();
            f.rules.retain(|r| r.source != Source::Local);
            if f.rules.len() != before {
                removed += before - f.rules.len();
                policy::save_sandbox(&path, &f)?;
            }
        }
    }
    drop(lock);
    proxy::reload_or_warn(dirs);
    output::println(&format!("removed {removed} rule{}", if removed == 1 { "" } else { "s" }))?;
    Ok(ExitCode::SUCCESS)
}

/// Which rules `policy rm` removes: clap lets exactly one selector through.
enum Doomed<'a> {
    Id(&'a str),
    Resource(&'a str, Vec<Resource>),
    Source(SourceSelector),
}

impl Doomed<'_> {
    /// The ids of the rules in `rules` this selects.
    fn ids(&self, rules: &[Rule]) -> Result<Vec<uuid::Uuid>> {
        Ok(match self {
            Doomed::Id(id) => by_id_prefix(rules, |r| r.id.to_string(), id)?.map(|r| r.id).into_iter().collect(),
            Doomed::Resource(_, res) => rules.iter().filter(|r| res.contains(&r.resource)).map(|r| r.id).collect(),
            Doomed::Source(sel) => rules.iter().filter(|r| sel.matches(r)).map(|r| r.id).collect(),
        })
    }

    /// "id `3f2a`", for "no rule with … in …".
    fn describe(&self) -> String {
        match self {
            Doomed::Id(id) => format!("id `{id}`"),
            Doomed::Resource(r, _) => format!("resource `{r}`"),
            Doomed::Source(sel) => format!("source `{sel}`"),
        }
    }
}

fn rm(
    dirs: &Dirs,
    kind: RuleKind,
    sandbox_name: Option<&str>,
    id: Option<&str>,
    resource: Option<&str>,
    source: Option<&str>,
) -> Result<ExitCode> {
    if let Some(s) = sandbox_name {
        sandbox::validate_name(s)?;
    }
    let doomed = match (id, resource, source) {
        (Some(id), _, _) => Doomed::Id(id),
        (None, Some(r), _) => Doomed::Resource(r, parse_resources(r)?),
        (None, None, Some(s)) => Doomed::Source(SourceSelector::parse(s)?),
        (None, None, None) => unreachable!("clap requires one of --id, --resource and --source"),
    };
    let lock = state::Lock::acquire(&dirs.state_lock())?;
    let place = sandbox_name.map_or_else(|| "the global policy".to_owned(), |s| format!("the policy of sandbox `{s}`"));
    let select = |rules: &mut Vec<Rule>| -> Result<Vec<Rule>> {
        // Only rules of the kind named: `rm network --resource x` leaves
        // x's HTTP rules, and the reverse.
        let of_kind: Vec<Rule> = rules.iter().filter(|r| r.kind == kind.rule_type()).cloned().collect();
        let doomed_ids = doomed.ids(&of_kind)?;
        if doomed_ids.is_empty() {
            let what = doomed.describe();
            return Err(fail(format!("no rule with {what} in {place}"))
                .hint("list rules with `ppp policy ls`")
                .code(2)
                .into());
        }
        let (gone, kept) = std::mem::take(rules).into_iter().partition(|r| doomed_ids.contains(&r.id));
        *rules = kept;
        Ok(gone)
    };
    let removed = if let Some(s) = sandbox_name {
        let path = dirs.sandbox_policy(s);
        let mut f = policy::load_sandbox(&path)?.unwrap_or_default();
        let gone = select(&mut f.rules)?;
        policy::save_sandbox(&path, &f)?;
        gone
    } else {
        let path = dirs.global_policy();
        let Some(mut f) = policy::load_global(&path)? else {
            return Err(fail(format!("no rule matches in {place}: it does not exist"))
                .hint(NO_POLICY_HINT)
                .code(2)
                .into());
        };
        let gone = select(&mut f.rules)?;
        policy::save_global(&path, &f)?;
        gone
    };
    drop(lock);
    proxy::reload_or_warn(dirs);
    output::print(&lines(removed.iter().map(|r| short_id(&r.id))))?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn destination_shows_the_address_connected_to_and_marks_a_misdirected_one() {
        let cases = [
            (
                json!({"host": "api.example.com", "ip": "10.77.0.9", "port": 443, "resolved": false}),
                "api.example.com:443 (10.77.0.9) !",
            ),
            (
                json!({"host": "api.example.com", "ip": "203.0.113.7", "port": 443, "resolved": true}),
                "api.example.com:443 (203.0.113.7)",
            ),
            (json!({"host": "api.example.com", "ip": "2001:db8::7", "port": 443}), "api.example.com:443 (2001:db8::7)"),
            (json!({"host": "api.example.com", "ip": null, "port": 443, "resolved": null}), "api.example.com:443"),
            (json!({"host": "10.77.0.9", "ip": "10.77.0.9", "port": 80}), "10.77.0.9:80"),
            (json!({"host": null, "ip": "2001:db8::7", "port": 22}), "[2001:db8::7]:22"),
            (json!({"host": null, "ip": "10.77.0.9", "port": 22, "resolved": false}), "10.77.0.9:22 !"),
            (json!({"host": "h.example", "port": 443}), "h.example:443"),
            (json!({"port": 443}), "-:443"),
            (json!({}), "-"),
        ];
        for (flow, want) in cases {
            assert_eq!(super::destination(&flow), want, "{flow}");
        }
        // Only `false` marks: `true`, null, absent and odd values do not.
        for v in [json!(true), json!(null), json!("false"), json!(0)] {
            assert!(!super::misdirected(&json!({"resolved": v})), "{v}");
        }
        assert!(!super::misdirected(&json!({})));
    }
}

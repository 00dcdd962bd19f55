//! A host is either read or passed through: an allow rule that says
//! `inspect: false` and a secret that would be sent to one of its hosts
//! cannot stand together (ADR 0051), because a key is injected only into a
//! connection ppp reads. `ppp policy allow --no-inspect` and `ppp secret
//! set` both refuse, whichever comes second, with the other named; the
//! daemon forces inspection as well, for a secret that came another way.
//! Matching goes through the one engine ([`Engine`]); this module only
//! pairs scopes and words the refusal.

use anyhow::Result;

use crate::dirs::Dirs;
use crate::error::fail;
use crate::policy::{self, Engine, ResourceKind, Rule, Verdict};
use crate::secret::{self, Kind, Scope};

/// A secret, as far as this check needs it: where it applies, its name and
/// the hosts it is sent to.
pub(crate) struct Keyed<'a> {
    pub scope: &'a Scope,
    pub name: &'a str,
    pub hosts: &'a [String],
}

/// A no-inspect rule that would splice a host a secret is sent to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub rule: uuid::Uuid,
    pub resource: String,
    /// The sandbox whose file holds the rule; `None` for the global file.
    pub rule_sandbox: Option<String>,
    pub secret: String,
    pub secret_scope: String,
    pub host: String,
}

/// The first host of `secrets` that one of `rules` (with the sandbox whose
/// file holds each, `None` for the global file) would pass through unread.
/// Only rules that allow with `inspect: false` count. A global rule or a
/// global secret meets every sandbox; a sandbox's rule meets only that
/// sandbox's secrets.
pub(crate) fn conflict(rules: &[(Option<&str>, &Rule)], secrets: &[Keyed<'_>]) -> Result<Option<Conflict>> {
    for (sandbox, rule) in rules {
        if rule.inspect || rule.decision != Verdict::Allow {
            continue;
        }
        // One rule alone: does it match the host? Any port a key goes to
        // is the rule's own port, when it names one.
        let engine = Engine::build(Verdict::Deny, vec![(*rule).clone()], Vec::new())?;
        let port = rule.resource.port().unwrap_or(policy::DEFAULT_PORT);
        for s in secrets {
            let meets = match (sandbox, s.scope) {
                (None, _) | (_, Scope::Global) => true,
                (Some(a), Scope::Sandbox(b)) => *a == b.as_str(),
            };
            if !meets {
                continue;
            }
            if let Some(host) =
                s.hosts.iter().find(|h| engine.decide(None, Some(h.as_str()), None, port).verdict == Verdict::Allow)
            {
                return Ok(Some(Conflict {
                    rule: rule.id,
                    resource: rule.resource.to_string(),
                    rule_sandbox: sandbox.map(str::to_owned),
                    secret: s.name.to_owned(),
                    secret_scope: s.scope.to_string(),
                    host: host.clone(),
                }));
            }
        }
    }
    Ok(None)
}

impl Conflict {
    fn rule_words(&self) -> String {
        let file = self.rule_sandbox.as_ref().map_or_else(|| "global".to_owned(), |s| format!("sandbox `{s}`"));
        format!("rule `{}` (allow `{}` --no-inspect, {file})", short(&self.rule), self.resource)
    }

    fn secret_words(&self) -> String {
        format!("secret `{}` ({} scope)", self.secret, self.secret_scope)
    }

    /// The refusal of `ppp policy allow … --no-inspect`.
    pub(crate) fn refuse_rule(&self) -> anyhow::Error {
        fail(format!(
            "`{}` cannot be `--no-inspect`: {} is sent to `{}`, and a key is injected only into a connection ppp reads",
            self.resource,
            self.secret_words(),
            self.host
        ))
        .hint(format!(
            "allow it without `--no-inspect`, or remove the secret first (`ppp secret rm {}`)",
            self.secret_rm()
        ))
        .into()
    }

    /// The refusal of `ppp secret set`.
    pub(crate) fn refuse_secret(&self) -> anyhow::Error {
        fail(format!(
            "`{}` cannot get a secret: {} passes it through unread, so no key could be injected",
            self.host,
            self.rule_words()
        ))
        .hint(format!(
            "remove the rule (`ppp policy rm {}`), or allow the host again without `--no-inspect`",
            short(&self.rule)
        ))
        .into()
    }

    fn secret_rm(&self) -> String {
        if self.secret_scope == "global" {
            self.secret.clone()
        } else {
            format!("{} {}", self.secret_scope, self.secret)
        }
    }
}

fn short(id: &uuid::Uuid) -> String {
    id.to_string()[..8].to_owned()
}

/// Every secret of the store's index that is sent with a sandbox's requests
/// (not registry credentials), as [`Keyed`].
pub(crate) fn keyed(entries: &[secret::Entry]) -> Vec<Keyed<'_>> {
    entries
        .iter()
        .filter(|e| e.kind != Kind::Registry)
        .map(|e| Keyed { scope: &e.scope, name: &e.name, hosts: &e.hosts })
        .collect()
}

/// Every rule of every policy file that says `inspect: false`, with the
/// sandbox whose file holds it.
pub(crate) fn rules(dirs: &Dirs) -> Result<Vec<(Option<String>, Rule)>> {
    let (global, sandboxes) = policy::load_files(dirs)?;
    let mut out: Vec<(Option<String>, Rule)> =
        global.into_iter().flat_map(|g| g.rules).filter(|r| !r.inspect).map(|r| (None, r)).collect();
    for (name, f) in sandboxes {
        out.extend(f.rules.into_iter().filter(|r| !r.inspect).map(|r| (Some(name.clone()), r)));
    }
    Ok(out)
}

/// `ppp secret set` for `hosts` in `scope`: refused when a no-inspect rule
/// covers one of them.
pub(crate) fn check_secret(dirs: &Dirs, scope: &Scope, name: &str, hosts: &[String]) -> Result<()> {
    let rules = rules(dirs)?;
    let refs: Vec<(Option<&str>, &Rule)> = rules.iter().map(|(s, r)| (s.as_deref(), r)).collect();
    match conflict(&refs, &[Keyed { scope, name, hosts }])? {
        Some(c) => Err(c.refuse_secret()),
        None => Ok(()),
    }
}

/// A host is read or passed through, never both, for HTTP rules too: they
/// decide on requests, which ppp sees only in a connection it reads (ADR
/// 0050, 0051). `rules` is the file `scope` names (`None`: the global file)
/// as it is about to be written; the other files are read from disk. So
/// `policy allow network H --no-inspect` and `policy allow|deny http H`
/// each refuse when the other is there. Checked for no-inspect rules that
/// name one host exactly: for a pattern, the daemon inspects every host an
/// HTTP rule covers whatever the rule says (`http_rules` in its reply).
pub(crate) fn check_http(dirs: &Dirs, scope: Option<&str>, rules: &[Rule]) -> Result<()> {
    let (mut global, mut sandboxes) = policy::load_files(dirs)?;
    match scope {
        None => {
            let mut g = global.unwrap_or_else(policy::GlobalFile::without_file);
            g.rules = rules.to_vec();
            global = Some(g);
        }
        Some(s) => match sandboxes.iter_mut().find(|(n, _)| n == s) {
            Some((_, f)) => f.rules = rules.to_vec(),
            None => sandboxes.push((s.to_owned(), policy::SandboxFile { rules: rules.to_vec(), ..Default::default() })),
        },
    }
    let names: Vec<String> = sandboxes.iter().map(|(n, _)| n.clone()).collect();
    let exact = |r: &Rule| !r.inspect && r.decision == Verdict::Allow && r.resource.kind() == ResourceKind::Host;
    let mut passed: Vec<(Option<String>, Rule)> =
        global.iter().flat_map(|g| g.rules.iter()).filter(|r| exact(r)).map(|r| (None, r.clone())).collect();
    for (name, f) in &sandboxes {
        passed.extend(f.rules.iter().filter(|r| exact(r)).map(|r| (Some(name.clone()), r.clone())));
    }
    if passed.is_empty() {
        return Ok(());
    }
    let engine = policy::engine_from(global, sandboxes)?;
    for (sandbox, rule) in passed {
        let text = rule.resource.to_string();
        let host = match rule.resource.port() {
            Some(_) => text.rsplit_once(':').map_or(text.as_str(), |(h, _)| h),
            None => text.as_str(),
        };
        let port = rule.resource.port().unwrap_or(policy::DEFAULT_PORT);
        let scopes: Vec<Option<&str>> = match &sandbox {
            Some(s) => vec![Some(s.as_str())],
            None => std::iter::once(None).chain(names.iter().map(|n| Some(n.as_str()))).collect(),
        };
        if scopes.into_iter().any(|s| engine.http_rules_apply(s, Some(host), port)) {
            return Err(fail(format!(
                "`{host}` cannot be both `--no-inspect` and under HTTP rules: HTTP rules decide on requests, which ppp reads only in a connection it inspects"
            ))
            .hint(format!(
                "remove the no-inspect rule (`ppp policy rm {}`) or the HTTP rules for `{host}` (`ppp policy ls`)",
                short(&rule.id)
            ))
            .code(2)
            .into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Resource, Source};

    fn rule(r: &str, inspect: bool) -> Rule {
        let mut rule = Rule::new(Verdict::Allow, Resource::parse(r).unwrap(), Source::Local);
        rule.inspect = inspect;
        rule
    }

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_no_inspect_rule_meets_the_secrets_of_its_hosts_and_scopes() {
        let wild = rule("*.example.com", false);
        let plain = rule("*.example.com", true);
        let api = hosts(&["api.example.com"]);
        let other = hosts(&["example.org"]);
        let (global, red, blue) = (Scope::Global, Scope::Sandbox("red".into()), Scope::Sandbox("blue".into()));
        let key = |scope, hosts| Keyed { scope, name: "svc", hosts };
        let hit = |rules: &[(Option<&str>, &Rule)], secrets: &[Keyed<'_>]| conflict(rules, secrets).unwrap();
        // A global rule meets every scope's secrets; the host is named.
        let c = hit(&[(None, &wild)], &[key(&red, &api)]).unwrap();
        assert_eq!((c.host.as_str(), c.secret_scope.as_str(), c.rule), ("api.example.com", "red", wild.id));
        // A sandbox's rule meets its own and global secrets, not another's.
        assert!(hit(&[(Some("red"), &wild)], &[key(&global, &api)]).is_some());
        assert!(hit(&[(Some("red"), &wild)], &[key(&red, &api)]).is_some());
        assert!(hit(&[(Some("red"), &wild)], &[key(&blue, &api)]).is_none());
        // Hosts the rule does not match, and inspected rules, never conflict.
        assert!(hit(&[(None, &wild)], &[key(&global, &other)]).is_none());
        assert!(hit(&[(None, &plain)], &[key(&global, &api)]).is_none());
        // A port in the rule still meets a key, which goes to any port.
        let port = rule("api.example.com:8443", false);
        assert!(hit(&[(None, &port)], &[key(&global, &api)]).is_some());
    }

    #[test]
    fn refusals_name_the_other_side_and_the_way_out() {
        let r = rule("api.example.com", false);
        let c = conflict(
            &[(Some("red"), &r)],
            &[Keyed { scope: &Scope::Sandbox("red".into()), name: "example", hosts: &hosts(&["api.example.com"]) }],
        )
        .unwrap()
        .unwrap();
        let short = short(&r.id);
        let rule_err = format!("{:#}", c.refuse_rule());
        assert!(rule_err.contains("secret `example` (red scope) is sent to `api.example.com`"), "{rule_err}");
        let secret_err = format!("{:#}", c.refuse_secret());
        assert!(
            secret_err.contains(&format!("rule `{short}` (allow `api.example.com` --no-inspect, sandbox `red`)")),
            "{secret_err}"
        );
    }
}

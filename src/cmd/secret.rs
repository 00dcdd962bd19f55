//! `ppp secret …`: store, import, list and remove the API keys the proxy
//! injects. Storage lives in [`crate::secret`]; this module parses scopes,
//! reads values without echoing them, and prints. No value is ever printed,
//! logged or put in an error message.

use std::io::{IsTerminal, Read};
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::Ctx;
use crate::cli::{SecretCommand, SecretRmArgs, SecretSetArgs, SecretSetCustomArgs};
use crate::dirs::Dirs;
use crate::error::{Failure, fail};
use crate::secret::{self, Kind, Scope, Source, Store, Value, command, services};
use crate::{output, proxy, sandbox};

/// Run `ppp secret …`.
pub fn run(cmd: &SecretCommand, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    match cmd {
        SecretCommand::Set(a) => set(dirs, a),
        SecretCommand::SetCustom(a) => set_custom(dirs, a),
        SecretCommand::Import { service, all, dry_run, force } => {
            import(dirs, service.as_deref(), *all, *dry_run, *force)
        }
        SecretCommand::Ls { sandbox, global, service, json, quiet } => {
            ls(dirs, sandbox.as_deref(), *global, service.as_deref(), *json, *quiet)
        }
        SecretCommand::Rm(a) => rm(dirs, a),
    }
}

/// Tell a running daemon. The proxy sees a secret change without it (the
/// store's index moved, docs/adr/0040), so a failed reload only means the
/// daemon's policy is still the old one: say that, not that the secret
/// change is pending.
fn reload(dirs: &Dirs) {
    if let proxy::Reload::Failed(why) = proxy::notify_reload(dirs) {
        eprintln!("warning: the running daemon did not reload its policy: {why}");
        eprintln!("note: the secret change applies to the next request all the same");
        eprintln!("hint: fix the policy, or restart the daemon with `ppp daemon stop && ppp daemon start -d`");
    }
}

/// Resolve `[-g | SANDBOX] NAME`. One name alone is global: that is what
/// `ppp secret set usai --host …` means.
fn scope_and_name(names: &[String], global: bool) -> Result<(Scope, String)> {
    match names {
        [name] => Ok((Scope::Global, name.clone())),
        [sb, name] if !global => {
            sandbox::validate_name(sb)?;
            Ok((Scope::Sandbox(sb.clone()), name.clone()))
        }
        [sb, _] => Err(fail(format!("both -g and sandbox `{sb}` were given")).hint("use one of them").code(2).into()),
        _ => Err(fail("expected `[SANDBOX] SERVICE`").code(2).into()),
    }
}

fn scope_words(scope: &Scope) -> String {
    match scope {
        Scope::Global => "for every sandbox".to_owned(),
        Scope::Sandbox(s) => format!("for sandbox `{s}`"),
    }
}

/// Read a secret value: from `--token`/`--value`, from stdin with
/// `--password-stdin`, or from a no-echo prompt on a terminal.
fn read_value(given: Option<&str>, from_stdin: bool, what: &str, stdin_flag: &str) -> Result<Value> {
    let raw = if let Some(v) = given {
        v.to_owned()
    } else if from_stdin {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("could not read the value from standard input")?;
        // Only the line ending `echo` adds; inner whitespace is the user's.
        let trimmed = s.trim_end_matches(['\n', '\r']).to_owned();
        zeroize::Zeroize::zeroize(&mut s);
        trimmed
    } else if std::io::stdin().is_terminal() {
        rpassword::prompt_password(format!("value for {what} (input is hidden): "))
            .context("could not read the value from the terminal")?
    } else {
        return Err(fail("no value given and standard input is not a terminal")
            .hint(format!("pipe it in with {stdin_flag}"))
            .code(2)
            .into());
    };
    if raw.trim().is_empty() {
        return Err(fail("the value is empty").code(2).into());
    }
    Ok(Value::new(raw))
}

fn set(dirs: &Dirs, a: &SecretSetArgs) -> Result<ExitCode> {
    if a.oauth {
        return Err(Failure::not_available("secret set --oauth").into());
    }
    if a.registry {
        return set_registry(dirs, a);
    }
    let (scope, service) = match (&a.sandbox, a.names.as_slice()) {
        (Some(sb), [name]) => {
            sandbox::validate_name(sb)?;
            (Scope::Sandbox(sb.clone()), name.clone())
        }
        (Some(_), _) => {
            return Err(fail("the sandbox is given twice, as --sandbox and as SANDBOX")
                .hint("use one of them")
                .code(2)
                .into());
        }
        (None, names) => scope_and_name(names, a.global)?,
    };
    secret::validate::service(&service)?;
    if services::builtin(&service).is_none() && a.hosts.is_empty() {
        if secret::validate::looks_like_secret(&service) {
            return Err(fail(
                "ppp does not know that service, and its name looks like a secret value, so it is not shown",
            )
            .hint("give the value at the prompt or with --password-stdin, never as an argument")
            .code(2)
            .into());
        }
        return Err(fail(format!("ppp does not know the hosts of service `{service}`"))
            .hint(format!("name them: `ppp secret set {service} --host api.example.com`"))
            .code(2)
            .into());
    }
    let hosts = match services::builtin(&service) {
        Some(spec) if a.hosts.is_empty() => spec.hosts.iter().map(|h| (*h).to_owned()).collect(),
        _ => a.hosts.clone(),
    };
    super::policy::no_inspect::check_secret(dirs, &scope, &service, &hosts)?;
    if let Some(line) = &a.command {
        let (argv, refresh) = command_source(line, a.refresh.as_deref())?;
        let store = Store::open(dirs)?;
        store.set_service_from(&scope, &service, &a.hosts, None, Source::Command { argv, refresh })?;
        reload(dirs);
        output::println(&format!(
            "stored `{service}` {} from a command, run by the daemon every {}",
            scope_words(&scope),
            command::show_refresh(refresh.as_secs())
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let value = read_value(a.token.as_deref(), a.password_stdin, &format!("`{service}`"), "--password-stdin")?;
    let store = Store::open(dirs)?;
    store.set_service(&scope, &service, &a.hosts, &value)?;
    reload(dirs);
    output::println(&format!("stored `{service}` {} ({})", scope_words(&scope), store.backend()))?;
    Ok(ExitCode::SUCCESS)
}

/// `--command CMD [--refresh DURATION]`: the argv and the interval.
fn command_source(line: &str, refresh: Option<&str>) -> Result<(Vec<String>, std::time::Duration)> {
    let argv = command::split(line).context("`--command` cannot be run")?;
    let refresh = match refresh {
        Some(r) => command::parse_refresh(r)?,
        None => command::DEFAULT_REFRESH,
    };
    Ok((argv, refresh))
}

/// `ppp secret set --registry HOST`: credentials `ppp kit push/pull` send to
/// that registry, `user:password` or a bearer token. Global only.
fn set_registry(dirs: &Dirs, a: &SecretSetArgs) -> Result<ExitCode> {
    let [host] = a.names.as_slice() else {
        return Err(fail("`--registry` takes one registry, such as `ppp secret set --registry localhost:5000`")
            .code(2)
            .into());
    };
    if a.sandbox.is_some() || !a.hosts.is_empty() {
        return Err(fail("registry credentials are global and name no hosts")
            .hint(format!("drop --sandbox and --host: `ppp secret set --registry {host}`"))
            .code(2)
            .into());
    }
    let host = secret::validate::registry(host)?;
    let value = read_value(
        a.token.as_deref(),
        a.password_stdin,
        &format!("registry `{host}` (user:password or token)"),
        "--password-stdin",
    )?;
    let store = Store::open(dirs)?;
    store.set_registry(&host, &value)?;
    output::println(&format!("stored credentials for registry `{host}` ({})", store.backend()))?;
    Ok(ExitCode::SUCCESS)
}

/// `ppp secret rm --registry HOST`.
fn rm_registry(dirs: &Dirs, a: &SecretRmArgs) -> Result<ExitCode> {
    let [host] = a.names.as_slice() else {
        return Err(fail("`--registry` takes one registry, such as `ppp secret rm --registry localhost:5000`")
            .code(2)
            .into());
    };
    let host = secret::validate::registry(host)?;
    let store = Store::open(dirs)?;
    if !store.exists(&Scope::Global, &host, Kind::Registry)? {
        return Err(fail(format!("no credentials are stored for registry `{host}`"))
            .hint("list secrets with `ppp secret ls`")
            .code(2)
            .into());
    }
    if !a.force
        && !output::confirm_or(
            &format!("remove the credentials for registry `{host}`?"),
            &format!("`ppp secret rm -f --registry {host}`"),
        )?
    {
        output::println("nothing changed")?;
        return Ok(ExitCode::SUCCESS);
    }
    store.remove(&Scope::Global, &host, Kind::Registry)?;
    output::println(&format!("removed the credentials for registry `{host}`"))?;
    Ok(ExitCode::SUCCESS)
}

fn set_custom(dirs: &Dirs, a: &SecretSetCustomArgs) -> Result<ExitCode> {
    let scope = match &a.sandbox {
        Some(s) => {
            sandbox::validate_name(s)?;
            Scope::Sandbox(s.clone())
        }
        None => Scope::Global,
    };
    super::policy::no_inspect::check_secret(dirs, &scope, &a.placeholder, &a.hosts)?;
    if let Some(line) = &a.command {
        let (argv, refresh) = command_source(line, a.refresh.as_deref())?;
        let store = Store::open(dirs)?;
        store.set_custom_from(&scope, &a.placeholder, &a.hosts, a.env.as_deref(), Source::Command { argv, refresh })?;
        reload(dirs);
        output::println(&format!(
            "stored a value for placeholder `{}` {} from a command, run by the daemon every {}",
            a.placeholder,
            scope_words(&scope),
            command::show_refresh(refresh.as_secs())
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let given = a.value.as_deref().or(a.token.as_deref());
    let value = read_value(given, a.password_stdin, &format!("placeholder `{}`", a.placeholder), "--password-stdin")?;
    let store = Store::open(dirs)?;
    store.set_custom(&scope, &a.placeholder, &a.hosts, a.env.as_deref(), &value)?;
    reload(dirs);
    output::println(&format!(
        "stored a value for placeholder `{}` {} ({})",
        a.placeholder,
        scope_words(&scope),
        store.backend()
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// The first non-empty variable of `vars`, with its name.
pub(crate) fn from_env(vars: &[&'static str]) -> Option<(&'static str, Value)> {
    vars.iter().find_map(|v| {
        let val = std::env::var(v).ok().filter(|s| !s.trim().is_empty())?;
        Some((*v, Value::new(val)))
    })
}

/// `ppp secret import`: store keys found in the environment; `ppp setup
/// --import-secrets` calls it too.
pub(crate) fn import(dirs: &Dirs, only: Option<&str>, all: bool, dry_run: bool, force: bool) -> Result<ExitCode> {
    if let Some(s) = only
        && services::builtin(s).is_none()
    {
        let known: Vec<&str> = services::all().iter().map(|s| s.name).collect();
        return Err(fail(format!("`{s}` is not a service ppp imports"))
            .hint(format!("one of: {}", known.join(", ")))
            .code(2)
            .into());
    }
    let found: Vec<(&'static str, &'static str, Value)> = services::all()
        .iter()
        .filter(|s| only.is_none_or(|o| o == s.name))
        .filter_map(|s| from_env(s.env_vars).map(|(var, v)| (s.name, var, v)))
        .collect();
    if found.is_empty() {
        let what = only.map_or_else(|| "any service".to_owned(), |s| format!("`{s}`"));
        return Err(fail(format!("no environment variable holds a key for {what}"))
            .hint("see `ppp secret import --help` for the variables read")
            .into());
    }
    if only.is_none() && !all {
        let names: Vec<String> = found.iter().map(|(s, v, _)| format!("{s} (from {v})")).collect();
        return Err(fail(format!("found keys for {}", names.join(", ")))
            .hint("pass --all to import them all, or name one service")
            .code(2)
            .into());
    }
    let store = Store::open(dirs)?;
    let mut imported = 0;
    for (service, var, value) in &found {
        let exists = store.exists(&Scope::Global, service, Kind::Service)?;
        let line = if exists && !force {
            format!("skipped {service}: already stored (pass -f to overwrite)")
        } else if dry_run {
            format!("would import {service} from {var}")
        } else {
            let hosts: Vec<String> = services::builtin(service)
                .map(|s| s.hosts.iter().map(|h| (*h).to_owned()).collect())
                .unwrap_or_default();
            super::policy::no_inspect::check_secret(dirs, &Scope::Global, service, &hosts)?;
            store.set_service(&Scope::Global, service, &[], value)?;
            imported += 1;
            format!("imported {service} from {var}")
        };
        output::println(&line)?;
    }
    if imported > 0 {
        reload(dirs);
    }
    Ok(ExitCode::SUCCESS)
}

fn ls(
    dirs: &Dirs,
    sandbox_name: Option<&str>,
    global: bool,
    service: Option<&str>,
    json: bool,
    quiet: bool,
) -> Result<ExitCode> {
    if let Some(s) = sandbox_name {
        sandbox::validate_name(s)?;
    }
    let store = Store::open(dirs)?;
    let entries: Vec<_> = store
        .list()?
        .into_iter()
        .filter(|e| match (&e.scope, sandbox_name) {
            _ if global => e.scope == Scope::Global,
            (Scope::Sandbox(s), Some(want)) => s == want,
            (Scope::Global, Some(_)) => false,
            (_, None) => true,
        })
        .filter(|e| service.is_none_or(|s| e.name == s))
        .collect();
    let status = command::load_status(&dirs.secret_status());
    let last = |e: &secret::Entry| status.get(&e.key()).cloned().unwrap_or_default();
    if json {
        // The index's fields but the command line (which may name a vault
        // path or carry a token in `sh -c '…'`), plus the source and the
        // daemon's last runs; never a value or an output.
        let rows: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| {
                let mut v = serde_json::to_value(e).unwrap_or_default();
                if let Some(m) = v.as_object_mut() {
                    m.remove("command");
                    m.remove("refresh");
                    m.insert("source".into(), source_word(e).into());
                    if e.command.is_some() {
                        let st = last(e);
                        m.insert("refresh".into(), e.refresh.into());
                        m.insert("last_refresh".into(), rfc3339(st.last_refresh).into());
                        m.insert("last_failure".into(), rfc3339(st.last_failure).into());
                        m.insert("error".into(), st.error.into());
                    }
                }
                v
            })
            .collect();
        output::json(&rows)?;
        return Ok(ExitCode::SUCCESS);
    }
    if quiet {
        let mut names = String::new();
        for e in &entries {
            names.push_str(&e.name);
            names.push('\n');
        }
        output::print(&names)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.scope.to_string(),
                e.name.clone(),
                e.kind.to_string(),
                if e.hosts.is_empty() { "-".to_owned() } else { e.hosts.join(",") },
                if e.command.is_some() { "-".to_owned() } else { e.backend.to_string() },
                source_word(e).to_owned(),
                e.refresh.map_or_else(|| "-".to_owned(), command::show_refresh),
                match (e.command.is_some(), last(e)) {
                    (false, _) => "-".to_owned(),
                    (true, st) if st.error.is_some() && st.last_failure > st.last_refresh => "failed".to_owned(),
                    (true, st) => rfc3339(st.last_refresh).unwrap_or_else(|| "never".to_owned()),
                },
            ]
        })
        .collect();
    output::print(&output::table(
        &["SCOPE", "NAME", "KIND", "HOSTS", "BACKEND", "SOURCE", "REFRESH", "LAST REFRESH"],
        &rows,
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn source_word(e: &secret::Entry) -> &'static str {
    if e.command.is_some() { "command" } else { "static" }
}

fn rfc3339(t: Option<time::OffsetDateTime>) -> Option<String> {
    t.and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
}

fn rm(dirs: &Dirs, a: &SecretRmArgs) -> Result<ExitCode> {
    if a.registry {
        return rm_registry(dirs, a);
    }
    let (scope, name) = scope_and_name(&a.names, a.global)?;
    let store = Store::open(dirs)?;
    // Look the name up in the index rather than validating it as a service
    // name first: custom placeholders follow other rules (`PPP_JIRA`).
    let kinds: Vec<Kind> =
        store.list()?.into_iter().filter(|e| e.scope == scope && e.name == name).map(|e| e.kind).collect();
    let kind = match (a.custom, kinds.contains(&Kind::Service), kinds.contains(&Kind::Custom)) {
        (false, true, _) => Kind::Service,
        (_, _, true) => Kind::Custom,
        _ => {
            let what = if a.custom { "custom secret" } else { "secret" };
            return Err(fail(format!("no {what} `{name}` is stored {}", scope_words(&scope)))
                .hint("list secrets with `ppp secret ls`")
                .code(2)
                .into());
        }
    };
    if !a.force
        && !output::confirm_or(
            &format!("remove `{name}` {}?", scope_words(&scope)),
            &format!(
                "`ppp secret rm -f{}{} {}`",
                if a.global { " -g" } else { "" },
                if a.custom { " --custom" } else { "" },
                a.names.join(" ")
            ),
        )?
    {
        output::println("nothing changed")?;
        return Ok(ExitCode::SUCCESS);
    }
    store.remove(&scope, &name, kind)?;
    reload(dirs);
    output::println(&format!("removed `{name}` {}", scope_words(&scope)))?;
    Ok(ExitCode::SUCCESS)
}

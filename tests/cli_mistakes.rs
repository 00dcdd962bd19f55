//! The mistakes users make most, each with the exact lines ppp prints: what
//! went wrong (`error:`), why (`caused by:`), and the command that fixes it
//! (`hint:`). Issue 5, "Everyday polish across the CLI". Mistakes covered
//! elsewhere (an unknown agent for `run`, `stop`/`rm` of an unknown
//! sandbox, `rm` without a terminal) live in `cli_sandbox_errors.rs`.

mod common;

use common::{World, ok, output};

/// Run and return (exit code, stderr with the temp root as `[ROOT]`).
fn fails(w: &World, cmd: &mut std::process::Command) -> (i32, String) {
    let (code, out, err) = output(cmd);
    assert_ne!(code, 0, "expected a failure; stdout:\n{out}");
    (code, w.redact(&err))
}

/// Mistake 1: podman is missing: `PPP_PODMAN` points nowhere, or it is not on PATH.
#[test]
fn podman_missing() {
    let w = World::new();
    w.stopped_sandbox("red");
    let (code, err) = fails(&w, w.ppp(["stop", "red"]).env("PPP_PODMAN", w.path().join("nowhere/podman")));
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "error: podman was not found at `[ROOT]/nowhere/podman` (PPP_PODMAN)\n\
         hint: install Podman (https://podman.io/docs/installation), or set PPP_PODMAN to its path; \
         `ppp setup` checks everything ppp needs\n"
    );
    let (code, err) = fails(&w, w.ppp(["exec", "red", "--", "true"]).env("PATH", w.bin()));
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "error: podman was not found\n\
         hint: install Podman (https://podman.io/docs/installation), or set PPP_PODMAN to its path; \
         `ppp setup` checks everything ppp needs\n"
    );
}

/// Mistake 2: No policy initialised: everything is denied, and the hint names
/// `ppp policy init`.
#[test]
fn no_policy_initialised() {
    let w = World::new();
    let (code, out, err) = output(&mut w.ppp(["policy", "check", "network", "x.com"]));
    assert_eq!(code, 0, "a check is an answer, not a failure");
    assert_eq!(out, "deny  x.com:443  by no policy exists\n");
    assert_eq!(
        err,
        "hint: no global policy exists, so everything is denied; choose a preset with \
         `ppp policy init balanced` (or `allow-all`, `deny-all`)\n"
    );
}

/// Mistake 3: An unknown sandbox, for the commands that take one besides stop/rm.
#[test]
fn unknown_sandbox() {
    let w = World::new();
    for args in
        [&["exec", "ghost", "--", "true"][..], &["ports", "ghost", "--publish", "8080:80"], &["cp", "ghost:/a", "."]]
    {
        let (code, err) = fails(&w, &mut w.ppp(args));
        assert_eq!(code, 2, "{args:?}");
        assert_eq!(err, "error: no sandbox named `ghost`\nhint: list sandboxes with `ppp ls`\n", "{args:?}");
    }
}

/// Mistake 4: A host port that another program holds: said now, not when the
/// agent next starts and podman fails.
#[test]
fn host_port_in_use() {
    let w = World::new();
    let dirs = w.stopped_sandbox("red");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let spec = format!("{port}:80");
    let (code, err) = fails(&w, &mut w.ppp(["ports", "red", "--publish", &spec]));
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "error: host port {port}/tcp on 127.0.0.1 is already in use by another program\n\
             hint: choose another host port, or give only the sandbox port to get a free one: \
             `ppp ports red --publish 80`\n"
        )
    );
    assert!(ppp::sandbox::load(&dirs, "red").unwrap().unwrap().published.is_empty(), "nothing recorded");
    drop(taken);
    // Published twice by the same sandbox: the hint says how to undo it.
    ok(&mut w.ppp(["ports", "red", "--publish", &spec]));
    let (code, err) = fails(&w, &mut w.ppp(["ports", "red", "--publish", &spec]));
    assert_eq!(code, 2);
    assert_eq!(
        err,
        format!(
            "error: host port {port}/tcp is already published as 127.0.0.1:{port}->80/tcp\n\
             hint: remove it first with `ppp ports red --unpublish {port}:80/tcp`\n"
        )
    );
}

/// Mistake 5: No daemon running: stopping it or setting its log level is not an
/// error, and says what happened.
#[test]
fn daemon_not_running() {
    let w = World::new();
    let (code, out, err) = output(&mut w.ppp(["daemon", "stop"]));
    assert_eq!((code, out.as_str(), err.as_str()), (0, "the ppp daemon is not running\n", ""));
    let (code, out, err) = output(&mut w.ppp(["daemon", "log-level", "proxy", "debug"]));
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, "proxy log level set to debug; it applies when the daemon next starts\n", "")
    );
}

/// Mistake 6: An agent ppp does not know, for `create` (run is covered in
/// `cli_sandbox_errors.rs`).
#[test]
fn unknown_agent() {
    let w = World::new();
    let (code, err) = fails(&w, &mut w.ppp(["create", "copilot", "."]));
    assert_eq!(code, 2, "naming an agent that does not exist is a usage mistake");
    assert_eq!(err, "error: unknown agent `copilot`\nhint: ppp runs these agents: opencode, claude, codex, gemini\n");
}

/// Mistake 7: A workspace path that does not exist, said in words.
#[test]
fn workspace_missing() {
    let w = World::new();
    let (code, err) = fails(&w, &mut w.ppp(["run", "opencode", "nope"]));
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "error: workspace `nope` cannot be used: it does not exist\nhint: pass a directory that exists, e.g. `.`\n"
    );
}

/// Mistake 8: A secret name with characters a service name cannot have.
#[test]
fn invalid_secret_name() {
    let w = World::new();
    let (code, err) = fails(&w, w.ppp(["secret", "set", "-g", "Bad!", "-t", "x"]).env("PPP_SECRET_BACKEND", "file"));
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "error: `Bad!` is not a valid service name\n\
         hint: use lower-case letters, digits, `-` and `_`, starting with a letter or digit, at most 64 characters\n"
    );
}

/// Mistake 9: A hand-edited policies.yaml that does not parse: the file, line and
/// column, and how to recover.
#[test]
fn malformed_policies_yaml() {
    let w = World::new();
    std::fs::write(w.config().join("policies.yaml"), "default: deny\nrules:\n  - [\n").unwrap();
    for args in [&["policy", "ls"][..], &["policy", "allow", "network", "x.com"]] {
        let (code, err) = fails(&w, &mut w.ppp(args));
        assert_eq!(code, 1, "{args:?}");
        assert_eq!(
            err,
            "error: `[ROOT]/config/policies.yaml` line 3, column 5: rules[0]: invalid type: sequence, expected struct Rule\n\
             hint: fix that line (docs/policy.md shows the format), or move the file away and run \
             `ppp policy init balanced`\n",
            "{args:?}"
        );
    }
    // Never rewritten.
    assert_eq!(std::fs::read_to_string(w.config().join("policies.yaml")).unwrap(), "default: deny\nrules:\n  - [\n");
}

/// Mistake 10: A command that asks first, run without a terminal (a script): the
/// hint is the exact command that runs without asking.
#[test]
fn confirmation_without_a_terminal() {
    let w = World::new();
    let (code, err) = fails(&w, &mut w.ppp(["policy", "reset"]));
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "error: cannot ask \"remove every rule you added, globally and in every sandbox?\": \
         standard input is not a terminal\n\
         hint: to go ahead without asking, run `ppp policy reset -f`\n"
    );
    let secret = |args: &[&str]| {
        let mut c = w.ppp(args);
        c.env("PPP_SECRET_BACKEND", "file");
        c
    };
    ok(&mut secret(&["secret", "set", "-g", "anthropic", "-t", "sk-test"]));
    let (code, err) = fails(&w, &mut secret(&["secret", "rm", "-g", "anthropic"]));
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "error: cannot ask \"remove `anthropic` for every sandbox?\": standard input is not a terminal\n\
         hint: to go ahead without asking, run `ppp secret rm -f -g anthropic`\n"
    );
}

/// Mistake 11: Resources separated by ", " as in prose.
#[test]
fn resources_with_spaces() {
    let w = World::new();
    let (code, err) = fails(&w, &mut w.ppp(["policy", "allow", "network", "a.com, b.com"]));
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "error: resource 2 of `a.com, b.com`: ` b.com` contains whitespace\n\
         hint: separate resources with commas and no spaces, e.g. `api.example.com,cdn.example.com`\n"
    );
}

/// A command name with one slip gets clap's tip, even where clap's own
/// measure finds nothing near (`rn`).
#[test]
fn mistyped_command_names_the_near_ones() {
    let w = World::new();
    let (code, out, err) = output(&mut w.ppp(["rn", "opencode", "."]));
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.starts_with("error: unrecognized subcommand 'rn'\n\n  tip: some similar subcommands exist: 'run', 'rm'\n"),
        "{err}"
    );
    let (code, _, err) = output(&mut w.ppp(["policy", "chek", "network", "x.com"]));
    assert_eq!(code, 2);
    assert!(err.contains("tip: a similar subcommand exists: 'check'"), "{err}");
}

/// An empty resource (`"$HOST"` unset) suggests naming a host, not `**`,
/// which would allow everything.
#[test]
fn empty_resource_suggests_a_host() {
    let w = World::new();
    let (code, err) = fails(&w, &mut w.ppp(["policy", "allow", "network", ""]));
    assert_eq!(code, 2);
    assert_eq!(err, "error: resource is empty\nhint: name a host, such as `api.example.com` or `*.example.com`\n");
}

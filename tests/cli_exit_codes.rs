//! Exit codes, across every command: 2 for a usage mistake (the command
//! line asks for something that cannot be: a bad flag or value, or a name
//! that does not exist), 1 for a failure while doing it (podman missing, a
//! malformed file), 0 otherwise. docs/user-guide/README.md documents the
//! split; issue 14 found unknown agents, secrets and rule ids exiting 1.

mod common;

use common::{World, output};

/// What a row needs in its world before ppp runs.
#[derive(Clone, Copy)]
enum Given {
    Nothing,
    /// A stopped sandbox `red` on disk.
    Sandbox,
    /// A `policies.yaml` that does not parse.
    BadPolicy,
    /// The balanced preset.
    Policy,
}

/// One command line and the exit code and first stderr line it must give.
struct Row {
    args: &'static [&'static str],
    given: Given,
    code: i32,
    /// The start of stderr's first line.
    says: &'static str,
}

const fn row(args: &'static [&'static str], given: Given, code: i32, says: &'static str) -> Row {
    Row { args, given, code, says }
}

use Given::{BadPolicy, Nothing, Policy, Sandbox};

/// Usage mistakes exit 2, one or more for every command.
const USAGE: &[Row] = &[
    row(&["rn"], Nothing, 2, "error: unrecognized subcommand 'rn'"),
    row(&["--bogus", "ls"], Nothing, 2, "error: unexpected argument '--bogus'"),
    row(&["completion", "tcsh"], Nothing, 2, "error: invalid value 'tcsh'"),
    row(&["cp", "ghost:/a", "."], Nothing, 2, "error: no sandbox named `ghost`"),
    row(&["cp", "a", "b"], Nothing, 2, "error: "),
    row(&["create", "copilot", "."], Nothing, 2, "error: unknown agent `copilot`"),
    row(&["create", "opencode", "nope"], Nothing, 2, "error: workspace `nope` cannot be used"),
    row(&["daemon", "log-level", "proxy", "loud"], Nothing, 2, "error: invalid value 'loud'"),
    row(&["daemon", "start", "--policy", "open"], Nothing, 2, "error: invalid value 'open'"),
    row(&["diagnose", "-o", "html"], Nothing, 2, "error: invalid value 'html'"),
    row(&["exec", "ghost", "--", "true"], Nothing, 2, "error: no sandbox named `ghost`"),
    row(&["kit", "add", "ghost", "nowhere"], Nothing, 2, "error: "),
    row(&["kit", "validate", "nowhere"], Nothing, 2, "error: kit `nowhere` was not found"),
    row(&["ls", "--json", "-q"], Nothing, 2, "error: the argument '--json' cannot be used with '--quiet'"),
    row(&["policy", "init", "open"], Nothing, 2, "error: invalid value 'open'"),
    row(&["policy", "allow", "network", ""], Nothing, 2, "error: resource is empty"),
    row(&["policy", "deny", "network", "a..b"], Nothing, 2, "error: "),
    row(&["policy", "check", "network", "a b"], Nothing, 2, "error: invalid target"),
    row(&["policy", "inspect", "deadbeef"], Policy, 2, "error: no rule has id `deadbeef`"),
    row(&["policy", "log", "ghost"], Nothing, 2, "error: no sandbox named `ghost`"),
    row(&["policy", "ls", "--decision", "maybe"], Nothing, 2, "error: invalid value 'maybe'"),
    row(&["policy", "budget", "set", "red"], Nothing, 2, "error: the following required arguments"),
    row(&["policy", "budget", "set", "red", "--tokens", "lots"], Nothing, 2, "error: invalid value 'lots'"),
    row(&["policy", "budget", "ls", "Red"], Nothing, 2, "error: invalid sandbox name `Red`"),
    row(&["policy", "budget", "rm", "red"], Nothing, 2, "error: there is no budget for `red`"),
    row(&["policy", "reset"], Policy, 2, "error: cannot ask"),
    row(&["policy", "rm", "network", "--id", "deadbeef"], Policy, 2, "error: no rule with id `deadbeef`"),
    row(&["policy", "rm", "network", "--resource", "nothere.example"], Policy, 2, "error: no rule with"),
    row(&["ports", "ghost"], Nothing, 2, "error: no sandbox named `ghost`"),
    row(&["ports", "red", "--publish", "x"], Sandbox, 2, "error: "),
    row(&["reset"], Nothing, 2, "error: cannot ask"),
    row(&["rm", "ghost"], Nothing, 2, "error: no sandbox named `ghost`"),
    row(&["run", "copilot", "."], Nothing, 2, "error: unknown agent `copilot`"),
    row(&["secret", "set", "-g", "Bad!", "-t", "x"], Nothing, 2, "error: `Bad!` is not a valid service name"),
    row(&["secret", "rm", "-g", "-f", "anthropic"], Nothing, 2, "error: no secret `anthropic` is stored"),
    row(&["secret", "import", "nothing-known"], Nothing, 2, "error: "),
    row(&["secret", "ls", "--bogus"], Nothing, 2, "error: unexpected argument '--bogus'"),
    row(&["secret", "set-custom", "-g", "--host", "x.example"], Nothing, 2, "error: the following required"),
    row(&["setup", "--bogus"], Nothing, 2, "error: unexpected argument '--bogus'"),
    row(&["stop", "ghost"], Nothing, 2, "error: no sandbox named `ghost`"),
    row(&["template", "save", "ghost", "t1"], Nothing, 2, "error: no sandbox named `ghost`"),
    row(&["template", "load", "nothere.tar"], Nothing, 2, "error: `nothere.tar` does not exist"),
    row(&["template", "rm", "t1"], Nothing, 2, "error: no template with tag or id `t1`"),
    row(&["template", "ls", "--bogus"], Nothing, 2, "error: unexpected argument '--bogus'"),
    row(&["tui"], Nothing, 2, "error: `ppp tui` needs a terminal"),
    row(&["version", "--bogus"], Nothing, 2, "error: unexpected argument '--bogus'"),
];

/// Failures while doing what was asked exit 1.
const RUNTIME: &[Row] = &[
    row(&["stop", "red"], Sandbox, 1, "error: podman was not found"),
    row(&["exec", "red", "--", "true"], Sandbox, 1, "error: podman was not found"),
    row(&["policy", "ls"], BadPolicy, 1, "error: "),
    row(&["policy", "check", "network", "x.example"], BadPolicy, 1, "error: "),
    row(&["policy", "allow", "network", "x.example"], BadPolicy, 1, "error: "),
];

/// Answers that are not failures exit 0, and `policy check --exit-code`
/// turns a deny into 1 for scripts.
const ANSWERS: &[Row] = &[
    row(&["policy", "check", "network", "x.example"], Nothing, 0, "hint: no global policy exists"),
    row(&["policy", "check", "--exit-code", "network", "x.example"], Nothing, 1, "hint: no global policy exists"),
    row(&["policy", "check", "--exit-code", "network", "api.anthropic.com"], Policy, 0, ""),
    row(&["policy", "log"], Nothing, 0, ""),
    row(&["policy", "budget", "ls"], Nothing, 0, ""),
    row(&["template", "ls"], Nothing, 0, ""),
];

#[test]
fn every_command_follows_the_exit_code_split() {
    let mut wrong = Vec::new();
    for r in USAGE.iter().chain(RUNTIME).chain(ANSWERS) {
        let w = World::new();
        match r.given {
            Nothing => {}
            Sandbox => {
                w.stopped_sandbox("red");
            }
            BadPolicy => std::fs::write(w.config().join("policies.yaml"), "default: [unclosed\n").unwrap(),
            Policy => {
                let (code, _, err) = output(&mut w.ppp(["policy", "init", "balanced"]));
                assert_eq!(code, 0, "{err}");
            }
        }
        let (code, _, err) =
            output(w.ppp(r.args).env("PPP_PODMAN", w.path().join("nowhere/podman")).env("PPP_SECRET_BACKEND", "file"));
        let first = err.lines().next().unwrap_or_default();
        if code != r.code || !first.starts_with(r.says) {
            wrong.push(format!(
                "ppp {}: exit {code} (want {}), {first:?} (want {:?}…)",
                r.args.join(" "),
                r.code,
                r.says
            ));
        }
    }
    assert!(wrong.is_empty(), "{} rows wrong:\n{}", wrong.len(), wrong.join("\n"));
}

//! `ppp exec`: run a command in a sandbox's VM. The command is an argv
//! slice, never a shell string: every argument reaches the guest exactly as
//! given (podman re-parses ssh arguments, so each is quoted), and the
//! command's exit code is ppp's.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::Ctx;
use crate::cli::ExecArgs;
use crate::error::fail;
use crate::exec::{self, Stdin};
use crate::podman::Podman;
use crate::sandbox::{self, machine};

/// Run `ppp exec`.
pub fn run(args: &ExecArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let rec = sandbox::load(dirs, &args.sandbox)?.ok_or_else(|| {
        fail(format!("no sandbox named `{}`", args.sandbox)).hint("list sandboxes with `ppp ls`").code(2)
    })?;
    let env = collect_env(&args.env, &args.env_file, |k| std::env::var(k).ok())?;
    let podman = sandbox::podman_for(&Podman::detect()?, dirs, &rec);
    let running = machine::list(&podman)?.into_iter().any(|m| m.name == rec.machine_name && m.running);
    if !running {
        return Err(fail(format!("sandbox `{}` is not running", rec.name))
            .hint(format!("start it with `ppp run --name {} {} …`", rec.name, rec.agent))
            .into());
    }
    let guest = guest_argv(args, &env);
    let interactive = args.interactive || args.tty;
    let inv = podman.ssh(&rec.machine_name, &guest).stdin(if interactive && !args.detach {
        Stdin::Inherit
    } else {
        Stdin::Null
    });
    if args.tty && !std::io::stdin().is_terminal() {
        eprintln!("warning: -t needs a terminal; running without one");
    }
    let code = exec::run_attached(&inv)?;
    Ok(ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1)))
}

/// `-e` and `--env-file` as `NAME=VALUE` pairs, in order. `-e NAME` alone
/// passes this process's value, like `docker exec`.
pub fn collect_env(
    flags: &[String],
    files: &[std::path::PathBuf],
    host: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("could not read `{}`", f.display()))?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let pair = parse_pair(line, &host).ok_or_else(|| {
                fail(format!("`{}` line {}: expected `NAME=VALUE`, found `{line}`", f.display(), i + 1)).code(2)
            })?;
            out.push(pair);
        }
    }
    for e in flags {
        let pair = parse_pair(e, &host)
            .ok_or_else(|| fail(format!("invalid `-e {e}`: expected `NAME=VALUE` or `NAME`")).code(2))?;
        out.push(pair);
    }
    Ok(out)
}

fn parse_pair(text: &str, host: &impl Fn(&str) -> Option<String>) -> Option<(String, String)> {
    let (name, value) = match text.split_once('=') {
        Some((n, v)) => (n, Some(v.to_owned())),
        None => (text, None),
    };
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return None;
    }
    Some((name.to_owned(), value.or_else(|| host(name)).unwrap_or_default()))
}

/// The command as the guest runs it: `[sudo [-u U]] env [-C DIR] [K=V…]
/// CMD ARGS…`, wrapped to run in the background with `-d`.
pub fn guest_argv(args: &ExecArgs, env: &[(String, String)]) -> Vec<String> {
    let mut line: Vec<String> = Vec::new();
    if args.privileged || args.user.is_some() {
        line.push("sudo".into());
        if let Some(u) = &args.user {
            line.extend(["-u".into(), u.clone()]);
        }
        line.push("--".into());
    }
    line.push("env".into());
    if let Some(dir) = &args.workdir {
        line.extend(["-C".into(), dir.clone()]);
    }
    line.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    // `env` would read a first argument with `=` in it as a variable.
    if args.command.first().is_some_and(|c| c.contains('=')) {
        line.push("--".into());
    }
    line.extend(args.command.iter().cloned());
    if args.detach {
        // The argv stays an argv: it reaches `sh` as "$@", never as text.
        let mut wrapped: Vec<String> =
            ["setsid", "sh", "-c", "\"$@\" </dev/null >/dev/null 2>&1 &", "ppp-exec"].map(str::to_owned).to_vec();
        wrapped.extend(line);
        return wrapped;
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(argv: &[&str]) -> ExecArgs {
        match crate::cli::Cli::parse_from(std::iter::once("ppp").chain(argv.iter().copied())).command {
            crate::cli::Command::Exec(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn argv_is_passed_as_a_slice() {
        let a = parse(&["exec", "red", "--", "printf", "%s\\n", "a b"]);
        assert_eq!(guest_argv(&a, &[]), ["env", "printf", "%s\\n", "a b"]);
        let a = parse(&["exec", "-u", "nobody", "-w", "/work", "-e", "A=1", "red", "--", "X=y", "id"]);
        let env = collect_env(&a.env, &a.env_file, |_| None).unwrap();
        assert_eq!(
            guest_argv(&a, &env),
            ["sudo", "-u", "nobody", "--", "env", "-C", "/work", "A=1", "--", "X=y", "id"]
        );
        let a = parse(&["exec", "--privileged", "-d", "red", "--", "sleep", "9"]);
        assert_eq!(
            guest_argv(&a, &[]),
            [
                "setsid",
                "sh",
                "-c",
                "\"$@\" </dev/null >/dev/null 2>&1 &",
                "ppp-exec",
                "sudo",
                "--",
                "env",
                "sleep",
                "9"
            ]
        );
    }

    #[test]
    fn env_flags_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("env");
        std::fs::write(&f, "# comment\n\nA=1\nB=two words\n").unwrap();
        let env = collect_env(&["C=3".into(), "HOSTVAR".into()], std::slice::from_ref(&f), |k| {
            (k == "HOSTVAR").then(|| "from-host".to_owned())
        })
        .unwrap();
        assert_eq!(
            env,
            [("A", "1"), ("B", "two words"), ("C", "3"), ("HOSTVAR", "from-host")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        std::fs::write(&f, "A=1\n9BAD=x\n").unwrap();
        let err = collect_env(&[], std::slice::from_ref(&f), |_| None).unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("9BAD=x"), "{err}");
        assert!(collect_env(&["=x".into()], &[], |_| None).is_err());
    }
}

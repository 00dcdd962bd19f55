//! `ppp __complete sandboxes [-- WORDS…]` (hidden): sandbox names for the
//! completion scripts `ppp completion` prints (ADR 0013).
//!
//! Without WORDS it prints every sandbox name. With the command line so far
//! it decides from the clap tree itself whether the word being completed is
//! a sandbox (a `SANDBOX` argument or option value, `--name`, or the
//! `SANDBOX:` side of `cp`) and prints the matching names; it prints nothing
//! otherwise, and the script falls back to its static completions. The
//! decision lives here, once, rather than in four shells' syntax.
//!
//! It reads only `sandbox.json` files (no podman, no lock) and never prints
//! an error: a TAB press must not spill messages into the command line.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Arg, CommandFactory};

use super::Ctx;
use crate::cli::{Cli, CompleteArgs, CompleteKind};

/// Run `ppp __complete`.
pub fn run(args: &CompleteArgs, ctx: &Ctx) -> Result<ExitCode> {
    let CompleteKind::Sandboxes = args.kind;
    let names: Vec<String> = ctx
        .dirs()
        .ok()
        .and_then(|d| crate::sandbox::load_all(d).ok())
        .map(|recs| recs.into_iter().map(|r| r.name).collect())
        .unwrap_or_default();
    let out = if args.words.is_empty() { names } else { candidates(&args.words, &names) };
    let mut text = String::new();
    for n in out {
        text.push_str(&n);
        text.push('\n');
    }
    crate::output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// What the word being completed is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A sandbox name.
    Sandbox,
    /// A `cp` side: a host path or `SANDBOX:PATH`.
    CopySide,
    /// Anything else: left to the static completions.
    Other,
}

/// The completions for `words` (program first, the word being completed
/// last) given the existing sandbox `names`.
pub fn candidates(words: &[String], names: &[String]) -> Vec<String> {
    let Some((current, before)) = words.split_last() else {
        return Vec::new();
    };
    let matching = names.iter().filter(|n| n.starts_with(current.as_str()));
    match slot(before.get(1..).unwrap_or_default(), current) {
        Slot::Sandbox => matching.cloned().collect(),
        // A path-looking word, or one already past the colon, is a file;
        // an empty word stays with file completion too, the common case.
        Slot::CopySide if !current.is_empty() && !current.contains([':', '/']) && !current.starts_with(['.', '~']) => {
            matching.map(|n| format!("{n}:")).collect()
        }
        Slot::CopySide | Slot::Other => Vec::new(),
    }
}

/// Which argument `current` fills after the words `before` (program name
/// removed), found by walking the clap tree: subcommands, options that take
/// a value, and positionals counted in order.
pub fn slot(before: &[String], current: &str) -> Slot {
    let mut root = Cli::command();
    // Building propagates the global flags (-D, -q) into every subcommand.
    root.build();
    let mut cmd = &root;
    let mut positional = 0usize;
    let mut pending: Option<&Arg> = None;
    let mut rest = false;
    for w in before {
        if let Some(_value) = pending.take() {
            continue;
        }
        if rest || !w.starts_with('-') || w == "-" {
            if positional == 0
                && !rest
                && let Some(sub) = cmd.find_subcommand(w)
            {
                cmd = sub;
                continue;
            }
            positional += 1;
            continue;
        }
        if w == "--" {
            rest = true;
            continue;
        }
        if let Some(long) = w.strip_prefix("--") {
            if !long.contains('=') {
                pending = cmd.get_arguments().find(|a| a.get_long() == Some(long)).filter(|a| takes_value(a));
            }
            continue;
        }
        // A cluster of short flags; the first that takes a value consumes
        // the rest of the word, or the next word when nothing follows.
        let shorts: Vec<char> = w.chars().skip(1).collect();
        for (i, c) in shorts.iter().enumerate() {
            if let Some(a) = cmd.get_arguments().find(|a| a.get_short() == Some(*c)).filter(|a| takes_value(a)) {
                if i + 1 == shorts.len() {
                    pending = Some(a);
                }
                break;
            }
        }
    }
    if let Some(a) = pending {
        let by_name = a.get_long() == Some("name") && matches!(cmd.get_name(), "run" | "create");
        return if by_name || is_sandbox(a) { Slot::Sandbox } else { Slot::Other };
    }
    if current.starts_with('-') && !rest {
        return Slot::Other;
    }
    // The positional this word fills: the one with this index, or a
    // trailing one that takes many values (`ppp stop a b c`).
    let index = positional + 1;
    let arg = cmd.get_positionals().find(|a| a.get_index() == Some(index)).or_else(|| {
        cmd.get_positionals()
            .filter(|a| {
                a.get_index().is_some_and(|i| i < index) && a.get_num_args().is_some_and(|n| n.max_values() > 1)
            })
            .last()
    });
    match arg {
        Some(a) if is_sandbox(a) => Slot::Sandbox,
        Some(a) if cmd.get_name() == "cp" && matches!(value_name(a), Some("SRC" | "DST")) => Slot::CopySide,
        _ => Slot::Other,
    }
}

fn takes_value(a: &Arg) -> bool {
    a.get_action().takes_values()
}

fn value_name(a: &Arg) -> Option<&str> {
    a.get_value_names().and_then(|v| v.first()).map(clap::builder::Str::as_str)
}

fn is_sandbox(a: &Arg) -> bool {
    value_name(a) == Some("SANDBOX")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_of(line: &str) -> Slot {
        let mut words: Vec<String> = line.split(' ').map(str::to_owned).collect();
        let current = words.pop().unwrap();
        slot(&words, &current)
    }

    #[test]
    fn sandbox_positions() {
        for line in [
            "stop ",
            "stop red-fox ",
            "-q stop r",
            "rm -f ",
            "exec ",
            "exec -e A=1 -u root ",
            "ports ",
            "run --name ",
            "create -m 8g --name r",
            "policy allow network x.com --sandbox ",
            "policy log ",
            "secret ls ",
        ] {
            assert_eq!(slot_of(line), Slot::Sandbox, "`ppp {line}`");
        }
    }

    #[test]
    fn other_positions() {
        for line in [
            "",
            "st",
            "stop -",
            "exec red-fox ",
            "exec red-fox -- ls ",
            "run ",
            "run opencode ",
            "ports red-fox --publish ",
            "policy allow ",
            "ls ",
        ] {
            assert_eq!(slot_of(line), Slot::Other, "`ppp {line}`");
        }
        assert_eq!(slot_of("cp "), Slot::CopySide);
        assert_eq!(slot_of("cp -L ./a "), Slot::CopySide);
    }

    #[test]
    fn candidates_filter_by_prefix() {
        let names = ["red-fox".to_owned(), "blue-owl".to_owned()];
        let w = |line: &str| -> Vec<String> { line.split(' ').map(str::to_owned).collect() };
        assert_eq!(candidates(&w("ppp stop r"), &names), ["red-fox"]);
        assert_eq!(candidates(&w("ppp stop "), &names), names);
        assert_eq!(candidates(&w("ppp cp b"), &names), ["blue-owl:"]);
        assert!(candidates(&w("ppp cp ./b"), &names).is_empty());
        assert!(candidates(&w("ppp run "), &names).is_empty());
    }
}

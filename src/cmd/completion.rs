//! `ppp completion SHELL`: print a completion script generated from the
//! clap tree, so it can never drift from the real commands and flags.

use std::process::ExitCode;

use anyhow::Result;
use clap::CommandFactory;
use clap::builder::PossibleValuesParser;
use clap_complete::Shell as Gen;

use crate::cli::{Cli, CompletionArgs, Shell};

/// Run `ppp completion`.
pub fn run(args: &CompletionArgs) -> Result<ExitCode> {
    crate::output::print(&script(args.shell, !args.no_descriptions))?;
    Ok(ExitCode::SUCCESS)
}

/// The completion script for `shell`, with or without descriptions.
pub fn script(shell: Shell, descriptions: bool) -> String {
    let mut cmd = Cli::command();
    if !descriptions {
        // Building first materialises the automatic `--help`/`--version`
        // flags in every subcommand, so their descriptions get stripped too.
        cmd.build();
        cmd = strip_descriptions(cmd);
    }
    let generator = match shell {
        Shell::Bash => Gen::Bash,
        Shell::Zsh => Gen::Zsh,
        Shell::Fish => Gen::Fish,
        Shell::Powershell => Gen::PowerShell,
    };
    let mut buf = Vec::new();
    clap_complete::generate(generator, &mut cmd, "ppp", &mut buf);
    String::from_utf8(buf).expect("clap_complete writes UTF-8")
}

/// Remove every about/help text, including those of enum values, so the
/// generators have nothing to describe.
fn strip_descriptions(mut cmd: clap::Command) -> clap::Command {
    let subs: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_owned()).collect();
    for name in subs {
        cmd = cmd.mut_subcommand(name, strip_descriptions);
    }
    cmd.about(None).long_about(None).mut_args(|a| {
        let values: Vec<_> = a.get_possible_values().into_iter().map(|v| v.help(None)).collect();
        let a = a.help(None).long_help(None);
        if values.is_empty() { a } else { a.value_parser(PossibleValuesParser::new(values)) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_can_be_left_out() {
        let with = script(Shell::Zsh, true);
        let without = script(Shell::Zsh, false);
        assert!(with.contains("Manage network policy"), "zsh script lacks descriptions");
        assert!(!without.contains("Manage network policy"));
        assert!(!without.contains("Print help"), "automatic flags keep no description");
        assert!(!without.contains("Default deny"), "enum values keep no description");
        assert!(with.contains("Default deny"));
        assert!(without.contains("policy"));
        assert!(script(Shell::Fish, false).contains("complete -c ppp"));
        assert!(script(Shell::Powershell, true).contains("Register-ArgumentCompleter"));
    }
}

//! `ppp completion SHELL`: print a completion script generated from the
//! clap tree, so it can never drift from the real commands and flags.
//! For bash, zsh and fish a small wrapper asks `ppp __complete` for sandbox
//! names first (ADR 0013); PowerShell gets the static script only.

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
    let text = String::from_utf8(buf).expect("clap_complete writes UTF-8");
    with_sandbox_names(shell, text)
}

/// Bash: ask `ppp __complete`, fall back to the generated `_ppp`. The words
/// are rebuilt so an empty current word is passed as `""`.
const BASH: &str = r#"
# Sandbox names come from `ppp __complete`, which knows where a SANDBOX goes;
# everything else is the static completion above.
_ppp_sandboxes() {
    local -a words names
    local line
    words=("${COMP_WORDS[@]:0:COMP_CWORD}" "${COMP_WORDS[COMP_CWORD]}")
    # A read loop, not IFS: IFS set here would leak into `_ppp` (bash
    # scoping is dynamic), and mapfile is missing from macOS's bash 3.2.
    while IFS= read -r line; do
        names+=("$line")
    done < <("${COMP_WORDS[0]}" __complete sandboxes -- "${words[@]}" 2>/dev/null)
    if [[ ${#names[@]} -gt 0 ]]; then
        COMPREPLY=("${names[@]}")
        [[ ${COMPREPLY[0]} == *: ]] && compopt -o nospace 2>/dev/null
        return 0
    fi
    _ppp "$@"
}
"#;

const ZSH: &str = r#"
# Sandbox names come from `ppp __complete`, which knows where a SANDBOX goes;
# everything else is the static completion above.
_ppp_sandboxes() {
    local -a names
    names=(${(f)"$(${words[1]} __complete sandboxes -- "${(@)words[1,CURRENT]}" 2>/dev/null)"})
    if (( ${#names} )); then
        if [[ $names[1] == *: ]]; then compadd -S '' -a names; else compadd -a names; fi
        return 0
    fi
    _ppp "$@"
}
"#;

const FISH: &str = r"
# Sandbox names come from `ppp __complete`, which knows where a SANDBOX goes.
function __ppp_sandboxes
    ppp __complete sandboxes -- (commandline -opc) (commandline -ct) 2>/dev/null
end
complete -c ppp -f -n 'count (__ppp_sandboxes) >/dev/null' -a '(__ppp_sandboxes)'
";

/// Splice the sandbox-name wrapper into a generated script: define it and
/// register it in place of the generated function.
fn with_sandbox_names(shell: Shell, text: String) -> String {
    match shell {
        Shell::Bash => {
            let registered = text.replace("complete -F _ppp ", "complete -F _ppp_sandboxes ");
            format!("{registered}{BASH}")
        }
        Shell::Zsh => {
            // The generated tail calls `_ppp` when autoloaded and registers
            // it otherwise; both must go through the wrapper, defined first.
            let tail = "if [ \"$funcstack[1]\" = \"_ppp\" ]; then";
            let (head, rest) = text.split_at(text.find(tail).unwrap_or(text.len()));
            let rest = rest
                .replace("    _ppp \"$@\"", "    _ppp_sandboxes \"$@\"")
                .replace("compdef _ppp ppp", "compdef _ppp_sandboxes ppp");
            format!("{head}{}\n{rest}", ZSH.trim_start())
        }
        Shell::Fish => format!("{text}{FISH}"),
        Shell::Powershell => text,
    }
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

    #[test]
    fn scripts_ask_for_sandbox_names() {
        for descriptions in [true, false] {
            let bash = script(Shell::Bash, descriptions);
            assert!(bash.contains("complete -F _ppp_sandboxes -o nosort"), "bash registers the wrapper");
            assert!(!bash.contains("complete -F _ppp "), "bash keeps no direct registration");
            let zsh = script(Shell::Zsh, descriptions);
            assert!(zsh.contains("_ppp_sandboxes \"$@\"\nelse\n    compdef _ppp_sandboxes ppp"), "{zsh}");
            assert!(zsh.find("_ppp_sandboxes() {") < zsh.find("compdef _ppp_sandboxes"));
            assert!(script(Shell::Fish, descriptions).contains("__complete sandboxes"));
        }
    }
}

//! The command surface as users meet it: every help text (snapshotted),
//! the commands that refuse until their release, completion scripts that
//! really complete in bash, and `ppp version`.

#![allow(clippy::similar_names, clippy::many_single_char_names, reason = "short names read better in tests")]

mod common;

use clap::CommandFactory;
use common::{World, ok, output};

/// Every command path in the tree, e.g. `["policy", "allow"]`.
fn command_paths() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, prefix: &[String], out: &mut Vec<Vec<String>>) {
        for sub in cmd.get_subcommands() {
            let mut p = prefix.to_vec();
            p.push(sub.get_name().to_owned());
            out.push(p.clone());
            walk(sub, &p, out);
        }
    }
    let mut out = vec![vec![]];
    walk(&ppp::cli::Cli::command(), &[], &mut out);
    out
}

#[test]
fn help_texts() {
    let w = World::new();
    let paths = command_paths();
    assert_eq!(paths.len(), 49, "root + 19 commands + 28 sub-verbs + `log-level set`");
    for path in paths {
        let mut args = path.clone();
        args.push("--help".into());
        let out = ok(&mut w.ppp(&args));
        let name = if path.is_empty() { "ppp".to_owned() } else { format!("ppp-{}", path.join("-")) };
        insta::assert_snapshot!(name, out);
    }
}

#[test]
fn top_level_surface_is_complete() {
    let cmd = ppp::cli::Cli::command();
    let names: Vec<&str> = cmd.get_subcommands().map(clap::Command::get_name).collect();
    assert_eq!(
        names,
        [
            "completion",
            "cp",
            "create",
            "daemon",
            "diagnose",
            "exec",
            "kit",
            "ls",
            "policy",
            "ports",
            "reset",
            "rm",
            "run",
            "secret",
            "setup",
            "stop",
            "template",
            "tui",
            "version"
        ]
    );
    let verbs = |group: &str| -> Vec<String> {
        cmd.find_subcommand(group).unwrap().get_subcommands().map(|c| c.get_name().to_owned()).collect()
    };
    assert_eq!(verbs("daemon"), ["start", "stop", "status", "log-level"]);
    assert_eq!(verbs("kit"), ["add", "inspect", "pack", "pull", "push", "validate"]);
    assert_eq!(verbs("policy"), ["init", "allow", "deny", "check", "ls", "inspect", "log", "reset", "rm"]);
    assert_eq!(verbs("secret"), ["set", "set-custom", "import", "ls", "rm"]);
    assert_eq!(verbs("template"), ["save", "load", "ls", "rm"]);
}

#[test]
fn tui_without_a_terminal_says_what_to_use_instead() {
    let w = World::new();
    // `output` pipes stdout and stderr: no terminal to draw on.
    let (code, out, err) = output(&mut w.ppp(["tui"]));
    assert_eq!(code, 2, "{err}");
    assert_eq!(out, "");
    assert_eq!(err, "error: `ppp tui` needs a terminal\nhint: use `ppp ls` in scripts and pipes\n");
    assert_eq!(std::fs::read_dir(w.data()).unwrap().count(), 0, "nothing written");
}

#[test]
fn later_commands_refuse_with_exit_2() {
    let w = World::new();
    let cases: &[(&[&str], &str)] = &[
        (&["kit", "validate", "x"], "kit validate"),
        (&["kit", "pack", "x"], "kit pack"),
        (&["template", "ls"], "template ls"),
    ];
    for (args, name) in cases {
        let (code, out, err) = output(&mut w.ppp(*args));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(out, "", "{args:?}");
        assert_eq!(err, format!("error: `ppp {name}` is not available yet\n"), "{args:?}");
    }
    // Nothing was created by any of them.
    assert_eq!(std::fs::read_dir(w.data()).unwrap().count(), 0);
}

#[test]
fn usage_errors_exit_2() {
    let w = World::new();
    let (code, _, err) = output(&mut w.ppp(["policy", "allow", "network"]));
    assert_eq!(code, 2);
    assert!(err.contains("<RESOURCES>"), "{err}");
    let (code, _, _) = output(&mut w.ppp(["nonsense"]));
    assert_eq!(code, 2);
}

/// Source the bash script and ask it for completions, as bash would.
fn bash_complete(script: &str, words: &[&str]) -> Vec<String> {
    let line = words.join(" ");
    let program = format!(
        "{script}\nCOMP_WORDS=({line})\nCOMP_CWORD={cword}\nCOMP_LINE='{line}'\nCOMP_POINT=${{#COMP_LINE}}\n_ppp ppp \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        cword = words.len() - 1,
    );
    let out = std::process::Command::new("bash").arg("-c").arg(program).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn bash_completion_completes() {
    let w = World::new();
    let script = ok(&mut w.ppp(["completion", "bash"]));
    let top = bash_complete(&script, &["ppp", "po"]);
    assert!(top.contains(&"policy".to_owned()) && top.contains(&"ports".to_owned()), "{top:?}");
    let verbs = bash_complete(&script, &["ppp", "policy", "i"]);
    assert_eq!(verbs, ["init", "inspect"]);
    let presets = bash_complete(&script, &["ppp", "policy", "init", ""]);
    assert!(presets.contains(&"balanced".to_owned()), "{presets:?}");
}

#[test]
fn completion_scripts_for_every_shell() {
    let w = World::new();
    for shell in ["bash", "zsh", "fish", "powershell"] {
        let with = ok(&mut w.ppp(["completion", shell]));
        let without = ok(&mut w.ppp(["completion", shell, "--no-descriptions"]));
        assert!(with.contains("policy") && without.contains("policy"), "{shell}");
        if shell != "bash" {
            assert!(with.contains("Manage network policy"), "{shell} lacks descriptions");
            assert!(!without.contains("Manage network policy"), "{shell} kept descriptions");
        }
    }
}

#[test]
fn version_reports_tools() {
    let w = World::new();
    w.fake("podman", r#"[ "$1" = --version ] && echo "podman version 5.8.1""#);
    w.fake("mitmdump", r#"[ "$1" = --version ] && printf 'Mitmproxy: 12.2.3\nPython:    3.13.0\n'"#);
    let out = ok(&mut w.ppp(["version", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ppp"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["podman"]["version"], "5.8.1");
    assert_eq!(v["mitmdump"]["version"], "12.2.3");
    assert_eq!(v["platform"]["os"], std::env::consts::OS);
    assert_eq!(v["provider"], "qemu");
    let text = ok(&mut w.ppp(["version"]));
    assert!(text.starts_with(&format!("ppp {}\npodman:   5.8.1 (", env!("CARGO_PKG_VERSION"))), "{text}");

    let bare = World::new();
    let v: serde_json::Value = serde_json::from_str(&ok(&mut bare.ppp(["version", "--json"]))).unwrap();
    assert!(v["podman"].is_null() && v["mitmdump"].is_null(), "{v}");
}

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
        // Hidden commands (`__complete`, `__man`) are plumbing for the
        // completion scripts and `make man`, not surface.
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
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
    assert_eq!(
        paths.len(),
        64,
        "root + 20 commands + 36 sub-verbs + `log-level set` + 3 `policy approval` and 3 `policy budget` verbs"
    );
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
    let names: Vec<&str> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).map(clap::Command::get_name).collect();
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
            "usage",
            "version"
        ]
    );
    let verbs = |group: &str| -> Vec<String> {
        cmd.find_subcommand(group).unwrap().get_subcommands().map(|c| c.get_name().to_owned()).collect()
    };
    assert_eq!(verbs("daemon"), ["start", "stop", "status", "log-level"]);
    assert_eq!(verbs("kit"), ["add", "inspect", "pack", "pull", "push", "validate"]);
    assert_eq!(
        verbs("policy"),
        [
            "init", "allow", "deny", "limits", "default", "budget", "approval", "check", "ls", "inspect", "log",
            "learn", "suggest", "replay", "apply", "reset", "rm"
        ]
    );
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
    // Every command works now; only OAuth sign-in for secrets is still to come.
    let cases: &[(&[&str], &str)] = &[(&["secret", "set", "--oauth", "anthropic"], "secret set --oauth")];
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
    bash_complete_in(&World::new(), script, words)
}

/// Complete `words` (the last being the word under the cursor) with the
/// function the script registers for `ppp`, as bash would on TAB, with
/// `w`'s environment and the built `ppp` first on PATH.
fn bash_complete_in(w: &World, script: &str, words: &[&str]) -> Vec<String> {
    let line = words.join(" ");
    let quoted: Vec<String> = words.iter().map(|x| format!("'{x}'")).collect();
    let program = format!(
        "{script}\nCOMP_WORDS=({words})\nCOMP_CWORD={cword}\nCOMP_LINE='{line}'\nCOMP_POINT=${{#COMP_LINE}}\nf=$(complete -p ppp | sed 's/.*-F \\([^ ]*\\).*/\\1/')\n\"$f\" ppp \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words = quoted.join(" "),
        cword = words.len() - 1,
    );
    let ppp_dir = std::path::Path::new(env!("CARGO_BIN_EXE_ppp")).parent().unwrap().to_owned();
    let mut cmd = w.ppp(Vec::<String>::new());
    let path = format!(
        "{}:{}",
        ppp_dir.display(),
        cmd.get_envs().find(|(k, _)| *k == "PATH").unwrap().1.unwrap().to_string_lossy()
    );
    let out = cmd.env("PATH", path).env_remove("COLUMNS");
    let out = std::process::Command::new("bash")
        .envs(out.get_envs().filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))))
        .env_remove("BASH_ENV")
        .arg("-c")
        .arg(program)
        .output()
        .unwrap();
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

/// Sandbox names come from `ppp __complete` where a SANDBOX goes, and the
/// static completions everywhere else.
#[test]
fn bash_completes_sandbox_names() {
    let w = World::new();
    w.write_record("red-fox", 51820, "stopped");
    w.write_record("blue-owl", 51821, "stopped");
    let mut names = ok(&mut w.ppp(["__complete", "sandboxes"])).lines().map(str::to_owned).collect::<Vec<_>>();
    names.sort();
    assert_eq!(names, ["blue-owl", "red-fox"]);

    let script = ok(&mut w.ppp(["completion", "bash"]));
    let mut got = bash_complete_in(&w, &script, &["ppp", "stop", ""]);
    got.sort();
    assert_eq!(got, ["blue-owl", "red-fox"]);
    assert_eq!(bash_complete_in(&w, &script, &["ppp", "rm", "-f", "r"]), ["red-fox"]);
    assert_eq!(bash_complete_in(&w, &script, &["ppp", "exec", "b"]), ["blue-owl"]);
    assert_eq!(bash_complete_in(&w, &script, &["ppp", "run", "--name", "r"]), ["red-fox"]);
    assert_eq!(bash_complete_in(&w, &script, &["ppp", "cp", "red"]), ["red-fox:"]);
    // Elsewhere the static completion answers as before.
    assert_eq!(bash_complete_in(&w, &script, &["ppp", "policy", "i"]), ["init", "inspect"]);
    assert_eq!(bash_complete_in(&w, &script, &["ppp", "stop", "--h"]), ["--help"]);
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
    assert!(text.starts_with(&format!("ppp {}\nrevision: ", env!("CARGO_PKG_VERSION"))), "{text}");
    assert!(text.contains("\npodman:   5.8.1 ("), "{text}");
    let rev = v["revision"].as_str().unwrap();
    assert!(rev == "unknown" || (rev.len() >= 7 && rev.chars().all(|c| c.is_ascii_hexdigit())), "{rev}");

    // The keys are the contract; values that vary by host are redacted.
    let mut shown = v.clone();
    shown["ppp"] = "[VERSION]".into();
    shown["revision"] = "[REVISION]".into();
    shown["platform"]["os"] = "[OS]".into();
    shown["platform"]["arch"] = "[ARCH]".into();
    insta::assert_snapshot!("version-json", w.redact(&serde_json::to_string_pretty(&shown).unwrap()));

    let bare = World::new();
    let v: serde_json::Value = serde_json::from_str(&ok(&mut bare.ppp(["version", "--json"]))).unwrap();
    assert!(v["podman"].is_null() && v["mitmdump"].is_null(), "{v}");
}

/// `make man`: one page per visible command, and a page that really renders.
#[test]
fn man_pages_are_generated_and_render() {
    let w = World::new();
    let dir = w.path().join("man");
    let out = ok(&mut w.ppp([std::ffi::OsStr::new("__man"), dir.as_os_str()]));
    assert_eq!(out, format!("wrote 64 man pages to `{}`\n", dir.display()), "one per help text");
    for page in ["ppp.1", "ppp-policy.1", "ppp-policy-allow.1", "ppp-daemon-log-level-set.1", "ppp-version.1"] {
        assert!(dir.join(page).is_file(), "{page} missing");
    }
    assert!(!dir.join("ppp-__complete.1").exists(), "hidden commands get no page");

    // `make test-deps` installs groff-base (scripts/install-test-deps.sh).
    let rendered = std::process::Command::new("groff")
        .args(["-man", "-Tutf8", "-P", "-cbou"])
        .arg(dir.join("ppp-policy-allow.1"))
        .env("LANG", "C.UTF-8")
        .output()
        .expect("groff is missing: run `make test-deps` (it installs groff-base)");
    assert!(rendered.status.success(), "{}", String::from_utf8_lossy(&rendered.stderr));
    let text = String::from_utf8_lossy(&rendered.stdout);
    // groff justifies and wraps: compare with the runs of spaces folded.
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("ppp-policy-allow - Allow connections to hosts, IPs or CIDR ranges, or HTTP requests"),
        "{text}"
    );
    assert!(text.contains("--sandbox"), "{text}");
}

//! Every `ppp …` command in the user guide's `sh` code blocks parses with the
//! real clap definition, so the docs cannot show a flag that does not
//! exist or an argument order clap rejects. A line ending in
//! `# not parsed` is skipped (for examples that are deliberately wrong).

use std::path::Path;

use clap::{CommandFactory, Parser};

/// The lines of the `sh` code blocks in `text`, with their line numbers.
fn sh_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut inside = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.starts_with("```") {
            inside = !inside && t == "```sh";
            continue;
        }
        if inside && !t.is_empty() && !t.ends_with("# not parsed") {
            out.push((i + 1, t));
        }
    }
    out
}

/// The `ppp` invocations on one shell line: split like a POSIX shell,
/// cut at pipes and `&&`/`||`/`;`, with redirections and leading
/// `VAR=value` assignments removed.
fn invocations(line: &str) -> Vec<Vec<String>> {
    let words = shlex::split(line).unwrap_or_else(|| panic!("not valid shell: {line}"));
    let mut out = Vec::new();
    for cmd in words.split(|w| matches!(w.as_str(), "|" | "&&" | "||" | ";")) {
        let mut argv = Vec::new();
        let mut skip = false;
        for w in cmd {
            if skip {
                skip = false;
            } else if matches!(w.as_str(), ">" | ">>" | "<" | "2>") {
                skip = true;
            } else if !(w.starts_with('>') || w.starts_with("2>")) {
                argv.push(w.clone());
            }
        }
        // The first word that is not a `VAR=value` assignment is the program.
        let first = argv.iter().position(|w| !w.contains('=') || w.starts_with('-'));
        let argv = first.map_or_else(Vec::new, |i| argv.split_off(i));
        if argv.first().is_some_and(|w| w == "ppp") {
            out.push(argv);
        }
    }
    out
}

#[test]
fn every_example_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/user-guide");
    let mut pages: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    assert!(pages.len() >= 8, "the user guide has a page per command group: {pages:?}");
    let mut failures = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    let mut count = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (n, line) in sh_lines(&text) {
            for argv in invocations(line) {
                count += 1;
                match ppp::cli::Cli::try_parse_from(&argv) {
                    Ok(_) => {
                        if let Some(cmd) = argv.iter().skip(1).find(|w| !w.starts_with('-')) {
                            covered.insert(cmd.clone());
                        }
                    }
                    Err(e) => failures.push(format!(
                        "{}:{n}: `{line}`\n{}",
                        page.file_name().unwrap().to_string_lossy(),
                        e.render()
                    )),
                }
            }
        }
    }
    assert!(failures.is_empty(), "examples that do not parse:\n{}", failures.join("\n"));
    assert!(count > 80, "only {count} examples found; is the extraction broken?");
    // Every visible command has at least one example.
    let all: std::collections::BTreeSet<String> = ppp::cli::Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_owned())
        .collect();
    let missing: Vec<_> = all.difference(&covered).collect();
    assert!(missing.is_empty(), "commands without an example in docs/user-guide: {missing:?}");
}

#[test]
fn extraction_handles_shell_syntax() {
    assert_eq!(
        invocations(r#"echo "$KEY" | PPP_LOG=debug ppp secret set -g openai --password-stdin 2>/dev/null"#),
        [["ppp", "secret", "set", "-g", "openai", "--password-stdin"]]
    );
    assert_eq!(
        invocations("ppp completion bash > ~/x && ppp ls # a comment"),
        [vec!["ppp", "completion", "bash"], vec!["ppp", "ls"]]
    );
    assert!(invocations("git fetch sandbox-try").is_empty());
    let text = "```sh\nppp ls\nppp bogus # not parsed\n```\n```text\nppp nope\n```\n";
    assert_eq!(sh_lines(text), [(2, "ppp ls")]);
}

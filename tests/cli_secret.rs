//! `ppp secret …` end to end, against a real Secret Service (gnome-keyring
//! on a private D-Bus session) and against the age file store.

#![allow(clippy::similar_names, clippy::many_single_char_names, reason = "short names read better in tests")]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{SecretService, World, files_containing, ok, output};
use serde_json::Value;

const KEY_A: &str = "sk-ant-test-0123456789-ABCDEFGHIJ";
const KEY_B: &str = "sk-openai-test-ZYXWVUTSRQ-9876543210";
const KEY_C: &str = "ghp_TESTTOKEN_4242424242424242";
const CUSTOM: &str = "real-custom-value-5555555555";

/// `ppp` inside the Secret Service session.
fn kc(w: &World, ss: &SecretService, args: &[&str]) -> Command {
    let mut c = w.ppp(args);
    c.env("DBUS_SESSION_BUS_ADDRESS", &ss.address).env("PPP_SECRET_BACKEND", "keychain");
    c
}

/// `ppp` with the file store forced.
fn file(w: &World, args: &[&str]) -> Command {
    let mut c = w.ppp(args);
    c.env("PPP_SECRET_BACKEND", "file");
    c
}

fn with_stdin(mut cmd: Command, input: &str) -> (i32, String, String) {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The whole user journey, run once per backend through `ppp`.
fn journey(ppp: &dyn Fn(&[&str]) -> Command, backend: &str) -> Vec<String> {
    let seen = std::cell::RefCell::new(Vec::new());
    let run = |cmd: Command| -> String {
        let mut cmd = cmd;
        let (code, out, err) = output(&mut cmd);
        assert_eq!(code, 0, "{cmd:?}\n{out}\n{err}");
        seen.borrow_mut().push(out.clone());
        seen.borrow_mut().push(err);
        out
    };
    let out = run(ppp(&["secret", "set", "-g", "anthropic", "-t", KEY_A]));
    assert_eq!(out, format!("stored `anthropic` for every sandbox ({backend})\n"));
    let (code, out, err) =
        with_stdin(ppp(&["secret", "set", "red-fox", "openai", "--password-stdin"]), &format!("{KEY_B}\n"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("stored `openai` for sandbox `red-fox` ({backend})\n"));
    seen.borrow_mut().extend([out, err]);
    run(ppp(&["secret", "set", "usai", "--host", "api.gsa.usai.gov", "-t", KEY_C]));
    run(ppp(&[
        "secret",
        "set-custom",
        "-g",
        "--placeholder",
        "PPP_PLACEHOLDER_X",
        "--host",
        "api.example.com",
        "--value",
        CUSTOM,
        "--env",
        "X_TOKEN",
    ]));

    let list: Value = serde_json::from_str(&run(ppp(&["secret", "ls", "--json"]))).unwrap();
    let names: Vec<(String, String, String)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["scope"].as_str().unwrap().to_owned(),
                e["name"].as_str().unwrap().to_owned(),
                e["backend"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(names.len(), 4, "{list}");
    assert!(names.contains(&("global".into(), "anthropic".into(), backend.into())), "{names:?}");
    assert!(names.contains(&("red-fox".into(), "openai".into(), backend.into())), "{names:?}");
    let only: Value = serde_json::from_str(&run(ppp(&["secret", "ls", "red-fox", "--json"]))).unwrap();
    assert_eq!(only.as_array().unwrap().len(), 1);
    let global: Value =
        serde_json::from_str(&run(ppp(&["secret", "ls", "-g", "--service", "usai", "--json"]))).unwrap();
    assert_eq!(global[0]["hosts"][0], "api.gsa.usai.gov");
    let table = run(ppp(&["secret", "ls"]));
    assert!(table.starts_with("SCOPE    NAME"), "{table}");
    let names = run(ppp(&["secret", "ls", "-g", "-q"]));
    assert!(!names.is_empty() && names.lines().all(|l| !l.contains(' ')), "names only: {names}");
    assert_eq!(run(ppp(&["-q", "secret", "ls", "-g"])), names, "the global -q means the same");

    let (code, _, err) = output(&mut ppp(&["secret", "set", "-g", "unknownsvc", "-t", "x"]));
    assert_eq!(code, 2);
    assert!(err.contains("--host"), "{err}");

    assert_eq!(run(ppp(&["secret", "rm", "red-fox", "openai", "-f"])), "removed `openai` for sandbox `red-fox`\n");
    let (code, _, err) = output(&mut ppp(&["secret", "rm", "red-fox", "openai", "-f"]));
    assert_eq!(code, 2, "a secret that is not stored is a usage mistake: {err}");
    let list: Value = serde_json::from_str(&run(ppp(&["secret", "ls", "--json"]))).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 3);
    seen.into_inner()
}

fn assert_no_plaintext(w: &World, outputs: &[String]) {
    for v in [KEY_A, KEY_B, KEY_C, CUSTOM] {
        for root in [w.config(), w.data(), w.cache()] {
            let hits = files_containing(&root, v.as_bytes());
            assert!(hits.is_empty(), "plaintext secret found in {hits:?}");
        }
        for o in outputs {
            assert!(!o.contains(v), "a secret value was printed: {o}");
        }
    }
}

#[test]
fn keychain_backend_stores_in_the_secret_service() {
    let w = World::new();
    let ss = SecretService::start(&w.home());
    let outputs = journey(&|a| kc(&w, &ss, a), "keychain");
    assert_no_plaintext(&w, &outputs);
    assert!(!w.data().join("secrets.age").exists(), "the file store was not used");

    // The values really live in the Secret Service.
    let found = ss.secret_tool(&w.home(), &["search", "--all", "service", "ppp.anthropic"]);
    let text = String::from_utf8_lossy(&found.stdout).into_owned() + &String::from_utf8_lossy(&found.stderr);
    assert!(text.contains(&format!("secret = {KEY_A}")), "secret-tool did not find the key:\n{text}");
    let gone = ss.secret_tool(&w.home(), &["search", "--all", "service", "ppp.red-fox.openai"]);
    assert!(!String::from_utf8_lossy(&gone.stdout).contains(KEY_B), "removed secret still stored");
}

#[test]
fn file_backend_is_encrypted_and_private() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new();
    let outputs = journey(&|a| file(&w, a), "file");
    assert_no_plaintext(&w, &outputs);
    let store = w.data().join("secrets.age");
    let meta = std::fs::metadata(&store).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(w.data()).unwrap().permissions().mode() & 0o777, 0o700);
    assert!(std::fs::read(&store).unwrap().starts_with(b"age-encryption.org/v1"), "not an age file");
}

#[test]
fn no_session_bus_falls_back_to_the_file_store() {
    let w = World::new();
    // No DBUS_SESSION_BUS_ADDRESS and no forced backend: the keychain is
    // unreachable, so the encrypted file takes over.
    let out = ok(&mut w.ppp(["secret", "set", "-g", "groq", "-t", KEY_A]));
    assert_eq!(out, "stored `groq` for every sandbox (file)\n");
    assert!(w.data().join("secrets.age").exists());
    let (code, _, err) =
        output(w.ppp(["secret", "set", "-g", "groq", "-t", KEY_A]).env("PPP_SECRET_BACKEND", "keychain"));
    assert_ne!(code, 0, "forcing an unreachable keychain fails");
    assert!(err.contains("hint:"), "{err}");
    assert!(!err.contains(KEY_A));
}

#[test]
fn import_reads_the_usual_variables() {
    let w = World::new();
    let imp = |args: &[&str]| {
        let mut c = file(&w, args);
        c.env("ANTHROPIC_API_KEY", KEY_A).env("GITHUB_TOKEN", KEY_C).env("OPENAI_API_KEY", "");
        c
    };
    let (code, _, err) = output(&mut imp(&["secret", "import"]));
    assert_eq!(code, 2);
    assert!(err.contains("anthropic (from ANTHROPIC_API_KEY)") && err.contains("github (from GITHUB_TOKEN)"), "{err}");
    assert!(err.contains("hint: pass --all"), "{err}");

    assert_eq!(
        ok(&mut imp(&["secret", "import", "--all", "--dry-run"])),
        "would import anthropic from ANTHROPIC_API_KEY\nwould import github from GITHUB_TOKEN\n"
    );
    assert_eq!(ok(&mut file(&w, &["secret", "ls", "--json"])), "[]\n", "dry run stores nothing");
    assert_eq!(ok(&mut imp(&["secret", "import", "anthropic"])), "imported anthropic from ANTHROPIC_API_KEY\n");
    assert_eq!(
        ok(&mut imp(&["secret", "import", "--all"])),
        "skipped anthropic: already stored (pass -f to overwrite)\nimported github from GITHUB_TOKEN\n"
    );
    assert_eq!(
        ok(&mut imp(&["secret", "import", "--all", "-f"])),
        "imported anthropic from ANTHROPIC_API_KEY\nimported github from GITHUB_TOKEN\n"
    );
    let (code, _, err) = output(&mut imp(&["secret", "import", "openai"]));
    assert_eq!(code, 1, "an empty variable is not a key: {err}");
    assert_no_plaintext(&w, &[]);
}

#[test]
fn debug_logs_never_carry_values() {
    let w = World::new();
    for args in [
        &["-D", "secret", "set", "-g", "anthropic", "-t", KEY_A][..],
        &["-D", "secret", "set", "--sandbox", "red-fox", "openai", "-t", KEY_B],
        &["-D", "secret", "ls", "--json"],
        &["-D", "secret", "rm", "-g", "anthropic", "-f"],
    ] {
        let (code, out, err) = output(file(&w, args).env("PPP_LOG", "trace"));
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(err.contains("debug: ") || err.contains("trace: ") || err.is_empty(), "{err}");
        assert!(!err.contains('\u{1b}'), "no colour codes: {err:?}");
        assert_no_plaintext(&w, &[out, err]);
    }
    let list: Value = serde_json::from_str(&ok(&mut file(&w, &["secret", "ls", "red-fox", "--json"]))).unwrap();
    assert_eq!(list[0]["name"], "openai", "--sandbox scopes like the positional");
}

#[test]
fn custom_secrets_can_be_removed() {
    let w = World::new();
    ok(&mut file(
        &w,
        &[
            "secret",
            "set-custom",
            "-g",
            "--placeholder",
            "PPP_JIRA_TOKEN",
            "--host",
            "jira.example.com",
            "--value",
            CUSTOM,
        ],
    ));
    let (code, _, err) = with_stdin(
        file(
            &w,
            &[
                "secret",
                "set-custom",
                "box1",
                "--placeholder",
                "myplaceholder1",
                "--host",
                "a.example.com",
                "--password-stdin",
            ],
        ),
        CUSTOM,
    );
    assert_eq!(code, 0, "{err}");
    ok(&mut file(&w, &["secret", "set", "box1", "myplaceholder1", "--host", "b.example.com", "-t", KEY_A]));
    assert_eq!(
        ok(&mut file(&w, &["secret", "rm", "-g", "PPP_JIRA_TOKEN", "-f"])),
        "removed `PPP_JIRA_TOKEN` for every sandbox\n"
    );
    // Same name as a service key and a custom secret: the service goes
    // first, and --custom picks the custom one.
    ok(&mut file(&w, &["secret", "rm", "box1", "myplaceholder1", "--custom", "-f"]));
    let list: Value = serde_json::from_str(&ok(&mut file(&w, &["secret", "ls", "--json"]))).unwrap();
    let left: Vec<(&str, &str)> =
        list.as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap())).collect();
    assert_eq!(left, [("myplaceholder1", "service")]);
}

#[test]
fn key_shaped_arguments_are_not_echoed() {
    let w = World::new();
    for args in [
        &["secret", "set", "anthropic", "sk-ant-api03-AbCdEf_123"][..],
        &["secret", "set", "-g", "ghp_abc123def456ghi789jkl"],
    ] {
        let (code, out, err) = output(&mut file(&w, args));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("looks like a secret value"), "{err}");
        assert!(!err.contains(args[args.len() - 1]) && !out.contains(args[args.len() - 1]), "{err}");
    }
}

#[test]
fn values_come_from_stdin_not_argv_echo() {
    let w = World::new();
    let (code, _, err) = output(file(&w, &["secret", "set", "-g", "openai"]).stdin(Stdio::null()));
    assert_eq!(code, 2);
    assert!(err.contains("--password-stdin"), "{err}");
    let (code, _, err) = with_stdin(file(&w, &["secret", "set", "-g", "openai", "--password-stdin"]), "\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("empty"), "{err}");
    let (code, _, err) = output(&mut file(&w, &["secret", "set", "-g", "x", "y"]));
    assert_eq!(code, 2, "-g with a sandbox is ambiguous: {err}");
    let (code, _, err) = output(&mut file(&w, &["secret", "set", "-g", "openai", "--oauth"]));
    assert_eq!((code, err.as_str()), (2, "error: `ppp secret set --oauth` is not available yet\n"));
}

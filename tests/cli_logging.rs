//! `-D`, `RUST_LOG` and `-q` as users meet them: debug lines on stderr in
//! ppp's own `debug: …` shape, never a secret's value, and `-q` keeping
//! output terse. (Issue 5; `cli_secret.rs` covers `-D` with `PPP_LOG`.)

mod common;

use common::{World, output};

const KEY: &str = "sk-ant-logging-test-0123456789";

fn has_debug_line(err: &str) -> bool {
    err.lines().any(|l| l.starts_with("debug: ppp ") && l.ends_with("command `ls`"))
}

#[test]
fn debug_flag_prints_debug_lines() {
    let w = World::new();
    let (code, out, err) = output(&mut w.ppp(["-D", "ls"]));
    assert_eq!(code, 0, "{err}");
    assert!(has_debug_line(&err), "{err}");
    assert!(!err.contains('\u{1b}'), "no colour codes: {err:?}");
    assert_eq!(out, "NAME  AGENT  STATUS  CPUS  MEMORY  PORTS  PODMAN  TOKENS  WORKSPACE\n", "stdout is untouched");
    // Without -D (and no filter in the environment) there is none.
    let (_, _, err) = output(&mut w.ppp(["ls"]));
    assert_eq!(err, "");
}

#[test]
fn rust_log_works_too_and_ppp_log_wins() {
    let w = World::new();
    let (code, _, err) = output(w.ppp(["ls"]).env("RUST_LOG", "debug"));
    assert_eq!(code, 0, "{err}");
    assert!(has_debug_line(&err), "{err}");
    let (_, _, err) = output(w.ppp(["ls"]).env("RUST_LOG", "debug").env("PPP_LOG", "warn"));
    assert_eq!(err, "", "PPP_LOG is ppp's own and overrides RUST_LOG");
}

#[test]
fn debug_lines_never_carry_a_secret() {
    let w = World::new();
    for (args, var) in [
        (&["-D", "secret", "set", "-g", "anthropic", "-t", KEY][..], None),
        (&["secret", "set", "-g", "openai", "-t", KEY], Some("trace")),
        (&["-D", "secret", "ls"], Some("trace")),
    ] {
        let mut cmd = w.ppp(args);
        cmd.env("PPP_SECRET_BACKEND", "file");
        if let Some(v) = var {
            cmd.env("RUST_LOG", v);
        }
        let (code, out, err) = output(&mut cmd);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(err.contains("debug: ppp "), "{args:?}: {err}");
        assert!(!err.contains(KEY) && !out.contains(KEY), "{args:?} printed the key:\n{out}\n{err}");
    }
}

#[test]
fn quiet_lists_only_names_before_or_after_the_command() {
    let w = World::new();
    w.write_record("red-fox", 51820, "stopped");
    for args in [&["-q", "ls"][..], &["ls", "-q"], &["ls", "--quiet"]] {
        let (code, out, err) = output(&mut w.ppp(args));
        assert_eq!((code, out.as_str(), err.as_str()), (0, "red-fox\n", ""), "{args:?}");
    }
}

//! Sandbox commands' early errors: each names the problem and the fix,
//! exits non-zero, and creates nothing. These need no VM: they fail before
//! ppp would touch one. The lifecycle itself runs against the fake podman
//! in the end-to-end tests.

mod common;

use common::{World, output};

/// Every file under `root`, for "nothing was created".
fn files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

#[test]
fn unknown_agent_and_missing_path_fail_before_anything() {
    let w = World::new();
    let (code, _, err) = output(&mut w.ppp(["run", "copilot", "."]));
    assert_eq!(code, 1, "{err}");
    assert!(err.starts_with("error: unknown agent `copilot`\n"), "{err}");
    assert!(err.contains("hint: ppp runs these agents: opencode, claude, codex, gemini"), "{err}");
    let (code, _, err) = output(&mut w.ppp(["create", "opencode", "does/not/exist"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("workspace `does/not/exist` cannot be used"), "{err}");
    let (code, _, err) = output(&mut w.ppp(["create", "-m", "8x", "opencode", "."]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid memory size `8x`"), "{err}");
    let (code, _, err) = output(&mut w.ppp(["create", "-m", "512m", "opencode", "."]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("512 MiB of memory is too little") && err.contains("minimum is 1536 MiB"), "{err}");
    let (code, _, err) = output(&mut w.ppp(["create", "--name", "Bad_Name", "opencode", "."]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid sandbox name `Bad_Name`"), "{err}");
    assert!(files(&w.data()).is_empty(), "nothing was created: {:?}", files(&w.data()));
}

#[test]
fn missing_podman_is_named_with_a_fix() {
    let w = World::new();
    let (code, _, err) = output(w.ppp(["create", "opencode", "."]).env("PPP_PODMAN", w.path().join("no-such-podman")));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("podman") && err.contains("hint:"), "{err}");
    // Not on PATH either (PATH holds only the test's empty bin dir).
    let (code, _, err) = output(w.ppp(["create", "opencode", "."]).env("PATH", w.bin()));
    assert_eq!(code, 1, "{err}");
    assert!(err.starts_with("error: podman was not found\n"), "{err}");
    assert!(err.contains("hint: install Podman"), "{err}");
    assert!(files(&w.data()).is_empty(), "nothing was created: {:?}", files(&w.data()));
}

#[test]
fn unknown_sandboxes_are_named() {
    let w = World::new();
    for args in [&["stop", "ghost"][..], &["rm", "-f", "ghost"][..]] {
        let (code, _, err) = output(&mut w.ppp(args));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with("error: no sandbox named `ghost`\n"), "{args:?}: {err}");
        assert!(err.contains("hint: list sandboxes with `ppp ls`"), "{args:?}: {err}");
    }
    // Without -f and without a terminal, rm asks and cannot: it refuses,
    // and the sandbox stays.
    let dirs = w.stopped_sandbox("red");
    let (code, _, err) = output(&mut w.ppp(["rm", "red"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("hint: to go ahead without asking, run `ppp rm -f red`"), "{err}");
    assert!(dirs.sandbox_record("red").exists());
}

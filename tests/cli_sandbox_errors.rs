//! Sandbox commands' early errors: each names the problem and the fix,
//! exits non-zero, and creates nothing. These need no VM: they fail before
//! ppp would touch one. The lifecycle itself runs against the fake podman
//! in the end-to-end tests; one test here does too, for what `create`
//! prints at its end.

mod common;

#[path = "support/netns.rs"]
mod netns;

#[path = "support/sandbox_env.rs"]
mod sandbox_env;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::{World, output};
use sandbox_env::{Env, setup_policy};

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
    assert_eq!(code, 2, "{err}");
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
    // Not `.`: the world's root holds ppp's own directories.
    let ws = w.home();
    let ws = ws.to_str().unwrap();
    let (code, _, err) = output(w.ppp(["create", "opencode", ws]).env("PPP_PODMAN", w.path().join("no-such-podman")));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("podman") && err.contains("hint:"), "{err}");
    // Not on PATH either (PATH holds only the test's empty bin dir).
    let (code, _, err) = output(w.ppp(["create", "opencode", ws]).env("PATH", w.bin()));
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

/// A workspace is mounted read-write into the sandbox: mounting `~` (which
/// holds ppp's config and data by default), a link to it, or a directory
/// inside ppp's data would hand the agent ppp's secrets, keys and policy.
#[test]
fn a_workspace_holding_or_inside_ppps_own_dirs_is_refused() {
    let w = World::new();
    let home = w.home();
    std::os::unix::fs::symlink(&home, w.path().join("home-link")).unwrap();
    std::fs::create_dir_all(home.join("src/app")).unwrap();
    // ppp's roots at their defaults under HOME, as for most users.
    let at_home = |args: &[&str]| {
        let mut c = w.ppp(args);
        c.env_remove("PPP_CONFIG").env_remove("PPP_DATA").env_remove("PPP_CACHE");
        output(&mut c)
    };
    let home_c = std::fs::canonicalize(&home).unwrap();
    for verb in ["create", "run"] {
        for ws in [home.clone(), w.path().join("home-link")] {
            let (code, out, err) = at_home(&[verb, "opencode", ws.to_str().unwrap()]);
            assert_eq!(code, 2, "{verb} {}: {err}", ws.display());
            assert_eq!(out, "");
            assert_eq!(
                err,
                format!(
                    "error: workspace `{}` cannot be used\n  caused by: it contains ppp's config directory `{}`\n\
                     hint: mount a project directory instead, e.g. `~/src/app`: the agent can change its \
                     workspace, and ppp's directories hold its policy, keys and secrets\n",
                    home_c.display(),
                    home_c.join(".config/ppp").display()
                )
            );
        }
        // Inside PPP_DATA, also when it is only one of several workspaces.
        let inside = w.data().join("sandboxes");
        std::fs::create_dir_all(&inside).unwrap();
        let (code, _, err) =
            output(&mut w.ppp([verb, "opencode", home.join("src/app").to_str().unwrap(), inside.to_str().unwrap()]));
        assert_eq!(code, 2, "{err}");
        let data_c = std::fs::canonicalize(w.data()).unwrap();
        assert!(err.contains(&format!("caused by: it is inside ppp's data directory `{}`", data_c.display())), "{err}");
        std::fs::remove_dir(&inside).unwrap();
    }
    assert!(files(w.path()).is_empty(), "nothing was created: {:?}", files(w.path()));
    // A project directory under `~` is fine: the error is about podman now.
    let mut c = w.ppp(["create", "opencode", home.join("src/app").to_str().unwrap()]);
    c.env_remove("PPP_CONFIG").env_remove("PPP_DATA").env_remove("PPP_CACHE").env("PATH", w.bin());
    let (_, _, err) = output(&mut c);
    assert!(err.starts_with("error: podman was not found\n"), "{err}");
}

/// `create` ends with the `ppp run` line that starts the agent, and users
/// paste it. A workspace named like a command substitution must come back
/// as that name, not run on the host.
#[test]
fn the_run_hint_create_prints_is_safe_to_paste() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    // Quotes balanced, so that an unquoted hint runs every part of it.
    let ws = env.root().join(r#"$(touch pwned) `touch pwned2`; touch pwned3 'it'"s""#);
    std::fs::create_dir_all(&ws).unwrap();
    let out = env.ok(&["create", "--name", "red", "opencode", ws.to_str().unwrap()]);
    let hint = out
        .split_once("start the agent with `")
        .and_then(|(_, rest)| rest.strip_suffix("`\n"))
        .unwrap_or_else(|| panic!("no hint in {out:?}"));
    // Pasted into a shell, with `ppp` a stub that records its argv.
    let paste = tempfile::tempdir().unwrap();
    let bin = paste.path().join("bin");
    let cwd = paste.path().join("cwd");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(bin.join("ppp"), "#!/bin/sh\nprintf '%s\\0' \"$@\" > \"$ARGV_OUT\"\n").unwrap();
    std::fs::set_permissions(bin.join("ppp"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let argv_out = paste.path().join("argv");
    let sh = Command::new("sh")
        .args(["-c", hint])
        .current_dir(&cwd)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("ARGV_OUT", &argv_out)
        .output()
        .unwrap();
    let made: Vec<_> = std::fs::read_dir(&cwd).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(made.is_empty(), "pasting `{hint}` ran something: {made:?}");
    assert!(sh.status.success(), "{hint}: {}", netns::describe(&sh));
    let argv = std::fs::read(&argv_out).unwrap();
    let argv: Vec<&str> = std::str::from_utf8(&argv).unwrap().split_terminator('\0').collect();
    let ws = std::fs::canonicalize(&ws).unwrap();
    assert_eq!(argv, ["run", "--name", "red", "opencode", ws.to_str().unwrap()], "{hint}");
}

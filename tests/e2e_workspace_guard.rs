//! The workspace guard end to end (issue 26, ADR 0036) on the fake podman,
//! whose containers honour `:ro` binds with a real read-only bind mount
//! and run with no capabilities (so they cannot remount): a stand-in agent
//! tries to plant hooks and git config, and files that cannot be mounted.

#[path = "support/netns.rs"]
mod netns;

#[path = "support/sandbox_env.rs"]
mod sandbox_env;

use std::process::Command;

use netns::describe;
use sandbox_env::{Env, setup_policy};

fn git(env: &Env, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .arg("-C")
        .arg(env.ws())
        .args(args)
        .env("HOME", env.root().join("home"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap()
}

/// The same attack with the guard off (`workspace.unprotected`): the
/// writes succeed, so the test above fails without the guard's mounts.
#[test]
fn with_the_guard_off_the_same_writes_succeed() {
    let env = Env::new("qemu");
    setup_policy(&env, "blue");
    std::fs::create_dir_all(env.root().join("config")).unwrap();
    std::fs::write(env.root().join("config/config.yaml"), "workspace:\n  unprotected: [blue]\n").unwrap();
    let home = env.root().join("home");
    std::fs::write(home.join(".gitconfig"), "[safe]\n\tdirectory = *\n").unwrap();
    assert!(git(&env, &["init", "-q"]).status.success());
    assert!(Command::new("chown").args(["-R", "1000:1000", &env.ws()]).status().unwrap().success());
    let script = r#"cd "$PWD"
echo x > .git/hooks/pre-commit && echo hook-written
git config core.fsmonitor true && echo config-written
"#;
    let out = env.run(&["run", "--name", "blue", "opencode", &env.ws(), "--", "sleep-then", script]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("hook-written") && text.contains("config-written"), "{}", describe(&out));
    assert_eq!(env.ls()[0]["protection"], "off");
}

#[test]
fn the_agent_cannot_plant_hooks_or_config_and_what_it_creates_is_moved_aside() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    let home = env.root().join("home");
    std::fs::write(home.join(".gitconfig"), "[safe]\n\tdirectory = *\n[user]\n\tname = t\n\temail = t@t\n").unwrap();
    assert!(git(&env, &["init", "-q"]).status.success());
    std::fs::write(format!("{}/README", env.ws()), "hello\n").unwrap();
    assert!(git(&env, &["add", "README"]).status.success());
    assert!(git(&env, &["commit", "-qm", "first"]).status.success());
    // The fake's containers run as uid 1000: the workspace is theirs, so
    // only the guard's mounts can stop a write.
    assert!(Command::new("chown").args(["-R", "1000:1000", &env.ws()]).status().unwrap().success());
    let marker = env.root().join("marker");
    let m = marker.display().to_string();
    let script = format!(
        r#"cd "$PWD"
printf '#!/bin/sh\ntouch {m}\n' > .git/hooks/pre-commit 2>/dev/null && echo hook-written || echo hook-refused
git config core.fsmonitor "touch {m}" 2>/dev/null && echo config-written || echo config-refused
printf '[core]\n\tfsmonitor = touch {m}\n' >> .git/config 2>/dev/null && echo append-written || echo append-refused
mv .git .git.old 2>/dev/null && echo git-moved || echo git-pinned
echo 'touch {m}' > .envrc
echo change >> README
git -c user.name=a -c user.email=a@a commit -qam 'by the agent' && echo commit-ok || echo commit-failed
"#
    );
    let out = env.run(&["run", "--strict", "--name", "red", "opencode", &env.ws(), "--", "sleep-then", &script]);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    for want in ["hook-refused", "config-refused", "append-refused", "git-pinned", "commit-ok"] {
        assert!(text.contains(want), "{want}: {}", describe(&out));
    }
    assert_eq!(out.status.code(), Some(1), "strict moved a file aside: {}", describe(&out));
    assert!(err.contains(".envrc") && err.contains("moved aside"), "{err}");
    assert!(std::path::Path::new(&format!("{}/.envrc.ppp-quarantine", env.ws())).exists());
    assert!(!std::path::Path::new(&format!("{}/.envrc", env.ws())).exists());
    // The host's git runs nothing the agent planted.
    std::fs::write(format!("{}/README", env.ws()), "host\n").unwrap();
    let c = git(&env, &["commit", "-qam", "by the host"]);
    assert!(c.status.success(), "{}", describe(&c));
    assert!(!marker.exists(), "a planted hook or config ran on the host");
    let log = git(&env, &["log", "--format=%s"]);
    assert!(String::from_utf8_lossy(&log.stdout).contains("by the agent"));
    let ls = env.ls();
    assert_eq!(ls[0]["protection"], "on", "{ls:?}");
}

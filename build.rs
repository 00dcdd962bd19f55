//! Embeds the git revision ppp was built from (`ppp version` reports it),
//! or `unknown` when the source is not a git checkout or git is missing,
//! as in a crate tarball.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    let revision = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PPP_GIT_REVISION={revision}");
    // A commit moves the branch ref, not HEAD, and a checkout moves HEAD;
    // watch both (and packed-refs, where `git gc` moves refs). `--git-path`
    // resolves them for linked worktrees too, whose `.git` is a file.
    println!("cargo:rerun-if-changed=build.rs");
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(r);
    }
    for p in watched {
        // A path that does not exist would make cargo rerun this script,
        // and rebuild ppp, on every build.
        if let Some(path) = git(&["rev-parse", "--git-path", &p]).filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

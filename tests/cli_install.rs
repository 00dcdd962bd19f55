//! `make install`'s man step (`scripts/install.sh man`, the same code
//! `make install` runs after `cargo install`): the pages land where `man`
//! finds them with no MANPATH set, both in the default layout and with
//! PREFIX. Issue 14: pages in `~/.local/share/man` were not found, because
//! man-db searches `<dir>/../share/man` only for the directories on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A PATH with the system's tools and `bindir` first, as a user who can
/// run the installed `ppp` has.
fn path_with(bindir: &Path) -> String {
    format!("{}:/usr/local/bin:/usr/bin:/bin", bindir.display())
}

/// Put the built ppp where `cargo install` would have put it.
fn place_binary(bindir: &Path) {
    std::fs::create_dir_all(bindir).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_ppp"), bindir.join("ppp")).unwrap();
}

/// `scripts/install.sh man` with a clean environment plus `vars`.
fn install_man(home: &Path, bindir: &Path, vars: &[(&str, &Path)]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh");
    let mut cmd = Command::new(script);
    cmd.arg("man").env_clear().env("HOME", home).env("PATH", path_with(bindir));
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "install.sh man failed: {err}");
    err
}

/// `man -w PAGE` as the user would run it: no MANPATH, `bindir` on PATH.
fn man_w(home: &Path, bindir: &Path, page: &str) -> (bool, String) {
    let out = Command::new("man")
        .args(["-w", page])
        .env_clear()
        .env("HOME", home)
        .env("PATH", path_with(bindir))
        .output()
        .expect("man runs (man-db is installed by scripts/install-test-deps.sh)");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn man_finds_the_pages_in_the_default_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let bindir = home.join(".cargo/bin");
    place_binary(&bindir);
    let err = install_man(&home, &bindir, &[]);
    let mandir = home.join(".cargo/share/man");
    assert!(err.contains(&format!("man pages to {}/man1", mandir.display())), "{err}");
    assert!(!err.contains("not on PATH"), "{err}");
    for page in ["ppp", "ppp-policy-allow"] {
        let (found, path) = man_w(&home, &bindir, page);
        assert!(found, "`man -w {page}` found nothing");
        assert_eq!(PathBuf::from(path), mandir.join(format!("man1/{page}.1")));
    }
}

#[test]
fn man_finds_the_pages_under_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let prefix = tmp.path().join("prefix");
    let bindir = prefix.join("bin");
    place_binary(&bindir);
    install_man(&home, &bindir, &[("PREFIX", &prefix)]);
    let (found, path) = man_w(&home, &bindir, "ppp");
    assert!(found, "`man -w ppp` found nothing");
    assert_eq!(PathBuf::from(path), prefix.join("share/man/man1/ppp.1"));
}

#[test]
fn a_bin_directory_off_path_is_said() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let bindir = home.join(".cargo/bin");
    place_binary(&bindir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh");
    let out =
        Command::new(script).arg("man").env_clear().env("HOME", &home).env("PATH", "/usr/bin:/bin").output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("note: {} is not on PATH", bindir.display())), "{err}");
}

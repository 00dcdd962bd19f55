//! The hermetic context every integration test runs the real `ppp` binary
//! in: its own HOME, XDG and PPP_* roots, and a PATH whose first entry is a
//! directory of fake executables the test writes.

#![allow(dead_code, unreachable_pub)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A temp world for one test.
pub struct World {
    pub root: tempfile::TempDir,
}

impl World {
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("ppp-test-")
            .tempdir()
            .unwrap();
        for d in ["home", "bin", "config", "data", "cache"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        Self { root }
    }

    pub fn path(&self) -> &Path {
        self.root.path()
    }
    pub fn home(&self) -> PathBuf {
        self.path().join("home")
    }
    pub fn bin(&self) -> PathBuf {
        self.path().join("bin")
    }
    pub fn config(&self) -> PathBuf {
        self.path().join("config")
    }
    pub fn data(&self) -> PathBuf {
        self.path().join("data")
    }
    pub fn cache(&self) -> PathBuf {
        self.path().join("cache")
    }

    /// `ppp` with the hermetic environment and `args`.
    pub fn ppp<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ppp"));
        c.env_clear()
            .env("HOME", self.home())
            .env("PATH", format!("{}:/usr/bin:/bin", self.bin().display()))
            .env("PPP_CONFIG", self.config())
            .env("PPP_DATA", self.data())
            .env("PPP_CACHE", self.cache())
            .env("NO_COLOR", "1")
            .env("COLUMNS", "100")
            .env("LANG", "C.UTF-8")
            .current_dir(self.path())
            .args(args);
        c
    }

    /// Write an executable shell script `name` into the fake bin directory.
    pub fn fake(&self, name: &str, script: &str) -> PathBuf {
        let p = self.bin().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// Replace the temp root in `text` with `[ROOT]`, for snapshots.
    pub fn redact(&self, text: &str) -> String {
        text.replace(&self.path().display().to_string(), "[ROOT]")
    }
}

/// Run and capture; returns (status code, stdout, stderr).
pub fn output(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("ppp runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Run, require success, return stdout.
pub fn ok(cmd: &mut Command) -> String {
    let (code, out, err) = output(cmd);
    assert_eq!(
        code, 0,
        "command failed: {cmd:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

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
        let root = tempfile::Builder::new().prefix("ppp-test-").tempdir().unwrap();
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

    /// ppp's directories in this world.
    pub fn dirs(&self) -> ppp::dirs::Dirs {
        ppp::dirs::Dirs { config: self.config(), data: self.data(), cache: self.cache() }
    }

    /// A stopped sandbox `name` on disk (record and port), as `ppp create`
    /// leaves one, for commands that need no VM.
    pub fn stopped_sandbox(&self, name: &str) -> ppp::dirs::Dirs {
        let dirs = self.dirs();
        let port = ppp::sandbox::with_registry(&dirs, |r| r.allocate(name)).unwrap();
        let rec = ppp::sandbox::Record {
            name: name.into(),
            agent: "opencode".into(),
            workspace: vec!["/tmp".into()],
            status: ppp::sandbox::Status::Stopped,
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            cpus: 1,
            memory: 2048,
            port,
            inner_ip: ppp::sandbox::inner_ip(port),
            kit_refs: Vec::new(),
            kit_env: std::collections::BTreeMap::new(),
            kit_files: std::collections::BTreeMap::new(),
            agent_generation: 0,
            template_tag: None,
            machine_name: ppp::sandbox::machine_name(name),
            published: Vec::new(),
            clone: None,
            image: None,
            image_origin: None,
            podman_run: None,
            boot_id: None,
        };
        ppp::sandbox::save_locked(&dirs, &rec).unwrap();
        dirs
    }

    /// A `sandbox.json` for `name` as a stopped-or-running `ppp create`
    /// leaves it (workspace `/src/<name>`), written as JSON so the file
    /// format itself is what the command under test reads. No port is
    /// claimed: for commands that read records only.
    pub fn write_record(&self, name: &str, port: u16, status: &str) {
        let dir = self.data().join("sandboxes").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let rec = serde_json::json!({
            "name": name,
            "agent": "opencode",
            "workspace": [format!("/src/{name}")],
            "status": status,
            "created_at": "2026-11-29T10:00:00Z",
            "cpus": 2,
            "memory": 4096,
            "port": port,
            "inner_ip": format!("10.0.0.{}", port - 51819),
            "kit_refs": [],
            "template_tag": null,
            "machine_name": format!("ppp-{name}"),
        });
        std::fs::write(dir.join("sandbox.json"), serde_json::to_string_pretty(&rec).unwrap()).unwrap();
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
            // Fakes first, then the stand-in hypervisor of the fake
            // podman's qemu provider (ppp checks one is installed).
            .env("PATH", format!("{}:{}:/usr/bin:/bin", self.bin().display(), fake_host_bin().display()))
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

/// The pinned mitmdump of the test venv (`$PPP_TEST_MITMDUMP`, else
/// `target/test-venv`); missing is a failure that names the fix.
pub fn test_mitmdump() -> PathBuf {
    let path = std::env::var_os("PPP_TEST_MITMDUMP")
        .filter(|v| !v.is_empty())
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin/mitmdump"), PathBuf::from);
    assert!(path.is_file(), "`{}` is missing: run `make test-deps`", path.display());
    path
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
    assert_eq!(code, 0, "command failed: {cmd:?}\nstdout:\n{out}\nstderr:\n{err}");
    out
}

/// A real Secret Service (gnome-keyring in its own D-Bus session) that
/// lives as long as this guard. ppp processes join it through
/// `DBUS_SESSION_BUS_ADDRESS`.
pub struct SecretService {
    child: std::process::Child,
    pub address: String,
}

impl SecretService {
    /// Start gnome-keyring, unlocked, with `home` as its HOME. Fails loudly
    /// when the tools are missing: `make test-deps` installs them.
    pub fn start(home: &Path) -> Self {
        for tool in ["dbus-run-session", "gnome-keyring-daemon", "dbus-send"] {
            assert!(
                std::process::Command::new("sh")
                    .arg("-c")
                    .arg(format!("command -v {tool}"))
                    .output()
                    .unwrap()
                    .status
                    .success(),
                "`{tool}` is missing; run `make test-deps` (scripts/install-test-deps.sh)"
            );
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/with-secret-service.sh");
        let addr_file = home.join("dbus-address");
        let mut child = std::process::Command::new("dbus-run-session")
            .arg("--")
            .arg(&script)
            .arg("sh")
            .arg("-c")
            .arg(format!(
                "echo \"$DBUS_SESSION_BUS_ADDRESS\" > {}.tmp && mv {0}.tmp {0} && exec sleep 600",
                addr_file.display()
            ))
            .env("HOME", home)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("dbus-run-session starts");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let address = loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                break a.trim().to_owned();
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the Secret Service session exited early: {status}");
            }
            assert!(std::time::Instant::now() < deadline, "the Secret Service did not come up within 30 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        Self { child, address }
    }

    /// Run `secret-tool` inside this session.
    pub fn secret_tool(&self, home: &Path, args: &[&str]) -> std::process::Output {
        std::process::Command::new("secret-tool")
            .args(args)
            .env("HOME", home)
            .env("DBUS_SESSION_BUS_ADDRESS", &self.address)
            .output()
            .expect("secret-tool runs (install libsecret-tools)")
    }
}

impl Drop for SecretService {
    fn drop(&mut self) {
        // Killing `sleep` ends the session: dbus-run-session then stops the
        // bus and gnome-keyring with it.
        let _ = std::process::Command::new("pkill").arg("-P").arg(self.child.id().to_string()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every file under `root` whose bytes contain `needle`.
pub fn files_containing(root: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p)
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                hits.push(p);
            }
        }
    }
    hits
}

/// A stand-in for the provider's hypervisor, which ppp looks for before it
/// creates a machine (see tests/fake-podman/host-bin).
pub fn fake_host_bin() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-podman/host-bin")
}

//! Issue 14: the new user's first `ppp run`, on a machine that lacks one
//! prerequisite at a time. Each gives, before anything is created, one
//! error with its cause and the fix, and leaves no sandbox directory, no
//! claimed port, no machine, no daemon and no mitmdump behind.
//!
//! The machine is the fake podman (`tests/fake-podman/podman`) with its
//! stand-in hypervisor; each case takes one piece away.

mod common;

use std::path::{Path, PathBuf};

use common::{World, fake_host_bin, output, test_mitmdump};

fn fake_podman() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-podman/podman")
}

/// One missing prerequisite: what to change in the environment, and what
/// the error must say.
struct Case {
    what: &'static str,
    env: Vec<(&'static str, String)>,
    error: &'static str,
    hint: &'static str,
}

fn cases(w: &World) -> Vec<Case> {
    let no_hypervisor_path = format!("{}:/usr/bin:/bin", w.bin().display());
    vec![
        Case {
            what: "no podman",
            env: vec![("PPP_PODMAN", w.path().join("no-podman").display().to_string())],
            error: "error: podman was not found at",
            hint: "hint: install Podman (https://podman.io/docs/installation)",
        },
        Case {
            what: "a podman too old",
            env: vec![("FAKE_PODMAN_VERSION", "4.3.1".into())],
            error: "error: podman 4.3.1 is too old",
            hint: "hint: upgrade Podman (ppp is tested with",
        },
        Case {
            what: "root",
            env: vec![("FAKE_PODMAN_FAIL", "root".into())],
            error: "error: podman refuses to run `podman machine` as root",
            hint: "hint: run ppp as your own user",
        },
        Case {
            what: "no hypervisor",
            env: vec![("PATH", no_hypervisor_path)],
            error: "error: `qemu-system-",
            hint: "hint: install QEMU: `sudo apt install qemu-system-",
        },
        Case {
            // No PPP_MITMDUMP and no venv: ppp would build one, and finds
            // no Python >= 3.12 (Debian 12's python3 is 3.11; the test's
            // HOME has no pyenv).
            what: "no Python 3.12",
            env: vec![
                ("PPP_MITMDUMP", String::new()),
                ("PPP_PYTHON", w.path().join("no-python").display().to_string()),
            ],
            error: "error: the sandbox's proxy needs mitmproxy",
            hint: "Python",
        },
    ]
}

#[test]
fn each_missing_prerequisite_fails_first_with_its_fix_and_leaves_nothing() {
    let w = World::new();
    let ws = w.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let fake_root = w.path().join("fake");
    for case in cases(&w) {
        let mut cmd = w.ppp(["run", "opencode", ws.to_str().unwrap()]);
        cmd.env("PPP_PODMAN", fake_podman())
            .env("FAKE_PODMAN_ROOT", &fake_root)
            .env("PPP_MITMDUMP", test_mitmdump())
            .env("PPP_SECRET_BACKEND", "file");
        for (k, v) in &case.env {
            if v.is_empty() {
                cmd.env_remove(k);
            } else {
                cmd.env(k, v);
            }
        }
        let (code, out, err) = output(&mut cmd);
        let what = case.what;
        assert_eq!(code, 1, "{what}: {err}");
        assert!(err.starts_with(case.error), "{what}: the error comes first and says what is missing:\n{err}");
        assert!(err.contains(case.hint), "{what}: the fix:\n{err}");
        assert_eq!(err.matches("error: ").count(), 1, "{what}: one error:\n{err}");
        assert!(!err.contains("was not created"), "{what}: nothing was started to be created:\n{err}");
        assert_eq!(out, "", "{what}");
        // Nothing behind: no sandbox directory, port, machine, daemon.
        let sandboxes = w.data().join("sandboxes");
        assert!(
            !sandboxes.exists() || std::fs::read_dir(&sandboxes).unwrap().next().is_none(),
            "{what}: a sandbox directory was left"
        );
        let registry = std::fs::read_to_string(w.data().join("port-registry.json")).unwrap_or_default();
        assert!(!registry.contains("opencode") && !registry.contains("\"5"), "{what}: a port was claimed: {registry}");
        assert!(!w.data().join("daemon.json").exists() || !daemon_running(&w), "{what}: a daemon was started");
        // In the default podman home, or in a sandbox's own (`homes/`).
        let homes: Vec<std::path::PathBuf> = std::fs::read_dir(fake_root.join("homes"))
            .map(|d| d.flatten().map(|h| h.path().join("machines")).collect())
            .unwrap_or_default();
        let machines: usize = std::iter::once(fake_root.join("machines"))
            .chain(homes)
            .map(|d| std::fs::read_dir(d).map_or(0, Iterator::count))
            .sum();
        assert_eq!(machines, 0, "{what}: a machine was made");
    }
    // And with everything in place the same command gets past all of it
    // (to podman, whose fake here has no agent image: a later failure).
    let mut cmd = w.ppp(["setup"]);
    cmd.env("PPP_PODMAN", fake_podman())
        .env("FAKE_PODMAN_ROOT", &fake_root)
        .env("PPP_MITMDUMP", test_mitmdump())
        .env("PPP_SECRET_BACKEND", "file");
    let (_, out, _) = output(&mut cmd);
    for row in ["podman ", "machine ", "hypervisor "] {
        let line = out.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row}row:\n{out}"));
        assert!(line.contains(" ok "), "{line}");
    }
    assert!(fake_host_bin().join(format!("qemu-system-{}", std::env::consts::ARCH)).exists());
}

fn daemon_running(w: &World) -> bool {
    let (_, out, _) = output(&mut w.ppp(["daemon", "status", "--json"]));
    out.contains("\"running\": true") || out.contains("\"running\":true")
}

//! `ppp template save|load|ls|rm` on the fake podman's machine disks (small
//! qcow2 files made by the real `qemu-img`), without booting anything: a
//! machine that was only `init`ed is stopped, so save needs no namespaces.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{World, ok, output};
use serde_json::Value;

fn fake_podman() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-podman/podman")
}

fn require_qemu_img() {
    assert!(
        Path::new("/usr/bin/qemu-img").is_file() || which("qemu-img"),
        "qemu-img is missing: run `make test-deps` (package qemu-utils)"
    );
}

fn which(p: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {p}")]).output().is_ok_and(|o| o.status.success())
}

/// A world with the fake podman and one sandbox `red` whose machine exists
/// (stopped) with a qcow2 disk.
struct T {
    w: World,
}

impl T {
    fn new() -> T {
        require_qemu_img();
        let t = T { w: World::new() };
        t.sandbox("red");
        t
    }

    fn ppp(&self, args: &[&str]) -> Command {
        let mut c = self.w.ppp(args);
        c.env("PPP_PODMAN", fake_podman()).env("FAKE_PODMAN_ROOT", self.w.path().join("fake"));
        c
    }

    fn podman(&self, args: &[&str]) -> String {
        let out = Command::new(fake_podman())
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", self.w.home())
            .env("FAKE_PODMAN_ROOT", self.w.path().join("fake"))
            .output()
            .unwrap();
        assert!(out.status.success(), "podman {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A podman that answers `podman <verb>` (e.g. `machine list`) with
    /// `json` and hands everything else to the fake.
    fn podman_answering(&self, verb: &str, json: &str) -> PathBuf {
        self.w.fake(
            "podman",
            &format!(
                "if [ \"$1 $2\" = '{verb}' ]; then echo '{json}'; exit 0; fi\nexec {} \"$@\"",
                fake_podman().display()
            ),
        )
    }

    fn sandbox(&self, name: &str) {
        self.w.write_record(name, 51820, "stopped");
        self.podman(&["machine", "init", &format!("ppp-{name}"), "--memory", "2048"]);
    }

    fn ls(&self) -> Vec<Value> {
        serde_json::from_str(&ok(&mut self.ppp(&["template", "ls", "--json"]))).unwrap()
    }

    fn templates_dir(&self) -> PathBuf {
        self.w.cache().join("templates")
    }

    /// Files in the templates directory other than the index and disks
    /// the index lists.
    fn strays(&self) -> Vec<String> {
        let listed: Vec<String> = self.ls().iter().map(|t| format!("{}.qcow2", t["id"].as_str().unwrap())).collect();
        std::fs::read_dir(self.templates_dir())
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n != "templates.json" && !listed.contains(n))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[test]
fn save_ls_export_load_rm() {
    let t = T::new();
    let out = ok(&mut t.ppp(&["template", "save", "red", "base"]));
    assert!(out.starts_with("saved template `base` ("), "{out}");
    let ls = t.ls();
    assert_eq!(ls.len(), 1);
    let tpl = &ls[0];
    for key in ["tag", "id", "source", "agent", "size", "sha256", "created_at", "path"] {
        assert!(!tpl[key].is_null(), "`{key}` in {tpl}");
    }
    assert_eq!(tpl["tag"], "base");
    assert_eq!(tpl["source"], "red");
    assert_eq!(tpl["agent"], "opencode");
    let sha = tpl["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64);
    assert_eq!(tpl["id"].as_str().unwrap(), &sha[..12]);
    let disk = PathBuf::from(tpl["path"].as_str().unwrap());
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), tpl["size"].as_u64().unwrap());
    assert_eq!(&std::fs::read(&disk).unwrap()[..4], b"QFI\xfb", "a qcow2");
    let info = Command::new("qemu-img").args(["info", "--output=json"]).arg(&disk).output().unwrap();
    let info: Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["format"], "qcow2");
    assert!(t.strays().is_empty(), "{:?}", t.strays());
    // The table.
    let table = ok(&mut t.ppp(&["template", "ls"]));
    assert!(table.starts_with("TAG   ID"), "{table}");
    assert!(table.contains("base  "), "{table}");
    // `-q`, the command's own or the global one, prints tags only.
    assert_eq!(ok(&mut t.ppp(&["template", "ls", "-q"])), "base\n");
    assert_eq!(ok(&mut t.ppp(&["-q", "template", "ls"])), "base\n");

    // Export, then load into a fresh cache.
    let file = t.w.path().join("base.tar");
    ok(&mut t.ppp(&["template", "save", "red", "base", "-o", file.to_str().unwrap()]));
    assert_eq!(t.ls().len(), 1, "saving the same tag again replaces it");
    let fresh = t.w.path().join("cache2");
    let load = |file: &Path| {
        let mut c = t.ppp(&["template", "load", file.to_str().unwrap()]);
        c.env("PPP_CACHE", &fresh);
        output(&mut c)
    };
    let (code, out, err) = load(&file);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("loaded template `base` ("), "{out}");
    let mut c = t.ppp(&["template", "ls", "--json"]);
    c.env("PPP_CACHE", &fresh);
    let loaded: Vec<Value> = serde_json::from_str(&ok(&mut c)).unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0]["sha256"], t.ls()[0]["sha256"]);
    assert_eq!(loaded[0]["source"], "red");
    let names: Vec<String> = std::fs::read_dir(fresh.join("templates"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "index and disk only: {names:?}");

    // rm by tag, and by id (prefix).
    ok(&mut t.ppp(&["template", "save", "red", "second"]));
    assert_eq!(t.ls().len(), 2);
    ok(&mut t.ppp(&["template", "rm", "base"]));
    let left = t.ls();
    assert_eq!(left.len(), 1);
    assert!(disk.exists(), "the disk `second` shares stays");
    let id = left[0]["id"].as_str().unwrap().to_owned();
    ok(&mut t.ppp(&["template", "rm", &id[..8]]));
    assert!(t.ls().is_empty());
    assert!(!disk.exists(), "the last tag's disk goes with it");
    let (code, _, err) = output(&mut t.ppp(&["template", "rm", "base"]));
    assert_eq!(code, 2);
    assert!(err.contains("error: no template with tag or id `base`"), "{err}");
    assert!(err.contains("hint: list templates with `ppp template ls`"), "{err}");
}

/// Load `file` into a fresh cache and expect it refused with `needle`,
/// with nothing registered and nothing left behind.
/// `tar -cf OUT -C DIR MEMBERS…`, which must succeed.
fn tar_cf(out: &Path, dir: &Path, members: &[&str]) {
    let st = Command::new("tar").arg("-cf").arg(out).arg("-C").arg(dir).args(members).status().unwrap();
    assert!(st.success(), "tar -cf {}", out.display());
}

fn refused(t: &T, file: &Path, needle: &str) {
    let fresh = t.w.path().join(format!("cache-{}", file.file_name().unwrap().to_string_lossy()));
    let mut c = t.ppp(&["template", "load", file.to_str().unwrap()]);
    c.env("PPP_CACHE", &fresh);
    let (code, out, err) = output(&mut c);
    assert_ne!(code, 0, "{out}");
    assert!(err.lines().any(|l| l.starts_with("error: ")), "{err}");
    assert!(err.contains(needle), "{err}");
    let left: Vec<String> = std::fs::read_dir(fresh.join("templates"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "nothing registered or left: {left:?}");
}

#[test]
fn damaged_files_are_refused_and_register_nothing() {
    let t = T::new();
    let file = t.w.path().join("good.tar");
    ok(&mut t.ppp(&["template", "save", "red", "base", "-o", file.to_str().unwrap()]));
    let bytes = std::fs::read(&file).unwrap();

    // Cut short: tar itself cannot read it.
    let cut = t.w.path().join("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    refused(&t, &cut, "is not a ppp template");

    // Not a tar at all.
    let junk = t.w.path().join("junk.tar");
    std::fs::write(&junk, b"hello").unwrap();
    refused(&t, &junk, "is not a ppp template");

    // A sound tar whose disk was changed after it was saved.
    let work = t.w.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    assert!(Command::new("tar").arg("-xf").arg(&file).arg("-C").arg(&work).status().unwrap().success());
    let disk = work.join("disk.qcow2");
    let mut d = std::fs::read(&disk).unwrap();
    let last = d.len() - 1;
    d[last] ^= 0xff;
    std::fs::write(&disk, d).unwrap();
    let bad = t.w.path().join("bad.tar");
    tar_cf(&bad, &work, &["template.json", "disk.qcow2"]);
    refused(&t, &bad, "does not match its checksum");

    // Extra members are refused before anything is extracted.
    std::fs::write(work.join("extra"), b"x").unwrap();
    let extra = t.w.path().join("extra.tar");
    tar_cf(&extra, &work, &["template.json", "disk.qcow2", "extra"]);
    refused(&t, &extra, "is not a ppp template");
}

/// Tars that pass the checksum but would make ppp or the VM read a host
/// file: a disk with a backing file or an external data file, a disk that
/// is not qcow2, and members that are links. Each is refused and nothing is
/// registered.
#[test]
fn hostile_templates_are_refused_and_register_nothing() {
    use sha2::Digest as _;
    let t = T::new();
    let file = t.w.path().join("good.tar");
    ok(&mut t.ppp(&["template", "save", "red", "base", "-o", file.to_str().unwrap()]));
    let good = t.w.path().join("good");
    std::fs::create_dir_all(&good).unwrap();
    assert!(Command::new("tar").arg("-xf").arg(&file).arg("-C").arg(&good).status().unwrap().success());
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(good.join("template.json")).unwrap()).unwrap();
    let secret = t.w.path().join("host-secret");
    std::fs::write(&secret, "not for the VM\n").unwrap();

    // A tar of `disk` (made by `make` in a fresh directory) with metadata
    // that matches it, so only the new checks can refuse it.
    let tar_of = |name: &str, make: &dyn Fn(&Path)| -> PathBuf {
        let work = t.w.path().join(format!("work-{name}"));
        std::fs::create_dir_all(&work).unwrap();
        let disk = work.join("disk.qcow2");
        make(&disk);
        let bytes = std::fs::read(&disk).unwrap();
        let mut m = meta.clone();
        m["sha256"] = format!("{:x}", sha2::Sha256::digest(&bytes)).into();
        m["size"] = bytes.len().into();
        std::fs::write(work.join("template.json"), serde_json::to_vec(&m).unwrap()).unwrap();
        let out = t.w.path().join(format!("{name}.tar"));
        tar_cf(&out, &work, &["template.json", "disk.qcow2"]);
        out
    };
    let qemu_img = |args: &[&str]| {
        let st = Command::new("qemu-img").args(args).status().unwrap();
        assert!(st.success(), "qemu-img {args:?}");
    };
    let backed = tar_of("backed", &|d| {
        qemu_img(&["create", "-q", "-f", "qcow2", "-b", secret.to_str().unwrap(), "-F", "raw", d.to_str().unwrap()]);
    });
    refused(&t, &backed, &format!("the disk has a backing file `{}`", secret.display()));
    let data = t.w.path().join("data.raw");
    let external = tar_of("external", &|d| {
        let opt = format!("data_file={}", data.display());
        qemu_img(&["create", "-q", "-f", "qcow2", "-o", &opt, d.to_str().unwrap(), "1M"]);
    });
    refused(&t, &external, "the disk has an external data file");
    let raw = tar_of("raw", &|d| std::fs::write(d, vec![0u8; 65536]).unwrap());
    refused(&t, &raw, "the disk is raw, not qcow2");

    // A symlink to a real qcow2 (whose digest the metadata carries).
    let linked = tar_of("linked", &|d| std::os::unix::fs::symlink(good.join("disk.qcow2"), d).unwrap());
    refused(&t, &linked, "`disk.qcow2` is not a regular file");

    // The untouched export still loads: the checks refuse only what they should.
    let fresh = t.w.path().join("cache-good");
    let mut c = t.ppp(&["template", "load", file.to_str().unwrap()]);
    c.env("PPP_CACHE", &fresh);
    ok(&mut c);
}

/// A tmpfs mounted for the life of the value; unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "ppp-test-full"])
            .arg(at)
            .status()
            .expect("mount runs (tests run as root)");
        assert!(st.success(), "could not mount a tmpfs on {}: tests need root", at.display());
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_leaves_no_half_template() {
    let t = T::new();
    // Even an empty disk's compressed copy (about 190 KiB of qcow2
    // metadata) does not fit in 64 KiB, so qemu-img fails part way.
    let _full = Tmpfs::mount(&t.templates_dir(), "64k");
    let (code, _, err) = output(&mut t.ppp(&["template", "save", "red", "base"]));
    assert_ne!(code, 0);
    assert!(err.contains("error: could not save template `base`"), "{err}");
    assert!(err.contains("caused by: `qemu-img convert -c -O qcow2"), "{err}");
    assert!(err.contains("hint: check the free space in"), "{err}");
    assert!(t.ls().is_empty(), "nothing registered");
    assert!(t.strays().is_empty(), "no temp file left: {:?}", t.strays());
}

#[test]
fn save_errors_name_what_to_do() {
    let t = T::new();
    let (code, _, err) = output(&mut t.ppp(&["template", "save", "nope", "base"]));
    assert_eq!(code, 2);
    assert!(err.contains("error: no sandbox named `nope`"), "{err}");
    let (code, _, err) = output(&mut t.ppp(&["template", "save", "red", "a/b"]));
    assert_eq!(code, 2);
    assert!(err.contains("error: invalid template tag `a/b`"), "{err}");
    // A machine whose inspect does not say where its disk is.
    let inspect = t.podman_answering("machine inspect", r#"[{"Name":"ppp-red"}]"#);
    let mut c = t.ppp(&["template", "save", "red", "base"]);
    c.env("PPP_PODMAN", inspect);
    let (code, _, err) = output(&mut c);
    assert_ne!(code, 0);
    assert!(
        err.contains("error: could not find the disk of machine `ppp-red`: it names no `ConfigDir.Path` and `Name`"),
        "{err}"
    );
    assert!(err.contains("hint: "), "{err}");
    assert!(t.ls().is_empty());
}

#[test]
fn saving_a_running_sandbox_without_a_terminal_needs_force() {
    let t = T::new();
    // `machine list` says the machine runs; everything else is the fake.
    let running = t.podman_answering("machine list", r#"[{"Name":"ppp-red","Running":true}]"#);
    let mut c = t.ppp(&["template", "save", "red", "base"]);
    c.env("PPP_PODMAN", &running).stdin(std::process::Stdio::null());
    let (code, _, err) = output(&mut c);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("standard input is not a terminal"), "{err}");
    assert!(err.contains("hint: to go ahead without asking, run `ppp template save -f red base`"), "{err}");
    assert!(t.ls().is_empty());
    let calls = std::fs::read_to_string(t.w.path().join("fake/calls.jsonl")).unwrap();
    assert!(!calls.contains("\"stop\""), "nothing stopped: {calls}");
}

/// While `template save` copies a disk (it holds the sandbox's disk lock),
/// the machine cannot be started and the sandbox cannot be saved again.
#[test]
fn a_sandbox_being_saved_cannot_start_or_be_saved_again() {
    let t = T::new();
    let lease = ppp::state::Lock::acquire(&t.w.dirs().sandbox_disk_lock("red")).unwrap();
    let ws = t.w.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    for args in
        [vec!["run", "--name", "red", "opencode", ws.to_str().unwrap()], vec!["template", "save", "-f", "red", "again"]]
    {
        let (code, _, err) = output(&mut t.ppp(&args));
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: sandbox `red` is being saved as a template; its machine must not start meanwhile"),
            "{args:?}: {err}"
        );
        assert!(err.contains("hint: wait for `ppp template save` to finish"), "{err}");
    }
    let calls = std::fs::read_to_string(t.w.path().join("fake/calls.jsonl")).unwrap_or_default();
    assert!(!calls.contains("\"start\""), "no machine was started: {calls}");
    assert!(t.ls().is_empty());
    // Released (as when a save ends or dies): saving works again.
    drop(lease);
    ok(&mut t.ppp(&["template", "save", "-f", "red", "again"]));
    assert_eq!(t.ls().len(), 1);
}

/// A template saved from another agent's sandbox is used, with a warning
/// that the agent's image will be pulled after all. (Here the create then
/// stops early: `sandboxes.max_running` is 0.)
#[test]
fn a_template_from_another_agent_warns() {
    let t = T::new();
    ok(&mut t.ppp(&["template", "save", "red", "base"]));
    let busy = t.podman_answering("machine list", "[]");
    std::fs::create_dir_all(t.w.config()).unwrap();
    std::fs::write(t.w.config().join("config.yaml"), "sandboxes:\n  max_running: 0\n").unwrap();
    let ws = t.w.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    for (agent, warned) in [("claude", true), ("opencode", false)] {
        let mut c = t.ppp(&["create", "-t", "base", agent, ws.to_str().unwrap()]);
        c.env("PPP_PODMAN", &busy);
        let (code, _, err) = output(&mut c);
        assert_ne!(code, 0, "{err}");
        assert!(err.contains("`sandboxes.max_running`") && err.contains("is 0: no sandbox may run"), "{err}");
        let warning =
            "warning: template `base` was saved from a sandbox running opencode, not claude; its image will be pulled";
        assert_eq!(err.contains(warning), warned, "{agent}: {err}");
    }
}

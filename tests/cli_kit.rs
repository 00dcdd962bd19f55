//! `ppp kit validate|inspect|pack|add` on kits the tests write: strict
//! errors, malicious kits refused without changing anything, deterministic
//! packs, and `kit add` against a small recording fake podman whose "VM" is
//! a directory (`guest/`): ssh runs the line with guest-side wrappers for
//! `sudo`, `install`, `mkdir`, `rm`, `touch` and `podman` that map absolute
//! paths into that directory.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{World, output};

const GOOD: &str = "\
apiVersion: ppp.kit/v1
kind: Kit
metadata:
  name: tools
  version: 0.1.0
spec:
  network:
    allow: [\"registry.npmjs.org\", \"*.pypi.org\"]
    deny: [\"evil.example.com\"]
  env:
    TOOLS_HOME: /opt/tools
  startup:
    - command: [\"touch\", \"/var/tmp/tools-ran\"]
  files:
    - path: /etc/tools/config.toml
      content: \"answer = 42\\n\"
      mode: \"0600\"
    - path: /usr/local/bin/tool
      source: bin/tool
      mode: 755
";

fn write_kit(dir: &Path, manifest: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::write(dir.join("kit.yaml"), manifest).unwrap();
    std::fs::write(dir.join("bin/tool"), "#!/bin/sh\necho tool\n").unwrap();
    dir.to_owned()
}

fn ppp_ok(w: &World, args: &[&str]) -> String {
    let (code, out, err) = output(&mut w.ppp(args));
    assert_eq!(code, 0, "ppp {args:?}: {err}");
    out
}

fn ppp_err(w: &World, args: &[&str]) -> String {
    let (code, _, err) = output(&mut w.ppp(args));
    assert_ne!(code, 0, "ppp {args:?} should fail");
    err
}

#[test]
fn validate_and_inspect_a_good_kit() {
    let w = World::new();
    let kit = write_kit(&w.path().join("k"), GOOD);
    let out = ppp_ok(&w, &["kit", "validate", kit.to_str().unwrap()]);
    assert_eq!(out, "kit `tools` 0.1.0 is valid\n");
    let json: serde_json::Value =
        serde_json::from_str(&ppp_ok(&w, &["kit", "inspect", "--json", kit.to_str().unwrap()])).unwrap();
    assert_eq!(json["name"], "tools");
    assert_eq!(json["files"][0]["mode"], "0600");
    assert_eq!(json["files"][1]["mode"], "0755");
    assert_eq!(json["network"]["deny"][0], "evil.example.com");
    let text = ppp_ok(&w, &["kit", "inspect", kit.to_str().unwrap()]);
    assert!(text.contains("version:  0.1.0"), "{text}");
    assert_eq!(std::fs::read_dir(w.data()).unwrap().count(), 0, "nothing written");
}

#[test]
fn unknown_field_names_file_line_and_column() {
    let w = World::new();
    let kit = write_kit(&w.path().join("k"), &GOOD.replace("  env:\n", "  envv:\n"));
    let err = ppp_err(&w, &["kit", "validate", kit.to_str().unwrap()]);
    assert!(err.contains("kit.yaml` line 10, column 3: spec: unknown field `envv`"), "{err}");
}

/// A bad value is an error naming the file, the line and column of the
/// value, and its field.
#[test]
fn field_errors_name_file_line_and_field() {
    let w = World::new();
    for (i, (from, to, want)) in [
        ("name: tools", "name: Tools!", "line 4, column 9: metadata.name: `Tools!` may contain only"),
        ("[\"evil.example.com\"]", "[\"https://x/y\"]", "line 9, column 12: spec.network.deny[0]: "),
        ("TOOLS_HOME", "1BAD", "line 11, column 5: spec.env: `1BAD` is not a valid variable name"),
        ("path: /etc/tools/config.toml", "path: ../x", "line 15, column 13: spec.files[0].path: `../x` must be"),
        ("      mode: 755", "      mode: 4755", "line 20, column 13: spec.files[1].mode: `4755` is not a file mode"),
        ("source: bin/tool", "source: ../bin", "line 19, column 15: spec.files[1].source: `../bin` must stay"),
    ]
    .into_iter()
    .enumerate()
    {
        assert!(GOOD.contains(from), "{from}");
        let dir = write_kit(&w.path().join(format!("f{i}")), &GOOD.replace(from, to));
        let err = ppp_err(&w, &["kit", "validate", dir.to_str().unwrap()]);
        let file = dir.join("kit.yaml");
        assert!(err.starts_with(&format!("error: `{}` {want}", file.display())), "case {i}: want `{want}` in {err}");
    }
}

/// Every malicious kit is refused with an error saying why, by `validate`,
/// `pack` and `kit add`, and `kit add` changes nothing: the record, the
/// policy, the VM and podman are untouched.
#[test]
fn malicious_kits_are_refused() {
    let w = sandbox_world();
    let record = w.data().join("sandboxes/red/sandbox.json");
    let before = std::fs::read(&record).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (GOOD.replace("path: /etc/tools/config.toml", "path: ../x"), "must be an absolute path"),
        (GOOD.replace("path: /etc/tools/config.toml", "path: /etc/../x"), "must not contain `..`"),
        (GOOD.replace("source: bin/tool", "source: ../../etc/passwd"), "must stay inside the kit"),
        (GOOD.replace("source: bin/tool", "source: /etc/passwd"), "must be relative"),
        (GOOD.replace("source: bin/tool", "source: bin/link"), "resolves outside the kit directory"),
        (GOOD.replace("source: bin/tool", "source: bin/huge"), "larger than the limit of 1 MiB"),
        (GOOD.replace("registry.npmjs.org", "https://x.org/path"), "is a URL, not a resource"),
        (GOOD.replace("TOOLS_HOME", "1BAD"), "is not a valid variable name"),
        (GOOD.replace("name: tools", "name: Tools!"), "metadata.name"),
        (GOOD.replace("version: 0.1.0", "version: one"), "metadata.version"),
        (GOOD.replace("apiVersion: ppp.kit/v1", "apiVersion: ppp.kit/v9"), "apiVersion"),
        (GOOD.replace("      mode: 755", "      mode: 755\n      owner: root"), "unknown field `owner`"),
    ];
    for (i, (manifest, want)) in cases.iter().enumerate() {
        let dir = write_kit(&w.path().join(format!("k{i}")), manifest);
        std::os::unix::fs::symlink("/etc/passwd", dir.join("bin/link")).unwrap();
        std::fs::write(dir.join("bin/huge"), vec![b'x'; 1024 * 1024 + 1]).unwrap();
        let err = ppp_err(&w, &["kit", "validate", dir.to_str().unwrap()]);
        assert!(err.contains(want), "case {i}: want `{want}` in {err}");
        assert!(err.starts_with("error: "), "{err}");
        let err = ppp_err(&w, &["kit", "pack", dir.to_str().unwrap(), "-o", "out.zip"]);
        assert!(err.contains(want), "case {i}: {err}");
        assert!(!w.path().join("out.zip").exists());
        let (code, _, err) = add(&w, &dir);
        assert_ne!(code, 0, "case {i}");
        assert!(err.contains(want), "case {i}: {err}");
        assert_unchanged(&w, &before);
    }

    // Archives whose entries would escape, or are links: refused the same way.
    let good_kit = write_kit(&w.path().join("good"), GOOD);
    for (i, (entry, want)) in [
        ("../evil", "entry `../evil` is not a plain relative path"),
        ("/etc/evil", "entry `/etc/evil` is not a plain relative path"),
        ("bin/tool@symlink", "entry `bin/tool` is a symlink"),
    ]
    .into_iter()
    .enumerate()
    {
        let zip = w.path().join(format!("evil{i}.zip"));
        let st = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys, zipfile\n\
                 z = zipfile.ZipFile(sys.argv[1], 'w')\n\
                 z.write(sys.argv[2] + '/kit.yaml', 'kit.yaml')\n\
                 name = sys.argv[3]\n\
                 if name.endswith('@symlink'):\n\
                 \x20   i = zipfile.ZipInfo(name[:-8]); i.external_attr = (0o120777 << 16); z.writestr(i, '/etc/passwd')\n\
                 else:\n\
                 \x20   z.writestr(zipfile.ZipInfo(name), 'x')\n\
                 z.close()\n",
            ])
            .arg(&zip)
            .arg(&good_kit)
            .arg(entry)
            .status()
            .unwrap();
        assert!(st.success());
        let err = ppp_err(&w, &["kit", "validate", zip.to_str().unwrap()]);
        assert!(err.contains(want), "zip {i}: want `{want}` in {err}");
        let (code, _, err) = add(&w, &zip);
        assert_ne!(code, 0);
        assert!(err.contains(want), "zip {i}: {err}");
        assert_unchanged(&w, &before);
    }
}

/// Nothing a refused `kit add` could have touched has changed: the record
/// is byte-identical, there is no policy file, nothing reached the VM, and
/// podman was never asked to do anything in it.
fn assert_unchanged(w: &World, record_before: &[u8]) {
    assert_eq!(std::fs::read(w.data().join("sandboxes/red/sandbox.json")).unwrap(), record_before);
    assert!(!w.data().join("sandboxes/red/policy.yaml").exists());
    assert_eq!(std::fs::read_dir(w.path().join("guest")).unwrap().count(), 0, "nothing reached the VM");
    let calls = std::fs::read_to_string(w.path().join("calls.log")).unwrap_or_default();
    assert!(!calls.contains("ssh") && !calls.contains(" cp "), "podman touched the VM: {calls}");
}

#[test]
fn pack_is_deterministic_and_round_trips() {
    let w = World::new();
    let kit = write_kit(&w.path().join("k"), GOOD);
    let out = ppp_ok(&w, &["kit", "pack", kit.to_str().unwrap()]);
    assert!(out.contains("tools-0.1.0.zip"), "{out}");
    let first = std::fs::read(w.path().join("tools-0.1.0.zip")).unwrap();
    let mode = std::fs::metadata(w.path().join("tools-0.1.0.zip")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "a kit to share is readable, like a pulled one");
    // Newer mtimes on the inputs change nothing.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(kit.join("bin/tool"), "#!/bin/sh\necho tool\n").unwrap();
    ppp_ok(&w, &["kit", "pack", kit.to_str().unwrap(), "-o", "again.zip"]);
    assert_eq!(first, std::fs::read(w.path().join("again.zip")).unwrap());
    // The zip is a kit itself, and validates and inspects the same.
    let zip = w.path().join("again.zip");
    ppp_ok(&w, &["kit", "validate", zip.to_str().unwrap()]);
    let a = ppp_ok(&w, &["kit", "inspect", "--json", kit.to_str().unwrap()]);
    let b = ppp_ok(&w, &["kit", "inspect", "--json", zip.to_str().unwrap()]);
    assert_eq!(a, b);
    // Unpack, repack: the same bytes.
    let un = w.path().join("unpacked");
    let st = std::process::Command::new("python3")
        .args(["-c", "import sys,zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])"])
        .arg(&zip)
        .arg(&un)
        .status()
        .unwrap();
    assert!(st.success());
    ppp_ok(&w, &["kit", "pack", un.to_str().unwrap(), "-o", "re.zip"]);
    assert_eq!(first, std::fs::read(w.path().join("re.zip")).unwrap());
}

#[test]
fn git_urls_are_cloned() {
    let w = sandbox_world();
    let repo = write_kit(&w.path().join("repo"), GOOD);
    let git = |args: &[&str]| {
        let st = std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .unwrap();
        assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-qm", "kit"]);
    let url = format!("file://{}", repo.display());
    assert_eq!(ppp_ok(&w, &["kit", "validate", &url]), "kit `tools` 0.1.0 is valid\n");
    ppp_ok(&w, &["kit", "validate", &format!("git+{url}")]);

    // `kit add` takes the same references: a git URL, then a packed zip of
    // the same kit, which changes no rule and adds only its reference.
    let (code, _, err) = add(&w, Path::new(&url));
    assert_eq!(code, 0, "{err}");
    let policy = std::fs::read(w.data().join("sandboxes/red/policy.yaml")).unwrap();
    assert_eq!(String::from_utf8_lossy(&policy).matches("kit: kit:tools").count(), 3);
    ppp_ok(&w, &["kit", "pack", repo.to_str().unwrap(), "-o", "tools.zip"]);
    let zip = w.path().join("tools.zip");
    let (code, _, err) = add(&w, &zip);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(w.data().join("sandboxes/red/policy.yaml")).unwrap(), policy);
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.data().join("sandboxes/red/sandbox.json")).unwrap()).unwrap();
    assert_eq!(rec["kit_refs"], serde_json::json!([url, zip.to_str().unwrap()]));
}

/// The recording fake podman and its guest wrappers.
const FAKE_PODMAN: &str = r#"#!/bin/sh
printf '%s\n' "$*" >> "$FAKE_ROOT/calls.log"
G="$FAKE_ROOT/guest"
case "$1 $2" in
  "version --format") echo '{"Client":{"Version":"6.0.1"}}' ;;
  "machine info") echo '{"Host":{"VMType":"qemu"}}' ;;
  "machine list") echo '[{"Name":"ppp-red","Running":true}]' ;;
  "machine cp") dst="${4#*:}"; mkdir -p "$G$(dirname "$dst")"; cp "$3" "$G$dst" ;;
  "machine ssh") shift 4; PATH="$FAKE_ROOT/guest-bin:/usr/bin:/bin" G="$G" sh -c "$*" ;;
  *) echo "fake podman: unexpected $*" >&2; exit 9 ;;
esac
"#;

fn guest_bin(w: &World) {
    let gb = w.path().join("guest-bin");
    std::fs::create_dir_all(&gb).unwrap();
    let scripts = [
        ("sudo", "#!/bin/sh\nexec \"$@\"\n"),
        ("install", "#!/bin/sh\n# install -D -m MODE SRC DST\nexec /usr/bin/install -D -m \"$3\" \"$G$4\" \"$G$5\"\n"),
        ("mkdir", "#!/bin/sh\nfor a; do last=$a; done\nexec /bin/mkdir -p \"$G$last\"\n"),
        ("rm", "#!/bin/sh\nexec /bin/rm -f \"$G$2\"\n"),
        ("touch", "#!/bin/sh\n/bin/mkdir -p \"$G$(dirname \"$1\")\"\necho ran >> \"$G$1\"\n"),
        ("podman", "#!/bin/sh\necho \"$*\" >> \"$G/podman.log\"\nexit 1\n"),
    ];
    for (name, body) in scripts {
        std::fs::write(gb.join(name), body).unwrap();
        std::fs::set_permissions(gb.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn sandbox_world() -> World {
    let w = World::new();
    w.fake("podman", FAKE_PODMAN);
    guest_bin(&w);
    std::fs::create_dir_all(w.path().join("guest")).unwrap();
    w.write_record("red", 51820, "running");
    w
}

fn add(w: &World, kit: &Path) -> (i32, String, String) {
    output(w.ppp(["kit", "add", "red", kit.to_str().unwrap()]).env("FAKE_ROOT", w.path()))
}

#[test]
fn kit_add_applies_rules_env_files_and_startup_idempotently() {
    let w = sandbox_world();
    let kit = write_kit(&w.path().join("k"), GOOD);
    let (code, out, err) = add(&w, &kit);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "added kit `tools` 0.1.0 to `red`\n");

    let ls: serde_json::Value = serde_json::from_str(&ppp_ok(&w, &["policy", "ls", "red", "--json"])).unwrap();
    let text = ls.to_string();
    assert!(text.contains("registry.npmjs.org") && text.contains("evil.example.com"), "{text}");
    let kit_rules = ppp_ok(&w, &["policy", "ls", "red", "--source", "kit"]);
    assert!(kit_rules.contains("*.pypi.org"), "{kit_rules}");
    let policy = std::fs::read_to_string(w.data().join("sandboxes/red/policy.yaml")).unwrap();
    assert_eq!(policy.matches("kit: kit:tools").count(), 3, "{policy}");

    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.data().join("sandboxes/red/sandbox.json")).unwrap()).unwrap();
    assert_eq!(rec["kit_env"]["tools"]["TOOLS_HOME"], "/opt/tools");
    assert_eq!(rec["kit_refs"][0], kit.to_str().unwrap());

    let guest = w.path().join("guest");
    let conf = guest.join("etc/tools/config.toml");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "answer = 42\n");
    assert_eq!(std::fs::metadata(&conf).unwrap().permissions().mode() & 0o777, 0o600);
    let tool = guest.join("usr/local/bin/tool");
    assert_eq!(std::fs::metadata(&tool).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::read_to_string(guest.join("var/tmp/tools-ran")).unwrap(), "ran\n");
    // The agent container was looked for (and was not running).
    assert!(std::fs::read_to_string(guest.join("podman.log")).unwrap().contains("container exists ppp-agent-red"));

    // Again: state files are byte-identical.
    let before_policy = std::fs::read(w.data().join("sandboxes/red/policy.yaml")).unwrap();
    let before_rec = std::fs::read(w.data().join("sandboxes/red/sandbox.json")).unwrap();
    let (code, _, err) = add(&w, &kit);
    assert_eq!(code, 0, "{err}");
    assert_eq!(before_policy, std::fs::read(w.data().join("sandboxes/red/policy.yaml")).unwrap());
    assert_eq!(before_rec, std::fs::read(w.data().join("sandboxes/red/sandbox.json")).unwrap());
    // Startup commands run every time (docs/kits.md: write them to be safe
    // to repeat); this one appends a line.
    assert_eq!(std::fs::read_to_string(guest.join("var/tmp/tools-ran")).unwrap(), "ran\nran\n");

    // A new version with fewer rules replaces the kit's rules, keeps others.
    ppp_ok(&w, &["policy", "allow", "network", "mine.example.com", "--sandbox", "red"]);
    write_kit(&kit, &GOOD.replace(", \"*.pypi.org\"", ""));
    let (code, _, err) = add(&w, &kit);
    assert_eq!(code, 0, "{err}");
    let policy = std::fs::read_to_string(w.data().join("sandboxes/red/policy.yaml")).unwrap();
    assert_eq!(policy.matches("kit: kit:tools").count(), 2, "{policy}");
    assert!(policy.contains("mine.example.com") && !policy.contains("pypi"), "{policy}");
}

#[test]
fn kit_add_with_a_missing_secret_changes_nothing() {
    let w = sandbox_world();
    let kit = write_kit(&w.path().join("k"), &GOOD.replace("spec:\n", "spec:\n  secrets:\n    - service: github\n"));
    let before = std::fs::read(w.data().join("sandboxes/red/sandbox.json")).unwrap();
    let (code, _, err) = add(&w, &kit);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("kit `tools` needs the secret `github`"), "{err}");
    assert!(err.contains("hint: store it with `ppp secret set --sandbox red github`"), "{err}");
    assert_eq!(before, std::fs::read(w.data().join("sandboxes/red/sandbox.json")).unwrap());
    assert!(!w.data().join("sandboxes/red/policy.yaml").exists());
    assert_eq!(std::fs::read_dir(w.path().join("guest")).unwrap().count(), 0, "nothing reached the VM");
}

#[test]
fn create_with_a_bad_kit_creates_nothing() {
    let w = sandbox_world();
    let kit = write_kit(&w.path().join("k"), &GOOD.replace("source: bin/tool", "source: ../../etc/passwd"));
    let (code, _, err) =
        output(w.ppp(["create", "--kit", kit.to_str().unwrap(), "opencode", "."]).env("FAKE_ROOT", w.path()));
    assert_ne!(code, 0);
    assert!(err.contains("must stay inside the kit directory"), "{err}");
    let calls = std::fs::read_to_string(w.path().join("calls.log")).unwrap_or_default();
    assert!(!calls.contains("machine init"), "{calls}");
}

/// A startup command that fails leaves the kit recorded but not finished;
/// the error says so and how to finish, and adding it again does.
#[test]
fn a_failing_startup_command_says_how_to_finish() {
    let w = sandbox_world();
    // `$G` is where this fake's "VM" keeps its files.
    let failing =
        GOOD.replace("[\"touch\", \"/var/tmp/tools-ran\"]", "[\"sh\", \"-c\", \"test -e \\\"$G/opt/ready\\\"\"]");
    let kit = write_kit(&w.path().join("k"), &failing);
    let (code, _, err) = add(&w, &kit);
    assert_eq!(code, 1, "{err}");
    assert!(err.starts_with("error: kit `tools` is only partly applied to sandbox `red`"), "{err}");
    assert!(err.contains("caused by: kit `tools` startup command 1 failed"), "{err}");
    assert!(err.contains(&format!("`ppp kit add red {}` finishes it", kit.display())), "{err}");
    let policy = std::fs::read_to_string(w.data().join("sandboxes/red/policy.yaml")).unwrap();
    assert_eq!(policy.matches("kit: kit:tools").count(), 3, "the rules are recorded: {policy}");

    // The cause fixed (the file the command tests for exists): it finishes.
    std::fs::create_dir_all(w.path().join("guest/opt/ready")).unwrap();
    let (code, _, err) = add(&w, &kit);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(w.data().join("sandboxes/red/policy.yaml")).unwrap(), policy);
}

/// Kit errors point at `ppp kit --help`, which every installed ppp has
/// (issue 14: they pointed at docs/kits.md), and that help shows a
/// kit.yaml that is itself valid.
#[test]
fn kit_errors_point_at_help_that_shows_a_valid_kit() {
    let w = World::new();
    let empty = w.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = ppp_err(&w, &["kit", "validate", empty.to_str().unwrap()]);
    assert!(
        err.ends_with("hint: a kit is a directory with a `kit.yaml`; `ppp kit --help` shows its format\n"),
        "{err}"
    );
    let kit = write_kit(&w.path().join("k"), &GOOD.replace("  env:\n", "  envv:\n"));
    let err = ppp_err(&w, &["kit", "validate", kit.to_str().unwrap()]);
    assert!(err.ends_with("hint: fix that line; `ppp kit --help` lists every field\n"), "{err}");

    let help = ppp_ok(&w, &["kit", "--help"]);
    let start = help.find("  apiVersion:").expect("the help shows a kit.yaml");
    let end = help.find("kit.yaml itself").expect("and its size limit");
    let mut yaml = String::new();
    for line in help[start..end].lines() {
        yaml.push_str(line.strip_prefix("  ").unwrap_or(line));
        yaml.push('\n');
    }
    let shown = w.path().join("shown");
    std::fs::create_dir_all(&shown).unwrap();
    std::fs::write(shown.join("kit.yaml"), &yaml).unwrap();
    assert_eq!(ppp_ok(&w, &["kit", "validate", shown.to_str().unwrap()]), "kit `tools` 0.1.0 is valid\n", "{yaml}");
}

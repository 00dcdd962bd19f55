//! `ppp kit push` and `ppp kit pull` against a real OCI registry: Debian's
//! `docker-registry` (distribution 2.8) on 127.0.0.1, storage in a temp dir.
//! Loopback traffic never leaves the machine, and plain HTTP is what ppp
//! allows for loopback registries only.
//!
//! The registry binary is required: `scripts/install-test-deps.sh` installs
//! it, and a missing binary fails these tests rather than skipping them.

mod common;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{World, ok, output};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
const USER: &str = "kituser";
const PASSWORD: &str = "s3cret-Registry-Pa55word-0xBEEF";

/// A `docker-registry serve` child that lives as long as this guard.
struct Registry {
    child: Child,
    addr: String,
    storage: PathBuf,
    dir: tempfile::TempDir,
}

impl Registry {
    fn start(htpasswd: bool) -> Registry {
        assert!(
            Path::new(REGISTRY_BIN).exists(),
            "`{REGISTRY_BIN}` is missing: run scripts/install-test-deps.sh (apt package docker-registry)"
        );
        let dir = tempfile::Builder::new().prefix("ppp-registry-").tempdir().unwrap();
        let storage = dir.path().join("storage");
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            storage.display()
        );
        if htpasswd {
            let file = dir.path().join("htpasswd");
            let out = Command::new("htpasswd")
                .args(["-Bbn", USER, PASSWORD])
                .output()
                .expect("htpasswd runs (apt package apache2-utils)");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            std::fs::write(&file, &out.stdout).unwrap();
            config +=
                &["auth:", "  htpasswd:", "    realm: ppp-test", &format!("    path: {}\n", file.display())].join("\n");
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("docker-registry starts");
        let reg = Registry { child, addr, storage, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&reg.addr).is_err() {
            assert!(Instant::now() < deadline, "registry did not listen on {} within 20 s: {}", reg.addr, reg.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        reg
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// The blob file the registry serves for `digest` (`sha256:…`).
    fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.storage.join(format!("docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small kit directory in `w`.
fn kit_dir(w: &World) -> PathBuf {
    let d = w.path().join("mykit");
    std::fs::create_dir_all(d.join("bin")).unwrap();
    std::fs::write(
        d.join("kit.yaml"),
        "apiVersion: ppp.kit/v1\nkind: Kit\nmetadata:\n  name: mykit\n  version: 0.1.0\nspec:\n  env:\n    MYKIT_HOME: /opt/mykit\n",
    )
    .unwrap();
    std::fs::write(d.join("bin/tool"), "#!/bin/sh\necho tool\n").unwrap();
    d
}

fn ppp(w: &World, args: &[&str]) -> Command {
    let mut c = w.ppp(args);
    c.env("PPP_SECRET_BACKEND", "file");
    c
}

fn sha256(bytes: &[u8]) -> String {
    ppp::kit::oci::digest(bytes)
}

#[test]
fn push_then_pull_round_trips_the_packed_zip() {
    let reg = Registry::start(false);
    let w = World::new();
    let dir = kit_dir(&w);
    let reference = format!("{}/kits/mykit:0.1.0", reg.addr);
    let packed = ppp::kit::oci::pack_dir(&dir).unwrap();

    let out = ok(&mut ppp(&w, &["kit", "push", dir.to_str().unwrap(), &reference]));
    assert!(out.contains(&sha256(&packed)), "{out}");

    // Default name: <repo-name>-<tag>.zip in the current directory.
    let out = ok(&mut ppp(&w, &["kit", "pull", &reference]));
    let pulled = std::fs::read(w.path().join("mykit-0.1.0.zip")).unwrap();
    assert_eq!(pulled, packed, "pulled bytes equal the packed zip");
    assert!(out.contains("mykit-0.1.0.zip"), "{out}");
    // …and the kit module reads it back as the same kit.
    let out = ok(&mut ppp(&w, &["kit", "validate", "mykit-0.1.0.zip"]));
    assert!(out.contains("mykit"), "{out}");
    // An OCI reference is a kit reference too: validate and inspect pull it
    // into memory, and write nothing.
    let before: Vec<_> = std::fs::read_dir(w.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    let out = ok(&mut ppp(&w, &["kit", "validate", &reference]));
    assert!(out.contains("mykit"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&mut ppp(&w, &["kit", "inspect", &reference, "--json"]))).unwrap();
    assert_eq!((json["name"].as_str(), json["version"].as_str()), (Some("mykit"), Some("0.1.0")), "{json}");
    let after: Vec<_> = std::fs::read_dir(w.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(before, after);

    let target = w.path().join("out/kit.zip");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    ok(&mut ppp(&w, &["kit", "pull", &reference, "-o", target.to_str().unwrap()]));
    assert_eq!(std::fs::read(&target).unwrap(), packed);

    // The manifest is an OCI 1.1 artifact with ppp's media types.
    let manifest = http_get(&reg.addr, "/v2/kits/mykit/manifests/0.1.0");
    let m: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(m["artifactType"], "application/vnd.ppp.kit.v1");
    assert_eq!(m["config"]["mediaType"], "application/vnd.oci.empty.v1+json");
    assert_eq!(m["layers"].as_array().unwrap().len(), 1);
    assert_eq!(m["layers"][0]["mediaType"], "application/vnd.ppp.kit.v1+zip");
    assert_eq!(m["layers"][0]["digest"], sha256(&packed).as_str());
}

/// A plain HTTP/1.0 GET, enough for the registry's manifest endpoint.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/vnd.oci.image.manifest.v1+json\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

#[test]
fn tampered_blob_fails_the_pull_and_writes_nothing() {
    let reg = Registry::start(false);
    let w = World::new();
    let dir = kit_dir(&w);
    let reference = format!("{}/kits/mykit:1", reg.addr);
    let packed = ppp::kit::oci::pack_dir(&dir).unwrap();
    ok(&mut ppp(&w, &["kit", "push", dir.to_str().unwrap(), &reference]));

    // Same length, different bytes: only the digest can tell.
    let blob = reg.blob_path(&sha256(&packed));
    let mut bytes = std::fs::read(&blob).unwrap();
    assert_eq!(bytes, packed);
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();

    let (code, out, err) = output(&mut ppp(&w, &["kit", "pull", &reference, "-o", "tampered.zip"]));
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.starts_with(&format!("error: could not pull the kit `{reference}`")), "{err}");
    assert!(err.contains("does not match its manifest"), "{err}");
    assert!(err.contains(&sha256(&packed)), "names the expected digest: {err}");
    assert!(err.contains("hint: "), "{err}");
    assert!(!w.path().join("tampered.zip").exists(), "nothing is written");
    let leftovers: Vec<_> = std::fs::read_dir(w.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "no temp file is left: {leftovers:?}");
}

/// A registry is not trusted with ppp's memory: a manifest that declares
/// a layer larger than any kit is refused before downloading, and a blob
/// larger than its manifest declares stops the download there.
#[test]
fn oversized_layers_are_refused() {
    let reg = Registry::start(false);
    let w = World::new();
    let dir = kit_dir(&w);
    ok(&mut ppp(&w, &["kit", "push", dir.to_str().unwrap(), &format!("{}/kits/mykit:1", reg.addr)]));
    let manifest: serde_json::Value = serde_json::from_str(&http_get(&reg.addr, "/v2/kits/mykit/manifests/1")).unwrap();
    let max = ppp::kit::manifest::MAX_ARCHIVE_BYTES;
    for (tag, size, want) in [
        ("huge", max + 1, format!("is {} bytes, more than a kit may be ({max} bytes)", max + 1)),
        ("short", 10, "the registry sent more than the 10 bytes the manifest declares".to_owned()),
    ] {
        let mut m = manifest.clone();
        m["layers"][0]["size"] = size.into();
        let url = format!("http://{}/v2/kits/mykit/manifests/{tag}", reg.addr);
        let put = Command::new("curl")
            .args(["-sS", "-f", "-X", "PUT", "-H", "Content-Type: application/vnd.oci.image.manifest.v1+json"])
            .args(["--data-binary", &m.to_string(), &url])
            .output()
            .unwrap();
        assert!(put.status.success(), "the registry takes the manifest: {}", String::from_utf8_lossy(&put.stderr));
        let reference = format!("{}/kits/mykit:{tag}", reg.addr);
        let (code, out, err) = output(&mut ppp(&w, &["kit", "pull", &reference, "-o", "big.zip"]));
        assert_ne!(code, 0, "{out}{err}");
        assert!(err.contains(&want), "{tag}: {err}");
        assert!(!w.path().join("big.zip").exists(), "nothing is written");
    }
}

#[test]
fn missing_tag_names_the_reference() {
    let reg = Registry::start(false);
    let w = World::new();
    let dir = kit_dir(&w);
    ok(&mut ppp(&w, &["kit", "push", dir.to_str().unwrap(), &format!("{}/kits/mykit:1", reg.addr)]));

    for reference in [format!("{}/kits/mykit:2", reg.addr), format!("{}/kits/nothere:1", reg.addr)] {
        let (code, out, err) = output(&mut ppp(&w, &["kit", "pull", &reference]));
        assert_eq!(code, 1, "{out}{err}");
        assert!(err.contains(&format!("`{reference}` was not found in registry `{}`", reg.addr)), "{err}");
        assert!(err.contains("hint: "), "{err}");
    }
    assert!(!w.path().join("mykit-2.zip").exists());
}

#[test]
fn unreachable_registry_says_so() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let w = World::new();
    let (code, _, err) = output(&mut ppp(&w, &["kit", "pull", &format!("127.0.0.1:{port}/kits/x:1")]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("could not reach registry `127.0.0.1:{port}`")), "{err}");
}

#[test]
fn bad_references_are_usage_errors() {
    let w = World::new();
    for (r, why) in [("kits/tools:1", "names no registry"), ("registry.example.com/kits/tools", "has no tag")] {
        let (code, _, err) = output(&mut ppp(&w, &["kit", "pull", r]));
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(why), "{err}");
        assert!(err.contains("hint: write `REGISTRY/REPOSITORY:TAG`"), "{err}");
    }
}

#[test]
fn auth_failure_hints_at_secret_set_and_stored_credentials_work() {
    let reg = Registry::start(true);
    let w = World::new();
    let dir = kit_dir(&w);
    let d = dir.to_str().unwrap();
    let reference = format!("{}/kits/private:1", reg.addr);

    let (code, out, err) = output(&mut ppp(&w, &["-D", "kit", "push", d, &reference]));
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(&format!("registry `{}` refused access", reg.addr)), "{err}");
    assert!(err.contains(&format!("hint: store credentials with `ppp secret set --registry {}`", reg.addr)), "{err}");

    // Wrong password: refused, and the hint says the stored ones were.
    ok(&mut ppp(&w, &["secret", "set", "--registry", &reg.addr, "-t", &format!("{USER}:wrong-password-123")]));
    let (code, _, err) = output(&mut ppp(&w, &["kit", "push", d, &reference]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the stored credentials were refused"), "{err}");

    let out = ok(&mut ppp(&w, &["secret", "set", "--registry", &reg.addr, "-t", &format!("{USER}:{PASSWORD}")]));
    assert_eq!(out, format!("stored credentials for registry `{}` (file)\n", reg.addr));
    let ls = ok(&mut ppp(&w, &["secret", "ls", "--json"]));
    let entries: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(entries[0]["kind"], "registry");
    assert_eq!(entries[0]["name"], reg.addr.as_str());

    let (code, out, err) = output(&mut ppp(&w, &["-D", "kit", "push", d, &reference]));
    assert_eq!(code, 0, "{out}{err}");
    let (code, out2, err2) = output(&mut ppp(&w, &["-D", "kit", "pull", &reference, "-o", "p.zip"]));
    assert_eq!(code, 0, "{out2}{err2}");
    assert_eq!(std::fs::read(w.path().join("p.zip")).unwrap(), ppp::kit::oci::pack_dir(&dir).unwrap());

    // Nothing ppp printed, even with -D, holds the password or its Basic form.
    let basic = base64_basic(USER, PASSWORD);
    for text in [&out, &err, &out2, &err2, &ls] {
        assert!(!text.contains(PASSWORD), "password leaked: {text}");
        assert!(!text.contains(&basic), "basic credentials leaked: {text}");
    }

    // Removing them brings the refusal back.
    ok(&mut ppp(&w, &["secret", "rm", "-f", "--registry", &reg.addr]));
    let (code, _, err) = output(&mut ppp(&w, &["kit", "pull", &reference]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("refused access"), "{err}");
    // A credential that is not stored is a usage mistake: exit 2.
    let (code, _, err) = output(&mut ppp(&w, &["secret", "rm", "-f", "--registry", &reg.addr]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no credentials are stored for registry"), "{err}");
}

fn base64_basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

#[test]
fn registry_secrets_are_validated_and_global() {
    let w = World::new();
    let (code, _, err) = output(&mut ppp(&w, &["secret", "set", "--registry", "https://x.example", "-t", "a:b"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a valid registry"), "{err}");
    let (code, _, err) =
        output(&mut ppp(&w, &["secret", "set", "--registry", "--sandbox", "red-fox", "x.example", "-t", "a:b"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("registry credentials are global"), "{err}");
    ok(&mut ppp(&w, &["secret", "set", "--registry", "Registry.Example.com:5000", "-t", "tok-123456"]));
    let ls = ok(&mut ppp(&w, &["secret", "ls"]));
    assert!(ls.contains("registry.example.com:5000"), "{ls}");
    assert!(!ls.contains("tok-123456"), "{ls}");
}

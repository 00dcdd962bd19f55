//! The agent image a real user gets (issue 24), end to end on the fake
//! podman: with no `PPP_<AGENT>_IMAGE`, the first `create` builds the
//! agent's image from ppp's embedded Containerfile in the sandbox's VM,
//! through the tunnel and under the policy, and saves it on the host; the
//! next `create` loads it from the cache without a build or a fetch; a cut
//! off cache is built again, never loaded; a build the policy refuses a
//! host to fails naming the step, the host and the `ppp policy allow` line
//! that fixes it, and leaves ppp's state as it was.
//!
//! The fake's `podman build` runs each RUN step in a container of its own
//! on the guest's bridge, with its image's own trust store (not the VM's,
//! which trusts mitmproxy): so a RUN step that fetches over HTTPS passes
//! only if the build hands it the CA. The base image's `apt-get` and `npm`
//! are stand-ins that fetch what the real ones would, from a server in the
//! test's namespaces that plays deb.debian.org and registry.npmjs.org.

#[path = "support/netns.rs"]
mod netns;

#[path = "support/sandbox_env.rs"]
mod sandbox_env;

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use netns::{Upstream, describe};
use sandbox_env::{Env, STUB_AGENT};
use serde_json::Value;

/// Public (routed only inside the test's namespaces), so names that
/// resolve to it need no address rule.
const MIRROR_IP: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 20);
const MIRROR_NAMES: [&str; 3] = ["deb.debian.org", "registry.npmjs.org", "blocked.test"];
/// The base image ppp's Containerfiles name.
const NODE_IMAGE: &str = "docker.io_library_node_22-bookworm-slim";

/// apt as the build runs it: the Debian mirror over plain HTTP, as
/// bookworm-slim's sources are.
const APT_GET: &str = r#"#!/bin/sh
case "$1" in
  update) exec curl -fsS -m 15 -o /dev/null http://deb.debian.org/debian/dists/bookworm/InRelease ;;
  install) exec curl -fsS -m 15 -o /dev/null http://deb.debian.org/debian/pool/main/g/git/git.deb ;;
esac
"#;

/// npm as the build runs it: HTTPS to the registry, trusting only what
/// `NODE_EXTRA_CA_CERTS` names beyond the image's own (empty) store, as Node
/// does.
const NPM: &str = r#"#!/bin/sh
case "$1" in
  install) exec curl -fsS -m 15 -o /dev/null --cacert "${NODE_EXTRA_CA_CERTS:-/nonexistent}" "https://registry.npmjs.org/$3" ;;
  cache) exit 0 ;;
esac
"#;

struct Rig {
    mirror: Upstream,
    env: Env,
}

fn write_exe(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A sandbox environment where nothing names an agent image, so ppp
/// builds its own, with the `balanced` preset (which allows the hosts ppp's
/// own Containerfiles need) and a mirror for them.
fn rig() -> Rig {
    let mut env = Env::new("qemu");
    // Blank is unset: ppp chooses the image itself.
    env.extra.push(("PPP_OPENCODE_IMAGE".into(), String::new()));
    let mirror = Upstream::start_public(&env.topo, &env.upstream, MIRROR_IP, &MIRROR_NAMES);
    let bin = env.root().join("images").join(NODE_IMAGE).join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    write_exe(&bin.join("apt-get"), APT_GET);
    write_exe(&bin.join("npm"), NPM);
    // What `npm install -g opencode-ai` would leave: the agent's CLI.
    write_exe(&bin.join("opencode"), STUB_AGENT);
    env.ok(&["policy", "init", "balanced"]);
    Rig { mirror, env }
}

/// The builds the fake recorded in machine `ppp-<sandbox>`.
fn builds(env: &Env, sandbox: &str) -> Vec<Value> {
    let path = env.machine_dir(&format!("ppp-{sandbox}")).join("guest/builds.jsonl");
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn cache_files(env: &Env) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(env.dirs().image_cache())
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

fn archive(env: &Env) -> PathBuf {
    cache_files(env)
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(".oci.tar"))
        .unwrap_or_else(|| panic!("no archive in {:?}", cache_files(env)))
}

fn record(env: &Env, name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(env.dirs().sandbox_record(name)).unwrap()).unwrap()
}

fn create(env: &Env, name: &str) -> std::process::Output {
    env.run(&["create", "--name", name, "opencode", &env.ws()])
}

fn diagnosed(env: &Env, name: &str) -> Value {
    let report: Value = serde_json::from_str(&env.ok(&["diagnose", "-o", "json"])).unwrap();
    report["sandboxes"].as_array().unwrap().iter().find(|s| s["name"] == name).cloned().unwrap()
}

#[test]
fn the_first_create_builds_and_later_ones_load_from_the_cache() {
    let rig = rig();
    let env = &rig.env;
    let embedded = String::from_utf8(ppp::assets::get("opencode.Containerfile").unwrap()).unwrap();

    // First create: built in the VM from the embedded Containerfile.
    let out = create(env, "first");
    assert!(out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("the first create said:\n{err}");
    assert!(err.contains("building the opencode image localhost/ppp/opencode:"), "{err}");
    let steps = ppp::assets::get("opencode.Containerfile").map(|t| String::from_utf8(t).unwrap()).unwrap();
    let total = steps
        .lines()
        .skip_while(|l| !l.starts_with("FROM "))
        .filter(|l| l.split(' ').next().is_some_and(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase())))
        .count();
    assert!(
        err.contains(&format!("STEP 1/{total}: FROM docker.io/library/node:22-bookworm-slim (")),
        "each step is shown: {err}"
    );
    assert!(err.contains(": RUN apt-get update"), "each step is shown: {err}");
    assert!(err.contains(" in)"), "with the time elapsed: {err}");
    let built = builds(env, "first");
    assert_eq!(built.len(), 1, "{built:?}");
    assert_eq!(built[0]["containerfile"], embedded.as_str(), "the embedded Containerfile, as it is");
    let tag = built[0]["tags"][0].as_str().unwrap().to_owned();
    assert!(tag.starts_with("localhost/ppp/opencode:") && tag.len() == "localhost/ppp/opencode:".len() + 16, "{tag}");
    // The RUN step fetched over HTTPS through the tunnel and trusted the
    // proxy's CA (npm's stand-in trusts only NODE_EXTRA_CA_CERTS), and the
    // image keeps none of it: the CA came as a volume and build arguments.
    let fetched: Vec<Value> = rig.mirror.requests();
    let npm = fetched.iter().find(|r| r["path"] == "/opencode-ai@latest").expect("npm's fetch reached the registry");
    assert_eq!(npm["tls"], true, "{npm}");
    assert!(fetched.iter().any(|r| r["path"] == "/debian/dists/bookworm/InRelease"), "{fetched:?}");
    assert_eq!(built[0]["volumes"][0], "/var/lib/ppp/ca-bundle.pem:/run/ppp-build/ca.pem:ro");
    assert_eq!(built[0]["build_args"]["NODE_EXTRA_CA_CERTS"], "/run/ppp-build/ca.pem");
    let flows = std::fs::read_to_string(env.dirs().flows_log()).unwrap();
    assert!(flows.lines().any(|l| l.contains("\"registry.npmjs.org\"") && l.contains("\"allow\"")), "{flows}");
    // Saved on the host: the archive and its digest file.
    let files = cache_files(env);
    assert!(files.iter().any(|f| f.to_string_lossy().ends_with(".oci.tar.sha256")), "{files:?}");
    assert!(!files.iter().any(|f| f.file_name().unwrap().to_string_lossy().starts_with(".tmp-")), "{files:?}");
    let log = std::fs::read_to_string(env.dirs().sandbox_machine_log("first")).unwrap();
    assert!(log.contains("STEP 2/") && log.contains("Successfully tagged"), "the build's log: {log}");
    assert_eq!(
        (record(env, "first")["image"].as_str(), record(env, "first")["image_origin"].as_str()),
        (Some(tag.as_str()), Some("built"))
    );
    let d = diagnosed(env, "first");
    assert_eq!((d["image"].as_str(), d["image_origin"].as_str()), (Some(tag.as_str()), Some("built")), "{d}");
    env.ok(&["rm", "-f", "first"]);

    // Second create: loaded from the cache, no build, no fetch.
    let requests_before = rig.mirror.requests().len();
    let n = env.calls().len();
    let out = create(env, "second");
    assert!(out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loading the cached opencode image"), "{err}");
    assert!(builds(env, "second").is_empty(), "{:?}", builds(env, "second"));
    let calls = env.calls()[n..].join("\n");
    assert!(!calls.contains("podman build"), "{calls}");
    assert!(calls.contains("podman load --input /tmp/ppp/image.oci.tar"), "{calls}");
    assert_eq!(rig.mirror.requests().len(), requests_before, "nothing was fetched for the image");
    assert_eq!(record(env, "second")["image_origin"], "cached");
    assert_eq!(diagnosed(env, "second")["image_origin"], "cached");
    // The agent runs in that image.
    let n = env.calls().len();
    let out = env.run(&["run", "--name", "second", "opencode", &env.ws(), "--", "hello"]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stub-agent args: hello"), "{}", describe(&out));
    let calls = env.calls()[n..].join("\n");
    assert!(calls.contains(&format!("{tag} opencode hello")), "the agent container runs the built image: {calls}");
    assert!(builds(env, "second").is_empty(), "a reattach builds nothing either");
    env.ok(&["rm", "-f", "second"]);

    // ppp setup says the image is cached.
    let setup = env.run(&["setup"]);
    let text = String::from_utf8_lossy(&setup.stdout);
    let row = text.lines().find(|l| l.contains("image opencode")).unwrap_or_default();
    assert!(row.contains(&tag) && row.contains("cached"), "{text}");

    // A cache cut off (a crash while copying, a full disk) is built again,
    // never loaded.
    let path = archive(env);
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len / 2).unwrap();
    drop(f);
    let n = env.calls().len();
    let out = create(env, "third");
    assert!(out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the cached opencode image is not usable"), "{err}");
    assert_eq!(builds(env, "third").len(), 1, "built again");
    assert!(!env.calls()[n..].join("\n").contains("podman load"), "the cut-off archive was never loaded");
    assert_eq!(record(env, "third")["image_origin"], "built");
    assert_eq!(std::fs::metadata(archive(env)).unwrap().len(), len, "the cache holds a whole archive again");
    env.ok(&["rm", "-f", "third"]);

    // Same size, other bytes: only the digest tells, and it does.
    let mut bytes = std::fs::read(archive(env)).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(archive(env), &bytes).unwrap();
    let n = env.calls().len();
    let out = create(env, "fourth");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("digest"), "{}", describe(&out));
    assert!(!env.calls()[n..].join("\n").contains("podman load"), "the altered archive was never loaded");
    assert_eq!(builds(env, "fourth").len(), 1, "built again");
}

#[test]
fn a_build_the_policy_refuses_a_host_to_names_the_fix_and_changes_nothing() {
    let rig = rig();
    let mut env = rig.env;
    // The product's own way to build from another Containerfile.
    let cf = env.root().join("Containerfile");
    std::fs::write(
        &cf,
        "FROM docker.io/library/node:22-bookworm-slim\n\
         ARG CURL_CA_BUNDLE\n\
         RUN ! env -u CURL_CA_BUNDLE curl -fsS -m 15 -o /dev/null https://registry.npmjs.org/own-store\n\
         RUN curl -fsS -m 15 -o /dev/null https://registry.npmjs.org/allowed\n\
         RUN curl -fsS -m 15 -o /dev/null https://blocked.test/tool.tgz\n\
         CMD [\"opencode\"]\n",
    )
    .unwrap();
    env.extra.push(("PPP_OPENCODE_CONTAINERFILE".into(), cf.display().to_string()));
    let state = |env: &Env| {
        let read = |p: PathBuf| std::fs::read(&p).ok();
        (
            read(env.dirs().global_policy()),
            ppp::sandbox::PortRegistry::load(&env.dirs()).unwrap().ports,
            env.ls(),
            cache_files(env).into_iter().filter(|p| !p.to_string_lossy().ends_with(".lock")).collect::<Vec<_>>(),
        )
    };
    let before = state(&env);

    let out = create(&env, "red");
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("the failed create said:\n{err}");
    assert!(
        err.contains("building the opencode image failed at STEP 5/6: RUN curl -fsS -m 15 -o /dev/null https://blocked.test/tool.tgz: while running runtime: exit status"),
        "the failing step: {err}"
    );
    assert!(err.contains("the policy refused `blocked.test`"), "the refused host: {err}");
    assert!(err.contains("`ppp policy allow network blocked.test`"), "the fix: {err}");
    // The steps before it: the image's own trust store does not know the
    // proxy (so a build must be handed the CA), and with the CA the build
    // was given (curl's CURL_CA_BUNDLE) a fetch over HTTPS through the
    // tunnel passes.
    assert!(rig.mirror.requests().iter().any(|r| r["path"] == "/allowed" && r["tls"] == true));
    assert!(!rig.mirror.requests().iter().any(|r| r["path"] == "/tool.tgz"), "the refused fetch never left");
    // Nothing of ppp's changed: no sandbox, no port, no policy change, no
    // cache entry (not even half of one). machine.log stays, as after any
    // failed create.
    assert_eq!(state(&env), before);
    let log = std::fs::read_to_string(env.dirs().sandbox_machine_log("red")).unwrap();
    assert!(log.contains("STEP 5/6"), "{log}");
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());

    // The line the error gave fixes it.
    env.ok(&["policy", "allow", "network", "blocked.test"]);
    let out = create(&env, "red");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(rig.mirror.requests().iter().any(|r| r["path"] == "/tool.tgz"));
    assert_eq!(record(&env, "red")["image_origin"], "built");
    let first_tag = record(&env, "red")["image"].as_str().unwrap().to_owned();
    env.ok(&["rm", "-f", "red"]);

    // The same Containerfile is loaded from the cache; a changed one (a
    // new ppp's, or the user's edit) is a new image, built.
    let out = create(&env, "blue");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(builds(&env, "blue").is_empty());
    assert_eq!(record(&env, "blue")["image"], first_tag.as_str());
    env.ok(&["rm", "-f", "blue"]);
    let mut text = std::fs::read_to_string(&cf).unwrap();
    text.push_str("LABEL changed=yes\n");
    std::fs::write(&cf, text).unwrap();
    let out = create(&env, "green");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(builds(&env, "green").len(), 1, "a changed Containerfile builds");
    let tag = record(&env, "green")["image"].as_str().unwrap().to_owned();
    assert!(tag != first_tag && tag.starts_with("localhost/ppp/opencode:"), "{tag} vs {first_tag}");
}

#[test]
fn setup_builds_images_ahead_in_one_vm_it_then_removes() {
    let rig = rig();
    let env = &rig.env;
    let out = env.run(&["setup", "--build-images", "opencode,claude"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("building the opencode image") && err.contains("building the claude image"),
        "{}",
        describe(&out)
    );
    let archives: Vec<PathBuf> =
        cache_files(env).into_iter().filter(|p| p.to_string_lossy().ends_with(".oci.tar")).collect();
    assert_eq!(archives.len(), 2, "{archives:?}");
    assert!(env.ls().is_empty(), "the build's sandbox is gone: {:?}", env.ls());
    assert_eq!(env.podman(&["machine", "list", "--format", "json"]), serde_json::json!([]));
    let text = String::from_utf8_lossy(&out.stdout);
    for agent in ["opencode", "claude"] {
        let row = text.lines().find(|l| l.contains(&format!("image {agent}"))).unwrap_or_default();
        assert!(row.contains("cached"), "{agent}: {text}");
    }
    // Asked again, nothing is built.
    let out = env.run(&["setup", "--build-images", "opencode"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is cached already"), "{}", describe(&out));
    // And a sandbox loads it.
    let out = create(env, "red");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(builds(env, "red").is_empty());
    assert_eq!(record(env, "red")["image_origin"], "cached");

    // A VM an agent has used never feeds the cache: its image gone and the
    // cache emptied, a reattach builds again for itself only.
    let tag = record(env, "red")["image"].as_str().unwrap().to_owned();
    env.ok(&["exec", "red", "--", "podman", "rmi", &tag]);
    std::fs::remove_dir_all(env.dirs().image_cache()).unwrap();
    env.ok(&["stop", "red"]);
    let out = env.run(&["run", "--name", "red", "opencode", &env.ws()]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert_eq!(builds(env, "red").len(), 1, "built again in the VM");
    assert_eq!(record(env, "red")["image_origin"], "built");
    let kept: Vec<PathBuf> = cache_files(env).into_iter().filter(|p| !p.to_string_lossy().ends_with(".lock")).collect();
    assert!(kept.is_empty(), "a used VM's build is not cached: {kept:?}");
}

/// podman before 5.5 has no `machine cp`: the archive goes out over ssh's
/// standard output and back in over its standard input, checked the same.
#[test]
fn a_podman_without_machine_cp_still_caches() {
    let mut rig = rig();
    rig.env.extra.push(("FAKE_PODMAN_VERSION".into(), "5.4.2".into()));
    let env = &rig.env;
    let out = create(env, "old");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(builds(env, "old").len(), 1);
    let calls = env.calls().join("\n");
    assert!(calls.contains("cat /tmp/ppp/image.oci.tar"), "{calls}");
    assert!(!calls.contains("machine cp"), "{calls}");
    let sum = std::fs::read_to_string(format!("{}.sha256", archive(env).display())).unwrap();
    assert!(sum.ends_with(&format!(" {}\n", std::fs::metadata(archive(env)).unwrap().len())), "{sum}");
    env.ok(&["rm", "-f", "old"]);
    let out = create(env, "again");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(builds(env, "again").is_empty(), "loaded, not built");
    assert_eq!(record(env, "again")["image_origin"], "cached");
}

//! Templates end to end on the fake podman, with the real daemon,
//! mitmdump, provision.sh and `qemu-img`: a provisioned sandbox saved as a
//! template, exported, loaded into a fresh cache, and a new sandbox created
//! from it with `-t` that boots from the template's disk and does not pull
//! the agent image again. The fake carries a machine's guest state in its
//! disk (see docs/harness.md), so the new machine sees the old one's
//! `/var/lib/ppp/.provisioned`.

#![allow(dead_code)]

#[path = "support/netns.rs"]
mod netns;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use netns::{NetnsEtc, Topology, UPSTREAM_IP, Upstream, describe, leftovers};
use serde_json::Value;

const KEY: &str = "sk-ant-sandbox-REAL-0123456789abcdef";
const IMAGE: &str = "localhost/agent:latest";

/// A stub agent: shows its arguments and key variable, calls the API
/// through the proxy from inside the container (the upstream's certificate
/// is for echo.test only, so the API call is plain HTTP and the HTTPS one
/// goes to echo.test), and exits 7.
const STUB_AGENT: &str = r#"#!/bin/sh
if [ "$1" = sleep-then ]; then exec sh -c "$2"; fi
echo "stub-agent args: $*"
echo "stub-agent key: $ANTHROPIC_API_KEY"
echo "stub-agent cwd: $(pwd)"
code=$(curl -sS -m 15 -o /dev/null -w '%{http_code}' -H "x-api-key: $ANTHROPIC_API_KEY" http://api.anthropic.com/from-agent)
echo "stub-agent api: $code"
code=$(curl -sS -m 15 -o /dev/null -w '%{http_code}' https://echo.test/agent-tls)
echo "stub-agent tls: $code"
exit 7
"#;

fn fake_podman() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-podman/podman")
}

/// ppp's state, the fake's state and the upstream, in one topology.
/// Dropping removes every sandbox and stops the daemon.
struct Env {
    provider: &'static str,
    extra: Vec<(String, String)>,
    upstream: Upstream,
    _etc: NetnsEtc,
    topo: Topology,
}

impl Env {
    fn new(provider: &'static str) -> Env {
        let topo = Topology::new(0);
        let upstream = Upstream::start(&topo);
        upstream.set_name("echo.test", UPSTREAM_IP);
        upstream.set_name("api.anthropic.com", UPSTREAM_IP);
        let etc = NetnsEtc::new(&topo);
        let bin = topo.path().join("images/localhost_agent_latest/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("opencode"), STUB_AGENT).unwrap();
        std::fs::set_permissions(bin.join("opencode"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(topo.path().join("ws")).unwrap();
        // The fake's containers run as uid 1000 with no user namespace, so
        // they can write the workspace only if everyone can (rootless
        // podman maps the owner in a real machine).
        std::fs::set_permissions(topo.path().join("ws"), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        std::fs::create_dir_all(topo.path().join("home")).unwrap();
        Env { provider, extra: Vec::new(), upstream, _etc: etc, topo }
    }

    fn root(&self) -> &Path {
        self.topo.path()
    }

    fn ws(&self) -> String {
        self.root().join("ws").display().to_string()
    }

    fn dirs(&self) -> ppp::dirs::Dirs {
        ppp::dirs::Dirs {
            config: self.root().join("config"),
            data: self.root().join("data"),
            cache: self.root().join("cache"),
        }
    }

    /// `ppp ARGS` inside the test host namespace.
    fn ppp(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.topo.host_ns(), env!("CARGO_BIN_EXE_ppp")])
            .args(args)
            .env_clear()
            .env("HOME", self.root().join("home"))
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("PPP_CONFIG", self.root().join("config"))
            .env("PPP_DATA", self.root().join("data"))
            .env("PPP_CACHE", self.root().join("cache"))
            .env("PPP_SECRET_BACKEND", "file")
            .env("PPP_MITMDUMP", netns::mitmdump_path())
            .env("PPP_PODMAN", fake_podman())
            .env("PPP_UPSTREAM_CA", &self.upstream.ca_cert)
            .env("PPP_OPENCODE_IMAGE", IMAGE)
            .env("FAKE_PODMAN_ROOT", self.root().join("fake"))
            .env("FAKE_PODMAN_IMAGES", self.root().join("images"))
            .env("FAKE_PODMAN_PROVIDER", self.provider)
            .envs(self.extra.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.ppp(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "ppp {args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn ls(&self) -> Vec<Value> {
        serde_json::from_str::<Vec<Value>>(&self.ok(&["ls", "--json"])).unwrap()
    }

    /// `podman ARGS` (the fake) as ppp would call it.
    fn podman(&self, args: &[&str]) -> Value {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.topo.host_ns()])
            .arg(fake_podman())
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("FAKE_PODMAN_ROOT", self.root().join("fake"))
            .output()
            .unwrap();
        assert!(out.status.success(), "podman {args:?}: {}", describe(&out));
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.root().join("fake/calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                let argv: Vec<String> =
                    v["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
                argv.join(" ").replace(&self.root().display().to_string(), "<tmp>")
            })
            .collect()
    }

    /// What is left of the fake's machines: namespaces, links, and
    /// processes of a machine (their command lines name its state dir).
    fn leftovers(&self) -> Vec<String> {
        let mut found = self.net_leftovers();
        let fake = self.root().join("fake").display().to_string();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            // The fake's own short-lived calls (`machine list`…) are not
            // machines; its holders and everything under them are.
            if text.contains(&format!("{fake}/machines/")) {
                found.push(format!("process {}: {text}", e.file_name().to_string_lossy()));
            }
        }
        found
    }

    fn net_leftovers(&self) -> Vec<String> {
        let prefix = std::fs::read_to_string(self.root().join("fake/prefix")).unwrap_or_default();
        let prefix = prefix.trim();
        if prefix.is_empty() {
            return Vec::new();
        }
        let mut found = leftovers(prefix);
        let links = self.topo.exec(&self.topo.host_ns(), &["ip", "-o", "link", "show"]);
        for line in String::from_utf8_lossy(&links.stdout).lines() {
            if let Some(name) = line.split(": ").nth(1).map(|n| n.split('@').next().unwrap_or(n))
                && name.starts_with(prefix)
            {
                found.push(format!("host-ns link {name}"));
            }
        }
        found
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "-f"]);
        let _ = self.run(&["daemon", "stop"]);
    }
}

/// The calls a command made (from a count taken before it), without the
/// read-only queries, with the per-run salt and digests masked.
fn since(env: &Env, before: usize) -> String {
    let salt = regex::Regex::new(r"--salt [0-9a-f]+").unwrap();
    let digests = regex::Regex::new(r"--digests [0-9a-f,]*").unwrap();
    env.calls()[before..]
        .iter()
        .filter(|c| !c.starts_with("machine list") && !c.starts_with("version") && !c.starts_with("machine info"))
        .map(|c| digests.replace(&salt.replace(c, "--salt <salt>"), "--digests <digests>").into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

fn setup_policy(env: &Env, sandbox: &str) {
    env.ok(&["policy", "init", "deny-all"]);
    // The upstream's test address is not public: the DNS-rebinding defence
    // wants an address rule for it.
    env.ok(&["policy", "allow", "network", "--sandbox", sandbox, "echo.test,api.anthropic.com,198.18.0.10"]);
    env.ok(&["secret", "set", "-g", "anthropic", "-t", KEY]);
}

/// Every call as `(guest, argv)`, where `guest` is the machine a call was
/// made in (empty for the host's).
fn raw_calls(env: &Env) -> Vec<(String, Vec<String>)> {
    std::fs::read_to_string(env.root().join("fake/calls.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let argv = v["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
            (v["guest"].as_str().unwrap_or("").to_owned(), argv)
        })
        .collect()
}

#[test]
fn save_load_and_create_from_a_template() {
    assert!(
        std::process::Command::new("qemu-img").arg("--version").output().is_ok_and(|o| o.status.success()),
        "qemu-img is missing: run `make test-deps` (package qemu-utils)"
    );
    let mut env = Env::new("qemu");
    setup_policy(&env, "red");
    env.ok(&["policy", "allow", "network", "--sandbox", "blue", "echo.test,api.anthropic.com,198.18.0.10"]);
    env.ok(&["create", "--name", "red", "opencode", &env.ws()]);
    assert!(
        raw_calls(&env).iter().any(|(g, a)| g == "ppp-red" && a.iter().any(|w| w == "pull")),
        "the first sandbox pulls the agent image"
    );
    // Leave a mark in the guest's persistent state to find in the copy.
    env.ok(&["exec", "red", "--", "sudo", "sh", "-c", "echo from-red > /var/lib/ppp-template-mark"]);

    // Save a running sandbox: stopped first (-f), then the disk converted.
    let file = env.root().join("base.tar");
    let out = env.ok(&["template", "save", "-f", "red", "base", "-o", file.to_str().unwrap()]);
    assert!(out.contains("saved template `base`"), "{out}");
    assert_eq!(env.ls()[0]["state"], "stopped");
    let saved: Vec<Value> = serde_json::from_str(&env.ok(&["template", "ls", "--json"])).unwrap();
    assert_eq!(saved[0]["source"], "red");

    // Into a fresh cache, then a sandbox from it.
    let fresh = env.root().join("cache2");
    env.extra.push(("PPP_CACHE".into(), fresh.display().to_string()));
    assert_eq!(env.ok(&["template", "ls", "--json"]).trim(), "[]");
    let out = env.ok(&["template", "load", file.to_str().unwrap()]);
    assert!(out.contains("loaded template `base`"), "{out}");
    let loaded: Vec<Value> = serde_json::from_str(&env.ok(&["template", "ls", "--json"])).unwrap();
    assert_eq!(loaded[0]["sha256"], saved[0]["sha256"]);
    let disk = loaded[0]["path"].as_str().unwrap().to_owned();
    assert!(disk.starts_with(&fresh.display().to_string()), "{disk}");

    let before = raw_calls(&env).len();
    let out = env.ok(&["create", "--name", "blue", "-t", "base", "opencode", &env.ws()]);
    assert!(out.contains("created sandbox `blue`"), "{out}");
    let calls = raw_calls(&env)[before..].to_vec();
    let init = calls
        .iter()
        .find(|(g, a)| g.is_empty() && a.get(..2) == Some(&["machine".to_owned(), "init".to_owned()][..]))
        .expect("a machine init");
    let at = init.1.iter().position(|w| w == "--image").expect("--image");
    assert_eq!(init.1[at + 1], disk, "{:?}", init.1);
    let pulls: Vec<_> = calls.iter().filter(|(g, a)| g == "ppp-blue" && a.iter().any(|w| w == "pull")).collect();
    assert!(pulls.is_empty(), "no pull in the templated sandbox: {pulls:?}");
    let log = std::fs::read_to_string(env.dirs().sandbox_machine_log("blue")).unwrap();
    assert!(log.contains("already pulled"), "provision.sh skipped the pull:\n{log}");
    let mark = env.ok(&["exec", "blue", "--", "cat", "/var/lib/ppp-template-mark"]);
    assert_eq!(mark, "from-red\n");
    let rec: Value =
        serde_json::from_str(&std::fs::read_to_string(env.dirs().sandbox_record("blue")).unwrap()).unwrap();
    assert_eq!(rec["template_tag"], "base");
    env.ok(&["rm", "-f", "blue"]);

    // A tag ppp does not know is an image reference, passed on as it is.
    let before = raw_calls(&env).len();
    let out = env.run(&["create", "--name", "green", "-t", "quay.io/example/machine-os:6.0", "opencode", &env.ws()]);
    let _ = out;
    let init = raw_calls(&env)[before..]
        .iter()
        .find(|(g, a)| g.is_empty() && a.get(..2) == Some(&["machine".to_owned(), "init".to_owned()][..]))
        .cloned()
        .expect("a machine init");
    let at = init.1.iter().position(|w| w == "--image").expect("--image");
    assert_eq!(init.1[at + 1], "quay.io/example/machine-os:6.0");
}

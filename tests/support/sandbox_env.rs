//! The sandbox fixture the end-to-end tests share: ppp's state, the fake
//! podman's state and an upstream, in one test topology, with the real
//! binary run inside the test host namespace. Dropping it removes every
//! sandbox and stops the daemon.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::netns::{self, NetnsEtc, Topology, UPSTREAM_IP, Upstream, describe, leftovers};
use serde_json::Value;

pub const KEY: &str = "sk-ant-sandbox-REAL-0123456789abcdef";
pub const IMAGE: &str = "localhost/agent:latest";

/// A stub agent: shows its arguments and key variable, calls the API
/// through the proxy from inside the container (the upstream's certificate
/// is for echo.test only, so the API call is plain HTTP and the HTTPS one
/// goes to echo.test), and exits 7.
pub const STUB_AGENT: &str = r#"#!/bin/sh
if [ "$1" = sleep-then ]; then exec sh -c "$2"; fi
echo "stub-agent args: $*"
echo "stub-agent key: $ANTHROPIC_API_KEY"
echo "stub-agent cwd: $(pwd)"
echo "stub-agent kit-env: ${TOOLS_HOME:-none}"
code=$(curl -sS -m 15 -o /dev/null -w '%{http_code}' -H "x-api-key: $ANTHROPIC_API_KEY" https://api.anthropic.com/from-agent)
echo "stub-agent api: $code"
code=$(curl -sS -m 15 -o /dev/null -w '%{http_code}' https://echo.test/agent-tls)
echo "stub-agent tls: $code"
exit 7
"#;

pub fn fake_podman() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-podman/podman")
}

/// The programs a host with the fake podman has besides it: a stand-in
/// for the provider's hypervisor.
pub fn fake_host_bin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-podman/host-bin")
}

/// ppp's state, the fake's state and the upstream, in one topology.
/// Dropping removes every sandbox and stops the daemon.
pub struct Env {
    pub provider: &'static str,
    pub extra: Vec<(String, String)>,
    pub upstream: Upstream,
    pub _etc: NetnsEtc,
    pub topo: Topology,
}

impl Env {
    pub fn new(provider: &'static str) -> Env {
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

    pub fn root(&self) -> &Path {
        self.topo.path()
    }

    pub fn ws(&self) -> String {
        self.root().join("ws").display().to_string()
    }

    pub fn dirs(&self) -> ppp::dirs::Dirs {
        ppp::dirs::Dirs {
            config: self.root().join("config"),
            data: self.root().join("data"),
            cache: self.root().join("cache"),
        }
    }

    /// The environment ppp runs with, for a `Command` and for scripts
    /// (the tui test's tmux pane).
    pub fn vars(&self) -> Vec<(String, String)> {
        let p = |rel: &str| self.root().join(rel).display().to_string();
        let mut vars: Vec<(String, String)> = [
            ("HOME", p("home")),
            // The fake's stand-in hypervisor first (ppp checks it is there).
            ("PATH", format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", fake_host_bin().display())),
            ("PPP_CONFIG", p("config")),
            ("PPP_DATA", p("data")),
            ("PPP_CACHE", p("cache")),
            ("PPP_SECRET_BACKEND", "file".into()),
            ("PPP_MITMDUMP", netns::mitmdump_path().display().to_string()),
            ("PPP_PODMAN", fake_podman().display().to_string()),
            ("PPP_UPSTREAM_CA", self.upstream.ca_cert.display().to_string()),
            ("PPP_OPENCODE_IMAGE", IMAGE.into()),
            ("FAKE_PODMAN_ROOT", p("fake")),
            ("FAKE_PODMAN_IMAGES", p("images")),
            ("FAKE_PODMAN_PROVIDER", self.provider.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        vars.extend(self.extra.iter().cloned());
        vars
    }

    /// `ppp ARGS` inside the test host namespace.
    pub fn ppp(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.topo.host_ns(), env!("CARGO_BIN_EXE_ppp")])
            .args(args)
            .env_clear()
            .envs(self.vars())
            .stdin(Stdio::null());
        c
    }

    /// The HTTP status the proxy gives `sandbox` for a host no policy
    /// allows, asked from inside its VM (a 403 also lands in flows.jsonl).
    pub fn denied_status(&self, sandbox: &str) -> String {
        self.ok(&[
            "exec",
            sandbox,
            "--",
            "curl",
            "-s",
            "-m",
            "15",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--connect-to",
            "denied.test:80:203.0.113.9:80",
            "http://denied.test/",
        ])
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.ppp(args).output().unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "ppp {args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn ls(&self) -> Vec<Value> {
        serde_json::from_str::<Vec<Value>>(&self.ok(&["ls", "--json"])).unwrap()
    }

    /// `podman ARGS` (the fake) as ppp would call it.
    pub fn podman(&self, args: &[&str]) -> Value {
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

    /// The variables podman runs with in sandbox `name`'s podman home, as
    /// ppp builds them (none for one in the user's own home).
    pub fn home_vars(&self, name: &str) -> Vec<(String, String)> {
        let rec = ppp::sandbox::load(&self.dirs(), name).unwrap().expect("the sandbox exists");
        ppp::sandbox::home(&self.dirs(), &rec)
            .env("linux")
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.display().to_string()))
            .collect()
    }

    /// The fake's state directory of machine `machine`, in whichever podman
    /// home it is (the default one's, or a sandbox's under `homes/`).
    pub fn machine_dir(&self, machine: &str) -> PathBuf {
        let fake = self.root().join("fake");
        let default = fake.join("machines").join(machine);
        if default.exists() {
            return default;
        }
        std::fs::read_dir(fake.join("homes"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|h| h.path().join("machines").join(machine))
            .find(|p| p.exists())
            .unwrap_or(default)
    }

    pub fn calls(&self) -> Vec<String> {
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
    pub fn leftovers(&self) -> Vec<String> {
        let mut found = self.net_leftovers();
        let fake = self.root().join("fake").display().to_string();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            // The fake's own short-lived calls (`machine list`…) are not
            // machines; its holders and everything under them are.
            // (Machines of a sandbox's own podman home are under `homes/`.)
            if text.contains(&format!("{fake}/machines/")) || text.contains(&format!("{fake}/homes/")) {
                found.push(format!("process {}: {text}", e.file_name().to_string_lossy()));
            }
        }
        found
    }

    pub fn net_leftovers(&self) -> Vec<String> {
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
pub fn since(env: &Env, before: usize) -> String {
    let salt = regex::Regex::new(r"--salt [0-9a-f]+").unwrap();
    let digests = regex::Regex::new(r"--digests [0-9a-f,]*").unwrap();
    env.calls()[before..]
        .iter()
        .filter(|c| !c.starts_with("machine list") && !c.starts_with("version") && !c.starts_with("machine info"))
        .map(|c| digests.replace(&salt.replace(c, "--salt <salt>"), "--digests <digests>").into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn setup_policy(env: &Env, sandbox: &str) {
    env.ok(&["policy", "init", "deny-all"]);
    // The upstream's test address is not public: the DNS-rebinding defence
    // wants an address rule for it.
    env.ok(&["policy", "allow", "network", "--sandbox", sandbox, "echo.test,api.anthropic.com,198.18.0.10"]);
    env.ok(&["secret", "set", "-g", "anthropic", "-t", KEY]);
}

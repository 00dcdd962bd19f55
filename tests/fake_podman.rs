//! Tests of the fake `podman` itself (`tests/fake-podman/podman`), which the
//! end-to-end tests put in place of real Podman Machine: its CLI answers the
//! way real podman's does, machines are network + mount namespaces with the
//! addresses a real guest sees, containers inside run unprivileged behind the
//! guest's FORWARD path, and nothing outlives `machine rm`.
//!
//! Every fake runs inside a test "host" namespace (`Topology`), so the
//! gvproxy-like addresses it puts on its host-side veths never reach the root
//! namespace. Needs root, like the other network tests; fails, never skips.

#[path = "support/netns.rs"]
mod netns;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use netns::{Topology, describe, leftovers};
use serde_json::Value;

/// The image the tests pull; `FAKE_PODMAN_IMAGES/<sanitized ref>/bin` holds
/// its programs.
const IMAGE: &str = "localhost/agent:latest";

fn fake_podman() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-podman/podman")
}

/// One fake podman root inside one test host namespace. Drop removes every
/// machine with `machine rm -f` and then checks nothing is left.
struct Fake {
    root: PathBuf,
    home: PathBuf,
    images: PathBuf,
    /// Extra variables for every call (provider, version, failures).
    env: Vec<(String, String)>,
    topo: Topology,
}

impl Fake {
    fn new() -> Self {
        let topo = Topology::without_mitmdump(0);
        let root = topo.path().join("root");
        let home = topo.path().join("home");
        let images = topo.path().join("images");
        let bin = images.join("localhost_agent_latest/bin");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        let stub = bin.join("opencode");
        std::fs::write(&stub, "#!/bin/sh\necho \"stub opencode $*\"\n").unwrap();
        std::fs::set_permissions(&stub, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        Self { root, home, images, env: Vec::new(), topo }
    }

    fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// `podman ARGS` in the test host namespace, with a clean environment.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.topo.host_ns()])
            .arg(fake_podman())
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", &self.home)
            .env("FAKE_PODMAN_ROOT", &self.root)
            .env("FAKE_PODMAN_IMAGES", &self.images)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        cmd
    }

    fn podman(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn podman_stdin(&self, args: &[&str], stdin: &str) -> Output {
        let mut child =
            self.command(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.podman(args);
        assert!(out.status.success(), "podman {args:?}: {}", describe(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    /// `machine ssh NAME -- SCRIPT`, required to succeed.
    fn ssh(&self, name: &str, script: &str) -> String {
        self.ok(&["machine", "ssh", name, "--", script])
    }

    /// The disk of machine `name`, found as ppp finds it on podman 5: the
    /// machine config `<name>.json` in the `ConfigDir` inspect names.
    fn disk(&self, name: &str) -> String {
        let inspect = self.json(&["machine", "inspect", name]);
        let dir = inspect[0]["ConfigDir"]["Path"].as_str().unwrap();
        let config: Value =
            serde_json::from_slice(&std::fs::read(Path::new(dir).join(format!("{name}.json"))).unwrap()).unwrap();
        config["ImagePath"]["Path"].as_str().unwrap().to_owned()
    }

    fn up(&self, name: &str) {
        self.ok(&["machine", "init", name]);
        self.ok(&["machine", "start", name]);
    }

    fn prefix(&self) -> String {
        std::fs::read_to_string(self.root.join("prefix")).unwrap().trim().to_owned()
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.root.join("calls.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// What is left of this root: netns and links (root and test host
    /// namespace) by prefix, and processes running the fake for it.
    fn leftovers(&self) -> Vec<String> {
        let Ok(prefix) = std::fs::read_to_string(self.root.join("prefix")) else { return Vec::new() };
        let prefix = prefix.trim();
        let mut left = leftovers(prefix);
        let links = self.topo.exec(&self.topo.host_ns(), &["ip", "-o", "link", "show"]);
        left.extend(
            String::from_utf8_lossy(&links.stdout)
                .lines()
                .filter_map(|l| l.split(": ").nth(1))
                .filter(|n| n.starts_with(prefix))
                .map(|n| format!("host-ns link {n}")),
        );
        let root = self.root.to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains("__holder") && cmdline.contains(&root) {
                left.push(format!("process {}: {cmdline}", entry.file_name().to_string_lossy()));
            }
        }
        left
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let dir = self.root.join("machines");
        let names: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        for name in names {
            let out = self.podman(&["machine", "rm", "-f", &name]);
            if !out.status.success() {
                eprintln!("cleanup: machine rm -f {name}: {}", describe(&out));
            }
        }
        let left = self.leftovers();
        if std::thread::panicking() {
            if !left.is_empty() {
                eprintln!("cleanup left: {left:?}");
            }
        } else {
            assert!(left.is_empty(), "the fake left {left:?}");
        }
    }
}

/// A guest script that succeeds when `ip` answers: a TCP connection to a
/// closed port is refused by that host (no ping on these machines).
fn reach(ip: &str) -> String {
    format!("bash -c 'exec 3<>/dev/tcp/{ip}/9' 2>&1 | grep -q 'Connection refused'")
}

/// Whether any process's command line contains `needle`.
fn processes_mentioning(needle: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(needle)
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn lifecycle_init_start_list_inspect_stop_rm_leaves_nothing() {
    let f = Fake::new();
    assert!(f.ok(&["--version"]).trim() == "podman version 6.0.1");
    assert_eq!(f.json(&["version", "--format", "json"])["Client"]["Version"], "6.0.1");
    assert_eq!(f.json(&["machine", "list", "--format", "json"]), serde_json::json!([]));

    f.ok(&["machine", "init", "m1", "--cpus", "1", "--memory", "1024", "--disk-size", "20", "--import-native-ca"]);
    let list = f.json(&["machine", "list", "--format", "json"]);
    let row = &list[0];
    assert_eq!(row["Name"], "m1");
    assert_eq!(row["Running"], false);
    assert_eq!(row["LastUp"], "Never");
    assert_eq!(row["CPUs"], 1);
    assert_eq!(row["Memory"], "1073741824", "bytes, as a string, like podman");
    assert_eq!(row["DiskSize"], (20u64 << 30).to_string());
    assert_eq!(row["VMType"], "qemu");
    for key in ["Default", "Created", "Starting", "Port", "RemoteUsername", "IdentityPath", "UserModeNetworking"] {
        assert!(row.get(key).is_some(), "list lacks {key}: {row}");
    }
    let inspect = f.json(&["machine", "inspect", "m1"]);
    assert_eq!(inspect[0]["State"], "stopped");
    assert_eq!(inspect[0]["Resources"]["Memory"], 1024);
    assert_eq!(inspect[0]["SSHConfig"]["RemoteUsername"], "core");
    assert!(inspect[0].get("ImagePath").is_none(), "podman 5's inspect does not say where the disk is");
    let disk = f.disk("m1");
    assert!(Path::new(&disk).is_file(), "qemu-img made the disk at {disk}");
    let info = f.json(&["machine", "info", "--format", "json"]);
    assert_eq!(info["Host"]["VMType"], "qemu");

    f.ok(&["machine", "start", "m1"]);
    let prefix = f.prefix();
    assert!(leftovers(&prefix).iter().any(|l| l == &format!("netns {prefix}-0")), "the machine's netns exists");
    let row = &f.json(&["machine", "list", "--format", "json"])[0];
    assert_eq!((row["Running"].as_bool(), row["LastUp"].as_str()), (Some(true), Some("Currently running")));
    assert_eq!(f.json(&["machine", "inspect", "m1"])[0]["State"], "running");
    // What a guest sees: the uplink with gvproxy's addressing, its hostname.
    let seen = f.ssh("m1", "hostname; ip -o -4 addr show enp0s1; ip route show default");
    assert!(seen.starts_with("m1\n"), "{seen}");
    assert!(seen.contains("192.168.127.2/24"), "{seen}");
    assert!(seen.contains("default via 192.168.127.1 dev enp0s1"), "{seen}");
    // The host alias answers from the test host namespace.
    f.ssh("m1", &reach("192.168.127.254"));

    // A real wireguard-go in the machine (wg0's socket in its private /run),
    // under a name only this test uses, so we can look for it afterwards.
    let wg = format!("wg{}", &prefix[2..]);
    f.ssh(
        "m1",
        &format!("sudo wireguard-go {wg} 2>/dev/null && test -S /run/wireguard/{wg}.sock && wg show {wg} >/dev/null"),
    );
    assert!(!Path::new(&format!("/run/wireguard/{wg}.sock")).exists(), "the socket is the machine's own");

    f.ok(&["machine", "stop", "m1"]);
    assert_eq!(f.json(&["machine", "inspect", "m1"])[0]["State"], "stopped");
    assert!(f.leftovers().is_empty(), "stop leaves no netns, link or process: {:?}", f.leftovers());
    assert!(!processes_mentioning(&wg), "stop killed the machine's wireguard-go");
    let out = f.podman(&["machine", "ssh", "m1", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("Error: vm \"m1\" is not running"), "{}", stderr(&out));

    f.ok(&["machine", "start", "m1"]);
    f.ok(&["machine", "rm", "-f", "m1"]);
    assert_eq!(f.json(&["machine", "list", "--format", "json"]), serde_json::json!([]));
    assert!(!f.root.join("machines/m1").exists(), "rm deletes the state dir");
    assert!(!f.root.join("config/qemu/m1.json").exists(), "rm deletes the machine config");
    assert!(f.leftovers().is_empty(), "{:?}", f.leftovers());
    let out = f.podman(&["machine", "inspect", "m1"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("m1: VM does not exist"), "{}", stderr(&out));
}

#[test]
fn init_rejects_bad_values_and_existing_names_like_podman() {
    let f = Fake::new();
    let out = f.podman(&["machine", "init", "m1", "--memory", "8g"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).starts_with(
            "Error: invalid argument \"8g\" for \"-m, --memory\" flag: strconv.ParseUint: parsing \"8g\": invalid syntax"
        ),
        "{}",
        stderr(&out)
    );
    let out = f.podman(&["machine", "init", "m1", "--memory", "999999999"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("greater than total system memory"), "{}", stderr(&out));
    let out = f.podman(&["machine", "init", "m1", "--cpus", "100000"]);
    assert!(stderr(&out).contains("greater than number of host CPUs"), "{}", stderr(&out));
    f.ok(&["machine", "init", "m1"]);
    let out = f.podman(&["machine", "init", "m1"]);
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(stderr(&out), "Error: m1: VM already exists\n");
    let out = f.podman(&["machine", "frobnicate"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("fake podman does not implement"), "{}", stderr(&out));
    // `--image` with a qcow2 file: it becomes the machine's disk.
    let image = f.topo.path().join("custom.qcow2");
    netns::run_ok(&["qemu-img", "create", "-q", "-f", "qcow2", image.to_str().unwrap(), "1M"]);
    f.ok(&["machine", "init", "custom", "--image", image.to_str().unwrap()]);
    let disk = f.disk("custom");
    assert_eq!(std::fs::read(disk).unwrap(), std::fs::read(&image).unwrap());
    // Without -f, rm asks; "n" keeps the machine.
    let out = f.podman_stdin(&["machine", "rm", "m1"], "n\n");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Are you sure you want to continue? [y/N]"));
    assert!(f.root.join("machines/m1/machine.json").exists());
    let out = f.podman_stdin(&["machine", "rm", "m1"], "y\n");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!f.root.join("machines/m1").exists());
}

#[test]
fn qemu_runs_one_machine_at_a_time_and_wsl_several() {
    let f = Fake::new();
    f.up("m1");
    f.ok(&["machine", "init", "m2"]);
    let out = f.podman(&["machine", "start", "m2"]);
    assert_eq!(out.status.code(), Some(125), "{}", describe(&out));
    assert!(
        stderr(&out).contains("m1 already starting or running: only one VM can be active at a time"),
        "{}",
        stderr(&out)
    );
    assert_eq!(f.json(&["machine", "inspect", "m2"])[0]["State"], "stopped", "refused before doing anything");
    let out = f.podman(&["machine", "start", "m1"]);
    assert_eq!(out.status.code(), Some(125), "starting a running machine fails, as in podman 5");
    assert!(stderr(&out).contains("VM already running or starting"), "{}", stderr(&out));

    let f = f.with_env("FAKE_PODMAN_PROVIDER", "wsl");
    f.ok(&["machine", "start", "m2"]);
    assert!(f.ssh("m2", "ip -o -4 addr show enp0s1").contains("192.168.127.3/24"));
    // Both machines reach gvproxy's gateway through their own veth.
    f.ssh("m1", &reach("192.168.127.1"));
    f.ssh("m2", &reach("192.168.127.1"));
}

#[test]
fn ssh_reparses_arguments_passes_exit_codes_and_stdin() {
    let f = Fake::new();
    f.up("m1");
    // Like real podman (OpenSSH), the words are joined and parsed again by
    // the guest's shell: "a b" becomes two arguments, and the unquoted `\n`
    // loses its backslash, exactly as over real ssh.
    let out = f.ok(&["machine", "ssh", "m1", "--", "printf", "%s\\n", "a b"]);
    assert_eq!(out, "anbn");
    let out = f.ok(&["machine", "ssh", "m1", "--", "printf", "'%s|'", "a b"]);
    assert_eq!(out, "a|b|");
    let out = f.ok(&["machine", "ssh", "m1", "--", "printf", "'%s\\n'", "'a b'"]);
    assert_eq!(out, "a b\n", "quoted words survive");
    let out = f.podman(&["machine", "ssh", "m1", "--", "exit", "7"]);
    assert_eq!(out.status.code(), Some(7));
    let out = f.podman_stdin(&["machine", "ssh", "m1", "--", "bash", "-s"], "echo from-stdin; id -un; exit 3\n");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-stdin\nroot\n");
    // A clean environment (nothing of the host's), the core user's basics.
    let env =
        f.ssh("m1", "echo \"$HOME $USER $(pwd)\"; env | grep -c FAKE_PODMAN_IMAGES; echo ${CARGO_MANIFEST_DIR:-unset}");
    assert_eq!(env, "/home/core core /home/core\n1\nunset\n");
    assert_eq!(f.ssh("m1", "sudo -u core id -un; sudo id -u"), "core\n0\n");
}

#[test]
fn machine_files_are_private_and_persist_across_stop_start() {
    let f = Fake::new();
    f.up("m1");
    let marker = format!("/etc/fake-podman-test-{}", f.prefix());
    f.ssh("m1", &format!("echo persisted > {marker}; echo tmp > /tmp/t; echo lib > /var/lib/ppp/x"));
    assert!(!Path::new(&marker).exists(), "a write to the machine's /etc stays in the machine");
    f.ok(&["machine", "stop", "m1"]);
    f.ok(&["machine", "start", "m1"]);
    assert_eq!(f.ssh("m1", &format!("cat {marker} /tmp/t /var/lib/ppp/x")), "persisted\ntmp\nlib\n");
    // Each machine has its own /run/wireguard (wireguard-go's sockets).
    assert_eq!(f.ssh("m1", "mountpoint -q /run/wireguard || findmnt -n -o FSTYPE --target /run/wireguard"), "tmpfs\n");
}

#[test]
fn cp_copies_files_and_directories_both_ways() {
    let f = Fake::new();
    f.up("m1");
    let src = f.topo.path().join("in.txt");
    std::fs::write(&src, "hello\n").unwrap();
    let dir = f.topo.path().join("tree");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/z"), "z\n").unwrap();
    f.ok(&["machine", "cp", src.to_str().unwrap(), "m1:/tmp/in.txt"]);
    f.ok(&["machine", "cp", dir.to_str().unwrap(), "m1:/home/core/tree"]);
    // Copied as the same user `machine ssh` runs as here, so a directory made
    // over ssh can be copied into (on a real machine both are `core`).
    f.ssh("m1", "mkdir -p /tmp/made-by-ssh");
    f.ok(&["machine", "cp", src.to_str().unwrap(), "m1:/tmp/made-by-ssh/in.txt"]);
    assert_eq!(f.ssh("m1", "cat /tmp/in.txt /home/core/tree/sub/z /tmp/made-by-ssh/in.txt"), "hello\nz\nhello\n");
    let back = f.topo.path().join("back");
    f.ok(&["machine", "cp", "m1:/home/core/tree", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(back.join("sub/z")).unwrap(), "z\n");
    let host = f.topo.path().join("hostname");
    f.ok(&["machine", "cp", "m1:/etc/hostname", host.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "m1\n");
    // A missing source is podman's error, exit 125.
    let out = f.podman(&["machine", "cp", "m1:/no/such/file", host.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125), "{}", describe(&out));
}

#[test]
fn containers_run_unprivileged_and_egress_through_forward() {
    let f = Fake::new();
    f.up("m1");
    let out = f.podman(&["machine", "ssh", "m1", "--", "podman", "image", "exists", IMAGE]);
    assert_eq!(out.status.code(), Some(1));
    f.ssh("m1", &format!("podman pull {IMAGE} && podman image exists {IMAGE}"));
    let out = f.podman(&["machine", "ssh", "m1", "--", "podman", "pull", "localhost/none:latest"]);
    assert_eq!(out.status.code(), Some(125));
    let images: Value = serde_json::from_str(&f.ssh("m1", "podman images --format json")).unwrap();
    assert_eq!(images[0]["Names"][0], IMAGE);

    // The image's bin/ is on PATH; the exit code passes through.
    let out =
        f.podman(&["machine", "ssh", "m1", "--", "podman", "run", "--rm", IMAGE, "sh", "-c", "'opencode hi; exit 4'"]);
    assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "stub opencode hi\n");

    // `-i` (here in a cluster, `-it`) passes stdin through ssh into the container.
    let out = f.podman_stdin(&["machine", "ssh", "m1", "--", "podman", "run", "--rm", "-it", IMAGE, "cat"], "piped\n");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "piped\n", "{}", describe(&out));

    // No CAP_NET_ADMIN: neither links nor the ruleset can be touched.
    for cmd in ["ip link add dummy0 type dummy", "nft list ruleset"] {
        let out = f.podman(&["machine", "ssh", "m1", "--", &format!("podman run --rm {IMAGE} {cmd}")]);
        assert!(!out.status.success(), "`{cmd}` must fail in a container: {}", describe(&out));
        assert!(stderr(&out).contains("Operation not permitted"), "{}", stderr(&out));
    }

    // A workspace volume at another path, writable by the container user.
    let ws = f.home.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::set_permissions(&ws, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    f.ssh("m1", &format!("podman run --rm -v {}:/work -w /work {IMAGE} sh -c 'pwd > out; id -u >> out'", ws.display()));
    assert_eq!(std::fs::read_to_string(ws.join("out")).unwrap(), "/work\n1000\n");

    // Container traffic crosses the guest's FORWARD hook (so a kill switch
    // must cover forward), masqueraded out of the uplink.
    let counted = f.ssh(
        "m1",
        &format!(
            "nft add table inet probe && nft add chain inet probe fw '{{ type filter hook forward priority 0; }}' && \
             nft add rule inet probe fw ip saddr 10.88.0.0/16 ip daddr 192.168.127.1 counter && \
             podman run --rm {IMAGE} bash -c 'exec 3<>/dev/tcp/192.168.127.1/9' 2>/dev/null; \
             nft list chain inet probe fw"
        ),
    );
    let packets: u64 = counted
        .split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in {counted}"));
    assert!(packets >= 1, "the container's SYN went through forward: {counted}");

    // Detached named containers: ps, exec, stop, rm.
    f.ssh("m1", &format!("podman run -d --name bg --label ppp.generation=3 {IMAGE} sleep 600"));
    let label = |key: &str| {
        f.ssh("m1", &format!("podman container inspect --format '{{{{index .Config.Labels \"{key}\"}}}}' bg"))
    };
    assert_eq!(label("ppp.generation"), "3\n");
    assert_eq!(label("other"), "<no value>\n", "as Go prints a missing key");
    let ps: Value = serde_json::from_str(&f.ssh("m1", "podman ps --format json")).unwrap();
    assert_eq!((ps[0]["Names"][0].as_str(), ps[0]["State"].as_str()), (Some("bg"), Some("running")));
    assert_eq!(f.ssh("m1", "podman exec bg opencode x"), "stub opencode x\n");
    assert_eq!(f.ssh("m1", "podman container exists bg && echo yes"), "yes\n");
    f.ssh("m1", "podman stop -t 1 bg && podman rm bg");
    assert_eq!(f.ssh("m1", "podman ps -a --format json"), "[]\n");
    let out = f.podman(&["machine", "ssh", "m1", "--", "podman", "container", "exists", "bg"]);
    assert_eq!(out.status.code(), Some(1), "a removed container does not exist: {}", describe(&out));
}

#[test]
fn versions_gate_flags_and_commands_and_calls_are_recorded() {
    let f = Fake::new().with_env("FAKE_PODMAN_VERSION", "5.4.2");
    assert_eq!(f.ok(&["--version"]), "podman version 5.4.2\n");
    let out = f.podman(&["machine", "init", "old", "--import-native-ca"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).starts_with("Error: unknown flag: --import-native-ca"), "{}", stderr(&out));
    f.up("old");
    let out = f.podman(&["machine", "cp", "/etc/hostname", "old:/tmp/h"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("unrecognized command `podman machine cp`"), "{}", stderr(&out));
    f.ssh("old", "podman --version >/dev/null");

    let argvs: Value =
        f.calls().into_iter().map(|c| serde_json::json!([c["argv"], c.get("guest")])).collect::<Vec<_>>().into();
    assert_eq!(
        argvs,
        serde_json::json!([
            [["--version"], null],
            [["machine", "init", "old", "--import-native-ca"], null],
            [["machine", "init", "old"], null],
            [["machine", "start", "old"], null],
            [["machine", "cp", "/etc/hostname", "old:/tmp/h"], null],
            [["machine", "ssh", "old", "--", "podman --version >/dev/null"], null],
            [["--version"], "old"],
        ])
    );
}

#[test]
fn injected_failures_and_a_missing_root_fail_loudly() {
    let f = Fake::new().with_env("FAKE_PODMAN_FAIL", "init");
    let out = f.podman(&["machine", "init", "m1"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("FAKE_PODMAN_FAIL=init"), "{}", stderr(&out));
    assert!(!f.root.join("machines/m1").exists());

    let mut f = Fake::new().with_env("FAKE_PODMAN_FAIL", "start");
    f.ok(&["machine", "init", "m1"]);
    let out = f.podman(&["machine", "start", "m1"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("FAKE_PODMAN_FAIL=start"), "{}", stderr(&out));
    assert_eq!(f.json(&["machine", "inspect", "m1"])[0]["State"], "stopped");
    assert!(f.leftovers().is_empty());

    f.env.clear();
    f.ok(&["machine", "start", "m1"]);
    f.env.push(("FAKE_PODMAN_FAIL".into(), "pull".into()));
    let out = f.podman(&["machine", "ssh", "m1", "--", "podman", "pull", IMAGE]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("FAKE_PODMAN_FAIL=pull"), "{}", stderr(&out));

    let out = Command::new(fake_podman()).arg("--version").env_clear().env("PATH", "/usr/bin:/bin").output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("FAKE_PODMAN_ROOT is not set"), "{}", stderr(&out));
}

/// Podman's one-machine rule is per home (`checkExclusiveActiveVM` lists the
/// machines under the XDG dirs podman runs with): machines made with other
/// `XDG_CONFIG_HOME`/`XDG_DATA_HOME` are neither listed nor counted, each
/// home keeps its own config and image cache, and a running machine's
/// sockets are bound under its `XDG_RUNTIME_DIR`, so one past `sun_path` fails.
#[test]
fn one_running_machine_per_podman_home() {
    let f = Fake::new();
    let home = |n: &str| {
        let d = f.topo.path().join(format!("h{n}"));
        std::fs::create_dir_all(d.join("run")).unwrap();
        d
    };
    let at = |h: &Path, args: &[&str]| -> Output {
        f.command(args)
            .env("XDG_CONFIG_HOME", h.join("config"))
            .env("XDG_DATA_HOME", h.join("data"))
            .env("XDG_RUNTIME_DIR", h.join("run"))
            .output()
            .unwrap()
    };
    let ok = |h: &Path, args: &[&str]| {
        let out = at(h, args);
        assert!(out.status.success(), "podman {args:?} in {}: {}", h.display(), describe(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let (a, b) = (home("a"), home("b"));
    // The default home has one running; each of the others runs its own.
    f.up("m0");
    ok(&a, &["machine", "init", "ma"]);
    ok(&b, &["machine", "init", "mb"]);
    ok(&b, &["machine", "init", "mb2"]);
    ok(&a, &["machine", "start", "ma"]);
    ok(&b, &["machine", "start", "mb"]);
    let out = at(&b, &["machine", "start", "mb2"]);
    assert!(stderr(&out).contains("mb already starting or running: only one VM can be active"), "{}", describe(&out));
    let names = |out: String| -> Vec<String> {
        serde_json::from_str::<Vec<Value>>(&out)
            .unwrap()
            .iter()
            .map(|m| m["Name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(ok(&a, &["machine", "list", "--format", "json"])), ["ma"]);
    assert_eq!(names(ok(&b, &["machine", "list", "--format", "json"])), ["mb", "mb2"]);
    assert_eq!(names(f.ok(&["machine", "list", "--format", "json"])), ["m0"]);
    assert!(a.join("config/containers/podman/machine/qemu/ma.json").is_file(), "configs live in the home");
    assert!(a.join("run/podman/ma-gvproxy.sock").exists(), "sockets in the home's runtime dir");
    // Each home downloads podman's image once.
    let pulls = std::fs::read_to_string(f.root.join("pulls.log")).unwrap();
    assert_eq!(pulls.lines().count(), 3, "{pulls}");
    // Both machines are really up, each with its own address.
    assert!(at(&a, &["machine", "ssh", "ma", "--", "hostname"]).status.success());
    let out = at(&a, &["machine", "ssh", "mb", "--", "hostname"]);
    assert!(!out.status.success(), "another home's machine is not there");
    ok(&a, &["machine", "rm", "-f", "ma"]);
    ok(&b, &["machine", "rm", "-f", "mb"]);
    ok(&b, &["machine", "rm", "-f", "mb2"]);
    assert!(!a.join("run/podman/ma-gvproxy.sock").exists());
    // A runtime dir too long for a socket fails at start, as gvproxy would.
    let long = f.topo.path().join("l".repeat(90));
    std::fs::create_dir_all(long.join("run")).unwrap();
    ok(&long, &["machine", "init", "ml"]);
    let out = at(&long, &["machine", "start", "ml"]);
    assert!(!out.status.success() && stderr(&out).contains("cannot bind"), "{}", describe(&out));
    ok(&long, &["machine", "rm", "-f", "ml"]);
}

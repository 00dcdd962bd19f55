//! The real pinned mitmdump, started from `proxy::mitmdump::command`, inside
//! a network namespace this test creates with nothing but loopback: every
//! packet (WireGuard handshakes included) stays in that namespace.
//!
//! Needs root (for `ip netns`) and the test venv that `make test-deps`
//! builds; without it the test fails rather than skipping.

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ppp::dirs::Dirs;
use ppp::exec::Invocation;
use ppp::proxy::clientconf::{self, ClientConf};
use ppp::proxy::{mitmdump, trust};

use common::test_mitmdump;

fn dirs(root: &Path) -> Dirs {
    Dirs { config: root.join("config"), data: root.join("data"), cache: root.join("cache") }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace with only `lo` up, and the mitmdump in it; both go
/// away on drop, also when an assertion fails.
struct Netns {
    name: String,
    child: Option<Child>,
}

impl Netns {
    fn new() -> Self {
        let name = format!("ppp-t{}", std::process::id());
        // A leftover of an earlier run with the same pid.
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = Self { name, child: None };
        run(&mut ns.exec(["ip", "link", "set", "lo", "up"]));
        // No address but loopback, no route: nothing here can reach outside.
        let routes = run(&mut ns.exec(["ip", "-4", "route", "show", "table", "all"]));
        assert!(routes.lines().all(|l| l.contains("dev lo")), "unexpected routes:\n{routes}");
        ns
    }

    fn exec<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(&self, argv: I) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(argv);
        c
    }

    /// Start `inv` in the namespace, stdout and stderr into `log`.
    /// `ip netns exec` execs the command, so the child's pid is mitmdump's.
    fn spawn(&mut self, inv: &Invocation, log: &Path) {
        let out = std::fs::File::create(log).unwrap();
        let err = out.try_clone().unwrap();
        let mut c = self.exec([inv.program.as_os_str()]);
        c.args(&inv.args).envs(inv.env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).stdout(out).stderr(err);
        self.child = Some(c.spawn().unwrap());
    }

    /// SIGTERM, then wait (with a deadline) for the process to be gone.
    fn stop(&mut self, deadline: Duration) -> Duration {
        let mut child = self.child.take().expect("started");
        let start = Instant::now();
        kill(Pid::from_raw(i32::try_from(child.id()).unwrap()), Signal::SIGTERM).unwrap();
        loop {
            if child.try_wait().unwrap().is_some() {
                return start.elapsed();
            }
            if start.elapsed() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mitmdump did not exit within {deadline:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Poll `log` until `n` client configs parse from it.
fn wait_for_configs(log: &Path, n: usize, deadline: Duration) -> BTreeMap<u16, ClientConf> {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let confs = clientconf::parse(&text);
        if confs.len() >= n {
            return confs;
        }
        assert!(start.elapsed() < deadline, "only {} of {n} configs after {deadline:?}; log:\n{text}", confs.len());
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn wg_pubkey(private: &str) -> String {
    let mut child =
        Command::new("wg").arg("pubkey").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("wg is installed");
    child.stdin.take().unwrap().write_all(format!("{private}\n").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Bring up a wireguard-go guest per rendered wg0.conf in the namespace
/// (wg-quick's own keys stripped, as `wg-quick strip` does) and wait for each
/// to complete a handshake with its server. `wg setconf` accepting the file
/// proves the shape; the handshake proves the guest key and server key pair up.
fn handshake_all(ns: &Netns, confs: &[PathBuf]) -> String {
    let script = r#"
set -eu
mkdir -p /run/wireguard
mount -t tmpfs ppp-wg /run/wireguard
i=0
for conf in "$@"; do
  dev=wg$i
  wireguard-go "$dev" 2>/dev/null
  n=0; until [ -S /run/wireguard/$dev.sock ]; do n=$((n+1)); [ $n -lt 200 ] || exit 3; sleep 0.01; done
  grep -v -e '^Address' -e '^Table' "$conf" > /run/wireguard/$dev.conf
  wg setconf "$dev" /run/wireguard/$dev.conf
  wg set "$dev" peer "$(wg show "$dev" peers)" persistent-keepalive 1
  ip link set "$dev" up
  i=$((i+1))
done
n=0
while wg show all latest-handshakes | awk '{ if ($3 == 0) bad=1 } END { exit !bad }'; do
  n=$((n+1)); [ $n -lt 500 ] || { wg show all latest-handshakes; exit 4; }
  sleep 0.02
done
wg show all latest-handshakes
j=0; while [ $j -lt $i ]; do ip link del wg$j; j=$((j+1)); done
"#;
    let mut c = ns.exec(["sh", "-c", script, "sh"]);
    c.args(confs);
    run(&mut c)
}

#[test]
fn three_servers_print_configs_guests_can_use() {
    let mitmdump = test_mitmdump();
    let tmp = tempfile::Builder::new().prefix("ppp-mitm-").tempdir().unwrap();
    let d = dirs(tmp.path());
    let addon = mitmdump::write_addon(
        &d,
        &ppp::assets::Addon::from_files([("addon.py", b"# ppp test addon: loads, does nothing\n".as_slice())]),
    )
    .unwrap();
    let ca =
        trust::export(&d, &trust::Source::Files(trust::LINUX_BUNDLES.iter().map(PathBuf::from).collect())).unwrap();
    // Out of order and not contiguous, so nothing can line up by accident.
    let claimed = [51825, 51821, 51823];
    let mut spec = mitmdump::Spec::new(&d, mitmdump, claimed, addon, ca);
    spec.sets.push(("console_eventlog_verbosity".into(), "info".into()));
    for &p in &spec.ports {
        assert!(!spec.keys(p).exists(), "key files are mitmdump's to create");
    }
    mitmdump::prepare(&spec).unwrap();
    let inv = mitmdump::command(&spec);

    let mut ns = Netns::new();
    let log = tmp.path().join("proxy.log");
    let start = Instant::now();
    ns.spawn(&inv, &log);
    let confs = wait_for_configs(&log, 3, Duration::from_secs(60));
    let up = start.elapsed();
    eprintln!("mitmdump printed 3 client configs {up:?} after start");

    assert_eq!(confs.keys().copied().collect::<Vec<_>>(), [51821, 51823, 51825]);
    let mut privs: Vec<&str> = confs.values().map(|c| c.private_key.as_str()).collect();
    let mut pubs: Vec<&str> = confs.values().map(|c| c.public_key.as_str()).collect();
    privs.sort_unstable();
    privs.dedup();
    pubs.sort_unstable();
    pubs.dedup();
    assert_eq!((privs.len(), pubs.len()), (3, 3), "every server has its own keys");

    let mut rendered = Vec::new();
    for (&port, conf) in &confs {
        // The key file mitmdump created is the one behind the printed block.
        let keys: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(spec.keys(port)).unwrap()).unwrap();
        assert_eq!(keys["client_key"].as_str(), Some(conf.private_key.as_str()), "port {port}");
        let server = keys["server_key"].as_str().expect("server_key");
        assert_eq!(wg_pubkey(server), conf.public_key, "port {port}");

        let text = clientconf::render_wg0(conf, ppp::sandbox::inner_ip(port), "127.0.0.1", port);
        assert!(text.contains(&format!("Endpoint = 127.0.0.1:{port}\n")) && !text.contains("DNS"), "{text}");
        let path = tmp.path().join(format!("wg0-{port}.conf"));
        std::fs::write(&path, &text).unwrap();
        rendered.push(path);
    }
    clientconf::save(&d, &confs).unwrap();
    assert_eq!(clientconf::load(&d).unwrap(), confs);

    let t = Instant::now();
    let shown = handshake_all(&ns, &rendered);
    eprintln!("3 guests completed handshakes in {:?}:\n{shown}", t.elapsed());

    let stopped = ns.stop(Duration::from_secs(20));
    eprintln!("mitmdump exited {stopped:?} after SIGTERM");
    drop(ns);
}

#[test]
fn ensure_takes_ppp_mitmdump_of_the_pinned_version() {
    let mitmdump = test_mitmdump();
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let lookup = mitmdump::Lookup { mitmdump: Some(mitmdump.clone()), ..mitmdump::Lookup::default() };
    let mut said = Vec::new();
    let start = Instant::now();
    assert_eq!(mitmdump::ensure_with(&d, &lookup, |m| said.push(m.to_owned())).unwrap(), mitmdump);
    eprintln!("ensure() with PPP_MITMDUMP took {:?}", start.elapsed());
    assert!(said.is_empty(), "{said:?}");
    assert!(!d.venv().exists(), "nothing is installed when PPP_MITMDUMP is set");
    assert_eq!(mitmdump::installed_version(&mitmdump).unwrap(), ppp::versions::mitmproxy());
}

#[test]
fn ensure_rejects_a_mitmdump_of_another_version() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("mitmdump");
    std::fs::write(&fake, "#!/bin/sh\necho 'Mitmproxy: 1.0.0'\necho 'Python:    3.13.0'\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lookup = mitmdump::Lookup { mitmdump: Some(fake), ..mitmdump::Lookup::default() };
    let err = mitmdump::ensure_with(&dirs(tmp.path()), &lookup, |_| {}).unwrap_err();
    let (text, _) = ppp::error::render(&err);
    assert!(text.contains("is mitmproxy 1.0.0, but ppp needs 12.2.3"), "{text}");
    assert!(text.contains("hint:") && text.contains("PPP_MITMDUMP"), "{text}");
}

/// The product's install path end to end: a venv holding another mitmproxy
/// is replaced with the pinned one (a real `pip install`, a few seconds with
/// pip's cache warm from `make test-deps`), and a second call just checks it.
#[test]
fn ensure_replaces_a_venv_of_another_version_then_keeps_it() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    std::fs::create_dir_all(d.venv().join("bin")).unwrap();
    std::fs::write(d.venv().join("pyvenv.cfg"), "home = /nowhere\n").unwrap();
    std::fs::write(d.venv_mitmdump(), "#!/bin/sh\necho 'Mitmproxy: 1.0.0'\n").unwrap();
    std::fs::set_permissions(d.venv_mitmdump(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The search as ppp does it, minus any PPP_MITMDUMP the caller exported.
    let lookup = mitmdump::Lookup { mitmdump: None, ..mitmdump::Lookup::from_env() };

    let mut said = Vec::new();
    let start = Instant::now();
    let path = mitmdump::ensure_with(&d, &lookup, |m| said.push(m.to_owned())).unwrap();
    eprintln!("ensure() replaced the venv in {:?}: {said:#?}", start.elapsed());
    assert_eq!(path, d.venv_mitmdump());
    assert!(said[0].starts_with("replacing mitmproxy 1.0.0"), "{said:?}");
    assert!(said.iter().any(|m| m.starts_with("installing mitmproxy 12.2.3")), "{said:?}");
    assert_eq!(mitmdump::installed_version(&path).unwrap(), "12.2.3");

    said.clear();
    let start = Instant::now();
    assert_eq!(mitmdump::ensure_with(&d, &lookup, |m| said.push(m.to_owned())).unwrap(), path);
    eprintln!("ensure() on an installed venv took {:?}", start.elapsed());
    assert!(said.is_empty(), "an installed venv is kept as it is: {said:?}");
}

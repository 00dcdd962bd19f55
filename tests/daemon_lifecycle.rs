//! `ppp daemon start/status/stop` for real: the supervisor runs the pinned
//! mitmdump inside a network namespace the test made (no route out), and
//! the test kills mitmdump and the supervisor to prove recovery.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{World, ok, output, test_mitmdump};
use serde_json::Value;

/// A namespace with only loopback, removed on drop.
struct Netns(String);

impl Netns {
    fn new() -> Self {
        assert!(nix::unistd::geteuid().is_root(), "the daemon tests need root for `ip netns` (CI runs as root)");
        let name = format!("ppp-dl{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(std::process::Stdio::null()).status();
        assert!(Command::new("ip").args(["netns", "add", &name]).status().unwrap().success());
        assert!(
            Command::new("ip")
                .args(["netns", "exec", &name, "ip", "link", "set", "lo", "up"])
                .status()
                .unwrap()
                .success()
        );
        let routes = Command::new("ip").args(["netns", "exec", &name, "ip", "route", "show"]).output().unwrap();
        assert!(!String::from_utf8_lossy(&routes.stdout).contains("default"), "the namespace must have no route out");
        Self(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// `ppp` run inside the namespace.
fn in_ns(w: &World, ns: &Netns, args: &[&str]) -> Command {
    let mut c = w.ppp(["--"]);
    // Rebuild as `ip netns exec NS ppp ARGS` with the hermetic environment.
    let envs: Vec<(std::ffi::OsString, std::ffi::OsString)> =
        c.get_envs().filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))).collect();
    c = Command::new("ip");
    c.env_clear().envs(envs).arg("netns").arg("exec").arg(&ns.0).arg(env!("CARGO_BIN_EXE_ppp")).args(args);
    c.env("PPP_MITMDUMP", test_mitmdump()).current_dir(w.path());
    c
}

fn status(w: &World) -> Value {
    serde_json::from_str(&ok(&mut w.ppp(["daemon", "status", "--json"]))).unwrap()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn alive(pid: i64) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()), None).is_ok()
}

fn generation(w: &World) -> u64 {
    let mut s = UnixStream::connect(w.data().join("secret.sock")).unwrap();
    s.write_all(b"{\"op\":\"generation\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    v["generation"].as_u64().unwrap()
}

#[test]
fn start_restart_recover_stop() {
    let w = World::new();
    let ns = Netns::new();
    let mut start = in_ns(&w, &ns, &["daemon", "start", "-d", "--policy", "balanced"]);
    let out = ok(&mut start);
    assert!(out.starts_with("ppp daemon started (pid "), "{out}");
    assert!(w.config().join("policies.yaml").exists(), "--policy created the global policy");
    let s = status(&w);
    assert_eq!(s["running"], true);
    assert_eq!(s["ports"], serde_json::json!([51820]), "only the base port when none is claimed");
    let first = s["mitmdump_pid"].as_i64().unwrap();
    assert!(alive(first));
    let confs: Value =
        serde_json::from_str(&std::fs::read_to_string(w.data().join("wg/client-confs.json")).unwrap()).unwrap();
    assert!(confs.get("51820").is_some(), "client config captured: {confs}");

    // Starting again is a no-op.
    let again = ok(&mut in_ns(&w, &ns, &["daemon", "start", "-d"]));
    assert!(again.contains("already running"), "{again}");

    // Policy changes and SIGHUP reload the running daemon.
    let g0 = generation(&w);
    ok(&mut w.ppp(["policy", "allow", "network", "x.example"]));
    let g1 = generation(&w);
    assert!(g1 > g0, "policy allow reloaded the daemon ({g0} -> {g1})");
    let daemon = s["pid"].as_i64().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon).unwrap()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_for("a reload on SIGHUP", || generation(&w) > g1);

    // Log levels persist in config.yaml; a new proxy level restarts
    // mitmdump on purpose (not counted as a crash) with the new verbosity.
    assert_eq!(ok(&mut w.ppp(["daemon", "log-level"])), "proxy:   info\ngeneral: warn\n");
    let out = ok(&mut w.ppp(["daemon", "log-level", "set", "proxy", "debug"]));
    assert_eq!(
        out,
        "proxy log level set to debug; the running daemon restarts mitmdump to apply it: open connections are \
         cut, and each sandbox's tunnel is back within about 20 s\n"
    );
    wait_for("mitmdump to restart with the new level", || {
        let s = status(&w);
        s["mitmdump_alive"] == true && s["mitmdump_pid"].as_i64() != Some(first)
    });
    let s = status(&w);
    assert_eq!(s["restarts"], 0, "a planned restart is not a crash: {s}");
    let first = s["mitmdump_pid"].as_i64().unwrap();
    let cmdline = std::fs::read_to_string(format!("/proc/{first}/cmdline")).unwrap();
    assert!(cmdline.contains("termlog_verbosity=debug"), "{cmdline:?}");
    assert_eq!(ok(&mut w.ppp(["daemon", "log-level", "general"])), "general: warn\n");
    // The general level restarts nothing.
    let out = ok(&mut w.ppp(["daemon", "log-level", "set", "general", "warn"]));
    assert_eq!(out, "general log level set to warn; the running daemon applies it now\n");
    let yaml = std::fs::read_to_string(w.config().join("config.yaml")).unwrap();
    assert!(yaml.contains("proxy: debug") && yaml.contains("general: warn"), "{yaml}");

    // A crashed mitmdump is restarted, and the restart recorded.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(first).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("mitmdump to be restarted", || {
        let s = status(&w);
        s["restarts"] == 1 && s["mitmdump_alive"] == true && s["mitmdump_pid"].as_i64() != Some(first)
    });
    let s = status(&w);
    assert!(s["last_restart"].as_str().unwrap().contains("SIGKILL"), "{s}");
    let second = s["mitmdump_pid"].as_i64().unwrap();

    // A killed supervisor shows as not running; start recovers, stopping
    // the mitmdump it left behind.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("the supervisor to die", || status(&w)["running"] == false);
    assert!(alive(second), "its mitmdump outlives it");
    // Status tells the truth about it, and stop stops it.
    let s = status(&w);
    assert_eq!(s["orphan_mitmdump_pid"], second, "{s}");
    let text = ok(&mut w.ppp(["daemon", "status"]));
    assert!(text.contains(&format!("mitmdump:  still running (pid {second}), left behind")), "{text}");
    let out = ok(&mut w.ppp(["daemon", "stop"]));
    assert_eq!(
        out,
        format!(
            "the ppp daemon was not running; stopped the mitmdump it left behind (pid {second}), its ports are free\n"
        )
    );
    assert!(!alive(second), "daemon stop stopped the orphan");
    assert_eq!(status(&w)["orphan_mitmdump_pid"], Value::Null);

    // A killed supervisor again: start recovers, stopping the mitmdump it
    // left behind.
    ok(&mut in_ns(&w, &ns, &["daemon", "start", "-d"]));
    let s = status(&w);
    let (daemon, second) = (s["pid"].as_i64().unwrap(), s["mitmdump_pid"].as_i64().unwrap());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("the supervisor to die", || status(&w)["running"] == false);
    let out = ok(&mut in_ns(&w, &ns, &["daemon", "start", "-d"]));
    assert!(out.starts_with("ppp daemon started"), "{out}");
    wait_for("the orphaned mitmdump to go", || !alive(second));
    let third = status(&w)["mitmdump_pid"].as_i64().unwrap();

    // Stop waits until mitmdump is gone; a second stop is a no-op.
    let out = ok(&mut w.ppp(["daemon", "stop"]));
    assert_eq!(out, "ppp daemon stopped; ports 51820 are free\n");
    assert!(!alive(third));
    assert_eq!(status(&w)["running"], false);
    assert!(!w.data().join("secret.sock").exists(), "socket removed");
    let (code, out, _) = output(&mut w.ppp(["daemon", "stop"]));
    assert_eq!((code, out.as_str()), (0, "the ppp daemon is not running\n"));
}

/// Issue 14, point 3: a daemon that cannot start says why. The detached
/// daemon's own error (a socket path too long for a Unix socket) reaches
/// the user with its cause and its hint, not only "it exited".
#[test]
fn a_daemon_that_cannot_start_says_why() {
    let w = World::new();
    let long = w.path().join("d".repeat(120));
    let (code, _, err) =
        output(w.ppp(["daemon", "start", "-d"]).env("PPP_DATA", &long).env("PPP_MITMDUMP", test_mitmdump()));
    assert_eq!(code, 1, "{err}");
    assert!(err.starts_with("error: the daemon exited during start-up"), "{err}");
    assert!(err.contains("caused by: the daemon socket path"), "the child's error is the cause: {err}");
    assert!(err.contains("hint: set `PPP_DATA` to a shorter directory"), "the child's hint: {err}");
}

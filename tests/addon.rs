//! The mitmproxy addon (`assets/addon/`) against the real daemon socket:
//! each test builds a `$PPP_DATA` (policy files, the file secret store, a
//! port registry), serves `secret.sock` in-process, and runs the Python
//! suite `tests/addon/test_addon.py` under pytest in the test venv, which
//! drives the addon's hooks with mitmproxy's own test flows. No network is
//! used. `tests/addon/test_package.py` checks that the entry file loads the
//! package beside it, through mitmproxy's own script loader.
//!
//! Plus one real `mitmdump -s <addon>` start, inside a network namespace with
//! nothing but loopback (needs root and `ip netns`), proving the addon loads.
//!
//! Needs the venv `make test-deps` builds; without it the tests fail rather
//! than skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ppp::dirs::Dirs;
use ppp::proxy::socket::{self, State};
use ppp::proxy::{mitmdump, trust};
use ppp::secret::{Backend, Scope, Settings, Store, Value};

fn venv() -> PathBuf {
    let root = std::env::var_os("PPP_TEST_VENV")
        .filter(|v| !v.is_empty())
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv"), PathBuf::from);
    let python = root.join("bin/python");
    assert!(python.is_file(), "`{}` is missing: run `make test-deps`", python.display());
    root
}

fn dirs(root: &Path) -> Dirs {
    // Short names: the socket path must fit in `sun_path`.
    Dirs { config: root.join("c"), data: root.join("d"), cache: root.join("k") }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// `decision` is `allow`, `deny`, or `pass`: an allow with `inspect: false`.
fn rules_yaml(rules: &[(&str, &str)]) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("rules:\n");
    for (decision, resource) in rules {
        let id = uuid::Uuid::new_v4();
        let (decision, inspect) = if *decision == "pass" { ("allow", "    inspect: false\n") } else { (*decision, "") };
        let _ = write!(
            out,
            "  - id: {id}\n    decision: {decision}\n    type: network\n    resource: \"{resource}\"\n    \
             created_at: 2026-01-01T00:00:00Z\n    source: local\n{inspect}"
        );
    }
    out
}

/// The fixture `tests/addon/test_addon.py` documents in its header.
fn fixture(d: &Dirs) {
    write(
        &d.global_policy(),
        &format!(
            "default: deny\n{}{}",
            rules_yaml(&[
                ("allow", "api.anthropic.com"),
                ("allow", "api.openai.com"),
                ("allow", "jira.example.com"),
                ("allow", "*.allowed.test"),
                ("allow", "10.9.0.0/16"),
                ("deny", "evil.allowed.test"),
            ]),
            // ADR 0050: git.allowed.test (allowed by `*.allowed.test`)
            // takes GET and HEAD under /repos/org/ only.
            "  - id: 5b0c3c9e-8f7a-4c55-9d5e-2f0b6f1c0a50\n    decision: allow\n    type: http\n    \
             resource: git.allowed.test\n    methods: [GET, HEAD]\n    path: /repos/org/**\n    \
             created_at: 2026-01-01T00:00:00Z\n    source: local\n",
        ),
    );
    write(
        &d.sandbox_policy("red-fox"),
        &rules_yaml(&[("allow", "fox-only.test"), ("pass", "pass.test"), ("pass", "keyed.test")]),
    );
    write(&d.sandbox_policy("blue"), &rules_yaml(&[("deny", "www.allowed.test")]));
    registry(d);
    let store = Store::open_with(d, &Settings { backend: Some(Backend::File), age_identity: None }).unwrap();
    let fox = Scope::Sandbox("red-fox".into());
    store.set_service(&Scope::Global, "anthropic", &[], &Value::new("sk-ant-GLOBAL-1111".into())).unwrap();
    store.set_service(&fox, "anthropic", &[], &Value::new("sk-ant-FOX-2222".into())).unwrap();
    store.set_service(&fox, "openai", &[], &Value::new("sk-oai-FOX-3333".into())).unwrap();
    // A service ppp does not know, with its own host: the addon has no
    // table for it, so only the daemon can route its key.
    let usai = ["usai.allowed.test".to_owned()];
    store.set_service(&Scope::Global, "usai", &usai, &Value::new("usai-GLOBAL-5555".into())).unwrap();
    let jira = ["jira.example.com".to_owned()];
    store.set_custom(&Scope::Global, "PPP_JIRA_TOKEN", &jira, None, &Value::new("jira-secret-4444".into())).unwrap();
    // A key for a host red-fox passes through: the daemon inspects it all
    // the same (ADR 0051); the CLI would have refused the pair.
    let keyed = ["keyed.test".to_owned()];
    store.set_service(&fox, "keyed", &keyed, &Value::new("keyed-FOX-6666".into())).unwrap();
}

fn registry(d: &Dirs) {
    write(&d.port_registry(), r#"{"ports": {"51820": "red-fox", "51821": "blue"}}"#);
}

/// The daemon's socket server on its own runtime thread, stopped on drop.
struct Daemon {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Daemon {
    fn start(d: &Dirs) -> Daemon {
        let listener = socket::bind(d).unwrap();
        let store = Store::open_with(d, &Settings { backend: Some(Backend::File), age_identity: None }).unwrap();
        let state = Arc::new(State::new(d.clone(), store).unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(socket::serve(listener, state, async {
                let _ = rx.await;
            }))
        });
        Daemon { stop: Some(tx), thread: Some(thread) }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
            let r = self.thread.take().unwrap().join();
            if !std::thread::panicking() {
                r.unwrap().unwrap();
            }
        }
    }
}

/// The pytest command of the test venv, run from the repository root (its
/// pyproject.toml configures pytest) with `PPP_STATE_DIR=data`.
fn pytest(data: &Path) -> Command {
    let python = venv().join("bin/python");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut c = Command::new(&python);
    c.args(["-m", "pytest", "-p", "no:cacheprovider"])
        .current_dir(root)
        .env("PPP_STATE_DIR", data)
        // The suite imports the package from assets/: no bytecode there,
        // where the build would embed it.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("PPP_DATA")
        .env_remove("PYTEST_ADDOPTS")
        .stdin(Stdio::null());
    c
}

/// Run the named test classes (`Live`: one of `tests/addon/test_addon.py`;
/// `file.py::Class`: another file's) under pytest; returns how many tests
/// passed. Fails unless every collected test passed: none skipped, none
/// failed.
fn python_suite(data: &Path, names: &[&str]) -> usize {
    let ids = names
        .iter()
        .map(|n| if n.contains("::") { format!("tests/addon/{n}") } else { format!("tests/addon/test_addon.py::{n}") });
    let out = pytest(data).arg("-v").args(ids).output().unwrap_or_else(|e| panic!("pytest: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "the addon suite failed");
    // pytest's last line: `===== 51 passed, 3 warnings in 1.20s =====`.
    let summary = stdout.lines().rev().find(|l| l.contains(" passed")).expect("pytest reports how many passed");
    for bad in ["failed", "error", "skipped", "xfail", "xpass", "deselected"] {
        assert!(!summary.contains(bad), "pytest: {summary}");
    }
    summary
        .split(|c: char| !c.is_ascii_alphanumeric())
        .collect::<Vec<_>>()
        .windows(2)
        .find_map(|w| (w[1] == "passed").then(|| w[0].parse::<usize>().ok()).flatten())
        .expect("a count before `passed`")
}

/// Every Python test class, and which test of this file runs it: a class
/// added to tests/addon/ must be run here, or this fails (`DnsLayerTest`
/// was once run by nothing).
const PYTHON_CLASSES: &[&str] = &[
    "test_addon.py::Live",
    "test_addon.py::NoDaemon",
    "test_addon.py::LoopShareTest",
    "test_addon.py::HookDispatchTest",
    "test_addon.py::AskTest",
    "test_addon.py::OffLoopTest",
    "test_addon.py::HttpRulesTest",
    "test_addon.py::DnsLayerTest",
    "test_package.py::PackageTest",
    "test_usage.py::UsageTest",
];

#[test]
fn every_python_test_is_run_here() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let out = pytest(tmp.path()).args(["--collect-only", "-q", "tests/addon"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pytest --collect-only failed:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let mut classes = std::collections::BTreeMap::<String, usize>::new();
    for id in stdout.lines().filter_map(|l| l.strip_prefix("tests/addon/")) {
        let mut parts = id.split("::");
        let (Some(file), Some(class), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            panic!("a Python test outside a class: {id}");
        };
        *classes.entry(format!("{file}::{class}")).or_default() += 1;
    }
    let known: std::collections::BTreeSet<_> = PYTHON_CLASSES.iter().map(|c| (*c).to_owned()).collect();
    let found: std::collections::BTreeSet<_> = classes.keys().cloned().collect();
    assert_eq!(found, known, "Python test classes collected vs run by tests/addon.rs");
    // 74 tests in test_addon.py (70 before the split into a package,
    // then issue 22's), 4 in test_package.py: a test removed shows here.
    let total: usize = classes.values().sum();
    assert!(total >= 78, "only {total} Python tests collected: {classes:?}");
}

#[test]
fn addon_suite_against_the_real_daemon() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let d = dirs(tmp.path());
    fixture(&d);
    let _daemon = Daemon::start(&d);
    let ran = python_suite(&d.data, &["Live"]);
    assert!(ran >= 51, "only {ran} tests ran");
    let flows = std::fs::read_to_string(d.flows_log()).unwrap();
    for secret in ["sk-ant-GLOBAL-1111", "sk-ant-FOX-2222", "sk-oai-FOX-3333", "jira-secret-4444", "keyed-FOX-6666"] {
        assert!(!flows.contains(secret), "flows.jsonl leaks a secret");
    }
    for line in flows.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let t = v["timestamp"].as_str().unwrap();
        assert!(time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).is_ok(), "{t}");
    }
}

#[test]
fn addon_fails_closed_without_a_daemon() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let d = dirs(tmp.path());
    fixture(&d);
    assert_eq!(python_suite(&d.data, &["NoDaemon"]), 1);
}

/// The event loop's sharing between sandboxes (ADR 0020) needs no daemon.
#[test]
fn addon_shares_the_event_loop_between_sandboxes() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let d = dirs(tmp.path());
    fixture(&d);
    assert_eq!(python_suite(&d.data, &["LoopShareTest"]), 6);
}

/// mitmproxy's DNS layer, patched as `load` patches it (issue 22, point
/// 3): answered flows leave it, unanswered ones are bounded, and a UDP DNS
/// connection closes once its queries are answered. Needs no daemon.
#[test]
fn addon_bounds_what_dns_connections_keep() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let d = dirs(tmp.path());
    fixture(&d);
    assert_eq!(python_suite(&d.data, &["DnsLayerTest"]), 5);
}

/// The addon's cache of mitmproxy's hook lookup needs no daemon.
#[test]
fn addon_dispatches_hooks_as_mitmproxy_does() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let d = dirs(tmp.path());
    fixture(&d);
    assert_eq!(python_suite(&d.data, &["HookDispatchTest"]), 4);
}

/// The addon's side of an `ask` default (a stand-in daemon answers).
#[test]
fn addon_holds_what_the_default_leaves_to_the_user() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let d = dirs(tmp.path());
    fixture(&d);
    assert_eq!(python_suite(&d.data, &["AskTest"]), 2);
}

/// A verdict not cached is asked off the event loop (ADR 0023).
#[test]
fn addon_decides_off_the_event_loop() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let d = dirs(tmp.path());
    fixture(&d);
    let _daemon = Daemon::start(&d);
    assert_eq!(python_suite(&d.data, &["OffLoopTest"]), 4);
}

/// HTTP rules (ADR 0050): the addon sends the request's bytes and applies
/// the daemon's answer.
#[test]
fn addon_applies_http_rules() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let d = dirs(tmp.path());
    fixture(&d);
    let _daemon = Daemon::start(&d);
    assert_eq!(python_suite(&d.data, &["HttpRulesTest"]), 2);
}

/// The entry file imports the `ppp_addon` beside it, never another copy
/// already imported or first on the path; needs no daemon.
#[test]
fn addon_entry_loads_its_own_package() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    assert_eq!(python_suite(tmp.path(), &["test_package.py::PackageTest"]), 4);
}

/// Deletes the named network namespace on drop, also when an assertion fails.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// `mitmdump -s addon-<hash>/addon.py` starts a WireGuard server with the addon loaded
/// and logs no error, in a namespace with no route anywhere.
#[test]
fn mitmdump_loads_the_addon() {
    let mitmdump_bin = venv().join("bin/mitmdump");
    assert!(mitmdump_bin.is_file(), "`{}` is missing: run `make test-deps`", mitmdump_bin.display());
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    let d = dirs(tmp.path());
    registry(&d);
    let addon = mitmdump::write_addon(&d, &ppp::assets::addon()).unwrap();
    let ca =
        trust::export(&d, &trust::Source::Files(trust::LINUX_BUNDLES.iter().map(PathBuf::from).collect())).unwrap();
    let mut spec = mitmdump::Spec::new(&d, mitmdump_bin, [51999], addon, ca);
    spec.sets.push(("ppp_state_dir".into(), d.data.display().to_string()));
    spec.sets.push(("console_eventlog_verbosity".into(), "info".into()));
    mitmdump::prepare(&spec).unwrap();
    let inv = mitmdump::command(&spec);

    let ns = format!("ppp-a{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "del", &ns]).stderr(Stdio::null()).status();
    assert!(Command::new("ip").args(["netns", "add", &ns]).status().unwrap().success(), "ip netns add (needs root)");
    let _cleanup = Cleanup(ns.clone());
    let log = tmp.path().join("proxy.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(&inv.program)
        .args(&inv.args)
        .envs(inv.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("listening") {
            break text;
        }
        if start.elapsed() > Duration::from_secs(60) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mitmdump did not start listening:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Give a late load error a moment to show up.
    std::thread::sleep(Duration::from_millis(500));
    let text = std::fs::read_to_string(&log).unwrap_or(text);
    kill(Pid::from_raw(i32::try_from(child.id()).unwrap()), Signal::SIGTERM).unwrap();
    let stopped = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if stopped.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mitmdump ignored SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!text.contains("Traceback") && !text.contains("Error"), "mitmdump logged an error:\n{text}");
    assert!(text.contains("Loading script"), "the addon was not loaded:\n{text}");
}

/// The usage meter's SSE and JSON parsers (issue 27) need no daemon.
#[test]
fn addon_usage_meter_parsers() {
    let tmp = tempfile::Builder::new().prefix("ppp-ad").tempdir().unwrap();
    assert_eq!(python_suite(tmp.path(), &["test_usage.py::UsageTest"]), 11);
}

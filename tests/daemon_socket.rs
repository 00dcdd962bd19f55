//! The daemon socket server end to end: a real `secret.sock` in a temp
//! `$PPP_DATA`, served in-process on a tokio runtime, real policy files and
//! the file secret store, and plain blocking clients like the addon's.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ppp::dirs::Dirs;
use ppp::proxy::socket::{self, State};
use ppp::proxy::{Reload, notify_reload};
use ppp::secret::{Backend, Scope, Settings, Store, Value};
use serde_json::{Value as Json, json};

/// Everything the server logs, from every test in this binary, so tests can
/// assert what is (and is never) written to the log.
fn log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Capture(sink.clone()))
            .try_init();
        buf
    })
    .clone()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged() -> String {
    String::from_utf8_lossy(&log().lock().unwrap()).into_owned()
}

fn file_store(dirs: &Dirs) -> Store {
    // The file backend, chosen in-process: setting `PPP_SECRET_BACKEND`
    // would race the other tests' threads.
    Store::open_with(dirs, &Settings { backend: Some(Backend::File), age_identity: None }).unwrap()
}

struct World {
    tmp: tempfile::TempDir,
    dirs: Dirs,
}

impl World {
    fn new() -> World {
        log();
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs { config: tmp.path().join("c"), data: tmp.path().join("d"), cache: tmp.path().join("k") };
        World { tmp, dirs }
    }

    fn sock(&self) -> PathBuf {
        self.dirs.secret_socket()
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn global(&self, default: &str, rules: &[(&str, &str)]) {
        Self::write(&self.dirs.global_policy(), &format!("default: {default}\nrules:\n{}", rules_yaml(rules)));
    }

    fn sandbox(&self, name: &str, rules: &[(&str, &str)]) {
        Self::write(&self.dirs.sandbox_policy(name), &format!("rules:\n{}", rules_yaml(rules)));
    }

    fn start(&self) -> Daemon {
        Daemon::start(&self.dirs)
    }
}

fn rules_yaml(rules: &[(&str, &str)]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (decision, resource) in rules {
        let id = uuid::Uuid::new_v4();
        let _ = write!(
            out,
            "  - id: {id}\n    decision: {decision}\n    type: network\n    resource: \"{resource}\"\n    \
             created_at: 2026-01-01T00:00:00Z\n    source: local\n"
        );
    }
    out
}

/// A server on its own runtime thread, stopped on drop.
struct Daemon {
    path: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Daemon {
    fn start(dirs: &Dirs) -> Daemon {
        Daemon::start_with(dirs, socket::IDLE_TIMEOUT)
    }

    fn start_with(dirs: &Dirs, idle: Duration) -> Daemon {
        let listener = socket::bind(dirs).unwrap();
        let state = Arc::new(State::new(dirs.clone(), file_store(dirs)).unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(socket::serve_with(
                listener,
                state,
                async {
                    let _ = rx.await;
                },
                idle,
            ))
        });
        Daemon { path: dirs.secret_socket(), stop: Some(tx), thread: Some(thread) }
    }

    fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
            self.thread.take().unwrap().join().unwrap().unwrap();
        }
    }

    fn connect(&self) -> Conn {
        let s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Conn { reader: BufReader::new(s.try_clone().unwrap()), stream: s }
    }

    /// One request on a fresh connection, as a one-shot client does it.
    fn ask(&self, req: &Json) -> Json {
        self.connect().ask(req)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Conn {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Conn {
    fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    fn reply(&mut self) -> Json {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        assert!(line.ends_with('\n'), "a whole reply line, got {line:?}");
        serde_json::from_str(&line).unwrap()
    }

    fn ask(&mut self, req: &Json) -> Json {
        self.send_raw(format!("{req}\n").as_bytes());
        self.reply()
    }
}

fn decide(d: &Daemon, sandbox: &str, host: &str) -> Json {
    d.ask(&json!({"op":"decide","sandbox":sandbox,"host":host,"ip":null,"port":443,"protocol":"tls"}))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn decide_applies_global_and_sandbox_rules() {
    let w = World::new();
    w.global("deny", &[("allow", "*.example.com"), ("deny", "evil.example.com"), ("allow", "10.0.0.0/8")]);
    w.sandbox("red-fox", &[("allow", "api.github.com"), ("deny", "www.example.com")]);
    w.sandbox("blue", &[]);
    std::fs::create_dir_all(w.dirs.sandbox("no-policy")).unwrap();
    let d = w.start();

    let r = decide(&d, "red-fox", "api.github.com");
    assert_eq!(r["ok"], true);
    assert_eq!(r["verdict"], "allow");
    assert_eq!(r["default_used"], false);
    assert_eq!(r["generation"], 1);
    let m = &r["matched_rule"];
    assert_eq!((m["decision"].as_str(), m["resource"].as_str()), (Some("allow"), Some("api.github.com")));
    assert_eq!((m["scope"].as_str(), m["source"].as_str()), (Some("sandbox"), Some("local")));
    assert!(uuid::Uuid::parse_str(m["id"].as_str().unwrap()).is_ok());

    // The sandbox's deny beats the global allow.
    let r = decide(&d, "red-fox", "www.example.com");
    assert_eq!((r["verdict"].as_str(), r["matched_rule"]["scope"].as_str()), (Some("deny"), Some("sandbox")));
    // Another sandbox only has the global allow.
    let r = decide(&d, "blue", "www.example.com");
    assert_eq!((r["verdict"].as_str(), r["matched_rule"]["scope"].as_str()), (Some("allow"), Some("global")));
    // A global deny beats a global allow, for every sandbox.
    let r = decide(&d, "red-fox", "evil.example.com");
    assert_eq!(
        (r["verdict"].as_str(), r["matched_rule"]["resource"].as_str()),
        (Some("deny"), Some("evil.example.com"))
    );
    // An unknown sandbox, or one without a policy file, gets the global rules and default.
    for sb in ["ghost", "no-policy"] {
        let r = decide(&d, sb, "api.github.com");
        assert_eq!(r["verdict"], "deny", "{sb}");
        assert_eq!(r["default_used"], true);
        assert_eq!(r["matched_rule"], Json::Null);
        assert_eq!(decide(&d, sb, "a.example.com")["verdict"], "allow");
    }
    // By address alone, and with no sandbox.
    let r = d.ask(&json!({"op":"decide","sandbox":null,"host":null,"ip":"10.1.2.3","port":22,"protocol":"tcp"}));
    assert_eq!((r["verdict"].as_str(), r["matched_rule"]["resource"].as_str()), (Some("allow"), Some("10.0.0.0/8")));
    let r = d.ask(&json!({"op":"decide","ip":"192.0.2.1","port":53,"protocol":"udp"}));
    assert_eq!((r["verdict"].as_str(), r["default_used"].as_bool()), (Some("deny"), Some(true)));
}

#[test]
fn no_global_file_denies_by_default() {
    let w = World::new();
    let d = w.start();
    let r = decide(&d, "red-fox", "example.com");
    assert_eq!((r["verdict"].as_str(), r["default_used"].as_bool()), (Some("deny"), Some(true)));
}

#[test]
fn reload_swaps_the_policy_and_bumps_the_generation() {
    let w = World::new();
    w.global("deny", &[]);
    let d = w.start();
    assert_eq!(d.ask(&json!({"op":"generation"})), json!({"ok":true,"generation":1}));
    assert_eq!(decide(&d, "red-fox", "x.example")["verdict"], "deny");

    w.global("deny", &[("allow", "x.example")]);
    assert_eq!(decide(&d, "red-fox", "x.example")["verdict"], "deny", "nothing changes before a reload");
    assert_eq!(d.ask(&json!({"op":"reload"})), json!({"ok":true,"generation":2}));
    let r = decide(&d, "red-fox", "x.example");
    assert_eq!((r["verdict"].as_str(), r["generation"].as_u64()), (Some("allow"), Some(2)));

    // A sandbox file that appears after start is picked up too.
    w.sandbox("red-fox", &[("deny", "x.example")]);
    assert_eq!(notify_reload(&w.dirs), Reload::Done, "the CLI's reload client talks to the real server");
    let r = decide(&d, "red-fox", "x.example");
    assert_eq!((r["verdict"].as_str(), r["generation"].as_u64()), (Some("deny"), Some(3)));

    // Malformed files: the old engine keeps answering, the generation stays.
    World::write(&w.dirs.sandbox_policy("red-fox"), "rules:\n  - id: nope\n");
    let r = d.ask(&json!({"op":"reload"}));
    assert_eq!((r["ok"].as_bool(), r["reason"].as_str()), (Some(false), Some("bad-policy")));
    let detail = r["detail"].as_str().unwrap();
    assert!(detail.contains("red-fox/policy.yaml") && detail.contains("line 2"), "{detail}");
    w.sandbox("red-fox", &[]);
    World::write(&w.dirs.global_policy(), "default: maybe\n");
    let r = d.ask(&json!({"op":"reload"}));
    assert_eq!(r["reason"], "bad-policy");
    assert!(r["detail"].as_str().unwrap().contains("policies.yaml` line 1"), "{r}");
    match notify_reload(&w.dirs) {
        Reload::Failed(why) => assert!(why.contains("policies.yaml"), "{why}"),
        other => panic!("{other:?}"),
    }
    let r = decide(&d, "red-fox", "x.example");
    assert_eq!((r["verdict"].as_str(), r["generation"].as_u64()), (Some("deny"), Some(3)));
    assert_eq!(d.ask(&json!({"op":"generation"}))["generation"], 3);
}

/// `modes` lists one WireGuard server per claimed port, exactly as the
/// daemon's command line spells it, or the base port when none is claimed;
/// a malformed registry is an error reply naming the file, not a guess.
#[test]
fn modes_follow_the_port_registry() {
    let w = World::new();
    let d = w.start();
    let keys = |port: u16| format!("wireguard:{}@{port}", w.dirs.wg_keys(port).display());
    assert_eq!(d.ask(&json!({"op":"modes"})), json!({"ok":true,"modes":[keys(51820)]}));
    ppp::sandbox::with_registry(&w.dirs, |r| r.allocate("a")).unwrap();
    ppp::sandbox::with_registry(&w.dirs, |r| r.allocate("b")).unwrap();
    ppp::sandbox::with_registry(&w.dirs, |r| Ok(r.free("a"))).unwrap();
    let claim = |port: u16| ppp::sandbox::PortRegistry::load(&w.dirs).unwrap().claims[&port].clone();
    let keys_of = |port: u16| {
        format!("wireguard:{}@{port}", w.dirs.wg().join(format!("keys-{port}-{}.conf", claim(port))).display())
    };
    assert_eq!(d.ask(&json!({"op":"modes"})), json!({"ok":true,"modes":[keys_of(51821)]}));
    ppp::sandbox::with_registry(&w.dirs, |r| r.allocate("c")).unwrap();
    let spec =
        ppp::proxy::mitmdump::Spec::new(&w.dirs, "mitmdump".into(), [51820, 51821], "addon.py".into(), "ca.pem".into());
    let argv: Vec<String> =
        ppp::proxy::mitmdump::command(&spec).args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    // "c" reuses the port "a" freed, under a claim (and keys) of its own.
    let modes = d.ask(&json!({"op":"modes"}));
    assert_eq!(modes["modes"].as_array().unwrap().len(), 2, "{modes}");
    for m in modes["modes"].as_array().unwrap() {
        assert!(argv.contains(&m.as_str().unwrap().to_owned()), "{m} is spelled as on the command line: {argv:?}");
    }
    World::write(&w.dirs.port_registry(), "{\"ports\": [");
    let r = d.ask(&json!({"op":"modes"}));
    assert_eq!(r["ok"], false, "{r}");
    assert!(r["detail"].as_str().unwrap().contains("port-registry.json"), "{r}");
}

#[test]
fn a_malformed_policy_stops_the_daemon_from_starting() {
    let w = World::new();
    World::write(&w.dirs.global_policy(), "default: deny\nrules: [\n");
    let err = State::new(w.dirs.clone(), file_store(&w.dirs)).unwrap_err();
    assert!(format!("{err:#}").contains("policies.yaml"), "{err:#}");
}

#[test]
fn secrets_sandbox_first_then_global() {
    let w = World::new();
    let store = file_store(&w.dirs);
    let fox = Scope::Sandbox("red-fox".into());
    store.set_service(&Scope::Global, "anthropic", &[], &Value::new("sk-ant-global-0001".into())).unwrap();
    store.set_service(&fox, "anthropic", &[], &Value::new("sk-ant-fox-0002".into())).unwrap();
    store.set_service(&Scope::Global, "github", &[], &Value::new("ghp-global-0003".into())).unwrap();
    let jira = ["jira.example.com".to_owned()];
    store.set_custom(&Scope::Global, "PPP_JIRA_TOKEN", &jira, None, &Value::new("jira-global-0004".into())).unwrap();
    store.set_custom(&fox, "PPP_JIRA_TOKEN", &jira, None, &Value::new("jira-fox-0005".into())).unwrap();
    store.set_custom(&Scope::Global, "PPP_WIKI", &jira, None, &Value::new("wiki-global-0006".into())).unwrap();
    let d = w.start();
    let ask = |service: Json, sandbox: &str, host: &str| {
        d.ask(&json!({"op":"secret","service":service,"sandbox":sandbox,"host":host}))
    };

    assert_eq!(
        ask(json!("anthropic"), "red-fox", "api.anthropic.com"),
        json!({"ok":true,"header":"x-api-key","value":"sk-ant-fox-0002"})
    );
    assert_eq!(
        ask(json!("anthropic"), "blue", "api.anthropic.com"),
        json!({"ok":true,"header":"x-api-key","value":"sk-ant-global-0001"})
    );
    assert_eq!(ask(json!("github"), "red-fox", "api.github.com")["value"], "Bearer ghp-global-0003");
    assert_eq!(ask(json!("openai"), "red-fox", "api.openai.com"), json!({"ok":false,"reason":"no-secret"}));
    assert_eq!(
        ask(json!("anthropic"), "red-fox", "evil.example"),
        json!({"ok":false,"reason":"no-secret"}),
        "a key only goes to its service's hosts"
    );

    // `inject` finds the key by host alone, sandbox scope first.
    let inject = |sandbox: &str, host: &str| d.ask(&json!({"op":"inject","sandbox":sandbox,"host":host}));
    assert_eq!(inject("red-fox", "api.anthropic.com")["value"], "sk-ant-fox-0002");
    assert_eq!(inject("blue", "api.anthropic.com")["value"], "sk-ant-global-0001");
    assert_eq!(inject("red-fox", "api.github.com")["value"], "Bearer ghp-global-0003");
    assert_eq!(inject("red-fox", "evil.example"), json!({"ok":false,"reason":"no-secret"}));

    let subs = json!({"ok":true,"substitutions":[
        {"placeholder":"PPP_JIRA_TOKEN","value":"jira-fox-0005"},
        {"placeholder":"PPP_WIKI","value":"wiki-global-0006"}]});
    assert_eq!(ask(json!(""), "red-fox", "jira.example.com"), subs);
    assert_eq!(d.ask(&json!({"op":"secret","sandbox":"red-fox","host":"jira.example.com"})), subs);
    assert_eq!(ask(Json::Null, "blue", "jira.example.com")["substitutions"][0]["value"], "jira-global-0004");
    assert_eq!(ask(json!(""), "red-fox", "other.example"), json!({"ok":true,"substitutions":[]}));

    let r = ask(json!("anthropic"), "../etc", "api.anthropic.com");
    assert_eq!(r["reason"], "bad-request", "{r}");

    // A store that cannot be decrypted is `locked`, and says nothing more.
    std::fs::remove_file(w.dirs.age_identity()).unwrap();
    assert_eq!(ask(json!("anthropic"), "blue", "api.anthropic.com"), json!({"ok":false,"reason":"locked"}));

    let log = logged();
    for v in ["sk-ant-global-0001", "sk-ant-fox-0002", "ghp-global-0003", "jira-global-0004", "jira-fox-0005"] {
        assert!(!log.contains(v), "the log must never hold a secret value");
    }
}

#[test]
fn socket_is_0600_in_a_0700_dir_and_removed_on_stop() {
    let w = World::new();
    // A data dir the user made world-readable is tightened before binding.
    std::fs::create_dir_all(&w.dirs.data).unwrap();
    std::fs::set_permissions(&w.dirs.data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut d = w.start();
    assert_eq!(mode(&w.dirs.data), 0o700);
    assert_eq!(mode(&w.sock()), 0o600);
    assert_eq!(d.ask(&json!({"op":"generation"}))["ok"], true);
    d.stop();
    assert!(!w.sock().exists(), "a stopped server removes its socket");
    assert_eq!(notify_reload(&w.dirs), Reload::NoDaemon);
}

#[test]
fn a_stale_socket_is_replaced_but_a_live_one_is_not() {
    let w = World::new();
    std::fs::create_dir_all(&w.dirs.data).unwrap();
    // A daemon that died leaves its socket file behind with nobody listening.
    drop(std::os::unix::net::UnixListener::bind(w.sock()).unwrap());
    assert!(w.sock().exists());
    let d = w.start();
    assert_eq!(d.ask(&json!({"op":"generation"}))["ok"], true);

    let err = socket::bind(&w.dirs).unwrap_err();
    let (text, _) = ppp::error::render(&err);
    assert!(text.starts_with("error: another ppp daemon is already serving"), "{text}");
    assert_eq!(d.ask(&json!({"op":"generation"}))["ok"], true, "the first server is untouched");
}

#[test]
fn a_file_in_the_way_is_not_deleted() {
    let w = World::new();
    World::write(&w.sock(), "precious");
    let err = socket::bind(&w.dirs).unwrap_err();
    assert!(format!("{err:#}").contains("is not a socket"), "{err:#}");
    assert_eq!(std::fs::read_to_string(w.sock()).unwrap(), "precious");
}

#[test]
fn bad_input_gets_an_error_and_the_next_request_an_answer() {
    let w = World::new();
    let d = w.start();
    let mut c = d.connect();
    // Random bytes, not even UTF-8, then malformed and unknown requests: one
    // error line each, on the same connection.
    c.send_raw(&[0xff, 0x00, 0x8f, b'{', 0xc3, b'\n']);
    assert_eq!(c.reply()["reason"], "bad-request");
    for bad in ["{\"op\":", "[1,2]", "{\"op\":\"fly\"}", "{\"op\":\"decide\",\"port\":99999}", ""] {
        let r = {
            c.send_raw(format!("{bad}\n").as_bytes());
            c.reply()
        };
        assert_eq!((r["ok"].as_bool(), r["reason"].as_str()), (Some(false), Some("bad-request")), "{bad}");
        assert!(r["detail"].is_string(), "{r}");
    }
    assert_eq!(c.ask(&json!({"op":"generation"})), json!({"ok":true,"generation":1}));

    // Truncated JSON: the client stops mid-line and shuts its side; the
    // unterminated line is still answered.
    let mut c = d.connect();
    c.send_raw(b"{\"op\":\"gener");
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(c.reply()["reason"], "bad-request");
    // A client that vanishes mid-line gets nothing and harms nothing.
    let mut c = d.connect();
    c.send_raw(b"{\"op\":\"reload\",\"sand");
    drop(c);
    // An unterminated but complete request is answered too.
    let mut c = d.connect();
    c.send_raw(b"{\"op\":\"generation\"}");
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(c.reply(), json!({"ok":true,"generation":1}));
    assert_eq!(d.ask(&json!({"op":"generation"}))["ok"], true);
}

#[test]
fn a_10_mib_line_is_refused_without_being_buffered() {
    let w = World::new();
    let d = w.start();
    let mut c = d.connect();
    c.stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0usize;
    let mut write_failed = false;
    for _ in 0..160 {
        if c.stream.write_all(&chunk).is_err() {
            write_failed = true;
            break;
        }
        sent += chunk.len();
    }
    // The server stopped reading just past 64 KiB and closed: the 10 MiB
    // could never all be written, so it was never all held in memory.
    assert!(write_failed, "the server kept reading: {sent} bytes accepted");
    assert!(sent < 4 * 1024 * 1024, "{sent}");
    assert_eq!(
        c.reply(),
        json!({"ok":false,"reason":"too-large","detail":"a request line may have at most 65536 bytes"})
    );
    let mut rest = Vec::new();
    let _ = c.reader.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the connection is closed after too-large");
    assert_eq!(d.ask(&json!({"op":"generation"}))["ok"], true, "the next connection is answered");
}

#[test]
fn several_requests_share_one_connection() {
    let w = World::new();
    w.global("allow", &[("deny", "x.example")]);
    let d = w.start();
    let mut c = d.connect();
    // Pipelined: three lines in one write, replies in order with ids echoed.
    c.send_raw(
        concat!(
            r#"{"op":"generation","id":1}"#,
            "\n",
            r#"{"id":"two","op":"decide","sandbox":"a","host":"x.example","port":443}"#,
            "\n",
            r#"{"op":"nope","id":[3]}"#,
            "\n"
        )
        .as_bytes(),
    );
    assert_eq!(c.reply(), json!({"ok":true,"generation":1,"id":1}));
    let r = c.reply();
    assert_eq!((r["verdict"].as_str(), r["id"].as_str()), (Some("deny"), Some("two")));
    let r = c.reply();
    assert_eq!((r["reason"].as_str(), &r["id"]), (Some("bad-request"), &json!([3])));
    // And later requests on the same connection, including a reload.
    for i in 0..50 {
        let r = c.ask(&json!({"op":"decide","sandbox":"a","host":format!("h{i}.example"),"port":443}));
        assert_eq!(r["verdict"], "allow");
    }
    assert_eq!(c.ask(&json!({"op":"reload"})), json!({"ok":true,"generation":2}));
    assert_eq!(c.ask(&json!({"op":"generation"})), json!({"ok":true,"generation":2}));
}

#[test]
fn idle_and_slow_connections_are_closed() {
    let w = World::new();
    let d = Daemon::start_with(&w.dirs, Duration::from_millis(300));
    let mut idle = d.connect();
    assert_eq!(idle.ask(&json!({"op":"generation"}))["ok"], true);
    // A client that dribbles a line without finishing it is cut off too.
    let mut slow = d.connect();
    slow.send_raw(b"{\"op\":");
    for c in [&mut idle, &mut slow] {
        let mut rest = Vec::new();
        let start = std::time::Instant::now();
        c.reader.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty() && start.elapsed() < Duration::from_secs(5), "closed without a reply");
    }
    assert_eq!(d.ask(&json!({"op":"generation"}))["ok"], true);
}

#[test]
fn many_clients_at_once() {
    let w = World::new();
    w.global("deny", &[("allow", "ok.example")]);
    let d = Arc::new(w.start());
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let d = d.clone();
            std::thread::spawn(move || {
                let mut c = d.connect();
                for _ in 0..20 {
                    let r = c.ask(&json!({"op":"decide","sandbox":format!("s{i}"),"host":"ok.example","port":443}));
                    assert_eq!(r["verdict"], "allow");
                    if i == 0 {
                        assert_eq!(c.ask(&json!({"op":"reload"}))["ok"], true);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(d.ask(&json!({"op":"generation"}))["generation"], 21);
}

/// Env var naming the socket [`other_uid_client`] should connect to.
const PEER_SOCKET: &str = "PPP_TEST_PEER_SOCKET";

/// Not a test on its own: the client half of [`another_uid_is_refused`],
/// which runs this test binary again as uid 65534 with [`PEER_SOCKET`] set.
/// Without the variable it has nothing to do.
#[test]
fn other_uid_client() {
    let Some(path) = std::env::var_os(PEER_SOCKET) else { return };
    let mut s = UnixStream::connect(path).expect("connect as the other uid");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(b"{\"op\":\"generation\"}\n");
    let mut line = String::new();
    let _ = BufReader::new(&s).read_line(&mut line);
    // libtest may print `test … ` before this on the same line.
    println!("REPLY:{}", line.trim_end());
}

#[test]
fn another_uid_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "another_uid_is_refused needs root: it runs a client as uid 65534 (CI runs as root)"
    );
    let w = World::new();
    let d = w.start();
    // Open the path to everyone for this test only, so the other uid's
    // connect succeeds and the server's own peer check is what refuses it.
    for dir in [w.tmp.path(), w.dirs.data.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(w.sock(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "other_uid_client", "--nocapture", "--test-threads=1"])
        .env(PEER_SOCKET, w.sock())
        .output()
        .expect("run setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let reply =
        stdout.lines().find_map(|l| l.split_once("REPLY:").map(|(_, r)| r)).expect("the client printed its reply");
    let reply: Json = serde_json::from_str(reply).unwrap();
    assert_eq!((reply["ok"].as_bool(), reply["reason"].as_str()), (Some(false), Some("forbidden")), "{reply}");
    assert!(logged().contains("refused a connection from uid 65534"), "the refusal is logged");
    assert_eq!(
        d.ask(&json!({"op":"generation"})),
        json!({"ok":true,"generation":1}),
        "the daemon's uid still gets answers"
    );
}

/// The decide reply says when the destination is one of the host's own
/// addresses (`local: true`, issue 28): the addon logs it, so `ppp policy
/// replay` judges such a flow as internal, as the daemon did. Loopback is
/// always one of them; a public address is not. Before the fix the reply
/// had no `local` at all.
#[test]
fn decide_says_when_the_destination_is_the_hosts_own() {
    let w = World::new();
    w.global("deny", &[("allow", "127.0.0.1"), ("allow", "93.184.216.34")]);
    let d = w.start();
    let ask = |ip: &str| d.ask(&json!({"op":"decide","sandbox":"red","host":null,"ip":ip,"port":80,"protocol":"tcp"}));
    let own = ask("127.0.0.1");
    assert_eq!((own["verdict"].as_str(), own["local"].as_bool()), (Some("allow"), Some(true)), "{own}");
    let public = ask("93.184.216.34");
    assert_eq!(public["verdict"], "allow", "{public}");
    assert!(public.get("local").is_none(), "only the host's own: {public}");
}

/// The budget check on `meter` (ADR 0055): a line counted once per flow,
/// the refusal once the sandbox's use reaches the limit, another sandbox
/// untouched, a bad budgets.yaml on reload keeping the old budgets (and
/// the reload saying why), a raise live on the next request.
#[test]
fn meter_replies_carry_the_budget_a_request_is_past() {
    let w = World::new();
    let budgets = |tokens: &str| format!("budgets:\n  - scope: red\n    tokens: {tokens}\n    per: day\n");
    World::write(&w.dirs.budgets(), &budgets("10"));
    let d = w.start();
    let meter = |sandbox: &str| {
        d.ask(&json!({"op":"meter","sandbox":sandbox,"host":"api.anthropic.com","port":443,"method":"POST","path":"/v1/messages"}))
    };
    let usage = |flow: &str| {
        let r = d.ask(&json!({"op":"usage","sandbox":"red","provider":"anthropic","model":"m","input":6,"flow":flow}));
        assert_eq!(r["ok"], true, "{r}");
    };
    assert_eq!(meter("red")["meter"]["provider"], "anthropic");
    assert!(meter("red")["meter"].get("over").is_none());
    // One flow reported twice is one request: 6 tokens, under 10.
    usage("f1");
    usage("f1");
    assert!(meter("red")["meter"].get("over").is_none(), "counted once");
    usage("f2");
    let over = meter("red")["meter"]["over"].clone();
    assert_eq!((over["status"].as_u64(), over["ask"].as_bool()), (Some(429), Some(false)), "{over}");
    let message = over["message"].as_str().unwrap();
    assert!(message.contains("sandbox `red` is used up: 12 tokens of 10 tokens today"), "{message}");
    let body: Json = serde_json::from_str(over["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert!(meter("blue")["meter"].get("over").is_none(), "blue has no budget");

    World::write(&w.dirs.budgets(), &budgets("lots"));
    let r = d.ask(&json!({"op":"reload"}));
    assert_eq!(r["reason"], "bad-policy", "{r}");
    assert!(r["detail"].as_str().unwrap().contains("budgets.yaml` line 3"), "{r}");
    assert_eq!(meter("red")["meter"]["over"]["status"], 429, "the old budgets stand");
    World::write(&w.dirs.budgets(), &budgets("1k"));
    assert_eq!(d.ask(&json!({"op":"reload"}))["ok"], true);
    assert!(meter("red")["meter"].get("over").is_none(), "raised");

    // A cost budget: model `m` has no price, so 12 tokens cost nothing
    // known; once the user prices it ($1 a token), a reload re-prices the
    // totals and the budget is past.
    World::write(&w.dirs.budgets(), "budgets:\n  - scope: red\n    cost_usd: 5\n    per: total\n");
    assert_eq!(d.ask(&json!({"op":"reload"}))["ok"], true);
    assert!(meter("red")["meter"].get("over").is_none(), "unpriced");
    World::write(
        &w.dirs.usage_prices(),
        "date: 2026-12-01\ncurrency: USD\nprices:\n  - {provider: anthropic, model: m, input: 1000000, output: 1000000}\n",
    );
    assert_eq!(d.ask(&json!({"op":"reload"}))["ok"], true);
    let message = meter("red")["meter"]["over"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("$12.00 of $5.00 in total"), "{message}");
}

/// `budget_hold` (ADR 0055): two identical requests past an `ask` budget
/// share one entry, listed as a budget's; one approval releases both and
/// raises the budget once (10 → 20, not 30), so with 25 used both still
/// get the 429, naming the raise. With a global `deny` budget also past,
/// an approval raises the sandbox's own and the request is still refused
/// by the global one.
#[test]
fn an_approved_budget_hold_raises_once_and_never_a_deny_budget() {
    let w = World::new();
    World::write(&w.dirs.budgets(), "budgets:\n  - scope: red\n    tokens: 10\n    per: day\n    on_exceed: ask\n");
    let d = w.start();
    let usage = |flow: &str, n: u64| {
        let r = d.ask(&json!({"op":"usage","sandbox":"red","provider":"anthropic","model":"m","input":n,"flow":flow}));
        assert_eq!(r["ok"], true, "{r}");
    };
    usage("f1", 25);
    let hold = json!({"op":"budget_hold","sandbox":"red","host":"api.anthropic.com","port":443,"method":"POST","path":"/v1/messages?x=1"});
    let mut conns: Vec<Conn> = (0..2).map(|_| d.connect()).collect();
    for conn in &mut conns {
        conn.send_raw(format!("{hold}\n").as_bytes());
    }
    let listed = |d: &Daemon| d.ask(&json!({"op":"approvals"}))["approvals"].as_array().cloned().unwrap_or_default();
    let start = std::time::Instant::now();
    while listed(&d).first().is_none_or(|p| p["count"] != 2) {
        assert!(start.elapsed() < Duration::from_secs(10), "{:?}", listed(&d));
        std::thread::sleep(Duration::from_millis(20));
    }
    let entry = listed(&d)[0].clone();
    assert_eq!((entry["path"].as_str(), entry["method"].as_str()), (Some("/v1/messages"), Some("POST")), "{entry}");
    assert!(entry["budget"].as_str().unwrap().contains("sandbox `red` is used up"), "{entry}");
    let r = d.ask(&json!({"op":"answer","approval":entry["id"],"verdict":"allow"}));
    assert_eq!(r["released"], 2, "{r}");
    for conn in &mut conns {
        let r = conn.reply();
        let over = &r["meter"]["over"];
        assert_eq!((over["status"].as_u64(), over["ask"].as_bool()), (Some(429), Some(false)), "{r}");
        let m = over["message"].as_str().unwrap();
        assert!(m.contains("25 tokens of 20 tokens today (raised once from 10 tokens)"), "{m}");
    }

    // Under the raised 20 now? No: 25. A global deny budget beside it:
    // an approval raises red's own again, and the global one refuses.
    World::write(
        &w.dirs.budgets(),
        "budgets:\n  - scope: red\n    tokens: 10\n    per: day\n    on_exceed: ask\n  - scope: global\n    tokens: 20\n    per: day\n",
    );
    assert_eq!(d.ask(&json!({"op":"reload"}))["ok"], true);
    let mut third = d.connect();
    third.send_raw(format!("{hold}\n").as_bytes());
    let start = std::time::Instant::now();
    while listed(&d).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    }
    let id = listed(&d)[0]["id"].clone();
    assert_eq!(d.ask(&json!({"op":"answer","approval":id,"verdict":"allow"}))["released"], 1);
    let r = third.reply();
    let m = r["meter"]["over"]["message"].as_str().unwrap();
    assert!(m.contains("the global daily token budget"), "{m}");
}

//! The secret store against real backends: a real Secret Service
//! (gnome-keyring in a private D-Bus session) and real age files, checked
//! from outside ppp with `secret-tool` and the `age` CLI.
//!
//! The keychain tests cannot run in this process: `keyring` connects to the
//! session bus once per process, and this process's bus (if any) is the
//! developer's own. So the outer test re-runs this test binary, filtered to
//! `#[ignore]`d inner tests, under `dbus-run-session` and
//! `tests/support/with-secret-service.sh` with a fresh HOME, and asserts that
//! each inner test ran and passed. The inner tests refuse to run anywhere
//! else, so `cargo test -- --ignored` cannot write to a real keyring.
//!
//! Tools: dbus-run-session, dbus-send, gnome-keyring-daemon, secret-tool,
//! age, age-keygen. A missing one fails the test with an install hint; no
//! test skips.

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ppp::dirs::Dirs;
use ppp::secret::{self, Backend, Kind, Scope, Settings, Store, Value};

/// Set by the outer tests in the child's environment; the inner tests check it.
const INSIDE_SECRET_SERVICE: &str = "PPP_TEST_INSIDE_SECRET_SERVICE";
const WITHOUT_SESSION_BUS: &str = "PPP_TEST_WITHOUT_SESSION_BUS";

const APT_HINT: &str = "apt-get install -y dbus-daemon dbus-bin gnome-keyring libsecret-tools age";

/// Temp roots for one test, laid out like a real install.
struct Ctx {
    tmp: tempfile::TempDir,
    dirs: Dirs,
}

fn ctx() -> Ctx {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = Dirs {
        config: tmp.path().join("config/ppp"),
        data: tmp.path().join("data/ppp"),
        cache: tmp.path().join("cache/ppp"),
    };
    Ctx { tmp, dirs }
}

fn open(dirs: &Dirs, backend: Option<Backend>) -> Store {
    Store::open_with(dirs, &Settings { backend, age_identity: None }).unwrap()
}

/// A fresh value nobody else could have written, so finding it proves where
/// it went and not finding it proves where it did not.
fn fresh(label: &str) -> String {
    format!("sk-{label}-{}", uuid::Uuid::new_v4().simple())
}

fn value(s: &str) -> Value {
    Value::new(s.to_owned())
}

fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` is not installed; this test needs it (Debian: {APT_HINT})"))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

/// Every file under `roots` whose bytes contain one of `secrets`, and every
/// file looked at.
fn plaintext_hits(roots: &[&Path], secrets: &[&str]) -> (Vec<String>, Vec<PathBuf>) {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, files);
            } else {
                files.push(p);
            }
        }
    }
    let mut files = Vec::new();
    for r in roots {
        walk(r, &mut files);
    }
    let mut hits = Vec::new();
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        for s in secrets {
            if bytes.windows(s.len()).any(|w| w == s.as_bytes()) {
                hits.push(format!("{} holds a secret value", f.display()));
            }
        }
    }
    (hits, files)
}

fn assert_no_plaintext(dirs: &Dirs, secrets: &[&str], must_cover: &[PathBuf]) {
    let (hits, files) = plaintext_hits(&[&dirs.data, &dirs.config], secrets);
    assert_eq!(hits, Vec::<String>::new());
    for p in must_cover {
        assert!(files.contains(p), "the scan missed `{}`; scanned {files:?}", p.display());
    }
}

/// What the Secret Service holds under `key`, asked with libsecret's CLI.
fn secret_tool_lookup(key: &str) -> Option<String> {
    let out = Command::new(tool("secret-tool")).args(["lookup", "service", key, "username", "ppp"]).output().unwrap();
    // secret-tool exits 1 with no output when nothing matches.
    if !out.status.success() && out.stdout.is_empty() {
        return None;
    }
    assert!(out.status.success(), "secret-tool lookup {key}: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8(out.stdout).unwrap())
}

/// The plaintext map inside `secrets.age`, decrypted with the `age` CLI.
fn age_decrypt(file: &Path, identity: &Path) -> serde_json::Map<String, serde_json::Value> {
    let out = Command::new(tool("age")).arg("--decrypt").arg("-i").arg(identity).arg(file).output().unwrap();
    assert!(out.status.success(), "age --decrypt: {}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["version"], 1);
    doc["secrets"].as_object().unwrap().clone()
}

/// Reads what a backend holds under a key, without going through ppp.
type Peek<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The behaviour every backend must show, against one store. `peek` reads a
/// key straight from the backend.
struct Scenario<'a> {
    store: &'a Store,
    dirs: &'a Dirs,
    peek: Peek<'a>,
    sandbox: String,
    boxed: Scope,
    /// Global anthropic, sandbox anthropic, global usai, custom, and the
    /// global anthropic that replaces the first.
    values: [String; 5],
}

impl Scenario<'_> {
    fn v(&self, i: usize) -> &str {
        &self.values[i]
    }

    fn get(&self, scope: &Scope, name: &str, kind: Kind) -> Option<String> {
        let got = self.store.get(scope, name, kind).unwrap();
        got.map(|v| v.expose().to_owned())
    }

    fn lookup(&self, sandbox: Option<&str>, service: &str) -> Option<(Scope, String)> {
        let got = self.store.lookup(sandbox, service).unwrap();
        got.map(|(scope, v)| (scope, v.expose().to_owned()))
    }

    fn inject(&self, sandbox: Option<&str>, svc: &str, host: &str) -> Option<(Scope, String, String)> {
        let got = self.store.header_for(sandbox, svc, host).unwrap();
        got.map(|i| (i.scope, i.header, i.value.expose().to_owned()))
    }

    fn peek(&self, key: &str) -> Option<String> {
        (self.peek)(key)
    }

    fn set(&self, scope: &Scope, service: &str, hosts: &[&str], v: &str) -> anyhow::Result<()> {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        self.store.set_service(scope, service, &hosts, &value(v))
    }

    fn starts_empty(&self) {
        let store = self.store;
        assert!(store.list().unwrap().is_empty());
        assert_eq!(self.get(&Scope::Global, "anthropic", Kind::Service), None);
        assert_eq!(self.lookup(Some(&self.sandbox), "anthropic"), None);
        assert!(!store.exists(&Scope::Global, "anthropic", Kind::Service).unwrap());
    }

    fn write_and_read(&self) {
        let (g, s, u, c) = (self.v(0), self.v(1), self.v(2), self.v(3));
        self.set(&Scope::Global, "anthropic", &[], g).unwrap();
        self.set(&self.boxed, "anthropic", &[], s).unwrap();
        self.set(&Scope::Global, "usai", &["API.gsa.usai.gov"], u).unwrap();
        let err = self.set(&Scope::Global, "usai2", &[], u).unwrap_err();
        assert!(format!("{err:#}").contains("its hosts must be given"), "{err:#}");
        let jira = ["jira.example.com".to_owned()];
        self.store.set_custom(&Scope::Global, "PPP_JIRA_TOKEN", &jira, Some("JIRA_TOKEN"), &value(c)).unwrap();

        // The values really are in the backend, under the documented keys.
        assert_eq!(self.peek("ppp.anthropic").as_deref(), Some(g));
        assert_eq!(self.peek(&format!("ppp.{}.anthropic", self.sandbox)).as_deref(), Some(s));
        assert_eq!(self.peek("ppp.usai").as_deref(), Some(u));
        assert_eq!(self.peek("ppp.custom.PPP_JIRA_TOKEN").as_deref(), Some(c));

        let some = |v: &str| Some(v.to_owned());
        assert_eq!(self.get(&Scope::Global, "anthropic", Kind::Service), some(g));
        assert_eq!(self.get(&self.boxed, "anthropic", Kind::Service), some(s));
        assert_eq!(self.get(&Scope::Global, "PPP_JIRA_TOKEN", Kind::Custom), some(c));
        assert_eq!(self.get(&self.boxed, "usai", Kind::Service), None, "get reads one scope");
    }

    fn lookup_and_inject(&self) {
        let (g, s, u, c) = (self.v(0), self.v(1), self.v(2), self.v(3));
        let sb = Some(self.sandbox.as_str());
        let global = |v: &str| Some((Scope::Global, v.to_owned()));
        // The sandbox's own key first, then the global one.
        assert_eq!(self.lookup(sb, "anthropic"), Some((self.boxed.clone(), s.to_owned())));
        assert_eq!(self.lookup(Some("other-box"), "anthropic"), global(g));
        assert_eq!(self.lookup(None, "anthropic"), global(g));
        assert_eq!(self.lookup(sb, "usai"), global(u));
        assert_eq!(self.lookup(None, "openai"), None);

        // What the daemon will answer the addon with.
        assert_eq!(
            self.inject(sb, "anthropic", "api.anthropic.com"),
            Some((self.boxed.clone(), "x-api-key".into(), s.to_owned()))
        );
        assert_eq!(self.inject(sb, "anthropic", "api.openai.com"), None);
        assert_eq!(
            self.inject(None, "usai", "api.gsa.usai.gov"),
            Some((Scope::Global, "authorization".into(), format!("Bearer {u}")))
        );
        let subs = self.store.substitutions(sb, "jira.example.com").unwrap();
        let subs: Vec<_> = subs.iter().map(|s| (s.placeholder.as_str(), s.value.expose())).collect();
        assert_eq!(subs, [("PPP_JIRA_TOKEN", c)]);
        assert!(self.store.substitutions(sb, "api.anthropic.com").unwrap().is_empty());
    }

    fn check_index(&self) {
        let b = self.store.backend();
        let list = self.store.list().unwrap();
        let summary: Vec<_> = list
            .iter()
            .map(|e| {
                let header = e.header.as_deref().unwrap_or("-");
                let row = format!("{} {} {} {} [{header}]", e.scope, e.kind, e.name, e.hosts.join(","));
                (row, e.backend)
            })
            .collect();
        let sb = &self.sandbox;
        assert_eq!(
            summary,
            [
                ("global service anthropic api.anthropic.com [x-api-key]".into(), b),
                ("global service usai api.gsa.usai.gov [authorization: Bearer]".into(), b),
                ("global custom PPP_JIRA_TOKEN jira.example.com [-]".into(), b),
                (format!("{sb} service anthropic api.anthropic.com [x-api-key]"), b),
            ]
        );
        assert_eq!(list[2].placeholder.as_deref(), Some("PPP_JIRA_TOKEN"));
        assert_eq!(list[2].env.as_deref(), Some("JIRA_TOKEN"));
        let age = time::OffsetDateTime::now_utc() - list[0].created_at;
        let recent = age < time::Duration::minutes(5) && age > -time::Duration::minutes(1);
        assert!(recent, "created_at {}", list[0].created_at);
        let text = std::fs::read_to_string(self.dirs.secrets_index()).unwrap();
        assert!(text.contains(&format!("\"backend\": \"{b}\"")), "{text}");
        assert_eq!(mode(&self.dirs.secrets_index()), 0o600);
    }

    fn overwrite_and_remove(&self) {
        let (g2, store) = (self.v(4), self.store);
        // Setting again replaces the value and keeps one entry.
        self.set(&Scope::Global, "anthropic", &[], g2).unwrap();
        assert_eq!(self.get(&Scope::Global, "anthropic", Kind::Service).as_deref(), Some(g2));
        assert_eq!(self.peek("ppp.anthropic").as_deref(), Some(g2));
        assert_eq!(store.list().unwrap().len(), 4);
        assert!(store.exists(&self.boxed, "anthropic", Kind::Service).unwrap());
        let all: Vec<&str> = self.values.iter().map(String::as_str).collect();
        assert_no_plaintext(self.dirs, &all, &[self.dirs.secrets_index()]);

        // The sandbox's key goes; lookup falls back to the global one.
        assert!(store.remove(&self.boxed, "anthropic", Kind::Service).unwrap());
        assert!(!store.remove(&self.boxed, "anthropic", Kind::Service).unwrap());
        assert_eq!(self.peek(&format!("ppp.{}.anthropic", self.sandbox)), None);
        let found = self.lookup(Some(&self.sandbox), "anthropic");
        assert_eq!(found, Some((Scope::Global, g2.to_owned())));
        assert!(store.remove(&Scope::Global, "PPP_JIRA_TOKEN", Kind::Custom).unwrap());
        assert_eq!(self.peek("ppp.custom.PPP_JIRA_TOKEN"), None);
        assert_eq!(store.list().unwrap().len(), 2);
    }

    fn refuse_bad_input(&self) {
        let g = self.v(0);
        // Bad names are refused, quoting the name and never the value.
        let err = self.set(&Scope::Sandbox("custom".into()), "anthropic", &[], g).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("reserved") && !text.contains(g), "{text}");
        let err = self.set(&Scope::Global, "anthropic", &[], &format!("{g}\n")).unwrap_err();
        let (text, _) = ppp::error::render(&err);
        assert!(text.contains("control character") && !text.contains(g), "{text}");
    }
}

/// Run the scenario; returns the values written, for the caller's own checks.
fn scenario(store: &Store, dirs: &Dirs, peek: Peek<'_>) -> Vec<String> {
    let sandbox = format!("box-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let sc = Scenario {
        store,
        dirs,
        peek,
        boxed: Scope::Sandbox(sandbox.clone()),
        sandbox,
        values: ["global", "sandbox", "usai", "custom", "global2"].map(fresh),
    };
    sc.starts_empty();
    sc.write_and_read();
    sc.lookup_and_inject();
    sc.check_index();
    sc.overwrite_and_remove();
    sc.refuse_bad_input();
    sc.values.to_vec()
}

#[test]
fn file_backend() {
    let cx = ctx();
    let store = open(&cx.dirs, Some(Backend::File));
    assert_eq!(store.backend(), Backend::File);
    store.list().unwrap();
    assert!(!cx.dirs.data.exists() && !cx.dirs.config.exists(), "opening and reading must create nothing");

    let secrets_file = cx.dirs.secrets_file();
    let identity = cx.dirs.age_identity();
    let peek = |key: &str| age_decrypt(&secrets_file, &identity).get(key).map(|v| v.as_str().unwrap().to_owned());
    let values = scenario(&store, &cx.dirs, &peek);

    assert_eq!(mode(&secrets_file), 0o600);
    assert_eq!(mode(&cx.dirs.data), 0o700);
    assert_eq!(mode(&identity), 0o600);
    assert_eq!(mode(&cx.dirs.config), 0o700);
    assert_ne!(secrets_file.parent(), identity.parent(), "lock and key live in different roots");
    let bytes = std::fs::read(&secrets_file).unwrap();
    assert!(bytes.starts_with(b"age-encryption.org/v1\n-> X25519 "), "an x25519 age file, not scrypt");
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    assert_no_plaintext(&cx.dirs, &refs, &[secrets_file.clone(), identity.clone(), cx.dirs.secrets_index()]);
    // The identity is in age-keygen's format: the public key it names is the
    // one `age-keygen -y` derives.
    let out = Command::new(tool("age-keygen")).arg("-y").arg(&identity).output().unwrap();
    assert!(out.status.success());
    let text = std::fs::read_to_string(&identity).unwrap();
    let public = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(&format!("# public key: {}", public.trim())), "{text}");
}

#[test]
fn file_backend_with_an_identity_from_age_keygen() {
    let cx = ctx();
    let key = cx.tmp.path().join("keys/ppp.txt");
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    let out = Command::new(tool("age-keygen")).arg("-o").arg(&key).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();

    // `PPP_AGE_IDENTITY` as the daemon would read it from its environment.
    let settings = Settings::resolve(|k| match k {
        "PPP_SECRET_BACKEND" => Some("file".into()),
        "PPP_AGE_IDENTITY" => Some(key.clone().into()),
        _ => None,
    })
    .unwrap();
    let store = Store::open_with(&cx.dirs, &settings).unwrap();
    let v = fresh("keygen");
    store.set_service(&Scope::Global, "openai", &[], &value(&v)).unwrap();
    assert_eq!(age_decrypt(&cx.dirs.secrets_file(), &key)["ppp.openai"], v.as_str());
    assert!(!cx.dirs.age_identity().exists(), "a given identity replaces the default one");

    // Without it the file is locked, and says so rather than reading as empty.
    let store = open(&cx.dirs, Some(Backend::File));
    let err = store.get(&Scope::Global, "openai", Kind::Service).unwrap_err();
    assert!(secret::is_unavailable(&err), "{err:#}");
    let err = store.set_service(&Scope::Global, "groq", &[], &value(&v)).unwrap_err();
    assert!(secret::is_unavailable(&err), "{err:#}");
    assert!(!cx.dirs.age_identity().exists(), "must not mint a new key over existing secrets");
}

#[test]
fn concurrent_writers_lose_nothing() {
    // Each set is a read-modify-write of the index and of secrets.age; only
    // `state.lock` keeps two writers from dropping each other's entry.
    let cx = ctx();
    let expected: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|t| {
                let dirs = &cx.dirs;
                s.spawn(move || {
                    let store = open(dirs, Some(Backend::File));
                    (0..3)
                        .map(|i| {
                            let name = format!("svc-{t}-{i}");
                            let v = fresh(&name);
                            store.set_service(&Scope::Global, &name, &["api.example.com".into()], &value(&v)).unwrap();
                            (name, v)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let store = open(&cx.dirs, Some(Backend::File));
    assert_eq!(store.list().unwrap().len(), expected.len());
    for (name, v) in &expected {
        assert_eq!(store.get(&Scope::Global, name, Kind::Service).unwrap().unwrap().expose(), v);
    }
}

#[test]
fn plaintext_scan_finds_a_planted_value() {
    // The no-plaintext assertions are only worth something if the scan can
    // fail: plant a value and see it found.
    let cx = ctx();
    let v = fresh("planted");
    let p = cx.dirs.data.join("sandboxes/x/leak.log");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, format!("header: {v}\n")).unwrap();
    let (hits, files) = plaintext_hits(&[&cx.dirs.data, &cx.dirs.config], &[&v]);
    assert_eq!(files, std::slice::from_ref(&p));
    assert_eq!(hits, [format!("{} holds a secret value", p.display())]);
}

/// Run this test binary's `inner` tests in a child with `env`, under
/// `wrapper` (if any), and assert each one ran and passed.
fn run_inner(names: &[&str], wrapper: &[PathBuf], env: &[(&str, &Path)], marker: &str) {
    let cx = ctx();
    let out_path = cx.tmp.path().join("child.out");
    let out = std::fs::File::create(&out_path).unwrap();
    let exe = std::env::current_exe().unwrap();
    let (program, pre) = match wrapper.split_first() {
        Some((p, rest)) => (p.clone(), rest.to_vec()),
        None => (exe.clone(), Vec::new()),
    };
    let mut cmd = Command::new(program);
    cmd.args(&pre);
    if !wrapper.is_empty() {
        cmd.arg(&exe);
    }
    cmd.arg("--exact")
        .args(names)
        .args(["--ignored", "--nocapture", "--test-threads=1"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUST_BACKTRACE", "1")
        .env(marker, "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        // Its own process group, so a hung run can be killed whole.
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let pgid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            let mut text = String::new();
            std::fs::File::open(&out_path).unwrap().read_to_string(&mut text).unwrap();
            panic!("the inner tests did not finish within 180 s:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&out_path).unwrap();
    println!("{text}");
    assert!(status.success(), "inner tests failed ({status}):\n{text}");
    for n in names {
        assert!(text.contains(&format!("test {n} ... ok")), "`{n}` did not run and pass:\n{text}");
    }
    let summary = format!("test result: ok. {} passed; 0 failed; 0 ignored", names.len());
    assert!(text.contains(&summary), "expected `{summary}`:\n{text}");
}

#[test]
fn keychain_backend_against_real_secret_service() {
    let cx = ctx();
    let home = cx.tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    // Checked here too, so a missing tool names itself instead of failing
    // somewhere inside the child.
    for t in ["gnome-keyring-daemon", "dbus-send", "secret-tool", "age"] {
        tool(t);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/with-secret-service.sh");
    run_inner(
        &["inner::keychain_scenario", "inner::keychain_and_file_entries_coexist"],
        &[tool("dbus-run-session"), "--".into(), script],
        &[("HOME", &home)],
        INSIDE_SECRET_SERVICE,
    );
}

#[test]
fn auto_detection_falls_back_to_file_without_a_session_bus() {
    let cx = ctx();
    let home = cx.tmp.path().join("home");
    let run = cx.tmp.path().join("run");
    std::fs::create_dir(&home).unwrap();
    std::fs::create_dir(&run).unwrap();
    // No DBUS_SESSION_BUS_ADDRESS (the env is cleared) and an empty
    // XDG_RUNTIME_DIR, so there is no `$XDG_RUNTIME_DIR/bus` to find either.
    run_inner(
        &["inner::no_bus_auto_picks_file"],
        &[],
        &[("HOME", &home), ("XDG_RUNTIME_DIR", &run)],
        WITHOUT_SESSION_BUS,
    );
}

/// Run only by the outer tests above, inside the environment they set up.
mod inner {
    use super::*;

    fn require(marker: &str) {
        assert!(
            std::env::var_os(marker).is_some(),
            "this test runs only inside the environment its outer test sets up; run `cargo test --test secret_store`"
        );
    }

    #[test]
    #[ignore = "run by keychain_backend_against_real_secret_service"]
    fn keychain_scenario() {
        require(INSIDE_SECRET_SERVICE);
        assert!(std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some());
        assert!(secret::keychain_available(), "{:?}", secret::keychain_status());
        let cx = ctx();
        // Auto-detection, from the (cleared) environment: the keychain.
        let store = Store::open(&cx.dirs).unwrap();
        assert_eq!(store.backend(), Backend::Keychain);

        let values = scenario(&store, &cx.dirs, &secret_tool_lookup);

        // The Secret Service item carries the documented attributes.
        let out = Command::new(tool("secret-tool")).args(["search", "--all", "service", "ppp.usai"]).output().unwrap();
        let listing = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(listing.contains("attribute.username = ppp"), "{listing}");
        assert!(listing.contains("attribute.service = ppp.usai"), "{listing}");

        assert!(!cx.dirs.secrets_file().exists(), "keychain writes must not create secrets.age");
        assert!(!cx.dirs.age_identity().exists(), "keychain writes must not create an age identity");
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        assert_no_plaintext(&cx.dirs, &refs, &[cx.dirs.secrets_index()]);

        for (scope, name) in [(Scope::Global, "anthropic"), (Scope::Global, "usai")] {
            assert!(store.remove(&scope, name, Kind::Service).unwrap());
        }
        assert_eq!(secret_tool_lookup("ppp.anthropic"), None);
        assert!(store.list().unwrap().is_empty());
    }

    #[test]
    #[ignore = "run by keychain_backend_against_real_secret_service"]
    fn keychain_and_file_entries_coexist() {
        require(INSIDE_SECRET_SERVICE);
        let cx = ctx();
        let keychain = open(&cx.dirs, Some(Backend::Keychain));
        let file = open(&cx.dirs, Some(Backend::File));
        assert_eq!((keychain.backend(), file.backend()), (Backend::Keychain, Backend::File));
        let (a, o, a2) = (fresh("anthropic"), fresh("openai"), fresh("anthropic2"));
        let in_file = |key: &str| {
            age_decrypt(&cx.dirs.secrets_file(), &cx.dirs.age_identity())
                .get(key)
                .map(|v| v.as_str().unwrap().to_owned())
        };

        keychain.set_service(&Scope::Global, "anthropic", &[], &value(&a)).unwrap();
        file.set_service(&Scope::Global, "openai", &[], &value(&o)).unwrap();
        let backends: Vec<_> = file.list().unwrap().into_iter().map(|e| (e.name, e.backend)).collect();
        assert_eq!(backends, [("anthropic".into(), Backend::Keychain), ("openai".into(), Backend::File)]);

        // Each read goes where the index says, whatever the store would
        // write to now.
        assert_eq!(file.get(&Scope::Global, "anthropic", Kind::Service).unwrap().unwrap().expose(), a);
        assert_eq!(keychain.lookup(None, "openai").unwrap().unwrap().1.expose(), o);
        assert_eq!(secret_tool_lookup("ppp.openai"), None);
        assert_eq!(in_file("ppp.anthropic"), None);
        assert_eq!(in_file("ppp.openai"), Some(o.clone()));

        // Setting it again through the file store moves it: no stale copy
        // stays in the keychain.
        file.set_service(&Scope::Global, "anthropic", &[], &value(&a2)).unwrap();
        assert_eq!(secret_tool_lookup("ppp.anthropic"), None);
        assert_eq!(in_file("ppp.anthropic"), Some(a2.clone()));
        assert_eq!(keychain.get(&Scope::Global, "anthropic", Kind::Service).unwrap().unwrap().expose(), a2);

        // Removing through either store removes from the recorded backend.
        assert!(keychain.remove(&Scope::Global, "openai", Kind::Service).unwrap());
        assert_eq!(in_file("ppp.openai"), None);
        assert_no_plaintext(&cx.dirs, &[&a, &o, &a2], &[cx.dirs.secrets_file(), cx.dirs.secrets_index()]);
        assert!(file.remove(&Scope::Global, "anthropic", Kind::Service).unwrap());
    }

    #[test]
    #[ignore = "run by auto_detection_falls_back_to_file_without_a_session_bus"]
    fn no_bus_auto_picks_file() {
        require(WITHOUT_SESSION_BUS);
        assert!(std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_none());
        assert!(!secret::keychain_available());
        let why = secret::keychain_status().unwrap_err();
        assert!(!why.is_empty());

        let cx = ctx();
        let store = Store::open(&cx.dirs).unwrap();
        assert_eq!(store.backend(), Backend::File);
        let v = fresh("fallback");
        store.set_service(&Scope::Global, "xai", &[], &value(&v)).unwrap();
        assert_eq!(store.lookup(Some("some-box"), "xai").unwrap().unwrap().1.expose(), v);
        assert_eq!(store.list().unwrap()[0].backend, Backend::File);
        assert_eq!(mode(&cx.dirs.secrets_file()), 0o600);
        assert_eq!(mode(&cx.dirs.data), 0o700);
        assert_no_plaintext(&cx.dirs, &[&v], &[cx.dirs.secrets_file()]);

        // Forcing the keychain is an error that says how to get going.
        let err =
            Store::open_with(&cx.dirs, &Settings { backend: Some(Backend::Keychain), age_identity: None }).unwrap_err();
        assert!(secret::is_unavailable(&err));
        let (text, _) = ppp::error::render(&err);
        assert!(text.starts_with("error: `PPP_SECRET_BACKEND` is `keychain`"), "{text}");
        assert!(text.contains("hint: unset `PPP_SECRET_BACKEND` or set it to `file`"), "{text}");

        // An entry the index places in the keychain is not silently missing
        // when the keychain is gone: reading it is a "locked" error.
        let index = std::fs::read_to_string(cx.dirs.secrets_index()).unwrap();
        std::fs::write(cx.dirs.secrets_index(), index.replace("\"backend\": \"file\"", "\"backend\": \"keychain\""))
            .unwrap();
        let err = store.get(&Scope::Global, "xai", Kind::Service).unwrap_err();
        assert!(secret::is_unavailable(&err), "{err:#}");
        let (text, _) = ppp::error::render(&err);
        assert!(text.contains("from the keychain") && text.contains("hint:"), "{text}");
    }
}

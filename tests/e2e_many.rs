//! Many sandboxes at once (issue 25), end to end on the fake podman: each
//! sandbox's machine in a podman home of its own (the fake keeps podman's
//! rule: one running machine per home), all behind the one daemon and
//! mitmdump, each on its own WireGuard port with its own policy, secrets
//! and flows; a sandbox of an earlier ppp, in the user's own podman home,
//! keeps working; the bounds on running sandboxes (host memory, the
//! configured cap) refuse a start with a message and a hint.
//!
//! Everything runs inside the test's host namespace, as in `e2e_sandbox`.

#[path = "support/netns.rs"]
mod netns;

#[path = "support/sandbox_env.rs"]
mod sandbox_env;

use std::io::{BufRead as _, BufReader};
use std::process::{Output, Stdio};

use netns::describe;
use sandbox_env::Env;
use serde_json::Value;

const KEY_RED: &str = "sk-ant-red-ONLY-0123456789abcdef";
const KEY_GREEN: &str = "sk-green-ONLY-fedcba9876543210";

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The HTTP status `sandbox` gets for `url`, asked from inside its VM, with
/// the placeholder a service key replaces in `header`.
/// Names resolve to the upstream without asking (a name a policy denies
/// does not resolve at all), so the proxy decides on the connection.
fn status(env: &Env, sandbox: &str, url: &str, header: &str) -> String {
    let host = url.trim_start_matches("https://").split('/').next().unwrap();
    let resolve = format!("{host}:443:{}", netns::UPSTREAM_IP);
    env.ok(&[
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
        "--resolve",
        &resolve,
        "-H",
        header,
        url,
    ])
}

/// The upstream's record of the request for `path`.
fn seen(env: &Env, path: &str) -> Option<Value> {
    env.upstream.requests().into_iter().rfind(|r| r["path"] == path)
}

fn flows(env: &Env) -> Vec<Value> {
    std::fs::read_to_string(env.dirs().flows_log())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The `machine init` calls ppp made, as the fake logged them.
fn inits(env: &Env) -> Vec<String> {
    env.calls().into_iter().filter(|c| c.starts_with("machine init")).collect()
}

/// A guest program that keeps one HTTP/1.1 connection to api.anthropic.com
/// open: a first request, then (once `/tmp/go` exists) a second one on the
/// same socket. It prints each status line; a tunnel that went away in
/// between fails the second (the socket times out or is reset).
const KEEPALIVE: &str = r#"
import os, socket, sys, time
s = socket.create_connection(("api.anthropic.com", 80), timeout=30)
def req(path):
    s.sendall(("GET %s HTTP/1.1\r\nHost: api.anthropic.com\r\nx-api-key: ppp-proxy-managed\r\n\r\n" % path).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            sys.exit("connection closed")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    n = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0]
    while len(rest) < n:
        rest += s.recv(4096)
    return head.split(b"\r\n")[0].decode()
print(req("/keep-1"), flush=True)
while not os.path.exists("/tmp/go"):
    time.sleep(0.1)
print(req("/keep-2"), flush=True)
"#;

/// Spec 8.4: red-bird, blue-fox and green-owl at once. On the ppp before
/// issue 25 the second and third `create` fail with ppp's own refusal
/// ("machine `ppp-red` is running, and podman's qemu provider runs only one
/// machine at a time"); here all three run, each in its own podman home.
/// Three policies: red allows the service and gets its key, blue denies
/// everything, green allows another host with another key. Each sees only
/// its own decisions and secrets; stopping and removing two leaves the
/// third's open connection open.
#[test]
fn three_sandboxes_run_at_once_each_with_its_own_policy_and_secrets() {
    let env = Env::new("qemu");
    env.ok(&["policy", "init", "deny-all"]);
    // The upstream's test address is not public: the DNS-rebinding defence
    // wants an address rule beside the name.
    env.ok(&["policy", "allow", "network", "--sandbox", "red", "api.anthropic.com,198.18.0.10"]);
    env.ok(&["policy", "allow", "network", "--sandbox", "green", "echo.test,198.18.0.10"]);

    // red first (it fetches the machine image), then blue and green at once.
    env.ok(&["create", "-q", "--name", "red", "-m", "2g", "opencode", &env.ws()]);
    let outs: Vec<Output> = std::thread::scope(|s| {
        let hs: Vec<_> = ["blue", "green"]
            .iter()
            .map(|n| s.spawn(|| env.run(&["create", "-q", "--name", n, "-m", "2g", "opencode", &env.ws()])))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in &outs {
        assert!(o.status.success(), "{}", describe(o));
    }
    let ls = env.ls();
    let rows: Vec<(String, String, String, u64)> = ls
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap().to_owned();
            (s("name"), s("state"), s("home"), r["memory"].as_u64().unwrap())
        })
        .collect();
    let want = |n: &str| (n.to_owned(), "running".to_owned(), "own".to_owned(), 2048);
    assert_eq!(rows, [want("blue"), want("green"), want("red")], "{ls:?}");
    let table = env.ok(&["ls"]);
    assert!(table.contains("3 running: ") && table.contains("6G of memory"), "{table}");
    assert!(table.lines().next().unwrap().contains("CPUS") && table.contains("MEMORY"), "{table}");
    // Nothing of ppp's in the user's own podman home.
    assert_eq!(env.podman(&["machine", "list", "--format", "json"]), serde_json::json!([]));
    // Each machine is up, in its own home: its own hostname over its own ssh.
    for n in ["red", "blue", "green"] {
        assert_eq!(env.ok(&["exec", n, "--", "hostname"]).trim(), format!("ppp-{n}"));
    }
    // The machine image was fetched once, by red's init; the others were
    // given ppp's copy by path.
    let pulls = std::fs::read_to_string(env.root().join("fake/pulls.log")).unwrap();
    assert_eq!(pulls.lines().count(), 1, "{pulls}");
    let inits = inits(&env);
    assert_eq!(inits.len(), 3, "{inits:?}");
    assert!(!inits[0].contains("--image"), "{inits:?}");
    for i in &inits[1..] {
        assert!(i.contains("--image <tmp>/cache/machine-images/qemu-6.0/"), "{inits:?}");
    }

    env.ok(&["secret", "set", "--sandbox", "red", "anthropic", "-t", KEY_RED]);
    env.ok(&["secret", "set", "--sandbox", "green", "echo", "--host", "echo.test", "-t", KEY_GREEN]);
    // red: the service, with its own key.
    assert_eq!(status(&env, "red", "https://api.anthropic.com/red-call", "x-api-key: ppp-proxy-managed"), "200");
    let r = seen(&env, "/red-call").expect("red's call reached upstream").to_string();
    assert!(r.contains(KEY_RED) && !r.contains(KEY_GREEN), "{r}");
    // (Its policy allows the upstream's address, which echo.test shares:
    // allowed, but green's key is green's alone.)
    assert_eq!(status(&env, "red", "https://echo.test/red-other", "authorization: Bearer ppp-proxy-managed"), "200");
    let o = seen(&env, "/red-other").unwrap().to_string();
    assert!(!o.contains(KEY_GREEN) && !o.contains(KEY_RED), "{o}");
    // blue: nothing.
    assert_eq!(status(&env, "blue", "https://api.anthropic.com/blue-call", "x-api-key: ppp-proxy-managed"), "403");
    assert_eq!(status(&env, "blue", "https://echo.test/blue-call", "authorization: Bearer x"), "403");
    // green: its host, with its key; red's key never reaches it.
    assert_eq!(status(&env, "green", "https://echo.test/green-call", "authorization: Bearer ppp-proxy-managed"), "200");
    let g = seen(&env, "/green-call").expect("green's call reached upstream").to_string();
    assert!(g.contains(KEY_GREEN) && !g.contains(KEY_RED), "{g}");
    assert_eq!(status(&env, "green", "https://api.anthropic.com/green-api", "x-api-key: ppp-proxy-managed"), "200");
    let a = seen(&env, "/green-api").unwrap().to_string();
    assert!(!a.contains(KEY_RED) && !a.contains(KEY_GREEN), "red's key is red's alone: {a}");
    assert!(seen(&env, "/blue-call").is_none(), "blue's call was refused, yet reached upstream");
    // Each flow is its own sandbox's, with its own decision.
    let decision = |sandbox: &str, path: &str| {
        flows(&env)
            .into_iter()
            .find(|f| f["sandbox"] == sandbox && f["path"] == path)
            .map(|f| f["decision"].as_str().unwrap_or_default().to_owned())
    };
    assert_eq!(decision("red", "/red-call").as_deref(), Some("allow"));
    assert_eq!(decision("green", "/green-call").as_deref(), Some("allow"));
    // (Past its built-in `mitm.it`, where provisioning fetched the CA.)
    let blue: Vec<Value> =
        flows(&env).into_iter().filter(|f| f["sandbox"] == "blue" && f["host"] != "mitm.it").collect();
    assert!(!blue.is_empty() && blue.iter().all(|f| f["decision"] == "deny"), "{blue:?}");
    for (sandbox, path) in [("blue", "/red-call"), ("green", "/red-call"), ("red", "/green-call")] {
        assert_eq!(decision(sandbox, path), None, "{path} is not {sandbox}'s");
    }

    // red keeps a connection open while green stops and blue goes.
    let mut child = env
        .ppp(&["exec", "red", "--", "python3", "-c", KEEPALIVE])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "HTTP/1.1 200 OK");
    env.ok(&["stop", "green"]);
    env.ok(&["rm", "-f", "blue"]);
    assert!(!env.dirs().sandbox("blue").exists());
    env.ok(&["exec", "red", "--", "touch", "/tmp/go"]);
    assert_eq!(lines.next().unwrap().unwrap(), "HTTP/1.1 200 OK", "the open connection survived");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(seen(&env, "/keep-2").is_some(), "the second request reached upstream");

    // Removing red leaves green what it uses: its home, and ppp's image.
    let red_run = ppp::sandbox::load(&env.dirs(), "red").unwrap().unwrap().podman_run.unwrap();
    assert!(red_run.is_dir());
    env.ok(&["rm", "-f", "red"]);
    assert!(!red_run.exists(), "red's socket directory went with it");
    assert!(!env.dirs().sandbox("red").exists());
    let out = env.run(&["run", "--name", "green", "opencode", &env.ws()]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert_eq!(env.ls()[0]["state"], "running");
    env.ok(&["rm", "--all", "-f"]);
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    let cache = env.dirs().machine_images();
    assert_eq!(std::fs::read_dir(cache.join("qemu-6.0")).unwrap().count(), 1, "the image stays for the next");
}

/// `sandboxes.max_running` caps running sandboxes, and a start that would
/// give the VMs more memory than the host has (`MemTotal`) is refused; both
/// before anything is made, with the running ones named in the hint.
#[test]
fn starts_past_the_bounds_are_refused_before_anything_is_made() {
    let env = Env::new("qemu");
    env.ok(&["policy", "init", "deny-all"]);
    std::fs::create_dir_all(env.root().join("config")).unwrap();
    std::fs::write(env.dirs().config_file(), "sandboxes:\n  max_running: 2\n").unwrap();
    env.ok(&["create", "-q", "--name", "a", "-m", "1536m", "opencode", &env.ws()]);
    env.ok(&["create", "-q", "--name", "b", "-m", "1536m", "opencode", &env.ws()]);
    let n = env.calls().len();
    let out = env.run(&["create", "--name", "c", "-m", "1536m", "opencode", &env.ws()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("2 sandbox(es) are running (`a`, `b`), and `sandboxes.max_running`"), "{err}");
    assert!(err.contains("hint: stop one first: `ppp stop a`, or raise `sandboxes.max_running`"), "{err}");
    assert!(!env.calls()[n..].iter().any(|c| c.starts_with("machine init")), "nothing was made");
    assert_eq!(env.ls().len(), 2);
    // A stopped sandbox coming back counts too.
    env.ok(&["stop", "b"]);
    env.ok(&["create", "-q", "--name", "c", "-m", "1536m", "opencode", &env.ws()]);
    let out = env.run(&["run", "--name", "b", "opencode", &env.ws()]);
    assert!(stderr(&out).contains("`sandboxes.max_running`"), "{}", describe(&out));
    assert_eq!(env.ls().iter().filter(|r| r["state"] == "running").count(), 2);

    // Memory: a's and the new one's more than the host has.
    std::fs::write(env.dirs().config_file(), "").unwrap();
    env.ok(&["rm", "-f", "c"]);
    let total = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        / 1024;
    let big = format!("{}m", total - 1024);
    let out = env.run(&["create", "--name", "huge", "-m", &big, "opencode", &env.ws()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "error: the new sandbox needs {} MiB of memory; with the 1536 MiB of the 1 running (`a`)",
            total - 1024
        )),
        "{err}"
    );
    assert!(err.contains(&format!("more than this host has ({total} MiB)")), "{err}");
    assert!(err.contains("hint: stop one first: `ppp stop a`, or give it less with `-m`"), "{err}");
    assert!(env.ls().iter().all(|r| r["name"] != "huge"));
}

/// A sandbox an earlier ppp made lives in the user's own podman home (its
/// record has no `podman_run`): it is found, listed as `user`, started,
/// stopped and removed there, beside new ones in their own homes; two of
/// them still cannot run at once, podman's rule in that home.
#[test]
fn a_sandbox_of_an_earlier_ppp_keeps_working_in_the_users_podman_home() {
    let env = Env::new("qemu");
    env.ok(&["policy", "init", "deny-all"]);
    let dirs = env.dirs();
    for name in ["old", "old2"] {
        let port = ppp::sandbox::with_registry(&dirs, |r| r.allocate(name)).unwrap();
        std::fs::create_dir_all(dirs.sandbox(name)).unwrap();
        let rec = serde_json::json!({
            "name": name, "agent": "opencode", "workspace": [env.ws()], "status": "stopped",
            "created_at": "2026-01-01T00:00:00Z", "cpus": 1, "memory": 2048, "port": port,
            "inner_ip": ppp::sandbox::inner_ip(port).to_string(), "kit_refs": [], "template_tag": null,
            "machine_name": format!("ppp-{name}"),
        });
        std::fs::write(dirs.sandbox_record(name), serde_json::to_string_pretty(&rec).unwrap()).unwrap();
        let volume = format!("{}:{}", env.ws(), env.ws());
        env.podman(&["machine", "init", &format!("ppp-{name}"), "--memory", "2048", "--volume", &volume]);
    }
    let out = env.run(&["run", "--name", "old", "opencode", &env.ws()]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stub-agent args:"), "{}", describe(&out));
    env.ok(&["create", "-q", "--name", "new", "-m", "2g", "opencode", &env.ws()]);
    let ls = env.ls();
    let row = |n: &str| ls.iter().find(|r| r["name"] == n).unwrap().clone();
    assert_eq!((row("old")["state"].clone(), row("old")["home"].clone()), ("running".into(), "user".into()));
    assert_eq!((row("new")["state"].clone(), row("new")["home"].clone()), ("running".into(), "own".into()));
    assert_eq!(row("old2")["state"], "stopped");
    let table = env.ok(&["ls"]);
    assert!(table.contains(" user ") && table.contains(" own "), "{table}");
    // diagnose lists the machines of both homes.
    let report: Value = serde_json::from_str(&env.ok(&["diagnose", "-o", "json"])).unwrap();
    let machines: Vec<(String, String)> = report["machines"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap().to_owned(), m["home"].as_str().unwrap().to_owned()))
        .collect();
    for want in [("ppp-old", "user"), ("ppp-old2", "user"), ("ppp-new", "own")] {
        assert!(machines.contains(&(want.0.to_owned(), want.1.to_owned())), "{machines:?}");
    }
    // Two in the user's home: podman's rule there, said by ppp first.
    let out = env.run(&["run", "--name", "old2", "opencode", &env.ws()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("machine `ppp-old` is running in your podman home"), "{err}");
    assert!(err.contains("hint: stop the running one first: `ppp stop old`"), "{err}");
    env.ok(&["stop", "old"]);
    assert_eq!(env.podman(&["machine", "inspect", "ppp-old"])[0]["State"], "stopped");
    // reset takes them all, from both homes, and leaves the user's empty.
    env.ok(&["reset", "-f"]);
    assert_eq!(env.podman(&["machine", "list", "--format", "json"]), serde_json::json!([]));
    assert!(!dirs.sandboxes().exists());
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
}

//! Sandboxes end to end: the real `ppp` binary creates, runs, stops and
//! removes sandboxes on the fake podman (`tests/fake-podman/podman`), whose
//! machines are network + mount namespaces. Everything else is real: the
//! daemon and mitmdump, the embedded provision.sh with wireguard-go, the
//! nftables kill switch, the CA fetched through the tunnel, and the agent
//! container's traffic through the guest's forward path.
//!
//! ppp runs inside the test's host namespace (no route out), so the
//! machines' veths, the daemon's WireGuard ports and every request stay in
//! namespaces the test made.

#[path = "support/netns.rs"]
mod netns;

#[path = "support/sandbox_env.rs"]
mod sandbox_env;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use netns::{UPSTREAM_IP, describe};
use sandbox_env::{Env, KEY, setup_policy, since};
use serde_json::Value;

#[test]
fn a_sandbox_from_create_to_rm() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");

    // create: provisioned, verified, running.
    let n = env.calls().len();
    let out =
        env.ok(&["create", "--name", "red", "--cpus", "2", "-m", "4g", "--disk-size", "20g", "opencode", &env.ws()]);
    assert!(out.contains("created sandbox `red`"), "{out}");
    insta::assert_snapshot!("create_calls", since(&env, n));
    let ls = env.ls();
    assert_eq!((ls[0]["name"].as_str(), ls[0]["state"].as_str()), (Some("red"), Some("running")), "{ls:?}");
    assert_eq!(ls[0]["port"], 51820);
    let log = std::fs::read_to_string(env.dirs().sandbox_machine_log("red")).unwrap();
    for check in ["ok handshake", "ok no-direct-egress", "ok policy-denies", "ok ca-trusted", "ok no-secret-in-env"] {
        assert!(log.contains(check), "{check} in machine.log:\n{log}");
    }

    // exec: argv reaches the guest as given, exit codes come back.
    let out = env.run(&["exec", "red", "--", "printf", "[%s]\\n", "a b", "it's", "$HOME"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[a b]\n[it's]\n[$HOME]\n", "{}", describe(&out));
    assert_eq!(env.run(&["exec", "red", "--", "sh", "-c", "exit 3"]).status.code(), Some(3));

    // From the VM: HTTPS to an allowed host verifies (the CA is trusted),
    // names resolve through the tunnel, the key is injected, and a host the
    // policy does not allow gets 403 from the proxy.
    let body = env.ok(&["exec", "red", "--", "curl", "-sS", "-m", "15", "https://echo.test/from-vm"]);
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((echo["path"].as_str(), echo["tls"].as_bool()), (Some("/from-vm"), Some(true)), "{body}");
    // The key goes only over TLS to the service's own name; the upstream
    // echoes it back, and ppp scrubs it from what the VM receives.
    let body = env.ok(&[
        "exec",
        "red",
        "--",
        "curl",
        "-sS",
        "-m",
        "15",
        "-H",
        "x-api-key: ppp-proxy-managed",
        "https://api.anthropic.com/v1/messages",
    ]);
    let seen = env.upstream.requests().into_iter().rfind(|r| r["path"] == "/v1/messages").expect("reached upstream");
    assert!(seen["headers"].to_string().contains(KEY), "the upstream saw the real key: {seen}");
    assert!(!body.contains(KEY) && body.contains("[redacted by ppp]"), "scrubbed on the way back: {body}");
    let code = env.denied_status("red");
    assert_eq!(code, "403");

    // cp: into the VM and back, following a link with -L.
    let file = env.root().join("note.txt");
    std::fs::write(&file, "from the host\n").unwrap();
    std::os::unix::fs::symlink(&file, env.root().join("link.txt")).unwrap();
    env.ok(&["cp", file.to_str().unwrap(), "red:/tmp/note.txt"]);
    env.ok(&["cp", "-L", env.root().join("link.txt").to_str().unwrap(), "red:/tmp/linked.txt"]);
    assert_eq!(
        env.ok(&["exec", "red", "--", "cat", "/tmp/note.txt", "/tmp/linked.txt"]),
        "from the host\nfrom the host\n"
    );
    env.ok(&["exec", "red", "--", "sh", "-c", "echo from the vm > /tmp/back.txt"]);
    let back = env.root().join("back.txt");
    env.ok(&["cp", "red:/tmp/back.txt", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "from the vm\n");

    // run --name reattaches and runs the agent in its container: the
    // placeholder is in its environment, the proxy puts the real key on
    // its request, and its exit code is ppp's.
    let before = env.upstream.requests().len();
    let out = env.run(&["run", "--name", "red", "opencode", &env.ws(), "--", "hello", "world"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(text.contains("stub-agent args: hello world"), "{text}");
    assert!(text.contains("stub-agent key: ppp-proxy-managed"), "{text}");
    assert!(text.contains(&format!("stub-agent cwd: {}", env.ws())), "{text}");
    assert!(text.contains("stub-agent api: 200"), "{text}");
    assert!(text.contains("stub-agent tls: 200"), "the container trusts the proxy's CA: {text}");
    assert!(!text.contains(KEY), "the key never reaches the container: {text}");
    let seen = &env.upstream.requests()[before..];
    let from_agent = seen.iter().find(|r| r["path"] == "/from-agent").expect("the agent's request reached upstream");
    assert!(from_agent["headers"].to_string().contains(KEY), "{from_agent}");

    // A published port is kept in sandbox.json and given to the agent
    // container on its next start, after a stop too (see run_name_calls).
    env.ok(&["ports", "red", "--publish", "127.0.0.1:18080:3000"]);
    let ports: Value = serde_json::from_str(&env.ok(&["ports", "red", "--json"])).unwrap();
    assert_eq!(
        ports,
        serde_json::json!([{"host_ip": "127.0.0.1", "host_port": 18080, "sandbox_port": 3000, "protocol": "tcp"}])
    );

    // stop keeps the port; run --name starts, re-provisions and verifies.
    let n = env.calls().len();
    env.ok(&["stop", "red"]);
    insta::assert_snapshot!("stop_calls", since(&env, n));
    assert_eq!(env.ls()[0]["state"], "stopped");
    assert_eq!(ppp::sandbox::PortRegistry::load(&env.dirs()).unwrap().port_of("red"), Some(51820));
    let n = env.calls().len();
    let out = env.run(&["run", "--name", "red", "opencode", &env.ws()]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    insta::assert_snapshot!("run_name_calls", since(&env, n));
    assert_eq!(env.ls()[0]["state"], "running");
    env.ok(&["ports", "red", "--unpublish", "3000"]);
    assert_eq!(env.ok(&["ports", "red", "--json"]).trim(), "[]");

    // The kill switch: with wg0 gone and a default route straight to the
    // host, which now forwards, a direct request still fails. Removing the
    // nftables table shows the path would otherwise work.
    env.topo.host_forwarding(true);
    // The upstream answers the machines' own addresses through the host.
    netns::run_ok(&["ip", "-n", &env.topo.upstream_ns(), "route", "add", "192.168.127.0/24", "via", "10.251.0.1"]);
    env.ok(&["exec", "red", "--", "sudo", "sh", "-c", "ip link del wg0; ip route replace default via 192.168.127.1"]);
    let direct = format!("http://{UPSTREAM_IP}/direct");
    let out = env.run(&["exec", "red", "--", "curl", "-sS", "-m", "3", &direct]);
    assert!(!out.status.success(), "direct egress must fail: {}", describe(&out));
    env.ok(&["exec", "red", "--", "sudo", "nft", "delete", "table", "inet", "ppp"]);
    let control = format!("http://{UPSTREAM_IP}/control");
    env.ok(&["exec", "red", "--", "curl", "-sS", "-m", "5", &control]);
    let paths: Vec<Value> = env.upstream.requests().iter().map(|r| r["path"].clone()).collect();
    assert!(!paths.contains(&Value::from("/direct")), "{paths:?}");
    assert!(paths.contains(&Value::from("/control")), "the control request shows the path was real: {paths:?}");
    env.topo.host_forwarding(false);

    // rm leaves no machine, namespace, link, process, port or state.
    let before = env.leftovers();
    assert!(before.iter().any(|l| l.starts_with("process ")), "a running machine is seen: {before:?}");
    assert!(before.iter().any(|l| l.starts_with("netns ")), "{before:?}");
    let n = env.calls().len();
    env.ok(&["rm", "-f", "red"]);
    insta::assert_snapshot!("rm_calls", since(&env, n));
    assert_eq!(env.podman(&["machine", "list", "--format", "json"]), serde_json::json!([]));
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    assert!(ppp::sandbox::PortRegistry::load(&env.dirs()).unwrap().ports.is_empty());
    assert!(!env.dirs().sandbox("red").exists());
    assert!(env.ls().is_empty());
}

#[test]
fn failures_leave_nothing_half_made() {
    let mut env = Env::new("qemu");
    setup_policy(&env, "red");
    let nothing_left = |env: &Env| {
        assert!(env.ls().is_empty(), "{:?}", env.ls());
        // The create started the daemon; with nothing left to serve it is
        // stopped again (issue 14: the state is as before).
        let status: Value = serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).unwrap();
        assert_eq!(status["running"], false, "{status}");
        assert_eq!(status["orphan_mitmdump_pid"], Value::Null, "{status}");
        assert!(ppp::sandbox::PortRegistry::load(&env.dirs()).unwrap().ports.is_empty());
        assert_eq!(env.podman(&["machine", "list", "--format", "json"]), serde_json::json!([]));
        assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
        // The prepared policy survives a failed create.
        assert!(env.dirs().sandbox_policy("red").exists());
    };

    env.extra = vec![("FAKE_PODMAN_FAIL".into(), "init".into())];
    let out = env.run(&["create", "--name", "red", "opencode", &env.ws()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("error: podman machine init failed"), "{err}");
    assert!(err.contains("ppp: sandbox `red` was not created"), "{err}");
    nothing_left(&env);

    env.extra = vec![("FAKE_PODMAN_FAIL".into(), "pull".into())];
    let out = env.run(&["create", "--name", "red", "opencode", &env.ws()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("error: provisioning failed: "), "{err}");
    assert!(err.contains("agent image"), "names the step: {err}");
    let log = env.dirs().sandbox_machine_log("red");
    assert!(err.contains(&format!("hint: see `{}`", log.display())), "points at the log: {err}");
    assert!(std::fs::read_to_string(&log).unwrap().contains("ppp-provision: FAILED"), "the log is kept");
    nothing_left(&env);
    // `rm` removes what the failed create kept (the prepared policy stays).
    env.ok(&["rm", "-f", "red"]);
    assert!(!log.exists(), "rm removed the kept log");
    assert!(env.dirs().sandbox_policy("red").exists());

    // A handover check failing stops the handover: here a "secret" whose
    // value is in every guest shell's environment.
    env.extra.clear();
    env.ok(&["secret", "set", "-g", "github", "-t", "/home/core"]);
    let out = env.run(&["create", "--name", "red", "opencode", &env.ws()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("failed its handover checks: check `no-secret-in-env` failed"), "{err}");
    assert!(err.contains("the agent was not started"), "{err}");
    assert!(!err.contains("/home/core"), "the value is never printed: {err}");
    nothing_left(&env);
}

/// Every call the fake podman recorded, argv and any file fed on stdin,
/// as one text per call.
fn recorded_calls(env: &Env) -> Vec<String> {
    std::fs::read_to_string(env.root().join("fake/calls.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let argv: Vec<&str> = v["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
            format!("{}\n{}", argv.join(" "), v["stdin"].as_str().unwrap_or(""))
        })
        .collect()
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    format!("{:x}", sha2::Sha256::digest(data))
}

/// Issue 11 point 6, as the attack: root in the guest reads every argv and
/// stdin ppp sends in (the process list, a wrapped `sudo`). Through create
/// and run, none of it holds a stored secret or a digest of one under any
/// salt ppp sent; yet a guest process that does hold the real key is caught
/// by the handover check, which the host decides.
#[test]
fn nothing_derived_from_a_secret_enters_the_guest() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    let other = "sk-other-sandbox-0123456789abcdef";
    env.ok(&["secret", "set", "--sandbox", "blue", "openai", "-t", other]);
    env.ok(&["create", "--name", "red", "opencode", &env.ws()]);
    let out = env.run(&["run", "--name", "red", "opencode", &env.ws()]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));

    let calls = recorded_calls(&env);
    let salts: Vec<String> = calls
        .iter()
        .flat_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            words.windows(2).filter(|w| w[0] == "--salt").map(|w| w[1].to_owned()).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(salts.len(), 2, "one verify per create and per run: {calls:#?}");
    for secret in [KEY, other] {
        for call in &calls {
            assert!(!call.contains(secret), "a secret went into the guest: {call}");
            for salt in &salts {
                let digest = sha256_hex(format!("{salt}{secret}").as_bytes());
                assert!(!call.contains(&digest), "a salted digest of a secret went into the guest: {call}");
            }
        }
    }

    // A process in the VM whose environment holds the real key (read from
    // a file ppp never sees, so the test itself puts no key in an argv).
    std::fs::write(env.root().join("ws/key.txt"), KEY).unwrap();
    let key_file = env.root().join("ws/key.txt").display().to_string();
    env.ok(&[
        "exec",
        "red",
        "--",
        "sh",
        "-c",
        &format!("ANTHROPIC_API_KEY=$(cat {key_file}) nohup sleep 600 >/dev/null 2>&1 &"),
    ]);
    let out = env.run(&["run", "--name", "red", "opencode", &env.ws()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(err.contains("failed its handover checks: check `no-secret-in-env` failed"), "{err}");
    assert!(err.contains("variable ANTHROPIC_API_KEY"), "{err}");
    assert!(!err.contains(KEY), "the value is never printed: {err}");
}

/// A WireGuard peer made from `wg0` (a guest config ppp rendered), with its
/// endpoint replaced by `endpoint` when given, that keeps sending
/// keepalives: whether its server answers with a handshake within 6 s.
/// `run` runs the probe script as root somewhere (a VM, a namespace).
const WG_PROBE: &str = r#"set -e
ip link del wgp 2>/dev/null || true
ip link add wgp type wireguard 2>/dev/null || wireguard-go wgp >/dev/null 2>&1
printf '%s' "$1" > /run/wireguard/wgp.key
wg set wgp private-key /run/wireguard/wgp.key peer "$2" endpoint "$3" allowed-ips 10.0.0.53/32 persistent-keepalive 1
ip link set wgp up
i=0
while [ $i -lt 30 ]; do
  hs=$(wg show wgp latest-handshakes | awk '{print $2}')
  if [ "${hs:-0}" != 0 ]; then echo HANDSHAKE; break; fi
  sleep 0.2
  i=$((i + 1))
done
ip link del wgp
rm -f /run/wireguard/wgp.key
"#;

fn wg0_field<'a>(wg0: &'a str, key: &str) -> &'a str {
    wg0.lines().find_map(|l| l.strip_prefix(&format!("{key} = "))).unwrap_or_else(|| panic!("{key} in {wg0}"))
}

/// The probe's arguments for `wg0`: private key, server key, endpoint.
fn probe_args(wg0: &str, endpoint: Option<&str>) -> [String; 3] {
    [
        wg0_field(wg0, "PrivateKey").to_owned(),
        wg0_field(wg0, "PublicKey").to_owned(),
        endpoint.map_or_else(|| wg0_field(wg0, "Endpoint").to_owned(), ToOwned::to_owned),
    ]
}

/// Root in sandbox `vm` runs the probe next to its own tunnel.
fn handshakes_from_vm(env: &Env, vm: &str, wg0: &str) -> bool {
    let [key, server, endpoint] = probe_args(wg0, None);
    let out = env.ok(&["exec", vm, "--", "sudo", "sh", "-c", WG_PROBE, "sh", &key, &server, &endpoint]);
    out.contains("HANDSHAKE")
}

/// Issue 11 point 5, as the attack: a sandbox's WireGuard identity cannot
/// be reused. After `ppp rm red`, red's `wg0.conf` (which root in red had)
/// gets no handshake from the server of the port's next owner; the next
/// owner's own valid config gets none from a LAN address of the host
/// (the servers listen only on loopback, where gvproxy delivers); and no
/// copy of the key was ever on the machine's disk.
#[test]
fn a_sandbox_identity_cannot_be_reused() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    env.ok(&["policy", "allow", "network", "--sandbox", "blue", "echo.test,api.anthropic.com,198.18.0.10"]);
    env.ok(&["create", "--name", "red", "opencode", &env.ws()]);
    let red = std::fs::read_to_string(env.dirs().sandbox_wg_conf("red")).unwrap();
    // The key is on tmpfs in the VM only: nothing in the machine's state
    // (overlays, /tmp, /home, /var/lib/ppp; its "disk") holds it.
    let disk = Command::new("grep")
        .args(["-rlF", wg0_field(&red, "PrivateKey")])
        .arg(env.machine_dir("ppp-red"))
        .output()
        .unwrap();
    assert_eq!(disk.status.code(), Some(1), "the key is on the machine's disk: {}", describe(&disk));
    env.ok(&["rm", "-f", "red"]);

    env.ok(&["create", "--name", "blue", "opencode", &env.ws()]);
    assert_eq!(env.ls()[0]["port"], 51820, "blue has red's old port");
    let blue = std::fs::read_to_string(env.dirs().sandbox_wg_conf("blue")).unwrap();
    assert_ne!(wg0_field(&blue, "PrivateKey"), wg0_field(&red, "PrivateKey"), "a new claim, new keys");
    assert_ne!(wg0_field(&blue, "PublicKey"), wg0_field(&red, "PublicKey"), "and a new server key");
    // The control: the probe with blue's own config handshakes.
    assert!(handshakes_from_vm(&env, "blue", &blue), "the probe works");
    // The attack: red's old config against the port's new server.
    assert!(!handshakes_from_vm(&env, "blue", &red), "red's old keys still open port 51820");

    // From the LAN: blue's valid config, sent to the host's address on the
    // link the upstream namespace shares with it.
    std::fs::create_dir_all("/run/wireguard").unwrap();
    let [key, server, _] = probe_args(&blue, None);
    let endpoint = format!("{}:51820", netns::HOST_UPSTREAM_IP);
    let out = env.topo.exec(
        &env.topo.upstream_ns(),
        &[
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs wgp /run/wireguard && sh -c \"$0\" sh \"$@\"",
            WG_PROBE,
            &key,
            &server,
            &endpoint,
        ],
    );
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("HANDSHAKE"), "a server answered on {endpoint}");
    // blue itself is untouched by all this.
    assert_eq!(env.denied_status("blue"), "403");
}

/// `podman ARGS` (the fake) run directly, with no ppp in between, in
/// sandbox `sandbox`'s podman home.
fn podman_raw(env: &Env, sandbox: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &env.topo.host_ns()])
        .arg(sandbox_env::fake_podman())
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("FAKE_PODMAN_ROOT", env.root().join("fake"))
        .env("FAKE_PODMAN_IMAGES", env.root().join("images"))
        .envs(env.home_vars(sandbox))
        .output()
        .unwrap()
}

/// Issue 11 point 9, as the attack: a provisioned machine booted outside
/// ppp (`podman machine start`, or the VM rebooting) is closed from its
/// first packet: the kill switch is loaded at boot, there is no tunnel (the
/// key was on tmpfs), and root's packets to the host, to the world or to
/// UDP port 67 anywhere but the gateway go nowhere. ppp provisions it again
/// on top of that.
#[test]
fn a_machine_booted_without_ppp_is_closed() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    env.ok(&["create", "--name", "red", "opencode", &env.ws()]);
    env.ok(&["stop", "red"]);
    let out = podman_raw(&env, "red", &["machine", "start", "ppp-red"]);
    assert!(out.status.success(), "{}", describe(&out));
    let ssh = |script: &str| podman_raw(&env, "red", &["machine", "ssh", "ppp-red", "--", script]);
    let text = |out: &Output| String::from_utf8_lossy(&out.stdout).into_owned();

    // In force from boot, before anyone ran anything.
    let table = ssh("sudo nft list table inet ppp");
    assert!(table.status.success(), "no kill switch after boot: {}", describe(&table));
    assert_eq!(text(&table).matches("policy drop").count(), 2, "{}", text(&table));
    // No tunnel: its key was on tmpfs.
    let wg = ssh("ip link show wg0; test -e /run/ppp/wg0.conf");
    assert!(!wg.status.success(), "a tunnel came up without ppp: {}", describe(&wg));

    // A direct path would work (host forwarding on, the upstream routes
    // back), but nothing leaves: TCP to the world, and UDP from port 68 to
    // port 67 of an address that is not the gateway.
    env.topo.host_forwarding(true);
    netns::run_ok(&["ip", "-n", &env.topo.upstream_ns(), "route", "add", "192.168.127.0/24", "via", "10.251.0.1"]);
    let out = ssh(&format!("curl -sS -m 3 http://{UPSTREAM_IP}/boot-direct"));
    assert!(!out.status.success(), "direct egress after boot: {}", describe(&out));
    let listener = Command::new("ip")
        .args(["netns", "exec", &env.topo.upstream_ns(), "python3", "-c"])
        .arg(
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('0.0.0.0', 67))\n\
             s.settimeout(4)\ntry:\n    print('GOT', s.recvfrom(100))\nexcept OSError:\n    print('NOTHING')\n",
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let send = format!(
        "sudo python3 -c \"import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.bind(('0.0.0.0',68))\nfor _ in range(6):\n  s.sendto(b'dhcp?',('{UPSTREAM_IP}',67)); time.sleep(0.3)\""
    );
    let _ = ssh(&send);
    let got = String::from_utf8_lossy(&listener.wait_with_output().unwrap().stdout).into_owned();
    assert!(got.contains("NOTHING"), "UDP 68->67 left the guest for {UPSTREAM_IP}: {got}");
    // The control: without the table the same request gets through.
    ssh("sudo nft delete table inet ppp");
    let out = ssh(&format!("curl -sS -m 5 http://{UPSTREAM_IP}/boot-control"));
    assert!(out.status.success(), "the direct path is real: {}", describe(&out));
    let paths: Vec<Value> = env.upstream.requests().iter().map(|r| r["path"].clone()).collect();
    assert!(!paths.contains(&Value::from("/boot-direct")), "{paths:?}");
    env.topo.host_forwarding(false);

    // ppp provisions it again on top of what booted: verified, working.
    let out = env.run(&["run", "--name", "red", "opencode", &env.ws()]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stub-agent api: 200"), "{}", describe(&out));
}

/// Each sandbox's machine is in its own podman home, so podman's
/// one-machine rule no longer stops a second (issue 25; the user's own home
/// keeps it, see `e2e_many`). `run` with a new name creates the sandbox,
/// then runs the agent.
#[test]
fn a_second_sandbox_runs_beside_the_first() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    env.ok(&["create", "--name", "red", "-m", "2g", "opencode", &env.ws()]);
    let out = env.run(&["run", "--name", "blue", "-m", "2g", "opencode", &env.ws(), "--", "first", "run"]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stub-agent args: first run"), "{}", describe(&out));
    let ls = env.ls();
    assert!(ls.iter().all(|r| r["state"] == "running" && r["home"] == "own"), "{ls:?}");
    assert_eq!(ls.len(), 2);
}

/// The pid podman recorded for sandbox `name`'s `file` (`gvproxy.pid`, or
/// qemu's `<machine>_vm.pid`) in its runtime directory.
fn recorded_pid(env: &Env, name: &str, file: &str) -> i32 {
    let rec = ppp::sandbox::load(&env.dirs(), name).unwrap().unwrap();
    let path = rec.podman_run.unwrap().join("podman").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().parse().unwrap()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit(") ").next().is_some_and(|r| !r.starts_with('Z')))
}

/// Issue 23: gvproxy killed under a running machine (the VM has no network,
/// podman still calls it running, and podman 5.4.2's stop fails on "unable
/// to clean up gvproxy"), and qemu killed (podman calls it stopped, its
/// gvproxy lives on). Both are `broken` in `ls` and `diagnose`, with a
/// hint; `stop` and `rm` finish them, leaving no process of theirs. Fails
/// on the code before: `ls` said running and stopped, `ppp stop` failed,
/// and the gvproxy of the dead qemu outlived `rm`.
#[test]
fn a_machine_whose_gvproxy_or_qemu_died_is_broken_and_stop_and_rm_finish_it() {
    let env = Env::new("qemu");
    setup_policy(&env, "gv");
    setup_policy(&env, "qm");
    env.ok(&["create", "--name", "gv", "-m", "2g", "opencode", &env.ws()]);
    env.ok(&["create", "--name", "qm", "-m", "2g", "opencode", &env.ws()]);
    let gv_qemu = recorded_pid(&env, "gv", "ppp-gv_vm.pid");
    let qm_gvproxy = recorded_pid(&env, "qm", "gvproxy.pid");
    for (name, file) in [("gv", "gvproxy.pid"), ("qm", "ppp-qm_vm.pid")] {
        let pid = recorded_pid(&env, name, file);
        assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
        netns::wait_until("the killed process to go", netns::DEADLINE, || !alive(pid));
    }

    let out = env.run(&["ls", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let ls: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let row = |n: &str| ls.iter().find(|r| r["name"] == n).unwrap().clone();
    assert_eq!(row("gv")["state"], "broken", "{ls:?}");
    assert!(row("gv")["machine"]["Broken"].as_str().unwrap().contains("gvproxy"), "{ls:?}");
    assert_eq!(row("qm")["state"], "broken", "{ls:?}");
    assert!(row("qm")["machine"]["Broken"].as_str().unwrap().contains("qemu died"), "{ls:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`gv`'s machine is broken") && err.contains("hint: `ppp stop gv`"), "{err}");
    let report: Value = serde_json::from_str(&env.ok(&["diagnose", "-o", "json"])).unwrap();
    let sandboxes = report["sandboxes"].as_array().unwrap();
    for n in ["gv", "qm"] {
        let s = sandboxes.iter().find(|s| s["name"] == n).unwrap();
        assert_eq!(s["machine_state"], "broken", "{s}");
        assert!(s["machine_problem"].as_str().unwrap().contains(&format!("ppp stop {n}")), "{s}");
    }

    // stop finishes the one whose gvproxy died: podman's stop ends qemu,
    // fails on the gone gvproxy; ppp says so and finishes.
    let out = env.run(&["stop", "gv"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(err.contains("unable to clean up gvproxy") && err.contains("ppp finishes the stop"), "{err}");
    assert!(!alive(gv_qemu), "gv's qemu is gone");
    // rm of the one whose qemu died: its gvproxy is ended first (-f:
    // standard input is not a terminal to confirm on).
    let out = env.run(&["rm", "-f", "qm"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ended gvproxy"), "{}", describe(&out));
    assert!(!alive(qm_gvproxy), "qm's gvproxy outlived rm");
    let ls = env.ls();
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0]["state"], "stopped", "{ls:?}");
    // And the stopped one starts again, with a live gvproxy of its own.
    let out = env.run(&["run", "--name", "gv", "opencode", &env.ws(), "--", "again"]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(alive(recorded_pid(&env, "gv", "gvproxy.pid")));
    env.ok(&["rm", "-f", "gv"]);
}

#[test]
fn sixteen_parallel_creates_get_distinct_names_ports_and_addresses() {
    let env = Env::new("wsl");
    env.ok(&["policy", "init", "deny-all"]);
    // ppp refuses to give the VMs more memory than the host has: at the
    // smallest size, as many as this host holds, up to 16.
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
    let n = usize::try_from(total / 1536).unwrap().min(16);
    assert!(n >= 4, "this host has too little memory ({total} MiB) for the test");
    let outs: Vec<Output> = std::thread::scope(|s| {
        let hs: Vec<_> =
            (0..n).map(|_| s.spawn(|| env.run(&["create", "-q", "-m", "1536m", "opencode", &env.ws()]))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut names: Vec<String> = Vec::new();
    for o in &outs {
        assert!(o.status.success(), "{}", describe(o));
        names.push(String::from_utf8_lossy(&o.stdout).trim().to_owned());
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "{names:?}");
    let ls = env.ls();
    assert_eq!(ls.len(), n);
    let mut ports: Vec<u64> = ls.iter().map(|r| r["port"].as_u64().unwrap()).collect();
    let mut ips: Vec<String> = ls.iter().map(|r| r["inner_ip"].as_str().unwrap().to_owned()).collect();
    ports.sort_unstable();
    ips.sort();
    ips.dedup();
    assert_eq!(ports, (51820..51820 + n as u64).collect::<Vec<u64>>());
    assert_eq!(ips.len(), n);
    assert!(ls.iter().all(|r| r["state"] == "running"), "{ls:?}");
    let reg = ppp::sandbox::PortRegistry::load(&env.dirs()).unwrap();
    assert_eq!(reg.ports.len(), n);
    env.ok(&["rm", "--all", "-f"]);
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
}

/// `--clone`: the VM works on its own clone of the repository, and the
/// host fetches the agent's commits back through the `sandbox-<name>`
/// remote (git's `ext::` transport over `podman machine ssh`).
#[test]
fn a_cloned_workspace_goes_in_and_commits_come_back() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    let ws = env.ws();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-C", &ws])
            .args(args)
            .env("FAKE_PODMAN_ROOT", env.root().join("fake"))
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.test")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.test")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Not a repository yet: refused before anything is made.
    let out = env.run(&["create", "--clone", "--name", "red", "opencode", &ws]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a git repository"), "{}", describe(&out));
    git(&["init", "-q", "-b", "main"]);
    std::fs::write(Path::new(&ws).join("README"), "hello\n").unwrap();
    git(&["add", "README"]);
    git(&["commit", "-q", "-m", "first"]);

    env.ok(&["create", "--clone", "--name", "red", "opencode", &ws]);
    let guest = "/home/core/workspace/ws";
    assert_eq!(env.ok(&["exec", "red", "--", "cat", &format!("{guest}/README")]), "hello\n");
    // The VM's copy is its own: the host directory is not mounted.
    env.ok(&["exec", "red", "--", "sh", "-c", &format!("echo agent > {guest}/NEW && git -C {guest} add NEW && git -C {guest} -c user.name=a -c user.email=a@x commit -q -m agent-commit")]);
    assert!(!Path::new(&ws).join("NEW").exists());
    let remotes = git(&["remote", "-v"]);
    assert!(remotes.contains("sandbox-red\text::"), "{remotes}");
    git(&["fetch", "-q", "sandbox-red"]);
    assert_eq!(git(&["log", "-1", "--format=%s", "sandbox-red/main"]), "agent-commit\n");
    // The agent container works in the clone.
    let out = env.run(&["run", "--name", "red", "opencode", &ws]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("stub-agent cwd: {guest}")), "{}", describe(&out));
    // rm takes the remote away with the sandbox.
    env.ok(&["rm", "-f", "red"]);
    assert!(!git(&["remote"]).contains("sandbox-red"));
}

#[test]
fn reset_removes_sandboxes_and_state_and_secrets_unless_asked() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    env.ok(&["create", "--name", "red", "opencode", &env.ws()]);
    env.ok(&["secret", "set", "--sandbox", "red", "openai", "-t", "sk-red-only-0123456789"]);
    let out = env.run(&["reset"]);
    assert_eq!(out.status.code(), Some(2), "asks, and without a terminal refuses: {}", describe(&out));
    assert_eq!(env.ls().len(), 1);

    env.ok(&["reset", "-f", "--preserve-secrets"]);
    assert!(env.ls().is_empty());
    assert_eq!(env.podman(&["machine", "list", "--format", "json"]), serde_json::json!([]));
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    let dirs = env.dirs();
    assert!(!dirs.global_policy().exists() && !dirs.port_registry().exists() && !dirs.sandboxes().exists());
    let status: Value = serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).unwrap();
    assert_eq!(status["running"], false);
    let secrets = env.ok(&["secret", "ls"]);
    assert!(secrets.contains("anthropic"), "global secrets kept: {secrets}");
    assert!(!secrets.contains("openai"), "the sandbox's own secret went with it: {secrets}");

    env.ok(&["reset", "-f"]);
    assert!(!env.ok(&["secret", "ls"]).contains("anthropic"));
    assert!(!dirs.secrets_file().exists());
}

/// Ctrl-C stops the agent and leaves the sandbox running; ppp reports the
/// agent's end (SIGINT: 130).
#[test]
fn ctrl_c_stops_the_agent_and_keeps_the_vm() {
    use std::os::unix::process::CommandExt as _;
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    env.ok(&["create", "--name", "red", "opencode", &env.ws()]);
    let marker = env.root().join("ws/agent-started");
    // The stub agent runs `sh -c` on its second argument when the first is
    // `sleep-then`.
    let script = format!("touch {}; exec sleep 60", marker.display());
    let mut child = env
        .ppp(&["run", "--name", "red", "opencode", &env.ws(), "--", "sleep-then", &script])
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    netns::wait_until("the agent to start", std::time::Duration::from_secs(60), || marker.exists());
    // As a terminal does: SIGINT to the whole foreground process group.
    let pgid = nix::unistd::Pid::from_raw(-i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "ppp outlives Ctrl-C and reports the agent's end: {err}");
    assert_eq!(env.ls()[0]["state"], "running", "the VM keeps running");
    assert_eq!(env.ok(&["exec", "red", "--", "echo", "still here"]), "still here\n");
}

/// Kits given to `create`, then a kit applied to a running sandbox on the
/// fake podman: its rule joins the sandbox's policy as a kit rule, its file
/// lands in the VM with its mode, its startup command runs in the VM, and
/// its environment reaches the agent container. Applying it again changes nothing. A new version
/// applied while the agent runs makes the agent start again with it.
#[test]
fn a_kit_reaches_the_vm_the_policy_and_the_agent() {
    let env = Env::new("qemu");
    setup_policy(&env, "red");
    let kit = env.root().join("tools-kit");
    std::fs::create_dir_all(kit.join("bin")).unwrap();
    std::fs::write(
        kit.join("kit.yaml"),
        "apiVersion: ppp.kit/v1\nkind: Kit\nmetadata:\n  name: tools\n  version: 0.1.0\nspec:\n  \
         network:\n    allow: [\"registry.npmjs.org\"]\n  env:\n    TOOLS_HOME: /opt/tools\n  startup:\n    \
         - command: [\"sh\", \"-c\", \"touch /tmp/kit-started\"]\n  files:\n    - path: /opt/tools/bin/tool\n      \
         source: bin/tool\n      mode: 755\n",
    )
    .unwrap();
    std::fs::write(kit.join("bin/tool"), "#!/bin/sh\necho tool ran\n").unwrap();
    // Two more kits, given to `create` (`--kit` is repeatable): they apply
    // before the agent first starts.
    let early = env.root().join("early-kit");
    let net = env.root().join("net-kit");
    for (dir, spec) in [(&early, "env:\n    EARLY: from-create\n"), (&net, "network:\n    allow: [\"early.test\"]\n")] {
        std::fs::create_dir_all(dir).unwrap();
        let name = dir.file_name().unwrap().to_str().unwrap().trim_end_matches("-kit");
        let yaml =
            format!("apiVersion: ppp.kit/v1\nkind: Kit\nmetadata:\n  name: {name}\n  version: 1.0.0\nspec:\n  {spec}");
        std::fs::write(dir.join("kit.yaml"), yaml).unwrap();
    }
    let (early_ref, net_ref) = (early.display().to_string(), net.display().to_string());
    env.ok(&["create", "--name", "red", "--kit", &early_ref, "--kit", &net_ref, "opencode", &env.ws()]);
    let rules = env.ok(&["policy", "ls", "red", "--source", "kit", "--json"]);
    assert!(rules.contains("early.test") && rules.contains("kit:net"), "{rules}");
    let record: Value = serde_json::from_slice(&std::fs::read(env.dirs().sandbox_record("red")).unwrap()).unwrap();
    assert_eq!(record["kit_env"]["early"]["EARLY"], "from-create", "{record}");
    assert_eq!(record["kit_refs"], serde_json::json!([early_ref, net_ref]));
    let kit_ref = kit.display().to_string();
    env.ok(&["kit", "add", "red", &kit_ref]);

    assert_eq!(env.ok(&["exec", "red", "--", "/opt/tools/bin/tool"]), "tool ran\n");
    assert_eq!(env.ok(&["exec", "red", "--", "stat", "-c", "%a", "/opt/tools/bin/tool"]), "755\n");
    env.ok(&["exec", "red", "--", "test", "-f", "/tmp/kit-started"]);
    let rules: Value = serde_json::from_str(&env.ok(&["policy", "ls", "red", "--json"])).unwrap();
    let text = rules.to_string();
    assert!(text.contains("registry.npmjs.org") && text.contains("kit:tools"), "{text}");

    // Idempotent: a second apply leaves the policy and the record as they were.
    let dirs = env.dirs();
    let before =
        (std::fs::read(dirs.sandbox_policy("red")).unwrap(), std::fs::read(dirs.sandbox_record("red")).unwrap());
    env.ok(&["kit", "add", "red", &kit_ref]);
    let after =
        (std::fs::read(dirs.sandbox_policy("red")).unwrap(), std::fs::read(dirs.sandbox_record("red")).unwrap());
    assert_eq!(before, after);

    let out = env.run(&["run", "--name", "red", "opencode", &env.ws()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("stub-agent kit-env: /opt/tools"), "{}", describe(&out));

    // A new version of the kit while an agent runs: the agent container is
    // made again, so it gets the new variable and sees the new file (under
    // /home/core, which a container sees only through its mount), and the
    // `ppp run` session carries on with it.
    let log = env.root().join("ws/agent.log");
    let script = format!(
        "echo \"$EARLY $TOOLS_HOME ${{EXTRA:-none}} $(cat /home/core/.config/tools/extra.conf 2>/dev/null || echo absent)\" \
         >> {}; if [ -n \"$EXTRA\" ]; then exit 5; fi; exec sleep 120",
        log.display()
    );
    let mut child = env
        .ppp(&["run", "--name", "red", "opencode", &env.ws(), "--", "sleep-then", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    netns::wait_until("the agent to start", std::time::Duration::from_secs(60), || !lines().is_empty());
    std::fs::write(
        kit.join("kit.yaml"),
        "apiVersion: ppp.kit/v1\nkind: Kit\nmetadata:\n  name: tools\n  version: 0.2.0\nspec:\n  \
         env:\n    TOOLS_HOME: /opt/tools\n    EXTRA: \"yes\"\n  files:\n    - path: /opt/tools/bin/tool\n      \
         source: bin/tool\n      mode: 755\n    - path: /home/core/.config/tools/extra.conf\n      \
         content: \"forty-two\"\n  startup:\n    - command: [\"test\", \"-e\", \"/tmp/kit-ok\"]\n",
    )
    .unwrap();
    // Its startup command fails first: the kit is recorded but not
    // finished, so the agent keeps running as it was.
    let out = env.run(&["kit", "add", "red", &kit_ref]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is only partly applied"), "{}", describe(&out));
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "the agent was not restarted by a half-applied kit");
    // Fixed, and added again: the record does not change this time, but the
    // container's label is older than the record's generation, so the agent
    // restarts now.
    env.ok(&["exec", "red", "--", "touch", "/tmp/kit-ok"]);
    let calls_before = env.calls().len();
    env.ok(&["kit", "add", "red", &kit_ref]);
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(5), "the session ends with the restarted agent's code: {err}");
    assert_eq!(lines(), "from-create /opt/tools none absent\nfrom-create /opt/tools yes forty-two\n", "{err}");
    assert!(err.contains("a kit changed sandbox `red`; starting the agent again"), "{err}");
    let calls = env.calls()[calls_before..].join("\n");
    for want in [
        "container exists ppp-agent-red",
        "container inspect --format {{index .Config.Labels \"ppp.generation\"}} ppp-agent-red",
        "stop -t 10 ppp-agent-red",
        "--label ppp.generation=",
        "-v /home/core/.config/tools/extra.conf:/home/core/.config/tools/extra.conf:ro",
        "-v /opt/tools/bin/tool:/opt/tools/bin/tool:ro",
    ] {
        assert!(calls.contains(want), "no `{want}` in the calls:\n{calls}");
    }
    // The version-0.2.0 kit has no network section: its rule is gone.
    let rules = env.ok(&["policy", "ls", "red", "--json"]);
    assert!(!rules.contains("registry.npmjs.org"), "{rules}");

    // The same kit again, with no agent running: nothing to restart, and
    // the record (with its generation) stays as it is.
    let record = std::fs::read(dirs.sandbox_record("red")).unwrap();
    env.ok(&["kit", "add", "red", &kit_ref]);
    assert_eq!(std::fs::read(dirs.sandbox_record("red")).unwrap(), record);
}

//! Two real sandboxes at once (issues 25, 24, 23 on the real VM): each in
//! its own podman home (podman's one-running-machine rule is per home), both
//! behind the one mitmdump, each with its own policy. The first builds the
//! agent image from a Containerfile of the test's own, set the way the
//! product reads one (`PPP_OPENCODE_CONTAINERFILE`, no `PPP_OPENCODE_IMAGE`):
//! `FROM` the rig's registry, a `RUN` that fetches over HTTPS through the
//! tunnel (the build trusts the proxy's CA). The second loads it from the
//! host's cache without a build. Then the second is stopped and removed
//! while the first holds an SSE stream, which keeps flowing; and the first's
//! qemu is killed: ppp reports it broken, and stop and rm clean up.
//!
//! Each VM gets 2 vCPUs and 1536 MiB (ppp's floor). With one vCPU, TCG's
//! one thread per vCPU could not use the host's second core: on a busy
//! 2-core host a second guest's boot passed podman's 5-minute start (the
//! run of 13:33). The first VM idles while the second boots. See
//! docs/harness.md, "The real VM".

#[path = "support/netns.rs"]
mod netns;

#[path = "support/sandbox_env.rs"]
mod sandbox_env;

#[path = "support/vm.rs"]
mod vm;

use std::path::Path;
use std::time::{Duration, Instant};

use netns::describe;
use serde_json::Value;
use vm::Rig;

/// Both VMs' size: two TCG vCPUs (one thread each) and ppp's smallest memory.
const SIZE: [&str; 4] = ["--cpus", "2", "-m", "1536"];

/// The qemu RSS of sandbox `name`'s VM, in MiB (`VmRSS` of its recorded pid).
fn qemu_rss_mib(rig: &Rig, name: &str) -> u64 {
    let pid = rig.machine_pid_in(name, "qemu");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024
}

/// The timed steps `ppp run` printed (`ppp: … done in …`).
fn steps(out: &std::process::Output) -> String {
    vm::timed_steps(out)
}

/// The HTTP status `name`'s VM gets for `url` (`000`: no HTTP answer).
fn status(rig: &Rig, name: &str, url: &str) -> String {
    let out =
        rig.env.run(&["exec", name, "--", "curl", "-s", "-m", "30", "-o", "/dev/null", "-w", "%{http_code}", url]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether the flow log holds a deny for `sandbox` to `host` (an HTTPS
/// flow the policy refuses may end before any status: curl's `000`).
fn denied(rig: &Rig, sandbox: &str, host: &str) -> bool {
    let flows = std::fs::read_to_string(rig.env.dirs().flows_log()).unwrap_or_default();
    flows.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).any(|f| {
        f["sandbox"] == sandbox && f["host"] == host && f["decision"].as_str().is_some_and(|d| d.starts_with("deny"))
    })
}

#[test]
fn two_real_sandboxes_at_once_one_image_build_their_own_policies() {
    let mut rig = Rig::new();
    // The product's own build path: no image given (blank is unset; the
    // fixture's base environment names the fake's image), a Containerfile
    // of ours.
    rig.env.extra.retain(|(k, _)| k != "PPP_OPENCODE_IMAGE");
    rig.env.extra.push(("PPP_OPENCODE_IMAGE".into(), String::new()));
    let containerfile = rig.env.root().join("agent.Containerfile");
    std::fs::write(
        &containerfile,
        format!(
            "FROM {}\n\
             ARG CURL_CA_BUNDLE\n\
             RUN curl -sS --fail -m 120 -o /opt/build-step.json https://echo.test/build-step && grep -q build-step /opt/build-step.json\n",
            rig.image
        ),
    )
    .unwrap();
    rig.env.extra.push(("PPP_OPENCODE_CONTAINERFILE".into(), containerfile.display().to_string()));
    let env = &rig.env;
    // a reaches echo.test; b reaches api.anthropic.com and not echo.test
    // (the upstream's address needs its own rule, DNS-rebinding defence).
    env.ok(&["policy", "init", "deny-all"]);
    env.ok(&["policy", "allow", "network", "--sandbox", "a", "echo.test,198.18.0.10"]);
    env.ok(&["policy", "allow", "network", "--sandbox", "b", "api.anthropic.com,198.18.0.10"]);
    env.ok(&["secret", "set", "-g", "anthropic", "-t", sandbox_env::KEY]);

    // a: built in its VM, through the tunnel, and saved on the host.
    let started = Instant::now();
    let out = rig.run_agent_with("a", &SIZE);
    let a_time = started.elapsed();
    eprintln!("real VM: `ppp run` of a (init, boot, provision, build, agent) took {a_time:.0?}: {}", steps(&out));
    assert_eq!(out.status.code(), Some(7), "{}", rig.explain("a", &out));
    let a_out = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(a_out.contains("vm-agent tls: 200"), "a reaches echo.test: {a_out}");
    let a_log = std::fs::read_to_string(env.dirs().sandbox_machine_log("a")).unwrap();
    assert!(a_log.contains("# building localhost/ppp/opencode:"), "a built its image:\n{a_log}");
    let seen = std::fs::read_to_string(&env.upstream.requests_log).unwrap_or_default();
    let step = seen.lines().find(|l| l.contains("\"/build-step\"")).unwrap_or_default();
    assert!(step.contains("\"tls\": true"), "the build's RUN step fetched over HTTPS through the tunnel: {seen}");
    let cache = env.dirs().cache.join("images");
    let archives: Vec<_> = walk(&cache);
    assert!(!archives.is_empty(), "the built image is saved under {}", cache.display());

    // b, while a runs: loaded from the cache, no build; its own policy.
    let started = Instant::now();
    let out = rig.run_agent_with("b", &SIZE);
    let b_time = started.elapsed();
    eprintln!("real VM: `ppp run` of b (init, boot, provision, load, agent) took {b_time:.0?}: {}", steps(&out));
    assert_eq!(out.status.code(), Some(7), "{}", rig.explain("b", &out));
    let b_out = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        (b_out.contains("vm-agent tls: 403") || b_out.contains("vm-agent tls: 000")) && denied(&rig, "b", "echo.test"),
        "b's policy denies echo.test: {b_out}"
    );
    let b_log = std::fs::read_to_string(env.dirs().sandbox_machine_log("b")).unwrap();
    assert!(b_log.contains("podman load --input"), "b loaded the cached image:\n{b_log}");
    assert!(!b_log.contains("# building") && !b_log.contains("podman build"), "b built nothing:\n{b_log}");
    let ls = env.ls();
    assert_eq!(ls.len(), 2);
    assert!(ls.iter().all(|r| r["state"] == "running" && r["home"] == "own"), "{ls:?}");
    let report: Value = serde_json::from_str(&env.ok(&["diagnose", "-o", "json"])).unwrap();
    let origin = |n: &str| {
        report["sandboxes"].as_array().unwrap().iter().find(|s| s["name"] == n).unwrap()["image_origin"].clone()
    };
    assert_eq!((origin("a"), origin("b")), ("built".into(), "cached".into()), "{report}");
    let (rss_a, rss_b) = (qemu_rss_mib(&rig, "a"), qemu_rss_mib(&rig, "b"));
    eprintln!("real VM: qemu RSS with both running: a {rss_a} MiB, b {rss_b} MiB");

    // Each reaches only what its own policy allows.
    assert_eq!(status(&rig, "a", "https://echo.test/a-allowed"), "200");
    assert_eq!(status(&rig, "b", "https://api.anthropic.com/b-allowed"), "200");
    for (who, host) in [("a", "api.anthropic.com"), ("b", "echo.test")] {
        let code = status(&rig, who, &format!("https://{host}/{who}-denied"));
        assert!(code == "403" || code == "000", "{who} to {host}: {code}");
        assert!(denied(&rig, who, host), "{who}'s deny of {host} in flows.jsonl");
    }
    let seen = std::fs::read_to_string(&env.upstream.requests_log).unwrap_or_default();
    assert!(!seen.contains("-denied"), "no denied request reached the upstream: {seen}");

    // a holds an SSE stream (an event every 250 ms) while b is stopped
    // and removed; it keeps flowing.
    let sse = "curl -sSN -m 900 https://echo.test/sse-ticks/2400/250 >/tmp/sse.out 2>/tmp/sse.err";
    env.ok(&["exec", "a", "--", "sudo", "systemd-run", "--unit", "ppp-sse", "sh", "-c", sse]);
    let events = || {
        let out = env.run(&["exec", "a", "--", "sh", "-c", "grep -c '^data:' /tmp/sse.out || true"]);
        String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap_or(0)
    };
    let begun = Instant::now();
    while events() < 4 {
        assert!(begun.elapsed() < Duration::from_secs(120), "the SSE stream began in a");
        std::thread::sleep(Duration::from_secs(2));
    }
    env.ok(&["stop", "b"]);
    env.ok(&["rm", "-f", "b"]);
    let after_rm = events();
    std::thread::sleep(Duration::from_secs(10));
    let later = events();
    eprintln!("real VM: a's SSE stream: {after_rm} events when b was gone, {later} ten seconds later");
    assert!(later > after_rm, "a's SSE stream kept flowing after b's stop and rm ({after_rm} then {later})");
    let active = env.run(&["exec", "a", "--", "systemctl", "is-active", "ppp-sse"]);
    assert_eq!(String::from_utf8_lossy(&active.stdout).trim(), "active", "{}", describe(&active));
    assert_eq!(env.ls().len(), 1);

    // Kill a's qemu: fails closed (the VM is gone), ppp reports it broken,
    // stop and rm clean up: no qemu, gvproxy or virtiofsd left, the podman
    // home gone.
    let qemu = rig.machine_pid_in("a", "qemu");
    let gvproxy = rig.machine_pid_in("a", "gvproxy");
    let run_dir = ppp::sandbox::load(&env.dirs(), "a").unwrap().unwrap().podman_run.unwrap();
    let out = std::process::Command::new("kill").args(["-9", &qemu.to_string()]).output().unwrap();
    assert!(out.status.success(), "kill qemu: {}", describe(&out));
    netns::wait_until("qemu to go", netns::DEADLINE, || !vm::alive(qemu));
    std::thread::sleep(Duration::from_secs(3));
    let gvproxy_lived = vm::alive(gvproxy);
    let out = env.run(&["ls", "--json"]);
    let ls: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!(
        "real VM: ppp ls after qemu died (gvproxy {}): {} {}",
        if gvproxy_lived { "still running" } else { "gone with it" },
        ls[0]["state"],
        ls[0]["machine"]
    );
    // podman lists it stopped. gvproxy 0.8.1 ends with its qemu (the run
    // of 13:49): then "stopped" is the truth and nothing is left; were it
    // left running (the fake's case), ppp says broken.
    let want = if gvproxy_lived { "broken" } else { "stopped" };
    assert_eq!(ls[0]["state"], want, "{}", describe(&out));
    if gvproxy_lived {
        assert!(String::from_utf8_lossy(&out.stderr).contains("hint: `ppp stop a`"), "{}", describe(&out));
    }
    let report: Value = serde_json::from_str(&env.ok(&["diagnose", "-o", "json"])).unwrap();
    assert_eq!(report["sandboxes"][0]["machine_state"], want, "{report}");
    let out = env.run(&["exec", "a", "--", "true"]);
    assert!(!out.status.success(), "nothing answers in a VM whose qemu is gone: {}", describe(&out));
    let out = env.run(&["stop", "a"]);
    eprintln!("real VM: ppp stop after qemu died: {}", describe(&out));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!vm::alive(gvproxy), "a's gvproxy ({gvproxy}) outlived ppp stop");
    assert_eq!(env.ls()[0]["state"], "stopped");
    env.ok(&["rm", "-f", "a"]);
    assert!(env.ls().is_empty());
    assert!(!env.dirs().sandbox_podman("a").exists() && !run_dir.exists(), "a's podman home is gone");
    for dir in [rig.state.display().to_string(), run_dir.display().to_string(), env.ws()] {
        let left = std::process::Command::new("pgrep").arg("-af").arg(&dir).output().unwrap();
        assert!(left.stdout.is_empty(), "left running ({dir}): {}", describe(&left));
    }
    eprintln!("real VM: two at once: a {a_time:.0?} (built), b {b_time:.0?} (cached), qemu RSS {rss_a} + {rss_b} MiB");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

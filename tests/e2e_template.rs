//! Templates end to end on the fake podman, with the real daemon,
//! mitmdump, provision.sh and `qemu-img`: a provisioned sandbox saved as a
//! template, exported, loaded into a fresh cache, and a new sandbox created
//! from it with `-t` that boots from the template's disk and does not pull
//! the agent image again. The fake carries a machine's guest state in its
//! disk (see docs/harness.md), so the new machine sees the old one's
//! `/var/lib/ppp/.provisioned`.

#![allow(dead_code)]

#[path = "support/netns.rs"]
mod netns;

#[path = "support/sandbox_env.rs"]
mod sandbox_env;

use sandbox_env::{Env, setup_policy};
use serde_json::Value;

/// Every call as `(guest, argv)`, where `guest` is the machine a call was
/// made in (empty for the host's).
fn raw_calls(env: &Env) -> Vec<(String, Vec<String>)> {
    std::fs::read_to_string(env.root().join("fake/calls.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let argv = v["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
            (v["guest"].as_str().unwrap_or("").to_owned(), argv)
        })
        .collect()
}

fn private_key(wg0: &str) -> String {
    wg0.lines().find_map(|l| l.strip_prefix("PrivateKey = ")).expect("a PrivateKey line").to_owned()
}

#[test]
fn save_load_and_create_from_a_template() {
    assert!(
        std::process::Command::new("qemu-img").arg("--version").output().is_ok_and(|o| o.status.success()),
        "qemu-img is missing: run `make test-deps` (package qemu-utils)"
    );
    let mut env = Env::new("qemu");
    setup_policy(&env, "red");
    env.ok(&["policy", "allow", "network", "--sandbox", "blue", "echo.test,api.anthropic.com,198.18.0.10"]);
    env.ok(&["create", "--name", "red", "opencode", &env.ws()]);
    assert!(
        raw_calls(&env).iter().any(|(g, a)| g == "ppp-red" && a.iter().any(|w| w == "pull")),
        "the first sandbox pulls the agent image"
    );
    // Leave a mark in the guest's persistent state to find in the copy.
    env.ok(&["exec", "red", "--", "sudo", "sh", "-c", "echo from-red > /var/lib/ppp-template-mark"]);

    // Save a running sandbox: stopped first (-f), then the disk converted.
    let file = env.root().join("base.tar");
    let out = env.ok(&["template", "save", "-f", "red", "base", "-o", file.to_str().unwrap()]);
    assert!(out.contains("saved template `base`"), "{out}");
    assert_eq!(env.ls()[0]["state"], "stopped");
    let saved: Vec<Value> = serde_json::from_str(&env.ok(&["template", "ls", "--json"])).unwrap();
    assert_eq!(saved[0]["source"], "red");
    // Issue 11 point 5: the template carries no WireGuard key. Its disk,
    // read as raw bytes, does not hold red's private key anywhere (it was
    // on tmpfs in the VM only).
    let red_wg0 = std::fs::read_to_string(env.dirs().sandbox_wg_conf("red")).unwrap();
    let red_key = private_key(&red_wg0);
    let raw = env.root().join("template.raw");
    let out = std::process::Command::new("qemu-img")
        .args(["convert", "-q", "-O", "raw"])
        .arg(saved[0]["path"].as_str().unwrap())
        .arg(&raw)
        .output()
        .unwrap();
    assert!(out.status.success(), "qemu-img convert: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&raw).unwrap();
    assert!(bytes.len() > 1024, "the disk holds the guest's state");
    assert!(!bytes.windows(red_key.len()).any(|w| w == red_key.as_bytes()), "the template holds red's WireGuard key");
    std::fs::remove_file(&raw).unwrap();

    // Into a fresh cache, then a sandbox from it.
    let fresh = env.root().join("cache2");
    env.extra.push(("PPP_CACHE".into(), fresh.display().to_string()));
    assert_eq!(env.ok(&["template", "ls", "--json"]).trim(), "[]");
    let out = env.ok(&["template", "load", file.to_str().unwrap()]);
    assert!(out.contains("loaded template `base`"), "{out}");
    let loaded: Vec<Value> = serde_json::from_str(&env.ok(&["template", "ls", "--json"])).unwrap();
    assert_eq!(loaded[0]["sha256"], saved[0]["sha256"]);
    let disk = loaded[0]["path"].as_str().unwrap().to_owned();
    assert!(disk.starts_with(&fresh.display().to_string()), "{disk}");

    let before = raw_calls(&env).len();
    let out = env.ok(&["create", "--name", "blue", "-t", "base", "opencode", &env.ws()]);
    assert!(out.contains("created sandbox `blue`"), "{out}");
    let calls = raw_calls(&env)[before..].to_vec();
    let init = calls
        .iter()
        .find(|(g, a)| g.is_empty() && a.get(..2) == Some(&["machine".to_owned(), "init".to_owned()][..]))
        .expect("a machine init");
    let at = init.1.iter().position(|w| w == "--image").expect("--image");
    assert_eq!(init.1[at + 1], disk, "{:?}", init.1);
    let pulls: Vec<_> = calls.iter().filter(|(g, a)| g == "ppp-blue" && a.iter().any(|w| w == "pull")).collect();
    assert!(pulls.is_empty(), "no pull in the templated sandbox: {pulls:?}");
    let log = std::fs::read_to_string(env.dirs().sandbox_machine_log("blue")).unwrap();
    assert!(log.contains("already pulled"), "provision.sh skipped the pull:\n{log}");
    let mark = env.ok(&["exec", "blue", "--", "cat", "/var/lib/ppp-template-mark"]);
    assert_eq!(mark, "from-red\n");
    // And the sandbox made from it has keys of its own.
    let blue_wg0 = std::fs::read_to_string(env.dirs().sandbox_wg_conf("blue")).unwrap();
    assert_ne!(private_key(&blue_wg0), red_key);
    let rec: Value =
        serde_json::from_str(&std::fs::read_to_string(env.dirs().sandbox_record("blue")).unwrap()).unwrap();
    assert_eq!(rec["template_tag"], "base");
    env.ok(&["rm", "-f", "blue"]);

    // A tag ppp does not know is an image reference, passed on as it is.
    let before = raw_calls(&env).len();
    let out = env.run(&["create", "--name", "green", "-t", "quay.io/example/machine-os:6.0", "opencode", &env.ws()]);
    let _ = out;
    let init = raw_calls(&env)[before..]
        .iter()
        .find(|(g, a)| g.is_empty() && a.get(..2) == Some(&["machine".to_owned(), "init".to_owned()][..]))
        .cloned()
        .expect("a machine init");
    let at = init.1.iter().position(|w| w == "--image").expect("--image");
    assert_eq!(init.1[at + 1], "quay.io/example/machine-os:6.0");
}

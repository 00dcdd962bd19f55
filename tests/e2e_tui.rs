//! `ppp tui` on a real terminal: tmux runs the real binary inside the
//! test's host namespace, against a sandbox the real `ppp create` made on
//! the fake podman (as in `e2e_sandbox.rs`), with the real daemon and
//! mitmdump. The test reads the screen with `tmux capture-pane`, presses
//! keys with `tmux send-keys`, and checks that quitting gives the terminal
//! back (the pane leaves the alternate screen and the shell runs on).
//!
//! Needs root (namespaces) and tmux; fails, never skips, without them.

#[path = "support/netns.rs"]
mod netns;
#[path = "support/sandbox_env.rs"]
mod sandbox_env;
#[path = "support/tmux.rs"]
mod tmux;

use std::time::Duration;

use netns::wait_until;
use sandbox_env::Env;
use tmux::Tmux;

#[test]
fn the_dashboard_shows_a_sandbox_helps_and_gives_the_terminal_back() {
    let env = Env::new("qemu");
    env.ok(&["policy", "init", "deny-all"]);
    env.ok(&["policy", "allow", "network", "--sandbox", "red", "echo.test,198.18.0.10"]);
    let ws = env.root().join("ws").display().to_string();
    let out = env.ok(&["create", "--name", "red", "opencode", &ws]);
    assert!(out.contains("created sandbox `red`"), "{out}");
    // One denial in the flow log for the dashboard to count and highlight.
    let code = env.denied_status("red");
    assert_eq!(code, "403");

    // `ppp tui` with exactly the environment above, inside the host
    // namespace; the shell prints its exit code when it returns.
    let script = env.root().join("tui.sh");
    let vars: Vec<String> = env.vars().into_iter().map(|(k, v)| format!("{k}='{v}'")).collect();
    std::fs::write(
        &script,
        format!(
            "ip netns exec {ns} env -i {vars} TERM=\"$TERM\" {ppp} tui\necho \"ppp exited with $?\"\n",
            ns = env.topo.host_ns(),
            vars = vars.join(" "),
            ppp = env!("CARGO_BIN_EXE_ppp"),
        ),
    )
    .unwrap();
    let tmux = Tmux::start(env.root(), 120, 30);
    tmux.keys(&[&format!("sh {}", script.display()), "Enter"]);

    // The list: the sandbox, running, its inner address, and as many
    // denials as the flow log holds (the handover check's probe is one).
    let flows = std::fs::read_to_string(env.root().join("data/flows.jsonl")).unwrap();
    let denials = flows
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|f| f["sandbox"] == "red" && f["decision"] == "deny")
        .count();
    assert!(denials >= 1, "{flows}");
    let deny_row =
        regex::Regex::new(&format!(r"red\s+opencode\s+running\s+\d+\s+\w+\s+\w+\s+10\.0\.0\.2\s+-\s+{denials}\s"))
            .unwrap();
    let screen = tmux.wait_for("the sandbox row with its denials", |s| deny_row.is_match(s));
    assert!(screen.contains("1 sandbox · daemon running"), "{screen}");
    assert!(tmux.alternate_on(), "the dashboard draws on the alternate screen");

    // The pane under the list shows a request through the tunnel as soon
    // as the proxy logs it: its path, never its query.
    env.ok(&[
        "exec",
        "red",
        "--",
        "curl",
        "-s",
        "-m",
        "15",
        "-o",
        "/dev/null",
        "--connect-to",
        "denied.test:80:203.0.113.9:80",
        "http://denied.test/live-pane?token=tok-e2e-4444",
    ]);
    let screen = tmux.wait_for("the request in the flow pane", |s| s.contains("/live-pane"));
    assert!(screen.contains("latest flows of `red`") && !screen.contains("tok-e2e-4444"), "{screen}");
    let line = screen.lines().find(|l| l.contains("/live-pane")).unwrap();
    assert!(line.contains("denied.test") && line.contains("DENY"), "{screen}");

    // The flow log of the selected sandbox shows the denial.
    tmux.keys(&["l"]);
    let screen = tmux.wait_for("the flow log", |s| s.contains("flows of `red`"));
    let line = screen.lines().find(|l| l.contains("denied.test")).unwrap_or_else(|| panic!("{screen}"));
    assert!(line.contains("DENY"), "{screen}");
    tmux.keys(&["l"]);
    tmux.wait_for("the list again", |s| s.contains("NAME"));

    // e: a shell in the VM on the normal screen, then the dashboard again.
    tmux.keys(&["e"]);
    tmux.wait_for("the shell", |s| s.contains("ppp: shell in `red`; exit it"));
    assert!(!tmux.alternate_on(), "the shell runs on the normal screen");
    tmux.keys(&["cat /etc/hostname", "Enter"]);
    tmux.wait_for("the VM's hostname", |s| s.lines().any(|l| l.trim().ends_with("ppp-red")));
    tmux.keys(&["exit", "Enter"]);
    // The status is the shell's: dash in the fake's PID namespace cannot
    // hand the terminal's process group back and exits 2 saying so (ppp
    // takes the terminal back itself), so only its presence is checked.
    tmux.wait_for("the dashboard after the shell", |s| s.contains("shell in `red` exited with status"));
    assert!(tmux.alternate_on());

    // x stops, s starts again (reattach: provision and verify), off the UI
    // thread with a status line.
    tmux.keys(&["x"]);
    tmux.wait_for("the stop", |s| s.contains("stopped `red`") && s.contains("red  opencode  stopped"));
    tmux.keys(&["s"]);
    tmux.wait_for("the start to begin", |s| s.contains("starting `red`…"));
    tmux.wait_within(Duration::from_secs(120), "the start", |s| {
        s.contains("started `red`") && s.contains("red  opencode  running")
    });

    // d asks first; n keeps the sandbox.
    tmux.keys(&["d"]);
    tmux.wait_for("the confirmation", |s| s.contains("Remove sandbox `red`?"));
    tmux.keys(&["n"]);
    tmux.wait_for("the answer", |s| s.contains("kept `red`"));
    assert_eq!(env.ok(&["ls", "-q"]), "red\n");

    // Help.
    tmux.keys(&["?"]);
    let screen = tmux.wait_for("the help", |s| s.contains("move the selection"));
    assert!(screen.contains("remove the sandbox, after a y/n confirmation"), "{screen}");

    // d, y removes it; the empty state follows.
    tmux.keys(&["Escape"]);
    tmux.wait_for("the list again", |s| s.contains("NAME"));
    tmux.keys(&["d"]);
    tmux.wait_for("the confirmation", |s| s.contains("Remove sandbox `red`?"));
    tmux.keys(&["y"]);
    tmux.wait_for("the removal", |s| s.contains("removed `red`") && s.contains("No sandboxes yet."));
    assert_eq!(env.ok(&["ls", "-q"]), "");

    // Quit: the process ends with 0 and the terminal is back to normal.
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("ppp to exit", |s| s.contains("ppp exited with"));
    assert!(screen.contains("ppp exited with 0"), "{screen}");
    assert!(!tmux.alternate_on(), "the alternate screen is off again");
    // The shell reads lines again, with echo: raw mode is off.
    tmux.keys(&["echo still-$((40+2))", "Enter"]);
    tmux.wait_for("the shell to answer", |s| s.contains("still-42"));
    wait_until("nothing in the pane but the shell", Duration::from_secs(5), || !tmux.screen().contains("sandboxes ─"));
}

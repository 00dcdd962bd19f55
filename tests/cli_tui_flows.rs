//! The dashboard's live flow pane on a real terminal (tmux): flows the test
//! appends to `flows.jsonl`, the way the addon writes them, show under the
//! sandbox list for the selected sandbox as they are logged, also after the
//! log is rotated, and in the flow log (`l`). No VM and no daemon: a
//! sandbox record and a podman that knows no machines are all it needs.
//!
//! Needs tmux; fails, never skips, without it.

mod common;
#[path = "support/tmux.rs"]
mod tmux;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::World;
use serde_json::{Value, json};
use tmux::Tmux;

/// Long enough for the first frame of a debug build under load. A flow
/// reaches the pane only through the follower, so the deadline can be
/// generous without letting the 2-second refresh pass for it.
const SCREEN_DEADLINE: Duration = Duration::from_secs(30);

fn flow(sandbox: &str, host: &str, path: &str, denied: bool) -> Value {
    json!({"sandbox": sandbox, "timestamp": "2026-11-29T10:00:00.000Z", "kind": "http", "host": host,
        "ip": "203.0.113.7", "port": 443, "method": "POST", "path": path,
        "status": if denied { 403 } else { 200 }, "decision": if denied { "deny" } else { "allow" },
        "matched_rule": null, "bytes_out": 1536, "bytes_in": 5_400_000, "duration_ms": 830})
}

fn append(path: &Path, v: &Value) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    f.write_all(format!("{v}\n").as_bytes()).unwrap();
}

#[test]
fn the_flow_pane_shows_flows_as_they_are_logged() {
    let w = World::new();
    w.write_record("red", 51820, "running");
    w.fake("podman", "echo '[]'");
    let log = w.data().join("flows.jsonl");
    append(&log, &flow("red", "backlog.example", "/before", false));

    let script = w.path().join("tui.sh");
    std::fs::write(
        &script,
        format!(
            "env -i HOME='{home}' PATH='{bin}:/usr/bin:/bin' PPP_CONFIG='{config}' PPP_DATA='{data}' \
             PPP_CACHE='{cache}' PPP_PODMAN='{bin}/podman' TERM=\"$TERM\" {ppp} tui\n\
             echo \"ppp exited with $?\"\n",
            home = w.home().display(),
            bin = w.bin().display(),
            config = w.config().display(),
            data = w.data().display(),
            cache = w.cache().display(),
            ppp = env!("CARGO_BIN_EXE_ppp"),
        ),
    )
    .unwrap();
    let tmux = Tmux::start(w.path(), 120, 30);
    tmux.keys(&[&format!("sh {}", script.display()), "Enter"]);

    let screen = tmux.wait_within(SCREEN_DEADLINE, "the pane with the backlog", |s| {
        s.contains("latest flows of `red`") && s.contains("backlog.example")
    });
    assert!(screen.contains("NAME"), "the list is still there: {screen}");

    // A flow logged now shows in the pane, its path without the query.
    append(&log, &flow("red", "api.example.com", "/live/check?token=tok-9999", true));
    let screen = tmux.wait_within(SCREEN_DEADLINE, "the new flow", |s| s.contains("/live/check"));
    let line = screen.lines().find(|l| l.contains("/live/check")).unwrap();
    for part in ["POST", "api.example.com", "DENY", "1.5KiB", "5.1MiB", "830ms"] {
        assert!(line.contains(part), "`{part}` in {line}");
    }
    assert!(!screen.contains("tok-9999"), "{screen}");
    // Another sandbox's flow is not in red's pane.
    append(&log, &flow("blue", "blue-only.example", "/", false));

    // Rotated as the addon does it: the next flow still shows.
    std::fs::rename(&log, w.data().join("flows.jsonl.1")).unwrap();
    append(&log, &flow("red", "after-rotation.example", "/rotated", false));
    let screen = tmux.wait_within(SCREEN_DEADLINE, "the flow after rotation", |s| s.contains("/rotated"));
    assert!(!screen.contains("blue-only.example"), "{screen}");

    // The flow log of the sandbox has them too.
    tmux.keys(&["l"]);
    let screen = tmux.wait_within(SCREEN_DEADLINE, "the flow log", |s| s.contains("flows of `red`"));
    assert!(screen.contains("after-rotation.example") && screen.contains("backlog.example"), "{screen}");
    tmux.keys(&["q"]);
    let screen = tmux.wait_within(SCREEN_DEADLINE, "ppp to exit", |s| s.contains("ppp exited with"));
    assert!(screen.contains("ppp exited with 0"), "{screen}");
}

//! A private tmux server for driving `ppp tui` on a real terminal: its own
//! socket, no config, one pane running `sh`. The test reads the screen with
//! `capture-pane` and presses keys with `send-keys`. Dropping it kills the
//! server and everything in the pane.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// A `width`x`height` pane running `sh`; fails, never skips, without tmux.
    pub fn start(dir: &Path, width: u16, height: u16) -> Tmux {
        let version = Command::new("tmux").arg("-V").output();
        assert!(
            version.is_ok_and(|o| o.status.success()),
            "tmux is missing: run `make test-deps` (scripts/install-test-deps.sh installs it)"
        );
        let t = Tmux { socket: dir.join("tmux.sock") };
        let (w, h) = (width.to_string(), height.to_string());
        t.ok(&["-f", "/dev/null", "new-session", "-d", "-s", "tui", "-x", &w, "-y", &h, "sh"]);
        t
    }

    fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("TERM", "xterm-256color")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn screen(&self) -> String {
        self.ok(&["capture-pane", "-p", "-t", "tui"])
    }

    /// Whether the pane shows the alternate screen (a full-screen program
    /// holds the terminal).
    pub fn alternate_on(&self) -> bool {
        self.ok(&["display", "-p", "-t", "tui", "#{alternate_on}"]).trim() == "1"
    }

    /// Send keys (tmux key names: `q`, `Enter`, `Escape`).
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "tui"];
        args.extend(keys);
        self.ok(&args);
    }

    /// Wait up to 30 s (the first refresh of a debug build under load)
    /// until the screen shows something `cond` accepts; return it.
    pub fn wait_for(&self, what: &str, cond: impl Fn(&str) -> bool) -> String {
        self.wait_within(Duration::from_secs(30), what, cond)
    }

    /// Wait up to `deadline` until the screen shows something `cond`
    /// accepts; return it.
    pub fn wait_within(&self, deadline: Duration, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + deadline;
        loop {
            let screen = self.screen();
            if cond(&screen) {
                return screen;
            }
            assert!(Instant::now() < end, "timed out waiting for {what}; the screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

//! `ppp tui` on a terminal that never answers the cursor position query
//! (ESC[6n), as an editor's shell buffer or a serial console: the error
//! says what happened and what to do, and the terminal is given back.
//! Issue 14: it said only "The cursor position could not be read".

mod common;

use std::io::Read;
use std::process::Stdio;

use common::World;

#[test]
fn a_terminal_that_never_answers_the_cursor_query_gets_a_fix() {
    let w = World::new();
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let mut cmd = w.ppp(["tui"]);
    cmd.stdin(Stdio::from(pty.slave.try_clone().unwrap()))
        .stdout(Stdio::from(pty.slave))
        .stderr(Stdio::piped())
        .env("TERM", "xterm");
    let child = cmd.spawn().unwrap();
    // Our copies of the terminal's slave side are gone with `cmd`, so the
    // master reads EOF/EIO once ppp exits. Nothing is ever written back.
    drop(cmd);
    let mut master = std::fs::File::from(pty.master);
    let drain = std::thread::spawn(move || {
        let mut screen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            screen.extend_from_slice(&buf[..n]);
        }
        screen
    });
    let out = child.wait_with_output().unwrap();
    let screen = String::from_utf8_lossy(&drain.join().unwrap()).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(screen.contains("\x1b[6n"), "ppp asked for the cursor position: {screen:?}");
    assert!(
        err.starts_with(
            "error: `ppp tui` cannot draw: the terminal did not answer when asked where its cursor is\n  caused by: "
        ),
        "{err}"
    );
    assert!(err.contains("hint: run `ppp tui` in a terminal emulator"), "{err}");
    assert!(screen.contains("\x1b[?1049l"), "the main screen is back: {screen:?}");
}

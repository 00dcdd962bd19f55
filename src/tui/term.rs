//! The terminal while the dashboard owns it: raw mode, the alternate
//! screen, a hidden cursor, and stderr sent to a log file (a warning printed
//! by a library call would otherwise land in the middle of the frame).
//!
//! Whatever happens, the terminal is given back: [`Terminal`] restores it in
//! `Drop`, and a panic hook restores it before the previous hook prints the
//! panic, so the message appears on a normal screen and the shell is usable
//! afterwards. Restoring twice is harmless, so both may run.

use std::fs::File;
use std::io::{Stdout, stdout};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Mutex, Once};

use anyhow::{Context, Result};

use crate::error::fail;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::cursor::{Hide, Show};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode};

/// What to do when the terminal never answers the cursor position query:
/// editors' shell buffers, serial consoles and some web terminals do not.
const NO_CURSOR_ANSWER_HINT: &str = "run `ppp tui` in a terminal emulator (xterm, GNOME Terminal, iTerm2, tmux); over a \
                                     slow connection, try again; without the dashboard, `ppp ls` and `ppp policy log` \
                                     show the same state";

/// The real stderr while it points at the log; taken back by [`restore`].
/// A static because the panic hook must reach it.
static SAVED_STDERR: Mutex<Option<OwnedFd>> = Mutex::new(None);
static HOOK: Once = Once::new();

/// The dashboard's terminal. Dropping it restores the user's terminal.
pub(super) struct Terminal {
    pub(super) inner: ratatui::Terminal<CrosstermBackend<Stdout>>,
    log: File,
}

impl Terminal {
    /// Take over the terminal; stderr goes to `log` until restored.
    pub(super) fn enter(log: &Path) -> Result<Terminal> {
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(log)
            .with_context(|| format!("could not open `{}`", log.display()))?;
        let inner = ratatui::Terminal::new(CrosstermBackend::new(stdout())).context("could not set up the terminal")?;
        let mut t = Terminal { inner, log };
        t.resume()?;
        Ok(t)
    }

    /// Hand the terminal back for an interactive child (shell, agent).
    #[allow(clippy::unused_self, reason = "`&mut self` keeps anyone from drawing while suspended")]
    pub(super) fn suspend(&mut self) {
        restore();
    }

    /// Take the terminal again, and redraw everything on the next draw: the
    /// child left its own output on the screen ratatui remembers.
    pub(super) fn resume(&mut self) -> Result<()> {
        reclaim_foreground();
        // Saved before anything can fail, so `restore` always has it.
        let mut saved = SAVED_STDERR.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if saved.is_none() {
            *saved = Some(nix::unistd::dup(std::io::stderr()).context("could not save stderr")?);
            nix::unistd::dup2_stderr(&self.log).context("could not redirect stderr")?;
        }
        drop(saved);
        enable_raw_mode().context("could not put the terminal in raw mode")?;
        execute!(stdout(), EnterAlternateScreen, Hide).context("could not switch to the alternate screen")?;
        // ratatui asks the terminal where its cursor is before clearing
        // (ESC[6n); crossterm gives up after 2 s without an answer.
        self.inner.clear().map_err(|e| {
            let unanswered = e.to_string().contains("cursor position could not be read");
            let e = anyhow::Error::new(e);
            if unanswered {
                e.context(
                    fail("`ppp tui` cannot draw: the terminal did not answer when asked where its cursor is")
                        .hint(NO_CURSOR_ANSWER_HINT),
                )
            } else {
                e.context("could not clear the terminal")
            }
        })?;
        Ok(())
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        restore();
    }
}

/// Make ppp's process group the terminal's foreground group again. A child
/// that does job control (an interactive shell) moves the terminal to its
/// own group and may fail to move it back on exit, e.g. from another PID
/// namespace; ppp would then stop with SIGTTOU at its next terminal call.
/// SIGTTOU is blocked meanwhile, as shells do: a background process may
/// then take the terminal instead of being stopped for trying.
fn reclaim_foreground() {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_err() {
        return;
    }
    let _ = nix::unistd::tcsetpgrp(std::io::stdin(), nix::unistd::getpgrp());
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
}

/// Give the terminal back: stderr, cooked mode, the main screen, the
/// cursor. Errors are ignored: this runs on the way out, often in a panic,
/// and each step is worth trying on its own.
fn restore() {
    let saved = SAVED_STDERR.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    if let Some(fd) = saved {
        let _ = nix::unistd::dup2_stderr(&fd);
    }
    let _ = disable_raw_mode();
    let _ = execute!(stdout(), LeaveAlternateScreen, Show);
}

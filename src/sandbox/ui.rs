//! How the sandbox steps report progress. Every step takes one, and the
//! lifecycle that runs them in order takes it from the command, so it
//! lives below them all.

use anyhow::Result;

use crate::progress;

/// Progress on stderr: a spinner (or plain lines off a terminal) per long
/// step; silent with `-q`. See [`crate::progress`].
#[derive(Debug, Clone, Copy)]
pub struct Ui {
    pub quiet: bool,
}

impl Ui {
    /// Start a timed step; the caller ends it with `.done()` on success.
    fn step(self, what: &str) -> progress::Step {
        progress::Progress::detect(self.quiet).start(what)
    }

    /// Run `f` as one timed step, ended as done when it succeeds.
    pub(super) fn timed<T>(self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let step = self.step(what);
        let result = f();
        if result.is_ok() {
            step.done();
        }
        result
    }

    /// An untimed line.
    pub(super) fn note(self, what: &str) {
        progress::Progress::detect(self.quiet).note(what);
    }
}

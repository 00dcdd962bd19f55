//! Progress for the long steps (VM init and boot, provisioning, the handover
//! checks, the mitmproxy venv install, template save/load) on stderr.
//!
//! On a terminal a step is a spinner showing its name and elapsed time; on
//! anything else (a pipe, a CI log) it is two plain lines, `ppp: <step>` and
//! `ppp: <step> done in 1.2 s`, because spinner redraws are noise in a log
//! file. `-q` silences both. Stdout is never touched: it belongs to the
//! command's output (`ppp create -q` prints only the name there).
//!
//! The line texts are pure functions so tests can check them without timing.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How progress is shown, decided once per command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// `-q`: nothing.
    Quiet,
    /// Plain lines, for a stderr that is not a terminal.
    Plain,
    /// Spinners, for a terminal.
    Spinner,
}

impl Progress {
    /// Spinners on a terminal stderr, plain lines elsewhere, nothing when
    /// `quiet`. `TERM=dumb` terminals cannot redraw a line, so they get
    /// plain lines too.
    pub fn detect(quiet: bool) -> Self {
        if quiet {
            Self::Quiet
        } else if std::io::stderr().is_terminal() && std::env::var_os("TERM").is_none_or(|t| t != "dumb") {
            Self::Spinner
        } else {
            Self::Plain
        }
    }

    /// Start a step; call [`Step::done`] when it succeeds. A step dropped
    /// without `done` (its caller returned an error) clears its spinner and
    /// prints nothing more: the error that follows says what went wrong.
    pub fn start(self, step: &str) -> Step {
        self.begin(step, None)
    }

    /// Start a step that moves `total` bytes (template save and load): the
    /// spinner becomes a bar; plain output is the same two lines.
    pub fn transfer(self, step: &str, total: u64) -> Step {
        self.begin(step, Some(total))
    }

    /// A one-off line, not timed: what is about to happen, or a note.
    pub fn note(self, text: &str) {
        if self != Self::Quiet {
            eprintln!("{}", start_line(text));
        }
    }

    fn begin(self, step: &str, total: Option<u64>) -> Step {
        let bar = match self {
            Self::Quiet => None,
            Self::Plain => {
                eprintln!("{}", start_line(step));
                None
            }
            Self::Spinner => Some(spinner(step, total)),
        };
        Step { name: step.to_owned(), mode: self, started: Instant::now(), bar }
    }

    /// A sequence of steps where each message ends the previous step, for
    /// code that reports progress through a callback
    /// (`proxy::mitmdump::ensure`).
    pub fn sequence(self) -> Sequence {
        Sequence { progress: self, current: None }
    }
}

fn spinner(step: &str, total: Option<u64>) -> ProgressBar {
    let (bar, template) = match total {
        Some(n) => (ProgressBar::new(n), "{spinner} {msg} {bytes}/{total_bytes} ({elapsed})"),
        None => (ProgressBar::new_spinner(), "{spinner} {msg} ({elapsed})"),
    };
    // The template is a constant; a bad one is a programming error caught
    // by the unit test below, so falling back to the default is harmless.
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_message(step.to_owned());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// One running step.
#[derive(Debug)]
pub struct Step {
    name: String,
    mode: Progress,
    started: Instant,
    bar: Option<ProgressBar>,
}

impl Step {
    /// Count `bytes` more moved (transfers only; a no-op otherwise).
    pub fn advance(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }

    /// Print a line without tearing the spinner (a warning during a step).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    /// The step succeeded: replace the spinner (or follow the start line)
    /// with `ppp: <step> done in <elapsed>`.
    pub fn done(mut self) {
        let line = done_line(&self.name, self.started.elapsed());
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        if self.mode != Progress::Quiet {
            eprintln!("{line}");
        }
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// Steps reported one message at a time; see [`Progress::sequence`].
#[derive(Debug)]
pub struct Sequence {
    progress: Progress,
    current: Option<Step>,
}

impl Sequence {
    /// End the current step, if any, and start `step`.
    pub fn next(&mut self, step: &str) {
        if let Some(s) = self.current.take() {
            s.done();
        }
        self.current = Some(self.progress.start(step));
    }

    /// End the last step as done.
    pub fn finish(mut self) {
        if let Some(s) = self.current.take() {
            s.done();
        }
    }
}

/// `ppp: <step>`.
pub fn start_line(step: &str) -> String {
    format!("ppp: {step}")
}

/// `ppp: <step> done in <elapsed>`.
pub fn done_line(step: &str, elapsed: Duration) -> String {
    format!("ppp: {step} done in {}", elapsed_text(elapsed))
}

/// `0.4 s`, `12.3 s`, `2 min 05 s`: tenths while they still matter, then
/// whole seconds.
pub fn elapsed_text(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{}.{} s", secs, d.subsec_millis() / 100)
    } else {
        format!("{} min {:02} s", secs / 60, secs % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines() {
        assert_eq!(start_line("starting machine `ppp-red`"), "ppp: starting machine `ppp-red`");
        assert_eq!(
            done_line("starting machine `ppp-red`", Duration::from_millis(1234)),
            "ppp: starting machine `ppp-red` done in 1.2 s"
        );
    }

    #[test]
    fn elapsed_forms() {
        assert_eq!(elapsed_text(Duration::ZERO), "0.0 s");
        assert_eq!(elapsed_text(Duration::from_millis(59_990)), "59.9 s");
        assert_eq!(elapsed_text(Duration::from_secs(60)), "1 min 00 s");
        assert_eq!(elapsed_text(Duration::from_secs(125)), "2 min 05 s");
    }

    #[test]
    fn templates_parse() {
        for t in ["{spinner} {msg} {bytes}/{total_bytes} ({elapsed})", "{spinner} {msg} ({elapsed})"] {
            ProgressStyle::with_template(t).unwrap();
        }
    }

    #[test]
    fn quiet_prints_nothing_and_steps_end() {
        // Nothing to assert on stderr here; this checks the quiet path has
        // no spinner to leak and that a sequence can end without steps.
        let s = Progress::Quiet.start("x");
        assert!(s.bar.is_none());
        s.done();
        Progress::Quiet.sequence().finish();
    }
}

//! How failures reach the user: `error: …`, then one `caused by: …` per
//! underlying cause, then an optional `hint: …`, and an exit code.
//!
//! Commands return `anyhow::Error`. To add a hint or a specific exit code they
//! put a [`Failure`] somewhere in the chain; the renderer finds it.

use std::fmt::{self, Write as _};

/// A user-facing failure with an optional hint and exit code.
#[derive(Debug)]
pub struct Failure {
    message: String,
    hint: Option<String>,
    code: u8,
}

impl Failure {
    /// A failure with exit code 1.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), hint: None, code: 1 }
    }

    /// Attach a `hint:` line.
    #[must_use]
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Use `code` as the process exit code.
    #[must_use]
    pub fn code(mut self, code: u8) -> Self {
        self.code = code;
        self
    }

    /// The failure for a command whose machinery lands in a later release.
    pub fn not_available(command: &str) -> Self {
        Self::new(format!("`ppp {command}` is not available yet")).code(2)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// An error that keeps its own message and causes and gains a `hint:`
/// line, for errors whose text is already right (a parse error naming the
/// file and line) but whose fix needs saying. See [`hinted`].
#[derive(Debug)]
struct Hinted {
    inner: anyhow::Error,
    hint: String,
}

impl fmt::Display for Hinted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for Hinted {
    // The inner error's own message is shown as this one's, so the chain
    // continues with its causes, not with it.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

/// `err` unchanged on screen, plus a `hint:` line (unless a hint further
/// out in the chain already says more).
pub fn hinted(err: impl Into<anyhow::Error>, hint: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Hinted { inner: err.into(), hint: hint.into() })
}

/// Shorthand: `return Err(fail("…").hint("…").into())`.
pub fn fail(message: impl Into<String>) -> Failure {
    Failure::new(message)
}

/// The error a child `ppp` printed (what [`render`] wrote: the last
/// `error:` line, its `caused by:` lines and `hint:`), rebuilt so that it
/// can be the cause of this process's error with nothing lost; `fallback`
/// is the hint when the child gave none. `None` when `text` holds no
/// `error:` line.
pub fn from_rendered(text: &str, fallback: &str) -> Option<anyhow::Error> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().rposition(|l| l.starts_with("error: "))?;
    let mut chain = vec![lines[start].trim_start_matches("error: ").to_owned()];
    let mut hint = (!fallback.is_empty()).then(|| fallback.to_owned());
    for l in &lines[start + 1..] {
        if let Some(c) = l.strip_prefix("  caused by: ") {
            chain.push(c.to_owned());
        } else if let Some(h) = l.strip_prefix("hint: ") {
            hint = Some(h.to_owned());
        }
    }
    let mut err = anyhow::Error::msg(chain.pop()?);
    while let Some(outer) = chain.pop() {
        err = err.context(outer);
    }
    Some(match hint {
        Some(h) => hinted(err, h),
        None => err,
    })
}

/// Render `err` as the lines ppp prints on stderr, and pick the exit code.
pub fn render(err: &anyhow::Error) -> (String, u8) {
    let mut out = String::new();
    // A Failure given as context (`.context(fail("…").hint("…"))`) is not
    // reachable by downcasting the chain's items, which are anyhow's
    // context wrappers; `anyhow::Error::downcast_ref` sees through them and
    // finds the outermost one.
    let outer = err.downcast_ref::<Failure>();
    let mut hint = outer.and_then(|f| f.hint.clone());
    let mut code = outer.map_or(1, |f| f.code);
    for (i, cause) in err.chain().enumerate() {
        // A Hinted stands in the chain for its inner error (it shows its
        // message and continues with its causes), so the inner error's own
        // Failure is found through it: its code must survive the hint.
        let mut item = cause;
        loop {
            if let Some(f) = item.downcast_ref::<Failure>() {
                if hint.is_none() {
                    hint.clone_from(&f.hint);
                }
                code = f.code;
                break;
            }
            let Some(h) = item.downcast_ref::<Hinted>() else { break };
            if hint.is_none() {
                hint = Some(h.hint.clone());
            }
            // anyhow's downcast sees a Failure given as context too.
            if let Some(f) = h.inner.downcast_ref::<Failure>() {
                if hint.is_none() {
                    hint.clone_from(&f.hint);
                }
                code = f.code;
                break;
            }
            item = h.inner.as_ref();
        }
        if i == 0 {
            let _ = writeln!(out, "error: {cause}");
        } else {
            let _ = writeln!(out, "  caused by: {cause}");
        }
    }
    if let Some(h) = hint {
        let _ = writeln!(out, "hint: {h}");
    }
    (out, code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn a_child_error_is_rebuilt_whole() {
        let child: anyhow::Result<()> = Err(fail("the socket path is too long").hint("set PPP_DATA shorter").into());
        let child = child.context("could not listen").unwrap_err();
        let (text, _) = render(&child);
        let printed = format!("warning: something earlier\n{text}");
        let rebuilt = from_rendered(&printed, "see the log").unwrap().context("the daemon exited during start-up");
        assert_eq!(
            render(&rebuilt).0,
            "error: the daemon exited during start-up\n  caused by: could not listen\n  caused by: the socket \
             path is too long\nhint: set PPP_DATA shorter\n"
        );
        assert!(from_rendered("just noise\n", "").is_none());
        let bare = from_rendered("error: boom\n", "see the log").unwrap();
        assert_eq!(render(&bare).0, "error: boom\nhint: see the log\n");
    }

    #[test]
    fn renders_chain_hint_and_code() {
        let inner: anyhow::Result<()> =
            Err(fail("port 70000 is out of range").hint("ports run from 1 to 65535").code(2).into());
        let err = inner.context("could not add rule").unwrap_err();
        let (text, code) = render(&err);
        assert_eq!(
            text,
            "error: could not add rule\n  caused by: port 70000 is out of range\nhint: ports run from 1 to 65535\n"
        );
        assert_eq!(code, 2);
    }

    #[test]
    fn hinted_keeps_the_message_and_causes() {
        let inner = anyhow::anyhow!("disk full").context("could not write `x`");
        let (text, code) = render(&hinted(inner, "free some space"));
        assert_eq!(text, "error: could not write `x`\n  caused by: disk full\nhint: free some space\n");
        assert_eq!(code, 1);
        // The code of a Failure the hint wraps survives it, however it is
        // wrapped (issue 28: a broken candidate policy exited 1, not 2).
        let (text, code) = render(&hinted(fail("`c.yaml` line 4: decision").code(2), "fix that line"));
        assert_eq!((text.as_str(), code), ("error: `c.yaml` line 4: decision\nhint: fix that line\n", 2));
        let as_context = anyhow::anyhow!("cause").context(fail("bad input").code(2));
        assert_eq!(render(&hinted(as_context, "h")).1, 2);
        assert_eq!(render(&hinted(hinted(fail("x").code(2), "inner"), "outer")), ("error: x\nhint: outer\n".into(), 2));
        assert_eq!(render(&hinted(fail("x").code(2), "h").context("while replaying")).1, 2);
        // A hint from further out wins: it knows more about what was asked.
        let outer = hinted(anyhow::anyhow!("x"), "inner hint").context(fail("outer").hint("outer hint"));
        assert!(render(&outer).0.ends_with("hint: outer hint\n"));
    }
}

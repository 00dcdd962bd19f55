//! Everything ppp prints on stdout goes through here, so a closed pipe
//! (`ppp ls | head -1`) ends ppp quietly instead of panicking, and tables
//! are aligned the same way everywhere.

use std::fmt::Write as _;
use std::io::Write;

use anyhow::Result;

/// Whether `c` may not reach the user's terminal as it is: a control
/// character (C0, DEL, C1), or one that reorders or hides text: the
/// bidirectional marks, embeddings, overrides and isolates
/// (`\u{202e}moc.elgoog` reads as `google.com` on a terminal that does
/// bidi), zero-width and other invisible format characters (two different
/// hosts that look the same), and the line and paragraph separators.
#[must_use]
pub fn hides_text(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{61c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
}

/// `text` with each character [`hides_text`] says may not reach a terminal
/// shown as `\u{..}`. For text a guest chose (a host, a path, a method) on
/// its way to the user's terminal: an escape sequence in it could retitle
/// the terminal, move the cursor or repaint lines, and a bidi override
/// could reorder it, and so change what the user reads before answering.
#[must_use]
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(hides_text) {
        text.chars().map(|c| if hides_text(c) { c.escape_unicode().to_string() } else { c.to_string() }).collect()
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// `text` for the user's terminal: every character [`hides_text`] names
/// but newline and tab shown as `\u{..}`. [`print`] and [`println`] pass
/// everything through it, so text a guest chose (a Host header in
/// `proxy.log`, a name in `flows.jsonl`) cannot reach the terminal as an
/// escape sequence or a bidi override through any command, present or
/// future. ppp itself prints none.
#[must_use]
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| hides_text(c) && c != '\n' && c != '\t';
    if text.chars().any(unsafe_char) {
        text.chars().map(|c| if unsafe_char(c) { c.escape_unicode().to_string() } else { c.to_string() }).collect()
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// JSON text with every character [`hides_text`] names escaped (newlines
/// between tokens aside): JSON itself escapes only those below U+0020, and
/// DEL, the C1 controls (U+0080..U+009F, a CSI among them) and bidi
/// overrides would reach a terminal that reads the text raw. Escaped this
/// way it is still JSON, with the same value.
fn json_controls_escaped(text: String) -> String {
    if !text.chars().any(|c| hides_text(c) && c != '\n') {
        return text;
    }
    text.chars().fold(String::with_capacity(text.len()), |mut out, c| {
        if hides_text(c) && c != '\n' {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
        out
    })
}

/// `value` as one line of JSON with every control character escaped.
pub fn json_line<T: serde::Serialize>(value: &T) -> Result<String> {
    Ok(json_controls_escaped(serde_json::to_string(value)?))
}

/// Write `text` to stdout, control characters escaped ([`terminal_safe`]).
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(terminal_safe(text).as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Write `line` and a newline to stdout, control characters escaped
/// ([`terminal_safe`]).
pub fn println(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(terminal_safe(line).as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// Pretty-print `value` as JSON on stdout, every control character in it
/// escaped (still JSON, the same value).
pub fn json<T: serde::Serialize>(value: &T) -> Result<()> {
    println(&json_controls_escaped(serde_json::to_string_pretty(value)?))
}

/// Ask a yes/no question on the terminal. Without a terminal there is no
/// one to ask, so it is an error telling the user to pass `-f`.
pub fn confirm(question: &str) -> Result<bool> {
    confirm_or(question, "the same command with -f")
}

/// [`confirm`], whose error names `unattended`, the exact command that
/// runs without asking (`ppp rm -f red-fox`).
pub fn confirm_or(question: &str, unattended: &str) -> Result<bool> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        return Err(crate::error::fail(format!("cannot ask \"{question}\": standard input is not a terminal"))
            .hint(format!("to go ahead without asking, run {unattended}"))
            .code(2)
            .into());
    }
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// True when `err` is (caused by) a closed stdout.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

/// Render rows as left-aligned columns separated by two spaces. The last
/// column is not padded, so lines carry no trailing spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(cols) {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate() {
            if i + 1 < cols {
                let _ = write!(s, "{c:<w$}  ", w = widths[i]);
            } else {
                s.push_str(c);
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn printable_text_has_no_control_characters() {
        use super::printable;
        assert_eq!(printable("/v1/messages"), "/v1/messages");
        let p = printable("/\u{1b}]0;ok\u{7}\r\n\u{9b}2J");
        assert!(!p.chars().any(char::is_control), "{p}");
        assert_eq!(p, "/\\u{1b}]0;ok\\u{7}\\u{d}\\u{a}\\u{9b}2J");
    }

    /// Bidirectional overrides and isolates reorder what a terminal (and a
    /// browser) shows: `\u{202e}moc.elgoog` reads as `google.com`; zero-width
    /// and invisible characters make two different hosts look the same.
    #[test]
    fn printable_text_has_no_reordering_or_invisible_characters() {
        use super::{json_line, printable};
        for c in ['\u{202e}', '\u{2066}', '\u{200f}', '\u{061c}', '\u{200b}', '\u{feff}', '\u{2028}', '\u{ad}'] {
            let host = format!("{c}moc.elgoog");
            let p = printable(&host);
            assert!(!p.contains(c), "{c:?} kept: {p}");
            assert!(p.ends_with("moc.elgoog"), "{p}");
            let j = json_line(&host).unwrap();
            assert!(!j.contains(c), "{c:?} kept in JSON: {j}");
            assert_eq!(serde_json::from_str::<String>(&j).unwrap(), host);
        }
        assert_eq!(printable("b\u{fc}cher.example/\u{65e5}\u{672c}"), "b\u{fc}cher.example/\u{65e5}\u{672c}");
    }

    #[test]
    fn terminal_text_keeps_lines_and_tabs_and_escapes_every_other_control() {
        use super::terminal_safe;
        let plain = "NAME\tSTATE\nred  running\n";
        assert!(matches!(terminal_safe(plain), std::borrow::Cow::Borrowed(_)));
        let t = terminal_safe("last log:  GET http://\u{1b}]0;owned\u{7}/\r\u{9b}2J\u{7f}\n");
        assert_eq!(t, "last log:  GET http://\\u{1b}]0;owned\\u{7}/\\u{d}\\u{9b}2J\\u{7f}\n");
    }

    #[test]
    fn json_keeps_its_value_with_every_control_escaped() {
        let v = serde_json::json!({"host": "a\u{1b}[2J\u{9b}b\u{7f}", "n": [1, 2]});
        for text in
            [super::json_line(&v).unwrap(), super::json_controls_escaped(serde_json::to_string_pretty(&v).unwrap())]
        {
            assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
            assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), v);
        }
    }

    #[test]
    fn table_aligns() {
        let t = super::table(
            &["NAME", "STATUS"],
            &[vec!["a".into(), "running".into()], vec!["long-name".into(), "-".into()]],
        );
        assert_eq!(t, "NAME       STATUS\na          running\nlong-name  -\n");
    }
}

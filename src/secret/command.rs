//! Secrets whose value is the output of a command the daemon runs on the
//! host (`ppp secret set SERVICE --command 'gh auth token' --refresh 55m`).
//!
//! The command line is split into argv here, as data, and never handed to a
//! shell: a user who wants one writes `sh -c '…'`. It runs through
//! [`crate::exec`], never in a guest; its stdout (one final newline
//! trimmed, at most [`MAX_OUTPUT`] bytes, a valid header value) is the value.
//! Its stderr is discarded unread: it may hold a token, and no error, log
//! line or reply carries it or the output.
//!
//! A value is cached in the daemon for the entry's refresh interval. A 401
//! from the service (the addon's `stale` op) drops it early, at most once per
//! [`STALE_MIN`] per secret, and a failure is remembered for
//! [`RETRY_AFTER_FAILURE`]: a guest that makes requests fail in a loop cannot
//! make the host run the command in a loop (docs/adr/0047).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::secret::{Entry, Value};

/// Longest accepted output: header values are a few hundred bytes (a JWT a
/// few kilobytes); more means the command printed something else.
pub const MAX_OUTPUT: usize = 16 * 1024;

/// A command that has not finished by then is killed and counts as failed.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The refresh interval when `--refresh` is not given: an hour, shorter than
/// most short-lived tokens' lives are not, so give `--refresh` for those.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(3600);

/// Bounds of `--refresh`.
pub const MIN_REFRESH: Duration = Duration::from_secs(1);
pub const MAX_REFRESH: Duration = Duration::from_secs(7 * 24 * 3600);

/// At most one early refresh (after a 401) per secret in this long.
pub const STALE_MIN: Duration = Duration::from_secs(30);

/// After a failed run, requests get the failure, without a new run, for this
/// long.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// Longest accepted command line, and most arguments.
const MAX_LINE: usize = 4096;
const MAX_ARGS: usize = 64;

/// Split a command line into argv the way a POSIX shell splits words, with
/// no expansion of any kind: `'…'` is literal, `"…"` allows `\"` and `\\`,
/// a backslash outside quotes escapes the next character. A word that is a
/// shell operator (`|`, `&&`, `>`, …) is refused: without a shell it would be
/// a plain argument, which is never what the user meant.
pub fn split(line: &str) -> Result<Vec<String>> {
    if line.len() > MAX_LINE {
        return Err(fail(format!("the command is {} bytes long; at most {MAX_LINE} are accepted", line.len()))
            .hint("put a long command in a script and give its path")
            .code(2)
            .into());
    }
    let mut words: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err(unterminated("'")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => cur.push(c),
                            Some(c) => {
                                cur.push('\\');
                                cur.push(c);
                            }
                            None => return Err(unterminated("\"")),
                        },
                        Some(c) => cur.push(c),
                        None => return Err(unterminated("\"")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => cur.push(c),
                    None => {
                        return Err(fail("the command ends with a lone backslash").code(2).into());
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c if c.is_control() => {
                return Err(fail("the command contains a control character").code(2).into());
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    if words.is_empty() {
        return Err(fail("the command is empty")
            .hint("give the command that prints the secret, e.g. `--command 'gh auth token'`")
            .code(2)
            .into());
    }
    if words.len() > MAX_ARGS {
        return Err(fail(format!("the command has {} words; at most {MAX_ARGS} are accepted", words.len()))
            .code(2)
            .into());
    }
    // Only an unquoted operator reaches here as a whole word of its own;
    // a quoted `'|'` is refused too, which costs nothing real.
    if let Some(op) = words.iter().find(|w| SHELL_OPERATORS.contains(&w.as_str())) {
        return Err(fail(format!("the command contains `{op}`, which only a shell understands"))
            .hint("ppp runs the command without a shell; to use one, write `--command \"sh -c '…'\"`")
            .code(2)
            .into());
    }
    Ok(words)
}

const SHELL_OPERATORS: &[&str] = &["|", "||", "&&", "&", ";", ">", ">>", "<", "<<", "2>", "2>&1", "$(", "`"];

fn unterminated(quote: &str) -> anyhow::Error {
    fail(format!("the command has an unterminated {quote} quote")).hint("close the quote").code(2).into()
}

/// Parse `--refresh`: a number and a unit (`s`, `m`, `h`, `d`), or several
/// (`1h30m`).
pub fn parse_refresh(text: &str) -> Result<Duration> {
    let hint = "write a number and a unit, such as `30s`, `55m`, `1h30m` or `1d`";
    let bad = |why: String| -> anyhow::Error { fail(format!("`--refresh {text}`: {why}")).hint(hint).code(2).into() };
    let mut total: u64 = 0;
    let mut num = String::new();
    if text.trim().is_empty() {
        return Err(bad("the duration is empty".to_owned()));
    }
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(bad(format!("`{c}` is not a unit"))),
        };
        if num.is_empty() {
            return Err(bad(format!("the unit `{c}` has no number before it")));
        }
        let n: u64 = num.parse().map_err(|_| bad("the number is too large".to_owned()))?;
        total = n.checked_mul(unit).and_then(|v| total.checked_add(v)).ok_or_else(|| bad("too long".to_owned()))?;
        num.clear();
    }
    if !num.is_empty() {
        return Err(bad(format!("`{num}` has no unit")));
    }
    let d = Duration::from_secs(total);
    if d < MIN_REFRESH || d > MAX_REFRESH {
        return Err(bad(format!(
            "the interval must lie between {} s and {} days",
            MIN_REFRESH.as_secs(),
            MAX_REFRESH.as_secs() / 86_400
        )));
    }
    Ok(d)
}

/// `3600` → `1h`, for `secret ls`.
#[must_use]
pub fn show_refresh(secs: u64) -> String {
    let mut out = String::new();
    let mut rest = secs;
    for (unit, n) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if rest >= n {
            let _ = write!(out, "{}{unit}", rest / n);
            rest %= n;
        }
    }
    if out.is_empty() { "0s".to_owned() } else { out }
}

/// Why a command gave no value. Never carries the output or stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    NotFound,
    Spawn,
    Exit(i32),
    TimedOut,
    Empty,
    TooLong,
    NotUtf8,
    /// Not a valid header value (a control character, surrounding space).
    Invalid,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotFound => f.write_str("the program was not found"),
            Failure::Spawn => f.write_str("the program could not be started"),
            Failure::Exit(c) if *c > 128 => write!(f, "it was ended by signal {}", c - 128),
            Failure::Exit(c) => write!(f, "it exited with status {c}"),
            Failure::TimedOut => write!(f, "it did not finish within {} s", TIMEOUT.as_secs()),
            Failure::Empty => f.write_str("it printed nothing"),
            Failure::TooLong => write!(f, "it printed more than {MAX_OUTPUT} bytes"),
            Failure::NotUtf8 => f.write_str("its output is not UTF-8"),
            Failure::Invalid => {
                f.write_str("its output is not a valid header value (a control character or surrounding whitespace)")
            }
        }
    }
}

/// The value in a command's stdout: one final `\n` (or `\r\n`) trimmed,
/// then checked as a stored value is ([`Value::check`]).
pub fn value_from_output(mut out: Vec<u8>, truncated: bool) -> Result<Value, Failure> {
    let wipe = |mut b: Vec<u8>| zeroize::Zeroize::zeroize(&mut b);
    if truncated || out.len() > MAX_OUTPUT + 2 {
        wipe(out);
        return Err(Failure::TooLong);
    }
    if out.last() == Some(&b'\n') {
        out.pop();
        if out.last() == Some(&b'\r') {
            out.pop();
        }
    }
    if out.len() > MAX_OUTPUT {
        wipe(out);
        return Err(Failure::TooLong);
    }
    if out.is_empty() {
        return Err(Failure::Empty);
    }
    let text = match String::from_utf8(out) {
        Ok(t) => t,
        Err(e) => {
            wipe(e.into_bytes());
            return Err(Failure::NotUtf8);
        }
    };
    let v = Value::new(text);
    if v.check().is_err() {
        return Err(Failure::Invalid);
    }
    Ok(v)
}

/// Run `argv` once and take its value.
fn run(words: &[String]) -> Result<Value, Failure> {
    let Some((program, rest)) = words.split_first() else {
        return Err(Failure::NotFound);
    };
    let inv = Invocation::new(PathBuf::from(program)).args(rest).timeout(TIMEOUT);
    match exec::stdout_capped(&inv, MAX_OUTPUT + 2) {
        Ok((0, out, truncated)) => value_from_output(out, truncated),
        Ok((code, mut out, _)) => {
            zeroize::Zeroize::zeroize(&mut out);
            Err(Failure::Exit(code))
        }
        Err(exec::ExecError::NotFound { .. }) => Err(Failure::NotFound),
        Err(exec::ExecError::TimedOut { .. }) => Err(Failure::TimedOut),
        Err(_) => Err(Failure::Spawn),
    }
}

/// What `secret ls` and `ppp diagnose` show of a command secret's runs:
/// `$PPP_DATA/secret-status.json`, written by the daemon alone (so no
/// `state.lock`: one writer, atomic replaces). Never a value or an output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// When the command last gave a value.
    #[serde(default, with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    pub last_refresh: Option<OffsetDateTime>,
    /// When it last failed, and why (no output).
    #[serde(default, with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<OffsetDateTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Runs since the daemon started.
    #[serde(default)]
    pub runs: u64,
}

/// Read the status file; a missing or unreadable one is empty (it is only
/// shown, never decided on).
#[must_use]
pub fn load_status(path: &std::path::Path) -> HashMap<String, Status> {
    crate::state::read_optional(path).ok().flatten().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
}

/// One secret's cached value and its bookkeeping.
#[derive(Default)]
struct Slot {
    /// What the cache was filled for: a changed command or a `secret set`
    /// again starts over.
    fingerprint: String,
    value: Option<(Value, Instant)>,
    failed: Option<(Failure, Instant)>,
    last_stale: Option<Instant>,
}

/// The daemon's cache of command values, one slot per store key. A slot is
/// locked for the whole run, so requests that arrive meanwhile wait for that
/// run instead of starting their own.
#[derive(Default)]
pub struct Cache {
    slots: Mutex<HashMap<String, Arc<Mutex<Slot>>>>,
    status: Mutex<HashMap<String, Status>>,
    status_path: Option<PathBuf>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cache")
    }
}

/// A command secret's failure, in the error chain of a store read: the
/// daemon's `command-failed` reply. Names the secret, never the output.
#[derive(Debug, thiserror::Error)]
#[error("the command of secret `{name}` ({scope} scope) failed: {failure}")]
pub struct CommandFailed {
    pub name: String,
    pub scope: String,
    pub failure: String,
}

fn fingerprint(e: &Entry) -> String {
    format!("{:?}|{:?}|{}", e.command, e.refresh, e.created_at)
}

impl Cache {
    /// A cache that records its runs in `status_path`.
    #[must_use]
    pub fn new(status_path: PathBuf) -> Cache {
        Cache { status_path: Some(status_path), ..Cache::default() }
    }

    fn slot(&self, key: &str) -> Arc<Mutex<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        slots.entry(key.to_owned()).or_default().clone()
    }

    /// The value of command entry `e` and how long it may still be cached.
    pub fn get(&self, e: &Entry) -> Result<(Value, Duration)> {
        let argv = e.command.as_deref().unwrap_or_default();
        let refresh = Duration::from_secs(e.refresh.unwrap_or(DEFAULT_REFRESH.as_secs()));
        let key = e.key();
        let slot = self.slot(&key);
        let mut s = slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let fp = fingerprint(e);
        if s.fingerprint != fp {
            *s = Slot { fingerprint: fp, ..Slot::default() };
        }
        let now = Instant::now();
        if let Some((v, at)) = &s.value {
            let age = now.duration_since(*at);
            if age < refresh {
                return Ok((v.clone(), refresh.saturating_sub(age)));
            }
        }
        let failed_err = |f: &Failure| -> anyhow::Error {
            CommandFailed { name: e.name.clone(), scope: e.scope.to_string(), failure: f.to_string() }.into()
        };
        if let Some((f, at)) = &s.failed
            && now.duration_since(*at) < RETRY_AFTER_FAILURE
        {
            return Err(failed_err(f));
        }
        let result = run(argv);
        let program = argv.first().map_or("", String::as_str);
        match result {
            Ok(v) => {
                tracing::info!("secret `{}` ({} scope): refreshed by running `{program}`", e.name, e.scope);
                s.value = Some((v.clone(), Instant::now()));
                s.failed = None;
                self.record(&key, None);
                Ok((v, refresh))
            }
            Err(f) => {
                // The failure's kind only: the output and stderr may hold a
                // token, and the arguments may too.
                tracing::warn!("secret `{}` ({} scope): its command `{program}` failed: {f}", e.name, e.scope);
                s.value = None;
                let err = failed_err(&f);
                self.record(&key, Some(f.to_string()));
                s.failed = Some((f, Instant::now()));
                Err(err)
            }
        }
    }

    /// The service rejected a request that carried `e`'s value: drop it so
    /// the next request runs the command again, unless an early refresh of
    /// this secret happened less than [`STALE_MIN`] ago. True when dropped.
    pub fn stale(&self, e: &Entry) -> bool {
        let slot = self.slot(&e.key());
        let mut s = slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.fingerprint != fingerprint(e) || s.value.is_none() {
            return false;
        }
        let now = Instant::now();
        if s.last_stale.is_some_and(|t| now.duration_since(t) < STALE_MIN) {
            return false;
        }
        s.last_stale = Some(now);
        s.value = None;
        tracing::info!("secret `{}` ({} scope): the service answered 401; refreshing it", e.name, e.scope);
        true
    }

    fn record(&self, key: &str, error: Option<String>) {
        let Some(path) = &self.status_path else {
            return;
        };
        let mut all = self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let st = all.entry(key.to_owned()).or_default();
        st.runs += 1;
        let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap_or_else(|_| OffsetDateTime::now_utc());
        match error {
            None => {
                st.last_refresh = Some(now);
                st.error = None;
            }
            Some(e) => {
                st.last_failure = Some(now);
                st.error = Some(e);
            }
        }
        if let Err(e) = crate::state::write_json(path, &*all) {
            tracing::warn!("could not write `{}`: {e:#}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        split(s).unwrap()
    }

    #[test]
    fn split_is_shell_words_without_a_shell() {
        assert_eq!(words("gh auth token"), ["gh", "auth", "token"]);
        assert_eq!(words("  op  read\t'op://vault/item/field'  "), ["op", "read", "op://vault/item/field"]);
        assert_eq!(words(r#"sh -c 'echo "$TOKEN" | tr -d x'"#), ["sh", "-c", r#"echo "$TOKEN" | tr -d x"#]);
        assert_eq!(words(r#"a "b \"c\" \\ \n" d\ e"#), ["a", r#"b "c" \ \n"#, "d e"]);
        assert_eq!(words("a '' b"), ["a", "", "b"]);
        assert_eq!(words("pre'fix'\"ed\""), ["prefixed"]);
        // No expansion of any kind.
        assert_eq!(words("echo $HOME ~ *"), ["echo", "$HOME", "~", "*"]);
    }

    #[test]
    fn split_refuses_what_it_cannot_run() {
        for bad in ["", "   ", "a 'b", "a \"b", "a\\", "gh auth token | tr -d x", "a && b", "a > f", "a\u{0}b"] {
            let err = split(bad).unwrap_err();
            let (text, _) = crate::error::render(&err);
            assert!(text.starts_with("error: "), "{bad:?}: {text}");
        }
        let (text, _) = crate::error::render(&split("gh auth token | cat").unwrap_err());
        assert!(text.contains("`|`") && text.contains("sh -c"), "{text}");
        assert!(split(&"a ".repeat(MAX_ARGS + 1)).is_err());
        assert!(split(&"a".repeat(MAX_LINE + 1)).is_err());
    }

    #[test]
    fn refresh_durations() {
        assert_eq!(parse_refresh("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_refresh("55m").unwrap(), Duration::from_secs(3300));
        assert_eq!(parse_refresh("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_refresh("2d").unwrap(), Duration::from_secs(172_800));
        for bad in ["", "5", "m", "5x", "0s", "8d", "1.5h", "-1s", "99999999999999999999s"] {
            let (text, _) = crate::error::render(&parse_refresh(bad).unwrap_err());
            assert!(text.contains(&format!("`--refresh {bad}`")), "{text}");
            assert!(text.contains("hint: write a number and a unit"), "{text}");
        }
        assert_eq!(show_refresh(3300), "55m");
        assert_eq!(show_refresh(5401), "1h30m1s");
    }

    #[test]
    fn output_validation() {
        let ok = |b: &str| value_from_output(b.as_bytes().to_vec(), false).map(|v| v.expose().to_owned());
        assert_eq!(ok("tok\n").unwrap(), "tok");
        assert_eq!(ok("tok\r\n").unwrap(), "tok");
        assert_eq!(ok("tok").unwrap(), "tok");
        assert_eq!(ok("").unwrap_err(), Failure::Empty);
        assert_eq!(ok("\n").unwrap_err(), Failure::Empty);
        // Only one newline is the command's line ending; more is output.
        assert_eq!(ok("tok\n\n").unwrap_err(), Failure::Invalid);
        assert_eq!(ok("tok\nx-evil: 1\n").unwrap_err(), Failure::Invalid);
        assert_eq!(ok(" tok\n").unwrap_err(), Failure::Invalid);
        assert_eq!(value_from_output(vec![0xff, 0xfe], false).unwrap_err(), Failure::NotUtf8);
        assert_eq!(ok(&"a".repeat(MAX_OUTPUT)).unwrap().len(), MAX_OUTPUT);
        assert_eq!(ok(&"a".repeat(MAX_OUTPUT + 1)).unwrap_err(), Failure::TooLong);
        assert_eq!(value_from_output(b"tok".to_vec(), true).unwrap_err(), Failure::TooLong);
        // No failure text quotes the output.
        for f in [Failure::Empty, Failure::Invalid, Failure::TooLong, Failure::Exit(3), Failure::TimedOut] {
            assert!(!f.to_string().contains("tok"));
        }
    }
}

//! One line of `flows.jsonl` as the policy workflow reads it (`ppp policy
//! suggest`, `ppp policy replay`), and the forward stream over the rotated
//! and current files. Owns what a record must hold for a flow to be decided
//! again, and the error for a line that does not hold it; never decides
//! anything itself (that is [`super::Engine`]'s).
//!
//! Streaming, with one reused line buffer: a log of a million lines is read
//! in constant memory. Unlike `ppp policy log`, which skips a damaged line,
//! the workflow refuses one, naming the file, line and field: a policy
//! derived from a log that was not understood could allow or deny what
//! nobody saw.

use std::borrow::Cow;
use std::io::{BufRead as _, BufReader, Read as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Deserialize;

use super::Verdict;
use crate::error::fail;

/// The longest line read, as [`super::follow`] bounds it: the addon cuts
/// every field it writes, so a longer line is not one of its own.
pub const MAX_LINE: usize = 1 << 20;

/// A flow record. Its strings borrow from the line (see [`opt_str`]), so
/// reading one allocates nothing unless a string has an escape in it.
/// Fields the workflow does not use (sizes, status, duration) are skipped.
#[derive(Debug, Deserialize)]
pub struct Record<'a> {
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub sandbox: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub timestamp: Option<Cow<'a, str>>,
    /// `http`, `websocket`, `tls`, `tcp`, `udp` or `dns`.
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub kind: Option<Cow<'a, str>>,
    /// The name the guest used: SNI, `Host`, `:authority`, the DNS question.
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub host: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub ip: Option<Cow<'a, str>>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub path: Option<Cow<'a, str>>,
    pub decision: Verdict,
    /// The rule's id, [`super::LEARNED`], `builtin:…`, or null (the
    /// default, or a refusal no rule made).
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub matched_rule: Option<Cow<'a, str>>,
    /// `false`: the name did not resolve to `ip` (and the flow was refused).
    #[serde(default)]
    pub resolved: Option<bool>,
    /// The aliases the name resolved through.
    #[serde(borrow, default)]
    pub chain: Option<Vec<Cow<'a, str>>>,
    /// A key was injected into the request (the addon logs it for `http`).
    #[serde(default)]
    pub injected: Option<bool>,
    /// The destination was one of the host's own addresses
    /// ([`super::Flow::local`]): internal whatever its range.
    #[serde(default)]
    pub local: Option<bool>,
    /// `false`: a TLS connection passed through unread (an `inspect: false`
    /// rule, ADR 0051), logged once at its `ClientHello`. Absent (every line
    /// before it, and every inspected flow): inspected.
    #[serde(default)]
    pub inspected: Option<bool>,
}

/// An optional string field, borrowed from the line where it has no escape.
/// serde borrows a `Cow<str>` field only when it is the field's own type;
/// inside an `Option` it copies every string, which was eight allocations a
/// line for `ppp policy replay` (docs/benchmarks.md).
fn opt_str<'de: 'a, 'a, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Borrowed<'a>>::deserialize(d)?.map(|b| b.0))
}

impl Record<'_> {
    /// The destination address, parsed. `None` when absent; the caller has
    /// already had [`parse`] reject one that does not parse.
    #[must_use]
    pub fn addr(&self) -> Option<IpAddr> {
        self.ip.as_deref().and_then(|a| a.trim_matches(['[', ']']).parse().ok())
    }

    /// When the flow was logged. `None` without a timestamp.
    pub fn time(&self) -> Option<time::OffsetDateTime> {
        let t = self.timestamp.as_deref()?;
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
    }
}

/// What is wrong with a line: the field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad {
    /// The field at fault, when one is.
    pub field: Option<&'static str>,
    pub why: String,
}

/// Parse one line (without its newline).
pub fn parse(line: &[u8]) -> Result<Record<'_>, Bad> {
    match serde_json::from_slice::<Record<'_>>(line) {
        Ok(r) => {
            if let Some(ip) = r.ip.as_deref()
                && ip.trim_matches(['[', ']']).parse::<IpAddr>().is_err()
            {
                return Err(Bad { field: Some("ip"), why: format!("`{}` is not an IP address", clip(ip)) });
            }
            Ok(r)
        }
        Err(e) => Err(diagnose(line, &e)),
    }
}

/// Which field made a line fail, found again on the slow path (a generic
/// JSON value), since `serde_json`'s error names a column, not a field.
fn diagnose(line: &[u8], e: &serde_json::Error) -> Bad {
    use serde_json::Value;
    let Ok(v) = serde_json::from_slice::<Value>(line) else {
        return Bad { field: None, why: format!("not JSON: {}", crate::state::strip_location(&e.to_string())) };
    };
    let Some(obj) = v.as_object() else { return Bad { field: None, why: "not a JSON object".to_owned() } };
    let text = |v: &Value| clip(&v.to_string()).into_owned();
    let strings = ["sandbox", "timestamp", "kind", "host", "ip", "method", "path", "matched_rule"];
    for k in strings {
        if let Some(x) = obj.get(k)
            && !(x.is_string() || x.is_null())
        {
            return Bad { field: Some(k), why: format!("expected a string, found `{}`", text(x)) };
        }
    }
    match obj.get("decision") {
        None => return Bad { field: Some("decision"), why: "missing".to_owned() },
        Some(Value::String(s)) if s == "allow" || s == "deny" => {}
        Some(x) => {
            return Bad { field: Some("decision"), why: format!("expected `allow` or `deny`, found `{}`", text(x)) };
        }
    }
    if let Some(x) = obj.get("port")
        && !x.is_null()
        && x.as_u64().is_none_or(|p| p > u64::from(u16::MAX))
    {
        return Bad { field: Some("port"), why: format!("expected a port number 0..=65535, found `{}`", text(x)) };
    }
    for k in ["resolved", "injected", "local", "inspected"] {
        if let Some(x) = obj.get(k)
            && !(x.is_boolean() || x.is_null())
        {
            return Bad { field: Some(k), why: format!("expected true or false, found `{}`", text(x)) };
        }
    }
    if let Some(x) = obj.get("chain")
        && !(x.is_null() || x.as_array().is_some_and(|a| a.iter().all(Value::is_string)))
    {
        return Bad { field: Some("chain"), why: format!("expected a list of names, found `{}`", text(x)) };
    }
    Bad { field: None, why: crate::state::strip_location(&e.to_string()) }
}

/// At most 80 characters of the guest's bytes in a message, escaped.
fn clip(s: &str) -> Cow<'_, str> {
    let cut: String = s.chars().take(80).collect();
    let cut = if cut.len() < s.len() { format!("{cut}…") } else { cut };
    Cow::Owned(crate::output::printable(&cut).into_owned())
}

/// The error for line `line` of `path`: bad input, so exit 2.
#[must_use]
pub fn error(path: &Path, line: u64, bad: &Bad) -> anyhow::Error {
    let at = match bad.field {
        Some(f) => format!("`{}` line {line}, field `{f}`: {}", path.display(), bad.why),
        None => format!("`{}` line {line}: {}", path.display(), bad.why),
    };
    fail(format!("could not read the flow log: {at}"))
        .hint(format!(
            "the proxy writes this file; remove or fix line {line} (`sed -i '{line}d' {}`), or pass \
             --log with a file of your own",
            path.display()
        ))
        .code(2)
        .into()
}

/// The files a full read goes through, oldest first: the rotated file,
/// then the current one. `--log FILE` reads that file alone.
#[must_use]
pub fn files(current: &Path) -> Vec<PathBuf> {
    vec![super::flowlog::rotated(current), current.to_owned()]
}

/// Call `each` for every complete line of `paths` (missing files are
/// empty), oldest first, with the file and the line's number in it. A last
/// line without its newline is one the proxy is still writing and is left
/// out. Stops at the first error `each` returns.
pub fn stream(paths: &[PathBuf], mut each: impl FnMut(&Path, u64, &[u8]) -> Result<()>) -> Result<()> {
    let mut buf = Vec::with_capacity(4096);
    for path in paths {
        let file = match fs_err::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        let mut reader = BufReader::with_capacity(256 << 10, file);
        let mut n = 0u64;
        loop {
            buf.clear();
            // Bounded: a line longer than MAX_LINE is not read whole.
            let got = (&mut reader).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
            if got == 0 {
                break;
            }
            n += 1;
            if buf.last() != Some(&b'\n') {
                if buf.len() > MAX_LINE {
                    let bad = Bad { field: None, why: format!("longer than {MAX_LINE} bytes") };
                    return Err(error(path, n, &bad));
                }
                break; // still being written
            }
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            if buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            each(path, n, &buf)?;
        }
    }
    Ok(())
}

/// How `--since` is read: an RFC 3339 time (`2026-05-01T12:00:00Z`), a
/// UTC day (`2026-05-01`, from its midnight), or an age (`90s`, `30m`,
/// `2h`, `7d`) counted back from `now`.
pub fn since(text: &str, now: time::OffsetDateTime) -> Result<time::OffsetDateTime> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(t) = time::OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(t);
    }
    if let Ok(d) = time::Date::parse(text, time::macros::format_description!("[year]-[month]-[day]")) {
        return Ok(d.midnight().assume_utc());
    }
    let bad = || {
        anyhow::Error::from(
            fail(format!("`--since {text}` is neither a time nor an age"))
                .hint(
                    "give an RFC 3339 time such as `2026-05-01T12:00:00Z`, a day such as `2026-05-01`, \
                     or an age such as `30m`, `2h`, `7d`",
                )
                .code(2),
        )
    };
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
    let n: i64 = digits.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    Ok(now - time::Duration::seconds(n.checked_mul(secs).ok_or_else(bad)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"sandbox":"red-fox","timestamp":"2026-05-01T12:00:00.123Z","kind":"http","host":"api.example.com","ip":"93.184.216.34","port":443,"method":"GET","path":"/v1","status":200,"decision":"allow","matched_rule":"learned","bytes_out":0,"bytes_in":12,"duration_ms":3,"injected":true}"#;

    #[test]
    fn a_record_is_read_with_what_replay_needs() {
        let r = parse(LINE.as_bytes()).unwrap();
        assert_eq!(r.sandbox.as_deref(), Some("red-fox"));
        assert_eq!(r.host.as_deref(), Some("api.example.com"));
        assert_eq!(r.addr(), Some("93.184.216.34".parse().unwrap()));
        assert_eq!((r.port, r.decision, r.matched_rule.as_deref()), (Some(443), Verdict::Allow, Some("learned")));
        assert_eq!(r.injected, Some(true));
        assert!(r.time().is_some());
        // Borrowed from the line, not copied (replay's speed); an escaped
        // string is decoded into a copy.
        for f in [&r.sandbox, &r.timestamp, &r.kind, &r.host, &r.ip, &r.method, &r.path, &r.matched_rule] {
            assert!(matches!(f, Some(Cow::Borrowed(_))), "{f:?}");
        }
        let r = parse(br#"{"decision":"deny","host":"a\u0041.example","kind":null}"#).unwrap();
        assert!(matches!(r.host, Some(Cow::Owned(ref h)) if h == "aA.example"), "{:?}", r.host);
        assert_eq!(r.kind, None);
    }

    #[test]
    fn a_passed_through_connection_reads_like_any_tls_flow() {
        let line = r#"{"sandbox":"s","kind":"tls","host":"login.example.com","ip":"93.184.216.34","port":443,"decision":"allow","matched_rule":"7c9e6679-7425-40de-944b-e07fc1f90ae7","inspected":false}"#;
        let r = parse(line.as_bytes()).unwrap();
        assert_eq!((r.kind.as_deref(), r.decision, r.inspected), (Some("tls"), Verdict::Allow, Some(false)));
        // Lines written before the field: inspected, as they were.
        assert_eq!(parse(LINE.as_bytes()).unwrap().inspected, None);
        assert_eq!(parse(br#"{"decision":"allow","inspected":"no"}"#).unwrap_err().field, Some("inspected"));
    }

    #[test]
    fn a_bad_line_names_its_field() {
        let field = |l: &str| parse(l.as_bytes()).unwrap_err().field;
        assert_eq!(field(r#"{"decision":"allow","port":"443"}"#), Some("port"));
        assert_eq!(field(r#"{"decision":"allow","port":70000}"#), Some("port"));
        assert_eq!(field(r#"{"decision":"maybe"}"#), Some("decision"));
        assert_eq!(field(r#"{"port":1}"#), Some("decision"));
        assert_eq!(field(r#"{"decision":"deny","ip":"999.1.1.1"}"#), Some("ip"));
        assert_eq!(field(r#"{"decision":"deny","host":7}"#), Some("host"));
        assert_eq!(field(r#"{"decision":"deny","chain":[1]}"#), Some("chain"));
        assert_eq!(field("{not json"), None);
        assert_eq!(field("[1]"), None);
        let e = error(Path::new("/d/flows.jsonl"), 7, &parse(br#"{"decision":"allow","port":"x"}"#).unwrap_err());
        let (text, _) = crate::error::render(&e);
        assert!(text.contains("`/d/flows.jsonl` line 7, field `port`: expected a port number"), "{text}");
        assert!(text.contains("hint: "), "{text}");
    }

    #[test]
    fn the_stream_reads_rotated_first_and_skips_a_line_being_written() {
        let dir = tempfile::tempdir().unwrap();
        let cur = dir.path().join("flows.jsonl");
        std::fs::write(super::super::flowlog::rotated(&cur), "a\nb\n").unwrap();
        std::fs::write(&cur, "c\n\nd\npartial").unwrap();
        let mut seen = Vec::new();
        stream(&files(&cur), |p, n, l| {
            seen.push((p.file_name().unwrap().to_str().unwrap().to_owned(), n, String::from_utf8(l.to_vec())?));
            Ok(())
        })
        .unwrap();
        let names: Vec<(&str, u64, &str)> = seen.iter().map(|(f, n, l)| (f.as_str(), *n, l.as_str())).collect();
        assert_eq!(
            names,
            [("flows.jsonl.1", 1, "a"), ("flows.jsonl.1", 2, "b"), ("flows.jsonl", 1, "c"), ("flows.jsonl", 3, "d")]
        );
    }

    #[test]
    fn since_takes_a_time_or_an_age() {
        let now = time::macros::datetime!(2026-05-01 12:00 UTC);
        assert_eq!(since("2h", now).unwrap(), time::macros::datetime!(2026-05-01 10:00 UTC));
        assert_eq!(since("7d", now).unwrap(), time::macros::datetime!(2026-04-24 12:00 UTC));
        assert_eq!(since("2026-04-01T00:00:00Z", now).unwrap(), time::macros::datetime!(2026-04-01 0:00 UTC));
        assert_eq!(since("2026-04-02", now).unwrap(), time::macros::datetime!(2026-04-02 0:00 UTC));
        assert!(since("2026-04-31", now).is_err());
        for bad in ["", "h", "2w", "-1h", "99999999999999999999d", "yesterday"] {
            assert!(since(bad, now).is_err(), "{bad}");
        }
    }
}

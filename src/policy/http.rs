//! HTTP rules (ADR 0050): what a rule's `methods` and `path` mean, and the
//! one function that turns the path a guest sent into the path ppp matches,
//! [`canonical_path`].
//!
//! Pure. The engine ([`super::Engine::decide_http`]) decides with these; the
//! addon only reports the raw bytes mitmproxy will forward. Canonicalising
//! never "fixes" a path an upstream could read another way: anything where
//! ppp and a server could disagree (an encoded `/`, a dot segment, `//`,
//! `;params`, a backslash) is refused, so a rule can never be matched
//! against a path the server does not see.

use std::fmt::{self, Write as _};

/// The method word that stands for every method.
pub const ANY: &str = "ANY";

/// The longest raw path the engine looks at; longer is refused (a guest
/// chooses its paths, and matching must stay cheap).
pub const MAX_PATH: usize = 8 * 1024;

/// Headers that make some servers and frameworks run another method than
/// the request line's (Rails, Express's method-override, Google APIs):
/// with HTTP rules in force a request carrying one is refused, since the
/// bytes would do what the header says.
pub const OVERRIDE_HEADERS: [&str; 3] = ["x-http-method-override", "x-http-method", "x-method-override"];

/// Why a request under an HTTP-rule host was refused before any rule was
/// matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The path cannot be canonicalised; the text says why.
    Path(String),
    /// The method is not an upper-case token (`get` may run as GET).
    Method,
    /// The request carries a method-override header.
    Override,
    /// `CONNECT` or `OPTIONS *` inside an inspected connection: nothing a
    /// path rule can judge.
    Target,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Path(why) => write!(f, "the path {why}"),
            Refusal::Method => f.write_str("the method is not an upper-case HTTP token"),
            Refusal::Override => f.write_str("the request carries a method-override header"),
            Refusal::Target => f.write_str("a CONNECT or `OPTIONS *` request has no path to judge"),
        }
    }
}

/// A request as [`super::Engine::decide_http`] judges it: the method and
/// the raw path mitmproxy forwards (origin-form, or HTTP/2's `:path`), each
/// byte as one char (latin-1), and whether a method-override header came.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub overridden: bool,
}

/// The path a request names, as ppp matches it: the query dropped, every
/// `%XX` of a printable ASCII character decoded (but `/`, `\`, `%`, `.`,
/// `;`, `?`, `#`), other `%XX` kept with upper-case hex. Refused (the
/// `Err` says why) when ppp and an upstream could read it differently:
/// not starting with `/`, a byte outside printable ASCII, a literal `\`,
/// `;` or `#`, a bad or refused escape, escapes that are not UTF-8, an
/// empty segment (`//`) other than a final one, a `.` or `..` segment.
pub fn canonical_path(raw: &str) -> Result<String, String> {
    if raw.len() > MAX_PATH {
        return Err(format!("is longer than {MAX_PATH} bytes"));
    }
    let path = raw.split_once('?').map_or(raw, |(p, _)| p);
    if !path.starts_with('/') {
        return Err("does not start with `/`".to_owned());
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    // Decoded bytes of the current run of escapes above 0x7f, which must
    // together be UTF-8.
    let mut high: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let Some(d) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) else {
                return Err("has a `%` that is not followed by two hex digits".to_owned());
            };
            if !hex.is_some_and(|h| h.bytes().all(|c| c.is_ascii_hexdigit())) {
                return Err("has a `%` that is not followed by two hex digits".to_owned());
            }
            i += 3;
            if d >= 0x80 {
                high.push(d);
                let _ = write!(out, "%{d:02X}");
                continue;
            }
            utf8_run(&mut high)?;
            match d {
                b'/' | b'\\' | b'%' | b'.' | b';' => {
                    return Err(format!("has `%{d:02X}` (an encoded `{}`)", char::from(d)));
                }
                0..0x20 | 0x7f => return Err(format!("has `%{d:02X}` (an encoded control byte)")),
                // Kept encoded: decoded they would read as a query or a
                // fragment, and no rule path can contain them anyway.
                b' ' | b'?' | b'#' => {
                    let _ = write!(out, "%{d:02X}");
                }
                _ => out.push(char::from(d)),
            }
            continue;
        }
        utf8_run(&mut high)?;
        match b {
            b'\\' | b';' | b'#' => return Err(format!("has a literal `{}`", char::from(b))),
            0x21..0x7f => out.push(char::from(b)),
            _ => return Err("has a byte that is not printable ASCII".to_owned()),
        }
        i += 1;
    }
    utf8_run(&mut high)?;
    let segments: Vec<&str> = out[1..].split('/').collect();
    let last = segments.len() - 1;
    for (n, s) in segments.iter().enumerate() {
        match *s {
            "" if n != last => return Err("has an empty segment (`//`)".to_owned()),
            "." | ".." => return Err(format!("has a `{s}` segment")),
            _ => {}
        }
    }
    Ok(out)
}

/// The escapes above 0x7f just read must be UTF-8; cleared for the next run.
fn utf8_run(high: &mut Vec<u8>) -> Result<(), String> {
    if !high.is_empty() && std::str::from_utf8(high).is_err() {
        return Err("has escapes that are not UTF-8".to_owned());
    }
    high.clear();
    Ok(())
}

/// Check a rule's path: canonical itself (what [`canonical_path`] would
/// return unchanged, without any `%`, `?`, `#`, `;` or `\`), with `*` only
/// inside a segment and `**` only as a whole one.
pub fn check_rule_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("`{p}` does not start with `/`"));
    }
    if let Some(c) = p.chars().find(|c| !('\x21'..'\x7f').contains(c) || "%?#;\\".contains(*c)) {
        return Err(format!("`{p}` contains `{}`, which a canonical path cannot", c.escape_default()));
    }
    let segments: Vec<&str> = p[1..].split('/').collect();
    let last = segments.len() - 1;
    for (n, s) in segments.iter().enumerate() {
        match *s {
            "" if n != last => return Err(format!("`{p}` has an empty segment (`//`)")),
            "." | ".." => return Err(format!("`{p}` has a `{s}` segment")),
            s if s.contains("**") && s != "**" => {
                return Err(format!("`{p}`: `**` must be a whole segment (`/a/**/b`), not part of `{s}`"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Check a rule's methods: `ANY` alone, or upper-case method tokens.
pub fn check_methods(methods: &[String]) -> Result<(), String> {
    if methods.is_empty() {
        return Err("no method given (write `ANY` for every method)".to_owned());
    }
    if methods.len() > 1 && methods.iter().any(|m| m == ANY) {
        return Err("`ANY` already means every method; list it alone".to_owned());
    }
    for m in methods {
        if m.is_empty() || m.len() > 32 || !m.bytes().all(|b| b.is_ascii_uppercase() || b == b'-' || b == b'_') {
            return Err(format!("`{m}` is not an upper-case method such as `GET` or `POST`"));
        }
    }
    Ok(())
}

/// Whether `m` is what a request line may carry for HTTP rules to judge
/// it: a token of upper-case letters, digits and the token symbols. A
/// lower-case letter is refused: some servers read `get` as GET.
#[must_use]
pub fn is_method(m: &str) -> bool {
    !m.is_empty()
        && m.len() <= 32
        && m.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b"!#$&'*+-.^_`|~".contains(&b))
}

/// Whether a rule's methods cover `m`.
#[must_use]
pub fn method_matches(methods: &[String], m: &str) -> bool {
    methods.iter().any(|r| r == ANY || r == m)
}

/// Whether the rule path `glob` (checked by [`check_rule_path`]) matches
/// the canonical path `path`: segment by segment, `*` any characters within
/// one segment, `**` as a segment zero or more segments.
#[must_use]
pub fn path_matches(glob: &str, path: &str) -> bool {
    let g: Vec<&str> = glob[1..].split('/').collect();
    let p: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    segments(&g, &p)
}

fn segments(g: &[&str], p: &[&str]) -> bool {
    // Iterative with one backtrack point per `**`, as label globs are in
    // the engine: a guest's path cannot make this exponential.
    let (mut gi, mut pi) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while pi < p.len() {
        match g.get(gi) {
            Some(&"**") => {
                star = Some((gi, pi));
                gi += 1;
            }
            // The engine's label matcher: a rule path has no `?`
            // (`check_rule_path`), so only `*` is a wildcard here.
            Some(s) if super::wildcard::wildcard(s.as_bytes(), p[pi].as_bytes()) => {
                gi += 1;
                pi += 1;
            }
            _ => match star {
                Some((sg, sp)) => {
                    star = Some((sg, sp + 1));
                    gi = sg + 1;
                    pi = sp + 1;
                }
                None => return false,
            },
        }
    }
    g[gi..].iter().all(|s| *s == "**")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonicalisation_table() {
        let table: Vec<(&str, String)> = [
            "/repos/org/x",
            "/repos/org/x?ref=main",
            "/repos/org/x?a=/../b",
            "/repos/%6Frg/x",
            "/repos/%6frg/%7Euser",
            "/repos/org/",
            "/",
            "/a%20b",
            "/a%3Fb",
            "/%C3%A9t%C3%A9",
            "/%c3%a9",
            "/repos/org%2Fother/x",
            "/repos/org%2fother",
            "/repos/org/%2e%2e/other",
            "/repos/org/%2E",
            "/repos/org/../other",
            "/repos/org/./x",
            "/repos/org/..",
            "/repos//org/x",
            "//repos/org",
            "/repos/org;x=1/x",
            "/repos/org/x;",
            "/repos\\org",
            "/repos/%5Corg",
            "/repos/%00",
            "/repos/%0a",
            "/repos/%7F",
            "/repos/%25",
            "/repos/%3B",
            "/repos/%zz",
            "/repos/%4",
            "/repos/%+1",
            "/%C3",
            "/%C3%28",
            "/%FF",
            "/repos/org#frag",
            "/a b",
            "/a\u{e9}",
            "/a\tb",
            "*",
            "",
            "repos/org",
            "https://api.example.com/repos/org",
        ]
        .iter()
        .map(|p| (*p, canonical_path(p).unwrap_or_else(|e| format!("refused: the path {e}"))))
        .collect();
        let text = table.iter().map(|(p, c)| format!("{p:?} => {c}")).collect::<Vec<_>>().join("\n");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn over_long_paths_are_refused() {
        let p = format!("/{}", "a".repeat(MAX_PATH));
        assert!(canonical_path(&p).unwrap_err().contains("longer"));
    }

    #[test]
    fn rule_paths() {
        for ok in ["/", "/repos/org/**", "/repos/*/pulls", "/a/**/b", "/a/x*y/", "/**"] {
            assert_eq!(check_rule_path(ok), Ok(()), "{ok}");
        }
        for (bad, needle) in [
            ("repos", "does not start"),
            ("/a?b", "`?`"),
            ("/a#b", "`#`"),
            ("/a%2F", "`%`"),
            ("/a;b", "`;`"),
            ("/a\\b", "`\\\\`"),
            ("/a b", "` `"),
            ("/a//b", "empty segment"),
            ("/a/../b", "`..` segment"),
            ("/a/./b", "`.` segment"),
            ("/a**", "whole segment"),
            ("/\u{e9}", "`\\u{e9}`"),
        ] {
            let e = check_rule_path(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn methods() {
        assert!(check_methods(&["GET".into(), "HEAD".into()]).is_ok());
        assert!(check_methods(&[ANY.into()]).is_ok());
        assert!(check_methods(&[]).is_err());
        assert!(check_methods(&["get".into()]).unwrap_err().contains("`get`"));
        assert!(check_methods(&["ANY".into(), "GET".into()]).is_err());
        assert!(method_matches(&["GET".into(), "HEAD".into()], "HEAD"));
        assert!(!method_matches(&["GET".into()], "POST"));
        assert!(method_matches(&[ANY.into()], "PROPFIND"));
        assert!(is_method("GET") && is_method("M-SEARCH") && is_method("PATCH"));
        assert!(!is_method("get") && !is_method("Get") && !is_method("") && !is_method("G ET"));
    }

    #[test]
    fn globs() {
        let yes = [
            ("/repos/org/**", "/repos/org"),
            ("/repos/org/**", "/repos/org/"),
            ("/repos/org/**", "/repos/org/x/y/z"),
            ("/repos/*/pulls", "/repos/org/pulls"),
            ("/repos/*/pulls", "/repos//pulls"),
            ("/a/**/b", "/a/b"),
            ("/a/**/b", "/a/x/y/b"),
            ("/a/x*y", "/a/xzzy"),
            ("/**", "/"),
            ("/", "/"),
            ("/a/**/b/**/c", "/a/b/q/b/c"),
        ];
        for (g, p) in yes {
            assert!(path_matches(g, p), "{g} {p}");
        }
        let no = [
            ("/repos/org/**", "/repos/other/x"),
            ("/repos/org/**", "/repos/orgx"),
            ("/repos/*/pulls", "/repos/a/b/pulls"),
            ("/a/**/b", "/a/x/c"),
            ("/repos/org", "/repos/org/"),
            ("/repos/org", "/Repos/org"),
            ("/", "/a"),
        ];
        for (g, p) in no {
            assert!(!path_matches(g, p), "{g} {p}");
        }
    }

    proptest::proptest! {
        /// A canonical path is a fixed point, and never has what the
        /// refusals list.
        #[test]
        fn canonical_is_idempotent(raw in "/[a-zA-Z0-9/%._;~?#-]{0,40}") {
            if let Ok(c) = canonical_path(&raw) {
                proptest::prop_assert_eq!(canonical_path(&c), Ok(c.clone()));
                proptest::prop_assert!(!c.contains("//") && !c.contains(';') && !c.contains('?'));
                for s in c.split('/') {
                    proptest::prop_assert!(s != "." && s != "..");
                }
            }
        }
    }
}

//! The `resource` of a rule: what it matches, parsed once and kept in a form
//! the engine can index without re-parsing. Owns the grammar (docs/policy.md
//! has the table) and its error messages; never matches anything itself.
//!
//! Parsing is total over `&str`: every input either becomes a [`Resource`]
//! whose printed form parses back to the same value, or a [`ResourceError`]
//! that says what is wrong. The fuzz target `resource_parse` holds it to that.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The characters that make a resource a regex. `.`, `*` and `?` are not
/// among them: they are glob characters, and `.` is in every host name.
pub(crate) const REGEX_META: [char; 11] = ['^', '$', '(', ')', '[', ']', '{', '}', '|', '+', '\\'];

/// What a rule matches: a host pattern or an address range, optionally
/// restricted to one port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resource {
    pattern: Pattern,
    port: Option<u16>,
}

/// The parsed pattern. Host strings are stored lower-case without a trailing
/// dot; regexes are stored as written (lower-casing `\D` would change it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Pattern {
    /// `**`: everything.
    Any,
    /// `example.com`.
    Exact(Box<str>),
    /// `*.base` (exactly one label below `base`) or `**.base` (one or more).
    Sub { base: Box<str>, deep: bool },
    /// Any other host pattern with `*` or `?` in a label, e.g. `api-*.example.com`.
    Glob(Box<str>),
    /// Matched against the whole host name, anchored and case-insensitive.
    Regex(Box<str>, ParsedRegex),
    /// One address. IPv4-mapped IPv6 addresses are stored as IPv4.
    Ip(IpAddr),
    /// A network with no host bits set.
    Net(IpNet),
}

/// The coarse kind of a resource, for listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceKind {
    /// `**`
    Any,
    /// An exact host name.
    Host,
    /// `*.example.com` or `**.example.com`.
    Wildcard,
    /// A host name with `*` or `?` inside a label.
    Glob,
    /// A regular expression over the host name.
    Regex,
    /// A single IP address.
    Ip,
    /// A CIDR network.
    Cidr,
}

/// Why a resource string was rejected. The message quotes the offending
/// value; the hint, when there is one, says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ResourceError {
    message: String,
    hint: Option<String>,
}

impl ResourceError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), hint: None }
    }

    #[must_use]
    pub(crate) fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The message, e.g. "`a..b` has an empty label".
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// What to write instead, when ppp can tell.
    #[must_use]
    pub fn hint(&self) -> Option<&str> {
        self.hint.as_deref()
    }
}

impl From<ResourceError> for crate::error::Failure {
    fn from(e: ResourceError) -> Self {
        let f = crate::error::fail(e.message);
        match e.hint {
            Some(h) => f.hint(h),
            None => f,
        }
    }
}

type Result<T> = std::result::Result<T, ResourceError>;

fn err(message: impl Into<String>) -> ResourceError {
    ResourceError::new(message)
}

impl Resource {
    /// Parse a resource; see docs/policy.md for the grammar.
    pub fn parse(s: &str) -> Result<Resource> {
        if s.is_empty() {
            return Err(err("resource is empty").with_hint("name a host, such as `api.example.com` or `*.example.com`"));
        }
        if s.chars().any(char::is_whitespace) {
            // Almost always `a.com, b.com` or two words where one was meant.
            return Err(err(format!("`{}` contains whitespace", s.escape_debug()))
                .with_hint("separate resources with commas and no spaces, e.g. `api.example.com,cdn.example.com`"));
        }
        if let Some(c) = s.chars().find(|c| c.is_control()) {
            return Err(err(format!("`{}` contains control character `{}`", s.escape_debug(), c.escape_debug())));
        }
        if let Some((scheme, _)) = s.split_once("://") {
            return Err(err(format!("`{s}` is a URL, not a resource"))
                .with_hint(format!("drop `{scheme}://` and any path: a rule names a host, address or network")));
        }
        if let Some(r) = parse_bracketed(s)? {
            return Ok(r);
        }
        if s.contains(REGEX_META) {
            return parse_regex(s);
        }
        if s.bytes().filter(|&b| b == b':').count() > 1 {
            // More than one colon: a bare IPv6 address or network, which
            // cannot carry a port (`::1:443` is itself an address).
            let pattern = parse_ip(s, s, Family::V6).map_err(|e| match e.hint {
                Some(_) => e,
                None => e.with_hint("an IPv6 address with a port is written in brackets, e.g. `[2001:db8::1]:443`"),
            })?;
            return Ok(Resource { pattern, port: None });
        }
        let (host, port) = match s.split_once(':') {
            Some((h, p)) => (h, Some(parse_port(s, p)?)),
            None => (s, None),
        };
        if host.is_empty() {
            return Err(err(format!("`{s}` has no host")));
        }
        let pattern = if host == "**" {
            Pattern::Any
        } else if looks_like_ipv4(host) {
            parse_ip(s, host, Family::V4)?
        } else {
            parse_host_pattern(s, host)?
        };
        Ok(Resource { pattern, port })
    }

    /// The port the rule is restricted to, if any.
    #[must_use]
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The coarse kind, for listings.
    #[must_use]
    pub fn kind(&self) -> ResourceKind {
        match self.pattern {
            Pattern::Any => ResourceKind::Any,
            Pattern::Exact(_) => ResourceKind::Host,
            Pattern::Sub { .. } => ResourceKind::Wildcard,
            Pattern::Glob(_) => ResourceKind::Glob,
            Pattern::Regex(..) => ResourceKind::Regex,
            Pattern::Ip(_) => ResourceKind::Ip,
            Pattern::Net(_) => ResourceKind::Cidr,
        }
    }

    /// True for `**` with or without a port.
    #[must_use]
    pub fn is_any(&self) -> bool {
        self.pattern == Pattern::Any
    }

    pub(crate) fn pattern(&self) -> &Pattern {
        &self.pattern
    }
}

/// Digits and dots, optionally `/len`: an IPv4 address or network, never a
/// host name (no top-level domain is numeric).
fn looks_like_ipv4(host: &str) -> bool {
    let addr = host.split_once('/').map_or(host, |(a, _)| a);
    addr.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// `[v6]` or `[v6]:port`, also with a `/len` network inside the brackets.
/// A regex of that exact shape could only ever match a one-character host,
/// so the shape is taken as an address and errors are reported as such.
fn parse_bracketed(s: &str) -> Result<Option<Resource>> {
    let Some(rest) = s.strip_prefix('[') else { return Ok(None) };
    let Some((inner, after)) = rest.split_once(']') else { return Ok(None) };
    let port = match after {
        "" => None,
        _ => match after.strip_prefix(':') {
            Some(p) => Some(parse_port(s, p)?),
            None => return Ok(None),
        },
    };
    if !inner.contains(':') && parse_ip(s, inner, Family::V4).is_ok() {
        let bare = match port {
            Some(p) => format!("{inner}:{p}"),
            None => inner.to_owned(),
        };
        return Err(err(format!("`{s}` puts an IPv4 address in brackets"))
            .with_hint(format!("brackets are for IPv6; write `{bare}`")));
    }
    let pattern = parse_ip(s, inner, Family::V6)?;
    Ok(Some(Resource { pattern, port }))
}

fn parse_regex(s: &str) -> Result<Resource> {
    // A trailing unescaped `:digits` is a port: host names never contain a
    // colon, so a regex ending in a literal one could never match anyway.
    let (src, port) = match s.rfind(':') {
        Some(i) if s[i + 1..].bytes().all(|b| b.is_ascii_digit()) && !escaped(s, i) => {
            (&s[..i], Some(parse_port(s, &s[i + 1..])?))
        }
        // `example.com:+80` has a regex metacharacter only because the port
        // is mistyped; reading it as a regex would add a rule that never
        // matches anything.
        Some(i) if !escaped(s, i) && s[i + 1..].trim_start_matches(['+', '-']).bytes().all(|b| b.is_ascii_digit()) => {
            return Err(err(format!("port `{}` in `{s}` is not a number", &s[i + 1..])));
        }
        _ => (s, None),
    };
    let hir = validate_regex(src)?;
    Ok(Resource { pattern: Pattern::Regex(src.into(), ParsedRegex(Arc::new(hir))), port })
}

/// True when the byte at `i` is preceded by an odd number of backslashes.
fn escaped(s: &str, i: usize) -> bool {
    s.as_bytes()[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// The regex the engine compiles for a regex resource. The group keeps a
/// top-level `|` inside the anchors.
pub(crate) fn anchored(src: &str) -> String {
    format!("^(?:{src})$")
}

/// The regex's syntax tree, kept from validation so `Engine::build` does not
/// parse every regex a second time (that was half its cost at 10,000 rules).
/// It is a function of the source text, so it takes no part in equality.
#[derive(Debug, Clone)]
pub(crate) struct ParsedRegex(pub(crate) Arc<regex_syntax::hir::Hir>);

impl PartialEq for ParsedRegex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for ParsedRegex {}
impl std::hash::Hash for ParsedRegex {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

/// Parse with the settings the engine compiles with: bytes, no Unicode (host
/// names are ASCII, and Unicode case folding multiplies the automaton's
/// size), case-insensitive, anchored. Only syntax is checked here, which is
/// cheap; the automaton is built in `Engine::build`.
fn validate_regex(src: &str) -> Result<regex_syntax::hir::Hir> {
    let mut parser = regex_syntax::ParserBuilder::new().case_insensitive(true).unicode(false).utf8(false).build();
    parser.parse(&anchored(src)).map_err(|e| {
        let why = match &e {
            regex_syntax::Error::Parse(e) => e.kind().to_string(),
            regex_syntax::Error::Translate(e) => e.kind().to_string(),
            other => other.to_string(),
        };
        err(format!("`{src}` is not a valid regex: {why}"))
    })
}

fn parse_port(orig: &str, p: &str) -> Result<u16> {
    if p.is_empty() {
        return Err(err(format!("`{orig}` has an empty port")));
    }
    if !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(format!("port `{p}` in `{orig}` is not a number")));
    }
    match p.parse::<u32>() {
        Ok(n @ 1..=65535) => Ok(u16::try_from(n).expect("range checked")),
        _ => Err(err(format!("port `{p}` in `{orig}` is out of range")).with_hint("ports run from 1 to 65535")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    fn max_len(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    fn parse_addr(self, s: &str) -> Option<IpAddr> {
        match self {
            Family::V4 => s.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4),
            Family::V6 => s.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6),
        }
    }
}

/// An address or `addr/len` of the given family.
fn parse_ip(orig: &str, text: &str, family: Family) -> Result<Pattern> {
    let (addr_text, len_text) = match text.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (text, None),
    };
    let addr = family
        .parse_addr(addr_text)
        .ok_or_else(|| err(format!("`{addr_text}` is not a valid {} address", family.name())))?;
    let Some(len_text) = len_text else {
        return Ok(Pattern::Ip(addr.to_canonical()));
    };
    if len_text.is_empty() {
        return Err(err(format!("`{orig}` has an empty prefix length")));
    }
    let max = family.max_len();
    let len = match len_text.parse::<u8>() {
        Ok(l) if l <= max && len_text.bytes().all(|b| b.is_ascii_digit()) => l,
        _ => {
            return Err(err(format!("prefix length `{len_text}` in `{orig}` is out of range"))
                .with_hint(format!("{} prefix lengths run from 0 to {max}", family.name())));
        }
    };
    let net = IpNet::new(addr, len).expect("prefix length checked");
    if net.addr() != net.network() {
        return Err(err(format!("`{text}` has host bits set")).with_hint(format!("the network is `{}`", net.trunc())));
    }
    Ok(Pattern::Net(canonical_net(net)))
}

/// IPv4-mapped IPv6 networks become IPv4 ones, because the engine compares
/// IPv4-mapped query addresses as IPv4. Without this, `::ffff:10.0.0.0/104`
/// would silently never match.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(n) = net
        && n.prefix_len() >= 96
        && let Some(v4) = n.addr().to_ipv4_mapped()
    {
        return IpNet::new(IpAddr::V4(v4), n.prefix_len() - 96).expect("prefix at most 32");
    }
    net
}

fn parse_host_pattern(orig: &str, host: &str) -> Result<Pattern> {
    let h = host.strip_suffix('.').unwrap_or(host);
    // `*.` or `**.` is what `*.$DOMAIN` becomes when the variable is empty.
    // With the trailing dot dropped it would be `*` (every one-label host)
    // or `**` (everything): a rule far wider than the one meant, so a
    // pattern of wildcards alone with a trailing dot is refused.
    if h.len() < host.len() && h.split('.').all(|l| !l.is_empty() && l.chars().all(|c| matches!(c, '*' | '?'))) {
        return Err(err(format!("`{orig}` has no domain after the wildcard"))
            .with_hint("name the domain, e.g. `*.example.com`; to match every host, write `**`"));
    }
    if let Some(c) = h.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '*' | '?'))) {
        let e = err(format!("`{orig}` contains invalid character `{}`", c.escape_debug()));
        return Err(if c.is_ascii() {
            e
        } else {
            e.with_hint("write internationalised names in their `xn--` (punycode) form")
        });
    }
    if h.len() > 253 {
        return Err(err(format!("`{orig}` is longer than 253 characters")));
    }
    let lower = h.to_ascii_lowercase();
    for (i, label) in lower.split('.').enumerate() {
        if label.is_empty() {
            return Err(err(format!("`{orig}` has an empty label")));
        }
        if label.len() > 63 {
            return Err(err(format!("label `{label}` in `{orig}` is longer than 63 characters")));
        }
        if label.contains("**") && !(i == 0 && label == "**") {
            return Err(err(format!("`{orig}` uses `**` inside a name"))
                .with_hint("`**` is only valid as the whole first label, as in `**.example.com`"));
        }
    }
    let wild = |s: &str| s.contains(['*', '?']);
    if !wild(&lower) {
        return Ok(Pattern::Exact(lower.into()));
    }
    if let Some((first, base)) = lower.split_once('.')
        && !wild(base)
        && (first == "*" || first == "**")
    {
        return Ok(Pattern::Sub { base: base.into(), deep: first == "**" });
    }
    Ok(Pattern::Glob(lower.into()))
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Any => f.write_str("**"),
            Pattern::Exact(h) | Pattern::Glob(h) | Pattern::Regex(h, _) => f.write_str(h),
            Pattern::Sub { base, deep: false } => write!(f, "*.{base}"),
            Pattern::Sub { base, deep: true } => write!(f, "**.{base}"),
            Pattern::Ip(a) => write!(f, "{a}"),
            Pattern::Net(n) => write!(f, "{n}"),
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = matches!(self.pattern, Pattern::Ip(IpAddr::V6(_)) | Pattern::Net(IpNet::V6(_)));
        match self.port {
            Some(p) if v6 => write!(f, "[{}]:{p}", self.pattern),
            Some(p) => write!(f, "{}:{p}", self.pattern),
            None => write!(f, "{}", self.pattern),
        }
    }
}

impl FromStr for Resource {
    type Err = ResourceError;
    fn from_str(s: &str) -> Result<Self> {
        Resource::parse(s)
    }
}

impl Serialize for Resource {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Resource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Resource;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a resource string such as `example.com` or `10.0.0.0/8`")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<Resource, E> {
                // The hint goes into the message: a file error has no other
                // place to carry it.
                Resource::parse(s).map_err(|e| match e.hint {
                    Some(h) => E::custom(format_args!("{} ({h})", e.message)),
                    None => E::custom(e.message),
                })
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Resource {
        Resource::parse(s).unwrap_or_else(|e| panic!("`{s}`: {e}"))
    }

    fn e(s: &str) -> String {
        Resource::parse(s).expect_err(s).to_string()
    }

    fn hint(s: &str) -> String {
        Resource::parse(s).expect_err(s).hint().expect("a hint").to_owned()
    }

    #[test]
    fn kinds() {
        let cases = [
            ("**", ResourceKind::Any),
            ("**:443", ResourceKind::Any),
            ("example.com", ResourceKind::Host),
            ("localhost", ResourceKind::Host),
            ("*.example.com", ResourceKind::Wildcard),
            ("**.example.com", ResourceKind::Wildcard),
            ("api-*.example.com", ResourceKind::Glob),
            ("ex?mple.com", ResourceKind::Glob),
            ("*.*.example.com", ResourceKind::Glob),
            ("**.api-*.example.com", ResourceKind::Glob),
            ("*", ResourceKind::Glob),
            (r"^api\d+\.example\.com$", ResourceKind::Regex),
            ("(a|b).example.com", ResourceKind::Regex),
            ("10.0.0.1", ResourceKind::Ip),
            ("10.0.0.0/8", ResourceKind::Cidr),
            ("2001:db8::1", ResourceKind::Ip),
            ("2001:db8::/32", ResourceKind::Cidr),
            ("[2001:db8::1]:443", ResourceKind::Ip),
            ("[2001:db8::/32]:443", ResourceKind::Cidr),
        ];
        for (s, k) in cases {
            assert_eq!(p(s).kind(), k, "{s}");
        }
    }

    #[test]
    fn canonical_form() {
        let cases = [
            ("Example.COM.", "example.com"),
            ("EXAMPLE.com.:443", "example.com:443"),
            ("*.Example.com", "*.example.com"),
            ("**:0443", "**:443"),
            ("API-*.Example.com", "api-*.example.com"),
            (r"^API\D+$", r"^API\D+$"),
            (r"^api\d+$:8443", r"^api\d+$:8443"),
            ("[2001:DB8:0:0::1]:443", "[2001:db8::1]:443"),
            ("2001:DB8::1", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("[2001:db8::/32]:443", "[2001:db8::/32]:443"),
            ("10.0.0.0/8:22", "10.0.0.0/8:22"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("[::ffff:10.0.0.1]:80", "10.0.0.1:80"),
        ];
        for (input, want) in cases {
            let r = p(input);
            assert_eq!(r.to_string(), want, "{input}");
            assert_eq!(p(&r.to_string()), r, "{input}");
        }
    }

    #[test]
    fn ports() {
        assert_eq!(p("example.com:443").port(), Some(443));
        assert_eq!(p("example.com").port(), None);
        assert_eq!(p("**:1").port(), Some(1));
        assert_eq!(p("[::1]:65535").port(), Some(65535));
        // `::1:443` is an address, not `::1` port 443.
        assert_eq!(p("::1:443").port(), None);
        assert_eq!(p(r"\d+\.example\.com:8080").port(), Some(8080));
        // An escaped colon belongs to the regex.
        assert_eq!(p(r"a\:80").port(), None);
        assert_eq!(p(r"a\\:80").port(), Some(80));
    }

    #[test]
    fn error_messages() {
        let cases = [
            ("", "resource is empty"),
            ("a..b", "`a..b` has an empty label"),
            (".example.com", "`.example.com` has an empty label"),
            ("example.com..", "`example.com..` has an empty label"),
            ("a b", "`a b` contains whitespace"),
            (" example.com", "` example.com` contains whitespace"),
            ("example.com\n", "`example.com\\n` contains whitespace"),
            ("example.com:", "`example.com:` has an empty port"),
            ("example.com:0", "port `0` in `example.com:0` is out of range"),
            ("example.com:+80", "port `+80` in `example.com:+80` is not a number"),
            ("https://example.com/x", "`https://example.com/x` is a URL, not a resource"),
            ("example.com:65536", "port `65536` in `example.com:65536` is out of range"),
            ("example.com:99999999999", "port `99999999999` in `example.com:99999999999` is out of range"),
            ("example.com:https", "port `https` in `example.com:https` is not a number"),
            ("example.com:-1", "port `-1` in `example.com:-1` is not a number"),
            (":443", "`:443` has no host"),
            ("exa!mple.com", "`exa!mple.com` contains invalid character `!`"),
            ("a\u{1a}(b)", "`a\\u{1a}(b)` contains control character `\\u{1a}`"),
            ("bücher.de", "`bücher.de` contains invalid character `ü`"),
            ("a/b.com", "`a/b.com` contains invalid character `/`"),
            ("a.**.com", "`a.**.com` uses `**` inside a name"),
            ("***.com", "`***.com` uses `**` inside a name"),
            ("a**.com", "`a**.com` uses `**` inside a name"),
            ("10.0.0.1/8", "`10.0.0.1/8` has host bits set"),
            ("10.0.0.0/33", "prefix length `33` in `10.0.0.0/33` is out of range"),
            ("10.0.0.0/", "`10.0.0.0/` has an empty prefix length"),
            ("10.0.0.0/x", "prefix length `x` in `10.0.0.0/x` is out of range"),
            ("+a", "`+a` is not a valid regex: repetition operator missing expression"),
            ("2001:db8::1/32", "`2001:db8::1/32` has host bits set"),
            ("2001:db8::/129", "prefix length `129` in `2001:db8::/129` is out of range"),
            ("1.2.3.256", "`1.2.3.256` is not a valid IPv4 address"),
            ("1.2.3", "`1.2.3` is not a valid IPv4 address"),
            ("2001:db8::zz", "`2001:db8::zz` is not a valid IPv6 address"),
            ("2001:db8::1:443x", "`2001:db8::1:443x` is not a valid IPv6 address"),
            ("[2001:db8::zz]:443", "`2001:db8::zz` is not a valid IPv6 address"),
            ("[2001:db8::1]:", "`[2001:db8::1]:` has an empty port"),
            ("[2001:db8::1]:70000", "port `70000` in `[2001:db8::1]:70000` is out of range"),
            ("[10.0.0.1]:443", "`[10.0.0.1]:443` puts an IPv4 address in brackets"),
            ("^foo(", "`^foo(` is not a valid regex: unclosed group"),
            ("a{2,1}", "`a{2,1}` is not a valid regex: invalid repetition count range, the start must be <= the end"),
            (r"\p{Greek}", r"`\p{Greek}` is not a valid regex: Unicode not allowed here"),
            ("(a|b):", "`(a|b):` has an empty port"),
            // Wildcards with no domain after them: never widened to `*`/`**`.
            ("*.", "`*.` has no domain after the wildcard"),
            ("**.", "`**.` has no domain after the wildcard"),
            ("*.:443", "`*.:443` has no domain after the wildcard"),
            ("**.:443", "`**.:443` has no domain after the wildcard"),
            ("?.", "`?.` has no domain after the wildcard"),
            ("*.*.", "`*.*.` has no domain after the wildcard"),
            ("*..", "`*..` has an empty label"),
            ("**..", "`**..` has an empty label"),
            // Dots alone look like an IPv4 address, and are not one.
            (".", "`.` is not a valid IPv4 address"),
            (".:443", "`.` is not a valid IPv4 address"),
            ("..", "`..` is not a valid IPv4 address"),
            (" *.", "` *.` contains whitespace"),
            ("*. ", "`*. ` contains whitespace"),
        ];
        for (input, want) in cases {
            assert_eq!(e(input), want, "input {input:?}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        assert_eq!(
            e(&long_label),
            format!("label `{}` in `{long_label}` is longer than 63 characters", "a".repeat(64))
        );
        let long_host = ["a".repeat(63).as_str(); 4].join(".") + ".a";
        assert_eq!(long_host.len(), 257);
        assert_eq!(e(&long_host), format!("`{long_host}` is longer than 253 characters"));
        // 63-character labels and a 253-character host are fine.
        let max_host = ["a".repeat(63).as_str(); 3].join(".") + "." + &"b".repeat(61);
        assert_eq!(max_host.len(), 253);
        p(&max_host);
        p(&format!("{max_host}."));
    }

    #[test]
    fn hints() {
        assert_eq!(hint("10.0.0.1/8"), "the network is `10.0.0.0/8`");
        assert_eq!(hint("10.1.2.3/16:443"), "the network is `10.1.0.0/16`");
        assert_eq!(hint("2001:db8::1/32"), "the network is `2001:db8::/32`");
        assert_eq!(hint("[2001:db8::1/32]:443"), "the network is `2001:db8::/32`");
        assert_eq!(hint("example.com:0"), "ports run from 1 to 65535");
        assert_eq!(hint("[10.0.0.1]:443"), "brackets are for IPv6; write `10.0.0.1:443`");
        assert!(hint("2001:db8::zz").contains("[2001:db8::1]:443"));
        assert!(hint("bücher.de").contains("punycode"));
        assert_eq!(hint("*."), "name the domain, e.g. `*.example.com`; to match every host, write `**`");
        assert_eq!(hint("**.:443"), hint("*."));
        let f: crate::error::Failure = Resource::parse("10.0.0.1/8").unwrap_err().into();
        let (text, _) = crate::error::render(&anyhow::Error::from(f));
        assert_eq!(text, "error: `10.0.0.1/8` has host bits set\nhint: the network is `10.0.0.0/8`\n");
    }

    #[test]
    fn accepted_oddities() {
        // Underscores occur in real host names (`_dmarc`, some CDNs).
        p("_dmarc.example.com");
        p("0.0.0.0/0");
        p("::/0");
        p("**:443");
        p("*:443");
        // A trailing dot after a domain is the fully qualified form.
        assert_eq!(p("*.Example.com.").to_string(), "*.example.com");
        assert_eq!(p("api-*.").to_string(), "api-*");
        // `(?x)` comments would swallow the anchors, so they fail up front.
        assert!(e("(?x)a#b").contains("is not a valid regex"), "{}", e("(?x)a#b"));
    }

    #[test]
    fn serde_as_string() {
        let r = p("[2001:db8::1]:443");
        assert_eq!(serde_json::to_string(&r).unwrap(), r#""[2001:db8::1]:443""#);
        let back: Resource = serde_json::from_str(r#""[2001:db8::1]:443""#).unwrap();
        assert_eq!(back, r);
        let bad = serde_json::from_str::<Resource>(r#""10.0.0.1/8""#).unwrap_err().to_string();
        assert!(bad.starts_with("`10.0.0.1/8` has host bits set (the network is `10.0.0.0/8`)"), "{bad}");
    }
}

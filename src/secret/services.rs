//! The built-in services: which hosts each one's key is for, which header
//! carries it and how the header value is formed, and which environment
//! variables `ppp secret import` reads it from.
//!
//! Also the pure function the daemon uses to turn a stored key into the header
//! to inject ([`ServiceSpec::header_for`], [`Header::render`]). This module
//! never reads a store and never decides policy; it only knows formats.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;

use crate::error::fail;
use crate::secret::Value;

/// How a header value is formed from the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// The secret itself.
    Raw,
    /// `Bearer <secret>`.
    Bearer,
    /// `Basic base64(<user>:<secret>)`, as git-over-HTTPS wants.
    Basic { user: Cow<'static, str> },
}

/// A header to inject: its (lower-case) name and how its value is formed.
///
/// Written in the index and accepted from users as text:
/// `x-api-key` (raw), `authorization: Bearer`, `authorization: Basic <user>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: Cow<'static, str>,
    pub format: Format,
}

impl Header {
    /// `authorization: Bearer`, the default for services ppp does not know.
    pub const BEARER: Header = Header::bearer("authorization");

    const fn raw(name: &'static str) -> Header {
        Header { name: Cow::Borrowed(name), format: Format::Raw }
    }

    const fn bearer(name: &'static str) -> Header {
        Header { name: Cow::Borrowed(name), format: Format::Bearer }
    }

    /// Parse the textual form (see the type's docs). Header names are
    /// case-insensitive and come back lower case.
    pub fn parse(text: &str) -> anyhow::Result<Header> {
        let (name, rest) = match text.split_once(':') {
            Some((n, r)) => (n.trim(), Some(r.trim())),
            None => (text.trim(), None),
        };
        let name = name.to_ascii_lowercase();
        // RFC 9110 token characters.
        let token_ok = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(token_ok) {
            return Err(fail(format!("`{text}` is not a valid header"))
                .hint("write `x-api-key`, `authorization: Bearer` or `authorization: Basic <user>`")
                .into());
        }
        let format = match rest.map(|r| r.split_whitespace().collect::<Vec<_>>()).as_deref() {
            None => Format::Raw,
            Some(["Bearer" | "bearer"]) => Format::Bearer,
            Some(["Basic" | "basic", user]) if !user.contains(':') => {
                Format::Basic { user: Cow::Owned((*user).to_owned()) }
            }
            Some(_) => {
                return Err(fail(format!("`{text}` is not a valid header"))
                    .hint("after the colon only `Bearer` or `Basic <user>` may follow")
                    .into());
            }
        };
        Ok(Header { name: Cow::Owned(name), format })
    }

    /// The header name and value to inject for `secret`.
    #[must_use]
    pub fn render(&self, secret: &Value) -> (String, Value) {
        let s = secret.expose();
        let value = match &self.format {
            Format::Raw => secret.clone(),
            Format::Bearer => {
                // Sized up front so the buffer never reallocates and leaves
                // an unzeroized copy behind.
                let mut out = String::with_capacity(7 + s.len());
                out.push_str("Bearer ");
                out.push_str(s);
                Value::new(out)
            }
            Format::Basic { user } => {
                let mut pair = String::with_capacity(user.len() + 1 + s.len());
                pair.push_str(user);
                pair.push(':');
                pair.push_str(s);
                let pair = Value::new(pair);
                let mut out = String::with_capacity(6 + pair.len().div_ceil(3) * 4);
                out.push_str("Basic ");
                base64::engine::general_purpose::STANDARD.encode_string(pair.expose().as_bytes(), &mut out);
                Value::new(out)
            }
        };
        (self.name.clone().into_owned(), value)
    }
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.format {
            Format::Raw => write!(f, "{}", self.name),
            Format::Bearer => write!(f, "{}: Bearer", self.name),
            Format::Basic { user } => write!(f, "{}: Basic {user}", self.name),
        }
    }
}

/// A service ppp knows: its API hosts, the header each host takes, and the
/// environment variables its key is conventionally kept in.
#[derive(Debug)]
pub struct ServiceSpec {
    /// The service name, as in `ppp secret set <name>` and `ppp.<name>`.
    pub name: &'static str,
    /// Every host the key is injected for.
    pub hosts: &'static [&'static str],
    /// Variables `ppp secret import` reads, first one set wins.
    pub env_vars: &'static [&'static str],
    /// The header for most hosts.
    pub header: Header,
    /// Hosts that take a different header than [`ServiceSpec::header`].
    pub host_headers: &'static [(&'static str, Header)],
}

impl ServiceSpec {
    /// The header `host` takes, or `None` when the key is not for `host`.
    #[must_use]
    pub fn header_rule(&self, host: &str) -> Option<&Header> {
        let host = canonical_host(host);
        if !self.hosts.contains(&host.as_ref()) {
            return None;
        }
        Some(self.host_header(&host).unwrap_or(&self.header))
    }

    /// The per-host exception for `host`, if it has one. `host` must be
    /// canonical (lower case, no trailing dot).
    pub(crate) fn host_header(&self, host: &str) -> Option<&Header> {
        self.host_headers.iter().find(|(h, _)| *h == host).map(|(_, hd)| hd)
    }

    /// The header name and value to inject into a request for `host`, or
    /// `None` when this service's key must not go to `host`.
    #[must_use]
    pub fn header_for(&self, host: &str, secret: &Value) -> Option<(String, Value)> {
        self.header_rule(host).map(|h| h.render(secret))
    }
}

/// Lower case, without the trailing dot of a fully qualified name: the form
/// hosts are compared in.
pub(crate) fn canonical_host(host: &str) -> Cow<'_, str> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

static ALL: &[ServiceSpec] = &[
    ServiceSpec {
        name: "anthropic",
        hosts: &["api.anthropic.com"],
        env_vars: &["ANTHROPIC_API_KEY"],
        header: Header::raw("x-api-key"),
        host_headers: &[],
    },
    ServiceSpec {
        name: "openai",
        hosts: &["api.openai.com"],
        env_vars: &["OPENAI_API_KEY"],
        header: Header::BEARER,
        host_headers: &[],
    },
    ServiceSpec {
        name: "github",
        hosts: &["api.github.com", "uploads.github.com", "github.com"],
        env_vars: &["GH_TOKEN", "GITHUB_TOKEN"],
        header: Header::BEARER,
        // git over HTTPS does not accept bearer tokens; it takes the token as
        // the password of Basic auth, with this conventional user name.
        host_headers: &[(
            "github.com",
            Header {
                name: Cow::Borrowed("authorization"),
                format: Format::Basic { user: Cow::Borrowed("x-access-token") },
            },
        )],
    },
    ServiceSpec {
        name: "google",
        hosts: &["generativelanguage.googleapis.com"],
        env_vars: &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        header: Header::raw("x-goog-api-key"),
        host_headers: &[],
    },
    ServiceSpec {
        name: "groq",
        hosts: &["api.groq.com"],
        env_vars: &["GROQ_API_KEY"],
        header: Header::BEARER,
        host_headers: &[],
    },
    ServiceSpec {
        name: "mistral",
        hosts: &["api.mistral.ai"],
        env_vars: &["MISTRAL_API_KEY"],
        header: Header::BEARER,
        host_headers: &[],
    },
    ServiceSpec {
        name: "nebius",
        hosts: &["api.studio.nebius.com", "api.studio.nebius.ai", "api.tokenfactory.nebius.com"],
        env_vars: &["NEBIUS_API_KEY"],
        header: Header::BEARER,
        host_headers: &[],
    },
    ServiceSpec {
        name: "openrouter",
        hosts: &["openrouter.ai"],
        env_vars: &["OPENROUTER_API_KEY"],
        header: Header::BEARER,
        host_headers: &[],
    },
    ServiceSpec {
        name: "xai",
        hosts: &["api.x.ai"],
        env_vars: &["XAI_API_KEY"],
        header: Header::BEARER,
        host_headers: &[],
    },
];

/// The built-in service called `name`.
#[must_use]
pub fn builtin(name: &str) -> Option<&'static ServiceSpec> {
    ALL.iter().find(|s| s.name == name)
}

/// Every built-in service, in the order `ppp secret import` and help list them.
#[must_use]
pub fn all() -> &'static [ServiceSpec] {
    ALL
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::validate;

    fn v(s: &str) -> Value {
        Value::new(s.to_owned())
    }

    fn inject(service: &str, host: &str, key: &str) -> Option<(String, String)> {
        builtin(service).unwrap().header_for(host, &v(key)).map(|(n, val)| (n, val.expose().to_owned()))
    }

    #[test]
    fn builtin_headers() {
        let pair = |n: &str, val: &str| Some((n.to_owned(), val.to_owned()));
        assert_eq!(inject("anthropic", "api.anthropic.com", "k"), pair("x-api-key", "k"));
        assert_eq!(inject("openai", "api.openai.com", "k"), pair("authorization", "Bearer k"));
        assert_eq!(inject("github", "api.github.com", "ghp_x"), pair("authorization", "Bearer ghp_x"));
        assert_eq!(inject("github", "uploads.github.com", "t"), pair("authorization", "Bearer t"));
        // base64("x-access-token:ghp_abc")
        assert_eq!(
            inject("github", "github.com", "ghp_abc"),
            pair("authorization", "Basic eC1hY2Nlc3MtdG9rZW46Z2hwX2FiYw==")
        );
        assert_eq!(inject("google", "generativelanguage.googleapis.com", "AIza"), pair("x-goog-api-key", "AIza"));
        for (svc, host) in [
            ("groq", "api.groq.com"),
            ("mistral", "api.mistral.ai"),
            ("nebius", "api.studio.nebius.com"),
            ("nebius", "api.studio.nebius.ai"),
            ("nebius", "api.tokenfactory.nebius.com"),
            ("openrouter", "openrouter.ai"),
            ("xai", "api.x.ai"),
        ] {
            assert_eq!(inject(svc, host, "k"), pair("authorization", "Bearer k"), "{svc} {host}");
        }
    }

    #[test]
    fn keys_only_go_to_their_hosts() {
        assert_eq!(inject("anthropic", "api.openai.com", "k"), None);
        assert_eq!(inject("anthropic", "evil.api.anthropic.com", "k"), None);
        assert_eq!(inject("anthropic", "api.anthropic.com.evil.net", "k"), None);
        assert_eq!(inject("github", "gist.github.com", "k"), None);
        // Host comparison ignores case and a trailing dot.
        assert!(inject("anthropic", "API.Anthropic.COM.", "k").is_some());
    }

    #[test]
    fn builtin_table_is_well_formed() {
        let names: Vec<_> = all().iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            ["anthropic", "openai", "github", "google", "groq", "mistral", "nebius", "openrouter", "xai"]
        );
        for s in all() {
            validate::service(s.name).unwrap();
            assert!(!s.hosts.is_empty() && !s.env_vars.is_empty(), "{}", s.name);
            for h in s.hosts {
                assert_eq!(validate::host(h).unwrap(), *h);
            }
            for (h, _) in s.host_headers {
                assert!(s.hosts.contains(h), "{} overrides a host it does not list", s.name);
            }
            assert_eq!(Header::parse(&s.header.to_string()).unwrap(), s.header);
        }
        assert!(builtin("usai").is_none());
        assert_eq!(builtin("github").unwrap().env_vars, ["GH_TOKEN", "GITHUB_TOKEN"]);
        assert_eq!(builtin("google").unwrap().env_vars, ["GEMINI_API_KEY", "GOOGLE_API_KEY"]);
    }

    #[test]
    fn header_text_round_trips() {
        for text in ["x-api-key", "authorization: Bearer", "authorization: Basic x-access-token"] {
            assert_eq!(Header::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(Header::parse("Authorization:bearer").unwrap(), Header::BEARER);
        for bad in ["", "x api key", "authorization: Token", "a: Basic", "a: Basic u:p", "a: Bearer x"] {
            assert!(Header::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn basic_encodes_user_and_secret() {
        let h = Header::parse("authorization: Basic bob").unwrap();
        let (name, val) = h.render(&v("pw"));
        assert_eq!(name, "authorization");
        assert_eq!(val.expose(), "Basic Ym9iOnB3"); // base64("bob:pw")
        assert_eq!(format!("{val:?}"), crate::secret::value::REDACTED);
    }
}

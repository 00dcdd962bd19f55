//! The shapes of the names the secret store accepts: services, sandboxes,
//! placeholders, environment variables, hosts.
//!
//! Store keys are built by joining names with dots (`ppp.<sandbox>.<service>`),
//! so no name may contain a dot, and the sandbox names that would make two
//! keys look alike are reserved. Errors quote the rejected name (names are
//! not secret) and carry a hint. This module never sees a secret value.

use anyhow::Result;

use crate::error::fail;

/// Sandbox names the store cannot tell apart from its own key layout:
/// - `custom`: `ppp.custom.<placeholder>` is a global custom secret, so a
///   sandbox called `custom` would read as one;
/// - `global`: the index writes the global scope as `"global"`;
/// - `registry`: `ppp.registry.<host>` is kept for registry credentials.
pub const RESERVED_SANDBOX_NAMES: &[&str] = &["custom", "global", "registry"];

/// Longest service, sandbox or placeholder name.
pub const MAX_NAME_LEN: usize = 64;

/// Shortest placeholder: it is searched for in every outbound header of the
/// listed hosts, so a short one would match where it was never written.
pub const MIN_PLACEHOLDER_LEN: usize = 8;

/// A service name: `[a-z0-9][a-z0-9_-]*`, at most 64 characters.
pub fn service(name: &str) -> Result<()> {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
    if name.is_empty()
        || name.len() > MAX_NAME_LEN
        || !name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        || !name.chars().all(ok)
    {
        if looks_like_secret(name) {
            // Someone typed the key where the service goes. Echoing it would
            // put it in the terminal scrollback and in CI logs.
            return Err(fail("the service name is not valid, and it looks like a secret value, so it is not shown")
                .hint("give the value at the prompt or with --password-stdin, never as an argument")
                .code(2)
                .into());
        }
        return Err(fail(format!("`{name}` is not a valid service name"))
            .hint(
                "use lower-case letters, digits, `-` and `_`, starting with a letter or digit, \
                 at most 64 characters",
            )
            .code(2)
            .into());
    }
    Ok(())
}

/// Whether an argument looks like an API key rather than a name: a known
/// key prefix, or a long token mixing letters and digits.
pub fn looks_like_secret(s: &str) -> bool {
    const PREFIXES: &[&str] = &["sk-", "ghp_", "gho_", "ghs_", "ghu_", "github_pat_", "glpat-", "xai-", "gsk_", "AIza"];
    if PREFIXES.iter().any(|p| s.starts_with(p)) {
        return true;
    }
    let letters = s.chars().filter(char::is_ascii_alphabetic).count();
    let digits = s.chars().filter(char::is_ascii_digit).count();
    s.len() >= 24 && letters >= 4 && digits >= 4
}

/// A sandbox name as a secret scope: ASCII letters, digits, `-` and `_`,
/// starting with a letter or digit, at most 64 characters, and not one of
/// [`RESERVED_SANDBOX_NAMES`].
pub fn sandbox(name: &str) -> Result<()> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty()
        || name.len() > MAX_NAME_LEN
        || !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.chars().all(ok)
    {
        return Err(fail(format!("`{name}` is not a valid sandbox name"))
            .hint("use letters, digits, `-` and `_`, starting with a letter or digit, at most 64 characters")
            .code(2)
            .into());
    }
    if RESERVED_SANDBOX_NAMES.contains(&name) {
        return Err(fail(format!("`{name}` is reserved and cannot name a sandbox"))
            .hint(format!("reserved names: {}", RESERVED_SANDBOX_NAMES.join(", ")))
            .code(2)
            .into());
    }
    Ok(())
}

/// A custom-secret placeholder: ASCII letters, digits, `-` and `_`, 8 to 64
/// characters.
pub fn placeholder(p: &str) -> Result<()> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !p.chars().all(ok) || p.is_empty() {
        return Err(fail(format!("`{p}` is not a valid placeholder"))
            .hint("use letters, digits, `-` and `_`, such as `PPP_JIRA_TOKEN`")
            .code(2)
            .into());
    }
    if !(MIN_PLACEHOLDER_LEN..=MAX_NAME_LEN).contains(&p.len()) {
        return Err(fail(format!("placeholder `{p}` must be {MIN_PLACEHOLDER_LEN} to {MAX_NAME_LEN} characters long"))
            .hint("the placeholder is replaced wherever it appears in a request header, so make it distinctive")
            .code(2)
            .into());
    }
    Ok(())
}

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn env_var(name: &str) -> Result<()> {
    if name.is_empty()
        || name.starts_with(|c: char| c.is_ascii_digit())
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(fail(format!("`{name}` is not a valid environment variable name"))
            .hint("use letters, digits and `_`, not starting with a digit")
            .code(2)
            .into());
    }
    Ok(())
}

/// A host a secret may be sent to, returned in canonical form (lower case,
/// no trailing dot). Exact names only: a wildcard would send the key to
/// every subdomain, including ones someone else controls.
pub fn host(h: &str) -> Result<String> {
    let canonical = crate::secret::services::canonical_host(h.trim()).into_owned();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if canonical.is_empty() || canonical.len() > 253 || !canonical.split('.').all(label_ok) {
        let hint = if h.contains("://") || h.contains('/') {
            "give the host name alone, such as `api.example.com`, not a URL"
        } else if h.contains('*') {
            "wildcards are not accepted: list each host the secret may be sent to"
        } else if h.contains(':') {
            "give the host name without a port"
        } else {
            "a host name is dot-separated labels of letters, digits and `-`"
        };
        return Err(fail(format!("`{h}` is not a valid host name")).hint(hint).code(2).into());
    }
    Ok(canonical)
}

/// An OCI registry as `ppp kit push/pull` and `ppp secret set --registry`
/// name it: a host name or IPv4 address, optionally with `:port`, returned
/// in canonical form (lower case, no trailing dot). This is also the store
/// key's last part, `ppp.registry.<host[:port]>`.
pub fn registry(r: &str) -> Result<String> {
    let bad = || {
        let hint = if r.contains("://") || r.contains('/') {
            "give the registry alone, such as `registry.example.com` or `localhost:5000`, not a URL or reference"
        } else {
            "a registry is a host name with an optional `:port`, such as `localhost:5000`"
        };
        anyhow::Error::from(fail(format!("`{r}` is not a valid registry")).hint(hint).code(2))
    };
    let (name, port) = match r.trim().rsplit_once(':') {
        Some((n, p)) => {
            if p.is_empty() || p.len() > 5 || !p.chars().all(|c| c.is_ascii_digit()) || p.parse::<u16>().is_err() {
                return Err(bad());
            }
            (n, Some(p))
        }
        None => (r.trim(), None),
    };
    let name = host(name).map_err(|_| bad())?;
    Ok(match port {
        Some(p) => format!("{name}:{p}"),
        None => name,
    })
}

/// [`host`] for each of `hosts`, dropping duplicates but keeping order.
pub fn hosts(hosts: &[String]) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::with_capacity(hosts.len());
    for h in hosts {
        let h = host(h)?;
        if !out.contains(&h) {
            out.push(h);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_host_and_optional_port() {
        assert_eq!(registry("Registry.Example.com.").unwrap(), "registry.example.com");
        assert_eq!(registry("localhost:5000").unwrap(), "localhost:5000");
        assert_eq!(registry("127.0.0.1:65535").unwrap(), "127.0.0.1:65535");
        for bad in ["", "https://ghcr.io", "ghcr.io/me", "host:", "host:99999", "host:5x", "*.example.com", "a b"] {
            assert!(registry(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn key_shaped_names_are_not_echoed() {
        for key in ["sk-ant-api03-AbCdEf_123", "ghp_ABCdef123", "A1b2c3d4e5f6g7h8i9j0k1l2m3"] {
            let msg = format!("{:#}", service(key).unwrap_err());
            assert!(!msg.contains(key), "{msg}");
            assert!(msg.contains("looks like a secret"), "{msg}");
        }
        assert!(looks_like_secret("a1b2c3d4e5f6g7h8i9j0k1l2m3"));
        assert!(!looks_like_secret("usai"));
        assert!(!looks_like_secret("my-service-name-is-long"));
    }

    #[test]
    fn service_names() {
        for ok in ["anthropic", "usai", "my-svc_2", "0x", &"a".repeat(64)] {
            service(ok).unwrap();
        }
        for bad in ["", "-a", "_a", "A", "a.b", "a b", "ä", &"a".repeat(65)] {
            assert!(service(bad).is_err(), "{bad}");
        }
        let (text, _) = crate::error::render(&service("a.b").unwrap_err());
        assert_eq!(text.lines().next().unwrap(), "error: `a.b` is not a valid service name",);
        assert!(text.contains("hint:"), "{text}");
    }

    #[test]
    fn sandbox_names() {
        for ok in ["ppp-red-fox", "opencode-my-app", "Box_1"] {
            sandbox(ok).unwrap();
        }
        for bad in ["", "a.b", "-x", "a/b", &"s".repeat(65)] {
            assert!(sandbox(bad).is_err(), "{bad}");
        }
        for reserved in RESERVED_SANDBOX_NAMES {
            let (text, _) = crate::error::render(&sandbox(reserved).unwrap_err());
            assert!(text.contains("reserved"), "{text}");
        }
    }

    #[test]
    fn placeholders_and_env_vars() {
        placeholder("PPP_JIRA_TOKEN").unwrap();
        placeholder("abcdefgh").unwrap();
        for bad in ["short", "", "has.dot_long", "with space x", &"P".repeat(65)] {
            assert!(placeholder(bad).is_err(), "{bad}");
        }
        env_var("JIRA_TOKEN").unwrap();
        env_var("_x1").unwrap();
        for bad in ["", "1X", "A-B", "A B"] {
            assert!(env_var(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_names() {
        assert_eq!(host("API.Example.com.").unwrap(), "api.example.com");
        assert_eq!(host("localhost").unwrap(), "localhost");
        assert_eq!(host("10.0.0.1").unwrap(), "10.0.0.1");
        for bad in [
            "",
            ".",
            "a..b",
            "-a.com",
            "a-.com",
            "https://api.x.ai",
            "api.x.ai/v1",
            "*.x.ai",
            "api.x.ai:443",
            "a_b.com",
            &format!("{}.com", "a".repeat(64)),
        ] {
            assert!(host(bad).is_err(), "{bad}");
        }
        let (text, _) = crate::error::render(&host("https://api.x.ai").unwrap_err());
        assert!(text.contains("not a URL"), "{text}");
        assert_eq!(hosts(&["A.com".into(), "b.com".into(), "a.com".into()]).unwrap(), ["a.com", "b.com"]);
    }
}

//! The LLM providers ppp meters, as data (`assets/usage/providers.yaml`,
//! embedded, plus `$PPP_CONFIG/usage/providers.yaml`, which adds providers
//! or replaces one by name): which responses report usage (exact hosts,
//! path globs) and where in them the usage fields are.
//!
//! The daemon alone matches a request against these ([`Providers::find`]);
//! the addon is handed the field paths of the one provider that matched and
//! only reads them (issue 27, ADR 0053). Pure but for reading the user's
//! file.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::dirs::Dirs;
use crate::policy::http;
use crate::state::{self, ParseError};

/// The embedded providers' file inside `assets/`.
pub const BUILTIN: &str = "usage/providers.yaml";

/// How a provider's error bodies look: what a budget's 429 imitates so an
/// agent's client reads it as the provider's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    Anthropic,
    Openai,
    Gemini,
}

/// Where a response puts each usage field: per field, alternatives in
/// order; each a dotted JSON path, or several joined by `+` to be summed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fields {
    #[serde(default)]
    pub model: Vec<String>,
    #[serde(default)]
    pub input: Vec<String>,
    #[serde(default)]
    pub output: Vec<String>,
    #[serde(default)]
    pub cache_read: Vec<String>,
    #[serde(default)]
    pub cache_write: Vec<String>,
}

impl Fields {
    fn all(&self) -> impl Iterator<Item = (&'static str, &String)> {
        self.model
            .iter()
            .map(|p| ("model", p))
            .chain(self.input.iter().map(|p| ("input", p)))
            .chain(self.output.iter().map(|p| ("output", p)))
            .chain(self.cache_read.iter().map(|p| ("cache_read", p)))
            .chain(self.cache_write.iter().map(|p| ("cache_write", p)))
    }
}

/// One provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    pub name: String,
    /// Exact host names, lower case.
    pub hosts: Vec<String>,
    /// Globs on the canonical request path ([`http::path_matches`]).
    pub paths: Vec<String>,
    pub dialect: Dialect,
    pub usage: Fields,
    /// The prompt count includes the cached tokens (`OpenAI`, Gemini): the
    /// record's `input` is then the prompt count less `cache_read`.
    #[serde(default)]
    pub input_includes_cache_read: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    providers: Vec<Provider>,
}

/// The providers in effect: the built-in ones, then the user's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Providers {
    list: Vec<Provider>,
}

impl Providers {
    /// The built-in providers merged with the user's file, if there is one.
    /// A malformed user file is an error naming its line and field.
    pub fn load(dirs: &Dirs) -> Result<Providers> {
        let mut p = Providers::builtin();
        let path = user_file(dirs);
        if let Some(text) = state::read_optional(&path)? {
            p.merge(parse(&path, &text).map_err(|e| {
                crate::error::hinted(
                    e,
                    format!("fix the file, or move it away to meter only the built-in providers ({})", path.display()),
                )
            })?);
        }
        Ok(p)
    }

    /// The providers shipped in the binary.
    ///
    /// # Panics
    /// Never in a build that passed its tests: the embedded file is checked
    /// by them.
    #[must_use]
    pub fn builtin() -> Providers {
        let bytes = crate::assets::get(BUILTIN).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let list = parse(Path::new(BUILTIN), &text).expect("the embedded providers.yaml parses");
        Providers { list }
    }

    /// Add `other`, each replacing a provider of the same name in place.
    pub fn merge(&mut self, other: Vec<Provider>) {
        for p in other {
            match self.list.iter_mut().find(|q| q.name == p.name) {
                Some(q) => *q = p,
                None => self.list.push(p),
            }
        }
    }

    /// Every provider, in order.
    #[must_use]
    pub fn all(&self) -> &[Provider] {
        &self.list
    }

    /// Whether some provider answers on `host`: its requests are then
    /// worth asking [`Providers::find`] about.
    #[must_use]
    pub fn has_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.list.iter().any(|p| p.hosts.contains(&host))
    }

    /// The provider whose responses to this request report usage: a POST
    /// (every usage-reporting endpoint is one) to one of its hosts, on a
    /// path (raw, as forwarded; canonicalised here, the query dropped) one
    /// of its globs matches. A path that cannot be canonicalised matches
    /// nothing. The first provider in file order wins.
    #[must_use]
    pub fn find(&self, host: &str, method: &str, raw_path: &str) -> Option<&Provider> {
        if !method.eq_ignore_ascii_case("POST") {
            return None;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let path = http::canonical_path(raw_path).ok()?;
        self.list.iter().find(|p| p.hosts.contains(&host) && p.paths.iter().any(|g| http::path_matches(g, &path)))
    }
}

/// `$PPP_CONFIG/usage/providers.yaml`.
#[must_use]
pub fn user_file(dirs: &Dirs) -> PathBuf {
    dirs.usage_providers()
}

/// A providers file's text; `path` only names it in errors. Each semantic
/// error names the line of the offending value (serde has no location
/// once a value is whole).
pub fn parse(path: &Path, text: &str) -> Result<Vec<Provider>, ParseError> {
    let file: File = state::parse_yaml(path, text)?;
    let err = |needle: &str, after: usize, message: String| {
        let line = line_of(text, needle, after);
        ParseError { path: path.to_owned(), line, column: 1, message }
    };
    let mut seen = std::collections::HashSet::new();
    for p in &file.providers {
        let at = line_of(text, &p.name, 1);
        let name_ok = !p.name.is_empty()
            && p.name.len() <= 64
            && p.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(err(
                &p.name,
                1,
                format!("field `name`: `{}` is not a provider name (lower-case letters, digits, `-`, `_`)", p.name),
            ));
        }
        if !seen.insert(p.name.as_str()) {
            return Err(err(&p.name, at + 1, format!("field `name`: provider `{}` is defined twice", p.name)));
        }
        if p.hosts.is_empty() {
            return Err(err("hosts", at, format!("provider `{}`, field `hosts`: names no host", p.name)));
        }
        for h in &p.hosts {
            let ok = crate::policy::is_name(h) && !h.contains('*') && *h == h.to_ascii_lowercase();
            if !ok {
                return Err(err(
                    h,
                    at,
                    format!("provider `{}`, field `hosts`: `{h}` is not an exact lower-case host name", p.name),
                ));
            }
        }
        if p.paths.is_empty() {
            return Err(err("paths", at, format!("provider `{}`, field `paths`: names no path", p.name)));
        }
        for g in &p.paths {
            if let Err(why) = http::check_rule_path(g) {
                return Err(err(g, at, format!("provider `{}`, field `paths`: `{g}`: {why}", p.name)));
            }
        }
        if p.usage.input.is_empty() && p.usage.output.is_empty() {
            return Err(err(
                "usage",
                at,
                format!("provider `{}`, field `usage`: names neither `input` nor `output`", p.name),
            ));
        }
        for (field, alt) in p.usage.all() {
            let ok = !alt.is_empty()
                && alt.len() <= 256
                && alt.split('+').all(|path| !path.is_empty() && path.split('.').all(|seg| !seg.is_empty()))
                && (field != "model" || !alt.contains('+'));
            if !ok {
                return Err(err(
                    alt,
                    at,
                    format!(
                        "provider `{}`, field `usage.{field}`: `{alt}` is not a dotted JSON path (`a.b.c`, or paths joined by `+` to sum)",
                        p.name
                    ),
                ));
            }
        }
    }
    Ok(file.providers)
}

/// The 1-based line where `needle` first appears at or after line `after`;
/// `after` itself when it does not.
fn line_of(text: &str, needle: &str, after: usize) -> usize {
    text.lines()
        .enumerate()
        .skip(after.saturating_sub(1))
        .find(|(_, l)| !needle.is_empty() && l.contains(needle))
        .map_or(after.max(1), |(i, _)| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(text: &str) -> String {
        parse(Path::new("p.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn the_builtin_providers_parse_and_match() {
        let p = Providers::builtin();
        let names: Vec<&str> = p.all().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["anthropic", "openai", "gemini"]);
        let find = |h: &str, m: &str, path: &str| p.find(h, m, path).map(|p| p.name.as_str());
        assert_eq!(find("api.anthropic.com", "POST", "/v1/messages"), Some("anthropic"));
        assert_eq!(find("API.Anthropic.com.", "post", "/v1/messages?beta=true"), Some("anthropic"));
        assert_eq!(find("api.anthropic.com", "GET", "/v1/messages"), None);
        assert_eq!(find("api.anthropic.com", "POST", "/v1/messages/count_tokens"), None);
        assert_eq!(find("api.anthropic.com", "POST", "/v1/%6Dessages"), Some("anthropic"), "canonicalised");
        assert_eq!(find("api.anthropic.com", "POST", "/v1//messages"), None, "refused paths match nothing");
        assert_eq!(find("evil.example", "POST", "/v1/messages"), None);
        assert_eq!(find("api.openai.com", "POST", "/v1/chat/completions"), Some("openai"));
        assert_eq!(find("api.openai.com", "POST", "/v1/responses"), Some("openai"));
        assert_eq!(
            find(
                "generativelanguage.googleapis.com",
                "POST",
                "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
            ),
            Some("gemini")
        );
        assert_eq!(find("generativelanguage.googleapis.com", "POST", "/v1beta/models/x:countTokens"), None);
    }

    #[test]
    fn a_user_provider_adds_or_replaces_by_name() {
        let mut p = Providers::builtin();
        let user = parse(
            Path::new("u.yaml"),
            "providers:\n  - name: gateway\n    hosts: [llm.corp.example]\n    paths: [/openai/v1/chat/completions]\n    dialect: openai\n    usage:\n      input: [usage.prompt_tokens]\n      output: [usage.completion_tokens]\n  - name: anthropic\n    hosts: [claude.corp.example]\n    paths: [/v1/messages]\n    dialect: anthropic\n    usage:\n      output: [usage.output_tokens]\n",
        )
        .unwrap();
        p.merge(user);
        assert_eq!(p.all().len(), 4);
        assert_eq!(p.find("llm.corp.example", "POST", "/openai/v1/chat/completions").unwrap().name, "gateway");
        assert!(p.find("api.anthropic.com", "POST", "/v1/messages").is_none(), "replaced whole");
        assert_eq!(p.find("claude.corp.example", "POST", "/v1/messages").unwrap().name, "anthropic");
    }

    #[test]
    fn the_user_file_is_loaded_and_a_bad_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = Dirs { config: dir.path().join("c"), data: dir.path().join("d"), cache: dir.path().join("k") };
        assert_eq!(Providers::load(&dirs).unwrap(), Providers::builtin(), "no file: the built-in ones");
        std::fs::create_dir_all(dirs.usage_providers().parent().unwrap()).unwrap();
        std::fs::write(
            dirs.usage_providers(),
            "providers:\n  - name: gw\n    hosts: [gw.example]\n    paths: [/v1/chat/completions]\n    dialect: openai\n    usage:\n      input: [usage.prompt_tokens]\n",
        )
        .unwrap();
        assert_eq!(
            Providers::load(&dirs).unwrap().find("gw.example", "POST", "/v1/chat/completions").unwrap().name,
            "gw"
        );
        std::fs::write(dirs.usage_providers(), "providers:\n  - name: gw\n    hosts: gw.example\n").unwrap();
        let e = format!("{:#}", Providers::load(&dirs).unwrap_err());
        assert!(e.contains("providers.yaml` line 3") && e.contains("hosts"), "{e}");
    }

    #[test]
    fn bad_files_name_the_line_and_field() {
        let head = "providers:\n  - name: x\n    hosts: [a.example]\n";
        let e = bad(&format!("{head}    paths: [v1/messages]\n    dialect: openai\n    usage:\n      input: [a]\n"));
        assert!(e.starts_with("`p.yaml` line 4") && e.contains("field `paths`") && e.contains("v1/messages"), "{e}");
        let e = bad(&format!("{head}    paths: [/v1]\n    dialect: cohere\n    usage:\n      input: [a]\n"));
        assert!(e.starts_with("`p.yaml` line 5") && e.contains("dialect"), "{e}");
        let e = bad(&format!("{head}    paths: [/v1]\n    dialect: openai\n    usage:\n      input: [a..b]\n"));
        assert!(e.starts_with("`p.yaml` line 7") && e.contains("usage.input"), "{e}");
        let e = bad(&format!("{head}    paths: [/v1]\n    dialect: openai\n    usage:\n      inputs: [a]\n"));
        assert!(e.contains("line 7") && e.contains("inputs"), "{e}");
        let e = bad(
            "providers:\n  - name: x\n    hosts: ['*.example']\n    paths: [/v1]\n    dialect: openai\n    usage:\n      input: [a]\n",
        );
        assert!(e.starts_with("`p.yaml` line 3") && e.contains("field `hosts`"), "{e}");
        let e = bad(
            "providers:\n  - name: x\n    hosts: [a.example]\n    paths: [/v1]\n    dialect: openai\n    usage:\n      model: [m]\n",
        );
        assert!(e.contains("names neither"), "{e}");
        let e = bad(
            "providers:\n  - name: Bad Name\n    hosts: [a.example]\n    paths: [/v1]\n    dialect: openai\n    usage:\n      input: [a]\n",
        );
        assert!(e.starts_with("`p.yaml` line 2") && e.contains("field `name`"), "{e}");
    }
}

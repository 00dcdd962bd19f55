//! The two policy files: `$PPP_CONFIG/policies.yaml` (global default, preset
//! and rules) and `$PPP_DATA/sandboxes/<name>/policy.yaml` (that sandbox's
//! rules). Reading never modifies a file; writing is atomic through
//! [`crate::state`], and the caller holds `state.lock`.
//!
//! Every field is validated while parsing, so a bad resource or timestamp is
//! a parse error naming the file, line and column, not a later surprise.

use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::limits::Size;
use super::{Limits, Preset, Rule, Verdict};
use crate::state::{self, ParseError};

/// `$PPP_CONFIG/policies.yaml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalFile {
    /// What happens when no rule matches.
    pub default: Verdict,
    /// The preset the file was initialised from, for `ppp policy ls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// Body-size limits for every sandbox, unless its file or the allow
    /// rule sets its own ([`super::limits`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<Size>,
    /// How long, in seconds, a request held by an `ask` default waits for
    /// an answer before it is denied; [`super::APPROVAL_TIMEOUT`] when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout: Option<u32>,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// `$PPP_DATA/sandboxes/<name>/policy.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxFile {
    /// This sandbox's default, over the global file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Verdict>,
    /// This sandbox's body-size limits, over the global file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<Size>,
    /// Learning (ADR 0048): what no rule decides is allowed and logged as
    /// `learned` instead of going to the default. Deny rules, internal
    /// addresses and the rebinding defences still refuse.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub learn: bool,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

impl SandboxFile {
    /// The limits this file sets.
    #[must_use]
    pub fn limits(&self) -> Limits {
        Limits { upload: self.upload, download: self.download }
    }
}

impl GlobalFile {
    /// A fresh file for `preset`: its default and its rules.
    #[must_use]
    pub fn from_preset(preset: Preset) -> GlobalFile {
        GlobalFile {
            default: preset.default_verdict(),
            preset: Some(preset),
            upload: None,
            download: None,
            approval_timeout: None,
            rules: preset.rules(),
        }
    }

    /// What stands in for a missing file: the fail-closed default, nothing
    /// else (ADR 0005).
    #[must_use]
    pub fn without_file() -> GlobalFile {
        GlobalFile {
            default: super::DEFAULT_WITHOUT_FILE,
            preset: None,
            upload: None,
            download: None,
            approval_timeout: None,
            rules: Vec::new(),
        }
    }

    /// The limits this file sets.
    #[must_use]
    pub fn limits(&self) -> Limits {
        Limits { upload: self.upload, download: self.download }
    }
}

/// Parse the global file's text; `path` is only used in messages. This is the
/// code path [`load_global`] uses, exposed for the fuzz target.
pub fn parse_global(path: &Path, text: &str) -> Result<GlobalFile, ParseError> {
    let f: GlobalFile = match fast::global(text) {
        Some(f) => f,
        None => state::parse_yaml(path, text)?,
    };
    check_rules(path, text, &f.rules)?;
    inspect_only_on_allow(path, text, &f.rules)?;
    Ok(f)
}

/// Parse a sandbox file's text. An empty file (or one with only comments)
/// means no rules: truncating the file is a natural way to clear it.
pub fn parse_sandbox(path: &Path, text: &str) -> Result<SandboxFile, ParseError> {
    if is_blank_yaml(text) {
        return Ok(SandboxFile::default());
    }
    let f: SandboxFile = match fast::sandbox(text) {
        Some(f) => f,
        None => state::parse_yaml(path, text)?,
    };
    check_rules(path, text, &f.rules)?;
    inspect_only_on_allow(path, text, &f.rules)?;
    Ok(f)
}

/// The checks across a rule's fields ([`Rule::check`]), as a parse error
/// at the line of the rule's `id` (serde has no location once a rule is
/// whole).
fn check_rules(path: &Path, text: &str, rules: &[Rule]) -> Result<(), ParseError> {
    for r in rules {
        if let Err(message) = r.check() {
            let id = r.id.to_string();
            let line = text.lines().position(|l| l.contains(&id)).map_or(1, |i| i + 1);
            return Err(ParseError {
                path: path.to_owned(),
                line,
                column: 1,
                message: format!("rule `{id}`: {message}"),
            });
        }
    }
    Ok(())
}

/// `inspect: false` says how an allowed connection is carried; on a deny
/// rule it would mean nothing, and a reader could take it for a promise
/// (ADR 0051). A check after parsing, because it joins two fields: the
/// line is found from the rule's id, which both readers require.
fn inspect_only_on_allow(path: &Path, text: &str, rules: &[Rule]) -> Result<(), ParseError> {
    let Some(rule) = rules.iter().find(|r| !r.inspect && r.decision != Verdict::Allow) else {
        return Ok(());
    };
    let id = rule.id.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let at_id = lines.iter().position(|l| l.to_ascii_lowercase().contains(&id));
    // The rule's `inspect:` line: the first after its id, before the next
    // item starts (a line whose first non-space character is `-`).
    let field = at_id.and_then(|start| {
        lines[start..]
            .iter()
            .enumerate()
            .skip(1)
            .take_while(|(_, l)| !l.trim_start().starts_with('-'))
            .find(|(_, l)| l.trim_start().starts_with("inspect"))
            .map(|(i, _)| start + i)
            .or_else(|| {
                // `inspect` came before `id` in the item.
                lines[..start].iter().rposition(|l| l.trim_start().trim_start_matches("- ").starts_with("inspect"))
            })
    });
    let line = field.or(at_id).map_or(1, |i| i + 1);
    let column = lines.get(line - 1).map_or(1, |l| l.len() - l.trim_start().trim_start_matches("- ").len() + 1);
    Err(ParseError {
        path: path.to_owned(),
        line,
        column,
        message: format!(
            "field `inspect` of rule `{id}`: only an allow rule may say `inspect: false` \
             (it says how an allowed TLS connection is carried)"
        ),
    })
}

/// Parse with `serde_norway` only, bypassing the fast path. For the fuzz
/// target and tests, which check that both paths agree.
#[doc(hidden)]
pub fn parse_global_slow(path: &Path, text: &str) -> Result<GlobalFile, ParseError> {
    let f: GlobalFile = state::parse_yaml(path, text)?;
    check_rules(path, text, &f.rules)?;
    inspect_only_on_allow(path, text, &f.rules)?;
    Ok(f)
}

/// A reader for exactly the layout `serde_norway` writes (and the spec's
/// example layout), so the common case skips the YAML parser.
///
/// Why: `ppp policy check` must answer within 50 ms on a 10,000-rule file,
/// and `serde_norway` alone spends about 30 ms building YAML events for it
/// (docs/policy.md has the measurements). This is not a second format: it
/// accepts a strict subset of YAML and gives up, returning `None`, on
/// anything else (comments, flow style, anchors, tags, tabs, CR, unusual
/// quoting or indentation, unknown or repeated keys, any invalid value).
/// The caller then parses with `serde_norway`, which also produces every
/// error message, so errors keep their line numbers. The `policy_yaml` fuzz
/// target and a property test check both paths agree whenever this one
/// answers.
mod fast {
    use std::str::FromStr;

    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;

    use super::{GlobalFile, SandboxFile};
    use crate::policy::limits::Size;
    use crate::policy::{Preset, Resource, Rule, RuleType, Source, Verdict};

    pub(super) fn global(text: &str) -> Option<GlobalFile> {
        let mut lines = Lines::new(text)?;
        let (mut default, mut preset, mut rules) = (None, None, None);
        let (mut upload, mut download, mut timeout) = (None, None, None);
        while let Some(line) = lines.next_line() {
            let (key, value) = top_level(line)?;
            match key {
                "default" if default.is_none() => default = Some(default_verdict(value?)?),
                "approval_timeout" if timeout.is_none() => timeout = Some(plain(value?)?.parse::<u32>().ok()?),
                "preset" if preset.is_none() => preset = Some(preset_of(value?)?),
                "upload" if upload.is_none() => upload = Some(size(value?)?),
                "download" if download.is_none() => download = Some(size(value?)?),
                "rules" if rules.is_none() => rules = Some(rule_list(value, &mut lines)?),
                _ => return None,
            }
        }
        Some(GlobalFile {
            default: default?,
            preset,
            upload,
            download,
            approval_timeout: timeout,
            rules: rules.unwrap_or_default(),
        })
    }

    pub(super) fn sandbox(text: &str) -> Option<SandboxFile> {
        let mut lines = Lines::new(text)?;
        let (mut upload, mut download, mut rules, mut default) = (None, None, None, None);
        let mut learn = None;
        while let Some(line) = lines.next_line() {
            let (key, value) = top_level(line)?;
            match key {
                "default" if default.is_none() => default = Some(default_verdict(value?)?),
                // Only the spelling ppp writes; `yes`, `True` go to serde.
                "learn" if learn.is_none() => learn = Some(matches!(plain(value?)?, "true").then_some(true)?),
                "upload" if upload.is_none() => upload = Some(size(value?)?),
                "download" if download.is_none() => download = Some(size(value?)?),
                "rules" if rules.is_none() => rules = Some(rule_list(value, &mut lines)?),
                _ => return None,
            }
        }
        Some(SandboxFile { default, upload, download, learn: learn.unwrap_or(false), rules: rules? })
    }

    /// A limit as `Size` writes it (`64MiB`, `none`); other spellings
    /// (numbers, quoted text) go to `serde_norway`.
    fn size(v: &str) -> Option<Size> {
        let text = plain(v)?;
        let parsed: Size = text.parse().ok()?;
        (parsed.to_string() == text).then_some(parsed)
    }

    /// The file's lines, without blank and comment-only lines (which YAML
    /// ignores in every construct this reader accepts).
    struct Lines<'a> {
        lines: Vec<&'a str>,
        next: usize,
    }

    impl<'a> Lines<'a> {
        fn new(text: &'a str) -> Option<Self> {
            // Only the plainest text: printable ASCII lines (YAML rejects
            // most control characters), one final newline.
            let body = text.strip_suffix('\n')?;
            if !body.bytes().all(|b| b == b'\n' || (0x20..0x7f).contains(&b)) {
                return None;
            }
            let lines: Vec<&str> = body
                .split('\n')
                .filter(|l| {
                    let t = l.trim_start_matches(' ');
                    !t.is_empty() && !t.starts_with('#')
                })
                .collect();
            (!lines.is_empty()).then_some(Lines { lines, next: 0 })
        }

        fn next_line(&mut self) -> Option<&'a str> {
            let l = self.peek()?;
            self.next += 1;
            Some(l)
        }

        fn peek(&self) -> Option<&'a str> {
            self.lines.get(self.next).copied()
        }
    }

    /// `key: value` or `key:` at column 0. The value is `None` when empty.
    fn top_level(line: &str) -> Option<(&str, Option<&str>)> {
        key_value(line)
    }

    /// `key: value`, `key:` or `key: value # comment`; the value is `None`
    /// when empty, and loses a trailing comment and spaces.
    fn key_value(line: &str) -> Option<(&str, Option<&str>)> {
        let (key, value) = match line.split_once(": ") {
            Some((k, v)) => (k, Some(value_text(v)?).filter(|v| !v.is_empty())),
            None => (line.strip_suffix(':')?, None),
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return None;
        }
        Some((key, value))
    }

    /// The value part of `v`, and what follows it must be nothing but spaces
    /// and an optional ` #` comment. Empty for an empty value.
    fn value_text(v: &str) -> Option<&str> {
        let v = v.trim_start_matches(' ');
        let end = match v.as_bytes().first() {
            None | Some(b'#') => return Some(""),
            Some(b'\'') => {
                // The closing quote is the first one not doubled.
                let b = v.as_bytes();
                let mut i = 1;
                loop {
                    match b.get(i)? {
                        b'\'' if b.get(i + 1) == Some(&b'\'') => i += 2,
                        b'\'' => break i + 1,
                        _ => i += 1,
                    }
                }
            }
            Some(b'"') => v[1..].find('"')? + 2,
            Some(_) => v.find(" #").unwrap_or(v.len()),
        };
        let (value, rest) = v.split_at(end);
        let comment = rest.trim_start_matches(' ');
        if !(comment.is_empty() || (comment.starts_with('#') && rest.starts_with(' '))) {
            return None;
        }
        Some(value.trim_end_matches(' '))
    }

    /// After `rules:`: `[]` inline, or block items at indent 0 or 2.
    fn rule_list(value: Option<&str>, lines: &mut Lines<'_>) -> Option<Vec<Rule>> {
        match value {
            Some("[]") => return Some(Vec::new()),
            Some(_) => return None,
            None => {}
        }
        let first = lines.peek()?;
        let indent = if first.starts_with("- ") {
            ""
        } else if first.starts_with("  - ") {
            "  "
        } else {
            return None;
        };
        let item = format!("{indent}- ");
        let field = format!("{indent}  ");
        let mut rules = Vec::new();
        while let Some(line) = lines.peek() {
            let Some(first_field) = line.strip_prefix(item.as_str()) else { break };
            lines.next_line();
            let mut fields = Fields::default();
            fields.set(first_field)?;
            while let Some(more) = lines.peek().and_then(|l| l.strip_prefix(field.as_str())) {
                lines.next_line();
                fields.set(more)?;
            }
            rules.push(fields.finish()?);
        }
        (!rules.is_empty()).then_some(rules)
    }

    #[derive(Default)]
    struct Fields<'a> {
        id: Option<&'a str>,
        decision: Option<&'a str>,
        kind: Option<&'a str>,
        resource: Option<&'a str>,
        created_at: Option<&'a str>,
        source: Option<&'a str>,
        kit: Option<&'a str>,
        upload: Option<&'a str>,
        download: Option<&'a str>,
        inspect: Option<&'a str>,
    }

    impl<'a> Fields<'a> {
        fn set(&mut self, line: &'a str) -> Option<()> {
            let (key, value) = key_value(line)?;
            let slot = match key {
                "id" => &mut self.id,
                "decision" => &mut self.decision,
                "type" => &mut self.kind,
                "resource" => &mut self.resource,
                "created_at" => &mut self.created_at,
                "source" => &mut self.source,
                "kit" => &mut self.kit,
                "upload" => &mut self.upload,
                "download" => &mut self.download,
                "inspect" => &mut self.inspect,
                _ => return None,
            };
            if slot.is_some() {
                return None;
            }
            *slot = Some(value?);
            Some(())
        }

        fn finish(self) -> Option<Rule> {
            let ("network", None) = scalar(self.kind?)? else { return None };
            let (resource, owned) = scalar(self.resource?)?;
            let resource = Resource::parse(owned.as_deref().unwrap_or(resource)).ok()?;
            Some(Rule {
                id: uuid::Uuid::from_str(plain(self.id?)?).ok()?,
                decision: verdict(self.decision?)?,
                kind: RuleType::Network,
                resource,
                created_at: OffsetDateTime::parse(plain(self.created_at?)?, &Rfc3339).ok()?,
                source: match plain(self.source?)? {
                    "local" => Source::Local,
                    "kit" => Source::Kit,
                    "preset" => Source::Preset,
                    "approval" => Source::Approval,
                    _ => return None,
                },
                kit: match self.kit {
                    Some(k) => Some(plain(k)?.to_owned()),
                    None => None,
                },
                upload: match self.upload {
                    Some(v) => Some(size(v)?),
                    None => None,
                },
                download: match self.download {
                    Some(v) => Some(size(v)?),
                    None => None,
                },
                // HTTP rules (`type: http`) go to serde_norway.
                methods: None,
                path: None,
                // Only the spellings ppp writes; `no`, `False` go to serde.
                inspect: match self.inspect.map(plain) {
                    None | Some(Some("true")) => true,
                    Some(Some("false")) => false,
                    Some(_) => return None,
                },
            })
        }
    }

    /// A rule's decision: never `ask`, which only a default may be (the
    /// slow path then says so, with the line).
    fn verdict(v: &str) -> Option<Verdict> {
        match plain(v)? {
            "allow" => Some(Verdict::Allow),
            "deny" => Some(Verdict::Deny),
            _ => None,
        }
    }

    fn default_verdict(v: &str) -> Option<Verdict> {
        match plain(v)? {
            "ask" => Some(Verdict::Ask),
            _ => verdict(v),
        }
    }

    fn preset_of(v: &str) -> Option<Preset> {
        match plain(v)? {
            "allow-all" => Some(Preset::AllowAll),
            "balanced" => Some(Preset::Balanced),
            "deny-all" => Some(Preset::DenyAll),
            _ => None,
        }
    }

    /// A value that must be a plain (unquoted) scalar.
    fn plain(v: &str) -> Option<&str> {
        match scalar(v)? {
            (s, None) if !v.starts_with(['\'', '"']) => Some(s),
            _ => None,
        }
    }

    /// A scalar's text: plain, single-quoted, or double-quoted without
    /// escapes. Returns an owned string only when `''` had to be unescaped.
    fn scalar(v: &str) -> Option<(&str, Option<String>)> {
        if let Some(inner) = v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
            if inner.is_empty() {
                return None;
            }
            // Every quote inside must be a doubled one.
            if inner.replace("''", "").contains('\'') {
                return None;
            }
            return Some(if inner.contains("''") { (inner, Some(inner.replace("''", "'"))) } else { (inner, None) });
        }
        if let Some(inner) = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
            return (!inner.is_empty() && !inner.contains(['"', '\\'])).then_some((inner, None));
        }
        // Plain: nothing YAML could read as structure, a comment, an alias,
        // a tag or a block scalar. Comments and trailing spaces are gone.
        let first = v.bytes().next()?;
        let indicator = b"-?:,[]{}#&*!|>'\"%@` ".contains(&first);
        let ok = !indicator && !v.ends_with([' ', ':']) && !v.contains(" #") && !v.contains(": ");
        ok.then_some((v, None))
    }
}

fn is_blank_yaml(text: &str) -> bool {
    text.lines().map(str::trim).all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}

/// Read the global policy; `None` when the file does not exist.
pub fn load_global(path: &Path) -> Result<Option<GlobalFile>> {
    match state::read_optional(path)? {
        Some(text) => Ok(Some(parse_global(path, &text).map_err(|e| {
            crate::error::hinted(
                e,
                "fix that line (docs/policy.md shows the format), or move the file away and run `ppp policy init balanced`",
            )
        })?)),
        None => Ok(None),
    }
}

/// Read a sandbox's policy; `None` when the file does not exist.
pub fn load_sandbox(path: &Path) -> Result<Option<SandboxFile>> {
    match state::read_optional(path)? {
        Some(text) => Ok(Some(parse_sandbox(path, &text)?)),
        None => Ok(None),
    }
}

/// Write the global policy atomically. The caller holds `state.lock`.
pub fn save_global(path: &Path, f: &GlobalFile) -> Result<()> {
    state::write_yaml(path, f)
}

/// Write a sandbox's policy atomically. The caller holds `state.lock`.
pub fn save_sandbox(path: &Path, f: &SandboxFile) -> Result<()> {
    state::write_yaml(path, f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Resource, Source};

    const GOOD: &str = "\
default: deny
preset: balanced
rules:
  - id: 7c9e6679-7425-40de-944b-e07fc1f90ae7
    decision: allow
    type: network
    resource: API.Anthropic.com.
    created_at: 2025-06-01T12:00:00Z
    source: preset
  - id: 16fd2706-8baf-433b-82eb-8c7fada847da
    decision: deny
    type: network
    resource: \"[2001:db8::/32]:443\"
    created_at: 2025-06-01T12:00:00+02:00
    source: local
";

    #[test]
    fn missing_files_are_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_global(&dir.path().join("policies.yaml")).unwrap(), None);
        assert_eq!(load_sandbox(&dir.path().join("policy.yaml")).unwrap(), None);
    }

    #[test]
    fn parses_a_full_file() {
        let f = parse_global(Path::new("p.yaml"), GOOD).unwrap();
        assert_eq!(f.default, Verdict::Deny);
        assert_eq!(f.preset, Some(Preset::Balanced));
        assert_eq!(f.rules.len(), 2);
        assert_eq!(f.rules[0].resource.to_string(), "api.anthropic.com");
        assert_eq!(f.rules[1].decision, Verdict::Deny);
        assert_eq!(f.rules[1].created_at.offset().whole_hours(), 2);
    }

    #[test]
    fn round_trips_through_disk_without_touching_on_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cfg/policies.yaml");
        let mut f = GlobalFile::from_preset(Preset::Balanced);
        f.rules.push(Rule::new(Verdict::Deny, Resource::parse("[2001:db8::1]:443").unwrap(), Source::Local));
        save_global(&path, &f).unwrap();
        let before = std::fs::read(&path).unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(load_global(&path).unwrap().unwrap(), f);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);

        let spath = dir.path().join("data/sandboxes/s/policy.yaml");
        let s = SandboxFile { rules: f.rules[..2].to_vec(), ..SandboxFile::default() };
        save_sandbox(&spath, &s).unwrap();
        assert_eq!(load_sandbox(&spath).unwrap().unwrap(), s);
    }

    /// `default: allow` and nothing else.
    fn bare_allow() -> GlobalFile {
        GlobalFile {
            default: Verdict::Allow,
            preset: None,
            upload: None,
            download: None,
            approval_timeout: None,
            rules: vec![],
        }
    }

    #[test]
    fn preset_is_omitted_when_absent() {
        let f = bare_allow();
        let text = serde_norway::to_string(&f).unwrap();
        assert!(!text.contains("preset"), "{text}");
        assert_eq!(parse_global(Path::new("p"), "default: allow\n").unwrap(), f);
    }

    #[test]
    fn empty_sandbox_file_has_no_rules() {
        for text in ["", "\n", "# cleared\n", "---\n"] {
            assert_eq!(parse_sandbox(Path::new("p"), text).unwrap(), SandboxFile::default(), "{text:?}");
        }
        assert_eq!(parse_sandbox(Path::new("p"), "rules: []\n").unwrap(), SandboxFile::default());
    }

    /// Both readers, and whether the fast one answered.
    fn both(text: &str) -> (Option<GlobalFile>, Option<GlobalFile>) {
        (fast::global(text), parse_global_slow(Path::new("p"), text).ok())
    }

    #[test]
    fn fast_reader_agrees_on_written_files() {
        let mut f = GlobalFile::from_preset(Preset::Balanced);
        for r in [
            "*.x.com",
            "**",
            "**:443",
            "[2001:db8::1]:443",
            r"^a\d+$",
            "(a|b).c",
            "10.0.0.0/8:22",
            "2001:db8::/32",
            "a?b.com",
            "_x.com",
        ] {
            f.rules.push(Rule::new(Verdict::Deny, Resource::parse(r).unwrap(), Source::Kit));
        }
        let text = serde_norway::to_string(&f).unwrap();
        assert_eq!(both(&text), (Some(f.clone()), Some(f.clone())));
        let empty = bare_allow();
        let text = serde_norway::to_string(&empty).unwrap();
        assert_eq!(both(&text), (Some(empty.clone()), Some(empty)));
        // The spec's layout, items indented under `rules:`.
        let (fast, slow) = both(GOOD);
        assert!(fast.is_some());
        assert_eq!(fast, slow);
        let s = SandboxFile { rules: f.rules, ..SandboxFile::default() };
        let text = serde_norway::to_string(&s).unwrap();
        assert_eq!(fast::sandbox(&text), Some(s));
    }

    #[test]
    fn limits_round_trip_through_both_readers() {
        use crate::policy::limits::Size;
        let mut f = GlobalFile::from_preset(Preset::Balanced);
        f.upload = Some(Size::Bytes(8 << 20));
        f.download = Some(Size::Unlimited);
        f.rules[0].upload = Some(Size::Bytes(64 << 20));
        f.rules[1].download = Some(Size::Bytes(1536 << 10));
        let text = serde_norway::to_string(&f).unwrap();
        assert!(text.contains("upload: 8MiB\n") && text.contains("download: none\n"), "{text}");
        assert_eq!(both(&text), (Some(f.clone()), Some(f.clone())));
        let s =
            SandboxFile { default: None, upload: Some(Size::Unlimited), download: None, learn: false, rules: f.rules };
        let text = serde_norway::to_string(&s).unwrap();
        assert_eq!(fast::sandbox(&text), Some(s.clone()));
        assert_eq!(parse_sandbox(Path::new("p"), &text).unwrap(), s);
        // Other spellings are serde's, and still mean the same.
        let g = parse_global(Path::new("p"), "default: deny\nupload: 1048576\ndownload: 2g\n").unwrap();
        assert_eq!((g.upload, g.download), (Some(Size::Bytes(1 << 20)), Some(Size::Bytes(2 << 30))));
        // A bad size names the file, line and field.
        let e = parse_global(Path::new("p"), "default: deny\nupload: lots\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("upload") && e.contains("`lots` is not a size"), "{e}");
    }

    #[test]
    fn inspect_false_round_trips_through_both_readers_and_only_on_allow() {
        let mut f = GlobalFile::from_preset(Preset::Balanced);
        f.rules[0].inspect = false;
        let text = serde_norway::to_string(&f).unwrap();
        assert_eq!(text.matches("inspect: false\n").count(), 1, "written only when off: {text}");
        assert_eq!(both(&text), (Some(f.clone()), Some(f.clone())));
        // `no` is YAML 1.1's false for some readers: serde's to refuse.
        assert_eq!(fast::global(&text.replace("inspect: false", "inspect: no")), None);
        // On a deny rule: refused by both paths, at the field's line.
        let mut f = GlobalFile::without_file();
        f.rules.push(Rule {
            inspect: false,
            ..Rule::new(Verdict::Deny, Resource::parse("x.test").unwrap(), Source::Local)
        });
        let text = serde_norway::to_string(&f).unwrap();
        let line = text.lines().position(|l| l.contains("inspect:")).unwrap() + 1;
        for text in [text.clone(), format!("{text}# a comment\n"), text.replace("source: local", "source: 'local'")] {
            let e = parse_global(Path::new("p"), &text).unwrap_err();
            assert_eq!(e.line, line, "{e}");
            assert!(e.message.starts_with("field `inspect` of rule `"), "{e}");
        }
        let s = SandboxFile { rules: f.rules, ..SandboxFile::default() };
        let e = parse_sandbox(Path::new("s"), &serde_norway::to_string(&s).unwrap()).unwrap_err();
        assert!(e.message.contains("only an allow rule may say `inspect: false`"), "{e}");
    }

    #[test]
    fn fast_reader_gives_up_on_anything_unusual() {
        let base = "default: deny\nrules:\n- id: 16fd2706-8baf-433b-82eb-8c7fada847da\n  decision: deny\n  type: network\n  resource: R\n  created_at: 2025-06-01T12:00:00Z\n  source: local\n";
        assert!(fast::global(&base.replace('R', "x.com")).is_some());
        let unusual = [
            base.replace('R', "*.x.com"),
            base.replace('R', "&a x.com"),
            base.replace('R', "!!str x.com"),
            base.replace('R', "'x.com"),
            base.replace('R', "\"x\\x2ecom\""),
            base.replace('R', "|"),
            base.replace('R', "'x.com'x"),
            base.replace('R', "a..b"),
            base.replace('R', "bücher.de"),
            base.replace("deny\nrules", "~\nrules"),
            base.replace("default: deny", "default: deny\npreset: ~"),
            base.replace("default: deny", "default: deny\ndefault: deny"),
            base.replace("  source: local", "  source: local\n  source: local"),
            base.replace("  source: local", "  source: local\n  extra: 1"),
            base.replace("  source: local", "  source: \"local\""),
            base.replace("  source: local\n", "  source: local"),
            base.replace('\n', "\r\n"),
            base.replace("  decision", "   decision"),
            base.replace("  decision", "\tdecision"),
            base.replace('R', "a\u{1a}b.com"),
            base.replace('R', "a\u{7f}b.com"),
            format!("---\n{base}"),
            "default: deny\nrules:\n".to_owned(),
            "default: deny\nrules: [ ]\n".to_owned(),
            "rules: []\n".to_owned(),
        ];
        for text in unusual {
            let (fast, slow) = both(&text);
            assert_eq!(fast, None, "{text}");
            // Whatever serde_norway makes of it is what the user gets.
            let _ = slow;
        }
        // Quoted forms that are unambiguous, comments and blank lines are
        // read, identically.
        let annotated = [
            base.replace("  decision", "  # note\n  decision"),
            base.replace("  decision", "\n  decision"),
            base.replace("  decision", "\n    \n# x\n  decision"),
            base.replace("default: deny", "# hand-edited\ndefault: deny # for now"),
            base.replace("rules:", "rules: # list"),
        ];
        for r in [
            "'*.x.com'",
            "'**'",
            "\"x.com\"",
            "'[::1]:443'",
            "x.com # why",
            "x.com   ",
            "'*.x.com' # c",
            "\"x.com\"  #c",
            "'it''s.com'",
        ]
        .iter()
        .map(|r| base.replace('R', r))
        .chain(annotated)
        {
            let text = r;
            let (fast, slow) = both(&text);
            assert!(fast.is_some() || slow.is_none(), "{text}");
            assert_eq!(fast, slow, "{text}");
        }
    }

    fn global_err(text: &str) -> String {
        parse_global(Path::new("/c/policies.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn bad_resource_names_file_and_line() {
        let text = GOOD.replace("API.Anthropic.com.", "a..b");
        let msg = global_err(&text);
        assert!(msg.starts_with("`/c/policies.yaml` line 7, column "), "{msg}");
        assert!(msg.contains("`a..b` has an empty label"), "{msg}");

        let text = GOOD.replace("\"[2001:db8::/32]:443\"", "10.0.0.1/8");
        let msg = global_err(&text);
        assert!(msg.starts_with("`/c/policies.yaml` line 13, column "), "{msg}");
        assert!(msg.contains("`10.0.0.1/8` has host bits set (the network is `10.0.0.0/8`)"), "{msg}");
    }

    /// ADR 0050: an HTTP rule round-trips through the files (`serde_norway`'s
    /// path: the fast reader leaves it alone), and what is not one names
    /// the file, the rule's line and the field.
    #[test]
    fn http_rules_parse_and_bad_ones_name_the_field() {
        let rule = "- id: 16fd2706-8baf-433b-82eb-8c7fada847da\n  decision: allow\n  type: http\n  resource: api.example.com\n  methods: [GET, HEAD]\n  path: /repos/org/**\n  created_at: 2025-06-01T12:00:00Z\n  source: local\n";
        let text = format!("default: deny\nrules:\n{rule}");
        let f = parse_global(Path::new("p"), &text).unwrap();
        assert_eq!(f.rules[0].kind, crate::policy::RuleType::Http);
        assert_eq!(f.rules[0].methods.as_deref(), Some(&["GET".to_owned(), "HEAD".to_owned()][..]));
        let saved = serde_norway::to_string(&f).unwrap();
        assert_eq!(parse_global(Path::new("p"), &saved).unwrap(), f);
        assert_eq!(fast::global(&saved), None, "HTTP rules go to serde_norway");
        let cases = [
            (rule.replace("/repos/org/**", "/repos/../x"), "field `path`: `/repos/../x` has a `..` segment"),
            (rule.replace("/repos/org/**", "/a%2Fb"), "field `path`"),
            (rule.replace("[GET, HEAD]", "[get]"), "field `methods`: `get`"),
            (rule.replace("[GET, HEAD]", "[]"), "field `methods`: no method"),
            (rule.replace("  methods: [GET, HEAD]\n", ""), "field `methods`: an HTTP rule needs methods"),
            (rule.replace("  path: /repos/org/**\n", ""), "field `path`: an HTTP rule needs a path"),
            (rule.replace("api.example.com", "10.0.0.0/8"), "field `resource`: `10.0.0.0/8` is not a host pattern"),
            (rule.replace("type: http", "type: network"), "field `methods`: only an HTTP rule"),
        ];
        for (bad, needle) in cases {
            let text = format!(
                "default: deny\nrules:\n- id: 7c9e6679-7425-40de-944b-e07fc1f90ae7\n  decision: deny\n  type: network\n  resource: x.com\n  created_at: 2025-06-01T12:00:00Z\n  source: local\n{bad}"
            );
            let e = parse_global(Path::new("/c/policies.yaml"), &text).unwrap_err();
            assert_eq!(e.line, 9, "{e}");
            let msg = e.to_string();
            assert!(msg.starts_with("`/c/policies.yaml` line 9"), "{msg}");
            assert!(msg.contains(needle), "{msg}");
            assert_eq!(parse_global_slow(Path::new("p"), &text).ok(), None);
        }
    }

    #[test]
    fn other_malformed_files_name_the_line() {
        let cases = [
            (GOOD.replace("decision: deny", "decision: maybe"), 11, "unknown variant `maybe`"),
            (
                GOOD.replace("type: network\n    resource: \"", "type: file\n    resource: \""),
                12,
                "unknown variant `file`",
            ),
            (GOOD.replace("2025-06-01T12:00:00Z", "yesterday"), 8, "created_at"),
            (GOOD.replace("7c9e6679-7425-40de-944b-e07fc1f90ae7", "not-a-uuid"), 4, "UUID"),
            (GOOD.replace("source: local", "source: org"), 15, "unknown variant `org`"),
            (GOOD.replace("    source: preset", "    source: preset\n    comment: hi"), 10, "unknown field `comment`"),
            (GOOD.replace("default: deny\n", ""), 1, "missing field `default`"),
            (format!("{GOOD}  - [\n"), 16, "expected struct Rule"),
        ];
        for (text, line, needle) in cases {
            let err = parse_global(Path::new("p"), &text).unwrap_err();
            assert_eq!(err.line, line, "{err}");
            assert!(err.to_string().contains(needle), "{err}");
        }
    }
}

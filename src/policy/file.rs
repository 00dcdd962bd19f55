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

use super::{Preset, Rule, Verdict};
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
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// `$PPP_DATA/sandboxes/<name>/policy.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxFile {
    #[serde(default)]
    pub rules: Vec<Rule>,
}

impl GlobalFile {
    /// A fresh file for `preset`: its default and its rules.
    #[must_use]
    pub fn from_preset(preset: Preset) -> GlobalFile {
        GlobalFile {
            default: preset.default_verdict(),
            preset: Some(preset),
            rules: preset.rules(),
        }
    }
}

/// Parse the global file's text; `path` is only used in messages. This is the
/// code path [`load_global`] uses, exposed for the fuzz target.
pub fn parse_global(path: &Path, text: &str) -> Result<GlobalFile, ParseError> {
    state::parse_yaml(path, text)
}

/// Parse a sandbox file's text. An empty file (or one with only comments)
/// means no rules: truncating the file is a natural way to clear it.
pub fn parse_sandbox(path: &Path, text: &str) -> Result<SandboxFile, ParseError> {
    if is_blank_yaml(text) {
        return Ok(SandboxFile::default());
    }
    state::parse_yaml(path, text)
}

fn is_blank_yaml(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}

/// Read the global policy; `None` when the file does not exist.
pub fn load_global(path: &Path) -> Result<Option<GlobalFile>> {
    match state::read_optional(path)? {
        Some(text) => Ok(Some(parse_global(path, &text)?)),
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
        assert_eq!(
            load_global(&dir.path().join("policies.yaml")).unwrap(),
            None
        );
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
        f.rules.push(Rule::new(
            Verdict::Deny,
            Resource::parse("[2001:db8::1]:443").unwrap(),
            Source::Local,
        ));
        save_global(&path, &f).unwrap();
        let before = std::fs::read(&path).unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(load_global(&path).unwrap().unwrap(), f);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);

        let spath = dir.path().join("data/sandboxes/s/policy.yaml");
        let s = SandboxFile {
            rules: f.rules[..2].to_vec(),
        };
        save_sandbox(&spath, &s).unwrap();
        assert_eq!(load_sandbox(&spath).unwrap().unwrap(), s);
    }

    #[test]
    fn preset_is_omitted_when_absent() {
        let f = GlobalFile {
            default: Verdict::Allow,
            preset: None,
            rules: vec![],
        };
        let text = serde_norway::to_string(&f).unwrap();
        assert!(!text.contains("preset"), "{text}");
        assert_eq!(parse_global(Path::new("p"), "default: allow\n").unwrap(), f);
    }

    #[test]
    fn empty_sandbox_file_has_no_rules() {
        for text in ["", "\n", "# cleared\n", "---\n"] {
            assert_eq!(
                parse_sandbox(Path::new("p"), text).unwrap(),
                SandboxFile::default(),
                "{text:?}"
            );
        }
        assert_eq!(
            parse_sandbox(Path::new("p"), "rules: []\n").unwrap(),
            SandboxFile::default()
        );
    }

    fn global_err(text: &str) -> String {
        parse_global(Path::new("/c/policies.yaml"), text)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn bad_resource_names_file_and_line() {
        let text = GOOD.replace("API.Anthropic.com.", "a..b");
        let msg = global_err(&text);
        assert!(
            msg.starts_with("`/c/policies.yaml` line 7, column "),
            "{msg}"
        );
        assert!(msg.contains("`a..b` has an empty label"), "{msg}");

        let text = GOOD.replace("\"[2001:db8::/32]:443\"", "10.0.0.1/8");
        let msg = global_err(&text);
        assert!(
            msg.starts_with("`/c/policies.yaml` line 13, column "),
            "{msg}"
        );
        assert!(
            msg.contains("`10.0.0.1/8` has host bits set (the network is `10.0.0.0/8`)"),
            "{msg}"
        );
    }

    #[test]
    fn other_malformed_files_name_the_line() {
        let cases = [
            (
                GOOD.replace("decision: deny", "decision: maybe"),
                11,
                "unknown variant `maybe`",
            ),
            (
                GOOD.replace(
                    "type: network\n    resource: \"",
                    "type: file\n    resource: \"",
                ),
                12,
                "unknown variant `file`",
            ),
            (
                GOOD.replace("2025-06-01T12:00:00Z", "yesterday"),
                8,
                "created_at",
            ),
            (
                GOOD.replace("7c9e6679-7425-40de-944b-e07fc1f90ae7", "not-a-uuid"),
                4,
                "UUID",
            ),
            (
                GOOD.replace("source: local", "source: org"),
                15,
                "unknown variant `org`",
            ),
            (
                GOOD.replace("    source: preset", "    source: preset\n    comment: hi"),
                10,
                "unknown field `comment`",
            ),
            (
                GOOD.replace("default: deny\n", ""),
                1,
                "missing field `default`",
            ),
            (format!("{GOOD}  - [\n"), 16, "expected struct Rule"),
        ];
        for (text, line, needle) in cases {
            let err = parse_global(Path::new("p"), &text).unwrap_err();
            assert_eq!(err.line, line, "{err}");
            assert!(err.to_string().contains(needle), "{err}");
        }
    }
}

//! `$PPP_DATA/usage.jsonl`: one JSON object per line, each a [`Record`].
//!
//! Two kinds of line share the shape. A *flow* line is one metered response
//! (`flow` set, `requests` 1). A *roll-up* line (`flow` absent) sums the
//! flow lines of one (UTC day, sandbox, provider, model) that the writer
//! folded when it compacted the file, so the log stays bounded while the
//! all-time, per-day totals survive. Readers sum both kinds alike: every
//! field adds.
//!
//! Lines that are not records (a torn write, a hand edit) are skipped and
//! counted, never fatal, as for flows.jsonl.

use std::io;
use std::path::Path;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

/// The tokens of one response, or of many summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
    /// Prompt tokens read from the provider's cache (Anthropic
    /// `cache_read_input_tokens`, OpenAI `cached_tokens`, Gemini
    /// `cachedContentTokenCount`). Counted inside `input` only where the
    /// provider counts it there; each provider's data says (providers.yaml).
    #[serde(default)]
    pub cache_read: u64,
    /// Prompt tokens written to the cache (Anthropic
    /// `cache_creation_input_tokens`).
    #[serde(default)]
    pub cache_write: u64,
}

impl Tokens {
    /// Every kind together: what a token budget and the TOKENS column count.
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output).saturating_add(self.cache_read).saturating_add(self.cache_write)
    }

    pub fn add(&mut self, o: &Tokens) {
        self.input = self.input.saturating_add(o.input);
        self.output = self.output.saturating_add(o.output);
        self.cache_read = self.cache_read.saturating_add(o.cache_read);
        self.cache_write = self.cache_write.saturating_add(o.cache_write);
    }
}

/// One line of usage.jsonl.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// RFC 3339 UTC, second precision: when the response ended (a flow
    /// line), or the start of the UTC day it sums (a roll-up,
    /// `2026-12-03T00:00:00Z`).
    pub ts: String,
    pub sandbox: String,
    /// The provider's name in providers.yaml (`anthropic`, `openai`,
    /// `gemini`, or one the user added).
    pub provider: String,
    /// The model the response named; `""` when it named none.
    #[serde(default)]
    pub model: String,
    /// Responses counted: 1 on a flow line.
    pub requests: u64,
    /// Of `requests`, those whose tokens are estimated because the response
    /// reported no usage (an error, a cut stream, a stream without usage);
    /// docs/user-guide/usage.md says how the estimate is made.
    #[serde(default)]
    pub estimated: u64,
    #[serde(flatten)]
    pub tokens: Tokens,
    /// The proxy's flow id, on a flow line: a response reported twice (the
    /// addon retrying across a daemon restart) is written once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<String>,
}

impl Record {
    /// The UTC day of `ts` (`2026-12-03`), what roll-ups and "today" group by.
    pub fn day(&self) -> &str {
        self.ts.get(..10).unwrap_or(&self.ts)
    }
}

/// What [`read`] found.
#[derive(Debug, Default)]
pub struct Read {
    /// In file order.
    pub records: Vec<Record>,
    /// Lines that were not records.
    pub malformed: usize,
}

/// Every record of the log at `path`; a missing log has none.
pub fn read(path: &Path) -> Result<Read> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Read::default()),
        Err(e) => return Err(e).with_context(|| format!("could not open `{}`", path.display())),
    };
    read_from(io::BufReader::new(file)).with_context(|| format!("could not read `{}`", path.display()))
}

/// [`read`] of any reader: one record per line.
pub fn read_from(r: impl io::BufRead) -> io::Result<Read> {
    let mut out = Read::default();
    for line in r.split(b'\n') {
        let line = line?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Record>(&line) {
            Ok(rec) => out.records.push(rec),
            Err(_) => out.malformed += 1,
        }
    }
    Ok(out)
}

/// One record as its line in usage.jsonl, newline included.
pub fn line(rec: &Record) -> String {
    let mut s = serde_json::to_string(rec).expect("a record always serialises");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow() -> Record {
        Record {
            ts: "2026-12-03T10:11:12Z".into(),
            sandbox: "red".into(),
            provider: "anthropic".into(),
            model: "claude-sonnet-4-5".into(),
            requests: 1,
            estimated: 0,
            tokens: Tokens { input: 10, output: 20, cache_read: 3, cache_write: 4 },
            flow: Some("f-1".into()),
        }
    }

    #[test]
    fn a_line_round_trips_and_is_flat() {
        let l = line(&flow());
        assert_eq!(
            l,
            "{\"ts\":\"2026-12-03T10:11:12Z\",\"sandbox\":\"red\",\"provider\":\"anthropic\",\"model\":\"claude-sonnet-4-5\",\"requests\":1,\"estimated\":0,\"input\":10,\"output\":20,\"cache_read\":3,\"cache_write\":4,\"flow\":\"f-1\"}\n"
        );
        let r = read_from(l.as_bytes()).unwrap();
        assert_eq!(r.records, vec![flow()]);
        assert_eq!(r.records[0].day(), "2026-12-03");
    }

    #[test]
    fn bad_lines_are_counted_and_skipped() {
        let text = format!("{}not json\n{{\"ts\":1}}\n\n{}", line(&flow()), line(&flow()));
        let r = read_from(text.as_bytes()).unwrap();
        assert_eq!((r.records.len(), r.malformed), (2, 2));
    }

    #[test]
    fn totals_saturate() {
        let mut t = Tokens { input: u64::MAX, ..Tokens::default() };
        t.add(&Tokens { input: 5, output: 1, ..Tokens::default() });
        assert_eq!(t.input, u64::MAX);
        assert_eq!(t.total(), u64::MAX);
    }
}

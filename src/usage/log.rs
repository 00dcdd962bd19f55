//! The writer of `$PPP_DATA/usage.jsonl` ([`super::record`]): the daemon's
//! alone, one [`Log`] per daemon.
//!
//! Each record is appended with a single `write` on an `O_APPEND` file, so
//! a crash leaves at most a torn last line, which the reader skips. A flow
//! id already written is not written again: the ids of recent flow lines
//! are kept (bounded, [`RECENT_FLOWS`]) and loaded from the file when the
//! log is opened, so an addon that retries a report across a daemon
//! restart is counted once. Past a size the file is compacted: flow lines
//! of earlier UTC days become one roll-up line per (day, sandbox,
//! provider, model), today's newest stay (the rest of today folds too, so a
//! busy day cannot outgrow the bound), and the new file replaces the old one
//! atomically (temp file, fsync, rename). Totals are the same before and
//! after.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::record::{self, Record, Tokens};

/// The size past which the log is compacted.
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;

/// Flow ids remembered for de-duplication. A retry comes within seconds of
/// the first report; this many cover far more than a daemon restart's
/// worth of responses, in a few MiB at most.
pub const RECENT_FLOWS: usize = 65_536;

/// The longest flow id written; the addon's are uuids (36 bytes).
pub const MAX_FLOW_ID: usize = 128;

/// The usage log, open for appending.
#[derive(Debug)]
pub struct Log {
    path: PathBuf,
    max_bytes: u64,
    recent: HashSet<String>,
    order: VecDeque<String>,
}

impl Log {
    /// Open (or start) the log at `path`, compacted past `max_bytes`, and
    /// remember the flow ids it already has.
    pub fn open(path: &Path, max_bytes: u64) -> Result<Log> {
        let mut log = Log { path: path.to_owned(), max_bytes, recent: HashSet::new(), order: VecDeque::new() };
        end_torn_line(path)?;
        for r in record::read(path)?.records {
            if let Some(f) = r.flow {
                log.remember(f);
            }
        }
        Ok(log)
    }

    fn remember(&mut self, flow: String) {
        if self.recent.insert(flow.clone()) {
            self.order.push_back(flow);
            while self.order.len() > RECENT_FLOWS {
                if let Some(old) = self.order.pop_front() {
                    self.recent.remove(&old);
                }
            }
        }
    }

    /// Append `rec`; `Ok(false)` when its flow id was already written.
    /// Compacts the file when it grew past its size.
    pub fn append(&mut self, rec: &Record) -> Result<bool> {
        if let Some(f) = &rec.flow
            && self.recent.contains(f)
        {
            return Ok(false);
        }
        let line = record::line(rec);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .with_context(|| format!("could not open `{}`", self.path.display()))?;
        // One write of the whole line: appends of one write are not
        // interleaved, and a crash tears at most this line.
        file.write_all(line.as_bytes()).with_context(|| format!("could not append to `{}`", self.path.display()))?;
        if let Some(f) = &rec.flow {
            self.remember(f.clone());
        }
        let size = file.metadata().map_or(0, |m| m.len());
        drop(file);
        if size > self.max_bytes {
            self.compact(&today())?;
        }
        Ok(true)
    }

    /// Fold every line of a day before `today` (`YYYY-MM-DD`) into roll-ups,
    /// and today's too but for the newest quarter of the size limit: a
    /// guest makes as many requests as it likes in one day, and without
    /// that the file would outgrow its bound until midnight, rewritten
    /// whole on every append past it. Today's folded lines keep their day,
    /// not their hour (`--since 2h` counts such a roll-up whole).
    pub fn compact(&self, today: &str) -> Result<()> {
        let read = record::read(&self.path)?;
        let mut rolled: BTreeMap<(String, String, String, String), Record> = BTreeMap::new();
        let mut kept = Vec::new();
        let mut todays = Vec::new();
        let mut older = Vec::new();
        for r in read.records {
            if r.day() >= today { todays.push(r) } else { older.push(r) }
        }
        // The newest of today's lines that fit in a quarter of the limit.
        let mut room = self.max_bytes / 4;
        let mut split = todays.len();
        while split > 0 {
            let len = record::line(&todays[split - 1]).len() as u64;
            if len > room {
                break;
            }
            room -= len;
            split -= 1;
        }
        kept.extend(todays.drain(split..));
        for r in older.into_iter().chain(todays) {
            let key = (r.day().to_owned(), r.sandbox.clone(), r.provider.clone(), r.model.clone());
            let sum = rolled.entry(key).or_insert_with(|| Record {
                ts: format!("{}T00:00:00Z", r.day()),
                sandbox: r.sandbox.clone(),
                provider: r.provider.clone(),
                model: r.model.clone(),
                requests: 0,
                estimated: 0,
                tokens: Tokens::default(),
                flow: None,
            });
            sum.requests = sum.requests.saturating_add(r.requests);
            sum.estimated = sum.estimated.saturating_add(r.estimated);
            sum.tokens.add(&r.tokens);
        }
        let mut text = String::new();
        for r in rolled.values().chain(kept.iter()) {
            text.push_str(&record::line(r));
        }
        crate::state::write_atomic(&self.path, text.as_bytes())
            .with_context(|| format!("could not compact `{}`", self.path.display()))
    }
}

/// A crash mid-append left a last line without its newline: end it, so
/// the next record starts a line of its own (the torn one is skipped).
fn end_torn_line(path: &Path) -> Result<()> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut f = match std::fs::OpenOptions::new().read(true).append(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("could not open `{}`", path.display())),
    };
    let len = f.metadata().map_or(0, |m| m.len());
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8];
    f.seek(SeekFrom::Start(len - 1))
        .and_then(|_| f.read_exact(&mut last))
        .with_context(|| format!("could not read `{}`", path.display()))?;
    if last[0] != b'\n' {
        f.write_all(b"\n").with_context(|| format!("could not append to `{}`", path.display()))?;
    }
    Ok(())
}

/// Now, as a record's `ts`: RFC 3339 UTC, second precision.
#[must_use]
pub fn now() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Today's UTC day, `YYYY-MM-DD`.
#[must_use]
pub fn today() -> String {
    now()[..10].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ts: &str, sandbox: &str, model: &str, flow: &str, n: u64) -> Record {
        Record {
            ts: ts.into(),
            sandbox: sandbox.into(),
            provider: "anthropic".into(),
            model: model.into(),
            requests: 1,
            estimated: u64::from(n.is_multiple_of(2)),
            tokens: Tokens { input: n, output: 2 * n, cache_read: 3 * n, cache_write: n / 2 },
            flow: Some(flow.into()),
        }
    }

    /// What `ppp usage` sums: per (day, sandbox, provider, model).
    fn totals(path: &Path) -> BTreeMap<(String, String, String), (u64, u64, Tokens)> {
        let mut t: BTreeMap<_, (u64, u64, Tokens)> = BTreeMap::new();
        for r in record::read(path).unwrap().records {
            let e = t.entry((r.day().to_owned(), r.sandbox.clone(), r.model.clone())).or_default();
            e.0 += r.requests;
            e.1 += r.estimated;
            e.2.add(&r.tokens);
        }
        t
    }

    #[test]
    fn a_flow_is_written_once_even_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.jsonl");
        let mut log = Log::open(&path, MAX_BYTES).unwrap();
        assert!(log.append(&rec("2026-12-03T10:00:00Z", "red", "m", "f-1", 5)).unwrap());
        assert!(!log.append(&rec("2026-12-03T10:00:01Z", "red", "m", "f-1", 5)).unwrap());
        drop(log);
        let mut log = Log::open(&path, MAX_BYTES).unwrap();
        assert!(!log.append(&rec("2026-12-03T10:00:02Z", "red", "m", "f-1", 5)).unwrap(), "loaded at open");
        assert!(log.append(&rec("2026-12-03T10:00:02Z", "red", "m", "f-2", 5)).unwrap());
        assert_eq!(record::read(&path).unwrap().records.len(), 2);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_the_next_append_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.jsonl");
        std::fs::write(&path, "{\"ts\":\"2026-12-03T10:00:00Z\",\"sandbox\":\"red\",\"prov").unwrap();
        let mut log = Log::open(&path, MAX_BYTES).unwrap();
        assert!(log.append(&rec("2026-12-03T10:00:00Z", "red", "m", "f-1", 5)).unwrap());
        let r = record::read(&path).unwrap();
        assert_eq!((r.records.len(), r.malformed), (1, 1), "the torn line is ended, not joined");
        assert!(log.append(&rec("2026-12-03T10:00:01Z", "red", "m", "f-2", 5)).unwrap());
        assert_eq!(record::read(&path).unwrap().records.last().unwrap().flow.as_deref(), Some("f-2"));
    }

    #[test]
    fn compaction_keeps_the_totals_and_today_s_flows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.jsonl");
        // Never compacts by itself: the test calls it.
        let mut log = Log::open(&path, u64::MAX).unwrap();
        let mut n = 0;
        for day in ["2026-12-01", "2026-12-02", "2026-12-03"] {
            for sandbox in ["red", "blue"] {
                for model in ["a", "b"] {
                    for _ in 0..3 {
                        n += 1;
                        log.append(&rec(&format!("{day}T0{}:00:00Z", n % 10), sandbox, model, &format!("f-{n}"), n))
                            .unwrap();
                    }
                }
            }
        }
        let before = totals(&path);
        log.compact("2026-12-03").unwrap();
        assert_eq!(totals(&path), before);
        let r = record::read(&path).unwrap().records;
        let (rollups, flows): (Vec<_>, Vec<_>) = r.iter().partition(|r| r.flow.is_none());
        assert_eq!(rollups.len(), 2 * 2 * 2, "one per (day, sandbox, model) before today");
        assert!(rollups.iter().all(|r| r.ts.ends_with("T00:00:00Z") && r.requests == 3));
        assert_eq!(flows.len(), 12, "today's flow lines are kept");
        assert!(flows.iter().all(|r| r.day() == "2026-12-03"));
        // Compacting again changes nothing; the file stays bounded.
        log.compact("2026-12-03").unwrap();
        assert_eq!(totals(&path), before);
        assert_eq!(record::read(&path).unwrap().records.len(), 20);
        // A later day folds the earlier roll-ups and today's flows alike.
        log.compact("2026-12-04").unwrap();
        assert_eq!(totals(&path), before);
        assert_eq!(record::read(&path).unwrap().records.len(), 12);
    }

    #[test]
    fn appending_past_the_size_compacts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.jsonl");
        let mut log = Log::open(&path, 2048).unwrap();
        for i in 0..100 {
            log.append(&rec("2020-01-01T00:00:00Z", "red", "m", &format!("f-{i}"), 1)).unwrap();
        }
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size <= 2048 + 512, "{size}");
        let t = totals(&path);
        assert_eq!(t.values().map(|v| v.0).sum::<u64>(), 100);
        // Ids of compacted flows are still remembered by this daemon.
        assert!(!log.append(&rec("2020-01-01T00:00:00Z", "red", "m", "f-3", 1)).unwrap());
    }

    /// The attack: a guest that makes request after request in one day.
    /// Today's lines are folded too, past a quarter of the limit, so the
    /// file stays bounded and is not rewritten on every append.
    #[test]
    fn one_day_of_many_requests_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.jsonl");
        let mut log = Log::open(&path, 4096).unwrap();
        let day = today();
        let mut compactions = 0;
        let mut last = 0;
        for i in 0..2000 {
            log.append(&rec(&format!("{day}T00:00:01Z"), "red", "m", &format!("f-{i}"), 1)).unwrap();
            let size = std::fs::metadata(&path).unwrap().len();
            assert!(size <= 4096 + 512, "{size}");
            if size < last {
                compactions += 1;
            }
            last = size;
        }
        assert!(compactions < 200, "compacted {compactions} times in 2000 appends");
        let t = totals(&path);
        assert_eq!(t.values().map(|v| v.0).sum::<u64>(), 2000);
        assert_eq!(t.values().map(|v| v.2.input).sum::<u64>(), 2000);
    }

    #[test]
    fn the_recent_flows_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(&dir.path().join("u"), u64::MAX).unwrap();
        for i in 0..(RECENT_FLOWS + 10) {
            log.remember(format!("f-{i}"));
        }
        assert_eq!((log.recent.len(), log.order.len()), (RECENT_FLOWS, RECENT_FLOWS));
        assert!(!log.recent.contains("f-0"));
    }

    #[test]
    fn now_is_rfc3339_seconds() {
        let n = now();
        assert_eq!(n.len(), 20, "{n}");
        assert!(n.ends_with('Z') && n.as_bytes()[10] == b'T');
    }
}

//! Following `$PPP_DATA/flows.jsonl` as it grows, for `ppp policy log -f`
//! and the dashboard's flow pane, and the few words both use to show a flow
//! (its path without the query, sizes, durations).
//!
//! [`Follower`] polls: each [`Follower::poll`] stats the path and reads what
//! was appended since the last one, returning complete lines only (a line
//! without its newline yet is held until it has one). Polling a stat every
//! [`INTERVAL`] costs next to nothing and needs no inotify, which would also
//! miss a file replaced on another mount. It survives the addon's rotation
//! (`flows.jsonl` renamed to `flows.jsonl.1`, a new file created): the
//! renamed file is still open, so it is read to its end before the new one is
//! read from its start, and it is read a while longer ([`RETIRE_POLLS`]) for
//! a writer that had not noticed the rename yet. A file truncated in place
//! (shorter than what was read) is read again from its start.
//!
//! Read-only. Nothing here decides what a line means beyond "a JSON object";
//! malformed lines are counted and skipped, as [`flowlog`](super::flowlog)
//! does.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use super::flowlog;

/// How often a follower is polled: a flow shows well within a second of
/// being logged, and a stat plus an empty read five times a second is free.
pub const INTERVAL: Duration = Duration::from_millis(150);

/// How many polls a rotated-away file is still read after the switch. The
/// addon closes the log before renaming it, so its own rotation loses
/// nothing; a file moved away behind its back is written until the addon
/// notices (it checks once a second), and those lines are still caught.
pub const RETIRE_POLLS: u32 = 20;

/// A line longer than this is dropped rather than held: the addon's lines
/// are far shorter (its paths are capped at 1024 characters), so this only
/// bounds memory against a file that is not a flow log.
pub const MAX_LINE: usize = 1024 * 1024;

/// How much is read per `read_at`.
const READ: usize = 64 * 1024;

/// One open file being read from `pos` on.
#[derive(Debug)]
struct Source {
    file: File,
    /// Device and inode: the identity a rename keeps and a new file lacks.
    id: (u64, u64),
    pos: u64,
    /// The start of a line whose newline has not been read yet.
    partial: Vec<u8>,
    /// Inside a line longer than [`MAX_LINE`]: skip to its newline.
    skipping: bool,
}

impl Source {
    fn open(path: &Path) -> io::Result<Option<Source>> {
        match File::open(path) {
            Ok(file) => {
                let m = file.metadata()?;
                Ok(Some(Source { file, id: (m.dev(), m.ino()), pos: 0, partial: Vec::new(), skipping: false }))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Read from `pos` to the end of the file, pushing complete lines.
    fn drain(&mut self, lines: &mut Vec<Vec<u8>>, malformed: &mut usize) -> io::Result<()> {
        if self.file.metadata()?.len() < self.pos {
            // Truncated in place (`copytruncate`, `: > flows.jsonl`): what
            // is there now was written after the truncation.
            self.pos = 0;
            self.partial.clear();
            self.skipping = false;
        }
        let mut buf = vec![0u8; READ];
        loop {
            let n = self.file.read_at(&mut buf, self.pos)?;
            if n == 0 {
                return Ok(());
            }
            self.pos += n as u64;
            let mut rest = &buf[..n];
            while let Some(i) = rest.iter().position(|&b| b == b'\n') {
                if self.skipping {
                    self.skipping = false;
                } else {
                    self.partial.extend_from_slice(&rest[..i]);
                    lines.push(std::mem::take(&mut self.partial));
                }
                rest = &rest[i + 1..];
            }
            if !self.skipping {
                self.partial.extend_from_slice(rest);
                if self.partial.len() > MAX_LINE {
                    self.partial = Vec::new();
                    self.skipping = true;
                    *malformed += 1;
                }
            }
        }
    }

    /// The file will not be read again: an unterminated last line is as
    /// complete as it will get.
    fn finish(&mut self, lines: &mut Vec<Vec<u8>>) {
        if !self.partial.is_empty() {
            lines.push(std::mem::take(&mut self.partial));
        }
    }
}

/// Follows one log path across rotation and truncation. See the module doc.
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    current: Option<Source>,
    /// The file rotated away, still read for [`RETIRE_POLLS`] polls.
    retired: Option<(Source, u32)>,
    /// Lines skipped: not JSON objects, or too long.
    pub malformed: usize,
}

impl Follower {
    /// Follow `path` from its current end: only flows logged from now on
    /// are returned. A missing file is followed from its start once it
    /// appears.
    pub fn at_end(path: &Path) -> io::Result<Follower> {
        let mut current = Source::open(path)?;
        if let Some(s) = &mut current {
            s.pos = s.file.metadata()?.len();
        }
        Ok(Follower { path: path.to_owned(), current, retired: None, malformed: 0 })
    }

    /// Follow `path` from its start.
    pub fn from_start(path: &Path) -> io::Result<Follower> {
        Ok(Follower { path: path.to_owned(), current: Source::open(path)?, retired: None, malformed: 0 })
    }

    /// The last `limit` flows (only `sandbox`'s when given) logged before
    /// the point this follower starts from, oldest first, going on into the
    /// rotated file when needed. Read from the file the follower holds, up
    /// to where it starts, so that a flow logged meanwhile is shown once:
    /// here or by the next [`poll`](Self::poll), never both or neither.
    pub fn backlog(&self, limit: usize, sandbox: Option<&str>) -> Result<Vec<Value>> {
        let mut flows = match &self.current {
            Some(s) => {
                let f = s.file.try_clone().context("could not read the flow log")?;
                let t = flowlog::tail_from(Upto { inner: f, end: s.pos, pos: 0 }, limit, sandbox)
                    .with_context(|| format!("could not read `{}`", self.path.display()))?;
                t.flows
            }
            None => Vec::new(),
        };
        if flows.len() < limit {
            let mut older = flowlog::tail_file(&flowlog::rotated(&self.path), limit - flows.len(), sandbox)?;
            older.append(&mut flows);
            flows = older;
        }
        flows.iter_mut().for_each(scrub);
        Ok(flows)
    }

    /// Everything appended since the last poll, as complete lines in the
    /// order they were written (the rotated file's last lines before the
    /// new file's first).
    pub fn poll(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let mut lines = Vec::new();
        if let Some((old, left)) = &mut self.retired {
            old.drain(&mut lines, &mut self.malformed)?;
            *left -= 1;
            if *left == 0 {
                old.finish(&mut lines);
                self.retired = None;
            }
        }
        let now = match std::fs::metadata(&self.path) {
            Ok(m) => Some((m.dev(), m.ino())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let replaced = match (&self.current, now) {
            (Some(s), Some(id)) => s.id != id,
            (None, Some(_)) => true,
            // Renamed away and no new file yet: keep reading the old one.
            (_, None) => false,
        };
        if let Some(s) = &mut self.current {
            // Everything up to the rename, before anything of the new file.
            s.drain(&mut lines, &mut self.malformed)?;
        }
        if replaced {
            if let Some(mut old) = self.current.take() {
                if let Some((mut older, _)) = self.retired.take() {
                    older.finish(&mut lines);
                }
                old.finish(&mut lines);
                self.retired = Some((old, RETIRE_POLLS));
            }
            self.current = Source::open(&self.path)?;
            if let Some(s) = &mut self.current {
                s.drain(&mut lines, &mut self.malformed)?;
            }
        }
        Ok(lines)
    }

    /// [`poll`](Self::poll), keeping the lines that are flows (of `sandbox`
    /// when given) with their path made safe to show ([`scrub`]).
    pub fn poll_flows(&mut self, sandbox: Option<&str>) -> io::Result<Vec<Value>> {
        let mut flows = Vec::new();
        for line in self.poll()? {
            match parse(&line) {
                Some(Ok(mut v)) if sandbox.is_none_or(|s| v.get("sandbox").and_then(Value::as_str) == Some(s)) => {
                    scrub(&mut v);
                    flows.push(v);
                }
                Some(Err(())) => self.malformed += 1,
                Some(Ok(_)) | None => {}
            }
        }
        Ok(flows)
    }
}

/// A log line as a flow: `None` for a blank line, `Err` for one that is
/// not a JSON object.
pub fn parse(line: &[u8]) -> Option<Result<Value, ()>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    Some(match serde_json::from_slice::<Value>(line) {
        Ok(v @ Value::Object(_)) => Ok(v),
        _ => Err(()),
    })
}

/// A flow's `path` without its query string and fragment, as
/// [`scrub`] leaves it.
pub fn path(flow: &Value) -> Option<&str> {
    let p = flow.get("path")?.as_str()?;
    Some(p.split(['?', '#']).next().unwrap_or(p))
}

/// Drop the query string (and fragment) from a flow's `path`. The addon
/// never logs them, since a query often carries a token; this keeps a log
/// written by anything else from putting one on the screen.
pub fn scrub(flow: &mut Value) {
    if let Some(Value::String(p)) = flow.get_mut("path")
        && let Some(i) = p.find(['?', '#'])
    {
        p.truncate(i);
    }
}

/// A byte count in a few characters: `512B`, `1.5KiB`, `12MiB`.
pub fn size(n: u64) -> String {
    #[allow(clippy::cast_precision_loss, reason = "a size shown to one decimal")]
    let mut v = n as f64;
    let mut unit = "B";
    for u in ["KiB", "MiB", "GiB", "TiB"] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if unit == "B" {
        format!("{n}B")
    } else if v < 9.95 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.0}{unit}")
    }
}

/// A duration in milliseconds in a few characters: `830ms`, `1.3s`,
/// `2m05s`, `1h02m`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms}ms"),
        1000..59_950 => {
            let tenths = (ms + 50) / 100;
            format!("{}.{}s", tenths / 10, tenths % 10)
        }
        _ => {
            let s = (ms + 500) / 1000;
            if s < 3600 { format!("{}m{:02}s", s / 60, s % 60) } else { format!("{}h{:02}m", s / 3600, s / 60 % 60) }
        }
    }
}

/// A reader that ends at `end`, for reading the log only up to where a
/// follower starts.
struct Upto<R> {
    inner: R,
    end: u64,
    pos: u64,
}

impl<R: Read + Seek> Read for Upto<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = usize::try_from(self.end.saturating_sub(self.pos)).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        if want == 0 {
            return Ok(0);
        }
        self.inner.seek(SeekFrom::Start(self.pos))?;
        let n = self.inner.read(&mut buf[..want])?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read + Seek> Seek for Upto<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.end.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn flow(i: usize) -> String {
        format!(r#"{{"sandbox":"s{}","host":"h{i}","path":"/p{i}"}}"#, i % 2)
    }

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn text(lines: Vec<Vec<u8>>) -> Vec<String> {
        lines.into_iter().map(|l| String::from_utf8(l).unwrap()).collect()
    }

    fn hosts(flows: &[Value]) -> Vec<&str> {
        flows.iter().map(|f| f["host"].as_str().unwrap()).collect()
    }

    #[test]
    fn growth_and_a_partial_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        append(&p, "old\n");
        let mut f = Follower::at_end(&p).unwrap();
        assert!(f.poll().unwrap().is_empty(), "starts at the end");
        append(&p, "a\nb\nhalf");
        assert_eq!(text(f.poll().unwrap()), ["a", "b"], "the unterminated line is held");
        assert!(f.poll().unwrap().is_empty());
        append(&p, "-done\n");
        assert_eq!(text(f.poll().unwrap()), ["half-done"]);
        // Bigger than one read.
        let big: String = (0..5000).map(|i| flow(i) + "\n").collect();
        assert!(big.len() > 2 * READ);
        append(&p, &big);
        assert_eq!(f.poll().unwrap().len(), 5000);
    }

    #[test]
    fn a_missing_file_is_read_from_its_start_once_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        let mut f = Follower::at_end(&p).unwrap();
        assert!(f.poll().unwrap().is_empty());
        append(&p, "first\n");
        assert_eq!(text(f.poll().unwrap()), ["first"]);
    }

    #[test]
    fn rotation_by_rename_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        append(&p, "a\n");
        let mut f = Follower::from_start(&p).unwrap();
        assert_eq!(text(f.poll().unwrap()), ["a"]);
        // Written, then rotated, then the new file started, all between two
        // polls: the old file's last lines come first.
        append(&p, "b\n");
        std::fs::rename(&p, flowlog::rotated(&p)).unwrap();
        assert_eq!(text(f.poll().unwrap()), ["b"], "renamed, no new file yet: the old one is still read");
        append(&flowlog::rotated(&p), "c\n");
        append(&p, "d\n");
        assert_eq!(text(f.poll().unwrap()), ["c", "d"]);
        // A writer that has not noticed the rename is still read a while.
        append(&flowlog::rotated(&p), "late\n");
        append(&p, "e\n");
        assert_eq!(text(f.poll().unwrap()), ["late", "e"]);
        for _ in 0..RETIRE_POLLS {
            f.poll().unwrap();
        }
        append(&flowlog::rotated(&p), "too late\n");
        assert!(f.poll().unwrap().is_empty(), "retired files are let go");
        // Rotated again, replacing `.1`: the same again.
        append(&p, "f\n");
        std::fs::rename(&p, flowlog::rotated(&p)).unwrap();
        append(&p, "g\n");
        assert_eq!(text(f.poll().unwrap()), ["f", "g"]);
    }

    #[test]
    fn an_unterminated_line_is_given_when_its_file_is_rotated_away() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        let mut f = Follower::at_end(&p).unwrap();
        append(&p, "torn");
        assert!(f.poll().unwrap().is_empty());
        std::fs::rename(&p, flowlog::rotated(&p)).unwrap();
        append(&p, "new\n");
        assert_eq!(text(f.poll().unwrap()), ["torn", "new"]);
    }

    #[test]
    fn truncation_reads_again_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        append(&p, "aaaaaaaaaa\nbbbbbbbbbb\n");
        let mut f = Follower::at_end(&p).unwrap();
        std::fs::OpenOptions::new().write(true).truncate(true).open(&p).unwrap();
        append(&p, "c\n");
        assert_eq!(text(f.poll().unwrap()), ["c"]);
        append(&p, "d\n");
        assert_eq!(text(f.poll().unwrap()), ["d"]);
    }

    #[test]
    fn overlong_lines_are_dropped_not_held() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        let mut f = Follower::at_end(&p).unwrap();
        append(&p, &"x".repeat(MAX_LINE + 10));
        assert!(f.poll().unwrap().is_empty());
        assert_eq!(f.malformed, 1);
        append(&p, &format!("{}\nok\n", "x".repeat(MAX_LINE)));
        assert_eq!(text(f.poll().unwrap()), ["ok"]);
        assert!(f.current.as_ref().unwrap().partial.capacity() <= MAX_LINE + READ);
    }

    #[test]
    fn flows_are_filtered_parsed_and_scrubbed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        let mut f = Follower::at_end(&p).unwrap();
        append(&p, &format!("{}\n{{torn\n\n[1]\n{}\r\n", flow(1), flow(2)));
        append(&p, "{\"sandbox\":\"s1\",\"host\":\"q\",\"path\":\"/a?token=x#f\"}\n");
        let got = f.poll_flows(Some("s1")).unwrap();
        assert_eq!(hosts(&got), ["h1", "q"]);
        assert_eq!(got[1]["path"], "/a");
        assert_eq!(f.malformed, 2);
        append(&p, &format!("{}\n", flow(4)));
        assert_eq!(hosts(&f.poll_flows(None).unwrap()), ["h4"]);
    }

    #[test]
    fn backlog_ends_where_following_starts() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        append(&flowlog::rotated(&p), &(0..3).map(|i| flow(i) + "\n").collect::<String>());
        append(&p, &(3..6).map(|i| flow(i) + "\n").collect::<String>());
        let mut f = Follower::at_end(&p).unwrap();
        append(&p, &(6..8).map(|i| flow(i) + "\n").collect::<String>());
        assert_eq!(hosts(&f.backlog(2, None).unwrap()), ["h4", "h5"], "not the lines after the start");
        assert_eq!(hosts(&f.backlog(100, Some("s0")).unwrap()), ["h0", "h2", "h4"], "then the rotated file");
        assert!(f.backlog(0, None).unwrap().is_empty());
        assert_eq!(hosts(&f.poll_flows(None).unwrap()), ["h6", "h7"]);
        let none = Follower::at_end(&dir.path().join("nothing.jsonl")).unwrap();
        assert!(none.backlog(5, None).unwrap().is_empty());
    }

    #[test]
    fn sizes_and_durations_are_short() {
        let sizes: Vec<String> = [0, 512, 1023, 1024, 1536, 10 * 1024 - 1, 12 * 1024 * 1024, 3 << 30].map(size).into();
        assert_eq!(sizes, ["0B", "512B", "1023B", "1.0KiB", "1.5KiB", "10KiB", "12MiB", "3.0GiB"]);
        let times: Vec<String> = [0, 830, 999, 1000, 1349, 59_949, 59_950, 125_000, 3_720_000].map(duration).into();
        assert_eq!(times, ["0ms", "830ms", "999ms", "1.0s", "1.3s", "59.9s", "1m00s", "2m05s", "1h02m"]);
    }
}

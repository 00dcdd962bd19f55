//! Reading the end of `$PPP_DATA/flows.jsonl` for `ppp policy log`. The log
//! only grows until the addon rotates it (at 32 MiB, to `flows.jsonl.1`,
//! replacing the older one), so this reads backwards from the end in
//! fixed-size chunks and stops as soon as it has enough lines, going on into
//! the rotated file when the current one holds too few: `--limit 10` costs
//! one or two reads, not a scan.
//!
//! Read-only. Lines that are not JSON objects (a torn write, a hand edit) are
//! skipped and counted, never fatal: a log viewer that refuses to show
//! anything because of one bad line is no help.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

/// How much is read per step from the end.
pub const CHUNK: usize = 64 * 1024;

/// The result of [`tail_from`].
#[derive(Debug, Default)]
pub struct Tail {
    /// Matching flows, oldest first.
    pub flows: Vec<Value>,
    /// Lines looked at that were not JSON objects.
    pub malformed: usize,
    /// Bytes read from the source, to show the tail stayed a tail.
    pub bytes_read: u64,
}

/// Where the addon moves the log when it rotates it: `<path>.1`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// The last `limit` flows in the log at `path` and, when it holds fewer,
/// in its rotated predecessor ([`rotated`]), oldest first, only those of
/// `sandbox` when given. A missing log has no flows.
pub fn tail(path: &Path, limit: usize, sandbox: Option<&str>) -> Result<Vec<Value>> {
    let mut flows = tail_file(path, limit, sandbox)?;
    if flows.len() < limit {
        let mut older = tail_file(&rotated(path), limit - flows.len(), sandbox)?;
        older.append(&mut flows);
        flows = older;
    }
    Ok(flows)
}

/// [`tail`] of the one file at `path`, without its rotated predecessor.
pub fn tail_file(path: &Path, limit: usize, sandbox: Option<&str>) -> Result<Vec<Value>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("could not open `{}`", path.display())),
    };
    let t = tail_from(file, limit, sandbox).with_context(|| format!("could not read `{}`", path.display()))?;
    if t.malformed > 0 {
        tracing::warn!(path = %path.display(), skipped = t.malformed, "skipped malformed lines in the flow log");
    }
    Ok(t.flows)
}

/// [`tail`] over any seekable reader.
pub fn tail_from<R: Read + Seek>(mut r: R, limit: usize, sandbox: Option<&str>) -> io::Result<Tail> {
    let mut out = Tail::default();
    if limit == 0 {
        return Ok(out);
    }
    let mut pos = r.seek(SeekFrom::End(0))?;
    // Bytes of the line that straddles the chunk boundary: the start of the
    // file region not yet split into lines, kept until its newline is found.
    let mut carry: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    while pos > 0 && out.flows.len() < limit {
        let n = usize::try_from(pos.min(CHUNK as u64)).expect("at most CHUNK");
        pos -= n as u64;
        r.seek(SeekFrom::Start(pos))?;
        r.read_exact(&mut chunk[..n])?;
        out.bytes_read += n as u64;
        // Everything from this chunk plus the carried partial line.
        let mut buf = chunk[..n].to_vec();
        buf.append(&mut carry);
        // The first line may continue into the previous chunk unless we are
        // at the start of the file.
        let mut lines = buf.rsplit(|&b| b == b'\n');
        let mut complete: Vec<&[u8]> = Vec::new();
        let mut first_partial: Option<&[u8]> = None;
        while let Some(line) = lines.next() {
            if lines.size_hint().1 == Some(0) && pos > 0 {
                first_partial = Some(line);
            } else {
                complete.push(line);
            }
        }
        // rsplit's last item is the text before the first newline; whether
        // it is complete depends on `pos`, decided above.
        for line in complete {
            take(line, sandbox, &mut out);
            if out.flows.len() == limit {
                break;
            }
        }
        if let Some(p) = first_partial {
            carry = p.to_vec();
        }
    }
    out.flows.reverse();
    Ok(out)
}

fn take(line: &[u8], sandbox: Option<&str>, out: &mut Tail) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    match serde_json::from_slice::<Value>(line) {
        Ok(v @ Value::Object(_)) => {
            if sandbox.is_none_or(|s| v.get("sandbox").and_then(Value::as_str) == Some(s)) {
                out.flows.push(v);
            }
        }
        _ => out.malformed += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A reader that counts what is read through it.
    struct Counting<R> {
        inner: R,
        read: u64,
    }
    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n as u64;
            Ok(n)
        }
    }
    impl<R: Seek> Seek for Counting<R> {
        fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
            self.inner.seek(pos)
        }
    }

    fn flow(i: usize, sandbox: &str) -> String {
        format!(
            r#"{{"sandbox":"{sandbox}","timestamp":"2025-06-01T12:00:00Z","host":"h{i}.example.com","port":443,"method":"GET","status":200,"decision":"allow","matched_rule":null}}"#
        )
    }

    fn hosts(v: &[Value]) -> Vec<String> {
        v.iter().map(|f| f["host"].as_str().unwrap().to_owned()).collect()
    }

    #[test]
    fn last_lines_oldest_first() {
        let text: String = (0..10).map(|i| flow(i, "a") + "\n").collect();
        let t = tail_from(Cursor::new(text.as_bytes()), 3, None).unwrap();
        assert_eq!(hosts(&t.flows), ["h7.example.com", "h8.example.com", "h9.example.com"]);
        let t = tail_from(Cursor::new(text.as_bytes()), 100, None).unwrap();
        assert_eq!(t.flows.len(), 10);
        assert_eq!(t.flows[0]["host"], "h0.example.com");
        assert!(tail_from(Cursor::new(text.as_bytes()), 0, None).unwrap().flows.is_empty());
        assert!(tail_from(Cursor::new(b"".as_slice()), 5, None).unwrap().flows.is_empty());
    }

    #[test]
    fn no_trailing_newline_and_crlf() {
        let text = format!("{}\r\n{}", flow(1, "a"), flow(2, "a"));
        let t = tail_from(Cursor::new(text.as_bytes()), 5, None).unwrap();
        assert_eq!(hosts(&t.flows), ["h1.example.com", "h2.example.com"]);
        assert_eq!(t.malformed, 0);
    }

    #[test]
    fn filters_by_sandbox_and_skips_malformed() {
        let mut text = String::new();
        for i in 0..20 {
            text += &flow(i, if i % 2 == 0 { "even" } else { "odd" });
            text += "\n";
            if i % 5 == 0 {
                text += "{torn\n[1,2]\n";
            }
        }
        let t = tail_from(Cursor::new(text.as_bytes()), 3, Some("odd")).unwrap();
        assert_eq!(hosts(&t.flows), ["h15.example.com", "h17.example.com", "h19.example.com"]);
        assert_eq!(t.malformed, 2, "only the lines looked at are counted");
        let t = tail_from(Cursor::new(text.as_bytes()), 100, Some("none")).unwrap();
        assert!(t.flows.is_empty());
        assert_eq!(t.malformed, 8);
    }

    #[test]
    fn lines_straddling_chunks() {
        // Lines of varied length so boundaries fall everywhere, some longer
        // than a chunk.
        let mut lines = Vec::new();
        for i in 0..400 {
            let pad = "x".repeat((i * 7919) % (CHUNK / 20) + if i % 97 == 0 { CHUNK * 2 } else { 0 });
            lines.push(format!(r#"{{"sandbox":"s","host":"h{i}","pad":"{pad}"}}"#));
        }
        let text = lines.join("\n") + "\n";
        for limit in [1, 2, 50, 399, 400, 1000] {
            let t = tail_from(Cursor::new(text.as_bytes()), limit, None).unwrap();
            let want: Vec<String> = (400usize.saturating_sub(limit)..400).map(|i| format!("h{i}")).collect();
            assert_eq!(hosts(&t.flows), want, "limit {limit}");
            assert_eq!(t.malformed, 0);
        }
    }

    #[test]
    fn reads_only_the_tail_of_a_big_log() {
        let line = flow(0, "s") + "\n";
        let count = 50 * 1024 * 1024 / line.len() + 1;
        let mut text = line.repeat(count);
        text += &flow(1, "s");
        text.push('\n');
        assert!(text.len() > 50 * 1024 * 1024);
        let mut r = Counting { inner: Cursor::new(text.as_bytes()), read: 0 };
        let t = tail_from(&mut r, 10, Some("s")).unwrap();
        assert_eq!(t.flows.len(), 10);
        assert_eq!(t.flows[9]["host"], "h1.example.com");
        assert_eq!(r.read, CHUNK as u64, "one chunk holds ten lines");
        assert_eq!(t.bytes_read, r.read);
    }

    #[test]
    fn reads_on_into_the_rotated_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        // Rotated away with nothing written since: everything is in `.1`.
        std::fs::write(rotated(&p), (0..5).map(|i| flow(i, "a") + "\n").collect::<String>()).unwrap();
        assert_eq!(tail(&p, 2, None).unwrap().len(), 2);
        std::fs::write(&p, (5..8).map(|i| flow(i, if i == 6 { "b" } else { "a" }) + "\n").collect::<String>()).unwrap();
        let hosts = |v: Vec<Value>| hosts(&v);
        assert_eq!(hosts(tail(&p, 2, None).unwrap()), ["h6.example.com", "h7.example.com"], "the current file first");
        assert_eq!(
            hosts(tail(&p, 4, Some("a")).unwrap()),
            ["h3.example.com", "h4.example.com", "h5.example.com", "h7.example.com"],
            "then the rotated one, oldest first"
        );
        assert_eq!(tail(&p, 100, None).unwrap().len(), 8);
        assert_eq!(rotated(&p), dir.path().join("flows.jsonl.1"));
    }

    #[test]
    fn missing_file_is_empty_and_real_file_works() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flows.jsonl");
        assert!(tail(&p, 10, None).unwrap().is_empty());
        std::fs::write(&p, flow(1, "a") + "\n" + &flow(2, "b") + "\n").unwrap();
        assert_eq!(hosts(&tail(&p, 10, Some("a")).unwrap()), ["h1.example.com"]);
    }
}

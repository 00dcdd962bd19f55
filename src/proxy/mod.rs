//! The host proxy: one mitmdump in WireGuard mode supervised by the ppp
//! daemon. [`socket`] is the daemon's side of `$PPP_DATA/secret.sock`,
//! [`protocol`] its wire format; this file holds the client side that
//! state-changing commands use to ask for a reload.

pub mod approvals;
pub mod dns;
pub mod protocol;
pub mod resolve;
pub mod socket;
pub mod status;
pub mod supervisor;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::dirs::Dirs;

pub mod clientconf;
pub mod endpoint;
pub mod mitmdump;
pub mod trust;

/// How long a CLI command waits for the daemon to acknowledge a reload.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(2);

/// What became of a reload request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// No daemon is listening; the next start reads the new state anyway.
    NoDaemon,
    /// The daemon acknowledged.
    Done,
    /// A daemon is there but did not acknowledge; the message says why.
    Failed(String),
}

/// Ask a running daemon to reload policy and secrets. Without a daemon this
/// is a no-op: there is nothing holding stale state.
pub fn notify_reload(dirs: &Dirs) -> Reload {
    let path = dirs.secret_socket();
    let Ok(mut stream) = UnixStream::connect(&path) else {
        return Reload::NoDaemon;
    };
    let mut attempt = || -> std::io::Result<String> {
        stream.set_read_timeout(Some(RELOAD_TIMEOUT))?;
        stream.set_write_timeout(Some(RELOAD_TIMEOUT))?;
        stream.write_all(b"{\"op\":\"reload\"}\n")?;
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line)?;
        Ok(line)
    };
    match attempt().map(|line| (protocol::Response::parse(&line), line)) {
        Ok((Ok((r, _)), _)) if r.is_ok() => Reload::Done,
        Ok((Ok((protocol::Response::Error { detail: Some(d), .. }, _)), _)) => Reload::Failed(d),
        Ok((_, line)) => Reload::Failed(format!("the daemon answered `{}`", line.trim())),
        Err(e) => Reload::Failed(e.to_string()),
    }
}

/// One request to the running daemon and its reply. `Ok(None)` when no
/// daemon listens.
pub fn ask_daemon(dirs: &Dirs, request: &protocol::Request) -> anyhow::Result<Option<protocol::Response>> {
    use anyhow::Context as _;
    let path = dirs.secret_socket();
    let Ok(mut stream) = UnixStream::connect(&path) else {
        return Ok(None);
    };
    stream.set_read_timeout(Some(RELOAD_TIMEOUT))?;
    stream.set_write_timeout(Some(RELOAD_TIMEOUT))?;
    let mut line = serde_json::to_string(request)?;
    line.push('\n');
    stream.write_all(line.as_bytes()).with_context(|| format!("could not write to `{}`", path.display()))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .with_context(|| format!("the daemon at `{}` did not answer", path.display()))?;
    let (r, _) =
        protocol::Response::parse(&reply).with_context(|| format!("the daemon answered `{}`", reply.trim()))?;
    Ok(Some(r))
}

/// The requests the running daemon holds for approval; `None` when no
/// daemon runs (then nothing can be held).
pub fn approvals(dirs: &Dirs) -> anyhow::Result<Option<Vec<protocol::Pending>>> {
    match ask_daemon(dirs, &protocol::Request::Approvals)? {
        None => Ok(None),
        Some(protocol::Response::Approvals(p)) => Ok(Some(p)),
        Some(other) => Err(unexpected(&other)),
    }
}

/// Answer held entry `id` in the running daemon: how many requests it
/// released, `Ok(None)` when no such entry waits (answered, timed out, its
/// client gone).
pub fn answer(dirs: &Dirs, id: &str, verdict: crate::policy::Verdict) -> anyhow::Result<Option<usize>> {
    let req = protocol::Request::Answer { approval: id.to_owned(), verdict };
    match ask_daemon(dirs, &req)? {
        Some(protocol::Response::Released(n)) => Ok(Some(n)),
        Some(protocol::Response::Error { reason: protocol::Reason::NotPending, .. }) => Ok(None),
        Some(other) => Err(unexpected(&other)),
        None => Err(crate::error::fail("the daemon is not running, so nothing is held")
            .hint("`ppp daemon status` shows it; held requests end with the daemon")
            .into()),
    }
}

/// A reply of the wrong kind: most likely an older daemon.
pub fn unexpected(r: &protocol::Response) -> anyhow::Error {
    crate::error::fail(format!("the daemon gave an unexpected answer: {}", r.to_line(None).trim()))
        .hint("the daemon may be an older ppp; restart it with `ppp daemon stop && ppp daemon start -d`")
        .into()
}

/// [`notify_reload`], reporting a failure as a warning on stderr: the
/// change itself is already saved, so it must not turn into an error.
pub fn reload_or_warn(dirs: &Dirs) {
    if let Reload::Failed(why) = notify_reload(dirs) {
        eprintln!("warning: the change is saved, but the running daemon did not reload: {why}");
        eprintln!("hint: restart it with `ppp daemon stop && ppp daemon start -d`");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn dirs(tmp: &std::path::Path) -> Dirs {
        Dirs { config: tmp.join("c"), data: tmp.to_owned(), cache: tmp.join("k") }
    }

    #[test]
    fn no_socket_is_no_daemon() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(notify_reload(&dirs(tmp.path())), Reload::NoDaemon);
    }

    #[test]
    fn reload_is_acknowledged() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        let listener = UnixListener::bind(d.secret_socket()).unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            (&s).write_all(b"{\"ok\":true}\n").unwrap();
            line
        });
        assert_eq!(notify_reload(&d), Reload::Done);
        assert_eq!(server.join().unwrap(), "{\"op\":\"reload\"}\n");
    }
}

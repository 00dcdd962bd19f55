//! The one place ppp spawns processes. Other modules build an
//! [`Invocation`] (pure data, snapshot-testable) and hand it here.
//!
//! Failures become a typed [`ExecError`] carrying the child's stderr, so a
//! caller can tell "not installed" from "ran and failed".

use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A command to run, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    /// Give up and kill the child after this long.
    pub timeout: Option<Duration>,
    /// Where the child's standard input comes from.
    pub stdin: Stdin,
}

/// A child's standard input.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Stdin {
    /// `/dev/null`: the default, so no child ever waits on a terminal.
    #[default]
    Null,
    /// The contents of a file.
    File(PathBuf),
    /// This process's own standard input (interactive commands).
    Inherit,
}

impl Invocation {
    /// An invocation of `program` with no arguments.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self { program: program.into(), args: Vec::new(), env: Vec::new(), timeout: None, stdin: Stdin::Null }
    }

    /// Append one argument.
    #[must_use]
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Append arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Set an environment variable for the child.
    #[must_use]
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Kill the child if it runs longer than `t`.
    #[must_use]
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Feed the child's standard input from `stdin`.
    #[must_use]
    pub fn stdin(mut self, stdin: Stdin) -> Self {
        self.stdin = stdin;
        self
    }

    fn stdin_stdio(&self) -> std::io::Result<Stdio> {
        Ok(match &self.stdin {
            Stdin::Null => Stdio::null(),
            Stdin::Inherit => Stdio::inherit(),
            Stdin::File(p) => Stdio::from(std::fs::File::open(p)?),
        })
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }
}

impl fmt::Display for Invocation {
    /// The command line as a user would type it, for error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.program.file_name().map_or_else(|| self.program.as_os_str().to_owned(), ToOwned::to_owned);
        write!(f, "{}", name.to_string_lossy())?;
        for a in &self.args {
            write!(f, " {}", a.to_string_lossy())?;
        }
        Ok(())
    }
}

/// What a finished child left behind.
#[derive(Debug, Clone)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// Why a child did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("`{program}` was not found", program = program.display())]
    NotFound { program: PathBuf },
    #[error("could not run `{command}`: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("`{command}` exited with {status}{}", stderr_suffix(stderr))]
    Failed { command: String, status: String, stderr: String },
    #[error("`{command}` did not finish within {secs} s", secs = timeout.as_secs())]
    TimedOut { command: String, timeout: Duration },
    #[error("`{command}` printed nothing for {secs} s", secs = quiet.as_secs())]
    Silent { command: String, quiet: Duration },
}

fn stderr_suffix(stderr: &str) -> String {
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    if last.is_empty() { String::new() } else { format!(": {}", last.trim()) }
}

/// Run `inv` to completion, capturing stdout and stderr. Non-zero exit is an
/// error.
pub fn run(inv: &Invocation) -> Result<Output, ExecError> {
    let (code, out) = output(inv)?;
    if code == 0 {
        Ok(out)
    } else {
        let status = if code > 128 { "a signal".to_owned() } else { format!("status {code}") };
        Err(ExecError::Failed { command: inv.to_string(), status, stderr: out.stderr })
    }
}

/// The most of a child's stdout (and, separately, stderr) that `output`
/// keeps. Some children print what a guest chose (`podman machine ssh …
/// provision.sh verify` runs in the VM, where root can print anything):
/// what is past this is read and dropped, so the child never blocks and
/// ppp's memory stays bounded. Nothing ppp captures legitimately comes near
/// it; content (`ppp cp`) goes to files, never through a capture.
pub const CAPTURE_MAX: usize = 8 << 20;

/// Everything `r` gives until EOF, keeping the first `cap` bytes.
fn read_capped(r: &mut impl Read, cap: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let _ = r.by_ref().take(cap as u64).read_to_end(&mut kept);
    let dropped = std::io::copy(r, &mut std::io::sink()).unwrap_or(0);
    if dropped > 0 {
        tracing::warn!("a child printed {dropped} bytes past the {cap}-byte capture limit; they were dropped");
    }
    kept
}

/// Run `inv` to completion and return its exit code (128 + the signal
/// number when a signal ended it) with what it printed; a non-zero exit is
/// not an error here.
pub fn output(inv: &Invocation) -> Result<(i32, Output), ExecError> {
    // Arguments are shown in error messages already; env values (which
    // may hold secrets) are not logged.
    tracing::debug!("running `{inv}`");
    let command = inv.to_string();
    let mut child = spawn_retrying(|| {
        inv.command().stdin(inv.stdin_stdio()?).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()
    })
    .map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ExecError::NotFound { program: inv.program.clone() },
        _ => ExecError::Spawn { command: command.clone(), source },
    })?;
    // Drain both pipes on threads so a chatty child cannot block on a full
    // pipe while we wait on it.
    let mut out_pipe = child.stdout.take().expect("piped");
    let mut err_pipe = child.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || read_capped(&mut out_pipe, CAPTURE_MAX));
    let err_t = std::thread::spawn(move || read_capped(&mut err_pipe, CAPTURE_MAX));
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(source) => return Err(ExecError::Spawn { command, source }),
        }
        if let Some(t) = inv.timeout
            && start.elapsed() > t
        {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ExecError::TimedOut { command, timeout: t });
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_t.join().unwrap_or_default()).into_owned();
    let code = {
        use std::os::unix::process::ExitStatusExt;
        status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
    };
    Ok((code, Output { stdout, stderr }))
}

/// Run `inv` to completion and return its exit code, the first `cap` bytes
/// of its stdout and whether it printed more. Its stderr goes to
/// `/dev/null` unread: for a command that prints a secret (a
/// `--command` secret), whatever it says there may hold one too.
pub fn stdout_capped(inv: &Invocation, cap: usize) -> Result<(i32, Vec<u8>, bool), ExecError> {
    tracing::debug!("running `{}`", inv.program.display());
    let command = inv.program.display().to_string();
    let mut child =
        spawn_retrying(|| inv.command().stdin(inv.stdin_stdio()?).stdout(Stdio::piped()).stderr(Stdio::null()).spawn())
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::NotFound => ExecError::NotFound { program: inv.program.clone() },
                _ => ExecError::Spawn { command: command.clone(), source },
            })?;
    let mut out_pipe = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let _ = out_pipe.by_ref().take(cap as u64).read_to_end(&mut kept);
        // Drained, so the child never blocks on a full pipe; dropped.
        let more = std::io::copy(&mut out_pipe, &mut std::io::sink()).unwrap_or(0) > 0;
        let _ = tx.send((kept, more));
    });
    let start = Instant::now();
    let status = wait_with_timeout(&mut child, inv.timeout, &command)?;
    // A grandchild left running can hold stdout open after the child
    // exits: the timeout bounds the wait for it too.
    let left = inv.timeout.map_or(Duration::from_secs(3600), |t| t.saturating_sub(start.elapsed()));
    match rx.recv_timeout(left.max(Duration::from_millis(100))) {
        Ok((kept, more)) => Ok((status, kept, more)),
        Err(_) => Err(ExecError::TimedOut { command, timeout: inv.timeout.unwrap_or_default() }),
    }
}

/// Run `inv` with stdout and stderr appended to `log`, and return its exit
/// code (128 + the signal number when a signal ended it). A non-zero code
/// is not an error here: the caller reads the log to say what failed.
pub fn run_to_log(inv: &Invocation, log: &std::fs::File) -> Result<i32, ExecError> {
    run_to_file(inv, log, log)
}

/// Run `inv` with its stdout written to `out` (a file being copied out of
/// a machine over ssh, where podman has no `machine cp`) and its stderr
/// appended to `log`; returns the exit code as [`run_to_log`] does.
pub fn run_to_file(inv: &Invocation, out: &std::fs::File, log: &std::fs::File) -> Result<i32, ExecError> {
    tracing::debug!("running `{inv}`");
    let command = inv.to_string();
    let io = |f: &std::fs::File| f.try_clone().map_err(|source| ExecError::Spawn { command: command.clone(), source });
    let (out, err) = (io(out)?, io(log)?);
    let mut child = spawn_retrying(|| {
        inv.command().stdin(inv.stdin_stdio()?).stdout(out.try_clone()?).stderr(err.try_clone()?).spawn()
    })
    .map_err(|source| spawn_error(inv, &command, source))?;
    wait_with_timeout(&mut child, inv.timeout, &command)
}

/// How [`run_to_log_watched`] tells a live child from a lost one.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// Kill the child once it has printed nothing for this long.
    pub quiet: Duration,
    /// A line the child prints only to show it is alive: it counts as
    /// output but is not written to the log.
    pub heartbeat: &'static str,
}

/// The longest line [`run_to_log_watched`] holds back while it waits for the
/// newline; past it the bytes go to the log as they are (a child that prints
/// what a guest chose cannot grow ppp's memory).
const WATCH_LINE_MAX: usize = 64 << 10;

/// [`run_to_log`] for a child whose silence means it is lost: a command in
/// the VM over ssh whose connection no longer carries packets, which ssh may
/// take a quarter of an hour to notice. The child prints a heartbeat line
/// while it works; once nothing at all came for `watch.quiet`, it is killed
/// and this returns [`ExecError::Silent`].
pub fn run_to_log_watched(inv: &Invocation, log: &std::fs::File, watch: Watch) -> Result<i32, ExecError> {
    use std::os::unix::process::ExitStatusExt;
    use std::sync::{Arc, Mutex};
    tracing::debug!("running `{inv}`");
    let command = inv.to_string();
    let io = |f: &std::fs::File| f.try_clone().map_err(|source| ExecError::Spawn { command: command.clone(), source });
    let mut child = spawn_retrying(|| {
        inv.command().stdin(inv.stdin_stdio()?).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()
    })
    .map_err(|source| spawn_error(inv, &command, source))?;
    let last = Arc::new(Mutex::new(Instant::now()));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let pipes: [Box<dyn Read + Send>; 2] =
        [Box::new(child.stdout.take().expect("piped")), Box::new(child.stderr.take().expect("piped"))];
    for mut pipe in pipes {
        let (last, done, mut out) = (Arc::clone(&last), done_tx.clone(), io(log)?);
        std::thread::spawn(move || {
            copy_lines(&mut pipe, &mut out, watch.heartbeat.as_bytes(), &last);
            drop(done);
        });
    }
    drop(done_tx);
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(source) => return Err(ExecError::Spawn { command, source }),
        }
        let silent = last.lock().is_ok_and(|t| t.elapsed() > watch.quiet);
        let timed_out = inv.timeout.is_some_and(|t| start.elapsed() > t);
        if silent || timed_out {
            let _ = child.kill();
            let _ = child.wait();
            return Err(if timed_out {
                ExecError::TimedOut { command, timeout: inv.timeout.unwrap_or_default() }
            } else {
                ExecError::Silent { command, quiet: watch.quiet }
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // What the child printed last is in the log before the caller reads it;
    // a grandchild that kept the pipes open is not waited for long.
    let _ = done_rx.recv_timeout(Duration::from_secs(2));
    let _ = done_rx.recv_timeout(Duration::from_secs(2));
    Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// Copy `r` to `out` line by line, dropping lines equal to `heartbeat`, and
/// note in `last` when anything came.
fn copy_lines(r: &mut impl Read, out: &mut impl std::io::Write, heartbeat: &[u8], last: &std::sync::Mutex<Instant>) {
    let mut buf = [0u8; 8192];
    let mut line = Vec::new();
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Ok(mut t) = last.lock() {
            *t = Instant::now();
        }
        for &b in &buf[..n] {
            line.push(b);
            if b == b'\n' || line.len() >= WATCH_LINE_MAX {
                if line.strip_suffix(b"\n") != Some(heartbeat) {
                    let _ = out.write_all(&line);
                }
                line.clear();
            }
        }
    }
    if !line.is_empty() {
        let _ = out.write_all(&line);
    }
}

/// Run `inv` on this terminal (standard input, output and error inherited)
/// and return its exit code. While it runs, Ctrl-C is left to the child:
/// the terminal sends SIGINT to the whole foreground process group, and ppp
/// must outlive the child to pass its exit code on.
pub fn run_attached(inv: &Invocation) -> Result<i32, ExecError> {
    tracing::debug!("running `{inv}`");
    let command = inv.to_string();
    // A handler (not SIG_IGN, which exec would pass on) keeps ppp alive;
    // exec resets handlers, so the child still dies on Ctrl-C.
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let id = signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted).ok();
    let mut spawned = spawn_retrying(|| inv.command().stdin(inv.stdin_stdio()?).spawn())
        .map_err(|source| spawn_error(inv, &command, source));
    let code = match &mut spawned {
        Ok(child) => wait_with_timeout(child, inv.timeout, &command),
        Err(_) => Ok(0),
    };
    if let Some(id) = id {
        signal_hook::low_level::unregister(id);
    }
    spawned?;
    code
}

fn spawn_error(inv: &Invocation, command: &str, source: std::io::Error) -> ExecError {
    match source.kind() {
        std::io::ErrorKind::NotFound => ExecError::NotFound { program: inv.program.clone() },
        _ => ExecError::Spawn { command: command.to_owned(), source },
    }
}

fn wait_with_timeout(
    child: &mut std::process::Child,
    timeout: Option<Duration>,
    command: &str,
) -> Result<i32, ExecError> {
    use std::os::unix::process::ExitStatusExt;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(source) => return Err(ExecError::Spawn { command: command.to_owned(), source }),
        }
        if let Some(t) = timeout
            && start.elapsed() > t
        {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ExecError::TimedOut { command: command.to_owned(), timeout: t });
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// Start `inv` as a long-running child with stdout and stderr appended to
/// `log`, in a process group of its own so a terminal's Ctrl-C reaches only
/// its supervisor, which stops it in order. Killed if the handle is dropped.
pub fn spawn_logged(inv: &Invocation, log: &std::fs::File) -> Result<tokio::process::Child, ExecError> {
    tracing::debug!("running `{inv}`");
    let command = inv.to_string();
    let io = |f: &std::fs::File| f.try_clone().map_err(|source| ExecError::Spawn { command: command.clone(), source });
    let mut c = tokio::process::Command::from(inv.command());
    c.stdin(Stdio::null()).stdout(io(log)?).stderr(io(log)?).process_group(0).kill_on_drop(true);
    c.spawn().map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ExecError::NotFound { program: inv.program.clone() },
        _ => ExecError::Spawn { command, source },
    })
}

/// Start `inv` detached from this process: its own process group, no
/// stdin, output appended to `log`. Used for `ppp daemon start -d`.
pub fn spawn_detached(inv: &Invocation, log: &std::fs::File) -> Result<std::process::Child, ExecError> {
    use std::os::unix::process::CommandExt;
    tracing::debug!("running `{inv}`");
    let command = inv.to_string();
    let io = |f: &std::fs::File| f.try_clone().map_err(|source| ExecError::Spawn { command: command.clone(), source });
    let mut c = inv.command();
    c.stdin(Stdio::null()).stdout(io(log)?).stderr(io(log)?).process_group(0);
    c.spawn().map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ExecError::NotFound { program: inv.program.clone() },
        _ => ExecError::Spawn { command, source },
    })
}

/// Spawn, retrying briefly on `ETXTBSY`. A script that was just written
/// can still be open for writing in a child that another thread forked and
/// has not yet exec'd; exec of the script then fails with "text file busy"
/// for a moment, though nothing is wrong with it.
fn spawn_retrying<T>(mut spawn: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let mut tries = 0;
    loop {
        match spawn() {
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32) && tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// Find `name` on `PATH`, like a shell would.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| is_executable(p))
}

/// The program to use for a tool: the override variable if set, else `PATH`.
pub fn resolve_program(override_var: &str, name: &str) -> Option<PathBuf> {
    match std::env::var_os(override_var).filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None => find_on_path(name),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_capped_keeps_the_first_bytes_and_bounds_the_wait() {
        let inv = Invocation::new("/bin/sh").args(["-c", "echo tok; echo oops >&2"]).timeout(Duration::from_secs(5));
        let (code, out, more) = stdout_capped(&inv, 64).unwrap();
        assert_eq!((code, out.as_slice(), more), (0, &b"tok\n"[..], false));
        let inv = Invocation::new("/bin/sh").args(["-c", "head -c 100 /dev/zero; exit 4"]);
        let (code, out, more) = stdout_capped(&inv, 10).unwrap();
        assert_eq!((code, out.len(), more), (4, 10, true));
        // A grandchild that keeps stdout open past the child's exit.
        let inv = Invocation::new("/bin/sh").args(["-c", "sleep 5 & echo tok"]).timeout(Duration::from_millis(300));
        assert!(matches!(stdout_capped(&inv, 64), Err(ExecError::TimedOut { .. })));
    }

    #[test]
    fn captures_output_and_failure() {
        let ok = run(&Invocation::new("/bin/sh").args(["-c", "echo out; echo err >&2"])).unwrap();
        assert_eq!(ok.stdout, "out\n");
        assert_eq!(ok.stderr, "err\n");
        let err = run(&Invocation::new("/bin/sh").args(["-c", "echo boom >&2; exit 3"])).unwrap_err();
        assert_eq!(err.to_string(), "`sh -c echo boom >&2; exit 3` exited with status 3: boom");
        let err = run(&Invocation::new("/nonexistent/podman")).unwrap_err();
        assert!(matches!(err, ExecError::NotFound { .. }), "{err}");
    }

    /// What a hostile guest does to `provision.sh verify`'s report: print
    /// without end. ppp keeps `CAPTURE_MAX` bytes, reads the rest to EOF (the
    /// child finishes instead of blocking on a full pipe) and drops it.
    #[test]
    fn captured_output_is_capped_and_the_child_still_finishes() {
        let flood = "head -c 40000000 /dev/zero; head -c 20000000 /dev/zero >&2; echo done >&2";
        let (code, out) = output(&Invocation::new("/bin/sh").args(["-c", flood])).unwrap();
        assert_eq!(code, 0);
        assert_eq!(out.stdout.len(), CAPTURE_MAX);
        assert_eq!(out.stderr.len(), CAPTURE_MAX);
        let small = read_capped(&mut &b"abc"[..], 2);
        assert_eq!(small, b"ab");
    }

    #[test]
    fn times_out() {
        let err = run(&Invocation::new("/bin/sleep").arg("5").timeout(Duration::from_millis(100))).unwrap_err();
        assert!(matches!(err, ExecError::TimedOut { .. }), "{err}");
    }

    /// A session that goes quiet (the lost-ssh case: the child neither exits
    /// nor prints) is given up on after `quiet`, long before its timeout;
    /// heartbeats keep a busy one alive and stay out of the log.
    #[test]
    fn a_silent_child_is_lost_and_heartbeats_keep_one_alive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let watch = Watch { quiet: Duration::from_secs(1), heartbeat: "alive" };
        let silent =
            Invocation::new("/bin/sh").args(["-c", "echo step 4; exec sleep 600"]).timeout(Duration::from_secs(600));
        let err = run_to_log_watched(&silent, &log, watch).unwrap_err();
        assert!(matches!(err, ExecError::Silent { .. }), "{err}");
        // 3 s in all, past the 2-s limit, never silent for more than 0.3 s.
        let busy = Invocation::new("/bin/sh")
            .args(["-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo alive; sleep 0.3; done; echo done"]);
        assert_eq!(run_to_log_watched(&busy, &log, Watch { quiet: Duration::from_secs(2), ..watch }).unwrap(), 0);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "step 4\ndone\n");
    }
}

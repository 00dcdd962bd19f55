//! The daemon's socket server: `$PPP_DATA/secret.sock`, which the mitmproxy
//! addon asks for policy decisions and for the headers to inject, and which
//! CLI commands ask to reload. Owns binding the socket safely, checking the
//! peer, framing, and the policy engine the daemon answers with
//! ([`State`]). The wire types live in [`super::protocol`]; the secrets
//! themselves in [`crate::secret::Store`], read on every request.
//!
//! It must never let a bad client take it down: every failure on one
//! connection ends at most that connection, and is never a panic. It must
//! never log or echo a secret value.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::task::JoinSet;

use super::approvals::{Approvals, Key, Outcome, Wake};
use super::protocol::{self, Held, HeldOutcome, MAX_LINE, MatchedRule, Reason, Request, Response};
use crate::dirs::Dirs;
use crate::error::fail;
use crate::policy::{self, Engine, Flow, Verdict};
use crate::secret::{self, Store};
use crate::usage::{
    self,
    budget::{self, Budgets, Raises},
    price::Prices,
    provider::Providers,
    record::Record,
    totals::Totals,
};

/// How long a connection may sit without completing a request line. The
/// addon's persistent connection sends often; one that goes quiet is
/// reopened on its next request, which costs a fraction of a millisecond.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// `sun_path` in `struct sockaddr_un` is 108 bytes on Linux (104 on macOS)
/// and holds a NUL-terminated path, so a longer path cannot be bound at all;
/// std reports that as a bare `InvalidInput`, which says nothing about what
/// to change.
const SUN_PATH_MAX: usize = if cfg!(target_os = "linux") { 107 } else { 103 };

/// A bound, private socket, ready for [`serve`].
#[derive(Debug)]
pub struct Listener {
    inner: std::os::unix::net::UnixListener,
    path: PathBuf,
    /// The socket file's inode, so cleanup never removes a successor's file.
    ino: u64,
}

impl Listener {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Bind `$PPP_DATA/secret.sock` with mode 0600 inside a 0700 `$PPP_DATA`.
///
/// Refuses when another server answers on the path; a socket file nobody
/// answers on is left over from a crash and is replaced. Needs no runtime.
pub fn bind(dirs: &Dirs) -> Result<Listener> {
    let path = dirs.secret_socket();
    let len = path.as_os_str().len();
    if len > SUN_PATH_MAX {
        return Err(fail(format!(
            "the daemon socket path `{}` is {len} bytes, longer than the {SUN_PATH_MAX} a Unix socket path may have",
            path.display()
        ))
        .hint("set `PPP_DATA` to a shorter directory, such as `~/.ppp-data`")
        .into());
    }
    // The directory is made private *before* the socket exists: bind creates
    // the file with the process umask (typically 0755 → reachable by all),
    // and the chmod to 0600 below comes after. Inside a 0700 directory that
    // window is harmless, because nobody else can even reach the path. A
    // temporary umask would close it too, but umask is process-wide and
    // would race every other thread creating files.
    crate::state::tighten_dir(&dirs.data)?;
    let meta = std::fs::metadata(&dirs.data).with_context(|| format!("could not inspect `{}`", dirs.data.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(fail(format!(
            "`{}` must be owned by uid {me} with mode 0700 to hold the daemon socket",
            dirs.data.display()
        ))
        .hint(format!("check `ls -ld {}`", dirs.data.display()))
        .into());
    }
    remove_stale(&path)?;
    let inner = std::os::unix::net::UnixListener::bind(&path)
        .with_context(|| format!("could not listen on `{}`", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("could not make `{}` private (mode 0600)", path.display()))?;
    inner.set_nonblocking(true).context("could not make the daemon socket non-blocking")?;
    let ino = std::fs::symlink_metadata(&path).map(|m| m.ino()).unwrap_or_default();
    tracing::debug!("listening on `{}`", path.display());
    Ok(Listener { inner, path, ino })
}

/// Remove a socket file left by a daemon that died, but never one a live
/// server answers on, and never anything that is not a socket.
fn remove_stale(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("could not inspect `{}`", path.display())),
    };
    if !meta.file_type().is_socket() {
        return Err(fail(format!("`{}` exists and is not a socket", path.display()))
            .hint("move it away; ppp does not delete files it did not create")
            .into());
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(fail(format!("another ppp daemon is already serving `{}`", path.display()))
            .hint("stop it with `ppp daemon stop`, or check it with `ppp daemon status`")
            .into()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::debug!("removing the stale socket `{}`", path.display());
            std::fs::remove_file(path).with_context(|| format!("could not remove stale socket `{}`", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("could not check whether `{}` is in use", path.display())),
    }
}

/// The compiled policy and the generation it belongs to, swapped whole.
#[derive(Debug)]
struct Snapshot {
    generation: u64,
    engine: Arc<Engine>,
    /// The LLM providers whose responses are metered (issue 27), re-read
    /// with the policy.
    providers: Arc<Providers>,
    /// budgets.yaml (ADR 0055), re-read with the policy: `ppp policy
    /// budget set` reloads, so a change applies to the next request.
    budgets: Arc<Budgets>,
    /// The price tables a cost budget's totals are priced with.
    prices: Arc<Prices>,
}

/// usage.jsonl and the sums a budget is checked against, under one lock:
/// a line is counted in the totals exactly when it is written.
#[derive(Debug)]
struct Metered {
    log: usage::log::Log,
    totals: Totals,
    /// The user's price file as the totals were priced with it (`None`:
    /// none), so a reload re-reads the log only when prices changed.
    priced_with: Option<String>,
}

impl Metered {
    /// The totals of the log at `path`, priced with `prices`, as of now.
    fn totals(path: &Path, prices: &Prices) -> Result<Totals> {
        let (totals, malformed) = Totals::from_log(path, today(), &|r: &Record| prices.usd(r))?;
        if malformed > 0 {
            tracing::warn!("`{}`: {malformed} lines skipped, not usage records", path.display());
        }
        Ok(totals)
    }
}

/// The UTC day now.
fn today() -> time::Date {
    time::OffsetDateTime::now_utc().date()
}

/// What the server answers from: the policy engine, shared and swapped on
/// reload, and the secret store.
#[derive(Debug)]
pub struct State {
    dirs: Dirs,
    store: Arc<Store>,
    /// Readers clone the `Arc` and let go at once; a rebuild happens outside
    /// the lock and only the swap takes it, so a decision never waits for a
    /// rebuild.
    snapshot: RwLock<Arc<Snapshot>>,
    /// Serialises rebuilds so two reloads cannot swap in the wrong order.
    rebuilding: Mutex<()>,
    /// Last generation handed out; starts at 1.
    generation: AtomicU64,
    /// Distinguishes this daemon's generations from an earlier daemon's.
    epoch: String,
    /// Carries each new generation to the supervisor, which then brings
    /// mitmdump's WireGuard servers in line with the port registry.
    reloaded: tokio::sync::watch::Sender<u64>,
    /// The names each sandbox resolved through ppp, and the host's lookups.
    pub resolutions: super::resolve::Resolutions,
    /// Requests an `ask` default holds for the user.
    pub approvals: Approvals,
    /// `$PPP_DATA/usage.jsonl`, which only this daemon writes, and its
    /// totals.
    usage: Arc<Mutex<Metered>>,
    /// The one-time raises approvals of budget holds granted; in memory
    /// only (a restart forgets them), pruned on every reload.
    raises: Mutex<Raises>,
}

impl State {
    /// Load the policy files and keep `store`. A malformed policy file is an
    /// error naming the file and line: a daemon should not start on a policy
    /// it cannot read.
    pub fn new(dirs: Dirs, store: Store) -> Result<State> {
        Self::with_usage_limit(dirs, store, usage::log::MAX_BYTES)
    }

    /// [`State::new`] with usage.jsonl compacted past `usage_bytes`.
    pub fn with_usage_limit(dirs: Dirs, store: Store, usage_bytes: u64) -> Result<State> {
        let engine = policy::load_engine(&dirs)?;
        let providers = Providers::load(&dirs)?;
        let budgets = budget::load(&dirs.budgets())?;
        let prices = usage::price::load(&dirs)?;
        let log = usage::log::Log::open(&dirs.usage_log(), usage_bytes)?;
        let totals = Metered::totals(&dirs.usage_log(), &prices)?;
        let priced_with = crate::state::read_optional(&dirs.usage_prices())?;
        let epoch = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
        );
        let state = State {
            dirs,
            store: Arc::new(store),
            snapshot: RwLock::new(Arc::new(Snapshot {
                generation: 1,
                engine: Arc::new(engine),
                providers: Arc::new(providers),
                budgets: Arc::new(budgets),
                prices: Arc::new(prices),
            })),
            rebuilding: Mutex::new(()),
            generation: AtomicU64::new(1),
            epoch,
            reloaded: tokio::sync::watch::Sender::new(1),
            resolutions: super::resolve::Resolutions::default(),
            approvals: Approvals::default(),
            usage: Arc::new(Mutex::new(Metered { log, totals, priced_with })),
            raises: Mutex::new(Raises::default()),
        };
        state.publish(1)?;
        Ok(state)
    }

    /// Write `$PPP_DATA/generation`: this daemon's epoch and the generation.
    /// The addon reads it (a few microseconds) before every cached answer,
    /// so a change applies to the very next request rather than after its
    /// next poll of the socket; the epoch keeps a restarted daemon's
    /// generation 1 from matching an old one.
    fn publish(&self, generation: u64) -> Result<()> {
        crate::state::write_atomic(&self.dirs.generation_file(), format!("{}.{generation}\n", self.epoch).as_bytes())
    }

    /// The current reload generation.
    pub fn generation(&self) -> u64 {
        self.current().generation
    }

    /// The engine now in use.
    pub fn engine(&self) -> Arc<Engine> {
        self.current().engine.clone()
    }

    fn current(&self) -> Arc<Snapshot> {
        // A poisoned lock only means a panic elsewhere mid-swap; the Arc
        // inside is whole either way.
        self.snapshot.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Re-read the policy files and swap the engine in; returns the new
    /// generation. On error the old engine stays. Blocking: file I/O and
    /// compiling can take tens of milliseconds at 10,000 rules.
    pub fn reload(&self) -> Result<u64> {
        let _one = self.rebuilding.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let engine = Arc::new(policy::load_engine(&self.dirs)?);
        let providers = Arc::new(Providers::load(&self.dirs)?);
        let budgets = Arc::new(budget::load(&self.dirs.budgets())?);
        let prices = Arc::new(usage::price::load(&self.dirs)?);
        let price_text = crate::state::read_optional(&self.dirs.usage_prices())?;
        // Priced again when the user's prices changed. Under the log's
        // lock, so no line is counted twice or missed meanwhile; only then,
        // since the lock holds every `meter` while the log is read.
        {
            let mut m = self.usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if m.priced_with != price_text {
                m.totals = Metered::totals(&self.dirs.usage_log(), &prices)?;
                m.priced_with = price_text;
            }
        }
        self.raises.lock().unwrap_or_else(std::sync::PoisonError::into_inner).prune(&budgets, today());
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let next =
            Arc::new(Snapshot { generation, engine: engine.clone(), providers, budgets: budgets.clone(), prices });
        *self.snapshot.write().unwrap_or_else(std::sync::PoisonError::into_inner) = next;
        // Published after the swap: a reader that sees the new stamp gets
        // the new engine when it asks.
        self.publish(generation)?;
        self.reloaded.send_replace(generation);
        // Held requests a new rule (or default) now decides go on, or stop,
        // at once; each decides again with the new engine.
        // A request a budget holds is woken when the budget no longer
        // asks for it (raised, removed, turned `deny`).
        self.approvals.recheck(|k| match &k.budget {
            Some(_) => self
                .over(
                    &k.sandbox,
                    &k.host.clone().unwrap_or_default(),
                    k.method.as_deref().unwrap_or(""),
                    k.path.as_deref().unwrap_or(""),
                )
                .is_some_and(|(_, o)| o.is_some_and(|o| o.ask)),
            None => still_asks(&engine, k),
        });
        Ok(generation)
    }

    /// For a request of `sandbox` to a provider: the provider's meter, and
    /// the budget it would go past now (ADR 0055), if any. `None` when no
    /// provider answers on the host and path.
    fn over(
        &self,
        sandbox: &str,
        host: &str,
        method: &str,
        path: &str,
    ) -> Option<(protocol::Meter, Option<protocol::Over>)> {
        let snap = self.current();
        let p = snap.providers.find(host, method, path)?;
        let over = self.exceeded(&snap, sandbox).map(|ex| protocol::Over::new(&ex, p.dialect));
        Some((protocol::Meter::from(p), over))
    }

    /// The budget a request of `sandbox` would go past now.
    fn exceeded(&self, snap: &Snapshot, sandbox: &str) -> Option<budget::Exceeded> {
        let m = self.usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let raises = self.raises.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        budget::check(&snap.budgets, &m.totals, &raises, sandbox, time::OffsetDateTime::now_utc())
    }

    /// Grant what an approval of a request held by `held` raises (ADR
    /// 0055), and the same for any other `ask` budget the request is past
    /// (the sandbox's own and a global one may both be). From the budget
    /// as it was exceeded when the request was held: every request waiting
    /// on one entry grants the same raise, so they raise it once. A `deny`
    /// budget is never raised: the request then still gets its 429
    /// ([`budget_hold`] checks again).
    fn raise(&self, sandbox: &str, held: &budget::Exceeded) {
        let snap = self.current();
        let m = self.usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut raises = self.raises.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        raises.grant(budget::raise(held));
        let mut done = vec![held.budget.clone()];
        // Each round raises another budget, so it ends.
        for _ in 0..snap.budgets.budgets.len() {
            match budget::check(&snap.budgets, &m.totals, &raises, sandbox, time::OffsetDateTime::now_utc()) {
                Some(ex) if ex.budget.on_exceed == budget::OnExceed::Ask && !done.contains(&ex.budget) => {
                    raises.grant(budget::raise(&ex));
                    done.push(ex.budget);
                }
                _ => break,
            }
        }
    }

    /// A receiver that sees every reload's generation.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloaded.subscribe()
    }

    /// The `--mode` list for the ports the registry claims now.
    pub fn modes(&self) -> Result<Vec<String>> {
        super::mitmdump::wanted_modes(&self.dirs)
    }
}

/// Accept and answer connections until `shutdown` completes, then stop
/// accepting, drop open connections and remove the socket file. Must run
/// inside a tokio runtime with the time driver.
pub async fn serve(listener: Listener, state: Arc<State>, shutdown: impl Future<Output = ()>) -> Result<()> {
    serve_with(listener, state, shutdown, IDLE_TIMEOUT).await
}

/// [`serve`] with a chosen idle timeout: how long a connection may take to
/// send its next complete line before it is closed.
pub async fn serve_with(
    listener: Listener,
    state: Arc<State>,
    shutdown: impl Future<Output = ()>,
    idle: Duration,
) -> Result<()> {
    let Listener { inner, path, ino } = listener;
    let listener = tokio::net::UnixListener::from_std(inner).context("could not register the daemon socket")?;
    let me = nix::unistd::geteuid().as_raw();
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let state = state.clone();
                    conns.spawn(async move { connection(stream, state, me, idle).await });
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("daemon socket: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // Reap finished connections so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
    drop(listener);
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.ino() == ino) {
        let _ = std::fs::remove_file(&path);
    }
    Ok(())
}

/// One connection: check the peer, then answer one line at a time until the
/// client closes, goes idle, or breaks the framing.
async fn connection(stream: UnixStream, state: Arc<State>, me: u32, idle: Duration) {
    let (read, mut write) = stream.into_split();
    let peer = read.as_ref().peer_cred();
    match peer {
        Ok(c) if c.uid() == me => {}
        other => {
            let who = match &other {
                Ok(c) => {
                    format!("uid {} (pid {})", c.uid(), c.pid().map_or_else(|| "unknown".to_owned(), |p| p.to_string()))
                }
                Err(e) => format!("an unidentifiable peer ({e})"),
            };
            tracing::warn!("daemon socket: refused a connection from {who}; only uid {me} may connect");
            let reply = Response::error(Reason::Forbidden, format!("only uid {me} may use this socket"));
            let _ = tokio::time::timeout(idle, write.write_all(reply.to_line(None).as_bytes())).await;
            return;
        }
    }
    let mut reader = BufReader::new(read);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let line = match tokio::time::timeout(idle, read_line(&mut reader, &mut buf)).await {
            Err(_) => {
                tracing::debug!("daemon socket: closing an idle connection");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!("daemon socket: read failed: {e}");
                return;
            }
            Ok(Ok(l)) => l,
        };
        let (reply, id, last) = match line {
            Line::Eof => return,
            Line::TooLarge => {
                tracing::warn!("daemon socket: a request exceeded {MAX_LINE} bytes; closing the connection");
                (
                    Response::error(Reason::TooLarge, format!("a request line may have at most {MAX_LINE} bytes")),
                    None,
                    true,
                )
            }
            // A last line without its newline is still answered: a client may
            // write one request and shut down its sending side.
            Line::Complete | Line::Unterminated => {
                let (id, request) = protocol::parse_request(&buf);
                let held = matches!(request, Ok(Request::Hold { .. } | Request::BudgetHold { .. }));
                let work = answer(request, &state);
                let reply = if held {
                    // A held request ends when the client goes away (the
                    // addon closes it with the flow, or mitmdump stops) or
                    // sends anything else: the wait is withdrawn, not left
                    // to time out in the list.
                    tokio::select! {
                        r = work => r,
                        _ = reader.fill_buf() => return,
                    }
                } else {
                    work.await
                };
                (reply, id, matches!(line, Line::Unterminated))
            }
        };
        // Bounded too: a client that pipelines requests but never reads the
        // replies would otherwise hold this task forever once its buffer fills.
        match tokio::time::timeout(idle, write.write_all(reply.to_line(id.as_ref()).as_bytes())).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!("daemon socket: write failed: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!("daemon socket: closing a connection that does not read its replies");
                return;
            }
        }
        if last {
            return;
        }
    }
}

/// How [`read_line`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// A line ended by `\n`, now in the buffer without it.
    Complete,
    /// End of stream after some bytes without a `\n`.
    Unterminated,
    /// End of stream at a line boundary.
    Eof,
    /// More than [`MAX_LINE`] bytes without a `\n`; the rest is unread.
    TooLarge,
}

/// Read one line into `buf`, never holding more than [`MAX_LINE`] bytes
/// plus one read's worth: `read_until` would buffer a 10 MiB line whole.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<Line> {
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if buf.is_empty() { Line::Eof } else { Line::Unterminated });
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if buf.len() + take > MAX_LINE {
            return Ok(Line::TooLarge);
        }
        buf.extend_from_slice(&chunk[..take]);
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(Line::Complete);
        }
    }
}

/// Answer one parsed request line.
async fn answer(request: Result<Request, serde_json::Error>, state: &Arc<State>) -> Response {
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            // serde_json's messages quote at most a type or field name, never
            // the input, so the detail cannot echo a pasted secret.
            return Response::error(Reason::BadRequest, e.to_string());
        }
    };
    match request {
        Request::Generation => Response::Generation(state.generation()),
        Request::Modes => {
            let st = state.clone();
            match tokio::task::spawn_blocking(move || st.modes()).await {
                Ok(Ok(m)) => Response::Modes(m),
                Ok(Err(e)) => Response::error(Reason::Internal, format!("{e:#}")),
                Err(e) => Response::error(Reason::Internal, format!("modes task failed: {e}")),
            }
        }
        Request::Decide { sandbox, host, ip, port, protocol, chain, method, path, overridden } => {
            let Some(method) = method else {
                return decide_chain(state, sandbox.as_deref(), host.as_deref(), ip, port, protocol, chain).await;
            };
            let req = policy::http::Request { method: &method, path: path.as_deref().unwrap_or(""), overridden };
            for _ in 0..3 {
                let network =
                    decide_chain(state, sandbox.as_deref(), host.as_deref(), ip, port, protocol, chain.clone()).await;
                if let Some(r) = decide_http(state, network, sandbox.as_deref(), host.as_deref(), port, &req) {
                    return r;
                }
            }
            Response::error(Reason::Internal, "the policy changed three times while the request was decided")
        }
        Request::Resolved { sandbox, name, addrs, ttl, chain } => {
            state.resolutions.record(&sandbox, &name, &addrs, ttl, &chain);
            Response::Ack
        }
        Request::Reload => {
            let st = state.clone();
            match tokio::task::spawn_blocking(move || st.reload()).await {
                Ok(Ok(g)) => {
                    tracing::info!("daemon socket: policy reloaded, generation {g}");
                    Response::Generation(g)
                }
                Ok(Err(e)) => {
                    tracing::warn!("daemon socket: reload failed, keeping the old policy: {e:#}");
                    Response::error(Reason::BadPolicy, format!("{e:#}"))
                }
                Err(e) => Response::error(Reason::Internal, format!("reload task failed: {e}")),
            }
        }
        Request::Secret { service, sandbox, host } => {
            let wanted = match service.filter(|s| !s.is_empty()) {
                Some(s) => Wanted::Service(s),
                None => Wanted::Substitutions,
            };
            secret_blocking(state, wanted, sandbox, host).await
        }
        Request::Inject { sandbox, host } => secret_blocking(state, Wanted::AnyService, sandbox, host).await,
        Request::Stale { sandbox, host } => {
            if let Some(s) = &sandbox
                && let Err(e) = secret::validate::sandbox(s)
            {
                return Response::error(Reason::BadRequest, format!("{e:#}"));
            }
            let st = state.clone();
            // Only index reads and a flag: the command runs on the next
            // request for the secret, never here.
            match tokio::task::spawn_blocking(move || st.store.stale(sandbox.as_deref(), &host)).await {
                Ok(Ok(_)) => Response::Ack,
                Ok(Err(e)) => Response::error(Reason::Internal, format!("{e:#}")),
                Err(e) => Response::error(Reason::Internal, format!("stale task failed: {e}")),
            }
        }
        Request::Hold { sandbox, host, ip, port, protocol, method, path, size } => {
            let key = Key::new(sandbox, host, ip, port, protocol, method, path);
            hold(state, key, size).await
        }
        Request::Meter { sandbox, host, port: _, method, path } => {
            if let Err(e) = secret::validate::sandbox(&sandbox) {
                return Response::error(Reason::BadRequest, format!("{e:#}"));
            }
            Response::Meter(state.over(&sandbox, &host, &method, &path).map(|(mut m, over)| {
                m.over = over;
                m
            }))
        }
        Request::BudgetHold { sandbox, host, port, method, path, size } => {
            if let Err(e) = secret::validate::sandbox(&sandbox) {
                return Response::error(Reason::BadRequest, format!("{e:#}"));
            }
            budget_hold(state, sandbox, host, port, method, path, size).await
        }
        Request::Usage { sandbox, provider, model, input, output, cache_read, cache_write, estimated, flow } => {
            record_usage(
                state,
                sandbox,
                provider,
                model,
                usage::record::Tokens { input, output, cache_read, cache_write },
                estimated,
                flow,
            )
            .await
        }
        Request::Approvals => Response::Approvals(state.approvals.list()),
        Request::Answer { approval: id, verdict } => match verdict {
            Verdict::Ask => Response::error(Reason::BadRequest, "an answer is `allow` or `deny`"),
            v => match state.approvals.answer(&id, v) {
                Some(n) => Response::Released(n),
                None => Response::error(Reason::NotPending, format!("no pending request has id `{id}`")),
            },
        },
    }
}

/// The longest model name written: the upstream's words, bounded.
const MAX_MODEL: usize = 128;

/// One `usage` report as a line of usage.jsonl, unless its flow was
/// written already. Blocking: a compaction rewrites the file.
async fn record_usage(
    state: &State,
    sandbox: String,
    provider: String,
    model: String,
    tokens: usage::record::Tokens,
    estimated: bool,
    flow: String,
) -> Response {
    if let Err(e) = secret::validate::sandbox(&sandbox) {
        return Response::error(Reason::BadRequest, format!("{e:#}"));
    }
    if !state.current().providers.all().iter().any(|p| p.name == provider) {
        return Response::error(Reason::BadRequest, format!("no provider is named `{provider}`"));
    }
    if flow.is_empty() || flow.len() > usage::log::MAX_FLOW_ID {
        return Response::error(Reason::BadRequest, "a flow id has 1 to 128 bytes");
    }
    let model: String = model.chars().filter(|c| !c.is_control()).take(MAX_MODEL).collect();
    let rec = Record {
        ts: usage::log::now(),
        sandbox,
        provider,
        model,
        requests: 1,
        estimated: u64::from(estimated),
        tokens,
        flow: Some(flow),
    };
    let log = state.usage.clone();
    let prices = state.current().prices.clone();
    let written = tokio::task::spawn_blocking(move || {
        let mut m = log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let written = m.log.append(&rec)?;
        // Counted only when written: a report sent again after a daemon
        // restart or a retry is one request, not two.
        if written {
            m.totals.add(&rec, &|r: &Record| prices.usd(r));
        }
        Ok::<_, anyhow::Error>(written)
    })
    .await;
    match written {
        Ok(Ok(_)) => Response::Ack,
        Ok(Err(e)) => {
            tracing::warn!("daemon socket: could not record usage: {e:#}");
            Response::error(Reason::Internal, format!("{e:#}"))
        }
        Err(e) => Response::error(Reason::Internal, format!("usage task failed: {e}")),
    }
}

/// A flow an `ask` default leaves to the user: decided again first (a rule
/// may have come since the addon asked), then held until it is answered,
/// times out, or the policy changes; then decided once more, so a deny rule
/// added meanwhile still wins over an approval, and an allowed flow gets
/// its limits like any other.
///
/// A held HTTP request is decided by the HTTP rules again too: an HTTP deny
/// written while it waited wins over the user's yes, as a network deny does
/// (ADR 0050). The key's path is cut at 512 bytes for display; a cut path
/// cannot be canonicalised, so a request that long on a host with HTTP rules
/// is refused after the hold: the closed side.
async fn again(state: &State, key: &Key) -> Response {
    let network = || decide(state, Some(&key.sandbox), key.host.as_deref(), key.ip, key.port, key.protocol);
    let Some(method) = key.method.as_deref() else { return network().await };
    // An overridden method is refused before any hold.
    let req = policy::http::Request { method, path: key.path.as_deref().unwrap_or(""), overridden: false };
    for _ in 0..3 {
        if let Some(r) = decide_http(state, network().await, Some(&key.sandbox), key.host.as_deref(), key.port, &req) {
            return r;
        }
    }
    Response::error(Reason::Internal, "the policy changed three times while the request was decided")
}

/// Whether a held request is still the user's to answer under `engine`
/// (after a reload): the network rules still ask, and no HTTP rule now
/// denies it. The rest are woken to be decided again ([`again`]).
fn still_asks(engine: &Engine, k: &Key) -> bool {
    if engine.decide(Some(&k.sandbox), k.host.as_deref(), k.ip, k.port).verdict != Verdict::Ask {
        return false;
    }
    let Some(method) = k.method.as_deref() else { return true };
    let req = policy::http::Request { method, path: k.path.as_deref().unwrap_or(""), overridden: false };
    engine.decide_http(Some(&k.sandbox), k.host.as_deref(), k.port, &req).is_none_or(|d| d.verdict != Verdict::Deny)
}

/// A metered request past a budget that asks (ADR 0055): checked again
/// first (a raise or another approval may have come since the addon
/// asked), then held in [`State::approvals`] beside the policy's holds, so
/// `ppp policy approval ls/allow/deny` and the TUI answer it. An allow
/// raises the budget once and lets this request go; a deny, a timeout or a
/// full queue is the 429. A reload that raises the budget wakes it
/// ([`State::reload`]): checked again.
async fn budget_hold(
    state: &State,
    sandbox: String,
    host: String,
    port: u16,
    method: String,
    path: String,
    size: Option<u64>,
) -> Response {
    let check = || state.over(&sandbox, &host, &method, &path);
    let Some((meter, over)) = check() else { return Response::Meter(None) };
    let first = match over {
        Some(o) if o.ask => o,
        over => return Response::Meter(Some(protocol::Meter { over, ..meter })),
    };
    // What an approval raises: the budget as exceeded now, when it is held.
    let Some(held) = state.exceeded(&state.current(), &sandbox) else { return after(check()) };
    let key = Key::new(
        sandbox.clone(),
        Some(host.clone()),
        None,
        port,
        Some(protocol::Protocol::Http),
        Some(method.clone()),
        Some(path.split('?').next().unwrap_or_default().to_owned()),
    )
    .held_by_budget(&first.message);
    let timeout = Duration::from_secs(u64::from(state.engine().approval_timeout()));
    let (_, outcome) = state.approvals.hold(key, size, timeout).await;
    match outcome {
        Outcome::Woken(Wake::Answered(Verdict::Allow)) => {
            state.raise(&sandbox, &held);
            after(check())
        }
        Outcome::Woken(Wake::PolicyChanged) => after(check()),
        Outcome::Woken(Wake::Answered(_)) | Outcome::TimedOut | Outcome::Full => {
            Response::Meter(Some(protocol::Meter { over: Some(protocol::Over { ask: false, ..first }), ..meter }))
        }
    }
}

/// A budget hold's reply once it was answered: on when no budget is past
/// now, else the 429 of the one that is (an `ask` one too: this wait is
/// over, and the next request is held again).
fn after(now: Option<(protocol::Meter, Option<protocol::Over>)>) -> Response {
    match now {
        Some((m, over)) => {
            Response::Meter(Some(protocol::Meter { over: over.map(|o| protocol::Over { ask: false, ..o }), ..m }))
        }
        None => Response::Meter(None),
    }
}

async fn hold(state: &State, key: Key, size: Option<u64>) -> Response {
    let Response::Decision(first) = again(state, &key).await else {
        return Response::error(Reason::Internal, "decide gave no decision");
    };
    if first.verdict != Verdict::Ask {
        return Response::Decision(first);
    }
    let timeout = Duration::from_secs(u64::from(state.engine().approval_timeout()));
    let (id, outcome) = state.approvals.hold(key.clone(), size, timeout).await;
    let denied = |outcome| {
        let mut d = first.clone();
        d.verdict = Verdict::Deny;
        d.approval = Some(Held { id: id.clone(), outcome });
        Response::Decision(d)
    };
    let answered = match outcome {
        Outcome::Full => return denied(HeldOutcome::Full),
        Outcome::TimedOut => return denied(HeldOutcome::Timeout),
        Outcome::Woken(Wake::Answered(Verdict::Allow)) => HeldOutcome::Allowed,
        Outcome::Woken(Wake::Answered(_)) => return denied(HeldOutcome::Denied),
        Outcome::Woken(Wake::PolicyChanged) => HeldOutcome::Policy,
    };
    let Response::Decision(mut now) = again(state, &key).await else {
        return Response::error(Reason::Internal, "decide gave no decision");
    };
    match now.verdict {
        // Still left to the user, and the user said yes: this request goes,
        // with the limits a flow the default allowed would get.
        Verdict::Ask if answered == HeldOutcome::Allowed => {
            let engine = state.engine();
            let d =
                policy::Decision { verdict: Verdict::Allow, matched_rule: None, default_used: true, learned: false };
            now.verdict = Verdict::Allow;
            now.limits = Some(engine.limits(Some(&key.sandbox), &d));
        }
        // A policy change that still asks (it cannot, by recheck): deny.
        Verdict::Ask => now.verdict = Verdict::Deny,
        Verdict::Allow | Verdict::Deny => {}
    }
    now.approval = Some(Held { id, outcome: answered });
    Response::Decision(now)
}

/// A flow's verdict. The name counts only where it resolves: for a flow
/// with both (not a DNS question or answer, which is the resolution itself),
/// the name must resolve to the address, which costs a host lookup only when
/// the rules would let the name through and ppp's resolver did not already
/// give this sandbox that address.
async fn decide(
    state: &State,
    sandbox: Option<&str>,
    host: Option<&str>,
    ip: Option<std::net::IpAddr>,
    port: u16,
    protocol: Option<protocol::Protocol>,
) -> Response {
    decide_chain(state, sandbox, host, ip, port, protocol, Vec::new()).await
}

/// [`decide`] with the aliases a DNS answer went through (`chain`, from the
/// addon); for any other flow with a name and an address, the aliases of
/// the name's resolution are found here, with it.
async fn decide_chain(
    state: &State,
    sandbox: Option<&str>,
    host: Option<&str>,
    ip: Option<std::net::IpAddr>,
    port: u16,
    protocol: Option<protocol::Protocol>,
    mut chain: Vec<String>,
) -> Response {
    let snap = state.current();
    let mut flow = Flow { sandbox, host, ip, port, resolved: None, local: false, chain: &[] };
    if let Some(addr) = ip {
        flow.local = state.resolutions.is_own(addr);
        if let Some(name) = host.filter(|h| policy::is_name(h) && protocol != Some(protocol::Protocol::Dns))
            && snap.engine.decide(sandbox, host, ip, port).verdict != Verdict::Deny
        {
            let r = state.resolutions.resolves(sandbox, name, addr).await;
            flow.resolved = Some(r.hit);
            chain.extend(r.chain);
        }
    }
    flow.chain = &chain;
    let (mut d, refusal) = snap.engine.decide_flow(&flow);
    if d.verdict == Verdict::Ask {
        match protocol {
            // The name is answered so the request can be made, and held.
            Some(protocol::Protocol::Dns) => d.verdict = Verdict::Allow,
            // A datagram cannot wait for a person; QUIC falls back to TCP,
            // which can.
            Some(protocol::Protocol::Udp) => d.verdict = Verdict::Deny,
            _ => {}
        }
    }
    let mut out = protocol::Decision {
        verdict: d.verdict,
        // A learned flow names the pseudo-rule `learned`, which the addon
        // logs as the flow's rule, as it does any other (ADR 0048).
        matched_rule: if d.learned {
            Some(MatchedRule::learned())
        } else {
            d.matched_rule.as_ref().map(MatchedRule::from)
        },
        default_used: d.default_used,
        generation: snap.generation,
        rebinding: None,
        unresolved: None,
        internal: None,
        limits: (d.verdict == Verdict::Allow).then(|| snap.engine.limits(sandbox, &d)),
        approval: None,
        alias: None,
        long_chain: None,
        chain: Vec::new(),
        local: flow.local,
        http_rules: http_rules(state, &snap.engine, sandbox, host, ip, port),
        http: None,
        inspect: true,
        metered: host.is_some_and(|h| snap.providers.has_host(h)),
    };
    // Only an allow rule saying so turns inspection off, and only for a
    // flow that names a host: the SNI is what a `--no-inspect` rule is
    // about, and the name already resolved to the destination above.
    if d.verdict == Verdict::Allow && !d.inspect() && refusal.is_none() && host.is_some_and(policy::is_name) {
        // HTTP rules need the requests read, as a secret does (ADR 0050,
        // 0051), and so does a provider's host: a pass-through rule must
        // not walk around the meter and its budgets (ADR 0053, 0055).
        out.inspect =
            out.http_rules || out.metered || inspection_required(state, sandbox, host.unwrap_or_default()).await;
    }
    out.set_refusal(refusal, &chain);
    out.chain = chain;
    Response::Decision(out)
}

/// Whether HTTP rules cover a flow (ADR 0050): by its name, or for a flow
/// with none (raw TCP, UDP) by the names ppp's resolver answered this
/// sandbox with its address.
fn http_rules(
    state: &State,
    engine: &policy::Engine,
    sandbox: Option<&str>,
    host: Option<&str>,
    ip: Option<std::net::IpAddr>,
    port: u16,
) -> bool {
    if !engine.has_http_rules() {
        return false;
    }
    if let Some(h) = host.filter(|h| policy::is_name(h)) {
        return engine.http_rules_apply(sandbox, Some(h), port);
    }
    match (sandbox, ip) {
        (Some(s), Some(addr)) => {
            state.resolutions.any_name_at(s, addr, |name| engine.http_rules_apply(sandbox, Some(name), port))
        }
        _ => false,
    }
}

/// The HTTP rules' say over a request the network decision let through
/// (allowed, or left to the user): a network deny is the floor and stays
/// (ADR 0050). Decided with the engine of the network decision's
/// generation; `None` when the policy changed in between (decide again).
fn decide_http(
    state: &State,
    response: Response,
    sandbox: Option<&str>,
    host: Option<&str>,
    port: u16,
    req: &policy::http::Request<'_>,
) -> Option<Response> {
    let Response::Decision(mut out) = response else { return Some(response) };
    if out.verdict == Verdict::Deny {
        return Some(Response::Decision(out));
    }
    let snap = state.current();
    if snap.generation != out.generation {
        return None;
    }
    let Some(d) = snap.engine.decide_http(sandbox, host, port, req) else { return Some(Response::Decision(out)) };
    let path = d.path.map(|p| bounded(&p));
    if d.verdict == Verdict::Deny {
        out.verdict = Verdict::Deny;
        out.matched_rule = d.matched_rule.as_ref().map(MatchedRule::from);
        out.default_used = false;
        out.limits = None;
    } else if out.verdict == Verdict::Allow {
        // The network rule's limits stay: an HTTP rule has none.
        out.matched_rule = d.matched_rule.as_ref().map(MatchedRule::from);
        out.default_used = false;
    }
    // An HTTP allow under an `ask` network default stays `ask`: an HTTP
    // rule never opens a host; the user still answers for it.
    out.http = Some(protocol::HttpOutcome { refusal: d.refusal.map(|r| r.to_string()), path });
    Some(Response::Decision(out))
}

/// A canonical path as the reply carries it (and flows.jsonl records it):
/// at most [`MAX_LOGGED_PATH`] bytes, a cut one ending in `…`.
fn bounded(p: &str) -> String {
    if p.len() <= MAX_LOGGED_PATH {
        return p.to_owned();
    }
    // Canonical paths are ASCII (other bytes stay `%XX`): any cut is on a
    // char boundary.
    format!("{}\u{2026}", &p[..MAX_LOGGED_PATH - 3])
}

/// The flow log's bound on a path (the addon's `MAX_LOGGED_PATH`).
const MAX_LOGGED_PATH: usize = 1024;

/// Whether a flow from `sandbox` to `host` that an allow rule says not to
/// inspect must be intercepted all the same: a secret for the host (its
/// service's hosts, or a custom secret's) can only be injected into a
/// connection ppp reads, and one may be stored after the rule was written,
/// so the daemon checks on every such decision as well as the CLI at write
/// time (ADR 0051). A store that cannot be read inspects: the safe side.
async fn inspection_required(state: &State, sandbox: Option<&str>, host: &str) -> bool {
    let store = state.store.clone();
    let (owned_sandbox, owned_host) = (sandbox.map(str::to_owned), host.to_owned());
    let secret = tokio::task::spawn_blocking(move || store.covers(owned_sandbox.as_deref(), &owned_host)).await;
    match secret {
        Ok(Ok(covered)) => covered,
        Ok(Err(e)) => {
            tracing::warn!("daemon socket: could not read the secret index, inspecting: {e:#}");
            true
        }
        Err(e) => {
            tracing::warn!("daemon socket: secret index task failed, inspecting: {e}");
            true
        }
    }
}

/// Look a secret up. Blocking: the keychain and the age file are.
/// What a secret request asks for.
enum Wanted {
    /// The header for this service's key.
    Service(String),
    /// The header for whichever service's key covers the host.
    AnyService,
    /// The custom placeholder substitutions for the host.
    Substitutions,
}

/// [`secret`] off the async threads: the keychain and the age file block.
async fn secret_blocking(state: &Arc<State>, wanted: Wanted, sandbox: Option<String>, host: String) -> Response {
    let st = state.clone();
    match tokio::task::spawn_blocking(move || secret(&st.store, &wanted, sandbox.as_deref(), &host)).await {
        Ok(r) => r,
        Err(e) => Response::error(Reason::Internal, format!("secret task failed: {e}")),
    }
}

fn secret(store: &Store, wanted: &Wanted, sandbox: Option<&str>, host: &str) -> Response {
    // Names are checked here so a malformed one is the client's error, not
    // a store failure.
    if let Some(s) = sandbox
        && let Err(e) = secret::validate::sandbox(s)
    {
        return Response::error(Reason::BadRequest, format!("{e:#}"));
    }
    if let Wanted::Service(s) = wanted
        && let Err(e) = secret::validate::service(s)
    {
        return Response::error(Reason::BadRequest, format!("{e:#}"));
    }
    let failed = |e: &anyhow::Error| {
        if let Some(c) = e.downcast_ref::<secret::command::CommandFailed>() {
            // Logged by the cache when it ran; the detail names the secret
            // and the kind of failure, never the output.
            return Response::error(Reason::CommandFailed, format!("`{}` ({} scope): {}", c.name, c.scope, c.failure));
        }
        if secret::is_unavailable(e) {
            tracing::warn!("daemon socket: the secret store is locked: {e:#}");
            Response::Error { reason: Reason::Locked, detail: None }
        } else {
            // Store errors name secrets and files, never values.
            tracing::warn!("daemon socket: secret lookup failed: {e:#}");
            Response::error(Reason::Internal, format!("{e:#}"))
        }
    };
    let header = match wanted {
        Wanted::Service(service) => store.header_for(sandbox, service, host),
        Wanted::AnyService => store.header_for_host(sandbox, host),
        Wanted::Substitutions => {
            return match store.substitutions(sandbox, host) {
                Ok(subs) => Response::Substitutions(
                    subs.into_iter()
                        .map(|s| protocol::Substitution {
                            placeholder: s.placeholder,
                            value: s.value,
                            ttl: s.ttl.map(|t| t.as_secs()),
                        })
                        .collect(),
                ),
                Err(e) => failed(&e),
            };
        }
    };
    match header {
        Ok(Some(i)) => {
            tracing::debug!("daemon socket: injecting a key ({} scope) for `{host}`", i.scope);
            Response::Header { header: i.header, value: i.value, ttl: i.ttl.map(|t| t.as_secs()) }
        }
        Ok(None) => Response::Error { reason: Reason::NoSecret, detail: None },
        Err(e) => failed(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn read_line_is_bounded() {
        // An endless line: reading must stop after MAX_LINE, not buffer forever.
        let mut r = BufReader::new(tokio::io::repeat(b'a'));
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut r, &mut buf).await.unwrap(), Line::TooLarge);
        assert!(buf.len() <= MAX_LINE && buf.capacity() <= 2 * MAX_LINE, "{}", buf.capacity());
    }

    #[tokio::test]
    async fn read_line_frames() {
        let mut r = BufReader::with_capacity(3, &b"ab\n\ncdefg\nhi"[..]);
        let mut got = Vec::new();
        loop {
            let mut buf = Vec::new();
            let l = read_line(&mut r, &mut buf).await.unwrap();
            got.push((l, String::from_utf8(buf).unwrap()));
            if matches!(l, Line::Eof | Line::Unterminated) {
                break;
            }
        }
        assert_eq!(
            got,
            [
                (Line::Complete, "ab".to_owned()),
                (Line::Complete, String::new()),
                (Line::Complete, "cdefg".to_owned()),
                (Line::Unterminated, "hi".to_owned())
            ]
        );
        let mut exact = vec![b'x'; MAX_LINE];
        exact.push(b'\n');
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut BufReader::new(&exact[..]), &mut buf).await.unwrap(), Line::Complete);
        assert_eq!(buf.len(), MAX_LINE);
    }

    proptest::proptest! {
        /// However the bytes arrive, the lines read are the lines sent, and
        /// a line over the limit is reported instead of read.
        #[test]
        fn framing_matches_splitting(
            lines in proptest::collection::vec(proptest::collection::vec(0u8..=255, 0..200), 0..8),
            cap in 1usize..64,
            tail in proptest::collection::vec(0u8..=255, 0..50),
        ) {
            let lines: Vec<Vec<u8>> =
                lines.into_iter().map(|l| l.into_iter().filter(|&b| b != b'\n').collect()).collect();
            let tail: Vec<u8> = tail.into_iter().filter(|&b| b != b'\n').collect();
            let mut input: Vec<u8> = lines.iter().flat_map(|l| l.iter().copied().chain([b'\n'])).collect();
            input.extend_from_slice(&tail);
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let got = rt.block_on(async {
                let mut r = BufReader::with_capacity(cap, &input[..]);
                let mut got = Vec::new();
                loop {
                    let mut buf = Vec::new();
                    match read_line(&mut r, &mut buf).await.unwrap() {
                        Line::Complete => got.push(buf),
                        Line::Unterminated => { got.push(buf); break; }
                        Line::Eof => break,
                        Line::TooLarge => unreachable!("lines here are short"),
                    }
                }
                got
            });
            let mut want = lines.clone();
            if !tail.is_empty() {
                want.push(tail);
            }
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_replied_path_is_bounded_as_the_flow_log_bounds_it() {
        assert_eq!(bounded("/a/b"), "/a/b");
        let long = format!("/{}", "a".repeat(4000));
        let cut = bounded(&long);
        assert_eq!(cut.len(), MAX_LOGGED_PATH);
        assert!(cut.ends_with('\u{2026}'));
    }

    #[test]
    fn long_socket_path_is_refused_with_a_hint() {
        let long = PathBuf::from("/tmp").join("d".repeat(120));
        let dirs = Dirs { config: long.join("c"), data: long.clone(), cache: long.join("k") };
        let err = bind(&dirs).unwrap_err();
        let (text, _) = crate::error::render(&err);
        assert!(text.contains("longer than the"), "{text}");
        assert!(text.contains("hint: set `PPP_DATA` to a shorter directory"), "{text}");
        assert!(!long.exists(), "nothing is created for a path that cannot work");
    }
}

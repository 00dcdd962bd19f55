//! Requests an `ask` default holds until the user answers them
//! (`ppp policy approval allow|deny`), times out, or a new rule decides.
//!
//! Lives in the daemon, beside the engine: the addon only says "this flow
//! waits" over its own socket connection and is told the outcome. Identical
//! requests (a client's retry loop) share one entry and are answered
//! together; the entry shows how many wait.
//!
//! Every size the guest can grow is bounded: entries and waiters per
//! sandbox, and the length of each text field an entry keeps.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::protocol::{Pending, Protocol};
use crate::policy::Verdict;

/// Distinct pending requests one sandbox may have; more are denied at once.
pub const MAX_ENTRIES_PER_SANDBOX: usize = 128;
/// Requests one sandbox may have waiting, over all its entries.
pub const MAX_WAITERS_PER_SANDBOX: usize = 512;
/// The longest path an entry keeps (the rest is cut, marked with `…`).
const MAX_PATH: usize = 512;
const MAX_METHOD: usize = 16;
const MAX_HOST: usize = 253;
const MAX_MESSAGE: usize = 1024;

/// What identifies "the same request": a retry of it joins its entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub sandbox: String,
    pub host: Option<String>,
    pub ip: Option<IpAddr>,
    pub port: u16,
    pub protocol: Option<Protocol>,
    pub method: Option<String>,
    pub path: Option<String>,
    /// For a request held by a budget with `on_exceed: ask` (ADR 0055),
    /// not by the policy: the budget's message, shown in the listing.
    pub budget: Option<String>,
}

impl Key {
    /// A key with each guest-chosen text cut to its bound.
    #[must_use]
    pub fn new(
        sandbox: String,
        host: Option<String>,
        ip: Option<IpAddr>,
        port: u16,
        protocol: Option<Protocol>,
        method: Option<String>,
        path: Option<String>,
    ) -> Key {
        Key {
            sandbox,
            host: host.map(|h| cut(h, MAX_HOST)),
            ip,
            port,
            protocol,
            method: method.map(|m| cut(m, MAX_METHOD)),
            path: path.map(|p| cut(p, MAX_PATH)),
            budget: None,
        }
    }

    /// This key, for a request held by a budget whose message is
    /// `message` (ppp's own words, bounded all the same).
    #[must_use]
    pub fn held_by_budget(mut self, message: &str) -> Key {
        self.budget = Some(cut(message.to_owned(), MAX_MESSAGE));
        self
    }
}

/// `s` without control characters ([`crate::output::printable`]), cut to
/// `max` bytes: the guest chooses these bytes, and they reach the user's
/// terminal in `approval ls` and the TUI.
fn cut(s: String, max: usize) -> String {
    let mut s = match crate::output::printable(&s) {
        std::borrow::Cow::Borrowed(_) => s,
        std::borrow::Cow::Owned(clean) => clean,
    };
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// Why a held request went on or stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// `ppp policy approval allow|deny`.
    Answered(Verdict),
    /// The policy changed and a rule or default now decides it.
    PolicyChanged,
}

/// How [`Approvals::hold`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Woken(Wake),
    /// Nobody answered within the timeout.
    TimedOut,
    /// The sandbox already has too many requests waiting: denied at once.
    Full,
}

#[derive(Debug)]
struct Entry {
    id: String,
    key: Key,
    size: Option<u64>,
    first: Instant,
    deadline: Instant,
    waiters: HashMap<u64, oneshot::Sender<Wake>>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    by_key: HashMap<Key, String>,
    next_waiter: u64,
}

impl Inner {
    fn sandbox_load(&self, sandbox: &str) -> (usize, usize) {
        self.entries
            .values()
            .filter(|e| e.key.sandbox == sandbox)
            .fold((0, 0), |(n, w), e| (n + 1, w + e.waiters.len()))
    }

    fn remove(&mut self, id: &str) -> Option<Entry> {
        let e = self.entries.remove(id)?;
        self.by_key.remove(&e.key);
        Some(e)
    }
}

/// The pending requests of every sandbox.
#[derive(Debug, Default, Clone)]
pub struct Approvals {
    inner: Arc<Mutex<Inner>>,
}

/// A registered waiter; dropping it (the flow's connection went away, the
/// daemon stops) takes it off its entry, and the entry off the list when it
/// was the last.
#[derive(Debug)]
struct Guard {
    approvals: Approvals,
    id: String,
    waiter: u64,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut inner = self.approvals.lock();
        if let Some(e) = inner.entries.get_mut(&self.id) {
            e.waiters.remove(&self.waiter);
            if e.waiters.is_empty() {
                inner.remove(&self.id.clone());
            }
        }
    }
}

impl Approvals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere mid-update leaves maps that are still whole.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait until the request `key` is answered, `timeout` passes, or the
    /// policy changes under it. Joins an identical request's entry. Returns
    /// the entry's id (none when the sandbox's queue was full).
    pub async fn hold(&self, key: Key, size: Option<u64>, timeout: Duration) -> (Option<String>, Outcome) {
        let (tx, rx) = oneshot::channel();
        let guard = {
            let mut inner = self.lock();
            let existing = inner.by_key.get(&key).cloned();
            let (entries, waiters) = inner.sandbox_load(&key.sandbox);
            if waiters >= MAX_WAITERS_PER_SANDBOX || (existing.is_none() && entries >= MAX_ENTRIES_PER_SANDBOX) {
                return (None, Outcome::Full);
            }
            let waiter = inner.next_waiter;
            inner.next_waiter += 1;
            let id = if let Some(id) = existing {
                id
            } else {
                let id = fresh_id(&inner.entries);
                let now = Instant::now();
                let entry = Entry {
                    id: id.clone(),
                    key: key.clone(),
                    size,
                    first: now,
                    deadline: now + timeout,
                    waiters: HashMap::new(),
                };
                inner.by_key.insert(key, id.clone());
                inner.entries.insert(id.clone(), entry);
                id
            };
            if let Some(e) = inner.entries.get_mut(&id) {
                e.waiters.insert(waiter, tx);
            }
            Guard { approvals: self.clone(), id, waiter }
        };
        let id = Some(guard.id.clone());
        let outcome = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(wake)) => Outcome::Woken(wake),
            // The sender went with its entry: answered for everyone, so
            // this cannot happen without a wake; deny to be safe.
            Ok(Err(_)) => Outcome::Woken(Wake::Answered(Verdict::Deny)),
            Err(_) => Outcome::TimedOut,
        };
        drop(guard);
        (id, outcome)
    }

    /// Answer entry `id` for every request waiting on it; the number
    /// released, or `None` for an id that is not pending (answered, timed
    /// out, or never was).
    pub fn answer(&self, id: &str, verdict: Verdict) -> Option<usize> {
        let entry = self.lock().remove(id)?;
        let n = entry.waiters.len();
        for (_, tx) in entry.waiters {
            let _ = tx.send(Wake::Answered(verdict));
        }
        Some(n)
    }

    /// The pending entry `id`.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<Pending> {
        let inner = self.lock();
        inner.entries.get(id).map(|e| pending(e, Instant::now()))
    }

    /// Every pending entry, oldest first.
    #[must_use]
    pub fn list(&self) -> Vec<Pending> {
        let inner = self.lock();
        let now = Instant::now();
        let mut all: Vec<(&Entry, Pending)> = inner.entries.values().map(|e| (e, pending(e, now))).collect();
        all.sort_by(|a, b| a.0.first.cmp(&b.0.first).then_with(|| a.1.id.cmp(&b.1.id)));
        all.into_iter().map(|(_, p)| p).collect()
    }

    /// After a reload: release every entry that `still_asks` says the new
    /// policy no longer leaves to the user (a rule now matches, or the
    /// default is no longer `ask`). Their waiters decide again.
    pub fn recheck(&self, still_asks: impl Fn(&Key) -> bool) -> usize {
        let mut inner = self.lock();
        let done: Vec<String> = inner.entries.values().filter(|e| !still_asks(&e.key)).map(|e| e.id.clone()).collect();
        for id in &done {
            if let Some(e) = inner.remove(id) {
                for (_, tx) in e.waiters {
                    let _ = tx.send(Wake::PolicyChanged);
                }
            }
        }
        done.len()
    }
}

fn pending(e: &Entry, now: Instant) -> Pending {
    Pending {
        id: e.id.clone(),
        sandbox: e.key.sandbox.clone(),
        host: e.key.host.clone(),
        ip: e.key.ip,
        port: e.key.port,
        protocol: e.key.protocol,
        method: e.key.method.clone(),
        path: e.key.path.clone(),
        size: e.size,
        budget: e.key.budget.clone(),
        count: e.waiters.len(),
        waiting_secs: now.saturating_duration_since(e.first).as_secs(),
        remaining_secs: e.deadline.saturating_duration_since(now).as_secs(),
    }
}

/// Eight hex digits, random: an id from an earlier daemon (or an earlier
/// entry) does not answer a new one by accident.
fn fresh_id(taken: &HashMap<String, Entry>) -> String {
    loop {
        let u = uuid::Uuid::new_v4();
        let id = u.simple().to_string()[..8].to_owned();
        if !taken.contains_key(&id) {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sandbox: &str, path: &str) -> Key {
        Key::new(
            sandbox.into(),
            Some("h.example".into()),
            None,
            443,
            Some(Protocol::Http),
            Some("GET".into()),
            Some(path.into()),
        )
    }

    #[tokio::test]
    async fn identical_requests_share_an_entry_and_one_answer_releases_all() {
        let a = Approvals::default();
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let a2 = a.clone();
            tasks.push(tokio::spawn(async move { a2.hold(key("s", "/x"), None, Duration::from_secs(30)).await }));
        }
        while a.list().first().map(|p| p.count) != Some(3) {
            tokio::task::yield_now().await;
        }
        let list = a.list();
        assert_eq!(list.len(), 1);
        assert_eq!(a.answer(&list[0].id, Verdict::Allow), Some(3));
        for t in tasks {
            let (id, out) = t.await.unwrap();
            assert_eq!(id.as_deref(), Some(list[0].id.as_str()));
            assert_eq!(out, Outcome::Woken(Wake::Answered(Verdict::Allow)));
        }
        assert!(a.list().is_empty());
        assert_eq!(a.answer(&list[0].id, Verdict::Allow), None, "answered once");
    }

    #[tokio::test]
    async fn a_timeout_denies_and_removes_the_entry() {
        let a = Approvals::default();
        let (_, out) = a.hold(key("s", "/x"), Some(5), Duration::from_millis(50)).await;
        assert_eq!(out, Outcome::TimedOut);
        assert!(a.list().is_empty());
    }

    #[tokio::test]
    async fn a_dropped_waiter_leaves_the_list() {
        let a = Approvals::default();
        let a2 = a.clone();
        let t = tokio::spawn(async move { a2.hold(key("s", "/x"), None, Duration::from_secs(30)).await });
        while a.list().is_empty() {
            tokio::task::yield_now().await;
        }
        t.abort();
        let _ = t.await;
        assert!(a.list().is_empty());
    }

    #[tokio::test]
    async fn one_sandbox_cannot_fill_the_queue_for_another() {
        let a = Approvals::default();
        let mut tasks = Vec::new();
        for i in 0..MAX_ENTRIES_PER_SANDBOX {
            let a2 = a.clone();
            tasks.push(tokio::spawn(async move {
                a2.hold(key("greedy", &format!("/{i}")), None, Duration::from_secs(30)).await
            }));
        }
        while a.list().len() < MAX_ENTRIES_PER_SANDBOX {
            tokio::task::yield_now().await;
        }
        let (id, out) = a.hold(key("greedy", "/one-more"), None, Duration::from_secs(30)).await;
        assert_eq!((id, out), (None, Outcome::Full));
        let a2 = a.clone();
        let other = tokio::spawn(async move { a2.hold(key("other", "/x"), None, Duration::from_secs(30)).await });
        while !a.list().iter().any(|p| p.sandbox == "other") {
            tokio::task::yield_now().await;
        }
        let id = a.list().into_iter().find(|p| p.sandbox == "other").unwrap().id;
        assert_eq!(a.answer(&id, Verdict::Deny), Some(1));
        assert_eq!(other.await.unwrap().1, Outcome::Woken(Wake::Answered(Verdict::Deny)));
        for t in tasks {
            t.abort();
        }
    }

    #[tokio::test]
    async fn a_policy_change_releases_only_what_it_decides() {
        let a = Approvals::default();
        let (a1, a2) = (a.clone(), a.clone());
        let t1 = tokio::spawn(async move { a1.hold(key("s", "/decided"), None, Duration::from_secs(30)).await });
        let t2 = tokio::spawn(async move { a2.hold(key("s", "/still"), None, Duration::from_secs(30)).await });
        while a.list().len() < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(a.recheck(|k| k.path.as_deref() == Some("/still")), 1);
        assert_eq!(t1.await.unwrap().1, Outcome::Woken(Wake::PolicyChanged));
        assert_eq!(a.list().len(), 1);
        t2.abort();
    }

    #[test]
    fn guest_chosen_text_cannot_drive_the_users_terminal() {
        let k = Key::new(
            "s".into(),
            Some("h.test".into()),
            None,
            80,
            None,
            Some("GET\u{1b}[2J".into()),
            Some("/\u{1b}]0;approved\u{7}\u{1b}[1A\r\nall clear".into()),
        );
        let (m, p) = (k.method.unwrap(), k.path.unwrap());
        assert!(!m.chars().chain(p.chars()).any(char::is_control), "{m:?} {p:?}");
        assert!(p.contains("\\u{1b}]0;approved"), "{p}");
    }

    #[test]
    fn guest_chosen_text_is_bounded() {
        let k =
            Key::new("s".into(), Some("h".repeat(1000)), None, 1, None, Some("M".repeat(99)), Some("é".repeat(5000)));
        assert!(k.host.unwrap().len() <= MAX_HOST + 3);
        assert!(k.method.unwrap().len() <= MAX_METHOD + 3);
        assert!(k.path.unwrap().len() <= MAX_PATH + 3);
    }
}

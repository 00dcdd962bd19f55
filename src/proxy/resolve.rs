//! Where a name may send a flow: the addresses it resolves to.
//!
//! A guest chooses the address it connects to and, separately, the name it
//! says (SNI, `Host`, `:authority`). A rule that allows the name vouches only
//! for the name's own addresses, so the daemon checks that the flow's address
//! is one of them ([`crate::policy::Flow::resolved`]). "Its own addresses"
//! are, per sandbox:
//! - the answers ppp's resolver (`10.0.0.53` in the tunnel) gave this
//!   sandbox for the name, reported by the addon as it passes them on;
//! - the host's own resolution of the name (`/etc/hosts`, else the host's
//!   name servers, asked by [`super::dns`]), for guests that pinned an
//!   address the host agrees with (`curl --resolve`).
//!
//! Either way the names the resolution went through (CNAME and DNAME
//! aliases) come with it: a deny rule for any of them refuses the flow.
//!
//! Everything here is bounded: a guest can make the addon report answers for
//! as many names as it likes, and ask for flows to as many allowed names.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Reported answers kept, over all sandboxes.
const MAX_ANSWERS: usize = 16 * 1024;
/// Addresses kept per (sandbox, name); round-robin names rotate within it.
const MAX_ADDRS: usize = 16;
/// How long a reported answer counts, at least and at most, whatever its TTL:
/// a guest's resolver or program may keep an address for its TTL, and some
/// keep it for minutes whatever the TTL says.
const ANSWER_MIN: Duration = Duration::from_secs(300);
const ANSWER_MAX: Duration = Duration::from_secs(3600);
/// Host lookups kept (positive and negative), and for how long.
const MAX_LOOKUPS: usize = 4096;
const LOOKUP_TTL: Duration = Duration::from_secs(60);
const LOOKUP_NEGATIVE_TTL: Duration = Duration::from_secs(15);
/// A host lookup answers within this or counts as "does not resolve". The
/// addon waits for the reply in a worker thread (ADR 0023), so this bounds
/// how long that one flow waits, not the other flows.
const LOOKUP_TIMEOUT: Duration = Duration::from_millis(750);
/// Host lookups in flight at once, over all sandboxes and per sandbox; more
/// count as "does not resolve". Per sandbox, so that one sandbox's names
/// that never answer cannot make another's names fail to resolve; over all,
/// to bound the resolver threads (a lookup that timed out still runs).
const MAX_LOOKUPS_IN_FLIGHT: usize = 32;
const MAX_LOOKUPS_PER_SANDBOX: usize = 4;
/// How often the host's own addresses are re-read.
const OWN_REFRESH: Duration = Duration::from_secs(5);

/// A map that forgets its least recently used quarter when full.
#[derive(Debug)]
struct Bounded<K, V> {
    cap: usize,
    tick: u64,
    map: HashMap<K, (u64, V)>,
}

impl<K: Eq + Hash + Clone, V> Bounded<K, V> {
    fn new(cap: usize) -> Self {
        Self { cap, tick: 0, map: HashMap::new() }
    }

    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(k).map(|e| {
            e.0 = tick;
            &mut e.1
        })
    }

    fn entry_or(&mut self, k: K, make: impl FnOnce() -> V) -> &mut V {
        if !self.map.contains_key(&k) && self.map.len() >= self.cap {
            // Drop the oldest quarter at once: amortised O(log n) per insert.
            let mut ticks: Vec<u64> = self.map.values().map(|e| e.0).collect();
            let cut = self.cap / 4;
            ticks.select_nth_unstable(cut);
            let below = ticks[cut];
            self.map.retain(|_, e| e.0 > below);
        }
        self.tick += 1;
        let tick = self.tick;
        let e = self.map.entry(k).or_insert_with(|| (tick, make()));
        e.0 = tick;
        &mut e.1
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// (sandbox, name) -> the addresses ppp's resolver answered, each with the
/// time it stops counting, and the aliases the latest answer went through.
type Answers = Bounded<(String, String), (Vec<(IpAddr, Instant)>, Vec<String>)>;

/// Whether a name resolves to an address, and through which other names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    pub hit: bool,
    pub chain: Vec<String>,
}

/// The daemon's record of names and their addresses.
#[derive(Debug)]
pub struct Resolutions {
    answers: Mutex<Answers>,
    lookups: Mutex<Bounded<String, (super::dns::Answer, Instant)>>,
    in_flight: tokio::sync::Semaphore,
    /// Lookups in flight per sandbox (no entry at zero: at most
    /// [`MAX_LOOKUPS_IN_FLIGHT`] entries).
    in_flight_by: Mutex<HashMap<String, usize>>,
    own: Mutex<(Option<Instant>, Vec<IpAddr>)>,
}

impl Default for Resolutions {
    fn default() -> Self {
        Self {
            answers: Mutex::new(Bounded::new(MAX_ANSWERS)),
            lookups: Mutex::new(Bounded::new(MAX_LOOKUPS)),
            in_flight: tokio::sync::Semaphore::new(MAX_LOOKUPS_IN_FLIGHT),
            in_flight_by: Mutex::new(HashMap::new()),
            own: Mutex::new((None, Vec::new())),
        }
    }
}

/// The key a name is kept under: lower case, no trailing dot.
fn key(name: &str) -> String {
    crate::policy::normalize_host(name).into_owned()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Resolutions {
    /// Remember that ppp's resolver answered `sandbox` with `addrs` for
    /// `name`, for `ttl` seconds (within [`ANSWER_MIN`], [`ANSWER_MAX`]).
    pub fn record(&self, sandbox: &str, name: &str, addrs: &[IpAddr], ttl: u32, chain: &[String]) {
        self.record_at(sandbox, name, addrs, ttl, chain, Instant::now());
    }

    fn record_at(&self, sandbox: &str, name: &str, addrs: &[IpAddr], ttl: u32, chain: &[String], now: Instant) {
        if addrs.is_empty() || name.len() > 253 {
            return;
        }
        let until = now + Duration::from_secs(u64::from(ttl)).clamp(ANSWER_MIN, ANSWER_MAX);
        let mut answers = lock(&self.answers);
        let (kept, aliases) = answers.entry_or((sandbox.to_owned(), key(name)), Default::default);
        // Bounded as the engine bounds it: one past MAX_CHAIN refuses.
        *aliases = chain.iter().take(crate::policy::MAX_CHAIN + 1).map(|n| key(n)).collect();
        kept.retain(|(a, exp)| *exp > now && !addrs.iter().any(|n| n.to_canonical() == *a));
        kept.extend(addrs.iter().map(|a| (a.to_canonical(), until)));
        if kept.len() > MAX_ADDRS {
            // The newest answers win: they are what the guest connects to.
            kept.drain(..kept.len() - MAX_ADDRS);
        }
    }

    /// Whether ppp's resolver told `sandbox` that `name` is at `addr`, and
    /// through which aliases.
    fn answered(&self, sandbox: &str, name: &str, addr: IpAddr, now: Instant) -> Option<Vec<String>> {
        let mut answers = lock(&self.answers);
        answers
            .get_mut(&(sandbox.to_owned(), key(name)))
            .filter(|(kept, _)| kept.iter().any(|(a, exp)| *a == addr && *exp > now))
            .map(|(_, chain)| chain.clone())
    }

    /// Whether `name` resolves to `addr` for `sandbox`: an answer ppp's
    /// resolver gave it, or the host's own resolution; with the aliases
    /// that resolution went through. A lookup that fails, times out or
    /// cannot start (too many in flight) counts as "no".
    pub async fn resolves(&self, sandbox: Option<&str>, name: &str, addr: IpAddr) -> Resolved {
        let addr = addr.to_canonical();
        let now = Instant::now();
        if let Some(chain) = sandbox.and_then(|s| self.answered(s, name, addr, now)) {
            return Resolved { hit: true, chain };
        }
        let name = key(name);
        if name.is_empty() || name.len() > 253 {
            return Resolved::default();
        }
        let seen = |a: &super::dns::Answer| Resolved { hit: a.addrs.contains(&addr), chain: a.chain.clone() };
        {
            let mut lookups = lock(&self.lookups);
            if let Some((found, until)) = lookups.get_mut(&name)
                && *until > now
            {
                return seen(found);
            }
        }
        let Some(_slot) = self.slot(sandbox.unwrap_or("")) else {
            tracing::debug!("resolve: too many host lookups in flight; {name} counts as not resolving");
            return Resolved::default();
        };
        let found = host_lookup(&name).await;
        let ttl = if found.addrs.is_empty() { LOOKUP_NEGATIVE_TTL } else { LOOKUP_TTL };
        let out = seen(&found);
        *lock(&self.lookups).entry_or(name, || (super::dns::Answer::default(), now)) = (found, now + ttl);
        out
    }

    /// A place for one more host lookup by `sandbox`, or None when it, or
    /// everyone together, has as many in flight as allowed.
    fn slot(&self, sandbox: &str) -> Option<Slot<'_>> {
        let permit = self.in_flight.try_acquire().ok()?;
        let mut by = lock(&self.in_flight_by);
        let n = by.entry(sandbox.to_owned()).or_insert(0);
        if *n >= MAX_LOOKUPS_PER_SANDBOX {
            return None;
        }
        *n += 1;
        Some(Slot { owner: self, sandbox: sandbox.to_owned(), _permit: permit })
    }

    /// Whether ppp's resolver answered `sandbox` `addr` for a name `pred`
    /// holds for (ADR 0050: a connection to that address with no name of
    /// its own, raw TCP or UDP, belongs to the names it was answered for).
    /// Scans every kept answer (at most [`MAX_ANSWERS`]): only asked when
    /// HTTP rules exist at all.
    pub fn any_name_at(&self, sandbox: &str, addr: IpAddr, pred: impl Fn(&str) -> bool) -> bool {
        let addr = addr.to_canonical();
        let now = Instant::now();
        let answers = lock(&self.answers);
        answers.map.iter().any(|((s, name), (_, (kept, _)))| {
            s == sandbox && kept.iter().any(|(a, exp)| *a == addr && *exp > now) && pred(name)
        })
    }

    /// Whether `addr` is one of this host's own addresses (any interface):
    /// a flow there reaches the host's services, whatever the range.
    pub fn is_own(&self, addr: IpAddr) -> bool {
        let addr = addr.to_canonical();
        let mut own = lock(&self.own);
        let now = Instant::now();
        if own.0.is_none_or(|at| now.duration_since(at) > OWN_REFRESH) {
            own.1 = own_addresses();
            own.0 = Some(now);
        }
        own.1.contains(&addr)
    }

    /// Reported answers kept now (for tests of the bound).
    #[must_use]
    pub fn answers_len(&self) -> usize {
        lock(&self.answers).len()
    }
}

/// One host lookup's place in the bounds; given back on drop (also when the
/// lookup's future is dropped: a daemon client that went away).
struct Slot<'a> {
    owner: &'a Resolutions,
    sandbox: String,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut by = lock(&self.owner.in_flight_by);
        if let Some(n) = by.get_mut(&self.sandbox) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.sandbox);
            }
        }
    }
}

/// The host's own resolution of `name`: `/etc/hosts`, else its name
/// servers, asked directly so that the aliases come with the addresses
/// (`getaddrinfo` follows them silently). Without any name server
/// configured, `getaddrinfo` is all there is: its addresses, no aliases.
async fn host_lookup(name: &str) -> super::dns::Answer {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let hosts = super::dns::from_hosts(&read(crate::dirs::HOSTS), name);
    if !hosts.is_empty() {
        return super::dns::Answer { addrs: hosts, chain: Vec::new() };
    }
    let servers = super::dns::name_servers(&read(crate::dirs::RESOLV_CONF));
    if !servers.is_empty() {
        return super::dns::lookup(&servers, name, LOOKUP_TIMEOUT).await.unwrap_or_else(|| {
            tracing::debug!("resolve: no name server answered for {name}");
            super::dns::Answer::default()
        });
    }
    match tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((name, 0))).await {
        Ok(Ok(it)) => super::dns::Answer { addrs: it.map(|sa| sa.ip().to_canonical()).collect(), chain: Vec::new() },
        Ok(Err(e)) => {
            tracing::debug!("resolve: the host does not resolve {name}: {e}");
            super::dns::Answer::default()
        }
        Err(_) => {
            tracing::debug!("resolve: the host lookup of {name} timed out");
            super::dns::Answer::default()
        }
    }
}

/// Every address on this host's interfaces.
fn own_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else { return Vec::new() };
    addrs
        .filter_map(|i| {
            let a = i.address?;
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()).to_canonical())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn answers_count_per_sandbox_and_expire() {
        let r = Resolutions::default();
        let t0 = Instant::now();
        r.record_at("red", "API.test.", &[ip("93.184.216.34"), ip("::ffff:1.2.3.4")], 30, &[], t0);
        assert!(r.answered("red", "api.test", ip("93.184.216.34"), t0).is_some());
        assert!(r.answered("red", "api.test", ip("1.2.3.4"), t0).is_some());
        // Another sandbox got no such answer.
        assert!(r.answered("blue", "api.test", ip("93.184.216.34"), t0).is_none());
        // Kept at least ANSWER_MIN, whatever the TTL said.
        assert!(
            r.answered("red", "api.test", ip("93.184.216.34"), t0 + ANSWER_MIN.saturating_sub(Duration::from_secs(1)))
                .is_some()
        );
        assert!(r.answered("red", "api.test", ip("93.184.216.34"), t0 + ANSWER_MIN + Duration::from_secs(1)).is_none());
        // The aliases come with the answer, in the key's spelling.
        r.record_at("red", "alias.test", &[ip("93.184.216.34")], 30, &["Denied.Test.".to_owned()], t0);
        assert_eq!(r.answered("red", "alias.test", ip("93.184.216.34"), t0), Some(vec!["denied.test".to_owned()]));
    }

    #[test]
    fn a_guest_cannot_grow_the_record_without_bound() {
        let r = Resolutions::default();
        let t0 = Instant::now();
        for i in 0..(MAX_ANSWERS * 3) {
            r.record_at("red", &format!("n{i}.test"), &[ip("93.184.216.34")], 60, &[], t0);
        }
        assert!(r.answers_len() <= MAX_ANSWERS, "{}", r.answers_len());
        // The newest names are still there.
        assert!(r.answered("red", &format!("n{}.test", MAX_ANSWERS * 3 - 1), ip("93.184.216.34"), t0).is_some());
        // And addresses per name are bounded too.
        for i in 0..100u8 {
            r.record_at("red", "rr.test", &[IpAddr::from([93, 184, 0, i])], 60, &[], t0);
        }
        assert!(r.answered("red", "rr.test", ip("93.184.0.99"), t0).is_some());
        assert!(r.answered("red", "rr.test", ip("93.184.0.0"), t0).is_none());
    }

    #[tokio::test]
    async fn one_sandbox_cannot_take_every_lookup() {
        let r = Resolutions::default();
        // Red has as many lookups in flight as it may (names that never
        // answer): its next one counts as not resolving, without a lookup.
        let red: Vec<_> = (0..MAX_LOOKUPS_PER_SANDBOX).map(|_| r.slot("red").unwrap()).collect();
        assert!(r.slot("red").is_none());
        assert!(!r.resolves(Some("red"), "localhost", ip("127.0.0.1")).await.hit);
        // Blue's lookups go on.
        assert!(r.resolves(Some("blue"), "localhost", ip("127.0.0.1")).await.hit);
        drop(red);
        assert!(r.slot("red").is_some());
        // Every slot given back leaves no entry behind.
        assert!(lock(&r.in_flight_by).is_empty());
        // And everyone together stays within the overall bound.
        let all: Vec<_> = (0..MAX_LOOKUPS_IN_FLIGHT).map_while(|i| r.slot(&format!("s{i}"))).collect();
        assert_eq!(all.len(), MAX_LOOKUPS_IN_FLIGHT);
        assert!(r.slot("blue").is_none());
    }

    #[tokio::test]
    async fn the_hosts_own_resolution_counts() {
        let r = Resolutions::default();
        assert!(r.resolves(Some("red"), "localhost", ip("127.0.0.1")).await.hit);
        assert!(!r.resolves(Some("red"), "localhost", ip("93.184.216.34")).await.hit);
        assert!(r.is_own(ip("127.0.0.1")));
    }
}

//! The daemon's own DNS lookups, for the host's resolution of a flow's name
//! ([`super::resolve`]): the addresses, and every name the answer went
//! through (CNAME and DNAME owners and targets), so that a deny rule for an
//! alias's target refuses the alias (issue 22). `getaddrinfo` follows
//! aliases without saying which, so the daemon asks the host's name servers
//! itself; `/etc/hosts` is read first, as the C library would.
//!
//! Everything a name server sends is bounded: answers of at most
//! [`MAX_REPLY`] bytes, names followed through at most [`MAX_POINTERS`]
//! compression pointers, chains cut past [`MAX_CHAIN`] + 1 names (the
//! engine refuses those).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::policy::MAX_CHAIN;

/// The EDNS payload size asked for, and the largest reply read.
const MAX_REPLY: usize = 1232;
/// Compression pointers followed in one name.
const MAX_POINTERS: usize = 32;
/// Name servers asked, in `resolv.conf` order, as the C library does.
const MAX_SERVERS: usize = 3;

const TYPE_A: u16 = 1;
const TYPE_CNAME: u16 = 5;
const TYPE_DNAME: u16 = 39;
const TYPE_AAAA: u16 = 28;

/// What a lookup found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub addrs: Vec<IpAddr>,
    /// The names the answer went through besides the one asked, lower
    /// case, without a trailing dot; at most [`MAX_CHAIN`] + 1.
    pub chain: Vec<String>,
}

impl Answer {
    fn add_name(&mut self, asked: &str, name: String) {
        if name != asked && !self.chain.contains(&name) && self.chain.len() <= MAX_CHAIN {
            self.chain.push(name);
        }
    }

    fn merge(&mut self, asked: &str, other: Answer) {
        for a in other.addrs {
            if !self.addrs.contains(&a) {
                self.addrs.push(a);
            }
        }
        for n in other.chain {
            self.add_name(asked, n);
        }
    }
}

/// The name servers in a `resolv.conf` text.
#[must_use]
pub fn name_servers(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next()).flatten()
        })
        .filter_map(|w| w.split('%').next().and_then(|a| a.parse::<IpAddr>().ok()))
        .map(|a| SocketAddr::new(a, 53))
        .take(MAX_SERVERS)
        .collect()
}

/// The addresses `hosts` (an `/etc/hosts` text) gives `name`.
#[must_use]
pub fn from_hosts(hosts: &str, name: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in hosts.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let Some(addr) = words.next().and_then(|a| a.parse::<IpAddr>().ok()) else { continue };
        if words.any(|w| crate::policy::normalize_host(w) == name) && !out.contains(&addr) {
            out.push(addr.to_canonical());
        }
    }
    out
}

/// Look `name` up (A and AAAA) at `servers`, within `timeout`. `None` when
/// no server gave an answer (the name then counts as not resolving).
pub async fn lookup(servers: &[SocketAddr], name: &str, timeout: Duration) -> Option<Answer> {
    let (a, aaaa) = tokio::join!(
        tokio::time::timeout(timeout, ask_servers(servers, name, TYPE_A)),
        tokio::time::timeout(timeout, ask_servers(servers, name, TYPE_AAAA)),
    );
    let (a, aaaa) = (a.ok().flatten(), aaaa.ok().flatten());
    if a.is_none() && aaaa.is_none() {
        return None;
    }
    let mut out = Answer::default();
    for part in [a, aaaa].into_iter().flatten() {
        out.merge(name, part);
    }
    Some(out)
}

async fn ask_servers(servers: &[SocketAddr], name: &str, qtype: u16) -> Option<Answer> {
    for server in servers {
        match ask(*server, name, qtype).await {
            Ok(Some(a)) => return Some(a),
            Ok(None) => return Some(Answer::default()),
            Err(e) => tracing::debug!("dns: {server} gave no answer for {name} (type {qtype}): {e}"),
        }
    }
    None
}

/// One query over UDP. `Ok(None)`: the name does not exist (NXDOMAIN).
async fn ask(server: SocketAddr, name: &str, qtype: u16) -> std::io::Result<Option<Answer>> {
    let bind: SocketAddr =
        if server.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
    let sock = tokio::net::UdpSocket::bind(bind).await?;
    sock.connect(server).await?;
    let id = u16::from_be_bytes(*uuid::Uuid::new_v4().as_bytes().first_chunk::<2>().unwrap_or(&[0, 0]));
    let query = build_query(id, name, qtype).ok_or_else(|| std::io::Error::other("a name DNS cannot carry"))?;
    sock.send(&query).await?;
    let mut buf = vec![0u8; MAX_REPLY];
    loop {
        let n = sock.recv(&mut buf).await?;
        // Anything but the reply to this query (another id, a spoof) is
        // read past, within the caller's timeout.
        match parse_reply(&buf[..n], id, name, qtype) {
            Reply::Other => {}
            Reply::NoName => return Ok(None),
            Reply::Answer(a) => return Ok(Some(a)),
            Reply::Failed(why) => return Err(std::io::Error::other(why)),
        }
    }
}

/// A query for `name`, recursion desired, with an EDNS record offering
/// [`MAX_REPLY`] bytes. `None` for a name DNS cannot carry.
#[must_use]
pub fn build_query(id: u16, name: &str, qtype: u16) -> Option<Vec<u8>> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1]);
    let name = name.trim_end_matches('.');
    if name.is_empty() || name.len() > 253 {
        return None;
    }
    for label in name.split('.') {
        let len = u8::try_from(label.len()).ok().filter(|&l| (1..=63).contains(&l))?;
        q.push(len);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    // OPT: root name, type 41, payload size, no flags, no options.
    q.push(0);
    q.extend_from_slice(&41u16.to_be_bytes());
    q.extend_from_slice(&u16::try_from(MAX_REPLY).unwrap_or(512).to_be_bytes());
    q.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    Some(q)
}

/// What one datagram was.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// Not the reply to this query.
    Other,
    /// NXDOMAIN.
    NoName,
    Answer(Answer),
    /// A reply that says the server failed, or one that does not parse.
    Failed(String),
}

/// Read a reply to query `id` for `name`/`qtype`. Every owner and alias
/// target in the answer section joins the chain (a record for a name the
/// chain never reached is judged too: a guest's resolver might use it);
/// the authority and additional sections are not read.
#[must_use]
pub fn parse_reply(msg: &[u8], id: u16, name: &str, qtype: u16) -> Reply {
    let asked = crate::policy::normalize_host(name).into_owned();
    let Some(head) = msg.get(..12) else { return Reply::Other };
    let word = |i: usize| u16::from_be_bytes([head[i], head[i + 1]]);
    if word(0) != id || head[2] & 0x80 == 0 || word(4) != 1 {
        return Reply::Other;
    }
    let mut at = 12;
    let Some((qname, next)) = read_name(msg, at) else { return Reply::Other };
    if qname != asked || msg.get(next..next + 4).is_none_or(|t| u16::from_be_bytes([t[0], t[1]]) != qtype) {
        return Reply::Other;
    }
    at = next + 4;
    if head[2] & 0x02 != 0 {
        return Reply::Failed("the reply was truncated".into());
    }
    match head[3] & 0x0f {
        0 => {}
        3 => return Reply::NoName,
        rcode => return Reply::Failed(format!("rcode {rcode}")),
    }
    let mut out = Answer::default();
    for _ in 0..word(6) {
        let Some((owner, next)) = read_name(msg, at) else { return Reply::Failed("a malformed record".into()) };
        let Some(fixed) = msg.get(next..next + 10) else { return Reply::Failed("a short record".into()) };
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let len = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        let data_at = next + 10;
        let Some(data) = msg.get(data_at..data_at + len) else { return Reply::Failed("a short record".into()) };
        out.add_name(&asked, owner);
        match rtype {
            TYPE_A if len == 4 => out.addrs.push(IpAddr::from([data[0], data[1], data[2], data[3]])),
            TYPE_AAAA if len == 16 => {
                let b: [u8; 16] = data.try_into().unwrap_or([0; 16]);
                out.addrs.push(IpAddr::from(b).to_canonical());
            }
            TYPE_CNAME | TYPE_DNAME => {
                let Some((target, _)) = read_name(msg, data_at) else {
                    return Reply::Failed("a malformed alias".into());
                };
                out.add_name(&asked, target);
            }
            _ => {}
        }
        at = data_at + len;
    }
    Reply::Answer(out)
}

/// The name at `at` (lower case, no trailing dot) and where the bytes after
/// it start; compression pointers followed, at most [`MAX_POINTERS`].
fn read_name(msg: &[u8], mut at: usize) -> Option<(String, usize)> {
    let mut name = String::new();
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *msg.get(at)?;
        match len {
            0 => {
                return Some((name, end.unwrap_or(at + 1)));
            }
            l if l & 0xc0 == 0xc0 => {
                let ptr = usize::from(u16::from_be_bytes([l & 0x3f, *msg.get(at + 1)?]));
                end.get_or_insert(at + 2);
                jumps += 1;
                if jumps > MAX_POINTERS {
                    return None;
                }
                at = ptr;
            }
            l if l < 64 => {
                let label = msg.get(at + 1..at + 1 + usize::from(l))?;
                if !name.is_empty() {
                    name.push('.');
                }
                name.extend(label.iter().map(|b| char::from(b.to_ascii_lowercase())));
                if name.len() > 255 {
                    return None;
                }
                at += 1 + usize::from(l);
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rr(owner: &[u8], rtype: u16, data: &[u8]) -> Vec<u8> {
        let mut v = owner.to_vec();
        v.extend_from_slice(&rtype.to_be_bytes());
        v.extend_from_slice(&[0, 1, 0, 0, 0, 5]);
        v.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn wire(name: &str) -> Vec<u8> {
        let mut v = Vec::new();
        for l in name.split('.') {
            v.push(u8::try_from(l.len()).unwrap());
            v.extend_from_slice(l.as_bytes());
        }
        v.push(0);
        v
    }

    fn reply(id: u16, name: &str, rcode: u8, answers: &[Vec<u8>]) -> Vec<u8> {
        let mut m = id.to_be_bytes().to_vec();
        m.extend_from_slice(&[0x81, 0x80 | rcode, 0, 1]);
        m.extend_from_slice(&u16::try_from(answers.len()).unwrap().to_be_bytes());
        m.extend_from_slice(&[0, 0, 0, 0]);
        m.extend(wire(name));
        m.extend_from_slice(&[0, 1, 0, 1]);
        for a in answers {
            m.extend_from_slice(a);
        }
        m
    }

    #[test]
    fn a_query_is_well_formed() {
        let q = build_query(0x1234, "Alias.Example.", TYPE_A).unwrap();
        assert_eq!(&q[..4], &[0x12, 0x34, 0x01, 0x00]);
        assert_eq!(&q[12..27], b"\x05Alias\x07Example\x00");
        assert!(build_query(1, "", TYPE_A).is_none());
        assert!(build_query(1, &"a".repeat(64), TYPE_A).is_none());
        assert!(build_query(1, "a..b", TYPE_A).is_none());
    }

    #[test]
    fn the_chain_holds_every_alias_and_owner() {
        // alias.example CNAME hop.example (compressed pointer to the
        // question's "example"), hop.example CNAME denied.example, A.
        let hop = [b"\x03hop".as_slice(), &[0xc0, 18]].concat();
        let denied = wire("DENIED.example");
        let answers = [
            rr(&[0xc0, 12], TYPE_CNAME, &hop),
            rr(&wire("hop.example"), TYPE_CNAME, &denied),
            rr(&denied, TYPE_A, &[93, 184, 216, 34]),
        ];
        let m = reply(7, "alias.example", 0, &answers);
        let Reply::Answer(a) = parse_reply(&m, 7, "alias.example.", TYPE_A) else { panic!() };
        assert_eq!(a.addrs, vec![IpAddr::from([93, 184, 216, 34])]);
        assert_eq!(a.chain, vec!["hop.example".to_owned(), "denied.example".to_owned()]);
        assert_eq!(parse_reply(&m, 8, "alias.example", TYPE_A), Reply::Other);
        assert_eq!(parse_reply(&m, 7, "other.example", TYPE_A), Reply::Other);
        assert_eq!(parse_reply(&reply(7, "alias.example", 3, &[]), 7, "alias.example", TYPE_A), Reply::NoName);
        assert!(matches!(
            parse_reply(&reply(7, "alias.example", 2, &[]), 7, "alias.example", TYPE_A),
            Reply::Failed(_)
        ));
    }

    #[test]
    fn hostile_replies_are_bounded() {
        // A pointer loop, a pointer past the end, a record cut short.
        let looped = reply(1, "a.example", 0, &[rr(&[0xc0, 12], TYPE_CNAME, &[0xc0, 0x30])]);
        let mut m = looped.clone();
        let at = m.len() - 2;
        m[at + 1] = u8::try_from(at).unwrap();
        assert!(matches!(parse_reply(&m, 1, "a.example", TYPE_A), Reply::Failed(_)));
        let mut short = reply(1, "a.example", 0, &[rr(&[0xc0, 12], TYPE_A, &[1, 2, 3, 4])]);
        short.truncate(short.len() - 2);
        assert!(matches!(parse_reply(&short, 1, "a.example", TYPE_A), Reply::Failed(_)));
        // A chain of 100 aliases keeps MAX_CHAIN + 1 of them: enough for
        // the engine to refuse it.
        let answers: Vec<Vec<u8>> = (0..100)
            .map(|i| rr(&wire(&format!("h{i}.example")), TYPE_CNAME, &wire(&format!("h{}.example", i + 1))))
            .collect();
        let Reply::Answer(a) = parse_reply(&reply(1, "a.example", 0, &answers), 1, "a.example", TYPE_A) else {
            panic!()
        };
        assert_eq!(a.chain.len(), MAX_CHAIN + 1);
    }

    #[test]
    fn resolv_conf_and_hosts() {
        let ns = name_servers("# x\nsearch lan\nnameserver 198.18.0.10\nnameserver fe80::1%eth0\nnameserver bogus\n");
        assert_eq!(ns, vec!["198.18.0.10:53".parse().unwrap(), "[fe80::1]:53".parse().unwrap()]);
        let hosts = "127.0.0.1 localhost # me\n10.1.2.3 Build.LAN build\n::1 localhost\n";
        assert_eq!(from_hosts(hosts, "build.lan"), vec![IpAddr::from([10, 1, 2, 3])]);
        assert_eq!(from_hosts(hosts, "localhost").len(), 2);
        assert!(from_hosts(hosts, "other").is_empty());
    }
}

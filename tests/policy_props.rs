//! Property tests for the policy engine. The strongest one checks the indexed
//! engine against a naive reference written here from the spec: every rule
//! tried in order, globs matched label by label with a recursive matcher,
//! addresses compared with `ipnet`. Any disagreement is an index bug.

use std::net::IpAddr;

use ipnet::IpNet;
use ppp::policy::{Engine, Resource, Rule, Scope, Source, Verdict};
use proptest::prelude::*;

/// A resource as the generator built it, so the reference never has to
/// reverse-engineer the parser.
#[derive(Debug, Clone)]
enum Pat {
    Any,
    /// Label patterns (literal, or with `*` / `?`), with a leading `**` when deep.
    Labels {
        deep: bool,
        labels: Vec<String>,
    },
    Regex(String),
    Ip(IpAddr),
    Net(IpNet),
}

#[derive(Debug, Clone)]
struct Res {
    pat: Pat,
    port: Option<u16>,
}

impl Res {
    fn text(&self) -> String {
        let base = match &self.pat {
            Pat::Any => "**".to_owned(),
            Pat::Labels { deep, labels } => {
                let mut s = if *deep { "**.".to_owned() } else { String::new() };
                s += &labels.join(".");
                s
            }
            Pat::Regex(r) => r.clone(),
            Pat::Ip(a) => a.to_string(),
            Pat::Net(n) => n.to_string(),
        };
        let v6 = matches!(self.pat, Pat::Ip(IpAddr::V6(_)) | Pat::Net(IpNet::V6(_)));
        match self.port {
            Some(p) if v6 => format!("[{base}]:{p}"),
            Some(p) => format!("{base}:{p}"),
            None => base,
        }
    }
}

const LITERALS: &[&str] = &["a", "b", "ab", "x-1", "q_z", "B"];
const GLOBS: &[&str] = &["*", "?", "a*", "*b", "a?", "?*", "*a*", "a*b"];
const FRAGMENTS: &[&str] = &["a", "b", "(a|b)", "[a-z]+", ".*", "x-1", "a?b", "[0-9]*", "(ab)+"];

fn literal() -> impl Strategy<Value = String> {
    prop::sample::select(LITERALS).prop_map(str::to_owned)
}

fn glob_label() -> impl Strategy<Value = String> {
    prop_oneof![3 => literal(), 2 => prop::sample::select(GLOBS).prop_map(str::to_owned)]
}

fn v4() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        (0u8..4, 0u8..8).prop_map(|(c, d)| IpAddr::from([10, 0, c, d])),
        (0u8..4).prop_map(|d| IpAddr::from([192, 0, 2, d])),
    ]
}

fn v6() -> impl Strategy<Value = IpAddr> {
    (0u16..8).prop_map(|x| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, x]))
}

fn net() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        (v4(), prop::sample::select(vec![0u8, 8, 16, 24, 29, 30, 32]))
            .prop_map(|(a, l)| IpNet::new(a, l).unwrap().trunc()),
        (v6(), prop::sample::select(vec![0u8, 32, 64, 125, 126, 128]))
            .prop_map(|(a, l)| IpNet::new(a, l).unwrap().trunc()),
    ]
}

fn regex_src() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(prop::sample::select(FRAGMENTS), 2..4),
        prop::option::of(prop::collection::vec(prop::sample::select(FRAGMENTS), 2..3)),
    )
        .prop_map(|(a, b)| {
            // Joined by `\.`, so there is always a regex metacharacter.
            let mut s = a.join(r"\.");
            if let Some(b) = b {
                s = format!("{s}|{}", b.join(r"\."));
            }
            s
        })
}

fn pat() -> impl Strategy<Value = Pat> {
    prop_oneof![
        1 => Just(Pat::Any),
        6 => (any::<bool>(), prop::collection::vec(glob_label(), 1..4)).prop_map(|(deep, mut labels)| {
            // A leading `*`/`**` label on its own is the wildcard form;
            // make sure we hit it often.
            if deep && labels.len() == 1 { labels.insert(0, "a".into()); }
            Pat::Labels { deep, labels }
        }),
        2 => regex_src().prop_map(Pat::Regex),
        2 => prop_oneof![v4(), v6()].prop_map(Pat::Ip),
        2 => net().prop_map(Pat::Net),
    ]
}

fn res() -> impl Strategy<Value = Res> {
    (pat(), prop::sample::select(vec![None, None, Some(443u16), Some(80)])).prop_map(|(pat, port)| Res { pat, port })
}

fn rules() -> impl Strategy<Value = Vec<(Verdict, Res)>> {
    prop::collection::vec((prop_oneof![Just(Verdict::Allow), Just(Verdict::Deny)], res()), 0..25)
}

#[derive(Debug, Clone)]
struct Query {
    sandbox: Option<&'static str>,
    host: Option<String>,
    ip: Option<IpAddr>,
    port: u16,
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (prop::collection::vec(literal(), 1..5), any::<bool>(), any::<bool>()).prop_map(|(l, upper, dot)| {
            let mut h = l.join(".");
            if upper { h = h.to_uppercase(); }
            if dot { h.push('.'); }
            h
        }),
        1 => prop_oneof![v4(), v6()].prop_map(|a| a.to_string()),
        1 => Just("::ffff:10.0.0.1".to_owned()),
        1 => Just("[2001:db8::1]".to_owned()),
        1 => prop::sample::select(vec!["a..b", "ab.b..", "a.b..", ".a", "..", "b.", "A.B"]).prop_map(str::to_owned),
    ]
}

fn query() -> impl Strategy<Value = Query> {
    (
        prop::sample::select(vec![None, Some("s"), Some("t"), Some("unknown")]),
        prop::option::weighted(0.9, host()),
        prop::option::weighted(0.4, prop_oneof![v4(), v6(), Just("::ffff:10.0.1.2".parse().unwrap())]),
        prop::sample::select(vec![80u16, 443, 8080]),
    )
        .prop_map(|(sandbox, host, ip, port)| Query { sandbox, host, ip, port })
}

/// `*` any run of characters, `?` exactly one: the textbook recursion.
fn glob(p: &[char], t: &[char]) -> bool {
    match (p.first(), t.first()) {
        (None, None) => true,
        (Some('*'), _) => glob(&p[1..], t) || (!t.is_empty() && glob(p, &t[1..])),
        (Some('?'), Some(_)) => glob(&p[1..], &t[1..]),
        (Some(a), Some(b)) if a == b => glob(&p[1..], &t[1..]),
        _ => false,
    }
}

fn ref_matches(r: &Res, q: &Query) -> bool {
    if r.port.is_some_and(|p| p != q.port) {
        return false;
    }
    let host =
        q.host.as_deref().map(|h| h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase()).filter(|h| !h.is_empty());
    let literal_ip =
        host.as_deref().and_then(|h| h.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok());
    let ips: Vec<IpAddr> = [q.ip, literal_ip].into_iter().flatten().map(|a| a.to_canonical()).collect();
    match &r.pat {
        Pat::Any => true,
        Pat::Labels { deep, labels } => host.is_some_and(|h| {
            let host_labels: Vec<&str> = h.split('.').collect();
            let want = labels.len();
            let fits = if *deep { host_labels.len() > want } else { host_labels.len() == want };
            fits && labels.iter().zip(&host_labels[host_labels.len() - want..]).all(|(pat, label)| {
                let pat: Vec<char> = pat.to_ascii_lowercase().chars().collect();
                let label: Vec<char> = label.chars().collect();
                glob(&pat, &label)
            })
        }),
        Pat::Regex(src) => host.is_some_and(|h| {
            regex::bytes::RegexBuilder::new(&format!("^(?:{src})$"))
                .case_insensitive(true)
                .unicode(false)
                .build()
                .unwrap()
                .is_match(h.as_bytes())
        }),
        Pat::Ip(a) => ips.contains(&a.to_canonical()),
        Pat::Net(n) => ips.iter().any(|a| n.contains(a)),
    }
}

#[derive(Debug, Clone)]
struct Setup {
    global: Vec<(Rule, Res)>,
    sandboxes: Vec<(&'static str, Vec<(Rule, Res)>)>,
}

fn make(rules: &[(Verdict, Res)]) -> Vec<(Rule, Res)> {
    rules
        .iter()
        .map(|(v, r)| {
            let parsed = Resource::parse(&r.text()).unwrap_or_else(|e| panic!("generated `{}`: {e}", r.text()));
            (Rule::new(*v, parsed, Source::Local), r.clone())
        })
        .collect()
}

impl Setup {
    fn engine(&self, default: Verdict) -> Engine {
        let strip = |v: &[(Rule, Res)]| v.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>();
        Engine::build(
            default,
            strip(&self.global),
            self.sandboxes.iter().map(|(n, v)| ((*n).to_owned(), strip(v))).collect(),
        )
        .unwrap()
    }

    /// The spec, literally: global rules then the sandbox's, first deny,
    /// else first allow, else the default.
    fn reference(&self, default: Verdict, q: &Query) -> (Verdict, Option<(uuid::Uuid, Scope)>) {
        let mut all: Vec<(&Rule, &Res, Scope)> = self.global.iter().map(|(r, x)| (r, x, Scope::Global)).collect();
        if let Some((_, v)) = self.sandboxes.iter().find(|(n, _)| Some(*n) == q.sandbox) {
            all.extend(v.iter().map(|(r, x)| (r, x, Scope::Sandbox)));
        }
        for verdict in [Verdict::Deny, Verdict::Allow] {
            if let Some((r, _, s)) = all.iter().find(|(r, x, _)| r.decision == verdict && ref_matches(x, q)) {
                return (verdict, Some((r.id, *s)));
            }
        }
        (default, None)
    }
}

fn setup() -> impl Strategy<Value = Setup> {
    (rules(), rules(), prop::collection::vec((prop_oneof![Just(Verdict::Allow), Just(Verdict::Deny)], res()), 0..4))
        .prop_map(|(g, s, t)| Setup { global: make(&g), sandboxes: vec![("s", make(&s)), ("t", make(&t))] })
}

fn decide(e: &Engine, q: &Query) -> (Verdict, Option<(uuid::Uuid, Scope)>) {
    let d = e.decide(q.sandbox, q.host.as_deref(), q.ip, q.port);
    assert_eq!(d.default_used, d.matched_rule.is_none());
    (d.verdict, d.matched_rule.map(|m| (m.rule.id, m.scope)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn generated_resources_round_trip(r in res()) {
        let parsed = Resource::parse(&r.text()).unwrap();
        let printed = parsed.to_string();
        prop_assert_eq!(Resource::parse(&printed).unwrap(), parsed);
    }

    #[test]
    fn arbitrary_strings_round_trip_when_accepted(s in r"[a-zA-Z0-9.*?:/\[\]()|+^$\\_-]{0,24}") {
        if let Ok(r) = Resource::parse(&s) {
            let printed = r.to_string();
            prop_assert_eq!(Resource::parse(&printed).unwrap(), r, "printed `{}`", printed);
        }
    }

    #[test]
    fn engine_agrees_with_reference(s in setup(), queries in prop::collection::vec(query(), 1..20), allow_default in any::<bool>()) {
        let default = if allow_default { Verdict::Allow } else { Verdict::Deny };
        let e = s.engine(default);
        for q in &queries {
            prop_assert_eq!(decide(&e, q), s.reference(default, q), "query {:?}", q);
        }
    }

    #[test]
    fn deny_always_wins(mut s in setup(), q in query(), in_sandbox in any::<bool>(), at in any::<prop::sample::Index>()) {
        // A deny rule built to match the query: its host, its address, or `**`.
        // Only a host the resource grammar reproduces exactly: `a.b..` is
        // not the host `a.b`.
        let host = q.host.as_deref().map(|h| h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase())
            .filter(|h| Resource::parse(h).is_ok_and(|r| r.to_string() == *h));
        let text = match (host, q.ip) {
            (Some(h), _) => h,
            (None, Some(ip)) => ip.to_string(),
            (None, None) => "**".to_owned(),
        };
        let parsed = Resource::parse(&text).unwrap();
        let rule = (Rule::new(Verdict::Deny, parsed, Source::Local), Res { pat: Pat::Any, port: None });
        let q = if in_sandbox { Query { sandbox: Some("s"), ..q } } else { q };
        let list = if in_sandbox { &mut s.sandboxes[0].1 } else { &mut s.global };
        let i = at.index(list.len() + 1);
        list.insert(i, rule);
        for default in [Verdict::Allow, Verdict::Deny] {
            prop_assert_eq!(decide(&s.engine(default), &q).0, Verdict::Deny);
        }
    }

    #[test]
    fn adding_an_allow_never_denies(mut s in setup(), q in query(), extra in res(), in_sandbox in any::<bool>(), at in any::<prop::sample::Index>()) {
        let before = decide(&s.engine(Verdict::Deny), &q).0;
        let new = make(&[(Verdict::Allow, extra)]).remove(0);
        let list = if in_sandbox { &mut s.sandboxes[0].1 } else { &mut s.global };
        let i = at.index(list.len() + 1);
        list.insert(i, new);
        let after = decide(&s.engine(Verdict::Deny), &q).0;
        if before == Verdict::Allow {
            prop_assert_eq!(after, Verdict::Allow);
        }
    }
}

/// The agreement test is only as strong as its hit rate: make sure decisions
/// come from every kind of rule, not mostly from the default.
#[test]
fn generators_exercise_every_kind() {
    use proptest::strategy::ValueTree;
    use std::collections::HashMap;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut by_kind: HashMap<String, usize> = HashMap::new();
    let mut total = 0;
    for _ in 0..300 {
        let s = setup().new_tree(&mut runner).unwrap().current();
        let e = s.engine(Verdict::Deny);
        for _ in 0..10 {
            let q = query().new_tree(&mut runner).unwrap().current();
            total += 1;
            let d = e.decide(q.sandbox, q.host.as_deref(), q.ip, q.port);
            let key = d.matched_rule.map_or("default".to_owned(), |m| format!("{:?}", m.rule.resource.kind()));
            *by_kind.entry(key).or_default() += 1;
        }
    }
    for kind in ["Any", "Host", "Wildcard", "Glob", "Regex", "Ip", "Cidr"] {
        assert!(by_kind.get(kind).copied().unwrap_or(0) >= 5, "{kind} decided too rarely: {by_kind:?}");
    }
    assert!(by_kind["default"] < total * 9 / 10, "{by_kind:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// The fast file reader must agree with serde_norway whenever it answers,
    /// on written files and on files damaged by a hand edit.
    #[test]
    fn fast_reader_agrees_with_serde_norway(
        g in rules(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(vec![
            "", " ", "'", "\"", "#", ":", "-", "\n", "  ", "*", "~", "x", "[", "]", "\t", "\u{1a}", "\u{7f}", "é", " #", "# ", "''", " \n",
        ]), 0usize..3), 0..3),
    ) {
        let file = ppp::policy::GlobalFile { default: Verdict::Deny, preset: None, upload: None, download: None, approval_timeout: None, rules: make(&g).into_iter().map(|(r, _)| r).collect() };
        let mut text = serde_norway::to_string(&file).unwrap();
        let path = std::path::Path::new("p.yaml");
        prop_assert_eq!(ppp::policy::parse_global(path, &text).unwrap(), file);
        for (at, insert, delete) in edits {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) { i -= 1; }
            let end = (i + delete).min(text.len());
            if text.is_char_boundary(end) { text.replace_range(i..end, insert); }
            let fast = ppp::policy::parse_global(path, &text).ok();
            let slow = ppp::policy::parse_global_slow(path, &text).ok();
            prop_assert_eq!(fast, slow, "text:\n{}", text);
        }
    }
}

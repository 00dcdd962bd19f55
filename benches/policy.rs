//! Benchmarks for the policy engine: `decide` at 10, 1,000 and 10,000 rules,
//! and what `ppp policy check` pays before its first decision on a 10,000-rule
//! file (YAML parse, then engine build).
//!
//! The rule mix (see docs/policy.md): 60% exact hosts, 25% wildcards (15%
//! `*.d`, 7% `**.d`, 3% mid-label globs such as `api-*.d`), 5% regexes, 10%
//! addresses (5% IPv4 addresses, 3% IPv4 networks, 2% IPv6 networks). One
//! rule in ten is a deny, one in five has a port. Queries are half hits on
//! exact hosts, a fifth hits under wildcards, and the rest misses, some by IP.
//!
//! Run: `cargo bench --bench policy`. Set `PPP_BENCH_WRITE=path` to also
//! write the 10,000-rule file, e.g. to time a cold process on it.

use std::hint::black_box;
use std::net::IpAddr;
use std::path::Path;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use ppp::policy::{Engine, GlobalFile, Resource, Rule, Source, Verdict, parse_global, parse_global_slow};

/// xorshift64*: deterministic, and no dependency for a benchmark's dice.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const TLDS: [&str; 6] = ["com", "net", "org", "io", "dev", "ai"];

/// `n` rules of the documented mix, and the queries to ask.
fn workload(n: usize) -> (Vec<Rule>, Vec<(String, Option<IpAddr>)>) {
    let mut d = Dice(0x9e37_79b9_7f4a_7c15 ^ n as u64);
    let mut rules = Vec::with_capacity(n);
    let mut hits = Vec::new();
    for i in 0..n {
        let tld = TLDS[i % TLDS.len()];
        let roll = d.below(100);
        let (text, hit): (String, Option<(String, Option<IpAddr>)>) = match roll {
            0..60 => {
                let h = format!("h{i}.svc{}.example{}.{tld}", d.below(50), d.below(1000));
                (h.clone(), Some((h, None)))
            }
            60..75 => (format!("*.d{i}.{tld}"), Some((format!("x{}.d{i}.{tld}", d.below(9)), None))),
            75..82 => (format!("**.d{i}.{tld}"), Some((format!("a.b{}.d{i}.{tld}", d.below(9)), None))),
            82..85 => (format!("api-*.g{i}.{tld}"), Some((format!("api-eu{}.g{i}.{tld}", d.below(9)), None))),
            85..88 => (format!(r"^api[0-9]+\.r{i}\.example\.{tld}$"), Some((format!("api7.r{i}.example.{tld}"), None))),
            88..90 => (format!(r"(eu|us)-[a-z]+\.q{i}\.corp\.{tld}"), None),
            90..95 => {
                let a = format!("10.{}.{}.{}", d.below(256), d.below(256), d.below(256));
                let ip = a.parse().ok();
                (a, Some((String::new(), ip)))
            }
            95..98 => {
                let len = 8 + d.below(23);
                let raw = u32::try_from(d.next() >> 32).unwrap();
                let net = raw & u32::MAX.checked_shl(32 - u32::try_from(len).unwrap()).unwrap_or(0);
                (format!("{}/{len}", std::net::Ipv4Addr::from(net)), None)
            }
            _ => (format!("2001:db8:{:x}::/48", d.below(0xffff)), None),
        };
        let text = if d.below(5) == 0 { with_port(&text, 443) } else { text };
        let resource = Resource::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let decision = if d.below(10) == 0 { Verdict::Deny } else { Verdict::Allow };
        rules.push(Rule::new(decision, resource, Source::Local));
        if let Some(h) = hit {
            hits.push(h);
        }
    }
    let mut queries = Vec::new();
    for q in 0..1000u64 {
        match d.below(10) {
            0..7 if !hits.is_empty() => {
                queries.push(hits[usize::try_from(d.below(hits.len() as u64)).unwrap()].clone());
            }
            7 => queries.push((String::new(), Some(IpAddr::from([192, 0, 2, u8::try_from(q % 256).unwrap()])))),
            _ => queries.push((format!("miss{q}.nowhere{}.example.{}", d.below(100), TLDS[(q % 6) as usize]), None)),
        }
    }
    (rules, queries)
}

fn with_port(r: &str, port: u16) -> String {
    if r.contains(':') { format!("[{r}]:{port}") } else { format!("{r}:{port}") }
}

fn decide(c: &mut Criterion) {
    let mut g = c.benchmark_group("decide");
    for n in [10, 1_000, 10_000] {
        let (rules, queries) = workload(n);
        // Half the rules global, half in the sandbox asked about, plus a
        // second sandbox that must not be consulted.
        let sandbox = rules[n / 2..].to_vec();
        let engine =
            Engine::build(Verdict::Deny, rules[..n / 2].to_vec(), vec![("s".into(), sandbox), ("t".into(), vec![])])
                .unwrap();
        let mut i = 0;
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                let (host, ip) = &queries[i % queries.len()];
                i += 1;
                let host = (!host.is_empty()).then_some(host.as_str());
                black_box(engine.decide(Some("s"), black_box(host), *ip, 443).verdict)
            });
        });
    }
    g.finish();
}

fn check_path(c: &mut Criterion) {
    let (rules, _) = workload(10_000);
    let text = serde_norway::to_string(&GlobalFile {
        default: Verdict::Deny,
        preset: None,
        upload: None,
        download: None,
        approval_timeout: None,
        rules,
    })
    .unwrap();
    if let Some(out) = std::env::var_os("PPP_BENCH_WRITE") {
        std::fs::write(out, &text).unwrap();
    }
    let path = Path::new("policies.yaml");
    let mut g = c.benchmark_group("load_10k");
    g.sample_size(20);
    g.bench_function("yaml_parse", |b| b.iter(|| black_box(parse_global(path, &text).unwrap())));
    // The fallback a hand-edited file (comments, other quoting) takes.
    g.bench_function("yaml_parse_serde_norway", |b| b.iter(|| black_box(parse_global_slow(path, &text).unwrap())));
    let file = parse_global(path, &text).unwrap();
    g.bench_function("engine_build", |b| {
        b.iter_batched(
            || file.rules.clone(),
            |r| black_box(Engine::build(file.default, r, vec![]).unwrap()),
            BatchSize::LargeInput,
        );
    });
    g.bench_function("parse_build_decide", |b| {
        b.iter(|| {
            let f = parse_global(path, &text).unwrap();
            let e = Engine::build(f.default, f.rules, vec![]).unwrap();
            black_box(e.decide(None, Some("api.example.com"), None, 443).verdict)
        });
    });
    g.finish();
}

criterion_group!(benches, decide, check_path);
criterion_main!(benches);

//! What tokens cost: the price table that ships in the binary
//! (`assets/usage/prices.yaml`, dated) and the user's own
//! (`$PPP_CONFIG/usage/prices.yaml`, same shape, tried first). Never
//! fetched at run time (ADR 0054): a price list on the network would be
//! one more thing that can change what a report says without the user
//! seeing it.
//!
//! A model no entry prices has no cost (`None`), never a cost of zero, and
//! so does one with tokens of a kind its entry leaves unpriced (a cache
//! write at a provider whose entry has no `cache_write`). Prices are kept
//! as integer picodollars per token, so sums are exact and the same in any
//! order.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Deserialize;

use super::record::{Record, Tokens};
use crate::dirs::Dirs;
use crate::state::{self, ParseError};

/// The built-in table's name inside `assets/`.
pub const BUILT_IN: &str = "usage/prices.yaml";

/// The largest price accepted, in USD per million tokens: far above any
/// list price, low enough that no sum can overflow.
const MAX_USD_PER_MILLION: f64 = 1_000_000.0;

/// Picodollars in one dollar.
pub const PICO: u128 = 1_000_000_000_000;

/// The price of one model, in picodollars per token (USD per million
/// tokens × 10⁶).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Price {
    pub input: u64,
    pub output: u64,
    /// `None`: cached prompt tokens have no known price at this model.
    pub cache_read: Option<u64>,
    /// `None`: cache writes have no known price at this model.
    pub cache_write: Option<u64>,
}

impl Price {
    /// What `t` costs, in picodollars; `None` when `t` has tokens of a kind
    /// this price leaves out.
    pub fn cost(&self, t: &Tokens) -> Option<u128> {
        let part = |n: u64, p: Option<u64>| match (n, p) {
            (0, _) => Some(0),
            (n, Some(p)) => Some(u128::from(n) * u128::from(p)),
            (_, None) => None,
        };
        Some(
            part(t.input, Some(self.input))?
                + part(t.output, Some(self.output))?
                + part(t.cache_read, self.cache_read)?
                + part(t.cache_write, self.cache_write)?,
        )
    }
}

/// Where a table came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The user's file.
    User(PathBuf),
    /// Compiled into ppp.
    BuiltIn,
}

/// One price table.
#[derive(Debug, Clone)]
pub struct Table {
    /// When its prices were taken (`YYYY-MM-DD`).
    pub date: String,
    pub origin: Origin,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    provider: String,
    model: globset::GlobMatcher,
    price: Price,
}

/// Every table, the user's first.
#[derive(Debug, Clone)]
pub struct Prices {
    /// The user's file, whether it exists or not: what a report names when
    /// it tells the user where prices go.
    pub user_path: PathBuf,
    pub tables: Vec<Table>,
}

/// A price and the table (an index into [`Prices::tables`]) it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub price: Price,
    pub table: usize,
}

impl Prices {
    /// The first entry, the user's table first, whose provider is
    /// `provider` and whose pattern matches `model`.
    pub fn find(&self, provider: &str, model: &str) -> Option<Found> {
        self.tables.iter().enumerate().find_map(|(table, t)| {
            t.entries
                .iter()
                .find(|e| e.provider == provider && e.model.is_match(model))
                .map(|e| Found { price: e.price, table })
        })
    }

    /// What one record cost in US dollars; `None` when its model, or a
    /// kind of its tokens, has no price. The closure a budget's totals take
    /// (`usage::totals::Price`): `|r| prices.usd(r)`.
    pub fn usd(&self, rec: &Record) -> Option<f64> {
        if rec.tokens.total() == 0 {
            return Some(0.0);
        }
        let pico = self.find(&rec.provider, &rec.model)?.price.cost(&rec.tokens)?;
        // To the picodollar: far below what a cost budget compares.
        #[expect(clippy::cast_precision_loss, reason = "a dollar amount, not an exact count")]
        Some(pico as f64 / PICO as f64)
    }

    /// The built-in table alone, with `user_path` as where the user's would be.
    pub fn built_in(user_path: PathBuf) -> Prices {
        Prices { user_path, tables: vec![built_in()] }
    }
}

/// The user's table (if the file exists) and the built-in one.
pub fn load(dirs: &Dirs) -> Result<Prices> {
    let path = dirs.usage_prices();
    let mut prices = Prices::built_in(path.clone());
    if let Some(text) = state::read_optional(&path)?
        && !is_blank(&text)
    {
        let table = parse(&path, &text, Origin::User(path.clone())).map_err(|e| {
            crate::error::hinted(
                e,
                format!(
                    "fix that line (`ppp usage --help` shows the format), or move `{}` away to use the built-in prices",
                    path.display()
                ),
            )
        })?;
        prices.tables.insert(0, table);
    }
    Ok(prices)
}

fn is_blank(text: &str) -> bool {
    text.lines().map(str::trim).all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}

/// The table compiled into ppp. Its text is checked by a test, so it
/// always parses.
pub fn built_in() -> Table {
    let bytes = crate::assets::get(BUILT_IN).expect("assets/usage/prices.yaml is embedded");
    let text = String::from_utf8(bytes).expect("the built-in price table is UTF-8");
    parse(Path::new(BUILT_IN), &text, Origin::BuiltIn).expect("the built-in price table parses")
}

/// A price table read from `path`: errors name its line, column and field.
pub fn parse(path: &Path, text: &str, origin: Origin) -> Result<Table, ParseError> {
    let file: File = state::parse_yaml(path, text)?;
    let entries = file
        .prices
        .into_iter()
        .map(|e| Entry {
            provider: e.provider,
            model: e.model.0,
            price: Price {
                input: e.input.0,
                output: e.output.0,
                cache_read: e.cache_read.map(|p| p.0),
                cache_write: e.cache_write.map(|p| p.0),
            },
        })
        .collect();
    Ok(Table { date: file.date.0, origin, entries })
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    date: Day,
    #[expect(dead_code, reason = "checked when read: only USD is accepted")]
    currency: Usd,
    #[serde(default)]
    prices: Vec<FileEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    provider: String,
    model: Pattern,
    input: PerMillion,
    output: PerMillion,
    #[serde(default)]
    cache_read: Option<PerMillion>,
    #[serde(default)]
    cache_write: Option<PerMillion>,
}

/// A string field checked as it is read. The check runs inside the
/// visitor, while the YAML reader still stands on the value, so its error
/// names the field and the value's line, not the enclosing mapping's.
fn checked_str<'de, D, T>(d: D, what: &'static str, check: fn(&str) -> Result<T, String>) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct V<T> {
        what: &'static str,
        check: fn(&str) -> Result<T, String>,
    }
    impl<T> serde::de::Visitor<'_> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.what)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
            (self.check)(v).map_err(E::custom)
        }
    }
    d.deserialize_str(V { what, check })
}

/// `YYYY-MM-DD`.
#[derive(Debug)]
struct Day(String);

impl<'de> Deserialize<'de> for Day {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, "a date such as `2025-11-24`", |s| {
            let format = time::macros::format_description!("[year]-[month]-[day]");
            time::Date::parse(s, format)
                .map(|_| Day(s.to_owned()))
                .map_err(|_| format!("`{s}` is not a date such as `2025-11-24`"))
        })
    }
}

/// The currency: `USD`, the only one ppp prices in.
#[derive(Debug)]
struct Usd;

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, "`USD`", |s| {
            if s == "USD" { Ok(Usd) } else { Err(format!("`{s}` is not `USD`, the only currency ppp prices in")) }
        })
    }
}

/// A glob on the model name: `*` any run of characters, `?` one,
/// `[abc]` one of those, `{a,b}` either.
#[derive(Debug)]
struct Pattern(globset::GlobMatcher);

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, "a model pattern such as `claude-sonnet-4-5*`", |s| {
            if s.is_empty() {
                return Err("the model pattern is empty; `*` matches every model".to_owned());
            }
            globset::GlobBuilder::new(s)
                .literal_separator(false)
                .build()
                .map(|g| Pattern(g.compile_matcher()))
                .map_err(|e| format!("`{s}` is not a model pattern: {}", e.kind()))
        })
    }
}

/// USD per million tokens, as written; kept as picodollars per token.
#[derive(Debug)]
struct PerMillion(u64);

impl PerMillion {
    fn new(v: f64) -> Result<Self, String> {
        if !(0.0..=MAX_USD_PER_MILLION).contains(&v) {
            return Err(format!("`{v}` is not a price: USD per million tokens, from 0 to {MAX_USD_PER_MILLION}"));
        }
        // In range and rounded, so the cast neither truncates nor wraps.
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "checked range")]
        Ok(PerMillion((v * 1e6).round() as u64))
    }
}

impl<'de> Deserialize<'de> for PerMillion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = PerMillion;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a price in USD per million tokens, such as `3` or `0.30`")
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<PerMillion, E> {
                PerMillion::new(v).map_err(E::custom)
            }
            #[expect(clippy::cast_precision_loss, reason = "a price past 2^53 is refused either way")]
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<PerMillion, E> {
                PerMillion::new(v as f64).map_err(E::custom)
            }
            #[expect(clippy::cast_precision_loss, reason = "a price past 2^53 is refused either way")]
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<PerMillion, E> {
                PerMillion::new(v as f64).map_err(E::custom)
            }
        }
        d.deserialize_f64(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Result<Table, ParseError> {
        parse(Path::new("/c/usage/prices.yaml"), text, Origin::User("/c/usage/prices.yaml".into()))
    }

    fn prices() -> Prices {
        Prices::built_in("/c/usage/prices.yaml".into())
    }

    #[test]
    fn the_built_in_table_prices_the_current_models() {
        let p = prices();
        assert_eq!(p.tables[0].origin, Origin::BuiltIn);
        assert!(
            time::Date::parse(&p.tables[0].date, time::macros::format_description!("[year]-[month]-[day]")).is_ok()
        );
        let usd = |provider: &str, model: &str| {
            p.find(provider, model).map(|f| {
                let per_million = |x: u64| f64::from(u32::try_from(x).unwrap()) / 1e6;
                (per_million(f.price.input), per_million(f.price.output))
            })
        };
        assert_eq!(usd("anthropic", "claude-sonnet-4-5-20250929"), Some((3.0, 15.0)));
        assert_eq!(usd("anthropic", "claude-opus-4-5-20251101"), Some((5.0, 25.0)));
        assert_eq!(usd("anthropic", "claude-opus-4-1-20250805"), Some((15.0, 75.0)));
        assert_eq!(usd("anthropic", "claude-opus-4-20250514"), Some((15.0, 75.0)));
        assert_eq!(usd("anthropic", "claude-opus-4-0"), Some((15.0, 75.0)));
        assert_eq!(usd("anthropic", "claude-sonnet-4-20250514"), Some((3.0, 15.0)));
        assert_eq!(usd("anthropic", "claude-haiku-4-5-20251001"), Some((1.0, 5.0)));
        assert_eq!(usd("anthropic", "claude-3-5-haiku-20241022"), Some((0.8, 4.0)));
        assert_eq!(usd("openai", "gpt-5-2025-08-07"), Some((1.25, 10.0)));
        assert_eq!(usd("openai", "gpt-5-mini-2025-08-07"), Some((0.25, 2.0)));
        assert_eq!(usd("openai", "gpt-5-nano"), Some((0.05, 0.4)));
        assert_eq!(usd("openai", "gpt-4.1-mini-2025-04-14"), Some((0.4, 1.6)));
        assert_eq!(usd("openai", "gpt-4o-mini-2024-07-18"), Some((0.15, 0.6)));
        assert_eq!(usd("openai", "gpt-4o-2024-05-13"), Some((5.0, 15.0)), "the first gpt-4o snapshot kept its price");
        assert_eq!(usd("openai", "gpt-4o-2024-08-06"), Some((2.5, 10.0)));
        assert_eq!(usd("openai", "o3-2025-04-16"), Some((2.0, 8.0)));
        assert_eq!(usd("openai", "o4-mini"), Some((1.1, 4.4)));
        assert_eq!(usd("gemini", "gemini-2.5-pro"), Some((1.25, 10.0)));
        assert_eq!(usd("gemini", "gemini-2.5-flash"), Some((0.3, 2.5)));
        assert_eq!(usd("gemini", "gemini-2.5-flash-lite"), Some((0.1, 0.4)));
        // A name no entry was written for has no price: never a guessed
        // one from a looser pattern (gpt-5-pro costs twelve times gpt-5).
        assert_eq!(usd("openai", "gpt-5-pro"), None);
        assert_eq!(usd("anthropic", "claude-opus-4-7"), None);
        assert_eq!(usd("openai", "claude-sonnet-4-5"), None, "the provider is part of the key");
        assert_eq!(usd("anthropic", ""), None);
    }

    #[test]
    fn a_cost_is_exact_and_unknown_for_an_unpriced_kind() {
        let p = prices();
        let sonnet = p.find("anthropic", "claude-sonnet-4-5").unwrap().price;
        let t = Tokens { input: 1_000_000, output: 1_000_000, cache_read: 1_000_000, cache_write: 1_000_000 };
        // 3 + 15 + 0.30 + 3.75
        assert_eq!(sonnet.cost(&t), Some(22_050_000_000_000));
        let gemini = p.find("gemini", "gemini-2.5-flash").unwrap().price;
        assert_eq!(
            gemini.cost(&Tokens { input: 10, output: 10, ..Tokens::default() }),
            Some(10 * 300_000 + 10 * 2_500_000)
        );
        // Gemini's cache price is left out of the built-in table: with
        // cached tokens the cost is unknown, not the uncached part alone.
        assert_eq!(gemini.cost(&Tokens { input: 10, cache_read: 1, ..Tokens::default() }), None);
        assert_eq!(
            sonnet
                .cost(&Tokens { input: u64::MAX, output: u64::MAX, cache_read: u64::MAX, cache_write: u64::MAX })
                .map(|c| c > 0),
            Some(true)
        );
    }

    #[test]
    fn a_record_s_dollars_are_what_budget_totals_take() {
        let p = prices();
        let rec = |model: &str, input: u64| Record {
            ts: "2026-12-03T10:00:00Z".into(),
            sandbox: "red".into(),
            provider: "anthropic".into(),
            model: model.into(),
            requests: 1,
            estimated: 0,
            tokens: Tokens { input, output: 1_000_000, ..Tokens::default() },
            flow: Some(format!("f-{model}-{input}")),
        };
        let recs = [rec("claude-sonnet-4-5", 2_000_000), rec("claude-opus-9", 1)];
        assert_eq!(p.usd(&recs[0]), Some(21.0), "2 × $3 + $15");
        assert_eq!(p.usd(&recs[1]), None);
        let today = time::macros::date!(2026 - 12 - 03);
        let totals = crate::usage::totals::Totals::from_records(&recs, today, &|r: &Record| p.usd(r));
        let used = totals.day(Some("red"), today);
        assert_eq!((used.cost_usd, used.unpriced, used.requests), (21.0, 1, 2));
    }

    #[test]
    fn the_user_s_table_is_tried_first() {
        let mut p = prices();
        let t = table(
            "date: 2026-11-01\ncurrency: USD\nprices:\n  - {provider: anthropic, model: 'claude-sonnet-4*', input: 2, output: 10}\n  - {provider: gw, model: '*', input: 0.5, output: 1.5, cache_read: 0.05, cache_write: 0}\n",
        )
        .unwrap();
        assert_eq!(t.date, "2026-11-01");
        p.tables.insert(0, t);
        assert_eq!(p.find("anthropic", "claude-sonnet-4-5").map(|f| (f.table, f.price.input)), Some((0, 2_000_000)));
        assert_eq!(p.find("anthropic", "claude-haiku-4-5").map(|f| f.table), Some(1));
        assert_eq!(p.find("gw", "anything/at-all").map(|f| f.price.cache_write), Some(Some(0)));
    }

    #[test]
    fn bad_tables_name_line_and_field() {
        let err = |text: &str| table(text).unwrap_err().to_string();
        let e = err(
            "date: 2026-11-01\ncurrency: USD\nprices:\n  - provider: openai\n    model: gpt-5\n    input: cheap\n    output: 1\n",
        );
        assert!(e.starts_with("`/c/usage/prices.yaml` line 6, column 12: prices[0].input: invalid type"), "{e}");
        let e = err(
            "date: 2026-11-01\ncurrency: USD\nprices:\n  - {provider: openai, model: gpt-5, input: -1, output: 1}\n",
        );
        assert!(e.contains("line 4") && e.contains("prices[0].input: `-1` is not a price"), "{e}");
        let e = err("date: 2026-13-01\ncurrency: USD\n");
        assert!(e.contains("line 1") && e.contains("date: `2026-13-01` is not a date"), "{e}");
        let e = err("date: 2026-11-01\ncurrency: EUR\n");
        assert!(e.contains("line 2") && e.contains("currency: `EUR` is not `USD`"), "{e}");
        let e = err(
            "date: 2026-11-01\ncurrency: USD\nprices:\n  - {provider: openai, model: 'gpt-[5', input: 1, output: 1}\n",
        );
        assert!(e.contains("line 4") && e.contains("prices[0].model: `gpt-[5` is not a model pattern"), "{e}");
        let e = err(
            "date: 2026-11-01\ncurrency: USD\nprices:\n  - {provider: openai, model: gpt-5, input: 1, output: 1, cached: 1}\n",
        );
        assert!(e.contains("line 4") && e.contains("unknown field `cached`"), "{e}");
        let e = err(
            "date: 2026-11-01\ncurrency: USD\nprices:\n  - {provider: openai, model: gpt-5, input: x, output: 1}\n",
        );
        assert!(e.contains("line 4") && e.contains("prices[0].input: invalid type: string \"x\""), "{e}");
        let e = err("currency: USD\n");
        assert!(e.contains("missing field `date`"), "{e}");
    }
}

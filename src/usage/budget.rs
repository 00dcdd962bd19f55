//! Budgets (issue 27, point 4; ADR 0055): `$PPP_CONFIG/budgets.yaml`, the
//! check the daemon makes before a request to a metered provider, the 429
//! body that tells the agent why, and the one-time raise an approved `ask`
//! gives.
//!
//! Everything here but [`load`] and [`save`] is pure: the daemon holds the
//! [`Budgets`] it loaded, the [`Totals`] it keeps and the [`Raises`] it
//! granted, and asks [`check`] with the time. Core module: it never names
//! the command line.

use std::fmt::{self, Write as _};
use std::path::Path;
use std::str::FromStr;

use anyhow::Result;
use serde::{Deserialize, Deserializer, Serialize};
use time::{Date, OffsetDateTime, UtcOffset};

use super::provider::Dialect;
use super::totals::{Totals, Use};
use crate::state::{self, ParseError};

/// `$PPP_CONFIG/budgets.yaml`: every budget, in the order they were set.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Budgets {
    pub budgets: Vec<Budget>,
}

/// budgets.yaml as serde reads it; [`parse`] checks each entry into a
/// [`Budget`], naming the entry's line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    budgets: Vec<Entry>,
}

/// One budget: a limit on what a scope may use over a period.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(into = "Entry")]
pub struct Budget {
    pub scope: Scope,
    pub limit: Limit,
    pub per: Period,
    pub on_exceed: OnExceed,
}

/// Whose use a budget counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every sandbox's use together; it applies to each of them.
    Global,
    /// One sandbox's use.
    Sandbox(String),
}

/// What a budget limits: tokens ([`super::record::Tokens::total`], every
/// kind) or cost in US dollars. Also the amount a use or a raise is in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    Tokens(u64),
    CostUsd(f64),
}

/// The period a budget's use is summed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// One UTC day, from midnight to midnight.
    Day,
    /// All time: the budget never resets by itself.
    Total,
}

/// What a request past the budget meets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExceed {
    /// 429 at once.
    #[default]
    Deny,
    /// Held for an answer, as an `ask` default holds a connection; an
    /// approval raises the budget once ([`raise`]), a refusal or no answer
    /// is the 429.
    Ask,
}

impl Budget {
    /// Whether this budget counts `sandbox`'s requests.
    pub fn applies_to(&self, sandbox: &str) -> bool {
        match &self.scope {
            Scope::Global => true,
            Scope::Sandbox(s) => s == sandbox,
        }
    }

    /// Whether `other` is the same budget for [`Budgets::set`]: one scope,
    /// period and kind of limit (a token and a cost budget may stand side
    /// by side).
    pub fn same_slot(&self, other: &Budget) -> bool {
        self.scope == other.scope
            && self.per == other.per
            && std::mem::discriminant(&self.limit) == std::mem::discriminant(&other.limit)
    }

    /// What its scope used over its period, as of `today`.
    pub fn used(&self, totals: &Totals, today: Date) -> Use {
        let who = match &self.scope {
            Scope::Global => None,
            Scope::Sandbox(s) => Some(s.as_str()),
        };
        match self.per {
            Period::Day => totals.day(who, today),
            Period::Total => totals.all_time(who),
        }
    }
}

impl Budgets {
    /// Put `b` in place of the budget in its slot, or add it last. Whether
    /// one was replaced.
    pub fn set(&mut self, b: Budget) -> bool {
        if let Some(old) = self.budgets.iter_mut().find(|o| o.same_slot(&b)) {
            *old = b;
            true
        } else {
            self.budgets.push(b);
            false
        }
    }

    /// Take out the budgets of `scope` (of that period only, with `per`);
    /// the ones taken, in file order.
    pub fn remove(&mut self, scope: &Scope, per: Option<Period>) -> Vec<Budget> {
        let (gone, kept) = std::mem::take(&mut self.budgets)
            .into_iter()
            .partition(|b| &b.scope == scope && per.is_none_or(|p| p == b.per));
        self.budgets = kept;
        gone
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Global => f.write_str("global"),
            Self::Sandbox(s) => f.write_str(s),
        }
    }
}

impl FromStr for Scope {
    type Err = String;

    /// `global`, or a sandbox's name (`global` is reserved, so no sandbox
    /// has it).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "global" {
            return Ok(Self::Global);
        }
        crate::sandbox::validate_name(s).map_err(|e| e.to_string())?;
        Ok(Self::Sandbox(s.to_owned()))
    }
}

impl Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor, not `String` then a check: serde_norway places an
        // error at the scalar only while it is being read.
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Scope;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`global` or a sandbox's name")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Scope, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Day => "day",
            Self::Total => "total",
        })
    }
}

impl fmt::Display for OnExceed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Deny => "deny",
            Self::Ask => "ask",
        })
    }
}

impl Limit {
    /// Whether `used` has reached this limit (of the same kind).
    pub fn reached_by(self, used: &Use) -> bool {
        match self {
            Self::Tokens(n) => used.tokens >= n,
            Self::CostUsd(x) => used.cost_usd >= x,
        }
    }

    /// `used` in this limit's unit.
    #[must_use]
    pub fn of(self, used: &Use) -> Limit {
        match self {
            Self::Tokens(_) => Self::Tokens(used.tokens),
            Self::CostUsd(_) => Self::CostUsd(used.cost_usd),
        }
    }

    /// This amount twice over (saturating).
    fn doubled(self) -> Limit {
        match self {
            Self::Tokens(n) => Self::Tokens(n.saturating_mul(2)),
            Self::CostUsd(x) => Self::CostUsd(x * 2.0),
        }
    }

    /// The larger of two amounts of one kind; `self` when the kinds differ.
    fn max(self, other: Limit) -> Limit {
        match (self, other) {
            (Self::Tokens(a), Self::Tokens(b)) => Self::Tokens(a.max(b)),
            (Self::CostUsd(a), Self::CostUsd(b)) => Self::CostUsd(a.max(b)),
            _ => self,
        }
    }

    /// The amount as `ppp policy budget set` takes it: `--tokens 4M`,
    /// `--cost 5`.
    pub fn flag(self) -> String {
        match self {
            Self::Tokens(n) => format!("--tokens {}", compact_tokens(n)),
            Self::CostUsd(x) => format!("--cost {}", plain_usd(x)),
        }
    }

    /// For people: `4M tokens`, `1,234 tokens`, `$5.00`.
    pub fn describe(self) -> String {
        match self {
            Self::Tokens(n) => format!("{} tokens", compact_tokens(n)),
            Self::CostUsd(x) => format!("${x:.2}"),
        }
    }

    /// Exact, for a use: `4,000,120 tokens`, `$5.12`.
    pub fn describe_exact(self) -> String {
        match self {
            Self::Tokens(n) => format!("{} tokens", grouped(n)),
            Self::CostUsd(x) => format!("${x:.2}"),
        }
    }
}

/// `4M`, `500k`, `1.5M` when that is exact, else the digits.
pub fn compact_tokens(n: u64) -> String {
    for (unit, suffix) in [(1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")] {
        // One decimal at most: `n` is a whole number of tenths of `unit`.
        if n >= unit && n.is_multiple_of(unit / 10) {
            let whole = n / unit;
            let tenth = (n % unit) * 10 / unit;
            return if tenth == 0 { format!("{whole}{suffix}") } else { format!("{whole}.{tenth}{suffix}") };
        }
    }
    n.to_string()
}

/// `4000120` as `4,000,120`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `5`, `2.5`, `0.75`: dollars with no trailing zeros.
fn plain_usd(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A token count as a user writes it: `2000000`, `2M`, `500k`, `1.5M`
/// (k, M and G are powers of 1000). Zero is no budget, so it is refused.
pub fn parse_tokens(text: &str) -> Result<u64, String> {
    let t = text.trim().replace('_', "");
    let bad = || format!("`{text}` is not a token count (write e.g. `2000000`, `2M` or `500k`)");
    let (num, unit) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000u64),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        Some((i, 'g' | 'G')) => (&t[..i], 1_000_000_000),
        _ => (t.as_str(), 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad());
    }
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if whole.is_empty() || frac.contains('.') || (unit == 1 && !frac.is_empty()) {
        return Err(bad());
    }
    let whole: u64 = whole.parse().map_err(|_| bad())?;
    let mut n = whole.checked_mul(unit).ok_or_else(bad)?;
    // Decimals of a unit: `1.5M`; finer than one token is refused.
    let mut scale = unit;
    for d in frac.bytes() {
        scale /= 10;
        if scale == 0 {
            return Err(bad());
        }
        n = n.checked_add(u64::from(d - b'0') * scale).ok_or_else(bad)?;
    }
    if n == 0 {
        return Err(format!("`{text}` is zero tokens; remove the budget instead (`ppp policy budget rm`)"));
    }
    Ok(n)
}

/// Dollars as a user writes them: `5`, `2.50`, `$10`. More than zero.
pub fn parse_usd(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let x: f64 = t
        .strip_prefix('$')
        .unwrap_or(t)
        .parse()
        .map_err(|_| format!("`{text}` is not an amount of US dollars (write e.g. `5` or `2.50`)"))?;
    check_usd(x).map_err(|why| format!("`{text}` {why}"))
}

fn check_usd(x: f64) -> Result<f64, &'static str> {
    if !x.is_finite() || x <= 0.0 {
        return Err("must be more than zero dollars");
    }
    Ok(x)
}

/// A budget as it is in the file: the limit is one of two keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    scope: Scope,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "tokens_field")]
    tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "usd_field")]
    cost_usd: Option<f64>,
    per: Period,
    #[serde(default)]
    on_exceed: OnExceed,
}

impl TryFrom<Entry> for Budget {
    type Error = String;

    fn try_from(e: Entry) -> Result<Self, String> {
        let limit = match (e.tokens, e.cost_usd) {
            (Some(n), None) => Limit::Tokens(n),
            (None, Some(x)) => Limit::CostUsd(x),
            (Some(_), Some(_)) => return Err("a budget has `tokens` or `cost_usd`, not both".into()),
            (None, None) => return Err("a budget needs a limit: `tokens` or `cost_usd`".into()),
        };
        Ok(Budget { scope: e.scope, limit, per: e.per, on_exceed: e.on_exceed })
    }
}

impl From<Budget> for Entry {
    fn from(b: Budget) -> Self {
        let (tokens, cost_usd) = match b.limit {
            Limit::Tokens(n) => (Some(n), None),
            Limit::CostUsd(x) => (None, Some(x)),
        };
        Entry { scope: b.scope, tokens, cost_usd, per: b.per, on_exceed: b.on_exceed }
    }
}

/// `tokens: 2000000` or `tokens: 2M`, checked where it stands so the error
/// names its line.
fn tokens_field<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a token count such as 2000000 or `2M`")
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<u64, E> {
            if n == 0 { Err(E::custom("zero tokens is no budget; remove it instead")) } else { Ok(n) }
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<u64, E> {
            u64::try_from(n)
                .map_err(|_| E::custom(format!("`{n}` is not a token count")))
                .and_then(|n| self.visit_u64(n))
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<u64, E> {
            parse_tokens(s).map_err(E::custom)
        }
    }
    d.deserialize_any(V).map(Some)
}

/// `cost_usd: 5` or `cost_usd: 2.5`: more than zero.
fn usd_field<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = f64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an amount of US dollars such as 5 or 2.50")
        }
        fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<f64, E> {
            check_usd(x).map_err(E::custom)
        }
        #[allow(clippy::cast_precision_loss, reason = "a budget in dollars is far below 2^52")]
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<f64, E> {
            self.visit_f64(n as f64)
        }
        #[allow(clippy::cast_precision_loss, reason = "as above")]
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<f64, E> {
            self.visit_f64(n as f64)
        }
    }
    d.deserialize_any(V).map(Some)
}

/// Parse budgets.yaml's text; `path` is only used in messages. An empty
/// file (or comments only) has no budgets.
pub fn parse(path: &Path, text: &str) -> Result<Budgets, ParseError> {
    if text.lines().map(str::trim).all(|l| l.is_empty() || l.starts_with('#') || l == "---") {
        return Ok(Budgets::default());
    }
    let file: File = state::parse_yaml(path, text)?;
    let mut b = Budgets::default();
    for (i, e) in file.budgets.into_iter().enumerate() {
        let entry = Budget::try_from(e).map_err(|why| ParseError {
            path: path.to_owned(),
            line: entry_line(text, i),
            column: 1,
            message: format!("budgets[{i}]: {why}"),
        })?;
        b.budgets.push(entry);
    }
    // One budget per slot: a second would be silently shadowed by the first.
    for (i, x) in b.budgets.iter().enumerate() {
        if b.budgets[..i].iter().any(|y| y.same_slot(x)) {
            return Err(ParseError {
                path: path.to_owned(),
                line: entry_line(text, i),
                column: 1,
                message: format!(
                    "budgets[{i}]: a second {} {} budget for `{}`; keep one",
                    x.per,
                    match x.limit {
                        Limit::Tokens(_) => "token",
                        Limit::CostUsd(_) => "cost",
                    },
                    x.scope
                ),
            });
        }
    }
    Ok(b)
}

/// The line (from 1) where entry `i` of the `budgets:` list starts, for an
/// error serde cannot place: the `- ` items at the first item's indent.
fn entry_line(text: &str, i: usize) -> usize {
    let items = text.lines().enumerate().filter(|(_, l)| l.trim_start().starts_with("- ") || l.trim() == "-");
    let mut indent = None;
    let mut n = 0;
    for (at, l) in items {
        let here = l.len() - l.trim_start().len();
        if *indent.get_or_insert(here) != here {
            continue;
        }
        if n == i {
            return at + 1;
        }
        n += 1;
    }
    1
}

/// Read budgets.yaml; no file is no budgets.
pub fn load(path: &Path) -> Result<Budgets> {
    match state::read_optional(path)? {
        Some(text) => parse(path, &text).map_err(|e| {
            crate::error::hinted(
                e,
                "fix that line (docs/policy.md, \"Budgets\", shows the format), or move the file away and set the budgets again with `ppp policy budget set`",
            )
        }),
        None => Ok(Budgets::default()),
    }
}

/// Write budgets.yaml atomically. The caller holds `state.lock`.
pub fn save(path: &Path, b: &Budgets) -> Result<()> {
    state::write_yaml(path, b)
}

/// The raises approvals granted, per budget and period, held by the daemon
/// in memory (a restart forgets them: the budget in the file stands).
/// Bounded by the budgets: one entry per budget, and a daily one only for
/// the day it was granted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Raises {
    granted: Vec<Raise>,
}

/// One raise: while its budget is unchanged and its period lasts, the
/// budget's limit is `to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Raise {
    budget: Budget,
    /// The UTC day a daily budget's raise is for; `None` for a total.
    day: Option<Date>,
    to: Limit,
}

impl Raises {
    /// Keep `r`. A raise to no more than one already granted for the same
    /// budget and period changes nothing: approving two requests held by
    /// one exceeded budget raises it once.
    pub fn grant(&mut self, r: Raise) {
        let today = r.day;
        // Yesterday's raises of daily budgets can never apply again.
        self.granted.retain(|g| g.day.is_none() || g.day >= today);
        match self.granted.iter_mut().find(|g| g.budget == r.budget && g.day == r.day) {
            Some(g) => g.to = g.to.max(r.to),
            None => self.granted.push(r),
        }
    }

    /// Forget the raises no budget of `budgets` can use on `today`: of a
    /// budget changed or removed, or of a day gone. The daemon calls it when
    /// it reloads budgets.yaml, so raises stay bounded by the file.
    pub fn prune(&mut self, budgets: &Budgets, today: Date) {
        self.granted.retain(|g| budgets.budgets.contains(&g.budget) && g.day.is_none_or(|d| d >= today));
    }

    /// `b`'s limit in force on `today`: its own, or what a raise made it.
    /// A raise of a budget since changed (another limit, `ask` turned
    /// `deny`) is void: the user set the number they want.
    pub fn limit(&self, b: &Budget, today: Date) -> Limit {
        let day = (b.per == Period::Day).then_some(today);
        self.granted.iter().filter(|g| &g.budget == b && g.day == day).fold(b.limit, |l, g| l.max(g.to))
    }
}

/// What an approval of a request held by `ex` grants (ADR 0055): the
/// budget's limit in force plus one more of its own limit, for the period
/// it was exceeded in. Pure: the daemon [`Raises::grant`]s it.
pub fn raise(ex: &Exceeded) -> Raise {
    let to = match (ex.limit, ex.budget.limit) {
        (Limit::Tokens(now), Limit::Tokens(own)) => Limit::Tokens(now.saturating_add(own)),
        (Limit::CostUsd(now), Limit::CostUsd(own)) => Limit::CostUsd(now + own),
        (now, _) => now,
    };
    let day = (ex.budget.per == Period::Day).then(|| ex.at.to_offset(UtcOffset::UTC).date());
    Raise { budget: ex.budget.clone(), day, to }
}

/// A budget a request would go past.
#[derive(Debug, Clone, PartialEq)]
pub struct Exceeded {
    /// The budget as in the file.
    pub budget: Budget,
    /// Its limit in force: the budget's own, or raised by an approval.
    pub limit: Limit,
    /// What its scope used over its period, in the limit's unit.
    pub used: Limit,
    /// Of the requests counted, those without a price (a cost budget does
    /// not see their cost).
    pub unpriced: u64,
    /// When the check was made (UTC).
    pub at: OffsetDateTime,
    /// When a daily budget starts again: the next UTC midnight. `None` for
    /// a total.
    pub resets: Option<OffsetDateTime>,
    /// The command that raises it on the host: twice the limit in force,
    /// its period and `ask` kept.
    pub raise_command: String,
}

impl Exceeded {
    /// Whole seconds from the check to the reset, at least 1; `None` for a
    /// total.
    pub fn retry_after(&self) -> Option<u64> {
        self.resets.map(|r| u64::try_from((r - self.at).whole_seconds()).unwrap_or(0).max(1))
    }

    /// The sentence the agent (and the flow log) gets.
    pub fn message(&self) -> String {
        let kind = match self.budget.limit {
            Limit::Tokens(_) => "token",
            Limit::CostUsd(_) => "cost",
        };
        let period = match self.budget.per {
            Period::Day => "daily",
            Period::Total => "total",
        };
        let whose = match &self.budget.scope {
            Scope::Global => format!("the global {period} {kind} budget (all sandboxes together)"),
            Scope::Sandbox(s) => format!("the {period} {kind} budget of sandbox `{s}`"),
        };
        let over = match self.budget.per {
            Period::Day => "today",
            Period::Total => "in total",
        };
        let mut m =
            format!("ppp: {whose} is used up: {} of {} {over}", self.used.describe_exact(), self.limit.describe());
        if self.limit != self.budget.limit {
            let _ = write!(m, " (raised once from {})", self.budget.limit.describe());
        }
        if matches!(self.budget.limit, Limit::CostUsd(_)) && self.unpriced > 0 {
            let s = if self.unpriced == 1 { "" } else { "s" };
            let _ = write!(m, "; {} request{s} had no price and are not in the cost", self.unpriced);
        }
        match self.resets {
            Some(r) => {
                let _ = write!(m, ". It resets at {}", rfc3339(r));
            }
            None => m.push_str(". It does not reset by itself"),
        }
        let _ = write!(m, ". To raise it, run on the host: `{}`", self.raise_command);
        m
    }
}

/// `2026-12-04T00:00:00Z`.
fn rfc3339(t: OffsetDateTime) -> String {
    t.to_offset(UtcOffset::UTC)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.unix_timestamp().to_string())
}

/// The command that sets `b` to `limit`, keeping its scope, period and
/// `ask`.
pub fn set_command(b: &Budget, limit: Limit) -> String {
    let mut c = String::from("ppp policy budget set ");
    match &b.scope {
        Scope::Global => c.push_str("--global"),
        Scope::Sandbox(s) => c.push_str(s),
    }
    c.push(' ');
    c.push_str(&limit.flag());
    if b.per == Period::Total {
        c.push_str(" --per total");
    }
    if b.on_exceed == OnExceed::Ask {
        c.push_str(" --ask");
    }
    c
}

/// The first budget a request of `sandbox` at `now` would go past: the
/// sandbox's own budgets before the global ones, each in file order, with
/// use ≥ the limit in force (raised by `raises`). `None`: it may go on.
pub fn check(
    budgets: &Budgets,
    totals: &Totals,
    raises: &Raises,
    sandbox: &str,
    now: OffsetDateTime,
) -> Option<Exceeded> {
    let now = now.to_offset(UtcOffset::UTC);
    let today = now.date();
    let own = budgets.budgets.iter().filter(|b| b.scope != Scope::Global && b.applies_to(sandbox));
    let global = budgets.budgets.iter().filter(|b| b.scope == Scope::Global);
    own.chain(global).find_map(|b| {
        let limit = raises.limit(b, today);
        let used = b.used(totals, today);
        limit.reached_by(&used).then(|| Exceeded {
            budget: b.clone(),
            limit,
            used: limit.of(&used),
            unpriced: used.unpriced,
            at: now,
            resets: (b.per == Period::Day).then(|| today.next_day().unwrap_or(today).midnight().assume_utc()),
            raise_command: set_command(b, limit.doubled()),
        })
    })
}

/// The response a request past a budget gets instead of reaching the
/// provider.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// 429: the agents back off and show the message, rather than treat
    /// it as a broken request (400) or a missing key (401/403).
    pub status: u16,
    /// `content-type`, and `retry-after` (seconds to the reset) for a
    /// daily budget only: a total one never comes back by waiting, and a
    /// client that honours the header would wait forever.
    pub headers: Vec<(&'static str, String)>,
    pub body: serde_json::Value,
}

/// The 429 for `ex` in the error shape of `dialect`'s API.
pub fn refusal(ex: &Exceeded, dialect: Dialect) -> Refusal {
    let message = ex.message();
    let body = match dialect {
        Dialect::Anthropic => serde_json::json!({
            "type": "error",
            "error": { "type": "rate_limit_error", "message": message },
        }),
        Dialect::Openai => serde_json::json!({
            "error": {
                "message": message,
                "type": "insufficient_quota",
                "param": null,
                "code": "ppp_budget_exceeded",
            },
        }),
        Dialect::Gemini => serde_json::json!({
            "error": { "code": 429, "message": message, "status": "RESOURCE_EXHAUSTED" },
        }),
    };
    let mut headers = vec![("content-type", "application/json".to_owned())];
    if let Some(s) = ex.retry_after() {
        headers.push(("retry-after", s.to_string()));
    }
    Refusal { status: 429, headers, body }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::record::{Record, Tokens};
    use time::macros::{date, datetime};

    const NOW: OffsetDateTime = datetime!(2026-12-03 22:00:00 UTC);

    fn rec(sandbox: &str, tokens: u64) -> Record {
        Record {
            ts: "2026-12-03T10:00:00Z".into(),
            sandbox: sandbox.into(),
            provider: "anthropic".into(),
            model: "m".into(),
            requests: 1,
            estimated: 0,
            tokens: Tokens { input: tokens, ..Tokens::default() },
            flow: None,
        }
    }

    fn totals(recs: &[Record]) -> Totals {
        #[allow(clippy::cast_precision_loss, reason = "test sums are small")]
        let price = |r: &Record| (r.sandbox != "free").then(|| r.tokens.total() as f64 / 1_000_000.0);
        Totals::from_records(recs, date!(2026 - 12 - 03), &price)
    }

    fn budget(scope: &str, limit: Limit, per: Period, on_exceed: OnExceed) -> Budget {
        Budget { scope: scope.parse().unwrap(), limit, per, on_exceed }
    }

    fn parse_err(text: &str) -> ParseError {
        parse(Path::new("/c/budgets.yaml"), text).unwrap_err()
    }

    const FILE: &str = "\
budgets:
  - scope: global
    tokens: 10M
    per: day
  - scope: red
    cost_usd: 5
    per: total
    on_exceed: ask
  - scope: red
    tokens: 2000000
    per: day
";

    #[test]
    fn a_file_parses_and_round_trips() {
        let b = parse(Path::new("p"), FILE).unwrap();
        assert_eq!(
            b.budgets,
            [
                budget("global", Limit::Tokens(10_000_000), Period::Day, OnExceed::Deny),
                budget("red", Limit::CostUsd(5.0), Period::Total, OnExceed::Ask),
                budget("red", Limit::Tokens(2_000_000), Period::Day, OnExceed::Deny),
            ]
        );
        let text = serde_norway::to_string(&b).unwrap();
        insta::assert_snapshot!(text);
        assert_eq!(parse(Path::new("p"), &text).unwrap(), b);
        assert_eq!(parse(Path::new("p"), "# none yet\n").unwrap(), Budgets::default());
    }

    #[test]
    fn a_bad_file_names_file_line_and_field() {
        let cases = [
            (FILE.replace("tokens: 10M", "tokens: lots"), 3, "budgets[0].tokens: `lots` is not a token count"),
            (FILE.replace("tokens: 10M", "tokens: -4"), 3, "budgets[0].tokens: `-4` is not a token count"),
            (FILE.replace("tokens: 10M", "tokens: 0"), 3, "budgets[0].tokens: zero tokens"),
            (FILE.replace("cost_usd: 5", "cost_usd: -1"), 6, "budgets[1].cost_usd: must be more than zero"),
            (
                FILE.replace("scope: red\n    cost", "scope: Red!\n    cost"),
                5,
                "budgets[1].scope: invalid sandbox name `Red!`",
            ),
            (FILE.replace("per: total", "per: week"), 7, "budgets[1].per: unknown variant `week`"),
            (FILE.replace("on_exceed: ask", "on_exceed: warn"), 8, "budgets[1].on_exceed: unknown variant `warn`"),
            (FILE.replace("on_exceed: ask", "when: ask"), 8, "budgets[1]: unknown field `when`"),
            (FILE.replace("    per: total\n", ""), 5, "budgets[1]: missing field `per`"),
            (
                FILE.replace("    cost_usd: 5\n", "    cost_usd: 5\n    tokens: 9\n"),
                5,
                "budgets[1]: a budget has `tokens` or `cost_usd`, not both",
            ),
            (FILE.replace("    cost_usd: 5\n", ""), 5, "budgets[1]: a budget needs a limit"),
            (
                FILE.replace("per: total", "per: day").replace("cost_usd: 5", "tokens: 1k"),
                9,
                "budgets[2]: a second day token budget for `red`",
            ),
        ];
        for (text, line, needle) in cases {
            let e = parse_err(&text);
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("`/c/budgets.yaml` line {line}")), "want line {line}: {msg}");
            assert!(msg.contains(needle), "want {needle:?}: {msg}");
        }
    }

    #[test]
    fn token_counts_take_suffixes() {
        for (text, n) in [
            ("2M", 2_000_000),
            ("500k", 500_000),
            ("1.5M", 1_500_000),
            ("2_000", 2000),
            ("7", 7),
            ("1G", 1_000_000_000),
        ] {
            assert_eq!(parse_tokens(text), Ok(n), "{text}");
        }
        for bad in ["", "M", "1.5", "1.2345k", "-1k", "1..5M", "2 M", "99999999999999999999", "0", "0k"] {
            assert!(parse_tokens(bad).is_err(), "{bad}");
        }
        for (n, text) in
            [(4_000_000, "4M"), (500_000, "500k"), (1_500_000, "1.5M"), (1_234, "1234"), (12_345_000, "12345k")]
        {
            assert_eq!(compact_tokens(n), text);
            assert_eq!(parse_tokens(text), Ok(n));
        }
        assert_eq!(parse_usd("$2.50"), Ok(2.5));
        assert!(parse_usd("0").is_err() && parse_usd("NaN").is_err() && parse_usd("inf").is_err());
    }

    proptest::proptest! {
        /// What `ls` and the refusal print as a limit is what `set` takes.
        #[test]
        fn compact_token_counts_parse_back(n in 1u64..=u64::MAX) {
            proptest::prop_assert_eq!(parse_tokens(&compact_tokens(n)), Ok(n));
        }

        #[test]
        fn round_token_counts_parse_back(k in 1u64..100_000, e in 0u32..=14) {
            let n = k * 10u64.pow(e);
            proptest::prop_assert_eq!(parse_tokens(&compact_tokens(n)), Ok(n));
        }
    }

    #[test]
    fn set_replaces_its_slot_and_rm_takes_a_scope() {
        let mut b = parse(Path::new("p"), FILE).unwrap();
        assert!(b.set(budget("red", Limit::Tokens(4_000_000), Period::Day, OnExceed::Ask)));
        assert_eq!(b.budgets[2].limit, Limit::Tokens(4_000_000));
        assert!(
            !b.set(budget("red", Limit::CostUsd(1.0), Period::Day, OnExceed::Deny)),
            "a cost beside a token budget"
        );
        assert_eq!(b.budgets.len(), 4);
        let gone = b.remove(&"red".parse().unwrap(), Some(Period::Day));
        assert_eq!(gone.len(), 2);
        assert_eq!(b.remove(&Scope::Global, None).len(), 1);
        assert_eq!(b.budgets, [budget("red", Limit::CostUsd(5.0), Period::Total, OnExceed::Ask)]);
    }

    #[test]
    fn the_sandboxs_own_budget_comes_before_the_global_one() {
        let b = parse(Path::new("p"), FILE).unwrap();
        let none = Raises::default();
        assert_eq!(check(&b, &totals(&[rec("red", 1_999_999)]), &none, "red", NOW), None);
        // Red at its own daily limit, and everyone past the global one.
        let t = totals(&[rec("red", 2_000_000), rec("blue", 9_000_000)]);
        let ex = check(&b, &t, &none, "red", NOW).unwrap();
        assert_eq!(ex.budget, b.budgets[2]);
        assert_eq!((ex.limit, ex.used), (Limit::Tokens(2_000_000), Limit::Tokens(2_000_000)));
        assert_eq!(ex.resets, Some(datetime!(2026-12-04 00:00:00 UTC)));
        assert_eq!(ex.retry_after(), Some(7200));
        assert_eq!(ex.raise_command, "ppp policy budget set red --tokens 4M");
        // Blue has no budget of its own: the global one, over all sandboxes.
        let ex = check(&b, &t, &none, "blue", NOW).unwrap();
        assert_eq!((ex.budget.scope.clone(), ex.used), (Scope::Global, Limit::Tokens(11_000_000)));
        assert_eq!(ex.raise_command, "ppp policy budget set --global --tokens 20M");
        // A total cost budget: no reset, no retry-after; `ask` is kept.
        let t = totals(&[rec("red", 5_000_000)]);
        let only_cost = Budgets { budgets: vec![b.budgets[1].clone()] };
        let ex = check(&only_cost, &t, &none, "red", NOW).unwrap();
        assert_eq!((ex.used, ex.resets, ex.retry_after()), (Limit::CostUsd(5.0), None, None));
        assert_eq!(ex.raise_command, "ppp policy budget set red --cost 10 --per total --ask");
        // Yesterday's use is not today's: after midnight the day is new.
        let tomorrow = datetime!(2026-12-04 00:00:01 UTC);
        let t = totals(&[rec("red", 2_000_000)]);
        assert_eq!(check(&b, &t, &none, "red", tomorrow), None);
    }

    #[test]
    fn an_approval_raises_the_budget_once_for_its_period() {
        let b = Budgets { budgets: vec![budget("red", Limit::Tokens(1000), Period::Day, OnExceed::Ask)] };
        let mut raises = Raises::default();
        let t = totals(&[rec("red", 1000)]);
        let ex = check(&b, &t, &raises, "red", NOW).unwrap();
        let r = raise(&ex);
        // Two requests held by the same exceeded budget, both approved.
        raises.grant(r.clone());
        raises.grant(r);
        assert_eq!(raises.limit(&b.budgets[0], date!(2026 - 12 - 03)), Limit::Tokens(2000));
        assert_eq!(check(&b, &t, &raises, "red", NOW), None);
        let t = totals(&[rec("red", 2000)]);
        let ex = check(&b, &t, &raises, "red", NOW).unwrap();
        assert_eq!(ex.limit, Limit::Tokens(2000));
        assert!(ex.message().contains("(raised once from 1k tokens)"), "{}", ex.message());
        assert_eq!(ex.raise_command, "ppp policy budget set red --tokens 4k --ask");
        // A second approval, past the raised limit, raises by one more.
        raises.grant(raise(&ex));
        assert_eq!(raises.limit(&b.budgets[0], date!(2026 - 12 - 03)), Limit::Tokens(3000));
        // The next day the budget is its own again, and so is a changed one.
        assert_eq!(raises.limit(&b.budgets[0], date!(2026 - 12 - 04)), Limit::Tokens(1000));
        let changed = budget("red", Limit::Tokens(1500), Period::Day, OnExceed::Ask);
        assert_eq!(raises.limit(&changed, date!(2026 - 12 - 03)), Limit::Tokens(1500));
        // A grant on a later day drops the old day's raises.
        let next = check(&b, &totals(&[]), &raises, "red", NOW);
        assert_eq!(next, None);
        let mut later = raise(&ex);
        later.day = Some(date!(2026 - 12 - 04));
        raises.grant(later);
        assert_eq!(raises.granted.len(), 1);
        // A reload keeps the raises of the budgets still in the file only.
        let total = budget("red", Limit::Tokens(10), Period::Total, OnExceed::Ask);
        let t = totals(&[rec("red", 10)]);
        let both = Budgets { budgets: vec![b.budgets[0].clone(), total.clone()] };
        raises.grant(raise(&check(&Budgets { budgets: vec![total.clone()] }, &t, &raises, "red", NOW).unwrap()));
        assert_eq!(raises.limit(&total, date!(2026 - 12 - 03)), Limit::Tokens(20));
        raises.prune(&both, date!(2026 - 12 - 04));
        assert_eq!(raises.granted.len(), 2);
        raises.prune(&Budgets { budgets: vec![total.clone()] }, date!(2026 - 12 - 04));
        assert_eq!(raises.granted.len(), 1);
        assert_eq!(raises.limit(&total, date!(2027 - 01 - 01)), Limit::Tokens(20), "a total's raise has no day");
        raises.prune(&Budgets::default(), date!(2026 - 12 - 04));
        assert_eq!(raises, Raises::default());
    }

    fn exceeded(per: Period, limit: Limit, scope: &str, unpriced: u64) -> Exceeded {
        let b = Budgets { budgets: vec![budget(scope, limit, per, OnExceed::Deny)] };
        let mut t = totals(&[rec("red", 4_000_123), rec("free", 10)]);
        for _ in 1..unpriced {
            t.add(&rec("free", 1), &|_: &Record| None);
        }
        check(&b, &t, &Raises::default(), "red", NOW).unwrap()
    }

    #[test]
    fn refusal_bodies_per_dialect() {
        let daily = exceeded(Period::Day, Limit::Tokens(4_000_000), "red", 0);
        for (name, d) in [("anthropic", Dialect::Anthropic), ("openai", Dialect::Openai), ("gemini", Dialect::Gemini)] {
            assert_eq!(
                serde_json::from_value::<Dialect>(serde_json::json!(name)).ok(),
                Some(d),
                "as providers.yaml names it"
            );
            let r = refusal(&daily, d);
            assert_eq!(r.status, 429);
            assert_eq!(
                r.headers,
                [("content-type", "application/json".to_owned()), ("retry-after", "7200".to_owned())]
            );
            insta::assert_json_snapshot!(format!("refusal_{name}"), r.body);
        }
        assert!(serde_json::from_value::<Dialect>(serde_json::json!("claude")).is_err());
        let total = exceeded(Period::Total, Limit::CostUsd(4.0), "global", 3);
        let r = refusal(&total, Dialect::Openai);
        assert_eq!(r.headers, [("content-type", "application/json".to_owned())], "no retry-after for a total");
        insta::assert_json_snapshot!("refusal_openai_total_cost", r.body);
    }
}

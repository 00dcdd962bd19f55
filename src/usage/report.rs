//! What `ppp usage`, `ppp ls` and `ppp tui` say about tokens: the records
//! of usage.jsonl summed per (sandbox, provider, model) over windows of
//! time, priced, and rendered. Pure: the records, the time it is now and
//! the prices are passed in; nothing here reads a file or the clock.
//!
//! Windows are UTC days, as the log's roll-ups are: today, the last seven
//! days (today among them), all time, or from a time on (`--since`). A
//! roll-up line sums a whole past day, so it counts in a `--since` window
//! when its day ends after the window starts; when that day began before
//! it, the report says so ([`Report::whole_days`]) rather than pretend to
//! know which of that day's responses came after.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::price::{self, Prices};
use super::record::{Record, Tokens};

/// A span of time a report sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The current UTC day.
    Today,
    /// The last seven UTC days, today included.
    Week,
    /// Everything the log holds.
    All,
    /// From this time on.
    Since(OffsetDateTime),
}

impl Window {
    /// Its key in `--json`.
    pub fn name(self) -> &'static str {
        match self {
            Window::Today => "today",
            Window::Week => "week",
            Window::All => "all",
            Window::Since(_) => "since",
        }
    }

    /// When it starts; `None` for all time.
    pub fn start(self, now: OffsetDateTime) -> Option<OffsetDateTime> {
        let midnight = now.to_offset(time::UtcOffset::UTC).replace_time(time::Time::MIDNIGHT);
        match self {
            Window::Today => Some(midnight),
            Window::Week => Some(midnight - time::Duration::days(6)),
            Window::All => None,
            Window::Since(t) => Some(t),
        }
    }

    /// Whether `rec` counts in it. A roll-up whose day began before a
    /// `--since` counts whole, and sets `whole` to say so.
    fn contains(self, rec: &Record, now: OffsetDateTime, whole: &mut bool) -> bool {
        let Some(start) = self.start(now) else { return true };
        let Some(day) = day_start(rec) else { return false };
        match self {
            // Day windows compare days, which both kinds of line have; a
            // day after today (a clock set back since) is in none of them.
            Window::Today | Window::Week => day >= start && Window::Today.start(now).is_some_and(|today| day <= today),
            _ if rec.flow.is_some() => OffsetDateTime::parse(&rec.ts, &Rfc3339).is_ok_and(|t| t >= start),
            _ => {
                let inside = day + time::Duration::DAY > start;
                *whole |= inside && day < start;
                inside
            }
        }
    }
}

/// The start of the UTC day of `rec`.
fn day_start(rec: &Record) -> Option<OffsetDateTime> {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(rec.day(), format).ok().map(|d| d.midnight().assume_utc())
}

/// What one window holds for one row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sum {
    pub requests: u64,
    /// Of `requests`, those whose tokens are estimated.
    pub estimated: u64,
    pub tokens: Tokens,
    /// In picodollars; `None` when the model (or a kind of its tokens) has
    /// no price.
    pub cost: Option<u128>,
}

impl Sum {
    fn add(&mut self, r: &Record) {
        self.requests = self.requests.saturating_add(r.requests);
        self.estimated = self.estimated.saturating_add(r.estimated);
        self.tokens.add(&r.tokens);
    }

    /// `other` added in; the cost is known only when both are.
    fn merge(&mut self, other: &Sum) {
        self.requests = self.requests.saturating_add(other.requests);
        self.estimated = self.estimated.saturating_add(other.estimated);
        self.tokens.add(&other.tokens);
        self.cost = self.cost.zip(other.cost).map(|(a, b)| a.saturating_add(b));
    }
}

/// One (sandbox, provider, model) and its sums, one per window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub sandbox: String,
    pub provider: String,
    pub model: String,
    /// The price table that priced it (an index into [`Prices::tables`]).
    pub table: Option<usize>,
    /// In the order of [`Report::windows`].
    pub sums: Vec<Sum>,
}

/// Rows over windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub now: OffsetDateTime,
    pub windows: Vec<Window>,
    /// Sorted by sandbox, provider, model; only rows with a request in
    /// some window.
    pub rows: Vec<Row>,
    /// Days (`YYYY-MM-DD`) whose roll-ups counted whole in a `--since`
    /// window that starts after they began.
    pub whole_days: Vec<String>,
}

/// Sum `records` per (sandbox, provider, model) over `windows`, priced by
/// `prices`.
pub fn build(records: &[Record], now: OffsetDateTime, windows: &[Window], prices: &Prices) -> Report {
    let mut rows: BTreeMap<(&str, &str, &str), Vec<Sum>> = BTreeMap::new();
    let mut whole_days = std::collections::BTreeSet::new();
    for r in records {
        let hits: Vec<bool> = windows
            .iter()
            .map(|w| {
                let mut whole = false;
                let inside = w.contains(r, now, &mut whole);
                if whole {
                    whole_days.insert(r.day().to_owned());
                }
                inside
            })
            .collect();
        if !hits.contains(&true) {
            continue;
        }
        let sums =
            rows.entry((&r.sandbox, &r.provider, &r.model)).or_insert_with(|| vec![Sum::default(); windows.len()]);
        for (s, _) in sums.iter_mut().zip(&hits).filter(|(_, h)| **h) {
            s.add(r);
        }
    }
    let rows = rows
        .into_iter()
        .map(|((sandbox, provider, model), mut sums)| {
            let found = prices.find(provider, model);
            for s in &mut sums {
                // Nothing used costs nothing, priced or not.
                s.cost = if s.tokens.total() == 0 { Some(0) } else { found.and_then(|f| f.price.cost(&s.tokens)) };
            }
            Row {
                sandbox: sandbox.to_owned(),
                provider: provider.to_owned(),
                model: model.to_owned(),
                table: found.map(|f| f.table),
                sums,
            }
        })
        .collect();
    Report { now, windows: windows.to_vec(), rows, whole_days: whole_days.into_iter().collect() }
}

impl Report {
    /// Each sandbox's sum over window `i`, in name order.
    pub fn per_sandbox(&self, i: usize) -> BTreeMap<&str, Sum> {
        let mut out: BTreeMap<&str, Sum> = BTreeMap::new();
        for r in &self.rows {
            let s = out.entry(&r.sandbox).or_insert(Sum { cost: Some(0), ..Sum::default() });
            s.merge(&r.sums[i]);
        }
        out
    }

    fn total(&self, i: usize) -> Sum {
        let mut t = Sum { cost: Some(0), ..Sum::default() };
        for r in &self.rows {
            t.merge(&r.sums[i]);
        }
        t
    }
}

/// Tokens today per sandbox, for the TOKENS column of `ppp ls` and the
/// dashboard.
pub fn today(records: &[Record], now: OffsetDateTime) -> BTreeMap<String, Sum> {
    let none = Prices { user_path: std::path::PathBuf::new(), tables: Vec::new() };
    build(records, now, &[Window::Today], &none).per_sandbox(0).into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// A count with thousands separated: `1,234,567`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A count in five characters or fewer (`950`, `12.3k`, `456k`, `7.8M`),
/// rounded down so it never says more than was used.
pub fn short(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1_000_000_000_000, "T"), (1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")];
    for (size, unit) in UNITS {
        if n >= size {
            let tenths = n / (size / 10);
            return if tenths < 1000 {
                format!("{}.{}{unit}", tenths / 10, tenths % 10)
            } else {
                format!("{}{unit}", n / size)
            };
        }
    }
    n.to_string()
}

/// The TOKENS cell of `ppp ls` and the dashboard: `-` for none, `~` in
/// front when some of it is estimated.
pub fn tokens_cell(sum: Option<&Sum>) -> String {
    match sum {
        Some(s) if s.requests > 0 => format!("{}{}", if s.estimated > 0 { "~" } else { "" }, short(s.tokens.total())),
        _ => "-".to_owned(),
    }
}

/// Dollars: cents from one up, `<$0.01` below.
fn dollars(pico: u128) -> String {
    let cents = pico / (price::PICO / 100);
    if pico > 0 && cents == 0 {
        return "<$0.01".to_owned();
    }
    format!("${}.{:02}", grouped(u64::try_from(cents / 100).unwrap_or(u64::MAX)), cents % 100)
}

fn mark(s: &Sum) -> &'static str {
    if s.estimated > 0 { "~" } else { "" }
}

fn model_cell(model: &str) -> String {
    if model.is_empty() { "-".to_owned() } else { crate::output::printable(model).into_owned() }
}

/// What the footnotes under a table need to know.
#[derive(Default)]
struct Notes {
    estimated: bool,
    priced: std::collections::BTreeSet<usize>,
    unpriced: bool,
}

impl Notes {
    fn cost(&mut self, row: Option<&Row>, s: &Sum) -> String {
        if s.estimated > 0 {
            self.estimated = true;
        }
        if let Some(t) = row.and_then(|r| r.table) {
            self.priced.insert(t);
        }
        if let Some(c) = s.cost {
            format!("{}{}", mark(s), dollars(c))
        } else {
            self.unpriced = true;
            "-".to_owned()
        }
    }

    /// The footnotes, after a blank line under the table.
    fn render(&self, table: &mut String, report: &Report, prices: &Prices) {
        let mut notes = String::new();
        let out = &mut notes;
        if let [Window::Since(start)] = report.windows[..] {
            let _ = writeln!(out, "since {}", start.format(&Rfc3339).unwrap_or_default());
        }
        if self.estimated {
            out.push_str(
                "~ estimated: some responses reported no usage and were counted from what was seen (`ppp usage --help`)\n",
            );
        }
        for d in &report.whole_days {
            let _ = writeln!(out, "the whole of {d} counts: past days are kept as daily totals");
        }
        if !self.priced.is_empty() {
            let mut tables = Vec::new();
            let mut built_in = false;
            for t in self.priced.iter().filter_map(|&i| prices.tables.get(i)) {
                match &t.origin {
                    price::Origin::BuiltIn => {
                        built_in = true;
                        tables.push(format!("the built-in list prices of {}", t.date));
                    }
                    price::Origin::User(p) => tables.push(format!("your prices of {} (`{}`)", t.date, p.display())),
                }
            }
            let _ = write!(out, "cost: US dollars at {}", tables.join(" and "));
            if built_in {
                let _ = write!(out, "; check them: yours go in `{}`", prices.user_path.display());
            }
            out.push('\n');
        }
        if self.unpriced {
            let _ = writeln!(
                out,
                "- no price for that model (a total with `+` leaves it out): add one to `{}`",
                prices.user_path.display()
            );
        }
        if !notes.is_empty() {
            table.push('\n');
            table.push_str(&notes);
        }
    }
}

/// The table `ppp usage` prints for today, seven days and all time:
/// `report` built over [`Window::Today`], [`Window::Week`],
/// [`Window::All`].
pub fn render_overview(report: &Report, prices: &Prices) -> String {
    let mut notes = Notes::default();
    let tokens =
        |s: &Sum| if s.requests == 0 { "-".to_owned() } else { format!("{}{}", mark(s), grouped(s.tokens.total())) };
    let mut body: Vec<Vec<String>> = Vec::new();
    for r in &report.rows {
        let [today, week, all] = [&r.sums[0], &r.sums[1], &r.sums[2]];
        body.push(vec![
            r.sandbox.clone(),
            r.provider.clone(),
            model_cell(&r.model),
            tokens(today),
            tokens(week),
            tokens(all),
            notes.cost(Some(r), all),
        ]);
    }
    if report.rows.len() > 1 {
        let [today, week, all] = [report.total(0), report.total(1), report.total(2)];
        body.push(vec![
            "TOTAL".to_owned(),
            String::new(),
            String::new(),
            tokens(&today),
            tokens(&week),
            tokens(&all),
            total_cost(report, 2),
        ]);
    }
    let mut out = crate::output::table(&["SANDBOX", "PROVIDER", "MODEL", "TODAY", "7 DAYS", "ALL TIME", "COST"], &body);
    notes.render(&mut out, report, prices);
    out
}

/// The total's cost: the known costs summed, `+` after it when some model
/// had no price (so it is a floor), `-` when none had one.
fn total_cost(report: &Report, i: usize) -> String {
    let mut known = 0u128;
    let (mut some, mut missing, mut estimated) = (false, false, false);
    for r in &report.rows {
        let s = &r.sums[i];
        estimated |= s.estimated > 0;
        match s.cost {
            Some(c) => {
                some = true;
                known = known.saturating_add(c);
            }
            None => missing = true,
        }
    }
    if !some {
        return "-".to_owned();
    }
    format!("{}{}{}", if estimated { "~" } else { "" }, dollars(known), if missing { "+" } else { "" })
}

/// The table `ppp usage --since` prints: `report` built over one
/// [`Window::Since`].
pub fn render_window(report: &Report, prices: &Prices) -> String {
    let mut notes = Notes::default();
    let mut body: Vec<Vec<String>> = Vec::new();
    let cells = |s: &Sum| {
        let m = mark(s);
        vec![
            format!("{m}{}", grouped(s.tokens.input)),
            format!("{m}{}", grouped(s.tokens.output)),
            format!("{m}{}", grouped(s.tokens.cache_read)),
            format!("{m}{}", grouped(s.tokens.cache_write)),
            format!("{m}{}", grouped(s.tokens.total())),
            if s.estimated > 0 {
                format!("{} ({} est.)", grouped(s.requests), grouped(s.estimated))
            } else {
                grouped(s.requests)
            },
        ]
    };
    for r in &report.rows {
        let s = &r.sums[0];
        let mut row = vec![r.sandbox.clone(), r.provider.clone(), model_cell(&r.model)];
        row.extend(cells(s));
        row.push(notes.cost(Some(r), s));
        body.push(row);
    }
    if report.rows.len() > 1 {
        let mut row = vec!["TOTAL".to_owned(), String::new(), String::new()];
        row.extend(cells(&report.total(0)));
        row.push(total_cost(report, 0));
        body.push(row);
    }
    let mut out = crate::output::table(
        &["SANDBOX", "PROVIDER", "MODEL", "INPUT", "OUTPUT", "CACHE READ", "CACHE WRITE", "TOKENS", "REQUESTS", "COST"],
        &body,
    );
    notes.render(&mut out, report, prices);
    out
}

/// `ppp usage -q`: one line per sandbox, its name and its tokens over the
/// report's last window.
pub fn render_quiet(report: &Report) -> String {
    let last = report.windows.len().saturating_sub(1);
    let mut out = String::new();
    for (name, s) in report.per_sandbox(last) {
        let _ = writeln!(out, "{name} {}", s.tokens.total());
    }
    out
}

/// `ppp usage --json`: the stable object docs/user-guide/usage-report.md
/// documents.
#[derive(Debug, Serialize)]
pub struct Json {
    pub now: String,
    /// Each window's start (`null`: all time), by its name.
    pub windows: BTreeMap<&'static str, Option<String>>,
    pub currency: &'static str,
    /// The price tables that priced a row.
    pub prices: Vec<JsonTable>,
    pub rows: Vec<JsonRow>,
    pub whole_days: Vec<String>,
}

/// A price table as `--json` names it.
#[derive(Debug, Serialize)]
pub struct JsonTable {
    /// `built-in`, or the user's file.
    pub source: String,
    pub date: String,
}

/// A row as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct JsonRow {
    pub sandbox: String,
    pub provider: String,
    pub model: String,
    /// Each window's sum, by the window's name.
    #[serde(flatten)]
    pub sums: BTreeMap<&'static str, JsonSum>,
}

/// A sum as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct JsonSum {
    pub requests: u64,
    pub estimated: u64,
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub tokens: u64,
    /// USD, to the millionth; `null` when unknown.
    pub cost: Option<f64>,
}

impl From<&Sum> for JsonSum {
    fn from(s: &Sum) -> Self {
        #[expect(clippy::cast_precision_loss, reason = "a dollar amount to the millionth fits an f64's 53 bits")]
        let cost = s.cost.map(|c| (c / (price::PICO / 1_000_000)) as f64 / 1e6);
        JsonSum {
            requests: s.requests,
            estimated: s.estimated,
            input: s.tokens.input,
            output: s.tokens.output,
            cache_read: s.tokens.cache_read,
            cache_write: s.tokens.cache_write,
            tokens: s.tokens.total(),
            cost,
        }
    }
}

/// `report` as `--json` prints it.
pub fn json(report: &Report, prices: &Prices) -> Json {
    let stamp = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_default();
    let used: std::collections::BTreeSet<usize> = report.rows.iter().filter_map(|r| r.table).collect();
    Json {
        now: stamp(report.now),
        windows: report.windows.iter().map(|w| (w.name(), w.start(report.now).map(stamp))).collect(),
        currency: "USD",
        prices: used
            .into_iter()
            .filter_map(|i| prices.tables.get(i))
            .map(|t| JsonTable {
                source: match &t.origin {
                    price::Origin::BuiltIn => "built-in".to_owned(),
                    price::Origin::User(p) => p.display().to_string(),
                },
                date: t.date.clone(),
            })
            .collect(),
        rows: report
            .rows
            .iter()
            .map(|r| JsonRow {
                sandbox: r.sandbox.clone(),
                provider: r.provider.clone(),
                model: r.model.clone(),
                sums: report.windows.iter().zip(&r.sums).map(|(w, s)| (w.name(), JsonSum::from(s))).collect(),
            })
            .collect(),
        whole_days: report.whole_days.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use time::macros::datetime;

    use super::*;
    use crate::usage::price::{Origin, Prices};

    const NOW: OffsetDateTime = datetime!(2026-12-03 15:30 UTC);

    fn rec(ts: &str, sandbox: &str, provider: &str, model: &str, requests: u64, tokens: [u64; 4]) -> Record {
        let [input, output, cache_read, cache_write] = tokens;
        Record {
            ts: ts.into(),
            sandbox: sandbox.into(),
            provider: provider.into(),
            model: model.into(),
            requests,
            estimated: 0,
            tokens: Tokens { input, output, cache_read, cache_write },
            // A flow line has its time; a roll-up the start of its day.
            flow: (!ts.ends_with("T00:00:00Z")).then(|| format!("f-{ts}-{sandbox}")),
        }
    }

    /// Three sandboxes over two weeks: flow lines today and yesterday,
    /// roll-ups of past days, an estimated response, a model with no price
    /// and one with cache tokens its price leaves out.
    fn log() -> Vec<Record> {
        let mut estimated =
            rec("2026-12-03T15:00:00Z", "red-fox", "anthropic", "claude-sonnet-4-5-20250929", 1, [1_200, 300, 0, 0]);
        estimated.estimated = 1;
        vec![
            rec(
                "2026-11-20T00:00:00Z",
                "red-fox",
                "anthropic",
                "claude-sonnet-4-5-20250929",
                40,
                [400_000, 90_000, 2_000_000, 150_000],
            ),
            rec(
                "2026-11-29T00:00:00Z",
                "red-fox",
                "anthropic",
                "claude-sonnet-4-5-20250929",
                12,
                [120_000, 30_000, 600_000, 40_000],
            ),
            rec(
                "2026-12-02T18:00:00Z",
                "red-fox",
                "anthropic",
                "claude-sonnet-4-5-20250929",
                1,
                [5_000, 2_000, 50_000, 1_000],
            ),
            rec(
                "2026-12-03T09:00:00Z",
                "red-fox",
                "anthropic",
                "claude-sonnet-4-5-20250929",
                1,
                [8_000, 1_500, 64_000, 0],
            ),
            estimated,
            rec("2026-12-03T10:00:00Z", "red-fox", "anthropic", "claude-haiku-4-5-20251001", 1, [900, 100, 0, 0]),
            rec("2026-11-30T00:00:00Z", "blue-owl", "openai", "gpt-5-2025-08-07", 7, [70_000, 21_000, 35_000, 0]),
            rec("2026-12-03T14:59:00Z", "blue-owl", "openai", "gpt-5-2025-08-07", 1, [3_000, 800, 1_000, 0]),
            rec("2026-12-01T00:00:00Z", "green-elk", "gemini", "gemini-2.5-flash", 3, [30_000, 6_000, 9_000, 0]),
            rec("2026-12-03T12:00:00Z", "green-elk", "mygateway", "llama-4-maverick", 2, [4_000, 1_000, 0, 0]),
        ]
    }

    fn prices() -> Prices {
        Prices::built_in("/home/me/.config/ppp/usage/prices.yaml".into())
    }

    #[test]
    fn windows_are_utc_days_and_a_since() {
        let w = |ts: &str, window: Window| {
            let mut whole = false;
            let r = rec(ts, "s", "p", "m", 1, [1, 0, 0, 0]);
            (window.contains(&r, NOW, &mut whole), whole)
        };
        assert_eq!(w("2026-12-03T00:00:00Z", Window::Today), (true, false));
        assert_eq!(w("2026-12-02T23:59:59Z", Window::Today), (false, false));
        assert_eq!(w("2026-11-27T00:00:01Z", Window::Week), (true, false), "six days back is in the seven");
        assert_eq!(w("2026-11-26T23:59:59Z", Window::Week), (false, false));
        assert_eq!(w("2026-12-04T01:00:00Z", Window::Week), (false, false), "a day to come is in no day window");
        assert_eq!(w("2020-01-01T00:00:00Z", Window::All), (true, false));
        let since = Window::Since(datetime!(2026-12-01 12:00 UTC));
        assert_eq!(w("2026-12-01T11:59:59Z", since), (false, false));
        assert_eq!(w("2026-12-01T12:00:00Z", since), (true, false));
        // A roll-up of the day the window starts in counts, whole, and says so.
        assert_eq!(w("2026-12-01T00:00:00Z", since), (true, true));
        assert_eq!(w("2026-11-30T00:00:00Z", since), (false, false));
        assert_eq!(w("2026-12-02T00:00:00Z", since), (true, false));
        let mut bad = rec("yesterday", "s", "p", "m", 1, [1, 0, 0, 0]);
        bad.flow = None;
        assert!(!Window::Today.contains(&bad, NOW, &mut false));
        assert!(Window::All.contains(&bad, NOW, &mut false), "all time is every line");
    }

    #[test]
    fn sums_per_sandbox_provider_and_model() {
        let r = build(&log(), NOW, &[Window::Today, Window::Week, Window::All], &prices());
        let keys: Vec<_> = r.rows.iter().map(|r| (r.sandbox.as_str(), r.model.as_str())).collect();
        assert_eq!(
            keys,
            [
                ("blue-owl", "gpt-5-2025-08-07"),
                ("green-elk", "gemini-2.5-flash"),
                ("green-elk", "llama-4-maverick"),
                ("red-fox", "claude-haiku-4-5-20251001"),
                ("red-fox", "claude-sonnet-4-5-20250929"),
            ]
        );
        let sonnet = &r.rows[4];
        assert_eq!(sonnet.sums.iter().map(|s| s.requests).collect::<Vec<_>>(), [2, 15, 55]);
        assert_eq!(sonnet.sums[0].estimated, 1);
        assert_eq!(sonnet.sums[0].tokens.total(), 8_000 + 1_500 + 64_000 + 1_200 + 300);
        // 3 + 15 + 0.30 + 3.75 USD per million of each kind.
        let t = sonnet.sums[2].tokens;
        let expect = u128::from(t.input) * 3_000_000
            + u128::from(t.output) * 15_000_000
            + u128::from(t.cache_read) * 300_000
            + u128::from(t.cache_write) * 3_750_000;
        assert_eq!(sonnet.sums[2].cost, Some(expect));
        assert_eq!(r.rows[2].cost_all(), None, "a model with no price has no cost");
        assert_eq!(r.rows[1].cost_all(), None, "cached Gemini tokens have no built-in price");
        let per = r.per_sandbox(0);
        assert_eq!(per["green-elk"].cost, None, "a sandbox total with an unpriced row is unknown");
        assert_eq!(per["green-elk"].tokens.total(), 5_000, "the roll-up of Dec 1 is not today");
        assert_eq!(today(&log(), NOW)["red-fox"].tokens.total(), 8_000 + 1_500 + 64_000 + 1_200 + 300 + 1_000);
        assert!(!today(&log(), NOW).contains_key("nobody"));
    }

    impl Row {
        fn cost_all(&self) -> Option<u128> {
            self.sums.last().and_then(|s| s.cost)
        }
    }

    #[test]
    fn the_overview_table() {
        let p = prices();
        let r = build(&log(), NOW, &[Window::Today, Window::Week, Window::All], &p);
        insta::assert_snapshot!("overview", render_overview(&r, &p));
    }

    #[test]
    fn the_overview_of_one_priced_row_with_the_user_s_prices() {
        let mut p = prices();
        let user = Path::new("/home/me/.config/ppp/usage/prices.yaml");
        let t = price::parse(
            user,
            "date: 2026-11-02\ncurrency: USD\nprices:\n  - {provider: openai, model: 'gpt-5*', input: 1, output: 8, cache_read: 0.1}\n",
            Origin::User(user.to_owned()),
        )
        .unwrap();
        p.tables.insert(0, t);
        let only: Vec<Record> = log().into_iter().filter(|r| r.sandbox == "blue-owl").collect();
        let r = build(&only, NOW, &[Window::Today, Window::Week, Window::All], &p);
        insta::assert_snapshot!("overview_user_prices", render_overview(&r, &p));
    }

    #[test]
    fn the_since_table_says_which_days_count_whole() {
        let p = prices();
        let r = build(&log(), NOW, &[Window::Since(datetime!(2026-11-29 06:00 UTC))], &p);
        assert_eq!(r.whole_days, ["2026-11-29"]);
        insta::assert_snapshot!("since", render_window(&r, &p));
    }

    #[test]
    fn quiet_is_a_name_and_a_count_per_sandbox() {
        let p = prices();
        let r = build(&log(), NOW, &[Window::Today, Window::Week, Window::All], &p);
        assert_eq!(render_quiet(&r), "blue-owl 130800\ngreen-elk 50000\nred-fox 3564000\n");
    }

    #[test]
    fn the_json_object() {
        let p = prices();
        let r = build(&log(), NOW, &[Window::Today, Window::Week, Window::All], &p);
        insta::assert_json_snapshot!("json", json(&r, &p));
    }

    #[test]
    fn counts_read_short_and_grouped() {
        let cases = [
            (0, "0"),
            (999, "999"),
            (1_000, "1.0k"),
            (12_345, "12.3k"),
            (99_999, "99.9k"),
            (456_789, "456k"),
            (999_999, "999k"),
            (1_000_000, "1.0M"),
            (7_890_000_000, "7.8G"),
            (u64::MAX, "18446744T"),
        ];
        for (n, s) in cases {
            assert_eq!(short(n), s, "{n}");
        }
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(1_234), "1,234");
        assert_eq!(grouped(123_456), "123,456");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(dollars(0), "$0.00");
        assert_eq!(dollars(1), "<$0.01");
        assert_eq!(dollars(1_234_567 * price::PICO / 100), "$12,345.67");
        let est = Sum { requests: 2, estimated: 1, tokens: Tokens { input: 1_500, ..Tokens::default() }, cost: None };
        assert_eq!(tokens_cell(Some(&est)), "~1.5k");
        assert_eq!(tokens_cell(None), "-");
    }

    #[test]
    fn an_empty_log_has_no_rows() {
        let r = build(&[], NOW, &[Window::Today, Window::Week, Window::All], &prices());
        assert!(r.rows.is_empty());
        assert_eq!(render_quiet(&r), "");
    }
}

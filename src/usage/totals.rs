//! What each sandbox has used, in memory: the sums a budget is checked
//! against (issue 27, point 4). The daemon builds one from usage.jsonl
//! ([`super::record::read`]) when it starts and adds each new [`Record`] as
//! the writer appends it; `ppp policy budget ls` builds one to show use.
//!
//! Bounded whatever the log holds: one UTC day (the newest one seen, what
//! a daily budget needs) and the all-time sums, per sandbox and for all
//! sandboxes together. Older days fold into the all-time sums and are not
//! kept. The sandbox names come from the daemon's own identity of a flow
//! (never from the guest), so the maps grow only with the sandboxes made.
//!
//! Cost is the caller's: a closure prices a record (the price table is not
//! this module's). A record it cannot price adds no cost and is counted as
//! `unpriced`, so a cost budget can say what it could not see.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use time::Date;

use super::record::Record;

/// The price of one record in US dollars, `None` when its model has none.
pub trait Price: Fn(&Record) -> Option<f64> {}
impl<F: Fn(&Record) -> Option<f64>> Price for F {}

/// What was used over one period by one sandbox, or by all.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Use {
    /// Responses counted.
    pub requests: u64,
    /// Every kind of token together ([`super::record::Tokens::total`]).
    pub tokens: u64,
    /// Of the priced requests.
    pub cost_usd: f64,
    /// Requests the price closure had no price for: they add no cost.
    pub unpriced: u64,
    /// Requests whose tokens are estimated (the response reported none).
    pub estimated: u64,
}

impl Use {
    fn add(&mut self, rec: &Record, cost: Option<f64>) {
        self.requests = self.requests.saturating_add(rec.requests);
        self.tokens = self.tokens.saturating_add(rec.tokens.total());
        self.estimated = self.estimated.saturating_add(rec.estimated);
        match cost {
            // A price table is data a user can edit: a negative or NaN
            // price must not lower a sum a budget trusts.
            Some(c) if c.is_finite() && c >= 0.0 => self.cost_usd += c,
            _ => self.unpriced = self.unpriced.saturating_add(rec.requests),
        }
    }
}

/// The sums, per sandbox and for all sandboxes, of one UTC day and of all
/// time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// The day [`Totals::day`] sums: the newest day seen, or the one given
    /// to [`Totals::new`].
    day_of: Option<Date>,
    day: HashMap<String, Use>,
    day_all: Use,
    all: HashMap<String, Use>,
    all_all: Use,
}

impl Totals {
    /// Empty totals whose day is `today` (UTC): records of earlier days
    /// count only towards all time.
    pub fn new(today: Date) -> Self {
        Self { day_of: Some(today), ..Self::default() }
    }

    /// The totals of `records` (in any order, flow and roll-up lines
    /// alike), as of `today`.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a Record>, today: Date, price: &impl Price) -> Self {
        let mut t = Self::new(today);
        for r in records {
            t.add(r, price);
        }
        t
    }

    /// The totals of the log at `path` (a missing log has none), as of
    /// `today`, and how many of its lines were not records (skipped, as
    /// [`super::record::read`] does). What the daemon builds when it starts.
    pub fn from_log(path: &Path, today: Date, price: &impl Price) -> Result<(Self, usize)> {
        let read = super::record::read(path)?;
        Ok((Self::from_records(&read.records, today, price), read.malformed))
    }

    /// Count one more record. A record of a later day than the one kept
    /// starts that day (the old one is only in the all-time sums now); a
    /// record whose `ts` is not a date counts towards all time only.
    pub fn add(&mut self, rec: &Record, price: &impl Price) {
        let cost = price(rec);
        self.all.entry(rec.sandbox.clone()).or_default().add(rec, cost);
        self.all_all.add(rec, cost);
        let Some(day) = parse_day(rec.day()) else { return };
        if self.day_of.is_none_or(|d| day > d) {
            self.day_of = Some(day);
            self.day.clear();
            self.day_all = Use::default();
        }
        if self.day_of == Some(day) {
            self.day.entry(rec.sandbox.clone()).or_default().add(rec, cost);
            self.day_all.add(rec, cost);
        }
    }

    /// The use of `sandbox` (of all sandboxes with `None`) on UTC day
    /// `today`: nothing when no record of that day was counted yet, as
    /// after midnight.
    pub fn day(&self, sandbox: Option<&str>, today: Date) -> Use {
        if self.day_of != Some(today) {
            return Use::default();
        }
        match sandbox {
            Some(s) => self.day.get(s).copied().unwrap_or_default(),
            None => self.day_all,
        }
    }

    /// The all-time use of `sandbox` (of all sandboxes with `None`).
    pub fn all_time(&self, sandbox: Option<&str>) -> Use {
        match sandbox {
            Some(s) => self.all.get(s).copied().unwrap_or_default(),
            None => self.all_all,
        }
    }
}

/// `2026-12-03` as a date.
fn parse_day(text: &str) -> Option<Date> {
    Date::parse(text, time::macros::format_description!("[year]-[month]-[day]")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::record::{self, Tokens};
    use time::macros::date;

    fn rec(ts: &str, sandbox: &str, model: &str, input: u64, flow: Option<&str>) -> Record {
        Record {
            ts: ts.into(),
            sandbox: sandbox.into(),
            provider: "anthropic".into(),
            model: model.into(),
            requests: 1,
            estimated: 0,
            tokens: Tokens { input, output: 10, cache_read: 0, cache_write: 0 },
            flow: flow.map(Into::into),
        }
    }

    /// A dollar per thousand tokens for `priced`, no price for anything else.
    fn price(r: &Record) -> Option<f64> {
        #[allow(clippy::cast_precision_loss, reason = "test sums are small")]
        (r.model == "priced").then(|| r.tokens.total() as f64 / 1000.0)
    }

    #[test]
    fn flow_and_roll_up_lines_sum_alike_and_only_today_is_a_day() {
        // A roll-up of yesterday (three requests) and today's flow lines.
        let mut rollup = rec("2026-12-02T00:00:00Z", "red", "priced", 2990, None);
        rollup.requests = 3;
        rollup.estimated = 1;
        let text = [
            record::line(&rollup),
            record::line(&rec("2026-12-03T09:00:00Z", "red", "priced", 990, Some("f1"))),
            record::line(&rec("2026-12-03T10:00:00Z", "red", "other", 90, Some("f2"))),
            record::line(&rec("2026-12-03T11:00:00Z", "blue", "priced", 1990, Some("f3"))),
        ]
        .concat();
        let read = record::read_from(text.as_bytes()).unwrap();
        let t = Totals::from_records(&read.records, date!(2026 - 12 - 03), &price);

        let red_day = t.day(Some("red"), date!(2026 - 12 - 03));
        assert_eq!((red_day.requests, red_day.tokens, red_day.unpriced), (2, 1100, 1));
        assert!((red_day.cost_usd - 1.0).abs() < 1e-9, "{red_day:?}");
        let red_all = t.all_time(Some("red"));
        assert_eq!((red_all.requests, red_all.tokens, red_all.estimated, red_all.unpriced), (5, 4100, 1, 1));
        assert!((red_all.cost_usd - 4.0).abs() < 1e-9, "{red_all:?}");
        let all_day = t.day(None, date!(2026 - 12 - 03));
        assert_eq!((all_day.requests, all_day.tokens), (3, 3100));
        assert!((all_day.cost_usd - 3.0).abs() < 1e-9);
        assert_eq!(t.all_time(None).requests, 6);
        assert_eq!(t.day(Some("green"), date!(2026 - 12 - 03)), Use::default());
    }

    #[test]
    fn a_new_day_starts_at_utc_midnight_and_keeps_only_itself() {
        let mut t = Totals::new(date!(2026 - 12 - 03));
        t.add(&rec("2026-12-03T23:59:59Z", "red", "x", 90, Some("a")), &price);
        assert_eq!(t.day(Some("red"), date!(2026 - 12 - 03)).tokens, 100);
        // Before any record of the next day, that day reads as nothing.
        assert_eq!(t.day(Some("red"), date!(2026 - 12 - 04)), Use::default());
        t.add(&rec("2026-12-04T00:00:00Z", "blue", "x", 40, Some("b")), &price);
        assert_eq!(t.day(Some("red"), date!(2026 - 12 - 04)), Use::default());
        assert_eq!(t.day(Some("blue"), date!(2026 - 12 - 04)).tokens, 50);
        assert_eq!(t.day(None, date!(2026 - 12 - 03)), Use::default(), "yesterday is not kept");
        assert_eq!(t.day.len(), 1, "only today's sandboxes are held");
        // A late record of an earlier day counts towards all time only.
        t.add(&rec("2026-12-03T12:00:00Z", "red", "x", 0, Some("c")), &price);
        assert_eq!(t.day(None, date!(2026 - 12 - 04)).tokens, 50);
        assert_eq!(t.all_time(Some("red")).tokens, 110);
        // So does one whose time is not a date.
        t.add(&rec("garbage", "red", "x", 0, Some("d")), &price);
        assert_eq!((t.all_time(Some("red")).requests, t.day(None, date!(2026 - 12 - 04)).requests), (3, 1));
    }

    #[test]
    fn a_bad_price_counts_as_unpriced() {
        let mut t = Totals::new(date!(2026 - 12 - 03));
        let r = rec("2026-12-03T01:00:00Z", "red", "x", 0, None);
        t.add(&r, &|_: &Record| Some(-5.0));
        t.add(&r, &|_: &Record| Some(f64::NAN));
        t.add(&r, &|_: &Record| Some(0.25));
        let u = t.day(Some("red"), date!(2026 - 12 - 03));
        assert_eq!((u.requests, u.unpriced), (3, 2));
        assert!((u.cost_usd - 0.25).abs() < 1e-12);
    }
}

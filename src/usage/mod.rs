//! LLM usage per sandbox (issue 27): what each sandbox's agent spent in
//! tokens at its providers, read at the proxy from the upstream's responses.
//!
//! [`record`] is the shape of `$PPP_DATA/usage.jsonl` and its reader; the
//! daemon is the only writer ([`log`]). [`provider`] is the data that says
//! which responses are metered and where their usage is. [`totals`] sums the
//! log in memory per sandbox, per UTC day and all time; [`budget`] is
//! `$PPP_CONFIG/budgets.yaml`, the check against those sums and the 429 a
//! request past a budget gets. [`price`] is what tokens cost, [`report`] the
//! sums `ppp usage`, `ls` and `tui` show. Core module: it never names the
//! command line.

pub mod budget;
pub mod log;
pub mod price;
pub mod provider;
pub mod record;
pub mod report;
pub mod totals;

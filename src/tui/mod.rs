//! `ppp tui`: the dashboard. A live list of sandboxes with their machine,
//! tunnel and recent denials, and keys to start, stop, remove, open a shell,
//! attach the agent and read the flow log.
//!
//! Split so that everything but the terminal can be tested without one:
//! [`state`] is the pure model (`App`, `update(app, event) -> actions`),
//! [`view`] draws an `App` on any ratatui backend, [`data`] reads what the
//! dashboard shows, and the private runner owns the terminal, the poller
//! thread and the side effects the actions ask for.

pub mod approvals;
pub mod data;
pub mod flows;
pub mod live;
mod runner;
pub mod state;
mod term;
pub mod view;

pub use runner::run;

//! The dashboard's approvals: requests an `ask` default holds, polled from
//! the daemon on a thread of their own (so they show within half a second
//! however slowly podman answers the main poller), drawn as a view that
//! answers them with a key.

use std::sync::mpsc::Sender;
use std::time::Duration;

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, Borders, Cell, Row, Table};

use super::state::{App, Event};
use crate::dirs::Dirs;
use crate::output::printable;
use crate::policy::Verdict;
use crate::proxy::protocol::Pending;

/// How often the daemon's queue is read.
pub const INTERVAL: Duration = Duration::from_millis(500);

/// Send the held requests whenever they change, until the dashboard has
/// gone. A daemon that is not running holds nothing.
pub fn watch(dirs: &Dirs, tx: &Sender<Event>) {
    let mut last: Option<Vec<Pending>> = None;
    loop {
        let now = match crate::proxy::approvals(dirs) {
            Ok(held) => held.unwrap_or_default(),
            Err(e) => {
                tracing::debug!("could not list approvals: {e:#}");
                Vec::new()
            }
        };
        // Waiting times move every second; only the entries matter here,
        // the view shows times from the latest list anyway.
        let changed = last.as_ref().is_none_or(|l| {
            l.len() != now.len() || l.iter().zip(&now).any(|(a, b)| a.id != b.id || a.count != b.count)
        });
        if changed && tx.send(Event::Approvals(now.clone())).is_err() {
            return;
        }
        last = Some(now);
        std::thread::sleep(INTERVAL);
    }
}

/// Answer `id` once (this entry's requests only); the status line's text.
pub fn answer(dirs: &Dirs, id: &str, verdict: Verdict) -> Result<String, String> {
    let what = if verdict == Verdict::Allow { "allowed" } else { "denied" };
    match crate::proxy::answer(dirs, id, verdict) {
        Ok(Some(n)) => Ok(format!("{what} {id} ({n} request{})", if n == 1 { "" } else { "s" })),
        Ok(None) => Err(format!("{id} is no longer waiting (answered, timed out, or its client went away)")),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// The approvals view: one row per held entry, the cursor's reversed.
pub fn view(frame: &mut Frame, app: &App, area: Rect) {
    let rows: Vec<Row> = app
        .approvals
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let style =
                if i == app.approval_cursor { Style::new().add_modifier(Modifier::REVERSED) } else { Style::new() };
            Row::new(vec![
                Cell::from(p.id.clone()),
                Cell::from(printable(&p.sandbox).into_owned()),
                Cell::from(
                    printable(&if p.budget.is_some() { format!("budget: {}", p.target()) } else { p.target() })
                        .into_owned(),
                ),
                Cell::from(printable(p.method.as_deref().unwrap_or("-")).into_owned()),
                Cell::from(printable(p.path.as_deref().unwrap_or("-")).into_owned()),
                Cell::from(p.count.to_string()),
                Cell::from(format!("{}s", p.waiting_secs)),
                Cell::from(format!("{}s", p.remaining_secs)),
            ])
            .style(style)
        })
        .collect();
    let title = if app.approvals.is_empty() {
        " Approvals: nothing waits ".to_owned()
    } else {
        format!(" Approvals: {} waiting ", app.approvals.len())
    };
    let table = Table::new(
        rows,
        [
            Constraint::Length(8),
            Constraint::Length(14),
            Constraint::Min(20),
            Constraint::Length(7),
            Constraint::Min(16),
            Constraint::Length(5),
            Constraint::Length(7),
            Constraint::Length(5),
        ],
    )
    .header(
        Row::new(["ID", "SANDBOX", "TARGET", "METHOD", "PATH", "COUNT", "WAITING", "LEFT"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(Block::default().borders(Borders::ALL).title(title));
    frame.render_widget(table, area);
}

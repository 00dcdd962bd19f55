//! The dashboard's live flows: a thread that follows `flows.jsonl` with
//! [`policy::follow`](crate::policy::follow) and sends each batch of new
//! flows as they are logged (kept by the model in a bounded per-sandbox
//! [`Live`](super::live::Live)), and the pane under the sandbox list that
//! shows the selected sandbox's latest ones.
//!
//! The list's other columns refresh every 2 s with podman; flows come
//! through this separate path, polled every [`follow::INTERVAL`], so a flow
//! shows within a fraction of a second whatever podman is doing.

use std::path::Path;
use std::sync::mpsc::Sender;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};

use super::data::Flow;
use super::state::{App, Event};
use crate::policy::follow::{self, Follower};

/// Flows read from the end of the log when the dashboard starts, of every
/// sandbox together.
pub const BACKLOG: usize = 1000;

/// The main area's height below which the list gets it all: the pane needs
/// its border, a header and a few rows to be worth showing.
const PANE_MIN_AREA: u16 = 12;

/// Follow `path` until the dashboard has gone: first the last [`BACKLOG`]
/// flows, then every new batch, as [`Event::Flows`]. A read that fails is
/// logged (to `tui.log`) and tried again at the next poll.
pub fn watch(path: &Path, tx: &Sender<Event>) {
    let mut follower = match Follower::at_end(path) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), "could not follow the flow log: {e}");
            return;
        }
    };
    let backlog = follower.backlog(BACKLOG, None).unwrap_or_else(|e| {
        tracing::warn!("could not read the flow log: {e:#}");
        Vec::new()
    });
    if tx.send(Event::Flows(backlog.iter().map(Flow::from_json).collect())).is_err() {
        return;
    }
    loop {
        std::thread::sleep(follow::INTERVAL);
        match follower.poll_flows(None) {
            Ok(flows) if flows.is_empty() => {}
            Ok(flows) => {
                if tx.send(Event::Flows(flows.iter().map(Flow::from_json).collect())).is_err() {
                    return;
                }
            }
            Err(e) => tracing::warn!(path = %path.display(), "could not read the flow log: {e}"),
        }
    }
}

/// Split the list view's main area into the list and the flow pane under
/// it; no pane when no sandbox is selected or the area is too small to
/// hold both.
pub fn split(app: &App, area: Rect) -> (Rect, Option<Rect>) {
    if area.height < PANE_MIN_AREA || app.current().is_none() {
        return (area, None);
    }
    let [list, pane] = Layout::vertical([Constraint::Fill(1), Constraint::Percentage(45)]).areas(area);
    (list, Some(pane))
}

/// The pane: the selected sandbox's newest flows, newest at the bottom.
/// A denied flow reads `DENY` in STATUS and is drawn in red; the flow log
/// (`l`) has its rule and the rest.
pub fn pane(frame: &mut Frame, app: &App, area: Rect) {
    let Some(sb) = app.current() else { return };
    let flows = app.live.of(&sb.name);
    let block = Block::new().borders(Borders::ALL).title(format!(" latest flows of `{}` ", sb.name));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if flows.len() == 0 {
        frame.render_widget(
            Paragraph::new(format!("No flows recorded for `{}` yet; they appear here as they are logged.", sb.name)),
            inner,
        );
        return;
    }
    let visible = usize::from(inner.height.saturating_sub(1));
    let skip = flows.len().saturating_sub(visible);
    let rows = flows.skip(skip).map(|f| {
        let (status, style) = if f.denied {
            ("DENY".to_owned(), Style::new().fg(Color::Red).add_modifier(Modifier::BOLD))
        } else {
            (f.status.clone(), Style::new())
        };
        Row::new(vec![
            f.time.clone(),
            f.method.clone(),
            f.host.clone(),
            f.path.clone(),
            status,
            f.up.clone(),
            f.down.clone(),
            f.duration.clone(),
        ])
        .style(style)
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Fill(2),
        Constraint::Fill(3),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(8),
    ];
    let header = Row::new(["TIME", "METHOD", "HOST", "PATH", "STATUS", "UP", "DOWN", "DURATION"])
        .style(Style::new().add_modifier(Modifier::BOLD));
    frame.render_widget(Table::new(rows, widths).header(header), inner);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pane_needs_room_and_a_sandbox() {
        let mut app = App::default();
        let area = Rect::new(0, 0, 80, 20);
        assert_eq!(split(&app, area), (area, None), "nothing selected");
        app.snapshot.sandboxes.push(crate::tui::data::Sandbox {
            name: "a".into(),
            cpus: 2,
            memory_mib: 4096,
            agent: "opencode".into(),
            state: "running".into(),
            ports: "-".into(),
            workspace: "/ws".into(),
            inner_ip: std::net::Ipv4Addr::new(10, 0, 0, 1),
            tunnel: crate::tui::data::Link::Down,
            denials: 0,
            learning: false,
            tokens: "-".into(),
        });
        assert_eq!(split(&app, Rect::new(0, 0, 80, 11)), (Rect::new(0, 0, 80, 11), None));
        let (list, pane) = split(&app, area);
        let pane = pane.unwrap();
        assert_eq!(list.height + pane.height, 20);
        assert_eq!(pane.y, list.bottom());
    }
}

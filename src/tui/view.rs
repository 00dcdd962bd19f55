//! Drawing an [`App`]. Pure: the same `App` always draws the same frame, so
//! frames are snapshot-tested on ratatui's `TestBackend`. Colour only adds
//! to what the text already says (denials also read `DENY`, the selection
//! also has a `>` marker), so the dashboard works without colour.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table, TableState, Wrap};

use super::data::Link;
use super::state::{App, View};

const SPINNER: [&str; 4] = ["|", "/", "-", "\\"];

/// The key reference, shown by `?`: one (keys, what) pair per line.
pub const KEYS: &[(&str, &str)] = &[
    ("↑ ↓  j k", "move the selection (scroll in the flow log)"),
    ("s", "start the sandbox: boot its machine, provision and verify"),
    ("x", "stop the sandbox's machine (its port stays its own)"),
    ("d", "remove the sandbox, after a y/n confirmation"),
    ("e", "open a shell in the sandbox's VM (exit it to come back)"),
    ("a", "attach: run the agent on this terminal (quit it to come back)"),
    ("l", "flow log of the sandbox, denials highlighted"),
    ("p", "requests held for approval: a allows one once, d denies it"),
    ("r", "refresh now (otherwise every 2 s)"),
    ("?", "this help"),
    ("Esc", "back to the list"),
    ("q", "quit"),
];

/// Draw the whole screen.
pub fn render(frame: &mut Frame, app: &App) {
    let [top, main, status, hints] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(3), Constraint::Length(1), Constraint::Length(1)])
            .areas(frame.area());
    frame.render_widget(Paragraph::new(title(app)), top);
    match &app.view {
        View::List => {
            let (main, pane) = super::flows::split(app, main);
            list(frame, app, main);
            if let Some(pane) = pane {
                super::flows::pane(frame, app, pane);
            }
        }
        View::Flows { sandbox, scroll } => flows(frame, app, sandbox, *scroll, main),
        View::Approvals => super::approvals::view(frame, app, main),
        View::Help => help(frame, main),
    }
    frame.render_widget(Paragraph::new(status_line(app)), status);
    let keys = match app.view {
        View::List => " s start  x stop  d rm  e shell  a attach  l flows  p approvals  ? help  q quit",
        View::Flows { .. } => " ↑↓ scroll  Esc back  ? help  q quit",
        View::Approvals => " ↑↓ select  a allow once  d deny  Esc back  q quit",
        View::Help => " Esc back  q quit",
    };
    frame.render_widget(Paragraph::new(keys).style(Style::new().add_modifier(Modifier::DIM)), hints);
    if let Some(name) = &app.confirm_remove {
        confirm(frame, name, frame.area());
    }
}

fn title(app: &App) -> Line<'static> {
    let n = app.snapshot.sandboxes.len();
    let daemon = if app.snapshot.daemon_running { "daemon running" } else { "daemon stopped" };
    let mut spans = vec![
        Span::styled(" ppp ", Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED)),
        Span::raw(format!(" {n} sandbox{} · {daemon}", if n == 1 { "" } else { "es" })),
    ];
    // Held requests wait on the user: say so on every screen.
    let held = app.approvals.len();
    if held > 0 {
        spans.push(Span::styled(
            format!(" · {held} request{} waiting for approval (p)", if held == 1 { "" } else { "s" }),
            Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        ));
    }
    Line::from(spans)
}

fn status_line(app: &App) -> Line<'static> {
    if let Some(what) = &app.busy {
        return Line::from(format!(" {} {what}…", SPINNER[app.spinner % SPINNER.len()]))
            .style(Style::new().fg(Color::Yellow));
    }
    match &app.status {
        Some(s) if s.error => Line::from(format!(" {}", s.text)).style(Style::new().fg(Color::Red)),
        Some(s) => Line::from(format!(" {}", s.text)),
        None => Line::default(),
    }
}

fn list(frame: &mut Frame, app: &App, area: Rect) {
    let block = Block::new().borders(Borders::ALL).title(" sandboxes ");
    let snap = &app.snapshot;
    let warn_lines = u16::try_from(snap.warnings.len()).unwrap_or(u16::MAX).min(3);
    let [table_area, warn_area] =
        Layout::vertical([Constraint::Min(1), Constraint::Length(warn_lines)]).areas(block.inner(area));
    frame.render_widget(block, area);
    if !app.loaded || snap.sandboxes.is_empty() {
        let text = if app.loaded {
            vec![
                Line::from("No sandboxes yet."),
                Line::from(""),
                Line::from("Create one with `ppp create opencode .` or `ppp run opencode .`;"),
                Line::from("it shows up here within two seconds."),
            ]
        } else {
            vec![Line::from("loading…")]
        };
        frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: false }), table_area);
    } else {
        let header = Row::new([
            "NAME",
            "AGENT",
            "STATUS",
            "CPUS",
            "MEMORY",
            "TUNNEL",
            "INNER IP",
            "PORTS",
            "DENIALS",
            "TOKENS",
            "WORKSPACE",
        ])
        .style(Style::new().add_modifier(Modifier::BOLD));
        let rows = snap.sandboxes.iter().map(|s| {
            let status_style = match s.state.as_str() {
                "running" => Style::new().fg(Color::Green),
                "missing" | "failed" => Style::new().fg(Color::Red),
                _ => Style::new(),
            };
            let tunnel_style = match s.tunnel {
                Link::Up => Style::new().fg(Color::Green),
                Link::Idle => Style::new(),
                Link::Down => Style::new().add_modifier(Modifier::DIM),
            };
            let denials = if s.denials == 0 {
                Cell::from("0")
            } else {
                Cell::from(s.denials.to_string()).style(Style::new().fg(Color::Red).add_modifier(Modifier::BOLD))
            };
            Row::new(vec![
                Cell::from(s.name.clone()),
                Cell::from(s.agent.clone()),
                // Learning is said where the state is: it changes what the
                // sandbox may reach.
                Cell::from(if s.learning { format!("{} (learning)", s.state) } else { s.state.clone() })
                    .style(status_style),
                Cell::from(s.cpus.to_string()),
                Cell::from(crate::cmd::ls::memory(s.memory_mib)),
                Cell::from(s.tunnel.label()).style(tunnel_style),
                Cell::from(s.inner_ip.to_string()),
                Cell::from(s.ports.clone()),
                denials,
                Cell::from(s.tokens.clone()),
                Cell::from(s.workspace.clone()),
            ])
        });
        // Name and ports as wide as their longest entry (capped), so the
        // workspace gets the rest of the line.
        let widest = |f: fn(&super::data::Sandbox) -> usize, header: usize, cap: usize| {
            let w = snap.sandboxes.iter().map(f).max().unwrap_or(0).clamp(header, cap);
            Constraint::Length(u16::try_from(w).unwrap_or(u16::MAX))
        };
        let widths = [
            widest(|s| s.name.chars().count(), 4, 32),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(4),
            Constraint::Length(6),
            Constraint::Length(6),
            Constraint::Length(10),
            widest(|s| s.ports.chars().count(), 5, 32),
            Constraint::Length(7),
            Constraint::Length(6),
            Constraint::Fill(1),
        ];
        let table = Table::new(rows, widths)
            .header(header)
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
            .highlight_symbol("> ");
        let mut state = TableState::new().with_selected(Some(app.selected));
        frame.render_stateful_widget(table, table_area, &mut state);
    }
    let warnings: Vec<Line> = snap
        .warnings
        .iter()
        .map(|w| Line::from(format!("warning: {w}")).style(Style::new().fg(Color::Yellow)))
        .collect();
    frame.render_widget(Paragraph::new(warnings), warn_area);
}

fn flows(frame: &mut Frame, app: &App, sandbox: &str, scroll: usize, area: Rect) {
    let all: Vec<_> = app.flows_of(sandbox).collect();
    let denied = all.iter().filter(|f| f.denied).count();
    let block = Block::new()
        .borders(Borders::ALL)
        .title(format!(" flows of `{sandbox}`: {} recent, {denied} denied ", all.len()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if all.is_empty() {
        frame.render_widget(Paragraph::new(format!("No flows recorded for `{sandbox}` yet.")), inner);
        return;
    }
    // The newest flows fill the bottom, like a log; `scroll` moves the
    // window up. One line goes to the header.
    let visible = usize::from(inner.height.saturating_sub(1)).max(1);
    let end = all.len() - scroll.min(all.len() - 1);
    let start = end.saturating_sub(visible);
    let rows = all[start..end].iter().map(|f| {
        let (decision, style) = if f.denied {
            ("DENY", Style::new().fg(Color::Red).add_modifier(Modifier::BOLD))
        } else {
            ("allow", Style::new())
        };
        Row::new(vec![
            f.time.clone(),
            f.kind.clone(),
            f.method.clone(),
            f.host.clone(),
            f.port.clone(),
            f.status.clone(),
            decision.to_owned(),
            f.rule.clone(),
        ])
        .style(style)
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Length(5),
        Constraint::Length(7),
        Constraint::Fill(1),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Max(16),
    ];
    let header = Row::new(["TIME", "KIND", "METHOD", "HOST", "PORT", "STATUS", "DECISION", "RULE"])
        .style(Style::new().add_modifier(Modifier::BOLD));
    frame.render_widget(Table::new(rows, widths).header(header), inner);
}

fn help(frame: &mut Frame, area: Rect) {
    let mut lines: Vec<Line> = KEYS
        .iter()
        .map(|(k, what)| Line::from(vec![Span::styled(format!("  {k:<10}"), Style::new().bold()), Span::raw(*what)]))
        .collect();
    lines.insert(0, Line::from(""));
    lines.extend([
        Line::from(""),
        Line::from("  The list refreshes every 2 s from the sandbox records, `podman machine list`,"),
        Line::from("  the daemon's tunnel activity and the end of flows.jsonl. TUNNEL is up when the"),
        Line::from("  tunnel carried a connection in the last 3 minutes; DENIALS counts denied flows"),
        Line::from("  among the last 1000 in the log. The flows under the list and in the flow log"),
        Line::from("  follow flows.jsonl as the proxy writes it."),
    ]);
    let block = Block::new().borders(Borders::ALL).title(" keys ");
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

fn confirm(frame: &mut Frame, name: &str, area: Rect) {
    let width = area.width.min(64);
    let [_, mid, _] = Layout::vertical([Constraint::Fill(1), Constraint::Length(6), Constraint::Fill(1)]).areas(area);
    let [_, popup, _] =
        Layout::horizontal([Constraint::Fill(1), Constraint::Length(width), Constraint::Fill(1)]).areas(mid);
    let text = vec![
        Line::from(format!("Remove sandbox `{name}`?")),
        Line::from("Its machine, port and state are deleted."),
        Line::from(""),
        Line::from("y: remove    n: keep"),
    ];
    let block = Block::new().borders(Borders::ALL).title(" confirm ").style(Style::new().fg(Color::Red));
    frame.render_widget(Clear, popup);
    frame.render_widget(Paragraph::new(text).block(block), popup);
}

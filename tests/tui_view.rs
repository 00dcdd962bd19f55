//! The dashboard's frames, drawn from hand-made models on ratatui's
//! `TestBackend` and snapshotted: the list with several sandboxes (one with
//! denials), the flow log with a denial highlighted, the help, the remove
//! confirmation and the empty state. Colour is not in the snapshots, so the
//! highlight is checked on the buffer's cells.

use ppp::tui::data::{Flow, Link, Sandbox, Snapshot};
use ppp::tui::state::{App, Event, View, update};
use ppp::tui::view;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::style::Color;

fn sandbox(name: &str, state: &str, port: u8, tunnel: Link, denials: usize) -> Sandbox {
    Sandbox {
        name: name.into(),
        cpus: 2,
        memory_mib: 4096,
        agent: "opencode".into(),
        state: state.into(),
        ports: if name == "blue" { "127.0.0.1:18080->3000/tcp".into() } else { "-".into() },
        workspace: format!("/home/me/src/{name}"),
        inner_ip: std::net::Ipv4Addr::new(10, 0, 0, port),
        tunnel,
        denials,
        learning: false,
        tokens: match name {
            "blue" => "1.2M".into(),
            "red" => "~48.5k".into(),
            _ => "-".into(),
        },
    }
}

fn flow(sandbox: &str, sec: u8, host: &str, denied: bool) -> Flow {
    Flow {
        sandbox: sandbox.into(),
        time: format!("12:00:{sec:02}"),
        kind: "http".into(),
        method: "GET".into(),
        host: host.into(),
        port: "443".into(),
        status: if denied { "403".into() } else { "200".into() },
        denied,
        rule: if denied { "default".into() } else { "r1".into() },
        path: format!("/v1/call{sec}"),
        up: "1.5KiB".into(),
        down: if denied { "0B".into() } else { "20KiB".into() },
        duration: format!("{sec}0ms"),
    }
}

fn loaded() -> App {
    let mut app = App::default();
    let flows = vec![
        flow("red", 1, "api.anthropic.com", false),
        flow("blue", 2, "registry.npmjs.org", false),
        flow("red", 3, "evil.example.com", true),
        flow("red", 4, "api.anthropic.com", false),
        flow("red", 5, "pastebin.com", true),
    ];
    let snapshot = Snapshot {
        sandboxes: vec![
            sandbox("blue", "running", 1, Link::Up, 0),
            sandbox("green", "stopped", 2, Link::Down, 0),
            sandbox("red", "running", 3, Link::Idle, 2),
        ],
        flows: flows.clone(),
        daemon_running: true,
        warnings: Vec::new(),
    };
    update(&mut app, Event::Snapshot(snapshot));
    // The flow views are fed by the follower, not the refresh.
    update(&mut app, Event::Flows(flows));
    app
}

fn press(app: &mut App, c: char) {
    update(app, Event::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE)));
}

fn draw(app: &App) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(112, 16)).unwrap();
    t.draw(|f| view::render(f, app)).unwrap();
    t
}

/// The row of the buffer holding `text`, and the column where it starts.
fn find(t: &Terminal<TestBackend>, text: &str) -> (u16, u16) {
    let buf = t.backend().buffer();
    for y in 0..buf.area.height {
        let line: String = (0..buf.area.width).map(|x| buf[(x, y)].symbol().to_owned()).collect();
        if let Some(i) = line.find(text) {
            let x = line[..i].chars().count();
            return (u16::try_from(x).unwrap(), y);
        }
    }
    panic!("`{text}` is not on the screen:\n{}", t.backend());
}

#[test]
fn list_with_several_sandboxes_and_denials() {
    let mut app = loaded();
    press(&mut app, 'j');
    let t = draw(&app);
    insta::assert_snapshot!("tui_list", t.backend());
    // red's denial count stands out; blue's zero does not.
    let (x, y) = find(&t, "2       ~48.5k");
    assert_eq!(t.backend().buffer()[(x, y)].fg, Color::Red);
    // Tokens today: `-` for none.
    find(&t, "0       -      /home/me/");
}

#[test]
fn flow_log_highlights_denials() {
    let mut app = loaded();
    press(&mut app, 'G');
    press(&mut app, 'l');
    assert_eq!(app.view, View::Flows { sandbox: "red".into(), scroll: 0 });
    let t = draw(&app);
    insta::assert_snapshot!("tui_flows", t.backend());
    let (x, y) = find(&t, "pastebin.com");
    assert_eq!(t.backend().buffer()[(x, y)].fg, Color::Red, "denied flow in red");
    let (x, y) = find(&t, "DENY");
    assert_eq!(t.backend().buffer()[(x, y)].fg, Color::Red);
    let (x, y) = find(&t, "api.anthropic.com");
    assert_eq!(t.backend().buffer()[(x, y)].fg, Color::Reset, "allowed flow plain");
}

#[test]
fn the_flow_pane_shows_the_selected_sandboxs_latest_flows() {
    let mut app = loaded();
    press(&mut app, 'G');
    let mut t = Terminal::new(TestBackend::new(100, 20)).unwrap();
    t.draw(|f| view::render(f, &app)).unwrap();
    insta::assert_snapshot!("tui_list_flow_pane", t.backend());
    let (x, y) = find(&t, "DENY");
    assert_eq!(t.backend().buffer()[(x, y)].fg, Color::Red, "a denial reads DENY, in red");
    assert!(!t.backend().to_string().contains("registry.npmjs.org"), "only red's flows");
    // New flows arrive; the pane keeps the newest at the bottom.
    let mut newer = flow("red", 9, "newest.example.com", false);
    newer.path = "/just/now".into();
    update(&mut app, Event::Flows(vec![newer]));
    t.draw(|f| view::render(f, &app)).unwrap();
    let (_, y) = find(&t, "/just/now");
    // Under it: the pane's border, the status line, the keys.
    assert_eq!(y, 20 - 4, "the newest flow is the pane's last row");
    // Another selection, another sandbox's flows.
    press(&mut app, 'g');
    t.draw(|f| view::render(f, &app)).unwrap();
    find(&t, "latest flows of `blue`");
    find(&t, "registry.npmjs.org");
}

#[test]
fn help() {
    let mut app = loaded();
    press(&mut app, '?');
    let mut t = Terminal::new(TestBackend::new(100, 24)).unwrap();
    t.draw(|f| view::render(f, &app)).unwrap();
    insta::assert_snapshot!("tui_help", t.backend());
}

#[test]
fn remove_confirmation() {
    let mut app = loaded();
    press(&mut app, 'j');
    press(&mut app, 'd');
    insta::assert_snapshot!("tui_confirm_rm", draw(&app).backend());
}

#[test]
fn empty_and_loading() {
    let app = App::default();
    let t = draw(&app);
    find(&t, "loading…");
    let mut app = App::default();
    update(
        &mut app,
        Event::Snapshot(Snapshot {
            warnings: vec!["podman was not found; showing recorded states".into()],
            ..Snapshot::default()
        }),
    );
    insta::assert_snapshot!("tui_empty", draw(&app).backend());
}

#[test]
fn busy_and_failed_actions_show_on_the_status_line() {
    let mut app = loaded();
    press(&mut app, 'x');
    let t = draw(&app);
    find(&t, "| stopping `blue`…");
    update(&mut app, Event::Done(Err("could not stop `blue`; hint: see machine.log".into())));
    let t = draw(&app);
    let (x, y) = find(&t, "could not stop `blue`; hint: see machine.log");
    assert_eq!(t.backend().buffer()[(x, y)].fg, Color::Red);
}

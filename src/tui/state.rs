//! The dashboard's model: what is shown and selected, which view and dialog
//! are open, and what runs. [`update`] turns one [`Event`] into a new state
//! and the [`Action`]s the runner must perform. Pure: no terminal, no
//! podman, no clock, so every key path is a plain unit test.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::data::{Flow, Sandbox, Snapshot};

/// Which screen is up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum View {
    /// The sandbox list.
    #[default]
    List,
    /// The flow log of one sandbox. `scroll` counts lines up from the
    /// newest; 0 follows new flows as they arrive.
    Flows { sandbox: String, scroll: usize },
    /// The requests an `ask` default holds, answered with a key.
    Approvals,
    /// The key reference.
    Help,
}

/// Something the runner does for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Quit,
    /// Poll now instead of at the next interval.
    Refresh,
    /// Bring a sandbox back (`lifecycle::reattach`); runs off the UI thread.
    Start(String),
    Stop(String),
    Remove(String),
    /// Suspend the dashboard and open a shell in the sandbox's VM.
    Shell(String),
    /// Suspend the dashboard and run the agent on this terminal.
    Attach(String),
    /// Answer a held request once.
    Answer {
        id: String,
        verdict: crate::policy::Verdict,
    },
}

/// What happens to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Key(KeyEvent),
    /// A refresh finished.
    Snapshot(Snapshot),
    /// A long action or a suspended session ended; `Err` holds the message.
    Done(Result<String, String>),
    /// Time passed while something runs: moves the spinner.
    Tick,
    /// Flows just logged, oldest first ([`super::flows::watch`]).
    Flows(Vec<Flow>),
    /// The held requests now ([`super::approvals::watch`]).
    Approvals(Vec<crate::proxy::protocol::Pending>),
}

/// A line under the list: the last outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub text: String,
    pub error: bool,
}

/// The whole model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct App {
    pub snapshot: Snapshot,
    /// False until the first refresh arrives: "loading", not "no sandboxes".
    pub loaded: bool,
    pub selected: usize,
    pub view: View,
    /// The sandbox a `d` asked to remove, until `y` or `n`.
    pub confirm_remove: Option<String>,
    /// The long action in flight, e.g. "stopping `red`". One at a time:
    /// they share podman (one running machine on most providers) and the
    /// state lock, and a queue the user cannot see would surprise.
    pub busy: Option<String>,
    pub status: Option<Status>,
    /// Spinner frame, advanced by [`Event::Tick`].
    pub spinner: usize,
    /// The newest flows of each sandbox, as they are logged.
    pub live: super::live::Live,
    /// Requests waiting for the user's answer, oldest first.
    pub approvals: Vec<crate::proxy::protocol::Pending>,
    pub approval_cursor: usize,
}

impl App {
    /// The sandbox under the cursor.
    pub fn current(&self) -> Option<&Sandbox> {
        self.snapshot.sandboxes.get(self.selected)
    }

    /// The flows of `sandbox` kept as they were logged, oldest first.
    pub fn flows_of<'a>(&'a self, sandbox: &'a str) -> impl Iterator<Item = &'a Flow> + 'a {
        self.live.of(sandbox)
    }

    fn say(&mut self, text: impl Into<String>, error: bool) {
        self.status = Some(Status { text: text.into(), error });
    }
}

/// Apply `event` to `app`; return what the runner must do.
pub fn update(app: &mut App, event: Event) -> Vec<Action> {
    match event {
        Event::Key(key) => key_event(app, key),
        Event::Snapshot(s) => {
            // Keep the cursor on the same sandbox when others come or go.
            let name = app.current().map(|s| s.name.clone());
            app.snapshot = s;
            app.loaded = true;
            app.live.retain(app.snapshot.sandboxes.iter().map(|s| s.name.as_str()));
            app.selected = name
                .and_then(|n| app.snapshot.sandboxes.iter().position(|s| s.name == n))
                .unwrap_or(app.selected)
                .min(app.snapshot.sandboxes.len().saturating_sub(1));
            Vec::new()
        }
        Event::Done(result) => {
            app.busy = None;
            match result {
                Ok(text) => app.say(text, false),
                Err(text) => app.say(text, true),
            }
            vec![Action::Refresh]
        }
        Event::Tick => {
            if app.busy.is_some() {
                app.spinner = app.spinner.wrapping_add(1);
            }
            Vec::new()
        }
        Event::Flows(flows) => {
            app.live.push(flows);
            Vec::new()
        }
        Event::Approvals(list) => {
            // Keep the cursor on the same entry when others come or go.
            let id = app.approvals.get(app.approval_cursor).map(|p| p.id.clone());
            app.approvals = list;
            app.approval_cursor = id
                .and_then(|id| app.approvals.iter().position(|p| p.id == id))
                .unwrap_or(app.approval_cursor)
                .min(app.approvals.len().saturating_sub(1));
            Vec::new()
        }
    }
}

fn approvals_key(app: &mut App, key: KeyEvent) -> Vec<Action> {
    use crate::policy::Verdict;
    let count = app.approvals.len();
    match key.code {
        KeyCode::Char('q') => return quit(app),
        KeyCode::Char('p' | 'h') | KeyCode::Esc | KeyCode::Backspace | KeyCode::Left => app.view = View::List,
        KeyCode::Char('?') => app.view = View::Help,
        KeyCode::Up | KeyCode::Char('k') => app.approval_cursor = app.approval_cursor.saturating_sub(1),
        KeyCode::Down | KeyCode::Char('j') => {
            app.approval_cursor = (app.approval_cursor + 1).min(count.saturating_sub(1));
        }
        KeyCode::Char(c @ ('a' | 'y' | 'd' | 'n')) => {
            if let Some(p) = app.approvals.get(app.approval_cursor) {
                let verdict = if matches!(c, 'a' | 'y') { Verdict::Allow } else { Verdict::Deny };
                return vec![Action::Answer { id: p.id.clone(), verdict }];
            }
        }
        _ => {}
    }
    Vec::new()
}

fn key_event(app: &mut App, key: KeyEvent) -> Vec<Action> {
    // Terminals that report releases and repeats would act twice.
    if key.kind != KeyEventKind::Press {
        return Vec::new();
    }
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return vec![Action::Quit];
    }
    if let Some(name) = app.confirm_remove.clone() {
        // The dialog takes every key so a stray one cannot act behind it.
        match key.code {
            KeyCode::Char('y' | 'Y') => {
                app.confirm_remove = None;
                return begin(app, format!("removing `{name}`"), Action::Remove(name));
            }
            KeyCode::Char('n' | 'N' | 'q') | KeyCode::Esc => {
                app.confirm_remove = None;
                app.say(format!("kept `{name}`"), false);
            }
            _ => {}
        }
        return Vec::new();
    }
    match app.view.clone() {
        View::Help => {
            match key.code {
                KeyCode::Char('q') => return quit(app),
                KeyCode::Char('?') | KeyCode::Esc | KeyCode::Enter | KeyCode::Backspace => app.view = View::List,
                _ => {}
            }
            Vec::new()
        }
        View::Flows { sandbox, scroll } => {
            let total = app.flows_of(&sandbox).count();
            match key.code {
                KeyCode::Char('q') => return quit(app),
                KeyCode::Char('l' | 'h') | KeyCode::Esc | KeyCode::Backspace | KeyCode::Left => app.view = View::List,
                KeyCode::Char('?') => app.view = View::Help,
                KeyCode::Up | KeyCode::Char('k') => {
                    app.view = View::Flows { sandbox, scroll: (scroll + 1).min(total.saturating_sub(1)) };
                }
                KeyCode::Down | KeyCode::Char('j') => {
                    app.view = View::Flows { sandbox, scroll: scroll.saturating_sub(1) };
                }
                KeyCode::PageUp => {
                    app.view = View::Flows { sandbox, scroll: (scroll + 10).min(total.saturating_sub(1)) }
                }
                KeyCode::PageDown => app.view = View::Flows { sandbox, scroll: scroll.saturating_sub(10) },
                KeyCode::End | KeyCode::Char('G') => app.view = View::Flows { sandbox, scroll: 0 },
                KeyCode::Char('r') => return vec![Action::Refresh],
                _ => {}
            }
            Vec::new()
        }
        View::Approvals => approvals_key(app, key),
        View::List => list_key(app, key),
    }
}

fn list_key(app: &mut App, key: KeyEvent) -> Vec<Action> {
    let count = app.snapshot.sandboxes.len();
    match key.code {
        KeyCode::Char('q') => return quit(app),
        KeyCode::Char('?') => app.view = View::Help,
        KeyCode::Char('r') => return vec![Action::Refresh],
        KeyCode::Char('p') => app.view = View::Approvals,
        KeyCode::Up | KeyCode::Char('k') => app.selected = app.selected.saturating_sub(1),
        KeyCode::Down | KeyCode::Char('j') => app.selected = (app.selected + 1).min(count.saturating_sub(1)),
        KeyCode::Home | KeyCode::Char('g') => app.selected = 0,
        KeyCode::End | KeyCode::Char('G') => app.selected = count.saturating_sub(1),
        KeyCode::Char(c @ ('s' | 'x' | 'd' | 'e' | 'a' | 'l')) => return on_sandbox(app, c),
        _ => {}
    }
    Vec::new()
}

/// A key that acts on the selected sandbox.
fn on_sandbox(app: &mut App, key: char) -> Vec<Action> {
    let Some(sb) = app.current().cloned() else {
        app.say("no sandbox selected: create one with `ppp create`", true);
        return Vec::new();
    };
    let name = sb.name;
    let running = sb.state == "running";
    match key {
        'l' => {
            app.view = View::Flows { sandbox: name, scroll: 0 };
            Vec::new()
        }
        's' if running => {
            app.say(format!("`{name}` is already running"), false);
            Vec::new()
        }
        's' => begin(app, format!("starting `{name}`"), Action::Start(name)),
        'x' if !running && sb.state != "starting" => {
            app.say(format!("`{name}` is not running"), false);
            Vec::new()
        }
        'x' => begin(app, format!("stopping `{name}`"), Action::Stop(name)),
        'd' => {
            if let Some(what) = &app.busy {
                app.say(format!("wait: {what} is still in progress"), true);
            } else {
                app.confirm_remove = Some(name);
            }
            Vec::new()
        }
        'e' | 'a' if !running => {
            app.say(format!("`{name}` is not running: press s to start it"), true);
            Vec::new()
        }
        'e' => vec![Action::Shell(name)],
        _ => vec![Action::Attach(name)],
    }
}

/// `q`: quit, unless a long action is in flight: ending ppp then would
/// cut it off half done. Ctrl-C still quits.
fn quit(app: &mut App) -> Vec<Action> {
    if let Some(busy) = &app.busy {
        app.say(format!("wait: {busy} is still in progress (Ctrl-C quits anyway)"), true);
        return Vec::new();
    }
    vec![Action::Quit]
}

/// Start a long action unless one is in flight.
fn begin(app: &mut App, what: String, action: Action) -> Vec<Action> {
    if let Some(busy) = &app.busy {
        app.say(format!("wait: {busy} is still in progress"), true);
        return Vec::new();
    }
    app.busy = Some(what);
    app.status = None;
    vec![action]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::data::Link;

    fn sandbox(name: &str, state: &str) -> Sandbox {
        Sandbox {
            name: name.into(),
            cpus: 2,
            memory_mib: 4096,
            agent: "opencode".into(),
            state: state.into(),
            ports: "-".into(),
            workspace: "/ws".into(),
            inner_ip: std::net::Ipv4Addr::new(10, 0, 0, 1),
            tunnel: Link::Down,
            denials: 0,
            learning: false,
            tokens: "-".into(),
        }
    }

    fn app(sandboxes: &[(&str, &str)]) -> App {
        let mut app = App::default();
        let snap =
            Snapshot { sandboxes: sandboxes.iter().map(|(n, s)| sandbox(n, s)).collect(), ..Snapshot::default() };
        update(&mut app, Event::Snapshot(snap));
        app
    }

    fn key(app: &mut App, code: KeyCode) -> Vec<Action> {
        update(app, Event::Key(KeyEvent::new(code, KeyModifiers::NONE)))
    }

    fn ch(app: &mut App, c: char) -> Vec<Action> {
        key(app, KeyCode::Char(c))
    }

    #[test]
    fn moves_within_bounds() {
        let mut a = app(&[("a", "running"), ("b", "stopped"), ("c", "running")]);
        ch(&mut a, 'k');
        assert_eq!(a.selected, 0);
        ch(&mut a, 'j');
        key(&mut a, KeyCode::Down);
        ch(&mut a, 'j');
        assert_eq!(a.selected, 2);
        key(&mut a, KeyCode::Up);
        assert_eq!(a.current().unwrap().name, "b");
        ch(&mut a, 'G');
        assert_eq!(a.selected, 2);
        ch(&mut a, 'g');
        assert_eq!(a.selected, 0);
    }

    #[test]
    fn selection_follows_the_name_across_refreshes() {
        let mut a = app(&[("a", "running"), ("b", "stopped"), ("c", "running")]);
        ch(&mut a, 'j');
        ch(&mut a, 'j');
        let snap =
            Snapshot { sandboxes: vec![sandbox("c", "running"), sandbox("d", "running")], ..Snapshot::default() };
        update(&mut a, Event::Snapshot(snap));
        assert_eq!(a.current().unwrap().name, "c");
        // The selected one gone: the cursor stays in range.
        let snap = Snapshot { sandboxes: vec![sandbox("a", "running")], ..Snapshot::default() };
        update(&mut a, Event::Snapshot(snap));
        assert_eq!(a.selected, 0);
        update(&mut a, Event::Snapshot(Snapshot::default()));
        assert_eq!(a.selected, 0);
        assert!(a.current().is_none());
    }

    #[test]
    fn start_and_stop_run_once_at_a_time() {
        let mut a = app(&[("a", "stopped"), ("b", "running")]);
        assert_eq!(ch(&mut a, 's'), [Action::Start("a".into())]);
        assert_eq!(a.busy.as_deref(), Some("starting `a`"));
        ch(&mut a, 'j');
        assert_eq!(ch(&mut a, 'x'), []);
        assert!(a.status.as_ref().unwrap().text.contains("still in progress"));
        update(&mut a, Event::Tick);
        assert_eq!(a.spinner, 1);
        assert_eq!(ch(&mut a, 'q'), [], "q waits for the action");
        assert!(a.status.as_ref().unwrap().text.contains("Ctrl-C quits anyway"));
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(update(&mut a, Event::Key(ctrl_c)), [Action::Quit]);
        assert_eq!(update(&mut a, Event::Done(Ok("started `a`".into()))), [Action::Refresh]);
        assert_eq!(a.busy, None);
        assert_eq!(ch(&mut a, 'x'), [Action::Stop("b".into())]);
        update(&mut a, Event::Done(Err("could not stop".into())));
        assert!(a.status.as_ref().unwrap().error);
    }

    #[test]
    fn start_and_stop_say_when_there_is_nothing_to_do() {
        let mut a = app(&[("a", "running"), ("b", "stopped")]);
        assert_eq!(ch(&mut a, 's'), []);
        assert_eq!(a.status.as_ref().unwrap().text, "`a` is already running");
        ch(&mut a, 'j');
        assert_eq!(ch(&mut a, 'x'), []);
        assert_eq!(a.busy, None);
    }

    #[test]
    fn remove_asks_first() {
        let mut a = app(&[("a", "running")]);
        assert_eq!(ch(&mut a, 'd'), []);
        assert_eq!(a.confirm_remove.as_deref(), Some("a"));
        // Other keys do nothing while the dialog is up.
        assert_eq!(ch(&mut a, 'q'), []);
        assert_eq!(a.confirm_remove, None, "q answers no");
        ch(&mut a, 'd');
        assert_eq!(ch(&mut a, 'x'), []);
        assert_eq!(ch(&mut a, 'j'), []);
        assert_eq!(a.confirm_remove.as_deref(), Some("a"));
        assert_eq!(key(&mut a, KeyCode::Esc), []);
        assert_eq!(a.confirm_remove, None);
        ch(&mut a, 'd');
        assert_eq!(ch(&mut a, 'y'), [Action::Remove("a".into())]);
        assert_eq!(a.busy.as_deref(), Some("removing `a`"));
    }

    #[test]
    fn shell_and_attach_need_a_running_sandbox() {
        let mut a = app(&[("a", "running"), ("b", "stopped")]);
        assert_eq!(ch(&mut a, 'e'), [Action::Shell("a".into())]);
        assert_eq!(ch(&mut a, 'a'), [Action::Attach("a".into())]);
        ch(&mut a, 'j');
        assert_eq!(ch(&mut a, 'e'), []);
        assert_eq!(ch(&mut a, 'a'), []);
        assert!(a.status.as_ref().unwrap().text.contains("press s to start it"));
    }

    #[test]
    fn views_switch_and_quit() {
        let mut a = app(&[("a", "running")]);
        ch(&mut a, '?');
        assert_eq!(a.view, View::Help);
        key(&mut a, KeyCode::Esc);
        assert_eq!(a.view, View::List);
        ch(&mut a, 'l');
        assert_eq!(a.view, View::Flows { sandbox: "a".into(), scroll: 0 });
        ch(&mut a, 'l');
        assert_eq!(a.view, View::List);
        assert_eq!(ch(&mut a, 'q'), [Action::Quit]);
        ch(&mut a, '?');
        assert_eq!(ch(&mut a, 'q'), [Action::Quit]);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(update(&mut a, Event::Key(ctrl_c)), [Action::Quit]);
        key(&mut a, KeyCode::Esc);
        assert_eq!(ch(&mut a, 'r'), [Action::Refresh]);
    }

    #[test]
    fn flow_view_scrolls_within_the_log() {
        let mut a = app(&[("a", "running")]);
        let flows = (0..3).map(|i| Flow { sandbox: "a".into(), host: format!("h{i}"), ..Flow::default() }).collect();
        update(&mut a, Event::Flows(flows));
        ch(&mut a, 'l');
        for _ in 0..5 {
            ch(&mut a, 'k');
        }
        assert_eq!(a.view, View::Flows { sandbox: "a".into(), scroll: 2 });
        ch(&mut a, 'j');
        assert_eq!(a.view, View::Flows { sandbox: "a".into(), scroll: 1 });
        ch(&mut a, 'G');
        assert_eq!(a.view, View::Flows { sandbox: "a".into(), scroll: 0 });
    }

    #[test]
    fn keys_on_an_empty_list_explain() {
        let mut a = app(&[]);
        assert_eq!(ch(&mut a, 's'), []);
        assert!(a.status.as_ref().unwrap().error);
        ch(&mut a, 'j');
        assert_eq!(a.selected, 0);
    }

    #[test]
    fn releases_are_ignored() {
        let mut a = app(&[("a", "stopped")]);
        let mut k = KeyEvent::new(KeyCode::Char('s'), KeyModifiers::NONE);
        k.kind = KeyEventKind::Release;
        assert_eq!(update(&mut a, Event::Key(k)), []);
    }
}

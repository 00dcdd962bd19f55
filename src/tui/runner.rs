//! The side of the dashboard that touches the world: the terminal, a poller
//! thread that gathers a [`Snapshot`](super::data::Snapshot) every
//! [`POLL_INTERVAL`], worker threads for start, stop and remove, and the
//! suspended terminal for a shell or the agent. It feeds events to
//! [`update`] and performs the actions it returns.
//!
//! The UI thread never waits on podman: it only polls the keyboard (with a
//! short timeout) and drains a channel, so a slow or hung podman delays the
//! data, never a key press. A frame is drawn only when the model changed
//! (a key, new data, the spinner), so an idle dashboard does not flicker.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ratatui::crossterm::event::{self as term_event, Event as TermEvent};

use super::data;
use super::state::{Action, App, Event, update};
use super::term::Terminal;
use super::view;
use crate::dirs::Dirs;
use crate::exec::{self, Stdin};
use crate::podman::Podman;
use crate::sandbox;
use crate::sandbox::lifecycle;
use crate::sandbox::ui::Ui;

/// How often the data is read again when nothing asks sooner.
pub(super) const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How long the UI thread waits for a key before looking at the channel.
const INPUT_WAIT: Duration = Duration::from_millis(100);
/// Spinner speed while a long action runs.
const TICK: Duration = Duration::from_millis(250);

/// Run the dashboard until the user quits.
pub fn run(dirs: &Dirs) -> Result<()> {
    crate::state::create_private_dir(&dirs.data)?;
    let (events_tx, events) = mpsc::channel::<Event>();
    let (refresh_tx, refresh_rx) = mpsc::channel::<()>();
    let poller_dirs = dirs.clone();
    let poller_tx = events_tx.clone();
    // Detached on purpose: it ends on its own once the receiver is gone,
    // and joining would make quitting wait for a slow podman.
    std::thread::spawn(move || poll(&poller_dirs, &poller_tx, &refresh_rx));
    let (flows_path, flows_tx) = (dirs.flows_log(), events_tx.clone());
    // Flows on a path of their own, polled often, so they show at once
    // however slowly podman answers the poller.
    std::thread::spawn(move || super::flows::watch(&flows_path, &flows_tx));
    let (approvals_dirs, approvals_tx) = (dirs.clone(), events_tx.clone());
    std::thread::spawn(move || super::approvals::watch(&approvals_dirs, &approvals_tx));

    let mut term = Terminal::enter(&dirs.tui_log())?;
    let mut app = App::default();
    let mut dirty = true;
    let mut last_tick = Instant::now();
    loop {
        if dirty {
            term.inner.draw(|f| view::render(f, &app)).context("could not draw")?;
            dirty = false;
        }
        let mut pending = Vec::new();
        if term_event::poll(INPUT_WAIT).context("could not read the terminal")? {
            match term_event::read().context("could not read the terminal")? {
                TermEvent::Key(k) => pending.push(Event::Key(k)),
                TermEvent::Resize(..) => dirty = true,
                _ => {}
            }
        }
        pending.extend(events.try_iter());
        if app.busy.is_some() && last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            pending.push(Event::Tick);
        }
        for event in pending {
            let before = app.clone();
            let actions = update(&mut app, event);
            dirty |= app != before;
            for action in actions {
                match action {
                    Action::Quit => return Ok(()),
                    Action::Refresh => {
                        let _ = refresh_tx.send(());
                    }
                    Action::Start(name) => spawn_job(dirs, &events_tx, name, Job::Start),
                    Action::Stop(name) => spawn_job(dirs, &events_tx, name, Job::Stop),
                    Action::Remove(name) => spawn_job(dirs, &events_tx, name, Job::Remove),
                    Action::Shell(name) => {
                        let _ = events_tx.send(Event::Done(session(&mut term, dirs, &name, Session::Shell)?));
                        dirty = true;
                    }
                    Action::Answer { id, verdict } => {
                        let (dirs, tx) = (dirs.clone(), events_tx.clone());
                        std::thread::spawn(move || {
                            let _ = tx.send(Event::Done(super::approvals::answer(&dirs, &id, verdict)));
                        });
                    }
                    Action::Attach(name) => {
                        let _ = events_tx.send(Event::Done(session(&mut term, dirs, &name, Session::Agent)?));
                        dirty = true;
                    }
                }
            }
        }
    }
}

/// Gather a snapshot now, then again every [`POLL_INTERVAL`] or when asked.
/// Each one is sent even when unchanged; the model ignores what did not
/// change. Ends when the dashboard has gone.
fn poll(dirs: &Dirs, tx: &Sender<Event>, refresh: &Receiver<()>) {
    loop {
        if tx.send(Event::Snapshot(data::gather(dirs))).is_err() {
            return;
        }
        match refresh.recv_timeout(POLL_INTERVAL) {
            // Several requests while podman was slow need one refresh.
            Ok(()) => while refresh.try_recv().is_ok() {},
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Job {
    Start,
    Stop,
    Remove,
}

/// Run a long action on a thread of its own and report how it went. Its
/// progress lines are silenced (`Ui { quiet }`): the status line shows the
/// step instead.
fn spawn_job(dirs: &Dirs, tx: &Sender<Event>, name: String, job: Job) {
    let dirs = dirs.clone();
    let tx = tx.clone();
    std::thread::spawn(move || {
        let ui = Ui { quiet: true };
        let result = Podman::detect().and_then(|podman| match job {
            Job::Start => lifecycle::reattach(&dirs, &podman, &name, ui).map(|_| format!("started `{name}`")),
            Job::Stop => lifecycle::stop(&dirs, &podman, &name, ui).map(|()| format!("stopped `{name}`")),
            Job::Remove => {
                lifecycle::remove(&dirs, Some(&podman), &name, false, ui).map(|()| format!("removed `{name}`"))
            }
        });
        let _ = tx.send(Event::Done(result.map_err(|e| one_line(&e))));
    });
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Session {
    Shell,
    Agent,
}

/// Suspend the dashboard, run a shell or the agent on the terminal, and
/// take the terminal back. The inner result is the outcome to show; the
/// outer error means the terminal could not be taken back.
fn session(term: &mut Terminal, dirs: &Dirs, name: &str, what: Session) -> Result<Result<String, String>> {
    let (podman, rec) = match prepare(dirs, name) {
        Ok(p) => p,
        Err(e) => return Ok(Err(one_line(&e))),
    };
    term.suspend();
    let label = if what == Session::Shell { "shell" } else { "agent" };
    // Said on the normal screen so the user knows how to come back.
    println!("ppp: {label} in `{name}`; exit it to return to the dashboard");
    let code = match what {
        Session::Shell => {
            exec::run_attached(&podman.shell(&rec.machine_name).stdin(Stdin::Inherit)).map_err(anyhow::Error::new)
        }
        // As `ppp run --name` runs it, restarts for kits included.
        Session::Agent => sandbox::session::run_agent(dirs, &podman, rec, &[], true, false),
    };
    term.resume()?;
    Ok(match code {
        Ok(code) => Ok(format!("{label} in `{name}` exited with status {code}")),
        Err(e) => Err(format!("{label} in `{name}`: {}", one_line(&e))),
    })
}

/// Podman and the sandbox's record, for a shell (`podman machine ssh NAME`,
/// no command) or the agent container.
fn prepare(dirs: &Dirs, name: &str) -> Result<(Podman, sandbox::Record)> {
    let podman = Podman::detect()?;
    let rec = sandbox::load(dirs, name)?.ok_or_else(|| crate::error::fail(format!("no sandbox named `{name}`")))?;
    Ok((sandbox::podman_for(&podman, dirs, &rec), rec))
}

/// An error as one status line: its chain and hint, joined.
fn one_line(e: &anyhow::Error) -> String {
    let (text, _) = crate::error::render(e);
    text.lines().map(|l| l.trim().trim_start_matches("error: ")).collect::<Vec<_>>().join("; ")
}

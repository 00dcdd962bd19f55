//! One module per top-level command. Each exposes `run`, which takes the
//! parsed arguments and a [`Ctx`] and returns the process exit code.

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::Command;
use crate::dirs::Dirs;

pub mod approval;
pub mod complete;
pub mod completion;
pub mod cp;
pub mod create;
pub mod daemon;
pub mod diagnose;
pub mod exec;
pub mod kit;
pub mod ls;
pub mod man;
pub mod policy;
pub mod ports;
pub mod reset;
pub mod rm;
pub mod run;
pub mod secret;
pub mod setup;
pub mod stop;
pub mod template;
pub mod tui;
pub mod usage;
pub mod version;

/// What every command may need, resolved once after parsing.
#[derive(Debug)]
pub struct Ctx {
    dirs: Option<Dirs>,
    pub debug: bool,
    /// `-q`: no progress, terse output.
    pub quiet: bool,
}

impl Ctx {
    /// Resolve the context from the environment. Path resolution failing is
    /// not fatal here: `version` and `completion` work without a HOME.
    pub fn from_env(debug: bool) -> Self {
        Self { dirs: Dirs::from_env().ok(), debug, quiet: false }
    }

    /// A context with explicit directories.
    pub fn with_dirs(dirs: Dirs, debug: bool) -> Self {
        Self { dirs: Some(dirs), debug, quiet: false }
    }

    /// The same context with `-q` set as given.
    #[must_use]
    pub fn with_quiet(mut self, quiet: bool) -> Self {
        self.quiet = quiet;
        self
    }

    /// How to show progress for this command: nothing with `-q`, else
    /// spinners on a terminal and plain lines elsewhere.
    pub fn progress(&self) -> crate::progress::Progress {
        crate::progress::Progress::detect(self.quiet)
    }

    /// The sandbox lifecycle's progress switch.
    pub fn ui(&self) -> crate::sandbox::ui::Ui {
        crate::sandbox::ui::Ui { quiet: self.quiet }
    }

    /// ppp's directories; an error if they cannot be located.
    pub fn dirs(&self) -> Result<&Dirs> {
        match &self.dirs {
            Some(d) => Ok(d),
            // Resolving again reproduces the original error with its hint;
            // resolution is a pure function of the environment.
            None => Err(Dirs::from_env()
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("ppp's directories changed while running"))),
        }
    }
}

/// Dispatch a parsed command.
pub fn dispatch(command: Command, ctx: &Ctx) -> Result<ExitCode> {
    match command {
        Command::Completion(a) => completion::run(&a),
        Command::Cp(a) => cp::run(&a, ctx),
        Command::Create(a) => create::run(&a, ctx),
        Command::Daemon(a) => daemon::run(&a, ctx),
        Command::Diagnose(a) => diagnose::run(&a, ctx),
        Command::Exec(a) => exec::run(&a, ctx),
        Command::Kit(a) => kit::run(&a, ctx),
        Command::Ls(a) => ls::run(&a, ctx),
        Command::Policy(a) => policy::run(&a, ctx),
        Command::Ports(a) => ports::run(&a, ctx),
        Command::Reset(a) => reset::run(&a, ctx),
        Command::Rm(a) => rm::run(&a, ctx),
        Command::Run(a) => run::run(&a, ctx),
        Command::Secret(a) => secret::run(&a, ctx),
        Command::Setup(a) => setup::run(&a, ctx),
        Command::Stop(a) => stop::run(&a, ctx),
        Command::Template(a) => template::run(&a, ctx),
        Command::Tui => tui::run(ctx),
        Command::Usage(a) => usage::run(&a, ctx),
        Command::Version(a) => version::run(&a, ctx),
        Command::Complete(a) => complete::run(&a, ctx),
        Command::Man(a) => man::run(&a),
    }
}

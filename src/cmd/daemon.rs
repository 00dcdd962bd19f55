//! `ppp daemon …`. The proxy supervisor lands with a later release; until
//! then every verb refuses plainly instead of pretending to work.

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::DaemonCommand;
use crate::error::Failure;

/// Run `ppp daemon …`.
pub fn run(cmd: &DaemonCommand, _ctx: &Ctx) -> Result<ExitCode> {
    let verb = match cmd {
        DaemonCommand::Start(_) => "daemon start",
        DaemonCommand::Stop => "daemon stop",
        DaemonCommand::Status(_) => "daemon status",
        DaemonCommand::LogLevel(_) => "daemon log-level",
    };
    Err(Failure::not_available(verb).into())
}

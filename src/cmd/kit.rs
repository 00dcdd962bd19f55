//! `ppp kit …`. Kits land with a later release; until then every verb
//! refuses plainly instead of pretending to work.

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::KitCommand;
use crate::error::Failure;

/// Run `ppp kit …`.
pub fn run(cmd: &KitCommand, _ctx: &Ctx) -> Result<ExitCode> {
    let verb = match cmd {
        KitCommand::Add { .. } => "kit add",
        KitCommand::Inspect { .. } => "kit inspect",
        KitCommand::Pack { .. } => "kit pack",
        KitCommand::Pull { .. } => "kit pull",
        KitCommand::Push { .. } => "kit push",
        KitCommand::Validate { .. } => "kit validate",
    };
    Err(Failure::not_available(verb).into())
}

//! `ppp template …`. Templates land with a later release; until then every
//! verb refuses plainly instead of pretending to work.

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::TemplateCommand;
use crate::error::Failure;

/// Run `ppp template …`.
pub fn run(cmd: &TemplateCommand, _ctx: &Ctx) -> Result<ExitCode> {
    let verb = match cmd {
        TemplateCommand::Save { .. } => "template save",
        TemplateCommand::Load { .. } => "template load",
        TemplateCommand::Ls { .. } => "template ls",
        TemplateCommand::Rm { .. } => "template rm",
    };
    Err(Failure::not_available(verb).into())
}

//! `ppp create`. Its machinery lands with a later release; until then it
//! refuses plainly instead of pretending to work.

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::error::Failure;

/// Run `ppp create`.
pub fn run(_args: &crate::cli::CreateArgs, _ctx: &Ctx) -> Result<ExitCode> {
    Err(Failure::not_available("create").into())
}

//! `ppp policy …` (wired up when the engine lands).

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::error::Failure;

/// Run `ppp policy …`.
pub fn run(_cmd: &crate::cli::PolicyCommand, _ctx: &Ctx) -> Result<ExitCode> {
    Err(Failure::not_available("policy").into())
}

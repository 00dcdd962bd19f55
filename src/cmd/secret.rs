//! `ppp secret …` (wired up when the engine lands).

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::error::Failure;

/// Run `ppp secret …`.
pub fn run(_cmd: &crate::cli::SecretCommand, _ctx: &Ctx) -> Result<ExitCode> {
    Err(Failure::not_available("secret").into())
}

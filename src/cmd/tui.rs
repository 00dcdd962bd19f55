//! `ppp tui`. The dashboard lands with a later release; until then it
//! refuses plainly instead of pretending to work.

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::error::Failure;

/// Run `ppp tui`.
pub fn run(_ctx: &Ctx) -> Result<ExitCode> {
    Err(Failure::not_available("tui").into())
}

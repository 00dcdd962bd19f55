//! `ppp tui`: checks that there is a terminal to draw on, then hands over
//! to [`crate::tui`].

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::error::fail;

/// Run `ppp tui`.
pub fn run(ctx: &Ctx) -> Result<ExitCode> {
    // Raw mode and the alternate screen need a terminal on both ends; in a
    // pipe the escape codes would only garble the output.
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(fail("`ppp tui` needs a terminal").hint("use `ppp ls` in scripts and pipes").code(2).into());
    }
    crate::tui::run(ctx.dirs()?)?;
    Ok(ExitCode::SUCCESS)
}

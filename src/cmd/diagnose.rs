//! `ppp diagnose`: collect the report ([`crate::diagnose`]) and print it in
//! the chosen format. Uploading is not offered: the user pastes the
//! `github-issue` form, so nothing leaves the host unseen.

use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::{DiagnoseArgs, DiagnoseFormat};
use crate::diagnose;
use crate::error::fail;

/// Run `ppp diagnose`.
pub fn run(args: &DiagnoseArgs, ctx: &Ctx) -> Result<ExitCode> {
    if args.upload {
        return Err(fail("`ppp diagnose --upload` is not supported")
            .hint("run `ppp diagnose -o github-issue` and paste its output into the issue")
            .code(2)
            .into());
    }
    let timeout = diagnose::probe_timeout(std::env::var_os(crate::env::PPP_PROBE_TIMEOUT))?;
    let report = diagnose::collect(ctx.dirs()?, timeout)?;
    match args.output {
        DiagnoseFormat::Json => crate::output::json(&report)?,
        DiagnoseFormat::Yaml => crate::output::print(&serde_norway::to_string(&report)?)?,
        DiagnoseFormat::Table => crate::output::print(&diagnose::render_table(&report))?,
        DiagnoseFormat::GithubIssue => crate::output::print(&diagnose::render_github_issue(&report))?,
    }
    Ok(ExitCode::SUCCESS)
}

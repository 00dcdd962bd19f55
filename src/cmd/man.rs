//! `ppp __man DIR` (hidden; `make man` calls it): one man page per command
//! and subcommand, generated from the clap tree like `--help`, so the pages
//! cannot drift from the real flags. Hidden commands get no page.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::{Cli, ManArgs};

/// Run `ppp __man`.
pub fn run(args: &ManArgs) -> Result<ExitCode> {
    let n = generate(&args.dir)?;
    crate::output::println(&format!("wrote {n} man pages to `{}`", args.dir.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// Write `ppp.1`, `ppp-policy.1`, `ppp-policy-allow.1`, … into `dir`;
/// returns how many pages were written.
pub fn generate(dir: &Path) -> Result<usize> {
    fs_err::create_dir_all(dir)?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("could not write man pages to `{}`", dir.display()))?;
    let pages = fs_err::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "1"))
        .count();
    Ok(pages)
}

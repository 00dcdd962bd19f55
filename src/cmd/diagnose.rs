//! `ppp diagnose`: collect the report ([`crate::diagnose`]) and print it in
//! the chosen format, or with `--upload` write it as a GitHub issue body and
//! say how to file it. ppp itself never sends the report anywhere: the user
//! reads the file first and files it with their own tools.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;

use super::Ctx;
use crate::cli::{DiagnoseArgs, DiagnoseFormat};
use crate::diagnose::{self, Report};
use crate::dirs::Dirs;

/// Run `ppp diagnose`.
pub fn run(args: &DiagnoseArgs, ctx: &Ctx) -> Result<ExitCode> {
    let timeout = diagnose::probe_timeout(std::env::var_os(crate::env::PPP_PROBE_TIMEOUT))?;
    let dirs = ctx.dirs()?;
    let report = diagnose::collect(dirs, timeout)?;
    if args.upload {
        let path = write_issue_body(dirs, &report)?;
        crate::output::print(&upload_instructions(&path, &report, crate::exec::find_on_path("gh").is_some()))?;
        return Ok(ExitCode::SUCCESS);
    }
    match args.output {
        DiagnoseFormat::Json => crate::output::json(&report)?,
        DiagnoseFormat::Yaml => crate::output::print(&serde_norway::to_string(&report)?)?,
        DiagnoseFormat::Table => crate::output::print(&diagnose::render_table(&report))?,
        DiagnoseFormat::GithubIssue => crate::output::print(&diagnose::render_github_issue(&report))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Write the `github-issue` form to `$PPP_DATA/diagnose/ppp-diagnose-<time>.md`,
/// private (0600 in a 0700 directory): redacted, but still the user's logs.
fn write_issue_body(dirs: &Dirs, report: &Report) -> Result<PathBuf> {
    let stamp: String = report.generated_at.chars().filter(char::is_ascii_alphanumeric).collect();
    let path = dirs.data.join("diagnose").join(format!("ppp-diagnose-{stamp}.md"));
    // Read with `cat` and posted by `gh`: no guest's escape sequence in it.
    let body = diagnose::render_github_issue(report);
    crate::state::write_atomic_mode(&path, crate::output::terminal_safe(&body).as_bytes(), 0o600)?;
    Ok(path)
}

/// What `--upload` prints: where the file is, what to check in it, and the
/// exact `gh` command that files it when `gh` is installed.
fn upload_instructions(path: &Path, report: &Report, gh: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "wrote the report as a GitHub issue body to {}", path.display());
    let _ = writeln!(
        out,
        "read it before you share it: stored secrets and key-shaped tokens are redacted, but host names, paths and \
         log lines are not"
    );
    if report.redaction.secrets_unreadable > 0 {
        let _ = writeln!(
            out,
            "warning: {} stored secret(s) could not be read, so only their shape was redacted; check the file closely",
            report.redaction.secrets_unreadable
        );
    }
    if gh {
        let title = format!("ppp diagnose: ppp {}", report.ppp.version);
        let _ = writeln!(out, "ppp sends nothing itself; to file it, run this in your clone of ppp's repository:");
        let _ = writeln!(
            out,
            "  gh issue create --title {} --body-file {}",
            shell_quote(&title),
            shell_quote(&path.display().to_string())
        );
    } else {
        let _ = writeln!(
            out,
            "ppp sends nothing itself; to file it, open a new issue in ppp's repository and paste the file; with the \
             GitHub CLI (`gh`) on PATH, this prints the command that does it"
        );
    }
    out
}

/// `s` as one word for a POSIX shell.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c)) {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn shell_quote_keeps_one_word() {
        assert_eq!(super::shell_quote("/a/b.md"), "/a/b.md");
        assert_eq!(super::shell_quote("a b"), "'a b'");
        assert_eq!(super::shell_quote("it's"), r"'it'\''s'");
        assert_eq!(super::shell_quote(""), "''");
    }
}

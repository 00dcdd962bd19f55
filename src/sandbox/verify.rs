//! The handover checks a sandbox passes before the agent gets it: the
//! guest's own (`provision.sh verify`), and `no-secret-in-env`, which the
//! host decides from salted digests so no secret goes into the VM.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use anyhow::Result;
use sha2::{Digest, Sha256};

use super::Record;
use super::machine::{last_line, open_log};
use super::provision::provision_argv;
use super::ui::Ui;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec;
use crate::podman::Podman;

const VERIFY_TIMEOUT: Duration = Duration::from_secs(3 * 60);
/// The probe the handover check expects the proxy to refuse, when the
/// policy denies it: a reserved name on a documentation address.
const PROBE_HOST: &str = "ppp-verify.invalid";
const PROBE_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(192, 0, 2, 1);

/// One handover check's result, as provision.sh's `verify` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub outcome: Outcome,
    pub name: String,
    pub detail: String,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Fail,
    Skip,
}

/// Parse `verify` output: `ok NAME`, `fail NAME: WHY`, `skip NAME: WHY`.
pub fn parse_checks(text: &str) -> Vec<Check> {
    text.lines()
        .filter_map(|l| {
            let (word, rest) = l.trim().split_once(' ')?;
            let outcome = match word {
                "ok" => Outcome::Ok,
                "fail" => Outcome::Fail,
                "skip" => Outcome::Skip,
                _ => return None,
            };
            let (name, detail) = rest.split_once(':').map_or((rest, ""), |(n, d)| (n, d.trim()));
            Some(Check { outcome, name: name.trim().to_owned(), detail: detail.to_owned() })
        })
        .collect()
}

/// The checks every handover must pass.
pub const CHECKS: &[&str] = &["handshake", "no-direct-egress", "policy-denies", "ca-trusted", "no-secret-in-env"];

/// Verify the sandbox from inside before the agent gets it.
///
/// The guest runs four checks itself; the fifth, `no-secret-in-env`, is
/// decided here: the guest reports its processes' environment as digests
/// salted with a value ppp picks, and ppp compares them with its own
/// secrets' digests. Only the salt goes in, so nothing derived from a
/// secret ever enters the VM (issue 11 point 6; ADR 0018).
pub fn verify(dirs: &Dirs, podman: &Podman, rec: &Record, ui: Ui) -> Result<()> {
    let podman = &crate::sandbox::podman_for(podman, dirs, rec);
    ui.timed(&format!("verifying `{}` before handover", rec.name), || {
        let salt = uuid::Uuid::new_v4().simple().to_string();
        let mut args: Vec<String> = vec!["--salt".into(), salt.clone()];
        if probe_is_denied(dirs, &rec.name) {
            args.extend([
                "--denied-url".into(),
                format!("http://{PROBE_HOST}/"),
                "--denied-connect-to".into(),
                format!("{PROBE_HOST}:80:{PROBE_IP}:80"),
            ]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let inv = podman.ssh(&rec.machine_name, &provision_argv("verify", &refs)).timeout(VERIFY_TIMEOUT);
        let (code, out) = exec::output(&inv)?;
        let mut checks = parse_checks(&out.stdout);
        // This verdict is the host's alone, whatever the guest printed.
        checks.retain(|c| c.name != ENV_CHECK);
        checks.push(env_check(&parse_env_report(&out.stdout), &secret_digests(dirs, &salt)));
        let log = open_log(dirs, &rec.name)?;
        // The env report is hundreds of digests nobody reads; the log
        // keeps the verdicts.
        let shown = checks.iter().fold(String::new(), |mut s, c| {
            let _ = writeln!(s, "{c}");
            s
        });
        let _ = writeln!(&log, "$ provision.sh verify\n{shown}{}", out.stderr);
        if checks.iter().any(|c| c.name == ENV_CHECK && c.outcome == Outcome::Fail) {
            // What the guest did print, for whoever reads the log (bounded).
            let tail: String = out.stdout.lines().rev().take(20).collect::<Vec<_>>().join("\n");
            let _ = writeln!(&log, "(last lines of the report, newest first)\n{tail}");
        }
        let failed: Vec<&Check> = checks.iter().filter(|c| c.outcome == Outcome::Fail).collect();
        let missing: Vec<&&str> = CHECKS.iter().filter(|n| !checks.iter().any(|c| c.name == **n)).collect();
        if code == 0 && failed.is_empty() && missing.is_empty() {
            return Ok(());
        }
        let why = if let Some(c) = failed.first() {
            format!("check `{}` failed: {}", c.name, c.detail)
        } else if let Some(n) = missing.first() {
            format!("check `{n}` did not report (verify exited with status {code})")
        } else {
            format!("verify exited with status {code}: {}", last_line(&out.stderr))
        };
        Err(fail(format!("sandbox `{}` failed its handover checks: {why}", rec.name))
            .hint(format!("see `{}`; the agent was not started", dirs.sandbox_machine_log(&rec.name).display()))
            .into())
    })
}

impl std::fmt::Display for Check {
    /// The line as provision.sh prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let word = match self.outcome {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Skip => "skip",
        };
        if self.detail.is_empty() {
            write!(f, "{word} {}", self.name)
        } else {
            write!(f, "{word} {}: {}", self.name, self.detail)
        }
    }
}

/// The check ppp decides from the guest's environment report.
const ENV_CHECK: &str = "no-secret-in-env";

/// What the guest said about its environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvReport {
    /// Salted digest (lower-case hex) → where the guest found that value.
    pub digests: Vec<(String, String)>,
    /// Whether the closing `env-end` line came: without it the report was
    /// cut short and proves nothing.
    pub complete: bool,
}

/// The most a guest's `where` text may add to an error message: the
/// guest chooses it, so it is cut and limited to printable ASCII.
const WHERE_MAX: usize = 200;

/// Parse the `env <hex> <where>` and `env-end <n>` lines of `verify`.
pub fn parse_env_report(text: &str) -> EnvReport {
    let mut report = EnvReport::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("env ") {
            let (hex, place) = rest.split_once(' ').unwrap_or((rest, ""));
            if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                let place: String =
                    place.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').take(WHERE_MAX).collect();
                report.digests.push((hex.to_ascii_lowercase(), place));
            }
        } else if line.starts_with("env-end ") {
            report.complete = true;
        }
    }
    report
}

/// The `no-secret-in-env` check: no value in the guest's report has the
/// salted digest of a stored secret. A failure names where the guest found
/// it, never the value.
pub fn env_check(report: &EnvReport, secrets: &std::collections::BTreeSet<String>) -> Check {
    let name = ENV_CHECK.to_owned();
    if !report.complete {
        return Check {
            outcome: Outcome::Fail,
            name,
            detail: "the guest's environment report was missing or cut short".into(),
        };
    }
    let hits: Vec<&str> =
        report.digests.iter().filter(|(d, _)| secrets.contains(d)).map(|(_, place)| place.as_str()).collect();
    if hits.is_empty() {
        Check { outcome: Outcome::Ok, name, detail: String::new() }
    } else {
        Check {
            outcome: Outcome::Fail,
            name,
            detail: format!("a secret value is in the environment of {}", hits.join(", ")),
        }
    }
}

/// Whether the policy denies the handover probe for `sandbox`. A policy
/// that allows everything leaves nothing to probe; `verify` then skips it.
fn probe_is_denied(dirs: &Dirs, sandbox: &str) -> bool {
    crate::policy::load_engine(dirs).is_ok_and(|e| {
        e.decide(Some(sandbox), Some(PROBE_HOST), Some(PROBE_IP.into()), 80).verdict == crate::policy::Verdict::Deny
    })
}

/// SHA-256 of salt‖value for every stored secret, hex, computed on the host
/// and compared here: they never leave the host. A store that cannot be
/// read gives none (the proxy cannot inject from it either).
fn secret_digests(dirs: &Dirs, salt: &str) -> std::collections::BTreeSet<String> {
    let Ok(store) = crate::secret::Store::open(dirs) else { return std::collections::BTreeSet::new() };
    let Ok(entries) = store.list() else { return std::collections::BTreeSet::new() };
    entries
        .iter()
        .filter_map(|e| store.get(&e.scope, &e.name, e.kind).ok().flatten())
        .map(|v| salted_digest(salt, v.expose()))
        .collect()
}

/// Lower-case hex SHA-256 of `salt` followed by `value`, as provision.sh's
/// `sha256sum` of the same bytes prints it.
pub fn salted_digest(salt: &str, value: &str) -> String {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update(value.as_bytes());
    format!("{:x}", h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_output_parses() {
        let text = "noise\nok handshake\nfail no-direct-egress: connected to 192.168.127.1:80\nskip policy-denies: nothing denied\n";
        let checks = parse_checks(text);
        assert_eq!(checks.len(), 3);
        assert_eq!(checks[1].outcome, Outcome::Fail);
        assert_eq!(checks[1].name, "no-direct-egress");
        assert_eq!(checks[1].detail, "connected to 192.168.127.1:80");
        assert_eq!(checks[2].outcome, Outcome::Skip);
    }

    #[test]
    fn the_env_check_is_decided_on_the_host() {
        let salt = "00112233445566778899aabbccddeeff";
        let key = "sk-ant-REAL";
        let hit = salted_digest(salt, key);
        let other = salted_digest(salt, "/home/core");
        let secrets: std::collections::BTreeSet<String> = [hit.clone()].into();
        let text = format!(
            "ok handshake\nenv {other} pid 1 variable HOME\nenv {} pid 42 variable LEAKY, pid 43 variable X\x1b[2J and 3 more\nenv-end 2\n",
            hit.to_ascii_uppercase()
        );
        let report = parse_env_report(&text);
        assert!(report.complete);
        let c = env_check(&report, &secrets);
        assert_eq!(c.outcome, Outcome::Fail);
        assert_eq!(
            c.detail,
            "a secret value is in the environment of pid 42 variable LEAKY, pid 43 variable X[2J and 3 more"
        );
        assert!(!c.to_string().contains(key));
        // Nothing stored, or nothing matching: ok.
        assert_eq!(env_check(&report, &std::collections::BTreeSet::new()).outcome, Outcome::Ok);
        // A report without its end proves nothing.
        let cut = parse_env_report(&format!("env {other} pid 1 variable HOME\n"));
        assert_eq!(env_check(&cut, &secrets).outcome, Outcome::Fail);
        assert_eq!(env_check(&parse_env_report("ok no-secret-in-env\n"), &secrets).outcome, Outcome::Fail);
    }
}

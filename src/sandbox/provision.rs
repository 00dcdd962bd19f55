//! Provisioning: `provision.sh` copied into the VM and run with the
//! guest's WireGuard config on its standard input (WireGuard, kill switch,
//! CA, agent image). It runs again on every reattach, so it must stay
//! idempotent (docs/provisioning.md).

use std::io::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};

use super::Record;
use super::machine::{open_log, run_logged};
use super::ui::Ui;
use crate::dirs::Dirs;
use crate::error::fail;
use crate::exec::{self, Stdin};
use crate::podman::Podman;
use crate::proxy;
use crate::state;

/// Where provisioning files go inside the VM.
pub(crate) const GUEST_DIR: &str = "/tmp/ppp";
/// The CA bundle provision.sh exports for containers (their own trust store
/// does not know mitmproxy's CA).
pub(super) const GUEST_CA_BUNDLE: &str = "/var/lib/ppp/ca-bundle.pem";
const PROVISION_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// provision.sh prints [`HEARTBEAT`] every 3 s while it runs; a session
/// that stays silent this long is lost (its connection no longer carries
/// packets), however long ssh would take to notice.
const PROVISION_QUIET: Duration = Duration::from_secs(30);
/// provision.sh's `HEARTBEAT_LINE`, kept out of machine.log.
const HEARTBEAT: &str = "ppp-provision: alive";

/// Copy provision.sh into the VM and run it with wg0.conf on its standard
/// input; its output goes to the sandbox's machine.log. The config, which
/// holds the guest's WireGuard key, is never staged in a file in the VM:
/// provision.sh keeps it on tmpfs only (ADR 0018).
/// `pull`: the image provision.sh pulls, when the user named one; ppp's
/// own images are built or loaded afterwards ([`super::image`]).
pub fn provision(dirs: &Dirs, podman: &Podman, rec: &Record, pull: Option<&str>, ui: Ui) -> Result<()> {
    let podman = &crate::sandbox::podman_for(podman, dirs, rec);
    let what = if pull.is_some() { "WireGuard, kill switch, CA, agent image" } else { "WireGuard, kill switch, CA" };
    ui.timed(&format!("provisioning `{}` ({what})", rec.name), || {
        let machine = &rec.machine_name;
        let script = dirs.sandbox(&rec.name).join("provision.sh");
        state::write_atomic(&script, &crate::assets::provision())?;
        run_logged(
            dirs,
            &rec.name,
            &podman.ssh(machine, &["mkdir", "-p", "-m", "0700", GUEST_DIR]),
            "preparing the VM",
        )?;
        run_logged(
            dirs,
            &rec.name,
            &podman.copy_in(&script, machine, &format!("{GUEST_DIR}/provision.sh")),
            "copying provision.sh",
        )?;
        // The daemon renders wg0.conf with gvproxy's alias; this machine's
        // provider and the user's overrides decide the host it really uses.
        let endpoint = proxy::endpoint::current(dirs, &podman.provider)?;
        let wg0 = dirs.sandbox_wg_conf(&rec.name);
        let text = std::fs::read_to_string(&wg0).with_context(|| format!("could not read `{}`", wg0.display()))?;
        let guest_conf = dirs.sandbox_guest_wg_conf(&rec.name);
        state::write_atomic_mode(&guest_conf, proxy::endpoint::rewrite(&text, &endpoint.host).as_bytes(), 0o600)?;
        let mut args = vec!["--wg-conf", "-"];
        if let Some(image) = pull {
            args.extend(["--image", image]);
        }
        let up = podman
            .ssh(machine, &provision_argv("up", &args))
            .stdin(Stdin::File(guest_conf.clone()))
            .timeout(PROVISION_TIMEOUT);
        let log = open_log(dirs, &rec.name)?;
        let _ = writeln!(&log, "# WireGuard endpoint host {} ({})", endpoint.host, endpoint.source);
        let _ = writeln!(&log, "$ {up}");
        // Only this run's lines say where it stopped.
        let from = log.metadata().map_or(0, |m| m.len());
        let code = exec::run_to_log_watched(&up, &log, exec::Watch { quiet: PROVISION_QUIET, heartbeat: HEARTBEAT });
        // It holds the guest's key: gone as soon as the guest has read it.
        let _ = std::fs::remove_file(&guest_conf);
        let log_path = dirs.sandbox_machine_log(&rec.name);
        let this_run = || {
            let text = std::fs::read(&log_path).unwrap_or_default();
            String::from_utf8_lossy(text.get(usize::try_from(from).unwrap_or(0)..).unwrap_or_default()).into_owned()
        };
        let lost = |how: String| -> anyhow::Error {
            fail(format!("provisioning lost its ssh session {}: {how}", at_step(&this_run())))
                .hint(format!(
                    "the VM or its network to this host (gvproxy) stopped answering; see `{}` and try `ppp run --name {}` again",
                    log_path.display(),
                    rec.name
                ))
                .into()
        };
        let code = match code {
            Err(exec::ExecError::Silent { quiet, .. }) => {
                return Err(lost(format!("nothing came from the VM for {} s", quiet.as_secs())));
            }
            other => other?,
        };
        if code != 0 {
            let text = this_run();
            let why = text.lines().rev().find_map(|l| {
                l.split_once("ppp-provision: FAILED").map(|(_, r)| r.trim_start_matches([' ', ':']).to_owned())
            });
            return Err(match why {
                Some(why) => fail(format!("provisioning failed: {why}"))
                    .hint(format!("see `{}`", log_path.display()))
                    .into(),
                // ssh's own failure (255): the connection broke, the
                // script never reported.
                None if code == SSH_FAILED => lost(format!("ssh exited with status {code}")),
                None => fail(format!("provisioning failed {}: provision.sh exited with status {code}", at_step(&text)))
                    .hint(format!("see `{}`", log_path.display()))
                    .into(),
            });
        }
        Ok(())
    })
}

/// The status ssh (and so `podman machine ssh`) exits with when the
/// connection itself failed.
const SSH_FAILED: i32 = 255;

/// "at step 4/9 (kill switch …)": the last step provision.sh announced in
/// `text`, or "before its first step".
fn at_step(text: &str) -> String {
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix("ppp-provision: step "))
        .and_then(|rest| rest.split_once(' '))
        .map_or_else(|| "before its first step".to_owned(), |(n, what)| format!("at step {n} ({})", what.trim()))
}

/// `sudo bash /tmp/ppp/provision.sh VERB ARGS…`.
pub(super) fn provision_argv(verb: &str, rest: &[&str]) -> Vec<String> {
    let mut line: Vec<String> = ["sudo", "bash"].iter().map(|s| (*s).to_owned()).collect();
    line.push(format!("{GUEST_DIR}/provision.sh"));
    line.push(verb.to_owned());
    line.extend(rest.iter().map(|s| (*s).to_owned()));
    line
}

#[cfg(test)]
mod tests {
    use super::at_step;

    #[test]
    fn the_step_named_is_the_last_one_announced() {
        let log = "ppp-provision: step 1/9 wireguard\nppp-provision: wireguard: kernel module\n\
                   ppp-provision: step 4/9 kill switch (nftables table inet ppp)\nsome output\n";
        assert_eq!(at_step(log), "at step 4/9 (kill switch (nftables table inet ppp))");
        assert_eq!(at_step("Warning: permanently added\n"), "before its first step");
    }
}

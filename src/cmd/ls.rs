//! `ppp ls`: sandboxes from their `sandbox.json`, with the live machine
//! state merged in from `podman machine list` when podman is available.

use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;

use super::Ctx;
use crate::cli::LsArgs;
use crate::podman::{self, Machine};
use crate::sandbox::{self, Record};

/// One sandbox as `ppp ls --json` prints it.
#[derive(Debug, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub record: Record,
    /// The merged state: the machine's live state when podman answered,
    /// `missing` when podman has no such machine, else the recorded status.
    pub state: String,
    /// What podman said about the machine, if it was asked.
    pub machine: Option<Machine>,
    /// The workspace guard (ADR 0036): `on`, `strict`, `off` or `clone`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protection: Option<crate::sandbox::guard::Protection>,
}

/// Run `ppp ls`.
pub fn run(args: &LsArgs, ctx: &Ctx) -> Result<ExitCode> {
    let dirs = ctx.dirs()?;
    let records = sandbox::load_all(dirs)?;
    if args.quiet {
        let mut names = String::new();
        for r in &records {
            names.push_str(&r.name);
            names.push('\n');
        }
        crate::output::print(&names)?;
        return Ok(ExitCode::SUCCESS);
    }
    let machines = if records.is_empty() { None } else { machines() };
    let mut rows = merge(records, machines.as_deref());
    let config = crate::config::load(dirs)?;
    for r in &mut rows {
        r.protection =
            Some(crate::sandbox::guard::Settings::for_sandbox(&config, &r.record.name).protection(&r.record));
    }
    if args.json {
        crate::output::json(&rows)?;
    } else {
        crate::output::print(&render(&rows))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Ask podman for its machines. `None` when podman is absent or fails; a
/// failure is reported on stderr but does not fail `ls`, whose records are
/// still worth showing.
fn machines() -> Option<Vec<Machine>> {
    let program = podman::program()?;
    let out = match crate::exec::run(&podman::machine_list(program)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("warning: {e}; showing recorded states");
            return None;
        }
    };
    match podman::parse_machine_list(&out.stdout) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("warning: could not parse `podman machine list` output: {e}; showing recorded states");
            None
        }
    }
}

/// Join records with machines by machine name. Machines ppp did not create
/// are ignored.
pub fn merge(records: Vec<Record>, machines: Option<&[Machine]>) -> Vec<Row> {
    records
        .into_iter()
        .map(|record| {
            let machine = machines.and_then(|ms| ms.iter().find(|m| m.name == record.machine_name).cloned());
            let state = match (machines, &machine) {
                (None, _) => record.status.to_string(),
                (Some(_), Some(m)) => m.state().to_owned(),
                // Between the claim and `machine init` there is no machine yet.
                (Some(_), None) if record.status == sandbox::Status::Creating => "creating".to_owned(),
                (Some(_), None) => "missing".to_owned(),
            };
            Row { record, state, machine, protection: None }
        })
        .collect()
}

/// The table `ppp ls` prints.
pub fn render(rows: &[Row]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let ports = if r.record.published.is_empty() {
                "-".to_owned()
            } else {
                r.record.published.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
            };
            vec![r.record.name.clone(), r.record.agent.clone(), r.state.clone(), ports, r.record.workspace.join(",")]
        })
        .collect();
    crate::output::table(&["NAME", "AGENT", "STATUS", "PORTS", "WORKSPACE"], &body)
}

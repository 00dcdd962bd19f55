//! ppp runs AI coding agents in isolated Podman Machine microVMs. All guest
//! egress is tunnelled over WireGuard to one host mitmdump, where ppp's addon
//! enforces network policy and injects API keys that never enter the guest.
//!
//! The binary (`src/main.rs`) only calls [`main`]; the library exists so
//! benchmarks, fuzz targets and tests can reach the pure modules.

use std::process::ExitCode;

use clap::Parser;

pub mod assets;
pub mod cli;
pub mod cmd;
pub mod dirs;
pub mod env;
pub mod error;
pub mod exec;
pub mod output;
pub mod podman;
pub mod policy;
pub mod proxy;
pub mod sandbox;
pub mod secret;
pub mod state;
pub mod versions;

/// Parse the command line, run the command, render any error.
pub fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    init_tracing(cli.debug);
    let ctx = cmd::Ctx::from_env(cli.debug);
    match cmd::dispatch(cli.command, &ctx) {
        Ok(code) => code,
        // `ppp ls | head -1` closing the pipe is not an error.
        Err(e) if output::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let (text, code) = error::render(&e);
            eprint!("{text}");
            ExitCode::from(code)
        }
    }
}

fn init_tracing(debug: bool) {
    let default = if debug { "ppp=debug" } else { "ppp=warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env(env::PPP_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(LogLine)
        .try_init();
}

/// Log lines in the same shape as ppp's other messages: `warning: …`,
/// `debug: …`, with no colour codes and no timestamps.
struct LogLine;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for LogLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let word = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            tracing::Level::INFO => "info",
            tracing::Level::DEBUG => "debug",
            tracing::Level::TRACE => "trace",
        };
        write!(writer, "{word}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

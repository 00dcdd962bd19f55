//! ppp runs AI coding agents in isolated Podman Machine microVMs. All guest
//! egress is tunnelled over WireGuard to one host mitmdump, where ppp's addon
//! enforces network policy and injects API keys that never enter the guest.
//!
//! The binary (`src/main.rs`) only calls [`main`]; the library exists so
//! benchmarks, fuzz targets and tests can reach the pure modules.

use std::process::ExitCode;

use clap::FromArgMatches as _;

pub mod agent;
pub mod assets;
pub mod cli;
pub mod cmd;
pub mod config;
pub mod diagnose;
pub mod dirs;
pub mod env;
pub mod error;
pub mod exec;
pub mod kit;
pub mod output;
pub mod podman;
pub mod policy;
pub mod progress;
pub mod proxy;
pub mod sandbox;
pub mod secret;
pub mod setup;
pub mod state;
pub mod template;
pub mod tui;
pub mod usage;
pub mod versions;

/// Parse the command line, run the command, render any error.
pub fn main() -> ExitCode {
    let matches = cli::matches();
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_tracing(cli.debug);
    // Only the command's name: its arguments may hold a secret (`-t KEY`).
    tracing::debug!(
        "ppp {} ({}), command `{}`",
        env!("CARGO_PKG_VERSION"),
        versions::GIT_REVISION,
        command_path(&matches)
    );
    let ctx = cmd::Ctx::from_env(cli.debug).with_quiet(cli.quiet);
    match cmd::dispatch(cli.command, &ctx) {
        Ok(code) => code,
        // `ppp ls | head -1` closing the pipe is not an error.
        Err(e) if output::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let (text, code) = error::render(&e);
            // A cause may quote what a guest or a child printed.
            eprint!("{}", output::terminal_safe(&text));
            ExitCode::from(code)
        }
    }
}

/// `secret set`, `daemon log-level set`: the subcommand names only.
fn command_path(matches: &clap::ArgMatches) -> String {
    let mut names = Vec::new();
    let mut m = matches;
    while let Some((name, sub)) = m.subcommand() {
        names.push(name);
        m = sub;
    }
    names.join(" ")
}

/// Changes ppp's own log filter after start-up (`daemon log-level`).
static FILTER: std::sync::OnceLock<
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
> = std::sync::OnceLock::new();

/// Set ppp's own log level in this process, unless `PPP_LOG` or
/// `RUST_LOG` pins it.
pub fn set_log_level(level: config::LogLevel) {
    if std::env::var_os(env::PPP_LOG).is_some() || std::env::var_os(env::RUST_LOG).is_some() {
        return;
    }
    if let Some(h) = FILTER.get() {
        let _ = h.reload(tracing_subscriber::EnvFilter::new(config::tracing_directive(level)));
    }
}

/// `-D` wins, then `PPP_LOG`, then `RUST_LOG` (the variable Rust users
/// reach for first), then the level in config.yaml.
fn init_tracing(debug: bool) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let configured = || {
        let level = dirs::Dirs::from_env().ok().and_then(|d| config::load(&d).ok()).map(|c| c.log.general);
        config::tracing_directive(level.unwrap_or(config::LogLevel::Warn))
    };
    let filter = if debug {
        tracing_subscriber::EnvFilter::new("ppp=debug")
    } else {
        tracing_subscriber::EnvFilter::try_from_env(env::PPP_LOG)
            .or_else(|_| tracing_subscriber::EnvFilter::try_from_env(env::RUST_LOG))
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(configured()))
    };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(false).event_format(LogLine);
    // With -D the user asked for debug output; a configured level must not
    // take it away later.
    if tracing_subscriber::registry().with(filter).with(fmt).try_init().is_ok() && !debug {
        let _ = FILTER.set(handle);
    }
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

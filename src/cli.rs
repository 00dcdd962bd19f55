//! The command-line surface: the complete clap tree. Doc comments here are
//! the `--help` text users read, so they are written for users.
//!
//! Parsing touches nothing: no files, no environment beyond clap's own
//! `env` fallbacks, no processes. Commands resolve what they need later.

#![allow(clippy::struct_excessive_bools, reason = "clap flags are naturally bools")]

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

use crate::config::LogLevel;
use crate::error::{Failure, fail};
use crate::policy::limits::Size;
use crate::policy::{Preset, Rule, Source, Verdict};
use crate::usage::budget::{self, Period};

/// Run AI coding agents in isolated microVM sandboxes.
///
/// Each sandbox is its own Podman Machine with its own kernel. All of its
/// traffic is tunnelled over WireGuard to a host proxy that enforces network
/// policy and injects API keys, which never enter the sandbox.
#[derive(Debug, Parser)]
#[command(
    name = "ppp",
    version,
    disable_help_subcommand = true,
    max_term_width = 100,
    after_help = "Start with `ppp setup`, then `ppp run opencode .`"
)]
pub struct Cli {
    /// Print debug logs on stderr
    #[arg(short = 'D', long, global = true)]
    pub debug: bool,

    /// Print no progress; `create` and `ls` print only names
    // `ls -q`, `policy ls|log -q`, `secret ls -q` and `template ls -q`
    // declare their own `quiet` with a more precise help line. Sharing the
    // id makes clap skip the global copy there and carry the value both
    // ways, so `ppp -q ls` and `ppp ls -q` mean the same.
    #[arg(short, long, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// Parse the process's command line, or print clap's error and exit.
pub fn matches() -> clap::ArgMatches {
    use clap::CommandFactory as _;
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    Cli::command().try_get_matches_from(&argv).unwrap_or_else(|e| with_subcommand_tip(e, &Cli::command(), &argv).exit())
}

/// `err`, with the names one slip away added in front of clap's own "a
/// similar subcommand exists" tip. clap's suggestions are on, but it
/// proposes only names whose Jaro similarity exceeds 0.7, which short names
/// with one slip miss (`rn` is 0.61 from `run`) or rank below a longer one
/// (`secret st` gets `set-custom`, not `set`). One edit (two for longer
/// words) catches those.
pub fn with_subcommand_tip(mut err: clap::Error, cmd: &clap::Command, argv: &[std::ffi::OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::InvalidSubcommand {
        return err;
    }
    let Some(ContextValue::String(typed)) = err.get(ContextKind::InvalidSubcommand) else {
        return err;
    };
    let typed = typed.clone();
    // The mistyped word belongs to the deepest command named before it
    // (`ppp policy alow`); global flags take no values, so every earlier
    // word that names a subcommand is one.
    let mut at = cmd;
    for word in argv.iter().skip(1) {
        let word = word.to_string_lossy();
        if word == typed {
            break;
        }
        if let Some(sub) = at.find_subcommand(&*word) {
            at = sub;
        }
    }
    let names: Vec<&str> = at.get_subcommands().filter(|c| !c.is_hide_set()).map(clap::Command::get_name).collect();
    let mut near = similar_names(&typed, &names);
    if let Some(ContextValue::Strings(clap_says)) = err.get(ContextKind::SuggestedSubcommand) {
        for n in clap_says {
            if !near.contains(n) {
                near.push(n.clone());
            }
        }
    }
    if !near.is_empty() {
        err.insert(ContextKind::SuggestedSubcommand, ContextValue::Strings(near));
    }
    err
}

/// The names in `names` within one edit of `typed` (two when it has five or
/// more characters), those that contain its letters in order first: `rn`
/// is `run` with a letter dropped before it is `rm` with one changed.
fn similar_names(typed: &str, names: &[&str]) -> Vec<String> {
    let limit = if typed.chars().count() >= 5 { 2 } else { 1 };
    let mut near: Vec<(bool, &str)> =
        names.iter().filter(|n| edit_distance(typed, n) <= limit).map(|n| (!is_subsequence(typed, n), *n)).collect();
    near.sort_by_key(|&(later, _)| later);
    near.into_iter().map(|(_, n)| n.to_owned()).collect()
}

/// Whether the characters of `short` appear in `long` in order.
fn is_subsequence(short: &str, long: &str) -> bool {
    let mut rest = long.chars();
    short.chars().all(|c| rest.any(|l| l == c))
}

/// Edits (insert, delete, change, swap two neighbours) from `a` to `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print a shell completion script
    Completion(CompletionArgs),
    /// Copy files between the host and a sandbox
    Cp(CpArgs),
    /// Create a sandbox without starting its agent
    Create(CreateArgs),
    /// Manage the host proxy daemon
    #[command(subcommand)]
    Daemon(DaemonCommand),
    /// Collect versions, state and logs for a bug report
    Diagnose(DiagnoseArgs),
    /// Run a command inside a sandbox
    Exec(ExecArgs),
    /// Manage kits: declarative sandbox extensions (experimental)
    #[command(subcommand, after_help = KIT_HELP)]
    Kit(KitCommand),
    /// List sandboxes
    Ls(LsArgs),
    /// Manage network policy
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// List, publish or unpublish a sandbox's ports
    Ports(PortsArgs),
    /// Remove every sandbox and all ppp state
    Reset(ResetArgs),
    /// Remove sandboxes
    Rm(RmArgs),
    /// Create or reattach a sandbox and run an agent in it
    Run(RunArgs),
    /// Manage API keys and other secrets injected by the proxy
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Check the host and fix what ppp needs
    Setup(SetupArgs),
    /// Stop sandboxes, keeping their state
    Stop(StopArgs),
    /// Save and load sandbox templates
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Open the interactive dashboard
    Tui,
    /// Show the LLM tokens each sandbox used, and what they cost
    #[command(after_help = USAGE_HELP)]
    Usage(UsageArgs),
    /// Print the versions of ppp and the tools it drives
    Version(VersionArgs),
    /// Print completion candidates; called by the completion scripts
    #[command(name = "__complete", hide = true)]
    Complete(CompleteArgs),
    /// Write one man page per command into DIR; called by `make man`
    #[command(name = "__man", hide = true)]
    Man(ManArgs),
}

/// The kit format, in `ppp kit --help` and `man ppp-kit`: installed users
/// have no docs/kits.md, and kit errors point here.
const KIT_HELP: &str = "\
A kit is a directory with a kit.yaml (unknown fields are errors):
  apiVersion: ppp.kit/v1
  kind: Kit
  metadata:
    name: tools              # 1-63 of a-z, 0-9, -
    version: 0.1.0           # semver, optionally -pre and +build
  spec:
    secrets:                 # at most 64; each must be stored before the kit applies
      - service: github
    network:                 # entries as `ppp policy allow` takes them; at most 1024
      allow: [\"registry.npmjs.org\", \"*.pypi.org\"]
      deny: [\"telemetry.example.com\"]
    env:                     # at most 256; values at most 64 KiB
      TOOLS_HOME: /opt/tools
    startup:                 # at most 64; each a non-empty argv, run at every start
      - command: [\"sh\", \"-c\", \"mkdir -p /opt/tools\"]
    files:                   # at most 256; each 1 MiB, 8 MiB in all
      - path: /etc/tools/config.toml   # absolute, no `..`
        content: \"answer = 42\\n\"      # or source: a path inside the kit directory
        mode: \"0600\"                   # octal, at most 0777; default 0644
kit.yaml itself is at most 256 KiB.";

/// What `ppp usage --help` says under the flags: installed users have no
/// docs/user-guide/usage-report.md, and the report's footnotes point here.
const USAGE_HELP: &str = "\
The proxy reads the tokens each LLM response reports (Anthropic, OpenAI and
Gemini, or providers you add) as it passes; the agent cannot change them.
TODAY and 7 DAYS are UTC days. A `~` marks numbers that include estimated
responses: one that reported no usage (an error, a cut stream, an OpenAI
stream without usage) is counted from its bytes, about four to a token.

COST is an estimate from list prices that ship with ppp, dated under the
table; `-` means a model has no price. Put yours (a discount, a new model,
a gateway) in usage/prices.yaml in ppp's config directory (the table's
footnote names it; ~/.config/ppp unless PPP_CONFIG or XDG_CONFIG_HOME
says otherwise). Its entries are tried before the built-in ones:
  date: 2026-11-30             # when you took the prices
  currency: USD
  prices:
    - provider: anthropic      # a provider's name
      model: claude-sonnet-4*  # a glob on the model name; the first match wins
      input: 3                 # USD per million tokens
      output: 15
      cache_read: 0.30         # optional: without it, cached tokens have no price
      cache_write: 3.75        # optional, as cache_read

Examples:
  ppp usage
  ppp usage red-fox --since 2h
  ppp usage --since 2026-11-30 --json";

/// What `ppp __complete` completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompleteKind {
    /// Sandbox names
    Sandboxes,
}

/// `ppp __complete`.
#[derive(Debug, Args)]
pub struct CompleteArgs {
    /// What to complete
    #[arg(value_enum)]
    pub kind: CompleteKind,

    /// The command line so far, program name first and the word being
    /// completed last; without it, every sandbox name is printed
    #[arg(last = true, value_name = "WORDS")]
    pub words: Vec<String>,
}

/// `ppp __man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Flags shared by `run` and `create`.
#[derive(Debug, Args)]
pub struct SandboxSpec {
    /// The agent to run (opencode, claude, codex, gemini)
    #[arg(value_name = "AGENT")]
    pub agent: String,

    /// Workspace directories to mount; the first is the working directory
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<PathBuf>,

    /// Name of the sandbox [default: a generated `adjective-noun`]
    #[arg(long)]
    pub name: Option<String>,

    /// Work on a private clone of the workspace's git repository inside the
    /// sandbox, reachable from the host as the remote `sandbox-<name>`
    #[arg(long)]
    pub clone: bool,

    /// Virtual CPUs for the sandbox VM (0 = all host CPUs)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub cpus: u32,

    /// Memory for the sandbox VM, in binary units such as `8g` or `512MiB`
    /// [default: half the host's RAM, at most 32 GiB]
    #[arg(short = 'm', long, value_name = "SIZE")]
    pub memory: Option<String>,

    /// Disk size for the sandbox VM, in binary units such as `100g`
    #[arg(long, value_name = "SIZE")]
    pub disk_size: Option<String>,

    /// Apply a kit before the agent starts (repeatable)
    #[arg(long = "kit", value_name = "REFERENCE")]
    pub kits: Vec<String>,

    /// Start from a saved template instead of the agent's default image
    #[arg(short = 't', long, value_name = "TAG")]
    pub template: Option<String>,
}

/// `ppp run`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  ppp run opencode .\n  ppp run --name api -m 8g opencode ~/src/api -- --model sonnet"
)]
pub struct RunArgs {
    #[command(flatten)]
    pub spec: SandboxSpec,

    /// Move aside (`<name>.ppp-quarantine`) what the agent created or changed
    /// in the workspace that can run code on this host (git hooks and
    /// config, `.gitattributes`, `.envrc`, `.vscode/`, `.idea/`, …), and exit
    /// non-zero, instead of only reporting it [config: `workspace.strict`].
    /// The guard is on for every sandbox unless config.yaml's
    /// `workspace.unprotected` names it; then the agent can plant git hooks,
    /// git configuration and editor tasks that run on this host the next
    /// time you work in the workspace.
    #[arg(long)]
    pub strict: bool,

    /// Learn what the agent needs: allow what no rule decides and log it
    /// as `learned` (deny rules and internal addresses still refuse), until
    /// `ppp policy learn --off` or `ppp policy apply`; then `ppp policy
    /// suggest` writes the policy it used
    #[arg(long)]
    pub learn: bool,

    /// Arguments passed to the agent, after `--`
    #[arg(last = true, value_name = "AGENT_ARGS")]
    pub agent_args: Vec<String>,
}

/// `ppp create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub spec: SandboxSpec,
    // `-q` (print only the name, no progress) is the global flag.
}

/// `ppp ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Print JSON
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,

    /// Print only sandbox names
    #[arg(short, long)]
    pub quiet: bool,
}

/// `ppp usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Only this sandbox
    #[arg(value_name = "SANDBOX")]
    pub sandbox: Option<String>,

    /// One window from this time on, with each kind of token: an RFC 3339
    /// time, a UTC day (2026-11-30) or an age (30m, 2h, 7d)
    #[arg(long, value_name = "T")]
    pub since: Option<String>,

    /// Print one JSON object
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,

    /// Print only each sandbox's name and its tokens (all time, or since T)
    #[arg(short, long)]
    pub quiet: bool,
}

/// `ppp stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// Sandboxes to stop
    #[arg(value_name = "SANDBOX", required = true)]
    pub sandboxes: Vec<String>,

    /// Move aside (`<name>.ppp-quarantine`) what the agent created or changed
    /// in the workspace that can run code on this host (git hooks and
    /// config, `.gitattributes`, `.envrc`, `.vscode/`, `.idea/`, …), and exit
    /// non-zero, instead of only reporting it [config: `workspace.strict`].
    /// The guard is on for every sandbox unless config.yaml's
    /// `workspace.unprotected` names it; then the agent can plant git hooks,
    /// git configuration and editor tasks that run on this host the next
    /// time you work in the workspace.
    #[arg(long)]
    pub strict: bool,
}

/// `ppp rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Sandboxes to remove
    #[arg(value_name = "SANDBOX", required_unless_present = "all")]
    pub sandboxes: Vec<String>,

    /// Remove every sandbox
    #[arg(long, conflicts_with = "sandboxes")]
    pub all: bool,

    /// Do not ask for confirmation, and remove even an unresponsive machine
    #[arg(short, long)]
    pub force: bool,

    /// Move aside (`<name>.ppp-quarantine`) what the agent created or changed
    /// in the workspace that can run code on this host (git hooks and
    /// config, `.gitattributes`, `.envrc`, `.vscode/`, `.idea/`, …), and exit
    /// non-zero, instead of only reporting it [config: `workspace.strict`].
    /// The guard is on for every sandbox unless config.yaml's
    /// `workspace.unprotected` names it; then the agent can plant git hooks,
    /// git configuration and editor tasks that run on this host the next
    /// time you work in the workspace.
    #[arg(long)]
    pub strict: bool,
}

/// `ppp exec`.
#[derive(Debug, Args)]
#[command(after_help = "Example:\n  ppp exec red-fox -- printf '%s\\n' \"a b\"")]
pub struct ExecArgs {
    /// Run the command in the background
    #[arg(short, long)]
    pub detach: bool,

    /// Set an environment variable, `NAME=VALUE` (repeatable)
    #[arg(short, long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,

    /// Read environment variables from a file of `NAME=VALUE` lines
    #[arg(long, value_name = "FILE")]
    pub env_file: Vec<PathBuf>,

    /// Keep standard input open
    #[arg(short, long)]
    pub interactive: bool,

    /// Give the command extended privileges
    #[arg(long)]
    pub privileged: bool,

    /// Allocate a pseudo-terminal
    #[arg(short, long)]
    pub tty: bool,

    /// Run as this user, `NAME` or `UID[:GID]`
    #[arg(short, long)]
    pub user: Option<String>,

    /// Working directory inside the sandbox
    #[arg(short, long, value_name = "DIR")]
    pub workdir: Option<String>,

    /// The sandbox to run in
    #[arg(value_name = "SANDBOX")]
    pub sandbox: String,

    /// The command and its arguments, passed through unchanged
    #[arg(value_name = "COMMAND", required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// `ppp cp`.
#[derive(Debug, Args)]
#[command(
    after_help = "One side is `SANDBOX:PATH`, for example:\n  ppp cp red-fox:/workspace/out.txt .\n  ppp cp ./data red-fox:/tmp/data"
)]
pub struct CpArgs {
    /// Follow symbolic links in SRC
    #[arg(short = 'L', long)]
    pub follow_link: bool,

    /// Source: a host path or `SANDBOX:PATH`
    #[arg(value_name = "SRC")]
    pub src: String,

    /// Destination: a host path or `SANDBOX:PATH`
    #[arg(value_name = "DST")]
    pub dst: String,
}

/// `ppp ports`.
#[derive(Debug, Args)]
pub struct PortsArgs {
    /// The sandbox
    #[arg(value_name = "SANDBOX")]
    pub sandbox: String,

    /// Publish a port, `[[HOST_IP:]HOST_PORT:]SANDBOX_PORT[/PROTOCOL]`
    /// (repeatable; protocols tcp, tcp4, tcp6, udp, udp4, udp6; default tcp)
    #[arg(long, value_name = "SPEC")]
    pub publish: Vec<String>,

    /// Remove a published port, same syntax as `--publish` (repeatable)
    #[arg(long, value_name = "SPEC")]
    pub unpublish: Vec<String>,

    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// `ppp setup`.
#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Apply every fix without asking (for CI)
    #[arg(short, long)]
    pub yes: bool,

    /// Also import API keys found in environment variables
    #[arg(long)]
    pub import_secrets: bool,

    /// Build the agents' images now (all, or the agents named, comma-separated) in a VM of their own and cache them
    #[arg(long, value_name = "AGENT", num_args = 0.., value_delimiter = ',')]
    pub build_images: Option<Vec<String>>,
}

/// `ppp reset`.
#[derive(Debug, Args)]
pub struct ResetArgs {
    /// Do not ask for confirmation
    #[arg(short, long)]
    pub force: bool,

    /// Keep stored secrets
    #[arg(long)]
    pub preserve_secrets: bool,
}

/// Output formats of `ppp diagnose`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiagnoseFormat {
    /// A human-readable report
    Table,
    /// One JSON object
    Json,
    /// YAML
    Yaml,
    /// Markdown ready to paste into a GitHub issue
    GithubIssue,
}

/// `ppp diagnose`.
#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// Output format
    #[arg(short, long, value_enum, default_value_t = DiagnoseFormat::Table)]
    pub output: DiagnoseFormat,

    /// Write the report as a GitHub issue body to a file and print the `gh`
    /// command that files it; ppp itself sends nothing
    #[arg(long, conflicts_with = "output")]
    pub upload: bool,
}

/// `ppp version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// Shells `ppp completion` writes scripts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
    Powershell,
}

/// `ppp completion`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  ppp completion bash > ~/.local/share/bash-completion/completions/ppp\n  ppp completion zsh > \"${fpath[1]}/_ppp\"\n  ppp completion fish > ~/.config/fish/completions/ppp.fish"
)]
pub struct CompletionArgs {
    /// The shell
    #[arg(value_enum)]
    pub shell: Shell,

    /// Leave out command and flag descriptions
    #[arg(long)]
    pub no_descriptions: bool,
}

/// `ppp daemon …`.
#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Start the proxy daemon (a no-op when it is already running)
    Start(DaemonStartArgs),
    /// Stop the proxy daemon; sandboxes keep their ports
    Stop,
    /// Show whether the daemon is alive and which tunnels are active
    Status(DaemonStatusArgs),
    /// Show or set log levels
    LogLevel(LogLevelArgs),
}

/// `ppp daemon start`.
#[derive(Debug, Args)]
pub struct DaemonStartArgs {
    /// Run in the background
    #[arg(short, long)]
    pub detach: bool,

    /// Initialise the global policy with this preset if there is none
    #[arg(long, value_enum, value_name = "PRESET")]
    pub policy: Option<Preset>,
}

/// `ppp daemon status`.
#[derive(Debug, Args)]
pub struct DaemonStatusArgs {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// Which log a level applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogTarget {
    /// mitmdump's event log
    Proxy,
    /// ppp's own log
    General,
    /// Both
    All,
}

/// `ppp daemon log-level`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct LogLevelArgs {
    #[command(subcommand)]
    pub set: Option<LogLevelSet>,

    /// Which log
    #[arg(value_enum, default_value_t = LogTarget::All)]
    pub target: LogTarget,

    /// The level to set; without it, print the current levels
    #[arg(value_enum)]
    pub level: Option<LogLevel>,
}

/// `ppp daemon log-level set`.
#[derive(Debug, Subcommand)]
pub enum LogLevelSet {
    /// Persist a log level in config.yaml and apply it
    Set {
        /// Which log
        #[arg(value_enum)]
        target: LogTarget,
        /// The level
        #[arg(value_enum)]
        level: LogLevel,
    },
}

/// `ppp kit …`.
#[derive(Debug, Subcommand)]
pub enum KitCommand {
    /// Apply a kit to a sandbox
    Add {
        /// The sandbox
        #[arg(value_name = "SANDBOX")]
        sandbox: String,
        /// A kit directory, .zip file, OCI reference or git URL
        #[arg(value_name = "REFERENCE")]
        reference: String,
    },
    /// Show a kit's metadata
    Inspect {
        /// A kit directory, .zip file, OCI reference or git URL
        #[arg(value_name = "REFERENCE")]
        reference: String,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Validate a kit directory and zip it
    Pack {
        /// Directory containing kit.yaml
        #[arg(value_name = "DIRECTORY")]
        directory: PathBuf,
        /// Output file [default: <name>-<version>.zip]
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Download a kit from an OCI registry
    Pull {
        /// OCI reference, e.g. `registry.example.com/kits/tools:0.1.0`
        #[arg(value_name = "REFERENCE")]
        reference: String,
        /// Output file
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Pack a kit directory and push it to an OCI registry
    Push {
        /// Directory containing kit.yaml
        #[arg(value_name = "DIRECTORY")]
        directory: PathBuf,
        /// OCI reference to push to
        #[arg(value_name = "REFERENCE")]
        reference: String,
    },
    /// Check a kit against the schema
    Validate {
        /// A kit directory, .zip file, OCI reference or git URL
        #[arg(value_name = "REFERENCE")]
        reference: String,
    },
}

/// The kind of rule a policy command acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuleKind {
    // Plain comments: doc comments would turn clap's help into its long
    // form. `network`: which hosts, addresses and ports may be reached;
    // `http`: which methods and paths of an allowed host (ADR 0050).
    Network,
    Http,
}

impl RuleKind {
    /// The rule type in the policy files.
    pub fn rule_type(self) -> crate::policy::RuleType {
        match self {
            Self::Network => crate::policy::RuleType::Network,
            Self::Http => crate::policy::RuleType::Http,
        }
    }
}

/// Rule types for `policy ls --type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuleTypeFilter {
    Network,
    Http,
}

/// Flow types for `policy log --type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FlowTypeFilter {
    All,
    Network,
    Filesystem,
}

/// Source filter for `policy ls --source`. `org` is accepted for
/// compatibility and always matches nothing: ppp has no org policy source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourceFilter {
    Local,
    Kit,
    Preset,
    Approval,
    Org,
}

impl SourceFilter {
    /// The rule source this filter selects, if any can match.
    pub fn source(self) -> Option<Source> {
        match self {
            Self::Local => Some(Source::Local),
            Self::Kit => Some(Source::Kit),
            Self::Preset => Some(Source::Preset),
            Self::Approval => Some(Source::Approval),
            Self::Org => None,
        }
    }
}

/// The rules `policy rm --source` removes. Unlike [`SourceFilter`] it
/// names one kit too, and it refuses `org`: removing nothing on purpose is
/// a mistake worth saying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSelector {
    /// Every rule with this source (`local`, `kit`, `preset`).
    Source(Source),
    /// The rules one kit added: its name, without `kit:`.
    Kit(String),
}

impl SourceSelector {
    /// The accepted forms, for error messages.
    const FORMS: &str = "`local`, `preset`, `approval`, `kit` or `kit:NAME`";

    /// Parse a `--source` value. Errors are usage errors (exit code 2).
    pub fn parse(value: &str) -> Result<Self, Failure> {
        match value {
            "local" => Ok(Self::Source(Source::Local)),
            "kit" => Ok(Self::Source(Source::Kit)),
            "preset" => Ok(Self::Source(Source::Preset)),
            "approval" => Ok(Self::Source(Source::Approval)),
            "org" => Err(fail("cannot remove rules by source `org`: ppp has no org policy source")
                .hint(format!("`ppp policy ls --source org` accepts it only for compatibility; use {}", Self::FORMS))
                .code(2)),
            _ => match value.strip_prefix("kit:") {
                Some(name) => match crate::kit::manifest::check_name(name) {
                    Ok(()) => Ok(Self::Kit(name.to_owned())),
                    Err(why) => Err(fail(format!("invalid source `{value}`: the kit name {why}"))
                        .hint("kit names are slugs such as `kit:my-tools`")
                        .code(2)),
                },
                None => Err(fail(format!("invalid source `{value}`: expected {}", Self::FORMS)).code(2)),
            },
        }
    }

    /// Whether `rule` is one this selector removes.
    pub fn matches(&self, rule: &Rule) -> bool {
        match self {
            Self::Source(s) => rule.source == *s,
            Self::Kit(name) => {
                rule.source == Source::Kit && rule.kit.as_deref().and_then(|k| k.strip_prefix("kit:")) == Some(name)
            }
        }
    }
}

impl std::fmt::Display for SourceSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Source(s) => f.write_str(s.as_str()),
            Self::Kit(name) => write!(f, "kit:{name}"),
        }
    }
}

/// `ppp policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Create the global policy from a preset
    Init {
        /// The preset
        #[arg(value_enum)]
        preset: Preset,
        /// Switch from another preset (keeps your own rules)
        #[arg(short, long)]
        force: bool,
    },
    /// Allow connections to hosts, IPs or CIDR ranges, or HTTP requests by method and path
    #[command(after_help = RESOURCE_HELP)]
    Allow(PolicyAllowArgs),
    /// Deny connections to hosts, IPs or CIDR ranges, or HTTP requests by method and path
    #[command(after_help = RESOURCE_HELP)]
    Deny(PolicyAddArgs),
    /// Show or set the body-size limits for uploads and downloads
    #[command(after_help = LIMITS_HELP)]
    Limits(PolicyLimitsArgs),
    /// Show or set what happens when no rule matches: allow, deny, or ask you
    #[command(after_help = DEFAULT_HELP)]
    Default(PolicyDefaultArgs),
    /// Set, list and remove token and cost budgets for LLM providers
    #[command(subcommand)]
    Budget(BudgetCommand),
    /// List and answer the requests an `ask` default holds
    #[command(subcommand)]
    Approval(ApprovalCommand),
    /// Show the decision for a target without changing anything
    #[command(
        after_help = "TARGET is `host[:port]`, `ip[:port]` or `[ipv6]:port`; the port defaults to 443\n\nExit status: 0 for allow and, without --exit-code, for deny; 1 for deny with --exit-code;\n2 for a mistake such as a malformed TARGET"
    )]
    Check {
        /// Rule kind
        #[arg(value_enum)]
        kind: RuleKind,
        /// The target to check
        #[arg(value_name = "TARGET")]
        target: String,
        /// With `http`: the request's method
        #[arg(long, value_name = "METHOD", default_value = "GET")]
        method: String,
        /// With `http`: the request's path, as the client sends it (checked as the proxy does)
        #[arg(long, value_name = "PATH", default_value = "/")]
        path: String,
        /// Include this sandbox's rules
        #[arg(long, value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
        /// Also print every rule that matched
        #[arg(short, long)]
        verbose: bool,
        /// Exit 1 when the decision is deny, for scripts
        #[arg(long)]
        exit_code: bool,
    },
    /// List rules
    Ls {
        /// Show the global rules plus this sandbox's rules
        #[arg(value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// Only rules with this decision
        #[arg(long, value_enum)]
        decision: Option<Verdict>,
        /// Only rules from this source
        #[arg(long, value_enum)]
        source: Option<SourceFilter>,
        /// Only rules of this type
        #[arg(long = "type", value_enum)]
        kind: Option<RuleTypeFilter>,
        /// Also list the rules of every sandbox, not only global ones
        #[arg(long)]
        include_inactive: bool,
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// Show full ids and timestamps
        #[arg(long)]
        wide: bool,
        /// Print only rule ids
        #[arg(short, long)]
        quiet: bool,
    },
    /// Show one rule in full
    Inspect {
        /// Rule id, or a unique prefix of it
        #[arg(value_name = "ID")]
        id: String,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Show recent proxied connections, newest last
    Log {
        /// Only this sandbox's connections
        #[arg(value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// Print JSON lines
        #[arg(long)]
        json: bool,
        /// How many entries to show
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print only hosts
        #[arg(short, long)]
        quiet: bool,
        /// Which flows to show
        #[arg(long = "type", value_enum, default_value_t = FlowTypeFilter::All)]
        kind: FlowTypeFilter,
        /// Keep printing connections as they are logged, after the last
        /// `--limit` ones (Ctrl-C stops)
        #[arg(short, long)]
        follow: bool,
    },
    /// Show, start or stop learning: a learning sandbox is allowed what no rule decides, logged as `learned`
    #[command(after_help = LEARN_HELP)]
    Learn {
        /// The sandbox; without it, list the sandboxes that are learning
        #[arg(value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// Stop learning: the sandbox's default decides again
        #[arg(long)]
        off: bool,
    },
    /// Print the least policy that allows what a sandbox used, from its logged flows
    #[command(after_help = SUGGEST_HELP)]
    Suggest {
        /// Only this sandbox's flows, and print that sandbox's policy file;
        /// without it, every sandbox's flows as a global policy file
        #[arg(value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// Only flows logged since this time (RFC 3339) or this long ago (30m, 2h, 7d)
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// Turn two or more sibling hosts into `*.parent` (never across a public suffix)
        #[arg(long)]
        collapse: bool,
        /// One rule per host, any port, instead of one per port seen
        #[arg(long)]
        any_port: bool,
        /// Read this flow log instead of ppp's own
        #[arg(long, value_name = "FILE")]
        log: Option<PathBuf>,
    },
    /// Decide logged flows again under a candidate policy and show what would change
    #[command(after_help = REPLAY_HELP)]
    Replay {
        /// The candidate: a sandbox's policy file with SANDBOX, else the global one
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// Replay this sandbox's flows, the candidate in place of its file
        #[arg(value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// Only flows logged since this time (RFC 3339) or this long ago (30m, 2h, 7d)
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
        /// Read this flow log instead of ppp's own
        #[arg(long, value_name = "FILE")]
        log: Option<PathBuf>,
    },
    /// Replace the global or a sandbox's policy with a file, after showing its replay
    #[command(after_help = APPLY_HELP)]
    Apply {
        /// The new policy file (`ppp policy suggest` writes one)
        #[arg(value_name = "FILE", required_unless_present = "undo", conflicts_with = "undo")]
        file: Option<PathBuf>,
        /// Replace this sandbox's policy instead of the global one
        #[arg(long, value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// Put back the file the last apply replaced
        #[arg(long)]
        undo: bool,
    },
    /// Remove every rule you added, globally and in every sandbox
    Reset {
        /// Do not ask for confirmation
        #[arg(short, long)]
        force: bool,
    },
    /// Remove rules by id, resource or source
    #[command(
        group(ArgGroup::new("rules").args(["id", "resource", "source"]).required(true).multiple(false)),
        after_help = "SOURCE is `local`, `preset`, `approval` (rules `policy approval` wrote), `kit` (rules any kit added) or `kit:NAME` (the rules kit NAME added)"
    )]
    Rm {
        /// Rule kind
        #[arg(value_enum)]
        kind: RuleKind,
        /// Remove from this sandbox's policy instead of the global one
        #[arg(long, value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// The rule id, or a unique prefix of it
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// Remove every rule with this resource
        #[arg(long, value_name = "RESOURCE")]
        resource: Option<String>,
        /// Remove every rule from this source
        #[arg(long, value_name = "SOURCE")]
        source: Option<String>,
    },
}

const LEARN_HELP: &str = "While a sandbox learns, a flow no rule decides is allowed instead of going to the default\n\
(allow, deny or ask) and is logged with the rule `learned`. Deny rules, internal addresses, the\n\
DNS-rebinding defences, key injection and the guest's kill switch are unchanged. `ppp ls`, the TUI\n\
and `ppp policy log` show it.\n\n\
Examples:\n  ppp run --learn opencode .\n  ppp policy learn red-fox\n  ppp policy learn\n  ppp policy learn red-fox --off";

const SUGGEST_HELP: &str = "Allowed flows become exact rules: `host:port` for each port seen and `host:53` for its DNS\n\
(or `host` with --any-port), and an address rule for an address without a name or an internal\n\
address a name went to. Each rule comes after a comment: how many flows, how many learned, first\n\
and last seen, kinds, and `secret injected` for hosts a key was injected for (never collapsed).\n\
The same log gives the same file.\n\n\
Examples:\n  ppp policy suggest red-fox > red-fox.yaml\n  ppp policy suggest red-fox --since 2h --collapse";

const REPLAY_HELP: &str = "Every logged flow (of SANDBOX, or all) is decided again by the engine the daemon uses, with FILE\n\
in place of the sandbox's policy (or the global one), and counted as newly denied, newly allowed,\n\
newly held (an `ask` default) or unchanged.\n\n\
Exit status: 0 when nothing would be newly denied, 3 when something would, 2 for a mistake\n\
(a malformed FILE or flow line), 1 for other errors\n\n\
Examples:\n  ppp policy replay --policy red-fox.yaml red-fox\n  ppp policy replay --policy policies.yaml --since 1d --json";

const APPLY_HELP: &str = "The file is checked and replayed against the logged flows first (the summary is printed), then\n\
replaces the sandbox's policy.yaml (or the global policies.yaml) atomically under state.lock;\n\
the file it replaced is kept beside it (`.prev`), which `--undo` puts back (and undo again redoes).\n\
Applying a sandbox's file ends its learning unless the file says `learn: true`.\n\n\
Examples:\n  ppp policy apply red-fox.yaml --sandbox red-fox\n  ppp policy apply --undo --sandbox red-fox";

const RESOURCE_HELP: &str = "\
Resources (comma-separated):
  **                  everything
  example.com         that host, any port
  *.example.com       one label below example.com
  **.example.com      one or more labels below example.com
  api-?.example.com   ? is one character, * any characters, within a label
  ^api[0-9]+\\.io$     a regular expression over the whole host name
  10.0.0.0/8          an IPv4 or IPv6 address or CIDR range
  example.com:443     any of the above, on one port ([2001:db8::1]:443 for IPv6)

HTTP rules (`http HOST --method M[,M] --path GLOB`) decide methods and paths on a host that the
network rules allow; they never open a host. HOST is a host pattern (no address or regex); METHOD
is upper case, or ANY; in GLOB `*` stays within a segment and `**` as a segment is any number of
segments. Once a host has an HTTP rule, a request no HTTP allow matches is denied, and so is a
connection to it that ppp cannot inspect.
  ppp policy allow http api.github.com --method GET,HEAD --path '/repos/org/**'
  ppp policy deny http api.github.com --method ANY --path '/repos/org/secret/**'";

/// `ppp policy allow|deny`.
#[derive(Debug, Args)]
pub struct PolicyAddArgs {
    /// Rule kind
    #[arg(value_enum)]
    pub kind: RuleKind,

    /// Comma-separated resources; one rule is added per resource
    #[arg(value_name = "RESOURCES")]
    pub resources: String,

    /// Add to this sandbox's policy (it need not exist yet)
    #[arg(long, value_name = "SANDBOX")]
    pub sandbox: Option<String>,

    /// HTTP rules: comma-separated upper-case methods, or ANY
    #[arg(long, value_name = "METHODS")]
    pub method: Option<String>,

    /// HTTP rules: the path glob (`/repos/org/**`)
    #[arg(long, value_name = "GLOB")]
    pub path: Option<String>,
}

/// `ppp policy allow`: a rule, and optionally its own body-size limits.
#[derive(Debug, Args)]
pub struct PolicyAllowArgs {
    #[command(flatten)]
    pub rule: PolicyAddArgs,

    /// This rule's own upload limit, over `ppp policy limits` (e.g. 64MiB, or none)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub upload: Option<Size>,

    /// This rule's own download limit, over `ppp policy limits` (e.g. 2GiB, or none)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub download: Option<Size>,

    /// Pass TLS to these hosts through unread: the agent sees the server's
    /// own certificate (pinned certificates, OAuth logins, tools with their
    /// own trust store), and ppp injects nothing. Refused for a host with a
    /// secret
    #[arg(long)]
    pub no_inspect: bool,
}

/// `ppp policy default`.
#[derive(Debug, Args)]
pub struct PolicyDefaultArgs {
    /// The new default; without it, print the defaults in force
    #[arg(value_enum)]
    pub verdict: Option<Verdict>,

    /// Set this sandbox's default instead of the global one
    #[arg(long, value_name = "SANDBOX")]
    pub sandbox: Option<String>,

    /// Seconds a held request waits for an answer before it is denied (global)
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub timeout: Option<u32>,

    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
}

const DEFAULT_HELP: &str = "Rules decide first (deny over allow); the default decides the rest. Under `ask` such a\n\
request waits (60 s unless --timeout says otherwise) for `ppp policy approval allow|deny ID`\n\
or the TUI, and is denied with 403 when nobody answers. DNS for the name is answered, TLS waits\n\
at its ClientHello, other UDP is denied. Internal addresses always need an explicit rule.\n\n\
Examples:\n  ppp policy default ask\n  ppp policy default deny --sandbox ci-runner\n  ppp policy default ask --timeout 120";

/// `ppp policy budget …`.
#[derive(Debug, Subcommand)]
pub enum BudgetCommand {
    /// Set a token or cost budget for one sandbox, or for all of them together
    #[command(after_help = BUDGET_SET_HELP)]
    Set(BudgetSetArgs),
    /// List budgets with what has been used against each
    Ls {
        /// Only the budgets that count this sandbox's requests: its own and the global ones
        #[arg(value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove the budgets of one sandbox, or the global ones
    #[command(override_usage = "ppp policy budget rm [OPTIONS] [-g | SANDBOX]")]
    Rm {
        /// The sandbox whose budgets go; without it (or with -g), the global ones
        #[arg(value_name = "SANDBOX", conflicts_with = "global")]
        sandbox: Option<String>,
        /// Remove the global budgets (the default without SANDBOX)
        #[arg(short, long)]
        global: bool,
        /// Only the budget of this period
        #[arg(long, value_enum)]
        per: Option<Period>,
    },
}

/// `ppp policy budget set`.
#[derive(Debug, Args)]
#[command(
    override_usage = "ppp policy budget set [OPTIONS] [-g | SANDBOX] <--tokens <N>|--cost <USD>>",
    group(ArgGroup::new("limit").args(["tokens", "cost"]).required(true).multiple(false))
)]
pub struct BudgetSetArgs {
    /// The sandbox the budget is for (it need not exist yet); without it (or with -g), every sandbox's use together
    #[arg(value_name = "SANDBOX", conflicts_with = "global")]
    pub sandbox: Option<String>,
    /// A global budget: every sandbox's use counts towards it (the default without SANDBOX)
    #[arg(short, long)]
    pub global: bool,
    /// A limit in tokens, every kind together: input, output and cache (2000000, 2M, 500k)
    #[arg(long, value_name = "N", value_parser = budget::parse_tokens)]
    pub tokens: Option<u64>,
    /// A limit in US dollars, priced from the price table (5, 2.50)
    #[arg(long, value_name = "USD", value_parser = budget::parse_usd)]
    pub cost: Option<f64>,
    /// The period: a UTC day (midnight to midnight), or all time
    #[arg(long, value_enum, default_value_t = Period::Day)]
    pub per: Period,
    /// Past the budget, hold each request for your approval (`ppp policy approval`) instead of
    /// refusing it; an approval raises the budget by its own limit, once, for the period
    #[arg(long)]
    pub ask: bool,
}

const BUDGET_SET_HELP: &str =
    "Past a budget, requests to the LLM providers ppp meters get 429 with a message the agent shows:
which budget, and the command that raises it. A sandbox's own budgets are checked before the
global ones. A scope has one budget per period and kind (tokens or cost): setting it again
replaces it. The change is live in a running daemon. Budgets are kept in budgets.yaml.

Examples:
  ppp policy budget set red-fox --tokens 2M
  ppp policy budget set --global --cost 20 --per day
  ppp policy budget set red-fox --tokens 50M --per total --ask";

/// `ppp policy approval …`.
#[derive(Debug, Subcommand)]
pub enum ApprovalCommand {
    /// List held requests: id, sandbox, host, port, method, path, size, count, waiting time
    #[command(visible_alias = "list")]
    Ls {
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// Print only ids
        #[arg(short, long)]
        quiet: bool,
    },
    /// Let a held request through (and, with --sandbox or --global, its like from now on)
    Allow(ApprovalAnswerArgs),
    /// Refuse a held request with 403 (and, with --sandbox or --global, its like from now on)
    Deny(ApprovalAnswerArgs),
}

/// `ppp policy approval allow|deny`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("scope").args(["once", "sandbox", "global"]).multiple(false)))]
pub struct ApprovalAnswerArgs {
    /// The held request's id, from `ppp policy approval ls`
    #[arg(value_name = "ID")]
    pub id: String,
    /// Only this request (and identical ones waiting with it); the default
    #[arg(long)]
    pub once: bool,
    /// Also write a rule for its host and port to the sandbox's policy
    #[arg(long)]
    pub sandbox: bool,
    /// Also write a rule for its host and port to the global policy
    #[arg(long)]
    pub global: bool,
}

/// `ppp policy limits`.
#[derive(Debug, Args)]
pub struct PolicyLimitsArgs {
    /// Set this sandbox's limits instead of the global ones
    #[arg(long, value_name = "SANDBOX")]
    pub sandbox: Option<String>,

    /// Largest request body (e.g. 8MiB, or none)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub upload: Option<Size>,

    /// Largest response body (e.g. 2GiB, or none)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub download: Option<Size>,

    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
}

fn parse_size(text: &str) -> Result<Size, String> {
    text.parse()
}

const LIMITS_HELP: &str = "Bodies are streamed; a limit cuts a flow when its count is crossed (413).\n\
Which limit applies: the allow rule's own (ppp policy allow --upload/--download), else the\n\
sandbox's, else the global one, else the defaults: uploads 1MiB except to hosts ppp injects\n\
a key into (none), downloads none.\n\n\
Examples:\n  ppp policy limits\n  ppp policy limits --upload 8MiB\n  ppp policy limits --sandbox my-box --download 20GiB";

/// `ppp secret …`.
#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Store an API key for a service
    #[command(
        override_usage = "ppp secret set [OPTIONS] [-g | SANDBOX] SERVICE",
        after_help = "Services: anthropic, openai, github, google, groq, mistral, nebius, openrouter, xai.\nAny other name needs --host. Without -g or SANDBOX the secret is global.\n\nExamples:\n  ppp secret set -g anthropic\n  echo \"$KEY\" | ppp secret set my-sandbox openai --password-stdin\n  ppp secret set usai --host api.gsa.usai.gov"
    )]
    Set(SecretSetArgs),
    /// Store a value the proxy substitutes for a placeholder (experimental)
    #[command(override_usage = "ppp secret set-custom [OPTIONS] --placeholder <P> --host <HOST> [-g | SANDBOX]")]
    SetCustom(SecretSetCustomArgs),
    /// Import API keys from environment variables
    #[command(
        after_help = "Reads ANTHROPIC_API_KEY, OPENAI_API_KEY, GH_TOKEN or GITHUB_TOKEN, GEMINI_API_KEY or\nGOOGLE_API_KEY, GROQ_API_KEY, MISTRAL_API_KEY, NEBIUS_API_KEY, OPENROUTER_API_KEY, XAI_API_KEY"
    )]
    Import {
        /// Import only this service
        #[arg(value_name = "SERVICE", conflicts_with = "all")]
        service: Option<String>,
        /// Import every service found
        #[arg(long)]
        all: bool,
        /// Show what would be imported, without storing anything
        #[arg(long)]
        dry_run: bool,
        /// Overwrite secrets that already exist
        #[arg(short, long)]
        force: bool,
    },
    /// List stored secrets (values are never shown)
    Ls {
        /// Only this sandbox's secrets
        #[arg(value_name = "SANDBOX", conflicts_with = "global")]
        sandbox: Option<String>,
        /// Only global secrets
        #[arg(short, long)]
        global: bool,
        /// Only this service
        #[arg(long, value_name = "SERVICE")]
        service: Option<String>,
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// Print only names
        #[arg(short, long)]
        quiet: bool,
    },
    /// Remove a secret
    #[command(override_usage = "ppp secret rm [OPTIONS] [-g | SANDBOX] SERVICE|PLACEHOLDER")]
    Rm(SecretRmArgs),
}

/// `ppp secret set`.
#[derive(Debug, Args)]
pub struct SecretSetArgs {
    /// `[SANDBOX] SERVICE`
    #[arg(value_name = "NAMES", num_args = 1..=2, required = true, hide = true)]
    pub names: Vec<String>,

    /// Store globally, for every sandbox
    #[arg(short, long)]
    pub global: bool,

    /// Scope the key to this sandbox (same as giving SANDBOX)
    #[arg(long, value_name = "SANDBOX", conflicts_with = "global")]
    pub sandbox: Option<String>,

    /// API host the key is sent to (repeatable; required for services ppp does not know)
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,

    /// Read the value from standard input
    #[arg(long, conflicts_with = "token")]
    pub password_stdin: bool,

    /// The value (visible to other local users in the process list; prefer the prompt or --password-stdin)
    #[arg(short, long, value_name = "TOKEN")]
    pub token: Option<String>,

    /// Mark as a container registry credential
    #[arg(long)]
    pub registry: bool,

    /// Take the value from this command's output, run by the daemon on the host (no shell: write `sh -c '…'` for one)
    #[arg(long, value_name = "CMD", conflicts_with_all = ["token", "password_stdin", "registry"])]
    pub command: Option<String>,

    /// With --command: run it again after this long (default 1h; e.g. 30s, 55m, 1h30m)
    #[arg(long, value_name = "DURATION", requires = "command")]
    pub refresh: Option<String>,

    /// Sign in with OAuth instead of pasting a key
    #[arg(long)]
    pub oauth: bool,
}

/// `ppp secret set-custom`.
#[derive(Debug, Args)]
pub struct SecretSetCustomArgs {
    /// The sandbox to scope the secret to
    #[arg(value_name = "SANDBOX", conflicts_with = "global")]
    pub sandbox: Option<String>,

    /// Store globally, for every sandbox
    #[arg(short, long)]
    pub global: bool,

    /// The placeholder the agent sends; the proxy replaces it in request headers
    #[arg(long, value_name = "P", required = true)]
    pub placeholder: String,

    /// Host whose requests get the substitution (repeatable)
    #[arg(long = "host", value_name = "HOST", required = true)]
    pub hosts: Vec<String>,

    /// The real value
    #[arg(long, value_name = "VALUE", conflicts_with = "token")]
    pub value: Option<String>,

    /// The real value (alias of --value)
    #[arg(short, long, value_name = "TOKEN", conflicts_with = "password_stdin")]
    pub token: Option<String>,

    /// Read the real value from standard input
    #[arg(long, conflicts_with = "value")]
    pub password_stdin: bool,

    /// Also export the placeholder in the sandbox as this environment variable
    #[arg(long, value_name = "NAME")]
    pub env: Option<String>,

    /// Take the real value from this command's output, run by the daemon on the host (no shell)
    #[arg(long, value_name = "CMD", conflicts_with_all = ["value", "token", "password_stdin"])]
    pub command: Option<String>,

    /// With --command: run it again after this long (default 1h; e.g. 30s, 55m)
    #[arg(long, value_name = "DURATION", requires = "command")]
    pub refresh: Option<String>,
}

/// `ppp secret rm`.
#[derive(Debug, Args)]
pub struct SecretRmArgs {
    /// `[SANDBOX] SERVICE`
    #[arg(value_name = "NAMES", num_args = 1..=2, required = true, hide = true)]
    pub names: Vec<String>,

    /// Remove the global secret
    #[arg(short, long)]
    pub global: bool,

    /// Do not ask for confirmation
    #[arg(short, long)]
    pub force: bool,

    /// Remove a container registry credential
    #[arg(long)]
    pub registry: bool,

    /// Remove the custom secret with this placeholder, not a service key of the same name
    #[arg(long)]
    pub custom: bool,
}

/// `ppp template …`.
#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Save a sandbox's disk as a template
    Save {
        /// The sandbox
        #[arg(value_name = "SANDBOX")]
        sandbox: String,
        /// The template's tag
        #[arg(value_name = "TAG")]
        tag: String,
        /// Also export it to this file
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Stop the sandbox without asking if it is running
        #[arg(short, long)]
        force: bool,
    },
    /// Import a template from a file
    Load {
        /// A file written by `ppp template save -o`
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// List templates
    Ls {
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// Print only tags
        #[arg(short, long)]
        quiet: bool,
    },
    /// Remove a template
    Rm {
        /// Tag or id
        #[arg(value_name = "TAG|ID")]
        tag: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_passes_guest_flags_through() {
        let cli = Cli::try_parse_from(["ppp", "exec", "red-fox", "--", "ls", "-la", "--color"]).unwrap();
        let Command::Exec(a) = cli.command else { panic!() };
        assert_eq!(a.command, ["ls", "-la", "--color"]);
        let cli = Cli::try_parse_from(["ppp", "exec", "-e", "A=1", "red-fox", "printf", "-x"]).unwrap();
        let Command::Exec(a) = cli.command else { panic!() };
        assert_eq!(a.env, ["A=1"]);
        assert_eq!(a.command, ["printf", "-x"]);
    }

    #[test]
    fn run_takes_agent_args_after_dashes() {
        let cli = Cli::try_parse_from(["ppp", "run", "-m", "8g", "opencode", ".", "--", "--model", "x"]).unwrap();
        let Command::Run(a) = cli.command else { panic!() };
        assert_eq!(a.spec.agent, "opencode");
        assert_eq!(a.spec.memory.as_deref(), Some("8g"));
        assert_eq!(a.agent_args, ["--model", "x"]);
    }

    #[test]
    fn quiet_is_one_flag_everywhere() {
        for argv in [&["ppp", "-q", "ls"][..], &["ppp", "ls", "-q"], &["ppp", "create", "-q", "opencode", "."]] {
            let cli = Cli::try_parse_from(argv).unwrap();
            assert!(cli.quiet, "{argv:?}");
        }
        let cli = Cli::try_parse_from(["ppp", "-q", "ls"]).unwrap();
        let Command::Ls(a) = cli.command else { panic!() };
        assert!(a.quiet, "`ppp -q ls` lists only names, like `ppp ls -q`");
        let cli = Cli::try_parse_from(["ppp", "-q", "policy", "log"]).unwrap();
        let Command::Policy(PolicyCommand::Log { quiet, .. }) = cli.command else { panic!() };
        assert!(quiet);
        assert!(!Cli::try_parse_from(["ppp", "ls"]).unwrap().quiet);
    }

    #[test]
    fn source_selector_parses_sources_and_kits() {
        assert_eq!(SourceSelector::parse("local").unwrap(), SourceSelector::Source(Source::Local));
        assert_eq!(SourceSelector::parse("preset").unwrap(), SourceSelector::Source(Source::Preset));
        assert_eq!(SourceSelector::parse("kit").unwrap(), SourceSelector::Source(Source::Kit));
        assert_eq!(SourceSelector::parse("kit:tools").unwrap(), SourceSelector::Kit("tools".into()));
        assert_eq!(SourceSelector::parse("kit:a-1").unwrap(), SourceSelector::Kit("a-1".into()));
        for v in ["local", "preset", "kit", "kit:tools"] {
            assert_eq!(SourceSelector::parse(v).unwrap().to_string(), v);
        }
    }

    #[test]
    fn source_selector_refuses_org_and_unknown_values_with_exit_code_2() {
        let render = |v: &str| crate::error::render(&SourceSelector::parse(v).unwrap_err().into());
        let (text, code) = render("org");
        assert_eq!(code, 2);
        assert!(text.contains("source `org`") && text.contains("hint: ") && text.contains("no org policy"), "{text}");
        for bad in ["bogus", "", "Local", "KIT", "kit:", "kit:Tools", "kit:-x", "kit:a_b", "kit:a:b", "kits:x"] {
            let (text, code) = render(bad);
            assert_eq!(code, 2, "{bad}: {text}");
            assert!(text.starts_with(&format!("error: invalid source `{bad}`")), "{bad}: {text}");
        }
        let (text, _) = render("bogus");
        assert!(text.contains("`local`, `preset`, `approval`, `kit` or `kit:NAME`"), "{text}");
        let (text, _) = render("kit:Tools");
        assert!(text.contains("lowercase"), "the kit slug rule says why: {text}");
        assert!(SourceSelector::parse(&format!("kit:{}", "a".repeat(64))).is_err());
    }

    #[test]
    fn source_selector_matches_by_source_and_kit() {
        let kit_rule = |kit: Option<&str>| {
            let mut r = Rule::new(Verdict::Allow, crate::policy::Resource::parse("x.example").unwrap(), Source::Kit);
            r.kit = kit.map(str::to_owned);
            r
        };
        let local = Rule::new(Verdict::Deny, crate::policy::Resource::parse("y.example").unwrap(), Source::Local);
        let tools = SourceSelector::Kit("tools".into());
        assert!(tools.matches(&kit_rule(Some("kit:tools"))));
        assert!(!tools.matches(&kit_rule(Some("kit:other"))));
        assert!(!tools.matches(&kit_rule(Some("tools"))), "the file says `kit:NAME`");
        assert!(!tools.matches(&kit_rule(None)));
        assert!(!tools.matches(&local));
        let any_kit = SourceSelector::Source(Source::Kit);
        assert!(any_kit.matches(&kit_rule(Some("kit:other"))) && any_kit.matches(&kit_rule(None)));
        assert!(!any_kit.matches(&local));
        assert!(SourceSelector::Source(Source::Local).matches(&local));
    }

    #[test]
    fn policy_rm_needs_exactly_one_selector() {
        let rm = |extra: &[&str]| {
            let mut argv = vec!["ppp", "policy", "rm", "network"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
        };
        let Command::Policy(PolicyCommand::Rm { source, .. }) = rm(&["--source", "kit:tools"]).unwrap().command else {
            panic!()
        };
        assert_eq!(source.as_deref(), Some("kit:tools"));
        rm(&["--id", "3f2a"]).unwrap();
        rm(&["--resource", "x.example", "--sandbox", "red"]).unwrap();
        for bad in [&[][..], &["--id", "x", "--source", "kit"], &["--resource", "x", "--id", "y"]] {
            let e = rm(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn a_one_letter_slip_gets_a_subcommand_tip() {
        let tip = |argv: &[&str]| {
            let argv: Vec<std::ffi::OsString> = argv.iter().map(Into::into).collect();
            let err = Cli::command().try_get_matches_from(&argv).unwrap_err();
            let err = with_subcommand_tip(err, &Cli::command(), &argv);
            assert_eq!(err.exit_code(), 2);
            err.render().to_string()
        };
        let text = tip(&["ppp", "rn", "opencode", "."]);
        assert!(text.contains("tip: some similar subcommands exist: 'run', 'rm'"), "{text}");
        let text = tip(&["ppp", "-q", "polcy", "ls"]);
        assert!(text.contains("tip: a similar subcommand exists: 'policy'"), "{text}");
        let text = tip(&["ppp", "policy", "lg"]);
        assert!(text.contains("'log'") && text.contains("'ls'"), "{text}");
        let text = tip(&["ppp", "secret", "st", "-g", "x"]);
        assert!(text.contains("tip: some similar subcommands exist: 'set', 'set-custom'"), "{text}");
        let text = tip(&["ppp", "zzzzzz"]);
        assert!(!text.contains("tip:"), "nothing near: {text}");
        assert!(!tip(&["ppp", "mn"]).contains("__man"), "hidden commands are not suggested");
    }

    #[test]
    fn log_level_forms() {
        for argv in [
            &["ppp", "daemon", "log-level"][..],
            &["ppp", "daemon", "log-level", "proxy", "debug"],
            &["ppp", "daemon", "log-level", "set", "general", "warn"],
        ] {
            Cli::try_parse_from(argv).unwrap();
        }
        assert!(Cli::try_parse_from(["ppp", "daemon", "log-level", "set", "general"]).is_err());
    }
}

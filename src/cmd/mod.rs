//! The command line: one definition per flag (clap derive), which generates `--help`. One module
//! per command group; each parses, calls the library, and prints.

mod box_cmd;
mod browser_cmd;
mod cache_cmd;
mod completion;
mod env_help;
mod host_cmd;
mod man;
pub mod out;
mod skill;
mod source_arg;
#[cfg(feature = "ui")]
mod ui_cmd;

use clap::{Parser, Subcommand};

pub use box_cmd::RunRefused;

/// h5i: a contained development environment for coding agents.
#[derive(Debug, Parser)]
#[command(
    name = "h5i",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_long_help = env_help::TEXT
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create, run, inspect and export boxes.
    #[command(alias = "dev", alias = "env")]
    Box(Box<box_cmd::BoxArgs>),
    /// The control lock of a box's browser (who drives it, the agent or a human) and its
    /// viewer URL.
    Browser(browser_cmd::BrowserArgs),
    /// Prepare this host (as root) and its users for h5i.
    Host(host_cmd::HostArgs),
    /// The box console: one read-only screen over the whole fleet, on 127.0.0.1 (prints its URL,
    /// token included).
    #[cfg(feature = "ui")]
    Ui(ui_cmd::UiArgs),
    /// Write or print the agent skill this binary carries (skills/h5i, embedded at build time).
    Skill(skill::SkillArgs),
    /// Shell completions, generated from the command definitions: `source <(h5i completion bash)`.
    Completion {
        /// The shell: bash, zsh, fish, elvish, powershell.
        shell: clap_complete::Shell,
    },
    /// The man page (roff): `h5i man box | man -l -`, or every page with --out DIR.
    Man {
        /// The command whose page to print (`box`, `box cache`); none: h5i(1).
        command: Vec<String>,
        /// Write every page as DIR/<name>.1 instead.
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        out: Option<std::path::PathBuf>,
    },
}

/// Run the parsed command; the value is the process exit code.
pub fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Box(args) => box_cmd::dispatch(*args),
        Command::Browser(args) => browser_cmd::dispatch(args),
        Command::Host(args) => host_cmd::dispatch(args),
        #[cfg(feature = "ui")]
        Command::Ui(args) => ui_cmd::dispatch(args),
        Command::Skill(args) => skill::dispatch(args),
        Command::Completion { shell } => completion::run(shell),
        Command::Man { command, out } => man::run(&command, out.as_deref()),
    }
}

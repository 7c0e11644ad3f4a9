//! `h5i completion SHELL`: the shell completion script, generated from the same clap
//! definitions as `--help` (so a flag is defined once and completes everywhere).

use clap::CommandFactory;

/// Write the completion script for `shell` to stdout.
pub fn run(shell: clap_complete::Shell) -> anyhow::Result<i32> {
    let mut cmd = super::Cli::command();
    clap_complete::generate(shell, &mut cmd, "h5i", &mut std::io::stdout().lock());
    Ok(0)
}

//! `waitpoint completions`: shell completion scripts generated from the clap definitions.

use std::io::{self, Write};

use clap::{Args, ValueEnum};

use crate::error::exit;

/// Shells `completions` writes for.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Programs `completions` covers.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Program {
    Waitpoint,
    CortexSignal,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to write a completion script for
    #[arg(value_enum)]
    pub shell: Shell,
    /// The program to complete
    #[arg(long, value_enum, default_value_t = Program::Waitpoint)]
    pub program: Program,
}
/// `waitpoint completions SHELL`: the completion script on stdout.
pub fn run(a: CompletionsArgs) -> anyhow::Result<u8> {
    let (mut cmd, name) = match a.program {
        Program::Waitpoint => (super::waitpoint_command(), "waitpoint"),
        Program::CortexSignal => (super::cortex_signal_command(), "cortex-signal"),
    };
    let shell = match a.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = io::stdout().lock();
    clap_complete::generate(shell, &mut cmd, name, &mut out);
    out.flush()?;
    Ok(exit::OK)
}

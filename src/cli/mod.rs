//! Command-line interface (clap subcommands). Filled in by the foundation work.

/// Entry point of the `kvrun` binary.
pub fn main() -> std::process::ExitCode {
    std::process::ExitCode::SUCCESS
}

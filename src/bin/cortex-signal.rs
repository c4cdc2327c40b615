//! The `cortex-signal` binary: report a job's result to a waitpoint. All logic lives in the
//! library; this only maps the result to an exit code.

#![deny(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    waitpoint::cli::signal::main()
}

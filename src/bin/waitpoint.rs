//! The `waitpoint` binary: operator and agent CLI, and `waitpoint daemon`. All logic lives in
//! the library; this only maps the result to an exit code.

#![deny(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    waitpoint::cli::main()
}

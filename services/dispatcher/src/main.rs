//! `sluice-dispatcher`: records triggers exactly once in PostgreSQL and drives each job to its end.

use std::process::ExitCode;

fn main() -> ExitCode {
    sluice_kit::service::main(
        sluice_dispatcher::Options::from_env,
        |o| &o.common,
        sluice_dispatcher::run,
    )
}

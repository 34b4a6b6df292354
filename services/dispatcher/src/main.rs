//! `sluice-dispatcher`: records triggers exactly once in PostgreSQL and drives each job to its end.

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: sluice_dispatcher::Allocator = sluice_dispatcher::Allocator {};

fn main() -> ExitCode {
    // `unknown` / `settle`: the operator's commands for jobs the dispatcher cannot settle.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = sluice_dispatcher::operator::command(&args) {
        return code;
    }
    sluice_kit::service::main(
        sluice_dispatcher::Options::from_env,
        |o| &o.common,
        sluice_dispatcher::run,
    )
}

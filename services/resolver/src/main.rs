//! `sluice-resolver`: evaluates dependencies against asset-state and emits trigger requests.

use std::process::ExitCode;

fn main() -> ExitCode {
    sluice_kit::service::main(
        sluice_resolver::Options::from_env,
        |o| &o.common,
        sluice_resolver::run,
    )
}

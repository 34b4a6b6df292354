//! `sluice-api`: the control plane's HTTP API.

use std::process::ExitCode;

fn main() -> ExitCode {
    sluice_kit::service::main(
        sluice_api::Options::from_env,
        |o| &o.common,
        sluice_api::run,
    )
}

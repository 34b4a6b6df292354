//! `sluice-ingester`: turns lake commits (HTTP push, commit hooks on Kafka, CDC, metadata pollers) into AssetEvents.

use std::process::ExitCode;

fn main() -> ExitCode {
    sluice_kit::service::main(
        sluice_ingester::Options::from_env,
        |o| &o.common,
        sluice_ingester::run,
    )
}

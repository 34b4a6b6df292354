//! `sluice-state-updater`: folds asset-events into the compacted asset-state topic, exactly once.

use std::process::ExitCode;

fn main() -> ExitCode {
    sluice_kit::service::main(
        sluice_state_updater::Options::from_env,
        |o| &o.common,
        sluice_state_updater::run,
    )
}

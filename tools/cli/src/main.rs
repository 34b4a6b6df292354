//! `sluice`: the operator's command line next to the four services.
//!
//!   sluice apply FILE...        validate dependency specs (one or an array per file,
//!                               cycles checked across all) and publish them to the
//!                               dependencies topic
//!   sluice watch [--from-start] [--idle-exit SECS]
//!                               print commits, state changes, triggers and dispatches
//!                               as they happen, and a summary at the end (Ctrl-C,
//!                               SIGTERM, or SECS without a record)
//!
//! Both read the services' SLUICE_* settings (bootstrap, topic prefix, registry).

mod apply;
mod watch;

use std::process::ExitCode;

use sluice_kit::config::{Common, Env};

const USAGE: &str =
    "usage: sluice apply FILE...\n       sluice watch [--from-start] [--idle-exit SECS]";

fn common() -> Result<Common, ExitCode> {
    let mut env = Env::from_process();
    let common = Common::read(&mut env, "cli", "127.0.0.1:0");
    env.finish(common).map_err(|errors| {
        eprint!("{errors}");
        ExitCode::from(2)
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let common = match common() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cmd.as_str() {
        "apply" if args.len() > 1 => runtime.block_on(apply::run(&common, &args[1..])),
        "watch" => match watch::Args::parse(&args[1..]) {
            Ok(a) => runtime.block_on(watch::run(&common, a)),
            Err(e) => {
                eprintln!("{e}\n{USAGE}");
                ExitCode::from(2)
            }
        },
        "help" | "--help" => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

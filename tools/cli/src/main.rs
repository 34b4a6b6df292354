//! `sluice`: the control plane from a terminal, for people used to kubectl.
//!
//! It speaks to `sluice-api` (server and token from flags, `SLUICE_API_URL` /
//! `SLUICE_API_TOKEN`, or a context of the config file: see `client`). Two
//! commands also work without the API, straight on Kafka with the services'
//! SLUICE_* settings: `watch --kafka` (or `watch` with no API configured), and
//! `apply` when no server is configured (bootstrap of a cluster before the API runs).
//!
//! Exit codes: 0 done; 1 refused or failed (the API's message on stderr); 2 a
//! usage or configuration error.

mod apply;
mod client;
mod commands;
mod output;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice_kit::config::{Common, Env};

use crate::client::{Client, Failure, Target};
use crate::output::Format;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Data-version-driven scheduling: the operator's command line", long_about = None)]
struct Cli {
    /// The API, e.g. http://127.0.0.1:8090 (else SLUICE_API_URL, else the context's).
    #[arg(long, global = true)]
    server: Option<String>,
    /// The bearer token (else SLUICE_API_TOKEN, else the context's).
    #[arg(long, global = true)]
    token: Option<String>,
    /// A context of the config file other than the current one.
    #[arg(long, global = true)]
    context: Option<String>,
    /// How answers are printed.
    #[arg(short, long, global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// List resources: assets, deps, runs, grants, targets, tables, notifications,
    /// deliveries, backfills, audit.
    Get {
        #[command(subcommand)]
        what: commands::Get,
    },
    /// One resource in full: asset KEY, dep ID, run TRIGGER_KEY, backfill ID,
    /// target KIND/NAME, table ASSET, notification RULE.
    Describe { kind: commands::Kind, name: String },
    /// Why a dependency did or did not run: the evaluator's own tree.
    Explain {
        dependency: String,
        /// Evaluate at this time (epoch ms) instead of now.
        #[arg(long)]
        at_ms: Option<i64>,
    },
    /// Create or update dependencies, targets, polled tables and notification
    /// rules from files or directories (JSON or YAML; one document or a list per
    /// file: a spec has an `id`, a target a `kind` and `name`, a table an `asset`,
    /// a rule a `name` and a `webhook`). Shows each change and the resolver's verdict.
    Apply {
        /// Files or directories (`-f` may repeat).
        #[arg(short = 'f', long = "filename")]
        files: Vec<String>,
        /// The same, positionally (the older form).
        #[arg(hide = true)]
        positional: Vec<String>,
        /// Show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Publish straight to the dependencies topic (no API; bootstrap).
        #[arg(long)]
        direct: bool,
    },
    /// What `apply` would change.
    Diff {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
    },
    /// Delete a dependency, a grant, a declared target or table, or a notification rule.
    Delete {
        kind: commands::Kind,
        name: String,
        #[arg(long)]
        dry_run: bool,
    },
    /// Pause a dependency (it is evaluated but fires nothing until resumed), or a
    /// target with --target (no new sends; sends under way finish).
    Pause {
        #[arg(required_unless_present = "target")]
        dependency: Option<String>,
        /// A declared target, KIND/NAME.
        #[arg(long, conflicts_with = "dependency")]
        target: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a dependency (it fires once for the newest combination) or a target.
    Resume {
        #[arg(required_unless_present = "target")]
        dependency: Option<String>,
        /// A declared target, KIND/NAME.
        #[arg(long, conflicts_with = "dependency")]
        target: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Run a dependency now with its inputs' current snapshots.
    Run {
        dependency: String,
        /// The same id makes a retried command the same run (one is made up and
        /// printed if not given).
        #[arg(long)]
        request_id: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Re-run a FAILED, SUCCEEDED or CANCELLED run as a new run linked to it.
    Rerun {
        trigger_key: String,
        #[arg(long)]
        request_id: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Settle an UNKNOWN run after checking the target: it `succeeded`, it `failed`
    /// (or must not run), or it never ran and is sent again (`retry`).
    Settle {
        trigger_key: String,
        #[arg(value_enum)]
        outcome: commands::Outcome,
        /// What was checked at the target (required; it is the run's reason).
        #[arg(long)]
        reason: String,
        #[arg(long)]
        dry_run: bool,
    },
    /// Accept an input's new schema for a dependency whose `schema_unchanged` it
    /// shut: it fires for the newest combination if the rest of its condition holds.
    #[command(name = "ack-schema", visible_alias = "acknowledge-schema")]
    AckSchema {
        dependency: String,
        /// The input asset whose schema changed.
        #[arg(long)]
        input: String,
        /// The schema id you looked at (refused if the input has moved on since;
        /// default: its current one).
        #[arg(long)]
        schema_id: Option<i64>,
        /// Why the new schema is fine for the target (required; audited).
        #[arg(long)]
        reason: String,
        #[arg(long)]
        dry_run: bool,
    },
    /// Send a DEAD notification again from its first attempt (its key from
    /// `sluice get deliveries --status DEAD`).
    Redeliver { key: String },
    /// Re-run a dependency over past partitions, windows or an input's snapshots:
    /// one run per item, paced behind live triggers. Give one range.
    Backfill(commands::BackfillArgs),
    /// Cancel a backfill: its items not yet started are never sent.
    Cancel {
        backfill_id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// What happens as it happens: over the API's event stream (state changes,
    /// specs, triggers, run transitions you may see); with --kafka, or when no API
    /// is configured, straight on Kafka with the services' SLUICE_* settings
    /// (commits, states, triggers, dispatches with their latency, dead letters).
    Watch {
        /// Read Kafka instead of the API.
        #[arg(long)]
        kafka: bool,
        /// Read the topics from their beginning (Kafka only).
        #[arg(long)]
        from_start: bool,
        /// Exit after this many seconds without a record.
        #[arg(long, value_name = "SECS", value_parser = positive_secs)]
        idle_exit: Option<f64>,
    },
    /// The Kafka ACLs each Sluice principal needs (from the services' own access
    /// table): a table, JSON with -o json, or with --script the `kafka-acls` script
    /// shipped as deploy/kafka/acls.sh.
    Acls {
        /// The services' SLUICE_TOPIC_PREFIX.
        #[arg(long, default_value = "sluice.")]
        prefix: String,
        /// A hook topic the ingester reads (repeat for each).
        #[arg(long = "hook-topic", value_name = "TOPIC")]
        hook_topics: Vec<String>,
        /// Print the parameterised shell script instead.
        #[arg(long)]
        script: bool,
        /// Print the Helm chart's Strimzi KafkaUser template instead.
        #[arg(long, conflicts_with = "script")]
        strimzi: bool,
    },
    /// Contexts of the config file (kubectl's `config`).
    Config {
        #[command(subcommand)]
        what: commands::ConfigCmd,
    },
    /// A shell completion script: bash, zsh, fish, elvish, powershell.
    Completions { shell: clap_complete::Shell },
}

fn positive_secs(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && s.is_finite())
        .ok_or_else(|| format!("{s:?} is not a positive number of seconds"))
}

fn common() -> Result<Common, ExitCode> {
    let mut env = Env::from_process();
    let common = Common::read(&mut env, "cli", "127.0.0.1:0");
    env.finish(common).map_err(|errors| {
        eprint!("{errors}");
        ExitCode::from(2)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let target = Target {
        server: cli.server.as_deref(),
        token: cli.token.as_deref(),
        context: cli.context.as_deref(),
    };
    let result = match cli.command {
        Command::Watch {
            kafka,
            from_start,
            idle_exit,
        } => {
            let idle = idle_exit.map(std::time::Duration::from_secs_f64);
            match Client::resolve(&target) {
                Ok(Some(client)) if !kafka && !from_start => {
                    runtime.block_on(watch::follow_api(&client, cli.output == Format::Json, idle))
                }
                Err(e) if !kafka => Err(e),
                _ => {
                    return match common() {
                        Ok(c) => runtime.block_on(watch::run(
                            &c,
                            watch::Args {
                                from_start,
                                idle_exit: idle,
                            },
                        )),
                        Err(code) => code,
                    };
                }
            }
        }
        Command::Acls {
            prefix,
            hook_topics,
            script,
            strimzi,
        } => {
            if script {
                print!("{}", sluice_kit::access::kafka_acls_script());
            } else if strimzi {
                print!("{}", sluice_kit::access::strimzi_users_template());
            } else {
                commands::acls(&prefix, &hook_topics, cli.output);
            }
            return ExitCode::SUCCESS;
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "sluice", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Command::Config { what } => commands::config(what, cli.output),
        Command::Apply {
            files,
            positional,
            dry_run,
            direct,
        } => {
            let files: Vec<String> = files.into_iter().chain(positional).collect();
            if files.is_empty() {
                Err(Failure::Usage("apply: give files with -f".into()))
            } else {
                match Client::resolve(&target) {
                    Ok(Some(client)) if !direct => {
                        runtime.block_on(commands::apply(&client, &files, dry_run, cli.output))
                    }
                    Ok(_) if dry_run => Err(Failure::Usage(
                        "--dry-run needs the API (--server or SLUICE_API_URL)".into(),
                    )),
                    Ok(_) => {
                        return match common() {
                            Ok(c) => runtime.block_on(apply::run(&c, &files)),
                            Err(code) => code,
                        };
                    }
                    Err(e) => Err(e),
                }
            }
        }
        command => match Client::resolve(&target) {
            Ok(Some(client)) => runtime.block_on(commands::run(&client, command, cli.output)),
            Ok(None) => Err(Failure::Usage(
                "no API: give --server, SLUICE_API_URL, or a context (sluice config set-context)"
                    .into(),
            )),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("sluice: {}", f.message());
            ExitCode::from(f.code())
        }
    }
}

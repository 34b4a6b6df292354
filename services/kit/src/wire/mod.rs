//! Every topic record type, one submodule per schema file under `schemas/`.
//! Serde names match the Avro record and enum names: the schema-aware
//! (de)serializer checks them.
//!
//! [`sluice_core::AssetEvent`] is its own wire type (its fields map 1:1 onto
//! `schemas/asset-event.avsc`); the records below differ from the core types they
//! carry because Avro has no tuples, no tagged unions and no non-string map keys.

pub mod asset_state;
pub mod declared;
pub mod dependency_spec;
pub mod grant;
pub mod resolver_progress;
pub mod run_status;
pub mod trigger_request;

use serde::{Deserialize, Serialize};
use sluice_core::TargetKind;

pub use asset_state::{StateRecord, WireCommit};
pub use declared::DeclaredResource;
pub use dependency_spec::WireSpec;
pub use grant::WireGrant;
pub use resolver_progress::{InputBaseline, ProgressRecord};
pub use run_status::RunRecord;
pub use trigger_request::{TriggerInput, TriggerOrigin, TriggerRecord, TriggerTarget};

/// A record that decoded but breaks a rule its Rust type keeps (a negative
/// counter, half of a pair, a bad key): refused whole.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{field} is negative ({value})")]
    Negative { field: &'static str, value: i64 },
    #[error("{0}")]
    Inconsistent(&'static str),
    #[error("{field}: {source}")]
    Key {
        field: &'static str,
        source: sluice_core::asset::AssetKeyError,
    },
}

/// A counter the core keeps unsigned.
fn count(field: &'static str, value: i64) -> Result<u64, WireError> {
    u64::try_from(value).map_err(|_| WireError::Negative { field, value })
}

/// The kind of a trigger's target (`TargetKind` in the schemas).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "TargetKind", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WireTargetKind {
    Airflow,
    Dolphinscheduler,
    Webhook,
    Command,
    Kafka,
}

impl WireTargetKind {
    /// The Avro symbol, which is also how the dispatcher's tables name the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            WireTargetKind::Airflow => "AIRFLOW",
            WireTargetKind::Dolphinscheduler => "DOLPHINSCHEDULER",
            WireTargetKind::Webhook => "WEBHOOK",
            WireTargetKind::Command => "COMMAND",
            WireTargetKind::Kafka => "KAFKA",
        }
    }
}

impl From<TargetKind> for WireTargetKind {
    fn from(k: TargetKind) -> Self {
        match k {
            TargetKind::Airflow => WireTargetKind::Airflow,
            TargetKind::Dolphinscheduler => WireTargetKind::Dolphinscheduler,
            TargetKind::Webhook => WireTargetKind::Webhook,
            TargetKind::Command => WireTargetKind::Command,
            TargetKind::Kafka => WireTargetKind::Kafka,
        }
    }
}

impl From<WireTargetKind> for TargetKind {
    fn from(k: WireTargetKind) -> Self {
        match k {
            WireTargetKind::Airflow => TargetKind::Airflow,
            WireTargetKind::Dolphinscheduler => TargetKind::Dolphinscheduler,
            WireTargetKind::Webhook => TargetKind::Webhook,
            WireTargetKind::Command => TargetKind::Command,
            WireTargetKind::Kafka => TargetKind::Kafka,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WireTargetKind;

    #[test]
    fn a_target_kind_names_itself_as_its_avro_symbol() {
        use WireTargetKind::*;
        for k in [Airflow, Dolphinscheduler, Webhook, Command, Kafka] {
            assert_eq!(serde_json::to_value(k).expect("json"), k.as_str());
        }
    }
}

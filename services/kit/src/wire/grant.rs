//! The grants topic's value (`schemas/grant.avsc`), keyed by grant id; a tombstone
//! revokes the grant. A record becomes a [`Grant`] only through
//! [`WireGrant::into_grant`], which validates it.

use serde::{Deserialize, Serialize};
use sluice_core::grants::{Grant, GrantError, GrantKind};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Grant")]
pub struct WireGrant {
    pub id: String,
    pub project: String,
    pub kind: WireGrantKind,
    pub namespace: Option<String>,
    pub target: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "GrantKind", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WireGrantKind {
    ReadNamespace,
    ShareTarget,
}

impl From<&Grant> for WireGrant {
    fn from(g: &Grant) -> Self {
        WireGrant {
            id: g.id.clone(),
            project: g.project.clone(),
            kind: match g.kind {
                GrantKind::ReadNamespace => WireGrantKind::ReadNamespace,
                GrantKind::ShareTarget => WireGrantKind::ShareTarget,
            },
            namespace: g.namespace.clone(),
            target: g.target.clone(),
        }
    }
}

impl WireGrant {
    /// The grant a record carries, validated; `key` must be its id.
    pub fn into_grant(self, key: &str) -> Result<Grant, GrantError> {
        if key != self.id {
            return Err(GrantError::Invalid(format!(
                "record key {key:?} is not the grant id {:?}",
                self.id
            )));
        }
        let g = Grant {
            id: self.id,
            project: self.project,
            kind: match self.kind {
                WireGrantKind::ReadNamespace => GrantKind::ReadNamespace,
                WireGrantKind::ShareTarget => GrantKind::ShareTarget,
            },
            namespace: self.namespace,
            target: self.target,
        };
        g.validate()?;
        Ok(g)
    }
}

//! Grants: which project may read which namespaces, and which targets are shared
//! with which project. A dependency belongs to its `owner_project`; under
//! enforcement it may read an asset only where a grant lets that project read the
//! asset's namespace, and trigger a target only where a grant shares the target
//! with the project. The resolver and the API ask the same [`Grants::check`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::asset::AssetKey;
use crate::dependency::DependencySpec;

/// The longest grant id.
pub const MAX_GRANT_ID_LEN: usize = 200;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub id: String,
    /// The project the grant is for.
    pub project: String,
    pub kind: GrantKind,
    /// `read_namespace`: `catalog.namespace`, `catalog.*` or `*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `share_target`: `kind:name`, or `kind:*` for every target of a kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantKind {
    /// Read the assets of a namespace.
    ReadNamespace,
    /// Trigger a target.
    ShareTarget,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("grant: {0}")]
    Invalid(String),
    #[error(
        "project {project:?} may not read namespace {namespace} (input {asset}): no grant lets it"
    )]
    Read {
        project: String,
        namespace: String,
        asset: AssetKey,
    },
    #[error("target {target} is not shared with project {project:?}: no grant shares it")]
    Target { project: String, target: String },
}

impl Grant {
    pub fn from_json(text: &str) -> Result<Grant, GrantError> {
        let g: Grant =
            serde_json::from_str(text).map_err(|e| GrantError::Invalid(e.to_string()))?;
        g.validate()?;
        Ok(g)
    }

    pub fn validate(&self) -> Result<(), GrantError> {
        let bad = |m: String| Err(GrantError::Invalid(format!("{:?}: {m}", self.id)));
        if self.id.is_empty()
            || self.id.len() > MAX_GRANT_ID_LEN
            || !self
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return bad(format!(
                "id must be 1..={MAX_GRANT_ID_LEN} ASCII letters, digits, '-', '_' or '.'"
            ));
        }
        if self.project.trim().is_empty() {
            return bad("project must not be empty".into());
        }
        match (self.kind, &self.namespace, &self.target) {
            (GrantKind::ReadNamespace, Some(namespace), None) => {
                let parts: Vec<&str> = namespace.split('.').collect();
                let ok = namespace == "*"
                    || (parts.len() == 2
                        && !parts[0].is_empty()
                        && parts[0] != "*"
                        && !parts[1].is_empty());
                if !ok {
                    return bad(format!(
                        "namespace {namespace:?} must be catalog.namespace, catalog.* or *"
                    ));
                }
            }
            (GrantKind::ShareTarget, None, Some(target)) => {
                let ok = target
                    .split_once(':')
                    .is_some_and(|(k, n)| !k.is_empty() && !n.is_empty());
                if !ok {
                    return bad(format!("target {target:?} must be kind:name or kind:*"));
                }
            }
            (GrantKind::ReadNamespace, _, _) => {
                return bad("read_namespace takes a namespace and no target".into());
            }
            (GrantKind::ShareTarget, _, _) => {
                return bad("share_target takes a target and no namespace".into());
            }
        }
        Ok(())
    }
}

/// Every grant in force, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants(pub BTreeMap<String, Grant>);

impl Grants {
    pub fn may_read(&self, project: &str, asset: &AssetKey) -> bool {
        let ns = format!("{}.{}", asset.catalog(), asset.namespace());
        let catalog_wide = format!("{}.*", asset.catalog());
        self.0.values().any(|g| {
            g.project == project
                && g.kind == GrantKind::ReadNamespace
                && g.namespace
                    .as_deref()
                    .is_some_and(|n| n == "*" || n == ns || n == catalog_wide)
        })
    }

    pub fn may_trigger(&self, project: &str, target: &str) -> bool {
        let kind_wide = target.split_once(':').map(|(k, _)| format!("{k}:*"));
        self.0.values().any(|g| {
            g.project == project
                && g.kind == GrantKind::ShareTarget
                && g.target
                    .as_deref()
                    .is_some_and(|t| t == target || Some(t) == kind_wide.as_deref())
        })
    }

    /// Whether `spec` may run under these grants: every input readable by its
    /// project, its target shared with it. The first gap is the error.
    pub fn check(&self, spec: &DependencySpec) -> Result<(), GrantError> {
        for asset in spec.inputs() {
            if !self.may_read(&spec.owner_project, &asset) {
                return Err(GrantError::Read {
                    project: spec.owner_project.clone(),
                    namespace: format!("{}.{}", asset.catalog(), asset.namespace()),
                    asset,
                });
            }
        }
        let target = spec.target.identity();
        if !self.may_trigger(&spec.owner_project, &target) {
            return Err(GrantError::Target {
                project: spec.owner_project.clone(),
                target,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(project: &str) -> DependencySpec {
        DependencySpec::from_json(&format!(
            r#"{{"id": "d", "version": 1, "owner_project": "{project}", "target": {{"kind": "airflow", "name": "dag"}},
                "condition": {{"all": [{{"input": {{"asset": "lake.ods.order"}}}}, {{"input": {{"asset": "crm.raw.customer"}}}}]}}}}"#
        ))
        .expect("valid")
    }

    fn grants(list: &[&str]) -> Grants {
        Grants(
            list.iter()
                .map(|t| Grant::from_json(t).expect("valid grant"))
                .map(|g| (g.id.clone(), g))
                .collect(),
        )
    }

    #[test]
    fn a_cross_project_read_needs_a_grant_and_the_error_names_the_gap() {
        let mut g = grants(&[
            r#"{"id": "g1", "project": "gmv", "kind": "read_namespace", "namespace": "lake.ods"}"#,
            r#"{"id": "g2", "project": "gmv", "kind": "share_target", "target": "airflow:*"}"#,
        ]);
        assert_eq!(
            g.check(&spec("gmv"))
                .expect_err("crm not granted")
                .to_string(),
            "project \"gmv\" may not read namespace crm.raw (input crm.raw.customer): no grant lets it"
        );
        g.0.insert(
            "g3".into(),
            Grant::from_json(
                r#"{"id": "g3", "project": "gmv", "kind": "read_namespace", "namespace": "crm.*"}"#,
            )
            .expect("valid"),
        );
        assert!(g.check(&spec("gmv")).is_ok());
        assert!(g.check(&spec("finance")).is_err(), "grants are per project");
        g.0.remove("g2");
        assert_eq!(
            g.check(&spec("gmv")).expect_err("target").to_string(),
            "target airflow:dag is not shared with project \"gmv\": no grant shares it"
        );
    }

    #[test]
    fn bad_grants_are_refused_precisely() {
        for (text, says) in [
            (
                r#"{"id": "g", "project": "p", "kind": "read_namespace", "namespace": "lake"}"#,
                "must be catalog.namespace",
            ),
            (
                r#"{"id": "g", "project": "p", "kind": "share_target", "target": "dag"}"#,
                "must be kind:name",
            ),
            (
                r#"{"id": "g", "project": "", "kind": "share_target", "target": "a:b"}"#,
                "project must not be empty",
            ),
            (
                r#"{"id": "g", "project": "p", "kind": "own_everything"}"#,
                "unknown variant `own_everything`",
            ),
        ] {
            let e = Grant::from_json(text).expect_err(text).to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}

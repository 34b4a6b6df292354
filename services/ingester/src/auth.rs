//! Pure: which bearer token may write which namespaces. A namespace is an asset
//! key's `catalog.namespace`; a token lists the namespaces it may write, `catalog.*`
//! for a whole catalog, or `*`.

use serde::Deserialize;
use sluice_core::AssetKey;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    /// Shown in logs and metrics instead of the secret.
    pub name: String,
    pub token: String,
    pub namespaces: Vec<String>,
}

#[derive(Clone, Default)]
pub struct Tokens(Vec<TokenSpec>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|t| t.name.as_str()).collect();
        write!(f, "Tokens({names:?})")
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("no bearer token (Authorization: Bearer <token>, or HUDI-CALLBACK-KEY for Hudi)")]
    Missing,
    #[error("the token is not valid")]
    Unknown,
    #[error("token {token:?} may not write namespace {namespace:?} (asset {asset})")]
    Namespace {
        token: String,
        namespace: String,
        asset: String,
    },
}

/// Compares in constant time (no timing hint about a matching prefix).
fn same(a: &str, b: &str) -> bool {
    subtle::ConstantTimeEq::ct_eq(a.as_bytes(), b.as_bytes()).into()
}

impl Tokens {
    pub fn parse(json: &str) -> Result<Tokens, Vec<String>> {
        let specs: Vec<TokenSpec> =
            serde_json::from_str(json).map_err(|e| vec![format!("SLUICE_INGEST_TOKENS: {e}")])?;
        let mut problems = Vec::new();
        for (i, t) in specs.iter().enumerate() {
            if t.token.len() < 16 {
                problems.push(format!(
                    "SLUICE_INGEST_TOKENS[{i}] ({}): a token has at least 16 characters",
                    t.name
                ));
            }
            if t.namespaces.is_empty() {
                problems.push(format!(
                    "SLUICE_INGEST_TOKENS[{i}] ({}): namespaces is empty",
                    t.name
                ));
            }
            for ns in &t.namespaces {
                let parts: Vec<&str> = ns.split('.').collect();
                let ok = ns == "*" || (parts.len() == 2 && parts.iter().all(|p| !p.is_empty()));
                if !ok {
                    problems.push(format!(
                        "SLUICE_INGEST_TOKENS[{i}] ({}): namespace {ns:?} is not catalog.namespace, catalog.* or *",
                        t.name
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(Tokens(specs))
        } else {
            Err(problems)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The token presented, if it is one of ours.
    pub fn identify(&self, presented: Option<&str>) -> Result<&TokenSpec, Denied> {
        let presented = presented.ok_or(Denied::Missing)?;
        self.0
            .iter()
            .find(|t| same(&t.token, presented))
            .ok_or(Denied::Unknown)
    }
}

impl TokenSpec {
    pub fn may_write(&self, asset: &AssetKey) -> Result<(), Denied> {
        let ns = format!("{}.{}", asset.catalog(), asset.namespace());
        let catalog_wide = format!("{}.*", asset.catalog());
        if self
            .namespaces
            .iter()
            .any(|n| n == "*" || *n == ns || *n == catalog_wide)
        {
            Ok(())
        } else {
            Err(Denied::Namespace {
                token: self.name.clone(),
                namespace: ns,
                asset: asset.as_str().to_owned(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_namespaces() {
        let t = Tokens::parse(
            r#"[{"name": "ods", "token": "0123456789abcdef", "namespaces": ["lake.ods"]},
                {"name": "all", "token": "fedcba9876543210", "namespaces": ["lake.*"]}]"#,
        )
        .expect("valid");
        let key = |s: &str| AssetKey::parse(s).expect("key");
        assert_eq!(t.identify(None).expect_err("refused"), Denied::Missing);
        assert_eq!(
            t.identify(Some("0123456789abcdeX")).expect_err("refused"),
            Denied::Unknown
        );
        let ods = t.identify(Some("0123456789abcdef")).expect("known");
        assert!(ods.may_write(&key("lake.ods.orders")).is_ok());
        assert!(matches!(
            ods.may_write(&key("lake.dwd.fact")),
            Err(Denied::Namespace { .. })
        ));
        let all = t.identify(Some("fedcba9876543210")).expect("known");
        assert!(all.may_write(&key("lake.dwd.fact")).is_ok());
        assert!(all.may_write(&key("other.dwd.fact")).is_err());
        let bad = Tokens::parse(r#"[{"name": "x", "token": "short", "namespaces": ["lake"]}]"#)
            .expect_err("refused");
        assert_eq!(bad.len(), 2, "{bad:?}");
    }
}

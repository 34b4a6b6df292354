//! A secret as a declared resource writes it: where to find it (`{"env": "VAR"}`,
//! `{"file": "/path"}` — a mounted Kubernetes Secret key), or, in a service's own
//! bootstrap configuration only, the value itself. So no secret is ever stored in
//! a topic: the API refuses a declared document that holds one.

use serde::Deserialize;

/// A secret as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretValue {
    Value(String),
    Reference(SecretRef),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretRef {
    /// An environment variable of the service that uses the secret.
    Env(String),
    /// A file that service can read (a mounted Secret key); trailing newlines
    /// are not part of the secret.
    File(String),
}

/// Where a document comes from, which decides what a secret in it may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A service's bootstrap configuration: a value may be written in;
    /// references are looked up.
    Bootstrap,
    /// A declared resource, in the service that applies it: references only,
    /// looked up.
    Declared,
    /// The API checking a document before it publishes it: references only, not
    /// looked up (the API does not hold the other services' secrets).
    Check,
}

impl<'de> Deserialize<'de> for SecretValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = serde_json::Value::deserialize(d)?;
        let reference = |o: &serde_json::Map<String, serde_json::Value>| {
            let (key, value) = o.iter().next()?;
            let value = value.as_str()?.to_owned();
            match (o.len(), key.as_str()) {
                (1, "env") => Some(SecretRef::Env(value)),
                (1, "file") => Some(SecretRef::File(value)),
                _ => None,
            }
        };
        match &v {
            serde_json::Value::String(s) => Some(SecretValue::Value(s.clone())),
            serde_json::Value::Object(o) => reference(o).map(SecretValue::Reference),
            _ => None,
        }
        .ok_or_else(|| {
            D::Error::custom(format!(
                "a secret is {{\"env\": \"VAR\"}}, {{\"file\": \"/path\"}} or (bootstrap only) a string, not {v}"
            ))
        })
    }
}

impl SecretValue {
    /// The secret, as `source` allows; `field` names it in the error.
    pub fn reveal(&self, field: &str, source: Source) -> Result<String, String> {
        match (self, source) {
            (SecretValue::Value(_), Source::Declared | Source::Check) => Err(format!(
                "`{field}`: a declared resource holds references, never secrets: \
                 {{\"env\": \"VAR\"}} or {{\"file\": \"/path\"}}"
            )),
            (SecretValue::Value(s), Source::Bootstrap) => Ok(s.clone()),
            (SecretValue::Reference(SecretRef::Env(var)), _) if var.is_empty() => {
                Err(format!("`{field}`: the env reference names no variable"))
            }
            (SecretValue::Reference(SecretRef::File(path)), _) if path.is_empty() => {
                Err(format!("`{field}`: the file reference names no file"))
            }
            // The API cannot look up another service's secrets; a placeholder checks the rest.
            (SecretValue::Reference(_), Source::Check) => Ok("unchecked".into()),
            (SecretValue::Reference(SecretRef::Env(var)), _) => std::env::var(var)
                .map_err(|_| format!("`{field}`: environment variable {var} is not set")),
            (SecretValue::Reference(SecretRef::File(path)), _) => std::fs::read_to_string(path)
                .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
                .map_err(|e| format!("`{field}`: file {path}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<SecretValue, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn a_declared_document_holds_references_and_a_bootstrap_may_hold_values() {
        let value = parse(r#""s3cret""#).expect("value");
        assert!(value.reveal("token", Source::Declared).is_err());
        assert!(value.reveal("token", Source::Check).is_err());
        assert_eq!(
            value.reveal("token", Source::Bootstrap).as_deref(),
            Ok("s3cret")
        );
        let missing = parse(r#"{"env": "SLUICE_TEST_SURELY_UNSET_VARIABLE"}"#).expect("ref");
        assert_eq!(
            missing.reveal("token", Source::Check).as_deref(),
            Ok("unchecked")
        );
        let e = missing
            .reveal("token", Source::Declared)
            .expect_err("unset");
        assert!(e.contains("SLUICE_TEST_SURELY_UNSET_VARIABLE"), "{e}");
        assert!(parse(r#"{"vault": "x"}"#).is_err());
        assert!(
            parse(r#"{"env": ""}"#)
                .expect("parsed")
                .reveal("t", Source::Check)
                .is_err()
        );
    }
}

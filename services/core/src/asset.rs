//! Asset keys and table formats.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Longest accepted asset key, in bytes. Kafka keys and PostgreSQL text both
/// cope with far more; the bound keeps a typo or an attack from becoming a key.
pub const MAX_ASSET_KEY_LEN: usize = 255;

/// A lake table's identity: `catalog.namespace.table`, lower case.
///
/// Each of the three segments is 1..=80 characters of `[a-z0-9_-]`, starting with a
/// letter or digit. Keys are validated at every entry point, so a value of this
/// type is always well formed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AssetKey(String);

/// Why a string is not an [`AssetKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssetKeyError {
    #[error("asset key is empty")]
    Empty,
    #[error("asset key is {len} bytes long; at most {MAX_ASSET_KEY_LEN} are allowed")]
    TooLong { len: usize },
    #[error("asset key {key:?} has {segments} segment(s); expected catalog.namespace.table")]
    Segments { key: String, segments: usize },
    #[error("asset key {key:?} has an empty {segment} segment")]
    EmptySegment { key: String, segment: &'static str },
    #[error("asset key {key:?}: {segment} segment is longer than 80 characters")]
    SegmentTooLong { key: String, segment: &'static str },
    #[error(
        "asset key {key:?}: character {ch:?} is not allowed in the {segment} segment (use lower-case a-z, 0-9, '_' or '-')"
    )]
    BadChar {
        key: String,
        segment: &'static str,
        ch: char,
    },
    #[error("asset key {key:?}: the {segment} segment must start with a letter or digit")]
    BadStart { key: String, segment: &'static str },
}

const SEGMENTS: [&str; 3] = ["catalog", "namespace", "table"];

impl AssetKey {
    /// Parses and validates a key. No normalisation happens here: `ODS.x.y` is an
    /// error, not `ods.x.y`, so two spellings can never name one asset by accident.
    pub fn parse(raw: &str) -> Result<Self, AssetKeyError> {
        if raw.is_empty() {
            return Err(AssetKeyError::Empty);
        }
        if raw.len() > MAX_ASSET_KEY_LEN {
            return Err(AssetKeyError::TooLong { len: raw.len() });
        }
        let parts: Vec<&str> = raw.split('.').collect();
        if parts.len() != 3 {
            return Err(AssetKeyError::Segments {
                key: raw.to_owned(),
                segments: parts.len(),
            });
        }
        for (part, segment) in parts.iter().zip(SEGMENTS) {
            let key = || raw.to_owned();
            let Some(first) = part.chars().next() else {
                return Err(AssetKeyError::EmptySegment {
                    key: key(),
                    segment,
                });
            };
            if part.chars().count() > 80 {
                return Err(AssetKeyError::SegmentTooLong {
                    key: key(),
                    segment,
                });
            }
            if let Some(ch) = part
                .chars()
                .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == '-'))
            {
                return Err(AssetKeyError::BadChar {
                    key: key(),
                    segment,
                    ch,
                });
            }
            if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
                return Err(AssetKeyError::BadStart {
                    key: key(),
                    segment,
                });
            }
        }
        Ok(AssetKey(raw.to_owned()))
    }

    /// A key that was validated before it was stored (a packed state's bytes).
    pub(crate) fn trusted(valid: &str) -> Self {
        AssetKey(valid.to_owned())
    }

    /// Builds a key from its three segments, validating the result.
    pub fn from_parts(catalog: &str, namespace: &str, table: &str) -> Result<Self, AssetKeyError> {
        Self::parse(&format!("{catalog}.{namespace}.{table}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn catalog(&self) -> &str {
        self.segment(0)
    }

    pub fn namespace(&self) -> &str {
        self.segment(1)
    }

    pub fn table(&self) -> &str {
        self.segment(2)
    }

    fn segment(&self, i: usize) -> &str {
        // Validated at construction: exactly three segments.
        self.0.split('.').nth(i).unwrap_or_default()
    }
}

impl fmt::Display for AssetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for AssetKey {
    type Err = AssetKeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for AssetKey {
    type Error = AssetKeyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<AssetKey> for String {
    fn from(k: AssetKey) -> String {
        k.0
    }
}

/// The table format an asset is stored in; it decides what its commit sequence means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TableFormat {
    /// Sequence = Paimon snapshot id.
    Paimon,
    /// Sequence = Iceberg `sequence-number`.
    Iceberg,
    /// Sequence = Hudi instant time as a number (`yyyyMMddHHmmssSSS`).
    Hudi,
    /// Sequence = Delta log version.
    Delta,
    /// Anything else that can state a monotonic sequence (a generic commit API).
    Other,
}

impl TableFormat {
    /// Every format in declaration order: the Avro enum's symbol order.
    pub const ALL: [TableFormat; 5] = [
        TableFormat::Paimon,
        TableFormat::Iceberg,
        TableFormat::Hudi,
        TableFormat::Delta,
        TableFormat::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TableFormat::Paimon => "PAIMON",
            TableFormat::Iceberg => "ICEBERG",
            TableFormat::Hudi => "HUDI",
            TableFormat::Delta => "DELTA",
            TableFormat::Other => "OTHER",
        }
    }
}

impl fmt::Display for TableFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a string is not a [`TableFormat`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown table format {0:?}; expected one of paimon, iceberg, hudi, delta, other")]
pub struct UnknownFormat(pub String);

impl FromStr for TableFormat {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TableFormat::ALL
            .into_iter()
            .find(|f| f.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownFormat(s.to_owned()))
    }
}

/// A key orders, compares and hashes as its text, so ordered maps of keys can be
/// read by a text range (a page of a prefix).
impl std::borrow::Borrow<str> for AssetKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_well_formed_keys() {
        let k = AssetKey::parse("lake.ods.order_latest").expect("valid");
        assert_eq!(
            (k.catalog(), k.namespace(), k.table()),
            ("lake", "ods", "order_latest")
        );
        assert!(AssetKey::parse("c1.n-2.t_3").is_ok());
    }

    #[test]
    fn rejects_bad_keys_with_a_precise_reason() {
        use AssetKeyError::*;
        type Check = fn(&AssetKeyError) -> bool;
        let cases: &[(&str, Check)] = &[
            ("", |e| matches!(e, Empty)),
            ("a.b", |e| matches!(e, Segments { segments: 2, .. })),
            ("a.b.c.d", |e| matches!(e, Segments { segments: 4, .. })),
            ("a..c", |e| {
                matches!(
                    e,
                    EmptySegment {
                        segment: "namespace",
                        ..
                    }
                )
            }),
            ("Lake.ods.t", |e| {
                matches!(
                    e,
                    BadChar {
                        ch: 'L',
                        segment: "catalog",
                        ..
                    }
                )
            }),
            ("lake.ods.t x", |e| {
                matches!(
                    e,
                    BadChar {
                        ch: ' ',
                        segment: "table",
                        ..
                    }
                )
            }),
            ("lake._ods.t", |e| {
                matches!(
                    e,
                    BadStart {
                        segment: "namespace",
                        ..
                    }
                )
            }),
        ];
        for (raw, check) in cases {
            let err = AssetKey::parse(raw).expect_err(raw);
            assert!(check(&err), "{raw:?} gave {err:?}");
            assert!(!err.to_string().is_empty());
        }
        let long = format!("a.b.{}", "t".repeat(300));
        assert!(matches!(AssetKey::parse(&long), Err(TooLong { .. })));
        let long_seg = format!("a.b.{}", "t".repeat(81));
        assert!(matches!(
            AssetKey::parse(&long_seg),
            Err(SegmentTooLong { .. })
        ));
    }

    #[test]
    fn serde_validates() {
        let ok: AssetKey = serde_json::from_str("\"a.b.c\"").expect("valid");
        assert_eq!(ok.as_str(), "a.b.c");
        assert!(serde_json::from_str::<AssetKey>("\"A.b.c\"").is_err());
    }

    #[test]
    fn formats_parse_case_insensitively() {
        for f in TableFormat::ALL {
            assert_eq!(f.as_str().to_lowercase().parse::<TableFormat>(), Ok(f));
        }
        assert!("orc".parse::<TableFormat>().is_err());
    }
}

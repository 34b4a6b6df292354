//! Who is calling and what they may do. Pure apart from [`TokenFile`], which
//! re-reads the tokens file when it changes (rotation without a restart).
//!
//! A principal holds a role per project; `*` stands for every project. Roles are
//! ordered: a viewer reads, an editor also changes dependencies, an operator also
//! acts on runs (pause, run now, backfill), an admin also reads the audit log.
//! Tokens are stored as SHA-256 hex digests, never in the clear.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Viewer,
    Editor,
    Operator,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// A caller the tokens file knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Principal {
    pub name: String,
    /// Role by project; `*` is every project.
    pub roles: BTreeMap<String, Role>,
}

impl Principal {
    /// The caller's role in `project`: the higher of its own and the `*` role.
    pub fn role_in(&self, project: &str) -> Option<Role> {
        self.roles
            .get(project)
            .copied()
            .max(self.roles.get("*").copied())
    }

    /// Whether the caller holds at least `role` in `project`.
    pub fn may(&self, role: Role, project: &str) -> bool {
        self.role_in(project).is_some_and(|r| r >= role)
    }

    /// Whether the caller holds at least `role` in some project.
    pub fn may_anywhere(&self, role: Role) -> bool {
        self.roles.values().any(|r| *r >= role)
    }

    /// Refusal text for a missing role.
    pub fn lacks(&self, role: Role, project: &str) -> String {
        match self.role_in(project) {
            Some(r) => format!(
                "{} is {} in project {project:?}; this needs {}",
                self.name,
                r.as_str(),
                role.as_str()
            ),
            None => format!(
                "{} has no role in project {project:?}; this needs {}",
                self.name,
                role.as_str()
            ),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    /// Hex SHA-256 of the token (`printf %s "$TOKEN" | sha256sum`).
    sha256: String,
    roles: BTreeMap<String, Role>,
}

/// Why a tokens file was refused (at start: the API does not start; on reload:
/// the last good file stays in force).
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("tokens file: {0}")]
    Json(#[from] serde_json::Error),
    #[error("tokens file [{index}] ({name}): sha256 must be 64 hex digits")]
    Digest { index: usize, name: String },
    #[error("tokens file [{index}] ({name}): no roles")]
    NoRoles { index: usize, name: String },
    #[error("tokens file [{index}]: the same token as {other}")]
    Duplicate { index: usize, other: String },
}

/// The parsed tokens file: digest → principal.
#[derive(Debug, Default)]
pub struct Tokens(BTreeMap<[u8; 32], Principal>);

impl Tokens {
    pub fn parse(text: &str) -> Result<Tokens, TokensError> {
        let entries: Vec<Entry> = serde_json::from_str(text)?;
        let mut out = BTreeMap::new();
        for (index, e) in entries.into_iter().enumerate() {
            let digest: [u8; 32] = hex::decode(e.sha256.trim())
                .ok()
                .and_then(|d| d.try_into().ok())
                .ok_or_else(|| TokensError::Digest {
                    index,
                    name: e.name.clone(),
                })?;
            if e.roles.is_empty() {
                return Err(TokensError::NoRoles {
                    index,
                    name: e.name,
                });
            }
            let principal = Principal {
                name: e.name,
                roles: e.roles,
            };
            if let Some(other) = out.insert(digest, principal) {
                return Err(TokensError::Duplicate {
                    index,
                    other: other.name,
                });
            }
        }
        Ok(Tokens(out))
    }

    /// The principal a bearer token stands for. The digest is compared, not the
    /// token, so a lookup leaks nothing about the stored secrets' prefixes.
    pub fn principal(&self, token: &str) -> Option<&Principal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.0.get(&digest)
    }
}

/// The tokens file, re-read at most once a second when its modification time
/// changed. A file that stops parsing keeps the last good tokens (and says so).
pub struct TokenFile {
    path: PathBuf,
    inner: Mutex<Loaded>,
}

struct Loaded {
    tokens: std::sync::Arc<Tokens>,
    modified: Option<SystemTime>,
    checked: Instant,
}

impl TokenFile {
    pub fn open(path: PathBuf) -> Result<TokenFile, TokensError> {
        let (tokens, modified) = Self::load(&path)?;
        Ok(TokenFile {
            path,
            inner: Mutex::new(Loaded {
                tokens: std::sync::Arc::new(tokens),
                modified,
                checked: Instant::now(),
            }),
        })
    }

    fn load(path: &PathBuf) -> Result<(Tokens, Option<SystemTime>), TokensError> {
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let text = std::fs::read_to_string(path).map_err(|source| TokensError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Ok((Tokens::parse(&text)?, modified))
    }

    pub fn current(&self) -> std::sync::Arc<Tokens> {
        let mut l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if l.checked.elapsed() >= Duration::from_secs(1) {
            l.checked = Instant::now();
            let modified = std::fs::metadata(&self.path)
                .and_then(|m| m.modified())
                .ok();
            if modified != l.modified {
                match Self::load(&self.path) {
                    Ok((tokens, modified)) => {
                        tracing::info!(path = %self.path.display(), "tokens file reloaded");
                        l.tokens = std::sync::Arc::new(tokens);
                        l.modified = modified;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "tokens file no longer parses; keeping the last good one");
                        l.modified = modified;
                    }
                }
            }
        }
        l.tokens.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(t: &str) -> String {
        hex::encode(Sha256::digest(t.as_bytes()))
    }

    #[test]
    fn roles_are_per_project_with_a_star() {
        let text = format!(
            r#"[{{"name": "ann", "sha256": "{}", "roles": {{"gmv": "editor", "*": "viewer"}}}}]"#,
            digest("ann-token-0123456789")
        );
        let t = Tokens::parse(&text).expect("parses");
        assert!(t.principal("wrong").is_none());
        let ann = t.principal("ann-token-0123456789").expect("known");
        assert!(ann.may(Role::Editor, "gmv"));
        assert!(ann.may(Role::Viewer, "other"));
        assert!(!ann.may(Role::Editor, "other"));
        assert!(!ann.may(Role::Operator, "gmv"));
        assert_eq!(
            ann.lacks(Role::Editor, "other"),
            "ann is viewer in project \"other\"; this needs editor"
        );
    }

    #[test]
    fn a_bad_file_is_a_precise_error() {
        assert!(
            Tokens::parse(r#"[{"name": "x", "sha256": "zz", "roles": {"p": "viewer"}}]"#)
                .expect_err("bad digest")
                .to_string()
                .contains("64 hex digits")
        );
        assert!(
            Tokens::parse(&format!(
                r#"[{{"name": "x", "sha256": "{}", "roles": {{"p": "owner"}}}}]"#,
                digest("t")
            ))
            .expect_err("bad role")
            .to_string()
            .contains("unknown variant `owner`")
        );
    }
}

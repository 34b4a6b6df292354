//! Principals from the identity provider: a JWT (RS256 or ES256) verified against
//! the provider's JWKS, its issuer and audience checked, the caller's name and
//! roles read from claims. The keys come from a file (re-read when it changes) or
//! a URL (fetched at start, refreshed every five minutes and when a token names a
//! key not yet seen — a rotation — at most every 30 s).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::Value;

use crate::auth::{Principal, Role};

/// Clock skew tolerated on `exp` and `nbf`.
const LEEWAY_S: i64 = 60;

/// How tokens are checked.
#[derive(Clone, Debug)]
pub struct Rules {
    pub issuer: String,
    pub audience: String,
    /// The claim naming the caller (default `sub`).
    pub name_claim: String,
    /// The claim holding `{"<project>" or "*": "<role>"}` (default `sluice_roles`).
    pub roles_claim: String,
}

#[derive(Debug, Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

#[derive(Debug, Deserialize)]
struct JwkSet {
    keys: Vec<Jwk>,
}

/// A verifying key of the set.
#[derive(Clone, Debug)]
enum Key {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// P-256, uncompressed point (0x04 ‖ x ‖ y).
    Ec(Vec<u8>),
}

/// The keys of a JWKS document, by `kid` (`""` for a key without one).
#[derive(Clone, Debug, Default)]
pub struct Keys(BTreeMap<String, Key>);

/// Why the identity provider's key set could not be read (at start: the API
/// does not start; on refresh: the keys held stay in force).
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("JWKS: {0}")]
    Json(#[from] serde_json::Error),
    #[error("JWK without {0}")]
    Missing(&'static str),
    #[error("JWK {field}: {source}")]
    Base64 {
        field: &'static str,
        source: base64::DecodeError,
    },
    #[error("JWKS holds no RSA or P-256 key")]
    NoKey,
    #[error("{path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("JWKS {url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("JWKS {url}: HTTP {status}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
    },
}

fn b64(field: &'static str, v: Option<&String>) -> Result<Vec<u8>, JwksError> {
    let v = v.ok_or(JwksError::Missing(field))?;
    URL_SAFE_NO_PAD
        .decode(v.trim_end_matches('='))
        .map_err(|source| JwksError::Base64 { field, source })
}

impl Keys {
    /// Parses a JWKS document; keys of other types are skipped (a provider may
    /// publish encryption keys beside signing ones).
    pub fn parse(text: &str) -> Result<Keys, JwksError> {
        let set: JwkSet = serde_json::from_str(text)?;
        let mut keys = BTreeMap::new();
        for k in set.keys {
            let key = match (k.kty.as_str(), k.crv.as_deref()) {
                ("RSA", _) => Key::Rsa {
                    n: b64("n", k.n.as_ref())?,
                    e: b64("e", k.e.as_ref())?,
                },
                ("EC", Some("P-256")) => {
                    let mut point = vec![4u8];
                    point.extend(b64("x", k.x.as_ref())?);
                    point.extend(b64("y", k.y.as_ref())?);
                    Key::Ec(point)
                }
                _ => continue,
            };
            keys.insert(k.kid.unwrap_or_default(), key);
        }
        if keys.is_empty() {
            return Err(JwksError::NoKey);
        }
        Ok(Keys(keys))
    }
}

#[derive(Debug, Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// Why a JWT is not accepted; shown to the caller (it names no secret).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("the JWT is malformed: {0}")]
    Malformed(String),
    #[error("the JWT's algorithm {0} is not accepted (RS256, ES256)")]
    Algorithm(String),
    #[error("the JWT names key {0:?}, which the identity provider's JWKS does not hold")]
    UnknownKey(String),
    #[error("the JWT's signature does not verify")]
    Signature,
    #[error("the JWT expired")]
    Expired,
    #[error("the JWT is not valid yet")]
    NotYet,
    #[error("the JWT's {claim} is {found:?}, not {want:?}")]
    Claim {
        claim: &'static str,
        found: String,
        want: String,
    },
    #[error("the JWT's {0} claim is missing or not of the expected shape")]
    Shape(String),
}

fn part(p: &str, what: &str) -> Result<Vec<u8>, JwtError> {
    URL_SAFE_NO_PAD
        .decode(p)
        .map_err(|e| JwtError::Malformed(format!("{what}: {e}")))
}

/// Verifies `token` against `keys` and `rules` at `now_s`; the principal it names.
pub fn verify(token: &str, keys: &Keys, rules: &Rules, now_s: i64) -> Result<Principal, JwtError> {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed("not three dot-separated parts".into()));
    };
    let header: Header = serde_json::from_slice(&part(h, "header")?)
        .map_err(|e| JwtError::Malformed(format!("header: {e}")))?;
    let kid = header.kid.unwrap_or_default();
    let key = keys
        .0
        .get(&kid)
        .or_else(|| {
            (keys.0.len() == 1 && kid.is_empty())
                .then(|| keys.0.values().next())
                .flatten()
        })
        .ok_or_else(|| JwtError::UnknownKey(kid.clone()))?;
    let signed = &token.as_bytes()[..h.len() + 1 + p.len()];
    let sig = part(s, "signature")?;
    let ok = match (header.alg.as_str(), key) {
        ("RS256", Key::Rsa { n, e }) => RsaPublicKeyComponents { n, e }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, signed, &sig)
            .is_ok(),
        ("ES256", Key::Ec(point)) => {
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(signed, &sig)
                .is_ok()
        }
        ("RS256" | "ES256", _) => false,
        (other, _) => return Err(JwtError::Algorithm(other.to_owned())),
    };
    if !ok {
        return Err(JwtError::Signature);
    }
    let claims: Value = serde_json::from_slice(&part(p, "payload")?)
        .map_err(|e| JwtError::Malformed(format!("payload: {e}")))?;
    let exp = claims["exp"]
        .as_i64()
        .ok_or_else(|| JwtError::Shape("exp".into()))?;
    if now_s > exp + LEEWAY_S {
        return Err(JwtError::Expired);
    }
    if claims["nbf"]
        .as_i64()
        .is_some_and(|nbf| now_s + LEEWAY_S < nbf)
    {
        return Err(JwtError::NotYet);
    }
    let iss = claims["iss"].as_str().unwrap_or_default();
    if iss != rules.issuer {
        return Err(JwtError::Claim {
            claim: "iss",
            found: iss.to_owned(),
            want: rules.issuer.clone(),
        });
    }
    let aud_ok = match &claims["aud"] {
        Value::String(a) => *a == rules.audience,
        Value::Array(list) => list
            .iter()
            .any(|a| a.as_str() == Some(rules.audience.as_str())),
        _ => false,
    };
    if !aud_ok {
        return Err(JwtError::Claim {
            claim: "aud",
            found: claims["aud"].to_string(),
            want: rules.audience.clone(),
        });
    }
    let name = claims[rules.name_claim.as_str()]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| JwtError::Shape(rules.name_claim.clone()))?;
    let roles: BTreeMap<String, Role> =
        serde_json::from_value(claims[rules.roles_claim.as_str()].clone())
            .map_err(|_| JwtError::Shape(rules.roles_claim.clone()))?;
    Ok(Principal {
        name: name.to_owned(),
        roles,
    })
}

/// Where the keys come from.
#[derive(Clone, Debug)]
pub enum Source {
    File(PathBuf),
    Url(String),
}

impl Source {
    pub fn parse(raw: &str) -> Source {
        if raw.starts_with("http://") || raw.starts_with("https://") {
            Source::Url(raw.to_owned())
        } else {
            Source::File(PathBuf::from(raw))
        }
    }
}

struct Cached {
    keys: Arc<Keys>,
    fetched: Instant,
    modified: Option<SystemTime>,
}

/// The identity provider: its keys, kept fresh, and the rules tokens must meet.
pub struct Provider {
    source: Source,
    pub rules: Rules,
    client: reqwest::Client,
    cached: Mutex<Cached>,
}

const REFRESH: Duration = Duration::from_secs(300);
const MIN_REFETCH: Duration = Duration::from_secs(30);

impl Provider {
    /// Loads the keys once: a provider that cannot be read is a start-up error.
    pub async fn open(source: Source, rules: Rules) -> Result<Provider, JwksError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|source| JwksError::Http {
                url: "(client)".into(),
                source,
            })?;
        let (keys, modified) = load(&source, &client).await?;
        Ok(Provider {
            source,
            rules,
            client,
            cached: Mutex::new(Cached {
                keys: Arc::new(keys),
                fetched: Instant::now(),
                modified,
            }),
        })
    }

    fn cached(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.cached.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Verifies a token; refreshes the keys first when they are stale, or when the
    /// token names a key not held (a rotation), at most every 30 s.
    pub async fn principal(&self, token: &str) -> Result<Principal, JwtError> {
        let now_s = sluice_kit::clock::now_s();
        let (keys, age) = {
            let c = self.cached();
            (c.keys.clone(), c.fetched.elapsed())
        };
        let stale = match &self.source {
            Source::Url(_) => age >= REFRESH,
            Source::File(path) => {
                age >= Duration::from_secs(1)
                    && std::fs::metadata(path).and_then(|m| m.modified()).ok()
                        != self.cached().modified
            }
        };
        let keys = if stale {
            self.refresh().await.unwrap_or(keys)
        } else {
            keys
        };
        match verify(token, &keys, &self.rules, now_s) {
            Err(JwtError::UnknownKey(_)) if age >= MIN_REFETCH && !stale => {
                let keys = self.refresh().await.unwrap_or(keys);
                verify(token, &keys, &self.rules, now_s)
            }
            other => other,
        }
    }

    async fn refresh(&self) -> Option<Arc<Keys>> {
        match load(&self.source, &self.client).await {
            Ok((keys, modified)) => {
                let keys = Arc::new(keys);
                let mut c = self.cached();
                c.keys = keys.clone();
                c.fetched = Instant::now();
                c.modified = modified;
                Some(keys)
            }
            Err(e) => {
                tracing::error!(error = %e, "JWKS refresh failed; keeping the keys held");
                self.cached().fetched = Instant::now();
                None
            }
        }
    }
}

async fn load(
    source: &Source,
    client: &reqwest::Client,
) -> Result<(Keys, Option<SystemTime>), JwksError> {
    match source {
        Source::File(path) => {
            let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            let text = std::fs::read_to_string(path).map_err(|source| JwksError::File {
                path: path.display().to_string(),
                source,
            })?;
            Ok((Keys::parse(&text)?, modified))
        }
        Source::Url(url) => {
            let http = |source| JwksError::Http {
                url: url.clone(),
                source,
            };
            let resp = client.get(url).send().await.map_err(http)?;
            if !resp.status().is_success() {
                return Err(JwksError::Status {
                    url: url.clone(),
                    status: resp.status(),
                });
            }
            let text = resp.text().await.map_err(http)?;
            Ok((Keys::parse(&text)?, None))
        }
    }
}

#[cfg(test)]
mod tests {
    use ring::rand::SystemRandom;
    use ring::signature::{
        ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair, RSA_PKCS1_SHA256, RsaKeyPair,
    };
    use serde_json::json;

    use super::*;

    fn rules() -> Rules {
        Rules {
            issuer: "https://idp.example".into(),
            audience: "sluice".into(),
            name_claim: "sub".into(),
            roles_claim: "sluice_roles".into(),
        }
    }

    fn enc(v: &Value) -> String {
        URL_SAFE_NO_PAD.encode(v.to_string())
    }

    fn claims() -> Value {
        json!({"iss": "https://idp.example", "aud": ["sluice", "other"], "sub": "ann", "exp": 2_000,
               "sluice_roles": {"gmv": "editor"}})
    }

    /// An ES256 key pair made here, and its JWKS.
    fn ec() -> (EcdsaKeyPair, String) {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("pair");
        let point = pair.public_key().as_ref();
        let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "ec1", "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])}]});
        (pair, jwks.to_string())
    }

    fn es256(pair: &EcdsaKeyPair, kid: &str, claims: &Value) -> String {
        let signed = format!(
            "{}.{}",
            enc(&json!({"alg": "ES256", "kid": kid, "typ": "JWT"})),
            enc(claims)
        );
        let sig = pair
            .sign(&SystemRandom::new(), signed.as_bytes())
            .expect("signs");
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    #[test]
    fn an_es256_token_names_its_principal_and_every_bad_one_says_why() {
        let (pair, jwks) = ec();
        let keys = Keys::parse(&jwks).expect("jwks");
        let p = verify(&es256(&pair, "ec1", &claims()), &keys, &rules(), 1_000).expect("valid");
        assert_eq!(p.name, "ann");
        assert!(p.may(Role::Editor, "gmv"));
        let bad = |c: Value, kid: &str| {
            verify(&es256(&pair, kid, &c), &keys, &rules(), 1_000).expect_err("refused")
        };
        let mut c = claims();
        c["exp"] = json!(900);
        assert_eq!(bad(c, "ec1"), JwtError::Expired);
        let mut c = claims();
        c["iss"] = json!("https://evil.example");
        assert!(matches!(
            bad(c, "ec1"),
            JwtError::Claim { claim: "iss", .. }
        ));
        let mut c = claims();
        c["aud"] = json!("other");
        assert!(matches!(
            bad(c, "ec1"),
            JwtError::Claim { claim: "aud", .. }
        ));
        let mut c = claims();
        c["sluice_roles"] = json!({"gmv": "owner"});
        assert_eq!(bad(c, "ec1"), JwtError::Shape("sluice_roles".into()));
        assert_eq!(bad(claims(), "ec9"), JwtError::UnknownKey("ec9".into()));
        // A payload changed after signing.
        let token = es256(&pair, "ec1", &claims());
        let mut forged: Vec<&str> = token.split('.').collect();
        let mut c = claims();
        c["sluice_roles"] = json!({"*": "admin"});
        let body = enc(&c);
        forged[1] = &body;
        assert_eq!(
            verify(&forged.join("."), &keys, &rules(), 1_000),
            Err(JwtError::Signature)
        );
        // alg none is refused outright.
        let none = format!("{}.{}.", enc(&json!({"alg": "none"})), enc(&claims()));
        assert_eq!(
            verify(&none, &keys, &rules(), 1_000),
            Err(JwtError::Algorithm("none".into()))
        );
    }

    /// RS256, the common case (Keycloak, Okta, Entra ID): a key made by openssl.
    #[test]
    fn an_rs256_token_verifies_against_the_rsa_key_of_the_set() {
        let dir = std::env::temp_dir().join(format!("sluice-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (pem, der) = (dir.join("rsa.pem"), dir.join("rsa.der"));
        let openssl = |args: &[&str]| {
            let status = std::process::Command::new("openssl")
                .args(args)
                .stderr(std::process::Stdio::null())
                .status()
                .expect("openssl runs");
            assert!(status.success(), "openssl {args:?}");
        };
        let (pem_s, der_s) = (pem.to_string_lossy(), der.to_string_lossy());
        openssl(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            &pem_s,
        ]);
        openssl(&[
            "rsa",
            "-in",
            &pem_s,
            "-traditional",
            "-outform",
            "DER",
            "-out",
            &der_s,
        ]);
        let pair = RsaKeyPair::from_der(&std::fs::read(&der).expect("key")).expect("PKCS#1 key");
        let public = pair.public().clone();
        let comps: RsaPublicKeyComponents<Vec<u8>> = (&public).into();
        let jwks = json!({"keys": [{"kty": "RSA", "kid": "r1", "n": URL_SAFE_NO_PAD.encode(&comps.n), "e": URL_SAFE_NO_PAD.encode(&comps.e)}]});
        let keys = Keys::parse(&jwks.to_string()).expect("jwks");
        let signed = format!(
            "{}.{}",
            enc(&json!({"alg": "RS256", "kid": "r1"})),
            enc(&claims())
        );
        let mut sig = vec![0u8; pair.public().modulus_len()];
        pair.sign(
            &RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            signed.as_bytes(),
            &mut sig,
        )
        .expect("signs");
        let token = format!("{signed}.{}", URL_SAFE_NO_PAD.encode(&sig));
        assert_eq!(
            verify(&token, &keys, &rules(), 1_000).expect("valid").name,
            "ann"
        );
        // The same token claimed as ES256 against an RSA key does not verify.
        let confused = token.replacen(
            &enc(&json!({"alg": "RS256", "kid": "r1"})),
            &enc(&json!({"alg": "ES256", "kid": "r1"})),
            1,
        );
        assert_eq!(
            verify(&confused, &keys, &rules(), 1_000),
            Err(JwtError::Signature)
        );
    }
}

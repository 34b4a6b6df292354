//! A small client of `sluice-api` for the end-to-end tests.

use reqwest::StatusCode;
use serde_json::Value;

pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
    /// The token `get` and `post` use.
    pub token: String,
}

impl Api {
    pub fn new(port: u16, token: &str) -> Api {
        Api {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            token: token.to_owned(),
        }
    }

    /// One call as `token`: the status and the body (JSON, else the text as a string).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("the API answers");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// A GET that must answer 200.
    pub async fn get(&self, path: &str) -> Value {
        let (status, v) = self.call("GET", path, &self.token, None).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {v}");
        v
    }

    /// A POST that must succeed.
    pub async fn post(&self, path: &str, body: Value) -> Value {
        let (status, v) = self.call("POST", path, &self.token, Some(&body)).await;
        assert!(status.is_success(), "POST {path}: {status} {v}");
        v
    }

    /// A run's status, empty if it is not there (yet).
    pub async fn run_status(&self, key: &str) -> String {
        let (_, run) = self
            .call("GET", &format!("/v1/runs/{key}"), &self.token, None)
            .await;
        run["status"].as_str().unwrap_or_default().to_owned()
    }
}

/// A tokens file for `sluice-api` with `(name, token, roles)` entries (stored
/// hashed, as in production); its path.
pub fn tokens_file(entries: &[(&str, &str, Value)]) -> String {
    use sha2::{Digest, Sha256};
    let path = std::env::temp_dir().join(format!("{}.json", crate::unique("api-tokens")));
    let entries: Vec<Value> = entries
        .iter()
        .map(|(name, token, roles)| {
            serde_json::json!({"name": name, "sha256": hex::encode(Sha256::digest(token.as_bytes())), "roles": roles})
        })
        .collect();
    std::fs::write(&path, Value::Array(entries).to_string()).expect("tokens file");
    path.to_string_lossy().into_owned()
}

/// Pushes one commit of `asset` at `seq` to the ingester's HTTP endpoint `url`.
pub async fn push(client: &reqwest::Client, url: &str, asset: &str, seq: i64) {
    let body = serde_json::json!({"asset_key": asset, "format": "paimon", "snapshot_id": seq, "sequence": seq,
        "commit_time_ms": 1_764_633_600_000i64 + seq, "operation": "append", "partitions": ["dt=2026-12-04"]});
    push_notice(client, url, &body).await;
}

/// Pushes one commit notice as given (the ingester's push body).
pub async fn push_notice(client: &reqwest::Client, url: &str, body: &serde_json::Value) {
    let asset = body["asset_key"].as_str().unwrap_or_default();
    let seq = &body["sequence"];
    let r = client
        .post(url)
        .bearer_auth(crate::pipeline::TOKEN)
        .json(body)
        .send()
        .await
        .expect("ingester answers");
    assert!(
        r.status().is_success(),
        "push {asset}@{seq}: {}",
        r.status()
    );
}

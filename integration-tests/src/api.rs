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

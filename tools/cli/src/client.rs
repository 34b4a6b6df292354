//! Where the API is and who the caller is, kubectl-style: flags win over the
//! environment (`SLUICE_API_URL`, `SLUICE_API_TOKEN`), which wins over the
//! current context of the config file (`SLUICE_CONFIG`, else
//! `~/.config/sluice/config.yaml`).
//!
//! ```yaml
//! current-context: local
//! contexts:
//!   - name: local
//!     server: http://127.0.0.1:8090
//!     token-file: .stack/api-token        # or token: …, or token-env: NAME
//! ```

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a command could not do its work; each maps to an exit code.
#[derive(Debug)]
pub enum Failure {
    /// The command line or the configuration is wrong (exit 2).
    Usage(String),
    /// The API refused or the work failed (exit 1): its status and message.
    Refused(String),
}

impl Failure {
    pub fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Refused(_) => 1,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Failure::Usage(m) | Failure::Refused(m) => m,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Config {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    #[serde(default)]
    pub contexts: Vec<Context>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Context {
    pub name: String,
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
}

pub fn config_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_CONFIG") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".config").join("sluice").join("config.yaml")
}

impl Config {
    pub fn load() -> Result<Config, Failure> {
        let path = config_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_norway::from_str(&text)
                .map_err(|e| Failure::Usage(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(e) => Err(Failure::Usage(format!("{}: {e}", path.display()))),
        }
    }

    pub fn save(&self) -> Result<PathBuf, Failure> {
        let path = config_path();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Failure::Usage(format!("{}: {e}", dir.display())))?;
        }
        let text = serde_norway::to_string(self).map_err(|e| Failure::Usage(e.to_string()))?;
        std::fs::write(&path, text)
            .map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
        Ok(path)
    }
}

/// The API client of one invocation.
pub struct Client {
    server: String,
    token: String,
    http: reqwest::Client,
}

/// What the caller gave on the command line.
pub struct Target<'a> {
    pub server: Option<&'a str>,
    pub token: Option<&'a str>,
    pub context: Option<&'a str>,
}

impl Client {
    /// The client, or `None` when no server is named anywhere.
    pub fn resolve(t: &Target<'_>) -> Result<Option<Client>, Failure> {
        let config = Config::load()?;
        let context = match t.context.or(config.current_context.as_deref()) {
            None => None,
            Some(name) => Some(
                config
                    .contexts
                    .iter()
                    .find(|c| c.name == name)
                    .cloned()
                    .ok_or_else(|| {
                        Failure::Usage(format!(
                            "no context {name:?} in {}",
                            config_path().display()
                        ))
                    })?,
            ),
        };
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let server = t
            .server
            .map(str::to_owned)
            .or_else(|| env("SLUICE_API_URL"))
            .or_else(|| context.as_ref().map(|c| c.server.clone()));
        let Some(server) = server else {
            return Ok(None);
        };
        let token = match (t.token, env("SLUICE_API_TOKEN"), &context) {
            (Some(t), _, _) => t.to_owned(),
            (None, Some(t), _) => t,
            (None, None, Some(c)) => context_token(c)?,
            (None, None, None) => {
                return Err(Failure::Usage(
                    "no token: give --token, SLUICE_API_TOKEN or a context with one".into(),
                ));
            }
        };
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| Failure::Usage(format!("http client: {e}")))?;
        Ok(Some(Client {
            server: server.trim_end_matches('/').to_owned(),
            token,
            http,
        }))
    }

    /// One call; a non-2xx answer is a [`Failure::Refused`] with the API's message.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), Failure> {
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| Failure::Usage(e.to_string()))?;
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.server))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Failure::Refused(format!("{}: {e}", self.server)))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| Failure::Refused(e.to_string()))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let message = value["error"]["message"]
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            return Err(Failure::Refused(format!(
                "{method} {path}: {status}: {message}"
            )));
        }
        Ok((status.as_u16(), value))
    }

    pub async fn get(&self, path: &str) -> Result<Value, Failure> {
        self.call("GET", path, None).await.map(|(_, v)| v)
    }

    /// Every item of a paginated list, following `next` cursors (up to `max`).
    pub async fn list(&self, path: &str, max: usize) -> Result<Vec<Value>, Failure> {
        let mut items = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let sep = if path.contains('?') { '&' } else { '?' };
            let page = match &next {
                None => self.get(path).await?,
                Some(c) => {
                    self.get(&format!(
                        "{path}{sep}cursor={}",
                        sluice_kit::uri::component(c)
                    ))
                    .await?
                }
            };
            items.extend(page["items"].as_array().cloned().unwrap_or_default());
            next = page["next_cursor"].as_str().map(str::to_owned);
            if next.is_none() || items.len() >= max {
                items.truncate(max);
                return Ok(items);
            }
        }
    }
}

impl Client {
    /// Follows a server-sent-events stream, calling `on` with each event's name
    /// and data, until `on` answers false, `idle` passes without an event (the
    /// server's keep-alive comments do not count), or the server ends it.
    pub async fn events(
        &self,
        path: &str,
        idle: Option<std::time::Duration>,
        mut on: impl FnMut(&str, &str) -> bool,
    ) -> Result<(), Failure> {
        let mut resp = self
            .http
            .get(format!("{}{path}", self.server))
            .bearer_auth(&self.token)
            .header("Accept", "text/event-stream")
            .send()
            .await
            .map_err(|e| Failure::Refused(format!("{}: {e}", self.server)))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            let message = value["error"]["message"]
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            return Err(Failure::Refused(format!("GET {path}: {status}: {message}")));
        }
        let mut parser = SseParser::default();
        let mut last_event = std::time::Instant::now();
        loop {
            let wait = idle.map(|i| i.saturating_sub(last_event.elapsed()));
            let chunk = match wait {
                Some(w) => match tokio::time::timeout(w, resp.chunk()).await {
                    Ok(c) => c,
                    Err(_) => return Ok(()),
                },
                None => resp.chunk().await,
            };
            let chunk = chunk.map_err(|e| Failure::Refused(format!("{path}: {e}")))?;
            let Some(bytes) = chunk else { return Ok(()) };
            for (event, data) in parser.feed(&bytes) {
                last_event = std::time::Instant::now();
                if !on(&event, &data) {
                    return Ok(());
                }
            }
        }
    }
}

/// Server-sent events from a byte stream cut anywhere: `event:` and `data:`
/// lines up to a blank line make one event; `:` lines are comments (keep-alive).
#[derive(Default)]
pub struct SseParser {
    line: Vec<u8>,
    event: String,
    data: Vec<String>,
}

impl SseParser {
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            let line = String::from_utf8_lossy(&self.line)
                .trim_end_matches('\r')
                .to_owned();
            self.line.clear();
            if line.is_empty() {
                if !self.data.is_empty() {
                    let event = std::mem::take(&mut self.event);
                    let name = if event.is_empty() {
                        "message".to_owned()
                    } else {
                        event
                    };
                    out.push((name, std::mem::take(&mut self.data).join("\n")));
                }
                self.event.clear();
            } else if let Some(v) = line.strip_prefix("event:") {
                self.event = v.trim_start().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                self.data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
            }
        }
        out
    }
}

fn context_token(c: &Context) -> Result<String, Failure> {
    if let Some(t) = &c.token {
        return Ok(t.clone());
    }
    if let Some(path) = &c.token_file {
        return std::fs::read_to_string(path)
            .map(|t| t.trim().to_owned())
            .map_err(|e| Failure::Usage(format!("context {}: {}: {e}", c.name, path.display())));
    }
    if let Some(name) = &c.token_env {
        return std::env::var(name)
            .map_err(|_| Failure::Usage(format!("context {}: {name} is not set", c.name)));
    }
    Err(Failure::Usage(format!(
        "context {} has no token, token-file or token-env",
        c.name
    )))
}

/// An API path from its segments, each escaped: a name typed by a person
/// (`a/../grants/x`, `b?dry_run=true`) stays one segment and never reaches
/// another route.
pub fn path(segments: &[&str]) -> String {
    segments.iter().fold(String::new(), |mut p, s| {
        p.push('/');
        p.push_str(&sluice_kit::uri::component(s));
        p
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn server_sent_events_are_read_across_any_cut() {
        let stream = b": keep-alive\n\nevent: run\ndata: {\"a\":1}\n\nevent: state\r\ndata: x\r\ndata: y\r\n\n";
        for cut in 0..stream.len() {
            let mut p = super::SseParser::default();
            let mut got = p.feed(&stream[..cut]);
            got.extend(p.feed(&stream[cut..]));
            assert_eq!(
                got,
                vec![
                    ("run".to_owned(), "{\"a\":1}".to_owned()),
                    ("state".to_owned(), "x\ny".to_owned())
                ],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_typed_name_stays_one_segment() {
        assert_eq!(
            super::path(&["v1", "dependencies", "a/../grants/x?dry_run=true"]),
            "/v1/dependencies/a%2F..%2Fgrants%2Fx%3Fdry_run%3Dtrue"
        );
    }
}

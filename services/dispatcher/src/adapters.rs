//! The edges: one adapter per target kind, each turning one invocation into one
//! send and answering "what became of it?" where the target can answer.
//!
//! Classification of a send follows one rule: only an answer that proves nothing
//! started is a refusal (a 4xx, a refused connection); anything after the bytes may
//! have arrived (a timeout, a reset, a 5xx) is unknown, and is never resent blindly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hmac::{KeyInit, Mac};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::lifecycle::{Observed, SendOutcome};
use crate::store::Claimed;
use crate::targets::{Reach, Target};

pub const SIGNATURE_HEADER: &str = "X-Sluice-Signature";
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
pub const INVOCATION_HEADER: &str = "X-Sluice-Invocation";

/// The run id Airflow gets: derived from the trigger_key and the attempt, so a
/// second POST of the same attempt answers 409 and reconcile can look the run up,
/// while a retry after a failed run starts a new dag run instead of finding the
/// failed one again.
pub fn airflow_run_id(trigger_key: &str, attempt: i32) -> String {
    if attempt <= 1 {
        format!("sluice__{trigger_key}")
    } else {
        format!("sluice__{trigger_key}__{attempt}")
    }
}

/// What every target receives about a trigger (JSON body, conf, stdin, startParams).
pub fn trigger_document(job: &Claimed) -> Value {
    json!({
        "trigger_key": job.trigger_key,
        "dependency_id": job.dependency_id,
        "dependency_version": job.dependency_version,
        "target": {"kind": job.target_kind, "name": job.target_name, "parameters": job.target_parameters},
        "inputs": job.inputs,
        "partition": job.partition,
        "window_end_ms": job.window_end_ms,
        "reason": job.reason,
        "first_commit_ms": job.first_commit_ms,
        "attempt": job.attempt,
        "invocation_id": job.invocation_id,
    })
}

/// HMAC-SHA256 of `body` under `secret`, as `sha256=<hex>`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

pub struct Adapters {
    http: reqwest::Client,
    commands: crate::command::Runs,
    kafka: Option<FutureProducer>,
    /// Airflow 3.x JWTs by target name, fetched on first use and on a 401.
    airflow_tokens: Mutex<BTreeMap<String, String>>,
}

fn param<'a>(job: &'a Claimed, key: &str) -> Option<&'a str> {
    job.target_parameters.get(key).and_then(Value::as_str)
}

/// A send's HTTP error: was anything possibly received?
fn http_error(e: &reqwest::Error) -> SendOutcome {
    if e.is_connect() {
        SendOutcome::Refused {
            reason: format!("connection failed, nothing was sent: {e}"),
        }
    } else {
        SendOutcome::Unknown {
            reason: format!("no answer after the send: {e}"),
        }
    }
}

/// Classifies an HTTP status of a send.
fn by_status(status: reqwest::StatusCode, body: &str) -> Option<SendOutcome> {
    let brief: String = body.chars().take(300).collect();
    if status.is_server_error() || status == reqwest::StatusCode::REQUEST_TIMEOUT {
        Some(SendOutcome::Unknown {
            reason: format!("target answered {status} after the send: {brief}"),
        })
    } else if status.is_client_error() {
        Some(SendOutcome::Refused {
            reason: format!("target refused with {status}: {brief}"),
        })
    } else {
        None
    }
}

impl Adapters {
    /// https targets are verified against the system's roots plus `extra_roots`.
    pub fn new(
        kafka: Option<FutureProducer>,
        extra_roots: &[reqwest::Certificate],
        commands: crate::command::Runs,
    ) -> Result<Arc<Adapters>, reqwest::Error> {
        Ok(Arc::new(Adapters {
            commands,
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .tls_certs_merge(extra_roots.iter().cloned())
                .build()?,
            kafka,
            airflow_tokens: Mutex::new(BTreeMap::new()),
        }))
    }

    /// The one send of an invocation.
    pub async fn send(&self, target: &Target, job: &Claimed) -> SendOutcome {
        let timeout = target.timing.send_timeout;
        match &target.reach {
            Reach::Webhook { url, secret, .. } => {
                self.webhook(url, secret.as_deref(), job, timeout).await
            }
            Reach::Airflow { .. } => self.airflow_trigger(target, job, timeout).await,
            Reach::Dolphinscheduler {
                url,
                token,
                project_code,
            } => {
                self.dolphin_start(url, token, project_code, job, timeout)
                    .await
            }
            Reach::Command {
                argv,
                void_exit_codes,
            } => self.command(argv, void_exit_codes, job, timeout).await,
            Reach::Kafka { topic } => self.kafka_send(topic, job, timeout).await,
        }
    }

    /// Asks the target what became of the job (follow and reconcile).
    pub async fn observe(&self, target: &Target, job: &Claimed) -> Observed {
        match &target.reach {
            Reach::Airflow { .. } => self.airflow_observe(target, job).await,
            Reach::Dolphinscheduler {
                url,
                token,
                project_code,
            } => match &job.external_id {
                Some(id) => self.dolphin_observe(url, token, project_code, id).await,
                None => Observed::CannotTell {
                    reason: "DolphinScheduler has no instance id for this job".into(),
                },
            },
            Reach::Command {
                void_exit_codes, ..
            } => self
                .commands
                .observe(job.owner.as_deref(), job, void_exit_codes),
            _ => Observed::CannotTell {
                reason: format!("a {} target cannot be asked", job.target_kind),
            },
        }
    }

    /// Whether an unknown outcome may be settled by sending again: the receiver
    /// deduplicates (a webhook that declares it honours the Idempotency-Key). A
    /// Kafka topic does not: a second record under the same trigger_key is a second
    /// record for every consumer, so an UNKNOWN Kafka job waits for an operator.
    pub fn resend_is_safe(target: &Target) -> bool {
        match &target.reach {
            Reach::Webhook { idempotent, .. } => *idempotent,
            _ => false,
        }
    }

    async fn webhook(
        &self,
        url: &str,
        secret: Option<&str>,
        job: &Claimed,
        timeout: Duration,
    ) -> SendOutcome {
        let body = trigger_document(job).to_string();
        let mut req = self
            .http
            .post(url)
            .timeout(timeout)
            .header("Content-Type", "application/json")
            .header(IDEMPOTENCY_HEADER, &job.trigger_key)
            .header(INVOCATION_HEADER, &job.invocation_id);
        if let Some(secret) = secret {
            req = req.header(SIGNATURE_HEADER, signature(secret, body.as_bytes()));
        }
        match req.body(body).send().await {
            Err(e) => http_error(&e),
            Ok(resp) => {
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                by_status(status, &text).unwrap_or(SendOutcome::Accepted {
                    external_id: None,
                    done: true,
                })
            }
        }
    }

    async fn airflow_auth(
        &self,
        target: &Target,
        req: reqwest::RequestBuilder,
        fresh: bool,
    ) -> Result<reqwest::RequestBuilder, String> {
        let Reach::Airflow {
            url,
            api_version,
            username,
            password,
        } = &target.reach
        else {
            return Err("not an Airflow target".into());
        };
        if *api_version == 1 {
            return Ok(req.basic_auth(username, Some(password)));
        }
        let mut tokens = self.airflow_tokens.lock().await;
        if fresh || !tokens.contains_key(&target.name) {
            // Airflow 3.x simple/FAB auth managers: POST /auth/token → {"access_token": …}.
            let resp = self
                .http
                .post(format!("{url}/auth/token"))
                .timeout(Duration::from_secs(10))
                .json(&json!({"username": username, "password": password}))
                .send()
                .await
                .map_err(|e| format!("Airflow token: {e}"))?;
            let status = resp.status();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            let token = body
                .get("access_token")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("Airflow token: {status} without access_token: {body}"))?;
            tokens.insert(target.name.clone(), token.to_owned());
        }
        Ok(req.bearer_auth(&tokens[&target.name]))
    }

    fn airflow_runs_url(target: &Target, job: &Claimed) -> String {
        let Reach::Airflow {
            url, api_version, ..
        } = &target.reach
        else {
            return String::new();
        };
        let dag_id = param(job, "dag_id").unwrap_or(&job.target_name);
        format!("{url}/api/v{api_version}/dags/{dag_id}/dagRuns")
    }

    async fn airflow_trigger(
        &self,
        target: &Target,
        job: &Claimed,
        timeout: Duration,
    ) -> SendOutcome {
        let run_id = airflow_run_id(&job.trigger_key, job.attempt);
        let v2 = matches!(target.reach, Reach::Airflow { api_version: 2, .. });
        let mut body = json!({"dag_run_id": run_id, "conf": trigger_document(job)});
        if v2 {
            // 3.x requires the field; null lets Airflow choose (no data interval).
            body["logical_date"] = Value::Null;
        }
        for fresh in [false, true] {
            let req = self
                .http
                .post(Self::airflow_runs_url(target, job))
                .timeout(timeout)
                .json(&body);
            let req = match self.airflow_auth(target, req, fresh).await {
                Ok(r) => r,
                // The token endpoint failed: the trigger itself was not sent.
                Err(e) => return SendOutcome::Refused { reason: e },
            };
            match req.send().await {
                Err(e) => return http_error(&e),
                Ok(resp) => {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    if status == reqwest::StatusCode::UNAUTHORIZED && v2 && !fresh {
                        continue; // expired JWT: refused, nothing started; once more with a new one
                    }
                    if status == reqwest::StatusCode::CONFLICT {
                        // The run id is ours (derived from the trigger_key): it exists, follow it.
                        return SendOutcome::Accepted {
                            external_id: Some(run_id),
                            done: false,
                        };
                    }
                    return by_status(status, &text).unwrap_or(SendOutcome::Accepted {
                        external_id: Some(run_id),
                        done: false,
                    });
                }
            }
        }
        SendOutcome::Refused {
            reason: "Airflow refused the credentials twice".into(),
        }
    }

    async fn airflow_observe(&self, target: &Target, job: &Claimed) -> Observed {
        let run_id = airflow_run_id(&job.trigger_key, job.attempt);
        let url = format!("{}/{run_id}", Self::airflow_runs_url(target, job));
        for fresh in [false, true] {
            let req = self.http.get(&url).timeout(Duration::from_secs(10));
            let req = match self.airflow_auth(target, req, fresh).await {
                Ok(r) => r,
                Err(reason) => return Observed::CannotTell { reason },
            };
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    return Observed::CannotTell {
                        reason: format!("Airflow: {e}"),
                    };
                }
            };
            let status = resp.status();
            if status == reqwest::StatusCode::UNAUTHORIZED && !fresh {
                continue;
            }
            if status == reqwest::StatusCode::NOT_FOUND {
                return Observed::Absent;
            }
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            let external_id = Some(run_id.clone());
            return match body.get("state").and_then(Value::as_str) {
                Some("success") => Observed::Succeeded { external_id },
                Some("failed") => Observed::Failed {
                    external_id,
                    reason: "Airflow dag run failed".into(),
                },
                Some(_) if status.is_success() => Observed::Running { external_id },
                _ => Observed::CannotTell {
                    reason: format!("Airflow answered {status}: {body}"),
                },
            };
        }
        Observed::CannotTell {
            reason: "Airflow refused the credentials twice".into(),
        }
    }

    async fn dolphin_start(
        &self,
        url: &str,
        token: &str,
        project_code: &str,
        job: &Claimed,
        timeout: Duration,
    ) -> SendOutcome {
        let definition = param(job, "process_definition_code").unwrap_or(&job.target_name);
        // startParams: the workflow's global parameters, a JSON object of strings.
        let start_params = json!({
            "sluice_trigger_key": job.trigger_key,
            "sluice_dependency_id": job.dependency_id,
            "sluice_inputs": job.inputs.to_string(),
            "sluice_partition": job.partition.clone().unwrap_or_default(),
        })
        .to_string();
        let form = [
            ("processDefinitionCode", definition),
            ("scheduleTime", ""),
            ("failureStrategy", "CONTINUE"),
            ("warningType", "NONE"),
            ("startParams", start_params.as_str()),
        ];
        let req = self
            .http
            .post(format!(
                "{url}/dolphinscheduler/projects/{project_code}/executors/start-process-instance"
            ))
            .timeout(timeout)
            .header("token", token)
            .form(&form);
        match req.send().await {
            Err(e) => http_error(&e),
            Ok(resp) => {
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                if let Some(o) = by_status(status, &text) {
                    return o;
                }
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                match body.get("code").and_then(Value::as_i64) {
                    // Result{code: 0, data: …}: started. An instance id in data can be followed.
                    Some(0) => {
                        let id = match body.get("data") {
                            Some(Value::Number(n)) => Some(n.to_string()),
                            Some(Value::Array(a)) => a.first().map(Value::to_string),
                            _ => None,
                        };
                        SendOutcome::Accepted {
                            done: id.is_none(),
                            external_id: id,
                        }
                    }
                    // A business error (bad definition, offline workflow, no permission):
                    // DolphinScheduler started nothing.
                    Some(code) => SendOutcome::Refused {
                        reason: format!(
                            "DolphinScheduler code {code}: {}",
                            body.get("msg").and_then(Value::as_str).unwrap_or("")
                        ),
                    },
                    None => SendOutcome::Unknown {
                        reason: format!(
                            "DolphinScheduler answered {status} without a code: {text}"
                        ),
                    },
                }
            }
        }
    }

    async fn dolphin_observe(
        &self,
        url: &str,
        token: &str,
        project_code: &str,
        id: &str,
    ) -> Observed {
        let resp = self
            .http
            .get(format!(
                "{url}/dolphinscheduler/projects/{project_code}/process-instances/{id}"
            ))
            .timeout(Duration::from_secs(10))
            .header("token", token)
            .send()
            .await;
        let body: Value = match resp {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(e) => {
                return Observed::CannotTell {
                    reason: format!("DolphinScheduler: {e}"),
                };
            }
        };
        let external_id = Some(id.to_owned());
        match body.pointer("/data/state").and_then(Value::as_str) {
            Some("SUCCESS") => Observed::Succeeded { external_id },
            Some(s @ ("FAILURE" | "STOP" | "KILL")) => Observed::Failed {
                external_id,
                reason: format!("DolphinScheduler instance {id} ended {s}"),
            },
            Some(_) => Observed::Running { external_id },
            None => Observed::CannotTell {
                reason: format!("DolphinScheduler: no state in {body}"),
            },
        }
    }

    async fn kafka_send(&self, topic: &str, job: &Claimed, timeout: Duration) -> SendOutcome {
        let Some(producer) = &self.kafka else {
            return SendOutcome::Refused {
                reason: "no Kafka producer configured".into(),
            };
        };
        let body = trigger_document(job).to_string();
        let record = FutureRecord::to(topic).key(&job.trigger_key).payload(&body);
        match producer.send(record, timeout).await {
            Ok(_) => SendOutcome::Accepted {
                external_id: None,
                done: true,
            },
            Err((e, _)) => SendOutcome::Unknown {
                reason: format!("Kafka delivery not confirmed: {e}"),
            },
        }
    }
}

/// Expands `{trigger_key}`, `{dependency_id}`, `{target_name}`, `{partition}` and
/// `{param.NAME}` in one argv element.
pub fn expand(arg: &str, job: &Claimed) -> String {
    let mut out = arg
        .replace("{trigger_key}", &job.trigger_key)
        .replace("{dependency_id}", &job.dependency_id)
        .replace("{target_name}", &job.target_name)
        .replace("{partition}", job.partition.as_deref().unwrap_or(""));
    if let Some(obj) = job.target_parameters.as_object() {
        for (k, v) in obj {
            out = out.replace(&format!("{{param.{k}}}"), v.as_str().unwrap_or(""));
        }
    }
    out
}

impl Adapters {
    /// A local command (a spark-submit for a Hudi table service, a script): the
    /// trigger document on stdin and in SLUICE_TRIGGER, run detached so its outcome
    /// survives the dispatcher (see `command`), killed at the send timeout.
    async fn command(
        &self,
        argv: &[String],
        void_exit_codes: &[i32],
        job: &Claimed,
        timeout: Duration,
    ) -> SendOutcome {
        let args: Vec<String> = argv.iter().map(|a| expand(a, job)).collect();
        let doc = trigger_document(job).to_string();
        let env = [
            ("SLUICE_TRIGGER", doc.clone()),
            ("SLUICE_TRIGGER_KEY", job.trigger_key.clone()),
            ("SLUICE_DEPENDENCY_ID", job.dependency_id.clone()),
            ("SLUICE_INVOCATION_ID", job.invocation_id.clone()),
            ("SLUICE_ATTEMPT", job.attempt.to_string()),
        ];
        self.commands
            .send(&args, &env, &doc, job, timeout, void_exit_codes)
            .await
    }
}

#[cfg(test)]
mod tests {
    //! How an HTTP answer to a send is read: the line between "nothing started"
    //! (retried freely) and "may have started" (UNKNOWN, never resent blindly).
    use super::*;
    use reqwest::StatusCode;

    fn outcome(status: u16, body: &str) -> Option<SendOutcome> {
        by_status(StatusCode::from_u16(status).expect("status"), body)
    }

    #[test]
    fn a_success_is_left_to_the_target_kind() {
        for s in [200, 201, 202, 204] {
            assert_eq!(outcome(s, ""), None, "{s}");
        }
    }

    #[test]
    fn a_client_error_is_a_refusal_that_proves_nothing_started() {
        for s in [400, 401, 403, 404, 409, 422] {
            assert!(
                matches!(outcome(s, "no"), Some(SendOutcome::Refused { reason }) if reason.contains(&s.to_string())),
                "{s}"
            );
        }
    }

    #[test]
    fn a_server_error_or_a_timeout_may_have_started_the_run() {
        for s in [408, 500, 502, 503, 504] {
            assert!(
                matches!(outcome(s, ""), Some(SendOutcome::Unknown { .. })),
                "{s}: a resend could start a second run"
            );
        }
    }

    #[test]
    fn the_reason_quotes_a_bounded_prefix_of_the_body() {
        let body = "x".repeat(10_000);
        let Some(SendOutcome::Refused { reason }) = outcome(400, &body) else {
            panic!("a refusal");
        };
        assert!(reason.len() < 400, "{} bytes", reason.len());
    }
}

//! Command targets whose outcome survives the dispatcher. Each invocation runs in a
//! directory of its own, `<SLUICE_COMMAND_DIR>/<instance>/<trigger_key>/<invocation>`,
//! under a small `sh` wrapper in a process group of its own: the trigger document
//! is read from `trigger.json`, output goes to `stdout` / `stderr`, the wrapper
//! writes its pid to `pid` and the command's exit code to `exit` when it ends. No
//! pipe ties the command to the dispatcher, so a dispatcher that dies (kill -9, a
//! rollout) leaves it running, and the reconcile of its UNKNOWN job reads the
//! directory: an `exit` file is the outcome, a live pid is a run to follow, a dead
//! pid without `exit` is a failed attempt, no directory is a command never started.
//!
//! A table-service run may also name the instant it planned on a Hudi table
//! (`hudi-instant.json`: `{"path": …, "instant": …}`, written by
//! `engines/hudi_table_service.py` before it runs the plan). When such a run ends
//! without an exit code (its machine rebooted, it was killed), the table's
//! timeline tells the outcome: the instant completed is a success, whoever was
//! watching; not completed is a failed attempt whose retry resumes the plan.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::lifecycle::{Observed, SendOutcome};
use crate::store::Claimed;

/// The wrapper: records its pid, runs the command (argv after `sh -c … sluice-run`),
/// then the exit code, written atomically (tmp + rename).
const WRAPPER: &str = r#"echo $$ > pid.tmp && mv pid.tmp pid; "$@" < trigger.json > stdout 2> stderr; echo $? > exit.tmp && mv exit.tmp exit"#;

#[derive(Clone, Debug)]
pub struct Runs {
    /// `SLUICE_COMMAND_DIR`: kept across dispatcher restarts (a volume in Kubernetes).
    pub root: PathBuf,
    /// This dispatcher's instance: a run started by another instance is in its directory.
    pub instance: String,
}

fn safe(part: &str) -> String {
    part.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Runs {
    /// Where the invocation `job` runs when started by `instance`.
    pub fn dir(&self, instance: &str, job: &Claimed) -> PathBuf {
        self.root
            .join(safe(instance))
            .join(safe(&job.trigger_key))
            .join(safe(&job.invocation_id))
    }

    /// Starts the invocation and waits for it up to `timeout`; past it the run's
    /// process group is killed (a known, failed attempt).
    pub async fn send(
        &self,
        argv: &[String],
        env: &[(&str, String)],
        document: &str,
        job: &Claimed,
        timeout: Duration,
        void_exit_codes: &[i32],
    ) -> SendOutcome {
        let dir = self.dir(&self.instance, job);
        if let Err(e) = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join("trigger.json"), document))
        {
            return SendOutcome::Refused {
                reason: format!("cannot prepare {}: {e}", dir.display()),
            };
        }
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg(WRAPPER)
            .arg("sluice-run")
            .args(argv)
            .current_dir(&dir)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            // Its own process group: signals to the dispatcher's group do not reach it.
            .process_group(0)
            .kill_on_drop(false);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                return SendOutcome::Refused {
                    reason: format!("cannot start sh for {:?}: {e}", argv.first()),
                };
            }
        };
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(_)) => match outcome(&dir, void_exit_codes) {
                Observed::Succeeded { .. } => SendOutcome::Accepted {
                    external_id: Some(dir.display().to_string()),
                    done: true,
                },
                Observed::Failed { reason, .. } => SendOutcome::Failed { reason },
                Observed::Void { reason } => SendOutcome::Void { reason },
                other => SendOutcome::Unknown {
                    reason: format!("the wrapper ended without an exit code: {other:?}"),
                },
            },
            Ok(Err(e)) => SendOutcome::Unknown {
                reason: format!("lost the command: {e}"),
            },
            Err(_) => {
                if let Some(pid) = child.id() {
                    // The whole group: the wrapper and the command it started.
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", "--", &format!("-{pid}")])
                        .status();
                }
                let _ = child.wait().await;
                SendOutcome::Failed {
                    reason: format!("killed after the timeout of {timeout:?}"),
                }
            }
        }
    }

    /// What became of the invocation, from its directory (reconcile and follow).
    /// `started_by` is the instance that claimed the job.
    pub fn observe(
        &self,
        started_by: Option<&str>,
        job: &Claimed,
        void_exit_codes: &[i32],
    ) -> Observed {
        let by = started_by.unwrap_or(&self.instance);
        let dir = self.dir(by, job);
        if !dir.exists() {
            if by != self.instance {
                return Observed::CannotTell {
                    reason: format!(
                        "started by instance {by}; its command directory {} is not here",
                        dir.display()
                    ),
                };
            }
            return Observed::Absent;
        }
        outcome(&dir, void_exit_codes)
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let chars: Vec<char> = text.chars().collect();
    let from = chars.len().saturating_sub(300);
    chars[from..].iter().collect::<String>().trim().to_owned()
}

/// The outcome recorded in a run directory; an exit code among `void_exit_codes`
/// means the command found nothing to do.
fn outcome(dir: &Path, void_exit_codes: &[i32]) -> Observed {
    let external_id = Some(dir.display().to_string());
    if let Some(code) = read_trimmed(&dir.join("exit")) {
        return if code == "0" {
            Observed::Succeeded { external_id }
        } else if code
            .parse::<i32>()
            .is_ok_and(|c| void_exit_codes.contains(&c))
        {
            Observed::Void {
                reason: format!("exited with {code}: {}", tail(&dir.join("stderr"))),
            }
        } else {
            Observed::Failed {
                external_id,
                reason: format!("exited with {code}: {}", tail(&dir.join("stderr"))),
            }
        };
    }
    match read_trimmed(&dir.join("pid")).and_then(|p| p.parse::<u32>().ok()) {
        // The wrapper still runs (Linux: its /proc entry is there).
        Some(pid) if Path::new(&format!("/proc/{pid}")).exists() => {
            Observed::Running { external_id }
        }
        Some(pid) => match planned_instant(dir) {
            Some((path, instant)) if hudi_completed(&path, &instant) => Observed::Succeeded {
                external_id: Some(format!("{}#{instant}", path.display())),
            },
            Some((path, instant)) => Observed::Failed {
                external_id,
                reason: format!(
                    "the run (pid {pid}) ended without an exit code and instant {instant} is not completed on the timeline of {}",
                    path.display()
                ),
            },
            None => Observed::Failed {
                external_id,
                reason: format!("the run (pid {pid}) ended without an exit code: killed"),
            },
        },
        None => Observed::Failed {
            external_id,
            reason: "the run directory exists but the command never started".into(),
        },
    }
}

/// The Hudi instant a table-service run planned, if it wrote one.
fn planned_instant(dir: &Path) -> Option<(PathBuf, String)> {
    let text = std::fs::read_to_string(dir.join("hudi-instant.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let instant = v.get("instant")?.as_str()?;
    // An instant is digits only: it becomes part of a file name below.
    if instant.is_empty() || !instant.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((PathBuf::from(v.get("path")?.as_str()?), instant.to_owned()))
}

/// Whether `instant` completed on the Hudi table at `path` (either layout).
fn hudi_completed(path: &Path, instant: &str) -> bool {
    use sluice_kit::hudi::{LAYOUT2_DIR, completed_instant};
    let hoodie = path.join(".hoodie");
    let layout2 = hoodie.join(LAYOUT2_DIR).is_dir();
    let dir = if layout2 {
        hoodie.join(LAYOUT2_DIR)
    } else {
        hoodie
    };
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|e| {
            completed_instant(&e.file_name().to_string_lossy(), layout2)
                .is_some_and(|(requested, _)| requested == instant)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-cmd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    #[test]
    fn a_run_directory_tells_the_outcome() {
        let d = dir("outcome");
        assert!(
            matches!(outcome(&d, &[]), Observed::Failed { .. }),
            "never started"
        );
        std::fs::write(d.join("pid"), std::process::id().to_string()).expect("w");
        assert!(
            matches!(outcome(&d, &[]), Observed::Running { .. }),
            "alive"
        );
        std::fs::write(d.join("pid"), "999999999").expect("w");
        assert!(
            matches!(outcome(&d, &[]), Observed::Failed { .. }),
            "dead without exit"
        );
        std::fs::write(d.join("stderr"), "boom\n").expect("w");
        std::fs::write(d.join("exit"), "3\n").expect("w");
        match outcome(&d, &[]) {
            Observed::Failed { reason, .. } => assert!(reason.contains("3: boom"), "{reason}"),
            other => panic!("{other:?}"),
        }
        match outcome(&d, &[3]) {
            Observed::Void { reason } => assert!(reason.contains("3: boom"), "{reason}"),
            other => panic!("a void exit code: {other:?}"),
        }
        std::fs::write(d.join("exit"), "0\n").expect("w");
        assert!(matches!(outcome(&d, &[]), Observed::Succeeded { .. }));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_killed_table_service_run_is_told_by_the_timeline() {
        let d = dir("timeline");
        let table = d.join("orders");
        let tl = table.join(".hoodie/timeline");
        std::fs::create_dir_all(&tl).expect("timeline");
        std::fs::write(d.join("pid"), "999999999").expect("w");
        std::fs::write(
            d.join("hudi-instant.json"),
            serde_json::json!({"path": table, "instant": "20261207031412979"}).to_string(),
        )
        .expect("w");
        // Planned and inflight: a failed attempt (its retry resumes the plan).
        for f in [
            "20261207031412979.compaction.requested",
            "20261207031412979.compaction.inflight",
            "20261207031412000_20261207031412100.deltacommit",
        ] {
            std::fs::write(tl.join(f), "").expect("w");
        }
        match outcome(&d, &[]) {
            Observed::Failed { reason, .. } => {
                assert!(reason.contains("not completed on the timeline"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // Completed as a commit: a success, though nobody saw the exit.
        std::fs::write(tl.join("20261207031412979_20261207031427848.commit"), "").expect("w");
        assert!(matches!(outcome(&d, &[]), Observed::Succeeded { .. }));
        // Hudi 0.x's layout.
        let old = d.join("old");
        std::fs::create_dir_all(old.join(".hoodie")).expect("w");
        std::fs::write(
            old.join(".hoodie/20261207031412979.compaction.inflight"),
            "",
        )
        .expect("w");
        assert!(!hudi_completed(&old, "20261207031412979"));
        std::fs::write(old.join(".hoodie/20261207031412979.commit"), "").expect("w");
        assert!(hudi_completed(&old, "20261207031412979"));
        let _ = std::fs::remove_dir_all(&d);
    }
}

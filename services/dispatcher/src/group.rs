//! Group statements: while one statement runs for a batch of jobs, the requests
//! that arrive meanwhile wait and go in the next, so a busy dispatcher pays one
//! round trip for many jobs, an idle one nothing more than a statement per job.
//! The dispatcher groups the jobs' transitions (one statement per job was what
//! bounded dispatch) and the pre-send checks of the sends a claim starts.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

/// A request about one job; one statement holds each job once (its row is
/// matched by one guard only), in arrival order.
pub trait Keyed {
    fn key(&self) -> &str;
}

type Waiting<T> = (T, oneshot::Sender<Result<bool, String>>);

pub struct Group<T> {
    queue: Mutex<Queue<T>>,
    /// The most requests one statement holds.
    max: usize,
}

struct Queue<T> {
    waiting: Vec<Waiting<T>>,
    /// A caller is running batches: new requests only wait for it.
    leading: bool,
}

impl<T: Keyed> Group<T> {
    pub fn new(max: usize) -> Group<T> {
        Group {
            queue: Mutex::new(Queue {
                waiting: Vec::new(),
                leading: false,
            }),
            max: max.max(1),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue<T>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers `item` with the requests that wait beside it: `run` answers a
    /// batch, one `bool` per request in order. The first caller to find nobody
    /// leading runs every batch until none waits.
    pub async fn submit<F, Fut>(&self, item: T, run: F) -> Result<bool, String>
    where
        F: Fn(Vec<T>) -> Fut,
        Fut: Future<Output = Result<Vec<bool>, String>>,
    {
        let (done, result) = oneshot::channel();
        let lead = {
            let mut q = self.queue();
            q.waiting.push((item, done));
            !std::mem::replace(&mut q.leading, true)
        };
        if lead {
            // Cancelled mid-way, the leader hands the role on: the next caller leads.
            let mut handover = Handover {
                group: self,
                done: false,
            };
            while let Some(batch) = self.next_batch() {
                let (items, answers): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
                let outcome = run(items).await;
                for (i, answer) in answers.into_iter().enumerate() {
                    let _ = answer.send(match &outcome {
                        Ok(each) => each
                            .get(i)
                            .copied()
                            .ok_or_else(|| "the statement answered fewer requests".into()),
                        Err(e) => Err(e.clone()),
                    });
                }
            }
            handover.done = true;
        }
        result
            .await
            .unwrap_or_else(|_| Err("the leading caller went away".into()))
    }

    /// The next batch: distinct jobs, oldest first; `None` ends the lead.
    fn next_batch(&self) -> Option<Vec<Waiting<T>>> {
        let mut q = self.queue();
        if q.waiting.is_empty() {
            q.leading = false;
            return None;
        }
        let mut keys = HashSet::new();
        let end = q
            .waiting
            .iter()
            .take(self.max)
            .position(|(t, _)| !keys.insert(t.key().to_owned()))
            .unwrap_or(q.waiting.len().min(self.max));
        Some(q.waiting.drain(..end).collect())
    }
}

/// Gives up the leading role if its holder is dropped before it is done (a
/// cancelled send): its waiters see their answer gone, retry, and one leads.
struct Handover<'a, T> {
    group: &'a Group<T>,
    done: bool,
}

impl<T> Drop for Handover<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            self.group
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .leading = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Keyed for &'static str {
        fn key(&self) -> &str {
            self
        }
    }

    fn waiting(g: &Group<&'static str>, key: &'static str) {
        let (done, _) = oneshot::channel();
        g.queue().waiting.push((key, done));
    }

    fn keys(batch: Option<Vec<Waiting<&'static str>>>) -> Vec<&'static str> {
        batch
            .unwrap_or_default()
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    /// One statement matches a row by one guard only: a job's second request
    /// waits for the next batch, in order.
    #[test]
    fn a_batch_holds_each_job_once_and_keeps_the_order() {
        let g = Group::new(500);
        for k in ["a", "b", "a", "c"] {
            waiting(&g, k);
        }
        g.queue().leading = true;
        assert_eq!(keys(g.next_batch()), ["a", "b"]);
        assert_eq!(keys(g.next_batch()), ["a", "c"]);
        assert!(g.next_batch().is_none());
        assert!(!g.queue().leading, "an empty queue ends the lead");
    }

    #[test]
    fn a_batch_is_at_most_a_statement_long() {
        let g = Group::new(3);
        for k in ["a", "b", "c", "d", "e"] {
            waiting(&g, k);
        }
        assert_eq!(keys(g.next_batch()), ["a", "b", "c"]);
        assert_eq!(keys(g.next_batch()), ["d", "e"]);
    }

    /// Requests that arrive while a batch runs are answered by the next one,
    /// each with its own answer.
    #[tokio::test]
    async fn waiters_are_answered_in_batches_each_with_its_own_answer() {
        let g = std::sync::Arc::new(Group::new(500));
        let batches = std::sync::Arc::new(Mutex::new(Vec::<Vec<&'static str>>::new()));
        let run = {
            let batches = batches.clone();
            move |items: Vec<&'static str>| {
                let batches = batches.clone();
                async move {
                    batches.lock().expect("lock").push(items.clone());
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    Ok(items.iter().map(|k| *k != "no").collect())
                }
            }
        };
        let mut joins = Vec::new();
        for k in ["a", "no", "b", "c"] {
            let (g, run) = (g.clone(), run.clone());
            joins.push(tokio::spawn(async move { g.submit(k, run).await }));
            tokio::task::yield_now().await;
        }
        let mut answers = Vec::new();
        for j in joins {
            answers.push(j.await.expect("join"));
        }
        assert_eq!(answers, [Ok(true), Ok(false), Ok(true), Ok(true)]);
        let batches = batches.lock().expect("lock").clone();
        assert_eq!(batches.concat(), ["a", "no", "b", "c"]);
        assert!(batches.len() < 4, "grouped: {batches:?}");
    }
}

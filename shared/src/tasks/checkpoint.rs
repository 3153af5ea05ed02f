//! A long run's text, saved as it comes, so that a crash does not cost it: every
//! `LanePolicy::checkpoint_every` (the synthesis lane's, by default) the run's text so far is
//! written to its record under the run's fence ([`crate::domain::lifecycle::Event::Checkpoint`]).
//! The worker that takes the task over finds it in the record it claims and asks the provider to
//! continue it ([`crate::llm::continuation`]) rather than to say it all again.
//!
//! - The record, not the event stream, holds it: the stream is a view and may be lost with the
//!   cache; the record is what a takeover reads, and the fence decides whose text it is. A run whose
//!   fence moved on (a takeover, a cancel) has its saves refused and stops saving.
//! - A save rewrites the whole text (the stores have no append), so the text saved stops growing at
//!   [`MAX_SAVED_BYTES`]: a longer run saves its first part, and a takeover pays for the rest.
//! - Saving is best effort: a store that fails a save is counted and asked again at the next
//!   interval; the run itself never waits on it.
//! - A run's end, answered or not, ends its saving; the final write removes the saved text.

use crate::clock::SharedClock;
use crate::domain::model_call::Prefix;
use crate::domain::{TaskId, TaskRecord};
use crate::metrics::Metrics;
use crate::ports::{DeltaSink, TaskStore};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most text a save holds: a record stays far below DynamoDB's item limit with its request and
/// this (compressed above 32 KiB), and each save costs a write unit per KiB.
pub const MAX_SAVED_BYTES: usize = 64 * 1024;

/// The prefix a claimed run continues: the text an earlier run of the same submission saved (the
/// claim's own fence never saved anything yet), with its tokens counted as the provider will.
pub fn resumed_from(record: &TaskRecord) -> Option<Prefix> {
    let partial = record.partial.as_ref().filter(|p| p.run < record.fence && !p.text.trim().is_empty())?;
    let tokens = crate::commits::budget::count_tokens(&partial.text);
    Some(Prefix { text: partial.text.clone(), tokens: u32::try_from(tokens).unwrap_or(u32::MAX) })
}

/// The saving of one run's text: the text as the provider gives it (a sink), and a task that writes
/// it when it changed, every interval.
pub struct Checkpoints {
    text: Arc<Mutex<String>>,
    saver: tokio::task::JoinHandle<()>,
}

/// Where and as whom a run saves.
pub struct Saving {
    /// The record's store.
    pub store: Arc<dyn TaskStore>,
    /// Time, for the writes.
    pub clock: SharedClock,
    /// Counters.
    pub metrics: Metrics,
    /// The task.
    pub task: TaskId,
    /// The run's fence.
    pub fence: u64,
    /// The lane, for the counters.
    pub lane: &'static str,
}

impl Checkpoints {
    /// Starts saving the run's text every `every`.
    pub fn start(saving: Saving, every: Duration) -> Self {
        let text = Arc::new(Mutex::new(String::new()));
        let saver = tokio::spawn(save_every(saving, text.clone(), every));
        Self { text, saver }
    }

    fn text(&self) -> std::sync::MutexGuard<'_, String> {
        // The text is a plain string: a panic elsewhere cannot leave it half-written.
        self.text.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Checkpoints {
    fn drop(&mut self) {
        self.saver.abort();
    }
}

impl DeltaSink for Checkpoints {
    fn delta(&self, piece: &str) {
        let mut text = self.text();
        if text.len() < MAX_SAVED_BYTES {
            text.push_str(piece);
        }
    }

    fn restart(&self, _reason: &str) {
        self.text().clear();
    }
}

/// Writes the text every `every` when it changed, until the record refuses it.
async fn save_every(saving: Saving, text: Arc<Mutex<String>>, every: Duration) {
    let Saving { store, clock, metrics, task, fence, lane } = saving;
    let mut saved = String::new();
    loop {
        tokio::time::sleep(every).await;
        let now = {
            let text = text.lock().unwrap_or_else(|e| e.into_inner());
            let cut = cut_at(&text, MAX_SAVED_BYTES);
            if cut.is_empty() || cut == saved {
                continue;
            }
            cut.to_owned()
        };
        match store.checkpoint(&task, fence, &now, clock.now_ms()).await {
            Ok(true) => {
                metrics.checkpoints_total.with_label_values(&[lane, "saved"]).inc();
                saved = now;
            }
            // Another claim, or the client's cancellation, has the record: nothing of this run's is
            // the task's any more.
            Ok(false) => {
                metrics.checkpoints_total.with_label_values(&[lane, "refused"]).inc();
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the run's text was not saved; asked again at the next interval");
                metrics.checkpoints_total.with_label_values(&[lane, "failed"]).inc();
            }
        }
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut_at(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Two sinks as one: the run's event stream and its saving.
pub struct Both<'a>(pub Option<&'a dyn DeltaSink>, pub Option<&'a dyn DeltaSink>);

impl Both<'_> {
    /// Whether either is there.
    pub fn any(&self) -> bool {
        self.0.is_some() || self.1.is_some()
    }
}

impl DeltaSink for Both<'_> {
    fn delta(&self, text: &str) {
        self.0.iter().chain(self.1.iter()).for_each(|s| s.delta(text));
    }

    fn restart(&self, reason: &str) {
        self.0.iter().chain(self.1.iter()).for_each(|s| s.restart(reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::config::WorkerConfig;
    use crate::domain::{Lane, TaskRequest, TaskStatus};
    use crate::embedded::{
        EmbeddedDb, EmbeddedQueues, EmbeddedStore, MemoryCache, MemoryLock, QueueSettings,
    };
    use crate::llm::{Continuing, OfflineProvider};
    use crate::ports::{Acquire, LeaseLock, LlmClient, QueueConsume, QueueSend};
    use crate::tasks::worker::{Outcome, Worker};

    /// A synthesis run streams the offline model's answer over 800 ms, saving it every 100 ms; its
    /// lease is lost half-way and another worker takes the task over. The takeover continues the
    /// saved text: the answer is the whole one, the tokens it did not pay again are in the result
    /// and the counters, and the lost run's later saves are refused.
    #[tokio::test]
    async fn a_takeover_continues_the_saved_text_and_pays_only_for_the_rest() {
        let clock = ManualClock::new(1_000_000);
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let db = EmbeddedDb::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let store = EmbeddedStore::new(db.clone());
        let settings = QueueSettings { default_visibility: Duration::from_secs(900), ..Default::default() };
        let queue = EmbeddedQueues::open(db, clock.clone(), settings).await.unwrap_or_else(|e| panic!("{e}"));
        let queue = queue.queue("synthesis", "synthesis-dlq");
        let body =
            serde_json::json!({"project_id":"p","kind":"scaffold","prompt":"a crate","target_files":[]});
        let request = TaskRequest::from_value(body).unwrap_or_else(|e| panic!("{e:?}"));
        let record = TaskRecord::pending(request.task_id(None), request, clock.now_ms(), 3600);
        store.put_pending(&record, clock.now_ms()).await.unwrap_or_else(|e| panic!("{e}"));
        let message = serde_json::json!({"task_id": record.task_id, "lane": "synthesis", "kind": "scaffold"})
            .to_string();
        let offline = Arc::new(OfflineProvider::new(|_| Duration::from_millis(800)));
        let mut config = WorkerConfig {
            lease_ttl: Duration::from_millis(300),
            renew_interval: Duration::from_millis(20),
            lock_jitter_max: Duration::from_millis(10),
            ..WorkerConfig::default()
        };
        config.lanes[Lane::Synthesis.index()].checkpoint_every = Some(Duration::from_millis(100));
        let lock = Arc::new(MemoryLock::new(clock.clone()));
        let worker = Worker {
            objects: None,
            store: Arc::new(store.clone()),
            lock: lock.clone(),
            cache: Arc::new(MemoryCache::new(clock.clone())),
            llm: Arc::new(Continuing::new(offline.clone(), true)),
            metrics: Metrics::new(),
            clock: clock.clone(),
            config,
            batching: None,
            events: None,
        };
        let q: Arc<dyn QueueConsume> = Arc::new(queue.clone());
        let send = || queue.send(&message, Default::default());
        send().await.unwrap_or_else(|e| panic!("{e}"));
        let first = queue.receive(1).await.unwrap_or_else(|e| panic!("{e}")).remove(0);
        let (w, lost_q) = (worker.clone(), q.clone());
        let lost = tokio::spawn(async move { w.process(lost_q, first).await });
        tokio::time::sleep(Duration::from_millis(450)).await;
        // The worker stalls past its lease and another takes the lock; the lost run saved its text.
        clock.advance_ms(301);
        let key = crate::lease::task_lock_key(&record.task_id);
        let Ok(Acquire::Acquired(token)) = lock.acquire(&key, Duration::from_secs(10)).await else {
            panic!("the lock was not free")
        };
        assert_eq!(lost.await.unwrap_or_else(|e| panic!("{e}")), Outcome::LeaseLost);
        let saved = store.get(&record.task_id, clock.now_ms()).await.unwrap_or_else(|e| panic!("{e}"));
        let saved = saved.and_then(|r| r.partial).unwrap_or_else(|| panic!("nothing saved"));
        lock.release(&key, &token).await.unwrap_or_else(|e| panic!("{e}"));

        send().await.unwrap_or_else(|e| panic!("{e}"));
        let again = queue.receive(1).await.unwrap_or_else(|e| panic!("{e}")).remove(0);
        assert_eq!(worker.process(q.clone(), again).await, Outcome::Acked);
        let done = store.get(&record.task_id, clock.now_ms()).await.unwrap_or_else(|e| panic!("{e}"));
        let done = done.unwrap_or_else(|| panic!("no record"));
        let result = done.result.unwrap_or_else(|| panic!("no result"));
        let whole = offline.complete(&crate::ports::LlmRequest::for_task(&record.request, 16_384)).await;
        let whole = whole.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((done.status, result.text.as_str()), (TaskStatus::Completed, whole.text.as_str()));
        assert!(result.text.starts_with(saved.text.trim_end()), "{saved:?}");
        let saved_tokens = crate::commits::budget::count_tokens(&saved.text) as u64;
        assert_eq!(result.tokens_saved, saved_tokens);
        assert!(result.tokens.completion < whole.usage.completion, "it paid for the rest only");
        let counted = worker.metrics.llm_tokens_total.with_label_values(&["synthesis", "saved"]).get();
        assert_eq!(counted, saved_tokens);
        assert_eq!(done.partial, None, "the final write removes the saved text");
        assert!(!store.checkpoint(&record.task_id, saved.run, "late", clock.now_ms()).await.unwrap_or(true));
    }

    /// The saver writes at most [`MAX_SAVED_BYTES`] of a long run's text (its start), and stops at
    /// the first save the record refuses (another claim moved the fence on).
    #[tokio::test]
    async fn a_save_holds_the_texts_first_64_kib_and_stops_once_refused() {
        let clock = ManualClock::new(1_000_000);
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap_or_else(|e| panic!("{e}")));
        let body = serde_json::json!({"project_id":"p","kind":"scaffold","prompt":"long","target_files":[]});
        let request = TaskRequest::from_value(body).unwrap_or_else(|e| panic!("{e:?}"));
        let record = TaskRecord::pending(request.task_id(None), request, clock.now_ms(), 3600);
        store.put_pending(&record, clock.now_ms()).await.unwrap_or_else(|e| panic!("{e}"));
        let claimed = match store.claim(&record.task_id, clock.now_ms(), 3600).await {
            Ok(crate::ports::ClaimOutcome::Claimed(r)) => r,
            other => panic!("{other:?}"),
        };
        let (metrics, task, fence) = (Metrics::new(), record.task_id.clone(), claimed.fence);
        let saving = Saving {
            store: Arc::new(store.clone()),
            clock: clock.clone(),
            metrics: metrics.clone(),
            task,
            fence,
            lane: "synthesis",
        };
        let run = Checkpoints::start(saving, Duration::from_millis(20));
        let text: String = (0..20_000).map(|i| format!("{i} ")).collect();
        assert!(text.len() > 100 * 1024);
        for piece in text.as_bytes().chunks(1000) {
            run.delta(std::str::from_utf8(piece).unwrap_or_else(|e| panic!("{e}")));
        }
        tokio::time::sleep(Duration::from_millis(80)).await;
        let saved = store.get(&record.task_id, clock.now_ms()).await.unwrap_or_else(|e| panic!("{e}"));
        let saved = saved.and_then(|r| r.partial).unwrap_or_else(|| panic!("nothing saved"));
        assert_eq!((saved.text.len(), saved.run), (MAX_SAVED_BYTES, fence));
        assert!(text.starts_with(&saved.text));
        let saves =
            |outcome: &str| metrics.checkpoints_total.with_label_values(&["synthesis", outcome]).get();
        assert_eq!(saves("saved"), 1, "an unchanged text is not saved again");
        // Another claim takes the run over: this run's next save is refused, and it saves no more.
        store.claim(&record.task_id, clock.now_ms(), 3600).await.unwrap_or_else(|e| panic!("{e}"));
        run.restart("the text starts again");
        run.delta("another text");
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!((saves("saved"), saves("refused")), (1, 1));
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(cut_at("héllo", 2), "h");
        assert_eq!(cut_at("héllo", 3), "hé");
        assert_eq!(cut_at("abc", 10), "abc");
    }
}

//! A run's event stream, as the worker writes it (`crate::domain::events`): `running` when the
//! call starts, its text as the provider gives it, `retrying` when the call is made again before
//! any text, `restarting` when a retry or the next route voids what was said, and `stopped` when
//! the run ends without an answer here. The record's
//! fenced final write stays the answer; `GET /v1/tasks/{id}/events` ends the stream with it.
//!
//! The provider's client hands text to [`RunStream`] without waiting (a send on a channel); one
//! publisher task a run appends to the [`EventLog`], merging the text that arrived while its last
//! append was under way, so a fast stream costs an append per round trip, not per token. An append
//! that fails leaves a gap the reader could not see: the next one first says `restarting` and gives
//! the run's text so far again, so a reader never shows a missing character.

use super::checkpoint::{Both, Checkpoints, Saving};
use super::worker::{Call, Worker};
use crate::domain::events::RunEvent;
use crate::domain::{TaskId, TaskRecord};
use crate::metrics::Metrics;
use crate::ports::{DeltaSink, EventLog, LlmRequest};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Longest a finished run waits for its last events to be appended before its final write: the
/// stream is a view, and the record's answer must not wait on an outage of it.
const CLOSE_LIMIT: Duration = Duration::from_secs(2);

impl Worker {
    /// The run's provider call, streamed to the task's events where the worker keeps them and its
    /// text saved where its lane saves it; ended early by a lost lease or its client's cancel.
    pub(super) async fn call(
        &self,
        record: &TaskRecord,
        request: &LlmRequest,
        lost: &CancellationToken,
        cancelled: &CancellationToken,
    ) -> Call {
        let stream = self.events.as_ref().map(|events| {
            RunStream::start(events.clone(), record.task_id.clone(), record.fence, self.metrics.clone())
        });
        let saving = self.config.lane(record.lane).checkpoint_every.map(|every| {
            let (store, clock, metrics) = (self.store.clone(), self.clock.clone(), self.metrics.clone());
            let (task, fence, lane) = (record.task_id.clone(), record.fence, record.lane.as_str());
            Checkpoints::start(Saving { store, clock, metrics, task, fence, lane }, every)
        });
        let both = Both(stream.as_ref().map(|s| s as &dyn DeltaSink), saving.as_ref().map(|s| s as _));
        let sink = both.any().then_some(&both as &dyn DeltaSink);
        let call = tokio::select! {
            biased;
            _ = lost.cancelled() => Call::LeaseLost,
            _ = cancelled.cancelled() => Call::Cancelled,
            r = self.llm.call(request, sink) => Call::Answered(Box::new(r)),
        };
        // The run's end ends its saving: the final write removes what it saved.
        drop(saving);
        let Some(stream) = stream else { return call };
        match &call {
            Call::LeaseLost => stream.stop("the run's lease was lost; another worker takes the task over"),
            Call::Cancelled => stream.stop("cancelled by its client"),
            Call::Answered(answer) => {
                if let Err(e) = answer.as_ref() {
                    stream.stop(e.client_reason());
                }
            }
        }
        stream.close().await;
        call
    }
}

/// The writing end of one run's stream.
pub struct RunStream {
    tx: mpsc::UnboundedSender<RunEvent>,
    publisher: tokio::task::JoinHandle<()>,
    run: u64,
    /// Whether text was given since the last restart (a restart with nothing to void is a retry).
    spoke: AtomicBool,
}

impl RunStream {
    /// Starts the stream of `task`'s run `run` (its claim's fence) with a `running` event.
    pub fn start(events: Arc<dyn EventLog>, task: TaskId, run: u64, metrics: Metrics) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(RunEvent::Running { run });
        let publisher = tokio::spawn(publish(events, task, rx, metrics));
        Self { tx, publisher, run, spoke: AtomicBool::new(false) }
    }

    /// Ends the run's stream without an answer (`reason`, fit for the client).
    pub fn stop(&self, reason: &str) {
        let _ = self.tx.send(RunEvent::Stopped { run: self.run, reason: reason.to_owned() });
    }

    /// Waits (at most [`CLOSE_LIMIT`]) for what was given to be appended.
    pub async fn close(self) {
        let Self { tx, publisher, .. } = self;
        drop(tx);
        if tokio::time::timeout(CLOSE_LIMIT, publisher).await.is_err() {
            tracing::warn!("the run's last events were not appended in time; its readers get the answer");
        }
    }
}

impl DeltaSink for RunStream {
    fn delta(&self, text: &str) {
        self.spoke.store(true, Ordering::Relaxed);
        let _ = self.tx.send(RunEvent::Delta { run: self.run, text: text.to_owned() });
    }

    fn restart(&self, reason: &str) {
        let (run, reason) = (self.run, reason.to_owned());
        let event = match self.spoke.swap(false, Ordering::Relaxed) {
            true => RunEvent::Restart { run, reason },
            false => RunEvent::Retrying { run, reason },
        };
        let _ = self.tx.send(event);
    }
}

/// Appends what the run gives, in order, a batch per round trip.
async fn publish(
    events: Arc<dyn EventLog>,
    task: TaskId,
    mut rx: mpsc::UnboundedReceiver<RunEvent>,
    metrics: Metrics,
) {
    // The text since the last restart, to give again after a failed append.
    let (mut said, mut gap) = (String::new(), false);
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while let Ok(next) = rx.try_recv() {
            if let Some(last) = batch.last_mut()
                && let Some(unmerged) = last.merge(next)
            {
                batch.push(unmerged);
            }
        }
        for e in &batch {
            match e {
                RunEvent::Delta { text, .. } => said.push_str(text),
                RunEvent::Restart { .. } => said.clear(),
                _ => {}
            }
        }
        if gap {
            let run = batch[0].run();
            let reason = "the stream missed some text; it starts again".to_owned();
            let mut healed = vec![RunEvent::Restart { run, reason }];
            if !said.is_empty() {
                healed.push(RunEvent::Delta { run, text: said.clone() });
            }
            healed.extend(
                batch.into_iter().filter(|e| !matches!(e, RunEvent::Delta { .. } | RunEvent::Restart { .. })),
            );
            batch = healed;
        }
        match events.append(&task, &batch).await {
            Ok(_) => gap = false,
            Err(e) => {
                tracing::warn!(error = %e, "run events not appended; the stream is healed at the next append");
                metrics.degraded_operations_total.with_label_values(&["events"]).inc();
                gap = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::domain::events::EventId;
    use crate::embedded::MemoryEvents;
    use crate::ports::CacheError;
    use async_trait::async_trait;
    use std::sync::atomic::AtomicU32;

    /// The in-process log, failing its second append.
    struct FailsOnce {
        inner: MemoryEvents,
        appends: AtomicU32,
    }

    #[async_trait]
    impl EventLog for FailsOnce {
        async fn append(&self, task: &TaskId, events: &[RunEvent]) -> Result<EventId, CacheError> {
            if self.appends.fetch_add(1, Ordering::SeqCst) == 1 {
                return Err(CacheError::Unavailable("injected".into()));
            }
            self.inner.append(task, events).await
        }
        async fn read(
            &self,
            task: &TaskId,
            after: Option<EventId>,
            limit: usize,
            wait: Duration,
        ) -> Result<Vec<(EventId, RunEvent)>, CacheError> {
            self.inner.read(task, after, limit, wait).await
        }
    }

    /// What a client shows from the events: the text of the last segment, restarts applied.
    fn shown(events: &[(EventId, RunEvent)]) -> String {
        let mut text = String::new();
        for (_, e) in events {
            match e {
                RunEvent::Delta { text: t, .. } => text.push_str(t),
                RunEvent::Restart { .. } | RunEvent::Running { .. } => text.clear(),
                RunEvent::Stopped { .. } | RunEvent::Retrying { .. } => {}
            }
        }
        text
    }

    #[tokio::test]
    async fn a_failed_append_is_healed_by_the_next_so_no_character_is_lost() {
        let log = Arc::new(FailsOnce {
            inner: MemoryEvents::new(Arc::new(SystemClock)),
            appends: AtomicU32::new(0),
        });
        let task = TaskId::parse(&"a".repeat(64)).unwrap_or_else(|e| panic!("{e}"));
        let stream = RunStream::start(log.clone(), task.clone(), 1, Metrics::new());
        for piece in ["one ", "two ", "three"] {
            tokio::time::sleep(Duration::from_millis(30)).await;
            stream.delta(piece);
        }
        stream.close().await;
        let events = log.read(&task, None, 100, Duration::ZERO).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(shown(&events), "one two three", "{events:?}");
        assert!(events.iter().any(|(_, e)| matches!(e, RunEvent::Restart { .. })), "the gap was said");
    }

    #[tokio::test]
    async fn a_restart_is_said_only_after_text_and_a_retry_before_it() {
        let log = Arc::new(MemoryEvents::new(Arc::new(SystemClock)));
        let task = TaskId::parse(&"b".repeat(64)).unwrap_or_else(|e| panic!("{e}"));
        let stream = RunStream::start(log.clone(), task.clone(), 2, Metrics::new());
        stream.restart("nothing to void");
        stream.delta("half");
        stream.restart("the provider failed; calling again");
        stream.delta("whole");
        stream.close().await;
        let events = log.read(&task, None, 100, Duration::ZERO).await.unwrap_or_else(|e| panic!("{e}"));
        let restarts = events.iter().filter(|(_, e)| matches!(e, RunEvent::Restart { .. })).count();
        assert_eq!((restarts, shown(&events)), (1, "whole".to_owned()));
        assert_eq!(events[0].1, RunEvent::Running { run: 2 });
        assert_eq!(events[1].1, RunEvent::Retrying { run: 2, reason: "nothing to void".into() });
    }
}

//! The embedded twin of [`Admission`]: a new task's record and its message in one write
//! transaction of the shared redb file, so one group commit makes both durable (or neither), and a
//! submission waits for one flush, not two.

use super::{EmbeddedQueue, EmbeddedStore};
use crate::domain::TaskRecord;
use crate::ports::{Admission, Admitted, Message, PutOutcome, StoreError};
use async_trait::async_trait;

/// Admission on the embedded store and queues (of the same database).
#[derive(Debug, Clone)]
pub struct EmbeddedAdmission {
    store: EmbeddedStore,
    queues: [EmbeddedQueue; 3],
}

impl EmbeddedAdmission {
    /// On `store`, sending to `queues` (by [`crate::domain::Lane::index`]). They must be of one
    /// [`super::EmbeddedDb`]: the two writes share its transaction.
    pub fn new(store: EmbeddedStore, queues: [EmbeddedQueue; 3]) -> Self {
        Self { store, queues }
    }
}

#[async_trait]
impl Admission for EmbeddedAdmission {
    async fn admit(
        &self,
        record: &TaskRecord,
        now_ms: u64,
        message: Message,
    ) -> Result<Admitted, StoreError> {
        let (body, attributes) = message;
        let put = self.store.put_pending_job(record, now_ms);
        let queue = &self.queues[record.lane.index()];
        // The message is written only if the put writes, which it does exactly when it creates.
        match queue.send_with(&body, attributes, put).await? {
            (Ok(PutOutcome::Created), Some(id)) => Ok(Admitted::Sent(id)),
            (Ok(PutOutcome::Exists(live)), None) => Ok(Admitted::Exists(live)),
            (Err(e), _) => Err(e),
            (Ok(_), _) => Err(StoreError::Corrupt("a put and its message disagreed".into())),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::domain::{Lane, TaskRequest};
    use crate::embedded::{EmbeddedDb, EmbeddedQueues, QueueSettings};
    use crate::ports::{QueueConsume, TaskStore};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    async fn open(dir: &std::path::Path) -> (EmbeddedDb, EmbeddedStore, EmbeddedAdmission, EmbeddedQueue) {
        let db = EmbeddedDb::open(dir).unwrap();
        let store = EmbeddedStore::new(db.clone());
        let queues =
            EmbeddedQueues::open(db.clone(), Arc::new(SystemClock), QueueSettings::default()).await.unwrap();
        let lanes = Lane::ALL.map(|l| queues.queue(l.as_str(), "dlq"));
        let interactive = lanes[Lane::Interactive.index()].clone();
        (db, store.clone(), EmbeddedAdmission::new(store, lanes), interactive)
    }

    fn record(now: u64) -> TaskRecord {
        let body =
            serde_json::json!({"project_id":"p","kind":"explain","prompt":"one write","target_files":[]});
        let request = TaskRequest::from_value(body).unwrap();
        TaskRecord::pending(request.task_id(None), request, now, 3600)
    }

    #[tokio::test]
    async fn the_record_and_its_message_take_one_commit_and_a_duplicate_takes_none() {
        let dir = tempfile::tempdir().unwrap();
        let (db, store, admission, queue) = open(dir.path()).await;
        let now = crate::clock::Clock::now_ms(&SystemClock);
        let message = || ("body".to_owned(), BTreeMap::new());
        let before = db.commits();
        assert!(matches!(admission.admit(&record(now), now, message()).await.unwrap(), Admitted::Sent(_)));
        assert_eq!(db.commits(), before + 1, "the put and the send share one commit");
        assert!(matches!(admission.admit(&record(now), now, message()).await.unwrap(), Admitted::Exists(_)));
        assert_eq!(db.commits(), before + 1, "a refused put flushes nothing");
        assert_eq!(store.all(now).await.unwrap().len(), 1);
        assert_eq!(queue.depth().await.unwrap().visible, 1, "and sends nothing");
    }

    #[tokio::test]
    async fn an_admitted_task_and_its_message_are_in_the_file_when_admit_returns() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::clock::Clock::now_ms(&SystemClock);
        let task = record(now);
        {
            let (_db, _store, admission, _queue) = open(dir.path()).await;
            admission.admit(&task, now, ("body".into(), BTreeMap::new())).await.unwrap();
        }
        let (_db, store, _admission, queue) = open(dir.path()).await;
        assert_eq!(store.get(&task.task_id, now).await.unwrap().map(|r| r.nonce), Some(task.nonce));
        let got = queue.receive(10).await.unwrap();
        assert_eq!(got.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["body"]);
    }
}

//! The admission port ([`Admission`]): a new task's `PENDING` record put and, when the put creates
//! it, its message sent to its lane. [`PutThenSend`] composes the store and queue ports, two
//! requests one after the other; a backend that keeps both in one database does both in one write.

use super::{PutOutcome, QueueError, QueueSend, StoreError, TaskStore};
use crate::domain::{MessageId, TaskRecord};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What an admission came to.
#[derive(Debug)]
pub enum Admitted {
    /// The record was created and its message sent.
    Sent(MessageId),
    /// The record was created and the send failed: the caller marks the record unsent, so that the
    /// next read or retry sends it.
    Unsent(QueueError),
    /// A live record exists (a duplicate, or a conflicting payload): here it is; nothing was sent.
    Exists(Box<TaskRecord>),
}

/// A task's message: its body and attributes.
pub type Message = (String, BTreeMap<String, String>);

/// Puts a new task's record and sends its message.
#[async_trait]
pub trait Admission: Send + Sync {
    /// [`TaskStore::put_pending`] of `record` at `now_ms`, and the send of `message` to the queue
    /// of `record.lane` only when the put created the record. An `Err` means nothing was created.
    async fn admit(&self, record: &TaskRecord, now_ms: u64, message: Message)
    -> Result<Admitted, StoreError>;
}

/// Admission as two requests: the put, then (once it created the record) the send. A crash or a
/// failed send between the two leaves a `PENDING` record without a message, which the enqueue
/// grace re-sends.
#[derive(Clone)]
pub struct PutThenSend {
    store: Arc<dyn TaskStore>,
    queues: [Arc<dyn QueueSend>; 3],
}

impl PutThenSend {
    /// On `store`, sending to `queues` (by [`crate::domain::Lane::index`]).
    pub fn new(store: Arc<dyn TaskStore>, queues: [Arc<dyn QueueSend>; 3]) -> Self {
        Self { store, queues }
    }
}

#[async_trait]
impl Admission for PutThenSend {
    async fn admit(
        &self,
        record: &TaskRecord,
        now_ms: u64,
        message: Message,
    ) -> Result<Admitted, StoreError> {
        match self.store.put_pending(record, now_ms).await? {
            PutOutcome::Exists(live) => Ok(Admitted::Exists(live)),
            PutOutcome::Created => {
                let (body, attributes) = message;
                Ok(match self.queues[record.lane.index()].send(&body, attributes).await {
                    Ok(id) => Admitted::Sent(id),
                    Err(e) => Admitted::Unsent(e),
                })
            }
        }
    }
}

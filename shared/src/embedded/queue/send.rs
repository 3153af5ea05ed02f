//! Sending: a message is made durable, then put in memory, where receives see it. Alone
//! ([`QueueSend::send`]), or in the same write transaction as another port's write
//! ([`EmbeddedQueue::send_with`]), so that the two become durable together or not at all.

use super::{EmbeddedQueue, Entry, MESSAGES, StoredMessage};
use crate::domain::MessageId;
use crate::ports::{QueueError, QueueSend};
use async_trait::async_trait;
use redb::WriteTransaction;
use std::collections::BTreeMap;

impl EmbeddedQueue {
    /// Runs `first` in a write transaction and, only if it wrote, writes a message of `body` and
    /// `attributes` in the same transaction; answers `first`'s answer and, when the message was
    /// written, its id. An `Err` from `first` fails the transaction (see [`super::EmbeddedDb`]).
    pub(crate) async fn send_with<T, E, F>(
        &self,
        body: &str,
        mut attributes: BTreeMap<String, String>,
        first: F,
    ) -> Result<(T, Option<MessageId>), E>
    where
        T: Send + 'static,
        E: Send + 'static + From<String>,
        F: FnOnce(&WriteTransaction) -> Result<(T, bool), E> + Send + 'static,
    {
        let now = self.queues.clock.now_ms();
        let id = MessageId::fresh();
        attributes.insert("SentTimestamp".into(), now.to_string());
        let mut state = self.queues.state.lock().await;
        let seq = state.next_seq;
        state.next_seq += 1; // reserved: a write that fails or is not made leaves a harmless gap
        let stored = StoredMessage {
            queue: self.name.clone(),
            seq,
            body: body.to_owned(),
            attributes,
            sent_at_ms: now,
            receive_count: 0,
        };
        let bytes = serde_json::to_vec(&stored).map_err(|e| E::from(format!("queue message: {e}")))?;
        let entry = Entry::new(id.clone(), stored, 0);
        let key = id.to_string();
        // Queued under the state lock, so the file sees this queue's writes in the order memory
        // does; durable before it is in memory, so nothing can see it before: the lock is not held
        // while the write commits.
        let written = self.queues.db.submit_maybe(move |txn| -> Result<((T, bool), bool), E> {
            let (answer, wrote) = first(txn)?;
            if wrote {
                let mut table = txn.open_table(MESSAGES).map_err(|e| E::from(e.to_string()))?;
                table.insert(key.as_str(), bytes.as_slice()).map_err(|e| E::from(e.to_string()))?;
            }
            Ok(((answer, wrote), wrote))
        });
        drop(state);
        // Waiting and publishing run in their own task: a caller that gives up (a client hanging
        // up) cannot leave a durable message missing from memory.
        let (queues, name) = (self.queues.clone(), self.name.clone());
        let published = tokio::spawn(async move {
            let (answer, sent) = written.wait().await?;
            if sent {
                queues.state.lock().await.queue(&name).insert(entry);
                queues.shown.notify_waiters();
            }
            Ok::<_, E>((answer, sent.then_some(id)))
        });
        published.await.map_err(|e| E::from(format!("send task: {e}")))?
    }
}

#[async_trait]
impl QueueSend for EmbeddedQueue {
    async fn send(&self, body: &str, attributes: BTreeMap<String, String>) -> Result<MessageId, QueueError> {
        // Durable first: a send that returns Ok must survive a crash.
        let ((), id) = self.send_with(body, attributes, |_txn| Ok::<_, QueueError>(((), true))).await?;
        id.ok_or_else(|| QueueError::Unavailable("the message was not written".into()))
    }
}

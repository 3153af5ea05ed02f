//! The twin of SQS's message move task (`StartMessageMoveTask`): a DLQ's visible messages back to
//! their source queue as fresh deliveries, in one persisted batch, with a task that reports them.

use super::{EmbeddedQueue, Entry, put_op};
use crate::ports::{MoveTask, QueueError};

impl EmbeddedQueue {
    /// Moves every visible message of this DLQ back to its source queue (one persistence batch,
    /// written before memory changes); returns the move task's handle.
    pub(super) async fn move_back(&self) -> Result<String, QueueError> {
        let Some(source) = self.source.clone() else {
            return Err(QueueError::Rejected(format!("{} is not a DLQ handle", self.name)));
        };
        let now = self.queues.clock.now_ms();
        let mut state = self.queues.state.lock().await;
        let visible: Vec<u64> = state.queues.get_mut(&self.name).map(|q| q.visible(now)).unwrap_or_default();
        let mut moved = Vec::with_capacity(visible.len());
        for (n, seq) in visible.iter().enumerate() {
            let Some(entry) = state.queues.get(&self.name).and_then(|q| q.get(*seq)) else { continue };
            let mut stored = entry.stored.clone();
            stored.queue = source.clone();
            stored.seq = state.next_seq + n as u64;
            stored.receive_count = 0;
            // As SQS does: a moved message is enqueued anew, so the DLQ sweep's guard (a record no
            // newer than the message) holds for it if it dead-letters again.
            stored.sent_at_ms = now;
            stored.attributes.insert("SentTimestamp".into(), now.to_string());
            moved.push((*seq, Entry::new(entry.id.clone(), stored, 0)));
        }
        // Same ids: each put replaces the DLQ row, so the move is one atomic write.
        let ops = moved.iter().map(|(_, e)| put_op(e)).collect::<Result<Vec<_>, _>>()?;
        self.queues.persist(ops).wait().await?;
        state.next_seq += visible.len() as u64;
        let count = moved.len() as u64;
        for (old_seq, entry) in moved {
            if let Some(e) = state.queues.get_mut(&self.name).and_then(|q| q.remove(old_seq))
                && let Some(r) = e.receipt
            {
                state.receipts.remove(&r);
            }
            state.queue(&source).insert(entry);
        }
        let handle = uuid::Uuid::new_v4().to_string();
        let task = MoveTask {
            handle: None,
            status: "COMPLETED".into(),
            moved: count,
            to_move: Some(count),
            failure_reason: None,
            started_at_ms: now,
        };
        state.moves.push((self.name.clone(), task));
        Ok(handle)
    }
}

//! Embedded queues with SQS semantics: visibility timeout, `ChangeMessageVisibility`, an
//! `ApproximateReceiveCount`, redrive to a DLQ after `maxReceiveCount`, receipts that go stale on
//! redelivery. Messages are kept in the redb file, so a crash loses none; visibility is not persisted
//! (after a restart every message is visible at once, as after a crashed consumer's lease).

use super::db::{EmbeddedDb, Pending};
use crate::clock::SharedClock;
use crate::domain::MessageId;
use crate::ports::{
    DEAD_LETTER_REASON, DEAD_LETTER_SOURCE, MoveTask, QueueConsume, QueueDepth, QueueError, ReceivedMessage,
};
use async_trait::async_trait;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

mod entry;
mod messages;
mod move_task;
mod order;
mod poll;
mod send;
mod settings;

use entry::{Entry, StoredMessage, put_op, received};
use messages::Messages;
pub use order::DeliveryOrder;
use settings::MAX_DELAY;
pub use settings::QueueSettings;

const MESSAGES: TableDefinition<&str, &[u8]> = TableDefinition::new("queue_messages");

impl From<String> for QueueError {
    fn from(s: String) -> Self {
        QueueError::Unavailable(s)
    }
}

fn unavailable(e: impl std::fmt::Display) -> QueueError {
    QueueError::Unavailable(e.to_string())
}

#[derive(Debug)]
struct State {
    order: DeliveryOrder,
    next_seq: u64,
    queues: HashMap<String, Messages>,
    receipts: HashMap<String, (String, u64)>,
    /// Move tasks of this process by DLQ name, newest last (not persisted: SQS keeps them for a
    /// while only).
    moves: Vec<(String, MoveTask)>,
}

impl State {
    fn new(order: DeliveryOrder) -> Self {
        Self { order, next_seq: 0, queues: HashMap::new(), receipts: HashMap::new(), moves: Vec::new() }
    }

    /// Queue `name`'s messages, an empty queue if it has none yet.
    fn queue(&mut self, name: &str) -> &mut Messages {
        let order = self.order;
        self.queues.entry(name.to_owned()).or_insert_with(|| Messages::new(order))
    }
}

enum Op {
    Put(String, Vec<u8>),
    Delete(String),
}

/// All embedded queues of one data dir.
pub struct EmbeddedQueues {
    db: EmbeddedDb,
    clock: SharedClock,
    settings: QueueSettings,
    state: Mutex<State>,
    /// Woken whenever a message may have become visible now (a send, a requeue or a visibility set
    /// to zero), so a long poll answers at once instead of at its next look.
    shown: tokio::sync::Notify,
}

impl std::fmt::Debug for EmbeddedQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedQueues").field("settings", &self.settings).finish()
    }
}

impl EmbeddedQueues {
    /// Opens the queues kept in `db`, reloading every message a previous process left.
    pub async fn open(
        db: EmbeddedDb,
        clock: SharedClock,
        settings: QueueSettings,
    ) -> Result<Arc<Self>, QueueError> {
        let loaded: Vec<(MessageId, StoredMessage)> = db
            .run(|db| {
                let txn = db.begin_read().map_err(unavailable)?;
                let table = match txn.open_table(MESSAGES) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(unavailable(e)),
                };
                let mut out = Vec::new();
                for row in table.iter().map_err(unavailable)? {
                    let (k, v) = row.map_err(unavailable)?;
                    let stored: StoredMessage = serde_json::from_slice(v.value())
                        .map_err(|e| QueueError::Rejected(format!("corrupt queue message: {e}")))?;
                    let id = MessageId::parse(k.value())
                        .map_err(|e| QueueError::Rejected(format!("corrupt queue message id: {e}")))?;
                    out.push((id, stored));
                }
                Ok(out)
            })
            .await?;
        let mut state = State::new(settings.order);
        for (id, stored) in loaded {
            state.next_seq = state.next_seq.max(stored.seq + 1);
            let entry = Entry::new(id, stored, 0);
            state.queue(&entry.stored.queue.clone()).insert(entry);
        }
        Ok(Arc::new(Self {
            db,
            clock,
            settings,
            state: Mutex::new(state),
            shown: tokio::sync::Notify::new(),
        }))
    }

    /// A handle on queue `name`, whose DLQ is `dlq`.
    pub fn queue(self: &Arc<Self>, name: &str, dlq: &str) -> EmbeddedQueue {
        EmbeddedQueue { queues: self.clone(), name: name.to_owned(), dlq: dlq.to_owned(), source: None }
    }

    /// Queues `ops` as one atomic write, in call order (see [`EmbeddedDb::submit`]): done under the
    /// state lock, so the file sees the queue's changes in the order memory does. Hot paths then
    /// release the lock before waiting, so their writes share a commit.
    fn persist(&self, ops: Vec<Op>) -> Pending<(), QueueError> {
        if ops.is_empty() {
            // An empty receive (an idle poller's) writes nothing and so flushes nothing.
            return EmbeddedDb::answered(Ok(()));
        }
        self.db.submit(move |txn| {
            let mut table = txn.open_table(MESSAGES).map_err(unavailable)?;
            for op in &ops {
                match op {
                    Op::Put(id, bytes) => {
                        table.insert(id.as_str(), bytes.as_slice()).map_err(unavailable)?;
                    }
                    Op::Delete(id) => {
                        table.remove(id.as_str()).map_err(unavailable)?;
                    }
                }
            }
            Ok(())
        })
    }
}

/// One embedded queue (with its DLQ).
#[derive(Debug, Clone)]
pub struct EmbeddedQueue {
    queues: Arc<EmbeddedQueues>,
    name: String,
    dlq: String,
    /// On a DLQ handle: the queue its messages came from (where a move task sends them back).
    source: Option<String>,
}

impl EmbeddedQueue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A handle on this queue's DLQ.
    pub fn dead_letter_queue(&self) -> EmbeddedQueue {
        EmbeddedQueue {
            queues: self.queues.clone(),
            name: self.dlq.clone(),
            dlq: self.dlq.clone(),
            source: Some(self.name.clone()),
        }
    }

    /// Bodies and attributes of every message, visible or not (inspection of a DLQ).
    pub async fn peek_all(&self) -> Vec<(String, BTreeMap<String, String>)> {
        let state = self.queues.state.lock().await;
        state
            .queues
            .get(&self.name)
            .map(|q| q.values().map(|e| (e.stored.body.clone(), e.stored.attributes.clone())).collect())
            .unwrap_or_default()
    }

    /// The body and first send time of the message whose current delivery `receipt` is, if it is
    /// one (inspection: the lifecycle simulation reads what an ack is about to delete).
    pub async fn peek_receipt(&self, receipt: &str) -> Option<(String, u64)> {
        let state = self.queues.state.lock().await;
        let (queue, seq) = state.receipts.get(receipt)?;
        let entry = state.queues.get(queue)?.get(*seq)?;
        Some((entry.stored.body.clone(), entry.stored.sent_at_ms))
    }

    /// Moves an entry to the DLQ inside a held state lock; returns the persistence op.
    fn move_to_dlq(&self, state: &mut State, seq: u64, reason: &str) -> Result<Option<Op>, QueueError> {
        let Some(mut entry) = state.queues.get_mut(&self.name).and_then(|q| q.remove(seq)) else {
            return Ok(None);
        };
        if let Some(r) = entry.receipt.take() {
            state.receipts.remove(&r);
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        entry.stored.queue = self.dlq.clone();
        entry.stored.seq = seq;
        entry.stored.attributes.insert(DEAD_LETTER_REASON.into(), reason.to_owned());
        entry.stored.attributes.insert(DEAD_LETTER_SOURCE.into(), self.name.clone());
        entry.visible_at_ms = 0;
        let op = put_op(&entry)?;
        state.queue(&self.dlq).insert(entry);
        Ok(Some(op))
    }

    fn lookup(state: &State, receipt: &str) -> Result<(String, u64), QueueError> {
        state.receipts.get(receipt).cloned().ok_or(QueueError::ReceiptInvalid)
    }
}

#[async_trait]
impl QueueConsume for EmbeddedQueue {
    async fn receive_waiting(
        &self,
        max: usize,
        visibility: Option<Duration>,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        poll::receive_waiting(self, max, visibility, wait).await
    }

    async fn receive_for(
        &self,
        max: usize,
        visibility: Option<Duration>,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        let now = self.queues.clock.now_ms();
        let settings = self.queues.settings;
        let mut state = self.queues.state.lock().await;
        let Some(mut turns) = state.queues.get_mut(&self.name).map(|q| q.turns(now)) else {
            return Ok(Vec::new());
        };
        let mut ops = Vec::new();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(q) = state.queues.get_mut(&self.name) else { break };
            let Some(seq) = q.next_turn(&mut turns) else { break };
            let over = q.get(seq).is_some_and(|e| e.stored.receive_count >= settings.max_receive_count)
                // A DLQ has no redrive of its own (as in SQS): peeking it never moves anything.
                && self.name != self.dlq;
            if over {
                let reason = format!("maxReceiveCount ({}) exceeded", settings.max_receive_count);
                ops.extend(self.move_to_dlq(&mut state, seq, &reason)?);
                continue;
            }
            let receipt = uuid::Uuid::new_v4().to_string();
            let visible_at = now + visibility.unwrap_or(settings.default_visibility).as_millis() as u64;
            let Some(leased) = q.update(seq, |entry| {
                let old = entry.receipt.replace(receipt.clone());
                entry.stored.receive_count += 1;
                entry.visible_at_ms = visible_at;
                put_op(entry).map(|op| (op, received(entry, &receipt, visibility), old))
            }) else {
                continue;
            };
            let (op, message, old) = leased?;
            q.delivered(seq);
            ops.push(op);
            out.push(message);
            if let Some(old) = old {
                state.receipts.remove(&old);
            }
            state.receipts.insert(receipt, (self.name.clone(), seq));
        }
        // Memory is updated and the write queued under the lock; waiting for the commit is not.
        // Should the write fail, the messages are made visible again at once (their receive
        // counts, raised in memory only, stay raised: a poison message still reaches the DLQ).
        let written = self.queues.persist(ops);
        drop(state);
        if let Err(e) = written.wait().await {
            let mut state = self.queues.state.lock().await;
            for m in &out {
                if let Some((queue, seq)) = state.receipts.remove(&m.receipt)
                    && let Some(q) = state.queues.get_mut(&queue)
                {
                    q.update(seq, |entry| {
                        entry.visible_at_ms = 0;
                        entry.receipt = None;
                    });
                }
            }
            return Err(e);
        }
        Ok(out)
    }

    async fn change_visibility(&self, receipt: &str, timeout: Duration) -> Result<(), QueueError> {
        let now = self.queues.clock.now_ms();
        let mut state = self.queues.state.lock().await;
        let (queue, seq) = Self::lookup(&state, receipt)?;
        let q = state.queues.get_mut(&queue).ok_or(QueueError::ReceiptInvalid)?;
        // A deleted message is out of memory with its receipt: a renewal racing the ack finds
        // neither, so it cannot show a message whose delete is committing.
        let shown = q
            .update(seq, |entry| {
                entry.visible_at_ms = now + timeout.as_millis() as u64;
                entry.visible_at_ms <= now
            })
            .ok_or(QueueError::ReceiptInvalid)?;
        if shown {
            self.queues.shown.notify_waiters();
        }
        Ok(())
    }

    /// Settles the delivery without waiting for its write to be durable. Memory forgets the message
    /// and its receipt at once, so no receive hands it out again while the process runs; should the
    /// write fail, it comes back when the lease it had runs out. A crash before the commit brings it
    /// back once, as SQS too may deliver a deleted message again. A delete is always of work
    /// already durable (the worker awaits its final write before it acks), and workers take a
    /// delivery of a finished task as a duplicate and ack it. A slot so waits for two flushes a
    /// task (claim, final write), not three.
    async fn delete(&self, receipt: &str) -> Result<(), QueueError> {
        let mut state = self.queues.state.lock().await;
        let (queue, seq) = Self::lookup(&state, receipt)?;
        let Some(entry) = state.queues.get_mut(&queue).and_then(|q| q.remove(seq)) else {
            return Err(QueueError::ReceiptInvalid);
        };
        state.receipts.remove(receipt);
        let written = self.queues.persist(vec![Op::Delete(entry.id.to_string())]);
        drop(state);
        // Only a weak handle: a queue dropped meanwhile (its process closing) has no memory to
        // put the message back into, and must not keep the file open.
        let queues = Arc::downgrade(&self.queues);
        tokio::spawn(async move {
            let Err(e) = written.wait().await else { return };
            let Some(queues) = queues.upgrade() else { return };
            tracing::warn!(error = %e, message_id = %entry.id, "delete not written; the message returns");
            // As it was: hidden until its lease ends, its receipt spent.
            queues.state.lock().await.queue(&queue).insert(entry);
            queues.shown.notify_waiters();
        });
        Ok(())
    }

    async fn requeue(&self, message: &ReceivedMessage, delay: Duration) -> Result<(), QueueError> {
        let now = self.queues.clock.now_ms();
        let delay = delay.min(MAX_DELAY);
        let mut state = self.queues.state.lock().await;
        let (queue, seq) = Self::lookup(&state, &message.receipt)?;
        let Some(old) = state.queues.get(&queue).and_then(|q| q.get(seq)) else {
            return Err(QueueError::ReceiptInvalid);
        };
        let new_seq = state.next_seq;
        let mut stored = old.stored.clone();
        stored.seq = new_seq;
        stored.receive_count = 0;
        stored.sent_at_ms = now;
        stored.attributes.insert("SentTimestamp".into(), now.to_string());
        let copy = Entry::new(MessageId::fresh(), stored, now + delay.as_millis() as u64);
        // One persistence batch: the copy and the delete land together or not at all.
        self.queues.persist(vec![put_op(&copy)?, Op::Delete(old.id.to_string())]).wait().await?;
        state.next_seq += 1;
        state.receipts.remove(&message.receipt);
        if let Some(q) = state.queues.get_mut(&queue) {
            q.remove(seq);
            q.insert(copy);
        }
        if delay.is_zero() {
            self.queues.shown.notify_waiters();
        }
        Ok(())
    }

    async fn dead_letter(&self, message: &ReceivedMessage, reason: &str) -> Result<(), QueueError> {
        let mut state = self.queues.state.lock().await;
        let (_, seq) = Self::lookup(&state, &message.receipt)?;
        let ops: Vec<Op> = self.move_to_dlq(&mut state, seq, reason)?.into_iter().collect();
        self.queues.persist(ops).wait().await
    }

    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        let now = self.queues.clock.now_ms();
        let mut state = self.queues.state.lock().await;
        let Some(counts) = state.queues.get_mut(&self.name).map(|q| q.counts(now)) else {
            return Ok(QueueDepth::default());
        };
        Ok(QueueDepth {
            visible: counts.visible as u64,
            in_flight: counts.in_flight as u64,
            oldest_age_ms: counts.oldest_sent_at.map_or(0, |at| now.saturating_sub(at)),
        })
    }

    fn max_receive_count(&self) -> u32 {
        self.queues.settings.max_receive_count
    }

    /// Moves every visible message back to the source queue at once (one persistence batch, written
    /// before memory changes), as fresh deliveries: what an SQS move task does over time. In-flight
    /// messages stay, as in SQS.
    async fn start_move_back(&self) -> Result<String, QueueError> {
        self.move_back().await
    }

    /// This DLQ's move tasks, newest first.
    async fn move_tasks(&self) -> Result<Vec<MoveTask>, QueueError> {
        let state = self.queues.state.lock().await;
        Ok(state.moves.iter().rev().filter(|(dlq, _)| *dlq == self.name).map(|(_, t)| t.clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::domain::fairness::GROUP_ATTRIBUTE;
    use crate::ports::QueueSend;

    async fn open(dir: &std::path::Path, clock: Arc<ManualClock>) -> EmbeddedQueue {
        let db = EmbeddedDb::open(dir).unwrap();
        let settings = QueueSettings {
            default_visibility: Duration::from_millis(1_000),
            max_receive_count: 2,
            ..Default::default()
        };
        EmbeddedQueues::open(db, clock, settings).await.unwrap().queue("q", "q-dlq")
    }

    #[tokio::test]
    async fn a_groups_backlog_waits_behind_other_groups_unless_the_order_is_fifo() {
        for (order, want_b) in [(DeliveryOrder::Fair, 3), (DeliveryOrder::Fifo, 0)] {
            let dir = tempfile::tempdir().unwrap();
            let db = EmbeddedDb::open(dir.path()).unwrap();
            let settings = QueueSettings { order, ..Default::default() };
            let q = EmbeddedQueues::open(db, ManualClock::new(1_000), settings)
                .await
                .unwrap()
                .queue("q", "q-dlq");
            let group = |g: &str| BTreeMap::from([(GROUP_ATTRIBUTE.to_owned(), g.to_owned())]);
            for i in 0..50 {
                q.send(&format!("a{i}"), group("a")).await.unwrap();
            }
            q.send("b0", group("b")).await.unwrap();
            q.send("b1", group("b")).await.unwrap();
            // The first receive alternates; then, with three of a's and two of b's in flight, b's new
            // message goes first.
            let first = bodies(q.receive(5).await.unwrap());
            q.send("b2", group("b")).await.unwrap();
            let second = bodies(q.receive(3).await.unwrap());
            let b = first.iter().chain(&second).filter(|m| m.starts_with('b')).count();
            assert_eq!(b, want_b, "{order:?}: {first:?} then {second:?}");
            if order == DeliveryOrder::Fair {
                assert_eq!(first, ["a0", "b0", "a1", "b1", "a2"], "round-robin, oldest first in each group");
                assert_eq!(second, ["b2", "a3", "a4"], "the group with fewer in flight goes first");
            }
        }
    }

    #[tokio::test]
    async fn a_tie_goes_to_the_group_delivered_to_least_recently_not_to_the_older_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(dir.path(), ManualClock::new(1_000)).await;
        let group = |g: &str| BTreeMap::from([(GROUP_ATTRIBUTE.to_owned(), g.to_owned())]);
        for i in 0..10 {
            q.send(&format!("a{i}"), group("a")).await.unwrap();
        }
        q.send("b0", group("b")).await.unwrap();
        q.send("b1", group("b")).await.unwrap();
        // a's first task runs and ends: neither group has anything in flight, and a's head is older.
        let first = q.receive(1).await.unwrap().remove(0);
        assert_eq!(first.body, "a0");
        q.delete(&first.receipt).await.unwrap();
        assert_eq!(bodies(q.receive(1).await.unwrap()), ["b0"], "b has waited since a's turn");
        assert_eq!(bodies(q.receive(2).await.unwrap()), ["a1", "b1"]);
    }

    #[tokio::test]
    async fn visibility_receive_count_and_redrive() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(10_000);
        let q = open(dir.path(), clock.clone()).await;
        q.send("m1", BTreeMap::new()).await.unwrap();
        let first = q.receive(10).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].receive_count, 1);
        assert!(q.receive(10).await.unwrap().is_empty(), "invisible while leased");
        assert_eq!(q.depth().await.unwrap(), QueueDepth { visible: 0, in_flight: 1, oldest_age_ms: 0 });

        // A short lease made by ChangeMessageVisibility.
        q.change_visibility(&first[0].receipt, Duration::from_millis(100)).await.unwrap();
        clock.advance_ms(100);
        let second = q.receive(10).await.unwrap();
        assert_eq!(second[0].receive_count, 2);
        assert_eq!(
            q.change_visibility(&first[0].receipt, Duration::ZERO).await.err().map(|e| e.to_string()),
            Some(QueueError::ReceiptInvalid.to_string()),
            "the first delivery's receipt is stale"
        );
        q.change_visibility(&second[0].receipt, Duration::ZERO).await.unwrap();
        // Third receive exceeds maxReceiveCount = 2: redriven to the DLQ.
        assert!(q.receive(10).await.unwrap().is_empty());
        let dlq = q.dead_letter_queue().peek_all().await;
        assert_eq!(dlq.len(), 1);
        assert_eq!(dlq[0].0, "m1");
        assert!(dlq[0].1[DEAD_LETTER_REASON].contains("maxReceiveCount"));
    }

    #[tokio::test]
    async fn a_poller_receives_straight_into_a_short_lease() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(10_000);
        let q = open(dir.path(), clock.clone()).await;
        q.send("m", BTreeMap::new()).await.unwrap();
        assert_eq!(q.receive_for(1, Some(Duration::from_millis(50))).await.unwrap().len(), 1);
        clock.advance_ms(49);
        assert!(q.receive(1).await.unwrap().is_empty());
        clock.advance_ms(1);
        assert_eq!(q.receive(1).await.unwrap().len(), 1, "back after the lease, not the 1 s default");
    }

    #[tokio::test]
    async fn a_long_poll_answers_when_a_message_is_shown_not_at_its_next_look() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        // A poll would look again only after an hour: only the wake-up can answer it in time.
        let settings = QueueSettings { look_again: Duration::from_secs(3_600), ..Default::default() };
        let queues = EmbeddedQueues::open(db, ManualClock::new(10_000), settings).await.unwrap();
        let q = Arc::new(queues.queue("q", "q-dlq"));
        let poll = |q: Arc<EmbeddedQueue>| {
            tokio::spawn(async move { q.receive_waiting(1, None, Duration::from_secs(3_600)).await })
        };
        let first = poll(q.clone());
        // Parked on its first, empty look.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!first.is_finished());
        q.send("m", BTreeMap::new()).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), first).await.expect("woken by the send");
        let message = got.unwrap().unwrap().pop().unwrap();
        // In flight for 900 s: a new poll waits, until the message is requeued with no delay.
        let second = poll(q.clone());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!second.is_finished());
        q.requeue(&message, Duration::ZERO).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), second).await.expect("woken by the requeue");
        let message = got.unwrap().unwrap().pop().unwrap();
        // And by a visibility set to zero.
        let third = poll(q.clone());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!third.is_finished());
        q.change_visibility(&message.receipt, Duration::ZERO).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), third).await.expect("woken by the release");
        assert_eq!(got.unwrap().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn delete_dead_letter_and_restart() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(10_000);
        {
            let q = open(dir.path(), clock.clone()).await;
            for body in ["a", "b", "c"] {
                q.send(body, BTreeMap::new()).await.unwrap();
            }
            let got = q.receive(2).await.unwrap();
            assert_eq!(got.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["a", "b"]);
            q.delete(&got[0].receipt).await.unwrap();
            assert!(q.delete(&got[0].receipt).await.is_err());
            q.dead_letter(&got[1], "undecodable: expected value").await.unwrap();
        }
        // A new process: "c" survives and is visible at once; "b" is in the DLQ with its reason.
        let q = open(dir.path(), clock.clone()).await;
        let got = q.receive(10).await.unwrap();
        assert_eq!(got.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["c"]);
        let dlq = q.dead_letter_queue().peek_all().await;
        assert_eq!(dlq.len(), 1);
        assert_eq!(dlq[0].1[DEAD_LETTER_REASON], "undecodable: expected value");
    }

    fn bodies(messages: Vec<ReceivedMessage>) -> Vec<String> {
        messages.into_iter().map(|m| m.body).collect()
    }

    /// Deletes `receipt`, failing the test if the delete waits for its commit (the writer may be
    /// held: a delete that waited would hang).
    async fn delete_unwaited(q: &EmbeddedQueue, receipt: &str) {
        tokio::time::timeout(Duration::from_secs(30), q.delete(receipt))
            .await
            .expect("the delete waited for its commit")
            .unwrap();
    }

    /// Holds the writer thread inside a job until the returned sender is dropped or sent to.
    /// Returns once the job runs, so its group is formed: every write after it waits, and those
    /// queued meanwhile share the next group.
    fn hold_the_writer(q: &EmbeddedQueue) -> std::sync::mpsc::Sender<()> {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (running, started) = std::sync::mpsc::channel::<()>();
        let held = q.queues.db.submit(move |_txn| {
            let _ = running.send(());
            let _ = wait.recv();
            Ok::<(), QueueError>(())
        });
        drop(held); // its answer is not needed
        started.recv_timeout(Duration::from_secs(30)).expect("the writer never ran the holding job");
        go
    }

    #[tokio::test]
    async fn a_delete_is_answered_before_its_write_commits_and_hides_the_message_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(10_000);
        {
            let q = open(dir.path(), clock.clone()).await;
            for body in ["a", "b"] {
                q.send(body, BTreeMap::new()).await.unwrap();
            }
            let got = q.receive(1).await.unwrap();
            let go = hold_the_writer(&q);
            // Nothing can commit while the writer is held.
            delete_unwaited(&q, &got[0].receipt).await;
            assert!(q.delete(&got[0].receipt).await.is_err(), "the receipt is spent at once");
            // A receive writes (and waits for) the receive counts: the writer must go on first.
            go.send(()).unwrap();
            clock.advance_ms(3_600_000);
            assert_eq!(
                bodies(q.receive(10).await.unwrap()),
                ["b"],
                "the deleted message is never handed out again"
            );
        }
        // Dropping the last handle lets the writer finish what it holds: the delete is in the file.
        let q = open(dir.path(), clock.clone()).await;
        let left: Vec<String> = q.peek_all().await.into_iter().map(|(body, _)| body).collect();
        assert_eq!(left, ["b"]);
    }

    #[tokio::test]
    async fn a_delete_whose_write_fails_returns_the_message_when_its_lease_ends() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(10_000);
        let q = open(dir.path(), clock.clone()).await;
        q.send("a", BTreeMap::new()).await.unwrap();
        let got = q.receive_for(1, Some(Duration::from_millis(500))).await.unwrap();
        let go = hold_the_writer(&q);
        delete_unwaited(&q, &got[0].receipt).await;
        // A job queued after the delete, in the same group, fails: the group is abandoned.
        let failing =
            q.queues.db.submit(|_txn| Err::<(), QueueError>(QueueError::Unavailable("disk".into())));
        go.send(()).unwrap();
        assert!(failing.wait().await.is_err());
        // Back in memory once the delete's task has heard of the failure...
        tokio::time::timeout(Duration::from_secs(30), async {
            while q.peek_all().await.is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the message never came back");
        // ...hidden for the rest of its lease, then delivered again.
        clock.advance_ms(499);
        assert!(q.receive(1).await.unwrap().is_empty(), "hidden for the rest of its lease");
        clock.advance_ms(1);
        let back = q.receive(1).await.unwrap();
        assert_eq!(back.iter().map(|m| (m.body.as_str(), m.receive_count)).collect::<Vec<_>>(), [("a", 2)]);
    }
}

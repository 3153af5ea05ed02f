//! One queued message: what the file keeps of it ([`StoredMessage`]) and what memory adds
//! ([`Entry`]: its lease, and its group and order read from its attributes once).

use super::{Op, unavailable};
use crate::domain::MessageId;
use crate::domain::fairness::{GROUP_ATTRIBUTE, Priority};
use crate::ports::{QueueError, ReceivedMessage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredMessage {
    pub(super) queue: String,
    pub(super) seq: u64,
    pub(super) body: String,
    pub(super) attributes: BTreeMap<String, String>,
    pub(super) sent_at_ms: u64,
    pub(super) receive_count: u32,
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) id: MessageId,
    pub(super) stored: StoredMessage,
    pub(super) visible_at_ms: u64,
    pub(super) receipt: Option<String>,
    /// Its group and the time it is ordered as, read from its attributes once.
    pub(super) group: Arc<str>,
    pub(super) order_at: u64,
}

impl Entry {
    pub(super) fn new(id: MessageId, stored: StoredMessage, visible_at_ms: u64) -> Self {
        let group = Arc::from(stored.attributes.get(GROUP_ATTRIBUTE).map_or("", String::as_str));
        let order_at = Priority::of_attributes(&stored.attributes).order_at(stored.sent_at_ms);
        Self { id, stored, visible_at_ms, receipt: None, group, order_at }
    }
}

/// What a receive hands back for `entry`, leased under `receipt`.
pub(super) fn received(entry: &Entry, receipt: &str, visibility: Option<Duration>) -> ReceivedMessage {
    ReceivedMessage {
        message_id: entry.id.clone(),
        receipt: receipt.to_owned(),
        body: entry.stored.body.clone(),
        receive_count: entry.stored.receive_count,
        sent_at_ms: entry.stored.sent_at_ms,
        attributes: entry.stored.attributes.clone(),
        leased_for: visibility,
        leased_at: visibility.map(|_| tokio::time::Instant::now()),
    }
}

pub(super) fn put_op(entry: &Entry) -> Result<Op, QueueError> {
    Ok(Op::Put(entry.id.to_string(), serde_json::to_vec(&entry.stored).map_err(unavailable)?))
}

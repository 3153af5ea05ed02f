//! The order a queue twin delivers its visible messages in: the twin of SQS's fair queues
//! (round-robin across groups, [`fair_order`]), or oldest first for comparison.

use super::Entry;
use crate::domain::fairness::{GROUP_ATTRIBUTE, Priority, Ready, fair_order};
use std::collections::{BTreeMap, HashMap};

/// The order in which a queue delivers its visible messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeliveryOrder {
    /// Across groups as SQS's fair queues do ([`fair_order`]): a group's backlog cannot starve
    /// another group.
    #[default]
    Fair,
    /// Oldest first whatever the group or priority: what a queue without fairness does (kept for
    /// `lanes bench fairness` to compare against).
    Fifo,
}

/// The visible messages of a queue, in the order they are to be delivered.
pub(super) fn ready(q: &BTreeMap<u64, Entry>, now: u64, order: DeliveryOrder) -> Vec<u64> {
    fn group(e: &Entry) -> &str {
        e.stored.attributes.get(GROUP_ATTRIBUTE).map_or("", String::as_str)
    }
    let mut prioritized = false;
    let visible: Vec<Ready> = q
        .values()
        .filter(|e| e.visible_at_ms <= now)
        .map(|e| {
            let priority = Priority::of_attributes(&e.stored.attributes);
            prioritized |= !priority.is_normal();
            Ready { seq: e.stored.seq, order_at: priority.order_at(e.stored.sent_at_ms), group: group(e) }
        })
        .collect();
    if order == DeliveryOrder::Fifo {
        return visible.into_iter().map(|r| r.seq).collect();
    }
    // One group (a single tenant) at one priority is oldest first, as FIFO: no need to count what
    // is in flight.
    let one_group = visible.first().is_none_or(|first| visible.iter().all(|r| r.group == first.group));
    if one_group && !prioritized {
        return visible.into_iter().map(|r| r.seq).collect();
    }
    let mut in_flight: HashMap<&str, usize> = HashMap::new();
    for e in q.values().filter(|e| e.visible_at_ms > now && e.receipt.is_some()) {
        *in_flight.entry(group(e)).or_default() += 1;
    }
    fair_order(visible, &in_flight)
}

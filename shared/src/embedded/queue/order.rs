//! The order a queue twin delivers its visible messages in: the twin of SQS's fair queues
//! (round-robin across groups, [`fair_order`](crate::domain::fairness::fair_order)), or oldest first for comparison.

/// The order in which a queue delivers its visible messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeliveryOrder {
    /// Across groups as SQS's fair queues do ([`fair_order`](crate::domain::fairness::fair_order)): a group's backlog cannot starve
    /// another group.
    #[default]
    Fair,
    /// Oldest first whatever the group or priority: what a queue without fairness does (kept for
    /// `lanes bench fairness` to compare against).
    Fifo,
}

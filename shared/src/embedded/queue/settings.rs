//! The settings every embedded queue of a data dir shares, as an SQS queue's attributes.

use super::DeliveryOrder;
use std::time::Duration;

/// Settings shared by every embedded queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueSettings {
    /// The queue's default visibility timeout (kept long, as in SQS; the worker shortens it).
    pub default_visibility: Duration,
    /// The redrive policy's `maxReceiveCount`.
    pub max_receive_count: u32,
    /// The order visible messages are delivered in.
    pub order: DeliveryOrder,
    /// How often a long poll looks again for a message whose timeout or delay ran out (one that is
    /// sent, requeued or shown wakes it at once).
    pub look_again: Duration,
}

impl Default for QueueSettings {
    /// Receives are not attempts (those are counted in the task record), so the redrive only has to
    /// catch poison and crash loops: ten deliveries, as the template's default.
    fn default() -> Self {
        Self {
            default_visibility: Duration::from_secs(900),
            max_receive_count: 10,
            order: DeliveryOrder::Fair,
            look_again: Duration::from_millis(50),
        }
    }
}

/// SQS's longest `DelaySeconds`.
pub(super) const MAX_DELAY: Duration = Duration::from_secs(900);

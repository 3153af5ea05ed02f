//! The embedded queue's long poll: it answers the moment a message is shown (sent, requeued with no
//! delay, or released: `EmbeddedQueues::shown`), and a message whose timeout or delay runs out is
//! seen at the next look ([`super::QueueSettings::look_again`]).

use super::EmbeddedQueue;
use crate::ports::{QueueConsume, QueueError, ReceivedMessage};
use std::time::Duration;

/// Receives up to `max` messages, waiting up to `wait` for one.
pub(super) async fn receive_waiting(
    queue: &EmbeddedQueue,
    max: usize,
    visibility: Option<Duration>,
    wait: Duration,
) -> Result<Vec<ReceivedMessage>, QueueError> {
    let until = tokio::time::Instant::now() + wait;
    loop {
        // Registered before looking, so a message shown between the look and the wait wakes it.
        let shown = queue.queues.shown.notified();
        tokio::pin!(shown);
        shown.as_mut().enable();
        let got = queue.receive_for(max, visibility).await?;
        let now = tokio::time::Instant::now();
        if !got.is_empty() || now >= until {
            return Ok(got);
        }
        let look_again = (until - now).min(queue.queues.settings.look_again);
        tokio::select! {
            _ = shown => {}
            _ = tokio::time::sleep(look_again) => {}
        }
    }
}

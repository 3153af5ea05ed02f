//! The trace context that follows a task across the queue: X-Ray's trace header (`Root=…;Parent=…;
//! Sampled=…`) of the request that created it, sent with its message as SQS's `AWSTraceHeader`
//! system attribute, which Lambda's SQS integration uses to join the worker's invocation to the same
//! trace. The workers record it in each message's span, so every log line of a task carries it.
//!
//! Why a task-local rather than a parameter: the header belongs to the request being served, and the
//! send happens several calls below the handler (and in a GET's re-send of an orphaned task); a
//! task-local scoped around the request reaches it without threading it through every signature,
//! and outside a request there is simply none.

use std::future::Future;

/// The attribute the trace header travels in: an SQS system attribute; a plain attribute on the
/// embedded queue.
pub const TRACE_HEADER: &str = "AWSTraceHeader";

tokio::task_local! {
    static CURRENT: Option<String>;
}

/// Runs `f` with `header` as the current trace context.
pub async fn scope<F: Future>(header: Option<String>, f: F) -> F::Output {
    CURRENT.scope(header.filter(|h| is_valid(h)), f).await
}

/// The current trace header, inside [`scope`].
pub fn current() -> Option<String> {
    CURRENT.try_with(Clone::clone).ok().flatten()
}

/// Whether `header` looks like an X-Ray trace header: `Root=1-…` first, printable ASCII, at most
/// 256 bytes (what SQS accepts for `AWSTraceHeader`), so a malformed one is dropped, never sent.
pub fn is_valid(header: &str) -> bool {
    header.starts_with("Root=1-") && header.len() <= 256 && header.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_header_is_seen_inside_its_scope_only() {
        let h = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1".to_owned();
        assert_eq!(current(), None);
        let seen = scope(Some(h.clone()), async { current() }).await;
        assert_eq!(seen, Some(h));
        assert_eq!(scope(Some("Root=1-x; DROP".into()), async { current() }).await, None, "invalid: dropped");
        assert_eq!(scope(Some("x".repeat(300)), async { current() }).await, None);
        assert_eq!(current(), None);
    }
}

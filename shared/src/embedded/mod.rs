//! Embedded adapters: the local twins of SQS, DynamoDB, S3, Redis and Lambda's event source
//! mappings. The queue and the stores live in one redb file under the data dir, so accepted work
//! survives a `kill -9`; large results are files beside it; lock, cache and mappings are in-process.

mod admission;
mod batches;
mod cache;
mod db;
mod deliveries;
mod events;
mod expiring;
mod lock;
mod mappings;
mod objects;
mod queue;
mod store;
mod summaries;

pub use admission::EmbeddedAdmission;
pub use batches::EmbeddedBatches;
pub use cache::MemoryCache;
pub use db::{DbOpenError, EmbeddedDb};
pub use events::MemoryEvents;
pub use lock::MemoryLock;
#[cfg(test)]
pub(crate) use lock::ScriptedLock;
pub use mappings::MemoryMappings;
pub use objects::FileObjects;
pub use queue::{DeliveryOrder, EmbeddedQueue, EmbeddedQueues, QueueSettings};
pub use store::EmbeddedStore;
pub use summaries::EmbeddedSummaries;

/// A redb error as the stores answer it: unavailable (retryable), with the error's text.
fn unavailable(e: impl std::fmt::Display) -> crate::ports::StoreError {
    crate::ports::StoreError::Unavailable(e.to_string())
}

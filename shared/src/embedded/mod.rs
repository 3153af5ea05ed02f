//! Embedded adapters: the local twins of SQS, DynamoDB and Redis. The queue and the store live in one
//! redb file under the data dir, so accepted work survives a `kill -9`; lock and cache are in-process.

mod cache;
mod db;
mod lock;
mod queue;
mod store;
mod summaries;

pub use cache::MemoryCache;
pub use db::{DbOpenError, EmbeddedDb};
pub use lock::MemoryLock;
pub use queue::{DEAD_LETTER_REASON, DEAD_LETTER_SOURCE, EmbeddedQueue, EmbeddedQueues, QueueSettings};
pub use store::EmbeddedStore;
pub use summaries::EmbeddedSummaries;

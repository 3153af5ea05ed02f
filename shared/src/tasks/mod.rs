//! The task flow, shaped like [`crate::commits`]: the HTTP side that accepts, answers, cancels and
//! long-polls ([`ingress`]; the wait itself is [`poll`]'s) for the caller it authenticated
//! ([`tenant`]), with the views and problems it answers ([`answers`]); the worker that runs one
//! message from claim to the fenced final write ([`worker`], with how a run ends in `finish`, its
//! events as it runs in [`stream`], and its text saved for a takeover to continue in [`checkpoint`]); and what the hot cache holds for
//! them ([`cache`]); a result too large for a record is kept in the results store
//! ([`large_results`]). A new task's hold on its day's budgets, from ingress to its end, is `hold`'s; its group's share of the lane in tokens is [`share`]'s, and its place under its tenant's concurrency cap `cap`'s. What makes two submissions one is [`crate::idempotency`]'s; the request and
//! the record it becomes, with its transition table, are vocabulary the ports share
//! ([`crate::domain::request`], [`crate::domain::task`], [`crate::domain::lifecycle`]).

pub mod answers;
pub mod batches;
pub mod cache;
mod cap;
pub mod checkpoint;
pub mod collect;
pub mod enqueue;
pub mod events;
mod finish;
mod hold;
pub mod ingress;
pub mod large_results;
pub mod poll;
pub mod share;
pub mod stream;
pub mod tenant;
pub mod worker;

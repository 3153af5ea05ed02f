//! The task flow, shaped like [`crate::commits`]: the idempotency key of what a client sends
//! ([`key`]), the HTTP side that accepts, answers, cancels and long-polls ([`ingress`]) for the
//! caller it authenticated ([`tenant`]), and the worker that runs one message from claim to the
//! fenced final write ([`worker`]), and what the hot cache holds for them ([`cache`]). The request and the record it becomes, with its transition table,
//! are vocabulary the ports share ([`crate::domain::request`], [`crate::domain::task`],
//! [`crate::domain::lifecycle`]).

pub mod cache;
pub mod ingress;
pub mod key;
pub mod tenant;
pub mod worker;

pub use key::{is_task_id, validate_idempotency_key};

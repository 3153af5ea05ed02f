//! The task flow, shaped like [`crate::commits`]: what a client sends ([`request`]), its idempotency
//! key ([`key`]), the durable record and its state machine ([`record`]), the HTTP side that accepts,
//! answers, cancels and long-polls ([`ingress`]) for the caller it authenticated ([`tenant`]), and the
//! worker that runs one message from claim to
//! the fenced final write ([`worker`]).

pub mod ingress;
pub mod key;
pub mod record;
pub mod request;
pub mod tenant;
pub mod worker;

pub use key::{is_task_id, validate_idempotency_key};
pub use record::{TaskMessage, TaskRecord, TaskResult, TaskStatus, TaskView};
pub use request::{MAX_BODY_BYTES, ModelParams, TaskRequest};

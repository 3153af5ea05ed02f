//! Glue between Lambda events and the core, shared by `functions/*`, in three parts:
//! [`startup`] (cold-start assembly from the environment), [`handlers`] (the controller's and the
//! worker's per-container state and invocation) and [`batch`] (SQS records to deliveries, outcomes,
//! and the partial-batch response).

pub mod batch;
pub mod handlers;
pub mod startup;

pub use batch::*;
pub use handlers::*;
pub use startup::*;

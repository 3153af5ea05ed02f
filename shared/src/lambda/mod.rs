//! Glue between Lambda events and the core, shared by `functions/*`, in four parts:
//! [`startup`] (cold-start assembly from the environment), [`handlers`] (the controller's and the
//! worker's per-container state and invocation), [`batch`] (SQS records to deliveries, outcomes,
//! and the partial-batch response) and [`deadline`] (HTTP requests bounded by the invocation's).

pub mod batch;
pub mod deadline;
pub mod handlers;
pub mod startup;

pub use batch::*;
pub use handlers::*;
pub use startup::*;

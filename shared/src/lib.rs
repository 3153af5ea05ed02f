//! # lanes-core
//!
//! All of Lanes' logic. The Lambda functions and the `lanes` CLI are thin shells over this crate: they
//! read configuration, build adapters once, and hand events to the code here.
//!
//! # Layout
//!
//! - [`domain`]: kinds and lanes, request validation, the canonical idempotency key, the task record
//!   and its state machine. Pure.
//! - [`clock`]: time as a port, so leases and TTLs are testable without sleeping.
//! - [`ports`]: the small traits the core depends on (queue send/consume, task store, lease lock,
//!   cache, LLM client), each error carrying retry intent.
//! - [`embedded`]: local adapters for every port: queues and store in one redb file, in-process lock
//!   and cache.
//! - [`adapters`]: the production adapters: SQS, DynamoDB, Redis/Valkey (the only SDK users).
//! - [`backend`]: builds one backend's adapters once per process, from the environment or for `--create`.
//! - [`llm`]: LLM providers (offline, OpenAI-compatible, Anthropic) and the retry policy.
//! - [`limiter`]: the shared RPM/TPM limiter with lane reservations (in process and in Redis).
//! - [`ingress`]: the task API as an axum router (`POST /v1/tasks`, `GET /v1/tasks/{id}`, `/healthz`).
//! - [`lease`]: a delivery's lease: its start, the heartbeat (visibility and lock together), the hold
//!   of a message waiting for a slot, ack / hand-back / requeue / dead-letter and the backoff. The
//!   only module, besides the queue adapters, that changes a message's visibility.
//! - [`worker`]: one task message from claim to the fenced final write: attempts, waits, age,
//!   cancellation.
//! - [`dlq`]: the sweep that marks the records of dead-lettered tasks `FAILED`, and the redrive.
//! - [`pool`]: the weighted allocation policy and the in-process pool that runs workers with it.
//! - [`metrics`]: Prometheus registry with per-lane metrics.
//! - [`problem`]: RFC 9457 problem+json responses.
//! - [`config`]: tunables with defaults and their validation.
//! - [`controller`]: the per-minute concurrency controller over the lanes' event source mappings.
//! - [`commits`]: the commit-summary flow: webhook, diff sources, diff budget, micro-batching, the
//!   commits worker, the read API and `lanes summarize`.
//! - [`local`]: `lanes dev`: everything above wired together in one process, on either backend.
//! - [`lambda`]: cold-start configuration and Lambda events to the core (used by `functions/*`):
//!   the ingress router, the SQS batch handler with its partial failures and deadline hand-back.

pub mod adapters;
pub mod backend;
pub mod bench;
pub mod clock;
pub mod commits;
pub mod config;
pub mod controller;
pub mod dlq;
pub mod domain;
pub mod embedded;
pub mod ingress;
pub mod lambda;
pub mod lease;
pub mod limiter;
pub mod llm;
pub mod local;
pub mod metrics;
pub mod pool;
pub mod ports;
pub mod problem;
pub mod worker;

pub use tokio_util::sync::CancellationToken;

/// Human-readable logs for the CLI, level from `RUST_LOG` (default `info`).
pub fn init_cli_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

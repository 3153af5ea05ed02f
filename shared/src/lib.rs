//! # lanes-core
//!
//! All of Lanes' logic. The Lambda functions and the `lanes` CLI are thin shells over this crate: they
//! read configuration, build adapters once, and hand events to the code here.
//!
//! # Layout
//!
//! From the bottom up; docs/ARCHITECTURE.md (Dependency rule) draws the layers and says why:
//!
//! - [`domain`]: the vocabulary both flows and the ports share: lanes, kinds, token counts, the
//!   task request and its validation ([`domain::request`]), the task record ([`domain::task`])
//!   and its transition table ([`domain::lifecycle`]), commit messages and summaries, and the
//!   identifiers, each its own type checked once where it enters ([`domain::ids`]). Pure.
//! - [`idempotency`]: what makes two submissions one in both flows (the task key and its canonical
//!   form, the lookup's order, the duplicate's outcome, commit and delivery keys). Pure.
//! - [`tasks`]: the task flow: [`tasks::ingress`] (the HTTP API, per [`tasks::tenant`]; its sends
//!   and re-sends in [`tasks::enqueue`]), [`tasks::worker`] (claim to fenced write), a group's token
//!   share of its lane ([`tasks::share`]) and what the hot cache holds for them ([`tasks::cache`]).
//! - [`clock`]: time as a port, so leases and TTLs are testable without sleeping; [`jitter`]: the
//!   randomness of delays, seedable per thread so a simulation replays it.
//! - [`config`]: tunables with defaults, per-lane policies, and their validation.
//! - [`http`]: the process's one outbound HTTPS client (providers, Git hosts), built once.
//! - [`secret`]: a secret read when first needed, re-read when old or when a check with it fails
//!   (rotation), single-flight; the reading itself is Secrets Manager's, in [`adapters`].
//! - [`ports`]: one small trait per capability (queue send/consume, task store, summary store, lease
//!   lock, cache, LLM client, diff source), errors carrying retry intent, and shared constants.
//! - [`embedded`]: the twin of every port: queues and stores in one redb file, in-process lock and
//!   cache.
//! - [`adapters`]: SQS, DynamoDB, Redis/Valkey (lock, cache, limiter scripts), Lambda mappings,
//!   Bedrock, Secrets Manager, the SDK clients' TLS roots. The only modules that name an SDK crate.
//! - [`metrics`], [`problem`], [`query`]: Prometheus/EMF metrics; RFC 9457 problem+json responses
//!   (the framework's own rejections too); the query strings the routes take.
//! - [`openapi`]: the OpenAPI 3.1 document of every route, generated from the handlers and types.
//! - [`trace`]: the X-Ray trace header a task's message carries from ingress to its worker.
//! - [`lease`]: a delivery's lease: start, the batch heartbeat, the queue view that settles through
//!   it (deletes left to Lambda's event source mapping), ack / hand-back / requeue / dead-letter,
//!   backoff, release and hide. The only module besides the queue adapters and their twins that
//!   changes a message's visibility.
//! - [`limiter`]: the RPM/TPM decision with lane reservations (pure) and the in-process limiter.
//! - [`quota`]: budgets per tenant and project: a day held per new task, minutes per call.
//! - [`llm`]: providers (offline, OpenAI-compatible, Anthropic), the retry policy, per-lane routes
//!   with their fallback, and the price table.
//! - [`pool`]: the weighted allocation (pure) and the in-process pool that runs workers with it.
//! - [`commits`]: the commit flow: webhook (with the owners' secrets), diff sources (fetched by
//!   repository id once the host names it), diff budget, prompt, worker, read API (per reader).
//! - [`dlq`]: the sweep that settles the records behind dead-lettered task messages; list and
//!   redrive (relayed, or by the queue's own move task).
//! - [`dlq_admin`]: the DLQ operations of every lane, by lane, for `lanes dev` and `lanes dlq`.
//! - [`running`]: running invocations per lane, registered by the workers with leases in the cache.
//! - [`controller`]: mapping concurrency from queue depth and running work, every minute.
//! - [`wiring`]: one process's adapters, from the environment or created for `--create`.
//! - [`local`]: `lanes dev`, everything wired in one process; [`summarize`]: `lanes summarize`.
//! - [`lambda`]: Lambda events to the core (used by `functions/*`): cold-start assembly
//!   ([`lambda::startup`]), the controller's and worker's per-container state and invocations
//!   ([`lambda::handlers`]), the SQS batch plumbing with its partial failures and deadline
//!   hand-back ([`lambda::batch`]), and HTTP requests bounded by the invocation's deadline
//!   ([`lambda::deadline`]).

pub mod adapters;
pub mod clock;
pub mod commits;
pub mod config;
pub mod controller;
pub mod dlq;
pub mod dlq_admin;
pub mod domain;
pub mod embedded;
pub mod http;
pub mod idempotency;
pub mod jitter;
pub mod lambda;
pub mod lease;
pub mod limiter;
pub mod llm;
pub mod local;
pub mod metrics;
pub mod openapi;
pub mod pool;
pub mod ports;
pub mod problem;
pub mod query;
pub mod quota;
pub mod running;
pub mod secret;
pub mod summarize;
pub mod tasks;
pub mod trace;
pub mod wiring;

pub use tokio_util::sync::CancellationToken;

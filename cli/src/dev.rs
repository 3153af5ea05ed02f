//! `lanes dev`: the whole system in one process on embedded defaults (or on SQS, DynamoDB and Redis).

use crate::CliError;
use clap::Args;
use lanes_core::CancellationToken;
use lanes_core::local::{DevBackend, DevOptions, Local};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `lanes dev`'s flags.
#[derive(Args)]
pub struct DevArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// Directory of the embedded database.
    #[arg(long, default_value = ".lanes")]
    data_dir: PathBuf,
    /// Worker slots shared by the lanes (70% interactive, 30% background).
    #[arg(long, default_value_t = 10)]
    capacity: usize,
    /// Simulated offline-provider latency for interactive tasks, in ms.
    #[arg(long, default_value_t = 200)]
    interactive_latency_ms: u64,
    /// Simulated offline-provider latency for synthesis tasks, in ms.
    #[arg(long, default_value_t = 2000)]
    synthesis_latency_ms: u64,
    /// Lease TTL in ms (visibility and lock); the heartbeat renews at a third of it.
    #[arg(long, default_value_t = 15_000)]
    lease_ttl_ms: u64,
    /// How often a synthesis run saves its text for a takeover to continue, in ms (0 for never);
    /// default `LANES_CHECKPOINT_SECS`, else 5 s.
    #[arg(long)]
    checkpoint_ms: Option<u64>,
    /// `embedded` (a file in the data dir) or `aws` (SQS, DynamoDB, Redis; endpoint from
    /// AWS_ENDPOINT_URL, Redis from REDIS_URL).
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "aws"])]
    backend: String,
    /// With `--backend aws`: create the queues (lanes-<lane>, with DLQs) and the table (lanes-tasks).
    #[arg(long)]
    create: bool,
    /// The queues' maxReceiveCount (embedded, or with `--backend aws --create`). Receives are not
    /// attempts: only crash loops and poison reach the DLQ.
    #[arg(long, default_value_t = 10)]
    max_receive_count: u32,
    /// The queues' own (default) visibility timeout in seconds, when created. Kept long, as Lambda
    /// requires; the worker's lease is what makes redelivery fast.
    #[arg(long, default_value_t = 900)]
    queue_visibility_secs: u64,
    /// How often the task lanes' DLQs are swept (records of dead-lettered tasks marked FAILED).
    #[arg(long, default_value_t = 30)]
    dlq_sweep_secs: u64,
    /// How often expired records, delivery marks and past days' push counts are deleted from the
    /// embedded store (DynamoDB's TTL does it on AWS).
    #[arg(long, default_value_t = 60)]
    expiry_sweep_secs: u64,
    /// How often the provider batches' collector reads the open batches (when a lane's route has a
    /// batch endpoint).
    #[arg(long, default_value_t = 2)]
    batch_collect_secs: u64,
    /// Keep task records this long after their last write (default: 15 days finished, the queues'
    /// retention and a day pending). Shorter than the retention, a message that waits longer finds
    /// its record gone and its task reads as not found: for soaks and demos.
    #[arg(long, value_name = "SECS")]
    record_ttl_secs: Option<u64>,
    /// Serve tasks per tenant, taking the tenant from this header (set by a trusted local proxy): ids,
    /// reads, cancellations and long-polls are scoped to it, and a request without it is a 401.
    /// Without the flag, one tenant.
    #[arg(long, value_name = "NAME")]
    tenant_header: Option<String>,
    /// Listen on a non-loopback `--addr`: the task API, the DLQ admin routes and `/metrics` are
    /// then open to the network with no authentication.
    #[arg(long)]
    allow_remote: bool,
}

/// Serves until Ctrl-C.
pub async fn run(args: DevArgs) -> Result<(), CliError> {
    let DevArgs {
        addr,
        data_dir,
        capacity,
        interactive_latency_ms,
        synthesis_latency_ms,
        lease_ttl_ms,
        checkpoint_ms,
        backend,
        create,
        max_receive_count,
        queue_visibility_secs,
        dlq_sweep_secs,
        expiry_sweep_secs,
        batch_collect_secs,
        record_ttl_secs,
        tenant_header,
        allow_remote,
    } = args;
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(CliError::Usage(format!(
            "--addr {addr} is not a loopback address: lanes dev serves every task and its DLQ admin \
             routes without authentication; pass --allow-remote to expose them anyway"
        )));
    }
    let backend = match backend.as_str() {
        "aws" => DevBackend::Aws { create, aws: Default::default() },
        _ if create => return Err(CliError::Usage("--create needs --backend aws".into())),
        _ => DevBackend::Embedded,
    };
    let mut opts = DevOptions { addr, data_dir, capacity, backend, ..DevOptions::default() };
    opts.queue.max_receive_count = max_receive_count;
    opts.queue.default_visibility = Duration::from_secs(queue_visibility_secs);
    opts.offline_latency[0] = Duration::from_millis(interactive_latency_ms);
    opts.offline_latency[1] = Duration::from_millis(synthesis_latency_ms);
    opts.worker = opts.worker.with_lease(Duration::from_millis(lease_ttl_ms)).lanes_from_env()?;
    if let Some(ms) = checkpoint_ms {
        opts.worker.lanes[lanes_core::domain::Lane::Synthesis.index()].checkpoint_every =
            (ms > 0).then(|| Duration::from_millis(ms));
    }
    opts.worker.quota = lanes_core::quota::priced_by_routes(opts.worker.quota)?;
    opts.ingress = lanes_core::config::IngressConfig::from_env()?;
    opts.ingress.quota = opts.worker.quota;
    opts.dlq_sweep_interval = Duration::from_secs(dlq_sweep_secs.max(1));
    opts.expiry_sweep_interval = Duration::from_secs(expiry_sweep_secs.max(1));
    opts.batch_collect_interval = Duration::from_secs(batch_collect_secs.max(1));
    if let Some(ttl) = record_ttl_secs {
        opts.worker.record_ttl_secs = ttl.max(1);
        opts.ingress.pending_ttl_secs = ttl.max(1);
        // A cached finished task never outlives its record.
        let ttl = Duration::from_secs(ttl.max(1));
        opts.worker.result_cache_ttl = opts.worker.result_cache_ttl.min(ttl);
        opts.ingress.result_cache_ttl = opts.ingress.result_cache_ttl.min(ttl);
    }
    if let Some(name) = tenant_header {
        let header = reqwest::header::HeaderName::try_from(name.as_str())
            .map_err(|_| CliError::Usage(format!("--tenant-header `{name}` is not a valid header name")))?;
        opts.tenancy = lanes_core::tasks::tenant::Tenancy::Header(header);
    }
    let local = Local::build(&opts).await?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.cancel();
        }
    });
    Ok(local.serve(&opts, shutdown).await?)
}

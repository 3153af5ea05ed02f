//! Provider batches in a history (some histories put the commits lane at tier `batch`): the
//! batch records behind the store's faults, the provider's batch endpoint (the offline twin, run by
//! a model that counts each commit it answers as a paid call) behind faults of its own, and the
//! controller's collectors. The same histories batch the synthesis tasks that opt in with
//! `params.deadline_s`. What it adds to the checks: a commit's delivery, or a parked task's, may be
//! acked while a batch's record owns it (I5); every commit of an accepted push still ends
//! summarized, in at most one paid call, or in the DLQ (I6); every accepted task still ends (I1),
//! its batch's answer written unless the run was cancelled or given back (I9), in at most one paid
//! call a run, plus one where a run was given back with its batch still answering (I2), whatever
//! crashes and lost answers fall between a submission and its record.

use crate::faults::*;
use crate::history::World;
use async_trait::async_trait;
use lanes_core::domain::batch::{BatchPhase, BatchRecord, Carrier};
use lanes_core::embedded::EmbeddedBatches;
use lanes_core::llm::OfflineBatches;
use lanes_core::ports::*;
use std::collections::HashMap;
use std::sync::Arc;

/// The batch records behind the store's faults.
pub struct FaultyBatches {
    /// The twin.
    pub inner: EmbeddedBatches,
    /// Chaos and process.
    pub ctx: Ctx,
}

#[async_trait]
impl BatchStore for FaultyBatches {
    async fn create_batch(&self, r: &BatchRecord) -> Result<bool, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "batch.create", &r.key).await?;
        let out = self.inner.create_batch(r).await;
        self.ctx.post(d, "batch.create", &r.key, out).await
    }
    async fn update_batch(&self, r: &BatchRecord, expect: BatchPhase) -> Result<bool, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "batch.update", &r.key).await?;
        let out = self.inner.update_batch(r, expect).await;
        self.ctx.post(d, "batch.update", &r.key, out).await
    }
    async fn open_batches(&self, limit: usize) -> Result<Vec<BatchRecord>, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "batch.open", "").await?;
        let out = self.inner.open_batches(limit).await;
        self.ctx.post(d, "batch.open", "", out).await
    }
    async fn batched(&self, keys: &[String]) -> Result<HashMap<String, Carrier>, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "batch.batched", "").await?;
        let out = self.inner.batched(keys).await;
        self.ctx.post(d, "batch.batched", "", out).await
    }
    async fn close_batch(&self, r: &BatchRecord) -> Result<(), StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "batch.close", &r.key).await?;
        let out = self.inner.close_batch(r).await;
        self.ctx.post(d, "batch.close", &r.key, out).await
    }
}

/// The provider's batch endpoint behind faults: a call may fail before it acts, or act and lose
/// its answer (a submission made but unanswered).
pub struct FaultyBatchApi {
    /// The provider (one per history, outliving every process).
    pub inner: Arc<OfflineBatches>,
    /// Chaos and process.
    pub ctx: Ctx,
}

#[async_trait]
impl BatchApi for FaultyBatchApi {
    fn route(&self) -> &str {
        self.inner.route()
    }
    async fn find(&self, key: &str, since_ms: u64, requests: usize) -> Result<Option<String>, LlmError> {
        let d = self.ctx.pre::<LlmError>(Port::Provider, "batch.find", key).await?;
        let out = self.inner.find(key, since_ms, requests).await;
        self.ctx.post(d, "batch.find", key, out).await
    }
    async fn submit(&self, batch: &BatchSubmission) -> Result<String, SubmitError> {
        // Failed before it acted: no batch; acted and lost its answer: a batch that may exist.
        let d = self
            .ctx
            .pre::<LlmError>(Port::Provider, "batch.submit", &batch.key)
            .await
            .map_err(SubmitError::NotMade)?;
        let out = self.inner.submit(batch).await.map_err(|e| match e {
            SubmitError::NotMade(e) | SubmitError::Unknown(e) => e,
        });
        self.ctx.post(d, "batch.submit", &batch.key, out).await.map_err(SubmitError::Unknown)
    }
    async fn status(&self, id: &str) -> Result<BatchStatus, LlmError> {
        let d = self.ctx.pre::<LlmError>(Port::Provider, "batch.status", id).await?;
        let out = self.inner.status(id).await;
        self.ctx.post(d, "batch.status", id, out).await
    }
    async fn cancel(&self, id: &str) -> Result<(), LlmError> {
        let d = self.ctx.pre::<LlmError>(Port::Provider, "batch.cancel", id).await?;
        let out = self.inner.cancel(id).await;
        self.ctx.post(d, "batch.cancel", id, out).await
    }
}

/// The model a provider batch runs: answers a commit prompt as a model following it would, and
/// counts each commit it answers as paid (the batch's price is charged when the batch runs).
pub struct BatchModel {
    /// The history's chaos (its oracle counts the spend).
    pub chaos: Arc<Chaos>,
}

#[async_trait]
impl LlmClient for BatchModel {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let ids: Vec<String> =
            request.prompt.lines().filter_map(|l| l.strip_prefix("=== commit ")).map(str::to_owned).collect();
        if ids.is_empty() {
            // A synthesis task's run: paid whether its batch still owns it or gave it back.
            let task = self.chaos.prompts.get(&request.prompt).cloned().unwrap_or_default();
            self.chaos.oracle(|o| o.batch_spent(&task));
            self.chaos.trace(|| format!("batch model answers task {}", short(&task)));
        }
        self.chaos.oracle(|o| ids.iter().for_each(|id| o.spent(id)));
        self.chaos.trace(|| format!("batch model answers {} commits", ids.len()));
        let text = lanes_core::commits::prompt::offline_answer(&request.prompt);
        Ok(LlmResponse {
            usage: lanes_core::domain::TokenUsage { prompt: 100, completion: 20 * ids.len() as u64 },
            text,
            model: "sim:batch".into(),
            truncated: false,
            limits: Default::default(),
            tier: request.tier,
            route: Default::default(),
            continued: 0,
        })
    }
}

impl World {
    /// The commits lane's batch endpoint and records for `ctx`, in a history with batches.
    pub(crate) fn batching(&self, ctx: &Ctx) -> Option<lanes_core::commits::Batching> {
        let (records, provider) = self.batches.as_ref()?;
        Some(lanes_core::commits::Batching {
            api: Arc::new(FaultyBatchApi { inner: provider.clone(), ctx: ctx.clone() }),
            store: Arc::new(FaultyBatches { inner: records.clone(), ctx: ctx.clone() }),
            queue_tokens: None,
            scope: "sim".into(),
        })
    }
}

/// One tick of the controller's collectors (the commits' and the synthesis tasks'), in a history
/// with batches.
pub(crate) async fn collect(world: &World, ctx: &Ctx) {
    let Some(collector) = world.commits_worker(ctx).collector() else { return };
    let r = collector.tick().await;
    if r.open > 0 {
        world.chaos.trace(|| format!("collect: {r:?}"));
    }
    let Some(batching) = world.batching(ctx) else { return };
    let send = world.queue(ctx, lanes_core::domain::Lane::Synthesis);
    let tasks = lanes_core::tasks::collect::TaskCollector { worker: world.worker(ctx), batching, send };
    let r = tasks.tick().await;
    if r.open > 0 {
        world.chaos.trace(|| format!("collect tasks: {r:?}"));
    }
}

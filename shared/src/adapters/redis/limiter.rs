//! The RPM/TPM limiter in Redis, shared by every worker: `limiter::decide` and
//! `limiter::reconcile` as one Lua script (`limiter.lua`) over one hash key, so all workers
//! draw from the same buckets atomically (EVALSHA, with EVAL on NOSCRIPT). All of one limiter's keys
//! share a hash tag, so the script touches one cluster slot.

use super::RedisConn;
use crate::clock::SharedClock;
use crate::domain::Lane;
use crate::domain::limits::{Class, Decision, Learned, LimiterConfig, ProviderLimits};
use crate::ports::{LimiterError, RateLimiter};
use async_trait::async_trait;
use redis::Script;
use std::time::Duration;

/// `limiter::decide` and `limiter::reconcile` as one Lua script over one hash key, so every worker shares the
/// buckets atomically. ARGV: op (`take`/`put`/`cool`), now_ms, class (0/1), tokens, estimated, rpm,
/// tpm, interactive share, wait_for, window_ms, burst, reserve_up_to_ms. Returns 0 (granted), the
/// wait in ms, or minus the wait of a reservation.
const LIMITER_LUA: &str = include_str!("limiter.lua");

/// The limiter in Redis, shared by every worker (EVALSHA with EVAL fallback on NOSCRIPT).
#[derive(Clone)]
pub struct RedisLimiter {
    conn: RedisConn,
    key: String,
    config: LimiterConfig,
    learned: std::sync::Arc<Learned>,
    clock: SharedClock,
    script: Script,
}

impl RedisLimiter {
    /// A limiter named `name` (one per provider and model) with keys under `prefix`.
    pub fn new(conn: RedisConn, prefix: &str, name: &str, config: LimiterConfig, clock: SharedClock) -> Self {
        Self {
            conn,
            key: format!("{prefix}{{limiter:{name}}}"),
            config,
            learned: Default::default(),
            clock,
            script: Script::new(LIMITER_LUA),
        }
    }

    /// Runs the script: `extra` is the reservation bound and, for `align`, the two resets
    /// (`u64::MAX`: not said).
    async fn run(
        &self,
        op: &str,
        class: Class,
        tokens: u64,
        estimated: u64,
        extra: [u64; 3],
    ) -> Result<i64, LimiterError> {
        crate::metrics::aws_request("redis", "EVALSHA limiter");
        let mut conn = self.conn.clone();
        // The caps lowered to what the provider said: every call carries the limits it paces by.
        let c = &self.learned.apply(&self.config);
        self.script
            .key(&self.key)
            .arg(op)
            .arg(self.clock.now_ms())
            .arg(class as u8)
            .arg(tokens)
            .arg(estimated)
            .arg(c.rpm)
            .arg(c.tpm)
            .arg(c.interactive_share)
            .arg(c.wait_for)
            .arg(c.window_ms)
            .arg(c.burst)
            .arg(extra[0])
            .arg(extra[1])
            .arg(extra[2])
            .invoke_async(&mut conn)
            .await
            .map_err(|e| LimiterError::Unavailable(e.to_string()))
    }
}

#[async_trait]
impl RateLimiter for RedisLimiter {
    async fn try_acquire(
        &self,
        lane: Lane,
        tokens: u64,
        reserve_up_to: Duration,
    ) -> Result<Decision, LimiterError> {
        let wait = self
            .run("take", lane.into(), tokens, 0, [reserve_up_to.as_millis() as u64, u64::MAX, u64::MAX])
            .await?;
        Ok(match wait {
            0 => Decision::Granted,
            w if w < 0 => Decision::Reserved(Duration::from_millis(w.unsigned_abs())),
            w => Decision::Wait(Duration::from_millis(w as u64)),
        })
    }

    async fn reconcile(&self, lane: Lane, estimated: u64, actual: u64) -> Result<(), LimiterError> {
        self.run("put", lane.into(), actual, estimated, [0, u64::MAX, u64::MAX]).await.map(|_| ())
    }

    async fn give_back(&self, lane: Lane, tokens: u64) -> Result<(), LimiterError> {
        self.run("back", lane.into(), tokens, 0, [0, u64::MAX, u64::MAX]).await.map(|_| ())
    }

    async fn cool_down(&self, for_: Duration) -> Result<(), LimiterError> {
        self.run("cool", Class::Interactive, 0, for_.as_millis() as u64, [0, u64::MAX, u64::MAX])
            .await
            .map(|_| ())
    }

    async fn cooling_for(&self) -> Result<Option<Duration>, LimiterError> {
        crate::metrics::aws_request("redis", "HGET");
        let mut conn = self.conn.clone();
        // The script writes numbers with Lua's tostring: read them as floats.
        let until: Option<f64> = redis::cmd("HGET")
            .arg(&self.key)
            .arg("cool")
            .query_async(&mut conn)
            .await
            .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
        let left = (until.unwrap_or(0.0).max(0.0) as u64).saturating_sub(self.clock.now_ms());
        Ok((left > 0).then(|| Duration::from_millis(left)))
    }

    fn learn(&self, limits: &ProviderLimits) -> bool {
        self.learned.learn(limits)
    }

    fn limits(&self) -> LimiterConfig {
        self.learned.apply(&self.config)
    }

    async fn align(&self, lane: Lane, limits: &ProviderLimits) -> Result<(), LimiterError> {
        // Absent values travel as u64::MAX, which the script reads as "not said".
        let left = limits.remaining.map(|v| v.map_or(u64::MAX, |v| v as u64));
        let resets = limits.reset.map(|d| d.map_or(u64::MAX, |d| d.as_millis() as u64));
        self.run("align", lane.into(), left[0], left[1], [0, resets[0], resets[1]]).await.map(|_| ())
    }
}

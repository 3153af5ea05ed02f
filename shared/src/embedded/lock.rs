//! In-process lease lock with the Redis lock's contract: token, TTL, compare-then-renew,
//! compare-then-release. Expiry is judged by the injected clock.

use super::expiring::Expiring;
use crate::clock::SharedClock;
use crate::ports::{Acquire, LeaseLock, LockError};
use async_trait::async_trait;
use std::sync::Mutex;
use std::time::Duration;

/// The embedded lease lock.
#[derive(Debug)]
pub struct MemoryLock {
    clock: SharedClock,
    /// Token and expiry by key.
    held: Mutex<Expiring<String>>,
}

impl MemoryLock {
    /// A lock judged by `clock`.
    pub fn new(clock: SharedClock) -> Self {
        Self { clock, held: Mutex::new(Expiring::new(usize::MAX)) }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Expiring<String>, u64) -> T) -> Result<T, LockError> {
        let now = self.clock.now_ms();
        let mut held = self.held.lock().map_err(|_| LockError::Unavailable("lock table poisoned".into()))?;
        held.drop_expired(now);
        Ok(f(&mut held, now))
    }
}

#[async_trait]
impl LeaseLock for MemoryLock {
    async fn acquire(&self, key: &str, ttl: Duration) -> Result<Acquire, LockError> {
        self.with(|held, now| match held.live(key, now) {
            Some((_, expires)) => Acquire::Held { remaining: Duration::from_millis(expires - now) },
            None => {
                let token = uuid::Uuid::new_v4().to_string();
                held.insert(key, token.clone(), now + ttl.as_millis() as u64, now);
                Acquire::Acquired(token)
            }
        })
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LockError> {
        self.with(|held, now| match held.live(key, now) {
            Some((t, _)) if t != token => false,
            // Ours, or free: taken (again) until the new expiry.
            _ => {
                held.insert(key, token.to_owned(), now + ttl.as_millis() as u64, now);
                true
            }
        })
    }

    async fn release(&self, key: &str, token: &str) -> Result<bool, LockError> {
        self.with(|held, now| match held.live(key, now) {
            Some((t, _)) if t == token => held.remove(key).is_some(),
            _ => false,
        })
    }
}

/// The embedded lock with one set of keys (those containing `key_part`) scripted, for unit tests
/// of what a slow or stolen lock does to a worker: their acquires wait for a permit of `gate`, and
/// once `refuse_renewals` is set their renewals answer "held by another".
#[cfg(test)]
pub(crate) struct ScriptedLock {
    pub inner: std::sync::Arc<MemoryLock>,
    pub key_part: String,
    pub gate: tokio::sync::Semaphore,
    pub refuse_renewals: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
impl ScriptedLock {
    /// Scripts the keys containing `key_part`; `gated` closes their acquires until permits are added.
    pub fn new(inner: std::sync::Arc<MemoryLock>, key_part: String, gated: bool) -> Self {
        let permits = if gated { 0 } else { tokio::sync::Semaphore::MAX_PERMITS };
        Self { inner, key_part, gate: tokio::sync::Semaphore::new(permits), refuse_renewals: false.into() }
    }

    fn scripted(&self, key: &str) -> bool {
        key.contains(&self.key_part)
    }
}

#[cfg(test)]
#[async_trait]
impl LeaseLock for ScriptedLock {
    async fn acquire(&self, key: &str, ttl: Duration) -> Result<Acquire, LockError> {
        if self.scripted(key) {
            let _open = self.gate.acquire().await.map_err(|e| LockError::Unavailable(e.to_string()))?;
        }
        self.inner.acquire(key, ttl).await
    }
    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LockError> {
        if self.scripted(key) && self.refuse_renewals.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(false);
        }
        self.inner.renew(key, token, ttl).await
    }
    async fn release(&self, key: &str, token: &str) -> Result<bool, LockError> {
        self.inner.release(key, token).await
    }
}

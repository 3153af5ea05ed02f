//! In-process lease lock with the Redis lock's contract: token, TTL, compare-then-renew,
//! compare-then-release. Expiry is judged by the injected clock.

use crate::clock::SharedClock;
use crate::ports::{Acquire, LeaseLock, LockError};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The embedded lease lock.
#[derive(Debug)]
pub struct MemoryLock {
    clock: SharedClock,
    held: Mutex<HashMap<String, (String, u64)>>,
}

impl MemoryLock {
    /// A lock judged by `clock`.
    pub fn new(clock: SharedClock) -> Self {
        Self { clock, held: Mutex::new(HashMap::new()) }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, (String, u64)>, u64) -> T) -> Result<T, LockError> {
        let now = self.clock.now_ms();
        let mut held = self.held.lock().map_err(|_| LockError::Unavailable("lock table poisoned".into()))?;
        held.retain(|_, (_, expires)| *expires > now);
        Ok(f(&mut held, now))
    }
}

#[async_trait]
impl LeaseLock for MemoryLock {
    async fn acquire(&self, key: &str, ttl: Duration) -> Result<Acquire, LockError> {
        self.with(|held, now| match held.get(key) {
            Some((_, expires)) => Acquire::Held { remaining: Duration::from_millis(expires - now) },
            None => {
                let token = uuid::Uuid::new_v4().to_string();
                held.insert(key.to_owned(), (token.clone(), now + ttl.as_millis() as u64));
                Acquire::Acquired(token)
            }
        })
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LockError> {
        self.with(|held, now| match held.get_mut(key) {
            Some((t, expires)) if t == token => {
                *expires = now + ttl.as_millis() as u64;
                true
            }
            Some(_) => false,
            None => {
                held.insert(key.to_owned(), (token.to_owned(), now + ttl.as_millis() as u64));
                true
            }
        })
    }

    async fn release(&self, key: &str, token: &str) -> Result<bool, LockError> {
        self.with(|held, _| match held.get(key) {
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

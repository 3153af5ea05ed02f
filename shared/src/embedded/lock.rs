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

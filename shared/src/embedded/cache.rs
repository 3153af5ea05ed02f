//! In-process TTL cache with the Redis hot cache's contract.
//!
//! The lanes' token shares are kept apart from the entries, parsed, each lane's groups in a map under
//! a lock of their own: a step then touches its group's entry alone (a decision reads the others), as
//! the script does, and never holds up the entries' readers.

use super::expiring::Expiring;
use crate::clock::SharedClock;
use crate::domain::quota::{apply, first_refused};
use crate::ports::{Cache, CacheError, Charge, ShareAsk, ShareState, Verdict};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Most entries kept; past it the soonest-expiring go first.
const MAX_ENTRIES: usize = 100_000;

type Entries = Expiring<String>;

/// The embedded cache.
#[derive(Debug)]
pub struct MemoryCache {
    clock: SharedClock,
    entries: Mutex<Entries>,
    /// Sets of expiring members: key -> member -> until (Unix ms).
    sets: Mutex<HashMap<String, HashMap<String, u64>>>,
    /// Each lane's token shares by key, and when they expire (Unix ms).
    shares: Mutex<HashMap<String, (crate::domain::token_share::LaneShares, u64)>>,
}

impl MemoryCache {
    /// A cache judged by `clock`.
    pub fn new(clock: SharedClock) -> Self {
        Self {
            clock,
            entries: Mutex::new(Expiring::new(MAX_ENTRIES)),
            sets: Mutex::new(HashMap::new()),
            shares: Mutex::new(HashMap::new()),
        }
    }

    fn entries(&self) -> Result<std::sync::MutexGuard<'_, Entries>, CacheError> {
        self.entries.lock().map_err(|_| CacheError::Unavailable("cache poisoned".into()))
    }
}

#[async_trait]
impl Cache for MemoryCache {
    async fn get(&self, key: &str) -> Result<Option<String>, CacheError> {
        let now = self.clock.now_ms();
        Ok(self.entries()?.live(key, now).map(|(v, _)| v.clone()))
    }

    async fn set(&self, key: &str, value: &str, ttl: Duration) -> Result<(), CacheError> {
        let now = self.clock.now_ms();
        self.entries()?.insert(key, value.to_owned(), now + ttl.as_millis() as u64, now);
        Ok(())
    }

    async fn add(&self, key: &str, by: u64, ttl: Duration) -> Result<u64, CacheError> {
        let now = self.clock.now_ms();
        let mut entries = self.entries()?;
        let (current, expires) = match entries.live(key, now) {
            // A value that is not a number (a plain `set` under the same key) counts as zero.
            Some((v, exp)) => (v.parse::<u64>().unwrap_or(0), *exp),
            None => (0, now + ttl.as_millis() as u64),
        };
        let value = current.saturating_add(by);
        entries.insert(key, value.to_string(), expires, now);
        Ok(value)
    }

    async fn leave(&self, key: &str, member: &str) -> Result<(), CacheError> {
        let mut sets = self.sets.lock().map_err(|_| CacheError::Unavailable("cache poisoned".into()))?;
        if let Some(set) = sets.get_mut(key) {
            set.remove(member);
        }
        Ok(())
    }

    async fn enter_within(
        &self,
        key: &str,
        member: &str,
        now: u64,
        until_ms: u64,
        max: u64,
    ) -> Result<bool, CacheError> {
        let mut sets = self.sets.lock().map_err(|_| CacheError::Unavailable("cache poisoned".into()))?;
        // One lock over the count and the add: atomic as the script is.
        let set = sets.entry(key.to_owned()).or_default();
        set.retain(|_, until| *until > now);
        if !set.contains_key(member) && set.len() as u64 >= max {
            return Ok(false);
        }
        set.insert(member.to_owned(), until_ms);
        Ok(true)
    }

    async fn count_live(&self, key: &str, now_ms: u64) -> Result<u64, CacheError> {
        let sets = self.sets.lock().map_err(|_| CacheError::Unavailable("cache poisoned".into()))?;
        Ok(sets.get(key).map_or(0, |set| set.values().filter(|until| **until > now_ms).count() as u64))
    }

    async fn reserve(&self, charges: &[Charge]) -> Result<Option<usize>, CacheError> {
        let now = self.clock.now_ms();
        let mut entries = self.entries()?;
        // One lock over the check and the charges: the reservation is atomic as the script is.
        let current: Vec<u64> = charges
            .iter()
            .map(|c| entries.live(&c.key, now).and_then(|(v, _)| v.parse::<u64>().ok()).unwrap_or(0))
            .collect();
        if let Some(refused) = first_refused(&current, charges) {
            return Ok(Some(refused));
        }
        for (c, value) in charges.iter().zip(current) {
            let expires = entries.live(&c.key, now).map_or(now + c.ttl.as_millis() as u64, |(_, exp)| *exp);
            entries.insert(&c.key, apply(value, c.amount).to_string(), expires, now);
        }
        Ok(None)
    }

    async fn share(&self, key: &str, ask: &ShareAsk) -> Result<Verdict, CacheError> {
        use crate::domain::token_share::{LaneShares, state_ttl_ms};
        let now = self.clock.now_ms();
        let mut shares = self.shares.lock().map_err(|_| CacheError::Unavailable("cache poisoned".into()))?;
        // One lock over the read and the write: the step is atomic as the script is. A lane's
        // state, and when it was last swept, outlive its last step by the TTL the script gives its
        // keys.
        let (lane, expires) = shares.entry(key.to_owned()).or_default();
        if *expires <= now {
            *lane = LaneShares::default();
        }
        let verdict = lane.apply(ask);
        *expires = now + state_ttl_ms(&ask.settings);
        Ok(verdict)
    }

    async fn share_state(&self, key: &str) -> Result<ShareState, CacheError> {
        let now = self.clock.now_ms();
        let shares = self.shares.lock().map_err(|_| CacheError::Unavailable("cache poisoned".into()))?;
        Ok(shares
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(lane, _)| lane.groups.clone())
            .unwrap_or_default())
    }
}

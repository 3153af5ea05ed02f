//! Keys whose values expire, the in-process twin of Redis's TTLs for the cache and the lock: an
//! index by expiry time lets each write drop what has expired by then, oldest first, so expiry
//! costs once per key. (Scanning every key at each write cost more than the rest of a task once a
//! soak had tens of thousands of them.)

use std::collections::{BTreeSet, HashMap};

/// Values by key, each with the Unix ms it expires at.
#[derive(Debug)]
pub(super) struct Expiring<V> {
    values: HashMap<String, (V, u64)>,
    by_expiry: BTreeSet<(u64, String)>,
    /// Most keys kept; past it the soonest-expiring go first.
    max: usize,
}

impl<V> Expiring<V> {
    pub(super) fn new(max: usize) -> Self {
        Self { values: HashMap::new(), by_expiry: BTreeSet::new(), max }
    }

    /// The value under `key` and its expiry, if it has not expired by `now`.
    pub(super) fn live(&self, key: &str, now: u64) -> Option<&(V, u64)> {
        self.values.get(key).filter(|(_, exp)| *exp > now)
    }

    /// Sets `key` to `value` until `expires`, first dropping what has expired by `now` and, at the
    /// cap, the soonest-expiring keys.
    pub(super) fn insert(&mut self, key: &str, value: V, expires: u64, now: u64) {
        self.remove(key);
        self.drop_expired(now);
        while self.values.len() >= self.max
            && let Some((_, k)) = self.by_expiry.pop_first()
        {
            self.values.remove(&k);
        }
        self.values.insert(key.to_owned(), (value, expires));
        self.by_expiry.insert((expires, key.to_owned()));
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<(V, u64)> {
        let (value, exp) = self.values.remove(key)?;
        self.by_expiry.remove(&(exp, key.to_owned()));
        Some((value, exp))
    }

    /// Drops every key expired by `now`.
    pub(super) fn drop_expired(&mut self, now: u64) {
        while let Some((exp, _)) = self.by_expiry.first()
            && *exp <= now
            && let Some((_, k)) = self.by_expiry.pop_first()
        {
            self.values.remove(&k);
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        debug_assert_eq!(self.values.len(), self.by_expiry.len());
        self.values.len()
    }

    #[cfg(test)]
    pub(super) fn contains(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_keys_go_at_the_next_write_and_a_full_map_drops_the_soonest_expiring() {
        let mut m = Expiring::new(3);
        m.insert("short", 1, 1_010, 1_000);
        m.insert("long", 2, 61_000, 1_000);
        // Re-set with a later expiry: the index follows the value, not its first write.
        m.insert("short", 3, 1_020, 1_000);
        assert_eq!(m.live("short", 1_015), Some(&(3, 1_020)));
        assert_eq!(m.live("short", 1_020), None, "expired at its time, though still held");
        m.insert("other", 4, 60_000, 1_025);
        assert!(!m.contains("short"), "dropped by the next write once expired");
        assert_eq!(m.len(), 2);
        m.insert("a", 5, 70_000, 1_030);
        m.insert("b", 6, 80_000, 1_030);
        assert_eq!(m.len(), 3);
        assert!(!m.contains("other"), "the soonest-expiring went to make room");
        assert!(m.contains("long") && m.contains("a") && m.contains("b"));
        assert_eq!(m.remove("a"), Some((5, 70_000)));
        m.drop_expired(u64::MAX);
        assert_eq!(m.len(), 0);
    }
}

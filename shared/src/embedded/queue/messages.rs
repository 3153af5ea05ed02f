//! One queue's messages in memory, indexed so that a receive costs the messages it takes and the
//! number of groups, not the backlog.
//!
//! Every message is in exactly one of two sets, as of the last [`Messages::refresh`]:
//! - **ready**: visible, kept per group in delivery order ([`Place`]), which is what the fair
//!   order walks ([`FairTurns`]);
//! - **hidden**: not visible yet (leased, delayed, or being deleted), by the time it becomes
//!   visible. A refresh moves those whose time has come to ready, oldest first.
//!
//! Hidden messages with a receipt are the ones in flight, counted per group, since the fair order
//! puts a group with more of them out after the others. Every change to a message's visibility or
//! receipt goes through [`Messages::update`], which takes it out of the index and puts it back, so
//! the index cannot drift from the messages.

use super::{DeliveryOrder, Entry};
use crate::domain::fairness::{FairTurns, Place, Standing};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;

/// One queue's messages, by sequence number, with their delivery index.
#[derive(Debug)]
pub(super) struct Messages {
    order: DeliveryOrder,
    entries: BTreeMap<u64, Entry>,
    ready: BTreeMap<Arc<str>, BTreeSet<Place>>,
    ready_len: usize,
    /// (visible at, seq).
    hidden: BTreeSet<(u64, u64)>,
    in_flight: HashMap<Arc<str>, usize>,
    /// Each group's last delivery, by the delivery counter `turn`: the fair order's tie-break.
    /// A group with no message left is forgotten once the record outgrows the groups present.
    last_turn: HashMap<Arc<str>, u64>,
    turn: u64,
    /// (first sent at, seq): the oldest message's age without a scan.
    sent: BTreeSet<(u64, u64)>,
    /// The time of the last refresh: what "visible" means for the index.
    now: u64,
    /// The one group of FIFO order.
    everyone: Arc<str>,
}

/// What a queue holds, as SQS's approximate counts report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counts {
    pub visible: usize,
    pub in_flight: usize,
    pub oldest_sent_at: Option<u64>,
}

impl Messages {
    pub(super) fn new(order: DeliveryOrder) -> Self {
        Self {
            order,
            entries: BTreeMap::new(),
            ready: BTreeMap::new(),
            ready_len: 0,
            hidden: BTreeSet::new(),
            in_flight: HashMap::new(),
            last_turn: HashMap::new(),
            turn: 0,
            sent: BTreeSet::new(),
            now: 0,
            everyone: Arc::from(""),
        }
    }

    /// Shows every hidden message whose time has come by `now`.
    pub(super) fn refresh(&mut self, now: u64) {
        self.now = self.now.max(now);
        while let Some(&(at, seq)) = self.hidden.first()
            && at <= self.now
        {
            let Some(entry) = self.entries.remove(&seq) else {
                self.hidden.pop_first();
                continue;
            };
            self.unindex(&entry);
            self.index(&entry);
            self.entries.insert(seq, entry);
        }
    }

    pub(super) fn insert(&mut self, entry: Entry) {
        if let Some(old) = self.entries.remove(&entry.stored.seq) {
            self.unindex(&old);
        }
        self.index(&entry);
        self.entries.insert(entry.stored.seq, entry);
    }

    pub(super) fn remove(&mut self, seq: u64) -> Option<Entry> {
        let entry = self.entries.remove(&seq)?;
        self.unindex(&entry);
        Some(entry)
    }

    pub(super) fn get(&self, seq: u64) -> Option<&Entry> {
        self.entries.get(&seq)
    }

    /// Changes one message (its visibility, its receipt) and keeps the index true to it.
    pub(super) fn update<R>(&mut self, seq: u64, change: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let mut entry = self.remove(seq)?;
        let out = change(&mut entry);
        self.insert(entry);
        Some(out)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// The visible messages' sequence numbers, in sending order (a DLQ's move back).
    pub(super) fn visible(&mut self, now: u64) -> Vec<u64> {
        self.refresh(now);
        let mut seqs: Vec<u64> = self.ready.values().flatten().map(|&(_, seq)| seq).collect();
        seqs.sort_unstable();
        seqs
    }

    pub(super) fn counts(&mut self, now: u64) -> Counts {
        self.refresh(now);
        Counts {
            visible: self.ready_len,
            in_flight: self.hidden.len(),
            oldest_sent_at: self.sent.first().map(|&(at, _)| at),
        }
    }

    /// The delivery order from `now`, to be taken one message at a time with [`Self::next_turn`].
    pub(super) fn turns(&mut self, now: u64) -> FairTurns<Arc<str>> {
        self.refresh(now);
        FairTurns::new(
            self.ready
                .iter()
                .filter_map(|(group, places)| Some((group.clone(), self.standing(group), *places.first()?))),
        )
    }

    /// `group`'s messages in flight and its last delivery.
    fn standing(&self, group: &str) -> Standing {
        Standing {
            out: self.in_flight.get(group).copied().unwrap_or(0),
            last_turn: self.last_turn.get(group).copied().unwrap_or(0),
        }
    }

    /// Records that message `seq` was just delivered: its group goes behind the groups delivered to
    /// less recently among those with as many in flight. Once the record is more than twice the
    /// groups present (and 64), the groups with no message left are forgotten, so it stays bounded.
    pub(super) fn delivered(&mut self, seq: u64) {
        let Some(entry) = self.entries.get(&seq) else { return };
        let (group, _) = self.place(entry);
        self.turn += 1;
        self.last_turn.insert(group, self.turn);
        if self.last_turn.len() > 2 * (self.ready.len() + self.in_flight.len()) + 64 {
            let (ready, in_flight) = (&self.ready, &self.in_flight);
            self.last_turn.retain(|g, _| ready.contains_key(g) || in_flight.contains_key(g));
        }
    }

    /// The next message in `turns`' order. The caller may change or remove it before asking for
    /// the one after.
    pub(super) fn next_turn(&self, turns: &mut FairTurns<Arc<str>>) -> Option<u64> {
        let ready = &self.ready;
        let (_, (_, seq)) =
            turns.next(|group, head| ready.get(group)?.range((Excluded(head), Unbounded)).next().copied())?;
        Some(seq)
    }

    /// Where `entry` sits in its group's order: in FIFO order one group, by sending order.
    fn place(&self, entry: &Entry) -> (Arc<str>, Place) {
        match self.order {
            DeliveryOrder::Fair => (entry.group.clone(), (entry.order_at, entry.stored.seq)),
            DeliveryOrder::Fifo => (self.everyone.clone(), (0, entry.stored.seq)),
        }
    }

    fn index(&mut self, entry: &Entry) {
        let seq = entry.stored.seq;
        self.sent.insert((entry.stored.sent_at_ms, seq));
        if entry.visible_at_ms <= self.now {
            let (group, place) = self.place(entry);
            self.ready.entry(group).or_default().insert(place);
            self.ready_len += 1;
        } else {
            self.hidden.insert((entry.visible_at_ms, seq));
            if entry.receipt.is_some() {
                *self.in_flight.entry(entry.group.clone()).or_default() += 1;
            }
        }
    }

    fn unindex(&mut self, entry: &Entry) {
        let seq = entry.stored.seq;
        self.sent.remove(&(entry.stored.sent_at_ms, seq));
        if self.hidden.remove(&(entry.visible_at_ms, seq)) {
            if entry.receipt.is_some()
                && let Some(n) = self.in_flight.get_mut(&entry.group)
            {
                *n -= 1;
                if *n == 0 {
                    self.in_flight.remove(&entry.group);
                }
            }
            return;
        }
        let (group, place) = self.place(entry);
        if let Some(places) = self.ready.get_mut(&group)
            && places.remove(&place)
        {
            self.ready_len -= 1;
            if places.is_empty() {
                self.ready.remove(&group);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::StoredMessage;
    use super::*;
    use crate::domain::MessageId;
    use crate::domain::fairness::{GROUP_ATTRIBUTE, PRIORITY_ATTRIBUTE, Ready, Standing, fair_order};
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    fn entry(seq: u64, group: &str, priority: Option<&str>, sent_at_ms: u64, visible_at_ms: u64) -> Entry {
        let mut attributes = BTreeMap::new();
        if !group.is_empty() {
            attributes.insert(GROUP_ATTRIBUTE.to_owned(), group.to_owned());
        }
        if let Some(p) = priority {
            attributes.insert(PRIORITY_ATTRIBUTE.to_owned(), p.to_owned());
        }
        let stored = StoredMessage {
            queue: "q".into(),
            seq,
            body: String::new(),
            attributes,
            sent_at_ms,
            receive_count: 0,
        };
        Entry::new(MessageId::fresh(), stored, visible_at_ms)
    }

    /// The order and counts a scan of every message gives: the definition the index must keep.
    fn scanned(m: &Messages, now: u64) -> (Vec<u64>, Counts) {
        let visible = |e: &&Entry| e.visible_at_ms <= now;
        let ready: Vec<Ready> = m
            .values()
            .filter(visible)
            .map(|e| match m.order {
                DeliveryOrder::Fair => Ready { seq: e.stored.seq, order_at: e.order_at, group: &e.group },
                DeliveryOrder::Fifo => Ready { seq: e.stored.seq, order_at: 0, group: "" },
            })
            .collect();
        let mut standing: HashMap<&str, Standing> = HashMap::new();
        for e in m.values().filter(|e| e.visible_at_ms > now && e.receipt.is_some()) {
            standing.entry(&e.group).or_default().out += 1;
        }
        for (group, last) in &m.last_turn {
            standing.entry(group).or_default().last_turn = *last;
        }
        let counts = Counts {
            visible: ready.len(),
            in_flight: m.values().filter(|e| e.visible_at_ms > now).count(),
            oldest_sent_at: m.values().map(|e| e.stored.sent_at_ms).min(),
        };
        (fair_order(ready, &standing), counts)
    }

    fn indexed(m: &mut Messages, now: u64) -> (Vec<u64>, Counts) {
        let mut turns = m.turns(now);
        let order = std::iter::from_fn(|| m.next_turn(&mut turns)).collect();
        (order, m.counts(now))
    }

    /// Random sends, leases, releases, expiries, delays and deletes across a few groups and
    /// priorities: after every step the index delivers in the order, and counts as, a scan does.
    #[test]
    fn the_index_orders_and_counts_as_a_scan_of_every_message_does() {
        for seed in 0..200u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let order = if seed % 4 == 3 { DeliveryOrder::Fifo } else { DeliveryOrder::Fair };
            let mut m = Messages::new(order);
            let (mut now, mut next_seq) = (1_000u64, 0u64);
            for step in 0..150 {
                now += rng.random_range(0..30u64);
                let seqs: Vec<u64> = m.values().map(|e| e.stored.seq).collect();
                let pick = (!seqs.is_empty()).then(|| seqs[rng.random_range(0..seqs.len())]);
                match (rng.random_range(0..6u32), pick) {
                    (0 | 1, _) | (_, None) => {
                        let group = ["", "a", "b", "c"][rng.random_range(0..4usize)];
                        let priority = [None, Some("high"), Some("low")][rng.random_range(0..3usize)];
                        let delay = if rng.random_bool(0.2) { rng.random_range(1..100u64) } else { 0 };
                        m.insert(entry(next_seq, group, priority, now, now + delay));
                        next_seq += 1;
                    }
                    (2, Some(seq)) => {
                        let lease = rng.random_range(1..80u64);
                        m.update(seq, |e| {
                            e.receipt = Some(format!("r{step}"));
                            e.visible_at_ms = now + lease;
                        });
                        m.delivered(seq);
                    }
                    (3, Some(seq)) => {
                        m.update(seq, |e| e.visible_at_ms = now);
                    }
                    (4, Some(seq)) => {
                        m.update(seq, |e| e.visible_at_ms = u64::MAX);
                    }
                    (_, Some(seq)) => {
                        m.remove(seq);
                    }
                }
                assert_eq!(indexed(&mut m, now), scanned(&m, now), "seed {seed}, step {step}");
            }
        }
    }
}

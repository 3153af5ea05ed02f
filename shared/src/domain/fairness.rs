//! Fair order inside a lane: who a message is fair to (its group), and the order in which a queue
//! delivers the visible messages of many groups. Pure.
//!
//! - **Groups.** A task's group is its tenant, hashed ([`task_group`]; with tenancy off, where
//!   projects are the only parties, its project). A commit's is its repository's owner: the GitHub
//!   organisation or user, the GitLab top-level group ([`commit_group`]). The group travels as the
//!   [`GROUP_ATTRIBUTE`] of every send, requeue, re-send and redrive; SQS sends it as the message's
//!   `MessageGroupId`, which on a standard queue makes it a fair queue.
//! - **Order.** SQS's fair queues deliver a group that holds more messages in flight than the others
//!   after the quiet ones. The embedded queue's twin of that is [`fair_order`]: round-robin across
//!   groups, the group with the fewest messages in flight first, among equals the one delivered to
//!   least recently, oldest message first inside a group. A group with a backlog of thousands
//!   cannot starve one with a single message.
//! - **Priority.** A task may ask for `high` or `low` [`Priority`]: a time offset in that order
//!   ([`PRIORITY_OFFSET_MS`]), carried as the [`PRIORITY_ATTRIBUTE`] of its message. A `high`
//!   task is ordered as if sent that much earlier, so it passes its own group's older `normal`
//!   ones and heads its group sooner; it never takes a turn from another group (the round-robin
//!   still counts messages out first), so a tenant cannot buy its way past the others with it.

use crate::domain::hashed_tag;
use crate::domain::ids::{Provider, Tenant};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

/// The message attribute naming a message's group; the SQS adapter sends it as `MessageGroupId`
/// and reads it back from the received message's system attributes.
pub const GROUP_ATTRIBUTE: &str = "MessageGroupId";

/// The message attribute carrying a task's [`Priority`] when it is not `normal`.
pub const PRIORITY_ATTRIBUTE: &str = "priority";

/// How far a priority moves a message in the fair order: `high` is ordered as if sent 30 s
/// earlier, `low` 30 s later. Long enough to pass a burst's worth of `normal` work, short enough
/// that a `low` task still starts within an interactive lane's maximum age under steady load.
pub const PRIORITY_OFFSET_MS: u64 = 30_000;

/// A task's place in its group's order, chosen by its client (absent: `normal`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Ordered [`PRIORITY_OFFSET_MS`] ahead of its sending time.
    High,
    /// Ordered by its sending time.
    #[default]
    Normal,
    /// Ordered [`PRIORITY_OFFSET_MS`] behind its sending time.
    Low,
}

impl Priority {
    /// Every priority, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// The priority named `s`, exactly as written on the wire.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Whether this is the default (left out of records and messages).
    pub fn is_normal(&self) -> bool {
        *self == Priority::Normal
    }

    /// The priority a message's attributes carry (absent or unknown: `normal`).
    pub fn of_attributes(attributes: &BTreeMap<String, String>) -> Self {
        attributes.get(PRIORITY_ATTRIBUTE).and_then(|p| Self::parse(p)).unwrap_or_default()
    }

    /// The time a message of this priority sent at `sent_at_ms` is ordered as.
    pub fn order_at(self, sent_at_ms: u64) -> u64 {
        match self {
            Priority::High => sent_at_ms.saturating_sub(PRIORITY_OFFSET_MS),
            Priority::Normal => sent_at_ms,
            Priority::Low => sent_at_ms.saturating_add(PRIORITY_OFFSET_MS),
        }
    }
}

/// Longest group id SQS accepts.
pub const MAX_GROUP_LEN: usize = 128;

/// A task's group: `t-` and 32 hex digits of the tenant's sha256, or with tenancy off `p-` and
/// the project's. Hashed, so the tenant's identity (an ARN, a subject) never reaches the queue,
/// and always within SQS's alphabet and length.
pub fn task_group(tenant: Option<&Tenant>, project_id: &str) -> String {
    match tenant {
        Some(t) => hashed_tag("t-", t.as_bytes()),
        None => hashed_tag("p-", project_id.as_bytes()),
    }
}

/// A commit's group: its repository's owner, the first segment of `owner/name` (GitHub) or of
/// `path_with_namespace` (GitLab: the top-level group), lower-cased and hashed with the provider.
/// Every repository on this machine (`lanes summarize`, `lanes dev`) is one group.
pub fn commit_group(provider: Provider, repo: &str) -> String {
    let owner = match provider {
        Provider::Local => "",
        Provider::Github | Provider::Gitlab => repo.split('/').next().unwrap_or(""),
    };
    let key = format!("{provider}:{}", owner.to_ascii_lowercase());
    hashed_tag("o-", key.as_bytes())
}

/// Whether `group` can be sent as an SQS `MessageGroupId`: 1 to 128 characters of letters, digits
/// and ASCII punctuation.
pub fn is_valid_group(group: &str) -> bool {
    !group.is_empty() && group.len() <= MAX_GROUP_LEN && group.bytes().all(|b| b.is_ascii_graphic())
}

/// A visible message as the fair order sees it.
#[derive(Debug, Clone, Copy)]
pub struct Ready<'a> {
    /// The queue's sequence number (sending order), what the order hands back.
    pub seq: u64,
    /// The time it is ordered as ([`Priority::order_at`] of its sending time).
    pub order_at: u64,
    /// Its group (`""`: none).
    pub group: &'a str,
}

/// A message's place inside its group: its [`Ready::order_at`], then its sequence number.
pub type Place = (u64, u64);

/// What a group brings to the fair order besides its head: its messages out (in flight) and the
/// turn at which it was last delivered to (0: never, or forgotten while it had no message).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// Messages in flight.
    pub out: usize,
    /// The queue's delivery counter at the group's last delivery.
    pub last_turn: u64,
}

/// The fair order taken one message at a time, over groups whose ready messages are kept sorted
/// elsewhere (a queue's index): repeatedly the head of the group with the fewest messages out (in
/// flight before this receive, plus those this receive already took), ties to the group delivered
/// to least recently, then to the earliest head. Ties go round-robin rather than to the earliest
/// head because a backlog's head is always the oldest: a tenant whose burst holds as many in flight
/// as a flooding tenant would otherwise lose every tie to it. Each turn costs the log of the number
/// of groups, not the backlog.
#[derive(Debug)]
pub struct FairTurns<G> {
    /// Min-heap on (messages out, last turn, head's place, group).
    heap: BinaryHeap<Reverse<(usize, u64, Place, G)>>,
    /// The turn the next delivery of this walk is stamped with: after every group's last.
    turn: u64,
}

impl<G: Ord + Clone> FairTurns<G> {
    /// Starts from each group with a ready message: the group, its standing, its head.
    pub fn new(heads: impl IntoIterator<Item = (G, Standing, Place)>) -> Self {
        let heap: BinaryHeap<_> =
            heads.into_iter().map(|(g, s, head)| Reverse((s.out, s.last_turn, head, g))).collect();
        let turn = heap.iter().map(|Reverse((_, last, _, _))| *last).max().unwrap_or(0) + 1;
        Self { heap, turn }
    }

    /// The next message to deliver, with its group. `after` gives the group's ready message that
    /// follows the one just taken, if any.
    pub fn next(&mut self, after: impl FnOnce(&G, Place) -> Option<Place>) -> Option<(G, Place)> {
        let Reverse((out, _, head, group)) = self.heap.pop()?;
        if let Some(next) = after(&group, head) {
            self.heap.push(Reverse((out + 1, self.turn, next, group.clone())));
        }
        self.turn += 1;
        Some((group, head))
    }
}

/// The order in which to deliver `ready` (visible messages, in any order), as [`FairTurns`] takes
/// it, given each group's [`Standing`] (absent: none out, never delivered to). Inside a group,
/// earliest [`Ready::order_at`] first, then sending order. Messages without a group (`""`) are one
/// group of their own.
pub fn fair_order<'a>(
    ready: impl IntoIterator<Item = Ready<'a>>,
    standing: &HashMap<&str, Standing>,
) -> Vec<u64> {
    let mut by_group: BTreeMap<&str, Vec<Place>> = BTreeMap::new();
    for r in ready {
        by_group.entry(r.group).or_default().push((r.order_at, r.seq));
    }
    for q in by_group.values_mut() {
        q.sort_unstable();
    }
    let mut turns = FairTurns::new(
        by_group
            .iter()
            .filter_map(|(g, q)| Some((*g, standing.get(g).copied().unwrap_or_default(), *q.first()?))),
    );
    let mut out = Vec::with_capacity(by_group.values().map(Vec::len).sum());
    while let Some((_, (_, seq))) = turns.next(|g, head| {
        let q = by_group.get(g)?;
        q.get(q.partition_point(|p| *p <= head)).copied()
    }) {
        out.push(seq);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages sent one a millisecond, in sequence, at normal priority.
    fn at(ready: impl IntoIterator<Item = (u64, &'static str)>) -> Vec<Ready<'static>> {
        ready.into_iter().map(|(seq, group)| Ready { seq, order_at: seq, group }).collect()
    }

    #[test]
    fn priority_moves_a_task_inside_its_group_but_never_past_another_group() {
        // a: 1, 2, 3 normal and 4 high; b: 5 normal.
        let mut ready = at([(1, "a"), (2, "a"), (3, "a"), (5, "b")]);
        ready.push(Ready { seq: 4, order_at: Priority::High.order_at(4), group: "a" });
        assert_eq!(
            fair_order(ready, &HashMap::new()),
            [4, 5, 1, 2, 3],
            "a's high task heads a; b keeps its turn"
        );
        let mut ready = at([(2, "a"), (3, "a")]);
        ready.push(Ready { seq: 1, order_at: Priority::Low.order_at(1), group: "a" });
        assert_eq!(fair_order(ready, &HashMap::new()), [2, 3, 1]);
    }

    #[test]
    fn priorities_parse_their_wire_names_only() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.as_str()), Some(p));
            assert_eq!(serde_json::to_value(p).ok(), Some(serde_json::json!(p.as_str())));
        }
        assert_eq!(Priority::parse("HIGH"), None);
        assert_eq!(Priority::parse("urgent"), None);
        let attrs = BTreeMap::from([(PRIORITY_ATTRIBUTE.to_owned(), "bogus".to_owned())]);
        assert_eq!(
            Priority::of_attributes(&attrs),
            Priority::Normal,
            "an unknown value is normal, not an error"
        );
        assert_eq!(Priority::Low.order_at(u64::MAX), u64::MAX);
        assert_eq!(Priority::High.order_at(5), 0);
    }

    #[test]
    fn a_backlog_does_not_starve_a_group_with_one_message() {
        // Group a sent 1..=100 first; b sent one message after them.
        let mut ready: Vec<(u64, &str)> = (1..=100).map(|s| (s, "a")).collect();
        ready.push((101, "b"));
        let order = fair_order(at(ready), &HashMap::new());
        assert_eq!(&order[..3], &[1, 101, 2], "b's message is second, not 101st");
        assert_eq!(order.len(), 101);
    }

    #[test]
    fn groups_alternate_and_keep_their_own_order() {
        let ready = [(5, "b"), (1, "a"), (2, "a"), (3, "a"), (4, "b"), (6, "c")];
        assert_eq!(fair_order(at(ready), &HashMap::new()), [1, 4, 6, 2, 5, 3]);
    }

    #[test]
    fn a_group_with_messages_in_flight_waits_behind_the_quiet_ones() {
        let ready = [(1, "busy"), (2, "busy"), (3, "quiet")];
        let standing = HashMap::from([("busy", Standing { out: 5, last_turn: 0 })]);
        assert_eq!(fair_order(at(ready), &standing), [3, 1, 2]);
    }

    #[test]
    fn ties_go_to_the_group_delivered_to_least_recently_not_to_the_oldest_head() {
        // The flood's backlog heads every tie by age; both groups hold two in flight, and the
        // flood was delivered to last, so the burst's message goes first, then they alternate.
        let ready = [(1, "flood"), (2, "flood"), (3, "flood"), (50, "burst"), (51, "burst")];
        let standing = HashMap::from([
            ("flood", Standing { out: 2, last_turn: 9 }),
            ("burst", Standing { out: 2, last_turn: 7 }),
        ]);
        assert_eq!(fair_order(at(ready), &standing), [50, 1, 51, 2, 3]);
        // Never delivered to (0) goes before both; equal turns fall back to the earliest head.
        let ready = [(1, "flood"), (60, "new")];
        let standing = HashMap::from([("flood", Standing { out: 0, last_turn: 4 })]);
        assert_eq!(fair_order(at(ready), &standing), [60, 1]);
        assert_eq!(fair_order(at([(2, "b"), (1, "a")]), &HashMap::new()), [1, 2]);
    }

    #[test]
    fn groups_are_hashed_valid_and_scoped() {
        let a = Tenant::parse("arn:aws:iam::123456789012:user/dev").unwrap();
        let g = task_group(Some(&a), "p1");
        assert!(is_valid_group(&g) && g.starts_with("t-") && !g.contains("arn"), "{g}");
        assert_eq!(g, task_group(Some(&a), "p2"), "a tenant's projects are one group");
        assert_ne!(task_group(None, "p1"), task_group(None, "p2"));
        let o = commit_group(Provider::Github, "Octo-Org/hello");
        assert_eq!(o, commit_group(Provider::Github, "octo-org/other"), "one owner, one group");
        assert_ne!(o, commit_group(Provider::Gitlab, "octo-org/hello"));
        assert!(is_valid_group(&o));
        assert!(!is_valid_group("") && !is_valid_group("a b") && !is_valid_group(&"x".repeat(129)));
    }
}

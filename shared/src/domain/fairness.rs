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
//!   groups, the group with the fewest messages in flight first, oldest message first inside a
//!   group. A group with a backlog of thousands cannot starve one with a single message.

use crate::domain::ids::{Provider, Tenant};
use crate::domain::sha256_hex;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

/// The message attribute naming a message's group; the SQS adapter sends it as `MessageGroupId`
/// and reads it back from the received message's system attributes.
pub const GROUP_ATTRIBUTE: &str = "MessageGroupId";

/// Longest group id SQS accepts.
pub const MAX_GROUP_LEN: usize = 128;

/// A task's group: `t-` and 32 hex digits of the tenant's sha256, or with tenancy off `p-` and
/// the project's. Hashed, so the tenant's identity (an ARN, a subject) never reaches the queue,
/// and always within SQS's alphabet and length.
pub fn task_group(tenant: Option<&Tenant>, project_id: &str) -> String {
    match tenant {
        Some(t) => format!("t-{}", &sha256_hex(t.as_bytes())[..32]),
        None => format!("p-{}", &sha256_hex(project_id.as_bytes())[..32]),
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
    format!("o-{}", &sha256_hex(key.as_bytes())[..32])
}

/// Whether `group` can be sent as an SQS `MessageGroupId`: 1 to 128 characters of letters, digits
/// and ASCII punctuation.
pub fn is_valid_group(group: &str) -> bool {
    !group.is_empty() && group.len() <= MAX_GROUP_LEN && group.bytes().all(|b| b.is_ascii_graphic())
}

/// The order in which to deliver `ready` (visible messages as `(sequence, group)`, in any order):
/// repeatedly the head of the group with the fewest messages out (in flight before this receive,
/// from `in_flight`, plus those already picked by it), ties to the oldest head. Messages without a
/// group (`""`) are one group of their own.
pub fn fair_order<'a>(
    ready: impl IntoIterator<Item = (u64, &'a str)>,
    in_flight: &HashMap<&str, usize>,
) -> Vec<u64> {
    let mut by_group: BTreeMap<&str, VecDeque<u64>> = BTreeMap::new();
    for (seq, group) in ready {
        by_group.entry(group).or_default().push_back(seq);
    }
    for q in by_group.values_mut() {
        q.make_contiguous().sort_unstable();
    }
    // Min-heap on (messages out, head sequence).
    let mut heap: BinaryHeap<Reverse<(usize, u64, &str)>> = by_group
        .iter()
        .filter_map(|(g, q)| Some(Reverse((in_flight.get(g).copied().unwrap_or(0), *q.front()?, *g))))
        .collect();
    let mut out = Vec::with_capacity(by_group.values().map(VecDeque::len).sum());
    while let Some(Reverse((out_now, _, group))) = heap.pop() {
        let Some(q) = by_group.get_mut(group) else { continue };
        let Some(seq) = q.pop_front() else { continue };
        out.push(seq);
        if let Some(&next) = q.front() {
            heap.push(Reverse((out_now + 1, next, group)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_does_not_starve_a_group_with_one_message() {
        // Group a sent 1..=100 first; b sent one message after them.
        let mut ready: Vec<(u64, &str)> = (1..=100).map(|s| (s, "a")).collect();
        ready.push((101, "b"));
        let order = fair_order(ready, &HashMap::new());
        assert_eq!(&order[..3], &[1, 101, 2], "b's message is second, not 101st");
        assert_eq!(order.len(), 101);
    }

    #[test]
    fn groups_alternate_and_keep_their_own_order() {
        let ready = [(5, "b"), (1, "a"), (2, "a"), (3, "a"), (4, "b"), (6, "c")];
        assert_eq!(fair_order(ready, &HashMap::new()), [1, 4, 6, 2, 5, 3]);
    }

    #[test]
    fn a_group_with_messages_in_flight_waits_behind_the_quiet_ones() {
        let ready = [(1, "busy"), (2, "busy"), (3, "quiet")];
        let in_flight = HashMap::from([("busy", 5)]);
        assert_eq!(fair_order(ready, &in_flight), [3, 1, 2]);
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

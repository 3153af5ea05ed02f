//! Token-weighted fairness inside a lane: each tenant's share of a lane counted in tokens, not tasks.
//! Pure; the Redis script (`adapters/redis/share.lua`) and the embedded cache both apply [`step`]
//! unchanged, and a test runs one sequence through both.
//!
//! The fair queue ([`super::fairness`]) orders tasks by count; LLM tasks differ in cost by two
//! orders of magnitude, so a tenant whose every task is ten times larger would take ten times the
//! tokens. So, per lane, every group's tokens are counted over a sliding window ([`recent`]: the
//! last whole window weighted by how much of it still overlaps, plus the current one), and:
//! - **the charge** is a task's estimate (prompt plus `max_tokens`) when it starts, corrected by the
//!   usage its answer reports ([`Step::Settle`]);
//! - **waiting work** is counted too: ingress adds each new task to its group's `queued`
//!   ([`Step::Submit`]), and a start takes it off. A count nobody touched for
//!   [`ShareSettings::forget_ms`] is forgotten (a task cancelled before it started never starts);
//! - **the policy** ([`Step::Decide`]): a group over its weighted share of the tokens of the groups
//!   competing now (itself and every other group whose tasks have waited at least
//!   [`ShareSettings::patience_ms`]) is put off, as a wait and never an attempt. With no other group
//!   waiting every task starts at once, so capacity nobody else asks for is never held back.
//! - **contention, not arrival, makes a group compete.** A task submitted a moment ago is normally
//!   picked up by a free slot at once; putting another group off for it would cost that task a whole
//!   put-off and gain nobody anything. Only a group whose waiting began `patience_ms` ago, which the
//!   lane has not found a slot for, competes: then the lane is full and the order matters.
//!
//! Everything is whole numbers (tokens, ms, weights up to [`MAX_WEIGHT`]), so the script's doubles
//! and this code agree exactly while the products stay below 2^53 (tokens per window below about
//! 10^10 with a few hundred waiting groups).

use std::collections::BTreeMap;

/// The largest weight a group can have (the smallest is 1).
pub const MAX_WEIGHT: u64 = 1000;

/// The windows the policy works over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareSettings {
    /// The token-counting window: shares are measured over about the last one or two of these.
    pub window_ms: u64,
    /// A group's waiting count is forgotten after this long with no submission or start.
    pub forget_ms: u64,
    /// How long a put-off task waits before it is offered again.
    pub put_off_ms: u64,
    /// How long a group's tasks must have waited before it competes (see the module's header).
    pub patience_ms: u64,
}

impl Default for ShareSettings {
    fn default() -> Self {
        Self { window_ms: 60_000, forget_ms: 30_000, put_off_ms: 1_000, patience_ms: 250 }
    }
}

/// How long a lane's stored state outlives its last step: past it every group would be dropped or
/// forgotten anyway.
pub fn state_ttl_ms(s: &ShareSettings) -> u64 {
    3 * s.window_ms + s.forget_ms
}

/// One group's use of a lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupUse {
    /// Tokens charged in window `window`.
    pub current: u64,
    /// Tokens charged in the window before it.
    pub previous: u64,
    /// The index (`now / window_ms`) of the window `current` counts.
    pub window: u64,
    /// Tasks submitted and not started yet.
    pub queued: u64,
    /// The last submission or start decision (Unix ms).
    pub seen_ms: u64,
    /// The group's weight.
    pub weight: u64,
    /// When its waiting began: the submission that found nothing of the group waiting (Unix ms).
    pub since_ms: u64,
}

impl GroupUse {
    /// The text form, `current previous window queued seen_ms weight since_ms`: a lane's Redis
    /// hash may hold entries in it (the script reads them, and writes its own packed).
    pub fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {} {}",
            self.current, self.previous, self.window, self.queued, self.seen_ms, self.weight, self.since_ms
        )
    }

    /// The text form read back: six or seven whole numbers of digits alone, one space apart, as
    /// the script's pattern reads them; `None` for anything else. An entry without `since_ms` (six
    /// numbers) reads as waiting since the epoch, so it competes as soon as it has work waiting.
    pub fn decode(s: &str) -> Option<Self> {
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        let v: Vec<u64> =
            s.split(' ').map(|p| p.parse().ok().filter(|_| digits(p))).collect::<Option<_>>()?;
        let (current, previous, window, queued, seen_ms, weight, since_ms) = match v[..] {
            [c, p, w, q, s, wt] => (c, p, w, q, s, wt, 0),
            [c, p, w, q, s, wt, since] => (c, p, w, q, s, wt, since),
            _ => return None,
        };
        Some(Self { current, previous, window, queued, seen_ms, weight, since_ms })
    }

    /// This use at window `w`: moved on by whole windows (one back keeps its tokens as `previous`).
    fn rolled(self, w: u64) -> Self {
        match w.checked_sub(self.window) {
            Some(0) | None => self,
            Some(1) => Self { previous: self.current, current: 0, window: w, ..self },
            Some(_) => Self { previous: 0, current: 0, window: w, ..self },
        }
    }

    /// Tasks waiting, unless the count was left untouched for `forget_ms`.
    fn waiting(&self, now_ms: u64, s: &ShareSettings) -> u64 {
        if now_ms.saturating_sub(self.seen_ms) > s.forget_ms { 0 } else { self.queued }
    }

    /// Whether the group competes for the lane: it has tasks waiting, and has for `patience_ms`.
    fn competes(&self, now_ms: u64, s: &ShareSettings) -> bool {
        self.waiting(now_ms, s) > 0 && now_ms.saturating_sub(self.since_ms) >= s.patience_ms
    }
}

/// The tokens of `u` over the sliding window ending at `now_ms`.
pub fn recent(u: &GroupUse, now_ms: u64, window_ms: u64) -> u64 {
    let u = u.rolled(now_ms / window_ms);
    let left = window_ms - now_ms % window_ms;
    (u.previous as u128 * left as u128 / window_ms as u128) as u64 + u.current
}

/// What happens to the asking group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A new task of the group was queued (ingress).
    Submit,
    /// A task of the group is about to start, estimated at this many tokens.
    Decide {
        /// Prompt plus `max_tokens`.
        estimate: u64,
    },
    /// Correct the group's tokens by this much (usage minus estimate; minus the estimate for a call
    /// that used nothing).
    Settle {
        /// Signed correction.
        delta: i64,
    },
}

/// One question to the lane's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareAsk {
    /// The group asking (its fair-order group).
    pub group: String,
    /// Its weight (clamped to 1..=[`MAX_WEIGHT`]).
    pub weight: u64,
    /// What happens.
    pub step: Step,
    /// Now (Unix ms).
    pub now_ms: u64,
    /// The windows.
    pub settings: ShareSettings,
}

/// The answer: go on, or put the task off (only [`Step::Decide`] is ever put off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Start (or, for the other steps, done).
    Go,
    /// Over its share while another group waits: offer the task again after the put-off.
    PutOff,
}

/// What a step changes in the stored state: the asking group's new use, and, at a sweep (see
/// [`step`]), the groups to drop (nothing seen from them for two windows and nothing waiting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The verdict.
    pub verdict: Verdict,
    /// The asking group's use to store.
    pub mine: GroupUse,
    /// Groups to remove (none but at a sweep).
    pub drop: Vec<String>,
    /// Whether this step swept the lane: the store then keeps its time as the lane's last sweep.
    pub swept: bool,
}

/// Applies `ask` to `state` (every group's stored use) in a lane last swept at `swept_ms`; only the
/// asking group's entry changes, but for the groups a sweep drops. A submission or a correction reads
/// nothing but the asking group's entry; a start decision needs the groups with tasks waiting alone
/// (only they can compete), which the script keeps apart so that its scan does not grow with the
/// tenants merely active in the window (this function, run in process, filters the whole state).
/// Idle groups never compete and are dropped by a sweep: the first start decision a window or more
/// after the last sweep, which reads every group once.
pub fn step(state: &BTreeMap<String, GroupUse>, swept_ms: u64, ask: &ShareAsk) -> Change {
    let (now, s) = (ask.now_ms, &ask.settings);
    let w = now / s.window_ms;
    let swept = matches!(ask.step, Step::Decide { .. }) && now.saturating_sub(swept_ms) >= s.window_ms;
    let drop: Vec<String> = if swept {
        state
            .iter()
            .filter(|(g, u)| {
                **g != ask.group && u.seen_ms.saturating_add(2 * s.window_ms) < now && u.waiting(now, s) == 0
            })
            .map(|(g, _)| g.clone())
            .collect()
    } else {
        Vec::new()
    };
    let stored = state.get(&ask.group).copied().unwrap_or(GroupUse { window: w, ..Default::default() });
    let mut mine = stored.rolled(w);
    mine.queued = stored.waiting(now, s);
    mine.weight = ask.weight.clamp(1, MAX_WEIGHT);
    let verdict = match ask.step {
        Step::Submit => {
            if mine.queued == 0 {
                mine.since_ms = now;
            }
            mine.queued += 1;
            mine.seen_ms = now;
            Verdict::Go
        }
        Step::Settle { delta } => {
            mine.current = crate::domain::quota::apply(mine.current, delta);
            Verdict::Go
        }
        Step::Decide { estimate } => {
            mine.seen_ms = now;
            if over_share(state, ask, &mine) {
                Verdict::PutOff
            } else {
                mine.current = mine.current.saturating_add(estimate);
                mine.queued = mine.queued.saturating_sub(1);
                Verdict::Go
            }
        }
    };
    Change { verdict, mine, drop, swept }
}

/// A lane's token shares as a store keeps them: every group's use, and when the lane was last swept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaneShares {
    /// Each group's use.
    pub groups: BTreeMap<String, GroupUse>,
    /// The time of the lane's last sweep (0 for never).
    pub swept_ms: u64,
}

impl LaneShares {
    /// [`step`] applied, as the script applies it: the asking group's use written, the groups a
    /// sweep drops removed, and a sweep's time kept.
    pub fn apply(&mut self, ask: &ShareAsk) -> Verdict {
        let change = step(&self.groups, self.swept_ms, ask);
        for g in &change.drop {
            self.groups.remove(g);
        }
        if change.swept {
            self.swept_ms = ask.now_ms;
        }
        self.groups.insert(ask.group.clone(), change.mine);
        change.verdict
    }
}

/// Whether `mine` holds more than its weighted share of the tokens of the groups competing now:
/// itself and every other group that [`GroupUse::competes`]. Never with no other group competing,
/// nor for a group with no tokens in the window (its first task always starts).
fn over_share(state: &BTreeMap<String, GroupUse>, ask: &ShareAsk, mine: &GroupUse) -> bool {
    let (now, s) = (ask.now_ms, &ask.settings);
    let others: Vec<&GroupUse> =
        state.iter().filter(|(g, u)| **g != ask.group && u.competes(now, s)).map(|(_, u)| u).collect();
    let used = recent(mine, now, s.window_ms);
    if others.is_empty() || used == 0 {
        return false;
    }
    let total: u128 = used as u128 + others.iter().map(|u| recent(u, now, s.window_ms) as u128).sum::<u128>();
    let weights: u128 = mine.weight as u128 + others.iter().map(|u| u.weight.max(1) as u128).sum::<u128>();
    used as u128 * weights > total * mine.weight as u128
}

/// One group's standing in its lane: the share of the window's tokens it received, against the
/// share its weight entitles it to.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    /// The group.
    pub group: String,
    /// Its tokens over the sliding window, over every group's (0 when nobody used any).
    pub received: f64,
    /// Its weight over the weights of the groups active in the window.
    pub entitled: f64,
}

/// Every active group's [`Standing`] at `now_ms`: a group is active while it has tokens in the
/// window or tasks waiting. Entitlement is by weight among the active groups alone, so a group
/// that goes quiet leaves its share to the others; one that asks for less than it is entitled to
/// receives less, which is not unfair (the policy puts a group off only while another waits).
pub fn standings(state: &BTreeMap<String, GroupUse>, now_ms: u64, s: &ShareSettings) -> Vec<Standing> {
    let active: Vec<(&String, u64, u64)> = state
        .iter()
        .map(|(g, u)| (g, u, recent(u, now_ms, s.window_ms)))
        .filter(|(_, u, used)| *used > 0 || u.waiting(now_ms, s) > 0)
        .map(|(g, u, used)| (g, used, u.weight.clamp(1, MAX_WEIGHT)))
        .collect();
    let tokens: u128 = active.iter().map(|(_, used, _)| *used as u128).sum();
    let weights: u64 = active.iter().map(|(_, _, w)| w).sum();
    active
        .into_iter()
        .map(|(g, used, w)| Standing {
            group: g.clone(),
            received: if tokens == 0 { 0.0 } else { used as f64 / tokens as f64 },
            entitled: w as f64 / weights as f64,
        })
        .collect()
}

/// Weights per tenant (or project, with tenancy off) from `LANES_TENANT_WEIGHTS`:
/// `name=weight,name=weight`; a name not listed weighs 1.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Weights(BTreeMap<String, u64>);

impl Weights {
    /// No weights: every name weighs 1.
    pub const fn none() -> Self {
        Self(BTreeMap::new())
    }

    /// Parses `team-a=3,team-b=1`; an entry without `=`, a name listed twice, or a weight that is not
    /// a whole number from 1 to [`MAX_WEIGHT`] is an error naming the entry.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut out = BTreeMap::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, weight) =
                entry.rsplit_once('=').ok_or_else(|| format!("`{entry}` is not `name=weight`"))?;
            let name = name.trim();
            let weight: u64 =
                weight.trim().parse().ok().filter(|w| (1..=MAX_WEIGHT).contains(w)).ok_or_else(|| {
                    format!("`{entry}`: the weight must be a whole number from 1 to {MAX_WEIGHT}")
                })?;
            if name.is_empty() {
                return Err(format!("`{entry}` names no tenant"));
            }
            if out.insert(name.to_owned(), weight).is_some() {
                return Err(format!("`{name}` is listed twice"));
            }
        }
        Ok(Self(out))
    }

    /// The weight of `name` (1 when not listed).
    pub fn of(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(1)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// No patience: every waiting group competes at once, so the tests below read the share alone.
    fn settings() -> ShareSettings {
        ShareSettings { window_ms: 10_000, forget_ms: 5_000, put_off_ms: 100, patience_ms: 0 }
    }

    /// Applies `ask` as a store would ([`LaneShares::apply`]).
    fn apply(lane: &mut LaneShares, group: &str, weight: u64, step_: Step, now_ms: u64) -> Verdict {
        lane.apply(&ShareAsk { group: group.into(), weight, step: step_, now_ms, settings: settings() })
    }

    #[test]
    fn the_sliding_window_weighs_the_last_window_by_its_overlap() {
        let u = GroupUse { current: 100, previous: 0, window: 1, ..Default::default() };
        assert_eq!(recent(&u, 15_000, 10_000), 100);
        assert_eq!(recent(&u, 25_000, 10_000), 50, "half of window 1 still overlaps");
        assert_eq!(recent(&u, 35_000, 10_000), 0);
        assert_eq!(GroupUse::decode(&u.encode()), Some(u));
        assert_eq!(GroupUse::decode("1 2 3"), None);
    }

    #[test]
    fn alone_a_group_always_starts_whatever_it_has_used() {
        let mut st = LaneShares::default();
        for i in 0..50 {
            apply(&mut st, "big", 1, Step::Submit, i * 10);
            assert_eq!(apply(&mut st, "big", 1, Step::Decide { estimate: 10_000 }, i * 10 + 1), Verdict::Go);
        }
    }

    #[test]
    fn a_group_over_its_token_share_waits_while_another_has_work_waiting() {
        let mut st = LaneShares::default();
        apply(&mut st, "big", 1, Step::Submit, 0);
        assert_eq!(apply(&mut st, "big", 1, Step::Decide { estimate: 10_000 }, 1), Verdict::Go);
        apply(&mut st, "small", 1, Step::Submit, 2);
        apply(&mut st, "big", 1, Step::Submit, 3);
        assert_eq!(apply(&mut st, "big", 1, Step::Decide { estimate: 10_000 }, 4), Verdict::PutOff);
        assert_eq!(st.groups["big"].queued, 1, "a put-off task still waits");
        assert_eq!(apply(&mut st, "small", 1, Step::Decide { estimate: 1_000 }, 5), Verdict::Go);
        assert_eq!(
            apply(&mut st, "big", 1, Step::Decide { estimate: 10_000 }, 6),
            Verdict::Go,
            "small waits no more"
        );
    }

    #[test]
    fn weights_scale_the_share_and_settles_correct_the_charge() {
        let mut st = LaneShares::default();
        apply(&mut st, "a", 3, Step::Submit, 0);
        apply(&mut st, "a", 3, Step::Decide { estimate: 2_000 }, 1);
        apply(&mut st, "b", 1, Step::Submit, 2);
        apply(&mut st, "b", 1, Step::Decide { estimate: 1_000 }, 3);
        apply(&mut st, "b", 1, Step::Submit, 4);
        apply(&mut st, "a", 3, Step::Submit, 5);
        // a holds 2000 of 3000 with weight 3 of 4: under its share.
        assert_eq!(apply(&mut st, "a", 3, Step::Decide { estimate: 2_000 }, 6), Verdict::Go);
        apply(&mut st, "a", 3, Step::Submit, 7);
        // 4000 of 5000 is over 3/4: put off while b waits.
        assert_eq!(apply(&mut st, "a", 3, Step::Decide { estimate: 2_000 }, 8), Verdict::PutOff);
        // The answers used far less than estimated: back under.
        apply(&mut st, "a", 3, Step::Settle { delta: -3_500 }, 9);
        assert_eq!(st.groups["a"].current, 500);
        assert_eq!(apply(&mut st, "a", 3, Step::Decide { estimate: 2_000 }, 10), Verdict::Go);
    }

    #[test]
    fn a_waiting_count_nobody_touches_is_forgotten_and_idle_groups_are_dropped() {
        let mut st = LaneShares::default();
        apply(&mut st, "big", 1, Step::Submit, 0);
        apply(&mut st, "big", 1, Step::Decide { estimate: 10_000 }, 1);
        apply(&mut st, "ghost", 1, Step::Submit, 2); // cancelled before it ever starts
        apply(&mut st, "big", 1, Step::Submit, 3);
        assert_eq!(apply(&mut st, "big", 1, Step::Decide { estimate: 10_000 }, 4), Verdict::PutOff);
        assert_eq!(
            apply(&mut st, "big", 1, Step::Decide { estimate: 10_000 }, 5_003),
            Verdict::Go,
            "forgotten"
        );
        // Two windows idle and nothing waiting: the first start decision a window after the last
        // sweep drops it; a submission or a correction reads the asking group's entry alone, and
        // leaves the others as they are.
        apply(&mut st, "ghost2", 1, Step::Submit, 10_500);
        apply(&mut st, "big", 1, Step::Submit, 30_000);
        apply(&mut st, "big", 1, Step::Settle { delta: -10 }, 30_001);
        assert!(st.groups.contains_key("ghost"));
        apply(&mut st, "big", 1, Step::Decide { estimate: 10_000 }, 30_002);
        assert!(!st.groups.contains_key("ghost"), "two windows idle and nothing waiting");
        assert_eq!(st.swept_ms, 30_002);
        // ghost2 goes idle after that sweep: the decisions within a window of it leave it.
        apply(&mut st, "big", 1, Step::Decide { estimate: 1 }, 31_000);
        assert!(st.groups.contains_key("ghost2"), "idle, and no sweep is due");
        apply(&mut st, "big", 1, Step::Decide { estimate: 1 }, 40_002);
        assert!(!st.groups.contains_key("ghost2"), "a window after the last sweep");
        assert_eq!(st.swept_ms, 40_002);
    }

    #[test]
    fn a_group_competes_only_once_its_waiting_has_lasted_the_patience() {
        let patient = ShareSettings { patience_ms: 50, ..settings() };
        let mut st = LaneShares::default();
        let ask = |st: &mut LaneShares, group: &str, step_: Step, now_ms: u64| {
            st.apply(&ShareAsk { group: group.into(), weight: 1, step: step_, now_ms, settings: patient })
        };
        let big = Step::Decide { estimate: 10_000 };
        ask(&mut st, "big", Step::Submit, 0);
        ask(&mut st, "big", big, 1);
        ask(&mut st, "small", Step::Submit, 100);
        ask(&mut st, "small", Step::Submit, 130);
        ask(&mut st, "big", Step::Submit, 131);
        assert_eq!(
            ask(&mut st, "big", big, 140),
            Verdict::Go,
            "small has waited 40 ms: a free slot takes it"
        );
        assert_eq!(ask(&mut st, "big", big, 150), Verdict::PutOff, "its waiting began 50 ms ago");
        assert_eq!(st.groups["small"].since_ms, 100, "a second submission keeps when the waiting began");
        ask(&mut st, "small", Step::Decide { estimate: 1 }, 151);
        ask(&mut st, "small", Step::Decide { estimate: 1 }, 152);
        ask(&mut st, "small", Step::Submit, 400);
        assert_eq!(st.groups["small"].since_ms, 400, "waiting again after none waited begins anew");
        assert_eq!(ask(&mut st, "big", big, 420), Verdict::Go);
        let old = GroupUse::decode("1 2 3 4 5 6").unwrap();
        assert_eq!((old.queued, old.since_ms), (4, 0), "an entry written without since_ms competes at once");
    }

    #[test]
    fn standings_compare_the_tokens_received_with_the_weighted_share_of_the_active_groups() {
        let mut st = LaneShares::default();
        apply(&mut st, "a", 3, Step::Submit, 0);
        apply(&mut st, "a", 3, Step::Decide { estimate: 1_000 }, 1);
        apply(&mut st, "b", 1, Step::Submit, 2);
        apply(&mut st, "b", 1, Step::Decide { estimate: 3_000 }, 3);
        apply(&mut st, "c", 4, Step::Submit, 4); // waiting, nothing used yet
        apply(&mut st, "d", 1, Step::Submit, 5);
        apply(&mut st, "d", 1, Step::Decide { estimate: 1 }, 6);
        apply(&mut st, "d", 1, Step::Settle { delta: -1 }, 7); // used nothing, waits for nothing
        let s = standings(&st.groups, 8, &settings());
        let got: Vec<(&str, f64, f64)> =
            s.iter().map(|x| (x.group.as_str(), x.received, x.entitled)).collect();
        assert_eq!(got, vec![("a", 0.25, 3.0 / 8.0), ("b", 0.75, 1.0 / 8.0), ("c", 0.0, 0.5)]);
        // Half a window after the next one began, half of the tokens still count; once c's
        // waiting is forgotten it is no longer active.
        let later = standings(&st.groups, 15_000, &settings());
        let got: Vec<(&str, f64, f64)> =
            later.iter().map(|x| (x.group.as_str(), x.received, x.entitled)).collect();
        assert_eq!(got, vec![("a", 0.25, 0.75), ("b", 0.75, 0.25)]);
        assert!(standings(&st.groups, 40_000, &settings()).is_empty(), "nothing left in the window");
    }

    #[test]
    fn weights_parse_or_name_the_bad_entry() {
        let w = Weights::parse(" team-a=3, arn:aws:iam::1:role/x=2 ,").unwrap();
        assert_eq!((w.of("team-a"), w.of("arn:aws:iam::1:role/x"), w.of("other")), (3, 2, 1));
        assert_eq!(Weights::parse("").unwrap(), Weights::default());
        for (bad, names) in [
            ("a", "`a`"),
            ("a=0", "a=0"),
            ("a=x", "a=x"),
            ("a=1001", "a=1001"),
            ("=2", "=2"),
            ("a=1,a=2", "`a`"),
        ] {
            let e = Weights::parse(bad).unwrap_err();
            assert!(e.contains(names), "{bad}: {e}");
        }
    }
}

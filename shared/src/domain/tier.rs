//! Service tiers: the price a call is made at, and the choice of it from the work's deadline. Pure.
//!
//! A provider sells the same model at more than one tier. `sync` is the ordinary call at list price;
//! `priority` (OpenAI's and Bedrock's) is served ahead of the others at a premium.
//! `flex` (OpenAI's `service_tier: "flex"`, Bedrock's `serviceTier: flex`) is the same synchronous
//! call at the batch discount, slower, and refused when the provider lacks capacity; a refusal (or a
//! flex call failing as a retry would answer: a 5xx, a timeout) is answered by calling again at
//! `sync` (see `crate::llm::route`), so flex never spends a task's attempts.
//!
//! Each lane has a [`TierSetting`] (`LANES_TIER_<LANE>`) and a deadline (`LANES_DEADLINE_SECS_<LANE>`):
//! how long after it was enqueued its work may finish. [`choose`] makes `auto` a decision from the
//! time left: flex while a slow flex call still fits in it with room to spare, sync once it does not.
//! Nobody waits for a commit summary, so the commits lane is `auto` with a deadline of six hours by
//! default; interactive and synthesis tasks stay `sync` unless configured.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The tier a call is made, or was served, at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The ordinary synchronous call at list price.
    #[default]
    Sync,
    /// A synchronous call at the batch discount, which the provider may refuse for capacity.
    Flex,
    /// A synchronous call served ahead of the others, at a premium (OpenAI's and Bedrock's
    /// `priority`): for work a person waits for.
    Priority,
    /// One request of a provider batch (OpenAI's Batch API, Anthropic's Message Batches): half the
    /// list price, answered within the provider's window (24 hours), collected later
    /// ([`crate::domain::batch`]).
    Batch,
}

impl Tier {
    /// The tier's name in configuration, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Sync => "sync",
            Tier::Flex => "flex",
            Tier::Priority => "priority",
            Tier::Batch => "batch",
        }
    }

    /// How far along the price ladder the tier is, cheapest first: batch, flex, sync, priority.
    fn rank(self) -> u8 {
        match self {
            Tier::Batch => 0,
            Tier::Flex => 1,
            Tier::Sync => 2,
            Tier::Priority => 3,
        }
    }

    /// This tier, or `floor` where that is the dearer: work escalated from a batch is never asked
    /// at a cheaper tier than the one it escalated to.
    pub fn at_least(self, floor: Option<Tier>) -> Tier {
        match floor {
            Some(f) if f.rank() > self.rank() => f,
            _ => self,
        }
    }
}

/// What a lane is configured to call at (`LANES_TIER_<LANE>`): `sync`, `flex`, `auto` or `priority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierSetting {
    /// Always `sync`.
    Sync,
    /// `flex` wherever the route offers it, whatever the deadline.
    Flex,
    /// `flex` while the deadline leaves room for it ([`choose`]), else `sync`.
    Auto,
    /// Always `priority` wherever the route offers it.
    Priority,
    /// A provider batch while the deadline leaves room for one to finish ([`BATCH_HEADROOM`]),
    /// then as `auto`. Taken by the commits lane, on a route with a batch API.
    Batch,
}

impl TierSetting {
    /// Parses `sync`, `flex`, `auto`, `priority` or `batch`; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sync" => Some(TierSetting::Sync),
            "flex" => Some(TierSetting::Flex),
            "auto" => Some(TierSetting::Auto),
            "priority" => Some(TierSetting::Priority),
            "batch" => Some(TierSetting::Batch),
            _ => None,
        }
    }
}

/// The longest a flex call is expected to take, and so the least time left at which `auto` still
/// chooses it. OpenAI advises a 15-minute client timeout for flex calls, against the 10 minutes of an
/// ordinary one; a call refused for capacity is then made at `sync` with the rest of the time.
pub const FLEX_HEADROOM: Duration = Duration::from_secs(15 * 60);

/// How long a batch is given before the collector gives up on it and escalates what it has not
/// answered ([`crate::domain::batch::step`]): a slow flex call, and a cancellation's grace (OpenAI
/// takes up to ten minutes to cancel a batch), and two collector ticks, before the deadline.
pub const ESCALATE_BEFORE: Duration = Duration::from_secs(15 * 60 + 10 * 60 + 2 * 60);

/// The least time left at which a batch is chosen: half an hour for the batch to run (the
/// providers promise 24 hours but finish a small batch in minutes), plus [`ESCALATE_BEFORE`]. So a
/// one-hour deadline still batches, and whatever the batch has not answered half an hour in goes
/// on at flex or sync in time.
pub const BATCH_HEADROOM: Duration = Duration::from_secs(30 * 60 + ESCALATE_BEFORE.as_secs());

/// The tier to call at for work of a lane with `setting` and `deadline` that has waited `waited`
/// since it was enqueued. `auto` with no deadline is `sync`: the lane declared no patience.
pub fn choose(setting: TierSetting, deadline: Option<Duration>, waited: Duration) -> Tier {
    match setting {
        TierSetting::Sync => Tier::Sync,
        TierSetting::Flex => Tier::Flex,
        TierSetting::Priority => Tier::Priority,
        TierSetting::Batch if deadline.is_some_and(|d| d.saturating_sub(waited) >= BATCH_HEADROOM) => {
            Tier::Batch
        }
        TierSetting::Auto | TierSetting::Batch => match deadline {
            Some(d) if d.saturating_sub(waited) >= FLEX_HEADROOM => Tier::Flex,
            _ => Tier::Sync,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_calls_at_flex_while_a_slow_flex_call_fits_before_the_deadline() {
        let hours = |h: u64| Duration::from_secs(h * 3600);
        let six = Some(hours(6));
        assert_eq!(choose(TierSetting::Auto, six, Duration::ZERO), Tier::Flex);
        assert_eq!(choose(TierSetting::Auto, six, hours(6) - FLEX_HEADROOM), Tier::Flex);
        assert_eq!(
            choose(TierSetting::Auto, six, hours(6) - FLEX_HEADROOM + Duration::from_secs(1)),
            Tier::Sync
        );
        // Past the deadline: at once, at full price.
        assert_eq!(choose(TierSetting::Auto, six, hours(7)), Tier::Sync);
        // A deadline shorter than the headroom never waits for flex, and no deadline means none.
        assert_eq!(choose(TierSetting::Auto, Some(Duration::from_secs(600)), Duration::ZERO), Tier::Sync);
        assert_eq!(choose(TierSetting::Auto, None, Duration::ZERO), Tier::Sync);
        // The fixed settings ignore the clock.
        assert_eq!(choose(TierSetting::Flex, None, hours(100)), Tier::Flex);
        assert_eq!(choose(TierSetting::Sync, six, Duration::ZERO), Tier::Sync);
        assert_eq!(choose(TierSetting::Priority, six, hours(7)), Tier::Priority);
    }

    #[test]
    fn batch_while_a_batch_fits_then_flex_then_sync_and_a_floor_only_raises() {
        let hours = |h: u64| Duration::from_secs(h * 3600);
        let six = Some(hours(6));
        assert_eq!(choose(TierSetting::Batch, six, Duration::ZERO), Tier::Batch);
        assert_eq!(choose(TierSetting::Batch, six, hours(6) - BATCH_HEADROOM), Tier::Batch);
        let late = hours(6) - BATCH_HEADROOM + Duration::from_secs(1);
        assert_eq!(choose(TierSetting::Batch, six, late), Tier::Flex);
        assert_eq!(choose(TierSetting::Batch, six, hours(6) - FLEX_HEADROOM / 2), Tier::Sync);
        assert_eq!(choose(TierSetting::Batch, None, Duration::ZERO), Tier::Sync);
        // `auto` never batches: a batch needs a collector, which the lane must ask for.
        assert_eq!(choose(TierSetting::Auto, six, Duration::ZERO), Tier::Flex);
        assert_eq!(Tier::Batch.at_least(Some(Tier::Flex)), Tier::Flex);
        assert_eq!(Tier::Sync.at_least(Some(Tier::Flex)), Tier::Sync);
        assert_eq!(Tier::Flex.at_least(None), Tier::Flex);
        assert!(ESCALATE_BEFORE > FLEX_HEADROOM && BATCH_HEADROOM > ESCALATE_BEFORE);
    }

    #[test]
    fn settings_parse_by_name_and_nothing_else() {
        assert_eq!(TierSetting::parse(" Flex "), Some(TierSetting::Flex));
        assert_eq!(TierSetting::parse("auto"), Some(TierSetting::Auto));
        assert_eq!(TierSetting::parse("sync"), Some(TierSetting::Sync));
        assert_eq!(TierSetting::parse("PRIORITY"), Some(TierSetting::Priority));
        assert_eq!(TierSetting::parse("batch"), Some(TierSetting::Batch));
        for bad in ["", "default", "fast"] {
            assert_eq!(TierSetting::parse(bad), None, "{bad}");
        }
        assert_eq!(Tier::Flex.as_str(), "flex");
        assert_eq!(serde_json::to_string(&Tier::Sync).unwrap(), "\"sync\"");
    }
}

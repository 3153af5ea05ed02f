//! The shared LLM rate limiter (see docs/ARCHITECTURE.md, LLM gateway): requests per minute and tokens per minute, with lane
//! reservations. Interactive holds 70% of each budget and the background lanes 30%. A class that
//! leaves its bucket full (idle) lends its refill as it accrues: the overflow goes to the other
//! class's bucket, so one class alone uses the whole limit. The lender keeps its burst, so its own
//! work, when it comes, is admitted at once and takes its whole refill back; the 70/30 split holds
//! only while both classes have work. Tokens are charged with an estimate before the call and
//! reconciled with the provider's reported usage after it.
//!
//! Admission is smooth, GCRA-style: each class has a bucket per dimension that holds only a small
//! burst (5% of its share of the window's limit) and refills continuously at the rest of its share
//! over the window. Whatever the window starts, what is admitted in it is at most the burst plus the
//! refill, i.e. the limit, so a provider counting per calendar window, per sliding window or by token
//! bucket never sees more than its limit; about 95% of it is used under load. A request larger than
//! half a burst waits for half a bucket and then runs into debt that later refills pay.
//!
//! Limits are the configured caps (`LANES_LLM_RPM`/`TPM`, optional) or, lower, what the provider
//! says in its rate-limit headers ([`ProviderLimits`], learned per process from each answer). A 429
//! (or a provider that says its budget is spent) starts a cooldown stored with the buckets, so every
//! worker waits it out instead of each retrying on its own.
//!
//! [`decide`] is the algorithm; [`MemoryLimiter`] runs it in process and
//! `adapters::redis::limiter::RedisLimiter` runs the same steps as one Lua script shared by every
//! worker.

use crate::clock::SharedClock;
use crate::domain::Lane;
pub use crate::domain::limits::{Class, Decision, Learned, LimiterConfig, ProviderLimits, UNKNOWN};
pub use crate::ports::{LimiterError, RateLimiter};
use async_trait::async_trait;
use std::sync::Mutex;
use std::time::Duration;

/// Bucket levels (requests i/b, tokens i/b) and when they were last refilled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    /// Levels; a level may go below zero after reconciliation (a debt paid by later refills).
    pub levels: [f64; 4],
    /// Unix ms of the last refill.
    pub at_ms: u64,
    /// Unix ms until which every class waits (a provider's 429 or spent budget).
    pub cool_until_ms: u64,
    /// Whether the buckets were lined up with the provider's window ([`align`]) since they started
    /// (fresh, or empty after the limits came down).
    pub aligned: bool,
}

impl BucketState {
    /// Full buckets (one burst each) at `now_ms`.
    pub fn full(config: &LimiterConfig, now_ms: u64) -> Self {
        Self { levels: config.caps(), at_ms: now_ms, cool_until_ms: 0, aligned: false }
    }
}

fn refill(config: &LimiterConfig, state: &mut BucketState, now_ms: u64) {
    let elapsed = now_ms.saturating_sub(state.at_ms) as f64;
    let (caps, rates) = (config.caps(), config.rates());
    // A level above its cap means the limits just came down (first learned from the provider, or
    // lowered): what was admitted so far ran unpaced, so the new pace starts from empty, to be lined
    // up with the provider's window by the next answer.
    for (level, cap) in state.levels.iter_mut().zip(caps) {
        if *level > cap * (1.0 + 1e-9) + 1e-9 {
            *level = 0.0;
            state.aligned = false;
        }
    }
    for dim in [0, 2] {
        let (a, b) = (dim, dim + 1);
        let mut grown = [state.levels[a] + elapsed * rates[a], state.levels[b] + elapsed * rates[b]];
        spill(&mut grown, [caps[a], caps[b]]);
        state.levels[a] = grown[0];
        state.levels[b] = grown[1];
    }
    state.at_ms = state.at_ms.max(now_ms);
}

/// Caps two classes' refilled levels of one dimension, the overflow of a full bucket going to the
/// other class: an idle class's refill is lent as it accrues, and stops being lent the moment its
/// own work takes from its bucket (a bucket below its cap keeps its whole refill). Exact for a
/// piecewise-linear refill: once one bucket is full, the other refills at both rates.
fn spill(levels: &mut [f64; 2], caps: [f64; 2]) {
    for (from, to) in [(0, 1), (1, 0)] {
        let over = levels[from] - caps[from];
        if over > 0.0 {
            levels[from] = caps[from];
            levels[to] = (levels[to] + over).min(caps[to]);
        }
    }
}

/// Starts (or extends) the shared cooldown to `until_ms`.
pub fn cool_down(state: &mut BucketState, until_ms: u64) {
    state.cool_until_ms = state.cool_until_ms.max(until_ms);
}

/// Takes one request and `tokens` for `class`, or says how long to wait. All or nothing. A caller
/// willing to wait up to `reserve_up_to_ms` for its own class's refill gets the budget reserved
/// ([`Decision::Reserved`]) instead of polling again: reservations keep arrival order within a class,
/// and a class with waiting callers holds a bucket below its cap, so nothing of its refill spills to
/// the other class: only a truly idle class lends.
pub fn decide(
    config: &LimiterConfig,
    state: &mut BucketState,
    now_ms: u64,
    class: Class,
    tokens: u64,
    reserve_up_to_ms: u64,
) -> Decision {
    if state.cool_until_ms > now_ms {
        return Decision::Wait(Duration::from_millis(state.cool_until_ms - now_ms));
    }
    refill(config, state, now_ms);
    let (caps, rates) = (config.caps(), config.rates());
    let (own_off, other_off) = match class {
        Class::Interactive => (0, 1),
        Class::Background => (1, 0),
    };
    let mut wait_ms = 0.0f64;
    // Whether some dimension's wait counts on the other class's refill.
    let mut lent_sooner = false;
    for (dim, need) in [(0usize, 1.0f64), (2, tokens as f64)] {
        let (own, other) = (dim + own_off, dim + other_off);
        // A request waits for at most a share of its class's bucket, then runs into debt that later
        // refills pay: a request larger than the bucket is admitted at all.
        let need_now = need.min(caps[own] * config.wait_for.clamp(0.1, 1.0));
        if state.levels[own] >= need_now {
            continue;
        }
        // Its own bucket fills at its own rate, or at both classes' while the other's is full (idle)
        // and spills into it.
        let own_wait =
            if rates[own] > 0.0 { (need_now - state.levels[own]) / rates[own] } else { config.window_ms };
        let both = rates[own] + rates[other];
        let other_full = state.levels[other] >= caps[other] * (1.0 - 1e-9);
        let sooner = if other_full && both > 0.0 { (need_now - state.levels[own]) / both } else { own_wait };
        // A wait shortened by the other class's refill lasts only while that class stays idle, so it
        // is polled again rather than reserved.
        lent_sooner |= sooner < own_wait;
        wait_ms = wait_ms.max(sooner);
    }
    let wait = wait_ms.ceil() as u64;
    if wait > 0 && (lent_sooner || wait > reserve_up_to_ms) {
        return Decision::Wait(Duration::from_millis(wait));
    }
    // Granted now, or reserved: the budget is taken either way.
    state.levels[own_off] -= 1.0;
    state.levels[2 + own_off] -= tokens as f64;
    if wait > 0 {
        return Decision::Reserved(Duration::from_millis(wait));
    }
    Decision::Granted
}

/// Lines the buckets up with what the provider says is left of its current window, after an answer
/// to a call of `class`: both buckets together hold at most the remaining budget less what they
/// refill before the reset, so the rest of that window admits no more than is left, the calls made
/// before the limits were known (unpaced) included. That debt is `class`'s, whose calls ran unpaced;
/// the other class starts full, so if it is idle it lends its refill at once ([`refill`]). Without
/// a reset the window is taken as just begun (the most the rest of it can last). Once per start of
/// the buckets: later, a token-bucket provider's `reset-*` (time to full) would make this stall a
/// busy deployment for nothing. Never below minus a window's share.
pub fn align(
    config: &LimiterConfig,
    state: &mut BucketState,
    now_ms: u64,
    limits: &ProviderLimits,
    class: Class,
) {
    refill(config, state, now_ms);
    if state.aligned || limits.remaining.iter().all(Option::is_none) {
        return;
    }
    state.aligned = true;
    let (shares, rates, caps) = (config.shares(), config.rates(), config.caps());
    for dim in 0..2 {
        let Some(left) = limits.remaining[dim] else { continue };
        // A provider that says what is left but not when its window ends (LiteLLM's proxy) may have
        // just begun one: what is left must then last a whole window.
        let reset = limits.reset[dim].map_or(config.window_ms, |r| r.as_millis() as f64);
        let (own, other) = (dim * 2 + class as usize, dim * 2 + 1 - class as usize);
        let ceiling = left - (rates[own] + rates[other]) * reset;
        let levels = &mut state.levels;
        // The other class starts full (it may be idle, and then lends from now on), unless the debt
        // is more than `class` can hold above its floor.
        levels[other] = caps[other].min(ceiling + shares[own]).max(-shares[other]);
        levels[own] = levels[own].min(ceiling - levels[other].max(0.0)).max(-shares[own]);
    }
}

/// Returns a reservation that was not used (a 429 paused everyone while it waited): its request and
/// its tokens go back to `class`'s buckets, refilled to `now_ms` first.
pub fn give_back(config: &LimiterConfig, state: &mut BucketState, now_ms: u64, class: Class, tokens: u64) {
    refill(config, state, now_ms);
    let caps = config.caps();
    for (i, amount) in [(class as usize, 1.0), (2 + class as usize, tokens as f64)] {
        state.levels[i] = (state.levels[i] + amount).min(caps[i]);
    }
}

/// Puts back an overestimate, or charges an underestimate, to `class`'s token bucket (refilled to
/// `now_ms` first, as the Redis script does, so an underestimate is never forgiven by the cap).
pub fn reconcile(
    config: &LimiterConfig,
    state: &mut BucketState,
    now_ms: u64,
    class: Class,
    estimated: u64,
    actual: u64,
) {
    refill(config, state, now_ms);
    let i = 2 + class as usize;
    let cap = config.caps()[i];
    state.levels[i] = (state.levels[i] + estimated as f64 - actual as f64).min(cap);
}

/// The in-process limiter (local mode, tests).
#[derive(Debug)]
pub struct MemoryLimiter {
    config: LimiterConfig,
    learned: Learned,
    clock: SharedClock,
    state: Mutex<BucketState>,
}

impl MemoryLimiter {
    /// Full buckets now.
    pub fn new(config: LimiterConfig, clock: SharedClock) -> Self {
        let state = Mutex::new(BucketState::full(&config, clock.now_ms()));
        Self { config, learned: Learned::default(), clock, state }
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, BucketState>, LimiterError> {
        self.state.lock().map_err(|_| LimiterError::Unavailable("poisoned".into()))
    }
}

#[async_trait]
impl RateLimiter for MemoryLimiter {
    async fn try_acquire(
        &self,
        lane: Lane,
        tokens: u64,
        reserve_up_to: Duration,
    ) -> Result<Decision, LimiterError> {
        let config = self.learned.apply(&self.config);
        let reserve = reserve_up_to.as_millis() as u64;
        Ok(decide(&config, &mut *self.state()?, self.clock.now_ms(), lane.into(), tokens, reserve))
    }

    async fn reconcile(&self, lane: Lane, estimated: u64, actual: u64) -> Result<(), LimiterError> {
        let config = self.learned.apply(&self.config);
        reconcile(&config, &mut *self.state()?, self.clock.now_ms(), lane.into(), estimated, actual);
        Ok(())
    }

    async fn cool_down(&self, for_: Duration) -> Result<(), LimiterError> {
        cool_down(&mut *self.state()?, self.clock.now_ms() + for_.as_millis() as u64);
        Ok(())
    }

    async fn give_back(&self, lane: Lane, tokens: u64) -> Result<(), LimiterError> {
        let config = self.learned.apply(&self.config);
        give_back(&config, &mut *self.state()?, self.clock.now_ms(), lane.into(), tokens);
        Ok(())
    }

    async fn cooling_for(&self) -> Result<Option<Duration>, LimiterError> {
        let left = self.state()?.cool_until_ms.saturating_sub(self.clock.now_ms());
        Ok((left > 0).then(|| Duration::from_millis(left)))
    }

    fn learn(&self, limits: &ProviderLimits) -> bool {
        self.learned.learn(limits)
    }

    async fn align(&self, lane: Lane, limits: &ProviderLimits) -> Result<(), LimiterError> {
        let config = self.learned.apply(&self.config);
        align(&config, &mut *self.state()?, self.clock.now_ms(), limits, lane.into());
        Ok(())
    }

    fn limits(&self) -> LimiterConfig {
        self.learned.apply(&self.config)
    }
}

/// Caps from `LANES_LLM_RPM` and `LANES_LLM_TPM` (either may be left out); `None` when both are
/// unset (the limits are then learned from the provider's headers).
pub fn config_from_env() -> Result<Option<LimiterConfig>, crate::config::ConfigError> {
    use crate::config::ConfigError;
    let read = |name: &'static str| -> Result<Option<f64>, ConfigError> {
        match crate::config::optional_env(name) {
            None => Ok(None),
            Some(v) => match v.trim().parse::<f64>() {
                Ok(n) if n > 0.0 => Ok(Some(n)),
                _ => Err(ConfigError::Invalid { name, reason: format!("`{v}` is not a positive number") }),
            },
        }
    };
    match (read("LANES_LLM_RPM")?, read("LANES_LLM_TPM")?) {
        (None, None) => Ok(None),
        (rpm, tpm) => Ok(Some(LimiterConfig::new(rpm.unwrap_or(UNKNOWN), tpm.unwrap_or(UNKNOWN)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a limiter with two saturated (or one idle) classes on a simulated clock and returns the
    /// tokens each class got over `minutes` windows.
    fn simulate(
        config: LimiterConfig,
        minutes: u64,
        tokens_per_call: [u64; 2],
        active: [bool; 2],
        reserve_ms: u64,
    ) -> [u64; 2] {
        let mut state = BucketState::full(&config, 0);
        let mut now = 0u64;
        let mut got = [0u64; 2];
        let mut next = [0u64; 2];
        let end = (minutes as f64 * config.window_ms) as u64;
        while now < end {
            for (i, class) in [Class::Interactive, Class::Background].into_iter().enumerate() {
                if !active[i] || next[i] > now {
                    continue;
                }
                match decide(&config, &mut state, now, class, tokens_per_call[i], reserve_ms) {
                    Decision::Granted => got[i] += tokens_per_call[i],
                    Decision::Reserved(d) => {
                        got[i] += tokens_per_call[i];
                        next[i] = now + d.as_millis().max(1) as u64;
                    }
                    Decision::Wait(d) => next[i] = now + d.as_millis().max(1) as u64,
                }
            }
            now = next
                .iter()
                .zip(active)
                .filter(|(_, a)| *a)
                .map(|(n, _)| *n)
                .min()
                .unwrap_or(end)
                .max(now + 1);
        }
        got
    }

    #[test]
    fn both_saturated_interactive_keeps_its_reservation() {
        let cfg = LimiterConfig::new(600.0, 100_000.0);
        let got = simulate(cfg, 10, [500, 2_000], [true, true], 0);
        let share = got[0] as f64 / (got[0] + got[1]) as f64;
        assert!(share >= 0.65, "interactive got {share:.3} of the tokens");
        let total_per_min = (got[0] + got[1]) as f64 / 10.0;
        assert!(total_per_min <= 100_000.0, "never past the limit");
        // Callers that reserve (they will wait anyway) hold their class's place: the share is kept
        // within a rounding of one call.
        let got = simulate(cfg, 10, [500, 2_000], [true, true], 20_000);
        let share = got[0] as f64 / (got[0] + got[1]) as f64;
        assert!(share >= 0.69, "interactive got {share:.3} of the tokens when reserving");
        let total_per_min = (got[0] + got[1]) as f64 / 10.0;
        assert!(total_per_min <= 100_000.0 * 1.01, "never past the limit: {total_per_min}");
    }

    #[test]
    fn an_idle_interactive_lane_lends_to_the_background() {
        let cfg = LimiterConfig::new(600.0, 100_000.0);
        let got = simulate(cfg, 10, [500, 2_000], [false, true], 20_000);
        let per_min = got[1] as f64 / 10.0;
        assert!(per_min >= 0.9 * 100_000.0, "background got {per_min} tokens/min");
    }

    #[test]
    fn an_idle_background_lends_its_whole_share_to_interactive() {
        // The 30% kept for the background is lent as it accrues: interactive alone gets at least 95%
        // of 30 requests a minute, whether its callers poll or reserve (each bucket holds less than
        // one request here, so only the spill of the idle class's refill can give this).
        for reserve in [0, 20_000] {
            let cfg = LimiterConfig::new(30.0, 1e9);
            let got = simulate(cfg, 4, [100, 100], [true, false], reserve);
            let per_min = got[0] as f64 / 100.0 / 4.0;
            assert!(per_min >= 0.95 * 30.0, "interactive alone got {per_min} requests/min");
        }
    }

    #[test]
    fn a_lender_takes_its_share_back_as_soon_as_its_work_arrives() {
        // Interactive alone drains every bucket for a minute, the background's spill included.
        let cfg = LimiterConfig::new(30.0, 1e9);
        let mut s = BucketState::full(&cfg, 0);
        let mut now = 0;
        while now < 60_000 {
            match decide(&cfg, &mut s, now, Class::Interactive, 1, 0) {
                Decision::Granted => {}
                Decision::Wait(d) | Decision::Reserved(d) => now += d.as_millis().max(1) as u64,
            }
        }
        // The background's first request goes at once: what it did not use was lent, never its burst.
        assert_eq!(decide(&cfg, &mut s, now, Class::Background, 1, 0), Decision::Granted);
        // From then on, with both busy, each class keeps its own refill: nothing spills.
        let before = s.levels;
        refill(&cfg, &mut s, now + 1_000);
        let rates = cfg.rates();
        for class in [0, 1] {
            let grew = s.levels[class] - before[class];
            assert!((grew - 1_000.0 * rates[class]).abs() < 1e-9, "{:?}", s.levels);
        }
    }

    #[test]
    fn waits_are_exact_and_reconciliation_refunds() {
        // 60 rpm, 6000 tpm, 5% burst: interactive's token bucket holds 210 and refills 3990/min;
        // background's holds 90 and refills 1710/min.
        let cfg = LimiterConfig::new(60.0, 6_000.0);
        let mut s = BucketState::full(&cfg, 0);
        assert_eq!(decide(&cfg, &mut s, 0, Class::Interactive, 200, 0), Decision::Granted);
        // 10 left, short by 90. The background's bucket is full, so its refill spills into
        // interactive's, which fills at both rates (5700 tokens/min): 948 ms, not the 1.354 s it
        // would take on its own refill. The background keeps its burst for its own first call.
        let Decision::Wait(w) = decide(&cfg, &mut s, 0, Class::Interactive, 100, 0) else { panic!() };
        assert_eq!(w, Duration::from_millis(948));
        assert!((s.levels[3] - 90.0).abs() < 1e-9, "{:?}", s.levels);
        reconcile(&cfg, &mut s, 0, Class::Interactive, 200, 100);
        assert_eq!(
            decide(&cfg, &mut s, 0, Class::Interactive, 100, 0),
            Decision::Granted,
            "the overestimate came back"
        );
        // A cooldown makes every class wait it out, whatever its buckets hold.
        cool_down(&mut s, 5_000);
        assert_eq!(
            decide(&cfg, &mut s, 1_000, Class::Background, 1, 0),
            Decision::Wait(Duration::from_millis(4_000))
        );
        assert!(matches!(decide(&cfg, &mut s, 5_000, Class::Background, 1, 0), Decision::Granted));
        // A caller that would wait anyway reserves: the budget is taken now, the next one queues
        // behind it, and nothing is reserved past what the caller would wait.
        let cfg = LimiterConfig { interactive_share: 0.0, ..LimiterConfig::new(60.0, 1e9) };
        let mut s = BucketState::full(&cfg, 0);
        while decide(&cfg, &mut s, 0, Class::Background, 1, 0) == Decision::Granted {}
        let Decision::Reserved(first) = decide(&cfg, &mut s, 0, Class::Background, 1, 10_000) else {
            panic!()
        };
        let Decision::Reserved(second) = decide(&cfg, &mut s, 0, Class::Background, 1, 10_000) else {
            panic!()
        };
        assert!(second > first, "{first:?} then {second:?}");
        let before = s;
        assert!(matches!(decide(&cfg, &mut s, 0, Class::Background, 1, 1), Decision::Wait(_)));
        assert_eq!(s.levels, before.levels, "a wait takes nothing");
        // An unused reservation goes back whole: the next caller waits no longer than the second did.
        give_back(&cfg, &mut s, 0, Class::Background, 1);
        let Decision::Reserved(again) = decide(&cfg, &mut s, 0, Class::Background, 1, 10_000) else {
            panic!()
        };
        assert_eq!(again, second);
        // Limits coming down (first learned) restart the buckets empty.
        let cfg = LimiterConfig::new(60.0, 6_000.0);
        let mut s = BucketState::full(&LimiterConfig::unknown(), 0);
        assert!(matches!(decide(&cfg, &mut s, 0, Class::Interactive, 1, 0), Decision::Wait(_)));
    }

    #[test]
    fn the_first_answer_lines_the_buckets_up_with_the_providers_window_once() {
        // 1,000 tokens a second; the first answer says 600 are left for the next 500 ms.
        let cfg = LimiterConfig { window_ms: 1_000.0, ..LimiterConfig::new(1e6, 1_000.0) };
        let mut s = BucketState::full(&cfg, 0);
        let said = ProviderLimits {
            remaining: [None, Some(600.0)],
            reset: [None, Some(Duration::from_millis(500))],
            ..Default::default()
        };
        align(&cfg, &mut s, 0, &said, Class::Interactive);
        // What the rest of that window admits: the levels plus 95% of 1,000/s for 500 ms.
        let admitted = s.levels[2] + s.levels[3] + 0.95 * 1_000.0 * 0.5;
        assert!(admitted <= 600.0 + 1e-6, "{admitted}");
        // The debt is the answering class's: the other starts full, to lend at once if idle.
        assert_eq!(s.levels[3], cfg.caps()[3]);
        // Once per start of the buckets: a later answer (a token-bucket provider's time to full,
        // say) changes nothing.
        let before = s;
        align(
            &cfg,
            &mut s,
            0,
            &ProviderLimits {
                remaining: [None, Some(0.0)],
                reset: [None, Some(Duration::from_secs(60))],
                ..Default::default()
            },
            Class::Interactive,
        );
        assert_eq!(s, before);
    }

    #[test]
    fn without_a_reset_what_is_left_lasts_a_whole_window() {
        // A proxy allowing 30 requests a minute says 24 are left, and not when its minute ends.
        let cfg = LimiterConfig::new(30.0, 1e9);
        let mut s = BucketState::full(&cfg, 0);
        let said = ProviderLimits { remaining: [Some(24.0), None], ..Default::default() };
        align(&cfg, &mut s, 0, &said, Class::Interactive);
        // Interactive alone for the next minute (the background idle, lending its refill): its
        // minute may have just begun, so no more than the 24 go, and not many fewer.
        let (mut now, mut admitted) = (0u64, 0);
        while now < 60_000 {
            match decide(&cfg, &mut s, now, Class::Interactive, 1, 0) {
                Decision::Granted => admitted += 1,
                Decision::Wait(d) | Decision::Reserved(d) => now += d.as_millis().max(1) as u64,
            }
        }
        assert!((22..=24).contains(&admitted), "{admitted} admitted in the minute");
    }

    #[test]
    fn no_window_of_any_alignment_admits_more_than_the_limit() {
        // Saturated by both classes with varied sizes; any 60 s interval, wherever it starts, stays
        // within the limit: what a fixed-window or sliding-window provider counts.
        let cfg = LimiterConfig::new(120.0, 20_000.0);
        let mut s = BucketState::full(&cfg, 0);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut now = 0u64;
        let mut i = 0u64;
        while now < 600_000 {
            let class = if i.is_multiple_of(3) { Class::Background } else { Class::Interactive };
            let tokens = 50 + (i * 97) % 400;
            // Every other request reserves: a reservation is admitted when its wait ends.
            let reserve = if i.is_multiple_of(2) { 30_000 } else { 0 };
            match decide(&cfg, &mut s, now, class, tokens, reserve) {
                Decision::Granted => {
                    admitted.push((now, tokens));
                    i += 1;
                }
                Decision::Reserved(d) => {
                    now += d.as_millis() as u64;
                    admitted.push((now, tokens));
                    i += 1;
                }
                Decision::Wait(d) => now += d.as_millis().max(1) as u64,
            }
        }
        for start in (0..540_000).step_by(1_000) {
            let in_window = admitted.iter().filter(|(t, _)| (start..start + 60_000).contains(t));
            let (requests, tokens) = in_window.fold((0u64, 0u64), |(r, t), (_, k)| (r + 1, t + k));
            assert!(
                requests <= 120 && tokens <= 20_000 + 450,
                "window at {start}: {requests} req, {tokens} tok"
            );
        }
        // One sequential caller alternating classes idles while either class waits, so this is a
        // floor; `both_saturated_*` measures use under concurrent demand.
        let used = admitted.iter().map(|(_, k)| k).sum::<u64>() as f64 / (10.0 * 20_000.0);
        assert!(used >= 0.8, "uses the limit: {used:.3}");
    }
}

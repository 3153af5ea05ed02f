//! The limiter's vocabulary, shared by its policy (`crate::limiter`), its port and the Redis
//! adapter's script: the reservation classes, the limits with their shares, bursts and refill
//! rates, the answer to a request for budget, and the limits learned from a provider. Pure.

use super::Lane;
pub use super::model_call::ProviderLimits;
use std::sync::Mutex;
use std::time::Duration;

/// Reservation classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The interactive lane.
    Interactive = 0,
    /// Synthesis and commits.
    Background = 1,
}

impl From<Lane> for Class {
    fn from(l: Lane) -> Self {
        if l == Lane::Interactive { Class::Interactive } else { Class::Background }
    }
}

/// Limits and reservations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimiterConfig {
    /// Requests per minute.
    pub rpm: f64,
    /// Tokens per minute.
    pub tpm: f64,
    /// Interactive's reserved share (background gets the rest).
    pub interactive_share: f64,
    /// The fraction of its bucket's capacity a request waits for at most before it runs into debt
    /// (a request larger than that is admitted against later refills).
    pub wait_for: f64,
    /// The period the limits are per, in ms: 60000 for providers' per-minute limits; tests shorten it.
    pub window_ms: f64,
    /// The share of a window's limit a bucket holds as its burst.
    pub burst: f64,
}

/// The share of a window's limit each bucket holds as its burst. Under saturation a bucket is empty
/// and admits only its refill, the rest of the limit, so the burst is the part of each window that
/// goes unused: 5% keeps 95% in use. A smaller burst would use more, but the burst is also the
/// margin between what the limiter admits and what a provider counts: at 2%, a sliding-window
/// provider answers 429s and about two fifths of its limit go unused in the pauses that follow,
/// whether a large request waits for half its bucket or for all of it (`lanes bench provider`).
pub const DEFAULT_BURST: f64 = 0.05;

/// A limit to stand for "not known yet": large enough never to pace, finite so the Lua script and
/// JSON carry it.
pub const UNKNOWN: f64 = 1e12;

impl LimiterConfig {
    /// Limits with the default 70/30 reservation and a [`DEFAULT_BURST`].
    pub fn new(rpm: f64, tpm: f64) -> Self {
        Self { rpm, tpm, interactive_share: 0.7, wait_for: 0.5, window_ms: 60_000.0, burst: DEFAULT_BURST }
    }

    /// No configured cap: pacing starts when the provider's headers say its limits.
    pub fn unknown() -> Self {
        Self::new(UNKNOWN, UNKNOWN)
    }

    /// Each class's share of each limit: requests (interactive, background), tokens (same order).
    pub fn shares(&self) -> [f64; 4] {
        let s = self.interactive_share.clamp(0.0, 1.0);
        [self.rpm * s, self.rpm * (1.0 - s), self.tpm * s, self.tpm * (1.0 - s)]
    }

    /// Capacities of the four buckets: the burst of each share.
    pub fn caps(&self) -> [f64; 4] {
        self.shares().map(|l| l * self.burst.clamp(0.0, 1.0))
    }

    /// Refill rates of the four buckets, per ms: the rest of each share over the window.
    pub fn rates(&self) -> [f64; 4] {
        self.shares().map(|l| l * (1.0 - self.burst.clamp(0.0, 1.0)) / self.window_ms)
    }

    /// These caps lowered to what the provider said (`None` fields keep the cap).
    pub fn within(&self, learned: &ProviderLimits) -> Self {
        Self {
            rpm: learned.rpm.map_or(self.rpm, |l| l.min(self.rpm)),
            tpm: learned.tpm.map_or(self.tpm, |l| l.min(self.tpm)),
            ..*self
        }
    }
}

/// The answer to a request for budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Taken: call now.
    Granted,
    /// Taken from the class's own buckets ahead of their refill: call after this long. Requests
    /// that come later queue behind it, and the other class cannot borrow what it waits for.
    Reserved(Duration),
    /// Nothing taken; enough will be there after this long.
    Wait(Duration),
}

/// Limits learned from a provider's headers, kept per process: every worker reads the same headers.
#[derive(Debug, Default)]
pub struct Learned(Mutex<ProviderLimits>);

impl Learned {
    /// Keeps the newest limits the provider stated; true when none were known before.
    pub fn learn(&self, limits: &ProviderLimits) -> bool {
        let Ok(mut l) = self.0.lock() else { return false };
        let first = l.rpm.is_none() && l.tpm.is_none() && (limits.rpm.is_some() || limits.tpm.is_some());
        l.rpm = limits.rpm.or(l.rpm);
        l.tpm = limits.tpm.or(l.tpm);
        first
    }

    /// `caps` lowered to what was learned.
    pub fn apply(&self, caps: &LimiterConfig) -> LimiterConfig {
        self.0.lock().map(|l| caps.within(&l)).unwrap_or(*caps)
    }
}

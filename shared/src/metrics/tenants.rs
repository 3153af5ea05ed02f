//! Per-tenant series with bounded cardinality: each tenant's wait, its put-offs (fairness, its
//! concurrency cap), the tokens it received, and its share of the lane's recent tokens against the
//! share it is entitled to, for the [`TOP_TENANTS`] heaviest tenants by name
//! and every other tenant as [`OTHER`]. A tenant is named by its fairness group (`t-` and 32 hex
//! digits of its sha256, or `p-…` for a project with tenancy off), never by its identity.
//!
//! Which tenants are named is [`TenantLabels`]'s choice, pure: recent tokens decide, with
//! hysteresis so two tenants of equal weight do not swap names at every call, and a process names
//! at most `3 × TOP_TENANTS` tenants in its life, so neither a Prometheus scrape nor CloudWatch's
//! per-dimension billing grows with the number of tenants.

use super::{LATENCY_BUCKETS, Registrar};
use crate::domain::token_share::Standing;
use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Tenants named in the series at a time.
pub const TOP_TENANTS: usize = 10;

/// The label of every tenant not named.
pub const OTHER: &str = "other";

/// Tenants a process names in its life at most (replacements included).
const MAX_NAMED_EVER: usize = 3 * TOP_TENANTS;

/// Weights tracked before they are halved (older activity counts half as much after each halving).
const TRACKED: usize = 64 * TOP_TENANTS;

/// How often a process reports a lane's standings at most: each report reads the lane's whole
/// state once.
pub const STANDINGS_EVERY_MS: u64 = 5_000;

/// Events between two halvings of every weight, however few tenants there are: what makes the
/// weight recent, so yesterday's heavy tenant gives its name up to today's.
const HALVE_EVERY: u64 = 4_096;

/// Chooses each tenant's label: its own among the heaviest, [`OTHER`] otherwise.
#[derive(Debug, Default)]
pub struct TenantLabels {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    weight: HashMap<String, f64>,
    named: BTreeSet<String>,
    named_ever: usize,
    events: u64,
}

impl TenantLabels {
    /// The label of `group`, after adding `amount` (tokens; zero for an event that weighs nothing)
    /// to its recent weight. A group is named while fewer than [`TOP_TENANTS`] are, or in place of
    /// the lightest named one once it weighs twice as much (until the life-time bound is reached).
    pub fn label(&self, group: &str, amount: f64) -> String {
        let Ok(mut s) = self.inner.lock() else { return OTHER.into() };
        *s.weight.entry(group.to_owned()).or_default() += amount.max(0.0);
        s.events += 1;
        if s.weight.len() > TRACKED || s.events.is_multiple_of(HALVE_EVERY) {
            // Halve everything and forget what is left of the lightest: recent weight decides.
            s.weight.values_mut().for_each(|w| *w /= 2.0);
            let named = s.named.clone();
            s.weight.retain(|g, w| *w >= 1.0 || named.contains(g));
        }
        if s.named.contains(group) {
            return group.to_owned();
        }
        if s.named.len() < TOP_TENANTS && s.named_ever < MAX_NAMED_EVER {
            s.named.insert(group.to_owned());
            s.named_ever += 1;
            return group.to_owned();
        }
        let mine = s.weight.get(group).copied().unwrap_or(0.0);
        let lightest = s
            .named
            .iter()
            .map(|g| (s.weight.get(g).copied().unwrap_or(0.0), g.clone()))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        match lightest {
            Some((w, g)) if mine > 2.0 * w && s.named_ever < MAX_NAMED_EVER => {
                s.named.remove(&g);
                s.named.insert(group.to_owned());
                s.named_ever += 1;
                group.to_owned()
            }
            _ => OTHER.into(),
        }
    }
}

/// When a lane's standings were last reported, and the tenants they labelled.
type Shown = (u64, BTreeSet<String>);

impl TenantLabels {
    /// The label `group` has now, changing nothing: its own if it is named, [`OTHER`] otherwise.
    /// For series about groups this process did not itself serve (the lane's standings), which
    /// must not name or weigh them.
    pub fn current(&self, group: &str) -> String {
        match self.inner.lock() {
            Ok(s) if s.named.contains(group) => group.to_owned(),
            _ => OTHER.into(),
        }
    }
}

/// The per-tenant series.
#[derive(Clone)]
pub struct TenantMetrics {
    labels: Arc<TenantLabels>,
    /// Per lane: when its standings were last reported, and the tenants they labelled.
    shown: Arc<Mutex<HashMap<String, Shown>>>,
    /// Submission to claim, by lane and tenant.
    pub wait_seconds: HistogramVec,
    /// Runs put off by lane, tenant and reason (`fairness`, `tenant_cap`).
    pub put_offs_total: IntCounterVec,
    /// Tokens its calls used (the share it received), by lane and tenant.
    pub tokens_total: IntCounterVec,
    /// Its share of the lane's tokens over the window, by lane, tenant and kind (`received`, and
    /// `entitled`: its weight's share among the lane's active tenants), from the lane's shared
    /// state; `other` holds the sum of every tenant not named.
    pub share_ratio: GaugeVec,
}

impl TenantMetrics {
    pub(super) fn new(r: &Registrar) -> Self {
        let lt = &["lane", "tenant"];
        let opts = HistogramOpts::new("lanes_tenant_wait_seconds", "Submission to claim, per tenant")
            .buckets(LATENCY_BUCKETS.to_vec());
        Self {
            labels: Default::default(),
            shown: Default::default(),
            wait_seconds: r.add("lanes_tenant_wait_seconds", HistogramVec::new(opts, lt)),
            put_offs_total: r.add(
                "lanes_tenant_put_offs_total",
                IntCounterVec::new(
                    Opts::new("lanes_tenant_put_offs_total", "Runs put off for fairness, per tenant"),
                    &["lane", "tenant", "reason"],
                ),
            ),
            tokens_total: r.add(
                "lanes_tenant_tokens_total",
                IntCounterVec::new(Opts::new("lanes_tenant_tokens_total", "Tokens used, per tenant"), lt),
            ),
            share_ratio: r.add(
                "lanes_tenant_share_ratio",
                GaugeVec::new(
                    Opts::new("lanes_tenant_share_ratio", "Share of the lane's recent tokens, per tenant"),
                    &["lane", "tenant", "kind"],
                ),
            ),
        }
    }

    /// Whether `lane`'s standings are due at `now_ms` (none reported for [`STANDINGS_EVERY_MS`]);
    /// a `true` counts as reporting them, so two callers at once do not both read the state.
    pub fn standings_due(&self, lane: &str, now_ms: u64) -> bool {
        let Ok(mut shown) = self.shown.lock() else { return false };
        let (last, _) = shown.entry(lane.to_owned()).or_default();
        if *last != 0 && now_ms.saturating_sub(*last) < STANDINGS_EVERY_MS {
            return false;
        }
        *last = now_ms.max(1);
        true
    }

    /// Sets `lane`'s share gauges to `standings` (every active group of the lane): each tenant
    /// this process has named its own, the rest summed as [`OTHER`] (the standings name nobody). A
    /// tenant labelled last time and not now (quiet, or no longer named) loses its series rather
    /// than keep a stale share.
    pub fn stood(&self, lane: &str, standings: &[Standing]) {
        let mut now: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for s in standings {
            let e = now.entry(self.labels.current(&s.group)).or_default();
            e.0 += s.received;
            e.1 += s.entitled;
        }
        let Ok(mut shown) = self.shown.lock() else { return };
        let (_, before) = shown.entry(lane.to_owned()).or_default();
        for gone in before.iter().filter(|t| !now.contains_key(*t)) {
            for kind in ["received", "entitled"] {
                let _ = self.share_ratio.remove_label_values(&[lane, gone, kind]);
            }
        }
        for (tenant, (received, entitled)) in &now {
            self.share_ratio.with_label_values(&[lane, tenant, "received"]).set(*received);
            self.share_ratio.with_label_values(&[lane, tenant, "entitled"]).set(*entitled);
        }
        *before = now.into_keys().collect();
    }

    /// `lane`'s share gauge for `tenant` and `kind`, if the series exists.
    #[cfg(test)]
    pub(crate) fn share(&self, lane: &str, tenant: &str, kind: &str) -> Option<f64> {
        use prometheus::core::Collector;
        let families = self.share_ratio.collect();
        families[0]
            .get_metric()
            .iter()
            // Labels come sorted by name: kind, lane, tenant.
            .find(|x| x.get_label().iter().map(|l| l.value()).eq([kind, lane, tenant]))
            .map(|x| x.get_gauge().get_value())
    }

    /// A run of `group` claimed `seconds` after its submission. Returns the label used.
    pub fn waited(&self, lane: &str, group: &str, seconds: f64) -> String {
        let tenant = self.labels.label(group, 0.0);
        self.wait_seconds.with_label_values(&[lane, &tenant]).observe(seconds);
        tenant
    }

    /// A run of `group` put off for `reason`.
    pub fn put_off(&self, lane: &str, group: &str, reason: &str) {
        let tenant = self.labels.label(group, 0.0);
        self.put_offs_total.with_label_values(&[lane, &tenant, reason]).inc();
    }

    /// A call of `group` used `tokens`.
    pub fn used(&self, lane: &str, group: &str, tokens: u64) {
        let tenant = self.labels.label(group, tokens as f64);
        self.tokens_total.with_label_values(&[lane, &tenant]).inc_by(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heaviest_tenants_are_named_and_the_rest_are_other_within_a_bound() {
        let labels = TenantLabels::default();
        for i in 0..TOP_TENANTS {
            assert_eq!(labels.label(&format!("t-{i}"), 10.0), format!("t-{i}"));
        }
        assert_eq!(labels.label("t-light", 5.0), OTHER, "the first ten fill the names");
        assert_eq!(labels.label("t-heavy", 1_000.0), "t-heavy", "twice the lightest takes its name");
        assert_eq!(labels.label("t-0", 1.0), OTHER, "the lightest (t-0) gave its name up");
        // Thousands of tenants never name more than the life-time bound.
        let mut named = BTreeSet::new();
        for i in 0..5_000u64 {
            let l = labels.label(&format!("t-many-{i}"), (i * 10) as f64);
            named.insert(l);
        }
        assert!(named.len() <= MAX_NAMED_EVER + 1, "{} labels", named.len());
        assert!(named.contains(OTHER));
    }

    fn share(m: &TenantMetrics, tenant: &str, kind: &str) -> Option<f64> {
        m.share("interactive", tenant, kind)
    }

    #[test]
    fn standings_name_the_heaviest_sum_the_rest_as_other_and_drop_the_quiet() {
        let r = super::super::Registrar(prometheus::Registry::new());
        let m = TenantMetrics::new(&r);
        for i in 0..TOP_TENANTS - 1 {
            m.used("interactive", &format!("t-{i}"), 1_000);
        }
        let at = |g: &str, received: f64, entitled: f64| Standing { group: g.into(), received, entitled };
        m.stood("interactive", &[at("t-0", 0.5, 0.25), at("t-x", 0.25, 0.5), at("t-y", 0.25, 0.25)]);
        assert_eq!(m.labels.current("t-x"), OTHER, "a name was free, but the standings took none");
        assert_eq!(share(&m, "t-0", "received"), Some(0.5));
        assert_eq!(share(&m, "t-0", "entitled"), Some(0.25));
        assert_eq!(share(&m, OTHER, "received"), Some(0.5), "t-x and t-y, unnamed, summed");
        assert_eq!(share(&m, OTHER, "entitled"), Some(0.75));
        m.stood("interactive", &[at("t-1", 1.0, 1.0)]);
        assert_eq!(share(&m, "t-1", "received"), Some(1.0));
        assert_eq!(share(&m, "t-0", "received"), None, "quiet now: no stale share");
        assert_eq!(share(&m, OTHER, "entitled"), None);
    }

    #[test]
    fn standings_are_due_once_per_interval_per_lane() {
        let r = super::super::Registrar(prometheus::Registry::new());
        let m = TenantMetrics::new(&r);
        assert!(m.standings_due("interactive", 1_000));
        assert!(!m.standings_due("interactive", 1_000 + STANDINGS_EVERY_MS - 1));
        assert!(m.standings_due("synthesis", 1_001), "each lane has its own");
        assert!(m.standings_due("interactive", 1_000 + STANDINGS_EVERY_MS));
    }

    #[test]
    fn weight_is_recent_yesterdays_heavy_tenants_give_a_name_up() {
        let labels = TenantLabels::default();
        for i in 0..TOP_TENANTS {
            assert_eq!(labels.label(&format!("t-old-{i}"), 1e9), format!("t-old-{i}"));
        }
        // Long after, a steady newcomer: without the halvings it would need 2e7 events to weigh
        // twice the lightest old tenant; with them, yesterday's weight halves away.
        let named = (0..20 * HALVE_EVERY).any(|_| labels.label("t-new", 100.0) == "t-new");
        assert!(named, "a recent heavy tenant gets a name");
        let old_named =
            (0..TOP_TENANTS).filter(|i| labels.label(&format!("t-old-{i}"), 0.0) != OTHER).count();
        assert_eq!(old_named, TOP_TENANTS - 1, "one of yesterday's gave its name up");
    }
}

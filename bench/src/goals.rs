//! A bench's goal lines: what each one measures, its bound, and the figure the run got. A bench
//! computes them once, from its own figures, and carries them in its JSON (`goals`), so the text it
//! prints and `bench/REPORT.md` state the same bounds from one place; the report reads each bound
//! and figure from the JSON and judges it there.

use serde::Serialize;

/// Resident memory flat after warm-up: the last reading over the first at most this (the soak's
/// server and each function alike).
pub const RSS_FLAT: f64 = 1.10;

/// How a goal's figure is shown: the unit after it, and how many decimals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// A ratio of two like figures (`1.23x`).
    Times,
    /// A fraction shown as a percentage (`0.95` reads `95%`).
    Percent,
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Micros,
    /// Per second.
    PerSecond,
    /// A count.
    Count,
    /// Mebibytes.
    Mib,
}

/// One goal line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Goal {
    /// A short name the report finds the goal by, unique in its report.
    pub key: String,
    /// What is measured, in words.
    pub what: String,
    /// The run's figure.
    pub value: f64,
    /// The bound the figure must not pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_most: Option<f64>,
    /// The bound the figure must reach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_least: Option<f64>,
    /// How the figure and the bound are shown.
    pub unit: Unit,
    /// Decimals shown (the verdict compares unrounded figures).
    pub decimals: usize,
}

impl Goal {
    /// The goal `key` on `value`, shown as a ratio with two decimals until [`Self::shown`] says
    /// otherwise; give it its bound with [`Self::at_most`] or [`Self::at_least`].
    pub fn new(key: impl Into<String>, what: impl Into<String>, value: f64) -> Self {
        let (key, what) = (key.into(), what.into());
        Self { key, what, value, at_most: None, at_least: None, unit: Unit::Times, decimals: 2 }
    }

    /// The figure must be at most `bound`.
    pub fn at_most(self, bound: f64) -> Self {
        Self { at_most: Some(bound), ..self }
    }

    /// The figure must be at least `bound`.
    pub fn at_least(self, bound: f64) -> Self {
        Self { at_least: Some(bound), ..self }
    }

    /// Shown in `unit` with `decimals`.
    pub fn shown(self, unit: Unit, decimals: usize) -> Self {
        Self { unit, decimals, ..self }
    }

    /// Whether the figure is within its bound (a figure that is not a number never is).
    pub fn met(&self) -> bool {
        self.at_most.is_none_or(|b| self.value <= b) && self.at_least.is_none_or(|b| self.value >= b)
    }

    fn show(&self, v: f64) -> String {
        let d = self.decimals;
        match self.unit {
            Unit::Times => format!("{v:.d$}x"),
            Unit::Percent => format!("{:.d$}%", 100.0 * v),
            Unit::Ms => format!("{v:.d$} ms"),
            Unit::Micros => format!("{v:.d$} µs"),
            Unit::PerSecond => format!("{v:.d$}/s"),
            Unit::Count => format!("{v:.d$}"),
            Unit::Mib => format!("{v:.d$} MiB"),
        }
    }
}

impl std::fmt::Display for Goal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound = match (self.at_most, self.at_least) {
            (Some(hi), Some(lo)) if hi == lo => format!("= {}", self.show(hi)),
            (Some(hi), Some(lo)) => format!("{} to {}", self.show(lo), self.show(hi)),
            (Some(b), None) => format!("<= {}", self.show(b)),
            (None, Some(b)) => format!(">= {}", self.show(b)),
            (None, None) => "none".into(),
        };
        let verdict = if self.met() { "met" } else { "NOT met" };
        write!(f, "{}: {} (goal {bound}): {verdict}", self.what, self.show(self.value))
    }
}

/// The largest of `values`; not a number when there are none or one is not a number, so a goal
/// over it is not met rather than judged on the figures that happened to be taken.
pub fn worst(values: impl IntoIterator<Item = f64>) -> f64 {
    fold(values, f64::max)
}

/// The smallest of `values`, as [`worst`] treats them.
pub fn lowest(values: impl IntoIterator<Item = f64>) -> f64 {
    fold(values, f64::min)
}

fn fold(values: impl IntoIterator<Item = f64>, pick: fn(f64, f64) -> f64) -> f64 {
    let mut it = values.into_iter();
    let Some(first) = it.next() else { return f64::NAN };
    it.fold(first, |a, b| if a.is_nan() || b.is_nan() { f64::NAN } else { pick(a, b) })
}

/// Writes each goal on a line of its own.
pub fn write_goals(f: &mut std::fmt::Formatter<'_>, goals: &[Goal]) -> std::fmt::Result {
    goals.iter().try_for_each(|g| writeln!(f, "goal: {g}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goal_compares_unrounded_figures_and_shows_its_bound() {
        let g = Goal::new("used", "share of the limit", 0.94996).at_least(0.95).shown(Unit::Percent, 1);
        assert!(!g.met(), "a hair under is under");
        assert_eq!(g.to_string(), "share of the limit: 95.0% (goal >= 95.0%): NOT met");
        let g = Goal::new("p99", "p99", 4.2).at_most(5.0).shown(Unit::Ms, 1);
        assert_eq!((g.met(), g.to_string()), (true, "p99: 4.2 ms (goal <= 5.0 ms): met".to_owned()));
        assert!(!Goal::new("r", "ratio", f64::NAN).at_most(1.1).met());
        assert_eq!(worst([1.0, 3.0, 2.0]), 3.0);
        assert_eq!(lowest([1.0, 3.0, 2.0]), 1.0);
        assert!(worst([1.0, f64::NAN, 2.0]).is_nan(), "a figure not taken is not skipped");
        assert!(lowest([]).is_nan(), "no figure, no verdict");
        let one = |v| Goal::new("calls", "calls", v).at_least(1.0).at_most(1.0).shown(Unit::Count, 0);
        assert_eq!((one(1.0).met(), one(0.0).met(), one(2.0).met()), (true, false, false));
        assert_eq!(one(2.0).to_string(), "calls: 2 (goal = 1): NOT met");
        let json = serde_json::to_value(&g).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"key": "p99", "what": "p99", "value": 4.2, "at_most": 5.0, "unit": "ms", "decimals": 1})
        );
    }
}

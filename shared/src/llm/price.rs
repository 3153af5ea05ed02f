//! What a call costs: a price table per model (USD per million input and output tokens), with the
//! vendors' published list prices of the common OpenAI, Anthropic and Bedrock models as defaults,
//! and `LANES_LLM_PRICES` to override or add (`model=input/output,...`, e.g.
//! `gpt-4o=2.5/10,my-vllm-model=0/0`). A model is matched by the longest table key its reported name
//! contains, so dated versions (`gpt-4o-2024-08-06`) and Bedrock ids
//! (`us.anthropic.claude-sonnet-4-20250514-v1:0`) find their family. List prices change: the
//! variable is how a deployment keeps them true.
//!
//! A call served at the `flex` tier ([`crate::domain::tier`]) is charged the model's flex price.
//! OpenAI prices flex at its Batch API rates, half the list price, so its models default to that;
//! Bedrock's flex discount differs by model and is unpublished for most, so other models are
//! charged their list price at flex (an upper bound) until a deployment names the flex price as two
//! more figures: `model=input/output/flex_input/flex_output`. A call served at `priority` is charged
//! the model's priority price (OpenAI's published ones are built in; two more figures name others);
//! without one its cost is unknown rather than the list price, which would undercount it. A
//! request of a provider batch (`batch`) is charged half the list price, the discount OpenAI's Batch
//! API and Anthropic's Message Batches both publish for every model.

use crate::config::ConfigError;
use crate::domain::TokenUsage;
use crate::domain::tier::Tier;

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// Prompt (input) tokens.
    pub input: f64,
    /// Completion (output) tokens.
    pub output: f64,
    /// The same at the `flex` tier, when it differs from the list price.
    pub flex: Option<(f64, f64)>,
    /// The same at the `priority` tier, when known (a premium: unknown, a priority call's cost is
    /// unknown, never the list price).
    pub priority: Option<(f64, f64)>,
}

impl Price {
    fn list(input: f64, output: f64) -> Self {
        Self { input, output, flex: None, priority: None }
    }
}

/// OpenAI's published priority prices (input, output per million tokens) of the models in the table.
const PRIORITY: [(&str, f64, f64); 3] =
    [("gpt-5", 2.50, 20.00), ("gpt-5-mini", 0.45, 3.60), ("gpt-4.1", 3.50, 14.00)];

/// Prices by model-name key.
#[derive(Debug, Clone, PartialEq)]
pub struct PriceTable(Vec<(String, Price)>);

/// The defaults: list prices per million tokens (input, output).
const DEFAULTS: [(&str, f64, f64); 22] = [
    ("gpt-4o", 2.50, 10.00),
    ("gpt-4o-mini", 0.15, 0.60),
    ("gpt-4.1", 2.00, 8.00),
    ("gpt-4.1-mini", 0.40, 1.60),
    ("gpt-4.1-nano", 0.10, 0.40),
    ("gpt-5", 1.25, 10.00),
    ("gpt-5-mini", 0.25, 2.00),
    ("gpt-5-nano", 0.05, 0.40),
    ("o3", 2.00, 8.00),
    ("o3-mini", 1.10, 4.40),
    ("o4-mini", 1.10, 4.40),
    ("claude-3-haiku", 0.25, 1.25),
    ("claude-3-5-haiku", 0.80, 4.00),
    ("claude-haiku-4-5", 1.00, 5.00),
    ("claude-3-5-sonnet", 3.00, 15.00),
    ("claude-3-7-sonnet", 3.00, 15.00),
    ("claude-sonnet-4", 3.00, 15.00),
    ("claude-opus-4", 15.00, 75.00),
    ("claude-opus-4-1", 15.00, 75.00),
    ("amazon.nova-micro", 0.035, 0.14),
    ("amazon.nova-lite", 0.06, 0.24),
    ("amazon.nova-pro", 0.80, 3.20),
];

impl PriceTable {
    /// The published list prices above, and the offline provider at zero.
    pub fn defaults() -> Self {
        let mut table: Vec<(String, Price)> = DEFAULTS
            .iter()
            .map(|(k, input, output)| {
                // OpenAI's flex tier is charged at its Batch API rates: half the list price.
                let openai = ["gpt-", "o3", "o4"].iter().any(|p| k.starts_with(p));
                let flex = openai.then_some((input / 2.0, output / 2.0));
                let priority = PRIORITY.iter().find(|(m, _, _)| m == k).map(|(_, i, o)| (*i, *o));
                ((*k).to_owned(), Price { input: *input, output: *output, flex, priority })
            })
            .collect();
        table.push((super::OFFLINE_MODEL.to_owned(), Price::list(0.0, 0.0)));
        Self(table)
    }

    /// The defaults with `LANES_LLM_PRICES` applied.
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut table = Self::defaults();
        if let Some(spec) = crate::config::optional_env("LANES_LLM_PRICES") {
            table.apply(&spec)?;
        }
        Ok(table)
    }

    /// Adds or replaces prices from `model=input/output[/flex_input/flex_output[/priority_input/priority_output]],...`.
    pub fn apply(&mut self, spec: &str) -> Result<(), ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid { name: "LANES_LLM_PRICES", reason };
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (model, prices) = entry
                .split_once('=')
                .ok_or_else(|| invalid(format!("`{entry}`: expected model=input/output")))?;
            let parse = |v: &str| {
                v.trim().parse::<f64>().ok().filter(|p| p.is_finite() && *p >= 0.0).ok_or_else(|| {
                    invalid(format!("`{entry}`: `{v}` is not a price in USD per million tokens"))
                })
            };
            let figures = prices.split('/').map(parse).collect::<Result<Vec<f64>, _>>()?;
            let price = match figures[..] {
                [input, output] => Price::list(input, output),
                [input, output, fi, fo] => Price { flex: Some((fi, fo)), ..Price::list(input, output) },
                [input, output, fi, fo, pi, po] => {
                    Price { flex: Some((fi, fo)), priority: Some((pi, po)), ..Price::list(input, output) }
                }
                _ => {
                    return Err(invalid(format!(
                        "`{entry}`: expected input/output, then optionally flex_input/flex_output and \
                         priority_input/priority_output"
                    )));
                }
            };
            let model = model.trim().to_ascii_lowercase();
            self.0.retain(|(k, _)| *k != model);
            self.0.push((model, price));
        }
        Ok(())
    }

    /// The price of `model`: the longest key its name contains.
    pub fn price(&self, model: &str) -> Option<Price> {
        let model = model.to_ascii_lowercase();
        self.0
            .iter()
            .filter(|(k, _)| model.contains(&k.to_ascii_lowercase()))
            .max_by_key(|(k, _)| k.len())
            .map(|(_, p)| *p)
    }

    /// What `usage` cost on `model` served at `tier`, when its price is known: flex without a price
    /// of its own at the list price (an upper bound), priority without one unknown (a premium).
    pub fn cost(&self, model: &str, usage: TokenUsage, tier: Tier) -> Option<f64> {
        let p = self.price(model)?;
        let (input, output) = match tier {
            Tier::Sync => (p.input, p.output),
            Tier::Flex => p.flex.unwrap_or((p.input, p.output)),
            Tier::Priority => p.priority?,
            // OpenAI's Batch API and Anthropic's Message Batches both charge half the list price,
            // for every model.
            Tier::Batch => (p.input / 2.0, p.output / 2.0),
        };
        Some((usage.prompt as f64 * input + usage.completion as f64 * output) / 1_000_000.0)
    }
}

static PRICES: std::sync::OnceLock<PriceTable> = std::sync::OnceLock::new();

/// Reads `LANES_LLM_PRICES` once, at start-up, so a malformed value stops the process with its reason
/// rather than pricing calls wrong. Later calls keep the first table.
pub fn load_from_env() -> Result<(), ConfigError> {
    let table = PriceTable::from_env()?;
    let _ = PRICES.set(table);
    Ok(())
}

/// The process's price table ([`load_from_env`]'s, or the defaults).
pub fn prices() -> &'static PriceTable {
    PRICES.get_or_init(PriceTable::defaults)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_match_by_their_longest_key_and_overrides_win() {
        let mut t = PriceTable::defaults();
        let usage = TokenUsage { prompt: 1_000_000, completion: 100_000 };
        let cost =
            |t: &PriceTable, model: &str| t.cost(model, usage, Tier::Sync).map(|c| (c * 1e6).round() / 1e6);
        assert_eq!(cost(&t, "gpt-4o-2024-08-06"), Some(3.5));
        assert_eq!(cost(&t, "gpt-4o-mini-2024-07-18"), Some(0.21), "the longer key wins");
        assert_eq!(cost(&t, "us.anthropic.claude-sonnet-4-20250514-v1:0"), Some(4.5));
        assert_eq!(cost(&t, super::super::OFFLINE_MODEL), Some(0.0));
        assert_eq!(cost(&t, "my-vllm-model"), None, "unknown models cost nothing we can tell");
        t.apply("my-vllm-model=0.2/0.4, gpt-4o=5/20").unwrap();
        assert_eq!(cost(&t, "my-vllm-model"), Some(0.24));
        assert_eq!(cost(&t, "gpt-4o-2024-08-06"), Some(7.0));
        for bad in ["gpt-4o", "gpt-4o=1", "gpt-4o=a/b", "gpt-4o=-1/2", "gpt-4o=inf/1", "gpt-4o=1/2/3"] {
            assert!(t.apply(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flex_is_half_price_on_openai_and_list_price_where_the_discount_is_unknown() {
        let mut t = PriceTable::defaults();
        let usage = TokenUsage { prompt: 1_000_000, completion: 100_000 };
        let cost =
            |t: &PriceTable, model: &str, tier| t.cost(model, usage, tier).map(|c| (c * 1e6).round() / 1e6);
        assert_eq!(cost(&t, "gpt-4o-2024-08-06", Tier::Flex), Some(1.75));
        assert_eq!(cost(&t, "o3-2025-04-16", Tier::Flex), Some(1.4));
        assert_eq!(cost(&t, "us.anthropic.claude-sonnet-4-20250514-v1:0", Tier::Flex), Some(4.5));
        // A deployment names a Bedrock model's flex price; a list-only override drops the default.
        t.apply("amazon.nova-pro=0.8/3.2/0.4/1.6,gpt-4o=2.5/10").unwrap();
        assert_eq!(cost(&t, "amazon.nova-pro-v1:0", Tier::Flex), Some(0.56));
        assert_eq!(cost(&t, "amazon.nova-pro-v1:0", Tier::Sync), Some(1.12));
        assert_eq!(cost(&t, "gpt-4o", Tier::Flex), Some(3.5));
    }

    #[test]
    fn priority_is_charged_its_published_premium_and_is_unknown_without_one() {
        let mut t = PriceTable::defaults();
        let usage = TokenUsage { prompt: 1_000_000, completion: 100_000 };
        let cost = |t: &PriceTable, model: &str| {
            t.cost(model, usage, Tier::Priority).map(|c| (c * 1e6).round() / 1e6)
        };
        assert_eq!(cost(&t, "gpt-5-2025-08-07"), Some(4.5));
        assert_eq!(cost(&t, "gpt-5-mini-2025-08-07"), Some(0.81));
        assert_eq!(cost(&t, "gpt-4o"), None, "no published priority price: unknown, not the list price");
        t.apply("gpt-4o=2.5/10/1.25/5/4.25/17").unwrap();
        assert_eq!(cost(&t, "gpt-4o"), Some(5.95));
        assert!(t.apply("gpt-4o=1/2/3/4/5").is_err());
    }
}

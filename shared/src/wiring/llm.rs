//! The model side of a process, built once from the environment: every lane's routes behind the
//! fallback and the retry policy ([`llm_from_env`]), each route's client behind its limiter, the
//! providers' keys, and the commits lane's batch endpoints ([`batching`], [`lane_batching`]).

use super::Adapters;
use crate::clock::SharedClock;
use crate::config::ConfigError;
use crate::domain::Lane;
use std::sync::Arc;
use std::time::Duration;

/// The model client of this process, built once from the environment: every lane's routes
/// ([`crate::llm::route::routes_from_env`]) behind one [`crate::llm::route::Fallback`], inside the
/// retry policy when any route is a real provider. Each distinct route is built once and shared by
/// the lanes naming it, with its own limiter ([`Adapters::limiter`]) charging each HTTP attempt; a
/// budget wait past `max_wait` puts the task off. `offline` serves the `offline` routes.
///
/// Keys come from `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`, or, in Lambda, from the Secrets Manager
/// secret named by `LANES_LLM_API_KEY_SECRET` (read at first use or ahead of it, again when old or
/// refused: [`crate::adapters::secrets::llm_key`]); Bedrock uses the function's role.
/// `LANES_LLM_TIMEOUT_MS` (default 120000) bounds each HTTP attempt.
pub async fn llm_from_env(
    adapters: &Adapters,
    clock: SharedClock,
    offline: Arc<dyn crate::ports::LlmClient>,
    max_wait: Duration,
) -> Result<Arc<dyn crate::ports::LlmClient>, ConfigError> {
    use crate::llm::route::{Fallback, RouteClient, routes_from_env};
    let timeout = llm_timeout()?;
    let routes = routes_from_env()?;
    let keys = Keys::for_routes(&routes);
    let mut built: std::collections::HashMap<crate::llm::route::Route, RouteClient> = Default::default();
    let mut lanes: [Vec<RouteClient>; 3] = Default::default();
    let mut any_real = false;
    for lane in Lane::ALL {
        for route in &routes[lane.index()] {
            let client = match built.get(route) {
                Some(c) => c.clone(),
                None => {
                    let c =
                        route_client(adapters, &clock, route, &offline, (timeout, max_wait), &keys).await?;
                    built.insert(route.clone(), c.clone());
                    c
                }
            };
            lanes[lane.index()].push(client);
            any_real |= route.is_real();
        }
    }
    let fallback: Arc<dyn crate::ports::LlmClient> = Arc::new(Fallback::new(lanes));
    Ok(if any_real {
        Arc::new(crate::llm::Retrying::new(fallback, crate::llm::RetryPolicy::default()))
    } else {
        fallback
    })
}

/// The providers' keys ([`crate::adapters::secrets::llm_key`]), when a route needs them.
struct Keys {
    openai: Option<crate::secret::Secret>,
    anthropic: Option<crate::secret::Secret>,
}

impl Keys {
    /// One key per vendor the routes name, shared by its routes (one read each); several vendors
    /// behind keys read each from its own field of the secret.
    fn for_routes(routes: &[Vec<crate::llm::route::Route>; 3]) -> Self {
        use crate::llm::route::Provider;
        let vendors: std::collections::HashSet<Provider> = routes
            .iter()
            .flatten()
            .map(|r| r.provider)
            .filter(|p| matches!(p, Provider::OpenAi | Provider::Anthropic))
            .collect();
        let shared = vendors.len() > 1;
        let key = |provider, var, field| {
            vendors
                .contains(&provider)
                .then(|| crate::adapters::secrets::llm_key(var, field, shared))
                .flatten()
        };
        Keys {
            openai: key(Provider::OpenAi, "OPENAI_API_KEY", "openai_api_key"),
            anthropic: key(Provider::Anthropic, "ANTHROPIC_API_KEY", "anthropic_api_key"),
        }
    }
}

/// `LANES_LLM_TIMEOUT_MS` (default 120000): the bound of each HTTP attempt.
fn llm_timeout() -> Result<Duration, ConfigError> {
    match std::env::var("LANES_LLM_TIMEOUT_MS") {
        Err(_) => Ok(Duration::from_secs(120)),
        Ok(v) => Ok(Duration::from_millis(v.trim().parse().map_err(|_| ConfigError::Invalid {
            name: "LANES_LLM_TIMEOUT_MS",
            reason: format!("`{v}` is not a whole number"),
        })?)),
    }
}

/// The commits lane's provider batches, when its tier is `batch` (`LANES_TIER_COMMITS`) and its
/// first route has a batch endpoint ([`lane_batching`]). `None` otherwise: the lane's calls asked at
/// `batch` are then made at flex.
pub fn batching(
    store: Arc<dyn crate::ports::BatchStore>,
    llm: Arc<dyn crate::ports::LlmClient>,
    setting: crate::domain::tier::TierSetting,
) -> Result<Option<crate::ports::Batching>, ConfigError> {
    if setting != crate::domain::tier::TierSetting::Batch {
        return Ok(None);
    }
    let batching = lane_batching(Lane::Commits, store, llm)?;
    if batching.is_none() {
        tracing::warn!(
            "LANES_TIER_COMMITS=batch, but the commits lane's first route has no batch endpoint: flex"
        );
    }
    Ok(batching)
}

/// `lane`'s provider batches, when its first route has a batch endpoint
/// (`crate::llm::route::Route::batch`): OpenAI's Batch API, Anthropic's Message Batches, or the
/// offline model's twin, which ends a batch `LANES_BATCH_TURNAROUND_MS` (default 5000) after
/// submission and answers it with `llm`. `LANES_BATCH_QUEUE_TOKENS` caps the prompt tokens the
/// unended batches hold (the provider's batch queue limit). The synthesis lane's are for the tasks
/// that opt in with `params.deadline_s` (`crate::tasks::batches`).
pub fn lane_batching(
    lane: Lane,
    store: Arc<dyn crate::ports::BatchStore>,
    llm: Arc<dyn crate::ports::LlmClient>,
) -> Result<Option<crate::ports::Batching>, ConfigError> {
    use crate::llm::route::Provider;
    let routes = crate::llm::route::routes_from_env()?;
    let Some(route) = routes[lane.index()].first().filter(|r| r.batch) else {
        return Ok(None);
    };
    let api: Arc<dyn crate::ports::BatchApi> = match route.provider {
        Provider::Offline => {
            let turnaround =
                crate::config::env_number("LANES_BATCH_TURNAROUND_MS", 0, 86_400_000)?.unwrap_or(5000);
            Arc::new(crate::llm::OfflineBatches::new(llm, Duration::from_millis(turnaround), route.name()))
        }
        Provider::OpenAi => {
            let base = route.base_url.clone().unwrap_or_else(|| "https://api.openai.com/v1".to_owned());
            let chat = crate::llm::OpenAiClient::new(
                &base,
                &route.model,
                Keys::for_routes(&routes).openai,
                llm_timeout()?,
            );
            Arc::new(crate::llm::OpenAiBatches::new(chat, route.name()))
        }
        Provider::Anthropic => {
            let base = route.base_url.clone().unwrap_or_else(|| "https://api.anthropic.com".to_owned());
            let key = Keys::for_routes(&routes).anthropic.ok_or(ConfigError::Missing("ANTHROPIC_API_KEY"))?;
            let messages = crate::llm::AnthropicClient::new(&base, &route.model, key, llm_timeout()?);
            Arc::new(crate::llm::AnthropicBatches::new(messages, route.name()))
        }
        Provider::Bedrock => return Ok(None),
    };
    let queue_tokens = crate::config::env_number("LANES_BATCH_QUEUE_TOKENS", 1, u64::MAX)?;
    // Two deployments sharing a provider account never adopt each other's batches.
    let scope = crate::config::optional_env("LANES_TABLE").unwrap_or_else(|| "local".into());
    Ok(Some(crate::ports::Batching { api, store, queue_tokens, scope }))
}

/// Whether `provider`'s client is asked to continue a lost run's answer ([`crate::llm::continuation`]):
/// the offline model, Anthropic and Bedrock (prefill; a model that refuses it is asked for the whole
/// answer) are; an OpenAI-compatible server only with `LANES_OPENAI_CONTINUE_PREFIX=on` (one that
/// continues a final assistant message, as vLLM does: OpenAI's own API answers it as a new turn).
fn continues(provider: crate::llm::route::Provider) -> Result<bool, ConfigError> {
    use crate::llm::route::Provider;
    Ok(match provider {
        Provider::Offline | Provider::Anthropic | Provider::Bedrock => true,
        Provider::OpenAi => match crate::config::optional_env("LANES_OPENAI_CONTINUE_PREFIX").as_deref() {
            None | Some("off") => false,
            Some("on") => true,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "LANES_OPENAI_CONTINUE_PREFIX",
                    reason: format!("`{other}`; expected on or off"),
                });
            }
        },
    })
}

/// One route's client, continuing answers where it can, behind its limiter.
async fn route_client(
    adapters: &Adapters,
    clock: &SharedClock,
    route: &crate::llm::route::Route,
    offline: &Arc<dyn crate::ports::LlmClient>,
    (timeout, max_wait): (Duration, Duration),
    keys: &Keys,
) -> Result<crate::llm::route::RouteClient, ConfigError> {
    use crate::llm::route::Provider;
    let base = |default: &str| route.base_url.clone().unwrap_or_else(|| default.to_owned());
    let client: Arc<dyn crate::ports::LlmClient> = match route.provider {
        Provider::Offline => offline.clone(),
        Provider::OpenAi => Arc::new(crate::llm::OpenAiClient::new(
            &base("https://api.openai.com/v1"),
            &route.model,
            keys.openai.clone(),
            timeout,
        )),
        Provider::Anthropic => {
            let api_key = keys.anthropic.clone().ok_or(ConfigError::Missing("ANTHROPIC_API_KEY"))?;
            Arc::new(crate::llm::AnthropicClient::new(
                &base("https://api.anthropic.com"),
                &route.model,
                api_key,
                timeout,
            ))
        }
        Provider::Bedrock => {
            let sdk = crate::adapters::sdk_config(&Default::default()).await;
            Arc::new(crate::adapters::bedrock::BedrockClient::new(&sdk, &route.model))
        }
    };
    let client = Arc::new(crate::llm::Continuing::new(client, continues(route.provider)?)) as _;
    let name = route.name();
    let limiter = adapters.limiter(route, clock.clone())?;
    let client = match &limiter {
        Some(l) => Arc::new(crate::llm::Limited::new(client, l.clone(), max_wait).for_route(&name)) as _,
        None => client,
    };
    Ok(crate::llm::route::RouteClient::new(name, client, limiter, route.tiers))
}

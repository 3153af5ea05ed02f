//! Routes: the ordered provider/model list each lane calls, and the fallback between them.
//!
//! A lane's routes come from `LANES_LLM_ROUTES_<LANE>` (else `LANES_LLM_ROUTES`, else the single
//! route `LANES_LLM_PROVIDER`:`LANES_LLM_MODEL`), a comma-separated list of `provider:model`, each
//! optionally followed by `@base-url`, e.g.
//! `openai:gpt-4o-mini,anthropic:claude-3-5-haiku-latest@https://gateway.internal`.
//!
//! A route takes the vendor's service tiers (`flex`, `priority`: [`crate::domain::tier`]) on
//! OpenAI's own API, on Bedrock and on the offline model, and not on an OpenAI-compatible server of
//! one's own or on Anthropic's Messages API; `+tiers` or `+sync` after the model says otherwise
//! (`openai:gpt-5-mini+tiers@http://litellm:4000/v1`). A call asking for a tier on a route without
//! them is made at `sync`; a tier call the provider refuses is made again at `sync` on the same
//! route, and a model that has no such tier stops the route asking. The commits lane's first route
//! is where its provider batches go (`LANES_TIER_COMMITS=batch`): OpenAI's and Anthropic's own APIs
//! and the offline model have a batch endpoint; `+batch` says a server at another URL has its
//! vendor's (`+tiers+batch` combine).
//!
//! Each route has its own limiter (one per provider and model, so its own learned limits and
//! cooldown). [`Fallback`] tries the routes in order: a route cooling down after a 429 is skipped
//! while a later route exists, and a route failing with a retryable error (5xx, timeout, 429)
//! passes the same request to the next; the last route's answer or error is final. The retry policy
//! sits outside the fallback, so a retry starts again from the primary. The answer records the model
//! that produced it.

use crate::config::ConfigError;
use crate::domain::Lane;
use crate::domain::tier::Tier;
use crate::ports::RateLimiter;
use crate::ports::{DeltaSink, LlmClient, LlmError, LlmRequest, LlmResponse};
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The providers a route can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// The deterministic local model.
    Offline,
    /// OpenAI-compatible chat completions (OpenAI, vLLM, Ollama, LiteLLM).
    OpenAi,
    /// The Anthropic Messages API.
    Anthropic,
    /// Amazon Bedrock's Converse API.
    Bedrock,
}

impl Provider {
    /// The name used in route lists and limiter keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Offline => "offline",
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Bedrock => "bedrock",
        }
    }

    /// Whether a route of this provider at `base_url` takes service tiers unless it says otherwise:
    /// OpenAI's own API (no base URL) and Bedrock do, and so does the offline model (which serves
    /// any tier, free, so `lanes dev` shows the tiers); a server of one's own and Anthropic's
    /// Messages API do not.
    fn offers_tiers(self, base_url: Option<&str>) -> bool {
        match self {
            Provider::OpenAi => base_url.is_none(),
            Provider::Bedrock | Provider::Offline => true,
            Provider::Anthropic => false,
        }
    }

    /// Whether a route of this provider at `base_url` has a batch endpoint unless it says
    /// otherwise: OpenAI's own API (its Batch API), Anthropic's (Message Batches) and the offline
    /// model (its local twin). A server of one's own may have none; Bedrock's batch inference (a job
    /// over S3) is not taken.
    fn offers_batch(self, base_url: Option<&str>) -> bool {
        match self {
            Provider::OpenAi | Provider::Anthropic => base_url.is_none(),
            Provider::Offline => true,
            Provider::Bedrock => false,
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "offline" => Provider::Offline,
            "openai" => Provider::OpenAi,
            "anthropic" => Provider::Anthropic,
            "bedrock" => Provider::Bedrock,
            _ => return None,
        })
    }
}

/// One provider and model (and, optionally, where to reach it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    /// Who serves it.
    pub provider: Provider,
    /// The model id (a Bedrock model or inference-profile id for Bedrock; may be empty for offline).
    pub model: String,
    /// The API base URL, when not the vendor's.
    pub base_url: Option<String>,
    /// Whether calls may ask for the vendor's tiers (`flex`, `priority`): by default on OpenAI's
    /// own API, Bedrock and the offline model, never on a server of one's own; `+tiers` or `+sync`
    /// after the model says otherwise.
    pub tiers: bool,
    /// Whether the commits lane may hand its calls to the route's batch endpoint
    /// (`LANES_TIER_COMMITS=batch`): by default on OpenAI's own API and the offline model; `+batch`
    /// after the model says an OpenAI-compatible server has OpenAI's Files and Batches endpoints.
    pub batch: bool,
}

impl Route {
    /// `provider:model`: the route's name in metrics and its limiter's key.
    pub fn name(&self) -> String {
        format!("{}:{}", self.provider.as_str(), self.model)
    }

    /// Whether calls cost money and are paced by the provider's limits.
    pub fn is_real(&self) -> bool {
        self.provider != Provider::Offline
    }
}

/// The per-lane route variables.
pub const ROUTE_VARS: [&str; 3] =
    ["LANES_LLM_ROUTES_INTERACTIVE", "LANES_LLM_ROUTES_SYNTHESIS", "LANES_LLM_ROUTES_COMMITS"];

/// Parses a route list (`provider:model[@base-url]`, comma-separated), naming `var` in errors.
pub fn parse_routes(var: &'static str, list: &str) -> Result<Vec<Route>, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { name: var, reason };
    let mut routes = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (route, base_url) = match item.split_once('@') {
            Some((r, url)) => {
                crate::http::check_endpoint(url).map_err(|why| invalid(format!("in `{item}`: {why}")))?;
                (r, Some(url.to_owned()))
            }
            None => (item, None),
        };
        let (mut route, mut tier, mut batch) = (route, None, None);
        loop {
            if let Some(r) = route.strip_suffix("+tiers") {
                (route, tier) = (r, Some(true));
            } else if let Some(r) = route.strip_suffix("+sync") {
                (route, tier) = (r, Some(false));
            } else if let Some(r) = route.strip_suffix("+batch") {
                (route, batch) = (r, Some(true));
            } else {
                break;
            }
        }
        // Bedrock model ids contain `:` (`...-v1:0`): only the first one separates the provider.
        let (provider, model) = route.split_once(':').unwrap_or((route, ""));
        let provider = Provider::parse(provider).ok_or_else(|| {
            invalid(format!("`{provider}` in `{item}`; expected offline, openai, anthropic or bedrock"))
        })?;
        if model.is_empty() && provider != Provider::Offline {
            return Err(invalid(format!("`{item}` names no model; write {}:<model>", provider.as_str())));
        }
        let tiers = match (provider, tier) {
            (Provider::Anthropic, Some(true)) => {
                return Err(invalid(format!("`{item}`: {} takes no service tier", provider.as_str())));
            }
            (_, Some(tiers)) => tiers,
            (_, None) => provider.offers_tiers(base_url.as_deref()),
        };
        let batch = match (provider, batch) {
            (Provider::Bedrock, Some(true)) => {
                return Err(invalid(format!(
                    "`{item}`: batches are taken on openai and anthropic routes only"
                )));
            }
            (_, Some(b)) => b,
            (_, None) => provider.offers_batch(base_url.as_deref()),
        };
        routes.push(Route { provider, model: model.to_owned(), base_url, tiers, batch });
    }
    if routes.is_empty() {
        return Err(invalid("no route given".into()));
    }
    Ok(routes)
}

/// Every lane's routes, from the environment (see the module header).
pub fn routes_from_env() -> Result<[Vec<Route>; 3], ConfigError> {
    use crate::config::optional_env;
    let default = match optional_env("LANES_LLM_ROUTES") {
        Some(list) => parse_routes("LANES_LLM_ROUTES", &list)?,
        None => {
            let provider = optional_env("LANES_LLM_PROVIDER").unwrap_or_else(|| "offline".into());
            let provider = Provider::parse(&provider).ok_or_else(|| ConfigError::Invalid {
                name: "LANES_LLM_PROVIDER",
                reason: format!("`{provider}`; expected offline, openai, anthropic or bedrock"),
            })?;
            let model = match provider {
                Provider::Offline => String::new(),
                _ => crate::config::require_env("LANES_LLM_MODEL")?,
            };
            let base_url = optional_env("LANES_LLM_BASE_URL");
            if let Some(url) = &base_url {
                crate::http::check_endpoint(url)
                    .map_err(|reason| ConfigError::Invalid { name: "LANES_LLM_BASE_URL", reason })?;
            }
            let tiers = provider.offers_tiers(base_url.as_deref());
            let batch = provider.offers_batch(base_url.as_deref());
            vec![Route { provider, model, base_url, tiers, batch }]
        }
    };
    let mut lanes: [Vec<Route>; 3] = Default::default();
    for lane in Lane::ALL {
        let var = ROUTE_VARS[lane.index()];
        lanes[lane.index()] = match optional_env(var) {
            Some(list) => parse_routes(var, &list)?,
            None => default.clone(),
        };
    }
    Ok(lanes)
}

/// One route ready to call: its client (limited, not retried) and its limiter.
#[derive(Clone)]
pub struct RouteClient {
    /// `provider:model`.
    pub name: String,
    /// The provider behind its limiter.
    pub client: Arc<dyn LlmClient>,
    /// The route's limiter, to see a cooldown before calling.
    pub limiter: Option<Arc<dyn RateLimiter>>,
    /// Whether it is asked for service tiers: the route's setting, until its model says it has
    /// none of the one asked for.
    pub tiers: Arc<AtomicBool>,
}

impl RouteClient {
    /// A route's client; `tiers` as the route allows them.
    pub fn new(
        name: String,
        client: Arc<dyn LlmClient>,
        limiter: Option<Arc<dyn RateLimiter>>,
        tiers: bool,
    ) -> Self {
        Self { name, client, limiter, tiers: Arc::new(AtomicBool::new(tiers)) }
    }

    /// Calls at the tier asked for where this route offers it, else at `sync`. A call refused its
    /// tier (flex without capacity now, or a model without the tier, which stops the route asking)
    /// is made again at `sync` at once, through the limiter again: neither a failure nor an attempt
    /// of the task.
    async fn complete(
        &self,
        request: &LlmRequest,
        sink: Option<&dyn DeltaSink>,
    ) -> Result<LlmResponse, LlmError> {
        let answer = self.call_at_tier(request, sink).await?;
        Ok(LlmResponse { route: self.name.clone(), ..answer })
    }

    async fn call_at_tier(
        &self,
        request: &LlmRequest,
        sink: Option<&dyn DeltaSink>,
    ) -> Result<LlmResponse, LlmError> {
        let sync = || LlmRequest { tier: Tier::Sync, ..request.clone() };
        if request.tier == Tier::Sync {
            return self.client.call(request, sink).await;
        }
        if !self.tiers.load(Ordering::Relaxed) {
            return self.client.call(&sync(), sink).await;
        }
        // A refusal comes before any text: the call at sync needs no restart.
        match self.client.call(request, sink).await {
            Err(LlmError::TierRefused { message, unsupported }) => {
                let why = format!(
                    "{}_{}",
                    request.tier.as_str(),
                    if unsupported { "unsupported" } else { "refused" }
                );
                tracing::info!(lane = %request.lane, route = %self.name, %message, why, "tier refused; calling at sync");
                crate::metrics::llm_route_event(request.lane, &self.name, &why);
                if unsupported {
                    self.tiers.store(false, Ordering::Relaxed);
                }
                self.client.call(&sync(), sink).await
            }
            other => other,
        }
    }
}

/// Tries each lane's routes in order (see the module header).
pub struct Fallback {
    lanes: [Vec<RouteClient>; 3],
}

impl Fallback {
    /// Routes per lane ([`Lane::index`]); a lane with none answers with a permanent error.
    pub fn new(lanes: [Vec<RouteClient>; 3]) -> Self {
        Self { lanes }
    }
}

/// Counts a fallback from one route to the next.
fn fell_back(lane: Lane, from: &str, why: &str) {
    tracing::warn!(lane = %lane, route = from, why, "falling back to the next route");
    crate::metrics::llm_route_event(lane, from, "fallback");
}

#[async_trait]
impl LlmClient for Fallback {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        self.through_routes(request, None).await
    }
    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        self.through_routes(request, Some(sink)).await
    }
}

impl Fallback {
    /// The call on each of the lane's routes in turn until one answers or fails for good; a stream
    /// the failed route began is told to restart before the next route's.
    async fn through_routes(
        &self,
        request: &LlmRequest,
        sink: Option<&dyn DeltaSink>,
    ) -> Result<LlmResponse, LlmError> {
        let routes = &self.lanes[request.lane.index()];
        let Some((last, earlier)) = routes.split_last() else {
            return Err(LlmError::Permanent(format!("no LLM route for the {} lane", request.lane)));
        };
        for route in earlier {
            if let Some(limiter) = &route.limiter
                && let Ok(Some(_)) = limiter.cooling_for().await
            {
                fell_back(request.lane, &route.name, "cooldown");
                continue;
            }
            match route.complete(request, sink).await {
                Err(
                    e @ (LlmError::Retryable { .. }
                    | LlmError::Throttled { .. }
                    | LlmError::TierRefused { .. }),
                ) => {
                    let why = if matches!(e, LlmError::Throttled { .. }) { "throttled" } else { "retryable" };
                    tracing::debug!(error = %e, "route failed");
                    fell_back(request.lane, &route.name, why);
                    if let Some(sink) = sink {
                        sink.restart("falling back to the next route");
                    }
                }
                other => return other,
            }
        }
        last.complete(request, sink).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::domain::{Kind, TokenUsage};
    use crate::limiter::{LimiterConfig, MemoryLimiter};
    use std::sync::Mutex;
    use std::time::Duration;

    #[test]
    fn route_lists_parse_and_bad_ones_name_the_variable() {
        let r = parse_routes(
            "V",
            "openai:gpt-4o-mini, bedrock:anthropic.claude-3-5-haiku-20241022-v1:0,anthropic:claude-3-5-haiku-latest@http://127.0.0.1:9",
        )
        .unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].name(), "openai:gpt-4o-mini");
        assert_eq!(r[1].model, "anthropic.claude-3-5-haiku-20241022-v1:0");
        assert_eq!(r[2].base_url.as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(parse_routes("V", "offline").unwrap()[0].provider, Provider::Offline);
        // Tiers where the vendor sells them, unless the route says otherwise.
        assert_eq!(r.iter().map(|r| r.tiers).collect::<Vec<_>>(), [true, true, false]);
        let said =
            parse_routes("V", "openai:m+tiers@http://127.0.0.1:4000/v1,openai:m+sync,bedrock:b-v1:0+sync")
                .unwrap();
        assert_eq!(
            said.iter().map(|r| (r.model.as_str(), r.tiers)).collect::<Vec<_>>(),
            [("m", true), ("m", false), ("b-v1:0", false)]
        );
        assert_eq!(said[0].base_url.as_deref(), Some("http://127.0.0.1:4000/v1"));
        assert!(
            parse_routes("V", "anthropic:claude+tiers")
                .unwrap_err()
                .to_string()
                .contains("takes no service tier")
        );
        assert!(parse_routes("V", "offline").unwrap()[0].tiers, "the offline model serves any tier");
        for bad in
            ["", "cohere:x", "openai", "openai:", "openai:m@ftp://x", "openai:m@http://llm.internal:8000"]
        {
            let e = parse_routes("V", bad).unwrap_err().to_string();
            assert!(e.contains('V'), "{bad}: {e}");
        }
    }

    /// A provider answering with a scripted sequence of results, counting its calls.
    struct Scripted {
        model: &'static str,
        script: Mutex<Vec<Result<(), LlmError>>>,
        calls: Mutex<u32>,
    }

    impl Scripted {
        fn new(model: &'static str, script: Vec<Result<(), LlmError>>) -> Arc<Self> {
            Arc::new(Self { model, script: Mutex::new(script), calls: Mutex::new(0) })
        }
        fn calls(&self) -> u32 {
            *self.calls.lock().unwrap()
        }
    }

    #[async_trait]
    impl LlmClient for Scripted {
        async fn complete(&self, _: &LlmRequest) -> Result<LlmResponse, LlmError> {
            *self.calls.lock().unwrap() += 1;
            let next = {
                let mut s = self.script.lock().unwrap();
                if s.is_empty() { Ok(()) } else { s.remove(0) }
            };
            next.map(|()| LlmResponse {
                text: "ok".into(),
                model: self.model.into(),
                usage: TokenUsage { prompt: 1, completion: 1 },
                truncated: false,
                limits: Default::default(),
                tier: Default::default(),
                route: Default::default(),
                continued: 0,
            })
        }
    }

    fn request() -> LlmRequest {
        LlmRequest {
            lane: Lane::Interactive,
            kind: Kind::Explain,
            prompt: "p".into(),
            target_files: vec![],
            max_tokens: 10,
            params: Default::default(),
            tier: Default::default(),
            prefix: None,
        }
    }

    fn fallback(routes: Vec<RouteClient>) -> Fallback {
        Fallback::new([routes, vec![], vec![]])
    }

    fn failure(status: u16) -> LlmError {
        if status == 429 {
            LlmError::Throttled { message: "429".into(), retry_after: None }
        } else {
            LlmError::Retryable { message: status.to_string(), retry_after: None }
        }
    }

    #[tokio::test]
    async fn a_failing_primary_passes_the_request_on_and_the_answer_names_the_model() {
        let primary = Scripted::new("light", vec![Err(failure(503)), Err(failure(429))]);
        let second = Scripted::new("heavy", vec![]);
        let f = fallback(vec![
            RouteClient::new("openai:light".into(), primary.clone(), None, false),
            RouteClient::new("anthropic:heavy".into(), second.clone(), None, false),
        ]);
        let before = crate::metrics::LLM_ROUTE_EVENTS
            .with_label_values(&["interactive", "openai:light", "fallback"])
            .get();
        assert_eq!(f.complete(&request()).await.unwrap().model, "heavy");
        assert_eq!(f.complete(&request()).await.unwrap().model, "heavy");
        assert_eq!(f.complete(&request()).await.unwrap().model, "light");
        assert_eq!((primary.calls(), second.calls()), (3, 2));
        let after = crate::metrics::LLM_ROUTE_EVENTS
            .with_label_values(&["interactive", "openai:light", "fallback"])
            .get();
        assert_eq!(after - before, 2);
    }

    #[tokio::test]
    async fn a_primary_cooling_down_is_not_called_and_refusals_are_final() {
        let clock = ManualClock::new(1_000_000);
        let limiter: Arc<dyn RateLimiter> =
            Arc::new(MemoryLimiter::new(LimiterConfig::new(600.0, 1e6), clock.clone()));
        limiter.cool_down(Duration::from_secs(5)).await.unwrap();
        let primary = Scripted::new("light", vec![Err(LlmError::Permanent("bad request".into()))]);
        let second = Scripted::new("heavy", vec![]);
        let f = fallback(vec![
            RouteClient::new("p".into(), primary.clone(), Some(limiter.clone()), false),
            RouteClient::new("s".into(), second.clone(), None, false),
        ]);
        assert_eq!(f.complete(&request()).await.unwrap().model, "heavy");
        assert_eq!(primary.calls(), 0);
        clock.advance_ms(6_000);
        // The cooldown is over: the primary serves again, and its refusal is not retried elsewhere.
        assert!(matches!(f.complete(&request()).await, Err(LlmError::Permanent(_))));
        assert_eq!((primary.calls(), second.calls()), (1, 1));
        // The last route's errors are final too.
        let only = fallback(vec![RouteClient::new(
            "x".into(),
            Scripted::new("x", vec![Err(failure(503))]),
            None,
            false,
        )]);
        assert!(matches!(only.complete(&request()).await, Err(LlmError::Retryable { .. })));
    }
}

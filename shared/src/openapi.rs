//! The HTTP contract as an OpenAPI 3.1 document, generated from the handlers' own annotations
//! (`#[utoipa::path]` beside each handler) and the types they send and take (`ToSchema` derived on
//! them, so serde's renames and optional fields are what the document says). Served at
//! `GET /openapi.json` (and `/v1/openapi.json`, the path API Gateway routes to ingress); a test checks
//! that every route the routers serve is in it, and CI validates it with a standard validator.

use utoipa::OpenApi;

/// The routes that serve the document: `/openapi.json`, and `/v1/openapi.json` (the path API
/// Gateway routes to ingress). Merged beside the task routes by whoever serves them.
pub fn routes() -> axum::Router {
    let serve = || async { axum::Json(document()) };
    axum::Router::new()
        .route("/openapi.json", axum::routing::get(serve))
        .route("/v1/openapi.json", axum::routing::get(serve))
}

/// The document's source: every public route and the schemas they use.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Lanes",
        description = "AI code-generation tasks (idempotent, one lane per kind) and Git commit summaries. \
            Errors are RFC 9457 problem details (`application/problem+json`) whose `type` is a relative \
            reference `/problems/<slug>` naming the kind of problem; `field` and `errors` name what is wrong.",
    ),
    paths(
        crate::tasks::ingress::post_task,
        crate::tasks::ingress::get_task,
        crate::tasks::ingress::cancel_task,
        crate::tasks::events::task_events,
        crate::tasks::ingress::healthz,
        crate::commits::api::get_summary,
        crate::commits::api::list,
        crate::commits::webhook::github,
        crate::commits::webhook::gitlab,
        crate::commits::webhook::function_url,
    ),
    components(schemas(
        crate::domain::TaskRequest,
        crate::domain::request::ModelParams,
        crate::domain::fairness::Priority,
        crate::domain::TaskView,
        crate::tasks::events::StreamEvent,
        crate::domain::TaskStatus,
        crate::domain::TaskResult,
        crate::domain::Lane,
        crate::domain::Kind,
        crate::domain::TokenUsage,
        crate::domain::tier::Tier,
        crate::domain::FieldError,
        crate::domain::commit::CommitSummary,
        crate::domain::commit::SummarySource,
        crate::commits::api::SummaryPage,
        crate::commits::webhook::WebhookAnswer,
        crate::problem::Problem,
    )),
    tags(
        (name = "tasks", description = "Submit, read, long-poll and cancel tasks (behind API Gateway's authorizer)"),
        (name = "summaries", description = "Commit summaries, read"),
        (name = "webhooks", description = "Git push webhooks (the function URL; `lanes dev` serves both host routes)"),
        (name = "health", description = "Liveness"),
    )
)]
pub struct ApiDoc;

/// The document as JSON.
pub fn document() -> serde_json::Value {
    serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_is_openapi_3_1_with_every_route() {
        let doc = document();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
        for path in ["/v1/tasks", "/v1/tasks/{id}", "/healthz", "/webhooks/github", "/"] {
            assert!(doc["paths"].get(path).is_some(), "{path}");
        }
        let post = &doc["paths"]["/v1/tasks"]["post"];
        assert!(post["responses"]["429"]["content"].get("application/problem+json").is_some());
        let task = &doc["components"]["schemas"]["TaskRequest"]["properties"];
        assert!(task.get("tenant").is_none(), "the tenant is never the client's to send");
        assert!(task.get("prompt").is_some());
        assert_eq!(
            doc["components"]["schemas"]["Priority"]["enum"],
            serde_json::json!(["high", "normal", "low"])
        );
        assert!(task["priority"].to_string().contains("Priority"), "{}", task["priority"]);
        assert_eq!(doc["components"]["schemas"]["TaskStatus"]["enum"][0], "PENDING");
    }
}

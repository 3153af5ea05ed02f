//! The OpenAPI document as served by the real `lanes dev`: valid OpenAPI 3.1 by a validator we did
//! not write (`openapi-spec-validator`, from the project venv), and complete: every route the
//! public routers declare is in it with its methods.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_tests::{Backend, Stack, venv_bin, workspace_root};

/// `(path, method)` of every route the public routers declare (`.route("/p", get(..).delete(..))`).
fn declared_routes() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for file in [
        "shared/src/tasks/ingress.rs",
        "shared/src/tasks/events.rs",
        "shared/src/commits/api.rs",
        "shared/src/commits/webhook.rs",
    ] {
        let src = std::fs::read_to_string(workspace_root().join(file)).unwrap();
        let src = src.split("#[cfg(test)]").next().unwrap();
        for part in src.split(".route(").skip(1) {
            // rustfmt may put the path on its own line.
            let Some(part) = part.trim_start().strip_prefix('"') else { continue };
            let path = part.split('"').next().unwrap().to_owned();
            let rest = part.split_once(',').unwrap().1;
            let call = rest.split("))\n").next().unwrap();
            for method in ["get", "post", "delete", "put", "patch"] {
                if call.trim_start().starts_with(&format!("{method}("))
                    || call.contains(&format!(".{method}("))
                {
                    out.push((path.clone(), method.to_owned()));
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn the_served_document_is_valid_openapi_3_1_and_names_every_route() {
    let stack = Stack::start(Backend::Embedded, &[]).await;
    let resp = reqwest::get(format!("{}/openapi.json", stack.server.url)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let doc: serde_json::Value = resp.json().await.unwrap();
    let v1: serde_json::Value =
        reqwest::get(format!("{}/v1/openapi.json", stack.server.url)).await.unwrap().json().await.unwrap();
    assert_eq!(doc, v1, "the same document where API Gateway routes it");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1."), "{}", doc["openapi"]);

    let file = tempfile::NamedTempFile::with_suffix(".json").unwrap();
    std::fs::write(file.path(), serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let out =
        std::process::Command::new(venv_bin("openapi-spec-validator")).arg(file.path()).output().unwrap();
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let routes = declared_routes();
    assert!(routes.len() >= 9, "{routes:?}");
    for (path, method) in &routes {
        if path.ends_with("openapi.json") {
            continue;
        }
        assert!(
            doc["paths"][path].get(method).is_some(),
            "{method} {path} is served but not in the document"
        );
    }
}

//! The query strings the HTTP routes take: each parameter a route knows at most once,
//! percent-decoded; an unknown or repeated one is a `400` problem naming it, so a typo or an
//! ambiguous `?limit=1&limit=2` is never silently read one way.

use crate::problem::Problem;
use axum::http::StatusCode;
use std::collections::BTreeMap;

/// The parameters of `raw` (the query string, without `?`), each one of `known`.
pub fn params(
    raw: Option<&str>,
    known: &[&'static str],
) -> Result<BTreeMap<&'static str, String>, Box<Problem>> {
    let bad = |field: &str, reason: String| {
        let field: String = field.chars().take(40).collect();
        Box::new(
            Problem::new(StatusCode::BAD_REQUEST, "invalid-query", "Invalid query parameter", reason)
                .with_field(&field),
        )
    };
    let mut out = BTreeMap::new();
    for (key, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        let Some(name) = known.iter().find(|k| **k == key) else {
            let list = known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
            return Err(bad(&key, format!("unknown query parameter; this route takes {list}")));
        };
        if out.insert(*name, value.into_owned()).is_some() {
            return Err(bad(name, format!("`{name}` is given more than once")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_parameters_once_each_decoded() {
        let got = params(Some("limit=5&cursor=a%2Db"), &["limit", "cursor"]).unwrap_or_default();
        assert_eq!((got["limit"].as_str(), got["cursor"].as_str()), ("5", "a-b"));
        assert!(params(None, &["limit"]).is_ok_and(|p| p.is_empty()));
        for (raw, field) in [("limit=1&limit=2", "limit"), ("limt=1", "limt"), ("wait=1", "wait")] {
            let e = params(Some(raw), &["limit", "cursor"]).err();
            assert_eq!(e.and_then(|p| p.field.clone()).as_deref(), Some(field), "{raw}");
        }
    }
}

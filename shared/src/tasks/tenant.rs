//! The tenant: the authenticated caller of the task API, never a field the client chooses.
//!
//! With tenancy on, a task belongs to the tenant that submitted it: its id is derived from the
//! tenant (so two tenants sending the same payload, or the same `Idempotency-Key`, get different
//! tasks), and reads, cancellations and long-polls of another tenant's task answer `404`, as for a
//! task that does not exist. A request without a tenant is a `401`.
//!
//! Where the tenant comes from ([`Tenancy`]):
//! - in Lambda, from API Gateway's authorizer: the JWT claim named by `LANES_TENANT_CLAIM` (default
//!   `sub`), or with IAM authorization the caller's principal (its ARN); the Lambda glue puts it in the
//!   request's extensions as a [`Tenant`];
//! - in `lanes dev --tenant-header NAME`, from a header set by a trusted local proxy ([`from_header`]);
//! - otherwise tenancy is off: one tenant, as a single-user local run.
//!
//! Commit summaries are not tenant-scoped: one deployment serves one organisation, whose repositories'
//! summaries every member may read.

use axum::extract::{Request, State};
use axum::http::HeaderName;
use axum::middleware::Next;
use axum::response::Response;

/// The authenticated caller, as a request extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// Longest tenant identifier kept (an IAM role-session ARN fits).
pub const MAX_TENANT_LEN: usize = 512;

impl Tenant {
    /// A tenant from an identity string: trimmed, non-empty, at most [`MAX_TENANT_LEN`] bytes, no
    /// control characters; `None` otherwise (the request is then unauthenticated).
    pub fn parse(raw: &str) -> Option<Self> {
        let t = raw.trim();
        (!t.is_empty() && t.len() <= MAX_TENANT_LEN && !t.chars().any(char::is_control))
            .then(|| Self(t.to_owned()))
    }
}

impl Tenant {
    /// A tenant from an IAM caller's ARN: an assumed role's session name is dropped
    /// (`arn:aws:sts::123:assumed-role/R/session` is `arn:aws:sts::123:assumed-role/R`), because
    /// sessions change with every credential refresh while the role is who is calling.
    pub fn from_principal(arn: &str) -> Option<Self> {
        let arn = arn.trim();
        let principal = match arn.split_once(":assumed-role/") {
            Some((head, role_session)) => match role_session.split_once('/') {
                Some((role, _session)) => format!("{head}:assumed-role/{role}"),
                None => arn.to_owned(),
            },
            None => arn.to_owned(),
        };
        Self::parse(&principal)
    }
}

/// Where the tenant comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Tenancy {
    /// Single-tenant: no tenant is required or recorded.
    #[default]
    Off,
    /// A header set by a trusted proxy (`lanes dev --tenant-header NAME`).
    Header(HeaderName),
    /// API Gateway's authorizer: this JWT claim, or the IAM principal.
    Authorizer {
        /// The claim naming the tenant.
        claim: String,
    },
}

impl Tenancy {
    /// Whether requests must carry a tenant.
    pub fn is_on(&self) -> bool {
        !matches!(self, Tenancy::Off)
    }
}

/// `router` with the tenant taken from the header of [`Tenancy::Header`]; unchanged otherwise (the
/// authorizer's tenant is set by the Lambda glue, which owns API Gateway's request context).
pub fn with_header(router: axum::Router, tenancy: &Tenancy) -> axum::Router {
    match tenancy {
        Tenancy::Header(name) => {
            router.layer(axum::middleware::from_fn_with_state(name.clone(), from_header))
        }
        _ => router,
    }
}

/// Middleware for [`Tenancy::Header`]: the header's value becomes the request's [`Tenant`]. Any
/// `Tenant` already in the extensions is replaced, so only the named header can set it.
pub async fn from_header(State(name): State<HeaderName>, mut req: Request, next: Next) -> Response {
    let tenant = req.headers().get(&name).and_then(|v| v.to_str().ok()).and_then(Tenant::parse);
    match tenant {
        Some(t) => {
            req.extensions_mut().insert(t);
        }
        None => {
            req.extensions_mut().remove::<Tenant>();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_trimmed_and_bad_ones_refused() {
        assert_eq!(Tenant::parse(" team-a "), Some(Tenant("team-a".into())));
        for bad in ["", "   ", "a\nb", &"x".repeat(MAX_TENANT_LEN + 1)] {
            assert_eq!(Tenant::parse(bad), None, "{bad:?}");
        }
        assert!(Tenant::parse("arn:aws:sts::123456789012:assumed-role/r/session").is_some());
        let role = Tenant::from_principal("arn:aws:sts::123456789012:assumed-role/ci/botocore-session-1796");
        assert_eq!(role, Some(Tenant("arn:aws:sts::123456789012:assumed-role/ci".into())));
        let user = Tenant::from_principal("arn:aws:iam::123456789012:user/dev");
        assert_eq!(user, Some(Tenant("arn:aws:iam::123456789012:user/dev".into())));
    }
}

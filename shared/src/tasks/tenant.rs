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
//! Commit summaries are read by tenant too: only tenants mapped to a repository's owner read its
//! summaries ([`crate::commits::readers`]).

use axum::extract::{Request, State};
use axum::http::HeaderName;
use axum::middleware::Next;
use axum::response::Response;

pub use crate::domain::Tenant;

impl Tenant {
    /// A tenant from an identity string, trimmed; `None` when what is left is not a valid
    /// [`Tenant`] (the request is then unauthenticated).
    pub fn from_identity(raw: &str) -> Option<Self> {
        Self::parse(raw.trim()).ok()
    }

    /// A tenant from an IAM caller, by session: a Cognito identity pool's caller is its identity
    /// (`cognito-identity:<pool>:<id>`: every one of them assumes the same role, in a session named
    /// alike), anyone else its whole ARN, session name included.
    pub fn from_session(arn: &str, cognito: Option<(&str, &str)>) -> Option<Self> {
        match cognito {
            Some((pool, id)) => Self::from_identity(&format!("cognito-identity:{pool}:{id}")),
            None => Self::from_identity(arn.trim()),
        }
    }

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
        Self::from_identity(&principal)
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
        /// With IAM: each session is its own tenant (a Cognito identity pool's caller is its
        /// identity id), instead of every session of one role being one tenant.
        iam_session: bool,
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
    let tenant = req.headers().get(&name).and_then(|v| v.to_str().ok()).and_then(Tenant::from_identity);
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

    /// By role, every session of a role is one tenant; by session, each is its own, and a Cognito
    /// identity pool's callers (one role, one session name) are told apart by identity.
    #[test]
    fn iam_callers_by_role_or_by_session() {
        let a = "arn:aws:sts::123456789012:assumed-role/AWSReservedSSO_Dev/alice";
        let b = "arn:aws:sts::123456789012:assumed-role/AWSReservedSSO_Dev/bob";
        assert_eq!(Tenant::from_principal(a), Tenant::from_principal(b));
        assert_ne!(Tenant::from_session(a, None), Tenant::from_session(b, None));
        let pool = "arn:aws:sts::123456789012:assumed-role/Cognito_Auth/CognitoIdentityCredentials";
        let one = Tenant::from_session(pool, Some(("us-east-1:pool", "us-east-1:one")));
        let two = Tenant::from_session(pool, Some(("us-east-1:pool", "us-east-1:two")));
        assert!(one.is_some() && one != two, "{one:?} {two:?}");
    }
    use super::*;

    #[test]
    fn identities_are_trimmed_and_bad_ones_refused() {
        let t = |s: &str| Tenant::parse(s).ok();
        assert_eq!(Tenant::from_identity(" team-a "), t("team-a"));
        for bad in ["", "   ", "a\nb", &"x".repeat(crate::domain::ids::MAX_TENANT_LEN + 1)] {
            assert_eq!(Tenant::from_identity(bad), None, "{bad:?}");
        }
        assert!(Tenant::from_identity("arn:aws:sts::123456789012:assumed-role/r/session").is_some());
        let role = Tenant::from_principal("arn:aws:sts::123456789012:assumed-role/ci/botocore-session-1796");
        assert_eq!(role, t("arn:aws:sts::123456789012:assumed-role/ci"));
        let user = Tenant::from_principal("arn:aws:iam::123456789012:user/dev");
        assert_eq!(user, t("arn:aws:iam::123456789012:user/dev"));
    }
}

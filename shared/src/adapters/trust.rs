//! The TLS roots the AWS SDK clients trust: Amazon Trust Services' five roots in Lambda, the
//! system's everywhere else and whenever the deployment asks for them.
//!
//! # Why not always the system's
//!
//! The SDK's default HTTPS client reads the system bundle when a client is built: about 140
//! certificates, 220 KB of PEM that `rustls-pki-types` decodes in constant time. That is about a
//! fifth of a function's init (`lanes bench coldstart`). Every endpoint of the commercial and
//! GovCloud partitions presents a certificate that chains to one of Amazon Trust Services' roots
//! (`amazon-trust-roots.pem`: Amazon Root CA 1-4 and the Starfield Services G2 root they are
//! cross-signed by, as Debian's `ca-certificates` ships them). Five roots parse in microseconds, and
//! a call to an AWS API can then only be answered by a certificate Amazon issued: less trust than the
//! whole bundle, not more.
//!
//! # The choice
//!
//! `LANES_AWS_TLS_ROOTS` is `amazon` or `system`. Unset, [`AwsRoots::choose`] picks the system's:
//! - outside Lambda (a laptop behind a TLS-inspecting proxy trusts that proxy through the system store);
//! - when `SSL_CERT_FILE` or `SSL_CERT_DIR` names roots (an egress firewall's CA, say);
//! - when an endpoint is overridden (`AWS_ENDPOINT_URL*`, or the settings' endpoint): an emulator or
//!   a proxy, whose certificate any CA may have signed;
//! - in the China and ISO partitions, whose endpoints other CAs sign.
//!
//! and Amazon's otherwise. A refused certificate is a `DispatchFailure` naming `UnknownIssuer`,
//! which the adapters report as the service being unavailable.

use crate::config::ConfigError;
use aws_smithy_runtime_api::client::http::SharedHttpClient;

/// The variable that states the choice.
pub const ROOTS_VAR: &str = "LANES_AWS_TLS_ROOTS";

/// Amazon Trust Services' roots, PEM.
pub const AMAZON_TRUST_ROOTS: &[u8] = include_bytes!("amazon-trust-roots.pem");

/// Which roots the AWS SDK clients trust.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwsRoots {
    /// Amazon Trust Services' roots only.
    Amazon,
    /// The system's (the SDK's default: `rustls-native-certs`, which honours `SSL_CERT_FILE`).
    System,
}

impl AwsRoots {
    /// The choice from the process environment; `endpoint_overridden` says whether the settings name
    /// an endpoint of their own.
    pub fn from_env(endpoint_overridden: bool) -> Result<Self, ConfigError> {
        let endpoint_overridden = endpoint_overridden
            || std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("AWS_ENDPOINT_URL"));
        Self::choose(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()), endpoint_overridden)
    }

    /// The choice from variables read through `var` (see the module docs for the rules).
    pub fn choose(
        var: impl Fn(&str) -> Option<String>,
        endpoint_overridden: bool,
    ) -> Result<Self, ConfigError> {
        if let Some(stated) = var(ROOTS_VAR) {
            return match stated.trim().to_ascii_lowercase().as_str() {
                "amazon" => Ok(Self::Amazon),
                "system" => Ok(Self::System),
                _ => Err(ConfigError::Invalid {
                    name: ROOTS_VAR,
                    reason: format!("`{stated}`; expected `amazon` or `system`"),
                }),
            };
        }
        let in_lambda = var("AWS_LAMBDA_FUNCTION_NAME").is_some();
        let roots_named = var("SSL_CERT_FILE").is_some() || var("SSL_CERT_DIR").is_some();
        let region = var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")).unwrap_or_default();
        // China (`cn-north-1`) and the isolated partitions (`us-iso-east-1`, `eu-isoe-west-1`, ...).
        let other_partition = region.starts_with("cn-") || region.contains("-iso");
        Ok(if in_lambda && !roots_named && !endpoint_overridden && !other_partition {
            Self::Amazon
        } else {
            Self::System
        })
    }

    /// The HTTP client for these roots: `None` leaves the SDK's default in place.
    pub fn http_client(self) -> Option<SharedHttpClient> {
        match self {
            Self::System => None,
            Self::Amazon => pinned_https_client(AMAZON_TRUST_ROOTS),
        }
    }
}

/// The SDK's default HTTPS client (rustls with aws-lc, the proxy from the environment, the
/// connector settings and sleep of each client), trusting only the roots in `pem`. `None` if the
/// TLS context cannot be built, so the caller keeps the default rather than failing.
pub fn pinned_https_client(pem: &[u8]) -> Option<SharedHttpClient> {
    use aws_smithy_http_client::{Builder, ConnectorBuilder, proxy::ProxyConfig, tls};
    let context = tls::TlsContext::builder()
        .with_trust_store(
            tls::TrustStore::empty().with_native_roots(false).with_pem_certificate(pem.to_vec()),
        )
        .build()
        .map_err(|e| tracing::error!(error = %e, "pinned TLS roots: keeping the system's"))
        .ok()?;
    Some(Builder::new().build_with_connector_fn(move |settings, components| {
        let mut connector = ConnectorBuilder::default()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
            .tls_context(context.clone());
        connector.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            connector.set_sleep_impl(components.sleep_impl());
        }
        connector.set_proxy_config(Some(ProxyConfig::from_env()));
        connector.build()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn choose(vars: &[(&str, &str)], endpoint: bool) -> Result<AwsRoots, ConfigError> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        AwsRoots::choose(|n| vars.get(n).cloned(), endpoint)
    }

    const LAMBDA: (&str, &str) = ("AWS_LAMBDA_FUNCTION_NAME", "lanes-worker");

    #[test]
    fn lambda_in_a_commercial_or_govcloud_region_trusts_amazon() {
        for region in ["us-east-1", "eu-west-3", "us-gov-west-1"] {
            assert_eq!(
                choose(&[LAMBDA, ("AWS_REGION", region)], false).ok(),
                Some(AwsRoots::Amazon),
                "{region}"
            );
        }
    }

    #[test]
    fn anything_that_names_other_roots_or_endpoints_keeps_the_system_roots() {
        let system = Some(AwsRoots::System);
        assert_eq!(choose(&[("AWS_REGION", "us-east-1")], false).ok(), system, "outside Lambda");
        assert_eq!(choose(&[LAMBDA, ("SSL_CERT_FILE", "/opt/ca.pem")], false).ok(), system);
        assert_eq!(choose(&[LAMBDA, ("SSL_CERT_DIR", "/opt/certs")], false).ok(), system);
        assert_eq!(choose(&[LAMBDA], true).ok(), system, "an endpoint override");
        for region in ["cn-north-1", "cn-northwest-1", "us-iso-east-1", "us-isob-east-1", "eu-isoe-west-1"] {
            assert_eq!(choose(&[LAMBDA, ("AWS_REGION", region)], false).ok(), system, "{region}");
        }
    }

    #[test]
    fn the_variable_wins_and_a_bad_value_is_named() {
        assert_eq!(choose(&[(ROOTS_VAR, "amazon")], true).ok(), Some(AwsRoots::Amazon));
        assert_eq!(choose(&[LAMBDA, (ROOTS_VAR, " System ")], false).ok(), Some(AwsRoots::System));
        let err = choose(&[(ROOTS_VAR, "mozilla")], false).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err.contains(ROOTS_VAR) && err.contains("`mozilla`") && err.contains("`amazon` or `system`"),
            "{err}"
        );
    }

    #[test]
    fn the_pinned_roots_are_the_five_amazon_trust_services_roots() {
        use rustls_pki_types::{CertificateDer, pem::PemObject};
        let certs: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(AMAZON_TRUST_ROOTS)
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("amazon-trust-roots.pem: {e}"));
        assert_eq!(certs.len(), 5);
        let names = String::from_utf8_lossy(AMAZON_TRUST_ROOTS);
        for name in [
            "Amazon Root CA 1",
            "Amazon Root CA 2",
            "Amazon Root CA 3",
            "Amazon Root CA 4",
            "Starfield Services Root",
        ] {
            assert!(names.contains(name), "{name} missing");
        }
        // Each one parses as a trust anchor, as the connector will read it.
        let mut store = rustls::RootCertStore::empty();
        assert_eq!(store.add_parsable_certificates(certs), (5, 0));
    }
}

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
//! `LANES_AWS_TLS_ROOTS` is `amazon` or `system`. Unset, [`AwsRoots::choose`] picks Amazon's only in
//! Lambda, in a region of the commercial or GovCloud partition (by the SDK's own region patterns:
//! China, the isolated and the European Sovereign Cloud partitions keep the system's), and only when
//! nothing names other roots or another way to AWS:
//! - `SSL_CERT_FILE` or `SSL_CERT_DIR` (an egress firewall's CA, say);
//! - an endpoint override (`AWS_ENDPOINT_URL*`, or the settings' endpoint): an emulator or a proxy,
//!   whose certificate any CA may have signed;
//! - an HTTP(S) proxy (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, either case), which may inspect TLS
//!   with a CA of its own (`cargo lambda watch` and `sam local` set the Lambda variables too).
//!
//! A container image whose system store carries a company CA sets `LANES_AWS_TLS_ROOTS=system`. A
//! refused certificate is a `DispatchFailure` naming `UnknownIssuer`, which the adapters report as
//! the service being unavailable.

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
        let proxied = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
            .into_iter()
            .any(|v| var(v).is_some());
        let region = var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")).unwrap_or_default();
        Ok(
            if in_lambda && !roots_named && !endpoint_overridden && !proxied && amazon_signed_region(&region)
            {
                Self::Amazon
            } else {
                Self::System
            },
        )
    }

    /// The HTTP client for these roots: `None` leaves the SDK's default in place.
    pub fn http_client(self) -> Option<SharedHttpClient> {
        match self {
            Self::System => None,
            Self::Amazon => Some(pinned_https_client(AMAZON_TRUST_ROOTS)),
        }
    }
}

/// Whether `region` is in the commercial (`us-east-1`, `il-central-1`, ...) or GovCloud
/// (`us-gov-west-1`) partition, by the patterns of the SDK's partition table: Amazon Trust Services
/// signs their endpoints. Anything else, an empty region included, is not known to be.
fn amazon_signed_region(region: &str) -> bool {
    const COMMERCIAL: [&str; 9] = ["us", "eu", "ap", "sa", "ca", "me", "af", "il", "mx"];
    let number = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    match region.split('-').collect::<Vec<_>>().as_slice() {
        ["us", "gov", _, n] => number(n),
        [area, name, n] => {
            COMMERCIAL.contains(area)
                && !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && number(n)
        }
        _ => false,
    }
}

/// The SDK's default HTTPS client (rustls with aws-lc, the proxy from the environment, the
/// connector settings and sleep of each client), trusting only the roots in `pem`. The PEM is
/// parsed when a client first connects (a bad one panics there: the embedded roots are checked by
/// this module's tests).
pub fn pinned_https_client(pem: &[u8]) -> SharedHttpClient {
    use aws_smithy_http_client::{Builder, ConnectorBuilder, proxy::ProxyConfig, tls};
    let trust = tls::TrustStore::empty().with_native_roots(false).with_pem_certificate(pem.to_vec());
    // Building a context only moves the trust store in; it has no failure to handle today.
    let context = tls::TlsContext::builder().with_trust_store(trust).build();
    Builder::new().build_with_connector_fn(move |settings, components| {
        let mut connector = ConnectorBuilder::default()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc));
        if let Ok(context) = &context {
            connector.set_tls_context(context.clone());
        }
        connector.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            connector.set_sleep_impl(components.sleep_impl());
        }
        connector.set_proxy_config(Some(ProxyConfig::from_env()));
        connector.build()
    })
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
        for region in
            ["us-east-1", "eu-west-3", "ap-southeast-5", "il-central-1", "mx-central-1", "us-gov-west-1"]
        {
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
        for proxy in ["HTTPS_PROXY", "http_proxy", "ALL_PROXY"] {
            let vars = [LAMBDA, ("AWS_REGION", "us-east-1"), (proxy, "http://10.0.0.1:3128")];
            assert_eq!(choose(&vars, false).ok(), system, "{proxy}");
        }
        let others = [
            "cn-north-1",
            "cn-northwest-1",
            "us-iso-east-1",
            "us-isob-east-1",
            "eu-isoe-west-1",
            "eusc-de-east-1",
        ];
        for region in others.into_iter().chain([""]) {
            assert_eq!(choose(&[LAMBDA, ("AWS_REGION", region)], false).ok(), system, "{region:?}");
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
        // The SHA-256 fingerprints Amazon Trust Services publishes for Amazon Root CA 1 to 4 and the
        // Starfield Services Root Certificate Authority - G2, in the file's order.
        let published = [
            "8ecde6884f3d87b1125ba31ac3fcb13d7016de7f57cc904fe1cb97c6ae98196e",
            "1ba5b2aa8c65401a82960118f80bec4f62304d83cec4713a19c39c011ea46db4",
            "18ce6cfe7bf14e60b2e347b8dfe868cb31d02ebb3ada271569f50343b46db3a4",
            "e35d28419ed02025cfa69038cd623962458da5c695fbdea3c22b0bfb25897092",
            "568d6905a2c88708a4b3025190edcfedb1974a606a13c6e5290fcb2ae63edab5",
        ];
        let fingerprints: Vec<String> =
            certs.iter().map(|c| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(c.as_ref()))).collect();
        assert_eq!(fingerprints, published);
        // Each one parses as a trust anchor, as the connector will read it.
        let mut store = rustls::RootCertStore::empty();
        assert_eq!(store.add_parsable_certificates(certs), (5, 0));
    }
}

//! OpenTelemetry traces of the incident pipeline — ingest, detector passes, the incident
//! changes they make, store writes, alerts, diagnosis and operator actions — sent over
//! OTLP (HTTP, protobuf) when an endpoint is configured.
//!
//! The endpoint comes from the configuration file (`traces.otlp_endpoint`, the
//! collector's base URL; `/v1/traces` is added) or from the standard variables
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) and `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (base URL). The other standard variables apply too: `OTEL_EXPORTER_OTLP_HEADERS`
//! (collector credentials, kept out of the logs), `OTEL_SERVICE_NAME`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_BSP_SCHEDULE_DELAY`; `OTEL_SDK_DISABLED=true` turns
//! tracing off. Spans leave in batches from a background task, so a slow or absent
//! collector never holds the pipeline up: when the queue is full, spans are dropped.

#[cfg(feature = "otel")]
use std::sync::Arc;
#[cfg(feature = "otel")]
use std::time::Duration;

#[cfg(feature = "otel")]
use opentelemetry::trace::TracerProvider as _;
#[cfg(feature = "otel")]
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
#[cfg(feature = "otel")]
use opentelemetry_sdk::trace::SdkTracerProvider;
#[cfg(feature = "otel")]
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use serde::Deserialize;

/// The service name spans carry unless `OTEL_SERVICE_NAME` says otherwise.
pub const SERVICE_NAME: &str = "warden-controller";

/// Target of the pipeline's spans (what a log filter can name).
pub const TARGET: &str = "warden::pipeline";

/// The `traces` section of the configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracesConfig {
    /// Base URL of an OTLP/HTTP collector, e.g. `http://otel-collector:4318`.
    pub otlp_endpoint: Option<String>,
    /// Request timeout, milliseconds (default 10 000).
    pub timeout_ms: Option<u64>,
}

impl TracesConfig {
    /// Problems with the section, as `(field, message)`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(e) = &self.otlp_endpoint {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"));
            if rest.is_none_or(str::is_empty) || e.parse::<hyper::Uri>().is_err() {
                out.push((
                    "traces.otlp_endpoint".to_owned(),
                    format!("{e:?} is not an http:// or https:// URL"),
                ));
            }
        }
        if self.timeout_ms == Some(0) {
            out.push((
                "traces.timeout_ms".to_owned(),
                "must be at least 1".to_owned(),
            ));
        }
        out
    }
}

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The exporter refused its configuration.
    #[error("OTLP trace exporter: {0}")]
    Exporter(String),
}

/// Where spans go, when anywhere: the configured endpoint, else whether one of the
/// standard variables names one (then the exporter reads it itself). `None`: tracing
/// is off.
pub fn endpoint(
    config: &TracesConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Option<Option<String>> {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return None;
    }
    if let Some(base) = &config.otlp_endpoint {
        let base = base.trim_end_matches('/');
        let url = if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        };
        return Some(Some(url));
    }
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .then_some(None)
}

/// Start exporting: a tracer provider whose batches go out from a task on the current
/// Tokio runtime (call from inside it). `tls` is the client configuration for https
/// collectors. Shut the provider down before the runtime stops, to send what is queued.
#[cfg(feature = "otel")]
pub fn start(
    config: &TracesConfig,
    endpoint: Option<String>,
    tls: Arc<rustls::ClientConfig>,
) -> Result<SdkTracerProvider, TelemetryError> {
    let timeout = Duration::from_millis(config.timeout_ms.unwrap_or(10_000));
    // Warden's one connector: the same TLS trust and proxies as every other client.
    let https = warden_http::HttpClient::builder()
        .connect_timeout(Duration::from_secs(3))
        .tls((*tls).clone())
        .connector()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let client = opentelemetry_http::hyper::HyperClient::new(https, timeout, None);
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(timeout);
    if let Some(url) = endpoint {
        builder = builder.with_endpoint(url);
    }
    let exporter = builder
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(SERVICE_NAME)
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build())
}

/// The `tracing` layer that turns spans into OpenTelemetry spans for `provider`.
#[cfg(feature = "otel")]
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer(SERVICE_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn off_unless_an_endpoint_is_named() {
        assert_eq!(endpoint(&TracesConfig::default(), env(&[])), None);
        assert_eq!(
            endpoint(
                &TracesConfig::default(),
                env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")])
            ),
            Some(None)
        );
        assert_eq!(
            endpoint(
                &TracesConfig::default(),
                env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/x")])
            ),
            Some(None)
        );
        assert_eq!(
            endpoint(
                &TracesConfig::default(),
                env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])
            ),
            None
        );
    }

    #[test]
    fn the_configured_base_url_gets_the_traces_path() {
        let c = |e: &str| TracesConfig {
            otlp_endpoint: Some(e.to_owned()),
            timeout_ms: None,
        };
        assert_eq!(
            endpoint(&c("http://c:4318"), env(&[])),
            Some(Some("http://c:4318/v1/traces".to_owned()))
        );
        assert_eq!(
            endpoint(&c("http://c:4318/"), env(&[])),
            Some(Some("http://c:4318/v1/traces".to_owned()))
        );
        assert_eq!(
            endpoint(&c("https://c/v1/traces"), env(&[])),
            Some(Some("https://c/v1/traces".to_owned()))
        );
        assert_eq!(
            endpoint(&c("http://c:4318"), env(&[("OTEL_SDK_DISABLED", "TRUE")])),
            None
        );
    }

    #[test]
    fn bad_endpoints_are_named() {
        let c = |e: &str| TracesConfig {
            otlp_endpoint: Some(e.to_owned()),
            timeout_ms: Some(0),
        };
        let p = c("collector:4318").problems();
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p[0].0, "traces.otlp_endpoint");
        assert_eq!(p[1].0, "traces.timeout_ms");
        assert!(c("http://c:4318").problems().len() == 1);
    }
}

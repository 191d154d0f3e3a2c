//! Traces over OTLP: the server's spans (the api's request spans and the engine's stages,
//! all under `peregrine_engine::spans::TARGET`, plus the handlers' own spans) exported to
//! an OpenTelemetry collector, configured by OpenTelemetry's standard environment
//! variables and off unless they ask for it.
//!
//! The exporter speaks OTLP over gRPC (tonic), on a one-thread runtime of its own so that
//! exporting never takes a serving worker; spans wait in the SDK's batch processor, a
//! bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048 by default) that drops spans when full.

use anyhow::{bail, Context as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

/// Whether traces are exported, decided from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TracesSetting {
    Off,
    /// Export over OTLP/gRPC; the exporter reads the endpoint, headers, timeout and
    /// compression from the environment itself.
    Otlp,
}

impl TracesSetting {
    /// On when `OTEL_TRACES_EXPORTER=otlp`, or when an OTLP endpoint is set
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) and the
    /// exporter is not `none`; always off with `OTEL_SDK_DISABLED=true`. A protocol or
    /// exporter this build cannot use is an error rather than silence.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let set = |name: &str| var(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(Self::Off);
        }
        let endpoint =
            set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let on = match set("OTEL_TRACES_EXPORTER").as_deref() {
            None => endpoint.is_some(),
            Some("none") => false,
            Some("otlp") => true,
            Some(other) => bail!(
                "OTEL_TRACES_EXPORTER={other}: this server exports traces over OTLP only; \
                 use `otlp` or `none`"
            ),
        };
        if !on {
            return Ok(Self::Off);
        }
        let protocol =
            set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
        if let Some(protocol) = protocol.filter(|p| p != "grpc") {
            bail!(
                "OTLP protocol {protocol:?}: this server exports traces over OTLP/gRPC only \
                 (a collector's port 4317); set OTEL_EXPORTER_OTLP_PROTOCOL=grpc"
            );
        }
        Ok(Self::Otlp)
    }
}

/// The running exporter: shut it down before the process exits, so that the spans of
/// the last requests are sent.
pub struct Traces {
    provider: SdkTracerProvider,
    /// The tonic channel's tasks run here.
    runtime: tokio::runtime::Runtime,
}

impl Traces {
    /// Builds the exporter and the tracer provider. The service is named `peregrine`
    /// unless `OTEL_SERVICE_NAME` names it; `OTEL_RESOURCE_ATTRIBUTES`, the sampler
    /// (`OTEL_TRACES_SAMPLER`, parent-based always-on by default) and the batch
    /// processor's `OTEL_BSP_*` are read by the SDK.
    pub fn start() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-export")
            .enable_all()
            .build()
            .context("starting the OTLP exporter's runtime")?;
        let exporter = runtime
            .block_on(async { opentelemetry_otlp::SpanExporter::builder().with_tonic().build() })
            .context("configuring the OTLP trace exporter (OTEL_EXPORTER_OTLP_*)")?;
        let mut resource =
            Resource::builder().with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("peregrine");
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        Ok(Self { provider, runtime })
    }

    pub fn tracer(&self) -> opentelemetry_sdk::trace::Tracer {
        self.provider.tracer("peregrine")
    }

    /// Sends the spans still queued, then stops the exporter.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("peregrine: exporting the last traces failed: {e}");
        }
        self.runtime.shutdown_background();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(vars: &[(&str, &str)]) -> anyhow::Result<TracesSetting> {
        TracesSetting::from_env(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn traces_are_off_unless_the_environment_asks_for_them() {
        assert_eq!(setting(&[]).unwrap(), TracesSetting::Off);
        assert_eq!(
            setting(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")]).unwrap(),
            TracesSetting::Otlp
        );
        assert_eq!(
            setting(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317")]).unwrap(),
            TracesSetting::Otlp
        );
        assert_eq!(
            setting(&[("OTEL_TRACES_EXPORTER", "otlp")]).unwrap(),
            TracesSetting::Otlp
        );
        assert_eq!(
            setting(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_TRACES_EXPORTER", "none")
            ])
            .unwrap(),
            TracesSetting::Off
        );
        assert_eq!(
            setting(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_SDK_DISABLED", "TRUE")
            ])
            .unwrap(),
            TracesSetting::Off
        );
        assert_eq!(
            setting(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")]).unwrap(),
            TracesSetting::Off,
            "an empty variable is no setting"
        );
    }

    #[test]
    fn what_this_build_cannot_export_is_refused_with_the_way_out() {
        let e = setting(&[("OTEL_TRACES_EXPORTER", "zipkin")]).unwrap_err();
        assert!(e.to_string().contains("`otlp` or `none`"), "{e}");
        let e = setting(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc"), "{e}");
        assert_eq!(
            setting(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ])
            .unwrap(),
            TracesSetting::Otlp,
            "the traces' own variable wins"
        );
    }
}

//! The tracer a running process makes spans with: the SDK's provider, with
//! the capped sampler and the queued export, and whose trace context is
//! honoured.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use super::export::{QueuedExport, TracingError, TracingMetrics};
use super::sampler::CappedSampler;
use super::settings::{TracingSettings, TrustParent};

/// What a running process traces with.
pub struct Tracing {
    /// Kept for its spans' life: dropping it would end the export.
    _provider: SdkTracerProvider,
    export: QueuedExport,
    pub(super) tracer: SdkTracer,
    pub(super) propagator: TraceContextPropagator,
    trust_parent: TrustParent,
}

impl Tracing {
    /// Starts the export thread and the tracer.
    pub fn start(
        settings: &TracingSettings,
        metrics: &TracingMetrics,
    ) -> Result<Tracing, TracingError> {
        let mut resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ));
        for (key, value) in &settings.resource {
            resource =
                resource.with_attribute(opentelemetry::KeyValue::new(key.clone(), value.clone()));
        }
        let resource = resource.build();
        let processor = QueuedExport::start(settings, resource.clone(), metrics)?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor.clone())
            .with_sampler(CappedSampler::new(
                settings.sample_ratio,
                settings.max_spans_per_second,
                metrics.spans.with_label_values(&["over_cap"]),
            ))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("floodgate");
        Ok(Tracing {
            _provider: provider,
            export: processor,
            tracer,
            propagator: TraceContextPropagator::new(),
            trust_parent: settings.trust_parent,
        })
    }

    /// Whether a request from this peer continues the trace it names.
    pub fn honours_parent_of(&self, peer_is_trusted_proxy: bool) -> bool {
        match self.trust_parent {
            TrustParent::Nobody => false,
            TrustParent::TrustedProxies => peer_is_trusted_proxy,
            TrustParent::Everyone => true,
        }
    }

    /// Whether a caller of the rate limit service continues its trace:
    /// Envoy, there, is the gateway's own (its port is not the public's).
    pub fn honours_rls_parent(&self) -> bool {
        self.trust_parent != TrustParent::Nobody
    }

    /// Sends what is queued (at a stop), waiting at most `within`;
    /// whether it all went out.
    pub async fn flush(&self, within: std::time::Duration) -> bool {
        self.export.flush(within).await
    }
}

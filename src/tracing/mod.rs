//! `[tracing]`: an OpenTelemetry trace of each request (its decision, the
//! Redis calls it waited on, its exchange with the upstream), exported over
//! OTLP, with the W3C trace context carried on to the upstream.
//!
//! Off (no `[tracing]`), nothing here runs: the request's context holds one
//! empty pointer. On, a request that is not sampled gets ids only, enough
//! to tell the upstream where it hangs in the trace.

mod export;
mod propagation;
mod request;
mod sampler;
mod settings;
mod tracer;

pub(crate) use export::{TracingError, TracingMetrics};
pub(crate) use propagation::HeaderExtractor;
#[cfg(feature = "rls")]
pub(crate) use propagation::MetadataExtractor;
pub(crate) use request::{bounded, DecisionRecord, Decisive, RequestTrace};
pub(crate) use settings::{Protocol, TracingSettings, TrustParent};
pub(crate) use tracer::Tracing;

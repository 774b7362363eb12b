//! `[rls]`: floodgate as Envoy's rate limit service. Envoy (plain, Istio,
//! Envoy Gateway) asks `envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit` over gRPC; the limits matched by `domain` and
//! `descriptors` answer, on the gateway's store, fallback and breaker.
//!
//! `decide` is the call apart from gRPC; `service` (the `rls` cargo
//! feature) serves it.

pub(crate) mod auth;
#[cfg(feature = "rls")]
pub(crate) mod decide;
#[cfg(feature = "rls")]
mod door;
#[cfg(feature = "rls")]
mod service;
mod settings;
#[cfg(feature = "rls")]
mod traced;

pub(crate) use auth::RlsTokens;
#[cfg(feature = "rls")]
pub(crate) use service::RlsService;
pub(crate) use settings::{RlsSettings, DEFAULT_MAX_MESSAGE_BYTES, MESSAGE_BYTES_RANGE};

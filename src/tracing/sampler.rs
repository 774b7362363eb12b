//! Which spans are recorded: the parent's choice where there is a parent,
//! the configured share of new traces otherwise, and never more spans in a
//! second than the cap, however many requests arrive flagged `sampled`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SamplingDecision, SamplingResult, ShouldSample};
use prometheus::IntCounter;

/// What a recorded request counts for against the cap: its server,
/// decision and upstream spans and a Redis call. Its other spans (more
/// Redis calls, a retry, a leaky bucket's wait) follow it uncounted: a
/// trace is recorded whole or not at all.
pub(super) const SPANS_PER_REQUEST: u32 = 4;

#[derive(Debug, Clone)]
pub(super) struct CappedSampler {
    /// A new trace is kept when bits 63..1 of the low 8 bytes of its id fall
    /// under this: the rule of the Rust (and Go) SDK's `TraceIdRatioBased`.
    ratio_bound: u64,
    cap: Arc<SpanCap>,
    over_cap: IntCounter,
}

impl CappedSampler {
    pub(super) fn new(ratio: f64, per_second: u32, over_cap: IntCounter) -> CappedSampler {
        CappedSampler {
            ratio_bound: ratio_bound(ratio),
            cap: Arc::new(SpanCap::new(per_second)),
            over_cap,
        }
    }

    /// Whether the span would be recorded, and whether it is a request's
    /// first span here (whose recording the cap decides).
    fn wanted(&self, parent_context: Option<&Context>, trace_id: TraceId) -> (bool, bool) {
        if let Some(parent) = parent_context.filter(|cx| cx.has_active_span()) {
            let parent = parent.span();
            let parent = parent.span_context();
            if parent.is_valid() {
                return (parent.is_sampled(), parent.is_remote());
            }
        }
        let low = u64::from_be_bytes(trace_id.to_bytes()[8..].try_into().unwrap_or_default());
        ((low >> 1) < self.ratio_bound, true)
    }
}

fn ratio_bound(ratio: f64) -> u64 {
    if ratio >= 1.0 {
        u64::MAX
    } else if ratio <= 0.0 {
        0
    } else {
        (ratio * (1u64 << 63) as f64) as u64
    }
}

impl ShouldSample for CappedSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        _name: &str,
        _span_kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[Link],
    ) -> SamplingResult {
        let decision = match self.wanted(parent_context, trace_id) {
            (false, _) => SamplingDecision::Drop,
            (true, false) => SamplingDecision::RecordAndSample,
            (true, true) if self.cap.take(SPANS_PER_REQUEST) => SamplingDecision::RecordAndSample,
            (true, true) => {
                self.over_cap.inc();
                SamplingDecision::Drop
            }
        };
        let trace_state = parent_context
            .filter(|cx| cx.has_active_span())
            .map_or_else(TraceState::default, |cx| {
                cx.span().span_context().trace_state().clone()
            });
        SamplingResult {
            decision,
            attributes: Vec::new(),
            trace_state,
        }
    }
}

/// Spans a second, a bucket a second deep: a generic cell rate, the time
/// the next span would be due kept in one atomic.
#[derive(Debug)]
struct SpanCap {
    started: Instant,
    every_ns: u64,
    burst_ns: u64,
    /// When the bucket is next empty, in ns since `started`.
    due_ns: AtomicU64,
}

impl SpanCap {
    fn new(per_second: u32) -> SpanCap {
        let every_ns = 1_000_000_000 / u64::from(per_second.max(1));
        SpanCap {
            started: Instant::now(),
            every_ns,
            burst_ns: 1_000_000_000 - every_ns,
            due_ns: AtomicU64::new(0),
        }
    }

    fn take(&self, spans: u32) -> bool {
        self.take_at(self.started.elapsed().as_nanos() as u64, spans)
    }

    /// `spans` at once, if the bucket holds them all.
    fn take_at(&self, now_ns: u64, spans: u32) -> bool {
        let cost = self.every_ns * u64::from(spans);
        let mut due = self.due_ns.load(Ordering::Relaxed);
        loop {
            let from = due.max(now_ns);
            if from + cost - now_ns > self.burst_ns + self.every_ns {
                return false;
            }
            match self.due_ns.compare_exchange_weak(
                due,
                from + cost,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now_due) => due = now_due,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_lets_its_number_through_in_any_second_and_no_more() {
        for per_second in [1, 7, 100, 1_000, 50_000] {
            let cap = SpanCap::new(per_second);
            let mut taken = 0u64;
            // A flood of 200,000 asks over the first second, all at once.
            for _ in 0..200_000 {
                taken += u64::from(cap.take_at(0, 1));
            }
            assert_eq!(taken, u64::from(per_second), "{per_second}/s at once");
            // Then asked all along the next two seconds: the second's worth
            // saved up (a bucket a second deep), and the rate, no more.
            let mut later = 0;
            for i in 0..200_000u64 {
                later += u64::from(cap.take_at(1_000_000_000 + i * 10_000, 1));
            }
            let rate = u64::from(per_second);
            assert!(
                (2 * rate..=3 * rate).contains(&later),
                "{per_second}/s: {later} in the next two seconds"
            );
        }
    }

    #[test]
    fn a_request_takes_its_spans_at_once_or_not_at_all() {
        let cap = SpanCap::new(10);
        assert!(cap.take_at(0, 4) && cap.take_at(0, 4));
        assert!(!cap.take_at(0, 4), "8 of 10 taken: 4 more do not fit");
        assert!(cap.take_at(0, 2), "2 do");
        assert!(!cap.take_at(0, 1));
        // A second later, a second's worth again.
        assert!(cap.take_at(1_000_000_000, 4) && cap.take_at(1_000_000_000, 4));
        assert!(!cap.take_at(1_000_000_000, 4));
        // More than the bucket holds never passes.
        assert!(!SpanCap::new(3).take_at(0, 4));
    }

    #[test]
    fn the_ratio_keeps_its_share_of_new_traces() {
        for (ratio, share) in [(0.0, 0.0), (0.01, 0.01), (0.5, 0.5), (1.0, 1.0)] {
            let sampler = CappedSampler::new(ratio, 1_000_000, IntCounter::new("t", "t").unwrap());
            let mut kept = 0u32;
            for i in 0..100_000u64 {
                // Ids spread as random ones are.
                let id = u128::from(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) << 1;
                kept += u32::from(sampler.wanted(None, TraceId::from(id)).0);
            }
            let measured = f64::from(kept) / 100_000.0;
            assert!((measured - share).abs() < 0.01, "{ratio}: kept {measured}");
        }
    }
}

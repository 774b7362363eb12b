//! A finished request accounted for: in the metrics, its strike toward a
//! ban, its verdict in the refusal log and on the status page's board.

use std::time::Duration;

use super::ctx::RequestCtx;
use super::strikes;
use super::verdict::Shown;
use crate::proxy::headers::Position;
use crate::server::state::AppState;

/// The request in the metrics, its strike toward a ban, its verdict
/// logged and on the status page's board.
pub(super) async fn count(state: &AppState, ctx: &RequestCtx, status: u16, took: Duration) {
    let requests = &state.metrics.requests;
    requests.finished(status).inc();
    requests.duration.observe(took.as_secs_f64());
    if let Some(upstream) = ctx.upstream_took {
        requests.upstream_duration.observe(upstream.as_secs_f64());
    }
    // Struck before it is counted: once a refusal shows in the metrics,
    // its strike is in the store.
    strikes::strike(state.store.as_ref(), ctx).await;
    if let Some(verdict) = &ctx.verdict {
        verdict.account(
            &ctx.runtime,
            &state.refusal_log,
            ctx.client.as_ref(),
            ctx.request_id.as_str(),
        );
        // The status page's board, kept only where there is a page.
        if let (Shown::Refused(Position(i)), Some(client), true) = (
            verdict.shown,
            &ctx.client,
            ctx.runtime.admin_token.is_some(),
        ) {
            state.status.refused(client, &verdict.outcomes[i].name);
        }
    }
}

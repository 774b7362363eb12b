//! What is charged once the response is known: a layer counted by
//! status, a cost the response reports (or, when no response came, what a
//! request that got none owes).

use log::warn;
use pingora::http::ResponseHeader;

use super::ctx::RequestCtx;
use crate::limiter::{Check, Store};
use crate::policy::AfterResponse;

/// Charges the layers charged by the response: a listed status charges
/// the request's cost, each layer on its own (one spent layer does not
/// keep another from counting; a spent layer stays spent); a reported
/// cost is owed in full, whatever is left. The cost header is read
/// before any layer removes it from what the client sees.
pub(super) async fn charge_by_response(
    store: &dyn Store,
    ctx: &mut RequestCtx,
    response: &mut ResponseHeader,
) {
    let status = response.status.as_u16();
    let mut owed = Vec::new();
    let mut hidden = Vec::new();
    for (check, when) in std::mem::take(&mut ctx.counted) {
        match when {
            AfterResponse::Status(statuses) if statuses.contains(status) => {
                charge(store, check, status).await;
            }
            AfterResponse::Status(_) => {}
            AfterResponse::Cost(priced) => {
                let counters = &ctx.runtime.counters[check.layer];
                let cost = match reported_cost(response.headers.get(&priced.header)) {
                    Some(cost) if cost > priced.max => {
                        counters.cost_above_max.inc();
                        priced.max
                    }
                    Some(cost) => cost,
                    None => {
                        counters.cost_unread.inc();
                        priced.default
                    }
                };
                if !priced.expose {
                    hidden.push(priced.header);
                }
                owed.push(owed_check(check, cost));
            }
        }
    }
    for name in hidden {
        response.remove_header(&name);
    }
    debit(store, &owed, status).await;
}

/// Removes the cost headers the client must not see from an answer that
/// charges nothing itself (an interim 1xx).
pub(super) fn hide_costs(ctx: &RequestCtx, response: &mut ResponseHeader) {
    for (_, when) in &ctx.counted {
        if let AfterResponse::Cost(priced) = when {
            if !priced.expose {
                response.remove_header(&priced.header);
            }
        }
    }
}

/// Charges every layer charged by the response of a request that got
/// none. `client_left` (it hung up while the upstream worked) charges as
/// if the status were listed, so that hanging up is no way to dodge the
/// count. A cost is charged the most a response may report when the client
/// left or the upstream ran out of time (it may have done the work: a
/// request made to run long must not go free), its default otherwise (the
/// upstream failed).
pub(super) async fn charge_unanswered(
    store: &dyn Store,
    ctx: &mut RequestCtx,
    client_left: bool,
    upstream_timed_out: bool,
) {
    let mut owed = Vec::new();
    for (check, when) in std::mem::take(&mut ctx.counted) {
        match when {
            AfterResponse::Status(_) if client_left => charge(store, check, 0).await,
            AfterResponse::Status(_) => {}
            AfterResponse::Cost(priced) => {
                let cost = if client_left || upstream_timed_out {
                    priced.max
                } else {
                    priced.default
                };
                owed.push(owed_check(check, cost));
            }
        }
    }
    debit(store, &owed, 0).await;
}

async fn charge(store: &dyn Store, mut check: Check, status: u16) {
    check.peek = false;
    if let Err(e) = store.decide(std::slice::from_ref(&check)).await {
        warn!("could not count a {status} against {}: {e}", check.name);
    }
}

/// Charges costs that are owed (`owed_check`): one call for them all,
/// since none can be refused.
async fn debit(store: &dyn Store, owed: &[Check], status: u16) {
    if owed.is_empty() {
        return;
    }
    if let Err(e) = store.decide(owed).await {
        warn!(
            "could not charge the cost of a {status} response against {}: {e}",
            owed[0].name
        );
    }
}

/// The cost a response reports: a whole number, nothing else (one too
/// large to read is more than any `max`).
fn reported_cost(value: Option<&http::HeaderValue>) -> Option<u64> {
    let text = value?.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse().unwrap_or(u64::MAX))
}

/// `check` charged `cost` whatever is left (see `Algorithm::without_ceiling`).
fn owed_check(mut check: Check, cost: u64) -> Check {
    check.algorithm = check.algorithm.without_ceiling();
    check.cost = cost;
    check.peek = false;
    check
}

#[cfg(test)]
mod tests {
    use super::reported_cost;

    #[test]
    fn a_reported_cost_is_a_whole_number_or_nothing() {
        let read = |text: &str| reported_cost(Some(&http::HeaderValue::from_str(text).unwrap()));
        assert_eq!(read("400"), Some(400));
        assert_eq!(read(" 7 "), Some(7));
        assert_eq!(read("0"), Some(0));
        for unreadable in ["", "-3", "1e3", "4.5", "12 tokens", "0x10"] {
            assert_eq!(read(unreadable), None, "{unreadable:?}");
        }
        // Too large to read: more than any max, so charged the max.
        assert_eq!(read("99999999999999999999999"), Some(u64::MAX));
        assert_eq!(reported_cost(None), None);
    }
}

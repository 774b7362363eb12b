//! Limits charged by the response: by its status (`count`), or by the
//! cost it reports (`cost_from_response`). Each reserves before the
//! request goes upstream, in the same store call as the other layers (so
//! requests that arrive together never pass a limit already spent), and
//! is settled here: what was reserved and is not owed is refunded, what is
//! owed beyond it is charged. `Gateway::settle` does so for a finished
//! request, and gives its slots back.

use log::warn;
use pingora::http::ResponseHeader;
use pingora::{Error, ErrorSource, ErrorType};

use super::ctx::{BodyCharge, RequestCtx, Reservation};
use crate::connection::h2_watch::H2Stream;
use crate::server::state::AppState;
use crate::usage::{Provider, Read, UsageReader};
use floodgate_limiter::{Check, Leasing, Spending, Store};
use floodgate_policy::{ChargedByResponse, CostSource, LlmProvider, ResponseCost};

/// What a reservation comes to: the units owed in all, against the units
/// reserved.
struct Settled {
    owed: u64,
}

impl Settled {
    fn owe(owed: u64) -> Settled {
        Settled { owed }
    }
}

/// Settles the layers charged by the response: a listed status keeps the
/// request's reservation, any other gives it back; a reported cost is
/// owed in full, whatever is left (the reservation is refunded down to it,
/// or charged up to it). The cost header is read before any layer removes
/// it from what the client sees.
pub(super) async fn charge_by_response(
    store: &dyn Store,
    ctx: &mut RequestCtx,
    response: &mut ResponseHeader,
) {
    let status = response.status.as_u16();
    let mut settled = Vec::new();
    let mut hidden = Vec::new();
    for reservation in std::mem::take(&mut ctx.reservations) {
        let reserved = reservation.check.cost;
        let outcome = match &reservation.charged_by {
            ChargedByResponse::Status(statuses) if statuses.contains(status) => {
                Settled::owe(reserved)
            }
            ChargedByResponse::Status(_) => Settled::owe(0),
            ChargedByResponse::Cost(ResponseCost {
                source: CostSource::Usage { provider, .. },
                ..
            }) => {
                // Settled once the body has passed: its usage is in it.
                let header = |name| response.headers.get(name).map(|v| v.as_bytes());
                let reader = response.status.is_success().then(|| {
                    UsageReader::for_response(
                        provider_of(*provider),
                        header(http::header::CONTENT_TYPE),
                        header(http::header::CONTENT_ENCODING),
                    )
                });
                ctx.by_body.push(BodyCharge {
                    reservation,
                    reader: reader.flatten(),
                });
                continue;
            }
            ChargedByResponse::Cost(
                priced @ ResponseCost {
                    source: CostSource::Header(header),
                    ..
                },
            ) => {
                let counters = ctx.runtime.counters(reservation.check.limit);
                let cost = match reported_cost(response.headers.get_all(header)) {
                    Reported::Cost(cost) if cost > priced.max => {
                        counters.cost_above_max.inc();
                        priced.max
                    }
                    Reported::Cost(cost) => cost,
                    Reported::Unreadable(at_least) => {
                        counters.cost_unread.inc();
                        at_least.max(priced.default).min(priced.max)
                    }
                };
                if !priced.expose {
                    hidden.push(header.clone());
                }
                Settled::owe(cost)
            }
        };
        settled.push((reservation, outcome));
    }
    for name in hidden {
        response.remove_header(&name);
    }
    settle(store, ctx, settled, status).await;
}

/// Removes the cost headers the client must not see from an answer that
/// charges nothing itself (an interim 1xx).
pub(super) fn hide_costs(ctx: &RequestCtx, response: &mut ResponseHeader) {
    for reservation in &ctx.reservations {
        if let ChargedByResponse::Cost(ResponseCost {
            source: CostSource::Header(header),
            expose: false,
            ..
        }) = &reservation.charged_by
        {
            response.remove_header(header);
        }
    }
}

/// Why a request charged by its response got none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unanswered {
    /// It never reached the upstream.
    NeverSent,
    /// Its client hung up or reset the stream while the upstream had it.
    ClientLeft,
    /// The upstream ran out of time.
    UpstreamTimedOut,
    /// The upstream failed otherwise.
    UpstreamFailed,
}

impl Unanswered {
    /// Why the request in `ctx` ended with `e` and no response.
    pub(super) fn of(ctx: &RequestCtx, e: Option<&Error>) -> Unanswered {
        let source = e.map(|e| (e.esource(), e.etype()));
        match source {
            _ if ctx.upstream_sent.is_none() => Unanswered::NeverSent,
            Some((ErrorSource::Downstream, _)) if ctx.upstream_status.is_none() => {
                Unanswered::ClientLeft
            }
            Some((ErrorSource::Upstream, ErrorType::ReadTimedout)) => Unanswered::UpstreamTimedOut,
            _ => Unanswered::UpstreamFailed,
        }
    }
}

/// Settles the layers charged by the response of a request that got
/// none. A client that left keeps a reservation charged by status, as if
/// the status were listed, so that hanging up is no way to dodge the
/// count. A cost is owed the most a response may report when the client
/// left or the upstream ran out of time (it may have done the work: a
/// request made to run long must not go free), its default when the
/// upstream failed otherwise. A request that never got there is given
/// every reservation back.
pub(super) async fn charge_unanswered(store: &dyn Store, ctx: &mut RequestCtx, why: Unanswered) {
    let settled = std::mem::take(&mut ctx.reservations)
        .into_iter()
        .map(|reservation| {
            let reserved = reservation.check.cost;
            let outcome = match (&reservation.charged_by, why) {
                (_, Unanswered::NeverSent) => Settled::owe(0),
                (ChargedByResponse::Status(_), Unanswered::ClientLeft) => Settled::owe(reserved),
                (ChargedByResponse::Status(_), _) => Settled::owe(0),
                (
                    ChargedByResponse::Cost(ResponseCost { max, .. }),
                    Unanswered::ClientLeft | Unanswered::UpstreamTimedOut,
                ) => Settled::owe(*max),
                (ChargedByResponse::Cost(ResponseCost { default, .. }), _) => {
                    Settled::owe(*default)
                }
            };
            (reservation, outcome)
        })
        .collect();
    settle(store, ctx, settled, 0).await;
}

fn provider_of(provider: LlmProvider) -> Provider {
    match provider {
        LlmProvider::OpenAi => Provider::OpenAi,
        LlmProvider::Anthropic => Provider::Anthropic,
    }
}

/// The next bytes of the upstream's body, read by the layers charged by
/// its usage (the body itself passes untouched).
pub(super) fn read_body(ctx: &mut RequestCtx, body: Option<&[u8]>, end_of_stream: bool) {
    if let Some(bytes) = body.filter(|b| !b.is_empty()) {
        for charge in &mut ctx.by_body {
            if let Some(reader) = &mut charge.reader {
                reader.feed(bytes);
            }
        }
    }
    if end_of_stream {
        ctx.body_ended = true;
    }
}

/// The usage an answer's body reported, priced; none where a count the
/// price needs was not read, or read spoiled.
fn priced_usage(read: Read, prompt_weight: u64, completion_weight: u64) -> Option<u64> {
    if read.spoiled {
        return None;
    }
    let part = |count: Option<u64>, weight: u64| match weight {
        0 => Some(0),
        w => count.map(|c| c.saturating_mul(w)),
    };
    Some(
        part(read.usage.prompt, prompt_weight)?
            .saturating_add(part(read.usage.completion, completion_weight)?),
    )
}

/// Settles the layers charged by their answers' usage, once the exchange
/// is over: what the body reported, priced, at most `max`. An answer read
/// to its end without a usage (or with one unreadable, or none to read)
/// owes `default`; one cut before its end (the client left, the upstream
/// failed) owes its usage if that was read, else `max`: a stream abandoned
/// half-way is no way to go free.
pub(super) async fn charge_by_body(store: &dyn Store, ctx: &mut RequestCtx, finished: bool) {
    // An exchange that finished without an error had all its body, even
    // one that never came to the filter (a HEAD, a 204).
    let whole = ctx.body_ended || finished;
    let mut settled = Vec::new();
    for BodyCharge {
        reservation,
        reader,
    } in std::mem::take(&mut ctx.by_body)
    {
        let ChargedByResponse::Cost(ResponseCost {
            source:
                CostSource::Usage {
                    prompt_weight,
                    completion_weight,
                    ..
                },
            max,
            default,
            ..
        }) = reservation.charged_by
        else {
            continue;
        };
        let counters = ctx.runtime.counters(reservation.check.limit);
        let cost = reader
            .map(|r| r.finish(whole))
            .and_then(|read| priced_usage(read, prompt_weight, completion_weight));
        let owed = match cost {
            Some(cost) if cost > max => {
                counters.cost_above_max.inc();
                max
            }
            Some(cost) => cost,
            None if whole => {
                counters.cost_unread.inc();
                default
            }
            None => max,
        };
        settled.push((reservation, Settled::owe(owed)));
    }
    let status = ctx.upstream_status.unwrap_or(0);
    settle(store, ctx, settled, status).await;
}

/// Gives back what is not owed and charges what is owed beyond the
/// reservations: the charges in one call (none can be refused), each
/// refund on its own. A shadow layer that took nothing (it would have
/// refused) owes in full what its status or cost says. A refund goes only to the store that took the
/// reservation: one taken on Redis is not given back to this instance
/// while Redis is away, nor one taken while it was away to Redis (the
/// client gets back less than it could: never more).
async fn settle(
    store: &dyn Store,
    ctx: &RequestCtx,
    settled: Vec<(Reservation, Settled)>,
    status: u16,
) {
    let reserved_on = ctx.verdict.as_ref().map(|v| v.deciding);
    let same_store = reserved_on == Some(store.deciding());
    let mut owed = Vec::new();
    for (reservation, Settled { owed: total }) in settled {
        let Reservation {
            check, decision, ..
        } = reservation;
        let reserved = if decision.allowed() { check.cost } else { 0 };
        if total > reserved {
            owed.push(owed_check(check, total - reserved));
        } else if total < reserved && same_store && check.algorithm.takes_refund() {
            let refund = Check {
                cost: reserved - total,
                ..check
            };
            if let Err(e) = store.refund(&refund, decision.counted_at_us()).await {
                warn!("could not give back what {} reserved: {e}", refund.name);
            }
        }
    }
    if owed.is_empty() {
        return;
    }
    if let Err(e) = store.decide(&owed).await {
        warn!(
            "could not charge what a {status} response owes {}: {e}",
            owed[0].name
        );
    }
}

/// What a response's cost headers say.
#[derive(Debug, PartialEq, Eq)]
enum Reported {
    /// The largest whole number they carry.
    Cost(u64),
    /// Something that is not a whole number, or nothing; the largest whole
    /// number among the rest (0 for none).
    Unreadable(u64),
}

/// The cost a response reports: every value of the header, each line a
/// comma-separated list as HTTP allows, read as whole numbers; the largest
/// is charged (a cost said twice is not halved by saying it again lower).
/// One too large to read is more than any `max`.
fn reported_cost(values: http::header::GetAll<'_, http::HeaderValue>) -> Reported {
    let mut largest = None;
    let mut unreadable = false;
    for value in values {
        let Ok(text) = value.to_str() else {
            unreadable = true;
            continue;
        };
        for item in text.split(',') {
            let item = item.trim();
            if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
                unreadable = true;
                continue;
            }
            let cost = item.parse().unwrap_or(u64::MAX);
            largest = Some(largest.map_or(cost, |l: u64| l.max(cost)));
        }
    }
    match largest {
        Some(cost) if !unreadable => Reported::Cost(cost),
        other => Reported::Unreadable(other.unwrap_or(0)),
    }
}

/// `check` charged `cost` whatever is left (see `Algorithm::without_ceiling`).
fn owed_check(mut check: Check, cost: u64) -> Check {
    check.algorithm = check.algorithm.without_ceiling();
    check.cost = cost;
    check.spending = Spending::Charge;
    // A debt is charged where the budget is, never from or into a lease:
    // without a ceiling, a lease taken beside it would be as large as the
    // most a lease takes, whatever the limit.
    check.leasing = Leasing::Never;
    check
}

/// What a finished request holds is given back or charged: the
/// reservations of limits charged by the response, its slots.
pub(super) async fn settle_finished(state: &AppState, ctx: &mut RequestCtx, e: Option<&Error>) {
    // A request that reached the upstream but whose client hung up
    // before the answer is counted as if its status were listed:
    // otherwise hanging up at once would dodge the count. Settled
    // before the slots go, so that the next request a concurrency
    // limit lets in sees it.
    let why = Unanswered::of(ctx, e);
    if !ctx.by_body.is_empty() {
        charge_by_body(state.store.as_ref(), ctx, e.is_none()).await;
    }
    if !ctx.reservations.is_empty() {
        charge_unanswered(state.store.as_ref(), ctx, why).await;
    }
    // Over: the upstream answered, or floodgate gave up on it (a body
    // that never came whole, the upstream's read timeout). A client
    // that left once its request was whole was kept until then; a whole
    // request whose exchange was cut all the same (its HTTP/2 connection
    // torn down by the h2 server's own defences, say against a client
    // opening more streams than it may) leaves the upstream working on
    // it, so its place and its slots stay taken for as long as the
    // upstream may work: its read timeout, counted from the request.
    let cut_whole = || {
        ctx.h2_stream
            .as_ref()
            .is_some_and(H2Stream::cut_while_whole)
    };
    if why == Unanswered::ClientLeft && cut_whole() {
        let sent = ctx.upstream_sent.unwrap_or(ctx.started);
        let until = sent + ctx.runtime.upstream.settings().read_timeout;
        let (permit, slots) = (ctx.stream_permit.take(), ctx.slots.take());
        tokio::spawn(async move {
            tokio::time::sleep_until(until.into()).await;
            drop(permit);
            if let Some(mut slots) = slots {
                slots.release().await;
            }
        });
    } else if let Some(mut slots) = ctx.slots.take() {
        slots.release().await;
    }
}

#[cfg(test)]
mod tests {
    use super::{reported_cost, Reported};

    #[test]
    fn a_reported_cost_is_the_largest_whole_number_it_says() {
        let read = |values: &[&str]| {
            let mut headers = http::HeaderMap::new();
            for v in values {
                headers.append("x-cost", http::HeaderValue::from_str(v).unwrap());
            }
            reported_cost(headers.get_all("x-cost"))
        };
        assert_eq!(read(&["400"]), Reported::Cost(400));
        assert_eq!(read(&[" 7 "]), Reported::Cost(7));
        assert_eq!(read(&["0"]), Reported::Cost(0));
        // Twice, in two lines or in one list: the larger.
        assert_eq!(read(&["7", "9"]), Reported::Cost(9));
        assert_eq!(read(&["9", "7"]), Reported::Cost(9));
        assert_eq!(read(&["7, 9"]), Reported::Cost(9));
        for unreadable in ["", "-3", "1e3", "4.5", "12 tokens", "0x10"] {
            assert_eq!(
                read(&[unreadable]),
                Reported::Unreadable(0),
                "{unreadable:?}"
            );
        }
        // Beside one that reads, an unreadable one is noticed, and the
        // readable one still counts.
        assert_eq!(read(&["12", "lots"]), Reported::Unreadable(12));
        // Too large to read: more than any max, so charged the max.
        assert_eq!(read(&["99999999999999999999999"]), Reported::Cost(u64::MAX));
        assert_eq!(read(&[]), Reported::Unreadable(0));
    }
}

//! The scripts and their calling convention: the layers a run takes, the
//! arguments they are written as, and the reply read back into decisions.

use redis::{Script, ScriptInvocation};
use smallvec::SmallVec;

use crate::check::LeaseAsk;
use crate::error::LimiterError;
use floodgate_algorithm::{Algorithm, Decision, ALGORITHMS};

/// The algorithm scripts and the entry point, joined into one script after
/// the algorithms' codes, which come from the algorithm table.
pub fn script_source() -> String {
    let mut source = String::from("local CODE = {");
    for spec in &ALGORITHMS {
        source.push_str(&format!(" {} = {},", spec.name, spec.code));
    }
    source.push_str(" }\n");
    for part in [
        include_str!("../../lua/common.lua"),
        include_str!("../../lua/token_bucket.lua"),
        include_str!("../../lua/leaky_bucket.lua"),
        include_str!("../../lua/fixed_window.lua"),
        include_str!("../../lua/sliding_window.lua"),
        include_str!("../../lua/sliding_log.lua"),
        include_str!("../../lua/quota.lua"),
        include_str!("../../lua/decide.lua"),
    ] {
        source.push_str(part);
    }
    source
}

/// The concurrency limits' leases.
pub(super) const SLOTS_SCRIPT: &str = include_str!("../../lua/slots.lua");

/// Integers per layer in the script's reply.
pub(super) const REPLY_FIELDS: usize = 9;

/// One request's decisions, and the units leased beside each layer (empty
/// when none were).
pub(super) type Decided = (Vec<Decision>, SmallVec<[u64; 4]>);

/// How the script treats a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Refuses the request when it refuses; charged when all admit.
    Enforce = 0,
    /// Never refuses; charged when it admits and the request goes through.
    Shadow = 1,
    /// Decided, never charged; refuses the request when it refuses.
    Peek = 2,
    /// Decided, never charged, never refuses.
    ShadowPeek = 3,
    /// The cost is given back (an operator's credit).
    Credit = 4,
    /// A reservation's cost is given back where it was counted (the
    /// layer's `refund_at`).
    Refund = 5,
    /// Enforced, and a lease taken beside the charge (the layer's `lease`).
    Lease = 6,
}

/// One layer as the script takes it.
pub(super) struct ScriptLayer {
    pub(super) key: String,
    pub(super) code: u8,
    pub(super) quota: u64,
    /// In units of `1 / per_us` µs.
    pub(super) period: u64,
    /// 1, or a power of ten (a token bucket counting in fractions of a µs).
    pub(super) per_us: u64,
    pub(super) cost: u64,
    pub(super) mode: Mode,
    /// Where a refunded reservation was counted (`Mode::Refund` only).
    pub(super) refund_at: u64,
    /// The lease asked for (`Mode::Lease` only).
    pub(super) lease: LeaseAsk,
}

impl ScriptLayer {
    /// The key the layer's state lives under (its hash tag: its slot).
    pub(super) fn key(&self) -> &str {
        &self.key
    }
}

/// `units` of `1 / per_us` µs (a power of ten) as the script reads them:
/// µs with as many decimals as `per_us` has zeros ("0.1", "333.333334").
fn decimal_us(units: u64, per_us: u64) -> String {
    let decimals = per_us.ilog10() as usize;
    format!("{}.{:0decimals$}", units / per_us, units % per_us)
}

/// The probe's layer: always admits (so it always writes), and its key lives
/// a second.
pub(super) fn probe_algorithm() -> Algorithm {
    Algorithm::fixed_window(1 << 30, 1_000_000).unwrap_or_else(|_| unreachable!())
}

/// The decision script's invocation for `requests`, at `now` (the
/// script's clock argument: -1 for Redis's own).
pub(super) fn invocation<'a>(
    script: &'a Script,
    now: i64,
    requests: &[&[ScriptLayer]],
) -> ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    for layer in requests.iter().flat_map(|layers| layers.iter()) {
        invocation.key(&layer.key);
    }
    invocation.arg(now).arg(requests.len());
    for layers in requests {
        invocation.arg(layers.len());
        for layer in layers.iter() {
            invocation.arg(layer.code).arg(layer.quota);
            if layer.per_us == 1 {
                invocation.arg(layer.period);
            } else {
                invocation.arg(decimal_us(layer.period, layer.per_us));
            }
            invocation.arg(layer.cost).arg(layer.mode as u8);
            match layer.mode {
                Mode::Refund => {
                    invocation.arg(layer.refund_at);
                }
                Mode::Lease => {
                    invocation
                        .arg(layer.lease.max)
                        .arg(layer.lease.divisor)
                        .arg(layer.lease.life_us);
                }
                _ => {}
            }
        }
    }
    invocation
}

/// One run's reply, split back into the decisions of each request.
pub(super) fn decided(
    reply: &[u8],
    requests: &[&[ScriptLayer]],
) -> Result<Vec<Decided>, LimiterError> {
    let total = requests.iter().map(|layers| layers.len()).sum();
    let (decisions, leased) = parse_reply(reply, total)?;
    let mut decisions = decisions.into_iter();
    let mut first = 0;
    Ok(requests
        .iter()
        .map(|layers| {
            let own = first..first + layers.len();
            first = own.end;
            let leased = if leased.is_empty() {
                SmallVec::new()
            } else {
                leased[own].iter().copied().collect()
            };
            (decisions.by_ref().take(layers.len()).collect(), leased)
        })
        .collect())
}

/// The script's reply: `REPLY_FIELDS` space-separated integers per layer;
/// the decisions, and the units leased per layer (empty when none were).
pub(super) fn parse_reply(
    reply: &[u8],
    layers: usize,
) -> Result<(Vec<Decision>, Vec<u64>), LimiterError> {
    if layers == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let values: Vec<u64> = reply
        .split(|&b| b == b' ')
        .map(|field| {
            parse_u64(field)
                .ok_or_else(|| LimiterError::UnparsableReply(String::from_utf8_lossy(reply).into()))
        })
        .collect::<Result<_, _>>()?;
    if values.len() != layers * REPLY_FIELDS {
        return Err(LimiterError::WrongReplyLength {
            values: values.len(),
            layers,
        });
    }
    let leased: Vec<u64> = if values.chunks_exact(REPLY_FIELDS).any(|r| r[8] > 0) {
        values.chunks_exact(REPLY_FIELDS).map(|r| r[8]).collect()
    } else {
        Vec::new()
    };
    let decisions = values
        .chunks_exact(REPLY_FIELDS)
        .map(|r| {
            let (limit, remaining, reset_after_us) = (r[2], r[3], r[4]);
            match (r[0] == 1, r[1] == 1) {
                (true, _) => Decision::admitted_after(limit, remaining, reset_after_us, r[6])
                    .counted_at(r[7]),
                (false, true) => Decision::never_passable(limit, remaining, reset_after_us),
                (false, false) => Decision::refused(limit, remaining, reset_after_us, r[5]),
            }
        })
        .collect();
    Ok((decisions, leased))
}

#[derive(Debug, Clone, Copy)]
pub(super) enum SlotOp {
    Acquire,
    Renew,
    Release,
}

impl SlotOp {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            SlotOp::Acquire => "acquire",
            SlotOp::Renew => "renew",
            SlotOp::Release => "release",
        }
    }
}

/// The slots script's reply: allowed, remaining, reset_after_us,
/// retry_after_us.
pub(super) fn parse_slots_reply(reply: &[u8], max: u64) -> Result<(bool, Decision), LimiterError> {
    let unparsable = || LimiterError::UnparsableReply(String::from_utf8_lossy(reply).into());
    let values: Vec<u64> = reply
        .split(|&b| b == b' ')
        .map(|field| parse_u64(field).ok_or_else(unparsable))
        .collect::<Result<_, _>>()?;
    let [allowed, remaining, reset_after_us, retry_after_us] = values[..] else {
        return Err(LimiterError::WrongReplyLength {
            values: values.len(),
            layers: 1,
        });
    };
    let decision = if allowed == 1 {
        Decision::admitted(max, remaining, reset_after_us)
    } else {
        Decision::refused(max, remaining, reset_after_us, retry_after_us)
    };
    Ok((allowed == 1, decision))
}

/// A decimal integer, digits only, that fits in a u64.
pub(super) fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_learns_each_algorithms_code_from_the_table() {
        let source = script_source();
        for spec in &ALGORITHMS {
            assert!(source.contains(&format!(" {} = {},", spec.name, spec.code)));
            assert!(
                source.contains(&format!("ALGORITHMS[CODE.{}]", spec.name)),
                "{} is not registered by its code",
                spec.name
            );
        }
    }

    #[test]
    fn replies_hold_unsigned_decimal_integers_only() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"18446744073709551616",
            b"-1",
            b"1a",
            b" 1",
            b"1.5",
        ] {
            assert_eq!(parse_u64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let (decisions, leased) =
            parse_reply(b"1 0 10 9 100 0 0 4200 0 0 0 10 0 5 7 0 0 0", 2).expect("two layers");
        assert!(decisions[0].allowed() && !decisions[1].allowed());
        assert_eq!(decisions[0].counted_at_us(), 4200);
        assert_eq!(decisions[1].retry_after_us(), 7);
        assert!(leased.is_empty());
        let (_, leased) = parse_reply(b"1 0 10 4 100 0 0 4200 5", 1).expect("one layer");
        assert_eq!(leased, [5]);
        assert!(parse_reply(b"1 0 10 9 100 0 0 0", 1).is_err());
        assert!(parse_reply(b"1 0 10 x 100 0 0 0 0", 1).is_err());
    }
}

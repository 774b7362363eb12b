//! What both Redis stores share: the scripts, the keys, the connection made
//! on first use, the deadline on every call, and the replies' parsing.

use std::sync::Arc;
use std::time::Duration;

use prometheus::Histogram;
use redis::Script;
use smallvec::SmallVec;

use super::batch::{RunBatch, Wanted};
use super::settings::{ClockSource, RedisSettings};
use super::shared_connection::{Connect, SharedConnection, CONNECT_WITHIN};
use crate::check::{Check, LeaseAsk, LimitName, Slot, StateKey};
use crate::clock::Clock;
use crate::error::LimiterError;
use crate::watch;
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

/// How long an operator's reset or credit may take at least.
const OPERATOR_DEADLINE: Duration = Duration::from_secs(2);

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
    key: String,
    code: u8,
    quota: u64,
    /// In units of `1 / per_us` µs.
    period: u64,
    /// 1, or a power of ten (a token bucket counting in fractions of a µs).
    per_us: u64,
    cost: u64,
    mode: Mode,
    /// Where a refunded reservation was counted (`Mode::Refund` only).
    refund_at: u64,
    /// The lease asked for (`Mode::Lease` only).
    lease: LeaseAsk,
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

/// What both stores share: the settings, the script, the connection (made
/// on a proxy worker's runtime, before it listens or by the first call that
/// finds none), and the timing of each call.
pub(super) struct Scripted<C> {
    pub(super) settings: RedisSettings,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) script: Script,
    pub(super) slots_script: Script,
    pub(super) connection: SharedConnection<C>,
    turns: Option<tokio::sync::Semaphore>,
    pub(super) call_seconds: Option<Histogram>,
}

/// One script run per batch of requests, within the deadline: every key of
/// a batch in one slot on a cluster (`cluster::slot_of`).
#[async_trait::async_trait]
impl<C: Connect> RunBatch for Scripted<C> {
    type Layer = ScriptLayer;
    type Decided = Decided;

    async fn run_batch(
        &self,
        requests: &[&[ScriptLayer]],
        wanted: Wanted<'_>,
    ) -> Result<Vec<Option<Decided>>, LimiterError> {
        self.within_deadline(|mut connection| async move {
            self.run_wanted(&mut connection, requests, wanted).await
        })
        .await
    }
}

static STALLED_LINES: crate::log_throttle::LogThrottle =
    crate::log_throttle::LogThrottle::new(Duration::from_secs(10));

impl<C: Connect> Scripted<C> {
    pub(super) fn new(settings: RedisSettings, clock: Arc<dyn Clock>) -> Self {
        Scripted {
            settings,
            clock,
            script: Script::new(&script_source()),
            slots_script: Script::new(SLOTS_SCRIPT),
            connection: SharedConnection::new(),
            turns: C::MOST_CALLS_IN_FLIGHT.map(tokio::sync::Semaphore::new),
            call_seconds: None,
        }
    }

    /// `{prefix}:{limit}:{identity}`, the identity hash in braces: the hash
    /// tag, so that one identity's layers share a cluster slot.
    pub(super) fn key(&self, check: &Check) -> String {
        self.key_of("", &check.name, &check.key)
    }

    /// `{prefix}:{space}{limit}:{identity}`: `space` keeps kinds of state
    /// that a script must not mistake for each other apart ("slots:").
    pub(super) fn key_of(&self, space: &str, name: &LimitName, state: &StateKey) -> String {
        // By hand: `format!` with `{:032x}` cost more than the rest of the
        // request's Redis client work.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let prefix = &self.settings.key_prefix;
        let name = name.as_str();
        let mut key = String::with_capacity(prefix.len() + space.len() + name.len() + 36);
        key.push_str(prefix);
        key.push(':');
        key.push_str(space);
        key.push_str(name);
        key.push_str(":{");
        let identity = state.identity;
        for shift in (0..32).rev() {
            key.push(char::from(HEX[((identity >> (shift * 4)) & 0xf) as usize]));
        }
        key.push('}');
        key
    }

    pub(super) fn layers<'a>(
        &self,
        checks: impl IntoIterator<Item = &'a Check>,
        peek: bool,
    ) -> Vec<ScriptLayer> {
        self.layers_leasing(checks, &[], peek)
    }

    /// `layers`, each enforced layer with an ask in `asks` (by position)
    /// taking a lease beside its charge.
    pub(super) fn layers_leasing<'a>(
        &self,
        checks: impl IntoIterator<Item = &'a Check>,
        asks: &[Option<LeaseAsk>],
        peek: bool,
    ) -> Vec<ScriptLayer> {
        // A calendar quota's period ends where the proxy's calendar says:
        // read once, for all the layers.
        let mut now_us = None;
        let no_lease = LeaseAsk {
            max: 0,
            divisor: 1,
            life_us: 0,
        };
        checks
            .into_iter()
            .enumerate()
            .map(|(i, check)| {
                let ask = asks.get(i).copied().flatten();
                ScriptLayer {
                    key: self.key(check),
                    code: check.algorithm.kind().code(),
                    quota: check.algorithm.quota(),
                    per_us: check.algorithm.per_us(),
                    period: match check.algorithm.calendar() {
                        Some(_) => check
                            .algorithm
                            .script_period_at(*now_us.get_or_insert_with(|| self.clock.now_us())),
                        None => check.algorithm.period(),
                    },
                    cost: check.cost,
                    mode: match (peek || check.peek, check.shadow, ask) {
                        (true, false, _) => Mode::Peek,
                        (true, true, _) => Mode::ShadowPeek,
                        (false, true, _) => Mode::Shadow,
                        (false, false, Some(_)) => Mode::Lease,
                        (false, false, None) => Mode::Enforce,
                    },
                    refund_at: 0,
                    lease: ask.unwrap_or(no_lease),
                }
            })
            .collect()
    }

    pub(super) fn probe_layer(&self) -> ScriptLayer {
        let probe = probe_algorithm();
        ScriptLayer {
            key: format!("{}:probe:{{0}}", self.settings.key_prefix),
            code: probe.kind().code(),
            quota: probe.quota(),
            period: probe.period(),
            per_us: probe.per_us(),
            cost: 1,
            mode: Mode::Enforce,
            refund_at: 0,
            lease: LeaseAsk {
                max: 0,
                divisor: 1,
                life_us: 0,
            },
        }
    }

    pub(super) fn now_arg(&self) -> i64 {
        match self.settings.clock {
            ClockSource::Redis => -1,
            ClockSource::Local => self.clock.now_us() as i64,
        }
    }

    /// Runs `work` on the connection (made on first use), all within the
    /// deadline.
    pub(super) async fn within_deadline<T, F, Fut>(&self, work: F) -> Result<T, LimiterError>
    where
        F: FnOnce(C) -> Fut,
        Fut: std::future::Future<Output = Result<T, LimiterError>>,
    {
        self.within(self.settings.timeout, work).await
    }

    /// An operator's change is given longer than a request's decision: a
    /// change cut short after it was made would be reported as not made
    /// (and a retried credit given twice).
    fn operator_deadline(&self) -> Duration {
        self.settings.timeout.max(OPERATOR_DEADLINE)
    }

    async fn within<T, F, Fut>(&self, deadline: Duration, work: F) -> Result<T, LimiterError>
    where
        F: FnOnce(C) -> Fut,
        Fut: std::future::Future<Output = Result<T, LimiterError>>,
    {
        let mut generation = None;
        let run = async {
            let _turn = match &self.turns {
                Some(turns) => Some(turns.acquire().await.map_err(|_| LimiterError::Stopped)?),
                None => None,
            };
            let (made, connection) = self.connection.get(&self.settings).await?;
            generation = Some(made);
            work(connection).await
        };
        // Pingora's timer wheel: far cheaper per call than a tokio timer.
        match pingora_timeout::fast_timeout::fast_timeout(deadline, run).await {
            Ok(result) => result,
            Err(_) => {
                if let Some(generation) = generation {
                    self.stalled(generation);
                }
                Err(LimiterError::Timeout(deadline))
            }
        }
    }

    /// A call on the connection of `generation` missed its deadline: where
    /// the client can wedge, the next call makes a new connection.
    fn stalled(&self, generation: u64) {
        if !C::REPLACE_WHEN_STALLED {
            return;
        }
        self.connection.discard(generation);
        if let Some(held_back) = STALLED_LINES.due(self.clock.now_us()) {
            log::warn!("a call on the Redis connection missed its deadline: the next call connects anew, from a new slot map ({held_back} more since the last report)");
        }
    }

    /// Times a decision (observed when dropped, failed calls included).
    pub(super) fn call_timer(&self) -> Option<prometheus::HistogramTimer> {
        self.call_seconds.as_ref().map(Histogram::start_timer)
    }

    /// `run` for the requests still `wanted` now that the connection (and
    /// a turn on it) is there: a caller that gave up while the run waited
    /// for them is not charged.
    pub(super) async fn run_wanted(
        &self,
        connection: &mut C,
        requests: &[&[ScriptLayer]],
        wanted: Wanted<'_>,
    ) -> Result<Vec<Option<Decided>>, LimiterError> {
        if (0..requests.len()).all(wanted) {
            let decided = self.run(connection, requests).await?;
            return Ok(decided.into_iter().map(Some).collect());
        }
        let live: Vec<usize> = (0..requests.len()).filter(|&i| wanted(i)).collect();
        let mut answers: Vec<Option<Decided>> = requests.iter().map(|_| None).collect();
        if live.is_empty() {
            return Ok(answers);
        }
        let chosen: Vec<&[ScriptLayer]> = live.iter().map(|&i| requests[i]).collect();
        let decided = self.run(connection, &chosen).await?;
        for (i, decided) in live.into_iter().zip(decided) {
            answers[i] = Some(decided);
        }
        Ok(answers)
    }

    /// One script run for all the requests' layers; the decisions come back
    /// per request.
    pub(super) async fn run(
        &self,
        connection: &mut C,
        requests: &[&[ScriptLayer]],
    ) -> Result<Vec<Decided>, LimiterError> {
        let mut invocation = self.script.prepare_invoke();
        for layer in requests.iter().flat_map(|layers| layers.iter()) {
            invocation.key(&layer.key);
        }
        invocation.arg(self.now_arg()).arg(requests.len());
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
        let reply: Vec<u8> = invocation
            .invoke_async(connection)
            .await
            .map_err(classify)?;
        let total = requests.iter().map(|layers| layers.len()).sum();
        let (decisions, leased) = parse_reply(&reply, total)?;
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

    /// Makes the connection, waiting as long as a connect may take (a call
    /// waits only its deadline), and loads the scripts (on every node of a
    /// cluster), writing nothing; all within `CONNECT_WITHIN`. Not a call:
    /// running out of time here leaves a connection made in place.
    pub(super) async fn warm(&self) -> Result<(), LimiterError> {
        let warm = async {
            let (_, mut connection) = self.connection.get(&self.settings).await?;
            for script in [&self.script, &self.slots_script] {
                script
                    .load_async(&mut connection)
                    .await
                    .map_err(connection_error)?;
            }
            Ok(())
        };
        tokio::time::timeout(CONNECT_WITHIN, warm)
            .await
            .map_err(|_| LimiterError::Timeout(CONNECT_WITHIN))?
    }

    /// Runs the script on the probe key, with a write, loading the script
    /// where it is missing (after a restart or SCRIPT FLUSH). A Redis that
    /// answers pings but refuses writes (out of memory under `noeviction`, a
    /// read-only replica) fails the probe as it fails decisions.
    pub(super) async fn probe(&self) -> Result<(), LimiterError> {
        let probe = [self.probe_layer()];
        self.within_deadline(|mut connection| async move {
            self.run(&mut connection, &[&probe]).await.map(drop)
        })
        .await
    }

    /// One call of the slots script on `slot`'s key: whether it took (or
    /// held) the slot, and the decision for an acquisition.
    pub(super) async fn slots(
        &self,
        op: SlotOp,
        slot: &Slot,
    ) -> Result<(bool, Decision), LimiterError> {
        let key = self.key_of("slots:", slot.name(), slot.key());
        let now = self.now_arg();
        let call = self.within_deadline(|mut connection| async move {
            let reply: Vec<u8> = self
                .slots_script
                .key(&key)
                .arg(op.as_str())
                .arg(now)
                .arg(slot.max())
                .arg(slot.lease_us())
                .arg(slot.lease_id())
                .invoke_async(&mut connection)
                .await
                .map_err(classify)?;
            parse_slots_reply(&reply, slot.max())
        });
        let operation = match op {
            SlotOp::Acquire => "slot acquire",
            SlotOp::Renew => "slot renew",
            SlotOp::Release => "slot release",
        };
        watch::redis_call(operation, call).await
    }

    /// Deletes these layers' keys in one pipeline (a cluster routes each
    /// command by its key's slot), then tells the other instances
    /// (`announce`).
    pub(super) async fn delete(&self, checks: &[Check]) -> Result<(), LimiterError> {
        let mut pipeline = redis::pipe();
        for check in checks {
            pipeline.cmd("DEL").arg(self.key(check)).ignore();
        }
        self.within(self.operator_deadline(), |mut connection| async move {
            pipeline
                .exec_async(&mut connection)
                .await
                .map_err(classify)?;
            self.announce(&mut connection, checks, Change::Reset).await;
            Ok(())
        })
        .await
    }

    /// Gives `check.cost` units back to its layer (an operator's credit),
    /// then tells the other instances; the layer as a request of cost 0
    /// sees it after.
    pub(super) async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        let mut layers = self.layers([check], true);
        for layer in &mut layers {
            layer.mode = Mode::Credit;
        }
        let requests = [layers.as_slice()];
        let decided = self
            .within(self.operator_deadline(), |mut connection| async move {
                let decided = self.run(&mut connection, &requests).await?;
                self.announce(&mut connection, std::slice::from_ref(check), Change::Credit)
                    .await;
                Ok(decided)
            })
            .await?;
        decided
            .into_iter()
            .flat_map(|(decisions, _)| decisions)
            .next()
            .ok_or(LimiterError::WrongReplyLength {
                values: 0,
                layers: 1,
            })
    }

    /// Gives a reservation's `check.cost` units back where they were
    /// counted (`counted_at_us`), in one script run with a request's
    /// deadline: nobody else hears of it, as nobody heard of the
    /// reservation.
    pub(super) async fn refund(
        &self,
        check: &Check,
        counted_at_us: u64,
    ) -> Result<(), LimiterError> {
        let layers = self.refund_layers(check, counted_at_us);
        let requests = [layers.as_slice()];
        self.within_deadline(|mut connection| async move {
            self.run(&mut connection, &requests).await.map(drop)
        })
        .await
    }

    /// The script's layer that gives a reservation back (`refund`).
    pub(super) fn refund_layers(&self, check: &Check, counted_at_us: u64) -> Vec<ScriptLayer> {
        let mut layers = self.layers([check], true);
        for layer in &mut layers {
            layer.mode = Mode::Refund;
            layer.refund_at = counted_at_us;
        }
        layers
    }

    /// Publishes the layers whose state an operator changed on
    /// `changes_channel`, so that every instance forgets the refusals it
    /// remembers for them (`KnownRefusals`). The change is made whether or
    /// not this is heard: a failure is logged, not answered as the
    /// change's (a retried credit would be given twice).
    async fn announce(&self, connection: &mut C, checks: &[Check], change: Change) {
        let keys: Vec<StateKey> = checks.iter().map(|c| c.key).collect();
        let channel = changes_channel(&self.settings.key_prefix);
        let published = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(encode_change(change, &keys))
            .exec_async(connection)
            .await;
        if let Err(e) = published {
            log::warn!("changed, but could not tell the other instances on {channel} ({e}): each refuses the client until the refusal it remembers runs out");
        }
    }
}

/// The channel on which instances sharing a Redis (and a key prefix) hear
/// of state an operator reset or credited.
pub fn changes_channel(key_prefix: &str) -> String {
    format!("{key_prefix}:changes")
}

/// What an operator did to the keys announced on `changes_channel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Their state is gone: a lease of them is dropped, never given back.
    Reset,
    /// Units were given back to their state, which still counts what was
    /// leased of it: a lease of them goes back.
    Credit,
}

/// Before the keys, the word `credit` for a credit (nothing for a reset):
/// an instance from before it reads the word as a key that does not parse,
/// and forgets the keys as it always did.
const CREDIT_WORD: &str = "credit";

/// A `changes_channel` message.
pub fn encode_change(change: Change, keys: &[StateKey]) -> String {
    match change {
        Change::Reset => encode_state_keys(keys),
        Change::Credit => format!("{CREDIT_WORD} {}", encode_state_keys(keys)),
    }
}

/// What a `changes_channel` message says was done, and to which keys.
pub fn decode_change(message: &str) -> (Change, Vec<StateKey>) {
    match message.trim_start().strip_prefix(CREDIT_WORD) {
        Some(keys) if keys.starts_with(|c: char| c.is_ascii_whitespace()) => {
            (Change::Credit, decode_state_keys(keys))
        }
        _ => (Change::Reset, decode_state_keys(message)),
    }
}

/// `limit:identity` in hex, space-separated: what `changes_channel` carries.
pub fn encode_state_keys(keys: &[StateKey]) -> String {
    keys.iter()
        .map(|k| format!("{:x}:{:x}", k.limit, k.identity))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The keys of a `changes_channel` message; what does not parse is left out.
pub fn decode_state_keys(message: &str) -> Vec<StateKey> {
    message
        .split_ascii_whitespace()
        .filter_map(|pair| {
            let (limit, identity) = pair.split_once(':')?;
            Some(StateKey {
                limit: u64::from_str_radix(limit, 16).ok()?,
                identity: u128::from_str_radix(identity, 16).ok()?,
            })
        })
        .collect()
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
    fn as_str(self) -> &'static str {
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

pub(super) fn classify(e: redis::RedisError) -> LimiterError {
    if e.is_timeout() {
        LimiterError::Timeout(Duration::ZERO)
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        LimiterError::Connection(Arc::new(e))
    } else {
        LimiterError::Rejected(Arc::new(e))
    }
}

pub(super) fn connection_error(e: redis::RedisError) -> LimiterError {
    LimiterError::Connection(Arc::new(e))
}

/// rediss:// needs a process-wide TLS provider; a second install (another
/// store, a reload) finds it there already.
pub(super) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::super::settings::{InstanceCount, Topology};
    use super::*;
    use crate::check::OnFailure;
    use crate::clock::SystemClock;
    use redis::aio::ConnectionManager;

    #[test]
    fn keys_are_prefix_limit_and_the_identity_as_32_hex_digits() {
        let store: Scripted<ConnectionManager> = Scripted::new(
            RedisSettings {
                topology: Topology::Standalone("redis://127.0.0.1:1".into()),
                timeout: Duration::from_millis(50),
                clock: ClockSource::Redis,
                key_prefix: "fg".into(),
                on_failure: OnFailure::Deny,
                instances: InstanceCount::Fixed(1),
                tls_ca: None,
                leases: None,
            },
            Arc::new(SystemClock),
        );
        for identity in [
            0,
            1,
            0xabc,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            let check = Check {
                limit: crate::LimitId(0),
                name: LimitName::new("per-ip"),
                algorithm: Algorithm::fixed_window(1, 1).expect("valid numbers"),
                key: StateKey { limit: 0, identity },
                cost: 1,
                shadow: false,
                peek: false,
                on_failure: OnFailure::Deny,
                lease: false,
            };
            assert_eq!(store.key(&check), format!("fg:per-ip:{{{identity:032x}}}"));
        }
    }

    #[test]
    fn changed_keys_cross_the_channel_whole_and_garbage_is_left_out() {
        let keys = [
            StateKey {
                limit: u64::MAX,
                identity: u128::MAX,
            },
            StateKey {
                limit: 7,
                identity: 0,
            },
        ];
        let message = encode_state_keys(&keys);
        assert_eq!(decode_state_keys(&message), keys);
        assert_eq!(
            decode_state_keys(&format!("zz:1 7 {message} 1:2:3")),
            keys.to_vec()
        );
    }

    #[test]
    fn a_credit_is_told_from_a_reset_and_an_older_reader_still_finds_the_keys() {
        let keys = [StateKey {
            limit: 3,
            identity: 0xabc,
        }];
        for change in [Change::Reset, Change::Credit] {
            let message = encode_change(change, &keys);
            assert_eq!(decode_change(&message), (change, keys.to_vec()));
            // What an instance from before the word reads.
            assert_eq!(decode_state_keys(&message), keys);
        }
        assert_eq!(decode_change("creditz 3:abc").0, Change::Reset);
    }

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

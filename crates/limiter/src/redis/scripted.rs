//! What both Redis stores share: the keys, the connection made on first
//! use, the deadline on every call, and the calls themselves (a run of the
//! script, the slots script, an operator's change and its announcement).

use std::sync::Arc;
use std::time::Duration;

use prometheus::Histogram;
use redis::Script;

use super::batch::{RunBatch, Wanted};
use super::change_message::{changes_channel, encode_change, Change};
use super::script::{
    self, parse_slots_reply, probe_algorithm, script_source, Decided, Mode, ScriptLayer, SlotOp,
    SLOTS_SCRIPT,
};
use super::settings::{ClockSource, RedisSettings};
use super::shared_connection::{Connect, SharedConnection, CONNECT_WITHIN};
use crate::check::{Check, Enforcement, LeaseAsk, LimitName, Slot, Spending, StateKey};
use crate::clock::Clock;
use crate::error::LimiterError;
use crate::watch;
use floodgate_algorithm::Decision;

/// How long an operator's reset or credit may take at least.
const OPERATOR_DEADLINE: Duration = Duration::from_secs(2);

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
        spending: Spending,
    ) -> Vec<ScriptLayer> {
        self.layers_leasing(checks, &[], spending)
    }

    /// `layers`, each enforced layer with an ask in `asks` (by position)
    /// taking a lease beside its charge. `Spending::Peek` peeks at every
    /// layer; `Spending::Charge` spends as each layer says.
    pub(super) fn layers_leasing<'a>(
        &self,
        checks: impl IntoIterator<Item = &'a Check>,
        asks: &[Option<LeaseAsk>],
        spending: Spending,
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
                let spending = match spending {
                    Spending::Peek => Spending::Peek,
                    Spending::Charge => check.spending,
                };
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
                    mode: match (spending, check.enforcement, ask) {
                        (Spending::Peek, Enforcement::Enforce, _) => Mode::Peek,
                        (Spending::Peek, Enforcement::Shadow, _) => Mode::ShadowPeek,
                        (Spending::Charge, Enforcement::Shadow, _) => Mode::Shadow,
                        (Spending::Charge, Enforcement::Enforce, Some(_)) => Mode::Lease,
                        (Spending::Charge, Enforcement::Enforce, None) => Mode::Enforce,
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
        let reply: Vec<u8> = script::invocation(&self.script, self.now_arg(), requests)
            .invoke_async(connection)
            .await
            .map_err(classify)?;
        script::decided(&reply, requests)
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
        let mut layers = self.layers([check], Spending::Peek);
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
        let mut layers = self.layers([check], Spending::Peek);
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
    use crate::check::{Leasing, OnFailure};
    use crate::clock::SystemClock;
    use floodgate_algorithm::Algorithm;
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
                enforcement: Enforcement::Enforce,
                spending: Spending::Charge,
                on_failure: OnFailure::Deny,
                leasing: Leasing::Never,
            };
            assert_eq!(store.key(&check), format!("fg:per-ip:{{{identity:032x}}}"));
        }
    }
}

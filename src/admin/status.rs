//! What the status page shows that the metrics do not keep: each limit's
//! admitted and refused rates over the last 15 minutes, since when the
//! store decides as it does, the clients refused most, and the reloads.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::server::metrics::LayerCounters;
use floodgate_limiter::Enforcement;
use floodgate_limiter::{Deciding, LimitName};
use floodgate_policy::identity::Client;
use floodgate_policy::Limit;

/// One point of a chart per this long.
pub(crate) const STEP: Duration = Duration::from_secs(5);
/// How far back the charts go: 15 minutes.
const POINTS: usize = 180;
/// Clients the refusal board keeps at most (the least refused go first).
const BOARD_SIZE: usize = 1_000;
/// Rows of the board the page shows.
const BOARD_SHOWN: usize = 20;
/// A client not refused for this long leaves the board.
const BOARD_WINDOW_S: u64 = 15 * 60;
/// Reloads remembered.
const RELOADS_KEPT: usize = 20;

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Cumulative counts of one limit at one instant.
#[derive(Clone, Copy, Default)]
struct Totals {
    admitted: u64,
    refused: u64,
    shadow_refused: u64,
}

struct Sample {
    at: u64,
    /// By limit name: limits come and go with reloads.
    totals: HashMap<String, Totals>,
}

/// What is running now, for `Status::to_json`.
pub struct Scene<'a> {
    pub deciding: Deciding,
    /// Every running limit, with its series.
    pub limits: Vec<(&'a Limit, &'a LayerCounters)>,
    pub config: String,
    pub store_target: Option<String>,
    /// The instances sharing Redis, and whether counted live ("auto").
    pub instances: Option<(u64, bool)>,
    pub connections_open: i64,
    pub in_flight: usize,
    pub admin_connections_open: i64,
    /// `[upstream.protection]`'s state, when on.
    pub protection: Option<Value>,
}

/// The process's recent past, sampled by `Status::tick`.
pub struct Status {
    samples: Mutex<VecDeque<Sample>>,
    /// What decides, and since when (unix seconds).
    deciding: Mutex<(Deciding, u64)>,
    /// By the client's identity (key or address) and the refusing limit.
    board: Mutex<HashMap<(u128, LimitName), Refused>>,
    reloads: Mutex<VecDeque<Reload>>,
    pub started_at: u64,
}

struct Refused {
    /// The client as the page shows it: a key's label, or the address.
    label: String,
    tier: String,
    count: u64,
    last: u64,
}

struct Reload {
    at: u64,
    ok: bool,
    reason: Option<String>,
}

impl Status {
    pub fn new(deciding: Deciding) -> Status {
        let now = unix_now();
        Status {
            samples: Mutex::new(VecDeque::with_capacity(POINTS + 1)),
            deciding: Mutex::new((deciding, now)),
            board: Mutex::new(HashMap::new()),
            reloads: Mutex::new(VecDeque::with_capacity(RELOADS_KEPT)),
            started_at: now,
        }
    }

    /// Notes a change of the deciding store (called often: it is cheap).
    pub fn observe_store(&self, now: Deciding) {
        if let Ok(mut deciding) = self.deciding.lock() {
            if deciding.0 != now {
                *deciding = (now, unix_now());
            }
        }
    }

    /// Takes one sample of every running limit's counters.
    pub fn tick<'a>(
        &self,
        deciding: Deciding,
        limits: impl Iterator<Item = (&'a Limit, &'a LayerCounters)>,
    ) {
        self.observe_store(deciding);
        let totals = limits
            .map(|(limit, c)| {
                let totals = Totals {
                    admitted: c.admitted.get(),
                    refused: c.refused.get() + c.banned.get(),
                    shadow_refused: c.shadow_refused.get(),
                };
                (limit.name.as_str().to_string(), totals)
            })
            .collect();
        if let Ok(mut samples) = self.samples.lock() {
            if samples.len() > POINTS {
                samples.pop_front();
            }
            samples.push_back(Sample {
                at: unix_now(),
                totals,
            });
        }
    }

    /// Counts a refused request against its client and the refusing limit.
    /// A client already on the board costs a lookup and no allocation.
    pub fn refused(&self, client: &Client, limit: &LimitName) {
        let who = client.api_key.as_ref().map_or(client.ip_hash, |k| k.hash);
        let now = unix_now();
        let Ok(mut board) = self.board.lock() else {
            return;
        };
        let key = (who, limit.clone());
        if let Some(entry) = board.get_mut(&key) {
            entry.count += 1;
            entry.last = now;
            return;
        }
        // Full: the newcomer takes the place of the least refused and its
        // count plus one (space-saving), so that a client refused often
        // climbs even while many others are refused once each; a count is
        // then at most that many too high, never too low.
        let mut count = 1;
        if board.len() >= BOARD_SIZE {
            let recent = |r: &Refused| now.saturating_sub(r.last) < BOARD_WINDOW_S;
            let least = board
                .iter()
                .min_by_key(|(_, r)| (recent(r), r.count))
                .map(|(k, r)| (k.clone(), r.count, recent(r)));
            if let Some((least, least_count, recent)) = least {
                board.remove(&least);
                if recent {
                    count += least_count;
                }
            }
        }
        let label = client
            .api_key
            .as_ref()
            .map_or_else(|| client.address_label(), |key| key.log_label());
        board.insert(
            key,
            Refused {
                label,
                tier: client.tier.name().to_string(),
                count,
                last: now,
            },
        );
    }

    pub fn reloaded(&self, ok: bool, reason: Option<String>) {
        if let Ok(mut reloads) = self.reloads.lock() {
            if reloads.len() >= RELOADS_KEPT {
                reloads.pop_back();
            }
            reloads.push_front(Reload {
                at: unix_now(),
                ok,
                reason,
            });
        }
    }

    /// The JSON the status page renders.
    pub fn to_json(&self, scene: &Scene<'_>) -> Value {
        self.observe_store(scene.deciding);
        let now = unix_now();
        let samples = self.samples.lock().ok();
        let samples: Vec<&Sample> = samples.as_ref().map_or(Vec::new(), |s| s.iter().collect());
        let step = STEP.as_secs().max(1);
        let limits: Vec<Value> = scene
            .limits
            .iter()
            .map(|&(limit, counters)| {
                let name = limit.name.as_str();
                // Rates between consecutive samples; a limit new since a
                // reload starts where it appears.
                let mut series = (Vec::new(), Vec::new(), Vec::new());
                let mut start = None;
                for pair in samples.windows(2) {
                    let (Some(a), Some(b)) = (pair[0].totals.get(name), pair[1].totals.get(name))
                    else {
                        continue;
                    };
                    start.get_or_insert(pair[1].at);
                    let seconds = pair[1].at.saturating_sub(pair[0].at).max(1) as f64;
                    let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / seconds;
                    series.0.push(rate(a.admitted, b.admitted));
                    series.1.push(rate(a.refused, b.refused));
                    series.2.push(rate(a.shadow_refused, b.shadow_refused));
                }
                json!({
                    "name": name,
                    "algorithm": match limit.rule {
                        floodgate_policy::Rule::Rate(a) => a.name(),
                        floodgate_policy::Rule::Concurrency(_) => "concurrency",
                    },
                    "key": limit.key.describe(),
                    "shadow": limit.enforcement == Enforcement::Shadow,
                    "description": format!("{} on {}", limit.rule, limit.matcher.describe()),
                    "series": {
                        "start": start.unwrap_or(now),
                        "admitted": series.0,
                        "refused": series.1,
                        "shadow_refused": series.2,
                    },
                    "totals": {
                        "admitted": counters.admitted.get(),
                        "refused": counters.refused.get(),
                        "shadow_refused": counters.shadow_refused.get(),
                        "banned": counters.banned.get(),
                    },
                })
            })
            .collect();
        let board: Vec<Value> = self.board.lock().map_or(Vec::new(), |board| {
            let mut rows: Vec<(&(u128, LimitName), &Refused)> = board
                .iter()
                .filter(|(_, r)| now.saturating_sub(r.last) < BOARD_WINDOW_S)
                .collect();
            rows.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(b.1.last.cmp(&a.1.last)));
            rows.into_iter()
                .take(BOARD_SHOWN)
                .map(|((_, limit), r)| {
                    json!({"client": r.label, "tier": r.tier, "limit": limit.as_str(), "refusals": r.count, "last": r.last})
                })
                .collect()
        });
        let reloads: Vec<Value> = self.reloads.lock().map_or(Vec::new(), |reloads| {
            reloads
                .iter()
                .map(|r| json!({"at": r.at, "ok": r.ok, "reason": r.reason}))
                .collect()
        });
        let (deciding, since) = self
            .deciding
            .lock()
            .map_or((scene.deciding, self.started_at), |d| *d);
        json!({
            "now": now,
            "started_at": self.started_at,
            "version": env!("CARGO_PKG_VERSION"),
            "config": scene.config,
            "store": {
                "deciding": deciding.as_str(),
                "since": since,
                "target": scene.store_target,
                "instances": scene.instances.map(|(count, counted)| json!({
                    "count": count,
                    "source": if counted { "auto" } else { "config" },
                })),
            },
            "connections": {
                "open": scene.connections_open,
                "in_flight": scene.in_flight,
                "admin_open": scene.admin_connections_open,
            },
            "protection": scene.protection,
            "step_seconds": step,
            "limits": limits,
            "top_refused": board,
            "reloads": reloads,
        })
    }
}

//! A fragile upstream on a simulated clock, for the controller's tests and
//! `examples/protection_curve.rs`: it serves `capacity` requests at a time,
//! `latency_ms` each, and queues the rest, so latency grows with load;
//! `clients` send one request after another, a refused one again a
//! millisecond later. One step is one millisecond.

use std::collections::VecDeque;

use super::controller::Controller;

/// One millisecond's figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tick {
    pub limit: u32,
    pub in_flight: usize,
    pub served: usize,
    /// The upstream's capacity then.
    pub capacity: usize,
}

pub struct Upstream {
    pub capacity: usize,
    pub latency_ms: u64,
    /// Admitted at (ms), waiting for a place.
    queue: VecDeque<u64>,
    /// (admitted at, done at), being served.
    serving: Vec<(u64, u64)>,
}

/// Runs `ms` milliseconds; `change(t)` may reshape the upstream each ms.
pub fn run(
    controller: &mut Controller,
    clients: usize,
    ms: u64,
    mut change: impl FnMut(u64, &mut Upstream),
) -> Vec<Tick> {
    let mut upstream = Upstream {
        capacity: 8,
        latency_ms: 20,
        queue: VecDeque::new(),
        serving: Vec::new(),
    };
    let mut idle = clients;
    let mut ticks = Vec::with_capacity(ms as usize);
    for t in 0..ms {
        change(t, &mut upstream);
        let now = t * 1_000;
        // Done: each one's latency to the controller, its client idle.
        let mut served = 0;
        upstream.serving.retain(|&(admitted, done)| {
            if done <= t {
                controller.sample(now, (t - admitted) * 1_000);
                served += 1;
                false
            } else {
                true
            }
        });
        idle += served;
        controller.tick(now);
        // Idle clients send, as far as the limit lets them.
        while idle > 0 {
            let in_flight = upstream.queue.len() + upstream.serving.len();
            if in_flight >= controller.limit() as usize {
                break;
            }
            upstream.queue.push_back(t);
            idle -= 1;
        }
        while upstream.serving.len() < upstream.capacity {
            let Some(admitted) = upstream.queue.pop_front() else {
                break;
            };
            upstream.serving.push((admitted, t + upstream.latency_ms));
        }
        ticks.push(Tick {
            limit: controller.limit(),
            in_flight: upstream.queue.len() + upstream.serving.len(),
            served,
            capacity: upstream.capacity,
        });
    }
    ticks
}

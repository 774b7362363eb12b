//! The controller against a simulated fragile upstream
//! (`protection::simulation`).

use super::*;
use crate::protection::simulation::{run, Tick};

const MS: u64 = 1_000;

fn settings() -> ControllerSettings {
    ControllerSettings {
        min: 2,
        max: 1_000,
        initial: 10,
        tolerance: 1.2,
        window_us: 250 * MS,
        probe_interval_us: 30_000 * MS,
    }
}

/// Average in flight, and requests served a second, over `ticks`.
fn steady(ticks: &[Tick]) -> (f64, f64) {
    let n = ticks.len() as f64;
    let in_flight = ticks.iter().map(|t| t.in_flight as f64).sum::<f64>() / n;
    let served = ticks.iter().map(|t| t.served as f64).sum::<f64>() * 1_000.0 / n;
    (in_flight, served)
}

#[test]
fn under_eight_times_its_capacity_the_upstream_is_kept_near_it_and_busy() {
    let mut c = Controller::new(settings(), 0);
    let ticks = run(&mut c, 64, 20_000, |_, _| {});
    // Capacity 8 at 20 ms: 400 a second.
    let (in_flight, served) = steady(&ticks[5_000..]);
    assert!((8.0..=12.5).contains(&in_flight), "{in_flight} in flight");
    assert!(served >= 0.9 * 400.0, "{served} a second");
    // Without the limit, all 64 would wait there: 8 times the latency.
    assert!(ticks.iter().all(|t| (2..=1_000).contains(&t.limit)));
}

#[test]
fn the_limit_follows_a_capacity_that_doubles_then_halves() {
    let mut c = Controller::new(settings(), 0);
    let ticks = run(&mut c, 128, 30_000, |t, u| {
        u.capacity = if (10_000..20_000).contains(&t) { 16 } else { 8 };
    });
    // Within 3 s of each change, the upstream is busy and not swamped.
    let (in_flight, served) = steady(&ticks[13_000..20_000]);
    assert!(
        (16.0..=24.0).contains(&in_flight),
        "{in_flight} in flight at 16"
    );
    assert!(served >= 0.9 * 800.0, "{served} a second at 16");
    let (in_flight, served) = steady(&ticks[23_000..30_000]);
    assert!(
        (8.0..=12.5).contains(&in_flight),
        "{in_flight} in flight at 8 again"
    );
    assert!(served >= 0.9 * 400.0, "{served} a second at 8 again");
}

#[test]
fn an_upstream_that_gets_slower_is_followed_after_a_probe() {
    let mut c = Controller::new(
        ControllerSettings {
            probe_interval_us: 5_000 * MS,
            ..settings()
        },
        0,
    );
    let ticks = run(&mut c, 64, 30_000, |t, u| {
        u.latency_ms = if t >= 5_000 { 60 } else { 20 };
    });
    // Capacity 8 at 60 ms: 133 a second; without probes the old minimum
    // (20 ms) would hold the limit at its floor for good.
    let (in_flight, served) = steady(&ticks[20_000..]);
    assert!(served >= 0.9 * 8_000.0 / 60.0, "{served} a second");
    assert!(in_flight <= 12.5, "{in_flight} in flight");
    assert_eq!(c.min_latency_us().map(|m| m / MS), Some(60));
}

#[test]
fn an_upstream_that_gets_faster_lowers_the_minimum_at_once() {
    let mut c = Controller::new(settings(), 0);
    run(&mut c, 64, 6_000, |t, u| {
        u.latency_ms = if t >= 3_000 { 5 } else { 20 };
    });
    assert_eq!(c.min_latency_us().map(|m| m / MS), Some(5));
}

#[test]
fn no_traffic_changes_nothing_and_reloads_keep_what_was_learnt() {
    let mut c = Controller::new(settings(), 0);
    for t in 0..100 {
        assert_eq!(c.tick(t * 250 * MS), None);
    }
    assert_eq!(c.limit(), 10);
    run(&mut c, 64, 5_000, |_, _| {});
    let learnt = c.min_latency_us();
    c.reconfigure(ControllerSettings {
        max: 6,
        ..settings()
    });
    assert_eq!(c.limit(), 6);
    assert_eq!(c.min_latency_us(), learnt);
}

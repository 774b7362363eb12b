//! The upstream's adaptive limit drawn over time against the upstream's
//! capacity, on a simulated clock (`floodgate::protection::simulation`): a
//! fragile upstream serving 8 requests at a time at 20 ms, then 16, then 8
//! again, then three times slower, under 128 clients that never stop.
//!
//!   cargo run --release --example protection_curve
//!
//! Each row is half a second: C marks the upstream's capacity, * the limit,
//! and the bar the requests in flight (served and queued) on average.

use floodgate::protection::controller::{Controller, ControllerSettings};
use floodgate::protection::simulation::{run, Tick};

const COLUMNS: usize = 64;
const SCALE: f64 = 2.0; // requests in flight per column

fn main() {
    let settings = ControllerSettings {
        min: 1,
        max: 1_000,
        initial: 20,
        tolerance: 1.2,
        window_us: 250_000,
        probe_interval_us: 10_000_000,
    };
    let mut controller = Controller::new(settings, 0);
    let ticks = run(&mut controller, 128, 50_000, |t, upstream| {
        upstream.capacity = if (10_000..20_000).contains(&t) { 16 } else { 8 };
        upstream.latency_ms = if t >= 30_000 { 60 } else { 20 };
    });
    println!("window 250 ms, tolerance 1.2, a probe every 10 s; {SCALE} in flight a column");
    println!("  time  cap limit  in flight  served/s");
    for (row, half_second) in ticks.chunks(500).enumerate() {
        print_row(row, half_second);
    }
}

fn print_row(row: usize, ticks: &[Tick]) {
    let n = ticks.len() as f64;
    let in_flight = ticks.iter().map(|t| t.in_flight as f64).sum::<f64>() / n;
    let served = ticks.iter().map(|t| t.served).sum::<usize>() as f64 * 1_000.0 / n;
    let last = ticks.last().copied().unwrap_or_default();
    let column = |v: f64| ((v / SCALE).round() as usize).min(COLUMNS - 1);
    let mut line = vec![' '; COLUMNS];
    for cell in line.iter_mut().take(column(in_flight)) {
        *cell = '#';
    }
    line[column(last.capacity as f64)] = 'C';
    line[column(f64::from(last.limit))] = '*';
    println!(
        "{:5.1}s {:4} {:5} {:10.1} {:9.0}  |{}",
        row as f64 / 2.0,
        last.capacity,
        last.limit,
        in_flight,
        served,
        line.into_iter().collect::<String>()
    );
}

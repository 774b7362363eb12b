//! `floodgate simulate`: what a limit does to a pattern of arrivals, run
//! through the real algorithm code (the Rust twins) on a manual clock that
//! starts at a window boundary, drawn as an SVG chart with a text summary.

use std::fmt::Write;

use floodgate_algorithm::{Algorithm, AlgorithmError, Kind, MAX_SLIDING_LOG};

const SEC_US: u64 = 1_000_000;

/// The simulation's t = 0: a multiple of a week (so of a day, an hour and
/// a minute too), so every aligned window starts at 0.
const EPOCH_US: u64 = 2_976 * 7 * 86_400 * SEC_US;

/// Why a pattern cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("\"{0}\" is not a pattern part: use burst:N@Ts, steady:R/s@As-Bs or boundary:N@Ts")]
    Unknown(String),
    #[error("\"{0}\": {1}")]
    Bad(String, &'static str),
    #[error("the pattern has no arrivals")]
    Empty,
    #[error("more than {MAX_ARRIVALS} arrivals")]
    TooMany,
}

/// The most arrivals one simulation takes.
pub const MAX_ARRIVALS: usize = 1_000_000;

fn seconds(text: &str) -> Option<f64> {
    let number = text.strip_suffix('s').unwrap_or(text);
    number
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
}

fn to_us(seconds: f64) -> u64 {
    (seconds * SEC_US as f64).round() as u64
}

/// Arrival times in µs from t = 0, sorted: `burst:100@0s` (100 at 0 s),
/// `steady:5/s@0s-60s` (evenly spaced), `boundary:100@60s` (100 in the
/// last second before 60 s and 100 in the first from it), joined with
/// commas.
pub fn parse_pattern(pattern: &str) -> Result<Vec<u64>, PatternError> {
    let mut arrivals = Vec::new();
    for part in pattern.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = |why| PatternError::Bad(part.to_string(), why);
        let (kind, rest) = part
            .split_once(':')
            .ok_or_else(|| PatternError::Unknown(part.into()))?;
        let (amount, at) = rest
            .split_once('@')
            .ok_or_else(|| bad("needs @ and a time"))?;
        match kind {
            "burst" | "boundary" => {
                let n: usize = amount.parse().map_err(|_| bad("needs a whole number"))?;
                let at = seconds(at).ok_or_else(|| bad("needs a time like 60s"))?;
                if n > MAX_ARRIVALS {
                    return Err(PatternError::TooMany);
                }
                if kind == "burst" {
                    arrivals.extend(std::iter::repeat_n(to_us(at), n));
                } else {
                    if at < 1.0 {
                        return Err(bad("needs a time of at least 1s"));
                    }
                    let step = 1.0 / n.max(1) as f64;
                    for i in 0..n {
                        arrivals.push(to_us(at - 1.0 + i as f64 * step));
                        arrivals.push(to_us(at + i as f64 * step));
                    }
                }
            }
            "steady" => {
                let rate = amount
                    .strip_suffix("/s")
                    .and_then(|r| r.parse::<f64>().ok())
                    .filter(|r| r.is_finite() && *r > 0.0)
                    .ok_or_else(|| bad("needs a rate like 5/s"))?;
                let (from, to) = at
                    .split_once('-')
                    .ok_or_else(|| bad("needs a span like 0s-60s"))?;
                let (from, to) = match (seconds(from), seconds(to)) {
                    (Some(a), Some(b)) if b > a => (a, b),
                    _ => return Err(bad("needs a span like 0s-60s")),
                };
                let count = ((to - from) * rate).floor() as usize;
                if count > MAX_ARRIVALS {
                    return Err(PatternError::TooMany);
                }
                arrivals.extend((0..count).map(|i| to_us(from + i as f64 / rate)));
            }
            _ => return Err(PatternError::Unknown(part.into())),
        }
        if arrivals.len() > MAX_ARRIVALS {
            return Err(PatternError::TooMany);
        }
    }
    sorted(arrivals)
}

/// Arrivals in time order, when there are any.
fn sorted(mut arrivals: Vec<u64>) -> Result<Vec<u64>, PatternError> {
    if arrivals.is_empty() {
        return Err(PatternError::Empty);
    }
    arrivals.sort_unstable();
    Ok(arrivals)
}

/// Arrival times from a file: seconds, one per line (blank lines and `#`
/// comments skipped).
pub fn parse_arrivals(text: &str) -> Result<Vec<u64>, PatternError> {
    let mut arrivals = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = seconds(line)
            .ok_or_else(|| PatternError::Bad(line.into(), "is not a time in seconds"))?;
        arrivals.push(to_us(at));
        if arrivals.len() > MAX_ARRIVALS {
            return Err(PatternError::TooMany);
        }
    }
    sorted(arrivals)
}

/// What happened to each arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub at_us: u64,
    pub admitted: bool,
    /// A leaky bucket's wait before the request leaves.
    pub wait_us: u64,
}

/// One run of an algorithm over the arrivals.
#[derive(Debug, Clone)]
pub struct Run {
    pub algorithm: Algorithm,
    pub outcomes: Vec<Outcome>,
}

impl Run {
    pub fn admitted(&self) -> usize {
        self.outcomes.iter().filter(|o| o.admitted).count()
    }

    pub fn refused(&self) -> usize {
        self.outcomes.len() - self.admitted()
    }

    pub fn longest_wait_us(&self) -> u64 {
        self.outcomes.iter().map(|o| o.wait_us).max().unwrap_or(0)
    }

    /// The most admitted in any span of the limit's window (sliding, not
    /// aligned): what a client can get through in the worst window.
    pub fn most_in_any_window(&self) -> usize {
        self.busiest_window().map_or(0, |w| w.admitted)
    }

    /// Where `most_in_any_window` happened: the first such span, from its
    /// first admitted request.
    pub fn busiest_window(&self) -> Option<BusiestWindow> {
        let window = self.algorithm.window_us().max(1);
        let admitted: Vec<u64> = self
            .outcomes
            .iter()
            .filter(|o| o.admitted)
            .map(|o| o.at_us + o.wait_us)
            .collect();
        let mut busiest: Option<BusiestWindow> = None;
        let mut start = 0;
        for end in 0..admitted.len() {
            while admitted[end] - admitted[start] >= window {
                start += 1;
            }
            let count = end - start + 1;
            if busiest.is_none_or(|b| count > b.admitted) {
                busiest = Some(BusiestWindow {
                    from_us: admitted[start],
                    to_us: admitted[start] + window,
                    admitted: count,
                });
            }
        }
        busiest
    }

    /// `admitted: N, refused: M` first, then the rest.
    pub fn summary(&self) -> String {
        format!(
            "admitted: {}, refused: {}\nlongest wait: {} ms\nmost admitted in any {}: {}\n",
            self.admitted(),
            self.refused(),
            self.longest_wait_us().div_ceil(1000),
            window_text(self.algorithm.window_us()),
            self.most_in_any_window()
        )
    }
}

/// One window's span (µs from the pattern's t = 0) and what it admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusiestWindow {
    pub from_us: u64,
    pub to_us: u64,
    pub admitted: usize,
}

/// What the chart's time axis covers (`--span`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Span {
    /// From the first arrival to the last: where the arrivals are.
    #[default]
    Arrivals,
    /// From the pattern's t = 0 to the last arrival.
    Whole,
}

fn window_text(us: u64) -> String {
    let ms = us / 1000;
    match ms {
        0 => format!("{us}µs"),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// Runs `algorithm` over `arrivals` (µs from t = 0), one key, cost 1 each.
pub fn simulate(algorithm: Algorithm, arrivals: &[u64]) -> Run {
    let mut state = algorithm.fresh_state();
    let outcomes = arrivals
        .iter()
        .map(|&at_us| {
            let evaluation = algorithm.evaluate(&state, EPOCH_US + at_us, 1);
            let admitted = evaluation.decision.allowed();
            if admitted {
                state.apply(&evaluation.update);
            }
            Outcome {
                at_us,
                admitted,
                wait_us: evaluation.decision.delay_us(),
            }
        })
        .collect();
    Run {
        algorithm,
        outcomes,
    }
}

/// `algorithm`'s numbers in another algorithm's terms: the same quota over
/// the same window (a bucket refills it in that window).
pub fn translate(algorithm: &Algorithm, to: Kind) -> Result<Algorithm, AlgorithmError> {
    let quota = algorithm.quota();
    let window_us = algorithm.window_us();
    let interval_us = (window_us / quota).max(1);
    match to {
        Kind::TokenBucket => Algorithm::token_bucket(quota, interval_us),
        Kind::LeakyBucket => Algorithm::leaky_bucket(quota, interval_us),
        Kind::FixedWindow => Algorithm::fixed_window(quota, window_us),
        Kind::SlidingWindow => Algorithm::sliding_window(quota, window_us),
        Kind::SlidingLog => Algorithm::sliding_log(quota.min(MAX_SLIDING_LOG), window_us),
        Kind::Quota => match algorithm.calendar() {
            Some(calendar) => Algorithm::calendar_quota(quota, *calendar),
            None => Err(AlgorithmError::NeedsCalendar),
        },
    }
}

/// The chart's geometry, in pixels: the plot's width, one run's row, the
/// room left of the plot for a row's labels and above it for the legend.
const WIDTH: f64 = 900.0;
const ROW: f64 = 160.0;
const LEFT: f64 = 310.0;
const TOP: f64 = 34.0;
/// The most bars a row has.
const SLICES: usize = 120;
const BUSIEST: &str = "#e0a100";

/// The chart: per time slice, arrivals admitted (green) and refused (red)
/// stacked, one row per run, on a shared time axis that spans the arrivals
/// (not the time before them, unless `span` is `Whole`), with each row's
/// count scale, the window's edges dashed, the busiest window shaded and a
/// legend. Bars stand at arrival; the busiest window is counted in the time
/// requests were admitted, later than their bars for a leaky bucket's held
/// ones.
pub fn svg(runs: &[Run], span: Span) -> String {
    let axis = Axis::of(runs, span);
    let height = TOP + ROW * runs.len() as f64 + 44.0;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="12">"#,
        WIDTH + LEFT + 30.0
    );
    legend(&mut out, &axis);
    for (row, run) in runs.iter().enumerate() {
        let top = TOP + row as f64 * ROW;
        run_row(&mut out, &axis, run, top);
    }
    time_axis(&mut out, &axis, TOP + ROW * runs.len() as f64 + 4.0);
    out.push_str("</svg>\n");
    out
}

/// The shared time axis: where it starts and how it is sliced into bars.
struct Axis {
    start_us: u64,
    slice_us: u64,
    slices: usize,
    span_us: u64,
}

impl Axis {
    fn of(runs: &[Run], span: Span) -> Axis {
        let first = |r: &Run| r.outcomes.first().map(|o| o.at_us);
        let last = |r: &Run| r.outcomes.last().map(|o| o.at_us);
        let start_us = match span {
            Span::Arrivals => runs.iter().filter_map(first).min().unwrap_or(0),
            Span::Whole => 0,
        };
        let last_us = runs.iter().filter_map(last).max().unwrap_or(0);
        // A burst at one instant still gets a second of axis to stand in.
        let arrivals_span_us = (last_us - start_us + 1).max(SEC_US);
        // A round slice (1, 2 or 5 times a power of ten) holds evenly spaced
        // arrivals evenly, where an odd one would draw a comb.
        let slice_us = round_up_to_1_2_5(arrivals_span_us.div_ceil(SLICES as u64));
        let slices = (arrivals_span_us.div_ceil(slice_us) as usize).clamp(1, SLICES);
        Axis {
            start_us,
            slice_us,
            slices,
            span_us: slice_us * slices as u64,
        }
    }

    /// The busiest window runs on past the last arrival when its window is
    /// longer, or a leaky bucket admitted held requests later: it stops at
    /// the axis's end.
    fn x_of(&self, at_us: u64) -> f64 {
        let along = (at_us.saturating_sub(self.start_us)).min(self.span_us);
        LEFT + WIDTH * along as f64 / self.span_us as f64
    }

    /// Per slice, the arrivals `run` admitted and those it refused.
    fn counts(&self, run: &Run) -> ([usize; SLICES], [usize; SLICES]) {
        let mut admitted = [0usize; SLICES];
        let mut refused = [0usize; SLICES];
        for o in &run.outcomes {
            let slice = ((o.at_us.saturating_sub(self.start_us) / self.slice_us) as usize)
                .min(self.slices - 1);
            if o.admitted {
                admitted[slice] += 1;
            } else {
                refused[slice] += 1;
            }
        }
        (admitted, refused)
    }
}

fn legend(out: &mut String, axis: &Axis) {
    let _ = write!(
        out,
        r##"<rect x="{LEFT}" y="8" width="12" height="12" fill="#2e9d4f"/><text x="{}" y="18">admitted</text><rect x="{}" y="8" width="12" height="12" fill="#d0453a"/><text x="{}" y="18">refused</text><line x1="{}" y1="14" x2="{}" y2="14" stroke="#555" stroke-dasharray="4 3"/><text x="{}" y="18">a window's edge</text><rect x="{}" y="8" width="12" height="12" fill="{BUSIEST}" fill-opacity="0.35" stroke="{BUSIEST}"/><text x="{}" y="18">the most admitted in any window</text><text x="{}" y="18" text-anchor="end">arrivals per {}</text>"##,
        LEFT + 16.0,
        LEFT + 90.0,
        LEFT + 106.0,
        LEFT + 170.0,
        LEFT + 194.0,
        LEFT + 200.0,
        LEFT + 300.0,
        LEFT + 316.0,
        LEFT + WIDTH,
        duration_text(axis.slice_us)
    );
}

/// One run's row, from `top` down: its name and totals, the busiest
/// window, its count scale, its bars and its windows' edges.
fn run_row(out: &mut String, axis: &Axis, run: &Run, top: f64) {
    let (admitted, refused) = axis.counts(run);
    let base = top + ROW - 30.0;
    let tallest = (0..axis.slices)
        .map(|i| admitted[i] + refused[i])
        .max()
        .unwrap_or(1)
        .max(1);
    let scale = (ROW - 50.0) / tallest as f64;
    let _ = write!(
        out,
        r#"<text x="10" y="{}">{}</text><text x="10" y="{}">admitted {} refused {}</text>"#,
        top + 20.0,
        escape(&run.algorithm.to_string().replace(' ', "\u{a0}")),
        top + 38.0,
        run.admitted(),
        run.refused()
    );
    // Shaded under the bars, so that what it holds stays readable.
    busiest_window(out, axis, run, top, base);
    // The count scale: 0 at the axis, the fullest slice at the top.
    let _ = write!(
        out,
        r##"<line x1="{LEFT}" y1="{}" x2="{LEFT}" y2="{base}" stroke="black"/><text x="{}" y="{}" text-anchor="end">{tallest}</text><text x="{}" y="{base}" text-anchor="end">0</text>"##,
        base - tallest as f64 * scale,
        LEFT - 4.0,
        base - tallest as f64 * scale + 4.0,
        LEFT - 4.0,
    );
    let bar = WIDTH / axis.slices as f64;
    for i in 0..axis.slices {
        let x = LEFT + i as f64 * bar;
        let a = admitted[i] as f64 * scale;
        let r = refused[i] as f64 * scale;
        if a > 0.0 {
            let _ = write!(
                out,
                r##"<rect x="{x:.1}" y="{:.1}" width="{bar:.1}" height="{a:.1}" fill="#2e9d4f"/>"##,
                base - a
            );
        }
        if r > 0.0 {
            let _ = write!(
                out,
                r##"<rect x="{x:.1}" y="{:.1}" width="{bar:.1}" height="{r:.1}" fill="#d0453a"/>"##,
                base - a - r
            );
        }
    }
    window_edges(out, axis, run, top, base);
    let _ = write!(
        out,
        r#"<line x1="{LEFT}" y1="{base}" x2="{}" y2="{base}" stroke="black"/>"#,
        LEFT + WIDTH
    );
}

fn busiest_window(out: &mut String, axis: &Axis, run: &Run, top: f64, base: f64) {
    let Some(busiest) = run.busiest_window() else {
        return;
    };
    let (from, to) = (axis.x_of(busiest.from_us), axis.x_of(busiest.to_us));
    let (anchor, label_x) = if from > LEFT + WIDTH * 0.6 {
        ("end", to.max(from + 1.0) - 4.0)
    } else {
        ("start", from + 4.0)
    };
    let _ = write!(
        out,
        r##"<rect x="{from:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{BUSIEST}" fill-opacity="0.2" stroke="{BUSIEST}"/><text x="{label_x:.1}" y="{:.1}" text-anchor="{anchor}">{} admitted in any {}</text>"##,
        top + 4.0,
        (to - from).max(1.0),
        base - top - 4.0,
        top + 16.0,
        busiest.admitted,
        window_text(run.algorithm.window_us())
    );
}

/// Where a fixed window turns over (t = 0 is aligned to every window).
fn window_edges(out: &mut String, axis: &Axis, run: &Run, top: f64, base: f64) {
    let window_us = run.algorithm.window_us().max(1);
    let mut edge_us = axis.start_us.div_ceil(window_us) * window_us;
    for _ in 0..SLICES {
        if edge_us > axis.start_us + axis.span_us {
            break;
        }
        let x = axis.x_of(edge_us);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{base}" stroke="#555" stroke-dasharray="4 3"/>"##,
            top + 4.0
        );
        edge_us += window_us;
    }
}

/// The time axis under the rows, at `y`: five ticks and what it measures.
fn time_axis(out: &mut String, axis: &Axis, y: f64) {
    let span_s = axis.span_us as f64 / SEC_US as f64;
    let decimals = if span_s >= 20.0 { 0 } else { 1 };
    for tick in 0..=4 {
        let at_us = axis.start_us + axis.span_us * tick / 4;
        let x = axis.x_of(at_us);
        let anchor = match tick {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        let _ = write!(
            out,
            r#"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="black"/><text x="{x:.1}" y="{}" text-anchor="{anchor}">{:.decimals$}s</text>"#,
            y - 4.0,
            y + 2.0,
            y + 16.0,
            at_us as f64 / SEC_US as f64
        );
    }
    let _ = write!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">time since the pattern's t = 0</text>"#,
        LEFT + WIDTH / 2.0,
        y + 34.0
    );
}

/// The smallest of 1, 2 and 5 times a power of ten that is at least `us`.
fn round_up_to_1_2_5(us: u64) -> u64 {
    let mut decade = 1u64;
    loop {
        for step in [1, 2, 5] {
            let round = decade.saturating_mul(step);
            if round >= us {
                return round;
            }
        }
        decade = decade.saturating_mul(10);
    }
}

/// A slice's length for the legend: "20 ms", "2 s" (slices are round).
fn duration_text(us: u64) -> String {
    if us >= SEC_US {
        format!("{} s", us as f64 / SEC_US as f64)
    } else if us >= 1_000 {
        format!("{} ms", us as f64 / 1_000.0)
    } else {
        format!("{us} µs")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests;

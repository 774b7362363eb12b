use super::*;

#[test]
fn the_chart_spans_the_arrivals_and_says_what_it_shows() {
    let arrivals = parse_pattern("boundary:100@60s").expect("a pattern");
    let fixed = Algorithm::fixed_window(100, 60 * SEC_US).expect("valid");
    let run = simulate(fixed, &arrivals);
    let chart = svg(std::slice::from_ref(&run), Span::Arrivals);
    // The axis runs from the first arrival (59 s) to the last (just
    // under 61 s), both labels anchored inside the picture.
    assert!(
        chart.contains(r#"text-anchor="start">59.0s</text>"#),
        "{chart}"
    );
    assert!(
        chart.contains(r#"text-anchor="end">61.0s</text>"#),
        "{chart}"
    );
    for words in [
        "admitted",
        "refused",
        "a window's edge",
        "arrivals per 20 ms",
    ] {
        assert!(chart.contains(words), "{words}: {chart}");
    }
    // The window's edge at 60 s: half way along an axis of 100 slices of
    // 20 ms, drawn 900 px wide from x = 310.
    assert!(chart.contains(r#"<line x1="760.0""#), "{chart}");
    // The counts: 0 and the fullest slice (every 20 ms slice holds two
    // of the arrivals 10 ms apart).
    assert!(chart.contains(r#"text-anchor="end">2</text>"#), "{chart}");
    // The bars fill the axis from its left end, not its last 3 %.
    assert!(chart.contains(r#"<rect x="310.0""#), "{chart}");
    // The busiest window: all 200 within one minute, shaded from the
    // first (the axis's left end) and labelled.
    assert_eq!(
        run.busiest_window(),
        Some(BusiestWindow {
            from_us: 59 * SEC_US,
            to_us: 119 * SEC_US,
            admitted: 200
        })
    );
    assert!(chart.contains("200 admitted in any 1m</text>"), "{chart}");
    assert!(
        chart.contains(r##"<rect x="310.0" y="38.0" width="900.0""##),
        "{chart}"
    );
    assert!(chart.contains("the most admitted in any window"), "{chart}");
    assert_eq!(round_up_to_1_2_5(16_584), 20_000);
    assert_eq!(round_up_to_1_2_5(1), 1);
    assert_eq!(round_up_to_1_2_5(3), 5);
    assert_eq!(round_up_to_1_2_5(501), 1_000);
}

#[test]
fn the_whole_span_starts_at_t_0_and_the_mark_is_where_the_most_got_through() {
    // 5 a second for 30 s, then a burst of 50 at 40 s, limited to 60 in
    // a minute: the busiest minute is the one that ends with the burst.
    let arrivals = parse_pattern("steady:5/s@0s-30s, burst:50@40s").expect("a pattern");
    let log = Algorithm::sliding_log(60, 60 * SEC_US).expect("valid");
    let run = simulate(log, &arrivals);
    let chart = svg(std::slice::from_ref(&run), Span::Whole);
    assert!(
        chart.contains(r#"text-anchor="start">0s</text>"#),
        "{chart}"
    );
    let busiest = run.busiest_window().expect("admitted some");
    assert_eq!(busiest.admitted, 60, "exact: never more than the limit");
    assert_eq!(busiest.from_us, 0, "the first 60 of the steady arrivals");
    assert!(chart.contains("60 admitted in any 1m</text>"), "{chart}");
    let arrivals_only = svg(std::slice::from_ref(&run), Span::Arrivals);
    assert_eq!(arrivals_only, chart, "here the arrivals start at t = 0");
    let late = parse_pattern("burst:3@10s").expect("a pattern");
    let late = simulate(log, &late);
    let whole = svg(std::slice::from_ref(&late), Span::Whole);
    assert!(
        whole.contains(r#"text-anchor="start">0.0s</text>"#),
        "{whole}"
    );
    let zoomed = svg(std::slice::from_ref(&late), Span::Arrivals);
    assert!(
        zoomed.contains(r#"text-anchor="start">10.0s</text>"#),
        "{zoomed}"
    );
    use clap::ValueEnum;
    assert_eq!(Span::from_str("whole", false), Ok(Span::Whole));
    assert_eq!(Span::from_str("arrivals", false), Ok(Span::Arrivals));
    assert!(Span::from_str("all", false).is_err());
}

#[test]
fn patterns_read_as_documented() {
    assert_eq!(parse_pattern("burst:3@2s").unwrap(), vec![2_000_000; 3]);
    assert_eq!(
        parse_pattern("steady:2/s@0s-2s").unwrap(),
        vec![0, 500_000, 1_000_000, 1_500_000]
    );
    let boundary = parse_pattern("boundary:2@60s").unwrap();
    assert_eq!(
        boundary,
        vec![59_000_000, 59_500_000, 60_000_000, 60_500_000]
    );
    assert_eq!(
        parse_pattern("burst:1@1s, burst:1@0s").unwrap(),
        vec![0, 1_000_000]
    );
    assert!(matches!(
        parse_pattern("wave:3@1s"),
        Err(PatternError::Unknown(_))
    ));
    assert!(matches!(
        parse_pattern("steady:5@0s-1s"),
        Err(PatternError::Bad(..))
    ));
    assert_eq!(parse_pattern(""), Err(PatternError::Empty));
    assert_eq!(parse_arrivals("# t\n0.5\n0\n").unwrap(), vec![0, 500_000]);
}

#[test]
fn a_fixed_window_admits_twice_its_limit_across_a_boundary() {
    let arrivals = parse_pattern("boundary:100@60s").unwrap();
    let fixed = Algorithm::fixed_window(100, 60 * SEC_US).unwrap();
    let run = simulate(fixed, &arrivals);
    assert_eq!((run.admitted(), run.refused()), (200, 0));
    assert_eq!(run.most_in_any_window(), 200);
    let sliding = simulate(translate(&fixed, Kind::SlidingWindow).unwrap(), &arrivals);
    assert!(sliding.admitted() < 200, "{}", sliding.admitted());
    let log = simulate(translate(&fixed, Kind::SlidingLog).unwrap(), &arrivals);
    assert_eq!(log.most_in_any_window(), 100, "exact");
    let leaky = simulate(translate(&fixed, Kind::LeakyBucket).unwrap(), &arrivals);
    assert!(leaky.longest_wait_us() > 0, "a leaky bucket holds requests");
}

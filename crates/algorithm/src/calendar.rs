//! Calendar periods (a day, a week, a month) in a time zone: where the one
//! containing an instant ends. A month has its real length and a day its
//! real hours (23 or 25 across a DST change), because each boundary is a
//! local midnight converted to an instant through the zone's rules.

use std::cell::Cell;

use chrono::{DateTime, Datelike, Days, Months, NaiveDate, NaiveDateTime, TimeZone, Utc, Weekday};
use chrono_tz::Tz;

/// How long a calendar quota's period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// From one local midnight to the next (23 to 25 hours).
    Day,
    /// Seven local days, from midnight on the calendar's `week_starts`.
    Week,
    /// From the first of a month's local midnight to the next month's.
    Month,
}

impl Period {
    /// The names the config gives periods (`period = "day"`), in the
    /// enum's order.
    pub const NAMES: [&'static str; 3] = ["day", "week", "month"];

    /// The period a config name (one of `NAMES`) means; none for any other.
    pub fn from_name(name: &str) -> Option<Period> {
        match name {
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    /// The name the config gives it (`"day"`, `"week"`, `"month"`).
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// Its usual length, for `RateLimit-Policy`'s `w=` (a month: 30 days).
    pub fn nominal_us(self) -> u64 {
        const DAY_US: u64 = 86_400_000_000;
        match self {
            Period::Day => DAY_US,
            Period::Week => 7 * DAY_US,
            Period::Month => 30 * DAY_US,
        }
    }
}

/// A period in a zone; weeks start on `week_starts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    /// How long each period lasts: a day, a week or a month.
    pub period: Period,
    /// The zone whose local midnights bound the periods.
    pub timezone: Tz,
    /// The day a week period starts on (unused by days and months).
    pub week_starts: Weekday,
}

/// Longer than any gap a zone's rules have made in local time (Samoa
/// skipped a whole day in 2011): a boundary is found within it.
const GAP_SEARCH_HOURS: i64 = 48;

impl Calendar {
    /// The instant (µs since the epoch) at which the period containing
    /// `now_us` ends: the next period's first local midnight, or the first
    /// instant after it when the zone skips midnight that day.
    pub fn period_end_us(&self, now_us: u64) -> u64 {
        // Reading the zone's rules costs some 250 ns; a thread answers most
        // requests in the period it answered the last one in.
        thread_local! {
            static LAST: Cell<Option<(Calendar, u64, u64)>> = const { Cell::new(None) };
        }
        if let Some((calendar, from_us, end_us)) = LAST.get() {
            if calendar == *self && (from_us..end_us).contains(&now_us) {
                return end_us;
            }
        }
        let end_us = self.compute_period_end_us(now_us);
        LAST.set(Some((*self, now_us, end_us)));
        end_us
    }

    fn compute_period_end_us(&self, now_us: u64) -> u64 {
        let now = i64::try_from(now_us)
            .ok()
            .and_then(DateTime::<Utc>::from_timestamp_micros)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        let today = now.with_timezone(&self.timezone).date_naive();
        let next = match self.period {
            Period::Day => today.checked_add_days(Days::new(1)),
            Period::Week => {
                let into_week = today.weekday().days_since(self.week_starts);
                today.checked_add_days(Days::new(7 - u64::from(into_week)))
            }
            Period::Month => NaiveDate::from_ymd_opt(today.year(), today.month(), 1)
                .and_then(|first| first.checked_add_months(Months::new(1))),
        };
        next.and_then(|day| self.first_instant_of(day))
            .map_or(u64::MAX, |t| {
                u64::try_from(t.timestamp_micros()).unwrap_or(0)
            })
    }

    /// Local midnight of `day`, or the first local time of that day the
    /// zone has; the earlier of two when midnight happens twice.
    fn first_instant_of(&self, day: NaiveDate) -> Option<DateTime<Tz>> {
        let midnight: NaiveDateTime = day.and_hms_opt(0, 0, 0)?;
        (0..=GAP_SEARCH_HOURS * 4).find_map(|quarter| {
            let local = midnight + chrono::Duration::minutes(15 * quarter);
            self.timezone.from_local_datetime(&local).earliest()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(rfc3339: &str) -> u64 {
        DateTime::parse_from_rfc3339(rfc3339)
            .expect("a test instant")
            .timestamp_micros() as u64
    }

    fn calendar(period: Period, zone: &str) -> Calendar {
        Calendar {
            period,
            timezone: zone.parse().expect("a zone"),
            week_starts: Weekday::Mon,
        }
    }

    #[test]
    fn a_period_is_read_from_its_name_and_has_a_nominal_length() {
        const DAY_US: u64 = 86_400_000_000;
        for (name, period, days) in [
            ("day", Period::Day, 1),
            ("week", Period::Week, 7),
            ("month", Period::Month, 30),
        ] {
            assert_eq!(Period::from_name(name), Some(period));
            assert_eq!(period.name(), name);
            assert_eq!(period.nominal_us(), days * DAY_US);
        }
        assert_eq!(
            Period::NAMES
                .map(Period::from_name)
                .map(|p| p.map(Period::name)),
            Period::NAMES.map(Some)
        );
        assert_eq!(Period::from_name("year"), None);
        assert_eq!(Period::from_name("Day"), None);
    }

    #[test]
    fn months_end_at_their_real_length() {
        let utc = calendar(Period::Month, "UTC");
        // January has 31 days, February 2027 28, February 2028 29.
        assert_eq!(
            utc.period_end_us(us("2027-01-01T00:00:00Z")),
            us("2027-02-01T00:00:00Z")
        );
        assert_eq!(
            utc.period_end_us(us("2027-01-31T23:59:59.999999Z")),
            us("2027-02-01T00:00:00Z")
        );
        assert_eq!(
            utc.period_end_us(us("2027-02-01T00:00:00Z")),
            us("2027-03-01T00:00:00Z")
        );
        assert_eq!(
            utc.period_end_us(us("2028-02-15T12:00:00Z")),
            us("2028-03-01T00:00:00Z")
        );
        assert_eq!(
            utc.period_end_us(us("2027-12-31T10:00:00Z")),
            us("2028-01-01T00:00:00Z")
        );
    }

    #[test]
    fn a_zones_midnight_is_the_boundary_across_dst() {
        let paris = calendar(Period::Month, "Europe/Paris");
        // March 2027 in Paris: 31 days, one of them 23 hours long (DST
        // begins on the 28th), from 23:00 UTC on Feb 28 to 22:00 UTC on
        // Mar 31.
        let end = paris.period_end_us(us("2027-03-01T00:00:00+01:00"));
        assert_eq!(end, us("2027-04-01T00:00:00+02:00"));
        assert_eq!(
            end - us("2027-03-01T00:00:00+01:00"),
            (31 * 24 - 1) * 3_600_000_000
        );
        // The last microsecond of February, Paris time, is still February.
        assert_eq!(
            paris.period_end_us(us("2027-02-28T22:59:59.999999Z")),
            us("2027-02-28T23:00:00Z")
        );
        // October: the day DST ends has 25 hours.
        let day = calendar(Period::Day, "Europe/Paris");
        let start = us("2027-10-31T00:00:00+02:00");
        assert_eq!(day.period_end_us(start) - start, 25 * 3_600_000_000);
        assert_eq!(
            day.period_end_us(us("2027-03-28T12:00:00+02:00")) - us("2027-03-28T00:00:00+01:00"),
            23 * 3_600_000_000
        );
    }

    #[test]
    fn weeks_start_on_the_configured_day() {
        // 2027-03-03 is a Wednesday.
        let mut week = calendar(Period::Week, "UTC");
        assert_eq!(
            week.period_end_us(us("2027-03-03T08:00:00Z")),
            us("2027-03-08T00:00:00Z")
        );
        week.week_starts = Weekday::Sun;
        assert_eq!(
            week.period_end_us(us("2027-03-03T08:00:00Z")),
            us("2027-03-07T00:00:00Z")
        );
        // On the first day of the week, the week ends seven days later.
        assert_eq!(
            week.period_end_us(us("2027-03-07T00:00:00Z")),
            us("2027-03-14T00:00:00Z")
        );
    }

    #[test]
    fn a_skipped_midnight_ends_the_period_at_the_days_first_instant() {
        // Santiago moved its clocks from 00:00 to 01:00 on 2022-09-11:
        // that day began at 01:00 local (04:00 UTC).
        let santiago = calendar(Period::Day, "America/Santiago");
        assert_eq!(
            santiago.period_end_us(us("2022-09-10T12:00:00-04:00")),
            us("2022-09-11T01:00:00-03:00")
        );
        // Samoa skipped 2011-12-30 entirely: the 29th ended at the 31st.
        let apia = calendar(Period::Day, "Pacific/Apia");
        assert_eq!(
            apia.period_end_us(us("2011-12-29T12:00:00-10:00")),
            us("2011-12-31T00:00:00+14:00")
        );
    }
}

//! When a periodic automation's occurrences are: a cron `expression` read in an IANA
//! `timezone`. Parsing and the search are croner's (Vixie cron's fields, OCPS's rules
//! for daylight-saving changes: a time skipped by a spring-forward gap runs at the first
//! instant after it, a time repeated by a fall-back overlap runs once); time zones come
//! from the IANA database bundled into the binary by jiff, so a slim image without
//! `/usr/share/zoneinfo` schedules the same as a full one.
//!
//! Beyond the SDK's five fields, a leading seconds field is accepted (six fields), which
//! lets a schedule run more often than once a minute; years are not.

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::Timestamp;

/// A checked schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    cron: Cron,
    zone: TimeZone,
}

/// Why an expression or a time zone was refused: the field, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub param: &'static str,
    pub message: String,
}

impl Schedule {
    pub fn parse(expression: &str, timezone: &str) -> Result<Schedule, Refused> {
        let zone = zone(timezone)?;
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        let cron = parser.parse(expression).map_err(|e| Refused {
            param: "expression",
            message: format!(
                "expression '{expression}' is not a cron expression ({e}): give five fields, minute hour day-of-month month day-of-week, such as \"0 9 * * 1-5\"."
            ),
        })?;
        let schedule = Schedule { cron, zone };
        // "0 0 30 2 *" parses, and never comes.
        if schedule.next_after(now()).is_none() {
            return Err(Refused {
                param: "expression",
                message: format!(
                    "expression '{expression}' has no occurrence in the years to come (a day that never exists, such as February 30th)."
                ),
            });
        }
        Ok(schedule)
    }

    /// The first occurrence strictly after `unix` (seconds), if any.
    pub fn next_after(&self, unix: i64) -> Option<i64> {
        let start = Timestamp::from_second(unix)
            .ok()?
            .to_zoned(self.zone.clone());
        let next = self.cron.find_next_occurrence(&start, false).ok()?;
        Some(next.timestamp().as_second())
    }
}

/// The IANA time zone `name` (`UTC`, `Europe/Paris`), from the bundled database.
pub fn zone(name: &str) -> Result<TimeZone, Refused> {
    if name.trim().is_empty() {
        return Err(Refused {
            param: "timezone",
            message: "timezone is required: an IANA time zone name such as \"UTC\" or \"America/New_York\".".into(),
        });
    }
    jiff::tz::db().get(name).map_err(|_| Refused {
        param: "timezone",
        message: format!(
            "timezone '{name}' is not an IANA time zone name: use one such as \"UTC\", \"Europe/Paris\" or \"America/New_York\"."
        ),
    })
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_second()
    }

    #[test]
    fn the_next_occurrence_is_read_in_the_time_zone() {
        let nine = Schedule::parse("0 9 * * *", "America/New_York").unwrap();
        // 2026-01-15 12:00 UTC is 07:00 in New York (EST, -5): 09:00 EST is 14:00 UTC.
        assert_eq!(
            nine.next_after(at("2026-01-15T12:00:00Z")),
            Some(at("2026-01-15T14:00:00Z"))
        );
        // In July New York is on EDT (-4): 09:00 is 13:00 UTC.
        assert_eq!(
            nine.next_after(at("2026-07-15T12:00:00Z")),
            Some(at("2026-07-15T13:00:00Z"))
        );
        // Strictly after: an occurrence at the start is not the next one.
        assert_eq!(
            nine.next_after(at("2026-07-15T13:00:00Z")),
            Some(at("2026-07-16T13:00:00Z"))
        );
    }

    #[test]
    fn daylight_saving_changes_neither_skip_nor_repeat_a_day() {
        // 2026-03-08: New York springs forward at 02:00 (to 03:00); 02:30 does not exist
        // that day and runs at the first instant after the gap, 03:00 EDT (07:00 UTC).
        let half_past_two = Schedule::parse("30 2 * * *", "America/New_York").unwrap();
        assert_eq!(
            half_past_two.next_after(at("2026-03-08T05:00:00Z")),
            Some(at("2026-03-08T07:00:00Z"))
        );
        // 2026-11-01: 01:30 happens twice (EDT, then EST); it runs once.
        let half_past_one = Schedule::parse("30 1 * * *", "America/New_York").unwrap();
        let first = half_past_one
            .next_after(at("2026-11-01T04:00:00Z"))
            .unwrap();
        assert_eq!(first, at("2026-11-01T05:30:00Z"));
        let second = half_past_one.next_after(first).unwrap();
        assert_eq!(second, at("2026-11-02T06:30:00Z"));
    }

    #[test]
    fn five_fields_or_six_with_seconds() {
        let every_minute = Schedule::parse("* * * * *", "UTC").unwrap();
        assert_eq!(
            every_minute.next_after(at("2026-01-01T00:00:10Z")),
            Some(at("2026-01-01T00:01:00Z"))
        );
        let every_two_seconds = Schedule::parse("*/2 * * * * *", "UTC").unwrap();
        assert_eq!(
            every_two_seconds.next_after(at("2026-01-01T00:00:10Z")),
            Some(at("2026-01-01T00:00:12Z"))
        );
        assert_eq!(
            Schedule::parse("0 0 * * * * 2027", "UTC")
                .unwrap_err()
                .param,
            "expression"
        );
    }

    #[test]
    fn refusals_name_the_field() {
        for bad in ["", "every day", "61 * * * *", "* * *", "0 0 30 2 *"] {
            assert_eq!(
                Schedule::parse(bad, "UTC").unwrap_err().param,
                "expression",
                "{bad:?}"
            );
        }
        for bad in ["", "Mars/Olympus", "utc+25"] {
            assert_eq!(
                Schedule::parse("0 9 * * *", bad).unwrap_err().param,
                "timezone",
                "{bad:?}"
            );
        }
        assert!(Schedule::parse("0 9 * * MON-FRI", "Europe/Paris").is_ok());
        assert!(Schedule::parse("@daily", "Asia/Kolkata").is_ok());
    }
}

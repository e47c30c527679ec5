//! Timestamps without a date library: the HTTP `Date` header (IMF-fixdate, cached per
//! second per thread) and ISO 8601 UTC strings as Python's `isoformat()` writes them.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// (year, month, day) of the proleptic Gregorian calendar for days since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Howard Hinnant's algorithm: shift to an era starting in March so leap days fall last.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` for `secs` since the epoch.
pub fn http_date(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        DAYS[(days.rem_euclid(7)) as usize],
        d,
        MONTHS[(m - 1) as usize],
        y,
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// `2026-10-12T00:00:00+00:00` (with `.ffffff` when there are sub-second digits), as
/// Python's `datetime.fromtimestamp(t, timezone.utc).isoformat()` writes it.
pub fn iso8601_utc(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let micros = nanos / 1000;
    let fraction = if micros > 0 {
        format!(".{micros:06}")
    } else {
        String::new()
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{fraction}+00:00",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Appends the same text as [`iso8601_utc`] to `out`, without allocating.
pub fn push_iso8601_utc(out: &mut Vec<u8>, secs: i64, nanos: u32) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400) as u32;
    let (y, m, d) = civil_from_days(days);
    let two = |out: &mut Vec<u8>, v: u32| {
        out.extend_from_slice(&[b'0' + (v / 10) as u8, b'0' + (v % 10) as u8])
    };
    if (0..=9999).contains(&y) {
        let y = y as u32;
        two(out, y / 100);
        two(out, y % 100);
    } else {
        out.extend_from_slice(format!("{y:04}").as_bytes());
    }
    out.push(b'-');
    two(out, m);
    out.push(b'-');
    two(out, d);
    out.push(b'T');
    two(out, rem / 3600);
    out.push(b':');
    two(out, rem / 60 % 60);
    out.push(b':');
    two(out, rem % 60);
    let micros = nanos / 1000;
    if micros > 0 {
        out.push(b'.');
        let mut digits = [b'0'; 6];
        let mut v = micros;
        for slot in digits.iter_mut().rev() {
            *slot = b'0' + (v % 10) as u8;
            v /= 10;
        }
        out.extend_from_slice(&digits);
    }
    out.extend_from_slice(b"+00:00");
}

thread_local! {
    static DATE_CACHE: RefCell<(u64, Vec<u8>)> = const { RefCell::new((u64::MAX, Vec::new())) };
}

/// Calls `f` with the current `Date` header value, formatted at most once per second.
pub fn with_http_date<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    DATE_CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.0 != now {
            *cache = (now, http_date(now).into_bytes());
        }
        f(&cache.1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(iso8601_utc(1_760_227_200, 0), "2025-10-12T00:00:00+00:00");
        assert_eq!(
            iso8601_utc(951_782_400, 500_000_000),
            "2000-02-29T00:00:00.500000+00:00"
        );
        assert_eq!(iso8601_utc(-1, 0), "1969-12-31T23:59:59+00:00");
        for (secs, nanos) in [
            (0, 0),
            (951_782_400, 500_000_000),
            (1_760_227_200, 1_000),
            (-1, 999_999_999),
        ] {
            let mut out = Vec::new();
            push_iso8601_utc(&mut out, secs, nanos);
            assert_eq!(String::from_utf8(out).unwrap(), iso8601_utc(secs, nanos));
        }
    }
}

//! RFC 3339 timestamps to and from Unix time, without a date crate (the civil-calendar
//! arithmetic is a dozen lines). A wire format: envd's protojson `Timestamp`s and `/init`'s
//! `timestamp` (nanoseconds, in the agent), E2B's API times (milliseconds, in the daemon).

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// (year, month, day) of a day count since 1970-01-01 (civil_from_days).
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `2026-08-22T04:23:05` of Unix seconds.
fn date_time(secs: i64) -> String {
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    let (h, mi, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}")
}

/// `2026-08-22T04:23:05.123456789Z`, with 0, 3, 6 or 9 fraction digits as protojson writes.
pub fn format_nanos(secs: i64, nanos: u32) -> String {
    let frac = match nanos {
        0 => String::new(),
        n if n % 1_000_000 == 0 => format!(".{:03}", n / 1_000_000),
        n if n % 1_000 == 0 => format!(".{:06}", n / 1_000),
        n => format!(".{n:09}"),
    };
    format!("{}{frac}Z", date_time(secs))
}

/// Unix milliseconds as `2006-01-02T15:04:05.000Z` (always three fraction digits).
pub fn format_millis(ms: i64) -> String {
    format!(
        "{}.{:03}Z",
        date_time(ms.div_euclid(1000)),
        ms.rem_euclid(1000)
    )
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` into Unix nanoseconds (digits past the
/// ninth are dropped).
pub fn parse_nanos(text: &str) -> Option<i128> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(range)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos: i64 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = text.get(start..i)?;
        if digits.is_empty() {
            return None;
        }
        let mut padded: String = digits.chars().take(9).collect();
        while padded.len() < 9 {
            padded.push('0');
        }
        nanos = padded.parse().ok()?;
    }
    let offset_secs = match text.get(i..)? {
        "Z" | "z" => 0,
        off if off.len() == 6 && matches!(off.as_bytes()[0], b'+' | b'-') && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            let sign = if off.as_bytes()[0] == b'-' { -1 } else { 1 };
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_secs;
    Some(i128::from(secs) * 1_000_000_000 + i128::from(nanos))
}

/// [`parse_nanos`] in Unix milliseconds (the fraction past the third digit dropped).
pub fn parse_millis(text: &str) -> Option<i64> {
    i64::try_from(parse_nanos(text)?.div_euclid(1_000_000)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanos_round_trip_and_offsets() {
        assert_eq!(format_nanos(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_nanos(1_787_372_585, 5_000_000),
            "2026-08-22T04:23:05.005Z"
        );
        assert_eq!(
            parse_nanos("2026-08-22T04:23:05.005Z"),
            Some(1_787_372_585_005_000_000)
        );
        assert_eq!(
            parse_nanos("2026-08-22T06:23:05+02:00"),
            Some(1_787_372_585_000_000_000)
        );
        assert_eq!(parse_nanos("1969-12-31T23:59:59.5Z"), Some(-500_000_000));
        assert_eq!(format_nanos(-1, 0), "1969-12-31T23:59:59Z");
        for bad in [
            "",
            "2026-13-01T00:00:00Z",
            "2026-08-22T04:23:05",
            "2026-08-22T04:23:05.Z",
            "2026-08-22T06:23:05+02x00",
        ] {
            assert_eq!(parse_nanos(bad), None, "{bad}");
        }
    }

    #[test]
    fn millis_round_trip_and_offsets() {
        assert_eq!(format_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_millis(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(
            parse_millis("2000-02-29T00:00:00.123Z"),
            Some(951_782_400_123)
        );
        assert_eq!(
            parse_millis("2000-02-29T01:00:00+01:00"),
            Some(951_782_400_000)
        );
        assert_eq!(
            parse_millis("2000-02-29T00:00:00.5Z"),
            Some(951_782_400_500)
        );
        assert_eq!(
            parse_millis("2000-02-29T00:00:00.1239Z"),
            Some(951_782_400_123)
        );
        assert_eq!(parse_millis("2000-02-29"), None);
        assert_eq!(parse_millis("2000-13-29T00:00:00Z"), None);
        let now = 1_787_372_585_005;
        assert_eq!(parse_millis(&format_millis(now)), Some(now));
        assert_eq!(format_millis(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn civil_days_are_inverse() {
        for days in [-719_468, -1, 0, 59, 11_016, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}

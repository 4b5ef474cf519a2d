//! SQL text the engine's own callers write: string literals, the times users type for a
//! range (`7d`, an RFC 3339 time, a day), and the names they type (a tool, a version).

use chrono::{DateTime, Duration as ChronoDuration, NaiveDate, Utc};
use toolspan_schema::{Code, Envelope};

/// A SQL string literal: single quotes doubled (the dialect has no backslash escapes).
pub fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// `15m`, `1h`, `7d`, `2w`, `30s` before `now`; or RFC 3339; or a UTC day `YYYY-MM-DD`.
pub fn parse_time(name: &str, v: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, Envelope> {
    let v = v.trim();
    let bad = || {
        invalid(format!(
            "`{name}` must be a duration before now (30s, 15m, 1h, 7d, 2w) or a time \
             (2025-06-01T12:00:00Z, 2025-06-01), got {:?}",
            shorten(v)
        ))
    };
    if let Some(unit) = v.chars().last().filter(|c| c.is_ascii_alphabetic()) {
        let digits = &v[..v.len() - 1];
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            let n: i64 = digits.parse().map_err(|_| bad())?;
            let seconds = match unit {
                's' => Some(1),
                'm' => Some(60),
                'h' => Some(3_600),
                'd' => Some(86_400),
                'w' => Some(604_800),
                _ => None,
            }
            .ok_or_else(bad)?;
            let span = n
                .checked_mul(seconds)
                .filter(|s| *s <= 100 * 366 * 86_400)
                .ok_or_else(bad)?;
            return Ok(now - ChronoDuration::seconds(span));
        }
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(d) = NaiveDate::parse_from_str(v, "%Y-%m-%d") {
        if let Some(t) = d.and_hms_opt(0, 0, 0) {
            return Ok(t.and_utc());
        }
    }
    Err(bad())
}

/// The first 40 characters of a value a caller typed, for an error message.
pub fn shorten(v: &str) -> String {
    v.chars().take(40).collect()
}

/// The longest name a caller may give (a tool, service, version or error code).
pub const MAX_NAME: usize = 256;

/// A name a caller typed (`what` names the field): not blank, at most [`MAX_NAME`]
/// characters, no control characters; else `invalid_argument` saying so.
pub fn check_name(what: &str, v: &str) -> Result<(), Envelope> {
    if v.trim().is_empty() {
        return Err(invalid(format!("`{what}` must not be empty")));
    }
    if v.chars().count() > MAX_NAME || v.chars().any(char::is_control) {
        return Err(invalid(format!(
            "`{what}` must be at most {MAX_NAME} characters without control characters"
        )));
    }
    Ok(())
}

/// `invalid_argument` with `message` for the caller and the log alike.
pub(crate) fn invalid(message: String) -> Envelope {
    Envelope::new(Code::InvalidArgument, message.clone(), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2025-06-01T12:00:00Z")
            .expect("valid time")
            .with_timezone(&Utc)
    }

    #[test]
    fn times_parse_in_every_form() {
        let n = now();
        assert_eq!(
            parse_time("since", "15m", n).ok(),
            Some(n - ChronoDuration::minutes(15))
        );
        assert_eq!(
            parse_time("since", "2w", n).ok(),
            Some(n - ChronoDuration::weeks(2))
        );
        assert_eq!(
            parse_time("since", "2025-05-31T10:00:00+02:00", n)
                .ok()
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)),
            Some("2025-05-31T08:00:00.000000000Z".to_string())
        );
        assert_eq!(
            parse_time("since", "2025-05-31", n)
                .ok()
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)),
            Some("2025-05-31T00:00:00.000000000Z".to_string())
        );
    }
}

//! The search page's typed filters: a duration bound (`> 1 s`, `<= 250ms`), attribute
//! filters (`key=value`, space-separated, values in double quotes when they hold spaces) and
//! the text search (error message, code, reference, trace id). Each becomes SQL built only
//! from numbers toolspan formats and escaped literals.

use crate::http::error::ApiError;
use toolspan_query::sql::literal;

/// Attribute filters one search takes at most.
pub const MAX_ATTRS: usize = 8;

/// A comparison of a call's duration with a bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DurationBound {
    /// `>`, `>=`, `<` or `<=`.
    pub op: &'static str,
    /// The bound, milliseconds.
    pub ms: f64,
}

/// `> 1 s`, `>=250ms`, `< 2.5 min`, `<= 900 us`; several joined by `,` or `and`.
pub fn durations(v: &str) -> Result<Vec<DurationBound>, ApiError> {
    let bad = || {
        ApiError::invalid_argument(format!(
            "`duration` is one or two comparisons such as `> 1 s`, `>= 250 ms` or `> 1 s, < 5 s` \
             (units us, ms, s, min), got {:?}",
            v.chars().take(40).collect::<String>()
        ))
    };
    let mut out = Vec::new();
    for part in v
        .split(',')
        .flat_map(|p| p.split(" and "))
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (op, rest) = ["<=", ">=", "<", ">"]
            .into_iter()
            .find_map(|op| part.strip_prefix(op).map(|r| (op, r.trim())))
            .ok_or_else(bad)?;
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, unit) = (rest[..split].trim(), rest[split..].trim());
        let n: f64 = num.parse().map_err(|_| bad())?;
        let scale = match unit {
            "us" | "µs" => 0.001,
            "ms" => 1.0,
            "s" | "" => 1000.0,
            "m" | "min" => 60_000.0,
            _ => return Err(bad()),
        };
        let ms = n * scale;
        if !ms.is_finite() || !(0.0..=1e12).contains(&ms) {
            return Err(bad());
        }
        out.push(DurationBound { op, ms });
    }
    if out.is_empty() || out.len() > 2 {
        return Err(bad());
    }
    Ok(out)
}

/// The condition of `bounds` on `column`.
pub fn durations_sql(column: &str, bounds: &[DurationBound]) -> String {
    bounds
        .iter()
        .map(|b| format!("{column} {} {:?}", b.op, b.ms))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// `key=value` pairs, space-separated; a value may be double-quoted (`\"` inside).
pub fn attributes(v: &str) -> Result<Vec<(String, String)>, ApiError> {
    let bad = |why: &str| {
        ApiError::invalid_argument(format!(
            "`attr` is up to {MAX_ATTRS} filters key=value separated by spaces \
             (a value with spaces in double quotes: customer=\"acme corp\"): {why}"
        ))
    };
    let mut out = Vec::new();
    let mut chars = v.trim().chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        if key.is_empty() || chars.next() != Some('=') {
            return Err(bad("each filter is key=value"));
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return Err(bad("a quoted value is not closed"));
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                value.push(c);
            }
        }
        out.push((key, value));
    }
    if out.is_empty() || out.len() > MAX_ATTRS {
        return Err(bad("give one to eight filters"));
    }
    Ok(out)
}

/// The condition that a span's attributes or resource carry `key` with `value` (as text, or
/// as the number or boolean it spells). The columns are compact JSON objects, so the pair
/// is a substring `"key":"value"` (or `"key":42` followed by `,` or `}`); a key or value
/// inside another string would be escaped (`\"key\"`) and does not match.
pub fn attribute_sql(key: &str, value: &str) -> String {
    let k = serde_json::to_string(key).unwrap_or_default();
    let mut needles = vec![format!(
        "{k}:{}",
        serde_json::to_string(value).unwrap_or_default()
    )];
    let scalar = value == "true"
        || value == "false"
        || value == "null"
        || (value.parse::<f64>().is_ok()
            && value
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'e' | b'E' | b'+')));
    if scalar {
        needles.push(format!("{k}:{value},"));
        needles.push(format!("{k}:{value}}}"));
    }
    let mut conds = Vec::new();
    for col in ["attributes", "resource_attributes"] {
        for n in &needles {
            conds.push(format!("strpos({col}, {}) > 0", literal(n)));
        }
    }
    format!("({})", conds.join(" OR "))
}

/// The condition that a span's error message, error code, reference or trace id contains
/// `text` (case-insensitively).
pub fn text_sql(text: &str) -> String {
    format!(
        "strpos(lower(concat_ws(' ', error_message, error_code, reference, trace_id)), {}) > 0",
        literal(&text.to_lowercase())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(
            durations("> 1 s").expect("ok"),
            [DurationBound {
                op: ">",
                ms: 1000.0
            }]
        );
        assert_eq!(
            durations(">=250ms, <2.5 min").expect("ok"),
            [
                DurationBound {
                    op: ">=",
                    ms: 250.0
                },
                DurationBound {
                    op: "<",
                    ms: 150_000.0
                }
            ]
        );
        assert_eq!(durations("<= 900 us").expect("ok")[0].ms, 0.9);
        for bad in [
            "1 s",
            "> s",
            "> 1 parsec",
            "> -1 s",
            "> 1 s, < 2 s, > 3 s",
            ">1e400",
            "",
        ] {
            assert!(durations(bad).is_err(), "{bad}");
        }
        assert_eq!(
            durations_sql("c.duration_ms", &durations("> 1 s and < 5s").expect("ok")),
            "c.duration_ms > 1000.0 AND c.duration_ms < 5000.0"
        );
    }

    #[test]
    fn attributes_parse_and_escape() {
        assert_eq!(
            attributes("tier=gold customer=\"acme \\\"corp\\\"\" n=3").expect("ok"),
            [
                ("tier".to_string(), "gold".to_string()),
                ("customer".to_string(), "acme \"corp\"".to_string()),
                ("n".to_string(), "3".to_string())
            ]
        );
        for bad in ["tier", "=x", "a=\"open", ""] {
            assert!(attributes(bad).is_err(), "{bad}");
        }
        let sql = attribute_sql("k'", "v' OR 1=1 --");
        assert!(sql.contains("'\"k''\":\"v'' OR 1=1 --\"'"), "{sql}");
        assert!(!attribute_sql("n", "3 OR").contains(":3 OR,"));
        assert!(attribute_sql("n", "3").contains("'\"n\":3,'"));
        assert!(text_sql("It's").contains("'it''s'"));
    }
}

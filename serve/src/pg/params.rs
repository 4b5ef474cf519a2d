//! Binding the parameters of an extended-protocol statement (`$1`, `$2`, …) as SQL literals.
//!
//! Each value is decoded by its type (text or binary format, as the client sent it),
//! validated, and written as a literal toolspan formats itself: numbers as numbers (in
//! brackets, so a sign cannot form a comment), booleans as `true`/`false`, everything else
//! as a string literal with its quotes doubled. The substitution works on the token stream,
//! so placeholders inside string literals or comments are never touched, and the bound
//! statement then goes through the same gate as any other.

use chrono::{DateTime, FixedOffset, NaiveDate, NaiveDateTime, SecondsFormat, Utc};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use pgwire::api::portal::Portal;
use pgwire::api::Type;

use toolspan_query::error::{QueryError, QueryErrorKind};

fn invalid(message: String) -> QueryError {
    QueryError::new(
        QueryErrorKind::InvalidQuery {
            message: message.clone(),
        },
        message,
    )
}

/// `sql` with its placeholders replaced by the portal's parameter values; `types` are the
/// statement's parameter types (the client's where it gave them, else the inferred ones).
pub fn bind<S: Clone>(sql: &str, portal: &Portal<S>, types: &[Type]) -> Result<String, QueryError> {
    if portal.parameter_len() == 0 {
        return Ok(sql.to_string());
    }
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .with_unescape(false)
        .tokenize()
        .map_err(|e| invalid(format!("the statement could not be read: {e}")))?;
    let mut out = String::with_capacity(sql.len() + 16 * portal.parameter_len());
    for t in tokens {
        match &t {
            Token::Placeholder(p) if p.starts_with('$') => {
                let n: usize = p[1..]
                    .parse()
                    .map_err(|_| invalid(format!("unknown placeholder {p}: use $1, $2, …")))?;
                if n == 0 || n > portal.parameter_len() {
                    return Err(invalid(format!(
                        "the statement uses {p} but {} parameters were bound",
                        portal.parameter_len()
                    )));
                }
                let ty = types.get(n - 1).cloned().unwrap_or(Type::UNKNOWN);
                out.push_str(&literal(portal, n - 1, &ty)?);
            }
            _ => out.push_str(&t.to_string()),
        }
    }
    Ok(out)
}

/// A SQL string literal.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn number<T: std::fmt::Display>(v: T) -> String {
    format!("({v})")
}

fn literal<S: Clone>(portal: &Portal<S>, idx: usize, ty: &Type) -> Result<String, QueryError> {
    let bad = |e: &dyn std::fmt::Display| {
        invalid(format!(
            "parameter ${} is not a valid {} value ({e})",
            idx + 1,
            ty.name()
        ))
    };
    let Some(raw) = portal.parameters.get(idx) else {
        return Err(invalid(format!("parameter ${} was not bound", idx + 1)));
    };
    let Some(raw) = raw else {
        return Ok("NULL".into());
    };
    if !portal.parameter_format.is_binary(idx) {
        let text = std::str::from_utf8(raw).map_err(|e| bad(&e))?;
        let t = text.trim();
        return Ok(match *ty {
            Type::INT2 | Type::INT4 | Type::INT8 | Type::OID => {
                number(t.parse::<i64>().map_err(|e| bad(&e))?)
            }
            Type::FLOAT4 | Type::FLOAT8 | Type::NUMERIC => {
                let f = t.parse::<f64>().map_err(|e| bad(&e))?;
                if f.is_finite() {
                    // The client's digits, now known to be a plain number.
                    number(t)
                } else {
                    format!("CAST({} AS DOUBLE)", quoted(t))
                }
            }
            Type::BOOL => match t.to_ascii_lowercase().as_str() {
                "t" | "true" | "on" | "yes" | "1" | "y" => "true".into(),
                "f" | "false" | "off" | "no" | "0" | "n" => "false".into(),
                _ => return Err(bad(&"expected true or false")),
            },
            _ => quoted(text),
        });
    }
    let p = |e: pgwire::error::PgWireError| bad(&e);
    let value = match *ty {
        Type::INT2 => portal.parameter::<i16>(idx, ty).map_err(p)?.map(number),
        Type::INT4 => portal.parameter::<i32>(idx, ty).map_err(p)?.map(number),
        Type::INT8 => portal.parameter::<i64>(idx, ty).map_err(p)?.map(number),
        Type::OID => portal.parameter::<u32>(idx, ty).map_err(p)?.map(number),
        Type::FLOAT4 => portal
            .parameter::<f32>(idx, ty)
            .map_err(p)?
            .map(|f| float(f64::from(f))),
        Type::FLOAT8 => portal.parameter::<f64>(idx, ty).map_err(p)?.map(float),
        Type::BOOL => portal
            .parameter::<bool>(idx, ty)
            .map_err(p)?
            .map(|b| b.to_string()),
        Type::TIMESTAMPTZ => portal
            .parameter::<DateTime<FixedOffset>>(idx, ty)
            .map_err(p)?
            .map(|t| {
                quoted(
                    &t.with_timezone(&Utc)
                        .to_rfc3339_opts(SecondsFormat::AutoSi, true),
                )
            }),
        Type::TIMESTAMP => portal
            .parameter::<NaiveDateTime>(idx, ty)
            .map_err(p)?
            .map(|t| quoted(&t.format("%Y-%m-%dT%H:%M:%S%.f").to_string())),
        Type::DATE => portal
            .parameter::<NaiveDate>(idx, ty)
            .map_err(p)?
            .map(|d| quoted(&d.format("%Y-%m-%d").to_string())),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            let s = std::str::from_utf8(raw).map_err(|e| bad(&e))?;
            Some(quoted(s))
        }
        _ => {
            return Err(invalid(format!(
                "parameter ${} has type {} in binary format, which toolspan does not decode: \
                 send it in text format",
                idx + 1,
                ty.name()
            )))
        }
    };
    Ok(value.unwrap_or_else(|| "NULL".into()))
}

fn float(f: f64) -> String {
    if f.is_finite() {
        number(f)
    } else {
        format!("CAST('{f}' AS DOUBLE)")
    }
}

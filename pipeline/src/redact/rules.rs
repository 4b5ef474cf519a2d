//! The built-in rules: trigger strings and the checks run where one occurs.
//!
//! Every rule's match starts at one of its triggers, so a rule runs as a cheap check of the
//! bytes around a trigger followed by a `^`-anchored regex at the trigger, never as a scan of
//! the whole input. E-mail addresses and connection strings are found from their `@` instead.

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

use super::resolve::{
    push, Candidate, PRIO_AUTHZ, PRIO_AWS_ID, PRIO_BEARER, PRIO_CONN, PRIO_EMAIL, PRIO_JWT,
    PRIO_KV, PRIO_KV_NAMED, PRIO_PEM, PRIO_PROVIDER,
};
use super::SecretKind;
use crate::trigger::TriggerSearch;

const R_PEM: u16 = 1 << 0;
const R_AUTHZ: u16 = 1 << 1;
const R_BEARER: u16 = 1 << 2;
const R_BASIC: u16 = 1 << 3;
const R_JWT: u16 = 1 << 4;
const R_AWS_ID: u16 = 1 << 5;
const R_PROVIDER: u16 = 1 << 6;
const R_KV: u16 = 1 << 7;
const RULES: usize = 8;

/// Trigger strings (ASCII case-insensitive), the rules to try where one occurs, and for key
/// triggers whether a longer key name may continue after it (`secret` in
/// `secret_access_key`); otherwise a separator or quote must follow at once.
pub(super) const TRIGGERS: &[(&str, u16, bool)] = &[
    ("-----begin", R_PEM, false),
    ("auth", R_AUTHZ | R_KV, false),
    ("bearer", R_BEARER, false),
    ("basic", R_BASIC, false),
    ("eyj", R_JWT, false),
    ("akia", R_AWS_ID, false),
    ("asia", R_AWS_ID, false),
    ("abia", R_AWS_ID, false),
    ("acca", R_AWS_ID, false),
    ("sk-", R_PROVIDER, false),
    ("sk_live_", R_PROVIDER, false),
    ("sk_test_", R_PROVIDER, false),
    ("rk_live_", R_PROVIDER, false),
    ("rk_test_", R_PROVIDER, false),
    ("ghp_", R_PROVIDER, false),
    ("gho_", R_PROVIDER, false),
    ("ghu_", R_PROVIDER, false),
    ("ghs_", R_PROVIDER, false),
    ("ghr_", R_PROVIDER, false),
    ("github_pat_", R_PROVIDER, false),
    ("xoxa-", R_PROVIDER, false),
    ("xoxb-", R_PROVIDER, false),
    ("xoxp-", R_PROVIDER, false),
    ("xoxr-", R_PROVIDER, false),
    ("xoxs-", R_PROVIDER, false),
    ("aiza", R_PROVIDER, false),
    ("password", R_KV, false),
    ("passwd", R_KV, false),
    ("pwd", R_KV, false),
    ("secret", R_KV, true),
    ("token", R_KV, false),
    ("api_key", R_KV, false),
    ("apikey", R_KV, false),
    ("api-key", R_KV, false),
    ("session", R_KV, false),
    ("private_key", R_KV, false),
    ("sig", R_KV, true),
    ("x-amz-", R_KV, true),
    ("x-goog-", R_KV, true),
];

/// Key names whose value is a secret. A key matches when it ends with one of these
/// (`db_password`, `X-Auth-Token`, `oauth`), except `sig`, which must stand alone. Longer
/// names come first so that the most specific one names the kind.
const KV_KEYS: &str = "x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature\
    |x-goog-credential|secret_access_key|secretaccesskey|secret_key|secret|private_key|password\
    |passwd|pwd|token|api_key|apikey|api-key|auth|session|signature|sig";

/// ASCII whitespace exactly as `u8::is_ascii_whitespace` has it, so that the hand-written walk
/// in `Builtin::key_value` agrees with the regex.
const WS: &str = r"[\t\n\x0C\r ]";

/// The value after a key and separator: double-quoted (JSON, with escapes), single-quoted,
/// quoted with escaped quotes (JSON inside a JSON string), or bare up to a delimiter. A closing
/// quote is optional so that a truncated string still has its value redacted.
const KV_VALUE: &str = r#"(?:"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|\\"(?:[^"\\]|\\[^"])*(?:\\")?|[^\s"'&,;<>\\{}\[\]()]+)"#;

/// `Authorization` schemes, which precede the credential.
pub(super) const AUTH_SCHEMES: [&str; 8] = [
    "bearer",
    "basic",
    "token",
    "digest",
    "negotiate",
    "ntlm",
    "apikey",
    "sso-key",
];

pub(super) struct Builtin {
    pub(super) triggers: TriggerSearch,
    scheme_sep: memchr::memmem::FinderRev<'static>,
    pem: Regex,
    authz: Regex,
    bearer: Regex,
    basic: Regex,
    jwt: Regex,
    aws_id: Regex,
    provider: Regex,
    kv: Regex,
    conn: Regex,
    email: Regex,
}

pub(super) static BUILTIN: LazyLock<Builtin> = LazyLock::new(Builtin::new);

/// Compiles a built-in pattern. The patterns are literals in this file and every one is
/// exercised by the unit tests, so failing here is a programming error caught by `cargo test`.
fn builtin_regex(pattern: &str) -> Regex {
    #[allow(clippy::expect_used)]
    Regex::new(pattern).expect("built-in redaction pattern compiles (covered by tests)")
}

impl Builtin {
    fn new() -> Builtin {
        let patterns: Vec<&str> = TRIGGERS.iter().map(|(t, _, _)| *t).collect();
        Builtin {
            triggers: TriggerSearch::new(&patterns),
            scheme_sep: memchr::memmem::FinderRev::new(b"://"),
            pem: builtin_regex(
                r"^-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?:(?s:.*?)-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=\s\\:,.-]*)",
            ),
            authz: builtin_regex(
                r#"(?i)^authorization(?:\\?["'])?\s*[:=]\s*(?:\[\s*)?(?:\\?["'])?(?:(?:bearer|basic|token|digest|negotiate|ntlm|apikey|sso-key)\s+)?([^\s"'\\,;\[\]{}()<>]+)"#,
            ),
            bearer: builtin_regex(r"(?i)^bearer\s+([A-Za-z0-9._~+/-]+=*)"),
            basic: builtin_regex(r"(?i)^basic\s+([A-Za-z0-9+/]{6,}={0,2})"),
            jwt: builtin_regex(
                r"^eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]*){1,3}",
            ),
            aws_id: builtin_regex(r"^(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}"),
            provider: builtin_regex(
                r"^(?:sk-[A-Za-z0-9_-]{20,}|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[A-Za-z0-9_-]{35})",
            ),
            kv: builtin_regex(&format!(
                r#"(?i)^(?:{KV_KEYS})(?:\\?["'])?{WS}*(?:[:=]|=>){WS}*(?:\[{WS}*)?{KV_VALUE}"#
            )),
            conn: builtin_regex(
                r#"(?i)^[a-z][a-z0-9+.-]{0,30}://[^\s:/@"'?#<>\\]*:([^\s/@"'?#<>\\]+)@"#,
            ),
            email: builtin_regex(
                r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,24}",
            ),
        }
    }

    /// Tries the rules of every trigger occurrence in `hits`, pushing candidate ranges.
    pub(super) fn at_triggers(
        &self,
        s: &str,
        hits: &mut [(usize, usize)],
        found: &mut Vec<Candidate>,
    ) {
        hits.sort_unstable();
        let b = s.as_bytes();
        // Per rule, the end of its last candidate: an occurrence inside it (`token=token=x`)
        // cannot start a new match of that rule, which keeps the work linear.
        let mut covered = [0usize; RULES];
        let mut last = None;
        for &(p, t) in hits.iter() {
            if last == Some((p, t)) {
                continue;
            }
            last = Some((p, t));
            let (trigger, rules, key_may_continue) = TRIGGERS[t];
            let after = p + trigger.len();
            let rest = &s[p..];
            for (rule, covered_until) in covered.iter_mut().enumerate() {
                let bit = 1u16 << rule;
                if rules & bit == 0 || p < *covered_until {
                    continue;
                }
                let hit = match bit {
                    R_PEM => self
                        .pem
                        .find(rest)
                        .map(|m| (m.range(), SecretKind::PrivateKey, PRIO_PEM)),
                    R_AUTHZ => (starts_with_ignore_case(rest, "authorization"))
                        .then(|| group(&self.authz, rest, 1))
                        .flatten()
                        // `Bearer [REDACTED:...]`: the regex falls back to taking the scheme
                        // itself as the credential; a scheme name is never one.
                        .filter(|r| {
                            !AUTH_SCHEMES
                                .iter()
                                .any(|w| rest[r.clone()].eq_ignore_ascii_case(w))
                        })
                        .map(|r| (r, SecretKind::BearerToken, PRIO_AUTHZ)),
                    R_BEARER | R_BASIC => {
                        let (regex, accept): (&Regex, fn(&str) -> bool) = if bit == R_BEARER {
                            (&self.bearer, looks_like_token)
                        } else {
                            (&self.basic, is_basic_credential)
                        };
                        (starts_word(s, p) && b.get(after).is_some_and(u8::is_ascii_whitespace))
                            .then(|| group(regex, rest, 1))
                            .flatten()
                            .filter(|r| accept(&rest[r.clone()]))
                            .map(|r| (r, SecretKind::BearerToken, PRIO_BEARER))
                    }
                    R_JWT => rest
                        .starts_with("eyJ")
                        .then(|| self.jwt.find(rest))
                        .flatten()
                        .map(|m| (m.range(), SecretKind::Jwt, PRIO_JWT)),
                    R_AWS_ID => self
                        .aws_id
                        .find(rest)
                        // `ASIA` is also an English word: a temporary key id carries digits.
                        .filter(|m| {
                            !m.as_str().starts_with("ASIA")
                                || m.as_str().bytes().any(|c| c.is_ascii_digit())
                        })
                        .map(|m| (m.range(), SecretKind::AwsKey, PRIO_AWS_ID)),
                    R_PROVIDER => starts_token(s, p)
                        .then(|| self.provider.find(rest))
                        .flatten()
                        // `sk-learn-style-words`: real keys are random and carry digits.
                        .filter(|m| {
                            !m.as_str().starts_with("sk-")
                                || m.as_str().bytes().any(|c| c.is_ascii_digit())
                        })
                        .map(|m| (m.range(), SecretKind::Credential, PRIO_PROVIDER)),
                    R_KV => {
                        let next_ok = key_may_continue
                            || b.get(after).is_some_and(|c| b"\"'\\:= \t\r\n".contains(c));
                        if next_ok {
                            self.key_value(s, p)
                        } else {
                            None
                        }
                    }
                    _ => None,
                };
                if let Some((range, kind, prio)) = hit {
                    push(found, p + range.start, p + range.end, kind, prio);
                    *covered_until = p + range.end;
                }
            }
        }
    }

    /// Matches a key/value credential at `p`; returns the value's range relative to `p`.
    ///
    /// Only the overall match comes from the regex (a DFA search, no capture engine); the key
    /// and value inside it are found by walking the same grammar by hand.
    fn key_value(&self, s: &str, p: usize) -> Option<(Range<usize>, SecretKind, u8)> {
        let m = self.kv.find(&s[p..])?;
        let t = &s.as_bytes()[p..p + m.end()];
        // Key names hold only letters, `_` and `-`; the regex needs a quote, backslash, blank
        // or separator right after the key.
        let key_len = t
            .iter()
            .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-'))?;
        let key = &s[p..p + key_len];
        if key.eq_ignore_ascii_case("sig") && !starts_word(s, p) {
            return None; // `config=`, `xsig=`: not the Azure SAS parameter
        }
        let mut i = key_len;
        if t[i..].starts_with(b"\\\"") || t[i..].starts_with(b"\\'") {
            i += 2;
        } else if t[i] == b'"' || t[i] == b'\'' {
            i += 1;
        }
        while t.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i += if t[i..].starts_with(b"=>") { 2 } else { 1 };
        while t.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        // A one-element array, as OpenTelemetry records HTTP headers: `"x-api-key":["..."]`.
        // No value form starts with `[`, so a `[` here is the array's.
        if t.get(i) == Some(&b'[') {
            i += 1;
            while t.get(i).is_some_and(u8::is_ascii_whitespace) {
                i += 1;
            }
        }
        let end = t.len();
        let (v_start, v_end) = match t.get(i) {
            Some(b'"') => (
                i + 1,
                if end > i + 1 && t[end - 1] == b'"' {
                    end - 1
                } else {
                    end
                },
            ),
            Some(b'\'') => (
                i + 1,
                if end > i + 1 && t[end - 1] == b'\'' {
                    end - 1
                } else {
                    end
                },
            ),
            Some(b'\\') => (
                i + 2,
                if end >= i + 4 && t.ends_with(b"\\\"") {
                    end - 2
                } else {
                    end
                },
            ),
            _ => (i, end),
        };
        if v_start >= v_end {
            return None;
        }
        let value = &s[p + v_start..p + v_end];
        if ["null", "true", "false", "none", "undefined"]
            .iter()
            .any(|w| value.eq_ignore_ascii_case(w))
        {
            return None;
        }
        let (kind, prio) = if starts_with_ignore_case(key, "x-amz-")
            || starts_with_ignore_case(key, "x-goog-")
            || key.eq_ignore_ascii_case("signature")
            || key.eq_ignore_ascii_case("sig")
        {
            (SecretKind::SignedUrl, PRIO_KV_NAMED)
        } else if key.eq_ignore_ascii_case("secret_access_key")
            || key.eq_ignore_ascii_case("secretaccesskey")
        {
            (SecretKind::AwsKey, PRIO_KV_NAMED)
        } else {
            (SecretKind::Credential, PRIO_KV)
        };
        Some((v_start..v_end, kind, prio))
    }

    /// E-mail addresses and connection-string passwords, found from each `@`.
    pub(super) fn at_signs(&self, s: &str, found: &mut Vec<Candidate>) {
        let b = s.as_bytes();
        let mut email_until = 0;
        let mut conn_until = 0;
        let mut conn_locs = None;
        for at in memchr::memchr_iter(b'@', b) {
            if at >= email_until {
                // The local part: at most 64 characters (RFC 5321) before the `@`.
                let mut lo = at;
                while lo > 0 && at - lo < 64 && is_email_local(b[lo - 1]) {
                    lo -= 1;
                }
                if lo < at {
                    if let Some(m) = self.email.find(&s[lo..]) {
                        push(
                            found,
                            lo + m.start(),
                            lo + m.end(),
                            SecretKind::Email,
                            PRIO_EMAIL,
                        );
                        email_until = lo + m.end();
                    }
                }
            }
            if at >= conn_until {
                // `scheme://user:password@`: look back for the `://` and the scheme before it.
                let window = at.saturating_sub(256);
                if let Some(sep) = self.scheme_sep.rfind(&b[window..at]) {
                    let sep = window + sep;
                    let mut st = sep;
                    while st > 0
                        && sep - st < 32
                        && (b[st - 1].is_ascii_alphanumeric() || b"+.-".contains(&b[st - 1]))
                    {
                        st -= 1;
                    }
                    while st < sep && !b[st].is_ascii_alphabetic() {
                        st += 1;
                    }
                    let locs = conn_locs.get_or_insert_with(|| self.conn.capture_locations());
                    if st < sep && self.conn.captures_read(locs, &s[st..]).is_some() {
                        if let Some((v_start, v_end)) = locs.get(1) {
                            push(
                                found,
                                st + v_start,
                                st + v_end,
                                SecretKind::Credential,
                                PRIO_CONN,
                            );
                            conn_until = st + v_end + 1;
                        }
                    }
                }
            }
        }
    }
}

/// The range of capture group `i` of `regex` matched at the start of `hay`.
fn group(regex: &Regex, hay: &str, i: usize) -> Option<Range<usize>> {
    regex.captures(hay)?.get(i).map(|m| m.range())
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn is_email_local(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"._%+-".contains(&c)
}

/// True when `pos` does not continue an identifier (the byte before it is not alphanumeric
/// or `_`).
fn starts_word(s: &str, pos: usize) -> bool {
    pos == 0 || {
        let c = s.as_bytes()[pos - 1];
        !(c.is_ascii_alphanumeric() || c == b'_')
    }
}

/// True when a provider token may start at `pos`: the byte before it is not a letter or
/// digit. Unlike [`starts_word`], `_` is a boundary: identifiers glue a token on with it
/// (`key_with_ghp_...`, `STRIPE_sk_live_...`), and no provider prefix continues a word that
/// ends in `_`. A prefix inside a word (`task-...`, `desk_test_...`) is still not a token.
fn starts_token(s: &str, pos: usize) -> bool {
    pos == 0 || !s.as_bytes()[pos - 1].is_ascii_alphanumeric()
}

/// A `Bearer xxx` outside an `Authorization` header: tell a token from English
/// ("bearer tokens are...") by length or by digits and punctuation.
fn looks_like_token(v: &str) -> bool {
    v.len() >= 8 && (v.len() >= 20 || v.bytes().any(|c| !c.is_ascii_alphabetic()))
}

/// A `Basic xxx` outside an `Authorization` header: accept only base64 of `user:password`,
/// so that "basic information" is left alone.
fn is_basic_credential(v: &str) -> bool {
    let mut bits: u32 = 0;
    let mut nbits = 0;
    let mut colon = false;
    for c in v.bytes() {
        let six = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return false,
        };
        bits = (bits << 6) | u32::from(six);
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            let byte = (bits >> nbits) as u8;
            bits &= (1 << nbits) - 1;
            if !(0x20..0x7f).contains(&byte) {
                return false;
            }
            colon |= byte == b':';
        }
    }
    colon
}

//! Secret redaction for span attribute values and captured payloads.
//!
//! [`Redactor::redact`] finds secrets in free text (URLs, JSON text, YAML-ish `key: value`
//! lines, HTTP headers, query strings, log lines) and replaces each with
//! `[REDACTED:<kind>]`. For key/value credentials only the value is replaced:
//! `password=[REDACTED:credential]`, `"api_key": "[REDACTED:credential]"`,
//! `Authorization: Bearer [REDACTED:bearer_token]`.
//!
//! How it stays fast: one case-insensitive SIMD pass (see `TriggerSearch`) finds trigger
//! substrings (`akia`, `bearer`, `password`, `eyj`, ...), `memchr` finds `@`, and a
//! vectorised bit-mask test decides whether a card number is possible at all. A string with
//! none of these is returned borrowed, without allocating; that is nearly every attribute
//! value. Otherwise each occurrence is checked where it stands: a byte or two around it, then
//! a regex anchored at it. No built-in regex scans the whole input.
//!
//! How overlaps resolve: every rule reports byte ranges of the original input. A range inside
//! another is dropped, overlapping ranges are merged into one placeholder whose kind is that of
//! the widest range (ties go to the more specific rule), so no part of a secret is left behind.
//! An e-mail match that only partly overlaps another secret is dropped instead: that is the
//! `scheme://user:pass@host.example.com` case, where the host is not secret.
//!
//! Why it is idempotent: text inside an existing `[REDACTED:...]` placeholder is never redacted
//! again, and no rule matches the text around a placeholder, so a second pass changes nothing
//! and counts nothing.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::LazyLock;

use crate::trigger::TriggerSearch;
use regex::{Regex, RegexSet};

/// Kinds of secrets recognised; `as_str()` gives a stable snake_case name used in replacement
/// text and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecretKind {
    /// AWS access key id (`AKIA...`, `ASIA...`) or an AWS secret access key next to its key name.
    AwsKey,
    /// The credential of an `Authorization` header or a `Bearer`/`Basic` token.
    BearerToken,
    /// A JSON Web Token (three base64url parts, the first starting `eyJ`).
    Jwt,
    /// A PEM private-key block.
    PrivateKey,
    /// A password, API key or token given as a key/value pair, in a connection string, or in a
    /// provider format (`sk-...`, `ghp_...`, `xoxb-...`, `AIza...`).
    Credential,
    /// A signature or credential parameter of a pre-signed URL (S3, GCS, Azure SAS, CloudFront).
    SignedUrl,
    /// An e-mail address.
    Email,
    /// A payment card number that passes the Luhn check and has a known issuer prefix.
    CardNumber,
    /// A match of a user-supplied pattern.
    Custom,
}

impl SecretKind {
    /// Every kind, in declaration order.
    pub const ALL: [SecretKind; 9] = [
        SecretKind::AwsKey,
        SecretKind::BearerToken,
        SecretKind::Jwt,
        SecretKind::PrivateKey,
        SecretKind::Credential,
        SecretKind::SignedUrl,
        SecretKind::Email,
        SecretKind::CardNumber,
        SecretKind::Custom,
    ];

    /// Stable snake_case name, used in the replacement text and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            SecretKind::AwsKey => "aws_key",
            SecretKind::BearerToken => "bearer_token",
            SecretKind::Jwt => "jwt",
            SecretKind::PrivateKey => "private_key",
            SecretKind::Credential => "credential",
            SecretKind::SignedUrl => "signed_url",
            SecretKind::Email => "email",
            SecretKind::CardNumber => "card_number",
            SecretKind::Custom => "custom",
        }
    }

    /// The text that replaces a secret of this kind.
    fn placeholder(self) -> &'static str {
        match self {
            SecretKind::AwsKey => "[REDACTED:aws_key]",
            SecretKind::BearerToken => "[REDACTED:bearer_token]",
            SecretKind::Jwt => "[REDACTED:jwt]",
            SecretKind::PrivateKey => "[REDACTED:private_key]",
            SecretKind::Credential => "[REDACTED:credential]",
            SecretKind::SignedUrl => "[REDACTED:signed_url]",
            SecretKind::Email => "[REDACTED:email]",
            SecretKind::CardNumber => "[REDACTED:card_number]",
            SecretKind::Custom => "[REDACTED:custom]",
        }
    }
}

impl fmt::Display for SecretKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Counts of redactions by kind (cheap to create, mergeable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedactionCounts {
    by_kind: [u64; 9],
}

impl RedactionCounts {
    /// Adds `n` redactions of `kind`.
    pub fn add(&mut self, kind: SecretKind, n: u64) {
        let slot = &mut self.by_kind[kind as usize];
        *slot = slot.saturating_add(n);
    }

    /// Redactions of `kind` so far.
    pub fn get(&self, kind: SecretKind) -> u64 {
        self.by_kind[kind as usize]
    }

    /// Redactions of all kinds so far.
    pub fn total(&self) -> u64 {
        self.by_kind
            .iter()
            .fold(0u64, |acc, n| acc.saturating_add(*n))
    }

    /// Adds every count of `other` to this one.
    pub fn merge(&mut self, other: &RedactionCounts) {
        for (mine, theirs) in self.by_kind.iter_mut().zip(other.by_kind.iter()) {
            *mine = mine.saturating_add(*theirs);
        }
    }

    /// The non-zero counts, in [`SecretKind::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (SecretKind, u64)> + '_ {
        SecretKind::ALL
            .iter()
            .map(move |kind| (*kind, self.by_kind[*kind as usize]))
            .filter(|(_, n)| *n > 0)
    }
}

/// A user-supplied pattern that failed to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    /// The pattern as given.
    pub pattern: String,
    /// Why it was rejected.
    pub message: String,
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid redaction pattern `{}`: {}",
            self.pattern, self.message
        )
    }
}

impl std::error::Error for PatternError {}

/// Redacts secrets from text; see the module documentation.
///
/// Built-in patterns are compiled once per process and shared, so [`Redactor::builtin`] is
/// cheap. A `Redactor` is `Send + Sync`; share one behind an `Arc`.
pub struct Redactor {
    builtin: &'static Builtin,
    custom: Vec<CustomPattern>,
    /// One-pass "does any custom pattern match" check, present with two or more patterns.
    custom_set: Option<RegexSet>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field(
                "custom_patterns",
                &self
                    .custom
                    .iter()
                    .map(|c| c.regex.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A compiled user pattern. With a capture group named `secret` only that group is replaced
/// (so `token-id:(?P<secret>\w+)` keeps `token-id:`), otherwise the whole match.
struct CustomPattern {
    regex: Regex,
    secret_group: Option<usize>,
}

impl Redactor {
    /// Built-in patterns plus user regexes (each counted as [`SecretKind::Custom`]).
    ///
    /// Patterns use the `regex` crate syntax. A pattern with a capture group named `secret`
    /// redacts only that group; otherwise the whole match is redacted. Empty matches are
    /// ignored.
    pub fn new(custom_patterns: &[String]) -> Result<Redactor, PatternError> {
        let mut custom = Vec::with_capacity(custom_patterns.len());
        for pattern in custom_patterns {
            let regex = Regex::new(pattern).map_err(|err| PatternError {
                pattern: pattern.clone(),
                message: err.to_string(),
            })?;
            let secret_group = regex
                .capture_names()
                .position(|name| name == Some("secret"));
            custom.push(CustomPattern {
                regex,
                secret_group,
            });
        }
        let custom_set = if custom.len() >= 2 {
            let set = RegexSet::new(custom_patterns).map_err(|err| PatternError {
                pattern: custom_patterns.join(" | "),
                message: err.to_string(),
            })?;
            Some(set)
        } else {
            None
        };
        Ok(Redactor {
            builtin: &BUILTIN,
            custom,
            custom_set,
        })
    }

    /// Built-in patterns only.
    pub fn builtin() -> Redactor {
        Redactor {
            builtin: &BUILTIN,
            custom: Vec::new(),
            custom_set: None,
        }
    }

    /// Redacts `s`; returns `Cow::Borrowed` (no allocation) when nothing matched — the common
    /// case must be fast. Each placeholder written adds one to `counts` under its kind.
    pub fn redact<'a>(&self, s: &'a str, counts: &mut RedactionCounts) -> Cow<'a, str> {
        let bytes = s.as_bytes();
        let mut hits: Vec<(usize, usize)> = Vec::new();
        self.builtin
            .triggers
            .for_each(bytes, |pos, trigger| hits.push((pos, trigger)));
        let has_at = memchr::memchr(b'@', bytes).is_some();
        let maybe_card = may_hold_card(bytes);
        let maybe_custom = match &self.custom_set {
            Some(set) => set.is_match(s),
            None => !self.custom.is_empty(),
        };
        if hits.is_empty() && !has_at && !maybe_card && !maybe_custom {
            return Cow::Borrowed(s);
        }

        let mut found = Vec::new();
        if !hits.is_empty() {
            self.builtin.at_triggers(s, &mut hits, &mut found);
        }
        if has_at {
            self.builtin.at_signs(s, &mut found);
        }
        if maybe_card {
            find_cards(bytes, &mut found);
        }
        if maybe_custom {
            for pattern in &self.custom {
                pattern.collect(s, &mut found);
            }
        }
        if found.is_empty() {
            return Cow::Borrowed(s);
        }
        exclude_placeholders(s, &mut found);
        let merged = resolve(found);
        if merged.is_empty() {
            return Cow::Borrowed(s);
        }

        let mut out = String::with_capacity(s.len() + 8 * merged.len());
        let mut pos = 0;
        for m in &merged {
            out.push_str(&s[pos..m.start]);
            out.push_str(m.kind.placeholder());
            counts.add(m.kind, 1);
            pos = m.end;
        }
        out.push_str(&s[pos..]);
        Cow::Owned(out)
    }
}

impl CustomPattern {
    fn collect(&self, s: &str, found: &mut Vec<Candidate>) {
        match self.secret_group {
            None => {
                for m in self.regex.find_iter(s) {
                    push(found, m.start(), m.end(), SecretKind::Custom, PRIO_CUSTOM);
                }
            }
            Some(group) => {
                for caps in self.regex.captures_iter(s) {
                    if let Some(m) = caps.get(group) {
                        push(found, m.start(), m.end(), SecretKind::Custom, PRIO_CUSTOM);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Trigger search



// ---------------------------------------------------------------------------------------------
// Built-in rules
//
// Every rule's match starts at one of its triggers, so a rule runs as a cheap check of the
// bytes around a trigger followed by a `^`-anchored regex at the trigger, never as a scan of
// the whole input. E-mail addresses and connection strings are found from their `@` instead.

const R_PEM: u16 = 1 << 0;
const R_AUTHZ: u16 = 1 << 1;
const R_BEARER: u16 = 1 << 2;
const R_BASIC: u16 = 1 << 3;
const R_JWT: u16 = 1 << 4;
const R_AWS_ID: u16 = 1 << 5;
const R_PROVIDER: u16 = 1 << 6;
const R_KV: u16 = 1 << 7;
const RULES: usize = 8;

// Lower wins when two candidates of equal width overlap: the more specific rule names the kind.
const PRIO_PEM: u8 = 0;
const PRIO_AUTHZ: u8 = 1;
const PRIO_BEARER: u8 = 2;
const PRIO_JWT: u8 = 3;
const PRIO_AWS_ID: u8 = 4;
const PRIO_PROVIDER: u8 = 5;
const PRIO_KV_NAMED: u8 = 6;
const PRIO_KV: u8 = 7;
const PRIO_CONN: u8 = 8;
const PRIO_CARD: u8 = 9;
const PRIO_EMAIL: u8 = 10;
const PRIO_CUSTOM: u8 = 11;

/// Trigger strings (ASCII case-insensitive), the rules to try where one occurs, and for key
/// triggers whether a longer key name may continue after it (`secret` in
/// `secret_access_key`); otherwise a separator or quote must follow at once.
const TRIGGERS: &[(&str, u16, bool)] = &[
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
const AUTH_SCHEMES: [&str; 8] = [
    "bearer",
    "basic",
    "token",
    "digest",
    "negotiate",
    "ntlm",
    "apikey",
    "sso-key",
];

struct Builtin {
    triggers: TriggerSearch,
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

static BUILTIN: LazyLock<Builtin> = LazyLock::new(Builtin::new);

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
    fn at_triggers(&self, s: &str, hits: &mut [(usize, usize)], found: &mut Vec<Candidate>) {
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
                    R_PROVIDER => starts_word(s, p)
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
    fn at_signs(&self, s: &str, found: &mut Vec<Candidate>) {
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

// ---------------------------------------------------------------------------------------------
// Card numbers

/// Cheap test that `b` may hold a card number: a run of at least 13 bytes that are digits or
/// single spaces or dashes between digits. Works on 64-byte blocks turned into bit masks (the
/// byte compares vectorise), so a digit-heavy but card-free string such as an ISO timestamp or a
/// hex trace id costs a few instructions per block rather than a branch per byte.
fn may_hold_card(b: &[u8]) -> bool {
    if b.len() < 64 {
        // One block at most: a plain digit count rejects nearly every short string sooner.
        if b.iter().filter(|c| c.is_ascii_digit()).count() < 13 {
            return false;
        }
    }
    // Length of the run of qualifying bytes that ends the previous block.
    let mut carry = 0u32;
    for chunk in b.chunks(64) {
        let mut block = [0u8; 64];
        block[..chunk.len()].copy_from_slice(chunk);
        let (digits, seps) = block_masks(&block);
        // A separator counts only between two digits; at the block edges the neighbour is
        // unknown, so it counts (over-approximating is safe for a prefilter).
        let seps = seps & ((digits << 1) | 1) & ((digits >> 1) | (1 << 63));
        let run = digits | seps;
        if carry + run.trailing_ones() >= 13 || has_run_of_13(run) {
            return true;
        }
        carry = if run == u64::MAX {
            carry + 64
        } else {
            run.leading_ones()
        };
    }
    false
}

/// Bit `i` of the first mask is set when `block[i]` is a digit, of the second when it is a
/// space or a dash.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline]
fn block_masks(block: &[u8; 64]) -> (u64, u64) {
    // SAFETY: the cfg above guarantees that this build enables SSE2 (it is part of the x86_64
    // baseline), the only requirement of `block_masks_sse2`.
    unsafe { block_masks_sse2(block) }
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
fn block_masks_sse2(block: &[u8; 64]) -> (u64, u64) {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8, _mm_sub_epi8,
    };
    let mut digits = 0u64;
    let mut seps = 0u64;
    for (i, chunk) in block.chunks_exact(16).enumerate() {
        // SAFETY: the unaligned load reads exactly the 16 bytes of `chunk`.
        let v = unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) };
        // A digit is a byte whose distance above b'0' is at most 9 (unsigned).
        let above_zero = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
        let d = _mm_cmpeq_epi8(_mm_min_epu8(above_zero, _mm_set1_epi8(9)), above_zero);
        let s = _mm_or_si128(
            _mm_cmpeq_epi8(v, _mm_set1_epi8(b' ' as i8)),
            _mm_cmpeq_epi8(v, _mm_set1_epi8(b'-' as i8)),
        );
        // The movemask results are 16-bit masks in an i32: the casts only reinterpret them.
        digits |= u64::from(_mm_movemask_epi8(d) as u16) << (16 * i);
        seps |= u64::from(_mm_movemask_epi8(s) as u16) << (16 * i);
    }
    (digits, seps)
}

/// Bit `i` of the first mask is set when `block[i]` is a digit, of the second when it is a
/// space or a dash.
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
#[inline]
fn block_masks(block: &[u8; 64]) -> (u64, u64) {
    let mut digits = 0u64;
    let mut seps = 0u64;
    for (i, &c) in block.iter().enumerate() {
        digits |= u64::from(c.is_ascii_digit()) << i;
        seps |= u64::from(c == b' ' || c == b'-') << i;
    }
    (digits, seps)
}

/// True when `m` has at least 13 consecutive set bits.
#[inline]
fn has_run_of_13(m: u64) -> bool {
    let m2 = m & (m >> 1); // runs of 2
    let m4 = m2 & (m2 >> 2); // runs of 4
    let m8 = m4 & (m4 >> 4); // runs of 8
    m8 & (m8 >> 5) != 0 // runs of 13
}

/// Finds card numbers: 13–19 digits, optionally in groups separated by single spaces or dashes,
/// with a known issuer prefix and length, a valid Luhn check digit, and not one repeated digit.
/// A digit group glued to letters, `_` or `.` (hex ids, decimals) is never part of a card.
fn find_cards(b: &[u8], found: &mut Vec<Candidate>) {
    // Groups of the current run, as (start, end). A card spans at most 6 groups, so a long run
    // is examined in batches that keep the last groups for the next batch.
    const MAX_GROUPS: usize = 32;
    const KEEP: usize = 6;
    let glued = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut groups = [(0usize, 0usize); MAX_GROUPS];
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        // A group glued to a word or a decimal point is part of that token, not of a card; the
        // groups after a separator are still examined.
        let mut skip_group = i > 0 && (glued(b[i - 1]) || b[i - 1] == b'.');
        let mut n = 0;
        loop {
            let g_start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let more =
                i + 1 < b.len() && (b[i] == b' ' || b[i] == b'-') && b[i + 1].is_ascii_digit();
            let glued_after = !more
                && i < b.len()
                && (glued(b[i]) || b[i] == b'.' && i + 1 < b.len() && b[i + 1].is_ascii_digit());
            if !std::mem::take(&mut skip_group) && !glued_after {
                groups[n] = (g_start, i);
                n += 1;
            }
            if !more {
                cards_in_run(b, &groups[..n], n, found);
                break;
            }
            i += 1;
            if n == MAX_GROUPS {
                let next = cards_in_run(b, &groups[..n], n - KEEP, found);
                groups.copy_within(next..n, 0);
                n -= next;
            }
        }
    }
}

/// Tries group-aligned sub-runs of one digit run that start before group `start_limit`,
/// leftmost and longest first: a single group of 13–19 digits, or two or more groups of 3–6
/// digits each. Returns the index of the first group not yet examined or consumed.
fn cards_in_run(
    b: &[u8],
    groups: &[(usize, usize)],
    start_limit: usize,
    found: &mut Vec<Candidate>,
) -> usize {
    let mut first = 0;
    while first < start_limit.min(groups.len()) {
        let mut matched = None;
        for last in (first..groups.len().min(first + 7)).rev() {
            let parts = &groups[first..=last];
            let digits: usize = parts.iter().map(|(s, e)| e - s).sum();
            if !(13..=19).contains(&digits) {
                continue;
            }
            if parts.len() > 1 && parts.iter().any(|(s, e)| !(3..=6).contains(&(e - s))) {
                continue;
            }
            let mut number = [0u8; 19];
            let mut n = 0;
            for &(s, e) in parts {
                for &c in &b[s..e] {
                    number[n] = c - b'0';
                    n += 1;
                }
            }
            if is_card_number(&number[..n]) {
                matched = Some(last);
                break;
            }
        }
        match matched {
            Some(last) => {
                push(
                    found,
                    groups[first].0,
                    groups[last].1,
                    SecretKind::CardNumber,
                    PRIO_CARD,
                );
                first = last + 1;
            }
            None => first += 1,
        }
    }
    first
}

/// Issuer prefix and length (Visa, Mastercard, Amex, Discover, JCB, Diners, UnionPay), not a
/// single repeated digit, and a valid Luhn check digit. Prefixes rule out nanosecond and
/// millisecond timestamps, which start with `1`.
fn is_card_number(d: &[u8]) -> bool {
    let len = d.len();
    if d.iter().all(|&x| x == d[0]) {
        return false;
    }
    let prefix = |n: usize| d[..n].iter().fold(0u32, |acc, &x| acc * 10 + u32::from(x));
    let issuer_ok = match d[0] {
        4 => matches!(len, 13 | 16 | 19),
        5 => (51..=55).contains(&prefix(2)) && len == 16,
        2 => (2221..=2720).contains(&prefix(4)) && len == 16,
        3 => {
            let p2 = prefix(2);
            let p3 = prefix(3);
            (p2 == 34 || p2 == 37) && len == 15
                || (3528..=3589).contains(&prefix(4)) && (16..=19).contains(&len)
                || ((300..=305).contains(&p3) || p2 == 36 || p2 == 38) && (14..=19).contains(&len)
        }
        6 => {
            let p2 = prefix(2);
            let p3 = prefix(3);
            (prefix(4) == 6011 || p2 == 65 || (644..=649).contains(&p3) || p2 == 62)
                && (16..=19).contains(&len)
        }
        _ => false,
    };
    issuer_ok && luhn(d)
}

fn luhn(d: &[u8]) -> bool {
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| {
            let x = u32::from(x);
            if i % 2 == 1 {
                let y = x * 2;
                if y > 9 {
                    y - 9
                } else {
                    y
                }
            } else {
                x
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

// ---------------------------------------------------------------------------------------------
// Resolving candidates

const PLACEHOLDER_PREFIX: &[u8] = b"[REDACTED:";

static PLACEHOLDER: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(PLACEHOLDER_PREFIX));

#[derive(Debug, Clone, Copy)]
struct Candidate {
    start: usize,
    end: usize,
    kind: SecretKind,
    prio: u8,
}

fn push(found: &mut Vec<Candidate>, start: usize, end: usize, kind: SecretKind, prio: u8) {
    if start < end {
        found.push(Candidate {
            start,
            end,
            kind,
            prio,
        });
    }
}

/// Removes existing placeholders from the candidates, which is what makes redaction
/// idempotent: a candidate inside a placeholder is dropped, one that straddles a placeholder
/// keeps only its parts outside it that still hold an alphanumeric character.
fn exclude_placeholders(s: &str, found: &mut Vec<Candidate>) {
    let b = s.as_bytes();
    let guards: Vec<(usize, usize)> = PLACEHOLDER
        .find_iter(b)
        .map(|start| {
            let after = start + PLACEHOLDER_PREFIX.len();
            let end = memchr::memchr(b']', &b[after..]).map_or(after, |i| after + i + 1);
            (start, end)
        })
        .collect();
    if guards.is_empty() {
        return;
    }
    let mut kept = Vec::with_capacity(found.len());
    for c in found.drain(..) {
        let mut start = c.start;
        for &(g_start, g_end) in &guards {
            if g_end <= start || g_start >= c.end {
                continue;
            }
            if g_start > start {
                keep_part(
                    b,
                    &mut kept,
                    Candidate {
                        start,
                        end: g_start,
                        ..c
                    },
                );
            }
            start = start.max(g_end);
        }
        if start < c.end {
            keep_part(b, &mut kept, Candidate { start, ..c });
        }
    }
    *found = kept;
}

fn keep_part(b: &[u8], kept: &mut Vec<Candidate>, c: Candidate) {
    if b[c.start..c.end].iter().any(|x| x.is_ascii_alphanumeric()) {
        kept.push(c);
    }
}

/// A merged range and the kind it is reported as.
#[derive(Debug, Clone, Copy)]
struct Merged {
    start: usize,
    end: usize,
    kind: SecretKind,
    /// Width and priority of the candidate that named `kind`.
    best: (usize, u8),
}

/// Turns overlapping candidates into disjoint ranges sorted by start: see the module doc.
fn resolve(mut found: Vec<Candidate>) -> Vec<Merged> {
    found.sort_by_key(|c| (c.prio, c.start, std::cmp::Reverse(c.end)));
    let mut accepted: Vec<Candidate> = Vec::with_capacity(found.len());
    'next: for c in found {
        let mut partial = false;
        for a in &accepted {
            if c.start >= a.start && c.end <= a.end {
                continue 'next;
            }
            partial |= c.start < a.end && a.start < c.end;
        }
        if partial && c.kind == SecretKind::Email {
            continue;
        }
        accepted.push(c);
    }
    accepted.sort_by_key(|c| c.start);
    let mut merged: Vec<Merged> = Vec::with_capacity(accepted.len());
    for c in accepted {
        let width = c.end - c.start;
        if let Some(last) = merged.last_mut() {
            if c.start < last.end {
                last.end = last.end.max(c.end);
                if width > last.best.0 || width == last.best.0 && c.prio < last.best.1 {
                    last.kind = c.kind;
                    last.best = (width, c.prio);
                }
                continue;
            }
        }
        merged.push(Merged {
            start: c.start,
            end: c.end,
            kind: c.kind,
            best: (width, c.prio),
        });
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn red(s: &str) -> (String, RedactionCounts) {
        let mut counts = RedactionCounts::default();
        let out = Redactor::builtin().redact(s, &mut counts).into_owned();
        (out, counts)
    }

    /// Redacts, checks idempotence, and returns the output.
    fn check(s: &str) -> String {
        let (out, _) = red(s);
        let (again, counts) = red(&out);
        assert_eq!(again, out, "second pass changed {out:?}");
        assert_eq!(counts.total(), 0, "second pass counted on {out:?}");
        out
    }

    fn assert_redacts(input: &str, expected: &str, kind: SecretKind) {
        let (out, counts) = red(input);
        assert_eq!(out, expected, "input: {input:?}");
        assert!(
            counts.get(kind) >= 1,
            "expected a {kind} count for {input:?}, got {counts:?}"
        );
        check(input);
    }

    fn assert_untouched(input: &str) {
        let mut counts = RedactionCounts::default();
        let out = Redactor::builtin().redact(input, &mut counts);
        assert!(
            matches!(out, Cow::Borrowed(_)),
            "redacted benign {input:?} to {out:?}"
        );
        assert_eq!(counts.total(), 0);
    }

    #[test]
    fn kind_names_are_stable() {
        let names: Vec<&str> = SecretKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "aws_key",
                "bearer_token",
                "jwt",
                "private_key",
                "credential",
                "signed_url",
                "email",
                "card_number",
                "custom"
            ]
        );
        for k in SecretKind::ALL {
            assert_eq!(k.placeholder(), format!("[REDACTED:{}]", k.as_str()));
            assert_eq!(SecretKind::ALL[k as usize], k);
        }
    }

    #[test]
    fn redactor_is_shareable() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Redactor>();
        assert_send_sync::<RedactionCounts>();
    }

    #[test]
    fn counts_add_merge_iter() {
        let mut a = RedactionCounts::default();
        a.add(SecretKind::Email, 2);
        a.add(SecretKind::Jwt, 1);
        let mut b = RedactionCounts::default();
        b.add(SecretKind::Email, 3);
        a.merge(&b);
        assert_eq!(a.get(SecretKind::Email), 5);
        assert_eq!(a.get(SecretKind::AwsKey), 0);
        assert_eq!(a.total(), 6);
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            [(SecretKind::Jwt, 1), (SecretKind::Email, 5)]
        );
    }

    #[test]
    fn aws_access_key_id() {
        assert_redacts(
            "using key AKIAIOSFODNN7EXAMPLE for s3",
            "using key [REDACTED:aws_key] for s3",
            SecretKind::AwsKey,
        );
        assert_redacts(
            r#"{"AccessKeyId":"ASIAY34FZKBOKMUTVV7A"}"#,
            r#"{"AccessKeyId":"[REDACTED:aws_key]"}"#,
            SecretKind::AwsKey,
        );
        // "ASIA" followed by capitals but no digit is a word, not a key id.
        assert_untouched("ASIANMARKETSREPORTQQQQ");
    }

    #[test]
    fn aws_secret_access_key() {
        let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        for (input, expected) in [
            (
                format!("aws_secret_access_key = {secret}"),
                "aws_secret_access_key = [REDACTED:aws_key]".to_string(),
            ),
            (
                format!("AWS_SECRET_ACCESS_KEY={secret}"),
                "AWS_SECRET_ACCESS_KEY=[REDACTED:aws_key]".to_string(),
            ),
            (
                format!(r#"{{"SecretAccessKey": "{secret}"}}"#),
                r#"{"SecretAccessKey": "[REDACTED:aws_key]"}"#.to_string(),
            ),
        ] {
            assert_redacts(&input, &expected, SecretKind::AwsKey);
        }
    }

    #[test]
    fn bearer_and_basic() {
        assert_redacts(
            "Authorization: Bearer abc123.def-456_ghi",
            "Authorization: Bearer [REDACTED:bearer_token]",
            SecretKind::BearerToken,
        );
        assert_redacts(
            "authorization: Basic dXNlcjpwYXNz",
            "authorization: Basic [REDACTED:bearer_token]",
            SecretKind::BearerToken,
        );
        assert_redacts(
            r#"{"headers":{"Authorization":"Bearer sometoken"}}"#,
            r#"{"headers":{"Authorization":"Bearer [REDACTED:bearer_token]"}}"#,
            SecretKind::BearerToken,
        );
        assert_redacts(
            "curl -H 'Authorization: token ghx0123456789'",
            "curl -H 'Authorization: token [REDACTED:bearer_token]'",
            SecretKind::BearerToken,
        );
        // OpenTelemetry records headers as string arrays; JSON structure must survive.
        assert_redacts(
            r#"{"http.request.header.authorization":["Bearer abc.def-123"]}"#,
            r#"{"http.request.header.authorization":["Bearer [REDACTED:bearer_token]"]}"#,
            SecretKind::BearerToken,
        );
        assert_redacts(
            r#"{"ev":"{\"http.request.header.authorization\":[\"Basic dXNlcjpwYXNz\"]}"}"#,
            r#"{"ev":"{\"http.request.header.authorization\":[\"Basic [REDACTED:bearer_token]\"]}"}"#,
            SecretKind::BearerToken,
        );
        assert_redacts(
            "sent Bearer 9f8e7d6c5b4a3210 upstream",
            "sent Bearer [REDACTED:bearer_token] upstream",
            SecretKind::BearerToken,
        );
        assert_redacts(
            "retrying with basic dXNlcjpwYXNz",
            "retrying with basic [REDACTED:bearer_token]",
            SecretKind::BearerToken,
        );
        assert_untouched("bearer tokens are described in RFC 6750");
        assert_untouched("basic information about the account");
    }

    #[test]
    fn jwt() {
        let jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        assert_redacts(&format!("jwt={jwt}"), "jwt=[REDACTED:jwt]", SecretKind::Jwt);
        assert_redacts(
            &format!("cookie value {jwt} end"),
            "cookie value [REDACTED:jwt] end",
            SecretKind::Jwt,
        );
        // In an Authorization header the header rule names the kind.
        assert_redacts(
            &format!("Authorization: Bearer {jwt}"),
            "Authorization: Bearer [REDACTED:bearer_token]",
            SecretKind::BearerToken,
        );
    }

    #[test]
    fn pem_private_key() {
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7\nq0x9Zz+/=\n-----END RSA PRIVATE KEY-----";
        assert_redacts(
            &format!("key:\n{pem}\ndone"),
            "key:\n[REDACTED:private_key]\ndone",
            SecretKind::PrivateKey,
        );
        let escaped = r#"{"key":"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\nkqhkiG9w0B==\n-----END PRIVATE KEY-----\n","x":1}"#;
        assert_redacts(
            escaped,
            r#"{"key":"[REDACTED:private_key]\n","x":1}"#,
            SecretKind::PrivateKey,
        );
        // Truncated block: everything that looks like key material goes.
        assert_redacts(
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA",
            "[REDACTED:private_key]",
            SecretKind::PrivateKey,
        );
    }

    #[test]
    fn credential_styles() {
        let cases = [
            ("password=hunter2", "password=[REDACTED:credential]"),
            (
                "user=bob password=hunter2 status=ok",
                "user=bob password=[REDACTED:credential] status=ok",
            ),
            ("db_password: s3cr3t!", "db_password: [REDACTED:credential]"),
            (
                r#"{"api_key": "abc\"def"}"#,
                r#"{"api_key": "[REDACTED:credential]"}"#,
            ),
            (
                r#"{'client_secret': 'xyz'}"#,
                r#"{'client_secret': '[REDACTED:credential]'}"#,
            ),
            (
                "GET /cb?code=1&access_token=abc123&state=x",
                "GET /cb?code=1&access_token=[REDACTED:credential]&state=x",
            ),
            ("X-Api-Key: 0123abcd", "X-Api-Key: [REDACTED:credential]"),
            ("x-api-key=zzz", "x-api-key=[REDACTED:credential]"),
            ("APIKEY=zzz", "APIKEY=[REDACTED:credential]"),
            (
                "refresh_token => 'r1'",
                "refresh_token => '[REDACTED:credential]'",
            ),
            ("PWD=abc;Server=db", "PWD=[REDACTED:credential];Server=db"),
            ("passwd: x", "passwd: [REDACTED:credential]"),
            ("private_key=pk", "private_key=[REDACTED:credential]"),
            ("auth=abc", "auth=[REDACTED:credential]"),
            (
                "Cookie: session=abc; theme=dark",
                "Cookie: session=[REDACTED:credential]; theme=dark",
            ),
            (
                r#"{"args":"{\"password\": \"hunter2\", \"user\": \"bob\"}"}"#,
                r#"{"args":"{\"password\": \"[REDACTED:credential]\", \"user\": \"bob\"}"}"#,
            ),
            (
                r#"{"a":{"b":{"token":"t-1"}}}"#,
                r#"{"a":{"b":{"token":"[REDACTED:credential]"}}}"#,
            ),
            (
                r#"{"secret": "unterminated"#,
                r#"{"secret": "[REDACTED:credential]"#,
            ),
            (
                r#"{"http.request.header.x-api-key":["k-123"]}"#,
                r#"{"http.request.header.x-api-key":["[REDACTED:credential]"]}"#,
            ),
            (
                r#"{"attrs":"{\"x-api-key\":[\"k-123\"]}"}"#,
                r#"{"attrs":"{\"x-api-key\":[\"[REDACTED:credential]\"]}"}"#,
            ),
        ];
        for (input, expected) in cases {
            assert_redacts(input, expected, SecretKind::Credential);
        }
    }

    #[test]
    fn connection_string_password() {
        assert_redacts(
            "postgres://user:pass@host/db",
            "postgres://user:[REDACTED:credential]@host/db",
            SecretKind::Credential,
        );
        // The host is not an e-mail address.
        assert_redacts(
            "DATABASE_URL=mysql://root:pa55w0rd@db.example.com:3306/app",
            "DATABASE_URL=mysql://root:[REDACTED:credential]@db.example.com:3306/app",
            SecretKind::Credential,
        );
    }

    #[test]
    fn signed_url_parameters() {
        assert_redacts(
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20240101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=abcdef0123&X-Amz-Security-Token=FwoGZX",
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=[REDACTED:signed_url]&X-Amz-Signature=[REDACTED:signed_url]&X-Amz-Security-Token=[REDACTED:signed_url]",
            SecretKind::SignedUrl,
        );
        assert_redacts(
            "https://storage.googleapis.com/b/o?X-Goog-Credential=sa%40p.iam&X-Goog-Signature=0a1b2c",
            "https://storage.googleapis.com/b/o?X-Goog-Credential=[REDACTED:signed_url]&X-Goog-Signature=[REDACTED:signed_url]",
            SecretKind::SignedUrl,
        );
        assert_redacts(
            "https://acct.blob.core.windows.net/c/b?sv=2021-08-06&se=2024&sig=abc%2Bdef%3D",
            "https://acct.blob.core.windows.net/c/b?sv=2021-08-06&se=2024&sig=[REDACTED:signed_url]",
            SecretKind::SignedUrl,
        );
        assert_redacts(
            "https://d1.cloudfront.net/v.mp4?Expires=1700000000&Signature=Ab~cd__&Key-Pair-Id=K2",
            "https://d1.cloudfront.net/v.mp4?Expires=1700000000&Signature=[REDACTED:signed_url]&Key-Pair-Id=K2",
            SecretKind::SignedUrl,
        );
        assert_untouched("config=prod&design=flat");
    }

    #[test]
    fn provider_tokens() {
        for token in [
            "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a",
            "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
            "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOp",
            "AIzaSyA1234567890abcdefghijklmnopqrstuv",
        ] {
            assert_redacts(
                &format!("key {token} used"),
                "key [REDACTED:credential] used",
                SecretKind::Credential,
            );
        }
        assert_untouched("task-abcdefghijklmnopqrstuvwxyz12345");
        assert_untouched("sk-learn-compatible-estimator-module");
    }

    #[test]
    fn email() {
        assert_redacts(
            "contact alice.smith+x@mail.example.co.uk now",
            "contact [REDACTED:email] now",
            SecretKind::Email,
        );
        assert_redacts(
            r#"{"to":"bob@example.com"}"#,
            r#"{"to":"[REDACTED:email]"}"#,
            SecretKind::Email,
        );
        assert_untouched("npm i react@18.2.0 and @types/node");
    }

    #[test]
    fn card_numbers() {
        for (input, expected) in [
            ("card 4111111111111111 ok", "card [REDACTED:card_number] ok"),
            (
                "card 4111 1111 1111 1111 ok",
                "card [REDACTED:card_number] ok",
            ),
            (
                "card 5500-0000-0000-0004 ok",
                "card [REDACTED:card_number] ok",
            ),
            ("amex 378282246310005", "amex [REDACTED:card_number]"),
            ("amex 3782 822463 10005", "amex [REDACTED:card_number]"),
            ("disc 6011111111111117.", "disc [REDACTED:card_number]."),
            ("mc2 2221000000000009", "mc2 [REDACTED:card_number]"),
            (
                r#"{"pan":"4242424242424242"}"#,
                r#"{"pan":"[REDACTED:card_number]"}"#,
            ),
            (
                "4111 1111 1111 1111 2 items",
                "[REDACTED:card_number] 2 items",
            ),
        ] {
            assert_redacts(input, expected, SecretKind::CardNumber);
        }
        // Fails Luhn.
        assert_untouched("card 4111111111111112");
        // Repeated digit.
        assert_untouched("0000000000000000");
        assert_untouched("4444444444444444");
        // Nanosecond and millisecond timestamps.
        assert_untouched("start_time_unix_nano=1764441600000000000");
        assert_untouched("1700000000000");
        // Glued to hex or a decimal point.
        assert_untouched("a4111111111111111b");
        assert_untouched("0.4111111111111111");
    }

    #[test]
    fn custom_patterns() {
        let r = Redactor::new(&[
            r"EMP-\d{6}".to_string(),
            r"ticket:(?P<secret>[a-z]+)".to_string(),
        ])
        .expect("valid patterns");
        let mut counts = RedactionCounts::default();
        let out = r.redact("user EMP-123456 ticket:abcd", &mut counts);
        assert_eq!(out, "user [REDACTED:custom] ticket:[REDACTED:custom]");
        assert_eq!(counts.get(SecretKind::Custom), 2);
        let mut again = RedactionCounts::default();
        assert_eq!(r.redact(&out, &mut again), out);
        assert_eq!(again.total(), 0);

        // A pattern that would match inside a placeholder must not break idempotence.
        let r = Redactor::new(&[r"[A-Z]{5,}".to_string()]).expect("valid pattern");
        let mut counts = RedactionCounts::default();
        let out = r.redact("SECRETWORD here", &mut counts).into_owned();
        assert_eq!(out, "[REDACTED:custom] here");
        assert_eq!(r.redact(&out, &mut counts), out);
        assert_eq!(counts.total(), 1);

        let err = Redactor::new(&["(unclosed".to_string()]).expect_err("invalid pattern");
        assert_eq!(err.pattern, "(unclosed");
        assert!(!err.message.is_empty());
    }

    #[test]
    fn several_secrets_and_counts() {
        let (out, counts) =
            red(r#"{"email":"a@b.io","password":"p","key":"AKIAIOSFODNN7EXAMPLE"}"#);
        assert_eq!(
            out,
            r#"{"email":"[REDACTED:email]","password":"[REDACTED:credential]","key":"[REDACTED:aws_key]"}"#
        );
        assert_eq!(counts.total(), 3);
        assert_eq!(counts.get(SecretKind::Email), 1);
        assert_eq!(counts.get(SecretKind::Credential), 1);
        assert_eq!(counts.get(SecretKind::AwsKey), 1);
    }

    #[test]
    fn no_false_positives() {
        for s in [
            "",
            "search_docs",
            "GET",
            "200",
            "gpt-4o",
            "gpt-4o-mini-2024-07-18",
            "claude-3-5-sonnet-20241022",
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "00f067aa0ba902b7",
            "6e0c63257de34c92bf9efcd03927272e",
            "123e4567-e89b-12d3-a456-426614174000",
            "2025-11-29T12:34:56.789Z",
            "2025-11-29 12:34:56",
            "1764441600000000000",
            "1764441600123456789",
            "https://docs.example.com/app/guide?page=2&lang=en",
            "https://api.example.com/v1/search?q=rust+async",
            "token count 512",
            "password reset flow",
            "max_tokens=512",
            r#"{"input_tokens":1234,"output_tokens":56}"#,
            r#"{"tool":"search_docs","query":"how to rotate keys","results":[{"title":"Guide","url":"https://docs.example.com/guide"}]}"#,
            "the signal was designed for assignment",
            r#"{"usage":{"prompt_tokens":12,"completion_tokens":40,"total_tokens":52}}"#,
            r#"{"session_id":"s-1","auth_required":true,"token_type":"Bearer","expires_in":3600}"#,
            "Signature verification failed for the webhook",
            "tokenizer: cl100k_base",
            "region asia-southeast1, zone asia-east1-b",
            "arn:aws:iam::123456789012:role/agent",
            "mail the user at localhost or @mention them",
            r#"{"error":{"code":"invalid_status","class":"invalid_request","retryable":false,"reference":"err_7c1f9a"}}"#,
        ] {
            assert_untouched(s);
        }
    }

    #[test]
    fn idempotent_on_mixed_text() {
        let input = "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig \
            password=hunter2 mail me@x.io key AKIAIOSFODNN7EXAMPLE card 4111-1111-1111-1111 \
            url https://u:p4ss@h.example.com/x?sig=abc token=abc[REDACTED:credential]";
        let out = check(input);
        for leaked in [
            "eyJ",
            "hunter2",
            "me@x.io",
            "AKIA",
            "4111",
            "p4ss",
            "sig=abc",
            "token=abc",
        ] {
            assert!(!out.contains(leaked), "{leaked} left in {out}");
        }
    }

    #[test]
    fn unicode_around_secrets() {
        let out = check("ключ password=пароль€ и почта ёж@пример.рф AKIAIOSFODNN7EXAMPLE✓");
        assert_eq!(
            out,
            "ключ password=[REDACTED:credential] и почта ёж@пример.рф [REDACTED:aws_key]✓"
        );
    }

    #[test]
    fn secrets_across_chunk_boundaries() {
        // The trigger search folds the input in chunks of 256 and 2048 bytes; secrets must be
        // found wherever they fall.
        for pad in (0..40)
            .chain(240..270)
            .chain(2020..2070)
            .chain([4090, 6000])
        {
            let input = format!(
                "{} password=hunter2 key AKIAIOSFODNN7EXAMPLE me@x.io end",
                " ".repeat(pad)
            );
            let out = check(&input);
            for leaked in ["hunter2", "AKIA", "me@x.io"] {
                assert!(!out.contains(leaked), "{leaked} left at pad {pad}");
            }
        }
    }

    #[test]
    fn long_digit_runs_are_examined_in_batches() {
        let groups: Vec<String> = (100..140).map(|n| n.to_string()).collect();
        let input = format!("ids {} 4111 1111 1111 1111 done", groups.join(" "));
        let out = check(&input);
        assert!(out.ends_with(" 139 [REDACTED:card_number] done"), "{out}");
        assert!(out.starts_with("ids 100 101 102 "), "{out}");
    }

    #[test]
    fn trigger_search_without_teddy_agrees() {
        let patterns: Vec<&str> = TRIGGERS.iter().map(|(t, _, _)| *t).collect();
        let automaton_only = TriggerSearch {
            packed: Vec::new(),
            ..TriggerSearch::new(&patterns)
        };
        let input = format!(
            "{}Authorization: Bearer x; PASSWORD=1 eyJhbGc AKIA sk-1 x-amz-signature {}api_key",
            "z".repeat(2040),
            "q".repeat(300)
        );
        let collect = |t: &TriggerSearch| {
            let mut v = Vec::new();
            t.for_each(input.as_bytes(), |p, i| v.push((p, i)));
            v.sort_unstable();
            v.dedup();
            v
        };
        // Teddy needs SSSE3, which every x86_64 machine this runs on has: make sure the fast
        // path is the one under test.
        #[cfg(target_arch = "x86_64")]
        assert!(!BUILTIN.triggers.packed.is_empty());
        assert_eq!(collect(&BUILTIN.triggers), collect(&automaton_only));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn aws_key() -> impl Strategy<Value = String> {
            "(AKIA|ASIA)[A-Z2-7]{15}[0-9]"
        }

        fn planted() -> impl Strategy<Value = (String, String)> {
            prop_oneof![
                aws_key().prop_map(|k| (k.clone(), k)),
                "[A-Za-z0-9!%*]{6,24}".prop_map(|p| (format!(" password={p} "), p)),
                "[A-Za-z0-9]{6,24}".prop_map(|p| (format!(r#""api_key": "{p}""#), p)),
                "[a-z0-9]{3,10}"
                    .prop_map(|u| (format!(" {u}@corp.example.com "), format!("{u}@corp"))),
                "[A-Za-z0-9_-]{10,30}".prop_map(|t| (format!(" eyJhbGciOi.{t}.sig "), t)),
            ]
        }

        proptest! {
            #[test]
            fn never_panics(s in "\\PC*") {
                let mut counts = RedactionCounts::default();
                let _ = Redactor::builtin().redact(&s, &mut counts);
            }

            #[test]
            fn never_panics_bytes_like(s in "[ -~\\n\\\\\"']{0,200}") {
                let mut counts = RedactionCounts::default();
                let out = Redactor::builtin().redact(&s, &mut counts).into_owned();
                let mut again = RedactionCounts::default();
                prop_assert_eq!(Redactor::builtin().redact(&out, &mut again), out.clone());
            }

            #[test]
            fn planted_secret_never_survives(
                before in "[a-z ,.:{}\"]{0,40}",
                after in "[a-z ,.:{}\"]{0,40}",
                (text, secret) in planted(),
            ) {
                let input = format!("{before}{text}{after}");
                let mut counts = RedactionCounts::default();
                let out = Redactor::builtin().redact(&input, &mut counts).into_owned();
                prop_assert!(!out.contains(&secret), "{:?} survived in {:?}", secret, out);
                prop_assert!(counts.total() >= 1);
                let mut again = RedactionCounts::default();
                prop_assert_eq!(Redactor::builtin().redact(&out, &mut again), out.clone());
                prop_assert_eq!(again.total(), 0);
            }

            #[test]
            fn trigger_search_paths_agree(
                parts in proptest::collection::vec(
                    prop_oneof![
                        "[a-zA-Z _:=@.-]{0,40}",
                        proptest::sample::select(TRIGGERS.iter().map(|(t, _, _)| *t).collect::<Vec<_>>())
                            .prop_map(|t| if t.len() % 2 == 0 { t.to_ascii_uppercase() } else { t.to_string() }),
                    ],
                    0..200,
                ),
            ) {
                let input = parts.concat();
                let patterns: Vec<&str> = TRIGGERS.iter().map(|(t, _, _)| *t).collect();
                let automaton_only = TriggerSearch { packed: Vec::new(), ..TriggerSearch::new(&patterns) };
                let mut teddy = Vec::new();
                BUILTIN.triggers.for_each(input.as_bytes(), |p, i| teddy.push((p, p + TRIGGERS[i].0.len())));
                let mut automaton = Vec::new();
                automaton_only.for_each(input.as_bytes(), |p, i| automaton.push((p, p + TRIGGERS[i].0.len())));
                // Teddy reports no more than the automaton, and misses only occurrences that
                // overlap one it reported.
                for hit in &teddy {
                    prop_assert!(automaton.contains(hit), "{:?} not an occurrence in {:?}", hit, input);
                }
                for &(start, end) in &automaton {
                    prop_assert!(
                        teddy.iter().any(|&(s, e)| s < end && start < e),
                        "missed {:?} in {:?}", &input[start..end], input
                    );
                }
            }

            #[test]
            fn planted_key_in_arbitrary_text(before in "\\PC{0,60}", after in "\\PC{0,60}", key in aws_key()) {
                let input = format!("{before}{key}{after}");
                let mut counts = RedactionCounts::default();
                let out = Redactor::builtin().redact(&input, &mut counts);
                prop_assert!(!out.contains(&key));
            }
        }
    }
}

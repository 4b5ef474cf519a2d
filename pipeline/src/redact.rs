//! Secret redaction for span attribute values and captured payloads.
//!
//! [`Redactor::redact`] finds secrets in free text (URLs, JSON text, YAML-ish `key: value`
//! lines, HTTP headers, query strings, log lines) and replaces each with
//! `[REDACTED:<kind>]`. For key/value credentials only the value is replaced:
//! `password=[REDACTED:credential]`, `"api_key": "[REDACTED:credential]"`,
//! `Authorization: Bearer [REDACTED:bearer_token]`.
//!
//! Values whose key names a secret (`password`, `db.password`, `api_key`, `token`,
//! `aws.secret_access_key`, `http.request.header.authorization`, ...) are redacted whole,
//! whatever they look like: [`sensitive_key`] decides from the key alone (the rule is in its
//! module, `keys.rs`), [`Redactor::redact_keyed`] replaces the value. Bytes values are redacted
//! as the text they hold ([`Redactor::redact_bytes`]).
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

use regex::{Regex, RegexSet};

mod cards;
mod keys;
mod resolve;
mod rules;
#[cfg(test)]
mod tests;

use cards::{find_cards, may_hold_card};
pub use keys::sensitive_key;
use resolve::{exclude_placeholders, push, resolve, Candidate, PRIO_CUSTOM};
use rules::{Builtin, BUILTIN};

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

    /// The text that replaces a secret of this kind: `[REDACTED:<name>]`.
    pub fn placeholder(self) -> &'static str {
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
    /// Which rules these are, for the per-thread memo of clean values: 0 for the built-in
    /// rules alone, a number of its own for each redactor with custom patterns.
    rules_id: u64,
}

/// Values shorter than this are remembered when found clean.
const MEMO_MAX_LEN: usize = 256;
/// At most this many values, and about this many bytes, are remembered per thread; the memo
/// starts over when full. Small, because every thread that redacts has one (the receiver runs
/// requests on the blocking pool): at most ~128 KiB of strings plus the table, per thread.
const MEMO_MAX_ENTRIES: usize = 2048;
const MEMO_MAX_BYTES: usize = 128 << 10;

/// Short values found clean by one set of rules, per thread. Span attributes repeat a small
/// vocabulary (agent, model and tool names, call ids shared by a call's spans, error codes),
/// and a memo hit (a hash and a compare) costs a fraction of the scan. Only values the scan
/// returned unchanged are remembered, so a hit is exactly what the scan would have answered.
struct CleanMemo {
    rules_id: u64,
    clean: std::collections::HashSet<Box<str>, foldhash::fast::RandomState>,
    /// Bytes of the strings in `clean`.
    bytes: usize,
}

impl CleanMemo {
    fn clear(&mut self) {
        self.clean.clear();
        self.bytes = 0;
    }
}

thread_local! {
    static CLEAN_MEMO: std::cell::RefCell<CleanMemo> = std::cell::RefCell::new(CleanMemo {
        rules_id: 0,
        clean: Default::default(),
        bytes: 0,
    });
}

/// Runs `f` on this thread's memo; `None` (scan without it) while the thread is being torn
/// down or the memo is in use further up the stack, never a panic.
fn with_memo<T>(f: impl FnOnce(&mut CleanMemo) -> T) -> Option<T> {
    CLEAN_MEMO
        .try_with(|m| m.try_borrow_mut().ok().map(|mut m| f(&mut m)))
        .ok()
        .flatten()
}

/// Numbers for redactors with custom patterns (0 is the built-in rules alone).
static NEXT_RULES_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

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
        let rules_id = if custom.is_empty() {
            0
        } else {
            NEXT_RULES_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        };
        Ok(Redactor {
            builtin: &BUILTIN,
            custom,
            custom_set,
            rules_id,
        })
    }

    /// Built-in patterns only.
    pub fn builtin() -> Redactor {
        Redactor {
            builtin: &BUILTIN,
            custom: Vec::new(),
            custom_set: None,
            rules_id: 0,
        }
    }

    /// Redacts `s`; returns `Cow::Borrowed` (no allocation) when nothing matched — the common
    /// case must be fast. Each placeholder written adds one to `counts` under its kind.
    pub fn redact<'a>(&self, s: &'a str, counts: &mut RedactionCounts) -> Cow<'a, str> {
        if s.len() >= MEMO_MAX_LEN {
            return self.scan(s, counts);
        }
        let known = with_memo(|m| {
            if m.rules_id != self.rules_id {
                m.clear();
                m.rules_id = self.rules_id;
            }
            m.clean.contains(s)
        });
        if known == Some(true) {
            return Cow::Borrowed(s);
        }
        let r = self.scan(s, counts);
        if known.is_some() && matches!(r, Cow::Borrowed(_)) {
            with_memo(|m| {
                if m.clean.len() >= MEMO_MAX_ENTRIES || m.bytes + s.len() > MEMO_MAX_BYTES {
                    m.clear();
                }
                if m.clean.insert(s.into()) {
                    m.bytes += s.len();
                }
            });
        }
        r
    }

    /// [`Redactor::redact`] without the memo: every rule applied to `s`.
    fn scan<'a>(&self, s: &'a str, counts: &mut RedactionCounts) -> Cow<'a, str> {
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

    /// Redacts the value of an attribute whose key names a secret ([`sensitive_key`] gave
    /// `kind`): the value rules' result when it leaves nothing but placeholders and
    /// `Authorization` scheme words (`[REDACTED:jwt]`, `Bearer [REDACTED:bearer_token]`: the more
    /// specific kind), otherwise one placeholder of `kind` for the whole value, counted once. An
    /// empty value, a `null`/`true`/`false`/`none`/`undefined` literal and a value already
    /// redacted that way are kept as they are and not counted, as the `key=value` rule leaves
    /// them; so a second pass changes nothing.
    pub fn redact_keyed<'a>(
        &self,
        kind: SecretKind,
        s: &'a str,
        counts: &mut RedactionCounts,
    ) -> Cow<'a, str> {
        if !keyed_value_is_secret(s) {
            return Cow::Borrowed(s);
        }
        let mut found = RedactionCounts::default();
        if let Cow::Owned(r) = self.redact(s, &mut found) {
            if only_placeholders_and_schemes(&r) {
                counts.merge(&found);
                return Cow::Owned(r);
            }
        }
        counts.add(kind, 1);
        Cow::Borrowed(kind.placeholder())
    }

    /// Redacts the text inside a bytes value (OTLP `bytes_value`).
    ///
    /// Each run of valid UTF-8 in `b` is redacted like a string and every other byte is kept,
    /// so a value without secrets comes back borrowed and unchanged, and one with secrets comes
    /// back as the same bytes with each secret replaced by its placeholder's bytes. Callers
    /// keep their representation (toolspan stores bytes as hex): decoding the stored hex gives
    /// the redacted text, never the secret.
    pub fn redact_bytes<'a>(&self, b: &'a [u8], counts: &mut RedactionCounts) -> Cow<'a, [u8]> {
        if let Ok(s) = std::str::from_utf8(b) {
            return match self.redact(s, counts) {
                Cow::Borrowed(_) => Cow::Borrowed(b),
                Cow::Owned(r) => Cow::Owned(r.into_bytes()),
            };
        }
        let mut out: Option<Vec<u8>> = None;
        let mut done = 0;
        for chunk in b.utf8_chunks() {
            let valid = chunk.valid();
            let at = done;
            done += valid.len() + chunk.invalid().len();
            match self.redact(valid, counts) {
                Cow::Borrowed(_) => {
                    if let Some(o) = out.as_mut() {
                        o.extend_from_slice(&b[at..done]);
                    }
                }
                Cow::Owned(r) => {
                    let o = out.get_or_insert_with(|| b[..at].to_vec());
                    o.extend_from_slice(r.as_bytes());
                    o.extend_from_slice(chunk.invalid());
                }
            }
        }
        match out {
            Some(o) => Cow::Owned(o),
            None => Cow::Borrowed(b),
        }
    }
}

/// Whether a value under a secret-naming key is worth a placeholder: see
/// [`Redactor::redact_keyed`].
fn keyed_value_is_secret(s: &str) -> bool {
    if s.is_empty()
        || ["null", "true", "false", "none", "undefined"]
            .iter()
            .any(|w| s.eq_ignore_ascii_case(w))
    {
        return false;
    }
    !only_placeholders_and_schemes(s)
}

/// `s` after the placeholder it starts with, if it starts with one.
fn strip_placeholder(s: &str) -> Option<&str> {
    let rest = s.strip_prefix("[REDACTED:")?;
    let end = rest.find(']')?;
    let kind = &rest[..end];
    (!kind.is_empty() && kind.bytes().all(|c| c.is_ascii_lowercase() || c == b'_'))
        .then(|| &rest[end + 1..])
}

/// True when `s` is whitespace-separated placeholders (each word one or more of them) and
/// `Authorization` scheme words only: nothing of the original value is left.
fn only_placeholders_and_schemes(s: &str) -> bool {
    s.split_ascii_whitespace().all(|word| {
        if rules::AUTH_SCHEMES
            .iter()
            .any(|w| word.eq_ignore_ascii_case(w))
        {
            return true;
        }
        let mut rest = word;
        while let Some(after) = strip_placeholder(rest) {
            if after.is_empty() {
                return true;
            }
            rest = after;
        }
        false
    })
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

//! Attribute keys whose value is a secret whatever it looks like.
//!
//! The value rules find secrets by their shape or by a `key=value` inside the text; a bare
//! value (`password` → `hunter2`) has neither. Like the OpenTelemetry Collector's redaction
//! processor with `blocked_key_patterns`, the key then decides.
//!
//! The rule looks only at the key's last dotted component, split into words at `_`, `-`,
//! spaces and camelCase humps (`x-api-key` → `x api key`, `secretAccessKey` →
//! `secret access key`), compared ASCII case-insensitively. The key names a secret when
//! - its last word ends with `password`, `passwd`, `pwd`, `passphrase`, `secret`, `token`,
//!   `apikey`, `auth`, `authorization`, `credential`, `credentials`, `cookie`, `sessionid`,
//!   `sessid`, `privatekey`, `secretkey` or `accesskey` (so `oauth`, `accesstoken`,
//!   `set-cookie` and `jsessionid` count), or is `pass`;
//! - or its last two words are `api key`, `private key`, `secret key`, `access key`,
//!   `signing key`, `encryption key`, `master key`, `session key` or `session id`.
//!
//! Counts and plurals are other words, so `gen_ai.usage.input_tokens`, `max_tokens`,
//! `llm.token_count.prompt`, `tokenizer`, `token_type` and `auth_required` are left alone, and
//! only the last dotted component counts, so `session.id` (OpenInference's conversation id)
//! and `password.length` are too. No key toolspan reads for classification (`gen_ai.*`,
//! `toolspan.*`, `error.type`, `http.*` status and size keys) matches.
//!
//! The whole value becomes one placeholder of the kind the value rules give the same name
//! (`aws_key` for a secret access key, `bearer_token` for an `Authorization` header,
//! `credential` otherwise), unless the value rules already leave nothing of it but placeholders
//! and an `Authorization` scheme (`[REDACTED:jwt]`, `Bearer [REDACTED:bearer_token]`), whose more
//! specific kinds are kept; see `Redactor::redact_keyed`.

use super::SecretKind;

/// Endings of the last word that name a secret, most specific first (the first match names
/// the kind).
const WORD_ENDINGS: &[(&str, SecretKind)] = &[
    ("secretaccesskey", SecretKind::AwsKey),
    ("authorization", SecretKind::BearerToken),
    ("password", SecretKind::Credential),
    ("passwd", SecretKind::Credential),
    ("pwd", SecretKind::Credential),
    ("passphrase", SecretKind::Credential),
    ("secret", SecretKind::Credential),
    ("token", SecretKind::Credential),
    ("apikey", SecretKind::Credential),
    ("auth", SecretKind::Credential),
    ("credential", SecretKind::Credential),
    ("credentials", SecretKind::Credential),
    ("cookie", SecretKind::Credential),
    ("sessionid", SecretKind::Credential),
    ("sessid", SecretKind::Credential),
    ("privatekey", SecretKind::Credential),
    ("secretkey", SecretKind::Credential),
    ("accesskey", SecretKind::Credential),
];

/// Whole last words that name a secret (as endings they would catch `bypass`, `compass`).
const WORDS: &[&str] = &["pass"];

/// Words before a last word `key` that make it a secret.
const BEFORE_KEY: &[&str] = &[
    "api",
    "private",
    "secret",
    "access",
    "signing",
    "encryption",
    "master",
    "session",
];

/// The last letters of every name above (`key` and `id` included).
const LAST_LETTERS: &[u8] = b"dehlnsty";

/// The kind of secret an attribute with this key holds, when its name says it holds one; see
/// the module documentation for the rule.
pub fn sensitive_key(key: &str) -> Option<SecretKind> {
    let b = key.as_bytes();
    let component = match memchr::memrchr(b'.', b) {
        Some(i) => &b[i + 1..],
        None => b,
    };
    // Most keys end in a letter no secret name ends in: decided without splitting words.
    let last = component
        .iter()
        .rev()
        .find(|c| !matches!(c, b'_' | b'-' | b' '));
    if !last.is_some_and(|c| LAST_LETTERS.contains(&c.to_ascii_lowercase())) {
        return None;
    }
    let [w0, w1, w2] = last_words(component);
    if w2.is_empty() {
        return None;
    }
    for (ending, kind) in WORD_ENDINGS {
        if ends_with_ignore_case(w2, ending) {
            return Some(*kind);
        }
    }
    if WORDS.iter().any(|w| w2.eq_ignore_ascii_case(w.as_bytes())) {
        return Some(SecretKind::Credential);
    }
    if w2.eq_ignore_ascii_case(b"key")
        && BEFORE_KEY
            .iter()
            .any(|w| w1.eq_ignore_ascii_case(w.as_bytes()))
    {
        let aws = w1.eq_ignore_ascii_case(b"access") && w0.eq_ignore_ascii_case(b"secret");
        return Some(if aws {
            SecretKind::AwsKey
        } else {
            SecretKind::Credential
        });
    }
    if w2.eq_ignore_ascii_case(b"id") && w1.eq_ignore_ascii_case(b"session") {
        return Some(SecretKind::Credential);
    }
    None
}

fn ends_with_ignore_case(word: &[u8], ending: &str) -> bool {
    word.len() >= ending.len()
        && word[word.len() - ending.len()..].eq_ignore_ascii_case(ending.as_bytes())
}

/// The last three words of `c` (empty where there are fewer), last one last.
fn last_words(c: &[u8]) -> [&[u8]; 3] {
    fn close<'a>(words: &mut [&'a [u8]; 3], word: &'a [u8]) {
        words.rotate_left(1);
        words[2] = word;
    }
    let mut words: [&[u8]; 3] = [&[], &[], &[]];
    let mut start: Option<usize> = None;
    for i in 0..c.len() {
        let sep = matches!(c[i], b'_' | b'-' | b' ');
        match start {
            Some(s) if sep => {
                close(&mut words, &c[s..i]);
                start = None;
            }
            Some(s) if is_hump(c, i) => {
                close(&mut words, &c[s..i]);
                start = Some(i);
            }
            None if !sep => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        close(&mut words, &c[s..]);
    }
    words
}

/// True when a camelCase word starts at `i` (> 0): `apiKey`, `oauth2Token`, `APIKey`.
fn is_hump(c: &[u8], i: usize) -> bool {
    let (prev, cur) = (c[i - 1], c[i]);
    cur.is_ascii_uppercase()
        && (prev.is_ascii_lowercase()
            || prev.is_ascii_digit()
            || prev.is_ascii_uppercase() && c.get(i + 1).is_some_and(u8::is_ascii_lowercase))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_at_separators_and_humps() {
        let words =
            |s: &str| last_words(s.as_bytes()).map(|w| String::from_utf8_lossy(w).into_owned());
        assert_eq!(words("secret_access_key"), ["secret", "access", "key"]);
        assert_eq!(words("secretAccessKey"), ["secret", "Access", "Key"]);
        assert_eq!(words("x-api-key"), ["x", "api", "key"]);
        assert_eq!(words("APIKey"), ["", "API", "Key"]);
        assert_eq!(words("oauth2Token"), ["", "oauth2", "Token"]);
        assert_eq!(words("__password__"), ["", "", "password"]);
        assert_eq!(words(""), ["", "", ""]);
    }

    #[test]
    fn last_letters_cover_every_name() {
        let names = WORD_ENDINGS
            .iter()
            .map(|(w, _)| *w)
            .chain(WORDS.iter().copied())
            .chain(["key", "id"]);
        for name in names {
            let last = name.as_bytes()[name.len() - 1];
            assert!(LAST_LETTERS.contains(&last), "{name}");
        }
    }

    #[test]
    fn secret_names() {
        for (key, kind) in [
            ("password", SecretKind::Credential),
            ("db.password", SecretKind::Credential),
            ("DB_PASSWORD", SecretKind::Credential),
            ("smtp.pass", SecretKind::Credential),
            ("passwd", SecretKind::Credential),
            ("api_key", SecretKind::Credential),
            ("apiKey", SecretKind::Credential),
            ("openai.apikey", SecretKind::Credential),
            ("http.request.header.x-api-key", SecretKind::Credential),
            ("token", SecretKind::Credential),
            ("access_token", SecretKind::Credential),
            ("refreshToken", SecretKind::Credential),
            ("http.request.header.x-auth-token", SecretKind::Credential),
            ("aws.secret_access_key", SecretKind::AwsKey),
            ("AWS_SECRET_ACCESS_KEY", SecretKind::AwsKey),
            ("SecretAccessKey", SecretKind::AwsKey),
            ("secretaccesskey", SecretKind::AwsKey),
            ("minio.access_key", SecretKind::Credential),
            ("client_secret", SecretKind::Credential),
            ("auth", SecretKind::Credential),
            ("oauth", SecretKind::Credential),
            ("http.request.header.authorization", SecretKind::BearerToken),
            (
                "http.request.header.proxy-authorization",
                SecretKind::BearerToken,
            ),
            ("private_key", SecretKind::Credential),
            ("tls.privateKey", SecretKind::Credential),
            ("credentials", SecretKind::Credential),
            ("http.request.header.cookie", SecretKind::Credential),
            ("http.response.header.set-cookie", SecretKind::Credential),
            ("session_id", SecretKind::Credential),
            ("JSESSIONID", SecretKind::Credential),
            ("PHPSESSID", SecretKind::Credential),
            ("webhook.signing_key", SecretKind::Credential),
            ("wifi passphrase", SecretKind::Credential),
        ] {
            assert_eq!(sensitive_key(key), Some(kind), "{key}");
        }
    }

    #[test]
    fn telemetry_names_are_not_secrets() {
        for key in [
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "gen_ai.usage.cache_read.input_tokens",
            "gen_ai.request.max_tokens",
            "max_tokens",
            "llm.token_count.prompt",
            "llm.token_count.completion",
            "llm.token_count.total",
            "tokenizer",
            "token_type",
            "token_count",
            "tokens",
            "auth_required",
            "auth.method",
            "authenticated",
            "author",
            "password.length",
            "password_reset_required",
            "session.id",
            "gen_ai.conversation.id",
            "k8s.secret.name",
            "secret_name",
            "cache.key",
            "messaging.kafka.message.key",
            "idempotency_key",
            "aws.access_key_id",
            "bypass",
            "compass",
            "http.request.header.content-length",
            "http.response.status_code",
            "http.request.method",
            "server.address",
            "error.type",
            "exception.message",
            "exception.stacktrace",
            "service.name",
            "tenant.id",
            "",
            ".",
            "_",
        ] {
            assert_eq!(sensitive_key(key), None, "{key}");
        }
        // Every key toolspan reads for classification or a column.
        for key in [
            "gen_ai.operation.name",
            "gen_ai.tool.name",
            "gen_ai.tool.call.id",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
            "gen_ai.agent.name",
            "gen_ai.request.model",
            "tool.name",
            "llm.model_name",
            "openinference.span.kind",
            "input.value",
            "output.value",
            "traceloop.span.kind",
            "traceloop.entity.name",
            "traceloop.entity.input",
            "traceloop.entity.output",
            "http.status_code",
            "toolspan.stage",
            "toolspan.attempt",
            "toolspan.error.code",
            "toolspan.error.class",
            "toolspan.error.retryable",
            "toolspan.error.retry_after_ms",
            "toolspan.error.reference",
        ] {
            assert_eq!(sensitive_key(key), None, "{key}");
        }
    }
}

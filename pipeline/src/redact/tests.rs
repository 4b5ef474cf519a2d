use super::rules::TRIGGERS;
use super::*;
use crate::trigger::TriggerSearch;

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
fn provider_tokens_after_an_underscore() {
    // `_` joins words in identifiers, so a token glued on with it starts a token all the same.
    for (input, expected) in [
        (
            "key_with_ghp_1234567890abcdefghijklmnopqrstuvwxyzAB",
            "key_with_[REDACTED:credential]",
        ),
        (
            "GH_TOKEN_gho_16C7e42F292c6912E7710c838347Ae178B4a",
            "GH_TOKEN_[REDACTED:credential]",
        ),
        (
            "STRIPE_sk_live_4eC39HqLyjWDarjtT1zdp7dc",
            "STRIPE_[REDACTED:credential]",
        ),
        (
            "openai_sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a",
            "openai_[REDACTED:credential]",
        ),
        (
            "slack_xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOp",
            "slack_[REDACTED:credential]",
        ),
        (
            "maps_AIzaSyA1234567890abcdefghijklmnopqrstuv",
            "maps_[REDACTED:credential]",
        ),
        (
            "x=_github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
            "x=_[REDACTED:credential]",
        ),
    ] {
        assert_redacts(input, expected, SecretKind::Credential);
    }
    // A prefix inside a word is still not a token.
    for benign in [
        "task-abcdefghijklmnopqrstuvwxyz12345",
        "desk_test_abcdefghijklmnopqrstuvwxyz",
        "whiskey_sk-learn-compatible-estimator-module",
        "brighp_abcdefghijklmnopqrstuvwxyz0123456789",
        "config_ghp_setting_name_is_long_enough_here",
        "kitsk_live_4eC39HqLyjWDarjtT1zdp7dc",
    ] {
        assert_untouched(benign);
    }
}

#[test]
fn keyed_values() {
    let r = Redactor::builtin();
    let keyed = |key: &str, value: &str| {
        let kind = sensitive_key(key).expect("names a secret");
        let mut counts = RedactionCounts::default();
        let out = r.redact_keyed(kind, value, &mut counts).into_owned();
        let mut again = RedactionCounts::default();
        assert_eq!(
            r.redact_keyed(kind, &out, &mut again),
            out,
            "second pass changed {out:?}"
        );
        assert_eq!(again.total(), 0, "second pass counted on {out:?}");
        (out, counts)
    };
    let (out, counts) = keyed("db.password", "hunter2");
    assert_eq!(out, "[REDACTED:credential]");
    assert_eq!(counts.get(SecretKind::Credential), 1);
    let (out, counts) = keyed(
        "aws.secret_access_key",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    );
    assert_eq!(out, "[REDACTED:aws_key]");
    assert_eq!(counts.get(SecretKind::AwsKey), 1);
    // A value the value rules cover entirely keeps their more specific kind.
    let (out, counts) = keyed(
        "http.request.header.authorization",
        "Bearer abcDEF123ghiJKL456",
    );
    assert_eq!(out, "Bearer [REDACTED:bearer_token]");
    assert_eq!(counts.total(), 1);
    let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
    let (out, _) = keyed("auth.token", jwt);
    assert_eq!(out, "[REDACTED:jwt]");
    // One they cover partly is redacted whole: nothing of it is left.
    let (out, counts) = keyed("password", "hunter2 AKIAIOSFODNN7EXAMPLE");
    assert_eq!(out, "[REDACTED:credential]");
    assert_eq!(counts.total(), 1);
    let (out, _) = keyed("api_key", "token=abc123");
    assert_eq!(out, "[REDACTED:credential]");
    // Nothing to hide, or hidden already: kept, not counted.
    for value in [
        "",
        "null",
        "None",
        "[REDACTED:credential]",
        "Bearer [REDACTED:bearer_token]",
    ] {
        let (out, counts) = keyed("token", value);
        assert_eq!(out, value);
        assert_eq!(counts.total(), 0, "{value:?}");
    }
    let (out, _) = keyed("token", "[REDACTED:credential]x");
    assert_eq!(out, "[REDACTED:credential]");
}

#[test]
fn bytes_values() {
    let r = Redactor::builtin();
    let mut counts = RedactionCounts::default();
    // No secret: the same bytes, borrowed.
    let plain = b"\x00\x01binary\xff\xfe";
    assert!(matches!(
        r.redact_bytes(plain, &mut counts),
        Cow::Borrowed(_)
    ));
    assert_eq!(counts.total(), 0);
    // Valid UTF-8: redacted like a string.
    let out = r.redact_bytes(b"password=hunter2", &mut counts);
    assert_eq!(&*out, b"password=[REDACTED:credential]");
    // Invalid bytes around the text are kept as they are.
    let out = r.redact_bytes(
        b"\xff\x00key AKIAIOSFODNN7EXAMPLE\xfe\x80 me@x.io\xc3",
        &mut counts,
    );
    assert_eq!(
        &*out,
        b"\xff\x00key [REDACTED:aws_key]\xfe\x80 [REDACTED:email]\xc3"
    );
    assert_eq!(counts.get(SecretKind::Credential), 1);
    assert_eq!(counts.get(SecretKind::AwsKey), 1);
    assert_eq!(counts.get(SecretKind::Email), 1);
    let mut again = RedactionCounts::default();
    assert_eq!(r.redact_bytes(&out, &mut again), out);
    assert_eq!(again.total(), 0);
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
    let (out, counts) = red(r#"{"email":"a@b.io","password":"p","key":"AKIAIOSFODNN7EXAMPLE"}"#);
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
            "[a-z0-9]{3,10}".prop_map(|u| (format!(" {u}@corp.example.com "), format!("{u}@corp"))),
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

#[test]
fn a_value_remembered_clean_by_one_redactor_is_scanned_again_by_one_with_other_rules() {
    // The per-thread memo of clean values belongs to one set of rules: a value the built-in
    // rules leave alone must still meet a custom pattern, however the two alternate.
    let builtin = Redactor::builtin();
    let custom = Redactor::new(&["ticket-(?P<secret>[0-9]+)".to_string()]).expect("pattern");
    let other = Redactor::new(&["ticket-(?P<secret>[0-9]+)".to_string()]).expect("pattern");
    let s = "ticket-4711";
    for _ in 0..3 {
        let mut c = RedactionCounts::default();
        assert_eq!(builtin.redact(s, &mut c), s);
        assert_eq!(c.total(), 0);
        let mut c = RedactionCounts::default();
        assert_eq!(custom.redact(s, &mut c), "ticket-[REDACTED:custom]");
        assert_eq!(c.total(), 1, "counted at every call, memo or not");
        let mut c = RedactionCounts::default();
        assert_eq!(other.redact(s, &mut c), "ticket-[REDACTED:custom]");
    }
    // A value the custom rules found clean is remembered for them and stays clean.
    let mut c = RedactionCounts::default();
    assert_eq!(custom.redact("ticket-none", &mut c), "ticket-none");
    assert_eq!(custom.redact("ticket-none", &mut c), "ticket-none");
    assert_eq!(c.total(), 0);
}

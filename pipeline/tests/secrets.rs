//! A corpus of secrets placed in every kind of location a span has: none survives in any
//! string of the batch or of Parquet written from it (as text, or as the hex bytes values are
//! stored as), and the redaction counts match.
//!
//! Three corpora, each planted in every location it can occur in, one span per placement:
//! secrets in text (`CORPUS` × `TEXT_LOCATIONS`), bare values under keys that name a secret
//! (`KEYED` × `KV_LOCATIONS`), and secrets inside bytes values (`BYTES` × `KV_LOCATIONS` and the
//! payload attributes).

use std::collections::BTreeMap;

use arrow::array::{Array, RecordBatch};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::common::v1::{
    any_value::Value, AnyValue, ArrayValue, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use toolspan_pipeline::redact::SecretKind;
use toolspan_pipeline::Pipeline;

/// (kind, text as planted, the part that must never be stored)
const CORPUS: &[(SecretKind, &str, &str)] = &[
    (SecretKind::AwsKey, "AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    (SecretKind::AwsKey, "ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A"),
    (SecretKind::BearerToken, "Authorization: Bearer abcDEF123ghiJKL456mnoPQR789", "abcDEF123ghiJKL456mnoPQR789"),
    (SecretKind::BearerToken, "bearer ya29.a0AfH6SMBx3kLmNoPqRsTuVwXyZ", "ya29.a0AfH6SMBx3kLmNoPqRsTuVwXyZ"),
    (SecretKind::Jwt, "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
    (SecretKind::Jwt, "token is eyJraWQiOiJrMSJ9.eyJhZG1pbiI6dHJ1ZX0.ZGVtby1zaWduYXR1cmUtdmFsdWU and more", "ZGVtby1zaWduYXR1cmUtdmFsdWU"),
    (SecretKind::PrivateKey, "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAsecretkeymaterialAAAA\nBBBBmoresecretkeymaterial==\n-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEAsecretkeymaterialAAAA"),
    (SecretKind::PrivateKey, "{\"key\":\"-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\n-----END PRIVATE KEY-----\"}", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
    (SecretKind::Credential, "login with password=Hunter2-Sup3rS3cret! please", "Hunter2-Sup3rS3cret!"),
    (SecretKind::Credential, "https://api.example.com/v1?token=tok9f8e7d6c5b4a3f2e1d&page=2", "tok9f8e7d6c5b4a3f2e1d"),
    (SecretKind::Credential, "api_key=ak_live_51HxYzAbCdEfGhIj", "ak_live_51HxYzAbCdEfGhIj"),
    (SecretKind::Credential, "{\"client_secret\": \"cs_QWErty123456789\", \"scope\": \"read\"}", "cs_QWErty123456789"),
    (SecretKind::Credential, "postgres://admin:PgS3cretPass@db.internal:5432/app", "PgS3cretPass"),
    (SecretKind::Credential, "secret: yaml_s3cr3t_value_42", "yaml_s3cr3t_value_42"),
    (SecretKind::Credential, "x-api-key: XAPIKEY0987654321abc", "XAPIKEY0987654321abc"),
    (SecretKind::Credential, "refresh_token=rt_AAAABBBBCCCCDDDD1111", "rt_AAAABBBBCCCCDDDD1111"),
    (SecretKind::Credential, "openai key sk-proj-abcdefghijklmnopqrstuvwxyz0123456789", "abcdefghijklmnopqrstuvwxyz0123456789"),
    (SecretKind::Credential, "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB", "1234567890abcdefghijklmnopqrstuvwxyzAB"),
    // Provider tokens glued on with `_` (an identifier's separator, not part of a word).
    (SecretKind::Credential, "key_with_ghp_0987654321ZYXWVUTSRQPONMLKJIHGFEDCBAzy", "0987654321ZYXWVUTSRQPONMLKJIHGFEDCBAzy"),
    (SecretKind::Credential, "GITHUB_TOKEN_VALUE_gho_16C7e42F292c6912E7710c838347Ae178B4a", "16C7e42F292c6912E7710c838347Ae178B4a"),
    (SecretKind::Credential, "stripe_sk_live_4eC39HqLyjWDarjtT1zdp7dcZZ", "4eC39HqLyjWDarjtT1zdp7dcZZ"),
    (SecretKind::Credential, "maps_AIzaSyB9876543210zyxwvutsrqponmlkjihgfe", "SyB9876543210zyxwvutsrqponmlkjihgfe"),
    (SecretKind::Credential, "slack xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOpQrStUvWx"),
    (SecretKind::Credential, "AIzaSyA1234567890abcdefghijklmnopqrstuv", "SyA1234567890abcdefghijklmnopqrstuv"),
    (SecretKind::SignedUrl, "https://b.s3.amazonaws.com/f.pdf?X-Amz-Date=20261129&X-Amz-Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024", "fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024"),
    (SecretKind::SignedUrl, "https://storage.googleapis.com/b/o?X-Goog-Signature=0123abcd4567ef890123abcd4567ef89", "0123abcd4567ef890123abcd4567ef89"),
    (SecretKind::SignedUrl, "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=AbCdEf0123456789xYzQ%3D", "AbCdEf0123456789xYzQ"),
    (SecretKind::Email, "contact alice.smith@example.com today", "alice.smith@example.com"),
    (SecretKind::Email, "bob+test@corp.example.org", "bob+test@corp.example.org"),
    (SecretKind::Email, "{\"to\":\"carol@example.net\"}", "carol@example.net"),
    (SecretKind::CardNumber, "card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111"),
    (SecretKind::CardNumber, "paid with 5500-0000-0000-0004", "5500-0000-0000-0004"),
    (SecretKind::CardNumber, "amex 378282246310005", "378282246310005"),
    (SecretKind::CardNumber, "discover:6011111111111117", "6011111111111117"),
    (SecretKind::Custom, "internal ticket CUST-12345678 escalated", "CUST-12345678"),
    (SecretKind::Custom, "CUST-87654321", "CUST-87654321"),
];

/// A value under a key that names a secret.
#[derive(Clone, Copy)]
enum Bare {
    Str(&'static str),
    Int(i64),
    Bytes(&'static [u8]),
}

/// (kind, key, a bare value no text rule would catch): the key alone says it is a secret.
const KEYED: &[(SecretKind, &str, Bare)] = &[
    (
        SecretKind::Credential,
        "password",
        Bare::Str("Tr0ub4dor-and-3"),
    ),
    (
        SecretKind::Credential,
        "db.password",
        Bare::Str("pgBare93-Qx7"),
    ),
    (
        SecretKind::Credential,
        "api_key",
        Bare::Str("ak8H2kD9sLqBare"),
    ),
    (SecretKind::Credential, "token", Bare::Str("tkBareZq81Xv0")),
    (
        SecretKind::AwsKey,
        "aws.secret_access_key",
        Bare::Str("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ),
    (
        SecretKind::BearerToken,
        "http.request.header.authorization",
        Bare::Str("opaqueAuthValue123"),
    ),
    (
        SecretKind::Credential,
        "oauth.client_secret",
        Bare::Str("csBareValue77"),
    ),
    (
        SecretKind::Credential,
        "accessToken",
        Bare::Str("atBareValue55"),
    ),
    (
        SecretKind::Credential,
        "http.request.header.x-api-key",
        Bare::Str("xakBare4410"),
    ),
    (
        SecretKind::Credential,
        "http.request.header.cookie",
        Bare::Str("theme=dark; sid=cookieBare991"),
    ),
    (
        SecretKind::Credential,
        "smtp.password",
        Bare::Int(73_190_528_461),
    ),
    (
        SecretKind::Credential,
        "signing_key",
        Bare::Bytes(b"\x00skBytesBare8812"),
    ),
];

/// (kind, bytes value holding a secret, the part that must never be stored, as text or hex).
const BYTES: &[(SecretKind, &[u8], &str)] = &[
    (
        SecretKind::Credential,
        b"password=Hunter2-Bytes-S3cret!",
        "Hunter2-Bytes-S3cret!",
    ),
    (
        SecretKind::AwsKey,
        b"\x00\x01AKIAI44QH8DHBEXAMPLE\xff\xfe",
        "AKIAI44QH8DHBEXAMPLE",
    ),
    (
        SecretKind::Credential,
        b"\x0a\x2bkey_with_ghp_1234567890abcdefghijklmnopqrstuvwxyzCD",
        "1234567890abcdefghijklmnopqrstuvwxyzCD",
    ),
    (
        SecretKind::BearerToken,
        b"GET / HTTP/1.1\r\nAuthorization: Bearer bytesTok3nValue99xyz\r\n\r\n",
        "bytesTok3nValue99xyz",
    ),
    (
        SecretKind::Email,
        b"\x80\x81carol.bytes@example.org\x82",
        "carol.bytes@example.org",
    ),
];

fn sv(s: &str) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(Value::StringValue(s.into())),
    })
}

fn bv(b: &[u8]) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(Value::BytesValue(b.to_vec())),
    })
}

fn kvlist(values: Vec<KeyValue>) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(Value::KvlistValue(KeyValueList { values })),
    })
}

fn array(values: Vec<Option<AnyValue>>) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(Value::ArrayValue(ArrayValue {
            values: values.into_iter().map(Option::unwrap_or_default).collect(),
        })),
    })
}

fn kv(k: &str, v: Option<AnyValue>) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: v,
        ..Default::default()
    }
}

/// Where a planted secret is stored: in its span's row, in the resource's attributes (counted
/// once per request), or nowhere (links and scopes are not stored; they are planted so that a
/// change that starts storing them cannot leak).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stored {
    Span,
    Resource,
    Nowhere,
}

/// A span's surroundings that a secret can be planted in.
struct Slot<'a> {
    span: &'a mut Span,
    resource: &'a mut Vec<KeyValue>,
    scope: &'a mut Vec<KeyValue>,
}

/// The places a string can sit in.
const TEXT_LOCATIONS: usize = 13;

fn plant_text(loc: usize, i: usize, secret: &str, s: Slot<'_>) -> Stored {
    let span = s.span;
    match loc {
        0 => span.name = format!("call {secret}"),
        1 => span
            .attributes
            .push(kv("http.request.header.note", sv(secret))),
        2 => span.attributes.push(kv(
            "nested",
            kvlist(vec![kv("inner", array(vec![sv("x"), sv(secret)]))]),
        )),
        3 => span.attributes.push(kv(
            "gen_ai.tool.call.arguments",
            sv(&format!(
                "{{\"q\":\"look up\",\"extra\":{}}}",
                serde_json::to_string(secret).unwrap()
            )),
        )),
        // Past the 4 KiB the payload column keeps: hash and size are of the redacted text.
        4 => span.attributes.push(kv(
            "gen_ai.tool.call.result",
            sv(&format!("{} {}", "x".repeat(3000), secret)),
        )),
        5 => span.events.push(Event {
            time_unix_nano: 1,
            name: format!("retry {secret}"),
            ..Default::default()
        }),
        6 => span.events.push(Event {
            time_unix_nano: 1,
            name: "exception".into(),
            attributes: vec![
                kv("exception.type", sv("ValueError")),
                kv("exception.stacktrace", sv(&format!("Traceback: {secret}"))),
            ],
            ..Default::default()
        }),
        7 => {
            s.resource.push(kv(&format!("deploy.note.{i}"), sv(secret)));
            return Stored::Resource;
        }
        8 => {
            span.status = Some(Status {
                code: 2,
                message: format!("failed: {secret}"),
            })
        }
        9 => span
            .attributes
            .push(kv("toolspan.error.reference", sv(secret))),
        10 => span.attributes.push(kv("input.value", sv(secret))),
        11 => span.attributes.push(kv("gen_ai.agent.name", sv(secret))),
        _ => {
            span.links.push(Link {
                trace_id: vec![9; 16],
                span_id: vec![9; 8],
                attributes: vec![kv("note", sv(secret))],
                ..Default::default()
            });
            return Stored::Nowhere;
        }
    }
    Stored::Span
}

/// The places a key and its value can sit in.
const KV_LOCATIONS: usize = 12;

fn plant_kv(loc: usize, pair: KeyValue, s: Slot<'_>) -> Stored {
    let span = s.span;
    match loc {
        0 => span.attributes.push(pair),
        1 => span.attributes.push(kv(
            "config",
            kvlist(vec![kv("db", kvlist(vec![kv("host", sv("db1")), pair]))]),
        )),
        2 => span.attributes.push(kv(
            "steps",
            array(vec![kvlist(vec![kv("n", sv("1"))]), kvlist(vec![pair])]),
        )),
        3 => {
            s.resource.push(pair);
            return Stored::Resource;
        }
        4 => {
            s.resource.push(kv("deploy", kvlist(vec![pair])));
            return Stored::Resource;
        }
        5 => span.events.push(Event {
            time_unix_nano: 1,
            name: "exception".into(),
            attributes: vec![kv("exception.type", sv("ConnectionError")), pair],
            ..Default::default()
        }),
        6 => span.events.push(Event {
            time_unix_nano: 1,
            name: "connect".into(),
            attributes: vec![kv("db.system", sv("postgresql")), pair],
            ..Default::default()
        }),
        7 => {
            span.links.push(Link {
                trace_id: vec![9; 16],
                span_id: vec![9; 8],
                attributes: vec![pair],
                ..Default::default()
            });
            return Stored::Nowhere;
        }
        8 => span.attributes.push(kv(
            "gen_ai.tool.call.arguments",
            kvlist(vec![kv("user", sv("bob")), pair]),
        )),
        9 => span
            .attributes
            .push(kv("gen_ai.tool.call.result", kvlist(vec![pair]))),
        10 => span
            .attributes
            .push(kv("output.value", array(vec![kvlist(vec![pair])]))),
        _ => {
            s.scope.push(pair);
            return Stored::Nowhere;
        }
    }
    Stored::Span
}

/// Payload attributes that can hold a bytes value directly (beyond `KV_LOCATIONS`).
const PAYLOAD_KEYS: [&str; 4] = [
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "input.value",
    "output.value",
];

/// One planted secret: its kind, the text that must never be stored, where it is stored.
struct Planted {
    kind: SecretKind,
    core: String,
    /// The core's bytes as bytes values are stored (lowercase hex).
    core_hex: String,
    stored: Stored,
    what: String,
}

fn corpus_request() -> (ExportTraceServiceRequest, Vec<Planted>) {
    let mut spans = Vec::new();
    let mut resource = vec![kv("service.name", sv("svc"))];
    let mut scope = Vec::new();
    let mut planted = Vec::new();
    let mut plant =
        |what: String, kind: SecretKind, core: &[u8], f: &mut dyn FnMut(Slot<'_>) -> Stored| {
            let mut span = Span {
                trace_id: vec![7; 16],
                span_id: (spans.len() as u64 + 1).to_be_bytes().to_vec(),
                name: "plain".into(),
                start_time_unix_nano: 1_764_410_400_000_000_000,
                end_time_unix_nano: 1_764_410_400_500_000_000,
                status: Some(Status {
                    code: 2,
                    message: String::new(),
                }),
                ..Default::default()
            };
            let stored = f(Slot {
                span: &mut span,
                resource: &mut resource,
                scope: &mut scope,
            });
            spans.push(span);
            planted.push(Planted {
                kind,
                core: String::from_utf8_lossy(core).into_owned(),
                core_hex: hex::encode(core),
                stored,
                what,
            });
        };
    for (i, (kind, text, core)) in CORPUS.iter().enumerate() {
        for loc in 0..TEXT_LOCATIONS {
            plant(
                format!("text {i} at {loc}"),
                *kind,
                core.as_bytes(),
                &mut |s| plant_text(loc, i, text, s),
            );
        }
    }
    for (kind, key, bare) in KEYED {
        let (value, core) = match bare {
            Bare::Str(s) => (sv(s), s.as_bytes().to_vec()),
            Bare::Int(n) => (
                Some(AnyValue {
                    value: Some(Value::IntValue(*n)),
                }),
                n.to_string().into_bytes(),
            ),
            Bare::Bytes(b) => (bv(b), b.to_vec()),
        };
        for loc in 0..KV_LOCATIONS {
            plant(format!("key {key} at {loc}"), *kind, &core, &mut |s| {
                plant_kv(loc, kv(key, value.clone()), s)
            });
        }
    }
    for (i, (kind, bytes, core)) in BYTES.iter().enumerate() {
        for loc in 0..KV_LOCATIONS {
            plant(
                format!("bytes {i} at {loc}"),
                *kind,
                core.as_bytes(),
                &mut |s| plant_kv(loc, kv("blob", bv(bytes)), s),
            );
        }
        for key in PAYLOAD_KEYS {
            plant(
                format!("bytes {i} as {key}"),
                *kind,
                core.as_bytes(),
                &mut |s| {
                    s.span.attributes.push(kv(key, bv(bytes)));
                    Stored::Span
                },
            );
        }
    }
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource,
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "corpus".into(),
                    attributes: scope,
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    (req, planted)
}

fn strings_of(batch: &RecordBatch) -> Vec<String> {
    crate::common::all_strings(batch)
}

fn assert_clean(planted: &[Planted], strings: &[String], where_: &str) {
    // One haystack (NUL never occurs in a core), so each core is one search.
    let all = strings.join("\0");
    for p in planted {
        for needle in [&p.core, &p.core_hex] {
            if let Some(at) = all.find(needle.as_str()) {
                let s = all[..at].rsplit('\0').next().unwrap_or("").to_string()
                    + all[at..].split('\0').next().unwrap_or("");
                panic!(
                    "secret {:?} (planted as {}, maybe elsewhere too) survived in {where_}: {s:?}",
                    p.core, p.what
                );
            }
        }
    }
}

#[test]
fn no_planted_secret_survives_in_batches_or_parquet() {
    assert!(CORPUS.len() >= 30);
    let (request, planted) = corpus_request();
    let pipeline =
        Pipeline::new(None, &["CUST-[0-9]{8}".to_string()]).expect("custom pattern compiles");
    let out = pipeline.process(&request).expect("processes");
    assert_eq!(out.batch.num_rows(), planted.len());
    assert_clean(&planted, &strings_of(&out.batch), "the Arrow batch");

    let file = tempfile::tempfile().unwrap();
    let mut w = ArrowWriter::try_new(
        file.try_clone().unwrap(),
        out.batch.schema(),
        Some(toolspan_schema::parquet_props::writer_properties()),
    )
    .unwrap();
    w.write(&out.batch).unwrap();
    w.close().unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut from_parquet = Vec::new();
    for b in reader {
        from_parquet.extend(strings_of(&b.unwrap()));
    }
    assert!(!from_parquet.is_empty());
    assert_clean(&planted, &from_parquet, "Parquet");

    // Each secret was planted once, in a place stored once: one redaction each, by kind.
    let mut want: BTreeMap<SecretKind, u64> = BTreeMap::new();
    for p in planted.iter().filter(|p| p.stored != Stored::Nowhere) {
        *want.entry(p.kind).or_default() += 1;
    }
    let got: BTreeMap<SecretKind, u64> = SecretKind::ALL
        .iter()
        .map(|k| (*k, out.stats.redactions.get(*k)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(got, want, "redaction counts by kind");

    // The per-span column agrees with the totals (resource secrets are counted once per
    // request, not per span), span by span.
    let col = out
        .batch
        .column_by_name("redactions")
        .unwrap()
        .as_any()
        .downcast_ref::<arrow::array::Int32Array>()
        .unwrap();
    for (row, p) in planted.iter().enumerate() {
        let expected = i32::from(p.stored == Stored::Span);
        assert_eq!(
            col.value(row),
            expected,
            "redactions of the span of {}",
            p.what
        );
    }
    let in_resource = planted
        .iter()
        .filter(|p| p.stored == Stored::Resource)
        .count() as u64;
    let per_span: u64 = (0..col.len()).map(|i| col.value(i) as u64).sum();
    assert_eq!(per_span + in_resource, out.stats.redactions.total());
}

/// Values under keys that name a secret are redacted whole; the keys, and everything toolspan
/// classifies by, stay.
#[test]
fn key_names_redact_values_and_keep_keys_and_classification() {
    let mut span = Span {
        trace_id: vec![3; 16],
        span_id: vec![4; 8],
        name: "execute_tool run_sql".into(),
        start_time_unix_nano: 1_764_410_400_000_000_000,
        end_time_unix_nano: 1_764_410_400_500_000_000,
        status: Some(Status {
            code: 2,
            message: "boom".into(),
        }),
        ..Default::default()
    };
    span.attributes = vec![
        kv("gen_ai.operation.name", sv("execute_tool")),
        kv("gen_ai.tool.name", sv("run_sql")),
        kv("error.type", sv("PARSE")),
        kv(
            "gen_ai.usage.input_tokens",
            Some(AnyValue {
                value: Some(Value::IntValue(1234)),
            }),
        ),
        kv(
            "gen_ai.request.max_tokens",
            Some(AnyValue {
                value: Some(Value::IntValue(512)),
            }),
        ),
        kv(
            "llm.token_count.total",
            Some(AnyValue {
                value: Some(Value::IntValue(99)),
            }),
        ),
        kv("tokenizer", sv("cl100k_base")),
        kv("session.id", sv("conv-42")),
        kv("db.password", sv("pgBare93-Qx7")),
        kv(
            "has_token",
            Some(AnyValue {
                value: Some(Value::BoolValue(true)),
            }),
        ),
        kv("password", sv("")),
        kv("token", sv("[REDACTED:credential]")),
    ];
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![span],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let out = Pipeline::builtin().process(&req).expect("processes");
    let col = |name: &str| {
        let a = out.batch.column_by_name(name).unwrap();
        a.as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .map(|s| s.value(0).to_string())
    };
    assert_eq!(col("stage").as_deref(), Some("call"));
    assert_eq!(col("tool").as_deref(), Some("run_sql"));
    assert_eq!(col("error_type").as_deref(), Some("PARSE"));
    let attrs: serde_json::Value = serde_json::from_str(&col("attributes").unwrap()).unwrap();
    assert_eq!(attrs["db.password"], "[REDACTED:credential]");
    assert_eq!(attrs["gen_ai.request.max_tokens"], 512);
    assert_eq!(attrs["llm.token_count.total"], 99);
    assert_eq!(attrs["tokenizer"], "cl100k_base");
    assert_eq!(attrs["session.id"], "conv-42");
    assert_eq!(attrs["has_token"], true);
    assert_eq!(attrs["password"], "");
    assert_eq!(attrs["token"], "[REDACTED:credential]");
    let tokens = out
        .batch
        .column_by_name("input_tokens")
        .unwrap()
        .as_any()
        .downcast_ref::<arrow::array::Int64Array>()
        .unwrap()
        .value(0);
    assert_eq!(tokens, 1234);
    // One value redacted; the empty one and the one already redacted are not counted.
    assert_eq!(out.stats.redactions.total(), 1);
}

//! A corpus of secrets placed in every kind of location a span has: none survives in any
//! string of the batch or of Parquet written from it, and the redaction counts match.

use std::collections::BTreeMap;

use arrow::array::{Array, RecordBatch};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, ArrayValue, KeyValue, KeyValueList};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::Event;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use toolspan_schema::redact::SecretKind;
use toolspan_schema::Pipeline;

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

fn sv(s: &str) -> Option<AnyValue> {
    Some(AnyValue { value: Some(Value::StringValue(s.into())) })
}

fn kv(k: &str, v: Option<AnyValue>) -> KeyValue {
    KeyValue { key: k.into(), value: v, ..Default::default() }
}

/// The locations a secret can sit in. Each secret goes in exactly one, in its own span.
const LOCATIONS: usize = 12;

fn plant(i: usize, secret: &str, span: &mut Span, resource: &mut Vec<KeyValue>) {
    match i % LOCATIONS {
        0 => span.name = format!("call {secret}"),
        1 => span.attributes.push(kv("http.request.header.note", sv(secret))),
        2 => span.attributes.push(kv(
            "nested",
            Some(AnyValue {
                value: Some(Value::KvlistValue(KeyValueList {
                    values: vec![kv("inner", Some(AnyValue { value: Some(Value::ArrayValue(ArrayValue { values: vec![sv("x").unwrap(), sv(secret).unwrap()] })) }))],
                })),
            }),
        )),
        3 => span.attributes.push(kv("gen_ai.tool.call.arguments", sv(&format!("{{\"q\":\"look up\",\"extra\":{}}}", serde_json::to_string(secret).unwrap())))),
        4 => span.attributes.push(kv("gen_ai.tool.call.result", sv(&format!("{}{}", "x".repeat(3000), secret)))),
        5 => span.events.push(Event { time_unix_nano: 1, name: format!("retry {secret}"), ..Default::default() }),
        6 => span.events.push(Event {
            time_unix_nano: 1,
            name: "exception".into(),
            attributes: vec![kv("exception.type", sv("ValueError")), kv("exception.stacktrace", sv(&format!("Traceback: {secret}")))],
            ..Default::default()
        }),
        7 => resource.push(kv(&format!("deploy.note.{i}"), sv(secret))),
        8 => span.status = Some(Status { code: 2, message: format!("failed: {secret}") }),
        9 => span.attributes.push(kv("toolspan.error.reference", sv(secret))),
        10 => span.attributes.push(kv("input.value", sv(secret))),
        _ => span.attributes.push(kv("gen_ai.agent.name", sv(secret))),
    }
}

fn corpus_request() -> ExportTraceServiceRequest {
    let mut spans = Vec::new();
    let mut resource = vec![kv("service.name", sv("svc"))];
    for (i, (_, text, _)) in CORPUS.iter().enumerate() {
        let mut span = Span {
            trace_id: vec![7; 16],
            span_id: (i as u64 + 1).to_be_bytes().to_vec(),
            name: "plain".into(),
            start_time_unix_nano: 1_764_410_400_000_000_000,
            end_time_unix_nano: 1_764_410_400_500_000_000,
            status: Some(Status { code: 2, message: String::new() }),
            ..Default::default()
        };
        plant(i, text, &mut span, &mut resource);
        spans.push(span);
    }
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: resource, ..Default::default() }),
            scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
            ..Default::default()
        }],
    }
}

fn strings_of(batch: &RecordBatch) -> Vec<String> {
    crate::common::all_strings(batch)
}

fn assert_clean(strings: &[String], where_: &str) {
    for (_, _, core) in CORPUS {
        for s in strings {
            assert!(!s.contains(core), "secret {core:?} survived in {where_}: {s:?}");
        }
    }
}

#[test]
fn no_planted_secret_survives_in_batches_or_parquet() {
    assert!(CORPUS.len() >= 30);
    let pipeline = Pipeline::new(None, &["CUST-[0-9]{8}".to_string()]).expect("custom pattern compiles");
    let out = pipeline.process(&corpus_request()).expect("processes");
    assert_eq!(out.batch.num_rows(), CORPUS.len());
    assert_clean(&strings_of(&out.batch), "the Arrow batch");

    let file = tempfile::tempfile().unwrap();
    let mut w = ArrowWriter::try_new(file.try_clone().unwrap(), out.batch.schema(), Some(toolspan_schema::parquet_props::writer_properties())).unwrap();
    w.write(&out.batch).unwrap();
    w.close().unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
    let mut from_parquet = Vec::new();
    for b in reader {
        from_parquet.extend(strings_of(&b.unwrap()));
    }
    assert!(!from_parquet.is_empty());
    assert_clean(&from_parquet, "Parquet");

    // Each secret was planted once, in a place stored once: one redaction each, by kind.
    let mut want: BTreeMap<SecretKind, u64> = BTreeMap::new();
    for (kind, _, _) in CORPUS {
        *want.entry(*kind).or_default() += 1;
    }
    let got: BTreeMap<SecretKind, u64> = SecretKind::ALL.iter().map(|k| (*k, out.stats.redactions.get(*k))).filter(|(_, n)| *n > 0).collect();
    assert_eq!(got, want, "redaction counts by kind");

    // The per-span column agrees with the totals (resource secrets are counted once per
    // request, not per span).
    let col = out.batch.column_by_name("redactions").unwrap().as_any().downcast_ref::<arrow::array::Int32Array>().unwrap();
    let per_span: i64 = (0..col.len()).map(|i| i64::from(col.value(i))).sum();
    let in_resource = CORPUS.iter().enumerate().filter(|(i, _)| i % LOCATIONS == 7).count() as i64;
    assert_eq!(per_span + in_resource, out.stats.redactions.total() as i64);
}

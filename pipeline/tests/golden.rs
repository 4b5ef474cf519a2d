//! Golden tests: spans emitted by the official OpenTelemetry Python SDK, exported as protobuf
//! and as OTLP/JSON, decode and classify to the rows in `tests/golden/<scenario>.jsonl`.
//!
//! `UPDATE_GOLDEN=1 cargo test -p toolspan-schema golden` rewrites the files; review the diff.

use toolspan_pipeline::{Encoding, Pipeline};

use crate::common::{generate_golden_inputs, rows_as_json_lines};

const SCENARIOS: [&str; 21] = [
    "conventions_ok",
    "error_prepare",
    "error_network",
    "error_tool",
    "error_parse",
    "retry_recovered",
    "retry_exhausted",
    "explicit_error_type",
    "genai_execute_tool",
    "openinference_tool",
    "openllmetry_tool",
    "http_client_under_tool",
    "leaked_stack_trace",
    "secrets",
    "unknown_shape",
    "big_payload",
    "silent_failures",
    "meaning_not_names",
    "two_instrumentations",
    "framework_retries",
    "genai_conventions",
];

#[test]
fn python_sdk_spans_match_golden_rows_in_both_encodings() {
    let inputs = generate_golden_inputs();
    let pipeline = Pipeline::builtin();
    let golden_dir = crate::common::schema_dir().join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut failures = Vec::new();
    for scenario in SCENARIOS {
        let pb = std::fs::read(inputs.path().join(format!("{scenario}.pb"))).expect("pb file");
        let json =
            std::fs::read(inputs.path().join(format!("{scenario}.json"))).expect("json file");
        let from_pb = pipeline
            .process_bytes(&pb, Encoding::Protobuf)
            .expect("protobuf decodes");
        let from_json = pipeline
            .process_bytes(&json, Encoding::Json)
            .expect("json decodes");
        assert_eq!(
            from_pb.stats.rejected.total(),
            0,
            "{scenario}: no span rejected"
        );
        let rows_pb = rows_as_json_lines(&from_pb.batch);
        let rows_json = rows_as_json_lines(&from_json.batch);
        assert_eq!(
            rows_pb, rows_json,
            "{scenario}: protobuf and JSON give different rows"
        );
        let path = golden_dir.join(format!("{scenario}.jsonl"));
        if update {
            std::fs::write(&path, &rows_pb).expect("write golden");
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if want != rows_pb {
            failures.push(format!(
                "{scenario}: rows differ from {}\n--- got\n{rows_pb}",
                path.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

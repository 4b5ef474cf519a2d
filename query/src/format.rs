//! Rendering query results as text: an aligned table, CSV, or a JSON array of objects.

use std::str::FromStr;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::util::pretty::pretty_format_batches;

use crate::error::{QueryError, QueryErrorKind};

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// An aligned text table (arrow's pretty printer), for terminals.
    #[default]
    Table,
    /// CSV with a header row; timestamps in RFC 3339.
    Csv,
    /// A JSON array with one object per row; nulls written as `null`.
    Json,
}

impl FromStr for Format {
    type Err = String;

    /// `table`, `csv` or `json` (any case).
    fn from_str(s: &str) -> Result<Format, String> {
        match s.to_ascii_lowercase().as_str() {
            "table" => Ok(Format::Table),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            other => Err(format!("unknown format `{other}`: use table, csv or json")),
        }
    }
}

/// Renders batches. With no batches there is no schema: the table and CSV forms are empty
/// and JSON is `[]` (use [`render_with_schema`] to keep the header of an empty result).
pub fn render(batches: &[RecordBatch], fmt: Format) -> Result<String, QueryError> {
    match batches.first() {
        Some(b) => render_with_schema(&b.schema(), batches, fmt),
        None if fmt == Format::Json => Ok("[]".into()),
        None => Ok(String::new()),
    }
}

/// Renders batches of `schema`, writing the header even when there are no rows.
pub fn render_with_schema(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    fmt: Format,
) -> Result<String, QueryError> {
    let empty;
    let batches = if batches.is_empty() {
        empty = [RecordBatch::new_empty(schema.clone())];
        &empty[..]
    } else {
        batches
    };
    let fail = |what: &'static str, e: &dyn std::fmt::Display| {
        QueryError::new(
            QueryErrorKind::Internal,
            format_args!("rendering {what}: {e}"),
        )
    };
    match fmt {
        Format::Table => pretty_format_batches(batches)
            .map(|t| t.to_string())
            .map_err(|e| fail("table", &e)),
        Format::Csv => {
            let mut out = Vec::new();
            {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut out);
                for b in batches {
                    w.write(b).map_err(|e| fail("csv", &e))?;
                }
            }
            String::from_utf8(out).map_err(|e| fail("csv", &e))
        }
        Format::Json => {
            let mut out = Vec::new();
            {
                let mut w = datafusion::arrow::json::WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, datafusion::arrow::json::writer::JsonArray>(&mut out);
                for b in batches {
                    w.write(b).map_err(|e| fail("json", &e))?;
                }
                w.finish().map_err(|e| fail("json", &e))?;
            }
            if out.is_empty() {
                return Ok("[]".into());
            }
            String::from_utf8(out).map_err(|e| fail("json", &e))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("tool", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        // The columns match the schema just built, so construction cannot fail.
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![Some("search_docs"), None])),
                Arc::new(Int64Array::from(vec![3, 4])),
            ],
        )
        .expect("columns match the schema")
    }

    #[test]
    fn renders_three_formats() {
        let b = [batch()];
        let table = render(&b, Format::Table).expect("table");
        assert!(table.contains("| search_docs |"), "{table}");
        let csv = render(&b, Format::Csv).expect("csv");
        assert_eq!(csv, "tool,n\nsearch_docs,3\n,4\n");
        let json: serde_json::Value =
            serde_json::from_str(&render(&b, Format::Json).expect("json")).expect("valid json");
        assert_eq!(
            json,
            serde_json::json!([{"tool": "search_docs", "n": 3}, {"tool": null, "n": 4}])
        );
    }

    #[test]
    fn empty_results_keep_headers() {
        let schema = batch().schema();
        assert_eq!(
            render_with_schema(&schema, &[], Format::Csv).expect("csv"),
            "tool,n\n"
        );
        assert_eq!(
            render_with_schema(&schema, &[], Format::Json).expect("json"),
            "[]"
        );
        assert_eq!(render(&[], Format::Json).expect("json"), "[]");
    }
}

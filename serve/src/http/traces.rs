//! `GET /api/v1/traces/{trace_id}` and `GET /api/v1/references/{reference}`: a trace as a
//! tree, and the span that carries an error reference together with its whole trace (the
//! join between what the model saw and what the engineer needs).

use std::sync::Arc;

use axum::extract::{Path, State};
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use toolspan_query::trace;

/// Every span of one trace as a tree.
pub async fn get_trace(
    State(state): State<Arc<AppState>>,
    Path(trace_id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let Some(id) = trace::normalize_trace_id(&trace_id) else {
        return Err(ApiError::invalid_argument(
            "a trace id is 32 hexadecimal characters, e.g. 4bf92f3577b34da6a3ce929d0e0e4736",
        ));
    };
    match trace::load(&state.service, &id).await? {
        Some(tree) => Ok(axum::Json(tree)),
        None => Err(ApiError::not_found(format!(
            "no span has trace id {id}: it may not be ingested yet, or it was sampled out"
        ))),
    }
}

/// The span(s) carrying an error reference, and the trace of the first.
pub async fn get_reference(
    State(state): State<Arc<AppState>>,
    Path(reference): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    if !trace::valid_reference(&reference) {
        return Err(ApiError::invalid_argument(
            "a reference is 1 to 128 letters, digits, '_', '-', '.' or ':', e.g. err_7c1f9a",
        ));
    }
    // The reference is validated above: no quote can occur in it.
    let sql = format!(
        "SELECT trace_id, span_id, stage, tool, start_time FROM spans \
         WHERE reference = '{reference}' ORDER BY start_time, span_id LIMIT 100"
    );
    let result = state.service.query(&sql).await?;
    let mut matches = Vec::new();
    toolspan_query::rows::each_row(&result, |r| {
        matches.push(json!({
            "trace_id": r.text("trace_id"),
            "span_id": r.text("span_id"),
            "stage": r.text("stage"),
            "tool": r.text("tool"),
            "start_time": r.text("start_time"),
        }))
    });
    let Some(first) = matches.first() else {
        return Err(ApiError::not_found(format!(
            "no span carries the reference {reference}: check its spelling, or it may not be \
             ingested yet"
        )));
    };
    let trace_id = first["trace_id"].as_str().unwrap_or_default().to_string();
    let span_id = first["span_id"].as_str().unwrap_or_default().to_string();
    let tree = trace::load(&state.service, &trace_id)
        .await?
        .unwrap_or(Value::Null);
    let span = find_span(&tree, &span_id).unwrap_or(Value::Null);
    Ok(axum::Json(json!({
        "reference": reference,
        "span": span,
        "matches": matches,
        "trace": tree,
    })))
}

/// The node `span_id` in a trace tree, without its children (iterative: no recursion).
fn find_span(tree: &Value, span_id: &str) -> Option<Value> {
    let mut stack: Vec<&Value> = tree["roots"].as_array()?.iter().collect();
    while let Some(node) = stack.pop() {
        if node["span_id"].as_str() == Some(span_id) {
            let mut n = node.clone();
            if let Some(m) = n.as_object_mut() {
                m.remove("children");
            }
            return Some(n);
        }
        if let Some(children) = node["children"].as_array() {
            stack.extend(children.iter());
        }
    }
    None
}

//! What a validation error in pydantic's words says it validated: the call's arguments or
//! something else (the answer, a model the tool built).

use regex::Regex;

/// What a validation error in pydantic's words ("N validation error(s) for Model", then the
/// failing field's location on a line of its own) validated, judged against the call's recorded
/// arguments, whatever the model is called: `Some(true)` the arguments — the failing field is
/// one of the argument names the call was made with, or, for a missing field, every key of the
/// rejected `input_value={...}` is one — `Some(false)` something
/// else — the failing field is no argument, and, for a missing field, the rejected input has a
/// key that is no argument (an answer's `{'results': …}`) — and `None` when it cannot tell: no
/// arguments recorded, no pydantic header, or a missing field of an empty input.
pub(super) fn validation_target(message: &str, arguments: Option<&str>) -> Option<bool> {
    static HEADER: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        // Constant pattern, covered by the rules' tests (`tests.rs`).
        Regex::new(r"\b\d+ validation errors? for [^\s\\]+(?:\r?\n|\\n)\s*([A-Za-z_][A-Za-z0-9_]*)")
            .expect("valid regex")
    });
    let args = arguments.and_then(argument_names)?;
    let field = HEADER.captures(message).and_then(|c| c.get(1))?;
    if args.iter().any(|a| a == field.as_str()) {
        return Some(true);
    }
    // The first error's detail, "[type=…, input_value=…, input_type=…]": a field that was
    // given and is no argument is something else's; a missing one is whose input lacks it
    // ("Field required [type=missing, input_value={'limit': 3}, input_type=dict]").
    let after = &message[field.end()..];
    let detail = &after[after.find("[type=")?..];
    // The error types pydantic has only for a function's arguments (`validate_call`).
    if ARGUMENT_ERROR_TYPES
        .iter()
        .any(|t| detail[6..].starts_with(t))
    {
        return Some(true);
    }
    if !detail.starts_with("[type=missing,") {
        return Some(false);
    }
    let rest = &detail[detail.find("input_value=")? + "input_value=".len()..];
    if !rest.starts_with('{') {
        return None;
    }
    let end = rest.find(", input_type=").unwrap_or(rest.len());
    let keys: Vec<&str> = KEYS
        .captures_iter(&rest[..end])
        .filter_map(|c| c.get(1).map(|m| m.as_str()))
        .collect();
    if keys.is_empty() {
        return None;
    }
    Some(keys.iter().all(|k| args.iter().any(|a| a == k)))
}

/// pydantic's error types that only a function's arguments get (`validate_call`).
const ARGUMENT_ERROR_TYPES: [&str; 4] = [
    "missing_argument",
    "unexpected_keyword_argument",
    "unexpected_positional_argument",
    "multiple_argument_values",
];

/// Quoted keys of a dict or object rendered as text (`{'limit': 3}`, `{"limit": 3}`).
static KEYS: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
    // Constant pattern, covered by the rules' tests (`tests.rs`).
    Regex::new(r#"['"]([A-Za-z_][A-Za-z0-9_]*)['"]\s*:"#).expect("valid regex")
});

/// The argument names of a call's recorded arguments: the keys of a JSON object, or of the
/// object it wraps under `kwargs`, `arguments`, `args` or `input` (as some instrumentations
/// record them, or a dict rendered as text under `input_str`). Bounded like result bodies.
fn argument_names(text: &str) -> Option<Vec<String>> {
    if text.len() > 64 * 1024 || !text.trim_start().starts_with('{') {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let obj = v.as_object()?;
    let mut names: Vec<String> = obj.keys().cloned().collect();
    for wrapper in ["kwargs", "arguments", "args", "input", "input_str"] {
        match obj.get(wrapper) {
            Some(serde_json::Value::Object(inner)) => names.extend(inner.keys().cloned()),
            // LangChain's `input_str`: the arguments as Python renders a dict.
            Some(serde_json::Value::String(text)) if text.len() <= 64 * 1024 => names.extend(
                KEYS.captures_iter(text)
                    .filter_map(|c| c.get(1).map(|m| m.as_str().to_string())),
            ),
            _ => {}
        }
    }
    Some(names)
}

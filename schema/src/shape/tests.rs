use super::*;

#[test]
fn key_order_and_values_do_not_change_the_shape() {
    let a = of_text(r#"{"hits":[{"title":"a","url":"http://x"}],"total":2}"#);
    let b = of_text(
        r#"{ "total": 99, "hits": [ {"url": "u", "title": "other"}, {"title": "t", "url": "v"} ] }"#,
    );
    assert_eq!(a, b);
    assert_eq!(
        a,
        r#"{"hits":[{"title":"string","url":"string"}],"total":"number"}"#
    );
    assert_eq!(id(&a), id(&b));
    assert_eq!(id(&a).len(), 16);
}

#[test]
fn a_renamed_removed_or_retyped_field_changes_the_shape() {
    let base = of_text(r#"{"hits":[{"title":"a","url":"u"}],"total":2}"#);
    let renamed = of_text(r#"{"hits":[{"title":"a","link":"u"}],"total":2}"#);
    let removed = of_text(r#"{"hits":[{"title":"a"}],"total":2}"#);
    let retyped = of_text(r#"{"hits":[{"title":"a","url":"u"}],"total":"2"}"#);
    for other in [&renamed, &removed, &retyped] {
        assert_ne!(&base, other);
        assert_ne!(id(&base), id(other));
    }
    let d = diff(&base, &renamed);
    assert_eq!(
        d,
        vec![
            Change {
                path: "$.hits[].link".into(),
                before: None,
                after: Some("string".into())
            },
            Change {
                path: "$.hits[].url".into(),
                before: Some("string".into()),
                after: None
            },
        ]
    );
    assert_eq!(d[0].kind(), "added");
    assert_eq!(d[1].kind(), "removed");
    let d = diff(&base, &retyped);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].path.as_str(), d[0].kind()), ("$.total", "retyped"));
    assert!(diff(&base, &base).is_empty());
}

#[test]
fn payloads_that_are_not_json_have_a_kind() {
    assert_eq!(of_text(""), "empty");
    assert_eq!(of_text("  \n"), "empty");
    assert_eq!(
        of_text("<!DOCTYPE html><html><body>502</body></html>"),
        "html"
    );
    assert_eq!(
        of_text("Traceback (most recent call last):\n  File x"),
        "text"
    );
    assert_eq!(of_text("{not json"), "text");
    assert_eq!(of_text("{\"a\":1} trailing"), "text");
    assert_eq!(of_text("\u{0}\u{1}PNG"), "binary");
    assert_eq!(of_text("42"), r#""number""#);
    assert_eq!(of_text("\"ok\""), r#""string""#);
    for kind in ["empty", "html", "text", "binary"] {
        assert!(!is_json(kind));
    }
    assert!(is_json(&of_text("[1]")));
    let d = diff(r#"{"a":"number"}"#, "html");
    assert!(d
        .iter()
        .any(|c| c.path == "$" && c.after.as_deref() == Some("html")));
}

#[test]
fn arrays_merge_their_elements_and_maps_collapse() {
    assert_eq!(of_text("[]"), "[]");
    assert_eq!(of_text(r#"[1, "a", null]"#), r#"["null|number|string"]"#);
    assert_eq!(
        of_text(r#"[{"a":1},{"b":true}]"#),
        r#"[{"a":"number","b":"boolean"}]"#
    );
    // Ids as keys: one shape however many and whichever ids.
    let many = |offset: usize| {
        let fields: Vec<String> = (0..200)
            .map(|i| format!("\"user_{}\":{{\"name\":\"n\"}}", i + offset))
            .collect();
        format!("{{{}}}", fields.join(","))
    };
    assert_eq!(of_text(&many(0)), of_text(&many(1000)));
    assert_eq!(of_text(&many(0)), r#"{"*":{"name":"string"}}"#);
}

#[test]
fn deep_or_huge_payloads_stay_within_the_bounds() {
    let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    let s = of_text(&deep);
    assert!(s.contains('…'), "{s}");
    assert!(s.len() < 64, "{s}");
    // Far deeper: the levels below the bound are skipped without recursion, same shape.
    let deeper = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(of_text(&deeper), s);
    // Many distinct nested objects: the node budget bounds the text.
    let wide: Vec<String> = (0..60)
        .map(|i| {
            let inner: Vec<String> = (0..60).map(|j| format!("\"k{j}\":{i}")).collect();
            format!("\"f{i}\":{{{}}}", inner.join(","))
        })
        .collect();
    let s = of_text(&format!("{{{}}}", wide.join(",")));
    assert!(s.len() < 32 * MAX_NODES, "{} bytes", s.len());
    assert!(s.contains('…'));
    // A large body with a small shape.
    let big = format!(r#"{{"blob":"{}","n":1}}"#, "x".repeat(10 << 20));
    assert_eq!(of_text(&big), r#"{"blob":"string","n":"number"}"#);
}

#[test]
fn keys_that_need_quoting_have_paths_that_say_so() {
    let l = leaves(&of_text(r#"{"a b":{"c":1}}"#));
    assert_eq!(l.get(r#"$["a b"].c"#).map(String::as_str), Some("number"));
}

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

/// Random JSON texts for comparing implementations: nested objects and arrays, keys drawn
/// from a small set (so that arrays of objects merge and keys repeat), escapes, duplicates.
fn random_json(seed: &mut u64, depth: usize, out: &mut String) {
    fn next(seed: &mut u64, n: u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed % n
    }
    const KEYS: [&str; 10] = [
        "a", "b", "id", "url", "title", "z", "a\\\"q", "\\n", "é", "\\u00e9",
    ];
    match if depth > 10 {
        next(seed, 5)
    } else {
        next(seed, 9)
    } {
        0 => out.push_str("null"),
        1 => out.push_str(if next(seed, 2) == 0 { "true" } else { "false" }),
        2 => out.push_str(&format!("{}", next(seed, 1000) as i64 - 500)),
        3 => out.push_str("1.5e3"),
        4 => out.push_str("\"s\\tx\""),
        5 | 6 => {
            // Sometimes many keys, past the point where an object is taken for a map (near
            // the top only, their values shallow: the texts stay small).
            let many = depth < 3 && next(seed, 8) == 0;
            let n = if many {
                70 + next(seed, 10)
            } else {
                next(seed, 6)
            };
            out.push('{');
            for i in 0..n {
                if i > 0 {
                    out.push(',');
                }
                if many {
                    out.push_str(&format!("\"k{}\":", next(seed, 90)));
                    random_json(seed, depth.max(9) + 1, out);
                } else {
                    out.push_str(&format!(
                        "\"{}\":",
                        KEYS[next(seed, KEYS.len() as u64) as usize]
                    ));
                    random_json(seed, depth + 1, out);
                }
            }
            out.push('}');
        }
        _ => {
            let n = next(seed, 5);
            out.push('[');
            for i in 0..n {
                if i > 0 {
                    out.push(',');
                }
                random_json(seed, depth + 1, out);
            }
            out.push(']');
        }
    }
}

#[test]
fn the_fast_reader_gives_the_shapes_the_first_one_gave() {
    let fixed = [
        "",
        "  ",
        "{}",
        "[]",
        "[[]]",
        "[{},[]]",
        "[1,{\"a\":1},[2],\"x\",null]",
        "[{\"a\":1},{\"a\":\"x\"},{\"b\":[1]},{\"b\":[{\"c\":true}]}]",
        "[[{\"a\":1}],[[1]],{\"a\":[]}]",
        "{\"a\":1,\"a\":\"twice\"}",
        "{\"b\":1,\"a\":2,\"c\":{\"\\u0041\":[1,2,{\"x\":null}]}}",
        "{\"key\\u0000nul\":1,\"tab\\there\":2,\"quote\\\"d\":3,\"back\\\\slash\":4}",
        "{\"é\":1,\"\\u00e9\":2}",
        "{\"a\":1} trailing",
        "{not json",
        "\"\\ud800\"",
        "{\"\\ud800\":1}",
        "1e999",
        "-",
        "<html><body>x</body></html>",
        "\u{0}\u{1}binary",
    ];
    for text in fixed {
        assert_eq!(of_text(text), reference::of_text(text), "{text:?}");
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..3000 {
        let mut text = String::new();
        random_json(&mut seed, 0, &mut text);
        assert_eq!(of_text(&text), reference::of_text(&text), "{text}");
    }
    let deep = format!("{}1{}", "[{\"a\":".repeat(20), "}]".repeat(20));
    assert_eq!(of_text(&deep), reference::of_text(&deep));
    let wide: Vec<String> = (0..60)
        .map(|i| {
            let inner: Vec<String> = (0..60).map(|j| format!("\"k{j}\":{i}")).collect();
            format!("\"f{i}\":{{{}}}", inner.join(","))
        })
        .collect();
    let wide = format!("{{{}}}", wide.join(","));
    assert_eq!(of_text(&wide), reference::of_text(&wide));
}

use super::*;

fn sql(q: &str) -> Vec<String> {
    parse(q)
        .unwrap_or_else(|e| panic!("{q}: {e}"))
        .spansets()
        .into_iter()
        .map(|e| expr_sql(e).expect("sql"))
        .collect()
}

#[test]
fn parses_what_a_user_types() {
    assert_eq!(
        sql(r#"{ span.gen_ai.tool.name = "search_docs" && span.error.type = "PARSE" }"#),
        ["(tool = 'search_docs' AND error_type = 'PARSE')"]
    );
    assert_eq!(
        sql("{ status = error && duration > 1.5s }"),
        ["(status = 'error' AND duration_ms > 1500)"]
    );
    assert_eq!(
        sql(r#"{ resource.service.name =~ "agent-.*" }"#),
        ["coalesce(service, '') ~ '^(?:agent-.*)$'"]
    );
    assert_eq!(sql("{}"), ["TRUE"]);
    assert_eq!(sql(""), ["TRUE"]);
    let q = parse(r#"{ .toolspan.stage = "parse" } && { name != "x" } || { kind = client }"#)
        .expect("parses");
    assert_eq!(q.spansets().len(), 3);
    assert!(q.matches(&[true, true, false]));
    assert!(q.matches(&[false, false, true]));
    assert!(!q.matches(&[true, false, false]));
}

#[test]
fn other_attributes_match_inside_the_json() {
    assert_eq!(
        sql(r#"{ span.db.system = "postgres" }"#),
        [
            r#"(strpos(coalesce(attributes, ''), '"db.system":"postgres",') > 0 OR strpos(coalesce(attributes, ''), '"db.system":"postgres"}') > 0)"#
        ]
    );
}

#[test]
fn quotes_cannot_escape_their_literal() {
    let s = sql(r#"{ name = "a' OR '1'='1" }"#);
    assert_eq!(s, ["name = 'a'' OR ''1''=''1'"]);
}

#[test]
fn unsupported_traceql_says_what_is_supported() {
    for q in [
        "{ status = error } | count() > 2",
        "{ } >> { }",
        "{ span.db.system > 3 }",
        "{ duration > \"x\" }",
        "{ status = maybe }",
        "{ foo = 1 }",
        "{ name = \"x\"",
        "status = error",
    ] {
        assert!(
            parse(q)
                .and_then(|q| {
                    q.spansets()
                        .into_iter()
                        .try_for_each(|e| expr_sql(e).map(|_| ()))
                })
                .is_err(),
            "{q}"
        );
    }
}

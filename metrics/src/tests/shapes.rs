//! Answer shapes from fleet traffic: the docs service's rename of `url` to `link` is one
//! new-shape event for search_docs, and no other tool has one.

use super::*;

#[test]
fn the_docs_rename_is_one_new_shape_of_search_docs_and_its_share_takes_over() {
    let m = ToolMetrics::new(MetricsConfig::default());
    let base = 1_764_410_400_000_000_000u64;
    let mut fleet = toolspan_gen::Fleet::new(toolspan_gen::FleetConfig::default());
    fleet.rename_docs_field_at(base + 5 * 60_000_000_000);
    for k in 0..10u64 {
        feed(
            &m,
            &fleet.request(40, base + k * 60_000_000_000, 60_000_000_000),
        );
    }
    let text = m.encode();
    let value = |line_start: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
    };
    assert_eq!(
        value("toolspan_tool_answer_new_shapes_total{tool=\"search_docs\"}"),
        1.0
    );
    for tool in ["update_ticket", "fetch_url", "run_sql"] {
        assert_eq!(
            value(&format!(
                "toolspan_tool_answer_new_shapes_total{{tool=\"{tool}\"}}"
            )),
            0.0,
            "{tool}"
        );
    }
    let link = toolspan_schema::shape::of_text(r#"{"hits":[{"title":"a","link":"b"}]}"#);
    let id = toolspan_schema::shape::id(&link);
    assert_eq!(
        value(&format!(
            "toolspan_tool_answer_shape_share{{tool=\"search_docs\",shape=\"{id}\"}}"
        )),
        1.0,
        "the last 100 answers of search_docs all have link"
    );
}

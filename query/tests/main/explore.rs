//! SQL a user explores with: `DESCRIBE` and `information_schema.columns`,
//! the JSON text columns read with JSON functions and operators and with string functions — and what stays refused (settings,
//! files, statements other than reads). docs/table.md lists every column a view has.

use toolspan_query::{Engine, EngineOptions};
use toolspan_schema::Code;

use crate::common::{json_rows, request, s, scalar, table_with, Trace};

/// One `search_docs` call carrying two attributes no column holds.
async fn engine() -> (tempfile::TempDir, Engine) {
    let mut t = Trace::new(0x6a);
    t.span(
        1,
        None,
        "execute_tool search_docs",
        0,
        40,
        false,
        vec![
            s("gen_ai.operation.name", "execute_tool"),
            s("gen_ai.tool.name", "search_docs"),
            s("gen_ai.tool.call.id", "call_json"),
            s("app.region", "eu-west"),
            crate::common::i("app.shard", 7),
        ],
    );
    let (dir, table) = table_with(&[request(vec![t])]).await;
    let engine = Engine::with_table(table, EngineOptions::default())
        .await
        .expect("engine");
    (dir, engine)
}

async fn refused(engine: &Engine, sql: &str) -> Code {
    match engine.sql(sql).await {
        Ok(b) => panic!("{sql} should be refused, returned {} batches", b.len()),
        Err(e) => {
            let m = e.message();
            for bad in ["/etc", "datafusion.", "DataFusion"] {
                assert!(!m.contains(bad), "{sql}: {m}");
            }
            e.code()
        }
    }
}

/// The JSON text columns are read with datafusion-functions-json's functions and operators,
/// as docs/table.md shows them.
#[tokio::test]
async fn attributes_are_read_with_json_functions_and_operators() {
    let (_dir, engine) = engine().await;
    for (sql, want) in [
        (
            "SELECT attributes->>'app.region' FROM spans WHERE stage = 'call'",
            "eu-west",
        ),
        (
            "SELECT json_get_str(attributes, 'app.region') FROM spans WHERE stage = 'call'",
            "eu-west",
        ),
        (
            "SELECT json_get_int(attributes, 'app.shard') FROM spans WHERE stage = 'call'",
            "7",
        ),
        (
            "SELECT count(*) FROM spans WHERE json_contains(attributes, 'app.region')",
            "1",
        ),
        // `->>` binds looser than `=` in DataFusion's SQL: parentheses, as docs/table.md says.
        (
            "SELECT count(*) FROM spans WHERE (attributes->>'app.region') = 'eu-west'",
            "1",
        ),
        (
            "SELECT count(*) FROM spans WHERE json_get_str(attributes, 'app.region') = 'eu-west'",
            "1",
        ),
        (
            "SELECT count(*) FROM spans WHERE json_get_str(attributes, 'app.nothing') IS NULL",
            "1",
        ),
    ] {
        assert_eq!(scalar(&engine, sql).await, want, "{sql}");
    }
    // The docs' example, as written.
    let rows = json_rows(
        &engine
            .sql(
                "SELECT attributes->>'app.region' AS region, count(*) AS calls \
                 FROM spans WHERE stage = 'call' AND json_contains(attributes, 'app.region') \
                 GROUP BY 1 ORDER BY calls DESC",
            )
            .await
            .unwrap_or_else(|e| panic!("{}", e.envelope())),
    );
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["region"], "eu-west");
    assert_eq!(rows[0]["calls"], 1);
    // A value that is not JSON is NULL, not an error.
    assert_eq!(
        scalar(&engine, "SELECT json_get_str('not json', 'a') IS NULL").await,
        "true"
    );
}

/// The JSON text columns are read with string and regular-expression functions too.
#[tokio::test]
async fn attributes_are_read_with_string_functions() {
    let (_dir, engine) = engine().await;
    assert_eq!(
        scalar(
            &engine,
            "SELECT regexp_match(attributes, '\"app[.]region\":\"([^\"]*)\"')[1] \
             FROM spans WHERE stage = 'call'"
        )
        .await,
        "eu-west"
    );
    assert_eq!(
        scalar(
            &engine,
            "SELECT count(*) FROM spans WHERE strpos(attributes, '\"app.region\":') > 0"
        )
        .await,
        "1"
    );
}

#[tokio::test]
async fn describe_and_information_schema_list_the_columns_of_every_table() {
    let (_dir, engine) = engine().await;
    for table in toolspan_query::TABLES {
        let described: Vec<String> = json_rows(
            &engine
                .sql(&format!("DESCRIBE {table}"))
                .await
                .unwrap_or_else(|e| panic!("DESCRIBE {table}: {}", e.envelope())),
        )
        .iter()
        .map(|r| r["column_name"].as_str().expect("column_name").to_string())
        .collect();
        assert!(described.len() > 3, "{table}: {described:?}");
        let listed: Vec<String> = json_rows(
            &engine
                .sql(&format!(
                    "SELECT column_name FROM information_schema.columns \
                     WHERE table_name = '{table}' ORDER BY ordinal_position"
                ))
                .await
                .unwrap_or_else(|e| panic!("{table}: {}", e.envelope())),
        )
        .iter()
        .map(|r| r["column_name"].as_str().expect("column_name").to_string())
        .collect();
        assert_eq!(listed, described, "{table}");
    }
    let calls = json_rows(&engine.sql("DESC calls").await.expect("DESC"));
    assert!(calls
        .iter()
        .any(|r| r["column_name"] == "recovered_after_retry"));
    let tables = scalar(
        &engine,
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .await;
    assert_eq!(tables, toolspan_query::TABLES.len().to_string());
    assert_eq!(
        refused(&engine, "DESCRIBE nothing_here").await,
        Code::UnknownTable
    );
}

#[tokio::test]
async fn settings_files_and_other_statements_stay_refused() {
    let (_dir, engine) = engine().await;
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("secret.csv");
    std::fs::write(&file, "a\n1\n").expect("write");
    let file = file.display();
    for sql in [
        "SELECT * FROM information_schema.df_settings".to_string(),
        "SELECT name, value FROM datafusion.information_schema.df_settings".into(),
        "SHOW ALL".into(),
        "SHOW datafusion.execution.batch_size".into(),
        "SHOW TABLES".into(),
        "EXPLAIN SELECT * FROM spans".into(),
        format!("CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION '{file}'"),
        format!("COPY (SELECT 1) TO '{file}'"),
        "CREATE VIEW v AS SELECT attributes FROM spans".into(),
    ] {
        assert_eq!(
            refused(&engine, &sql).await,
            Code::ForbiddenStatement,
            "{sql}"
        );
    }
    for sql in [
        format!("SELECT * FROM '{file}'"),
        format!("DESCRIBE '{file}'"),
        "DESCRIBE SELECT * FROM spans".into(),
        "SELECT * FROM pg_catalog.pg_settings".into(),
    ] {
        let code = refused(&engine, &sql).await;
        assert!(
            matches!(
                code,
                Code::UnknownTable | Code::ForbiddenStatement | Code::SqlSyntax
            ),
            "{sql}: {code:?}"
        );
    }
}

/// docs/table.md names every column of `calls`, `recoveries` and `failure_rates`.
#[tokio::test]
async fn the_table_docs_list_every_column_of_every_view() {
    let (_dir, engine) = engine().await;
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/table.md"),
    )
    .expect("docs/table.md");
    for view in ["calls", "recoveries", "failure_rates"] {
        let heading = format!("`{view}` view\n");
        let at = docs
            .match_indices(&heading)
            .map(|(i, _)| i)
            .find(|&i| {
                docs[..i]
                    .rsplit('\n')
                    .next()
                    .is_some_and(|l| l.starts_with("## "))
            })
            .unwrap_or_else(|| panic!("docs/table.md has a section on the {heading:?}"));
        let section = &docs[at + heading.len()..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        for r in json_rows(
            &engine
                .sql(&format!("DESCRIBE {view}"))
                .await
                .expect("DESCRIBE"),
        ) {
            let c = r["column_name"].as_str().expect("column_name");
            assert!(
                section.contains(&format!("`{c}`")),
                "docs/table.md, {heading}: column `{c}` is not documented"
            );
        }
    }
}

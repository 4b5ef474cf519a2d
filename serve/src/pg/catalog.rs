//! What Postgres clients look up besides the data: `information_schema` (tables, columns,
//! schemata), `pg_catalog` (datafusion-pg-catalog's tables and functions: `quote_ident`,
//! `parse_ident`, `array_lower`/`array_upper`, `format_type`, `pg_get_userbyid`, …), and the
//! two functions it leaves out, `current_setting(name)` and a Postgres-style `version()`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{create_udf, ColumnarValue, Volatility};
use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_pg_catalog::pg_catalog::setup_pg_catalog;

use super::settings;
use toolspan_query::engine::Engine;
use toolspan_query::error::{QueryError, QueryErrorKind};

/// The text `version()` returns.
pub fn version_text() -> String {
    format!(
        "PostgreSQL {} on toolspan {} (Apache DataFusion, read-only)",
        settings::SERVER_VERSION,
        env!("CARGO_PKG_VERSION")
    )
}

/// Registers the catalogs and functions on the engine's context. The engine's read-only
/// gate applies to them as to every table.
pub async fn install(engine: &Engine) -> Result<(), QueryError> {
    let ctx = engine.context();
    let internal = |what: &str, e: &dyn std::fmt::Display| {
        QueryError::new(QueryErrorKind::Internal, format_args!("{what}: {e}"))
    };
    // Grafana's pickers read information_schema.tables / columns / schemata.
    ctx.state_ref()
        .write()
        .config_mut()
        .options_mut()
        .catalog
        .information_schema = true;
    setup_pg_catalog(ctx, "datafusion", EmptyContextProvider)
        .map_err(|e| internal("installing pg_catalog", &e))?;
    ctx.register_udf(create_udf(
        "current_setting",
        vec![DataType::Utf8],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(current_setting),
    ));
    let version = version_text();
    ctx.register_udf(create_udf(
        "version",
        vec![],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(move |_args: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
                version.clone(),
            ))))
        }),
    ));
    Ok(())
}

/// `current_setting(name)`: the server default of a setting (NULL for an unknown name; a
/// connection's own `SET`s show in `SHOW`).
fn current_setting(args: &[ColumnarValue]) -> Result<ColumnarValue, DataFusionError> {
    let lookup = |name: Option<&str>| name.and_then(settings::default_value).map(str::to_string);
    match args.first() {
        Some(ColumnarValue::Scalar(ScalarValue::Utf8(name))) => Ok(ColumnarValue::Scalar(
            ScalarValue::Utf8(lookup(name.as_deref())),
        )),
        Some(ColumnarValue::Array(array)) => {
            let names = array
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| DataFusionError::Plan("current_setting takes text".into()))?;
            let values: StringArray = (0..names.len())
                .map(|i| lookup((!names.is_null(i)).then(|| names.value(i))))
                .collect();
            Ok(ColumnarValue::Array(Arc::new(values) as ArrayRef))
        }
        _ => Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))),
    }
}

//! [`KeyedRowEstimates`]: row estimates where DataFusion's would need distinct counts.
//!
//! DataFusion chooses which side of a hash join to build from row estimates. Without distinct
//! counts of the join keys (the Delta log has none) its statistics registry estimates an inner
//! join as the product of its sides and a semi join as its whole preserved side, however small
//! the other side is. In the `calls` view that made the filter on `recovered_after_retry` build
//! its hash table on the ~1.1M calls rather than on the ~0.2M calls with a failed attempt.
//! Here, where a key's distinct counts are unknown, an inner or semi join keeps as many rows as
//! its smaller side (the key/foreign-key assumption DataFusion's per-operator estimate makes
//! for inner joins), and a grouping at most its input's estimate; everything else is left to
//! DataFusion's own providers.

use std::sync::Arc;

use datafusion::common::stats::Precision;
use datafusion::common::{JoinType, Result, Statistics};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::operator_statistics::{
    ExtendedStatistics, StatisticsProvider, StatisticsRegistry, StatisticsResult,
};
use datafusion::physical_plan::ExecutionPlan;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct KeyedRowEstimates;

/// DataFusion's statistics providers, with [`KeyedRowEstimates`] first.
pub(crate) fn registry() -> StatisticsRegistry {
    let mut registry = StatisticsRegistry::default_with_builtin_providers();
    registry.register(Arc::new(KeyedRowEstimates));
    registry
}

impl StatisticsProvider for KeyedRowEstimates {
    fn compute_statistics(
        &self,
        plan: &dyn ExecutionPlan,
        child_stats: &[ExtendedStatistics],
    ) -> Result<StatisticsResult> {
        let rows = |i: usize| {
            child_stats
                .get(i)
                .and_then(|s| s.base().num_rows.get_value().copied())
        };
        let estimate = if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
            // With distinct counts for every key on both sides, DataFusion's estimate holds.
            let known = |side: usize, key: &Arc<dyn PhysicalExpr>| {
                key.downcast_ref::<Column>()
                    .and_then(|c| {
                        child_stats
                            .get(side)?
                            .base()
                            .column_statistics
                            .get(c.index())
                    })
                    .is_some_and(|s| s.distinct_count.get_value().is_some())
            };
            if join.on().iter().all(|(l, r)| known(0, l) && known(1, r)) {
                return Ok(StatisticsResult::Delegate);
            }
            match (join.join_type(), rows(0), rows(1)) {
                (
                    JoinType::Inner | JoinType::LeftSemi | JoinType::RightSemi,
                    Some(left),
                    Some(right),
                ) => left.min(right),
                _ => return Ok(StatisticsResult::Delegate),
            }
        } else if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
            match (aggregate.group_expr().expr().is_empty(), rows(0)) {
                (false, Some(input)) => input,
                _ => return Ok(StatisticsResult::Delegate),
            }
        } else {
            return Ok(StatisticsResult::Delegate);
        };
        Ok(StatisticsResult::Computed(ExtendedStatistics::new(
            Statistics {
                num_rows: Precision::Inexact(estimate),
                total_byte_size: Precision::Absent,
                column_statistics: Statistics::unknown_column(&plan.schema()),
            },
        )))
    }
}

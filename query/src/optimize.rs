//! [`PartitionKeyAggregate`]: grouping on partition columns without hashing them per row.
//!
//! The searches users run most ("failure rate per tool and stage", "top error codes per tool")
//! group by partition columns, whose value is the same for every row of a file. DataFusion's
//! partial aggregation still hashes and compares those strings row by row (in Q2 of
//! `bench/query`, about half of the query's CPU). This rule splits such a partial aggregation
//! by the files' partition values: for each combination of the grouped partition columns, the
//! same plan over just those files, aggregating on the remaining group columns only (for Q2,
//! none: DataFusion's ungrouped path, plus a row count so that files without matching rows
//! still yield no group), then a projection that puts the combination's values back as
//! constants. The union of these has exactly the schema and rows of the partial
//! aggregation it replaces; the final aggregation above it is unchanged.
//!
//! It applies when the partial aggregation reads a file scan through filters, projections and
//! round-robin repartitions only, groups on plain columns, and at least one of them is a
//! partition column (a column of the scan's partition values); otherwise the plan is left as
//! DataFusion built it.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, ScalarValue};
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::functions_aggregate::count::count_udaf;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::aggregate::AggregateExprBuilder;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{ExecutionPlan, InputOrderMode, Partitioning};
use datafusion_datasource::{compute_all_files_statistics, PartitionedFile};

/// At most this many partition-value combinations per aggregation (one sub-plan each).
const MAX_COMBINATIONS: usize = 512;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct PartitionKeyAggregate;

impl PhysicalOptimizerRule for PartitionKeyAggregate {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let target = config.execution.target_partitions.max(1);
        plan.transform_down(|node| {
            // Only under nodes that read any number of input partitions, so that the union's
            // partition count cannot break a distribution requirement.
            let any_partitions = node.is::<CoalescePartitionsExec>()
                || node
                    .downcast_ref::<RepartitionExec>()
                    .is_some_and(|r| !r.preserve_order());
            if !any_partitions {
                return Ok(Transformed::no(node));
            }
            let Some(child) = node.children().first().map(|c| Arc::clone(c)) else {
                return Ok(Transformed::no(node));
            };
            match split(&child, target)? {
                Some(split) => Ok(Transformed::new(
                    replace_children_if_necessary(node, vec![split])?,
                    true,
                    TreeNodeRecursion::Jump,
                )),
                None => Ok(Transformed::no(node)),
            }
        })
        .data()
    }

    fn name(&self) -> &str {
        "partition_key_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Where a group column comes from.
enum Key {
    /// The scan's partition column with this index.
    Partition(usize),
    /// Anything else: it stays a group column of the per-combination aggregation.
    Other,
}

/// The union of per-combination partial aggregations replacing `plan`, if it qualifies.
fn split(plan: &Arc<dyn ExecutionPlan>, target: usize) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(agg) = plan.downcast_ref::<AggregateExec>() else {
        return Ok(None);
    };
    let group_by = agg.group_expr();
    if *agg.mode() != AggregateMode::Partial
        || !group_by.is_single()
        || group_by.is_empty()
        || agg.limit_options().is_some()
        || *agg.input_order_mode() != InputOrderMode::Linear
    {
        return Ok(None);
    }
    let mut parts = Vec::new();
    if !split_over(agg, Arc::clone(agg.input()), Vec::new(), target, &mut parts)? {
        return Ok(None);
    }
    Ok(Some(UnionExec::try_new(parts)?))
}

/// Adds to `parts` the partial aggregations that together replace `agg` over `node` (reached
/// through `chain`, top first). A union below the aggregation is split into its branches (a
/// partial aggregation of a union is the union of the branches' partial aggregations); a
/// branch that cannot be split keeps the aggregation as it is. Returns whether any scan was
/// split by partition values; if none was, the caller keeps the original plan.
fn split_over(
    agg: &AggregateExec,
    mut node: Arc<dyn ExecutionPlan>,
    mut chain: Vec<Arc<dyn ExecutionPlan>>,
    target: usize,
    parts: &mut Vec<Arc<dyn ExecutionPlan>>,
) -> Result<bool> {
    // Walk down to the scan through nodes that keep rows as they are (round-robin repartitions
    // are dropped: the combinations already run in parallel).
    let config = loop {
        let any: &dyn ExecutionPlan = node.as_ref();
        if let Some(scan) = any.downcast_ref::<DataSourceExec>() {
            match scan.data_source().downcast_ref::<FileScanConfig>() {
                Some(config) => break config.clone(),
                None => return unsplit(agg, node, &chain, parts),
            }
        }
        if any.is::<UnionExec>() {
            let mut any_split = false;
            for child in node.children() {
                any_split |= split_over(agg, Arc::clone(child), chain.clone(), target, parts)?;
            }
            return Ok(any_split);
        }
        let keep = if any.is::<FilterExec>()
            || any.is::<ProjectionExec>()
            || is_coalesce_batches(any)
        {
            true
        } else if let Some(r) = any.downcast_ref::<RepartitionExec>() {
            if !matches!(r.partitioning(), Partitioning::RoundRobinBatch(_)) || r.preserve_order() {
                return unsplit(agg, node, &chain, parts);
            }
            false
        } else {
            return unsplit(agg, node, &chain, parts);
        };
        let Some(child) = node.children().first().map(|c| Arc::clone(c)) else {
            return unsplit(agg, node, &chain, parts);
        };
        if keep {
            chain.push(node);
        }
        node = child;
    };
    match split_scan(agg, &config, &chain, target)? {
        Some(split) => {
            parts.extend(split);
            Ok(true)
        }
        None => unsplit(agg, node, &chain, parts),
    }
}

/// `agg` as it is over `node` below `chain`.
fn unsplit(
    agg: &AggregateExec,
    node: Arc<dyn ExecutionPlan>,
    chain: &[Arc<dyn ExecutionPlan>],
    parts: &mut Vec<Arc<dyn ExecutionPlan>>,
) -> Result<bool> {
    let input = rebuild(chain, node)?;
    parts.push(Arc::new(AggregateExec::try_new(
        AggregateMode::Partial,
        agg.group_expr().clone(),
        agg.aggr_expr().to_vec(),
        agg.filter_expr().to_vec(),
        input,
        agg.input_schema(),
    )?));
    Ok(false)
}

/// `chain` (top first) over `input`.
fn rebuild(
    chain: &[Arc<dyn ExecutionPlan>],
    mut input: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    for node in chain.iter().rev() {
        input = replace_children_if_necessary(Arc::clone(node), vec![input])?;
    }
    Ok(input)
}

/// One partial aggregation per combination of the grouped partition values of `config`'s
/// files, each re-laid out as `agg`'s output; None if `agg` groups on no partition column.
fn split_scan(
    agg: &AggregateExec,
    config: &FileScanConfig,
    chain: &[Arc<dyn ExecutionPlan>],
    target: usize,
) -> Result<Option<Vec<Arc<dyn ExecutionPlan>>>> {
    let group_by = agg.group_expr();
    if config.limit.is_some() {
        return Ok(None);
    }

    // Trace every group column down to the scan.
    let file_columns = config
        .file_source()
        .table_schema()
        .file_schema()
        .fields()
        .len();
    let projection = config.file_source().projection().cloned();
    let mut keys = Vec::with_capacity(group_by.expr().len());
    for (expr, _) in group_by.expr() {
        let Some(column) = expr.downcast_ref::<Column>() else {
            keys.push(Key::Other);
            continue;
        };
        let mut index = Some(column.index());
        for node in chain {
            index = index.and_then(|i| input_index(node, i));
        }
        let table_index = index.and_then(|i| match &projection {
            None => Some(i),
            Some(p) => p
                .iter()
                .nth(i)
                .and_then(|e| e.expr.downcast_ref::<Column>().map(|c| c.index())),
        });
        keys.push(match table_index {
            Some(t) if t >= file_columns => Key::Partition(t - file_columns),
            _ => Key::Other,
        });
    }
    if !keys.iter().any(|k| matches!(k, Key::Partition(_))) {
        return Ok(None);
    }

    // The files of each combination of the grouped partition values.
    let mut combos: Vec<(Vec<ScalarValue>, Vec<PartitionedFile>)> = Vec::new();
    let mut index: HashMap<Vec<ScalarValue>, usize> = HashMap::new();
    for file in config.file_groups.iter().flat_map(|g| g.iter()) {
        let mut values = Vec::new();
        for key in &keys {
            if let Key::Partition(p) = key {
                match file.partition_values.get(*p) {
                    Some(v) => values.push(v.clone()),
                    None => return Ok(None),
                }
            }
        }
        let at = *index.entry(values.clone()).or_insert_with(|| {
            combos.push((values, Vec::new()));
            combos.len() - 1
        });
        combos[at].1.push(file.clone());
    }
    if combos.is_empty() || combos.len() > MAX_COMBINATIONS {
        return Ok(None);
    }

    let others: Vec<(Arc<dyn PhysicalExpr>, String)> = group_by
        .expr()
        .iter()
        .zip(&keys)
        .filter(|(_, k)| matches!(k, Key::Other))
        .map(|(e, _)| e.clone())
        .collect();
    // Without group columns an aggregation returns one row even for no input rows (count 0),
    // where the grouped one it replaces returns none: such a part also counts its rows (free
    // for count(*): one addition per batch) and keeps its row only if it saw any.
    let ungrouped = others.is_empty();
    let group_columns = others.len();
    let groups = PhysicalGroupBy::new_single(others);
    let mut aggregates = agg.aggr_expr().to_vec();
    let mut filters = agg.filter_expr().to_vec();
    if ungrouped {
        let rows = AggregateExprBuilder::new(
            count_udaf(),
            vec![Arc::new(Literal::new(ScalarValue::Int64(Some(1))))],
        )
        .schema(agg.input_schema())
        .alias("__partition_rows")
        .build()?;
        aggregates.push(Arc::new(rows));
        filters.push(None);
    }
    let out = agg.schema();
    let table_schema = config.file_source().table_schema().table_schema().clone();
    let mut parts = Vec::with_capacity(combos.len());
    let file_groups_n = scan_groups(&config.object_store_url, target);
    for (values, files) in combos {
        let (file_groups, statistics) = compute_all_files_statistics(
            spread(files, file_groups_n),
            table_schema.clone(),
            true,
            false,
        )?;
        let scan = FileScanConfigBuilder::from(config.clone())
            .with_file_groups(file_groups)
            .with_statistics(statistics)
            .build();
        let input = rebuild(chain, DataSourceExec::from_data_source(scan))?;
        let mut partial: Arc<dyn ExecutionPlan> = Arc::new(AggregateExec::try_new(
            AggregateMode::Partial,
            groups.clone(),
            aggregates.clone(),
            filters.clone(),
            input,
            agg.input_schema(),
        )?);
        // The original states, without the row count of an ungrouped part.
        let states = partial.schema().fields().len() - group_columns - usize::from(ungrouped);
        if ungrouped {
            let rows = partial.schema().fields().len() - 1;
            let name = partial.schema().field(rows).name().clone();
            let seen: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
                Arc::new(Column::new(&name, rows)),
                Operator::Gt,
                Arc::new(Literal::new(ScalarValue::Int64(Some(0)))),
            ));
            partial = Arc::new(FilterExec::try_new(seen, partial)?);
        }
        // Back to the original layout: group columns (constants for the partition ones), then
        // the aggregate states.
        let mut exprs: Vec<(Arc<dyn PhysicalExpr>, String)> =
            Vec::with_capacity(out.fields().len());
        let (mut constant, mut other) = (values.into_iter(), 0usize);
        for (key, field) in keys.iter().zip(out.fields()) {
            let expr: Arc<dyn PhysicalExpr> = match key {
                Key::Partition(_) => match constant.next() {
                    Some(v) => Arc::new(Literal::new(v)),
                    None => return Ok(None),
                },
                Key::Other => {
                    other += 1;
                    Arc::new(Column::new(field.name(), other - 1))
                }
            };
            exprs.push((expr, field.name().clone()));
        }
        for (i, field) in out
            .fields()
            .iter()
            .skip(keys.len())
            .take(states)
            .enumerate()
        {
            exprs.push((
                Arc::new(Column::new(field.name(), group_columns + i)),
                field.name().clone(),
            ));
        }
        let part = Arc::new(ProjectionExec::try_new(exprs, partial)?) as Arc<dyn ExecutionPlan>;
        // Types and nullability must be those of the aggregation being replaced.
        if part.schema().fields() != out.fields() {
            return Ok(None);
        }
        parts.push(part);
    }
    Ok(Some(parts))
}

/// The index in `node`'s input of its output column `i`, if that column is passed through.
fn input_index(node: &Arc<dyn ExecutionPlan>, i: usize) -> Option<usize> {
    let any: &dyn ExecutionPlan = node.as_ref();
    if let Some(p) = any.downcast_ref::<ProjectionExec>() {
        let expr = p.projection_expr().iter().nth(i)?;
        return expr.expr.downcast_ref::<Column>().map(|c| c.index());
    }
    if let Some(f) = any.downcast_ref::<FilterExec>() {
        return match f.projection() {
            Some(p) => p.get(i).copied(),
            None => Some(i),
        };
    }
    Some(i)
}

/// File groups a scan of `store` is spread over for `target` partitions. A group reads its
/// files one after another, each waiting on a few round trips (bloom filters, page indexes,
/// column chunks); on object storage those are tens of milliseconds each, so a remote scan
/// uses at least [`REMOTE_SCAN_GROUPS`] groups to keep that many files in flight, whatever
/// the number of cores.
pub(crate) fn scan_groups(store: &ObjectStoreUrl, target: usize) -> usize {
    if toolspan_store::storage::is_remote(store.as_str()) {
        target.max(REMOTE_SCAN_GROUPS)
    } else {
        target
    }
}

/// See [`scan_groups`].
const REMOTE_SCAN_GROUPS: usize = 16;

/// `files` in at most `n` groups of about equal bytes (largest first, each to the lightest).
pub(crate) fn spread(mut files: Vec<PartitionedFile>, n: usize) -> Vec<FileGroup> {
    files.sort_by_key(|f| std::cmp::Reverse(f.object_meta.size));
    let mut groups: Vec<(u64, Vec<PartitionedFile>)> = (0..n.min(files.len()).max(1))
        .map(|_| (0, Vec::new()))
        .collect();
    for file in files {
        let bytes = file.object_meta.size;
        if let Some(g) = groups.iter_mut().min_by_key(|(b, _)| *b) {
            g.0 += bytes;
            g.1.push(file);
        }
    }
    groups
        .into_iter()
        .filter(|(_, f)| !f.is_empty())
        .map(|(_, f)| FileGroup::new(f))
        .collect()
}

/// DataFusion no longer plans `CoalesceBatchesExec` (deprecated), but plans built elsewhere may
/// still hold one; it passes rows and schema through unchanged.
#[allow(deprecated)]
fn is_coalesce_batches(node: &dyn ExecutionPlan) -> bool {
    node.is::<datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec>()
}

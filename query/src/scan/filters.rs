//! Bloom filters kept in memory between lookups.
//!
//! A lookup by trace id or error reference asks every row group of every file it cannot prune
//! by statistics (ids are random, so min/max prunes almost nothing) whether its bloom filter
//! may hold the value: one read per row group of a few kilobytes to a few hundred, which on a
//! table of many files is most of a lookup's time, and on object storage one request each.
//! Files never change once written, so their filters can be kept: this reader factory wraps
//! DataFusion's (which serves footers from the engine's metadata cache) and serves the reads
//! of bloom filters from the same cache, one entry per file holding the filters read so far,
//! under the file's path and [`FILTERS`] (no file is named so). The entry counts against the
//! cache's budget like a footer, and goes with the file's footer when the table no longer has
//! the file (see the `spans` provider).

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::datasource::physical_plan::parquet::{
    CachedParquetFileReaderFactory, ParquetFileReaderFactory,
};
use datafusion::error::Result as DfResult;
use datafusion::execution::cache::cache_manager::{
    CachedFileMetadataEntry, FileMetadata, FileMetadataCache,
};
use datafusion::parquet::arrow::arrow_reader::ArrowReaderOptions;
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::parquet::errors::Result as ParquetResult;
use datafusion::parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion_datasource::PartitionedFile;
use deltalake::logstore::object_store::ObjectStore;
use deltalake::{ObjectMeta, Path};
use futures::future::{BoxFuture, FutureExt};

/// The last part of the cache key of a file's filters (after the file's own path).
pub(crate) const FILTERS: &str = "bloom-filters";

/// The cache key of the filters of the file at `location`.
pub(crate) fn filters_key(location: &Path) -> Path {
    location.clone().join(FILTERS)
}

/// The filters of one file read so far, by offset in the file.
struct Filters(HashMap<u64, Bytes>);

impl FileMetadata for Filters {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn memory_size(&self) -> usize {
        self.0.values().map(|b| b.len() + 48).sum::<usize>() + 64
    }

    fn extra_info(&self) -> datafusion::common::HashMap<String, String> {
        datafusion::common::HashMap::from([("bloom_filters".to_owned(), self.0.len().to_string())])
    }
}

/// DataFusion's reader factory (footers from `cache`), with bloom filters from `cache` too.
#[derive(Debug)]
pub(crate) struct FilterCachingFactory {
    inner: CachedParquetFileReaderFactory,
    cache: Arc<FileMetadataCache>,
    page_index: bool,
}

impl FilterCachingFactory {
    /// `page_index`: whether the scan prunes pages, and so wants each file's page index
    /// cached with its footer. Scans that do not keep asking for the footer alone: a first
    /// query of a remote table would otherwise fetch every file's page index for nothing.
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        cache: Arc<FileMetadataCache>,
        page_index: bool,
    ) -> Self {
        FilterCachingFactory {
            inner: CachedParquetFileReaderFactory::new(store, cache.clone()),
            cache,
            page_index,
        }
    }
}

impl ParquetFileReaderFactory for FilterCachingFactory {
    fn create_reader(
        &self,
        partition_index: usize,
        partitioned_file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> DfResult<Box<dyn AsyncFileReader + Send>> {
        let file = partitioned_file.object_meta.clone();
        let inner = self.inner.create_reader(
            partition_index,
            partitioned_file,
            metadata_size_hint,
            metrics,
        )?;
        Ok(Box::new(FilterCachingReader {
            inner,
            file,
            cache: self.cache.clone(),
            page_index: self.page_index,
            offsets: None,
        }))
    }
}

/// A file's reader whose reads of bloom filters go through the cache.
struct FilterCachingReader {
    inner: Box<dyn AsyncFileReader + Send>,
    file: ObjectMeta,
    cache: Arc<FileMetadataCache>,
    /// Whether to ask for the footer with its page index.
    page_index: bool,
    /// Where the file's bloom filters start, once its footer is read.
    offsets: Option<HashSet<u64>>,
}

impl FilterCachingReader {
    fn cached(&self, start: u64, len: usize) -> Option<Bytes> {
        let entry = self.cache.get(&filters_key(&self.file.location))?;
        if !entry.is_valid_for(&self.file) {
            return None;
        }
        let filters = entry.file_metadata.as_any().downcast_ref::<Filters>()?;
        filters.0.get(&start).filter(|b| b.len() == len).cloned()
    }

    fn keep(&self, start: u64, bytes: &Bytes) {
        let key = filters_key(&self.file.location);
        let mut held: HashMap<u64, Bytes> = self
            .cache
            .get(&key)
            .filter(|e| e.is_valid_for(&self.file))
            .and_then(|e| {
                e.file_metadata
                    .as_any()
                    .downcast_ref::<Filters>()
                    .map(|f| f.0.clone())
            })
            .unwrap_or_default();
        // Its own copy: the read may be a slice of a larger buffer (a cached block).
        held.insert(start, Bytes::copy_from_slice(bytes));
        self.cache.put(
            &key,
            CachedFileMetadataEntry::new(self.file.clone(), Arc::new(Filters(held))),
        );
    }
}

impl AsyncFileReader for FilterCachingReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, ParquetResult<Bytes>> {
        let filter = self
            .offsets
            .as_ref()
            .is_some_and(|o| o.contains(&range.start));
        if !filter {
            return self.inner.get_bytes(range);
        }
        let len = (range.end - range.start) as usize;
        if let Some(bytes) = self.cached(range.start, len) {
            return futures::future::ready(Ok(bytes)).boxed();
        }
        async move {
            let start = range.start;
            let bytes = self.inner.get_bytes(range).await?;
            self.keep(start, &bytes);
            Ok(bytes)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, ParquetResult<Vec<Bytes>>> {
        self.inner.get_byte_ranges(ranges)
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, ParquetResult<Arc<ParquetMetaData>>> {
        // With its page index when the scan prunes pages: DataFusion's opener asks for the
        // footer alone and, when a query prunes pages, reads the page index itself, so
        // through its own reader a cached footer never holds one and every such query reads
        // and decodes the page index of every file again (and copies the footer to add it).
        // Asked for here, it is cached with the footer, and the opener uses it as it finds it.
        let wanted = self.page_index.then(|| {
            options
                .cloned()
                .unwrap_or_else(ArrowReaderOptions::new)
                .with_page_index_policy(PageIndexPolicy::Optional)
        });
        async move {
            let metadata = match &wanted {
                Some(wanted) => self.inner.get_metadata(Some(wanted)).await?,
                None => self.inner.get_metadata(options).await?,
            };
            if self.offsets.is_none() {
                self.offsets = Some(filter_offsets(&metadata));
            }
            Ok(metadata)
        }
        .boxed()
    }
}

/// Where the bloom filters of a file start (of every column that has them).
fn filter_offsets(metadata: &ParquetMetaData) -> HashSet<u64> {
    metadata
        .row_groups()
        .iter()
        .flat_map(|rg| rg.columns())
        .filter_map(|c| c.bloom_filter_offset())
        .filter_map(|o| u64::try_from(o).ok())
        .collect()
}

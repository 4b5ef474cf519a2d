//! [`CachedStore`]: Parquet bytes of a remote table kept in memory between queries.
//!
//! On a local disk a warm query reads its column chunks from the operating system's page
//! cache; on object storage every range read is a request of tens of milliseconds, and a
//! query touching 80 files makes hundreds of them (`bench/query --table s3://…`). The table's
//! data files never change once written (a Delta commit adds and removes whole files), so
//! their bytes can be kept without any invalidation: this wrapper around the table's object
//! store keeps fixed-size blocks of `*.parquet` objects in a bounded in-memory cache
//! ([moka], least recently used weighed by bytes). A read is served from the blocks it
//! covers; missing blocks are fetched as contiguous runs, several runs at once, and kept.
//! Everything else (the Delta log, listings, writes, conditional requests) goes to the store
//! unchanged. Footers are cached separately, decoded, by DataFusion's metadata cache.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use deltalake::logstore::object_store::{
    self, CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult,
};
use deltalake::Path;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};

/// Bytes per cached block. A read of a few bytes costs one block from the store, which on
/// object storage takes about as long as a read of a few bytes.
pub const BLOCK_BYTES: u64 = 256 << 10;

/// Longest run of blocks fetched in one request (so that a large read is fetched as several
/// requests at once).
const MAX_RUN_BLOCKS: u64 = 32;

/// Requests of one read that run at once.
const FETCH_CONCURRENCY: usize = 8;

/// How well the cache served reads, for logs and tests.
#[derive(Debug, Default)]
pub struct CacheStats {
    hit_blocks: AtomicU64,
    fetched_blocks: AtomicU64,
    requests: AtomicU64,
}

impl CacheStats {
    /// Blocks served from memory.
    pub fn hit_blocks(&self) -> u64 {
        self.hit_blocks.load(Ordering::Relaxed)
    }
    /// Blocks read from the store.
    pub fn fetched_blocks(&self) -> u64 {
        self.fetched_blocks.load(Ordering::Relaxed)
    }
    /// Range requests made to the store for cacheable objects.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// The blocks of every wrapped store of one engine, within one byte budget.
#[derive(Clone)]
pub struct DataCache {
    blocks: moka::sync::Cache<(Path, u64), Bytes>,
    /// What a range response says about its object (size, ETag), to answer `get_opts` from
    /// blocks. One small entry per file.
    metas: moka::sync::Cache<Path, ObjectMeta>,
    stats: Arc<CacheStats>,
}

impl fmt::Debug for DataCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataCache")
            .field("bytes", &self.blocks.weighted_size())
            .finish()
    }
}

impl DataCache {
    /// A cache of at most `bytes` of blocks.
    pub fn new(bytes: u64) -> DataCache {
        DataCache {
            blocks: moka::sync::Cache::builder()
                .max_capacity(bytes)
                .weigher(|_, v: &Bytes| u32::try_from(v.len()).unwrap_or(u32::MAX))
                .build(),
            metas: moka::sync::Cache::new(1 << 20),
            stats: Arc::new(CacheStats::default()),
        }
    }

    /// Counters of what the cache served.
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    /// `inner` with this cache in front of its Parquet objects.
    pub fn wrap(&self, inner: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
        Arc::new(CachedStore {
            inner,
            cache: self.clone(),
        })
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct CachedStore {
    inner: Arc<dyn ObjectStore>,
    cache: DataCache,
}

impl fmt::Display for CachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CachedStore({})", self.inner)
    }
}

/// Data files and checkpoints: written once, never changed.
fn immutable(location: &Path) -> bool {
    location.as_ref().ends_with(".parquet")
}

/// Contiguous runs of `blocks` (sorted), each at most [`MAX_RUN_BLOCKS`] long.
fn runs(blocks: &[u64]) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some(r) if r.end == b && r.end - r.start < MAX_RUN_BLOCKS => r.end = b + 1,
            _ => out.push(b..b + 1),
        }
    }
    out
}

/// The blocks covering `range` (none for an empty range).
fn blocks_of(range: &Range<u64>) -> Range<u64> {
    if range.start >= range.end {
        return 0..0;
    }
    range.start / BLOCK_BYTES..(range.end - 1) / BLOCK_BYTES + 1
}

impl CachedStore {
    /// Serves `ranges` of `location` from blocks, fetching the missing ones. `None` when a
    /// range reaches past the end of the object (the caller asks the store itself, which
    /// answers as it does).
    async fn read(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Option<Vec<Bytes>>> {
        let wanted: BTreeSet<u64> = ranges.iter().flat_map(blocks_of).collect();
        let mut have: HashMap<u64, Bytes> = HashMap::with_capacity(wanted.len());
        let mut missing = Vec::new();
        for b in wanted {
            match self.cache.blocks.get(&(location.clone(), b)) {
                Some(bytes) => {
                    have.insert(b, bytes);
                }
                None => missing.push(b),
            }
        }
        let stats = &self.cache.stats;
        stats
            .hit_blocks
            .fetch_add(have.len() as u64, Ordering::Relaxed);
        let fetches = runs(&missing).into_iter().map(|run| {
            let inner = Arc::clone(&self.inner);
            let location = location.clone();
            async move {
                let options = GetOptions {
                    range: Some(GetRange::Bounded(
                        run.start * BLOCK_BYTES..run.end * BLOCK_BYTES,
                    )),
                    ..GetOptions::default()
                };
                let got = inner.get_opts(&location, options).await?;
                let meta = got.meta.clone();
                let start = got.range.start;
                let bytes = got.bytes().await?;
                Ok::<_, object_store::Error>((run, start, bytes, meta))
            }
        });
        let fetched: Vec<_> = futures::stream::iter(fetches)
            .buffer_unordered(FETCH_CONCURRENCY)
            .try_collect()
            .await?;
        for (run, start, bytes, meta) in fetched {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            if start != run.start * BLOCK_BYTES {
                return Ok(None);
            }
            self.cache.metas.insert(location.clone(), meta);
            for b in run {
                let from = ((b * BLOCK_BYTES - start) as usize).min(bytes.len());
                let to = (from + BLOCK_BYTES as usize).min(bytes.len());
                if from == to {
                    break; // past the end of the object
                }
                let block = bytes.slice(from..to);
                stats.fetched_blocks.fetch_add(1, Ordering::Relaxed);
                self.cache
                    .blocks
                    .insert((location.clone(), b), block.clone());
                have.insert(b, block);
            }
        }
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            match assemble(&have, range) {
                Some(bytes) => out.push(bytes),
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    }
}

/// `range` cut out of the blocks in `have`; `None` if one is missing or short (past the end).
fn assemble(have: &HashMap<u64, Bytes>, range: &Range<u64>) -> Option<Bytes> {
    let blocks = blocks_of(range);
    if blocks.is_empty() {
        return Some(Bytes::new());
    }
    let piece = |b: u64| -> Option<Bytes> {
        let block = have.get(&b)?;
        let block_start = b * BLOCK_BYTES;
        let from = range.start.max(block_start) - block_start;
        let to = range.end.min(block_start + BLOCK_BYTES) - block_start;
        (to as usize <= block.len()).then(|| block.slice(from as usize..to as usize))
    };
    if blocks.end - blocks.start == 1 {
        return piece(blocks.start);
    }
    let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
    for b in blocks {
        out.extend_from_slice(&piece(b)?);
    }
    Some(out.freeze())
}

#[async_trait]
impl ObjectStore for CachedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let plain = !options.head
            && options.if_match.is_none()
            && options.if_none_match.is_none()
            && options.if_modified_since.is_none()
            && options.if_unmodified_since.is_none()
            && options.version.is_none();
        if let (true, true, Some(GetRange::Bounded(range))) =
            (plain, immutable(location), options.range.as_ref())
        {
            let range = range.clone();
            if let Some(mut bytes) = self.read(location, std::slice::from_ref(&range)).await? {
                if let Some(meta) = self.cache.metas.get(location) {
                    let bytes = bytes.pop().unwrap_or_default();
                    let end = range.start + bytes.len() as u64;
                    return Ok(GetResult {
                        payload: GetResultPayload::Stream(
                            futures::stream::once(async move { Ok(bytes) }).boxed(),
                        ),
                        meta,
                        range: range.start..end,
                        attributes: Default::default(),
                    });
                }
            }
        }
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        if immutable(location) {
            if let Some(bytes) = self.read(location, ranges).await? {
                return Ok(bytes);
            }
        }
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::logstore::object_store::memory::InMemory;
    use deltalake::logstore::object_store::ObjectStoreExt as _;

    /// A store that counts the range requests it answers.
    async fn setup(len: usize) -> (Arc<InMemory>, Arc<dyn ObjectStore>, DataCache, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let inner = Arc::new(InMemory::new());
        inner
            .put(&Path::from("t/a.parquet"), data.clone().into())
            .await
            .expect("put");
        inner
            .put(&Path::from("t/_delta_log/1.json"), data.clone().into())
            .await
            .expect("put");
        let cache = DataCache::new(64 << 20);
        let store = cache.wrap(inner.clone());
        (inner, store, cache, data)
    }

    #[tokio::test]
    async fn ranges_come_back_exact_and_the_second_read_is_served_from_memory() {
        let len = 3 * BLOCK_BYTES as usize + 1234;
        let (_, store, cache, data) = setup(len).await;
        let path = Path::from("t/a.parquet");
        let ranges: Vec<Range<u64>> = vec![
            0..10,
            BLOCK_BYTES - 5..BLOCK_BYTES + 5,
            100..3 * BLOCK_BYTES + 1000,
            len as u64 - 8..len as u64,
            7..7,
        ];
        let first = store.get_ranges(&path, &ranges).await.expect("read");
        for (r, b) in ranges.iter().zip(&first) {
            assert_eq!(b.as_ref(), &data[r.start as usize..r.end as usize], "{r:?}");
        }
        let requests = cache.stats().requests();
        assert!(requests >= 1);
        let second = store.get_ranges(&path, &ranges).await.expect("read");
        assert_eq!(first, second);
        let one = store
            .get_range(&path, 5..BLOCK_BYTES * 2)
            .await
            .expect("get_range");
        assert_eq!(one.as_ref(), &data[5..BLOCK_BYTES as usize * 2]);
        assert_eq!(
            cache.stats().requests(),
            requests,
            "no request for cached blocks"
        );
        assert!(cache.stats().hit_blocks() > 0);
    }

    #[tokio::test]
    async fn the_log_and_reads_past_the_end_go_to_the_store_as_they_are() {
        let len = BLOCK_BYTES as usize + 10;
        let (inner, store, cache, data) = setup(len).await;
        let log = Path::from("t/_delta_log/1.json");
        assert_eq!(
            store.get_range(&log, 0..4).await.expect("log").as_ref(),
            &data[..4]
        );
        assert_eq!(cache.stats().requests(), 0, "the log is not cached");
        // Past the end: the store's own answer (an error), not a short or cached one.
        let path = Path::from("t/a.parquet");
        let past = store.get_range(&path, 0..len as u64 + 100).await;
        let direct = inner.get_range(&path, 0..len as u64 + 100).await;
        match (past, direct) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("cached {a:?}, direct {b:?}"),
        }
        // A changed log entry is seen at once.
        inner.put(&log, vec![1u8, 2, 3].into()).await.expect("put");
        assert_eq!(
            store
                .get(&log)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("bytes")
                .as_ref(),
            &[1, 2, 3]
        );
    }

    #[test]
    fn runs_split_at_gaps_and_at_the_longest_run() {
        assert_eq!(runs(&[1, 2, 3, 7, 8]), vec![1..4, 7..9]);
        let long: Vec<u64> = (0..MAX_RUN_BLOCKS + 3).collect();
        assert_eq!(
            runs(&long),
            vec![0..MAX_RUN_BLOCKS, MAX_RUN_BLOCKS..MAX_RUN_BLOCKS + 3]
        );
        assert!(runs(&[]).is_empty());
    }
}

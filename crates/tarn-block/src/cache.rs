//! The block cache: verified, decompressed blocks kept in memory, bounded
//! in bytes, shared by every pool of the process.
//!
//! # Theory
//!
//! **What a key names.** A block is cached under its pool's guid, its first
//! address, its birth txg, its logical size, its compression and the
//! checksum of its stored bytes. Blocks are never rewritten in place with other contents:
//! a block freed and its space reused gets a new birth and checksum, a
//! rollback (or, once it exists, a receive) brings other pointers, and
//! self-heal rewrites the same bytes. So a hit is always the right content for the pointer that
//! asked, and nothing ever has to be invalidated while the pool is
//! imported. Only bytes that passed their checksum (or that the pipeline
//! just wrote) are inserted. Exporting a pool drops its blocks
//! ([`BlockCache::evict_pool`]): the devices may change hands.
//!
//! **Freed blocks leave.** The sync that frees a block (overwritten,
//! deleted, its last snapshot destroyed) drops it ([`BlockCache::forget`]).
//! Not for correctness (no pointer asks for it again) but for memory: a
//! guest rewriting its disk at random would otherwise fill the cache with
//! the versions it replaced, pushing out blocks that can still be read.
//!
//! **Eviction (S3-FIFO).** A plain LRU lets one large sequential read
//! flush a hot working set. Here every new block enters a *small* FIFO
//! (a tenth of the budget); a block read again while there moves to the
//! *main* FIFO when it reaches the small FIFO's head, the others leave,
//! and their keys are remembered in a *ghost* FIFO. A block whose key is
//! still a ghost when it comes back goes straight to main. Main evicts its
//! head unless it was read since its last pass (a counter from 0 to 3,
//! decremented per pass), in which case the block goes around again. A
//! stream of blocks read once therefore passes through the small FIFO and
//! never displaces main. Prefetched blocks ([`BlockCache::insert_prefetched`])
//! enter the small FIFO with no credit, so read-ahead that is never used
//! costs nothing but memory, and the first read of a prefetched block
//! counts as its first use (no credit either), so a sequential scan served
//! by read-ahead stays as harmless as one read on demand.
//!
//! **Concurrency.** The cache is split into shards by key hash, each under
//! its own mutex held only for map and queue updates (never for I/O or
//! copies); a hit clones an `Arc`. The byte bound is per shard
//! (`max_bytes / SHARDS`), so the whole cache never exceeds `max_bytes`
//! plus one block per shard in flight.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::bp::{BlockPtr, CompressAlg};
use crate::crypt::KeySet;

/// Number of independently locked shards.
const SHARDS: usize = 16;
/// The small FIFO's share of a shard's budget, in tenths.
const SMALL_TENTHS: usize = 1;
/// Highest access count a cached block keeps.
const FREQ_MAX: u8 = 3;
/// Smallest budget a cache accepts. Blocks above a quarter of a shard's
/// share are not cached, so a budget this small caches small blocks only
/// (tests use it to exercise the paths a cache miss takes).
pub const MIN_CACHE_BYTES: usize = 64 << 10;

/// What a block is, for the hit counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// File data (dataset data blocks).
    Data,
    /// Tree nodes and other metadata.
    Meta,
}

/// The identity of a block's contents (see the module docs, "What a key
/// names"): two pointers with the same identity read back the same bytes.
/// The cache keys by it, and so do reads in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockId {
    pool: u64,
    vdev: u32,
    offset: u64,
    birth: u64,
    lsize: u32,
    compress: CompressAlg,
    sum: [u8; 32],
}

impl BlockId {
    /// The identity of what `bp` of pool `pool` (its guid) holds; `None`
    /// for a pointer with no address (a hole).
    pub fn of(pool: u64, bp: &BlockPtr) -> Option<BlockId> {
        let d = bp.used_dvas().next()?;
        Some(BlockId {
            pool,
            vdev: d.vdev,
            offset: d.offset,
            birth: bp.birth,
            lsize: bp.lsize,
            compress: bp.compress,
            sum: bp.checksum,
        })
    }

    fn shard(&self) -> usize {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        (h.finish() as usize) % SHARDS
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

struct Entry {
    data: Arc<[u8]>,
    freq: u8,
    queue: Queue,
    kind: BlockKind,
    /// Inserted by read-ahead and not read since.
    prefetched: bool,
}

#[derive(Default)]
struct Shard {
    map: HashMap<BlockId, Entry>,
    small: VecDeque<BlockId>,
    main: VecDeque<BlockId>,
    /// Ghost keys in the order they were remembered, each with the number
    /// it was remembered under: a key that came back and became a ghost
    /// again has an older entry here that no longer counts.
    ghost: VecDeque<(BlockId, u64)>,
    /// The ghosts that count, each with its entry's number in `ghost`.
    ghost_set: HashMap<BlockId, u64>,
    /// The number the next ghost is remembered under.
    ghost_seq: u64,
    small_bytes: usize,
    main_bytes: usize,
}

impl Shard {
    fn bytes(&self) -> usize {
        self.small_bytes + self.main_bytes
    }

    /// Drops every queue slot but one per cached block, in its own queue:
    /// slots of keys no longer cached, and the older slots of a key cached
    /// again after it was dropped (a block read again after its pool was
    /// exported and imported), which would otherwise count as a live
    /// block's and keep the queues long for good. The newest slot stays,
    /// where the block's last insertion or move put it.
    fn compact(&mut self) {
        let Shard {
            map, small, main, ..
        } = self;
        let mut seen: HashSet<BlockId> = HashSet::with_capacity(map.len());
        for (q, which) in [(small, Queue::Small), (main, Queue::Main)] {
            let mut kept: VecDeque<BlockId> = q
                .iter()
                .rev()
                .filter(|k| map.get(k).is_some_and(|e| e.queue == which) && seen.insert(**k))
                .copied()
                .collect();
            kept.make_contiguous().reverse();
            *q = kept;
        }
    }

    fn remember_ghost(&mut self, k: BlockId) {
        if !self.ghost_set.contains_key(&k) {
            self.ghost_seq += 1;
            self.ghost_set.insert(k, self.ghost_seq);
            self.ghost.push_back((k, self.ghost_seq));
        }
        // As many ghosts as main holds blocks (at least a few), and at most
        // as many entries again that no longer count.
        let cap = self.main.len().max(16);
        while self.ghost_set.len() > cap || self.ghost.len() > 2 * cap {
            let Some((old, seq)) = self.ghost.pop_front() else {
                break;
            };
            // An older entry of a key that is a ghost again does not end
            // the newer ghost.
            if self.ghost_set.get(&old) == Some(&seq) {
                self.ghost_set.remove(&old);
            }
        }
    }

    /// Whether `k` was a ghost (it is not one any more: it is back).
    fn take_ghost(&mut self, k: &BlockId) -> bool {
        self.ghost_set.remove(k).is_some()
    }

    /// Evicts one block (or moves one from small to main); returns the
    /// bytes it released, 0 when it only moved something or found a stale
    /// queue slot.
    fn evict_one(&mut self, small_max: usize, stats: &Counters) -> Option<usize> {
        let from_small = self.small_bytes > small_max || self.main.is_empty();
        if from_small {
            let k = self.small.pop_front()?;
            let Some(e) = self.map.get_mut(&k) else {
                return Some(0);
            };
            if e.queue != Queue::Small {
                return Some(0);
            }
            let len = e.data.len();
            if e.freq > 0 {
                e.freq = 0;
                e.queue = Queue::Main;
                self.small_bytes -= len;
                self.main_bytes += len;
                self.main.push_back(k);
                return Some(0);
            }
            self.small_bytes -= len;
            self.map.remove(&k);
            self.remember_ghost(k);
            stats.evicted.fetch_add(1, Ordering::Relaxed);
            Some(len)
        } else {
            let k = self.main.pop_front()?;
            let Some(e) = self.map.get_mut(&k) else {
                return Some(0);
            };
            if e.queue != Queue::Main {
                return Some(0);
            }
            if e.freq > 0 {
                e.freq -= 1;
                self.main.push_back(k);
                return Some(0);
            }
            let len = e.data.len();
            self.main_bytes -= len;
            self.map.remove(&k);
            stats.evicted.fetch_add(1, Ordering::Relaxed);
            Some(len)
        }
    }
}

#[derive(Default)]
struct Counters {
    data_hits: AtomicU64,
    data_misses: AtomicU64,
    meta_hits: AtomicU64,
    meta_misses: AtomicU64,
    inserted: AtomicU64,
    evicted: AtomicU64,
    prefetched: AtomicU64,
    prefetch_hits: AtomicU64,
}

/// Counters and sizes of a [`BlockCache`], as `iostat -v` and status show them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Bytes held now.
    pub bytes: u64,
    /// The bound.
    pub max_bytes: u64,
    /// Blocks held now.
    pub blocks: u64,
    /// Data-block lookups that hit.
    pub data_hits: u64,
    /// Data-block lookups that missed.
    pub data_misses: u64,
    /// Metadata lookups that hit.
    pub meta_hits: u64,
    /// Metadata lookups that missed.
    pub meta_misses: u64,
    /// Blocks inserted.
    pub inserted: u64,
    /// Blocks evicted.
    pub evicted: u64,
    /// Blocks inserted by read-ahead.
    pub prefetched: u64,
    /// Read-ahead blocks that were read afterwards.
    pub prefetch_hits: u64,
}

/// A bounded cache of verified blocks (see the module docs).
pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    max_bytes: AtomicUsize,
    stats: Counters,
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("max_bytes", &self.max_bytes())
            .finish()
    }
}

fn lock(m: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl BlockCache {
    /// A cache of at most `max_bytes` (raised to [`MIN_CACHE_BYTES`]).
    pub fn new(max_bytes: usize) -> BlockCache {
        BlockCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            max_bytes: AtomicUsize::new(max_bytes.max(MIN_CACHE_BYTES)),
            stats: Counters::default(),
        }
    }

    /// The process-wide cache every pool uses unless given its own: an
    /// eighth of the machine's memory, at least 256 MiB, until
    /// [`BlockCache::set_max_bytes`] says otherwise.
    pub fn global() -> Arc<BlockCache> {
        static GLOBAL: OnceLock<Arc<BlockCache>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| Arc::new(BlockCache::new(default_cache_bytes())))
            .clone()
    }

    /// The byte bound.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes.load(Ordering::Relaxed)
    }

    /// Changes the bound; a smaller one evicts at once.
    pub fn set_max_bytes(&self, max_bytes: usize) {
        self.max_bytes
            .store(max_bytes.max(MIN_CACHE_BYTES), Ordering::Relaxed);
        for s in &self.shards {
            let mut sh = lock(s);
            self.shrink(&mut sh);
        }
    }

    fn shard_max(&self) -> usize {
        self.max_bytes() / SHARDS
    }

    /// The cached logical bytes of `bp` of pool `pool` (its guid), if any.
    pub fn get(&self, pool: u64, bp: &BlockPtr, kind: BlockKind) -> Option<Arc<[u8]>> {
        let found = self.try_get(pool, bp, kind);
        if found.is_none() {
            let misses = match kind {
                BlockKind::Data => &self.stats.data_misses,
                BlockKind::Meta => &self.stats.meta_misses,
            };
            misses.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// [`BlockCache::get`] for a reader that, on a miss, asks again the
    /// way that reads the block (a front end trying memory before a
    /// blocking read): a hit counts and is used, a miss is not counted.
    pub fn try_get(&self, pool: u64, bp: &BlockPtr, kind: BlockKind) -> Option<Arc<[u8]>> {
        let found = BlockId::of(pool, bp).and_then(|k| {
            let mut sh = lock(&self.shards[k.shard()]);
            let e = sh.map.get_mut(&k)?;
            self.use_entry(e);
            Some(e.data.clone())
        });
        if found.is_some() {
            let hits = match kind {
                BlockKind::Data => &self.stats.data_hits,
                BlockKind::Meta => &self.stats.meta_hits,
            };
            hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Counts a read of `bp` that another reader's read of it served (the
    /// caller missed the cache, then shared a read in progress): the block
    /// gets the use a hit would give it, and a block read ahead counts as
    /// used; the hit and miss counters do not move again.
    pub fn used(&self, pool: u64, bp: &BlockPtr) {
        if let Some(k) = BlockId::of(pool, bp) {
            if let Some(e) = lock(&self.shards[k.shard()]).map.get_mut(&k) {
                self.use_entry(e);
            }
        }
    }

    fn use_entry(&self, e: &mut Entry) {
        if e.prefetched {
            // The first read of a block read ahead is its first use, not a
            // second one: a sequential scan served by read-ahead must not
            // promote its blocks over the working set.
            e.prefetched = false;
            self.stats.prefetch_hits.fetch_add(1, Ordering::Relaxed);
        } else {
            e.freq = (e.freq + 1).min(FREQ_MAX);
        }
    }

    /// True when `bp` of pool `pool` is cached (no counters move).
    pub fn contains(&self, pool: u64, bp: &BlockPtr) -> bool {
        BlockId::of(pool, bp).is_some_and(|k| lock(&self.shards[k.shard()]).map.contains_key(&k))
    }

    /// Caches the logical bytes of `bp` of pool `pool`. The caller vouches
    /// for them: they passed the checksum in `bp`, or were just written
    /// under it.
    pub fn insert(&self, pool: u64, bp: &BlockPtr, data: Arc<[u8]>, kind: BlockKind) {
        self.insert_inner(pool, bp, data, kind, false);
    }

    /// Like [`BlockCache::insert`] (or [`BlockCache::insert_prefetched`])
    /// for plaintext read with `key`: refused, and false returned, once
    /// the key is revoked. The check is made under the lock of the
    /// block's shard, which [`BlockCache::evict_pool`] takes after an
    /// unload revokes the key, so plaintext read before the unload either
    /// enters before the eviction (and goes with it) or not at all.
    pub fn insert_unless_revoked(
        &self,
        pool: u64,
        bp: &BlockPtr,
        data: Arc<[u8]>,
        kind: BlockKind,
        key: Option<&KeySet>,
        prefetched: bool,
    ) -> bool {
        self.insert_checked(pool, bp, data, kind, prefetched, || {
            key.is_some_and(KeySet::is_revoked)
        })
    }

    /// Whether a block of `len` logical bytes would be kept: blocks above a
    /// quarter of a shard's budget are not, so reading them ahead is waste.
    pub fn would_keep(&self, len: usize) -> bool {
        len > 0 && len <= self.shard_max() / 4
    }

    /// Like [`BlockCache::insert`], for read-ahead: the block enters with
    /// no credit, so it leaves first unless it is read.
    pub fn insert_prefetched(&self, pool: u64, bp: &BlockPtr, data: Arc<[u8]>, kind: BlockKind) {
        self.insert_inner(pool, bp, data, kind, true);
    }

    fn insert_inner(
        &self,
        pool: u64,
        bp: &BlockPtr,
        data: Arc<[u8]>,
        kind: BlockKind,
        prefetched: bool,
    ) {
        self.insert_checked(pool, bp, data, kind, prefetched, || false);
    }

    /// Inserts unless `refuse()`, asked under the shard's lock; false if
    /// it refused.
    fn insert_checked(
        &self,
        pool: u64,
        bp: &BlockPtr,
        data: Arc<[u8]>,
        kind: BlockKind,
        prefetched: bool,
        refuse: impl FnOnce() -> bool,
    ) -> bool {
        let Some(k) = BlockId::of(pool, bp) else {
            return !refuse();
        };
        let len = data.len();
        // A block larger than a quarter of a shard would empty it.
        if !self.would_keep(len) {
            return !refuse();
        }
        let mut sh = lock(&self.shards[k.shard()]);
        if refuse() {
            return false;
        }
        if sh.map.contains_key(&k) {
            return true;
        }
        let queue = if sh.take_ghost(&k) {
            Queue::Main
        } else {
            Queue::Small
        };
        match queue {
            Queue::Small => {
                sh.small.push_back(k);
                sh.small_bytes += len;
            }
            Queue::Main => {
                sh.main.push_back(k);
                sh.main_bytes += len;
            }
        }
        sh.map.insert(
            k,
            Entry {
                data,
                freq: 0,
                queue,
                kind,
                prefetched,
            },
        );
        self.stats.inserted.fetch_add(1, Ordering::Relaxed);
        if prefetched {
            self.stats.prefetched.fetch_add(1, Ordering::Relaxed);
        }
        self.shrink(&mut sh);
        true
    }

    fn shrink(&self, sh: &mut Shard) {
        let max = self.shard_max();
        let small_max = max * SMALL_TENTHS / 10;
        // Each pass either frees bytes or moves a block along a queue; the
        // bound on passes keeps a pathological state from spinning.
        let mut passes = 4 * (sh.small.len() + sh.main.len()) + 8;
        while sh.bytes() > max && passes > 0 {
            passes -= 1;
            if sh.evict_one(small_max, &self.stats).is_none() {
                break;
            }
        }
    }

    /// Drops the block `bp` of pool `pool` (its guid): it was freed, so no
    /// pointer will ever ask for it again, and its memory is better given
    /// to blocks that can still be read (an overwrite would otherwise
    /// leave the cache full of the versions it replaced). A reader that
    /// still holds the bytes keeps them. Not counted as an eviction.
    pub fn forget(&self, pool: u64, bp: &BlockPtr) {
        let Some(k) = BlockId::of(pool, bp) else {
            return;
        };
        let mut sh = lock(&self.shards[k.shard()]);
        let Some(e) = sh.map.remove(&k) else {
            return;
        };
        match e.queue {
            Queue::Small => sh.small_bytes -= e.data.len(),
            Queue::Main => sh.main_bytes -= e.data.len(),
        }
        // The key's queue slot stays until it surfaces (skipped then). A
        // cache that frees what it holds may never be full enough to
        // surface them: compact the queues when stale slots outnumber the
        // blocks.
        if sh.small.len() + sh.main.len() > 2 * sh.map.len() + 64 {
            sh.compact();
        }
    }

    /// Drops every block of pool `pool` (at export: its devices may be
    /// imported elsewhere, or rewritten, before it comes back).
    pub fn evict_pool(&self, pool: u64) {
        for s in &self.shards {
            let mut sh = lock(s);
            let Shard {
                map,
                small_bytes,
                main_bytes,
                ..
            } = &mut *sh;
            map.retain(|k, e| {
                if k.pool != pool {
                    return true;
                }
                match e.queue {
                    Queue::Small => *small_bytes -= e.data.len(),
                    Queue::Main => *main_bytes -= e.data.len(),
                }
                false
            });
            // The pool's queue slots and ghosts go too: its blocks come
            // back under the same keys when it is imported again.
            sh.compact();
            let Shard {
                ghost, ghost_set, ..
            } = &mut *sh;
            ghost.retain(|(k, _)| k.pool != pool);
            ghost_set.retain(|k, _| k.pool != pool);
        }
    }

    /// Counters and sizes.
    pub fn stats(&self) -> CacheStats {
        let mut bytes = 0u64;
        let mut blocks = 0u64;
        for s in &self.shards {
            let sh = lock(s);
            bytes += sh.bytes() as u64;
            blocks += sh.map.len() as u64;
        }
        let c = &self.stats;
        CacheStats {
            bytes,
            max_bytes: self.max_bytes() as u64,
            blocks,
            data_hits: c.data_hits.load(Ordering::Relaxed),
            data_misses: c.data_misses.load(Ordering::Relaxed),
            meta_hits: c.meta_hits.load(Ordering::Relaxed),
            meta_misses: c.meta_misses.load(Ordering::Relaxed),
            inserted: c.inserted.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            prefetched: c.prefetched.load(Ordering::Relaxed),
            prefetch_hits: c.prefetch_hits.load(Ordering::Relaxed),
        }
    }

    /// Bytes held for one kind of block (for tests and status).
    pub fn bytes_of(&self, kind: BlockKind) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                lock(s)
                    .map
                    .values()
                    .filter(|e| e.kind == kind)
                    .map(|e| e.data.len() as u64)
                    .sum::<u64>()
            })
            .sum()
    }
}

/// The memory this process may use, in bytes: `MemTotal` of
/// `/proc/meminfo`, or the memory limit of its control group (a
/// container's, or a service's `MemoryMax=`) where that is lower; `None`
/// where neither can be read (not Linux, no `/proc`). Memory-scaled
/// defaults (the block cache, the daemon's dirty limit) start from it, so
/// a daemon in a container of 2 GiB sizes them for 2 GiB, not for the
/// host.
pub fn physical_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text));
    let limit = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|groups| {
            cgroup_limit_files(&groups)
                .iter()
                .filter_map(|f| std::fs::read_to_string(f).ok())
                .filter_map(|t| parse_memory_limit(&t))
                .min()
        });
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb.saturating_mul(1024))
}

/// The files that may hold a memory limit of the control groups named in
/// `/proc/self/cgroup` (`groups`): cgroup v2's `memory.max` and v1's
/// `memory.limit_in_bytes`, of the group and of each group above it (a
/// parent's limit binds its children too).
fn cgroup_limit_files(groups: &str) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (root, file) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut dir = std::path::PathBuf::from(root);
        files.push(dir.join(file));
        for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
            dir.push(part);
            files.push(dir.join(file));
        }
    }
    files
}

/// A memory limit file's value; `None` for no limit (`max`, or v1's
/// largest value).
fn parse_memory_limit(text: &str) -> Option<u64> {
    let v = text.trim().parse::<u64>().ok()?;
    (v < 1 << 60).then_some(v)
}

/// An eighth of physical memory, at least 256 MiB (see [`BlockCache::global`]).
pub fn default_cache_bytes() -> usize {
    let total = physical_memory().unwrap_or(2 << 30);
    let eighth = usize::try_from(total / 8).unwrap_or(usize::MAX);
    eighth.max(256 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget that holds many 64 KiB blocks per shard.
    const BUDGET: usize = 32 << 20;
    use crate::bp::Dva;
    use proptest::prelude::*;

    fn bp(n: u64, lsize: u32) -> BlockPtr {
        let mut b = BlockPtr {
            lsize,
            psize: lsize,
            birth: 1 + n % 7,
            ..Default::default()
        };
        b.dvas[0] = Dva {
            vdev: (n % 3) as u32,
            offset: n * 4096,
            asize: 4096,
        };
        b.checksum[..8].copy_from_slice(&n.to_le_bytes());
        b
    }

    fn data(n: u64, len: usize) -> Arc<[u8]> {
        (0..len).map(|i| (n as usize + i) as u8).collect()
    }

    /// Plaintext read with a key that is then unloaded never stays in the
    /// cache: an insert refuses once the key is revoked, and one racing
    /// the unload's eviction lands before it (and goes) or not at all.
    #[test]
    fn plaintext_of_a_revoked_key_stays_out_of_the_cache() {
        let c = BlockCache::new(BUDGET);
        let key = KeySet::new(crate::Cipher::Aes256Gcm, [7; 32]);
        assert!(c.insert_unless_revoked(
            1,
            &bp(1, 4096),
            data(1, 4096),
            BlockKind::Data,
            Some(&key),
            false
        ));
        assert!(c.contains(1, &bp(1, 4096)));
        assert!(c.insert_unless_revoked(
            1,
            &bp(2, 4096),
            data(2, 4096),
            BlockKind::Data,
            None,
            true
        ));
        key.revoke();
        assert!(!c.insert_unless_revoked(
            1,
            &bp(3, 4096),
            data(3, 4096),
            BlockKind::Data,
            Some(&key),
            false
        ));
        assert!(!c.insert_unless_revoked(
            1,
            &bp(4, 4096),
            data(4, 4096),
            BlockKind::Data,
            Some(&key),
            true
        ));
        assert!(!c.contains(1, &bp(3, 4096)) && !c.contains(1, &bp(4, 4096)));
        // Unencrypted blocks are not the key's business.
        assert!(c.insert_unless_revoked(
            1,
            &bp(5, 4096),
            data(5, 4096),
            BlockKind::Data,
            None,
            false
        ));

        for round in 0..20u64 {
            let c = Arc::new(BlockCache::new(BUDGET));
            let key = Arc::new(KeySet::new(crate::Cipher::Aes256Gcm, [9; 32]));
            let reader = {
                let (c, key) = (c.clone(), key.clone());
                std::thread::spawn(move || {
                    let mut n = round << 20;
                    while c.insert_unless_revoked(
                        2,
                        &bp(n, 4096),
                        data(n, 4096),
                        BlockKind::Data,
                        Some(&key),
                        false,
                    ) {
                        n += 1;
                    }
                })
            };
            std::thread::sleep(std::time::Duration::from_micros(200 * round));
            key.revoke();
            c.evict_pool(2);
            reader.join().expect("reader");
            assert_eq!(
                c.stats().bytes,
                0,
                "round {round}: plaintext left after the unload"
            );
        }
    }

    #[test]
    fn memory_limits_of_control_groups_are_found_and_read() {
        let files = |groups: &str| -> Vec<String> {
            cgroup_limit_files(groups)
                .iter()
                .map(|p| p.display().to_string())
                .collect()
        };
        let v2 = [
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/system.slice/memory.max",
            "/sys/fs/cgroup/system.slice/tarn.service/memory.max",
        ];
        assert_eq!(files("0::/system.slice/tarn.service\n"), v2);
        let v1 = [
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/docker/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory.max",
        ];
        assert_eq!(files("5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n"), v1);
        assert!(cgroup_limit_files("garbage\n1:pids:/a\n").is_empty());
        assert_eq!(parse_memory_limit("2147483648\n"), Some(2 << 30));
        assert_eq!(parse_memory_limit("max\n"), None);
        assert_eq!(parse_memory_limit("9223372036854771712\n"), None);
        assert_eq!(parse_memory_limit(""), None);
        assert_eq!(
            mem_total("MemFree: 5 kB\nMemTotal:       24567 kB\n"),
            Some(24567 * 1024)
        );
        assert_eq!(mem_total("MemTotal: lots\n"), None);
        // Never above what the machine has.
        if let (Some(m), Some(total)) = (
            physical_memory(),
            std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|t| mem_total(&t)),
        ) {
            assert!(m <= total && m > 0, "{m} of {total}");
        }
    }

    /// Queue slots over every shard, and blocks held.
    fn slots(c: &BlockCache) -> (usize, usize) {
        c.shards.iter().fold((0, 0), |(q, m), s| {
            let sh = lock(s);
            (
                q + sh.small.len() + sh.main.len() + sh.ghost.len(),
                m + sh.map.len(),
            )
        })
    }

    /// A pool exported and imported again brings its blocks back under
    /// the same keys: the export drops their queue slots and ghosts with
    /// them, so rounds of export and import do not pile up slots (which
    /// made every later `forget` walk the queues: a tenth of a sync's
    /// CPU).
    #[test]
    fn an_export_drops_its_queue_slots_and_rounds_of_import_do_not_pile_up() {
        let c = BlockCache::new(BUDGET);
        let other = bp(100_000, 1000);
        c.insert(8, &other, data(0, 1000), BlockKind::Data);
        for _round in 0..5 {
            for n in 0..1000 {
                c.insert(7, &bp(n, 1000), data(n, 1000), BlockKind::Data);
            }
            c.evict_pool(7);
            assert_eq!(slots(&c), (1, 1), "only the other pool's block is left");
        }
        assert!(c.contains(8, &other), "another pool's blocks stay");
    }

    /// A block forgotten and cached again (or cached again after an
    /// export) leaves an older slot that names a live block; compaction
    /// keeps one slot per block, in its own queue, so the queues cannot
    /// stay longer than the blocks for good (each `forget` would then
    /// walk them).
    #[test]
    fn compaction_keeps_one_queue_slot_per_block() {
        let c = BlockCache::new(BUDGET);
        let keys: Vec<BlockPtr> = (0..50).map(|n| bp(n, 1000)).collect();
        for round in 0..3 {
            for (n, b) in keys.iter().enumerate() {
                if round > 0 {
                    c.forget(7, b);
                }
                c.insert(7, b, data(n as u64, 1000), BlockKind::Data);
            }
        }
        let before = slots(&c);
        for s in &c.shards {
            lock(s).compact();
        }
        assert_eq!(
            slots(&c),
            (50, 50),
            "one slot per block (before: {before:?})"
        );
        let mut keys: HashSet<BlockId> = HashSet::new();
        for s in &c.shards {
            let sh = lock(s);
            keys.extend(sh.small.iter().chain(sh.main.iter()).copied());
        }
        assert_eq!(keys.len(), 50, "every block keeps a slot");
        for s in &c.shards {
            let sh = lock(s);
            assert!(sh.small.iter().all(|k| sh.map[k].queue == Queue::Small));
            assert!(sh.main.iter().all(|k| sh.map[k].queue == Queue::Main));
        }
    }

    /// A ghost that comes back and later becomes a ghost again leaves an
    /// older entry in the ghost FIFO; when that entry leaves, the newer
    /// ghost must stay (it used to end it, sending the block back through
    /// the small queue).
    #[test]
    fn an_older_ghost_entry_does_not_end_a_newer_ghost_of_the_same_key() {
        let id = |n: u64| BlockId::of(7, &bp(n, 1000)).expect("a block id");
        let mut sh = Shard::default();
        let a = id(0);
        sh.remember_ghost(a);
        assert!(sh.take_ghost(&a), "a was a ghost");
        assert!(!sh.take_ghost(&a), "and is one no longer");
        sh.remember_ghost(a);
        // Keys that come back at once: their entries no longer count, and
        // enough of them push a's older entry out of the FIFO.
        for n in 1..32 {
            sh.remember_ghost(id(n));
            assert!(sh.take_ghost(&id(n)));
        }
        assert_eq!(
            sh.ghost.iter().filter(|(k, _)| *k == a).count(),
            1,
            "a's older entry left the FIFO"
        );
        assert!(sh.take_ghost(&a), "a is still a ghost");
        // Ghosts stay bounded however many keys come back.
        for n in 100..10_000 {
            sh.remember_ghost(id(n));
            if n % 2 == 0 {
                sh.take_ghost(&id(n));
            }
        }
        assert!(
            sh.ghost_set.len() <= 16 && sh.ghost.len() <= 32,
            "{} {}",
            sh.ghost_set.len(),
            sh.ghost.len()
        );
    }

    /// An export drops the pool's ghosts too: a ghost key of an exported
    /// pool would send that pool's block straight to main after an import.
    #[test]
    fn an_export_drops_the_pools_ghosts() {
        let c = BlockCache::new(MIN_CACHE_BYTES);
        let len = c.shard_max() / 8;
        for n in 0..(SHARDS as u64 * 64) {
            c.insert(7, &bp(n, len as u32), data(n, len), BlockKind::Data);
            c.insert(8, &bp(n, len as u32), data(n, len), BlockKind::Data);
        }
        let ghosts = |pool: u64| -> usize {
            c.shards
                .iter()
                .map(|s| {
                    let sh = lock(s);
                    sh.ghost.iter().filter(|(k, _)| k.pool == pool).count()
                        + sh.ghost_set.keys().filter(|k| k.pool == pool).count()
                })
                .sum()
        };
        assert!(ghosts(7) > 0 && ghosts(8) > 0, "evictions left ghosts");
        c.evict_pool(7);
        assert_eq!(ghosts(7), 0, "the exported pool's ghosts are gone");
        assert!(ghosts(8) > 0, "another pool's ghosts stay");
    }

    #[test]
    fn hits_return_what_was_inserted_and_holes_are_never_cached() {
        let c = BlockCache::new(BUDGET);
        let b = bp(1, 1000);
        assert!(c.get(7, &b, BlockKind::Data).is_none());
        c.insert(7, &b, data(1, 1000), BlockKind::Data);
        assert_eq!(
            c.get(7, &b, BlockKind::Data).as_deref(),
            Some(&*data(1, 1000))
        );
        // Same address and birth, other contents: another key.
        let mut other = b;
        other.checksum[31] ^= 1;
        assert!(c.get(7, &other, BlockKind::Data).is_none());
        let hole = BlockPtr::default();
        c.insert(7, &hole, data(2, 10), BlockKind::Data);
        assert!(c.get(7, &hole, BlockKind::Data).is_none());
        let s = c.stats();
        assert_eq!((s.data_hits, s.data_misses), (1, 3));
    }

    #[test]
    fn a_large_scan_does_not_flush_the_hot_set() {
        let c = BlockCache::new(BUDGET);
        let blk = 64 << 10;
        // A hot set of a quarter of the budget, read several times.
        let hot = (BUDGET / 4 / blk) as u64;
        for round in 0..4 {
            for n in 0..hot {
                if c.get(7, &bp(n, blk as u32), BlockKind::Data).is_none() {
                    assert!(round < 2, "hot block {n} lost in round {round}");
                    c.insert(7, &bp(n, blk as u32), data(n, blk), BlockKind::Data);
                }
            }
        }
        // A scan of ten times the budget, each block read once.
        let scan = 10 * (BUDGET / blk) as u64;
        for n in 0..scan {
            let b = bp(1_000_000 + n, blk as u32);
            if c.get(7, &b, BlockKind::Data).is_none() {
                c.insert(7, &b, data(n, blk), BlockKind::Data);
            }
        }
        let kept = (0..hot)
            .filter(|n| c.contains(7, &bp(*n, blk as u32)))
            .count() as u64;
        assert!(
            kept * 10 >= hot * 8,
            "only {kept} of {hot} hot blocks survived the scan"
        );
        assert!(c.stats().bytes <= BUDGET as u64);
    }

    #[test]
    fn a_plain_fifo_would_fail_the_scan_test() {
        // The same workload with every block given credit on insertion
        // (what an LRU-like policy amounts to here) loses the hot set:
        // this is what the test above guards against.
        let c = BlockCache::new(BUDGET);
        let blk = 64 << 10;
        let hot = (BUDGET / 4 / blk) as u64;
        for n in 0..hot {
            c.insert(7, &bp(n, blk as u32), data(n, blk), BlockKind::Data);
        }
        let scan = 10 * (BUDGET / blk) as u64;
        for n in 0..scan {
            let b = bp(1_000_000 + n, blk as u32);
            c.insert(7, &b, data(n, blk), BlockKind::Data);
            // Read twice at once: the scan now looks hot too.
            c.get(7, &b, BlockKind::Data);
        }
        let kept = (0..hot)
            .filter(|n| c.contains(7, &bp(*n, blk as u32)))
            .count();
        assert!(kept < hot as usize / 2, "kept {kept}");
    }

    #[test]
    fn a_scan_served_by_read_ahead_keeps_the_hot_set() {
        let c = BlockCache::new(BUDGET);
        let blk = 64 << 10;
        let hot = (BUDGET / 4 / blk) as u64;
        for _ in 0..4 {
            for n in 0..hot {
                if c.get(7, &bp(n, blk as u32), BlockKind::Data).is_none() {
                    c.insert(7, &bp(n, blk as u32), data(n, blk), BlockKind::Data);
                }
            }
        }
        // Each scanned block is read ahead, then read once by the scan.
        let scan = 10 * (BUDGET / blk) as u64;
        for n in 0..scan {
            let b = bp(1_000_000 + n, blk as u32);
            c.insert_prefetched(7, &b, data(n, blk), BlockKind::Data);
            assert!(c.get(7, &b, BlockKind::Data).is_some(), "block {n}");
        }
        let kept = (0..hot)
            .filter(|n| c.contains(7, &bp(*n, blk as u32)))
            .count() as u64;
        assert!(kept * 10 >= hot * 8, "kept {kept} of {hot}");
        assert_eq!(c.stats().prefetch_hits, scan);
    }

    #[test]
    fn prefetched_blocks_count_when_used() {
        let c = BlockCache::new(BUDGET);
        let b = bp(9, 4096);
        c.insert_prefetched(7, &b, data(9, 4096), BlockKind::Data);
        assert!(c.get(7, &b, BlockKind::Data).is_some());
        assert!(c.get(7, &b, BlockKind::Data).is_some());
        let s = c.stats();
        assert_eq!((s.prefetched, s.prefetch_hits), (1, 1));
        // A read that shared read-ahead's read in progress uses it too, and
        // is not counted as a hit on top of its miss.
        let b = bp(10, 4096);
        c.insert_prefetched(7, &b, data(10, 4096), BlockKind::Data);
        c.used(7, &b);
        c.used(7, &bp(11, 4096));
        let t = c.stats();
        assert_eq!((t.prefetched, t.prefetch_hits), (2, 2));
        assert_eq!((t.data_hits, t.data_misses), (s.data_hits, s.data_misses));
    }

    #[test]
    fn exporting_a_pool_drops_only_its_blocks() {
        let c = BlockCache::new(BUDGET);
        c.insert(1, &bp(1, 4096), data(1, 4096), BlockKind::Data);
        c.insert(2, &bp(1, 4096), data(1, 4096), BlockKind::Data);
        c.evict_pool(1);
        assert!(!c.contains(1, &bp(1, 4096)));
        assert!(c.contains(2, &bp(1, 4096)));
        assert_eq!(c.stats().bytes, 4096);
        // The stale queue slot is skipped, and the block can come back.
        c.insert(1, &bp(1, 4096), data(1, 4096), BlockKind::Data);
        for n in 2..2000 {
            c.insert(1, &bp(n, 65536), data(n, 65536), BlockKind::Data);
        }
        assert!(c.stats().bytes <= BUDGET as u64);
    }

    #[test]
    fn freed_blocks_leave_and_their_queue_slots_do_not_pile_up() {
        let c = BlockCache::new(BUDGET);
        c.insert(7, &bp(0, 4096), data(0, 4096), BlockKind::Data);
        // A cache that frees everything it takes in never fills, so no
        // eviction ever pops a slot: forget must not leave them all.
        for n in 1..100_000 {
            c.insert(7, &bp(n, 4096), data(n, 4096), BlockKind::Data);
            c.forget(7, &bp(n, 4096));
        }
        let s = c.stats();
        assert_eq!((s.blocks, s.bytes, s.evicted), (1, 4096, 0));
        assert!(c.contains(7, &bp(0, 4096)));
        let slots: usize = c
            .shards
            .iter()
            .map(|s| {
                let sh = lock(s);
                sh.small.len() + sh.main.len()
            })
            .sum();
        assert!(slots <= SHARDS * 65, "{slots} queue slots for one block");
        // Forgetting what is not there, or a hole, changes nothing.
        c.forget(7, &bp(5, 4096));
        c.forget(7, &BlockPtr::default());
        assert_eq!(c.stats().bytes, 4096);
    }

    #[test]
    fn shrinking_the_bound_evicts() {
        let c = BlockCache::new(4 * BUDGET);
        for n in 0..2000 {
            c.insert(7, &bp(n, 65536), data(n, 65536), BlockKind::Meta);
        }
        assert!(c.stats().bytes > BUDGET as u64);
        c.set_max_bytes(BUDGET);
        assert!(c.stats().bytes <= BUDGET as u64);
        assert_eq!(c.bytes_of(BlockKind::Meta), c.stats().bytes);
    }

    proptest! {
        /// Against a model: whatever is found is what was inserted for that
        /// key, the bound holds after every step, and counters add up.
        #[test]
        fn model(ops in proptest::collection::vec((0u8..4, 0u64..200, 1usize..200_000), 1..400)) {
            let c = BlockCache::new(BUDGET);
            let mut model: HashMap<u64, Arc<[u8]>> = HashMap::new();
            // Forgotten (freed) and not inserted again since.
            let mut freed: HashSet<u64> = HashSet::new();
            let mut gets = 0u64;
            for (op, n, len) in ops {
                let len = model.get(&n).map_or(len, |d| d.len());
                let b = bp(n, len as u32);
                match op {
                    0 | 1 => {
                        let d = data(n, len);
                        model.entry(n).or_insert_with(|| d.clone());
                        freed.remove(&n);
                        if op == 0 { c.insert(7, &b, d, BlockKind::Data) } else { c.insert_prefetched(7, &b, d, BlockKind::Data) }
                    }
                    2 => {
                        gets += 1;
                        if let Some(got) = c.get(7, &b, BlockKind::Data) {
                            prop_assert!(!freed.contains(&n), "block {} served after it was freed", n);
                            prop_assert_eq!(Some(&got), model.get(&n));
                        }
                    }
                    _ => {
                        c.forget(7, &b);
                        freed.insert(n);
                        prop_assert!(!c.contains(7, &b));
                    }
                }
                prop_assert!(c.stats().bytes <= c.max_bytes() as u64);
                prop_assert_eq!(c.bytes_of(BlockKind::Data), c.stats().bytes);
            }
            let s = c.stats();
            prop_assert_eq!(s.data_hits + s.data_misses, gets);
            prop_assert!(s.blocks <= model.len() as u64);
        }
    }
}

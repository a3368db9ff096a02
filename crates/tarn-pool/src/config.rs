//! Pool properties (stored in the pool) and runtime options (given by the
//! daemon's configuration).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tarn_block::{BlockCache, ChecksumAlg, Compression};
use tarn_vdev::VdevKind;

use crate::PoolError;

/// One top-level vdev to create: its kind and its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VdevSpec {
    /// Single, mirror or raidz with parity.
    pub kind: VdevKind,
    /// Device paths (files or block devices).
    pub devices: Vec<PathBuf>,
}

/// Properties that live in the pool and move with the disks. `checksum`
/// and `copies` govern the pool's own metadata too; all four are the
/// defaults of the pool's datasets where no dataset sets them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolProps {
    /// Checksum of new blocks: `blake3` (default) or `xxh3`.
    pub checksum: String,
    /// Default compression of the pool's datasets.
    pub compression: String,
    /// Copies of each data block (1..=3); metadata gets one more, up to 3.
    pub copies: u8,
    /// Default record size of the pool's datasets in bytes (4 KiB ..= 1 MiB,
    /// power of two).
    pub recordsize: u32,
    /// Features of the on-disk format the pool has used since it was
    /// created, which a tarn that does not know them must not read: import
    /// refuses a pool naming one it does not know ([`FEATURES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// The features this tarn reads (see [`PoolProps::features`]).
pub const FEATURES: &[&str] = &["encryption", "large_records"];

impl Default for PoolProps {
    fn default() -> Self {
        PoolProps {
            checksum: "blake3".into(),
            compression: "lz4".into(),
            copies: 1,
            recordsize: 128 * 1024,
            features: Vec::new(),
        }
    }
}

/// Parses sizes like `4096`, `128K`, `1M`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match s[i..]
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1u64 << 40,
                _ => return None,
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

impl PoolProps {
    /// Applies `name=value` pairs, refusing unknown names and bad values.
    pub fn apply(&mut self, props: &BTreeMap<String, String>) -> Result<(), PoolError> {
        for (k, v) in props {
            match k.as_str() {
                "checksum" => {
                    ChecksumAlg::parse(v).map_err(|e| PoolError::Invalid(e.to_string()))?;
                    self.checksum = v.clone();
                }
                "compression" => {
                    Compression::parse(v).map_err(|e| PoolError::Invalid(e.to_string()))?;
                    self.compression = v.clone();
                }
                "copies" => {
                    let c: u8 = v
                        .parse()
                        .ok()
                        .filter(|c| (1..=3).contains(c))
                        .ok_or_else(|| PoolError::Invalid(format!("copies={v}: expected 1, 2 or 3")))?;
                    self.copies = c;
                }
                "recordsize" => {
                    let r = parse_size(v)
                        .filter(|r| r.is_power_of_two() && (4096..=1 << 20).contains(r))
                        .ok_or_else(|| {
                            PoolError::Invalid(format!(
                                "recordsize={v}: expected a power of two from 4K to 1M"
                            ))
                        })?;
                    self.recordsize = r as u32;
                }
                other => {
                    return Err(PoolError::Invalid(format!(
                        "unknown pool property '{other}' (known: checksum, compression, copies, recordsize)"
                    )))
                }
            }
        }
        Ok(())
    }

    /// The checksum algorithm for new blocks.
    pub fn checksum_alg(&self) -> ChecksumAlg {
        ChecksumAlg::parse(&self.checksum).unwrap_or_default()
    }

    /// The default compression of the pool's datasets.
    pub fn compression(&self) -> Compression {
        Compression::parse(&self.compression).unwrap_or_default()
    }

    /// Copies of each metadata block: one more than data, at most 3.
    pub fn metadata_copies(&self) -> usize {
        (self.copies as usize + 1).min(3)
    }

    /// Name/value pairs for display.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("checksum".into(), self.checksum.clone());
        m.insert("compression".into(), self.compression.clone());
        m.insert("copies".into(), self.copies.to_string());
        m.insert("recordsize".into(), self.recordsize.to_string());
        m
    }
}

/// Runtime limits of an imported pool; every queue and buffer has a bound.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// A txg syncs at least this often while anything is dirty.
    pub sync_interval: Duration,
    /// Writers wait when the open txg holds this many dirty bytes.
    pub dirty_max_bytes: u64,
    /// A sync starts early once this many bytes are dirty.
    pub dirty_sync_bytes: u64,
    /// The cache of verified blocks (tree nodes and data); `None` uses the
    /// process-wide one ([`BlockCache::global`]), which every pool shares.
    pub cache: Option<Arc<BlockCache>>,
    /// Block pointers gathered per scrub batch before sorting and reading.
    pub scan_batch_blocks: usize,
    /// Who imports the pool; recorded in the labels so another importer can
    /// tell an active pool from an abandoned one.
    pub owner: String,
    /// Worker threads for checksumming and compressing at sync.
    pub sync_threads: usize,
    /// Import even when the intent log cannot be read or replayed in full
    /// (a missing log device, device errors, a damaged referenced block),
    /// keeping the part before the damage.
    pub discard_log: bool,
    /// Largest block the space maps are written in (at most, and by
    /// default, [`crate::SPACE_CHUNK_MAX`]); a larger encoding is cut into
    /// chunks of this size (docs/format.md). Smaller only in tests, which
    /// go through the chunks with a small pool.
    pub space_chunk_bytes: usize,
}

impl PoolOptions {
    /// The block cache this pool uses.
    pub fn block_cache(&self) -> Arc<BlockCache> {
        self.cache.clone().unwrap_or_else(BlockCache::global)
    }
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            sync_interval: Duration::from_secs(5),
            dirty_max_bytes: 256 << 20,
            dirty_sync_bytes: 64 << 20,
            cache: None,
            scan_batch_blocks: 16384,
            owner: String::new(),
            sync_threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .min(8),
            discard_log: false,
            space_chunk_bytes: crate::SPACE_CHUNK_MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128K"), Some(128 << 10));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("1MiB"), Some(1 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size("99999999999999999999T"), None);
    }

    #[test]
    fn props_refuse_unknown_and_bad() {
        let mut p = PoolProps::default();
        let mut m = BTreeMap::new();
        m.insert("recordsize".to_string(), "1M".to_string());
        p.apply(&m).unwrap();
        assert_eq!(p.recordsize, 1 << 20);
        for (k, v) in [
            ("recordsize", "3000"),
            ("copies", "4"),
            ("checksum", "md5"),
            ("frobnicate", "1"),
        ] {
            let mut m = BTreeMap::new();
            m.insert(k.to_string(), v.to_string());
            assert!(p.clone().apply(&m).is_err(), "{k}={v} accepted");
        }
    }
}

//! Labels: how a device says which pool it belongs to.
//!
//! # Theory
//!
//! Every leaf carries four labels of `LABEL_SIZE` (256 KiB): L0 and L1 at the
//! front, L2 and L3 at the back (positions computed from the device size
//! rounded down to 256 KiB). Keeping copies at both ends means a stray write
//! over the start of a disk (a partitioning tool, a misdirected `dd`) or a
//! damaged tail still leaves a readable label. The first 512 KiB after L1 up to
//! `DATA_START` (4 MiB) is reserved; data lives in `[DATA_START, data_end)`.
//!
//! Each label is split in two halves:
//!
//! * a config area (128 KiB): a 48-byte header (`TARNLBL1`, format version u32
//!   LE, body length u32 LE, BLAKE3 of the body) followed by the body, the JSON
//!   of [`LabelConfig`], then zeros. Anything that does not match exactly is
//!   rejected as "not a valid copy", never half-parsed.
//! * an uberblock ring (128 KiB) of fixed-size slots, one sector (at least
//!   1 KiB) each. The pool writes txg `t` into slot `t % slots`, so a commit
//!   only ever overwrites the oldest entry and a torn uberblock write destroys
//!   one slot, never the previous good one. This module stores slots as raw
//!   bytes; the pool encodes and validates uberblocks.
//!
//! ## Updating the config without a window of no label
//!
//! A sector write may tear, so rewriting all four copies at once could leave
//! none valid after a power cut. The copies are split into two halves, Even
//! (L0 + L2) and Odd (L1 + L3), one of each at both ends. An update writes
//! Even, flushes, then writes Odd and flushes. A crash during the Even write
//! leaves Odd intact (old config); during the Odd write, Even already holds the
//! new config durably. Readers take the valid copy with the highest `txg`, so
//! either way they find a complete config: the old one or the new one, never a
//! mix. The writer must give each new config a higher txg than the last.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::leaf::Leaf;
use crate::{check_ashift, sector, VdevError};

/// Size of one label copy.
pub const LABEL_SIZE: u64 = 256 * 1024;
/// Start of the allocatable data region of every leaf.
pub const DATA_START: u64 = 4 * 1024 * 1024;
/// Smallest leaf tarn accepts: anything smaller is mostly labels.
pub const MIN_LEAF_SIZE: u64 = 64 * 1024 * 1024;
/// Minimum uberblock slot size; a slot is one sector when sectors are larger,
/// so writing a slot never rewrites a neighbour.
pub const UBERBLOCK_SLOT_MIN: usize = 1024;
/// Size of the config area at the start of each label.
pub const LABEL_CONFIG_SIZE: usize = 128 * 1024;
/// Size of the uberblock ring at the end of each label.
pub const UBERBLOCK_RING_SIZE: usize = LABEL_SIZE as usize - LABEL_CONFIG_SIZE;
/// Magic at the start of a config area.
pub const LABEL_MAGIC: [u8; 8] = *b"TARNLBL1";
/// Version of the config area encoding (header and JSON body).
pub const LABEL_HEADER_VERSION: u32 = 1;
/// Length of the config area header: magic, version, body length, BLAKE3.
pub const LABEL_HEADER_LEN: usize = 8 + 4 + 4 + 32;

/// Lifecycle state recorded in the labels, so a device can be recognised as
/// in use, exported (free to import elsewhere) or left over from a destroyed pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolState {
    /// Imported by some host.
    Active,
    /// Cleanly exported.
    Exported,
    /// The pool was destroyed; the device may be reused.
    Destroyed,
}

/// Redundancy scheme of a top-level vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VdevKind {
    /// One leaf, no redundancy.
    Single,
    /// Every child holds a full copy.
    Mirror,
    /// Variable-width stripes with `parity` (1..=3) Reed-Solomon parity columns.
    Raidz {
        /// Number of parity columns.
        parity: u8,
    },
}

/// One leaf in the vdev tree, as persisted in labels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafConfig {
    /// Unique id of the device, also stored in its own label.
    pub guid: u64,
    /// Last known path (a hint: devices are matched by guid).
    pub path: PathBuf,
    /// Administratively offline.
    pub offline: bool,
}

/// One top-level vdev in the vdev tree, as persisted in labels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopConfig {
    /// Redundancy scheme.
    pub kind: VdevKind,
    /// Unique id of the top-level vdev.
    pub guid: u64,
    /// Children in layout order (order matters for raidz).
    pub children: Vec<LeafConfig>,
}

/// The config stored in every label of every leaf of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelConfig {
    /// Pool format version (owned by the pool layer).
    pub version: u32,
    /// Human name of the pool.
    pub pool_name: String,
    /// Unique id of the pool.
    pub pool_guid: u64,
    /// Lifecycle state.
    pub state: PoolState,
    /// Txg at which this config was written; the newest valid copy wins.
    pub txg: u64,
    /// Guid of the device holding this label.
    pub device_guid: u64,
    /// Index of the top-level vdev this device belongs to.
    pub top_index: u32,
    /// Sector shift of the pool.
    pub ashift: u8,
    /// Host/process hint of the importer (informational).
    pub owner: Option<String>,
    /// The whole vdev tree.
    pub tree: Vec<TopConfig>,
    /// Separate intent log devices (their leaves carry `top_index`
    /// [`LOG_TOP_BASE`] + position).
    #[serde(default)]
    pub logs: Vec<TopConfig>,
}

/// `top_index` of the first log vdev in a label.
pub const LOG_TOP_BASE: u32 = 1 << 16;

/// Which two of the four label copies to write (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelHalf {
    /// L0 and L2.
    Even,
    /// L1 and L3.
    Odd,
}

/// The result of reading a device's labels.
#[derive(Clone, Debug)]
pub struct LabelRead {
    /// The newest valid config.
    pub config: LabelConfig,
    /// How many of the 4 copies hold exactly this config; below 4 means the
    /// labels should be rewritten.
    pub valid_copies: u8,
}

/// End of the data region of a leaf (the start of L2), rounded down to a sector.
pub fn data_end(leaf_size: u64, ashift: u8) -> u64 {
    let end = leaf_size - leaf_size % LABEL_SIZE;
    let s = sector(ashift);
    let d = end.saturating_sub(2 * LABEL_SIZE);
    d - d % s
}

/// Byte offsets of L0..L3 on a leaf of `leaf_size` bytes, or `None` when the
/// device is too small for four non-overlapping labels.
pub fn label_offsets(leaf_size: u64) -> Option<[u64; 4]> {
    let end = leaf_size - leaf_size % LABEL_SIZE;
    if end < 4 * LABEL_SIZE {
        return None;
    }
    Some([0, LABEL_SIZE, end - 2 * LABEL_SIZE, end - LABEL_SIZE])
}

/// Size of one uberblock slot: one sector, at least `UBERBLOCK_SLOT_MIN`.
pub fn uberblock_slot_size(ashift: u8) -> usize {
    (sector(ashift) as usize).max(UBERBLOCK_SLOT_MIN)
}

/// Number of uberblock slots in each label's ring.
pub fn uberblock_slots(ashift: u8) -> usize {
    UBERBLOCK_RING_SIZE / uberblock_slot_size(ashift)
}

fn io<'a>(leaf: &'a dyn Leaf, op: &'static str) -> impl FnOnce(std::io::Error) -> VdevError + 'a {
    move |source| VdevError::Io {
        path: leaf.path().to_path_buf(),
        op,
        source,
    }
}

fn offsets_or_small(leaf: &dyn Leaf) -> Result<[u64; 4], VdevError> {
    let size = leaf.size();
    match label_offsets(size) {
        Some(o) if size >= MIN_LEAF_SIZE => Ok(o),
        _ => Err(VdevError::TooSmall {
            path: leaf.path().to_path_buf(),
            size,
            min: MIN_LEAF_SIZE,
        }),
    }
}

/// Encodes a config into a full config area (header, body, zero fill).
fn encode_config(cfg: &LabelConfig) -> Result<Vec<u8>, VdevError> {
    check_ashift(cfg.ashift).map_err(VdevError::LabelEncode)?;
    let body = serde_json::to_vec(cfg).map_err(|e| VdevError::LabelEncode(e.to_string()))?;
    let max = LABEL_CONFIG_SIZE - LABEL_HEADER_LEN;
    if body.len() > max {
        return Err(VdevError::LabelEncode(format!(
            "config is {} bytes, the label holds {max}",
            body.len()
        )));
    }
    let mut area = vec![0u8; LABEL_CONFIG_SIZE];
    area[..8].copy_from_slice(&LABEL_MAGIC);
    area[8..12].copy_from_slice(&LABEL_HEADER_VERSION.to_le_bytes());
    area[12..16].copy_from_slice(&(body.len() as u32).to_le_bytes());
    area[16..48].copy_from_slice(blake3::hash(&body).as_bytes());
    area[LABEL_HEADER_LEN..LABEL_HEADER_LEN + body.len()].copy_from_slice(&body);
    Ok(area)
}

/// Decodes a config area, saying precisely why it is not a valid copy.
fn decode_config(area: &[u8]) -> Result<LabelConfig, String> {
    let header = area.get(..LABEL_HEADER_LEN).ok_or("short config area")?;
    if header[..8] != LABEL_MAGIC {
        return Err("bad magic".into());
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if version != LABEL_HEADER_VERSION {
        return Err(format!("unsupported label version {version}"));
    }
    let len = u32::from_le_bytes([header[12], header[13], header[14], header[15]]) as usize;
    let body = area
        .get(LABEL_HEADER_LEN..)
        .and_then(|rest| rest.get(..len))
        .ok_or_else(|| format!("body length {len} exceeds the config area"))?;
    if blake3::hash(body).as_bytes()[..] != header[16..48] {
        return Err("checksum mismatch".into());
    }
    let cfg: LabelConfig =
        serde_json::from_slice(body).map_err(|e| format!("undecodable config: {e}"))?;
    check_ashift(cfg.ashift)?;
    Ok(cfg)
}

fn half_offsets(offs: &[u64; 4], half: LabelHalf) -> [u64; 2] {
    match half {
        LabelHalf::Even => [offs[0], offs[2]],
        LabelHalf::Odd => [offs[1], offs[3]],
    }
}

/// Writes the config into the two labels of `half`, without flushing. Callers
/// write Even, flush, Odd, flush (or use [`write_label_config_all`]).
pub fn write_label_config(
    leaf: &dyn Leaf,
    cfg: &LabelConfig,
    half: LabelHalf,
) -> Result<(), VdevError> {
    let offs = offsets_or_small(leaf)?;
    let area = encode_config(cfg)?;
    let mut first_err = None;
    for off in half_offsets(&offs, half) {
        if let Err(e) = leaf.write_at(&area, off) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), |e| Err(io(leaf, "write label")(e)))
}

/// Rewrites all four config copies in the crash-safe order: Even, flush, Odd, flush.
pub fn write_label_config_all(leaf: &dyn Leaf, cfg: &LabelConfig) -> Result<(), VdevError> {
    for half in [LabelHalf::Even, LabelHalf::Odd] {
        write_label_config(leaf, cfg, half)?;
        leaf.flush().map_err(io(leaf, "flush label"))?;
    }
    Ok(())
}

/// Reads the four config copies and returns the valid one with the highest
/// txg (ties go to the lowest label index).
///
/// When no copy is valid and some could not be read at all, the four are
/// read once more, at once: a device that answered with read errors may
/// have failed for a moment (a bus reset, a cable), and a device whose
/// label cannot be read is left out of its pool at import, which then runs
/// without that device's redundancy. When every copy read and none
/// decoded, nothing is read again (they would not decode the second time
/// either). On a dying disk whose reads each wait out the kernel's
/// timeouts, finding that it has no readable label takes twice as long.
pub fn read_label(leaf: &dyn Leaf) -> Result<LabelRead, VdevError> {
    let offs = offsets_or_small(leaf)?;
    let mut area = vec![0u8; LABEL_CONFIG_SIZE];
    let mut found: Vec<LabelConfig> = Vec::with_capacity(4);
    let mut reasons = Vec::new();
    for attempt in 0..2 {
        let mut read_errors = 0;
        reasons.clear();
        for (i, off) in offs.iter().enumerate() {
            let res = match leaf.read_at(&mut area, *off) {
                Ok(()) => decode_config(&area),
                Err(e) => {
                    read_errors += 1;
                    Err(format!("read error: {e}"))
                }
            };
            match res {
                Ok(cfg) => found.push(cfg),
                Err(why) => reasons.push(format!("L{i}: {why}")),
            }
        }
        if !found.is_empty() || read_errors == 0 || attempt == 1 {
            break;
        }
    }
    let best = found
        .iter()
        .enumerate()
        .max_by_key(|(i, c)| (c.txg, std::cmp::Reverse(*i)))
        .map(|(_, c)| c.clone());
    match best {
        Some(config) => {
            let valid_copies = found.iter().filter(|c| **c == config).count() as u8;
            Ok(LabelRead {
                config,
                valid_copies,
            })
        }
        None => Err(VdevError::NoLabel {
            path: leaf.path().to_path_buf(),
            reason: reasons.join("; "),
        }),
    }
}

/// Writes one uberblock slot (zero-padded to the slot size) into all four
/// labels, without flushing. Every copy is attempted; the first error is returned.
pub fn write_uberblock(
    leaf: &dyn Leaf,
    ashift: u8,
    slot: usize,
    bytes: &[u8],
) -> Result<(), VdevError> {
    check_ashift(ashift).map_err(VdevError::InvalidArgument)?;
    let offs = offsets_or_small(leaf)?;
    let size = uberblock_slot_size(ashift);
    if slot >= uberblock_slots(ashift) || bytes.len() > size {
        return Err(VdevError::InvalidArgument(format!(
            "uberblock slot {slot} with {} bytes (ring has {} slots of {size} bytes)",
            bytes.len(),
            uberblock_slots(ashift)
        )));
    }
    let mut buf = vec![0u8; size];
    buf[..bytes.len()].copy_from_slice(bytes);
    let within = (LABEL_CONFIG_SIZE + slot * size) as u64;
    let mut first_err = None;
    for off in offs {
        if let Err(e) = leaf.write_at(&buf, off + within) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), |e| Err(io(leaf, "write uberblock")(e)))
}

/// Every slot of every readable label's uberblock ring, raw, label by label
/// (L0 slots first). Unreadable labels are skipped; a device too small to
/// carry labels yields nothing.
pub fn read_uberblocks(leaf: &dyn Leaf, ashift: u8) -> Vec<Vec<u8>> {
    let Ok(offs) = offsets_or_small(leaf) else {
        return Vec::new();
    };
    if check_ashift(ashift).is_err() {
        return Vec::new();
    }
    let size = uberblock_slot_size(ashift);
    let mut ring = vec![0u8; UBERBLOCK_RING_SIZE];
    let mut out = Vec::new();
    for off in offs {
        if leaf
            .read_at(&mut ring, off + LABEL_CONFIG_SIZE as u64)
            .is_ok()
        {
            out.extend(ring.chunks_exact(size).map(<[u8]>::to_vec));
        }
    }
    out
}

/// Zeroes every label position the device has room for and flushes, so the
/// device is no longer recognised as part of a pool.
pub fn clear_labels(leaf: &dyn Leaf) -> Result<(), VdevError> {
    let size = leaf.size();
    let end = size - size % LABEL_SIZE;
    let mut offs: Vec<u64> = Vec::with_capacity(4);
    if end >= 2 * LABEL_SIZE {
        offs.extend([0, LABEL_SIZE]);
    }
    if end >= 4 * LABEL_SIZE {
        offs.extend([end - 2 * LABEL_SIZE, end - LABEL_SIZE]);
    }
    if offs.is_empty() {
        return Err(VdevError::TooSmall {
            path: leaf.path().to_path_buf(),
            size,
            min: MIN_LEAF_SIZE,
        });
    }
    let zeros = vec![0u8; LABEL_SIZE as usize];
    for off in offs {
        leaf.write_at(&zeros, off)
            .map_err(io(leaf, "clear label"))?;
    }
    leaf.flush().map_err(io(leaf, "flush label"))
}

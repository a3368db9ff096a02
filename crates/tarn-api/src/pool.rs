//! Pools as the API shows them: status, list and iostat rows, import
//! candidates, scans, and the requests that create, import and change
//! pools. These are the API's own copies of what the pool layer reports,
//! with the same JSON shape; the daemon converts into them.
//!
//! It also turns the `zpool`-style words people write for vdevs
//! (`mirror a b raidz2 c d e`, `log mirror x y`) into [`VdevSpec`]s
//! ([`parse_vdev_words`], [`parse_log_words`]), so every client (the
//! command line, a configuration file, a web page) reads them alike and
//! refuses the same mistakes with the same sentences.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Health of a pool, a top-level vdev or a leaf, in ZFS's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Health {
    /// Every device answers and nothing is missing.
    Online,
    /// Some redundancy is lost; all data is still readable.
    Degraded,
    /// Too many devices are gone; data cannot be served.
    Faulted,
    /// Taken out of service by the administrator.
    Offline,
    /// The device could not be opened.
    Unavail,
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Health::Online => "ONLINE",
            Health::Degraded => "DEGRADED",
            Health::Faulted => "FAULTED",
            Health::Offline => "OFFLINE",
            Health::Unavail => "UNAVAIL",
        };
        f.write_str(s)
    }
}

/// Error and traffic counters of one device since import or `clear`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Reads that failed with an I/O error.
    pub read_errors: u64,
    /// Writes that failed with an I/O error.
    pub write_errors: u64,
    /// Reads that returned bytes failing their checksum (or parity).
    pub cksum_errors: u64,
    /// Read operations issued.
    pub read_ops: u64,
    /// Write operations issued.
    pub write_ops: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
}

/// One node of the vdev tree as shown by `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdevStatus {
    /// `raidz1-0`, `mirror-1`, or a leaf's path.
    pub name: String,
    /// Health of this node.
    pub health: Health,
    /// Counters (summed over children for interior nodes).
    pub counters: Counters,
    /// Extra words for the operator, e.g. "resilvering" or "was /dev/sdb".
    pub note: Option<String>,
    /// Children (empty for leaves).
    pub children: Vec<VdevStatus>,
}

/// Kind of a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanKind {
    /// Verify and repair every block.
    Scrub,
    /// Rebuild what a returning or new device missed.
    Resilver,
}

/// State of the last or current scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanState {
    /// Running now.
    Scanning,
    /// Paused by the administrator; resumes where it stopped.
    Paused,
    /// Ran to the end.
    Finished,
    /// Stopped by the administrator before the end.
    Canceled,
}

/// Progress and result of a scrub or resilver.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScanStatus {
    /// Scrub or resilver.
    pub kind: ScanKind,
    /// Running, paused, finished or canceled.
    pub state: ScanState,
    /// Unix seconds when the scan started.
    pub started_unix: u64,
    /// Unix seconds when it ended, if it did.
    pub ended_unix: Option<u64>,
    /// Allocated bytes examined so far.
    pub examined_bytes: u64,
    /// Allocated bytes the scan will examine in all.
    pub total_bytes: u64,
    /// Bytes rewritten to repair damage.
    pub repaired_bytes: u64,
    /// Blocks that could not be repaired.
    pub errors: u64,
    /// Recent rate in bytes per second while running.
    pub rate_bytes_per_sec: u64,
    /// Estimated seconds to completion while running.
    pub eta_secs: Option<u64>,
}

/// What `status` says about one pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Pool name.
    pub name: String,
    /// Pool GUID, hex.
    pub guid: String,
    /// Overall health.
    pub health: Health,
    /// A sentence for the operator when something needs attention.
    pub message: Option<String>,
    /// What to do about it.
    pub action: Option<String>,
    /// Last committed txg.
    pub txg: u64,
    /// The current or last scan.
    pub scan: Option<ScanStatus>,
    /// The vdev tree (the root's children are the top-level vdevs).
    pub vdevs: Vec<VdevStatus>,
    /// Separate intent log vdevs.
    #[serde(default)]
    pub logs: Vec<VdevStatus>,
    /// Objects with unrecoverable damage, named for the operator.
    pub damaged: Vec<String>,
    /// Encrypted datasets whose key is not loaded (API 2.2).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locked: Vec<String>,
    /// The block cache this pool reads through (shared by every pool of
    /// the daemon, so its counters cover them all); absent from older
    /// daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheCounters>,
}

impl PoolStatus {
    /// Whether the pool needs an operator: anything but a quiet, healthy
    /// pool (a message, damage, a device not online or with errors). What
    /// `status -x` shows; every client should single out the same pools.
    pub fn needs_attention(&self) -> bool {
        fn any_errors(v: &VdevStatus) -> bool {
            let c = &v.counters;
            c.read_errors + c.write_errors + c.cksum_errors > 0
                || v.health != Health::Online
                || v.children.iter().any(any_errors)
        }
        self.health != Health::Online
            || self.message.is_some()
            || !self.damaged.is_empty()
            || self.vdevs.iter().any(any_errors)
    }
}

/// The block cache's size and counters since the daemon started: whether
/// the working set fits, and what read-ahead brings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheCounters {
    /// Bytes of verified blocks held now.
    pub bytes: u64,
    /// The bound (`--cache-mib`).
    pub max_bytes: u64,
    /// Blocks held now.
    pub blocks: u64,
    /// Data-block lookups that found the block.
    pub data_hits: u64,
    /// Data-block lookups that had to read the disks.
    pub data_misses: u64,
    /// Tree-node lookups that found the node.
    pub meta_hits: u64,
    /// Tree-node lookups that had to read the disks.
    pub meta_misses: u64,
    /// Blocks evicted to stay within the bound.
    pub evicted: u64,
    /// Blocks read ahead of a sequential reader.
    pub prefetched: u64,
    /// Read-ahead blocks that were then read.
    pub prefetch_hits: u64,
}

/// One row of `list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolListEntry {
    /// Pool name.
    pub name: String,
    /// Usable bytes (after parity), data region only.
    pub size: u64,
    /// Allocated bytes (as the allocator counts them: with parity/padding).
    pub allocated: u64,
    /// Bytes still allocatable.
    pub free: u64,
    /// Overall health.
    pub health: Health,
    /// Pool GUID, hex.
    pub guid: String,
}

/// One row of `iostat`: a device's cumulative counters; the client computes
/// rates from two samples.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IostatEntry {
    /// Pool, top-level vdev name or leaf path.
    pub name: String,
    /// Nesting depth (0 pool, 1 top-level, 2 leaf) for indentation.
    pub depth: u8,
    /// Allocated bytes (pool and top-level rows; 0 for leaves).
    pub allocated: u64,
    /// Free bytes (pool and top-level rows; 0 for leaves).
    pub free: u64,
    /// Cumulative counters.
    pub counters: Counters,
}

/// A pool found on devices by `import` without a name: what can be imported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImportCandidate {
    /// Pool name from the labels.
    pub name: String,
    /// Pool GUID, hex.
    pub guid: String,
    /// Whether it can be imported as found.
    pub health: Health,
    /// Devices found, by path.
    pub devices: Vec<String>,
    /// Why it cannot be imported, or what is missing.
    pub note: Option<String>,
    /// Whether the labels say another process may own it (needs --force).
    pub active: bool,
}

/// Layout of one top-level vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VdevKind {
    /// One device, no redundancy.
    Single,
    /// N-way copies.
    Mirror,
    /// Single parity.
    Raidz1,
    /// Double parity.
    Raidz2,
    /// Triple parity.
    Raidz3,
}

impl VdevKind {
    /// The word used on the command line and in vdev names (`mirror-0`).
    pub fn as_str(self) -> &'static str {
        match self {
            VdevKind::Single => "single",
            VdevKind::Mirror => "mirror",
            VdevKind::Raidz1 => "raidz1",
            VdevKind::Raidz2 => "raidz2",
            VdevKind::Raidz3 => "raidz3",
        }
    }

    /// Fewest devices this layout accepts: one more than its parity.
    pub fn min_devices(self) -> usize {
        match self {
            VdevKind::Single => 1,
            VdevKind::Mirror | VdevKind::Raidz1 => 2,
            VdevKind::Raidz2 => 3,
            VdevKind::Raidz3 => 4,
        }
    }

    /// Most devices this layout accepts.
    pub fn max_devices(self) -> usize {
        match self {
            VdevKind::Single => 1,
            _ => 255,
        }
    }
}

/// One top-level vdev to create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VdevSpec {
    /// Layout.
    pub kind: VdevKind,
    /// Absolute device paths.
    pub devices: Vec<String>,
}

impl VdevSpec {
    /// Checks the device count; `index` is the vdev's position, for naming it
    /// the way `status` will (`mirror-1`).
    pub fn validate(&self, index: usize) -> Result<(), ApiError> {
        let kind = self.kind;
        let n = self.devices.len();
        let what = match kind {
            VdevKind::Single => format!("top-level vdev {index}"),
            _ => format!("{}-{index}", kind.as_str()),
        };
        if n < kind.min_devices() {
            let listed = if n == 0 {
                "none".to_string()
            } else {
                self.devices.join(" ")
            };
            return Err(ApiError::invalid(format!(
                "{what} needs at least {} devices for {}, got {n} ({listed}); \
                 list more devices after `{}`",
                kind.min_devices(),
                kind.as_str(),
                kind.as_str(),
            )));
        }
        if n > kind.max_devices() {
            return Err(ApiError::invalid(format!(
                "{what} has {n} devices; a {} vdev takes at most {}",
                kind.as_str(),
                kind.max_devices()
            )));
        }
        if let Some(empty) = self.devices.iter().find(|d| d.trim().is_empty()) {
            return Err(ApiError::invalid(format!(
                "{what} lists an empty device path {empty:?}"
            )));
        }
        Ok(())
    }
}

/// Parses `zpool create`-style vdev words into top-level vdevs: `a b` is two
/// single vdevs; `mirror a b`, `raidz1 a b c` (`raidz` = `raidz1`),
/// `raidz2 ...`, `raidz3 ...` are groups; a group runs until the next group
/// word. Devices are returned as written (a client makes them absolute,
/// relative to where its user is), and every vdev is checked with
/// [`VdevSpec::validate`].
pub fn parse_vdev_words(words: &[String]) -> Result<Vec<VdevSpec>, ApiError> {
    let mut vdevs = Vec::new();
    let mut group: Option<VdevSpec> = None;
    for word in words {
        match group_word(word)? {
            Some(kind) => {
                vdevs.extend(group.take());
                group = Some(VdevSpec {
                    kind,
                    devices: Vec::new(),
                });
            }
            None => match group.as_mut() {
                Some(g) => g.devices.push(word.clone()),
                None => vdevs.push(VdevSpec {
                    kind: VdevKind::Single,
                    devices: vec![word.clone()],
                }),
            },
        }
    }
    vdevs.extend(group);
    if vdevs.is_empty() {
        return Err(ApiError::invalid(
            "no devices given; e.g. `tarn pool create tank mirror /dev/sdb /dev/sdc`",
        ));
    }
    for (i, vdev) in vdevs.iter().enumerate() {
        vdev.validate(i)?;
    }
    Ok(vdevs)
}

/// Parses `log DEV` or `log mirror DEV...` (what `pool add` accepts) into
/// the one log vdev it names; devices are returned as written.
pub fn parse_log_words(words: &[String]) -> Result<VdevSpec, ApiError> {
    let Some((first, rest)) = words.split_first() else {
        return Err(ApiError::invalid(
            "nothing to add; e.g. `tarn pool add tank log /dev/nvme0n1`",
        ));
    };
    if first != "log" {
        return Err(ApiError::invalid(
            "tarn pool add adds log devices only: `tarn pool add POOL log DEV` or \
             `... log mirror DEV DEV`",
        ));
    }
    let mut vdevs = parse_vdev_words(rest)?;
    let spec = match (vdevs.pop(), vdevs.is_empty()) {
        (Some(v), true) => v,
        _ => {
            return Err(ApiError::invalid(
                "one log vdev at a time: a device, or `mirror` and its devices",
            ))
        }
    };
    if !matches!(spec.kind, VdevKind::Single | VdevKind::Mirror) {
        return Err(ApiError::invalid(
            "a log vdev is one device or a mirror, not raidz",
        ));
    }
    Ok(spec)
}

/// Recognises a group word; refuses words that look like vdev types tarn
/// does not have, so they are not taken for device names.
fn group_word(word: &str) -> Result<Option<VdevKind>, ApiError> {
    let kind = match word {
        "mirror" => VdevKind::Mirror,
        "raidz" | "raidz1" => VdevKind::Raidz1,
        "raidz2" => VdevKind::Raidz2,
        "raidz3" => VdevKind::Raidz3,
        w if w.starts_with("raidz") => {
            return Err(ApiError::invalid(format!(
                "{w} is not a vdev type: tarn has raidz1, raidz2 and raidz3 (raidz means raidz1); \
                 for a device with that name write ./{w}"
            )))
        }
        w if ["log", "cache", "spare", "special", "dedup"].contains(&w)
            || w.starts_with("draid") =>
        {
            return Err(ApiError::invalid(format!(
                "{w} vdevs are not supported by tarn; for a device with that name write ./{w}"
            )))
        }
        _ => return Ok(None),
    };
    Ok(Some(kind))
}

/// Lowest and highest accepted `ashift` (512 B to 64 KiB sectors).
pub const ASHIFT_RANGE: std::ops::RangeInclusive<u8> = 9..=16;

/// Longest accepted pool name, in bytes.
pub const POOL_NAME_MAX_BYTES: usize = 200;

/// Checks a pool name: it starts with a letter, holds only letters, digits
/// and `_-.:`, and does not start like a vdev type (so a forgotten name in
/// `tarn pool create mirror a b` is caught instead of naming a pool "mirror").
pub fn validate_pool_name(name: &str) -> Result<(), ApiError> {
    let bad = |why: &str| {
        Err(ApiError::invalid(format!(
            "pool name {name:?} {why}; use a name such as `tank`"
        )))
    };
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > POOL_NAME_MAX_BYTES {
        return bad(&format!("is longer than {POOL_NAME_MAX_BYTES} bytes"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return bad("must start with a letter");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.:".contains(*c)))
    {
        return bad(&format!(
            "contains {c:?}; only letters, digits and _ - . : are allowed"
        ));
    }
    let reserved_prefix = ["mirror", "raidz", "draid", "spare"]
        .into_iter()
        .find(|p| name.starts_with(p));
    let reserved_word = ["log", "cache", "special", "dedup"].contains(&name);
    if reserved_prefix.is_some() || reserved_word {
        return Err(ApiError::invalid(format!(
            "pool name {name:?} is reserved for a vdev type; did you forget the pool name? \
             e.g. `tarn pool create tank mirror /dev/sdb /dev/sdc`"
        )));
    }
    Ok(())
}

/// Parameters of `pool.create`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// New pool's name.
    pub name: String,
    /// Top-level vdevs, in order.
    pub vdevs: Vec<VdevSpec>,
    /// log2 of the sector size; the engine's default when absent.
    #[serde(default)]
    pub ashift: Option<u8>,
    /// Initial properties, e.g. `checksum=xxh3`, `compression=lz4`,
    /// `copies=2`; the engine refuses names or values it does not know.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Use devices even if their labels say they belong to another pool.
    #[serde(default)]
    pub force: bool,
}

impl CreateRequest {
    /// Checks everything that can be checked without touching a device.
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_pool_name(&self.name)?;
        if self.vdevs.is_empty() {
            return Err(ApiError::invalid(format!(
                "pool {} has no vdevs; list devices, e.g. `tarn pool create {} mirror /dev/sdb /dev/sdc`",
                self.name, self.name
            )));
        }
        let mut seen = BTreeSet::new();
        for (i, vdev) in self.vdevs.iter().enumerate() {
            vdev.validate(i)?;
            for dev in &vdev.devices {
                if !seen.insert(dev.as_str()) {
                    return Err(ApiError::invalid(format!(
                        "device {dev} is listed twice; each device can serve one vdev"
                    )));
                }
            }
        }
        if let Some(ashift) = self.ashift {
            if !ASHIFT_RANGE.contains(&ashift) {
                return Err(ApiError::invalid(format!(
                    "ashift={ashift} is out of range; use {} to {} (12 = 4 KiB sectors)",
                    ASHIFT_RANGE.start(),
                    ASHIFT_RANGE.end()
                )));
            }
        }
        if let Some(key) = self.properties.keys().find(|k| k.is_empty()) {
            return Err(ApiError::invalid(format!(
                "property name {key:?} is empty; write properties as NAME=VALUE"
            )));
        }
        Ok(())
    }
}

/// Parameters of `pool.import`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    /// Directories to search for devices; the engine's default when empty
    /// and no devices are given.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Individual devices to examine.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Pool to import, by name or hex GUID; none lists the candidates.
    #[serde(default)]
    pub pool: Option<String>,
    /// Import under this name instead.
    #[serde(default)]
    pub new_name: Option<String>,
    /// Import even if the labels say another process may own the pool.
    #[serde(default)]
    pub force: bool,
    /// Import even when the intent log cannot be read or replayed in
    /// full, keeping what precedes the damage.
    #[serde(default)]
    pub discard_log: bool,
}

impl ImportRequest {
    /// Checks the request's shape.
    pub fn validate(&self) -> Result<(), ApiError> {
        if let Some(new_name) = &self.new_name {
            if self.pool.is_none() {
                return Err(ApiError::invalid(
                    "a new name needs the pool to import; e.g. `tarn pool import tank tank2`",
                ));
            }
            validate_pool_name(new_name)?;
        }
        Ok(())
    }
}

/// Result of `pool.import`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportResult {
    /// No pool was named: what could be imported.
    Candidates(Vec<ImportCandidate>),
    /// The named pool, now imported (boxed: it is much larger than the
    /// other variant).
    Imported(Box<PoolStatus>),
}

/// What `pool.scrub` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubAction {
    /// Start a scrub (or resume a paused one).
    #[default]
    Start,
    /// Pause the running scrub; progress is kept.
    Pause,
    /// Resume a paused scrub.
    Resume,
    /// Stop the scrub for good.
    Cancel,
}

/// Drills (`pool.inject`): what an injected device fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Reads fail with an I/O error.
    ReadError,
    /// Writes fail with an I/O error.
    WriteError,
    /// Reads return data with one bit flipped.
    Bitflip,
    /// Writes are acknowledged but nothing lands.
    DropWrite,
    /// Writes land only partly: a prefix of whole sectors.
    TornWrite,
    /// Every I/O waits first (see [`Fault::latency_ms`]).
    Latency,
    /// The device is gone: every I/O and flush fails.
    Vanish,
    /// Flushes fail with an I/O error, as when a device's write-back
    /// fails: what was written since the last flush may be lost.
    FlushError,
}

impl FaultKind {
    /// Every kind, for help texts.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::ReadError,
        FaultKind::WriteError,
        FaultKind::Bitflip,
        FaultKind::DropWrite,
        FaultKind::TornWrite,
        FaultKind::Latency,
        FaultKind::Vanish,
        FaultKind::FlushError,
    ];

    /// The name used on the command line (`read-error`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ReadError => "read-error",
            FaultKind::WriteError => "write-error",
            FaultKind::Bitflip => "bitflip",
            FaultKind::DropWrite => "drop-write",
            FaultKind::TornWrite => "torn-write",
            FaultKind::Latency => "latency",
            FaultKind::Vanish => "vanish",
            FaultKind::FlushError => "flush-error",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// One injected device fault, as `pool.inject` takes and answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// What it does.
    pub kind: FaultKind,
    /// Share of the matching I/Os it hits, 0.0..=1.0.
    pub probability: f64,
    /// Only I/Os touching this byte range [start, end) of the device.
    pub range: Option<(u64, u64)>,
    /// Delay of a `Latency` fault.
    pub latency_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn create(vdevs: Vec<VdevSpec>) -> CreateRequest {
        CreateRequest {
            name: "tank".into(),
            vdevs,
            ashift: None,
            properties: BTreeMap::new(),
            force: false,
        }
    }

    fn spec(kind: VdevKind, devices: &[&str]) -> VdevSpec {
        VdevSpec {
            kind,
            devices: devices.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn pool_names() {
        for ok in ["tank", "t", "data_1.backup:x-y"] {
            validate_pool_name(ok).unwrap();
        }
        for bad in ["", "1tank", "ta nk", "ta/nk", "mirror", "raidz2x", "log"] {
            let err = validate_pool_name(bad).unwrap_err();
            assert_eq!(err.code, ErrorCode::Invalid, "{bad}");
        }
        assert!(validate_pool_name("mirror")
            .unwrap_err()
            .message
            .contains("forget the pool name"));
    }

    #[test]
    fn create_checks_counts_duplicates_and_ashift() {
        create(vec![spec(VdevKind::Raidz2, &["/a", "/b", "/c"])])
            .validate()
            .unwrap();
        let err = create(vec![spec(VdevKind::Raidz3, &["/a", "/b", "/c"])])
            .validate()
            .unwrap_err();
        assert!(
            err.message.contains("raidz3-0 needs at least 4"),
            "{}",
            err.message
        );
        let err = create(vec![
            spec(VdevKind::Single, &["/a"]),
            spec(VdevKind::Mirror, &["/b", "/a"]),
        ])
        .validate()
        .unwrap_err();
        assert!(
            err.message.contains("/a is listed twice"),
            "{}",
            err.message
        );
        assert!(create(vec![]).validate().is_err());
        let mut req = create(vec![spec(VdevKind::Single, &["/a"])]);
        req.ashift = Some(30);
        assert!(req.validate().unwrap_err().message.contains("ashift=30"));
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn kinds(specs: &[VdevSpec]) -> Vec<(VdevKind, usize)> {
        specs.iter().map(|s| (s.kind, s.devices.len())).collect()
    }

    #[test]
    fn vdev_words_group_like_zpool() {
        let specs = parse_vdev_words(&words("mirror a b raidz2 c d e f")).unwrap();
        assert_eq!(
            kinds(&specs),
            [(VdevKind::Mirror, 2), (VdevKind::Raidz2, 4)]
        );
        assert_eq!(specs[1].devices, ["c", "d", "e", "f"]);

        let specs = parse_vdev_words(&words("a b mirror c d mirror e f raidz g h")).unwrap();
        assert_eq!(
            kinds(&specs),
            [
                (VdevKind::Single, 1),
                (VdevKind::Single, 1),
                (VdevKind::Mirror, 2),
                (VdevKind::Mirror, 2),
                (VdevKind::Raidz1, 2),
            ]
        );
    }

    #[test]
    fn vdev_words_refuse_bad_groups() {
        let err = parse_vdev_words(&words("mirror a"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mirror-0 needs at least 2 devices"), "{err}");
        let err = parse_vdev_words(&words("mirror a b raidz3 c d e"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("raidz3-1 needs at least 4"), "{err}");
        let err = parse_vdev_words(&words("raidz4 a b c d e"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("raidz4 is not a vdev type"), "{err}");
        let err = parse_vdev_words(&words("mirror a b log c"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("log vdevs are not supported"), "{err}");
        let err = parse_vdev_words(&[]).unwrap_err().to_string();
        assert!(err.contains("no devices given"), "{err}");
        let err = parse_vdev_words(&words("mirror raidz1 a b"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("got 0 (none)"), "{err}");
    }

    #[test]
    fn log_words_name_one_device_or_mirror() {
        let spec = parse_log_words(&words("log mirror a b")).unwrap();
        assert_eq!(kinds(&[spec]), [(VdevKind::Mirror, 2)]);
        let spec = parse_log_words(&words("log a")).unwrap();
        assert_eq!(spec.devices, ["a"]);
        for (bad, says) in [
            ("", "nothing to add"),
            ("mirror a b", "log devices only"),
            ("log a b", "one log vdev at a time"),
            ("log raidz a b", "not raidz"),
        ] {
            let err = parse_log_words(&words(bad)).unwrap_err();
            assert_eq!(err.code, ErrorCode::Invalid, "{bad}");
            assert!(err.message.contains(says), "{bad}: {}", err.message);
        }
    }

    #[test]
    fn import_result_wire_shape() {
        let v = serde_json::to_value(ImportResult::Candidates(vec![])).unwrap();
        assert_eq!(v, serde_json::json!({"candidates": []}));
        let v = serde_json::to_value(ScrubAction::Cancel).unwrap();
        assert_eq!(v, serde_json::json!("cancel"));
        let v = serde_json::to_value(spec(VdevKind::Raidz1, &["/a", "/b"])).unwrap();
        assert_eq!(v["kind"], "raidz1");
    }
}

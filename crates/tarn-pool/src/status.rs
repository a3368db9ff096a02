//! Plain data describing a pool for `status`, `list` and `iostat`: what the
//! admin API returns as JSON and the CLI renders like `zpool status`.

use serde::{Deserialize, Serialize};

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

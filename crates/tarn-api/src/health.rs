//! Disk health as the API shows it: what SMART (ATA, SCSI) and the NVMe
//! health log say about each device of the imported pools, read through
//! smartmontools' `smartctl --json`.

use serde::{Deserialize, Serialize};

/// One device's health.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiskHealth {
    /// The device path, as the pool names it.
    pub device: String,
    /// The pool it belongs to.
    pub pool: String,
    /// `ATA`, `SCSI` or `NVMe`; none when there is no health data.
    pub protocol: Option<String>,
    /// Model.
    pub model: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// Temperature now, °C.
    pub temperature_c: Option<i64>,
    /// Hours powered on.
    pub power_on_hours: Option<u64>,
    /// The drive's own overall verdict (SMART "PASSED").
    pub smart_passed: Option<bool>,
    /// ATA: reallocated sectors; SCSI: grown defects.
    pub reallocated: Option<u64>,
    /// ATA: sectors waiting to be reallocated.
    pub pending: Option<u64>,
    /// ATA: sectors that could not be read offline; SCSI: uncorrected
    /// read and write errors.
    pub uncorrectable: Option<u64>,
    /// NVMe: media and data integrity errors.
    pub media_errors: Option<u64>,
    /// NVMe: share of the rated endurance used, %.
    pub percentage_used: Option<u64>,
    /// The latest self-test: what it was and how it ended.
    pub last_self_test: Option<String>,
    /// The latest self-test passed.
    pub last_self_test_passed: Option<bool>,
    /// What needs attention, one sentence each (also sent as events).
    pub warnings: Vec<String>,
    /// Whether any warning is critical.
    pub critical: bool,
    /// Why there is no health data ("a file, not a disk", smartctl
    /// missing or failing), if there is none.
    pub note: Option<String>,
}

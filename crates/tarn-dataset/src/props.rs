//! Dataset properties: names, validation, defaults and inheritance.
//!
//! Settable properties are stored per dataset only where set ("local");
//! a dataset without a local value takes its parent's, up to the pool's
//! root dataset, then the default, exactly as `zfs get` reports with its
//! SOURCE column. Snapshots inherit from their filesystem.

use serde::{Deserialize, Serialize};
use tarn_block::{ChecksumAlg, Compression};

use crate::DsError;

/// Where a property's value comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Set on this dataset.
    Local,
    /// Taken from the named ancestor.
    Inherited(String),
    /// Nobody set it.
    Default,
    /// Computed (space figures, type, ...); cannot be set.
    None,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Local => write!(f, "local"),
            Source::Inherited(from) => write!(f, "inherited from {from}"),
            Source::Default => write!(f, "default"),
            Source::None => write!(f, "-"),
        }
    }
}

/// One property value as `get` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PropValue {
    /// Dataset name.
    pub dataset: String,
    /// Property name.
    pub property: String,
    /// Value as text (sizes in bytes).
    pub value: String,
    /// Where it comes from.
    pub source: Source,
}

/// Settable properties and their defaults.
pub const SETTABLE: &[(&str, &str)] = &[
    ("recordsize", "131072"),
    ("compression", "lz4"),
    ("checksum", "blake3"),
    ("copies", "1"),
    ("atime", "on"),
    ("quota", "none"),
    ("reservation", "none"),
    ("readonly", "off"),
    ("sync", "standard"),
    ("mountpoint", "none"),
];

/// Read-only properties computed from the dataset's state.
pub const COMPUTED: &[&str] = &[
    "type",
    "creation",
    "used",
    "available",
    "referenced",
    "compressratio",
    "logicalused",
    "logicalreferenced",
    "usedbydataset",
    "usedbysnapshots",
    "usedbychildren",
    "written",
    "origin",
    "guid",
];

/// Default value of a settable property.
pub fn default_of(name: &str) -> Option<&'static str> {
    SETTABLE.iter().find(|(n, _)| *n == name).map(|(_, d)| *d)
}

fn bool_prop(name: &str, v: &str) -> Result<String, DsError> {
    match v {
        "on" | "off" => Ok(v.to_string()),
        _ => Err(DsError::Invalid(format!("{name}={v}: expected on or off"))),
    }
}

fn size_or_none(name: &str, v: &str) -> Result<String, DsError> {
    if v == "none" || v == "0" {
        return Ok("none".into());
    }
    tarn_pool::parse_size(v)
        .map(|n| n.to_string())
        .ok_or_else(|| DsError::Invalid(format!("{name}={v}: expected a size like 10G, or none")))
}

/// Checks and normalizes a value for a settable property.
pub fn validate(name: &str, value: &str) -> Result<String, DsError> {
    match name {
        "recordsize" => {
            let n = tarn_pool::parse_size(value).unwrap_or(0);
            if n.is_power_of_two() && (4096..=1 << 20).contains(&n) {
                Ok(n.to_string())
            } else {
                Err(DsError::Invalid(format!(
                    "recordsize={value}: expected a power of two from 4K to 1M"
                )))
            }
        }
        "compression" => Compression::parse(value)
            .map(|c| c.name())
            .map_err(|e| DsError::Invalid(e.to_string())),
        "checksum" => ChecksumAlg::parse(value)
            .map(|c| c.name().to_string())
            .map_err(|e| DsError::Invalid(e.to_string())),
        "copies" => match value {
            "1" | "2" | "3" => Ok(value.to_string()),
            _ => Err(DsError::Invalid(format!(
                "copies={value}: expected 1, 2 or 3"
            ))),
        },
        "atime" | "readonly" => bool_prop(name, value),
        "quota" | "reservation" => size_or_none(name, value),
        "sync" => match value {
            "standard" | "always" | "disabled" => Ok(value.to_string()),
            _ => Err(DsError::Invalid(format!(
                "sync={value}: expected standard, always or disabled"
            ))),
        },
        "mountpoint" => {
            if value == "none" || value == "legacy" {
                Ok(value.to_string())
            } else if value.starts_with('/') && !value.contains('\0') && value.len() < 4096 {
                let trimmed = value.trim_end_matches('/');
                Ok(if trimmed.is_empty() { "/" } else { trimmed }.to_string())
            } else {
                Err(DsError::Invalid(format!(
                    "mountpoint={value}: expected an absolute path, none or legacy"
                )))
            }
        }
        _ if COMPUTED.contains(&name) => {
            Err(DsError::Invalid(format!("property '{name}' is read-only")))
        }
        _ => Err(DsError::Invalid(format!(
            "unknown property '{name}'; settable: {}",
            SETTABLE
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Formats bytes the way `zfs list` does (1024-based, 3 significant digits).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n}B")
    } else if v < 10.0 {
        format!("{v:.2}{}", UNITS[u])
    } else if v < 100.0 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert_eq!(validate("recordsize", "128K").unwrap(), "131072");
        assert!(validate("recordsize", "3K").is_err());
        assert!(validate("recordsize", "2M").is_err());
        assert_eq!(validate("compression", "zstd-7").unwrap(), "zstd-7");
        assert!(validate("compression", "gzip").is_err());
        assert_eq!(validate("quota", "1G").unwrap(), (1u64 << 30).to_string());
        assert_eq!(validate("quota", "none").unwrap(), "none");
        assert!(validate("atime", "yes").is_err());
        assert!(validate("used", "1").is_err());
        assert!(validate("mountpoint", "rel/path").is_err());
        assert_eq!(validate("mountpoint", "/mnt/x/").unwrap(), "/mnt/x");
        assert!(validate("colour", "red").is_err());
        for (n, d) in SETTABLE {
            assert_eq!(validate(n, d).unwrap(), *d, "default of {n} must validate");
        }
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(512), "512B");
        assert_eq!(human_bytes(1536), "1.50K");
        assert_eq!(human_bytes(200 << 20), "200M");
    }
}

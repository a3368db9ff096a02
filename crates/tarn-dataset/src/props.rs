//! Dataset properties: names, validation, defaults and inheritance, and the
//! `get`/`set`/`inherit` operations on them.
//!
//! Settable properties are stored per dataset only where set ("local");
//! a dataset without a local value takes its parent's, up to the pool's
//! root dataset, then the default, exactly as `zfs get` reports with its
//! SOURCE column. Snapshots inherit from their filesystem. `quota` and
//! `reservation` are the exception ([`NOT_INHERITED`]): they hold where
//! they are set, or are `none`.

use serde::{Deserialize, Serialize};
use tarn_block::{ChecksumAlg, Compression};
use tarn_pool::{BlockOpts, Pool};

use crate::dsl::{with_dir, with_dir_excl, Dir};
use crate::record::DatasetKind;
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

/// Settable properties that apply to the dataset they are set on only,
/// as in ZFS: a quota limits that dataset with everything below it (its
/// `used` counts its children), and a reservation keeps room for that
/// subtree once. Inherited, every child would claim a reservation of its
/// own (and its parent would count each one again). `inherit` clears them.
pub const NOT_INHERITED: &[&str] = &["quota", "reservation"];

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
    "volsize",
    "volblocksize",
    "encryption",
    "keyformat",
    "keylocation",
    "keystatus",
    "encryptionroot",
    "receive_resume_token",
];

/// Encryption properties: given at creation (`encryption`, `keyformat`,
/// `keylocation`), changed with the key commands (`keylocation` also by
/// `set` on an encryption root), never inherited like the others.
pub const ENCRYPTION: &[&str] = &["encryption", "keyformat", "keylocation"];

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

impl Dir {
    /// Resolved value and source of a settable property.
    pub(crate) fn prop(&self, id: u64, name: &str) -> (String, Source) {
        let mut cur = self.recs.get(&id);
        let mut first = true;
        while let Some(r) = cur {
            if let Some(v) = r.props.get(name) {
                let src = if first {
                    Source::Local
                } else {
                    Source::Inherited(r.name.clone())
                };
                if name == "mountpoint" && !first && v.starts_with('/') {
                    // An inherited mountpoint extends by the relative name.
                    let rel = self
                        .recs
                        .get(&id)
                        .map(|me| {
                            let base = me.name.split('@').next().unwrap_or(&me.name);
                            base.strip_prefix(&r.name).unwrap_or("").to_string()
                        })
                        .unwrap_or_default();
                    let v = format!("{}{}", v.trim_end_matches('/'), rel);
                    return (v, src);
                }
                return (v.clone(), src);
            }
            if NOT_INHERITED.contains(&name) {
                break;
            }
            first = false;
            let up = if r.is_snapshot() { r.head } else { r.parent };
            cur = up.and_then(|p| self.recs.get(&p));
        }
        // The pool's own properties are its datasets' defaults.
        let pool = match name {
            "recordsize" => Some(self.pool_props.recordsize.to_string()),
            "compression" => Some(self.pool_props.compression.clone()),
            "checksum" => Some(self.pool_props.checksum.clone()),
            "copies" => Some(self.pool_props.copies.to_string()),
            _ => None,
        };
        let v = pool.unwrap_or_else(|| default_of(name).unwrap_or("").to_string());
        (v, Source::Default)
    }

    pub(crate) fn prop_bool(&self, id: u64, name: &str) -> bool {
        self.prop(id, name).0 == "on"
    }

    pub(crate) fn prop_u64(&self, id: u64, name: &str) -> Option<u64> {
        self.prop(id, name).0.parse().ok()
    }

    /// How dataset `id`'s blocks are written now, its key included; an
    /// encrypted dataset whose key is not loaded gets an error, never
    /// options without a key (its blocks would be written in the clear).
    pub(crate) fn block_opts(&self, id: u64) -> Result<BlockOpts, DsError> {
        Ok(BlockOpts {
            compression: Compression::parse(&self.prop(id, "compression").0)
                .unwrap_or(Compression::Lz4),
            checksum: ChecksumAlg::parse(&self.prop(id, "checksum").0)
                .unwrap_or(ChecksumAlg::Blake3),
            copies: self.copies(id),
            key: self.keyset(id)?,
        })
    }

    /// The `copies` of dataset `id`'s data blocks.
    pub(crate) fn copies(&self, id: u64) -> u8 {
        self.prop_u64(id, "copies").unwrap_or(1).clamp(1, 3) as u8
    }
}

/// Property values of a dataset (all of them when `names` is empty).
pub fn get_props(pool: &Pool, name: &str, names: &[String]) -> Result<Vec<PropValue>, DsError> {
    with_dir(pool, |dsl, cx| {
        let id = dsl.id_of(name)?;
        let info = dsl
            .info(cx, id)
            .ok_or_else(|| DsError::NotFound(name.to_string()))?;
        let wanted: Vec<String> = if names.is_empty() {
            COMPUTED
                .iter()
                .map(|s| s.to_string())
                .chain(SETTABLE.iter().map(|(n, _)| n.to_string()))
                .collect()
        } else {
            names.to_vec()
        };
        let mut out = Vec::new();
        for p in wanted {
            let computed = |v: String| (v, Source::None);
            let (value, source) = match p.as_str() {
                "type" => computed(
                    match info.kind {
                        DatasetKind::Filesystem => "filesystem",
                        DatasetKind::Snapshot => "snapshot",
                        DatasetKind::Volume => "volume",
                    }
                    .into(),
                ),
                "creation" => computed(info.creation_unix.to_string()),
                "used" => computed(info.used.to_string()),
                "available" => computed(info.available.map_or("-".into(), |a| a.to_string())),
                "referenced" => computed(info.referenced.to_string()),
                "compressratio" => computed(format!("{:.2}x", info.compressratio)),
                "logicalused" => computed(info.logicalused.to_string()),
                "logicalreferenced" => computed(info.logicalreferenced.to_string()),
                "usedbydataset" => computed(info.usedbydataset.to_string()),
                "usedbysnapshots" => computed(info.usedbysnapshots.to_string()),
                "usedbychildren" => computed(info.usedbychildren.to_string()),
                "written" => computed(info.written.to_string()),
                "origin" => computed(info.origin.clone().unwrap_or_else(|| "-".into())),
                "guid" => computed(info.guid.to_string()),
                "volsize" => computed(info.volsize.map_or("-".into(), |v| v.to_string())),
                "volblocksize" => computed(info.volblocksize.map_or("-".into(), |v| v.to_string())),
                "encryption" => computed(dsl.encryption(id).map_or("off".into(), |e| e.cipher)),
                "keyformat" => computed(
                    dsl.encryption(id)
                        .map_or("none".into(), |e| e.keyformat.name().into()),
                ),
                "keylocation" => match dsl.encryption(id) {
                    Some(e) if e.root == name => (e.keylocation, Source::Local),
                    Some(e) => (e.keylocation, Source::Inherited(e.root)),
                    None => computed("none".into()),
                },
                "keystatus" => computed(
                    dsl.encryption(id)
                        .map_or("none".into(), |e| e.status.name().into()),
                ),
                "encryptionroot" => computed(dsl.encryption(id).map_or("-".into(), |e| e.root)),
                "receive_resume_token" => {
                    computed(crate::recv::resume_token(dsl, id).unwrap_or_else(|| "-".into()))
                }
                other if default_of(other).is_some() => dsl.prop(id, other),
                other => {
                    return Err(DsError::Invalid(format!("unknown property '{other}'")));
                }
            };
            out.push(PropValue {
                dataset: name.to_string(),
                property: p,
                value,
                source,
            });
        }
        Ok(out)
    })
}

/// Sets a property on a filesystem.
pub fn set_prop(pool: &Pool, name: &str, prop: &str, value: &str) -> Result<(), DsError> {
    match prop {
        "keylocation" => return crate::crypt::set_keylocation(pool, name, value),
        "encryption" | "keyformat" => {
            return Err(DsError::Invalid(format!(
                "'{prop}' is set when a dataset is created; change a key with `tarn key change`"
            )))
        }
        _ => {}
    }
    let v = validate(prop, value)?;
    with_dir_excl(pool, |dsl, cx| {
        let id = dsl.id_of(name)?;
        // A reservation is room the dataset could still fill: no more than
        // what it uses plus what it may still write.
        if let ("reservation", Ok(want)) = (prop, v.parse::<u64>()) {
            let used = dsl.deflate(dsl.used(id).asize);
            let avail = dsl.available(cx, id);
            if want.saturating_sub(used) > avail {
                return Err(DsError::NoSpace(format!(
                    "cannot reserve {} for '{name}': it uses {} and may write {} more",
                    human_bytes(want),
                    human_bytes(used),
                    human_bytes(avail)
                )));
            }
        }
        let r = dsl
            .recs
            .get_mut(&id)
            .ok_or_else(|| DsError::NotFound(name.to_string()))?;
        if r.is_snapshot() {
            return Err(DsError::Invalid(format!(
                "'{name}' is a snapshot: its properties come from its filesystem"
            )));
        }
        let mut changed = r.clone();
        changed.props.insert(prop.to_string(), v);
        crate::stored::check_record_size(&changed)?;
        *r = changed;
        dsl.dirty_recs.insert(id);
        Ok(())
    })
}

/// Removes a local property value so the inherited one applies.
pub fn inherit(pool: &Pool, name: &str, prop: &str) -> Result<(), DsError> {
    if default_of(prop).is_none() {
        return Err(DsError::Invalid(format!(
            "'{prop}' is not an inheritable property"
        )));
    }
    with_dir_excl(pool, |dsl, _cx| {
        let id = dsl.id_of(name)?;
        if let Some(r) = dsl.recs.get_mut(&id) {
            r.props.remove(prop);
        }
        dsl.dirty_recs.insert(id);
        Ok(())
    })
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

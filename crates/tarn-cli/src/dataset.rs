//! Filesystems and snapshots: `tarn dataset ...`, and the commands `zfs`
//! users expect at the top level (`snapshot`, `rollback`, `clone`,
//! `destroy`, `mount`, `unmount`).

use std::path::Path;

use anyhow::bail;
use clap::Subcommand;
use tarn_api::dataset::{DatasetInfo, DatasetKind, HoldInfo, MountInfo, PropValue};
use tarn_api::method;
use tarn_api::params::{
    CloneParams, DatasetCreateParams, DatasetDestroyParams, DatasetGetParams, DatasetInheritParams,
    DatasetListParams, DatasetRenameParams, DatasetSetParams, HoldParams, HoldsParams, MountParams,
    NameParams, NoParams, RollbackParams, SnapshotParams, UnmountParams,
};

use crate::render;
use crate::session::{absolute, decode, Out, Session};

/// `tarn dataset ...`.
#[derive(Subcommand, Debug)]
pub enum DatasetCommand {
    /// Create a filesystem (`-o PROP=VALUE` sets properties; `-o
    /// encryption=on -o keyformat=passphrase` makes an encryption root and
    /// asks for its passphrase)
    Create {
        /// Create missing parents too
        #[arg(short = 'p', long)]
        parents: bool,
        /// Full name, e.g. tank/home/alice
        name: String,
    },
    /// Destroy a filesystem, a snapshot, or a range `fs@first%last`
    Destroy {
        /// Also destroy descendants and snapshots
        #[arg(short = 'r', long)]
        recursive: bool,
        /// What to destroy
        name: String,
    },
    /// List filesystems and volumes (snapshots with `-t snapshot` or `-t all`)
    List {
        /// Comma-separated: filesystem, volume, snapshot; or all
        #[arg(short = 't', long = "type", default_value = "filesystem,volume")]
        kind: String,
        /// Only these datasets and what is below them
        names: Vec<String>,
    },
    /// Show properties with their source: `tarn dataset get all tank/home`
    Get {
        /// Comma-separated property names, or `all`
        properties: String,
        /// Datasets
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Set a property: `tarn dataset set compression=zstd tank/home`
    Set {
        /// PROP=VALUE
        assignment: String,
        /// Datasets
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Drop a local value so the parent's applies
    Inherit {
        /// Property name
        property: String,
        /// Datasets
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Make a clone independent of its origin snapshot
    Promote {
        /// The clone
        name: String,
    },
    /// Rename (or move) a filesystem with everything below it, or a snapshot
    Rename {
        /// Current name
        name: String,
        /// New name
        new_name: String,
    },
}

pub(crate) fn dataset_command(
    client: &mut Session,
    out: &Out,
    cmd: DatasetCommand,
    props: Vec<(String, String)>,
) -> anyhow::Result<()> {
    match cmd {
        DatasetCommand::Create { parents, name } => {
            let properties = props.into_iter().collect();
            let key = crate::key::new_root_key(&name, &properties)?;
            let params = DatasetCreateParams {
                name,
                properties,
                parents,
                key,
            };
            client.call_quietly(out, method::DATASET_CREATE, &params)?;
        }
        DatasetCommand::Destroy { recursive, name } => {
            client.call_quietly(
                out,
                method::DATASET_DESTROY,
                &DatasetDestroyParams { name, recursive },
            )?;
        }
        DatasetCommand::List { kind, names } => {
            let (mut fs, mut vols, mut snaps) = (false, false, false);
            for k in kind.split(',') {
                match k.trim() {
                    "filesystem" => fs = true,
                    "volume" => vols = true,
                    "snapshot" => snaps = true,
                    "all" => (fs, vols, snaps) = (true, true, true),
                    other => bail!("-t {other}: expected filesystem, volume, snapshot or all"),
                }
            }
            let v = client.call(
                method::DATASET_LIST,
                &DatasetListParams { snapshots: snaps },
            )?;
            let all: Vec<DatasetInfo> = decode(method::DATASET_LIST, v)?;
            let below = |n: &str| {
                names.is_empty()
                    || names.iter().any(|w| {
                        n == w
                            || n.strip_prefix(w.as_str())
                                .is_some_and(|r| r.starts_with('/') || r.starts_with('@'))
                    })
            };
            let shown: Vec<DatasetInfo> = all
                .into_iter()
                .filter(|d| below(&d.name))
                .filter(|d| match d.kind {
                    DatasetKind::Filesystem => fs,
                    DatasetKind::Volume => vols,
                    DatasetKind::Snapshot => snaps,
                })
                .collect();
            let raw = serde_json::to_value(&shown)?;
            out.raw_or(&raw, || render::render_datasets(&shown))?;
        }
        DatasetCommand::Get { properties, names } => {
            let wanted: Vec<String> = if properties == "all" {
                Vec::new()
            } else {
                properties
                    .split(',')
                    .map(|p| p.trim().to_string())
                    .collect()
            };
            let mut all: Vec<PropValue> = Vec::new();
            for name in names {
                let v = client.call(
                    method::DATASET_GET,
                    &DatasetGetParams {
                        name,
                        properties: wanted.clone(),
                    },
                )?;
                let mut got: Vec<PropValue> = decode(method::DATASET_GET, v)?;
                all.append(&mut got);
            }
            let raw = serde_json::to_value(&all)?;
            out.raw_or(&raw, || render::render_props(&all))?;
        }
        DatasetCommand::Set { assignment, names } => {
            let Some((property, value)) = assignment.split_once('=') else {
                bail!("expected PROP=VALUE, e.g. compression=zstd; got {assignment:?}");
            };
            for name in names {
                let params = DatasetSetParams {
                    name,
                    property: property.to_string(),
                    value: value.to_string(),
                };
                client.call_quietly(out, method::DATASET_SET, &params)?;
            }
        }
        DatasetCommand::Inherit { property, names } => {
            for name in names {
                let params = DatasetInheritParams {
                    name,
                    property: property.clone(),
                };
                client.call_quietly(out, method::DATASET_INHERIT, &params)?;
            }
        }
        DatasetCommand::Promote { name } => {
            client.call_quietly(out, method::DATASET_PROMOTE, &NameParams { name })?;
        }
        DatasetCommand::Rename { name, new_name } => {
            client.call_quietly(
                out,
                method::DATASET_RENAME,
                &DatasetRenameParams { name, new_name },
            )?;
        }
    }
    Ok(())
}

/// `tarn snapshot [-r] FS@NAME...`: takes the snapshots in one txg.
pub(crate) fn snapshot(
    client: &mut Session,
    out: &Out,
    names: Vec<String>,
    recursive: bool,
) -> anyhow::Result<()> {
    client.call_quietly(
        out,
        method::DATASET_SNAPSHOT,
        &SnapshotParams { names, recursive },
    )
}

/// `tarn hold [-r] TAG FS@NAME...` (`put`) and `tarn release [-r] TAG
/// FS@NAME...`.
pub(crate) fn hold(
    client: &mut Session,
    out: &Out,
    put: bool,
    tag: String,
    snapshots: Vec<String>,
    recursive: bool,
) -> anyhow::Result<()> {
    let m = if put {
        method::DATASET_HOLD
    } else {
        method::DATASET_RELEASE
    };
    let params = HoldParams {
        tag,
        snapshots,
        recursive,
    };
    client.call_quietly(out, m, &params)
}

/// `tarn holds [-r] FS@NAME...`: a table of snapshot and tag.
pub(crate) fn holds(
    client: &mut Session,
    out: &Out,
    snapshots: Vec<String>,
    recursive: bool,
) -> anyhow::Result<()> {
    let v = client.call(
        method::DATASET_HOLDS,
        &HoldsParams {
            snapshots,
            recursive,
        },
    )?;
    let list: Vec<HoldInfo> = decode(method::DATASET_HOLDS, v.clone())?;
    out.raw_or(&v, || {
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|h| vec![h.snapshot.clone(), h.tag.clone()])
            .collect();
        render::table(&["NAME", "TAG"], &rows, &[0, 1])
    })
}

/// `tarn rollback [-r] FS@NAME`.
pub(crate) fn rollback(
    client: &mut Session,
    out: &Out,
    snapshot: String,
    recursive: bool,
) -> anyhow::Result<()> {
    let params = RollbackParams {
        snapshot,
        destroy_newer: recursive,
    };
    client.call_quietly(out, method::DATASET_ROLLBACK, &params)
}

/// `tarn clone SNAPSHOT NAME`, with the `-o PROP=VALUE` properties.
pub(crate) fn clone(
    client: &mut Session,
    out: &Out,
    snapshot: String,
    name: String,
    props: Vec<(String, String)>,
) -> anyhow::Result<()> {
    let params = CloneParams {
        snapshot,
        name,
        properties: props.into_iter().collect(),
    };
    client.call_quietly(out, method::DATASET_CLONE, &params)
}

/// `tarn destroy [-r] NAME`.
pub(crate) fn destroy(
    client: &mut Session,
    out: &Out,
    name: String,
    recursive: bool,
) -> anyhow::Result<()> {
    client.call_quietly(
        out,
        method::DATASET_DESTROY,
        &DatasetDestroyParams { name, recursive },
    )
}

/// `tarn mount`: lists the mounts without a name, else mounts one dataset.
pub(crate) fn mount(
    client: &mut Session,
    out: &Out,
    name: Option<String>,
    mountpoint: Option<&Path>,
    allow_other: bool,
    read_only: bool,
) -> anyhow::Result<()> {
    match name {
        None => {
            let v = client.call(method::DATASET_MOUNTS, &NoParams {})?;
            let mounts: Vec<MountInfo> = decode(method::DATASET_MOUNTS, v.clone())?;
            out.raw_or(&v, || render::render_mounts(&mounts))
        }
        Some(name) => {
            let params = MountParams {
                name,
                mountpoint: mountpoint.map(absolute).transpose()?,
                allow_other,
                read_only,
            };
            client.call_quietly(out, method::DATASET_MOUNT, &params)
        }
    }
}

/// `tarn unmount NAME|DIR`.
pub(crate) fn unmount(client: &mut Session, out: &Out, name: String) -> anyhow::Result<()> {
    // A relative directory means one below the current directory.
    let target = if name.starts_with('.') || name.contains("/.") {
        absolute(Path::new(&name))?
    } else {
        name
    };
    client.call_quietly(
        out,
        method::DATASET_UNMOUNT,
        &UnmountParams { name: target },
    )
}

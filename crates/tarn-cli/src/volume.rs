//! Block volumes: `tarn volume create|resize|list`, ZFS's `zfs create -V`
//! and `zfs set volsize=`.

use anyhow::bail;
use clap::Subcommand;
use tarn_api::dataset::{DatasetInfo, DatasetKind};
use tarn_api::method;
use tarn_api::params::{DatasetListParams, VolumeCreateParams, VolumeResizeParams};

use crate::render;
use crate::session::{decode, Out, Session};

/// `tarn volume ...`.
#[derive(Subcommand, Debug)]
pub enum VolumeCommand {
    /// Create a volume: `tarn volume create -V 100G tank/vm/disk0`
    /// (`-o PROP=VALUE` sets properties, `-o volblocksize=16K` the block size)
    Create {
        /// Size, e.g. 100G
        #[arg(short = 'V', long = "size", value_name = "SIZE")]
        size: String,
        /// Thin provisioning: do not reserve the size
        #[arg(short = 's', long)]
        sparse: bool,
        /// Block size (power of two, 512 to 1M; default 16K)
        #[arg(short = 'b', long = "blocksize", value_name = "SIZE")]
        block_size: Option<String>,
        /// Create missing parent filesystems too
        #[arg(short = 'p', long)]
        parents: bool,
        /// Full name, e.g. tank/vm/disk0
        name: String,
    },
    /// Change a volume's size (shrinking needs --force: it discards data)
    Resize {
        /// Allow shrinking
        #[arg(long)]
        force: bool,
        /// The volume
        name: String,
        /// New size, e.g. 200G
        size: String,
    },
    /// List volumes with their size and block size
    List,
}

pub(crate) fn volume_command(
    client: &mut Session,
    out: &Out,
    cmd: VolumeCommand,
    props: Vec<(String, String)>,
) -> anyhow::Result<()> {
    match cmd {
        VolumeCommand::Create {
            size,
            sparse,
            block_size,
            parents,
            name,
        } => {
            let mut properties: std::collections::BTreeMap<String, String> =
                props.into_iter().collect();
            let block_size = match (block_size, properties.remove("volblocksize")) {
                (Some(_), Some(_)) => bail!("give the block size once: -b or -o volblocksize"),
                (b, o) => b.or(o),
            };
            let key = crate::key::new_root_key(&name, &properties)?;
            let params = VolumeCreateParams {
                name,
                size,
                block_size,
                sparse,
                properties,
                parents,
                key,
            };
            client.call_quietly(out, method::VOLUME_CREATE, &params)?;
        }
        VolumeCommand::Resize { force, name, size } => {
            let params = VolumeResizeParams { name, size, force };
            client.call_quietly(out, method::VOLUME_RESIZE, &params)?;
        }
        VolumeCommand::List => {
            let v = client.call(
                method::DATASET_LIST,
                &DatasetListParams { snapshots: false },
            )?;
            let all: Vec<DatasetInfo> = decode(method::DATASET_LIST, v)?;
            let vols: Vec<DatasetInfo> = all
                .into_iter()
                .filter(|d| d.kind == DatasetKind::Volume)
                .collect();
            let raw = serde_json::to_value(&vols)?;
            out.raw_or(&raw, || render::render_volumes(&vols))?;
        }
    }
    Ok(())
}

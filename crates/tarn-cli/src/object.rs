//! `tarn object ...`: objects, the files at the top of a pool's root
//! filesystem, copied in and out without a mount, for drills, tests and
//! benchmarks. Data moves through files on the daemon's machine.

use std::path::PathBuf;

use clap::Subcommand;
use tarn_api::method;
use tarn_api::params::{ObjectInfo, ObjectParams, ObjectReadParams, ObjectWriteParams, PoolParams};

use crate::render;
use crate::session::{absolute, decode, Out, Session};

/// `tarn object ...`.
#[derive(Subcommand, Debug)]
pub enum ObjectCommand {
    /// Write a file into an object
    Put {
        /// Pool name
        pool: String,
        /// Object name
        name: String,
        /// File to read (on the daemon's machine)
        file: PathBuf,
        /// Byte offset in the object
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Return only once the data is durable
        #[arg(long)]
        sync: bool,
    },
    /// Read an object into a file
    Get {
        /// Pool name
        pool: String,
        /// Object name
        name: String,
        /// File to write (on the daemon's machine)
        file: PathBuf,
    },
    /// List the objects of a pool
    Ls {
        /// Pool name
        pool: String,
    },
    /// Delete an object
    Rm {
        /// Pool name
        pool: String,
        /// Object name
        name: String,
    },
}

pub(crate) fn object_command(
    client: &mut Session,
    out: &Out,
    cmd: ObjectCommand,
) -> anyhow::Result<()> {
    match cmd {
        ObjectCommand::Put {
            pool,
            name,
            file,
            offset,
            sync,
        } => {
            let params = ObjectWriteParams {
                pool,
                object: name,
                from_path: absolute(&file)?,
                offset,
                sync,
            };
            client.call_quietly(out, method::OBJECT_WRITE, &params)?;
        }
        ObjectCommand::Get { pool, name, file } => {
            let params = ObjectReadParams {
                pool,
                object: name,
                to_path: absolute(&file)?,
            };
            client.call_quietly(out, method::OBJECT_READ, &params)?;
        }
        ObjectCommand::Ls { pool } => {
            let v = client.call(method::OBJECT_LIST, &PoolParams { pool: pool.clone() })?;
            let objects: Vec<ObjectInfo> = decode(method::OBJECT_LIST, v.clone())?;
            out.raw_or(&v, || render::render_objects(&pool, &objects))?;
        }
        ObjectCommand::Rm { pool, name } => {
            client.call_quietly(
                out,
                method::OBJECT_DELETE,
                &ObjectParams { pool, object: name },
            )?;
        }
    }
    Ok(())
}

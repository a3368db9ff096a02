//! Raw objects: a pool-level store of named byte objects, used by drills,
//! tests and benchmarks. Data moves through files on the daemon's machine,
//! never through JSON: `object.write` copies a file into an object,
//! `object.read` an object into a file.

use std::io::{Read, Write};
use std::path::Path;

use tarn_api::params::ObjectInfo;
use tarn_api::ApiError;

use crate::convert::in_pool;
use crate::pools::{next_tmp, Pools};

/// Bytes moved per call between an object and a file.
const COPY_CHUNK_BYTES: usize = 8 << 20;

fn io_error(what: &str, path: &str, e: std::io::Error) -> ApiError {
    ApiError::io(format!("{what} {path}: {e}"))
}

impl Pools {
    /// `object.write`: copies the file at `from_path` into `object` at
    /// `offset`, in chunks; durable before returning when `sync`.
    pub(crate) fn copy_file_into_object(
        &self,
        pool: &str,
        object: &str,
        from_path: &str,
        offset: u64,
        sync: bool,
    ) -> Result<ObjectInfo, ApiError> {
        let p = self.get(pool)?;
        let from = absolute_path(from_path)?;
        // Only regular files: a FIFO or terminal would hold this connection
        // forever, a device is not what anyone means to copy.
        match std::fs::metadata(from) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(ApiError::invalid(format!(
                    "{from_path} is not a regular file"
                )))
            }
            Err(e) => return Err(io_error("cannot open", from_path, e)),
        }
        let mut f = std::fs::File::open(from).map_err(|e| io_error("cannot open", from_path, e))?;
        let mut buf = vec![0u8; COPY_CHUNK_BYTES];
        let mut pos = offset;
        let mut info = None;
        loop {
            let n =
                read_full(&mut f, &mut buf).map_err(|e| io_error("cannot read", from_path, e))?;
            if n == 0 {
                break;
            }
            info = Some(
                p.object_write(object, pos, &buf[..n], false)
                    .map_err(in_pool(pool))?,
            );
            pos += n as u64;
        }
        let info = match info {
            Some(i) => i,
            // An empty file still creates the object.
            None => p
                .object_write(object, offset, &[], false)
                .map_err(in_pool(pool))?,
        };
        let txg = if sync {
            p.sync().map_err(in_pool(pool))?
        } else {
            info.txg
        };
        Ok(ObjectInfo {
            name: info.name,
            size: info.size,
            txg,
        })
    }

    /// `object.read`: copies the whole of `object` into a file at
    /// `to_path`, written under a temporary name and renamed into place.
    pub(crate) fn copy_object_into_file(
        &self,
        pool: &str,
        object: &str,
        to_path: &str,
    ) -> Result<ObjectInfo, ApiError> {
        let p = self.get(pool)?;
        let to = absolute_path(to_path)?;
        if self.is_pool_device(to) {
            return Err(ApiError::invalid(format!(
                "{to_path} is a device of an imported pool"
            )));
        }
        let info = p.object_info(object).map_err(in_pool(pool))?;
        // /dev/null for benchmarks; otherwise a regular file, written under a
        // temporary name and renamed into place only when complete, so an
        // error never leaves the destination destroyed or half written.
        let discard = to == Path::new("/dev/null");
        if !discard {
            if let Ok(m) = std::fs::symlink_metadata(to) {
                if !m.is_file() {
                    return Err(ApiError::invalid(format!(
                        "{to_path} exists and is not a regular file"
                    )));
                }
            }
        }
        let tmp = if discard {
            to.to_path_buf()
        } else {
            let file = to
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            to.with_file_name(format!(
                ".{file}.tarn-{}-{}",
                std::process::id(),
                next_tmp()
            ))
        };
        let result = (|| {
            let mut f = if discard {
                std::fs::OpenOptions::new().write(true).open(&tmp)
            } else {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)
            }
            .map_err(|e| io_error("cannot create", to_path, e))?;
            let mut pos = 0u64;
            while pos < info.size {
                let n = ((info.size - pos) as usize).min(COPY_CHUNK_BYTES);
                let data = p.object_read(object, pos, n).map_err(in_pool(pool))?;
                if data.is_empty() {
                    break;
                }
                f.write_all(&data)
                    .map_err(|e| io_error("cannot write", to_path, e))?;
                pos += data.len() as u64;
            }
            if !discard {
                f.sync_all()
                    .map_err(|e| io_error("cannot write", to_path, e))?;
                std::fs::rename(&tmp, to).map_err(|e| io_error("cannot write", to_path, e))?;
            }
            Ok(())
        })();
        if result.is_err() && !discard {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        Ok(ObjectInfo {
            name: info.name,
            size: info.size,
            txg: info.txg,
        })
    }
}

/// Reads until `buf` is full or the file ends.
fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Paths come from clients: only absolute ones, so nothing depends on the
/// daemon's working directory.
pub(crate) fn absolute_path(p: &str) -> Result<&Path, ApiError> {
    let path = Path::new(p);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(ApiError::invalid(format!("{p:?} is not an absolute path")))
    }
}

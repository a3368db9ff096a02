//! Objects: files at the top of a pool's root filesystem, copied in and
//! out without a mount (for scripts, drills and benchmarks). Data moves
//! through files on the daemon's machine, never through JSON:
//! `object.write` copies a file into an object, `object.read` an object
//! into a file. They are ordinary files of the dataset, seen by every
//! front end, with root as owner; `--sync` makes a write durable through
//! the intent log like an `fsync`.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use tarn_api::params::ObjectInfo;
use tarn_api::ApiError;
use tarn_fs::{Cred, FileKind, FsError, ROOT_INO};
use tarn_pool::Pool;

use crate::filesystems::DatasetFs;
use crate::pools::{next_tmp, Pools};

/// Bytes moved per call between an object and a file.
const COPY_CHUNK_BYTES: usize = 8 << 20;

fn io_error(what: &str, path: &str, e: std::io::Error) -> ApiError {
    ApiError::io(format!("{what} {path}: {e}"))
}

/// An object's name is one file name at the top of the filesystem.
fn check_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty()
        || name.len() > 255
        || name.contains('/')
        || name.contains('\0')
        || name == "."
        || name == ".."
        || name == ".snapshot"
    {
        return Err(ApiError::invalid(format!(
            "invalid object name {name:?}: one file name of 1-255 bytes, without '/'"
        )));
    }
    Ok(())
}

/// An error of the filesystem about object `name` of `pool`.
fn fs_error(pool: &str, name: &str, e: FsError) -> ApiError {
    let msg = format!("pool '{pool}', object {name}: {}", e.message());
    match e.errno() {
        libc::ENOENT => ApiError::not_found(format!("no object '{name}' in pool '{pool}'")),
        libc::ENOSPC | libc::EDQUOT => ApiError::io(msg),
        libc::EIO => ApiError::damaged(msg),
        libc::EINVAL | libc::EISDIR | libc::ENAMETOOLONG => ApiError::invalid(msg),
        _ => ApiError::io(msg),
    }
}

impl Pools {
    /// The pool and the filesystem of its root dataset.
    fn object_fs(&self, pool: &str) -> Result<(Arc<Pool>, Arc<DatasetFs>), ApiError> {
        let p = self.get(pool)?;
        let fs = self.fss.get(&p, pool)?;
        Ok((p, fs))
    }

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
        check_name(object)?;
        let (p, fs) = self.object_fs(pool)?;
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
        let root = Cred::root();
        let err = |e| fs_error(pool, object, e);
        let a = fs
            .create(
                ROOT_INO,
                object.as_bytes(),
                0o644,
                0o022,
                libc::O_CREAT,
                &root,
            )
            .map_err(err)?;
        let ino = a.ino;
        let result = (|| {
            let mut buf = vec![0u8; COPY_CHUNK_BYTES];
            let mut pos = offset;
            loop {
                let n = read_full(&mut f, &mut buf)
                    .map_err(|e| io_error("cannot read", from_path, e))?;
                if n == 0 {
                    break;
                }
                fs.write(ino, pos, &buf[..n], false, &root).map_err(err)?;
                pos += n as u64;
            }
            if sync {
                fs.fsync(ino).map_err(err)?;
            }
            fs.getattr(ino).map_err(err)
        })();
        let released = fs.release(ino).map_err(err);
        let a = result?;
        released?;
        Ok(ObjectInfo {
            name: object.to_string(),
            size: a.size,
            txg: p.txg(),
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
        check_name(object)?;
        let (p, fs) = self.object_fs(pool)?;
        let to = absolute_path(to_path)?;
        if self.is_pool_device(to) {
            return Err(ApiError::invalid(format!(
                "{to_path} is a device of an imported pool"
            )));
        }
        let root = Cred::root();
        let err = |e| fs_error(pool, object, e);
        let a = fs.lookup(ROOT_INO, object.as_bytes(), &root).map_err(err)?;
        if a.kind != FileKind::Regular {
            return Err(ApiError::invalid(format!(
                "object {object} of pool '{pool}' is not a regular file"
            )));
        }
        let size = a.size;
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
            while pos < size {
                let n = ((size - pos) as usize).min(COPY_CHUNK_BYTES) as u32;
                let data = fs
                    .read(a.ino, pos, n)
                    .map_err(|e| fs_error(pool, &format!("{object} at offset {pos}"), e))?;
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
            name: object.to_string(),
            size,
            txg: p.txg(),
        })
    }

    /// `object.list`: the regular files at the top of the pool's root
    /// filesystem.
    pub(crate) fn list_objects(&self, pool: &str) -> Result<Vec<ObjectInfo>, ApiError> {
        let (p, fs) = self.object_fs(pool)?;
        let err = |e| fs_error(pool, "listing", e);
        let txg = p.txg();
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let page = fs.readdirplus(ROOT_INO, cookie, 1024).map_err(err)?;
            let Some(last) = page.last() else { break };
            cookie = last.0.cookie;
            for (e, a) in page {
                if a.kind == FileKind::Regular {
                    out.push(ObjectInfo {
                        name: String::from_utf8_lossy(&e.name).into_owned(),
                        size: a.size,
                        txg,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// `object.delete`: removes the file.
    pub(crate) fn delete_object(&self, pool: &str, object: &str) -> Result<(), ApiError> {
        check_name(object)?;
        let (_, fs) = self.object_fs(pool)?;
        fs.unlink(ROOT_INO, object.as_bytes(), &Cred::root())
            .map_err(|e| fs_error(pool, object, e))
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

//! `dav-server`'s filesystem traits over a [`FsApi`], by path.
//!
//! Paths arrive decoded and normalized by dav-server (`..` resolved or
//! refused above the share, `%2F` and NUL inside a segment refused). We
//! still refuse `.`/`..`/NUL/`/` in any component ourselves and only ever
//! walk *down* from the share's root inode with `lookup`, so no path can
//! name an inode outside the share. Symlinks are never followed.
//!
//! Every `FsApi` call runs on tokio's blocking pool (`spawn_blocking`),
//! whose size the server bounds; no call runs on an executor thread.
//!
//! This module is the filesystem by path: walking a path, the namespace
//! operations, COPY, dead properties, metadata and listings. An open
//! file, with its read-ahead parts and the gathering of an upload, is
//! [`file`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dav_server::davpath::DavPath;
use dav_server::fs::{
    DavDirEntry, DavFile, DavMetaData, DavProp, FsError, FsFuture, FsResult, FsStream,
    GuardedFileSystem, OpenOptions, ReadDirMeta,
};
use futures_util::future::{self, FutureExt};
use futures_util::stream;
use http::StatusCode;
use tarn_fs::{Attr, Cred, FileKind, SetAttr, TimeSet, Timestamp, R_OK};

use crate::api::FsApi;
use crate::props;

mod file;

use file::TarnFile;

/// Largest piece of file data moved in one `Fs` call (reads, writes, COPY).
pub const IO_CHUNK: usize = 1 << 20;
/// Directory entries fetched per `readdirplus` call.
const DIR_PAGE: usize = 256;

/// Per-request identity handed to the filesystem by the server.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub cred: Cred,
    /// False for read-only principals and read-only shares.
    pub can_write: bool,
    /// A COPY or MOVE that may overwrite a file: its destination is set
    /// aside instead of deleted (see [`Replace`]).
    pub replace: Option<Arc<Replace>>,
}

/// A COPY or MOVE of a file onto an existing file. The library deletes
/// the destination before it copies or moves onto it, so a copy that
/// fails part way (the pool or a quota full) would lose the old file for
/// nothing. Instead, the delete renames the destination to a hidden name
/// beside it (`.tarn-overwritten-…`); when the request is answered,
/// [`Replace::finish`] removes it if the copy or move succeeded and puts
/// it back otherwise. A crash in between leaves the old file under the
/// hidden name: kept, never lost. Directories are deleted as before
/// (setting a tree aside would need only the right to rename it, not to
/// delete what is in it).
#[derive(Debug)]
pub(crate) struct Replace {
    /// The source and the destination, by components under the share.
    src: Vec<Vec<u8>>,
    dest: Vec<Vec<u8>>,
    aside: std::sync::Mutex<Option<Aside>>,
}

/// Where a destination was set aside: its directory, hidden name and name.
#[derive(Debug)]
struct Aside {
    dir: u64,
    hidden: Vec<u8>,
    name: Vec<u8>,
}

impl Replace {
    /// For a COPY or MOVE from `src` to `dest` (components under the share).
    pub(crate) fn new(src: Vec<Vec<u8>>, dest: Vec<Vec<u8>>) -> Arc<Replace> {
        Arc::new(Replace {
            src,
            dest,
            aside: std::sync::Mutex::new(None),
        })
    }

    fn aside(&self) -> std::sync::MutexGuard<'_, Option<Aside>> {
        self.aside.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the destination file `path` aside instead of deleting it, when
    /// `path` is this request's destination and the source is a file too;
    /// false when it is not (the caller deletes as usual).
    fn set_aside(&self, inner: &Inner, path: &DavPath, cred: &Cred) -> FsResult<bool> {
        if components(path)? != self.dest || self.aside().is_some() {
            return Ok(false);
        }
        if inner.walk(&self.src, cred)?.kind != FileKind::Regular {
            return Ok(false);
        }
        let (dir, name) = inner.parent(path, cred)?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let hidden = format!(".tarn-overwritten-{:x}-{t:x}-{n:x}", std::process::id()).into_bytes();
        inner
            .fs
            .rename(dir, &name, dir, &hidden, tarn_fs::RENAME_NOREPLACE, cred)
            .map_err(map_err)?;
        *self.aside() = Some(Aside { dir, hidden, name });
        Ok(true)
    }

    /// Ends the request: the destination set aside is removed if the copy
    /// or move succeeded (`ok`), and put back otherwise, over whatever
    /// part of a copy was made. Whatever fails here leaves the old file
    /// under its hidden name, and says so in the log.
    pub(crate) fn finish(&self, fs: &dyn FsApi, cred: &Cred, ok: bool) {
        let Some(a) = self.aside().take() else {
            return;
        };
        let shown = String::from_utf8_lossy(&a.hidden).into_owned();
        if ok {
            if let Err(e) = fs.unlink(a.dir, &a.hidden, cred) {
                log::warn!("tarn-webdav: cannot remove the replaced file {shown}: {e}");
            }
            return;
        }
        if fs.lookup(a.dir, &a.name, cred).is_ok() {
            if let Err(e) = fs.unlink(a.dir, &a.name, cred) {
                log::warn!(
                    "tarn-webdav: a failed copy left its part in place; the old file is kept as {shown}: {e}"
                );
                return;
            }
        }
        if let Err(e) = fs.rename(
            a.dir,
            &a.hidden,
            a.dir,
            &a.name,
            tarn_fs::RENAME_NOREPLACE,
            cred,
        ) {
            log::warn!("tarn-webdav: cannot put the old file back; it is kept as {shown}: {e}");
        }
    }
}

/// Maps an errno from tarn-fs to the dav-server error (and so to the HTTP
/// status dav-server answers with).
pub(crate) fn map_err(e: tarn_fs::FsError) -> FsError {
    match e.errno() {
        libc::ENOENT | libc::ENOTDIR | libc::ENODATA | libc::ESTALE => FsError::NotFound,
        libc::EEXIST | libc::ENOTEMPTY => FsError::Exists,
        libc::EACCES | libc::EPERM | libc::EROFS | libc::EISDIR | libc::EINVAL | libc::EBUSY => {
            FsError::Forbidden
        }
        libc::ENOSPC | libc::EDQUOT | libc::EMLINK => FsError::InsufficientStorage,
        libc::EFBIG | libc::E2BIG => FsError::TooLarge,
        libc::ENAMETOOLONG => FsError::PathTooLong,
        libc::ELOOP => FsError::LoopDetected,
        libc::EXDEV => FsError::IsRemote,
        libc::EOPNOTSUPP | libc::ENOSYS => FsError::NotImplemented,
        _ => {
            log::warn!("tarn-webdav: filesystem error: {e}");
            FsError::GeneralFailure
        }
    }
}

/// Runs a blocking filesystem call on the blocking pool.
async fn blocking<T, F>(f: F) -> FsResult<T>
where
    F: FnOnce() -> FsResult<T> + Send + 'static,
    T: Send + 'static,
{
    let call = move || crate::panics::catch("a filesystem call", std::panic::AssertUnwindSafe(f));
    match tokio::task::spawn_blocking(call).await {
        Ok(Some(r)) => r,
        // Logged by the catcher.
        Ok(None) => Err(FsError::GeneralFailure),
        Err(e) => {
            log::warn!("tarn-webdav: blocking task failed: {e}");
            Err(FsError::GeneralFailure)
        }
    }
}

/// The path components below the share root; refuses anything that could
/// step out of it or that no directory entry can hold.
fn components(path: &DavPath) -> FsResult<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for c in path.as_bytes().split(|&b| b == b'/') {
        match c {
            b"" => continue,
            b"." | b".." => return Err(FsError::Forbidden),
            c if c.contains(&0) => return Err(FsError::Forbidden),
            c => out.push(c.to_vec()),
        }
    }
    Ok(out)
}

/// One share's filesystem as dav-server sees it.
#[derive(Clone)]
pub(crate) struct TarnDavFs {
    inner: Arc<Inner>,
}

struct Inner {
    fs: Arc<dyn FsApi>,
    root: u64,
    umask: u32,
}

impl TarnDavFs {
    pub(crate) fn new(fs: Arc<dyn FsApi>, root: u64, umask: u32) -> TarnDavFs {
        TarnDavFs {
            inner: Arc::new(Inner { fs, root, umask }),
        }
    }
}

impl Inner {
    /// Walks `comps` down from the share root.
    fn walk(&self, comps: &[Vec<u8>], cred: &Cred) -> FsResult<Attr> {
        let mut cur = self.fs.getattr(self.root).map_err(map_err)?;
        for c in comps {
            if cur.kind != FileKind::Directory {
                return Err(FsError::NotFound);
            }
            cur = self.fs.lookup(cur.ino, c, cred).map_err(map_err)?;
        }
        Ok(cur)
    }

    fn resolve(&self, path: &DavPath, cred: &Cred) -> FsResult<Attr> {
        self.walk(&components(path)?, cred)
    }

    /// The parent directory's inode and the last component. The share root
    /// itself has no parent: Forbidden.
    fn parent(&self, path: &DavPath, cred: &Cred) -> FsResult<(u64, Vec<u8>)> {
        let mut comps = components(path)?;
        let name = comps.pop().ok_or(FsError::Forbidden)?;
        let dir = self.walk(&comps, cred)?;
        if dir.kind != FileKind::Directory {
            return Err(FsError::NotFound);
        }
        Ok((dir.ino, name))
    }

    fn copy_file(&self, from: &DavPath, to: &DavPath, cred: &Cred) -> FsResult<()> {
        let src = self.resolve(from, cred)?;
        if src.kind != FileKind::Regular {
            return Err(FsError::Forbidden);
        }
        let (dparent, dname) = self.parent(to, cred)?;
        let fs = &self.fs;
        fs.open(src.ino, libc::O_RDONLY, cred).map_err(map_err)?;
        let dst = match fs.create(
            dparent,
            &dname,
            0o666,
            self.umask,
            libc::O_WRONLY | libc::O_TRUNC,
            cred,
        ) {
            Ok(a) => a,
            Err(e) => {
                let _ = fs.release(src.ino);
                return Err(map_err(e));
            }
        };
        let copy = || -> FsResult<()> {
            let mut off = 0u64;
            loop {
                // The source's cached blocks go straight into the copy's
                // records: one copy of the bytes, not two.
                let data = fs
                    .read_data(src.ino, off, IO_CHUNK as u32)
                    .map_err(map_err)?;
                if data.is_empty() {
                    break;
                }
                let iov: Vec<&[u8]> = data.slices().collect();
                fs.write_iov(dst.ino, off, &iov, false, cred)
                    .map_err(map_err)?;
                off += data.len() as u64;
            }
            // Dead properties travel with the copy (RFC 4918 §9.8.2).
            for name in fs.listxattr(src.ino, cred).map_err(map_err)? {
                if name.starts_with(props::XATTR_PREFIX) {
                    if let Ok(v) = fs.getxattr(src.ino, &name, cred) {
                        fs.setxattr(dst.ino, &name, &v, 0, cred).map_err(map_err)?;
                    }
                }
            }
            Ok(())
        };
        let r = copy();
        let _ = fs.release(src.ino);
        let _ = fs.release(dst.ino);
        r
    }

    fn patch_props(
        &self,
        path: &DavPath,
        patch: Vec<(bool, DavProp)>,
        cred: &Cred,
    ) -> FsResult<Vec<(StatusCode, DavProp)>> {
        let a = self.resolve(path, cred)?;
        let fs = &self.fs;
        let bare = |p: &DavProp| DavProp {
            name: p.name.clone(),
            prefix: p.prefix.clone(),
            namespace: p.namespace.clone(),
            xml: None,
        };
        // Validate first: a value too big for an xattr fails the whole
        // PROPPATCH before anything changes.
        let too_big: Vec<bool> = patch
            .iter()
            .map(|(set, p)| *set && props::encode(p).len() > tarn_fs::XATTR_SIZE_MAX)
            .collect();
        if too_big.iter().any(|&b| b) {
            return Ok(patch
                .iter()
                .zip(too_big)
                .map(|((_, p), big)| {
                    let s = if big {
                        StatusCode::INSUFFICIENT_STORAGE
                    } else {
                        StatusCode::FAILED_DEPENDENCY
                    };
                    (s, bare(p))
                })
                .collect());
        }
        // Apply in order, remembering old values so a failure halfway can
        // put everything back (PROPPATCH is all-or-nothing).
        let mut undo: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut failed: Option<(usize, StatusCode)> = None;
        for (i, (set, p)) in patch.iter().enumerate() {
            let name = props::xattr_name(p.namespace.as_deref(), &p.name);
            let old = match fs.getxattr(a.ino, &name, cred) {
                Ok(v) => Some(v),
                Err(e) if e.errno() == libc::ENODATA => None,
                Err(e) => {
                    failed = Some((i, status_of(map_err(e))));
                    break;
                }
            };
            let r = if *set {
                fs.setxattr(a.ino, &name, &props::encode(p), 0, cred)
            } else if old.is_some() {
                fs.removexattr(a.ino, &name, cred)
            } else {
                Ok(())
            };
            if let Err(e) = r {
                failed = Some((i, status_of(map_err(e))));
                break;
            }
            undo.push((name, old));
        }
        if let Some((at, status)) = failed {
            for (name, old) in undo.into_iter().rev() {
                let _ = match old {
                    Some(v) => fs.setxattr(a.ino, &name, &v, 0, cred),
                    None => fs.removexattr(a.ino, &name, cred),
                };
            }
            return Ok(patch
                .iter()
                .enumerate()
                .map(|(i, (_, p))| {
                    let s = if i == at {
                        status
                    } else {
                        StatusCode::FAILED_DEPENDENCY
                    };
                    (s, bare(p))
                })
                .collect());
        }
        Ok(patch
            .iter()
            .map(|(_, p)| (StatusCode::OK, bare(p)))
            .collect())
    }

    fn get_props(&self, path: &DavPath, content: bool, cred: &Cred) -> FsResult<Vec<DavProp>> {
        let a = self.resolve(path, cred)?;
        let mut out = Vec::new();
        let names = match self.fs.listxattr(a.ino, cred) {
            Ok(n) => n,
            // Inodes that cannot hold user xattrs simply have no properties.
            Err(e) if e.errno() == libc::EOPNOTSUPP => return Ok(out),
            Err(e) => return Err(map_err(e)),
        };
        for name in names {
            if !name.starts_with(props::XATTR_PREFIX) {
                continue;
            }
            let v = match self.fs.getxattr(a.ino, &name, cred) {
                Ok(v) => v,
                Err(e) if e.errno() == libc::ENODATA => continue,
                Err(e) => return Err(map_err(e)),
            };
            if let Some(mut p) = props::decode(&v) {
                if !content {
                    p.xml = None;
                }
                out.push(p);
            }
        }
        Ok(out)
    }

    fn get_prop(&self, path: &DavPath, prop: &DavProp, cred: &Cred) -> FsResult<Vec<u8>> {
        let a = self.resolve(path, cred)?;
        let name = props::xattr_name(prop.namespace.as_deref(), &prop.name);
        let v = self.fs.getxattr(a.ino, &name, cred).map_err(map_err)?;
        let p = props::decode(&v).ok_or(FsError::NotFound)?;
        if p.name != prop.name || p.namespace != prop.namespace {
            return Err(FsError::NotFound);
        }
        p.xml.ok_or(FsError::NotFound)
    }
}

fn status_of(e: FsError) -> StatusCode {
    match e {
        FsError::NotFound => StatusCode::NOT_FOUND,
        FsError::Forbidden => StatusCode::FORBIDDEN,
        FsError::InsufficientStorage | FsError::TooLarge => StatusCode::INSUFFICIENT_STORAGE,
        FsError::Exists => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn ts_to_system(t: Timestamp) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
            .and_then(|s| s.checked_add(Duration::from_nanos(u64::from(t.nsec))))
            .unwrap_or(UNIX_EPOCH)
    }
}

/// Latest time an HTTP date can say: 9999-12-31T23:59:59Z.
const HTTP_TIME_MAX: u64 = 253_402_300_799;

/// A time as WebDAV shows it (`Last-Modified`, `getlastmodified`,
/// `creationdate`): clamped to 1970-01-01 ..= 9999-12-31, the years an
/// HTTP date can say. The WebDAV library panics formatting a time outside
/// them, and SMB and FUSE clients set such times (Windows dates go back
/// to 1601), so a file dated so would fail every GET and cut off its
/// folder's listings. The file keeps its time; only the display is
/// clamped.
fn http_time(t: Timestamp) -> SystemTime {
    let max = UNIX_EPOCH + Duration::from_secs(HTTP_TIME_MAX);
    if t.sec < 0 {
        UNIX_EPOCH
    } else if t.sec as u64 >= HTTP_TIME_MAX {
        max
    } else {
        ts_to_system(t).min(max)
    }
}

fn system_to_ts(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp::new(
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            // sec is negative; nsec must stay in 0..1e9.
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() == 0 {
                Timestamp::new(-secs, 0)
            } else {
                Timestamp::new(-secs - 1, 1_000_000_000 - d.subsec_nanos())
            }
        }
    }
}

/// Metadata of one inode.
#[derive(Clone, Debug)]
pub(crate) struct Meta(pub Attr);

impl DavMetaData for Meta {
    fn len(&self) -> u64 {
        if self.0.kind == FileKind::Directory {
            0
        } else {
            self.0.size
        }
    }
    fn modified(&self) -> FsResult<SystemTime> {
        Ok(http_time(self.0.mtime))
    }
    fn is_dir(&self) -> bool {
        self.0.kind == FileKind::Directory
    }
    fn is_symlink(&self) -> bool {
        self.0.kind == FileKind::Symlink
    }
    fn etag(&self) -> Option<String> {
        // Changes whenever the content may have: a new inode (or a reused
        // name), a write (mtime), a truncate (size), a rewrite that set
        // the old mtime back (ctime).
        let a = &self.0;
        Some(format!(
            "{:x}-{:x}-{:x}-{:x}-{:x}",
            a.ino,
            a.generation,
            a.mtime.as_nanos(),
            a.ctime.as_nanos(),
            a.size
        ))
    }
    fn accessed(&self) -> FsResult<SystemTime> {
        Ok(http_time(self.0.atime))
    }
    fn created(&self) -> FsResult<SystemTime> {
        Ok(http_time(self.0.crtime))
    }
    fn status_changed(&self) -> FsResult<SystemTime> {
        Ok(http_time(self.0.ctime))
    }
    fn executable(&self) -> FsResult<bool> {
        Ok(self.0.kind == FileKind::Regular && self.0.mode & 0o100 != 0)
    }
}

struct Entry {
    name: Vec<u8>,
    meta: Meta,
}

impl DavDirEntry for Entry {
    fn name(&self) -> Vec<u8> {
        self.name.clone()
    }
    fn metadata(&self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        let m: Box<dyn DavMetaData> = Box::new(self.meta.clone());
        future::ready(Ok(m)).boxed()
    }
}

fn need_write(ctx: &Ctx) -> FsResult<()> {
    if ctx.can_write {
        Ok(())
    } else {
        Err(FsError::Forbidden)
    }
}

impl GuardedFileSystem<Ctx> for TarnDavFs {
    fn open<'a>(
        &'a self,
        path: &'a DavPath,
        options: OpenOptions,
        ctx: &'a Ctx,
    ) -> FsFuture<'a, Box<dyn DavFile>> {
        async move {
            let writes = options.write || options.append || options.truncate || options.create;
            if writes {
                need_write(ctx)?;
            }
            let inner = self.inner.clone();
            let path = path.clone();
            let cred = ctx.cred.clone();
            let file = blocking(move || {
                let mut flags = match (options.read, writes) {
                    (_, false) => libc::O_RDONLY,
                    (false, true) => libc::O_WRONLY,
                    (true, true) => libc::O_RDWR,
                };
                if options.truncate {
                    flags |= libc::O_TRUNC;
                }
                let a = if options.create || options.create_new {
                    if options.create_new {
                        flags |= libc::O_EXCL;
                    }
                    let (parent, name) = inner.parent(&path, &cred)?;
                    inner
                        .fs
                        .create(parent, &name, 0o666, inner.umask, flags, &cred)
                        .map_err(map_err)?
                } else {
                    let a = inner.resolve(&path, &cred)?;
                    if a.kind == FileKind::Directory {
                        return Err(FsError::Forbidden);
                    }
                    inner.fs.open(a.ino, flags, &cred).map_err(map_err)?
                };
                let f = TarnFile::new(
                    inner.fs.clone(),
                    a.ino,
                    cred.clone(),
                    options.append,
                    writes,
                );
                if a.kind != FileKind::Regular {
                    // Opened (and counted) but not a file we serve: dropping
                    // `f` releases it.
                    return Err(FsError::Forbidden);
                }
                Ok(f)
            })
            .await?;
            let f: Box<dyn DavFile> = Box::new(file);
            Ok(f)
        }
        .boxed()
    }

    fn read_dir<'a>(
        &'a self,
        path: &'a DavPath,
        _meta: ReadDirMeta,
        ctx: &'a Ctx,
    ) -> FsFuture<'a, FsStream<Box<dyn DavDirEntry>>> {
        async move {
            let inner = self.inner.clone();
            let (p, cred) = (path.clone(), ctx.cred.clone());
            let dir = blocking(move || {
                let a = inner.resolve(&p, &cred)?;
                if a.kind != FileKind::Directory {
                    return Err(FsError::Forbidden);
                }
                inner.fs.access(a.ino, R_OK, &cred).map_err(map_err)?;
                Ok(a.ino)
            })
            .await?;
            struct St {
                fs: Arc<dyn FsApi>,
                ino: u64,
                cookie: u64,
                page: VecDeque<(Vec<u8>, Attr)>,
                done: bool,
            }
            let st = St {
                fs: self.inner.fs.clone(),
                ino: dir,
                cookie: 0,
                page: VecDeque::new(),
                done: false,
            };
            let s = stream::unfold(st, |mut st| async move {
                loop {
                    if let Some((name, attr)) = st.page.pop_front() {
                        let e: Box<dyn DavDirEntry> = Box::new(Entry {
                            name,
                            meta: Meta(attr),
                        });
                        return Some((Ok(e), st));
                    }
                    if st.done {
                        return None;
                    }
                    let (fs, ino, cookie) = (st.fs.clone(), st.ino, st.cookie);
                    match blocking(move || fs.readdirplus(ino, cookie, DIR_PAGE).map_err(map_err))
                        .await
                    {
                        Ok(list) => {
                            if list.is_empty() {
                                st.done = true;
                            }
                            for (e, a) in list {
                                st.cookie = e.cookie;
                                if e.name != b"." && e.name != b".." {
                                    st.page.push_back((e.name, a));
                                }
                            }
                        }
                        Err(e) => {
                            st.done = true;
                            return Some((Err(e), st));
                        }
                    }
                }
            });
            let s: FsStream<Box<dyn DavDirEntry>> = Box::pin(s);
            Ok(s)
        }
        .boxed()
    }

    fn metadata<'a>(
        &'a self,
        path: &'a DavPath,
        ctx: &'a Ctx,
    ) -> FsFuture<'a, Box<dyn DavMetaData>> {
        async move {
            let inner = self.inner.clone();
            let (p, cred) = (path.clone(), ctx.cred.clone());
            let a = blocking(move || inner.resolve(&p, &cred)).await?;
            let m: Box<dyn DavMetaData> = Box::new(Meta(a));
            Ok(m)
        }
        .boxed()
    }

    fn create_dir<'a>(&'a self, path: &'a DavPath, ctx: &'a Ctx) -> FsFuture<'a, ()> {
        async move {
            need_write(ctx)?;
            let inner = self.inner.clone();
            let (p, cred) = (path.clone(), ctx.cred.clone());
            blocking(move || {
                let (parent, name) = inner.parent(&p, &cred)?;
                inner
                    .fs
                    .mkdir(parent, &name, 0o777, inner.umask, &cred)
                    .map_err(map_err)?;
                Ok(())
            })
            .await
        }
        .boxed()
    }

    fn remove_dir<'a>(&'a self, path: &'a DavPath, ctx: &'a Ctx) -> FsFuture<'a, ()> {
        async move {
            need_write(ctx)?;
            let inner = self.inner.clone();
            let (p, cred) = (path.clone(), ctx.cred.clone());
            blocking(move || {
                let (parent, name) = inner.parent(&p, &cred)?;
                inner.fs.rmdir(parent, &name, &cred).map_err(map_err)
            })
            .await
        }
        .boxed()
    }

    fn remove_file<'a>(&'a self, path: &'a DavPath, ctx: &'a Ctx) -> FsFuture<'a, ()> {
        async move {
            need_write(ctx)?;
            let inner = self.inner.clone();
            let (p, cred) = (path.clone(), ctx.cred.clone());
            let replace = ctx.replace.clone();
            blocking(move || {
                if let Some(r) = replace {
                    if r.set_aside(&inner, &p, &cred)? {
                        return Ok(());
                    }
                }
                let (parent, name) = inner.parent(&p, &cred)?;
                inner.fs.unlink(parent, &name, &cred).map_err(map_err)
            })
            .await
        }
        .boxed()
    }

    fn rename<'a>(&'a self, from: &'a DavPath, to: &'a DavPath, ctx: &'a Ctx) -> FsFuture<'a, ()> {
        async move {
            need_write(ctx)?;
            let inner = self.inner.clone();
            let (f, t, cred) = (from.clone(), to.clone(), ctx.cred.clone());
            blocking(move || {
                let (op, on) = inner.parent(&f, &cred)?;
                let (np, nn) = inner.parent(&t, &cred)?;
                inner.fs.rename(op, &on, np, &nn, 0, &cred).map_err(map_err)
            })
            .await
        }
        .boxed()
    }

    fn copy<'a>(&'a self, from: &'a DavPath, to: &'a DavPath, ctx: &'a Ctx) -> FsFuture<'a, ()> {
        async move {
            need_write(ctx)?;
            let inner = self.inner.clone();
            let (f, t, cred) = (from.clone(), to.clone(), ctx.cred.clone());
            blocking(move || inner.copy_file(&f, &t, &cred)).await
        }
        .boxed()
    }

    fn set_accessed<'a>(
        &'a self,
        path: &'a DavPath,
        tm: SystemTime,
        ctx: &Ctx,
    ) -> FsFuture<'a, ()> {
        let ctx = ctx.clone();
        async move {
            need_write(&ctx)?;
            let inner = self.inner.clone();
            let p = path.clone();
            blocking(move || {
                let a = inner.resolve(&p, &ctx.cred)?;
                let sa = SetAttr {
                    atime: Some(TimeSet::At(system_to_ts(tm))),
                    ..Default::default()
                };
                inner.fs.setattr(a.ino, &sa, &ctx.cred).map_err(map_err)?;
                Ok(())
            })
            .await
        }
        .boxed()
    }

    fn set_modified<'a>(
        &'a self,
        path: &'a DavPath,
        tm: SystemTime,
        ctx: &'a Ctx,
    ) -> FsFuture<'a, ()> {
        async move {
            need_write(ctx)?;
            let inner = self.inner.clone();
            let (p, cred) = (path.clone(), ctx.cred.clone());
            blocking(move || {
                let a = inner.resolve(&p, &cred)?;
                let sa = SetAttr {
                    mtime: Some(TimeSet::At(system_to_ts(tm))),
                    ..Default::default()
                };
                inner.fs.setattr(a.ino, &sa, &cred).map_err(map_err)?;
                Ok(())
            })
            .await
        }
        .boxed()
    }

    fn have_props<'a>(
        &'a self,
        _path: &'a DavPath,
        _ctx: &'a Ctx,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>> {
        future::ready(true).boxed()
    }

    fn patch_props<'a>(
        &'a self,
        path: &'a DavPath,
        patch: Vec<(bool, DavProp)>,
        ctx: &'a Ctx,
    ) -> FsFuture<'a, Vec<(StatusCode, DavProp)>> {
        async move {
            need_write(ctx)?;
            let inner = self.inner.clone();
            let (p, cred) = (path.clone(), ctx.cred.clone());
            blocking(move || inner.patch_props(&p, patch, &cred)).await
        }
        .boxed()
    }

    fn get_props<'a>(
        &'a self,
        path: &'a DavPath,
        do_content: bool,
        ctx: &'a Ctx,
    ) -> FsFuture<'a, Vec<DavProp>> {
        async move {
            let inner = self.inner.clone();
            let (p, cred) = (path.clone(), ctx.cred.clone());
            blocking(move || inner.get_props(&p, do_content, &cred)).await
        }
        .boxed()
    }

    fn get_prop<'a>(
        &'a self,
        path: &'a DavPath,
        prop: DavProp,
        ctx: &'a Ctx,
    ) -> FsFuture<'a, Vec<u8>> {
        async move {
            let inner = self.inner.clone();
            let (p, cred) = (path.clone(), ctx.cred.clone());
            blocking(move || inner.get_prop(&p, &prop, &cred)).await
        }
        .boxed()
    }

    fn get_quota<'a>(&'a self, _ctx: &'a Ctx) -> FsFuture<'a, (u64, Option<u64>)> {
        async move {
            let inner = self.inner.clone();
            blocking(move || {
                let s = inner.fs.statfs(inner.root).map_err(map_err)?;
                let b = u64::from(s.bsize);
                let total = s.blocks.saturating_mul(b);
                let used = s.blocks.saturating_sub(s.bfree).saturating_mul(b);
                Ok((used, Some(total)))
            })
            .await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_times_stay_within_what_http_dates_say() {
        let max = UNIX_EPOCH + Duration::from_secs(HTTP_TIME_MAX);
        assert_eq!(http_time(Timestamp::new(-11_644_473_600, 0)), UNIX_EPOCH);
        assert_eq!(http_time(Timestamp::new(-1, 999_999_999)), UNIX_EPOCH);
        assert_eq!(http_time(Timestamp::new(i64::MAX, 999_999_999)), max);
        assert_eq!(http_time(Timestamp::new(HTTP_TIME_MAX as i64, 5)), max);
        let t = Timestamp::new(1_700_000_000, 123);
        assert_eq!(http_time(t), ts_to_system(t));
    }

    #[test]
    fn times_round_trip() {
        for ts in [
            Timestamp::new(0, 0),
            Timestamp::new(1_700_000_000, 123),
            Timestamp::new(-5, 0),
            Timestamp::new(-5, 250_000_000),
        ] {
            assert_eq!(system_to_ts(ts_to_system(ts)), ts);
        }
    }

    #[test]
    fn components_refuse_escapes() {
        let p = DavPath::new("/a/b/").unwrap();
        assert_eq!(components(&p).unwrap(), vec![b"a".to_vec(), b"b".to_vec()]);
        assert!(DavPath::new("/../x").is_err());
        assert!(DavPath::new("/a%2Fb").is_err());
        assert!(DavPath::new("/a%00b").is_err());
        // `%2e%2e` is `..`: resolved inside, refused above the root.
        assert!(DavPath::new("/%2e%2e/x").is_err());
        assert_eq!(DavPath::new("/a/%2e%2e/b").unwrap().as_bytes(), b"/b");
    }

    #[test]
    fn errno_mapping() {
        let m = |e| map_err(tarn_fs::FsError::new(e, "t"));
        assert_eq!(m(libc::ENOENT), FsError::NotFound);
        assert_eq!(m(libc::EEXIST), FsError::Exists);
        assert_eq!(m(libc::EACCES), FsError::Forbidden);
        assert_eq!(m(libc::EROFS), FsError::Forbidden);
        assert_eq!(m(libc::ENOSPC), FsError::InsufficientStorage);
        assert_eq!(m(libc::EDQUOT), FsError::InsufficientStorage);
        assert_eq!(m(libc::ENAMETOOLONG), FsError::PathTooLong);
        assert_eq!(m(libc::EIO), FsError::GeneralFailure);
    }
}

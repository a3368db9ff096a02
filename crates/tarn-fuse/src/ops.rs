//! The `fuser::Filesystem` implementation: one `Fs` call per request.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tarn_fs::{Attr, Backend, Fs, FsError, Origin, SetAttr, SNAPDIR_INO};

use crate::convert::{absent, errno, file_attr, file_type, time_set};
use crate::creds::CredCache;
use crate::known::Known;
use crate::MountOptions;

/// Directory entries fetched from `Fs` per READDIR request (a reply holds
/// about a page: ~100 short names). Fewer than fit is fine; the kernel
/// asks again from the last cookie.
const READDIR_BATCH: usize = 128;
/// Same for READDIRPLUS, whose entries carry attributes (~150 bytes).
const READDIRPLUS_BATCH: usize = 32;
/// The TTL of what changes without a reported change (`.snapshot`), and
/// the longest entry TTL without `default_permissions`.
const SHORT_TTL: Duration = Duration::from_secs(1);

/// A file handle carries the open(2) flags in its low 32 bits (so the
/// write path needs no table lookup to know about `O_APPEND`) and a
/// sequence number in its high bits (so handles are distinct).
fn make_fh(seq: u32, flags: i32) -> FileHandle {
    FileHandle((u64::from(seq) << 32) | u64::from(flags as u32))
}

#[cfg(test)]
fn fh_flags(fh: FileHandle) -> i32 {
    (fh.0 & 0xffff_ffff) as u32 as i32
}

/// Serves one [`Fs`] to the kernel.
pub(crate) struct TarnFuse<B: Backend> {
    fs: Arc<Fs<B>>,
    /// The mark of this mount's worker threads.
    origin: Origin,
    attr_ttl: Duration,
    entry_ttl: Duration,
    max_write: u32,
    next_fh: AtomicU32,
    creds: CredCache,
    known: Arc<Known>,
    /// Reads refresh atime (not through a read-only mount: reading
    /// through it must not write, though the dataset is writable).
    atime: bool,
    /// `.snapshot` lists snapshots by time (`MountOptions::snapshot_time_names`).
    time_names: bool,
}

impl<B: Backend> TarnFuse<B> {
    pub(crate) fn new(
        fs: Arc<Fs<B>>,
        opts: &MountOptions,
        known: Arc<Known>,
        origin: Origin,
    ) -> Self {
        // Without the kernel's permission checks, a path walk through a
        // cached entry skips `Fs`'s search-permission check: keep that
        // window short.
        let entry_ttl = if opts.default_permissions {
            opts.entry_ttl
        } else {
            opts.entry_ttl.min(SHORT_TTL)
        };
        TarnFuse {
            fs,
            origin,
            attr_ttl: opts.attr_ttl,
            entry_ttl,
            max_write: opts.max_write,
            next_fh: AtomicU32::new(1),
            creds: CredCache::default(),
            known,
            atime: !opts.read_only,
            time_names: opts.snapshot_time_names,
        }
    }

    /// (time name, real name) of every snapshot, for a mount that names
    /// them by time.
    fn time_names(&self) -> Result<Vec<(String, String)>, FsError> {
        Ok(crate::gmt::by_time(&self.fs.snapshot_times()?))
    }

    /// The name to give `Fs` for `name` looked up in `parent`: in a mount
    /// that names snapshots by time, a time name in `.snapshot` becomes the
    /// snapshot's real name, and a real name is not found (each snapshot
    /// has one name there).
    fn real_name(&self, parent: u64, name: &[u8]) -> Result<Vec<u8>, FsError> {
        if !self.time_names || parent != SNAPDIR_INO || name == b"." || name == b".." {
            return Ok(name.to_vec());
        }
        self.time_names()?
            .into_iter()
            .find(|(t, _)| t.as_bytes() == name)
            .map(|(_, real)| real.into_bytes())
            .ok_or_else(|| FsError::new(libc::ENOENT, "no snapshot taken at that time"))
    }

    /// One batch of a directory listing from `offset`, with the names a
    /// mount that names snapshots by time shows. A batch whose every entry
    /// was dropped (snapshots that lost their time name) is not answered
    /// empty, which the kernel would take for the end: the next is fetched.
    fn listing<T>(
        &self,
        ino: u64,
        mut offset: u64,
        fetch: impl Fn(u64) -> Result<Vec<T>, FsError>,
        cookie_of: impl Fn(&T) -> u64,
        name_of: impl Fn(&mut T) -> &mut Vec<u8> + Copy,
    ) -> Result<Vec<T>, FsError> {
        loop {
            let raw = fetch(offset)?;
            let Some(last) = raw.last().map(&cookie_of) else {
                return Ok(raw);
            };
            let shown = self.listed_names(ino, raw, name_of)?;
            if !shown.is_empty() {
                return Ok(shown);
            }
            offset = last;
        }
    }

    /// Renames the entries of a `.snapshot` listing to time names (in a
    /// mount that names snapshots by time), dropping those that lost
    /// their time name to an older snapshot of the same second.
    fn listed_names<T>(
        &self,
        ino: u64,
        entries: Vec<T>,
        name_of: impl Fn(&mut T) -> &mut Vec<u8>,
    ) -> Result<Vec<T>, FsError> {
        if !self.time_names || ino != SNAPDIR_INO {
            return Ok(entries);
        }
        let names = self.time_names()?;
        let mut out = Vec::with_capacity(entries.len());
        for mut e in entries {
            let n = name_of(&mut e);
            if n.as_slice() == b"." || n.as_slice() == b".." {
                out.push(e);
                continue;
            }
            if let Some((t, _)) = names
                .iter()
                .find(|(_, real)| real.as_bytes() == n.as_slice())
            {
                *n = t.clone().into_bytes();
                out.push(e);
            }
        }
        Ok(out)
    }

    fn cred(&self, req: &Request) -> tarn_fs::Cred {
        self.creds.cred(req.uid(), req.gid(), req.pid())
    }

    fn new_fh(&self, flags: i32) -> FileHandle {
        make_fh(self.next_fh.fetch_add(1, Ordering::Relaxed), flags)
    }

    /// The TTLs for an entry `parent` → `ino`: short for the `.snapshot`
    /// directory and the names in it, which change without a transaction
    /// of the live dataset (taking or destroying a snapshot).
    fn ttls(&self, parent: u64, ino: u64) -> (Duration, Duration) {
        if parent == SNAPDIR_INO || ino == SNAPDIR_INO {
            (self.attr_ttl.min(SHORT_TTL), self.entry_ttl.min(SHORT_TTL))
        } else {
            (self.attr_ttl, self.entry_ttl)
        }
    }

    /// Replies with a new entry and counts the kernel's reference.
    fn entry(&self, parent: INodeNo, name: &OsStr, r: Result<Attr, FsError>, reply: ReplyEntry) {
        match r {
            Ok(a) => {
                self.known.add(a.ino, parent.0, name);
                let (attr_ttl, entry_ttl) = self.ttls(parent.0, a.ino);
                reply.entry_with_ttls(
                    &attr_ttl,
                    &entry_ttl,
                    &file_attr(&a),
                    Generation(a.generation),
                );
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn attr(&self, r: Result<Attr, FsError>, reply: ReplyAttr) {
        match r {
            Ok(a) => reply.attr(&self.ttls(0, a.ino).0, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

fn empty(r: Result<(), FsError>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Replies to getxattr/listxattr: size 0 asks for the length only; a
/// buffer that is too small gets ERANGE.
fn xattr_reply(value: &[u8], size: u32, reply: ReplyXattr) {
    let Ok(len) = u32::try_from(value.len()) else {
        return reply.error(Errno::E2BIG);
    };
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

/// Runs one request handler. A panic (a bug in `Fs` or here) must not
/// take a worker thread down: it is caught, the reply that was moved into
/// the handler is dropped during unwinding, and fuser answers a dropped
/// reply with EIO. `Fs` recovers its own poisoned locks.
///
/// The thread is marked as acting for this mount (`origin`) meanwhile, so
/// the changes it makes are not invalidated again (see `invalidate`).
fn guarded(origin: Origin, op: &'static str, f: impl FnOnce()) {
    let _mark = origin.enter();
    if std::panic::catch_unwind(AssertUnwindSafe(f)).is_err() {
        log::error!("tarn-fuse: {op} panicked; the request failed with EIO");
    }
}

/// Asks for `flag` if the kernel offers it (each one on its own, so one
/// missing capability does not cost the others).
fn want(config: &mut KernelConfig, flag: InitFlags) {
    let _ = config.add_capabilities(flag);
}

impl<B: Backend + 'static> Filesystem for TarnFuse<B> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(max) = config.set_max_write(self.max_write) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(1 << 20) {
            let _ = config.set_max_readahead(max);
        }
        want(config, InitFlags::FUSE_BIG_WRITES);
        want(config, InitFlags::FUSE_MAX_PAGES);
        want(config, InitFlags::FUSE_DO_READDIRPLUS);
        want(config, InitFlags::FUSE_READDIRPLUS_AUTO);
        want(config, InitFlags::FUSE_HANDLE_KILLPRIV);
        want(config, InitFlags::FUSE_PARALLEL_DIROPS);
        want(config, InitFlags::FUSE_AUTO_INVAL_DATA);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        guarded(self.origin, "lookup", || {
            let r = self
                .real_name(parent.0, name.as_bytes())
                .and_then(|n| self.fs.lookup(parent.0, &n, &self.cred(req)));
            match r {
                // A missing name is cached too (a negative entry): whoever
                // adds it reports the entry, which invalidates it. Names
                // in `.snapshot` appear without such a report.
                Err(e) if e.errno() == libc::ENOENT && parent.0 != SNAPDIR_INO => {
                    reply.entry_with_ttls(
                        &Duration::ZERO,
                        &self.entry_ttl,
                        &absent(),
                        Generation(0),
                    );
                }
                r => self.entry(parent, name, r, reply),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        guarded(self.origin, "forget", || {
            self.known.forget(ino.0, nlookup);
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        guarded(self.origin, "getattr", || {
            self.attr(self.fs.getattr(ino.0), reply);
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        guarded(self.origin, "setattr", || {
            let sa = SetAttr {
                mode,
                uid,
                gid,
                size,
                atime: atime.map(time_set),
                mtime: mtime.map(time_set),
                from_open_file: fh.is_some(),
                if_ctime: None,
            };
            self.attr(self.fs.setattr(ino.0, &sa, &self.cred(req)), reply);
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        guarded(self.origin, "readlink", || match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        guarded(self.origin, "mknod", || {
            let r = self.fs.mknod(
                parent.0,
                name.as_bytes(),
                mode,
                u64::from(rdev),
                umask,
                &self.cred(req),
            );
            self.entry(parent, name, r, reply);
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        guarded(self.origin, "mkdir", || {
            let r = self
                .fs
                .mkdir(parent.0, name.as_bytes(), mode, umask, &self.cred(req));
            self.entry(parent, name, r, reply);
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        guarded(self.origin, "unlink", || {
            empty(
                self.fs.unlink(parent.0, name.as_bytes(), &self.cred(req)),
                reply,
            );
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        guarded(self.origin, "rmdir", || {
            empty(
                self.fs.rmdir(parent.0, name.as_bytes(), &self.cred(req)),
                reply,
            );
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        guarded(self.origin, "symlink", || {
            let r = self.fs.symlink(
                parent.0,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
                &self.cred(req),
            );
            self.entry(parent, link_name, r, reply);
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        guarded(self.origin, "rename", || {
            empty(
                self.fs.rename(
                    parent.0,
                    name.as_bytes(),
                    newparent.0,
                    newname.as_bytes(),
                    flags.bits(),
                    &self.cred(req),
                ),
                reply,
            );
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        guarded(self.origin, "link", || {
            let r = self
                .fs
                .link(ino.0, newparent.0, newname.as_bytes(), &self.cred(req));
            self.entry(newparent, newname, r, reply);
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        guarded(self.origin, "open", || {
            match self.fs.open(ino.0, flags.0, &self.cred(req)) {
                // Cached pages stay valid across opens: a change made
                // elsewhere invalidates them (`invalidate`).
                Ok(_) => reply.opened(self.new_fh(flags.0), FopenFlags::FOPEN_KEEP_CACHE),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        guarded(self.origin, "read", || {
            let read = if self.atime {
                self.fs.read_data(ino.0, offset, size)
            } else {
                self.fs.read_data_without_atime(ino.0, offset, size)
            };
            // A read inside one record is replied from the cached block
            // itself; only one that spans several is assembled.
            match read {
                Ok(d) => match d.contiguous() {
                    Some(s) => reply.data(s),
                    None => reply.data(&d.to_vec()),
                },
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        guarded(self.origin, "write", || {
            // Page-cache writeback (shared mmap) writes pages at their offset
            // whatever the open flags; other writes append while the file
            // has O_APPEND: the kernel sends its flags as they are now,
            // given at open or later, or taken away, by fcntl(F_SETFL).
            let append = !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE)
                && flags.0 & libc::O_APPEND != 0;
            // O_SYNC/O_DSYNC need nothing here: the kernel follows each such
            // write with an fsync request (tested).
            let written = self.fs.write(ino.0, offset, data, append, &self.cred(req));
            match written {
                Ok(n) => reply.written(u32::try_from(n).unwrap_or(u32::MAX)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        guarded(self.origin, "flush", || {
            // Every write is already a committed transaction and locks are
            // the kernel's: nothing to do. ENOSYS tells the kernel so, and
            // it stops sending FLUSH on every close (a round trip each).
            reply.error(Errno::ENOSYS);
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        guarded(self.origin, "release", || {
            empty(self.fs.release(ino.0), reply);
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        guarded(self.origin, "fsync", || {
            empty(self.fs.fsync(ino.0), reply);
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        guarded(self.origin, "opendir", || {
            match self.fs.opendir(ino.0, &self.cred(req)) {
                Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        guarded(self.origin, "readdir", || {
            match self.listing(
                ino.0,
                offset,
                |off| self.fs.readdir_with(ino.0, off, READDIR_BATCH, self.atime),
                |e| e.cookie,
                |e| &mut e.name,
            ) {
                Ok(entries) => {
                    for e in &entries {
                        let name = OsStr::from_bytes(&e.name);
                        if reply.add(INodeNo(e.ino), e.cookie, file_type(e.kind), name) {
                            break;
                        }
                    }
                    reply.ok();
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        guarded(self.origin, "readdirplus", || {
            match self.listing(
                ino.0,
                offset,
                |off| {
                    self.fs
                        .readdirplus_with(ino.0, off, READDIRPLUS_BATCH, self.atime)
                },
                |e| e.0.cookie,
                |e| &mut e.0.name,
            ) {
                Ok(entries) => {
                    for (e, a) in &entries {
                        let name = OsStr::from_bytes(&e.name);
                        if reply.add(
                            INodeNo(e.ino),
                            e.cookie,
                            name,
                            &self.ttls(ino.0, e.ino).1,
                            &file_attr(a),
                            Generation(a.generation),
                        ) {
                            break;
                        }
                        // The kernel takes a lookup count for every entry but
                        // `.` and `..`.
                        if e.name != b"." && e.name != b".." {
                            self.known.add(e.ino, ino.0, name);
                        }
                    }
                    reply.ok();
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        guarded(self.origin, "releasedir", || {
            empty(self.fs.releasedir(ino.0), reply);
        });
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        guarded(self.origin, "fsyncdir", || {
            empty(self.fs.fsync(ino.0), reply);
        });
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        guarded(self.origin, "statfs", || match self.fs.statfs(ino.0) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        guarded(self.origin, "setxattr", || {
            if position != 0 {
                // Only macOS resource forks use a position.
                return reply.error(Errno::EINVAL);
            }
            empty(
                self.fs
                    .setxattr(ino.0, name.as_bytes(), value, flags as u32, &self.cred(req)),
                reply,
            );
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        guarded(self.origin, "getxattr", || {
            match self.fs.getxattr(ino.0, name.as_bytes(), &self.cred(req)) {
                Ok(v) => xattr_reply(&v, size, reply),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        guarded(self.origin, "listxattr", || {
            match self.fs.listxattr(ino.0, &self.cred(req)) {
                Ok(names) => {
                    let mut buf = Vec::new();
                    for n in names {
                        buf.extend_from_slice(&n);
                        buf.push(0);
                    }
                    xattr_reply(&buf, size, reply);
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        guarded(self.origin, "removexattr", || {
            empty(
                self.fs.removexattr(ino.0, name.as_bytes(), &self.cred(req)),
                reply,
            );
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        guarded(self.origin, "access", || {
            empty(
                self.fs.access(ino.0, mask.bits() as u32, &self.cred(req)),
                reply,
            );
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        guarded(self.origin, "create", || {
            match self.fs.create(
                parent.0,
                name.as_bytes(),
                mode,
                umask,
                flags,
                &self.cred(req),
            ) {
                Ok(a) => {
                    self.known.add(a.ino, parent.0, name);
                    reply.created(
                        &self.entry_ttl,
                        &file_attr(&a),
                        Generation(a.generation),
                        self.new_fh(flags),
                        FopenFlags::empty(),
                    );
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        guarded(self.origin, "fallocate", || {
            let cred = self.cred(req);
            empty(
                self.fs.fallocate(ino.0, offset, length, mode as u32, &cred),
                reply,
            );
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_handles_carry_flags() {
        let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC;
        let fh = make_fh(7, flags);
        assert_eq!(fh_flags(fh), flags);
        assert_ne!(make_fh(8, flags), fh);
        assert_eq!(fh_flags(make_fh(u32::MAX, -1)), -1);
    }

    #[test]
    fn guarded_survives_panics() {
        let mut ran = false;
        guarded(Origin::new(), "test", || ran = true);
        assert!(ran);
        guarded(Origin::new(), "test", || {
            panic!("deliberate panic in a handler")
        });
    }
}

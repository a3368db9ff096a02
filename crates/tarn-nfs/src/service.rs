//! The RPC services: one function, [`Service::dispatch`], turns a request
//! record into a reply record (or nothing). It is synchronous and runs on
//! the worker pool; it never panics on input: every decode step returns
//! an error that becomes GARBAGE_ARGS.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};

use tarn_fs::{
    Attr, Cred, FileHandle, FileKind, FsError, SetAttr, TimeSet, Timestamp, LINK_MAX, NAME_MAX,
    ROOT_INO, R_OK, SYMLINK_MAX, W_OK, X_OK,
};

use crate::export::Export;
use crate::handle::{self, HANDLE_LEN};
use crate::proto::{mountproc, mountstat, nfsproc, NfsStat, MOUNT_PROG, NFS_PROG, PMAP_PROG};
use crate::rpc::{self, AcceptStat, Auth, AuthStat, HeaderError};
use crate::xdr::{Reader, Writer, XdrError, XdrResult};

/// Largest handle a client may send (NFS3_FHSIZE).
const FHSIZE: usize = 64;
/// Longest path MOUNT accepts (MNTPATHLEN).
const MNTPATHLEN: usize = 1024;
/// Longest file name accepted on the wire (longer than NAME_MAX so the
/// filesystem answers NAMETOOLONG rather than the decoder GARBAGE_ARGS).
const WIRE_NAME_MAX: usize = 4096;
/// Most entries in MOUNT's DUMP list (it is advisory).
const MAX_MOUNT_LIST: usize = 1024;
/// Most entries fetched per READDIR(PLUS) call.
const MAX_DIR_BATCH: usize = 4096;
/// FSINFO properties: LINK | SYMLINK | HOMOGENEOUS | CANSETTIME.
const FSF3_PROPS: u32 = 0x0001 | 0x0002 | 0x0008 | 0x0010;
/// Bytes of an encoded `post_op_attr` carrying attributes.
const POST_OP_ATTR_LEN: usize = 4 + 84;

/// One export with what the server derives from it.
pub(crate) struct Entry {
    pub export: Export,
    /// Guid of the exported dataset (from its root's attributes).
    pub guid: u64,
    /// Root attributes' handle.
    pub root: FileHandle,
}

/// State shared by every connection.
pub(crate) struct Service {
    pub exports: RwLock<Arc<Vec<Entry>>>,
    pub handle_key: [u8; 32],
    pub write_verf: [u8; 8],
    pub max_io: u32,
    pub nfs_port: u16,
    pub mount_port: u16,
    /// MOUNT's DUMP list: (client, path).
    pub mounts: Mutex<Vec<(String, String)>>,
}

impl Service {
    /// True if at least one export admits a client at `ip`.
    pub(crate) fn any_export_allows(&self, ip: IpAddr) -> bool {
        let entries = match self.exports.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        };
        entries.iter().any(|e| e.export.allows(ip))
    }
}

/// Builds the export table: reads each export's root attributes.
pub(crate) fn build_entries(exports: Vec<Export>) -> Result<Vec<Entry>, crate::Error> {
    let mut out: Vec<Entry> = Vec::with_capacity(exports.len());
    for e in exports {
        let path = normalize_path(&e.path);
        if !path.starts_with('/') {
            return Err(crate::Error::Config(format!(
                "export path {:?} must be absolute",
                e.path
            )));
        }
        if out.iter().any(|o| o.export.path == path) {
            return Err(crate::Error::Config(format!(
                "export path {path:?} listed twice"
            )));
        }
        let root =
            e.fs.getattr(ROOT_INO)
                .map_err(|err| crate::Error::Config(format!("export {path:?}: {err}")))?;
        let mut export = e;
        export.path = path;
        out.push(Entry {
            guid: root.dataset,
            root: root.handle(),
            export,
        });
    }
    Ok(out)
}

fn normalize_path(p: &str) -> String {
    let t = p.trim_end_matches('/');
    if t.is_empty() {
        "/".to_string()
    } else {
        t.to_string()
    }
}

/// A procedure failed: the status, plus what the failure body needs.
type NfsResult<T> = Result<T, NfsStat>;

fn stat_of(e: &FsError) -> NfsStat {
    NfsStat::from_errno(e.errno())
}

// ----- encoders --------------------------------------------------------

fn time_wire(t: &Timestamp) -> (u32, u32) {
    // nfstime3 seconds are unsigned 32-bit: clamp what does not fit.
    let sec = t.sec.clamp(0, i64::from(u32::MAX)) as u32;
    (sec, t.nsec)
}

fn put_time(w: &mut Writer, t: &Timestamp) {
    let (s, n) = time_wire(t);
    w.u32(s).u32(n);
}

fn ftype(k: FileKind) -> u32 {
    match k {
        FileKind::Regular => 1,
        FileKind::Directory => 2,
        FileKind::BlockDevice => 3,
        FileKind::CharDevice => 4,
        FileKind::Symlink => 5,
        FileKind::Socket => 6,
        FileKind::Fifo => 7,
    }
}

/// Linux `dev_t` → (major, minor).
fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// (major, minor) → Linux `dev_t`.
fn make_dev(major: u32, minor: u32) -> u64 {
    let (ma, mi) = (u64::from(major), u64::from(minor));
    ((ma & 0xfff) << 8) | ((ma & !0xfff) << 32) | (mi & 0xff) | ((mi & !0xff) << 12)
}

fn fattr3(w: &mut Writer, a: &Attr) {
    w.u32(ftype(a.kind))
        .u32(a.mode & 0o7777)
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u64(a.size)
        .u64(a.blocks.saturating_mul(512));
    let (ma, mi) = split_dev(a.rdev);
    w.u32(ma).u32(mi).u64(a.dataset).u64(a.ino);
    put_time(w, &a.atime);
    put_time(w, &a.mtime);
    put_time(w, &a.ctime);
}

fn post_op_attr(w: &mut Writer, a: Option<&Attr>) {
    match a {
        Some(a) => {
            w.bool(true);
            fattr3(w, a);
        }
        None => {
            w.bool(false);
        }
    }
}

fn wcc_data(w: &mut Writer, pre: Option<&Attr>, post: Option<&Attr>) {
    match pre {
        Some(a) => {
            w.bool(true).u64(a.size);
            put_time(w, &a.mtime);
            put_time(w, &a.ctime);
        }
        None => {
            w.bool(false);
        }
    }
    post_op_attr(w, post);
}

// ----- decoders --------------------------------------------------------

/// Decoded `sattr3`.
#[derive(Debug, Default)]
struct Sattr {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeSet>,
    mtime: Option<TimeSet>,
}

impl Sattr {
    fn to_setattr(&self) -> SetAttr {
        SetAttr {
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            atime: self.atime,
            mtime: self.mtime,
            from_open_file: false,
        }
    }
    fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.size.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
    }
}

fn read_time_how(r: &mut Reader) -> XdrResult<Option<TimeSet>> {
    match r.u32()? {
        0 => Ok(None),
        1 => Ok(Some(TimeSet::Now)),
        2 => {
            let s = r.u32()?;
            let n = r.u32()?;
            if n >= 1_000_000_000 {
                return Err(XdrError::Invalid);
            }
            Ok(Some(TimeSet::At(Timestamp::new(i64::from(s), n))))
        }
        _ => Err(XdrError::Invalid),
    }
}

fn read_sattr(r: &mut Reader) -> XdrResult<Sattr> {
    Ok(Sattr {
        mode: r.option(|r| r.u32())?,
        uid: r.option(|r| r.u32())?,
        gid: r.option(|r| r.u32())?,
        size: r.option(|r| r.u64())?,
        atime: read_time_how(r)?,
        mtime: read_time_how(r)?,
    })
}

fn read_fh<'a>(r: &mut Reader<'a>) -> XdrResult<&'a [u8]> {
    r.opaque(FHSIZE)
}

fn read_name<'a>(r: &mut Reader<'a>) -> XdrResult<&'a [u8]> {
    r.string(WIRE_NAME_MAX)
}

// ----- the per-call context ------------------------------------------------

/// Who is calling, before an export's squash rules apply.
struct Caller {
    peer: IpAddr,
    /// AUTH_SYS credential; None for AUTH_NONE.
    user: Option<Cred>,
}

/// A handle resolved to its export and current attributes.
struct Obj<'a> {
    entry: &'a Entry,
    attr: Attr,
    cred: Cred,
}

impl<'a> Obj<'a> {
    fn fs(&self) -> &'a dyn crate::ExportFs {
        &*self.entry.export.fs
    }
    fn ino(&self) -> u64 {
        self.attr.ino
    }
    fn writable(&self) -> NfsResult<()> {
        if self.entry.export.read_only {
            Err(NfsStat::RoFs)
        } else {
            Ok(())
        }
    }
    fn reattr(&self) -> Option<Attr> {
        self.fs().getattr(self.ino()).ok()
    }
}

impl Service {
    fn entries(&self) -> Arc<Vec<Entry>> {
        match self.exports.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn handle_bytes(&self, a: &Attr) -> [u8; HANDLE_LEN] {
        handle::encode(&self.handle_key, &a.handle())
    }

    /// Resolves a handle: BADHANDLE if malformed, STALE if gone, ACCES if
    /// no export holding it admits this client.
    fn resolve<'e>(&self, entries: &'e [Entry], caller: &Caller, fh: &[u8]) -> NfsResult<Obj<'e>> {
        let h = handle::decode(&self.handle_key, fh).ok_or(NfsStat::BadHandle)?;
        let mut found_denied = false;
        let mut last_err = NfsStat::Stale;
        // Exports of the live dataset first; snapshot inodes (other guid)
        // are found by asking every export's filesystem.
        let direct = entries.iter().filter(|e| e.guid == h.dataset);
        let others = entries.iter().filter(|e| e.guid != h.dataset);
        for e in direct.chain(others) {
            if !e.export.allows(caller.peer) {
                if e.guid == h.dataset {
                    found_denied = true;
                }
                continue;
            }
            if e.guid != h.dataset && h.ino >> tarn_fs::SLOT_SHIFT == 0 {
                continue;
            }
            match e.export.fs.getattr_handle(&h) {
                Ok(attr) => {
                    return Ok(Obj {
                        entry: e,
                        attr,
                        cred: e.export.cred_for(caller.user.as_ref()),
                    })
                }
                Err(err) => {
                    if e.guid == h.dataset {
                        last_err = stat_of(&err);
                    }
                }
            }
        }
        if found_denied {
            Err(NfsStat::Acces)
        } else {
            Err(last_err)
        }
    }

    /// Handles one request record; None means "no reply" (unreadable or
    /// not a call).
    pub(crate) fn dispatch(&self, peer: IpAddr, record: &[u8]) -> Option<Vec<u8>> {
        let call = match rpc::parse_call(record) {
            Ok(c) => c,
            Err(HeaderError::Unreadable) | Err(HeaderError::NotCall) => return None,
            Err(HeaderError::BadCred(xid)) => return Some(rpc::auth_error(xid, AuthStat::BadCred)),
            Err(HeaderError::RpcMismatch(xid)) => return Some(rpc::rpc_mismatch(xid)),
        };
        let args = record.get(call.args_offset..).unwrap_or(&[]);
        let user = match &call.auth {
            Auth::None => None,
            Auth::Sys(a) => Some(Cred {
                uid: a.uid,
                gid: a.gid,
                groups: a.gids.clone(),
            }),
            Auth::Other(_) => {
                if call.proc_ == 0 {
                    None
                } else {
                    return Some(rpc::auth_error(call.xid, AuthStat::TooWeak));
                }
            }
        };
        let caller = Caller { peer, user };
        let xid = call.xid;
        let result: Result<Writer, AcceptStat> = match (call.prog, call.vers) {
            (NFS_PROG, 3) => self.nfs(&caller, call.proc_, args, xid),
            (NFS_PROG, _) => Err(AcceptStat::ProgMismatch(3, 3)),
            (MOUNT_PROG, 3) => self.mount(&caller, &call.auth, call.proc_, args, xid),
            (MOUNT_PROG, _) => Err(AcceptStat::ProgMismatch(3, 3)),
            (PMAP_PROG, 2) => self.pmap(call.proc_, args, xid),
            (PMAP_PROG, _) => Err(AcceptStat::ProgMismatch(2, 2)),
            _ => Err(AcceptStat::ProgUnavail),
        };
        Some(match result {
            Ok(w) => w.into_bytes(),
            Err(stat) => rpc::accepted(xid, stat).into_bytes(),
        })
    }

    // ----- portmapper ----------------------------------------------------

    fn pmap(&self, proc_: u32, args: &[u8], xid: u32) -> Result<Writer, AcceptStat> {
        match proc_ {
            0 => Ok(rpc::accepted(xid, AcceptStat::Success)),
            3 => {
                let mut r = Reader::new(args);
                let m = (|| -> XdrResult<(u32, u32, u32)> {
                    let prog = r.u32()?;
                    let vers = r.u32()?;
                    let prot = r.u32()?;
                    r.u32()?;
                    Ok((prog, vers, prot))
                })()
                .map_err(|_| AcceptStat::GarbageArgs)?;
                let port = match m {
                    (NFS_PROG, 3, 6) => self.nfs_port,
                    (MOUNT_PROG, 3, 6) => self.mount_port,
                    _ => 0,
                };
                let mut w = rpc::accepted(xid, AcceptStat::Success);
                w.u32(u32::from(port));
                Ok(w)
            }
            _ => Err(AcceptStat::ProcUnavail),
        }
    }

    // ----- MOUNT v3 ------------------------------------------------------

    fn mount(
        &self,
        caller: &Caller,
        auth: &Auth,
        proc_: u32,
        args: &[u8],
        xid: u32,
    ) -> Result<Writer, AcceptStat> {
        let mut r = Reader::new(args);
        let host = match auth {
            Auth::Sys(a) if !a.machine.is_empty() => {
                format!("{}", String::from_utf8_lossy(&a.machine))
            }
            _ => caller.peer.to_string(),
        };
        let mut w = rpc::accepted(xid, AcceptStat::Success);
        match proc_ {
            mountproc::NULL => {}
            mountproc::MNT => {
                let path = r.string(MNTPATHLEN).map_err(|_| AcceptStat::GarbageArgs)?;
                let path = normalize_path(&String::from_utf8_lossy(path));
                let entries = self.entries();
                let Some(e) = entries.iter().find(|e| e.export.path == path) else {
                    w.u32(mountstat::NOENT);
                    return Ok(w);
                };
                if !e.export.allows(caller.peer) {
                    w.u32(mountstat::ACCES);
                    return Ok(w);
                }
                // The root must still be readable; its handle is fixed.
                match e.export.fs.getattr(ROOT_INO) {
                    Ok(_) => {}
                    Err(err) => {
                        w.u32(stat_of(&err).code());
                        return Ok(w);
                    }
                };
                {
                    let mut m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                    if !m.iter().any(|(h, p)| *h == host && *p == path) && m.len() < MAX_MOUNT_LIST
                    {
                        m.push((host, path));
                    }
                }
                w.u32(mountstat::OK);
                w.opaque(&handle::encode(&self.handle_key, &e.root));
                // Accepted flavors: AUTH_SYS, and AUTH_NONE (mapped to the
                // anonymous user).
                w.u32(2).u32(rpc::AUTH_SYS).u32(rpc::AUTH_NONE);
            }
            mountproc::DUMP => {
                let m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                for (h, p) in m.iter() {
                    w.bool(true).opaque(h.as_bytes()).opaque(p.as_bytes());
                }
                w.bool(false);
            }
            mountproc::UMNT => {
                let path = r.string(MNTPATHLEN).map_err(|_| AcceptStat::GarbageArgs)?;
                let path = normalize_path(&String::from_utf8_lossy(path));
                let mut m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                m.retain(|(h, p)| !(*h == host && *p == path));
            }
            mountproc::UMNTALL => {
                let mut m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                m.retain(|(h, _)| *h != host);
            }
            mountproc::EXPORT => {
                for e in self.entries().iter() {
                    w.bool(true).opaque(e.export.path.as_bytes());
                    for n in &e.export.clients {
                        w.bool(true).opaque(n.to_string().as_bytes());
                    }
                    w.bool(false);
                }
                w.bool(false);
            }
            _ => return Err(AcceptStat::ProcUnavail),
        }
        Ok(w)
    }

    // ----- NFS v3 --------------------------------------------------------

    fn nfs(
        &self,
        caller: &Caller,
        proc_: u32,
        args: &[u8],
        xid: u32,
    ) -> Result<Writer, AcceptStat> {
        if proc_ == nfsproc::NULL {
            return Ok(rpc::accepted(xid, AcceptStat::Success));
        }
        if proc_ > nfsproc::COMMIT {
            return Err(AcceptStat::ProcUnavail);
        }
        let entries = self.entries();
        let mut r = Reader::new(args);
        let mut w = rpc::accepted(xid, AcceptStat::Success);
        let cx = Cx {
            svc: self,
            entries: &entries,
            caller,
        };
        let res = match proc_ {
            nfsproc::GETATTR => cx.getattr(&mut r, &mut w),
            nfsproc::SETATTR => cx.setattr(&mut r, &mut w),
            nfsproc::LOOKUP => cx.lookup(&mut r, &mut w),
            nfsproc::ACCESS => cx.access(&mut r, &mut w),
            nfsproc::READLINK => cx.readlink(&mut r, &mut w),
            nfsproc::READ => cx.read(&mut r, &mut w),
            nfsproc::WRITE => cx.write(&mut r, &mut w),
            nfsproc::CREATE => cx.create(&mut r, &mut w),
            nfsproc::MKDIR => cx.mkdir(&mut r, &mut w),
            nfsproc::SYMLINK => cx.symlink(&mut r, &mut w),
            nfsproc::MKNOD => cx.mknod(&mut r, &mut w),
            nfsproc::REMOVE => cx.remove(&mut r, &mut w, false),
            nfsproc::RMDIR => cx.remove(&mut r, &mut w, true),
            nfsproc::RENAME => cx.rename(&mut r, &mut w),
            nfsproc::LINK => cx.link(&mut r, &mut w),
            nfsproc::READDIR => cx.readdir(&mut r, &mut w, false),
            nfsproc::READDIRPLUS => cx.readdir(&mut r, &mut w, true),
            nfsproc::FSSTAT => cx.fsstat(&mut r, &mut w),
            nfsproc::FSINFO => cx.fsinfo(&mut r, &mut w),
            nfsproc::PATHCONF => cx.pathconf(&mut r, &mut w),
            nfsproc::COMMIT => cx.commit(&mut r, &mut w),
            _ => return Err(AcceptStat::ProcUnavail),
        };
        match res {
            Ok(()) => Ok(w),
            Err(_) => Err(AcceptStat::GarbageArgs),
        }
    }
}

/// Context of one NFS call.
struct Cx<'a> {
    svc: &'a Service,
    entries: &'a [Entry],
    caller: &'a Caller,
}

/// Writes `stat` then, on failure, calls `fail` to write the failure body;
/// on success calls `ok`.
macro_rules! finish {
    ($w:expr, $res:expr, |$v:ident| $ok:block, || $fail:block) => {
        match $res {
            Ok($v) => {
                $w.u32(NfsStat::Ok.code());
                $ok
            }
            Err(stat) => {
                $w.u32(stat.code());
                $fail
            }
        }
    };
}

/// What the create-like procedures return on success.
struct Made {
    obj: Attr,
}

impl<'a> Cx<'a> {
    fn resolve(&self, fh: &[u8]) -> NfsResult<Obj<'a>> {
        self.svc.resolve(self.entries, self.caller, fh)
    }

    fn getattr(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        finish!(w, self.resolve(fh), |o| { fattr3(w, &o.attr) }, || {});
        Ok(())
    }

    fn setattr(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let sa = read_sattr(r)?;
        let guard = r.option(|r| Ok((r.u32()?, r.u32()?)))?;
        let o = match self.resolve(fh) {
            Ok(o) => o,
            Err(s) => {
                w.u32(s.code());
                wcc_data(w, None, None);
                return Ok(());
            }
        };
        let res = (|| {
            o.writable()?;
            if let Some(g) = guard {
                if time_wire(&o.attr.ctime) != g {
                    return Err(NfsStat::NotSync);
                }
            }
            let mut set = sa.to_setattr();
            // Nothing to set: no change at all, as in Linux's nfsd (the
            // filesystem would take an empty setattr for chown(-1, -1)
            // and update ctime).
            if set == SetAttr::default() {
                return Ok(o.attr.clone());
            }
            // The owner may truncate a file whose mode denies them writing
            // (they created it that way and still hold it open).
            if set.size.is_some() && o.cred.uid == o.attr.uid {
                set.from_open_file = true;
            }
            o.fs()
                .setattr(o.ino(), &set, &o.cred)
                .map_err(|e| stat_of(&e))
        })();
        match res {
            Ok(a) => {
                w.u32(0);
                wcc_data(w, Some(&o.attr), Some(&a));
            }
            Err(s) => {
                w.u32(s.code());
                wcc_data(w, Some(&o.attr), o.reattr().as_ref());
            }
        }
        Ok(())
    }

    fn lookup(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let dir = match self.resolve(fh) {
            Ok(d) => d,
            Err(s) => {
                w.u32(s.code());
                post_op_attr(w, None);
                return Ok(());
            }
        };
        match dir.fs().lookup(dir.ino(), name, &dir.cred) {
            Ok(a) => {
                w.u32(0);
                w.opaque(&self.svc.handle_bytes(&a));
                post_op_attr(w, Some(&a));
                post_op_attr(w, Some(&dir.attr));
            }
            Err(e) => {
                w.u32(stat_of(&e).code());
                post_op_attr(w, Some(&dir.attr));
            }
        }
        Ok(())
    }

    fn access(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let want = r.u32()?;
        let o = match self.resolve(fh) {
            Ok(o) => o,
            Err(s) => {
                w.u32(s.code());
                post_op_attr(w, None);
                return Ok(());
            }
        };
        const READ: u32 = 0x01;
        const LOOKUP: u32 = 0x02;
        const MODIFY: u32 = 0x04;
        const EXTEND: u32 = 0x08;
        const DELETE: u32 = 0x10;
        const EXECUTE: u32 = 0x20;
        let is_dir = o.attr.kind == FileKind::Directory;
        let ok = |mask: u32| o.fs().access(o.ino(), mask, &o.cred).is_ok();
        let mut granted = 0;
        if want & READ != 0 && ok(R_OK) {
            granted |= READ;
        }
        if want & (MODIFY | EXTEND | DELETE) != 0 && !o.entry.export.read_only && ok(W_OK) {
            granted |= want & (MODIFY | EXTEND);
            if is_dir {
                granted |= want & DELETE;
            }
        }
        if is_dir {
            if want & LOOKUP != 0 && ok(X_OK) {
                granted |= LOOKUP;
            }
        } else if want & EXECUTE != 0 && ok(X_OK) {
            granted |= EXECUTE;
        }
        w.u32(0);
        post_op_attr(w, Some(&o.attr));
        w.u32(granted);
        Ok(())
    }

    fn readlink(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let o = self.resolve(fh);
        let attr = o.as_ref().ok().map(|o| o.attr.clone());
        let res = o.and_then(|o| o.fs().readlink(o.ino()).map_err(|e| stat_of(&e)));
        finish!(
            w,
            res,
            |t| {
                post_op_attr(w, attr.as_ref());
                w.opaque(&t);
            },
            || {
                post_op_attr(w, attr.as_ref());
            }
        );
        Ok(())
    }

    /// Read permission, Linux nfsd style: the owner may always read (the
    /// client checked at open time), and execute permission suffices (so
    /// a client can load an execute-only program).
    fn may_read(o: &Obj) -> NfsResult<()> {
        if o.cred.uid == o.attr.uid {
            return Ok(());
        }
        match o.fs().access(o.ino(), R_OK, &o.cred) {
            Ok(()) => Ok(()),
            Err(e) => {
                if o.attr.kind == FileKind::Regular && o.fs().access(o.ino(), X_OK, &o.cred).is_ok()
                {
                    Ok(())
                } else {
                    Err(stat_of(&e))
                }
            }
        }
    }

    fn read(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let offset = r.u64()?;
        let count = r.u32()?.min(self.svc.max_io);
        let o = match self.resolve(fh) {
            Ok(o) => o,
            Err(s) => {
                w.u32(s.code());
                post_op_attr(w, None);
                return Ok(());
            }
        };
        let res = Self::may_read(&o)
            .and_then(|()| o.fs().read(o.ino(), offset, count).map_err(|e| stat_of(&e)));
        let post = o.reattr();
        match res {
            Ok(data) => {
                let size = post.as_ref().map_or(o.attr.size, |a| a.size);
                let eof = offset.saturating_add(data.len() as u64) >= size;
                w.u32(0);
                post_op_attr(w, post.as_ref());
                w.u32(data.len() as u32).bool(eof).opaque(&data);
            }
            Err(s) => {
                w.u32(s.code());
                post_op_attr(w, post.as_ref());
            }
        }
        Ok(())
    }

    fn write(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let offset = r.u64()?;
        let count = r.u32()? as usize;
        let stable = r.u32()?;
        if stable > 2 {
            return Err(XdrError::Invalid);
        }
        let data = r.opaque(usize::MAX)?;
        let data = &data[..count.min(data.len())];
        let o = match self.resolve(fh) {
            Ok(o) => o,
            Err(s) => {
                w.u32(s.code());
                wcc_data(w, None, None);
                return Ok(());
            }
        };
        let res = (|| {
            o.writable()?;
            if data.len() > self.svc.max_io as usize {
                return Err(NfsStat::Inval);
            }
            if o.cred.uid != o.attr.uid {
                o.fs()
                    .access(o.ino(), W_OK, &o.cred)
                    .map_err(|e| stat_of(&e))?;
            }
            let n = o
                .fs()
                .write(o.ino(), offset, data, false, &o.cred)
                .map_err(|e| stat_of(&e))?;
            if stable != 0 {
                o.fs().fsync(o.ino()).map_err(|e| stat_of(&e))?;
            }
            Ok(n)
        })();
        let post = o.reattr();
        match res {
            Ok(n) => {
                w.u32(0);
                wcc_data(w, Some(&o.attr), post.as_ref());
                // DATA_SYNC and FILE_SYNC are both answered FILE_SYNC: a
                // sync commits metadata and data together.
                w.u32(n as u32).u32(if stable == 0 { 0 } else { 2 });
                w.fixed(&self.svc.write_verf);
            }
            Err(s) => {
                w.u32(s.code());
                wcc_data(w, Some(&o.attr), post.as_ref());
            }
        }
        Ok(())
    }

    /// Shared tail of CREATE / MKDIR / SYMLINK / MKNOD: on success
    /// post_op_fh3, post_op_attr and the directory's wcc_data; on failure
    /// the directory's wcc_data.
    fn reply_made(&self, w: &mut Writer, dir: Option<&Obj>, res: NfsResult<Made>) {
        let pre = dir.map(|d| d.attr.clone());
        let post = dir.and_then(|d| d.reattr());
        match res {
            Ok(m) => {
                w.u32(0);
                w.bool(true).opaque(&self.svc.handle_bytes(&m.obj));
                post_op_attr(w, Some(&m.obj));
                wcc_data(w, pre.as_ref(), post.as_ref());
            }
            Err(s) => {
                w.u32(s.code());
                wcc_data(w, pre.as_ref(), post.as_ref());
            }
        }
    }

    /// Applies the attributes a create-like call carried beyond the mode
    /// (owner, group, times, size) to a new object; best effort, the
    /// object exists either way.
    fn apply_rest(dir: &Obj, a: Attr, sa: &Sattr) -> Attr {
        let rest = Sattr {
            mode: None,
            uid: sa.uid.filter(|&u| u != a.uid),
            gid: sa.gid.filter(|&g| g != a.gid),
            size: sa.size.filter(|&s| s != 0 && a.kind == FileKind::Regular),
            atime: sa.atime,
            mtime: sa.mtime,
        };
        if rest.is_empty() {
            return a;
        }
        dir.fs()
            .setattr(a.ino, &rest.to_setattr(), &dir.cred)
            .unwrap_or(a)
    }

    fn create(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let how = r.u32()?;
        let (sa, verf) = match how {
            0 | 1 => (read_sattr(r)?, None),
            2 => {
                let v = r.fixed(8)?;
                let mut verf = [0u8; 8];
                verf.copy_from_slice(v);
                (Sattr::default(), Some(verf))
            }
            _ => return Err(XdrError::Invalid),
        };
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            d.writable()?;
            let fs = d.fs();
            let mode = sa.mode.unwrap_or(0o644) & 0o7777;
            match verf {
                None => {
                    // UNCHECKED returns an existing regular file as is
                    // (never truncated); GUARDED refuses it.
                    if how == 0 {
                        match fs.lookup(d.ino(), name, &d.cred) {
                            Ok(a) if a.kind == FileKind::Regular => return Ok(Made { obj: a }),
                            Ok(_) => return Err(NfsStat::Exist),
                            Err(e) if e.errno() == libc::ENOENT => {}
                            Err(e) => return Err(stat_of(&e)),
                        }
                    }
                    let a = fs
                        .create(
                            d.ino(),
                            name,
                            mode,
                            0,
                            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                            &d.cred,
                        )
                        .map_err(|e| stat_of(&e))?;
                    let _ = fs.release(a.ino);
                    Ok(Made {
                        obj: Self::apply_rest(d, a, &sa),
                    })
                }
                Some(v) => {
                    // EXCLUSIVE: the verifier is stored in atime/mtime
                    // seconds, so a retried call finds its own file.
                    let t0 = u32::from_be_bytes([v[0], v[1], v[2], v[3]]);
                    let t1 = u32::from_be_bytes([v[4], v[5], v[6], v[7]]);
                    let matches = |a: &Attr| {
                        a.kind == FileKind::Regular
                            && a.atime.sec == i64::from(t0)
                            && a.mtime.sec == i64::from(t1)
                    };
                    match fs.create(
                        d.ino(),
                        name,
                        0o600,
                        0,
                        libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                        &d.cred,
                    ) {
                        Ok(a) => {
                            let _ = fs.release(a.ino);
                            let set = SetAttr {
                                atime: Some(TimeSet::At(Timestamp::new(i64::from(t0), 0))),
                                mtime: Some(TimeSet::At(Timestamp::new(i64::from(t1), 0))),
                                ..SetAttr::default()
                            };
                            let a = fs.setattr(a.ino, &set, &d.cred).map_err(|e| stat_of(&e))?;
                            Ok(Made { obj: a })
                        }
                        Err(e) if e.errno() == libc::EEXIST => {
                            match fs.lookup(d.ino(), name, &d.cred) {
                                Ok(a) if matches(&a) => Ok(Made { obj: a }),
                                _ => Err(NfsStat::Exist),
                            }
                        }
                        Err(e) => Err(stat_of(&e)),
                    }
                }
            }
        });
        self.reply_made(w, dir.as_ref().ok(), res);
        Ok(())
    }

    fn mkdir(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let sa = read_sattr(r)?;
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            d.writable()?;
            let mode = sa.mode.unwrap_or(0o755) & 0o7777;
            let a = d
                .fs()
                .mkdir(d.ino(), name, mode, 0, &d.cred)
                .map_err(|e| stat_of(&e))?;
            Ok(Made {
                obj: Self::apply_rest(d, a, &sa),
            })
        });
        self.reply_made(w, dir.as_ref().ok(), res);
        Ok(())
    }

    fn symlink(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let sa = read_sattr(r)?;
        let target = r.string(SYMLINK_MAX + 1)?;
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            d.writable()?;
            let a = d
                .fs()
                .symlink(d.ino(), name, target, &d.cred)
                .map_err(|e| stat_of(&e))?;
            let sa = Sattr {
                mode: None,
                size: None,
                ..sa
            };
            Ok(Made {
                obj: Self::apply_rest(d, a, &sa),
            })
        });
        self.reply_made(w, dir.as_ref().ok(), res);
        Ok(())
    }

    fn mknod(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let t = r.u32()?;
        let (kind, sa, rdev) = match t {
            3 | 4 => {
                let sa = read_sattr(r)?;
                let ma = r.u32()?;
                let mi = r.u32()?;
                let k = if t == 3 {
                    FileKind::BlockDevice
                } else {
                    FileKind::CharDevice
                };
                (Some(k), sa, make_dev(ma, mi))
            }
            6 => (Some(FileKind::Socket), read_sattr(r)?, 0),
            7 => (Some(FileKind::Fifo), read_sattr(r)?, 0),
            1 | 2 | 5 => (None, Sattr::default(), 0),
            _ => return Err(XdrError::Invalid),
        };
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            let kind = kind.ok_or(NfsStat::BadType)?;
            d.writable()?;
            let mode = kind.mode_bits() | (sa.mode.unwrap_or(0o644) & 0o7777);
            let a = d
                .fs()
                .mknod(d.ino(), name, mode, rdev, 0, &d.cred)
                .map_err(|e| stat_of(&e))?;
            Ok(Made {
                obj: Self::apply_rest(d, a, &sa),
            })
        });
        self.reply_made(w, dir.as_ref().ok(), res);
        Ok(())
    }

    fn remove(&self, r: &mut Reader, w: &mut Writer, is_dir: bool) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            d.writable()?;
            let r = if is_dir {
                d.fs().rmdir(d.ino(), name, &d.cred)
            } else {
                d.fs().unlink(d.ino(), name, &d.cred)
            };
            r.map_err(|e| stat_of(&e))
        });
        let d = dir.as_ref().ok();
        w.u32(res.err().map_or(0, |s| s.code()));
        wcc_data(w, d.map(|d| &d.attr), d.and_then(|d| d.reattr()).as_ref());
        Ok(())
    }

    fn rename(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let ffh = read_fh(r)?;
        let fname = read_name(r)?;
        let tfh = read_fh(r)?;
        let tname = read_name(r)?;
        let from = self.resolve(ffh);
        let to = self.resolve(tfh);
        let res = match (&from, &to) {
            (Ok(f), Ok(t)) => (|| {
                if !std::ptr::eq(f.entry, t.entry) {
                    return Err(NfsStat::XDev);
                }
                f.writable()?;
                f.fs()
                    .rename(f.ino(), fname, t.ino(), tname, 0, &f.cred)
                    .map_err(|e| stat_of(&e))
            })(),
            (Err(s), _) | (_, Err(s)) => Err(*s),
        };
        w.u32(res.err().map_or(0, |s| s.code()));
        let f = from.as_ref().ok();
        let t = to.as_ref().ok();
        wcc_data(w, f.map(|d| &d.attr), f.and_then(|d| d.reattr()).as_ref());
        wcc_data(w, t.map(|d| &d.attr), t.and_then(|d| d.reattr()).as_ref());
        Ok(())
    }

    fn link(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let dfh = read_fh(r)?;
        let name = read_name(r)?;
        let file = self.resolve(fh);
        let dir = self.resolve(dfh);
        let res = match (&file, &dir) {
            (Ok(f), Ok(d)) => (|| {
                if !std::ptr::eq(f.entry, d.entry) {
                    return Err(NfsStat::XDev);
                }
                d.writable()?;
                d.fs()
                    .link(f.ino(), d.ino(), name, &d.cred)
                    .map_err(|e| stat_of(&e))
            })(),
            (Err(s), _) | (_, Err(s)) => Err(*s),
        };
        w.u32(res.as_ref().err().map_or(0, |s| s.code()));
        let f = file.as_ref().ok();
        let fattr = match &res {
            Ok(a) => Some(a.clone()),
            Err(_) => f.and_then(|f| f.reattr()),
        };
        post_op_attr(w, fattr.as_ref());
        let d = dir.as_ref().ok();
        wcc_data(w, d.map(|d| &d.attr), d.and_then(|d| d.reattr()).as_ref());
        Ok(())
    }

    /// The cookie verifier: cookies are keys in the directory's tree and
    /// never go stale, so it is a constant of the dataset (stable across
    /// restarts).
    fn cookieverf(guid: u64) -> [u8; 8] {
        (guid ^ 0x7461_726e_6e66_7333).to_be_bytes()
    }

    fn readdir(&self, r: &mut Reader, w: &mut Writer, plus: bool) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let cookie = r.u64()?;
        let verf = r.fixed(8)?;
        let (dircount, maxcount) = if plus {
            (r.u32()? as usize, r.u32()? as usize)
        } else {
            let c = r.u32()? as usize;
            (c, c)
        };
        let maxcount = maxcount.min(self.svc.max_io as usize);
        let dircount = dircount.min(maxcount);
        let d = match self.resolve(fh) {
            Ok(d) => d,
            Err(s) => {
                w.u32(s.code());
                post_op_attr(w, None);
                return Ok(());
            }
        };
        let myverf = Self::cookieverf(d.entry.guid);
        let fail = |w: &mut Writer, s: NfsStat| {
            w.u32(s.code());
            post_op_attr(w, Some(&d.attr));
        };
        if d.attr.kind != FileKind::Directory {
            fail(w, NfsStat::NotDir);
            return Ok(());
        }
        if cookie != 0 && verf != [0u8; 8] && verf != myverf {
            fail(w, NfsStat::BadCookie);
            return Ok(());
        }
        if let Err(e) = d.fs().access(d.ino(), R_OK, &d.cred) {
            fail(w, stat_of(&e));
            return Ok(());
        }
        // Reply overhead: status, dir attributes, verifier, list end, eof.
        let overhead = 4 + POST_OP_ATTR_LEN + 8 + 4 + 4;
        let per_entry_min = if plus {
            24 + 4 + POST_OP_ATTR_LEN + 8 + HANDLE_LEN
        } else {
            24 + 4
        };
        let limit = (maxcount.saturating_sub(overhead) / per_entry_min).clamp(1, MAX_DIR_BATCH);
        let listed: Result<Vec<(tarn_fs::DirEntry, Option<Attr>)>, FsError> = if plus {
            d.fs()
                .readdirplus(d.ino(), cookie, limit)
                .map(|v| v.into_iter().map(|(e, a)| (e, Some(a))).collect())
        } else {
            d.fs()
                .readdir(d.ino(), cookie, limit)
                .map(|v| v.into_iter().map(|e| (e, None)).collect())
        };
        let listed = match listed {
            Ok(l) => l,
            Err(e) => {
                fail(w, stat_of(&e));
                return Ok(());
            }
        };
        let fetched = listed.len();
        let mut body = Writer::new();
        let mut used = overhead;
        let mut dir_used = 0usize;
        let mut taken = 0usize;
        for (e, a) in &listed {
            let mut ew = Writer::new();
            ew.bool(true).u64(e.ino).opaque(&e.name).u64(e.cookie);
            let dir_bytes = ew.len() - 4;
            if plus {
                post_op_attr(&mut ew, a.as_ref());
                match a {
                    Some(a) => {
                        ew.bool(true).opaque(&self.svc.handle_bytes(a));
                    }
                    None => {
                        ew.bool(false);
                    }
                }
            }
            if used + ew.len() > maxcount || (plus && dir_used + dir_bytes > dircount) {
                break;
            }
            used += ew.len();
            dir_used += dir_bytes;
            body.fixed(&ew.into_bytes());
            taken += 1;
        }
        if taken == 0 && fetched > 0 {
            fail(w, NfsStat::TooSmall);
            return Ok(());
        }
        let eof = taken == fetched && fetched < limit;
        w.u32(0);
        post_op_attr(w, d.reattr().as_ref().or(Some(&d.attr)));
        w.fixed(&myverf);
        w.fixed(&body.into_bytes());
        w.bool(false).bool(eof);
        Ok(())
    }

    fn fsstat(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let o = self.resolve(fh);
        let attr = o.as_ref().ok().map(|o| o.attr.clone());
        let res = o.and_then(|o| o.fs().statfs(o.ino()).map_err(|e| stat_of(&e)));
        finish!(
            w,
            res,
            |s| {
                post_op_attr(w, attr.as_ref());
                let b = u64::from(s.bsize);
                w.u64(s.blocks.saturating_mul(b))
                    .u64(s.bfree.saturating_mul(b))
                    .u64(s.bavail.saturating_mul(b))
                    .u64(s.files)
                    .u64(s.ffree)
                    .u64(s.ffree)
                    .u32(0);
            },
            || {
                post_op_attr(w, attr.as_ref());
            }
        );
        Ok(())
    }

    fn fsinfo(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let o = self.resolve(fh);
        finish!(
            w,
            o,
            |o| {
                post_op_attr(w, Some(&o.attr));
                let io = self.svc.max_io;
                w.u32(io) // rtmax
                    .u32(io) // rtpref
                    .u32(4096) // rtmult
                    .u32(io) // wtmax
                    .u32(io) // wtpref
                    .u32(4096) // wtmult
                    .u32(64 * 1024) // dtpref
                    .u64(i64::MAX as u64) // maxfilesize
                    .u32(0)
                    .u32(1) // time_delta: 1 ns
                    .u32(FSF3_PROPS);
            },
            || {
                post_op_attr(w, None);
            }
        );
        Ok(())
    }

    fn pathconf(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let o = self.resolve(fh);
        finish!(
            w,
            o,
            |o| {
                post_op_attr(w, Some(&o.attr));
                w.u32(LINK_MAX)
                    .u32(NAME_MAX as u32)
                    .bool(true) // no_trunc
                    .bool(true) // chown_restricted
                    .bool(false) // case_insensitive
                    .bool(true); // case_preserving
            },
            || {
                post_op_attr(w, None);
            }
        );
        Ok(())
    }

    fn commit(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let _offset = r.u64()?;
        let _count = r.u32()?;
        let o = match self.resolve(fh) {
            Ok(o) => o,
            Err(s) => {
                w.u32(s.code());
                wcc_data(w, None, None);
                return Ok(());
            }
        };
        // The whole dataset is committed: a range commit costs the same.
        let res = o.fs().fsync(o.ino()).map_err(|e| stat_of(&e));
        let post = o.reattr();
        finish!(
            w,
            res,
            |_v| {
                wcc_data(w, Some(&o.attr), post.as_ref());
                w.fixed(&self.svc.write_verf);
            },
            || {
                wcc_data(w, Some(&o.attr), post.as_ref());
            }
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_numbers_round_trip() {
        for (ma, mi) in [(0, 0), (8, 1), (259, 65536), (4095, 255), (5000, 1 << 20)] {
            assert_eq!(split_dev(make_dev(ma, mi)), (ma, mi));
        }
    }
}

//! The RPC services: one function, [`Service::dispatch`], turns a request
//! record into a reply record (or nothing). It is synchronous and runs on
//! the worker pool; it never panics on input: every decode step returns
//! an error that becomes GARBAGE_ARGS.
//!
//! This module holds the shared state ([`Service`], the export table),
//! the call context (who calls, a handle resolved to its export and
//! attributes) and the dispatch tables. The procedures live by concern:
//! [`wire`] (XDR encoders and decoders of NFS types), [`mount`] (MOUNT and
//! the portmapper), [`attrs`] (attributes, lookup, access, filesystem
//! information), [`io`] (READ, WRITE, COMMIT), [`namespace`] (creating,
//! removing, renaming and linking names) and [`readdir`] (READDIR and
//! READDIRPLUS).

use std::cell::Cell;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};

use tarn_fs::{
    Attr, Cred, FileHandle, FileKind, FsError, ReadData, SetAttr, TimeSet, Timestamp, LINK_MAX,
    NAME_MAX, ROOT_INO, R_OK, SYMLINK_MAX, W_OK, X_OK,
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

/// A reply record: the XDR body and, for READ, the file data that ends
/// it, kept as ranges of the blocks that hold it so the connection writes
/// them to the socket with one vectored write and no copy. When `data` is
/// set, `body` ends with the opaque's length word; the data and its XDR
/// padding follow.
pub(crate) struct Reply {
    pub body: Vec<u8>,
    pub data: Option<ReadData>,
}

impl Reply {
    /// A reply that is all body.
    pub(crate) fn plain(body: Vec<u8>) -> Reply {
        Reply { body, data: None }
    }

    /// Bytes of XDR padding after the data.
    pub(crate) fn pad(&self) -> usize {
        self.data.as_ref().map_or(0, |d| (4 - d.len() % 4) % 4)
    }

    /// Length of the whole record.
    pub(crate) fn len(&self) -> usize {
        self.body.len() + self.data.as_ref().map_or(0, |d| d.len()) + self.pad()
    }

    /// The record in one buffer (tests, fuzzing).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn into_vec(self) -> Vec<u8> {
        let pad = self.pad();
        let mut v = self.body;
        if let Some(d) = self.data {
            for s in d.slices() {
                v.extend_from_slice(s);
            }
            v.resize(v.len() + pad, 0);
        }
        v
    }
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
    /// Per NFS procedure (by number): latencies and errors.
    pub stats: Vec<tarn_stats::RequestStats>,
    /// Replies of non-idempotent calls, for their retransmissions.
    pub drc: crate::drc::Drc,
}

/// NFSv3 procedure names by number (RFC 1813), as metrics label them.
pub const PROC_NAMES: [&str; 22] = [
    "null",
    "getattr",
    "setattr",
    "lookup",
    "access",
    "readlink",
    "read",
    "write",
    "create",
    "mkdir",
    "symlink",
    "mknod",
    "remove",
    "rmdir",
    "rename",
    "link",
    "readdir",
    "readdirplus",
    "fsstat",
    "fsinfo",
    "pathconf",
    "commit",
];

/// One [`tarn_stats::RequestStats`] per NFS procedure.
pub(crate) fn new_stats() -> Vec<tarn_stats::RequestStats> {
    PROC_NAMES
        .iter()
        .map(|_| tarn_stats::RequestStats::default())
        .collect()
}

impl Service {
    /// The write verifier of WRITE and COMMIT replies for `fs`: this
    /// server's, mixed with the opening of the filesystem. A client
    /// resends the unstable writes it has not seen committed when the
    /// verifier changes, which it must when they may be lost: at a restart
    /// (the server's part) and when the dataset was opened again under a
    /// running server (its pool stopped by a failed sync, exported and
    /// imported, say: the filesystem's part).
    pub(crate) fn verifier(&self, fs: &dyn crate::ExportFs) -> [u8; 8] {
        let mut v = self.write_verf;
        for (b, e) in v.iter_mut().zip(fs.epoch().to_be_bytes()) {
            *b ^= e;
        }
        v
    }

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
    /// `done`, once the change it reports is durable: NFSv3 clients take
    /// every change but an unstable WRITE as on stable storage when it is
    /// answered (the Linux client's fsync of a directory sends nothing,
    /// and a rename after a file's fsync is how programs replace files),
    /// so it goes through the intent log before the reply.
    fn synced<T>(&self, done: NfsResult<T>) -> NfsResult<T> {
        let v = done?;
        self.fs().fsync(self.ino()).map_err(|e| stat_of(&e))?;
        Ok(v)
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
    pub(crate) fn dispatch(&self, peer: IpAddr, record: &[u8]) -> Option<Reply> {
        let call = match rpc::parse_call(record) {
            Ok(c) => c,
            Err(HeaderError::Unreadable) | Err(HeaderError::NotCall) => return None,
            Err(HeaderError::BadCred(xid)) => {
                return Some(Reply::plain(rpc::auth_error(xid, AuthStat::BadCred)))
            }
            Err(HeaderError::RpcMismatch(xid)) => {
                return Some(Reply::plain(rpc::rpc_mismatch(xid)))
            }
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
                    return Some(Reply::plain(rpc::auth_error(call.xid, AuthStat::TooWeak)));
                }
            }
        };
        let caller = Caller { peer, user };
        let xid = call.xid;
        // A retransmission of a non-idempotent call is answered with the
        // first call's reply (see `drc`).
        let kept = call.prog == NFS_PROG && call.vers == 3 && crate::drc::is_kept(call.proc_);
        let running = if kept {
            let key = crate::drc::Key::new(peer, xid, call.proc_, record);
            match self.drc.begin(key) {
                crate::drc::Begin::Run(r) => Some(r),
                crate::drc::Begin::Replay(body) => {
                    return Some(Reply::plain(body.as_ref().clone()))
                }
                crate::drc::Begin::Drop => return None,
            }
        } else {
            None
        };
        let payload = Cell::new(None);
        let start = std::time::Instant::now();
        let result: Result<Writer, AcceptStat> = match (call.prog, call.vers) {
            (NFS_PROG, 3) => self.nfs(&caller, call.proc_, args, xid, &payload),
            (NFS_PROG, _) => Err(AcceptStat::ProgMismatch(3, 3)),
            (MOUNT_PROG, 3) => self.mount(&caller, &call.auth, call.proc_, args, xid),
            (MOUNT_PROG, _) => Err(AcceptStat::ProgMismatch(3, 3)),
            (PMAP_PROG, 2) => self.pmap(call.proc_, args, xid),
            (PMAP_PROG, _) => Err(AcceptStat::ProgMismatch(2, 2)),
            _ => Err(AcceptStat::ProgUnavail),
        };
        let reply = match result {
            Ok(w) => Reply {
                body: w.into_bytes(),
                data: payload.take(),
            },
            Err(stat) => Reply::plain(rpc::accepted(xid, stat).into_bytes()),
        };
        if let Some(r) = running {
            r.finish(&reply.body);
        }
        if call.prog == NFS_PROG && call.vers == 3 {
            if let Some(s) = self.stats.get(call.proc_ as usize) {
                // The accepted header is 24 bytes; an NFS result starts
                // with its nfsstat3 (NULL has none).
                let ok = match reply.body.get(20..28) {
                    Some(b) => b.iter().all(|x| *x == 0),
                    None => reply.body.get(20..24).is_some_and(|b| b == [0; 4]),
                };
                s.record(start, ok);
            }
        }
        Some(reply)
    }
    // ----- NFS v3 --------------------------------------------------------

    fn nfs(
        &self,
        caller: &Caller,
        proc_: u32,
        args: &[u8],
        xid: u32,
        payload: &Cell<Option<ReadData>>,
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
            payload,
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
    /// READ's data, sent after the reply body (see [`Reply`]).
    payload: &'a Cell<Option<ReadData>>,
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

/// The empty attribute body a reply carries when its handle does not
/// resolve.
#[derive(Clone, Copy)]
enum NoAttrs {
    /// `post_op_attr` without attributes.
    PostOp,
    /// `wcc_data` without attributes.
    Wcc,
}

impl<'a> Cx<'a> {
    fn resolve(&self, fh: &[u8]) -> NfsResult<Obj<'a>> {
        self.svc.resolve(self.entries, self.caller, fh)
    }

    /// Resolves `fh`; when it does not resolve, writes the status and the
    /// empty attributes of `shape` (the whole failure reply) and returns
    /// None.
    fn resolve_or(&self, fh: &[u8], w: &mut Writer, shape: NoAttrs) -> Option<Obj<'a>> {
        match self.resolve(fh) {
            Ok(o) => Some(o),
            Err(s) => {
                w.u32(s.code());
                match shape {
                    NoAttrs::PostOp => wire::post_op_attr(w, None),
                    NoAttrs::Wcc => wire::wcc_data(w, None, None),
                }
                None
            }
        }
    }
}

// The procedures, by concern (declared after `finish!` so they can use it).
mod attrs;
mod io;
mod mount;
mod namespace;
mod readdir;
mod wire;

//! Shared test support: a tiny raw ONC RPC client over TCP (to hold
//! handles across restarts and send exactly the calls a test needs),
//! servers over `MemBackend`, and URLs of their exports for the libnfs
//! command-line tools (which `tarn_testkit::clients` runs).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tarn_fs::testing::MemBackend;
use tarn_fs::{Backend, Fs, FsError, Store};
use tarn_nfs::proto::{mountproc, nfsproc, MOUNT_PROG, NFS_PROG};
use tarn_nfs::rpc::{encode_call, Auth, AuthSys};
use tarn_nfs::xdr::{Reader, Writer};
use tarn_nfs::{Export, IpNet, NfsConfig, NfsServer, Running};
use tarn_testkit::clients::nfs_url;

/// A server on an ephemeral port (NFS and MOUNT on separate listeners).
pub fn start(exports: Vec<Export>) -> Running {
    start_on(0, 0, exports)
}

pub fn start_on(nfs_port: u16, mount_port: u16, exports: Vec<Export>) -> Running {
    let cfg = NfsConfig {
        bind: SocketAddr::from(([127, 0, 0, 1], nfs_port)),
        mount_bind: Some(SocketAddr::from(([127, 0, 0, 1], mount_port))),
        ..NfsConfig::default()
    };
    NfsServer::start(cfg, exports).expect("server starts")
}

pub fn mem_fs() -> Arc<Fs<MemBackend>> {
    Arc::new(Fs::mount(MemBackend::new()).unwrap())
}

pub fn local() -> Vec<IpNet> {
    vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]
}

/// A read-write export to localhost without root squashing (the tools
/// run as whatever user runs the tests, often root).
pub fn open_export(path: &str, fs: std::sync::Arc<dyn tarn_nfs::ExportFs>) -> Export {
    let mut e = Export::new(path, fs, local());
    e.root_squash = false;
    e
}

/// `nfs://` URL of `path` inside export `export` of server `r`.
pub fn url(r: &Running, export: &str, path: &str) -> String {
    let (n, m) = r.local_addrs();
    nfs_url(n.port(), m.port(), &format!("{export}{path}"))
}

// ----- raw RPC client -----------------------------------------------------

pub struct Client {
    pub s: TcpStream,
    xid: u32,
    pub auth: Auth,
}

pub fn sys(uid: u32, gid: u32) -> Auth {
    Auth::Sys(AuthSys {
        stamp: 0,
        machine: b"testhost".to_vec(),
        uid,
        gid,
        gids: vec![],
    })
}

pub fn frame(body: &[u8]) -> Vec<u8> {
    tarn_nfs::record::frame(body)
}

/// Reads one record (single or multi fragment).
pub fn read_record(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let mut h = [0u8; 4];
        s.read_exact(&mut h)?;
        let h = u32::from_be_bytes(h);
        let len = (h & 0x7fff_ffff) as usize;
        let start = out.len();
        out.resize(start + len, 0);
        s.read_exact(&mut out[start..])?;
        if h & 0x8000_0000 != 0 {
            return Ok(out);
        }
    }
}

/// A decoded reply: xid and the bytes after the accepted header
/// (`accept_stat` already checked to be SUCCESS), or the reject info.
#[derive(Debug)]
pub enum Reply {
    Success(u32, Vec<u8>),
    Accepted(u32, u32),
    Denied(u32, Vec<u8>),
}

pub fn parse_reply(rec: &[u8]) -> Reply {
    let mut r = Reader::new(rec);
    let xid = r.u32().unwrap();
    assert_eq!(r.u32().unwrap(), 1, "REPLY");
    match r.u32().unwrap() {
        0 => {
            r.u32().unwrap();
            r.opaque(400).unwrap();
            let stat = r.u32().unwrap();
            if stat == 0 {
                Reply::Success(xid, rec[rec.len() - r.remaining()..].to_vec())
            } else {
                Reply::Accepted(xid, stat)
            }
        }
        _ => Reply::Denied(xid, rec[rec.len() - r.remaining()..].to_vec()),
    }
}

impl Client {
    pub fn connect(addr: SocketAddr, auth: Auth) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Client { s, xid: 1, auth }
    }

    /// A client over an already connected stream.
    pub fn over(s: TcpStream, auth: Auth) -> Client {
        Client { s, xid: 1, auth }
    }

    pub fn next_xid(&mut self) -> u32 {
        self.xid += 1;
        self.xid
    }

    /// Sends a call without waiting; returns its xid.
    pub fn send(&mut self, prog: u32, proc_: u32, args: &[u8]) -> u32 {
        let xid = self.next_xid();
        let mut w = encode_call(xid, prog, 3, proc_, &self.auth);
        w.fixed(args);
        let mut body = w.into_bytes();
        // fixed() pads: args are always 4-aligned XDR, so nothing added.
        body.truncate(body.len());
        self.s.write_all(&frame(&body)).unwrap();
        xid
    }

    /// Sends a call without waiting, or says why it could not (the
    /// server closed the connection).
    pub fn try_send(&mut self, prog: u32, proc_: u32, args: &[u8]) -> std::io::Result<u32> {
        let xid = self.next_xid();
        let mut w = encode_call(xid, prog, 3, proc_, &self.auth);
        w.fixed(args);
        self.s.write_all(&frame(&w.into_bytes()))?;
        Ok(xid)
    }

    /// Sends a call under a chosen xid (a retransmission), without waiting.
    pub fn send_as(&mut self, xid: u32, prog: u32, proc_: u32, args: &[u8]) {
        let mut w = encode_call(xid, prog, 3, proc_, &self.auth);
        w.fixed(args);
        self.s.write_all(&frame(&w.into_bytes())).unwrap();
    }

    pub fn recv(&mut self) -> Reply {
        let rec = read_record(&mut self.s).expect("reply");
        parse_reply(&rec)
    }

    /// Calls and returns the result bytes (panics unless SUCCESS).
    pub fn call(&mut self, prog: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
        let xid = self.send(prog, proc_, args);
        match self.recv() {
            Reply::Success(x, body) => {
                assert_eq!(x, xid);
                body
            }
            other => panic!("call {prog}/{proc_} not successful: {other:?}"),
        }
    }

    /// MOUNT MNT: (mountstat, root handle).
    pub fn mnt(&mut self, path: &str) -> (u32, Vec<u8>) {
        let mut w = Writer::new();
        w.opaque(path.as_bytes());
        let b = self.call(MOUNT_PROG, mountproc::MNT, &w.into_bytes());
        let mut r = Reader::new(&b);
        let st = r.u32().unwrap();
        if st != 0 {
            return (st, vec![]);
        }
        (st, r.opaque(64).unwrap().to_vec())
    }

    /// NFS GETATTR: (status, fattr3 fields: type, mode, nlink, uid, gid, size).
    pub fn getattr(&mut self, fh: &[u8]) -> (u32, Option<Fattr>) {
        let mut w = Writer::new();
        w.opaque(fh);
        let b = self.call(NFS_PROG, nfsproc::GETATTR, &w.into_bytes());
        let mut r = Reader::new(&b);
        let st = r.u32().unwrap();
        if st != 0 {
            return (st, None);
        }
        (0, Some(Fattr::read(&mut r)))
    }

    /// NFS LOOKUP: (status, handle).
    pub fn lookup(&mut self, dir: &[u8], name: &str) -> (u32, Vec<u8>) {
        let mut w = Writer::new();
        w.opaque(dir).opaque(name.as_bytes());
        let b = self.call(NFS_PROG, nfsproc::LOOKUP, &w.into_bytes());
        let mut r = Reader::new(&b);
        let st = r.u32().unwrap();
        if st != 0 {
            return (st, vec![]);
        }
        (0, r.opaque(64).unwrap().to_vec())
    }

    /// NFS CREATE with `how` (0 UNCHECKED, 1 GUARDED with mode 0644, 2
    /// EXCLUSIVE with `verf`): (status, handle, attrs).
    pub fn create(
        &mut self,
        dir: &[u8],
        name: &str,
        how: u32,
        verf: [u8; 8],
    ) -> (u32, Vec<u8>, Option<Fattr>) {
        let mut w = Writer::new();
        w.opaque(dir).opaque(name.as_bytes()).u32(how);
        if how == 2 {
            w.fixed(&verf);
        } else {
            // mode 0644, nothing else
            w.bool(true)
                .u32(0o644)
                .bool(false)
                .bool(false)
                .bool(false)
                .u32(0)
                .u32(0);
        }
        let b = self.call(NFS_PROG, nfsproc::CREATE, &w.into_bytes());
        let mut r = Reader::new(&b);
        let st = r.u32().unwrap();
        if st != 0 {
            return (st, vec![], None);
        }
        assert!(r.bool().unwrap(), "handle follows");
        let fh = r.opaque(64).unwrap().to_vec();
        assert!(r.bool().unwrap(), "attributes follow");
        (0, fh, Some(Fattr::read(&mut r)))
    }

    /// NFS WRITE: (status, count, committed, verifier).
    pub fn write(
        &mut self,
        fh: &[u8],
        off: u64,
        data: &[u8],
        stable: u32,
    ) -> (u32, u32, u32, [u8; 8]) {
        let mut w = Writer::new();
        w.opaque(fh)
            .u64(off)
            .u32(data.len() as u32)
            .u32(stable)
            .opaque(data);
        let b = self.call(NFS_PROG, nfsproc::WRITE, &w.into_bytes());
        let mut r = Reader::new(&b);
        let st = r.u32().unwrap();
        skip_wcc(&mut r);
        if st != 0 {
            return (st, 0, 0, [0; 8]);
        }
        let n = r.u32().unwrap();
        let c = r.u32().unwrap();
        let mut v = [0u8; 8];
        v.copy_from_slice(r.fixed(8).unwrap());
        (st, n, c, v)
    }

    /// NFS READ: (status, data, eof).
    pub fn read(&mut self, fh: &[u8], off: u64, count: u32) -> (u32, Vec<u8>, bool) {
        let mut w = Writer::new();
        w.opaque(fh).u64(off).u32(count);
        let b = self.call(NFS_PROG, nfsproc::READ, &w.into_bytes());
        let mut r = Reader::new(&b);
        let st = r.u32().unwrap();
        skip_post_op(&mut r);
        if st != 0 {
            return (st, vec![], false);
        }
        let _n = r.u32().unwrap();
        let eof = r.bool().unwrap();
        (st, r.opaque(1 << 21).unwrap().to_vec(), eof)
    }

    /// NFS REMOVE: status.
    pub fn remove(&mut self, dir: &[u8], name: &str) -> u32 {
        let mut w = Writer::new();
        w.opaque(dir).opaque(name.as_bytes());
        let b = self.call(NFS_PROG, nfsproc::REMOVE, &w.into_bytes());
        Reader::new(&b).u32().unwrap()
    }

    /// NFS COMMIT: (status, verifier).
    pub fn commit(&mut self, fh: &[u8]) -> (u32, [u8; 8]) {
        let mut w = Writer::new();
        w.opaque(fh).u64(0).u32(0);
        let b = self.call(NFS_PROG, nfsproc::COMMIT, &w.into_bytes());
        let mut r = Reader::new(&b);
        let st = r.u32().unwrap();
        skip_wcc(&mut r);
        let mut v = [0u8; 8];
        if st == 0 {
            v.copy_from_slice(r.fixed(8).unwrap());
        }
        (st, v)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fattr {
    pub ftype: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub fileid: u64,
    pub atime: (u32, u32),
    pub mtime: (u32, u32),
    pub ctime: (u32, u32),
}

impl Fattr {
    pub fn read(r: &mut Reader) -> Fattr {
        let ftype = r.u32().unwrap();
        let mode = r.u32().unwrap();
        let nlink = r.u32().unwrap();
        let uid = r.u32().unwrap();
        let gid = r.u32().unwrap();
        let size = r.u64().unwrap();
        let _used = r.u64().unwrap();
        let _rdev = (r.u32().unwrap(), r.u32().unwrap());
        let _fsid = r.u64().unwrap();
        let fileid = r.u64().unwrap();
        let atime = (r.u32().unwrap(), r.u32().unwrap());
        let mtime = (r.u32().unwrap(), r.u32().unwrap());
        let ctime = (r.u32().unwrap(), r.u32().unwrap());
        Fattr {
            ftype,
            mode,
            nlink,
            uid,
            gid,
            size,
            fileid,
            atime,
            mtime,
            ctime,
        }
    }
}

pub fn skip_post_op(r: &mut Reader) {
    if r.bool().unwrap() {
        Fattr::read(r);
    }
}

pub fn skip_wcc(r: &mut Reader) {
    if r.bool().unwrap() {
        r.u64().unwrap();
        r.u64().unwrap();
        r.u64().unwrap();
    }
    skip_post_op(r);
}

/// A backend whose sync (what COMMIT and stable writes wait for) takes
/// `delay`.
pub struct SlowSync {
    pub inner: Arc<MemBackend>,
    pub delay: Duration,
}

impl Backend for SlowSync {
    fn txn<R>(
        &self,
        write: bool,
        f: &mut dyn FnMut(&mut dyn Store) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        self.inner.txn(write, f)
    }
    fn sync(&self) -> Result<(), FsError> {
        std::thread::sleep(self.delay);
        self.inner.sync()
    }
    fn snapshots(&self) -> Result<Vec<(String, Arc<Self>)>, FsError> {
        Ok(vec![])
    }
}

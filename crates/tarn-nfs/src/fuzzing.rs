//! Entry points for fuzzing the request decoders (feature `fuzzing`, and
//! the crate's own tests): every byte string a client can send goes
//! through record marking, the RPC call header and, with a valid header,
//! the NFS / MOUNT / portmapper argument decoders of one in-memory
//! export. None of them may panic, whatever the input.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};

use tarn_fs::testing::MemBackend;
use tarn_fs::{Cred, Fs};

use crate::export::{Export, IpNet};
use crate::proto::{mountproc, nfsproc, MOUNT_PROG, NFS_PROG};
use crate::record::Decoder;
use crate::rpc::{encode_call, Auth, AuthSys};
use crate::service::{build_entries, Service};
use crate::xdr::Writer;

/// A service over one small in-memory export `/x` (a file `f` holding
/// "hello", a directory `d`), as every fuzz case sees it.
pub struct Target {
    svc: Service,
}

impl Default for Target {
    fn default() -> Self {
        Target::new()
    }
}

impl Target {
    /// Builds the export.
    pub fn new() -> Target {
        // Setting up the in-memory filesystem cannot fail; a failure here
        // is a bug of the harness, not of the code under test.
        let fs = Arc::new(Fs::mount(MemBackend::new()).expect("in-memory mount"));
        let a = fs
            .create(1, b"f", 0o644, 0, libc::O_CREAT, &Cred::root())
            .expect("create");
        fs.write(a.ino, 0, b"hello", false, &Cred::root())
            .expect("write");
        fs.mkdir(1, b"d", 0o755, 0, &Cred::root()).expect("mkdir");
        let e = Export::new("/x", fs, vec![IpNet::any_v4()]);
        Target {
            svc: Service {
                exports: RwLock::new(Arc::new(build_entries(vec![e]).expect("export"))),
                handle_key: [7; 32],
                write_verf: [1; 8],
                max_io: 1 << 20,
                nfs_port: 1,
                mount_port: 2,
                mounts: Mutex::new(Vec::new()),
                stats: crate::service::new_stats(),
                drc: Default::default(),
            },
        }
    }

    /// The export root's file handle (to build deeper valid calls).
    pub fn root_handle(&self) -> Vec<u8> {
        let e = match self.svc.exports.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        };
        crate::handle::encode(&self.svc.handle_key, &e[0].root).to_vec()
    }

    /// One request record, as the server would handle it; the reply.
    pub fn dispatch(&self, record: &[u8]) -> Option<Vec<u8>> {
        self.svc
            .dispatch(IpAddr::from([127, 0, 0, 1]), record)
            .map(|r| r.into_vec())
    }

    /// A byte stream as a connection would carry it: split into records
    /// (bounded as the server bounds them), each dispatched.
    pub fn stream(&self, bytes: &[u8]) {
        let mut d = Decoder::new(64 << 10);
        let mut out = Vec::new();
        let _ = d.feed(bytes, &mut out);
        for r in &out {
            let _ = self.dispatch(r);
        }
    }

    /// Valid calls of every kind (header and arguments), to mutate.
    pub fn corpus(&self) -> Vec<Vec<u8>> {
        let fh = self.root_handle();
        let auth = Auth::Sys(AuthSys {
            stamp: 0,
            machine: b"m".to_vec(),
            uid: 0,
            gid: 0,
            gids: vec![],
        });
        let call = |prog: u32, proc_: u32, args: &dyn Fn(&mut Writer)| {
            let mut w = encode_call(1, prog, 3, proc_, &auth);
            args(&mut w);
            w.into_bytes()
        };
        let sattr = |w: &mut Writer| {
            w.bool(true)
                .u32(0o644)
                .bool(false)
                .bool(false)
                .bool(true)
                .u64(3);
            w.u32(1).u32(2);
        };
        vec![
            call(MOUNT_PROG, mountproc::MNT, &|w| {
                w.opaque(b"/x");
            }),
            call(MOUNT_PROG, mountproc::UMNT, &|w| {
                w.opaque(b"/x");
            }),
            call(MOUNT_PROG, mountproc::EXPORT, &|_| {}),
            call(NFS_PROG, nfsproc::GETATTR, &|w| {
                w.opaque(&fh);
            }),
            call(NFS_PROG, nfsproc::SETATTR, &|w| {
                w.opaque(&fh);
                sattr(w);
                w.bool(false);
            }),
            call(NFS_PROG, nfsproc::LOOKUP, &|w| {
                w.opaque(&fh).opaque(b"f");
            }),
            call(NFS_PROG, nfsproc::ACCESS, &|w| {
                w.opaque(&fh).u32(0x3f);
            }),
            call(NFS_PROG, nfsproc::READ, &|w| {
                w.opaque(&fh).u64(0).u32(4096);
            }),
            call(NFS_PROG, nfsproc::WRITE, &|w| {
                w.opaque(&fh).u64(0).u32(5).u32(2).opaque(b"hello");
            }),
            call(NFS_PROG, nfsproc::CREATE, &|w| {
                w.opaque(&fh).opaque(b"new").u32(1);
                sattr(w);
            }),
            call(NFS_PROG, nfsproc::MKDIR, &|w| {
                w.opaque(&fh).opaque(b"dir");
                sattr(w);
            }),
            call(NFS_PROG, nfsproc::SYMLINK, &|w| {
                w.opaque(&fh).opaque(b"ln");
                sattr(w);
                w.opaque(b"target");
            }),
            call(NFS_PROG, nfsproc::MKNOD, &|w| {
                w.opaque(&fh).opaque(b"fifo").u32(7);
                sattr(w);
            }),
            call(NFS_PROG, nfsproc::REMOVE, &|w| {
                w.opaque(&fh).opaque(b"f");
            }),
            call(NFS_PROG, nfsproc::RENAME, &|w| {
                w.opaque(&fh).opaque(b"f").opaque(&fh).opaque(b"g");
            }),
            call(NFS_PROG, nfsproc::LINK, &|w| {
                w.opaque(&fh).opaque(&fh).opaque(b"l");
            }),
            call(NFS_PROG, nfsproc::READDIR, &|w| {
                w.opaque(&fh).u64(0).fixed(&[0; 8]).u32(4096);
            }),
            call(NFS_PROG, nfsproc::READDIRPLUS, &|w| {
                w.opaque(&fh).u64(0).fixed(&[0; 8]).u32(4096).u32(65536);
            }),
            call(NFS_PROG, nfsproc::FSSTAT, &|w| {
                w.opaque(&fh);
            }),
            call(NFS_PROG, nfsproc::COMMIT, &|w| {
                w.opaque(&fh).u64(0).u32(0);
            }),
        ]
    }
}

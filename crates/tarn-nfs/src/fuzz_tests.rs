//! Robustness: random and mutated records into the full request decoder
//! (RPC header, credentials, every procedure's arguments) never panic.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};

use proptest::prelude::*;
use tarn_fs::testing::MemBackend;
use tarn_fs::{Cred, Fs};

use crate::export::{Export, IpNet};
use crate::proto::{MOUNT_PROG, NFS_PROG, PMAP_PROG};
use crate::rpc::{encode_call, Auth, AuthSys};
use crate::service::{build_entries, Service};

fn service() -> Service {
    let fs = Arc::new(Fs::mount(MemBackend::new()).unwrap());
    let a = fs
        .create(1, b"f", 0o644, 0, libc::O_CREAT, &Cred::root())
        .unwrap();
    fs.write(a.ino, 0, b"hello", false, &Cred::root()).unwrap();
    fs.mkdir(1, b"d", 0o755, 0, &Cred::root()).unwrap();
    let e = Export::new("/x", fs, vec![IpNet::any_v4()]);
    Service {
        exports: RwLock::new(Arc::new(build_entries(vec![e]).unwrap())),
        handle_key: [7; 32],
        write_verf: [1; 8],
        max_io: 1 << 20,
        nfs_port: 1,
        mount_port: 2,
        mounts: Mutex::new(Vec::new()),
    }
}

fn peer() -> IpAddr {
    IpAddr::from([127, 0, 0, 1])
}

fn root_handle(svc: &Service) -> Vec<u8> {
    let e = svc.exports.read().unwrap();
    crate::handle::encode(&svc.handle_key, &e[0].root).to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_records(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let svc = service();
        let _ = svc.dispatch(peer(), &bytes);
    }

    /// Valid headers for every procedure, followed by random arguments
    /// (sometimes starting with a valid handle, to reach deeper code).
    #[test]
    fn random_args(prog in prop_oneof![Just(NFS_PROG), Just(MOUNT_PROG), Just(PMAP_PROG)],
                   proc_ in 0u32..24, with_fh in any::<bool>(),
                   args in proptest::collection::vec(any::<u8>(), 0..200)) {
        let svc = service();
        let vers = if prog == PMAP_PROG { 2 } else { 3 };
        let auth = Auth::Sys(AuthSys { stamp: 0, machine: b"m".to_vec(), uid: 1000, gid: 1000, gids: vec![] });
        let mut w = encode_call(1, prog, vers, proc_, &auth);
        if with_fh {
            w.opaque(&root_handle(&svc));
        }
        let mut rec = w.into_bytes();
        rec.extend_from_slice(&args);
        let reply = svc.dispatch(peer(), &rec);
        prop_assert!(reply.is_some());
    }
}

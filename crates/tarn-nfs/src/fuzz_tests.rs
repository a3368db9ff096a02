//! Robustness: random and mutated input into every request decoder —
//! record marking, the RPC header and credentials, every NFS / MOUNT /
//! portmapper procedure's arguments — never panics.
//!
//! CI runs a fixed number of cases; `PROPTEST_CASES=N` runs N per test
//! (see docs/security.md).

use proptest::prelude::*;
use tarn_testkit::data::cases;

use crate::fuzzing::Target;
use crate::proto::{MOUNT_PROG, NFS_PROG, PMAP_PROG};
use crate::record::Decoder;
use crate::rpc::{encode_call, parse_call, Auth, AuthSys};

thread_local! {
    static TARGET: Target = Target::new();
}

/// Flips, overwrites, inserts and truncates bytes of `base`.
fn mutate(base: &[u8], edits: &[(usize, u8, u8)], cut: Option<usize>) -> Vec<u8> {
    let mut v = base.to_vec();
    for &(pos, op, byte) in edits {
        if v.is_empty() {
            v.push(byte);
            continue;
        }
        let i = pos % v.len();
        match op % 4 {
            0 => v[i] ^= byte,
            1 => v[i] = byte,
            2 => v.insert(i, byte),
            _ => {
                v.remove(i);
            }
        }
    }
    if let Some(c) = cut {
        v.truncate(c % (v.len() + 1));
    }
    v
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn fuzz_random_records(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        TARGET.with(|t| { let _ = t.dispatch(&bytes); });
    }

    /// Valid headers for every procedure, followed by random arguments
    /// (sometimes starting with a valid handle, to reach deeper code).
    #[test]
    fn fuzz_random_args(prog in prop_oneof![Just(NFS_PROG), Just(MOUNT_PROG), Just(PMAP_PROG)],
                        proc_ in 0u32..24, with_fh in any::<bool>(),
                        args in proptest::collection::vec(any::<u8>(), 0..200)) {
        let vers = if prog == PMAP_PROG { 2 } else { 3 };
        let auth = Auth::Sys(AuthSys { stamp: 0, machine: b"m".to_vec(), uid: 1000, gid: 1000, gids: vec![] });
        let mut w = encode_call(1, prog, vers, proc_, &auth);
        TARGET.with(|t| {
            if with_fh {
                w.opaque(&t.root_handle());
            }
            let mut rec = w.into_bytes();
            rec.extend_from_slice(&args);
            prop_assert!(t.dispatch(&rec).is_some());
            Ok(())
        })?;
    }

    /// Valid calls of every kind with a few bytes changed: reaches the
    /// decoders past their first fields.
    #[test]
    fn fuzz_mutated_calls(which in any::<usize>(),
                          edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6),
                          cut in proptest::option::of(any::<usize>())) {
        TARGET.with(|t| {
            let corpus = t.corpus();
            let rec = mutate(&corpus[which % corpus.len()], &edits, cut);
            let _ = t.dispatch(&rec);
        });
    }

    /// RPC call headers: random bytes and mutated valid ones.
    #[test]
    fn fuzz_rpc_headers(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6)) {
        let _ = parse_call(&bytes);
        TARGET.with(|t| {
            let corpus = t.corpus();
            let rec = mutate(&corpus[bytes.len() % corpus.len()], &edits, None);
            if let Ok(c) = parse_call(&rec) {
                prop_assert!(c.args_offset <= rec.len());
            }
            Ok(())
        })?;
    }

    /// Record marking: any bytes, in any split, give the same records,
    /// each within the bound, or the same error; and whole connections'
    /// worth of records go through the service.
    #[test]
    fn fuzz_record_marking(bytes in proptest::collection::vec(any::<u8>(), 0..400),
                           split in 1usize..50) {
        let run = |step: usize| {
            let mut d = Decoder::new(128);
            let mut out = Vec::new();
            let mut r = Ok(());
            for piece in bytes.chunks(step) {
                r = d.feed(piece, &mut out);
                if r.is_err() {
                    break;
                }
            }
            (out, r)
        };
        let (whole, r1) = run(bytes.len().max(1));
        let (pieces, r2) = run(split);
        prop_assert_eq!(&whole, &pieces);
        prop_assert_eq!(r1, r2);
        prop_assert!(whole.iter().all(|r| r.len() <= 128));
        TARGET.with(|t| t.stream(&bytes));
    }
}

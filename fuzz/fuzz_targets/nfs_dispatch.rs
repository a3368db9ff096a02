//! Whole requests: RPC header, then NFS / MOUNT / portmapper arguments,
//! against an in-memory export. The first byte picks a valid call to
//! graft the rest onto, so the argument decoders are reached too.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tarn_nfs::fuzzing::Target;

static TARGET: OnceLock<(Target, Vec<Vec<u8>>)> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let (t, corpus) = TARGET.get_or_init(|| {
        let t = Target::new();
        let c = t.corpus();
        (t, c)
    });
    let _ = t.dispatch(data);
    t.stream(data);
    if let Some((&pick, rest)) = data.split_first() {
        let base = &corpus[usize::from(pick) % corpus.len()];
        // Keep the valid call header (up to its arguments), then the input.
        if let Ok(c) = tarn_nfs::rpc::parse_call(base) {
            let mut rec = base[..c.args_offset].to_vec();
            rec.extend_from_slice(rest);
            let _ = t.dispatch(&rec);
        }
    }
});

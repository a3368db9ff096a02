//! RPC record marking: any byte stream, cut at the first byte's choice.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_nfs::record::Decoder;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let mut d = Decoder::new(4096);
    let mut out = Vec::new();
    for piece in rest.chunks(usize::from(cut).max(1)) {
        if d.feed(piece, &mut out).is_err() {
            break;
        }
    }
    assert!(out.iter().all(|r| r.len() <= 4096));
});

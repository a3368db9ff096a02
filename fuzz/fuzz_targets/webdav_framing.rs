//! The request framing follower: any byte stream, cut at the first
//! byte's choice.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_webdav::reqwatch::{Heads, Tracker};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let heads = Heads::default();
    let mut t = Tracker::new(heads.clone());
    for piece in rest.chunks(usize::from(cut).max(1)) {
        t.feed(piece);
    }
    let _ = heads.had_fragment("GET", "/");
});

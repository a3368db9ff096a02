//! PROPFIND: the request body's property list, and the multistatus
//! rewriter on any answer bytes, cut at the first byte's choice.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_webdav::propfix::{self, PropFix};

fuzz_target!(|data: &[u8]| {
    let wanted = propfix::requested(data);
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let mut f = PropFix::new(wanted.unwrap_or_else(|| vec![(None, "x".into())]));
    let mut out = Vec::new();
    for piece in rest.chunks(usize::from(cut).max(1)) {
        out.extend(f.feed(piece));
    }
    out.extend(f.finish());
});

//! ONC RPC call headers and credentials.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = tarn_nfs::rpc::parse_call(data) {
        assert!(c.args_offset <= data.len());
    }
});

//! The send stream reader on arbitrary bytes: it must refuse them with an
//! error, never panic or allocate past its bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = tarn_send::stream::StreamReader::new(data);
    for _ in 0..1024 {
        match r.next_record() {
            Ok(Some(_)) => {}
            _ => break,
        }
    }
});

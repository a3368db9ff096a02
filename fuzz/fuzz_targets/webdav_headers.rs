//! WebDAV request headers: each parser on the raw input, then the input
//! as header lines ("Name: value") through the request check.
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue, Method, Version};
use libfuzzer_sys::fuzz_target;
use tarn_webdav::headers;

fuzz_target!(|data: &[u8]| {
    let _ = headers::parse_if(data);
    let _ = headers::parse_etag_list(data);
    let _ = headers::parse_depth(data);
    let _ = headers::parse_timeout(data);
    let _ = headers::parse_destination(data);
    let mut map = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        map.append(n, v);
    }
    for m in [Method::GET, Method::PUT, Method::DELETE] {
        let _ = headers::check(&m, Version::HTTP_11, &map);
    }
    for m in ["COPY", "MOVE", "PROPFIND", "LOCK"] {
        if let Ok(m) = Method::from_bytes(m.as_bytes()) {
            let _ = headers::check(&m, Version::HTTP_10, &map);
        }
    }
});

//! Random and grammar-shaped requests through a live server, end to
//! end: every header tarn or dav-server parses, on every method, with
//! bodies. A panic anywhere shows as a 500 (caught) or a connection
//! dropped without an answer; both fail the test.
//!
//! CI runs a fixed number of cases; `PROPTEST_CASES=N` runs N (see
//! docs/security.md).

mod common;

use std::sync::{Mutex, OnceLock};

use common::*;
use proptest::prelude::*;
use tarn_testkit::data::cases;
use tarn_webdav::{Running, Share};

fn shaped() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<"),
        Just(">"),
        Just("("),
        Just(")"),
        Just("["),
        Just("]"),
        Just("\""),
        Just("W/"),
        Just("Not"),
        Just(" "),
        Just(","),
        Just("*"),
        Just("#"),
        Just("opaquelocktoken:"),
        Just("http://h/s/f"),
        Just("/s/d/"),
        Just("/s/f"),
        Just("Second-"),
        Just("Infinite"),
        Just("infinity"),
        Just("0"),
        Just("1"),
        Just("T"),
        Just("F"),
        Just("x"),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

const METHODS: &[&str] = &[
    "GET",
    "HEAD",
    "PUT",
    "DELETE",
    "MKCOL",
    "COPY",
    "MOVE",
    "PROPFIND",
    "PROPPATCH",
    "LOCK",
    "UNLOCK",
    "OPTIONS",
];
const HEADERS: &[&str] = &[
    "If",
    "If-Match",
    "If-None-Match",
    "If-Range",
    "Depth",
    "Timeout",
    "Destination",
    "Overwrite",
    "Lock-Token",
    "Range",
];
const BODIES: &[&str] = &[
    "",
    r#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:"><D:prop><D:getetag/><x:a xmlns:x="urn:x"/></D:prop></D:propfind>"#,
    r#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:"><D:allprop/></D:propfind>"#,
    r#"<?xml version="1.0"?><D:propertyupdate xmlns:D="DAV:"><D:set><D:prop><x:a xmlns:x="urn:x">v</x:a></D:prop></D:set></D:propertyupdate>"#,
    r#"<?xml version="1.0"?><D:lockinfo xmlns:D="DAV:"><D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype></D:lockinfo>"#,
    "<D:propfind xmlns:D=\"DAV:\"><D:prop><",
    "data",
];

struct World {
    server: Running,
    conn: Option<Http>,
}

/// One server for all cases (never dropped: the process ends first).
static WORLD: OnceLock<Mutex<World>> = OnceLock::new();

fn with_world<R>(f: impl FnOnce(&mut World) -> R) -> R {
    let world = WORLD.get_or_init(|| {
        let server = start(vec![Share::new("s", mem_fs())]);
        let mut c = Http::connect(server.local_addr());
        assert_eq!(c.call("MKCOL", "/s/d/", &[], b"").status, 201);
        assert_eq!(c.call("PUT", "/s/f", &[], b"hello").status, 201);
        Mutex::new(World { server, conn: None })
    });
    let mut w = world.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut w)
}

proptest! {
    #![proptest_config(cases(300))]

    #[test]
    fn fuzz_requests_end_to_end(method in 0..METHODS.len(),
                                target in prop_oneof![Just("/s/f"), Just("/s/d/"), Just("/s/new"), Just("/"), Just("/s/d/%23x")],
                                hs in proptest::collection::vec((0..HEADERS.len(), shaped()), 0..4),
                                body in 0..BODIES.len()) {
        let method = METHODS[method];
        let extra: Vec<String> = hs.iter().map(|(n, v)| format!("{}: {v}", HEADERS[*n])).collect();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        with_world(|w| {
            let addr = w.server.local_addr();
            let c = w.conn.get_or_insert_with(|| Http::connect(addr));
            c.send(method, target, &extra, BODIES[body].as_bytes());
            let resp = c.read(method == "HEAD");
            let resp = match resp {
                Ok(r) => r,
                Err(e) => {
                    w.conn = None;
                    return Err(TestCaseError::fail(format!("{method} {target} {extra:?}: no answer ({e})")));
                }
            };
            let closes = resp
                .header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"));
            if closes || resp.status == 400 {
                // The server may close after an error; start afresh.
                w.conn = None;
            }
            prop_assert!(resp.status != 500, "{method} {target} {extra:?}: 500 {}", resp.text());
            Ok(())
        })?;
    }
}

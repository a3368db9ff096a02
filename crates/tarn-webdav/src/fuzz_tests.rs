//! Robustness: random and grammar-shaped input into every header parser
//! and stream follower the server runs on client bytes never panics;
//! where the answer must not depend on how the bytes were cut into
//! reads, it does not.
//!
//! CI runs a fixed number of cases; `PROPTEST_CASES=N` runs N per test
//! (see docs/security.md).

use http::{HeaderMap, HeaderName, HeaderValue, Method, Version};
use proptest::prelude::*;
use tarn_testkit::data::cases;

use crate::headers;
use crate::propfix::{self, PropFix};
use crate::reqwatch::{Heads, Tracker};

/// Strings made of the pieces header grammars are built from.
fn shaped() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<".to_string()),
        Just(">".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just("\"".to_string()),
        Just("W/".to_string()),
        Just("Not".to_string()),
        Just(" ".to_string()),
        Just(",".to_string()),
        Just("*".to_string()),
        Just("#".to_string()),
        Just("opaquelocktoken:".to_string()),
        Just("http://h/s/f".to_string()),
        Just("/s/d/".to_string()),
        Just("Second-".to_string()),
        Just("Infinite".to_string()),
        Just("infinity".to_string()),
        Just("noroot".to_string()),
        "[0-9]{1,12}",
        "[a-zA-Z:/.-]{1,6}",
    ];
    proptest::collection::vec(piece, 0..14).prop_map(|v| v.concat())
}

const NAMES: &[&str] = &[
    "if",
    "if-match",
    "if-none-match",
    "if-range",
    "depth",
    "timeout",
    "destination",
    "overwrite",
    "host",
    "lock-token",
];

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn fuzz_header_parsers(v in prop_oneof![shaped().prop_map(String::into_bytes),
                                             proptest::collection::vec(any::<u8>(), 0..80)]) {
        let _ = headers::parse_if(&v);
        let _ = headers::parse_etag_list(&v);
        let _ = headers::parse_depth(&v);
        let _ = headers::parse_timeout(&v);
        let _ = headers::parse_destination(&v);
        let _ = headers::is_entity_tag(&v);
    }

    /// Whole header sets through the request check.
    #[test]
    fn fuzz_header_check(hs in proptest::collection::vec((0..NAMES.len(), shaped()), 0..6),
                         method in prop_oneof![Just("GET"), Just("PUT"), Just("COPY"), Just("MOVE"),
                                               Just("PROPFIND"), Just("LOCK"), Just("DELETE")],
                         v11 in any::<bool>()) {
        let mut map = HeaderMap::new();
        for (n, v) in hs {
            if let Ok(v) = HeaderValue::from_str(&v) {
                map.append(HeaderName::from_static(NAMES[n]), v);
            }
        }
        let m = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
        let ver = if v11 { Version::HTTP_11 } else { Version::HTTP_10 };
        let _ = headers::check(&m, ver, &map);
    }

    /// An accepted If header's lists each hold at least one condition.
    #[test]
    fn fuzz_if_accepts_only_well_formed(v in shaped()) {
        if let Ok(lists) = headers::parse_if(v.as_bytes()) {
            prop_assert!(!lists.is_empty());
            prop_assert!(lists.iter().all(|l| !l.conditions.is_empty()));
            prop_assert!(v.matches('(').count() >= lists.len());
        }
    }

    /// Request framing: random bytes never panic; real request streams
    /// give the same heads however they are cut.
    #[test]
    fn fuzz_request_framing(noise in proptest::collection::vec(any::<u8>(), 0..300),
                            reqs in proptest::collection::vec((0usize..4, "[a-z#%]{0,8}", 0usize..40, any::<bool>()), 1..6),
                            split in 1usize..64) {
        let mut t = Tracker::new(Heads::default());
        for piece in noise.chunks(split) {
            t.feed(piece);
        }
        let mut stream = Vec::new();
        for (m, path, body, chunked) in &reqs {
            let method = ["GET", "PUT", "DELETE", "PROPFIND"][*m];
            stream.extend_from_slice(format!("{method} /s/{path} HTTP/1.1\r\nHost: h\r\n").as_bytes());
            let data = vec![b'#'; *body];
            if *chunked {
                stream.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                for c in data.chunks(7) {
                    stream.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                    stream.extend_from_slice(c);
                    stream.extend_from_slice(b"\r\n");
                }
                stream.extend_from_slice(b"0\r\n\r\n");
            } else {
                stream.extend_from_slice(format!("Content-Length: {}\r\n\r\n", data.len()).as_bytes());
                stream.extend_from_slice(&data);
            }
        }
        let heads_of = |step: usize| {
            let heads = Heads::default();
            let mut t = Tracker::new(heads.clone());
            for piece in stream.chunks(step) {
                t.feed(piece);
            }
            prop_assert!(!t.lost());
            Ok(reqs.iter().map(|(m, path, _, _)| {
                let method = ["GET", "PUT", "DELETE", "PROPFIND"][*m];
                let target = format!("/s/{path}");
                let target = target.split('#').next().unwrap_or("").to_string();
                heads.had_fragment(method, &target)
            }).collect::<Vec<bool>>())
        };
        let want: Vec<bool> = reqs.iter().map(|(_, p, _, _)| p.contains('#')).collect();
        prop_assert_eq!(heads_of(stream.len())?, want.clone());
        prop_assert_eq!(heads_of(split)?, want);
    }

    /// PROPFIND answers: random bytes pass through unchanged (less what
    /// a cut construct holds back until the end); real multistatus
    /// bodies give the same output however they are cut.
    #[test]
    fn fuzz_propfind_rewrite(noise in proptest::collection::vec(any::<u8>(), 0..300),
                             props in proptest::collection::vec(("[a-z]{1,5}", any::<bool>()), 1..5),
                             n in 1usize..5, split in 1usize..40) {
        let mut f = PropFix::new(vec![(None, "x".into())]);
        let mut out = Vec::new();
        for piece in noise.chunks(split) {
            out.extend(f.feed(piece));
        }
        out.extend(f.finish());
        prop_assert_eq!(&out, &noise);

        let mut req = String::from(r#"<D:propfind xmlns:D="DAV:" xmlns:z="urn:z"><D:prop>"#);
        for (p, _) in &props {
            req.push_str(&format!("<z:{p}/>"));
        }
        req.push_str("</D:prop></D:propfind>");
        let wanted = propfix::requested(req.as_bytes());
        prop_assert!(wanted.is_some());
        let mut body = String::from(r#"<?xml version="1.0"?><D:multistatus xmlns:D="DAV:">"#);
        for i in 0..n {
            body.push_str(&format!("<D:response><D:href>/s/{i}</D:href><D:propstat><D:prop>"));
            for (p, present) in &props {
                if *present {
                    body.push_str(&format!("<z:{p} xmlns:z=\"urn:z\">v&lt;/D:response&gt;</z:{p}>"));
                }
            }
            body.push_str("</D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>");
        }
        body.push_str("</D:multistatus>");
        let run = |step: usize| {
            let mut f = PropFix::new(wanted.clone().unwrap_or_default());
            let mut out = Vec::new();
            for piece in body.as_bytes().chunks(step) {
                out.extend(f.feed(piece));
            }
            out.extend(f.finish());
            out
        };
        let whole = run(body.len());
        prop_assert_eq!(&run(split), &whole);
        let doc = xmltree::Element::parse(whole.as_slice());
        prop_assert!(doc.is_ok(), "{}", String::from_utf8_lossy(&whole));
        let missing = props
            .iter()
            .filter(|(name, _)| !props.iter().any(|(n, present)| n == name && *present))
            .count();
        let text = String::from_utf8_lossy(&whole);
        prop_assert_eq!(text.matches("404 Not Found").count(), if missing > 0 { n } else { 0 });
    }
}

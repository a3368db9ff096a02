//! Completes PROPFIND answers: every property a `<D:prop>` request names
//! is reported for every resource (RFC 4918 §9.1).
//!
//! dav-server leaves out of its multistatus each requested property it
//! does not have (a removed dead property, `getcontentlength` of a
//! collection) instead of listing it in a propstat with status 404, and
//! clients cannot tell "absent" from "forgotten". [`PropFix`] rewrites
//! the answer as it streams: it cuts the body into its `<D:response>`
//! elements (one at a time in memory), and adds to each a 404 propstat
//! for the requested properties it lacks. A response it cannot parse is
//! passed on unchanged.

use std::collections::HashSet;
use std::io::Cursor;

use xmltree::{Element, XMLNode};

const DAV: &str = "DAV:";

/// Deepest element nesting a request's XML body (PROPFIND, PROPPATCH,
/// LOCK) may have. Their bodies are a few levels deep; the parsers that
/// build them into trees (here and in the WebDAV library) recurse once
/// per level, so a 64 KiB body of nothing but nested elements would
/// overflow a worker's stack, which kills the process rather than
/// failing the request.
pub const MAX_XML_DEPTH: usize = 64;

/// Most properties one PROPFIND may name (the children of its `prop` or
/// `include`, in any namespace, repeats counted): every resource of the
/// answer lists each of them, so a body of thousands of names would make
/// the answer to a folder thousands of times its size. Clients name a
/// few dozen at most.
pub const MAX_REQUESTED: usize = 256;

/// How many properties a PROPFIND body names: its elements three levels
/// down (`propfind`, then `prop` or `include`, then the names), counted
/// as the WebDAV library will answer them, whatever their namespace and
/// however often one repeats. A body that does not parse counts what
/// came before the error.
pub fn requested_count(body: &[u8]) -> usize {
    use xml::reader::XmlEvent;
    let (mut depth, mut n) = (0usize, 0usize);
    for ev in xml::EventReader::new(body) {
        match ev {
            Ok(XmlEvent::StartElement { .. }) => {
                depth += 1;
                if depth == 3 {
                    n += 1;
                }
            }
            Ok(XmlEvent::EndElement { .. }) => depth = depth.saturating_sub(1),
            Ok(XmlEvent::EndDocument) | Err(_) => break,
            Ok(_) => {}
        }
    }
    n
}

/// True when `body` nests elements at most `max` deep, found with a
/// streaming reader (no recursion) that stops at the first element too
/// deep. A body that does not parse is not judged here: the parser that
/// reads it next reports that.
pub fn nesting_within(body: &[u8], max: usize) -> bool {
    use xml::reader::XmlEvent;
    let mut depth = 0usize;
    for ev in xml::EventReader::new(body) {
        match ev {
            Ok(XmlEvent::StartElement { .. }) => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            Ok(XmlEvent::EndElement { .. }) => depth = depth.saturating_sub(1),
            Ok(XmlEvent::EndDocument) | Err(_) => break,
            Ok(_) => {}
        }
    }
    true
}

/// A property name: namespace (None: no namespace) and local name.
pub type PropName = (Option<String>, String);

/// The properties named by a PROPFIND body of the `<D:prop>` kind; None
/// for `allprop`, `propname`, an empty body or one that does not parse
/// (dav-server answers those as it sees fit).
pub fn requested(body: &[u8]) -> Option<Vec<PropName>> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return None;
    }
    let root = Element::parse(Cursor::new(body)).ok()?;
    if root.name != "propfind" || root.namespace.as_deref() != Some(DAV) {
        return None;
    }
    let prop = children(&root).find(|e| e.name == "prop" && is_dav(e))?;
    let mut out: Vec<PropName> = Vec::new();
    let mut seen: HashSet<PropName> = HashSet::new();
    for e in children(prop) {
        let n = (
            e.namespace.clone().filter(|n| !n.is_empty()),
            e.name.clone(),
        );
        if seen.insert(n.clone()) {
            out.push(n);
        }
    }
    (!out.is_empty()).then_some(out)
}

fn is_dav(e: &Element) -> bool {
    e.namespace.as_deref() == Some(DAV)
}

fn children(e: &Element) -> impl Iterator<Item = &Element> {
    e.children.iter().filter_map(|c| match c {
        XMLNode::Element(e) => Some(e),
        _ => None,
    })
}

fn escape_attr(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A streaming rewriter of one multistatus body.
pub struct PropFix {
    requested: Vec<PropName>,
    pending: Vec<u8>,
    /// Bytes of `pending` already scanned.
    pos: usize,
    /// Element depth at `pos`.
    depth: usize,
    /// The root element's start tag and name, once seen.
    root: Option<(Vec<u8>, Vec<u8>)>,
    /// Offset in `pending` of the `<D:response>` being read.
    resp_start: Option<usize>,
}

/// Where the construct starting at a `<` ends: the offset just past it.
fn construct_end(buf: &[u8], at: usize) -> Option<usize> {
    let rest = &buf[at..];
    let find = |pat: &[u8], from: usize| {
        rest.get(from..)?
            .windows(pat.len())
            .position(|w| w == pat)
            .map(|i| at + from + i + pat.len())
    };
    if rest.starts_with(b"<?") {
        find(b"?>", 2)
    } else if rest.starts_with(b"<!--") {
        find(b"-->", 4)
    } else if rest.starts_with(b"<![CDATA[") {
        find(b"]]>", 9)
    } else if rest.len() < 9 && (b"<![CDATA[".starts_with(rest) || b"<!--".starts_with(rest)) {
        None
    } else {
        // A tag: up to the first '>' outside quotes.
        let mut quote = None;
        for (i, &b) in rest.iter().enumerate().skip(1) {
            match (quote, b) {
                (None, b'"' | b'\'') => quote = Some(b),
                (Some(q), b) if b == q => quote = None,
                (None, b'>') => return Some(at + i + 1),
                _ => {}
            }
        }
        None
    }
}

impl PropFix {
    /// A rewriter adding 404 propstats for `requested` properties.
    pub fn new(requested: Vec<PropName>) -> PropFix {
        PropFix {
            requested,
            pending: Vec::new(),
            pos: 0,
            depth: 0,
            root: None,
            resp_start: None,
        }
    }

    /// Feeds body bytes; returns the bytes ready to send.
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            let Some(lt) = self.pending[self.pos..].iter().position(|&b| b == b'<') else {
                self.pos = self.pending.len();
                break;
            };
            let at = self.pos + lt;
            let Some(end) = construct_end(&self.pending, at) else {
                self.pos = at;
                break;
            };
            let tag = &self.pending[at..end];
            self.pos = end;
            if tag.starts_with(b"<?") || tag.starts_with(b"<!") {
                continue;
            }
            if tag.starts_with(b"</") {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 1 {
                    if let Some(start) = self.resp_start.take() {
                        self.finish_response(start, end, &mut out);
                    }
                }
                continue;
            }
            let empty = tag.ends_with(b"/>");
            match self.depth {
                0 => {
                    let name_end = tag[1..]
                        .iter()
                        .position(|b| b.is_ascii_whitespace() || *b == b'>' || *b == b'/')
                        .map_or(tag.len(), |i| i + 1);
                    self.root = Some((tag.to_vec(), tag[1..name_end].to_vec()));
                }
                1 if empty => {
                    self.finish_response(at, end, &mut out);
                    continue;
                }
                1 => self.resp_start = Some(at),
                _ => {}
            }
            if !empty {
                self.depth += 1;
            }
        }
        // Everything before the response being read can go.
        let keep_from = self.resp_start.unwrap_or(self.pos);
        out.extend_from_slice(&self.pending[..keep_from]);
        self.pending.drain(..keep_from);
        self.pos -= keep_from;
        if let Some(s) = &mut self.resp_start {
            *s -= keep_from;
        }
        out
    }

    /// The rest of the body at its end.
    pub fn finish(&mut self) -> Vec<u8> {
        self.resp_start = None;
        self.pos = 0;
        std::mem::take(&mut self.pending)
    }

    /// Emits `pending[..end]`, the response `[start..end]` completed.
    fn finish_response(&mut self, start: usize, end: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pending[..start]);
        let resp = self.pending[start..end].to_vec();
        match self.missing_propstat(&resp) {
            Some((close_at, extra)) => {
                out.extend_from_slice(&resp[..close_at]);
                out.extend_from_slice(extra.as_bytes());
                out.extend_from_slice(&resp[close_at..]);
            }
            None => out.extend_from_slice(&resp),
        }
        self.pending.drain(..end);
        self.pos -= end;
    }

    /// For a `<D:response>` lacking requested properties: where to insert
    /// and the propstat to insert.
    fn missing_propstat(&self, resp: &[u8]) -> Option<(usize, String)> {
        let (root_tag, root_name) = self.root.as_ref()?;
        if resp.ends_with(b"/>") {
            return None;
        }
        let mut doc = root_tag.clone();
        doc.extend_from_slice(resp);
        doc.extend_from_slice(b"</");
        doc.extend_from_slice(root_name);
        doc.push(b'>');
        let root = Element::parse(Cursor::new(doc)).ok()?;
        let r = children(&root).next()?;
        if r.name != "response" || !is_dav(r) {
            return None;
        }
        let mut present: Vec<PropName> = Vec::new();
        for ps in children(r).filter(|e| e.name == "propstat" && is_dav(e)) {
            for p in children(ps).filter(|e| e.name == "prop" && is_dav(e)) {
                for e in children(p) {
                    present.push((
                        e.namespace.clone().filter(|n| !n.is_empty()),
                        e.name.clone(),
                    ));
                }
            }
        }
        let missing: Vec<&PropName> = self
            .requested
            .iter()
            .filter(|n| !present.contains(n))
            .collect();
        if missing.is_empty() {
            return None;
        }
        // The response's prefix for DAV:, as its own tag spells it.
        let name_end = resp[1..]
            .iter()
            .position(|b| b.is_ascii_whitespace() || *b == b'>')
            .map_or(resp.len(), |i| i + 1);
        let tag = std::str::from_utf8(&resp[1..name_end]).ok()?;
        let prefix = tag.rsplit_once(':').map_or("", |(p, _)| p);
        let q = |local: &str| {
            if prefix.is_empty() {
                local.to_string()
            } else {
                format!("{prefix}:{local}")
            }
        };
        let mut x = format!("<{}><{}>", q("propstat"), q("prop"));
        for (ns, name) in missing {
            let ns = ns.as_deref().map(escape_attr).unwrap_or_default();
            x.push_str(&format!("<{name} xmlns=\"{ns}\"/>"));
        }
        x.push_str(&format!(
            "</{}><{}>HTTP/1.1 404 Not Found</{}></{}>",
            q("prop"),
            q("status"),
            q("status"),
            q("propstat")
        ));
        let close_at = resp.windows(2).rposition(|w| w == b"</")?;
        Some((close_at, x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize, attr: &str) -> Vec<u8> {
        let mut b = String::from("<?xml version=\"1.0\"?>");
        for _ in 0..depth {
            b.push_str(&format!("<a{attr}>"));
        }
        for _ in 0..depth {
            b.push_str("</a>");
        }
        b.into_bytes()
    }

    #[test]
    fn nesting_is_measured_by_elements_not_bytes() {
        assert!(nesting_within(&nested(MAX_XML_DEPTH, ""), MAX_XML_DEPTH));
        assert!(!nesting_within(
            &nested(MAX_XML_DEPTH + 1, ""),
            MAX_XML_DEPTH
        ));
        assert!(!nesting_within(&nested(30_000, ""), MAX_XML_DEPTH));
        // Markup inside attribute values and comments nests nothing, and
        // cannot hide nesting either.
        assert!(!nesting_within(
            &nested(100, r#" x="/>&lt;/a>""#),
            MAX_XML_DEPTH
        ));
        let flat = b"<?xml version=\"1.0\"?><a><!-- <b><c><d> --><b x=\"&lt;b>&lt;b>\"/><b/></a>";
        assert!(nesting_within(flat, 2));
        assert!(!nesting_within(flat, 1));
        // Siblings do not add up.
        let wide: String = std::iter::once("<r>".to_string())
            .chain((0..1000).map(|_| "<p><q/></p>".to_string()))
            .chain(std::iter::once("</r>".to_string()))
            .collect();
        assert!(nesting_within(wide.as_bytes(), 3));
        // Not XML at all: left to the parser that follows.
        assert!(nesting_within(b"<<<>>>", 1));
    }

    const REQ: &[u8] = br#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:" xmlns:x="urn:x"><D:prop><x:gone/><D:getetag/><plain xmlns=""/></D:prop></D:propfind>"#;

    fn body() -> Vec<u8> {
        br#"<?xml version="1.0" encoding="utf-8"?><D:multistatus xmlns:D="DAV:"><D:response><D:href>/s/a</D:href><D:propstat><D:prop><D:getetag>"1"</D:getetag></D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response><D:response><D:href>/s/b</D:href><D:propstat><D:prop><D:getetag>"&lt;/D:response&gt;"</D:getetag><plain xmlns=""><![CDATA[</D:response>]]></plain></D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response></D:multistatus>"#.to_vec()
    }

    fn rewrite(split: usize) -> Vec<u8> {
        let mut f = PropFix::new(requested(REQ).unwrap());
        let mut out = Vec::new();
        for piece in body().chunks(split) {
            out.extend(f.feed(piece));
        }
        out.extend(f.finish());
        out
    }

    #[test]
    fn requested_names() {
        assert_eq!(
            requested(REQ).unwrap(),
            vec![
                (Some("urn:x".to_string()), "gone".to_string()),
                (Some("DAV:".to_string()), "getetag".to_string()),
                (None, "plain".to_string()),
            ]
        );
        assert_eq!(requested(b""), None);
        assert_eq!(
            requested(br#"<D:propfind xmlns:D="DAV:"><D:allprop/></D:propfind>"#),
            None
        );
        assert_eq!(requested(b"<not xml"), None);
    }

    #[test]
    fn adds_404_propstats_in_any_split() {
        let whole = rewrite(usize::MAX);
        let doc = Element::parse(Cursor::new(whole.clone())).expect("well-formed");
        let rs: Vec<&Element> = children(&doc).collect();
        assert_eq!(rs.len(), 2);
        let missing = |r: &Element| -> Vec<String> {
            children(r)
                .filter(|e| e.name == "propstat")
                .filter(|ps| {
                    children(ps).any(|s| {
                        s.name == "status" && s.get_text().unwrap_or_default().contains("404")
                    })
                })
                .flat_map(|ps| children(ps).filter(|e| e.name == "prop").flat_map(children))
                .map(|e| format!("{:?}:{}", e.namespace, e.name))
                .collect()
        };
        assert_eq!(
            missing(rs[0]),
            vec!["Some(\"urn:x\"):gone".to_string(), "None:plain".to_string()]
        );
        assert_eq!(missing(rs[1]), vec!["Some(\"urn:x\"):gone".to_string()]);
        for split in [1, 2, 5, 13, 100] {
            assert_eq!(rewrite(split), whole, "split {split}");
        }
    }

    #[test]
    fn garbage_passes_through() {
        let mut f = PropFix::new(vec![(None, "x".into())]);
        let mut out = f.feed(b"<a><b></c><<<'\">");
        out.extend(f.finish());
        assert_eq!(out, b"<a><b></c><<<'\">");
    }
}

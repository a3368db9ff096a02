//! Dead properties (PROPPATCH / PROPFIND) stored as extended attributes.
//!
//! One property is one xattr named `user.tarn.dav.` + 32 hex digits of
//! BLAKE3(namespace ‖ 0 ‖ name). Hashing keeps every xattr name short
//! (a property's namespace URI plus name can be far longer than the
//! 255-byte xattr name limit) and makes every name the same length. The
//! value holds the full identity (namespace, name, prefix) and the raw XML,
//! so listing needs no other index and a lookup verifies that the stored
//! property really is the one asked for.
//!
//! Value layout: `TDP1`, then namespace, prefix (each: a presence byte, and
//! if present a u32 little-endian length and UTF-8 bytes), name (u32 length
//! and bytes), xml (presence byte, u32 length, bytes).

use dav_server::fs::DavProp;

/// Namespace of the xattrs that hold dead properties.
pub const XATTR_PREFIX: &[u8] = b"user.tarn.dav.";
const MAGIC: &[u8; 4] = b"TDP1";

/// The xattr name for property `name` in namespace `ns`.
pub fn xattr_name(ns: Option<&str>, name: &str) -> Vec<u8> {
    let mut h = blake3::Hasher::new();
    h.update(ns.unwrap_or("").as_bytes());
    h.update(&[0]);
    h.update(name.as_bytes());
    let digest = h.finalize();
    let mut out = XATTR_PREFIX.to_vec();
    for b in &digest.as_bytes()[..16] {
        out.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    out
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Property values are bounded by the request body limit (64 KiB), far
    // below u32::MAX.
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_opt(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            out.push(1);
            put_bytes(out, b);
        }
        None => out.push(0),
    }
}

/// Serializes a property for storage.
pub fn encode(p: &DavProp) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    put_opt(&mut out, p.namespace.as_deref().map(str::as_bytes));
    put_opt(&mut out, p.prefix.as_deref().map(str::as_bytes));
    put_bytes(&mut out, p.name.as_bytes());
    put_opt(&mut out, p.xml.as_deref());
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
        self.take(len)
    }
    fn opt(&mut self) -> Option<Option<&'a [u8]>> {
        match self.take(1)?[0] {
            0 => Some(None),
            1 => Some(Some(self.bytes()?)),
            _ => None,
        }
    }
}

fn string(b: &[u8]) -> Option<String> {
    String::from_utf8(b.to_vec()).ok()
}

/// Parses a stored property (None if the value is not one of ours).
pub fn decode(v: &[u8]) -> Option<DavProp> {
    let mut r = Reader(v);
    if r.take(4)? != MAGIC {
        return None;
    }
    let namespace = match r.opt()? {
        Some(b) => Some(string(b)?),
        None => None,
    };
    let prefix = match r.opt()? {
        Some(b) => Some(string(b)?),
        None => None,
    };
    let name = string(r.bytes()?)?;
    let xml = r.opt()?.map(<[u8]>::to_vec);
    if !r.0.is_empty() {
        return None;
    }
    Some(DavProp {
        name,
        prefix,
        namespace,
        xml,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_names() {
        let long_ns = "urn:".to_string() + &"x".repeat(1000);
        let p = DavProp {
            name: "n".repeat(300),
            prefix: Some("ns1".into()),
            namespace: Some(long_ns.clone()),
            xml: Some(b"<ns1:n xmlns:ns1=\"..\">v</ns1:n>".to_vec()),
        };
        let q = decode(&encode(&p)).unwrap();
        assert_eq!(
            (q.name, q.prefix, q.namespace, q.xml),
            (p.name.clone(), p.prefix.clone(), p.namespace.clone(), p.xml)
        );
        let n = xattr_name(Some(&long_ns), &p.name);
        assert!(n.len() <= 255 && n.starts_with(XATTR_PREFIX));
        assert_ne!(n, xattr_name(None, &p.name));
        // namespace/name boundaries are unambiguous
        assert_ne!(xattr_name(Some("ab"), "c"), xattr_name(Some("a"), "bc"));
        let none = DavProp {
            name: "x".into(),
            prefix: None,
            namespace: None,
            xml: None,
        };
        let q = decode(&encode(&none)).unwrap();
        assert!(q.namespace.is_none() && q.prefix.is_none() && q.xml.is_none());
        assert!(decode(b"TDP1\x02").is_none());
        assert!(decode(b"junk").is_none());
        let mut trailing = encode(&none);
        trailing.push(0);
        assert!(decode(&trailing).is_none());
    }
}

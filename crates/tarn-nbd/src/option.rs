//! Decoders of what the client sends during the handshake: the option
//! header and the payloads of `NBD_OPT_EXPORT_NAME`, `NBD_OPT_INFO` /
//! `NBD_OPT_GO` and the two metadata context options.
//!
//! They are pure functions over bytes already read (the caller bounds an
//! option's length before reading it), never panic, and never allocate
//! from a count the client sent: a list is collected only as its entries
//! are actually present in the payload, so a count of four billion
//! queries in a 20-byte option fails at the first missing byte.

use crate::proto::{self, MAX_STRING};

/// Why an option could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// The option header does not start with `IHAVEOPT`; nothing after
    /// it can be trusted, so the connection is closed.
    #[error("bad option magic {0:#018x}")]
    BadMagic(u64),
    /// The payload is shorter than its own fields say.
    #[error("option data ends inside the {0}")]
    Short(&'static str),
    /// The payload has bytes after its last field.
    #[error("{0} unexpected bytes after the option data")]
    Trailing(usize),
    /// A string is over 4096 bytes, not UTF-8, or holds a NUL.
    #[error("invalid {0}: longer than 4096 bytes, not UTF-8, or containing NUL")]
    BadString(&'static str),
    /// A metadata context query without a namespace (no colon).
    #[error("metadata context query {0:?} has no namespace")]
    NoNamespace(String),
}

/// An option's header: which option, and how many payload bytes follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option code (`NBD_OPT_*`).
    pub option: u32,
    /// Payload bytes after the header.
    pub len: u32,
}

/// Decodes an option header.
pub fn decode_header(b: &[u8; proto::OPTION_HEADER_LEN]) -> Result<OptionHeader, OptionError> {
    let magic = u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    if magic != proto::IHAVEOPT {
        return Err(OptionError::BadMagic(magic));
    }
    Ok(OptionHeader {
        option: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        len: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
    })
}

/// The payload of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    /// The export asked for; empty means the default export.
    pub name: String,
    /// The `NBD_INFO_*` items asked for, in the client's order.
    pub items: Vec<u16>,
}

/// The payload of `NBD_OPT_LIST_META_CONTEXT` and
/// `NBD_OPT_SET_META_CONTEXT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRequest {
    /// The export the contexts are for.
    pub name: String,
    /// The queries, each `namespace:leaf`.
    pub queries: Vec<String>,
}

/// Which of this server's contexts a set of queries names. Only
/// `base:allocation` exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaMatch {
    /// `base:allocation` is named.
    pub base_allocation: bool,
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], OptionError> {
        if self.b.len() < n {
            return Err(OptionError::Short(what));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, OptionError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, OptionError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A string prefixed by its 32-bit length.
    fn string(&mut self, what: &'static str) -> Result<String, OptionError> {
        let len = self.u32(what)? as usize;
        if len > MAX_STRING {
            return Err(OptionError::BadString(what));
        }
        let b = self.take(len, what)?;
        string(b, what)
    }

    fn end(&self) -> Result<(), OptionError> {
        match self.b.len() {
            0 => Ok(()),
            n => Err(OptionError::Trailing(n)),
        }
    }
}

/// A protocol string: at most 4096 bytes of UTF-8 without NUL.
fn string(b: &[u8], what: &'static str) -> Result<String, OptionError> {
    if b.len() > MAX_STRING || b.contains(&0) {
        return Err(OptionError::BadString(what));
    }
    String::from_utf8(b.to_vec()).map_err(|_| OptionError::BadString(what))
}

/// The payload of `NBD_OPT_EXPORT_NAME`: the whole of it is the name.
pub fn decode_export_name(data: &[u8]) -> Result<String, OptionError> {
    string(data, "export name")
}

/// Decodes the payload of `NBD_OPT_INFO` / `NBD_OPT_GO`: name length,
/// name, count of info items, the items; nothing may follow.
pub fn decode_info(data: &[u8]) -> Result<InfoRequest, OptionError> {
    let mut r = Reader { b: data };
    let name = r.string("export name")?;
    let n = r.u16("information request count")?;
    let raw = r.take(2 * n as usize, "information requests")?;
    r.end()?;
    let items = raw
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Ok(InfoRequest { name, items })
}

/// Decodes the payload of the metadata context options: name, count of
/// queries, the queries; nothing may follow.
pub fn decode_meta(data: &[u8]) -> Result<MetaRequest, OptionError> {
    let mut r = Reader { b: data };
    let name = r.string("export name")?;
    let n = r.u32("query count")?;
    // Collected as they are found: `n` only bounds the loop.
    let mut queries = Vec::new();
    for _ in 0..n {
        queries.push(r.string("query")?);
    }
    r.end()?;
    Ok(MetaRequest { name, queries })
}

/// Matches the queries of `NBD_OPT_LIST_META_CONTEXT`: no query lists
/// everything; `base:` is the wildcard of its namespace; a query of an
/// unknown namespace is ignored, one without a namespace is invalid.
pub fn match_list(queries: &[String]) -> Result<MetaMatch, OptionError> {
    if queries.is_empty() {
        return Ok(MetaMatch {
            base_allocation: true,
        });
    }
    let mut m = MetaMatch {
        base_allocation: false,
    };
    for q in queries {
        let (ns, leaf) = split_query(q)?;
        if ns == "base" && (leaf.is_empty() || leaf == "allocation") {
            m.base_allocation = true;
        }
    }
    Ok(m)
}

/// Matches the queries of `NBD_OPT_SET_META_CONTEXT`: only an exact
/// `base:allocation` selects it (the `base:` wildcard selects nothing
/// here); unknown names are ignored, a query without a namespace is
/// invalid.
pub fn match_set(queries: &[String]) -> Result<MetaMatch, OptionError> {
    let mut m = MetaMatch {
        base_allocation: false,
    };
    for q in queries {
        split_query(q)?;
        if q == proto::BASE_ALLOCATION {
            m.base_allocation = true;
        }
    }
    Ok(m)
}

fn split_query(q: &str) -> Result<(&str, &str), OptionError> {
    match q.split_once(':') {
        Some((ns, leaf)) if !ns.is_empty() => Ok((ns, leaf)),
        _ => Err(OptionError::NoNamespace(q.to_string())),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(option: u32, len: u32) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&proto::IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&option.to_be_bytes());
        b[12..].copy_from_slice(&len.to_be_bytes());
        b
    }

    pub(crate) fn info_payload(name: &[u8], items: &[u16]) -> Vec<u8> {
        let mut b = (name.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(name);
        b.extend_from_slice(&(items.len() as u16).to_be_bytes());
        for i in items {
            b.extend_from_slice(&i.to_be_bytes());
        }
        b
    }

    pub(crate) fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
        let mut b = (name.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            b.extend_from_slice(&(q.len() as u32).to_be_bytes());
            b.extend_from_slice(q.as_bytes());
        }
        b
    }

    #[test]
    fn header_roundtrip_and_bad_magic() {
        let h = decode_header(&header(proto::opt::GO, 12)).unwrap();
        assert_eq!((h.option, h.len), (7, 12));
        let mut bad = header(1, 0);
        bad[0] ^= 1;
        assert!(matches!(decode_header(&bad), Err(OptionError::BadMagic(_))));
    }

    #[test]
    fn info_request_decodes_and_checks_lengths() {
        let p = info_payload(b"vol", &[proto::info::NAME, proto::info::BLOCK_SIZE]);
        assert_eq!(
            decode_info(&p).unwrap(),
            InfoRequest {
                name: "vol".into(),
                items: vec![1, 3]
            }
        );
        assert_eq!(decode_info(&info_payload(b"", &[])).unwrap().name, "");
        // A name longer than the option.
        let mut p = info_payload(b"vol", &[]);
        p[3] = 200;
        assert_eq!(decode_info(&p), Err(OptionError::Short("export name")));
        // Fewer items than counted.
        let mut p = info_payload(b"v", &[1, 2]);
        p.truncate(p.len() - 1);
        assert_eq!(
            decode_info(&p),
            Err(OptionError::Short("information requests"))
        );
        // Extra bytes.
        let mut p = info_payload(b"v", &[]);
        p.push(0);
        assert_eq!(decode_info(&p), Err(OptionError::Trailing(1)));
        // Too short for the count.
        assert_eq!(
            decode_info(&[0, 0, 0, 0, 0]),
            Err(OptionError::Short("information request count"))
        );
        // Not UTF-8, NUL.
        assert!(matches!(
            decode_info(&info_payload(&[0xff], &[])),
            Err(OptionError::BadString(_))
        ));
        assert!(matches!(
            decode_info(&info_payload(b"a\0b", &[])),
            Err(OptionError::BadString(_))
        ));
        // A name over 4096 bytes is refused even when present.
        assert!(matches!(
            decode_info(&info_payload(&[b'a'; 4097], &[])),
            Err(OptionError::BadString(_))
        ));
    }

    #[test]
    fn export_name_is_the_whole_payload() {
        assert_eq!(decode_export_name(b"disk0").unwrap(), "disk0");
        assert_eq!(decode_export_name(b"").unwrap(), "");
        assert!(decode_export_name(&[b'x'; 4097]).is_err());
    }

    #[test]
    fn meta_request_decodes() {
        let p = meta_payload("vol", &["base:allocation", "qemu:dirty-bitmap:x"]);
        let m = decode_meta(&p).unwrap();
        assert_eq!(m.name, "vol");
        assert_eq!(m.queries, ["base:allocation", "qemu:dirty-bitmap:x"]);
        // A huge count with nothing behind it fails without allocating.
        let mut p = meta_payload("vol", &[]);
        let at = p.len() - 4;
        p[at..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_meta(&p), Err(OptionError::Short("query")));
        let mut p = meta_payload("vol", &["base:allocation"]);
        p.extend_from_slice(&[1, 2]);
        assert_eq!(decode_meta(&p), Err(OptionError::Trailing(2)));
    }

    #[test]
    fn query_matching() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(match_list(&[]).unwrap().base_allocation);
        assert!(match_list(&s(&["base:"])).unwrap().base_allocation);
        assert!(
            match_list(&s(&["base:allocation"]))
                .unwrap()
                .base_allocation
        );
        assert!(
            !match_list(&s(&["base:other", "qemu:"]))
                .unwrap()
                .base_allocation
        );
        assert!(match_list(&s(&["nocolon"])).is_err());
        assert!(match_list(&s(&[":leaf"])).is_err());
        assert!(!match_set(&[]).unwrap().base_allocation);
        assert!(!match_set(&s(&["base:"])).unwrap().base_allocation);
        assert!(
            match_set(&s(&["x-a:b", "base:allocation"]))
                .unwrap()
                .base_allocation
        );
        assert!(match_set(&s(&["base"])).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_option_decoders(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_info(&data);
            let _ = decode_meta(&data);
            let _ = decode_export_name(&data);
            if let Ok(m) = decode_meta(&data) {
                let _ = match_list(&m.queries);
                let _ = match_set(&m.queries);
            }
            let mut h = [0u8; 16];
            for (d, s) in h.iter_mut().zip(&data) {
                *d = *s;
            }
            let _ = decode_header(&h);
        }

        #[test]
        fn well_formed_info_requests_roundtrip(name in "[a-z0-9/._-]{0,64}", items in proptest::collection::vec(any::<u16>(), 0..32)) {
            let p = info_payload(name.as_bytes(), &items);
            let r = decode_info(&p).unwrap();
            prop_assert_eq!(r.name, name);
            prop_assert_eq!(r.items, items);
            // Any shorter prefix is refused, never misread.
            for cut in 0..p.len() {
                prop_assert!(decode_info(&p[..cut]).is_err());
            }
        }
    }
}

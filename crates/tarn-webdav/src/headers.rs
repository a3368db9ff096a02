//! The request headers tarn checks before a request reaches dav-server.
//!
//! dav-server parses `If`, `If-Match`, `If-None-Match`, `If-Range`,
//! `Depth`, `Timeout`, `Destination` and `Overwrite` itself, and some of
//! its parsers index past the end of a truncated value (`If: <`,
//! `If-Match: "`) and panic; others silently ignore a malformed value,
//! which for `If` means running a request without the condition the
//! client asked for. [`check`] validates them all first and the server
//! answers 400 to anything malformed, so no request value reaches a
//! parser that could panic on it.
//!
//! The `If` tokenizer here is the library's one, made total: the same
//! tokens in the same order, with every read bounds-checked. A value it
//! accepts is therefore one the library tokenizes without running off
//! the end. The other parsers follow the RFCs' grammars.
//!
//! The module is public so that fuzz targets can drive it.

use http::{HeaderMap, HeaderValue, Method, Version};

/// Why a request's headers are refused (answered 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// An HTTP/1.1 request without `Host` (RFC 9112 §3.2).
    #[error("missing Host header")]
    MissingHost,
    /// A header that may appear once appeared more often.
    #[error("more than one {0} header")]
    Repeated(&'static str),
    /// A header whose value does not parse.
    #[error("malformed {0} header")]
    Malformed(&'static str),
}

/// A header value that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed header value")]
pub struct Malformed;

/// The `Depth` header's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// `0`.
    Zero,
    /// `1` (also `1,noroot`).
    One,
    /// `infinity` (also `infinity,noroot`).
    Infinity,
}

/// One condition of an `If` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfItem {
    /// A state token (a lock token, `<opaquelocktoken:...>`).
    StateToken(String),
    /// An entity tag in brackets.
    ETag(String),
}

/// One parenthesized list of an `If` header, with its optional tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfList {
    /// The resource the list is about (`<url>` before the list).
    pub resource: Option<String>,
    /// The conditions, each possibly negated with `Not`.
    pub conditions: Vec<(bool, IfItem)>,
}

fn one<'a>(h: &'a HeaderMap, name: &'static str) -> Result<Option<&'a HeaderValue>, HeaderError> {
    let mut it = h.get_all(name).iter();
    let first = it.next();
    if it.next().is_some() {
        return Err(HeaderError::Repeated(name));
    }
    Ok(first)
}

/// Checks every header tarn or dav-server interprets; Err means 400.
pub fn check(method: &Method, version: Version, h: &HeaderMap) -> Result<(), HeaderError> {
    match one(h, "host")? {
        Some(v) if v.is_empty() || v.as_bytes().iter().any(|b| !b.is_ascii_graphic()) => {
            return Err(HeaderError::Malformed("Host"))
        }
        Some(_) => {}
        None if version >= Version::HTTP_11 => return Err(HeaderError::MissingHost),
        None => {}
    }
    if let Some(v) = one(h, "if")? {
        parse_if(v.as_bytes()).map_err(|Malformed| HeaderError::Malformed("If"))?;
    }
    for (name, label) in [("if-match", "If-Match"), ("if-none-match", "If-None-Match")] {
        for v in h.get_all(name) {
            parse_etag_list(v.as_bytes()).map_err(|Malformed| HeaderError::Malformed(label))?;
        }
    }
    if let Some(v) = one(h, "if-range")? {
        let b = v.as_bytes();
        // An entity tag must be whole; anything else is taken as a date
        // (and ignored by the library when it is not one).
        if (b.starts_with(b"\"") || b.starts_with(b"W/")) && !is_entity_tag(b) {
            return Err(HeaderError::Malformed("If-Range"));
        }
    }
    if let Some(v) = one(h, "depth")? {
        parse_depth(v.as_bytes()).map_err(|Malformed| HeaderError::Malformed("Depth"))?;
    }
    if let Some(v) = one(h, "timeout")? {
        parse_timeout(v.as_bytes()).map_err(|Malformed| HeaderError::Malformed("Timeout"))?;
    }
    if let Some(v) = one(h, "overwrite")? {
        if !matches!(v.as_bytes(), b"T" | b"F") {
            return Err(HeaderError::Malformed("Overwrite"));
        }
    }
    let dest = one(h, "destination")?;
    if let Some(v) = dest {
        parse_destination(v.as_bytes())
            .map_err(|Malformed| HeaderError::Malformed("Destination"))?;
    }
    if matches!(method.as_str(), "COPY" | "MOVE") && dest.is_none() {
        return Err(HeaderError::Malformed("Destination"));
    }
    Ok(())
}

/// `Depth`: `0`, `1` or `infinity` (any case), optionally followed by
/// `,noroot` (a common extension).
pub fn parse_depth(v: &[u8]) -> Result<Depth, Malformed> {
    let s = std::str::from_utf8(v).map_err(|_| Malformed)?.trim();
    let s = match s.split_once(',') {
        Some((d, ext)) if ext.trim().eq_ignore_ascii_case("noroot") => d.trim(),
        Some(_) => return Err(Malformed),
        None => s,
    };
    match s {
        "0" => Ok(Depth::Zero),
        "1" => Ok(Depth::One),
        s if s.eq_ignore_ascii_case("infinity") => Ok(Depth::Infinity),
        _ => Err(Malformed),
    }
}

/// `Timeout` (RFC 4918 §10.7): a comma-separated list of `Infinite` or
/// `Second-` followed by digits.
pub fn parse_timeout(v: &[u8]) -> Result<(), Malformed> {
    let s = std::str::from_utf8(v).map_err(|_| Malformed)?;
    for t in s.split(',') {
        let t = t.trim();
        let ok = t == "Infinite"
            || t.strip_prefix("Second-").is_some_and(|n| {
                !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit())
            });
        if !ok {
            return Err(Malformed);
        }
    }
    Ok(())
}

/// `Destination` (RFC 4918 §10.3): an absolute `http(s)` URI or an
/// absolute path, printable ASCII without spaces, and no fragment (a
/// fragment would silently widen the target to the whole resource) nor
/// backslash (no URI has one, and URL parsers read it as `/`, so the
/// path one reads would not be the path the other acts on).
pub fn parse_destination(v: &[u8]) -> Result<(), Malformed> {
    if v.is_empty()
        || v.iter()
            .any(|&b| !b.is_ascii_graphic() || b == b'#' || b == b'\\')
    {
        return Err(Malformed);
    }
    if v.starts_with(b"/") {
        return Ok(());
    }
    let lower = v.to_ascii_lowercase();
    let rest = lower
        .strip_prefix(b"http://")
        .or_else(|| lower.strip_prefix(b"https://"))
        .ok_or(Malformed)?;
    let path_at = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    if path_at == 0 {
        return Err(Malformed);
    }
    Ok(())
}

/// True if `v` is one entity tag: `"..."` or `W/"..."` with no `"`
/// inside (RFC 9110 §8.8.3).
pub fn is_entity_tag(v: &[u8]) -> bool {
    let v = v.strip_prefix(b"W/").unwrap_or(v);
    v.len() >= 2
        && v[0] == b'"'
        && v[v.len() - 1] == b'"'
        && v[1..v.len() - 1]
            .iter()
            .all(|&b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80)
}

/// `If-Match` / `If-None-Match`: `*` or a comma-separated list of entity
/// tags (empty elements allowed, as in every list header).
pub fn parse_etag_list(v: &[u8]) -> Result<(), Malformed> {
    let trimmed = v.trim_ascii();
    if trimmed == b"*" {
        return Ok(());
    }
    let mut rest = trimmed;
    loop {
        rest = rest.trim_ascii_start();
        if rest.is_empty() {
            return Ok(());
        }
        if rest[0] == b',' {
            rest = &rest[1..];
            continue;
        }
        // One entity tag: optional W/, then a quoted string.
        let start = if rest.starts_with(b"W/") { 2 } else { 0 };
        if rest.get(start) != Some(&b'"') {
            return Err(Malformed);
        }
        let close = rest[start + 1..]
            .iter()
            .position(|&b| b == b'"')
            .ok_or(Malformed)?;
        let end = start + 1 + close + 1;
        if !is_entity_tag(&rest[..end]) {
            return Err(Malformed);
        }
        rest = rest[end..].trim_ascii_start();
        match rest.first() {
            None => return Ok(()),
            Some(b',') => rest = &rest[1..],
            Some(_) => return Err(Malformed),
        }
    }
}

// ----- If (RFC 4918 §10.4) ----------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    ListOpen,
    ListClose,
    Not,
    Word(String),
    Pointy(String),
    ETag(String),
    End,
}

fn is_ws(c: u8) -> bool {
    b" \t\r\n".contains(&c)
}

fn is_special(c: u8) -> bool {
    b"<>()[]".contains(&c)
}

/// Scans from an opening `<` or `[` to the closing `c`, as the library
/// does (a `"` toggles quoting, whitespace outside quotes or the end of
/// the value is an error), returning the inside and the rest.
fn scan_until(buf: &[u8], c: u8) -> Result<(&[u8], &[u8]), Malformed> {
    let mut i = 1;
    let mut quote = false;
    loop {
        let b = *buf.get(i).ok_or(Malformed)?;
        if !quote && b == c {
            return Ok((&buf[1..i], &buf[i + 1..]));
        }
        if is_ws(b) {
            return Err(Malformed);
        }
        if b == b'"' {
            quote = !quote;
        }
        i += 1;
    }
}

fn scan_word(buf: &[u8]) -> Result<(&[u8], &[u8]), Malformed> {
    for (i, &c) in buf.iter().enumerate() {
        if is_ws(c) || is_special(c) || c < 32 {
            if i == 0 {
                return Err(Malformed);
            }
            return Ok((&buf[..i], &buf[i..]));
        }
    }
    Ok((buf, b""))
}

fn text(b: &[u8]) -> Result<String, Malformed> {
    String::from_utf8(b.to_vec()).map_err(|_| Malformed)
}

fn token(buf: &[u8]) -> Result<(Token, &[u8]), Malformed> {
    let buf = buf.trim_ascii_start();
    let Some(&first) = buf.first() else {
        return Ok((Token::End, buf));
    };
    match first {
        b'(' => Ok((Token::ListOpen, &buf[1..])),
        b')' => Ok((Token::ListClose, &buf[1..])),
        b'N' if buf.starts_with(b"Not") => Ok((Token::Not, &buf[3..])),
        b'<' => {
            let (t, rest) = scan_until(buf, b'>')?;
            Ok((Token::Pointy(text(t)?), rest))
        }
        b'[' => {
            let (t, rest) = scan_until(buf, b']')?;
            if !is_entity_tag(t) {
                return Err(Malformed);
            }
            Ok((Token::ETag(text(t)?), rest))
        }
        _ => {
            let (t, rest) = scan_word(buf)?;
            if t == b"Not" {
                Ok((Token::Not, rest))
            } else {
                Ok((Token::Word(text(t)?), rest))
            }
        }
    }
}

/// A resource tag: an absolute URI (`scheme:...`) or an absolute path.
fn is_resource_tag(s: &str) -> bool {
    if s.starts_with('/') {
        return true;
    }
    match s.split_once(':') {
        Some((scheme, _)) => {
            scheme
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic())
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        }
        None => false,
    }
}

/// Parses an `If` header value: one or more lists, each optionally
/// tagged with a resource, of (possibly negated) state tokens and entity
/// tags. Err for anything else, including every truncated value.
pub fn parse_if(v: &[u8]) -> Result<Vec<IfList>, Malformed> {
    // Tokenize the whole value first: the library tokenizes lazily, so
    // every token it could ever read must be readable.
    let mut tokens = Vec::new();
    let mut rest = v;
    loop {
        let (t, r) = token(rest)?;
        rest = r;
        if t == Token::End {
            break;
        }
        tokens.push(t);
    }
    let mut lists = Vec::new();
    let mut it = tokens.into_iter().peekable();
    while let Some(t) = it.next() {
        let resource = match t {
            Token::Pointy(url) => {
                if !is_resource_tag(&url) || it.next() != Some(Token::ListOpen) {
                    return Err(Malformed);
                }
                Some(url)
            }
            Token::ListOpen => None,
            _ => return Err(Malformed),
        };
        let mut conditions = Vec::new();
        loop {
            let mut not = false;
            let mut t = it.next().ok_or(Malformed)?;
            if t == Token::Not {
                not = true;
                t = it.next().ok_or(Malformed)?;
            }
            match t {
                Token::ListClose if !not && !conditions.is_empty() => break,
                Token::Pointy(s) | Token::Word(s) if s.contains(':') => {
                    conditions.push((not, IfItem::StateToken(s)));
                }
                Token::ETag(e) => conditions.push((not, IfItem::ETag(e))),
                _ => return Err(Malformed),
            }
        }
        lists.push(IfList {
            resource,
            conditions,
        });
    }
    if lists.is_empty() {
        return Err(Malformed);
    }
    Ok(lists)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_header() {
        let ok = [
            r#"(<opaquelocktoken:a-b-c>)"#,
            r#"  <http://x.yz/> ([W/"etag"] Not <DAV:nope> ) (Not<urn:x>[W/"bla"] plain:word:123) "#,
            r#"</share/f> (<urn:uuid:1>) (["abc"])"#,
            r#"(Not <DAV:no-lock>)"#,
        ];
        for v in ok {
            assert!(parse_if(v.as_bytes()).is_ok(), "{v}");
        }
        let bad = [
            "",
            "<",
            "(<",
            "([\"",
            "(",
            "()",
            "(<a",
            "([\"x\"",
            "(Not)",
            "(Not Not <a:b>)",
            "<http://x/>",
            "(<a:b>) junk",
            "(word)",
            "([x])",
            "[\"a\"]",
            "(<a:b>",
            "<x y>",
            "(<a:b> [\"c\" ])",
        ];
        for v in bad {
            assert!(parse_if(v.as_bytes()).is_err(), "{v:?}");
        }
        let l = parse_if(br#"<http://h/s/f> (Not <urn:x> ["e"])"#).unwrap();
        assert_eq!(l[0].resource.as_deref(), Some("http://h/s/f"));
        assert_eq!(
            l[0].conditions,
            vec![
                (true, IfItem::StateToken("urn:x".into())),
                (false, IfItem::ETag("\"e\"".into()))
            ]
        );
    }

    #[test]
    fn etag_lists() {
        for v in ["*", "\"a\"", "W/\"a\", \"b\"", " \"a\" ,, \"b\" ", "\"\""] {
            assert!(parse_etag_list(v.as_bytes()).is_ok(), "{v}");
        }
        for v in [
            "\"",
            "W/\"",
            "W/",
            "a",
            "\"a\" b",
            "\"a",
            "\"a\"\"b\"",
            "* , \"a\"",
        ] {
            assert!(parse_etag_list(v.as_bytes()).is_err(), "{v:?}");
        }
    }

    #[test]
    fn depth_timeout_destination() {
        assert_eq!(parse_depth(b"0"), Ok(Depth::Zero));
        assert_eq!(parse_depth(b"Infinity"), Ok(Depth::Infinity));
        assert_eq!(parse_depth(b"1,noroot"), Ok(Depth::One));
        assert!(parse_depth(b"2").is_err() && parse_depth(b"").is_err());
        assert!(parse_timeout(b"Infinite, Second-4100000000").is_ok());
        assert!(parse_timeout(b"Second-").is_err() && parse_timeout(b"Second-x").is_err());
        assert!(parse_timeout(b"").is_err());
        assert!(parse_destination(b"/s/a%20b").is_ok());
        assert!(parse_destination(b"http://host:8080/s/x").is_ok());
        assert!(parse_destination(b"HTTPS://h").is_ok());
        for v in [
            &b"/s/dir/#frag"[..],
            b"ftp://h/x",
            b"http:///x",
            b"rel/x",
            b"",
            b"/a b",
        ] {
            assert!(parse_destination(v).is_err(), "{v:?}");
        }
    }

    #[test]
    fn host_rules() {
        let mut h = HeaderMap::new();
        let get = Method::GET;
        assert_eq!(
            check(&get, Version::HTTP_11, &h),
            Err(HeaderError::MissingHost)
        );
        assert_eq!(check(&get, Version::HTTP_10, &h), Ok(()));
        h.insert("host", HeaderValue::from_static("a"));
        assert_eq!(check(&get, Version::HTTP_11, &h), Ok(()));
        h.append("host", HeaderValue::from_static("b"));
        assert_eq!(
            check(&get, Version::HTTP_10, &h),
            Err(HeaderError::Repeated("host"))
        );
    }
}

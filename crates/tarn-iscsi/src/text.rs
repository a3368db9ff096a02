//! Text data segments (RFC 7143 section 6.1): `key=value` pairs, each
//! ended by a NUL, in login and text PDUs.

/// Most bytes of text a negotiation accumulates across PDUs (the
/// continue bit) before the target gives up on it.
pub const MAX_TEXT: usize = 64 << 10;

/// A text segment that is not a list of `key=value` pairs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed text: {0}")]
pub struct TextError(pub String);

/// Parses a data segment into its pairs, in order. Empty strings
/// between NULs (padding, a trailing NUL) are skipped.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let mut out = Vec::new();
    for item in data.split(|&b| b == 0) {
        if item.is_empty() {
            continue;
        }
        let s = std::str::from_utf8(item).map_err(|_| TextError("not UTF-8".into()))?;
        let Some((k, v)) = s.split_once('=') else {
            return Err(TextError(format!("{s:?} has no '='")));
        };
        if k.is_empty() || k.len() > 63 {
            return Err(TextError(format!("key {k:?} is empty or too long")));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// Encodes pairs as a data segment.
pub fn encode(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Parses `0x`-prefixed hexadecimal (the form CHAP values take).
pub fn parse_hex(s: &str) -> Option<Vec<u8>> {
    let h = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    if h.is_empty() || h.len() % 2 != 0 {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Formats bytes as `0x`-prefixed hexadecimal.
pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_bad_text_is_an_error() {
        let p = parse(b"InitiatorName=iqn.a\0SessionType=Normal\0\0\0").unwrap();
        assert_eq!(
            p,
            [
                ("InitiatorName".to_string(), "iqn.a".to_string()),
                ("SessionType".to_string(), "Normal".to_string())
            ]
        );
        assert_eq!(parse(&encode(&p)).unwrap(), p);
        assert!(parse(b"novalue\0").is_err());
        assert!(parse(b"=x\0").is_err());
        assert!(parse(&[0xff, b'=', 0]).is_err());
        assert_eq!(parse(b"a=\0").unwrap(), [("a".into(), String::new())]);
    }

    #[test]
    fn hex_values() {
        assert_eq!(parse_hex("0x00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(parse_hex("0XAB"), Some(vec![0xab]));
        assert_eq!(parse_hex("0x"), None);
        assert_eq!(parse_hex("0xabc"), None);
        assert_eq!(parse_hex("0xzz"), None);
        assert_eq!(parse_hex("abcd"), None);
        assert_eq!(parse_hex("0xé1"), None);
        assert_eq!(hex(&[1, 0xab]), "0x01ab");
    }
}

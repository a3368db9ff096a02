//! XDR (RFC 4506): big-endian 4-byte units, opaque data padded to a
//! multiple of 4. The decoder works on a borrowed slice and fails with
//! [`XdrError`] on any short or invalid input; it never panics and never
//! allocates more than the input can justify (a length prefix larger than
//! the remaining bytes fails before allocating).

/// Decoding failed: the input was short or held an invalid value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum XdrError {
    /// The input ended before the value did.
    #[error("XDR input truncated")]
    Short,
    /// A value out of its allowed range (bad bool, enum, or over a limit).
    #[error("invalid XDR value")]
    Invalid,
}

/// Result of decoding.
pub type XdrResult<T> = Result<T, XdrError>;

/// Reads XDR values from a byte slice.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn pad4(n: usize) -> usize {
    (4 - (n % 4)) % 4
}

impl<'a> Reader<'a> {
    /// A reader over `buf`, starting at its beginning.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(XdrError::Short);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// An unsigned 32-bit integer.
    pub fn u32(&mut self) -> XdrResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A signed 32-bit integer.
    pub fn i32(&mut self) -> XdrResult<i32> {
        Ok(self.u32()? as i32)
    }

    /// An unsigned 64-bit integer (hyper).
    pub fn u64(&mut self) -> XdrResult<u64> {
        let hi = u64::from(self.u32()?);
        let lo = u64::from(self.u32()?);
        Ok((hi << 32) | lo)
    }

    /// A boolean: only 0 and 1 are valid.
    pub fn bool(&mut self) -> XdrResult<bool> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(XdrError::Invalid),
        }
    }

    /// Fixed-length opaque data of `n` bytes (plus padding).
    pub fn fixed(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        let s = self.take(n)?;
        self.take(pad4(n))?;
        Ok(s)
    }

    /// Variable-length opaque data of at most `max` bytes.
    pub fn opaque(&mut self, max: usize) -> XdrResult<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(XdrError::Invalid);
        }
        self.fixed(n)
    }

    /// A string (opaque bytes; XDR strings are not necessarily UTF-8).
    pub fn string(&mut self, max: usize) -> XdrResult<&'a [u8]> {
        self.opaque(max)
    }

    /// An optional value (XDR `*T`): a bool then the value if true.
    pub fn option<T>(&mut self, f: impl FnOnce(&mut Self) -> XdrResult<T>) -> XdrResult<Option<T>> {
        if self.bool()? {
            Ok(Some(f(self)?))
        } else {
            Ok(None)
        }
    }
}

/// Builds XDR output in a growable buffer.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Writer::default()
    }

    /// An empty writer with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True if nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Forgets what was written after the first `len` bytes (an item
    /// that turned out not to fit).
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    /// Makes room for `n` more bytes at once, so a long reply grows once.
    pub fn reserve(&mut self, n: usize) {
        self.buf.reserve(n);
    }

    /// The encoded bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// An unsigned 32-bit integer.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A signed 32-bit integer.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.u32(v as u32)
    }

    /// An unsigned 64-bit integer.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A boolean.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u32(u32::from(v))
    }

    /// Fixed-length opaque data (plus padding).
    pub fn fixed(&mut self, data: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(data);
        self.buf.extend_from_slice(&[0u8; 3][..pad4(data.len())]);
        self
    }

    /// Variable-length opaque data (length, bytes, padding). Callers keep
    /// `data` under 4 GiB (replies are bounded far below that).
    pub fn opaque(&mut self, data: &[u8]) -> &mut Self {
        self.u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
        self.fixed(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(a in any::<u32>(), b in any::<u64>(), c in any::<i32>(), d in any::<bool>(),
                      o in proptest::collection::vec(any::<u8>(), 0..40),
                      f in proptest::collection::vec(any::<u8>(), 0..9)) {
            let mut w = Writer::new();
            w.u32(a).u64(b).i32(c).bool(d).opaque(&o).fixed(&f);
            let bytes = w.into_bytes();
            prop_assert_eq!(bytes.len() % 4, 0);
            let mut r = Reader::new(&bytes);
            prop_assert_eq!(r.u32().unwrap(), a);
            prop_assert_eq!(r.u64().unwrap(), b);
            prop_assert_eq!(r.i32().unwrap(), c);
            prop_assert_eq!(r.bool().unwrap(), d);
            prop_assert_eq!(r.opaque(64).unwrap(), &o[..]);
            prop_assert_eq!(r.fixed(f.len()).unwrap(), &f[..]);
            prop_assert_eq!(r.remaining(), 0);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&bytes);
            let _ = r.u32();
            let _ = r.opaque(1 << 30);
            let _ = r.option(|r| r.u64());
            let _ = r.bool();
        }
    }

    #[test]
    fn errors() {
        assert_eq!(Reader::new(&[0, 0, 0]).u32(), Err(XdrError::Short));
        assert_eq!(Reader::new(&[0, 0, 0, 2]).bool(), Err(XdrError::Invalid));
        // Length over the limit, and length past the end.
        assert_eq!(
            Reader::new(&[0, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0]).opaque(8),
            Err(XdrError::Invalid)
        );
        assert_eq!(
            Reader::new(&[0xff, 0xff, 0xff, 0xff]).opaque(usize::MAX),
            Err(XdrError::Short)
        );
        // Padding must be present.
        assert_eq!(
            Reader::new(&[0, 0, 0, 1, 7]).opaque(8),
            Err(XdrError::Short)
        );
    }
}

//! ONC RPC record marking over TCP (RFC 5531 §11): a record is a sequence
//! of fragments, each preceded by a 4-byte big-endian header whose top bit
//! marks the last fragment and whose low 31 bits give its length.
//!
//! [`Decoder`] is a push parser: the connection feeds it whatever bytes a
//! read returned, in any split, and gets whole records back. It enforces
//! the record size bound as soon as a header announces too much, before
//! any of those bytes are buffered.
//!
//! Large fragments (a WRITE's payload) need not pass through the
//! connection's read buffer: [`Decoder::body_room`] hands out the record
//! itself, with room for the rest of the fragment, so the socket read
//! lands the bytes where the request is decoded from, and
//! [`Decoder::filled`] accounts for them. The payload is then copied once,
//! into the block that stores it.

/// Bit marking the last fragment of a record.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;

/// Record marking failed; the connection must be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A fragment header announced a record larger than the bound.
    #[error("record of at least {0} bytes exceeds the limit")]
    TooLarge(u64),
}

/// Reassembles records from a byte stream.
#[derive(Debug)]
pub struct Decoder {
    max: usize,
    header: [u8; 4],
    header_len: usize,
    /// Bytes still expected in the current fragment (None: reading a header).
    frag_left: Option<usize>,
    last: bool,
    record: Vec<u8>,
}

impl Decoder {
    /// A decoder accepting records of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Decoder {
            max,
            header: [0; 4],
            header_len: 0,
            frag_left: None,
            last: false,
            record: Vec::new(),
        }
    }

    /// True if the decoder holds part of a record (EOF now would truncate it).
    pub fn in_record(&self) -> bool {
        self.header_len > 0 || self.frag_left.is_some() || !self.record.is_empty()
    }

    /// Feeds `data`, appending every record it completes to `out`.
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<Vec<u8>>) -> Result<(), RecordError> {
        loop {
            match self.frag_left {
                None => {
                    if data.is_empty() {
                        return Ok(());
                    }
                    let n = (4 - self.header_len).min(data.len());
                    self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
                    self.header_len += n;
                    data = &data[n..];
                    if self.header_len < 4 {
                        return Ok(());
                    }
                    self.header_len = 0;
                    let h = u32::from_be_bytes(self.header);
                    let len = (h & !LAST_FRAGMENT) as usize;
                    self.last = h & LAST_FRAGMENT != 0;
                    let total = self.record.len() as u64 + len as u64;
                    if total > self.max as u64 {
                        return Err(RecordError::TooLarge(total));
                    }
                    // Room for the whole fragment at once (within the
                    // bound just checked): no regrowth, no second copy.
                    self.record.reserve(len);
                    self.frag_left = Some(len);
                }
                Some(left) => {
                    let n = left.min(data.len());
                    self.record.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    self.consumed(left, n, out);
                    if self.frag_left.is_some() {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// The record being assembled and how many bytes of the current
    /// fragment are still to come, when that is at least `min` bytes: read
    /// them straight into the record (at most that many), then call
    /// [`Decoder::filled`]. None while a header is being read or when
    /// little is left (read those through a buffer and [`Decoder::feed`]).
    pub fn body_room(&mut self, min: usize) -> Option<(&mut Vec<u8>, usize)> {
        match self.frag_left {
            Some(left) if left >= min.max(1) => Some((&mut self.record, left)),
            _ => None,
        }
    }

    /// Accounts for `n` bytes appended to the record after
    /// [`Decoder::body_room`] (at most the count it gave), appending the
    /// record to `out` if they complete it.
    pub fn filled(&mut self, n: usize, out: &mut Vec<Vec<u8>>) {
        if let Some(left) = self.frag_left {
            self.consumed(left, n.min(left), out);
        }
    }

    /// `n` of the `left` bytes of the current fragment are in the record.
    fn consumed(&mut self, left: usize, n: usize, out: &mut Vec<Vec<u8>>) {
        let left = left - n;
        if left > 0 {
            self.frag_left = Some(left);
            return;
        }
        self.frag_left = None;
        if self.last {
            out.push(std::mem::take(&mut self.record));
        }
    }
}

/// The record-marking header of a one-fragment record of `len` bytes,
/// written before the body so a large reply is not copied just to prefix
/// four bytes. Bodies are bounded far below 2 GiB by the server, so the
/// length always fits 31 bits.
pub fn header(len: usize) -> [u8; 4] {
    ((len as u32 & !LAST_FRAGMENT) | LAST_FRAGMENT).to_be_bytes()
}

/// Frames `body` as one record of one fragment (see [`header`]).
pub fn frame(body: &[u8]) -> Vec<u8> {
    let len = (body.len() as u32) & !LAST_FRAGMENT;
    let mut v = Vec::with_capacity(body.len() + 4);
    v.extend_from_slice(&(len | LAST_FRAGMENT).to_be_bytes());
    v.extend_from_slice(body);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Encodes records, each split into fragments at the given cut points.
    fn encode(records: &[Vec<u8>], cuts: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut ci = 0;
        for r in records {
            let mut pos = 0;
            loop {
                let want = cuts.get(ci).copied().unwrap_or(usize::MAX);
                ci += 1;
                let n = want.min(r.len() - pos);
                let last = pos + n == r.len();
                let h = n as u32 | if last { LAST_FRAGMENT } else { 0 };
                out.extend_from_slice(&h.to_be_bytes());
                out.extend_from_slice(&r[pos..pos + n]);
                pos += n;
                if last {
                    break;
                }
            }
        }
        out
    }

    proptest! {
        #[test]
        fn reassembles_any_split(
            records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..6),
            frag_cuts in proptest::collection::vec(0usize..120, 0..30),
            read_cuts in proptest::collection::vec(1usize..50, 1..60),
        ) {
            let stream = encode(&records, &frag_cuts);
            let mut d = Decoder::new(1000);
            let mut out = Vec::new();
            let mut pos = 0;
            let mut i = 0;
            while pos < stream.len() {
                let n = read_cuts[i % read_cuts.len()].min(stream.len() - pos);
                d.feed(&stream[pos..pos + n], &mut out).unwrap();
                pos += n;
                i += 1;
            }
            prop_assert_eq!(out, records);
            prop_assert!(!d.in_record());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut d = Decoder::new(64);
            let mut out = Vec::new();
            let _ = d.feed(&bytes, &mut out);
            for r in &out {
                prop_assert!(r.len() <= 64);
            }
        }
    }

    #[test]
    fn too_large_is_refused_at_the_header() {
        let mut d = Decoder::new(1 << 20);
        let mut out = Vec::new();
        let h = (100u32 << 20) | LAST_FRAGMENT;
        assert_eq!(
            d.feed(&h.to_be_bytes(), &mut out),
            Err(RecordError::TooLarge(100 << 20))
        );
        // Fragments adding up past the limit are refused too.
        let mut d = Decoder::new(10);
        let mut s = 6u32.to_be_bytes().to_vec();
        s.extend_from_slice(&[0; 6]);
        s.extend_from_slice(&(5u32 | LAST_FRAGMENT).to_be_bytes());
        assert_eq!(d.feed(&s, &mut out), Err(RecordError::TooLarge(11)));
    }

    #[test]
    fn body_read_in_place_matches_fed() {
        let records = vec![vec![7u8; 100], vec![1, 2, 3], vec![9u8; 5000], vec![]];
        let stream = encode(&records, &[40, 2000]);
        let mut d = Decoder::new(1 << 20);
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < stream.len() {
            if let Some((rec, left)) = d.body_room(16) {
                // What a socket read into the record would do, a few
                // bytes short of the fragment.
                let n = left.min(stream.len() - pos).min(37);
                rec.extend_from_slice(&stream[pos..pos + n]);
                d.filled(n, &mut out);
                pos += n;
            } else {
                let n = 3.min(stream.len() - pos);
                d.feed(&stream[pos..pos + n], &mut out).unwrap();
                pos += n;
            }
        }
        assert_eq!(out, records);
        assert!(!d.in_record());
    }

    #[test]
    fn frame_round_trip() {
        let mut d = Decoder::new(100);
        let mut out = Vec::new();
        d.feed(&frame(b"hello"), &mut out).unwrap();
        assert_eq!(out, vec![b"hello".to_vec()]);
    }
}

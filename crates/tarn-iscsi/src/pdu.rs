//! The iSCSI PDU codec (RFC 7143 section 11).
//!
//! Every PDU is a 48-byte Basic Header Segment (BHS), then
//! `TotalAHSLength` four-byte words of Additional Header Segments, a
//! header digest when one was negotiated, `DataSegmentLength` bytes of
//! data padded to a multiple of four, and a data digest (over data and
//! padding) when one was negotiated and the segment is not empty. Both
//! digests are CRC32C, sent little-endian.
//!
//! A [`Pdu`] keeps its BHS as raw bytes with typed accessors for the
//! fields every opcode shares (opcode, immediate bit, flags, LUN,
//! initiator task tag, and big-endian words at fixed offsets); the
//! opcode-specific fields are read by the code that handles the opcode.
//! [`Pdu::encode`] fills in the two length fields itself, so a PDU can
//! never announce a length it does not carry.
//!
//! Decoding never trusts a length before checking it: a data segment
//! longer than the receiver's limit is an error before anything is
//! allocated, and [`decode`] takes any bytes without panicking (a
//! property test holds it to that).

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::digest::crc32c;

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;

/// Opcodes (the low six bits of byte 0).
pub mod op {
    /// NOP-Out (initiator).
    pub const NOP_OUT: u8 = 0x00;
    /// SCSI Command (initiator).
    pub const SCSI_CMD: u8 = 0x01;
    /// Task Management Function Request (initiator).
    pub const TASK_MGMT: u8 = 0x02;
    /// Login Request (initiator).
    pub const LOGIN: u8 = 0x03;
    /// Text Request (initiator).
    pub const TEXT: u8 = 0x04;
    /// SCSI Data-Out (initiator).
    pub const DATA_OUT: u8 = 0x05;
    /// Logout Request (initiator).
    pub const LOGOUT: u8 = 0x06;
    /// SNACK Request (initiator; needs ErrorRecoveryLevel > 0).
    pub const SNACK: u8 = 0x10;
    /// NOP-In (target).
    pub const NOP_IN: u8 = 0x20;
    /// SCSI Response (target).
    pub const SCSI_RSP: u8 = 0x21;
    /// Task Management Function Response (target).
    pub const TASK_MGMT_RSP: u8 = 0x22;
    /// Login Response (target).
    pub const LOGIN_RSP: u8 = 0x23;
    /// Text Response (target).
    pub const TEXT_RSP: u8 = 0x24;
    /// SCSI Data-In (target).
    pub const DATA_IN: u8 = 0x25;
    /// Logout Response (target).
    pub const LOGOUT_RSP: u8 = 0x26;
    /// Ready To Transfer (target).
    pub const R2T: u8 = 0x31;
    /// Asynchronous Message (target).
    pub const ASYNC: u8 = 0x32;
    /// Reject (target).
    pub const REJECT: u8 = 0x3f;
}

/// The final bit (byte 1) of most PDUs.
pub const FLAG_F: u8 = 0x80;
/// The "no task tag" value of task tags and target transfer tags.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Which digests a connection uses (both off until login negotiates
/// them; they apply from the first PDU after the login).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    /// CRC32C after the header segments.
    pub header: bool,
    /// CRC32C after a non-empty data segment.
    pub data: bool,
}

/// A malformed or damaged PDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// The data segment is longer than the receiver accepts.
    #[error("data segment of {len} bytes, over the limit of {max}")]
    DataTooLong {
        /// The announced length.
        len: u32,
        /// The receiver's limit.
        max: u32,
    },
    /// The header digest does not match.
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The data digest does not match.
    #[error("data digest mismatch")]
    DataDigest,
}

/// Failure reading a PDU from a stream.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The stream ended or failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a valid PDU.
    #[error("{0}")]
    Pdu(#[from] PduError),
}

/// One PDU: its BHS, additional header segments and data segment.
#[derive(Clone, PartialEq, Eq)]
pub struct Pdu {
    /// The Basic Header Segment as sent (length fields are set by
    /// [`Pdu::encode`]).
    pub bhs: [u8; BHS_LEN],
    /// Additional header segments (a multiple of 4 bytes when encoded;
    /// padded with zeros otherwise).
    pub ahs: Vec<u8>,
    /// The data segment without padding.
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Pdu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pdu")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("flags", &format_args!("{:#04x}", self.flags()))
            .field("itt", &format_args!("{:#x}", self.itt()))
            .field("ahs", &self.ahs.len())
            .field("data", &self.data.len())
            .finish()
    }
}

impl Pdu {
    /// An empty PDU with `opcode` and nothing else set.
    pub fn new(opcode: u8) -> Pdu {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = opcode & 0x3f;
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: Vec::new(),
        }
    }

    /// The opcode.
    pub fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }

    /// The immediate-delivery bit (requests only).
    pub fn immediate(&self) -> bool {
        self.bhs[0] & 0x40 != 0
    }

    /// Sets the immediate-delivery bit.
    pub fn set_immediate(&mut self, on: bool) {
        if on {
            self.bhs[0] |= 0x40;
        } else {
            self.bhs[0] &= !0x40;
        }
    }

    /// Byte 1: the final bit and opcode-specific flags.
    pub fn flags(&self) -> u8 {
        self.bhs[1]
    }

    /// Sets byte 1.
    pub fn set_flags(&mut self, f: u8) {
        self.bhs[1] = f;
    }

    /// The final bit.
    pub fn is_final(&self) -> bool {
        self.bhs[1] & FLAG_F != 0
    }

    /// The big-endian word at `off` (0..=44).
    pub fn u32_at(&self, off: usize) -> u32 {
        u32::from_be_bytes([
            self.bhs[off],
            self.bhs[off + 1],
            self.bhs[off + 2],
            self.bhs[off + 3],
        ])
    }

    /// Sets the big-endian word at `off`.
    pub fn set_u32(&mut self, off: usize, v: u32) {
        self.bhs[off..off + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// The big-endian half-word at `off`.
    pub fn u16_at(&self, off: usize) -> u16 {
        u16::from_be_bytes([self.bhs[off], self.bhs[off + 1]])
    }

    /// Sets the big-endian half-word at `off`.
    pub fn set_u16(&mut self, off: usize, v: u16) {
        self.bhs[off..off + 2].copy_from_slice(&v.to_be_bytes());
    }

    /// Bytes 8..16: the LUN field (or ISID and TSIH in login PDUs).
    pub fn lun_field(&self) -> [u8; 8] {
        let mut l = [0u8; 8];
        l.copy_from_slice(&self.bhs[8..16]);
        l
    }

    /// Sets bytes 8..16.
    pub fn set_lun_field(&mut self, l: [u8; 8]) {
        self.bhs[8..16].copy_from_slice(&l);
    }

    /// The initiator task tag (bytes 16..20).
    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }

    /// Sets the initiator task tag.
    pub fn set_itt(&mut self, v: u32) {
        self.set_u32(16, v);
    }

    /// The 16-byte CDB of a SCSI Command (bytes 32..48).
    pub fn cdb(&self) -> &[u8] {
        &self.bhs[32..48]
    }

    /// The wire form: BHS (with both length fields set), AHS padded to 4,
    /// header digest, data padded to 4, data digest. Data past 2^24 - 1
    /// bytes is a caller's bug and is cut.
    pub fn encode(&self, digests: Digests) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(digests, &[&self.data], &mut out);
        out
    }

    /// Appends the PDU to `out` as [`Pdu::encode`] encodes it, with the
    /// data segment made of `data` (slices in order) instead of
    /// `self.data`: a Data-In PDU is built straight from the blocks a read
    /// shares, and a reply straight into the connection's output buffer.
    pub fn encode_into(&self, digests: Digests, data: &[&[u8]], out: &mut Vec<u8>) {
        let ahs_words = self.ahs.len().div_ceil(4).min(255);
        let data_len = data.iter().map(|d| d.len()).sum::<usize>().min(0x00ff_ffff);
        let at = out.len();
        out.reserve(BHS_LEN + ahs_words * 4 + 8 + data_len + 3);
        out.extend_from_slice(&self.bhs);
        out[at + 4] = ahs_words as u8;
        out[at + 5..at + 8].copy_from_slice(&(data_len as u32).to_be_bytes()[1..]);
        let ahs_len = self.ahs.len().min(ahs_words * 4);
        out.extend_from_slice(&self.ahs[..ahs_len]);
        out.resize(at + BHS_LEN + ahs_words * 4, 0);
        if digests.header {
            let c = crc32c(&[&out[at..]]);
            out.extend_from_slice(&c.to_le_bytes());
        }
        if data_len > 0 {
            let start = out.len();
            let mut left = data_len;
            for d in data {
                let take = d.len().min(left);
                out.extend_from_slice(&d[..take]);
                left -= take;
            }
            out.resize(start + padded(data_len), 0);
            if digests.data {
                let c = crc32c(&[&out[start..]]);
                out.extend_from_slice(&c.to_le_bytes());
            }
        }
    }
}

/// `n` rounded up to a multiple of 4.
pub fn padded(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// The lengths a BHS announces, checked against `max_data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framing {
    /// Bytes of additional header segments.
    pub ahs_len: usize,
    /// Bytes of data (without padding).
    pub data_len: usize,
}

/// Reads the length fields of a BHS.
pub fn framing(bhs: &[u8; BHS_LEN], max_data: u32) -> Result<Framing, PduError> {
    let data_len = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]);
    if data_len > max_data {
        return Err(PduError::DataTooLong {
            len: data_len,
            max: max_data,
        });
    }
    Ok(Framing {
        ahs_len: bhs[4] as usize * 4,
        data_len: data_len as usize,
    })
}

/// Bytes after the BHS that a PDU with framing `f` occupies.
fn rest_len(f: Framing, d: Digests) -> usize {
    let mut n = f.ahs_len;
    if d.header {
        n += 4;
    }
    if f.data_len > 0 {
        n += padded(f.data_len);
        if d.data {
            n += 4;
        }
    }
    n
}

/// Builds the PDU from the bytes after its BHS (exactly `rest_len` of
/// them), checking the data digest; the caller checked the header's.
fn assemble(bhs: [u8; BHS_LEN], f: Framing, rest: &[u8], d: Digests) -> Result<Pdu, PduError> {
    let ahs = rest[..f.ahs_len].to_vec();
    let mut at = f.ahs_len;
    if d.header {
        at += 4;
    }
    let mut data = Vec::new();
    if f.data_len > 0 {
        let p = padded(f.data_len);
        let seg = &rest[at..at + p];
        if d.data {
            let want = crc32c(&[seg]);
            let o = at + p;
            let got = u32::from_le_bytes([rest[o], rest[o + 1], rest[o + 2], rest[o + 3]]);
            if want != got {
                return Err(PduError::DataDigest);
            }
        }
        data = seg[..f.data_len].to_vec();
    }
    Ok(Pdu { bhs, ahs, data })
}

/// Decodes one PDU from the start of `buf`: `Ok(None)` if `buf` holds
/// only part of one, else the PDU and the bytes it took.
pub fn decode(buf: &[u8], d: Digests, max_data: u32) -> Result<Option<(Pdu, usize)>, PduError> {
    let Some(head) = buf.get(..BHS_LEN) else {
        return Ok(None);
    };
    let mut bhs = [0u8; BHS_LEN];
    bhs.copy_from_slice(head);
    let f = framing(&bhs, max_data)?;
    // A header whose digest fails is refused as soon as it is all there:
    // the lengths it announces are not to be trusted, so nothing is
    // waited for on their word.
    if d.header {
        let Some(h) = buf.get(BHS_LEN..BHS_LEN + f.ahs_len + 4) else {
            return Ok(None);
        };
        let (ahs, got) = h.split_at(f.ahs_len);
        if crc32c(&[&bhs, ahs]) != u32::from_le_bytes([got[0], got[1], got[2], got[3]]) {
            return Err(PduError::HeaderDigest);
        }
    }
    let n = rest_len(f, d);
    let Some(rest) = buf.get(BHS_LEN..BHS_LEN + n) else {
        return Ok(None);
    };
    Ok(Some((assemble(bhs, f, rest, d)?, BHS_LEN + n)))
}

/// Reads one PDU from a stream: the same PDU, or the same error, as
/// [`decode`] of the same bytes (a stream that ends early is an I/O
/// error). The data segment is read only after its length has been
/// checked against `max_data`, straight into the PDU's own buffer: a
/// write's payload is neither zeroed first nor copied out of a buffer of
/// the whole PDU.
pub async fn read_pdu<R: AsyncRead + Unpin>(
    rd: &mut R,
    d: Digests,
    max_data: u32,
) -> Result<Pdu, ReadError> {
    let mut bhs = [0u8; BHS_LEN];
    rd.read_exact(&mut bhs).await?;
    let f = framing(&bhs, max_data)?;
    let mut ahs = vec![0u8; f.ahs_len];
    rd.read_exact(&mut ahs).await?;
    if d.header {
        // Checked before the data segment is read, as `decode` does: a
        // damaged header's lengths are not waited for.
        let mut got = [0u8; 4];
        rd.read_exact(&mut got).await?;
        if crc32c(&[&bhs, &ahs]) != u32::from_le_bytes(got) {
            return Err(PduError::HeaderDigest.into());
        }
    }
    let mut data = Vec::new();
    if f.data_len > 0 {
        data.reserve_exact(f.data_len);
        let n = (&mut *rd)
            .take(f.data_len as u64)
            .read_to_end(&mut data)
            .await?;
        if n < f.data_len {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        let mut pad = [0u8; 3];
        let pad = &mut pad[..padded(f.data_len) - f.data_len];
        rd.read_exact(pad).await?;
        if d.data {
            let mut got = [0u8; 4];
            rd.read_exact(&mut got).await?;
            if crc32c(&[&data, pad]) != u32::from_le_bytes(got) {
                return Err(PduError::DataDigest.into());
            }
        }
    }
    Ok(Pdu { bhs, ahs, data })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    #[test]
    fn lengths_padding_and_digests_are_laid_out() {
        let mut p = Pdu::new(op::NOP_OUT);
        p.set_flags(FLAG_F);
        p.set_itt(7);
        p.data = b"hello".to_vec();
        let plain = p.encode(Digests::default());
        assert_eq!(plain.len(), 48 + 8);
        assert_eq!(&plain[5..8], &[0, 0, 5]);
        assert_eq!(&plain[48..56], b"hello\0\0\0");
        let dig = p.encode(BOTH);
        assert_eq!(dig.len(), 48 + 4 + 8 + 4);
        let hd = crc32c(&[&dig[..48]]);
        assert_eq!(&dig[48..52], &hd.to_le_bytes());
        let dd = crc32c(&[&dig[52..60]]);
        assert_eq!(&dig[60..64], &dd.to_le_bytes());
        let (q, n) = decode(&dig, BOTH, 1 << 20).unwrap().unwrap();
        assert_eq!(n, dig.len());
        assert_eq!(q.data, b"hello");
        assert_eq!(q.itt(), 7);
    }

    #[test]
    fn damaged_digests_and_long_segments_are_errors() {
        let mut p = Pdu::new(op::SCSI_CMD);
        p.data = vec![1; 100];
        let mut w = p.encode(BOTH);
        w[10] ^= 1;
        assert_eq!(decode(&w, BOTH, 1 << 20), Err(PduError::HeaderDigest));
        // Refused once the header and its digest are there, before the
        // data its (untrusted) length announces.
        assert_eq!(decode(&w[..52], BOTH, 1 << 20), Err(PduError::HeaderDigest));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let read = rt.block_on(read_pdu(&mut &w[..52], BOTH, 1 << 20));
        assert!(matches!(read, Err(ReadError::Pdu(PduError::HeaderDigest))));
        let mut w = p.encode(BOTH);
        w[60] ^= 1;
        assert_eq!(decode(&w, BOTH, 1 << 20), Err(PduError::DataDigest));
        let w = p.encode(Digests::default());
        assert_eq!(
            decode(&w, Digests::default(), 99),
            Err(PduError::DataTooLong { len: 100, max: 99 })
        );
        assert_eq!(decode(&w[..60], Digests::default(), 1 << 20), Ok(None));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..400),
                                       h in any::<bool>(), d in any::<bool>()) {
            let _ = decode(&buf, Digests { header: h, data: d }, 256);
        }

        #[test]
        fn reading_a_stream_agrees_with_decoding_its_bytes(
            bhs in proptest::collection::vec(any::<u8>(), 48),
            ahs_words in 0usize..3,
            data in proptest::collection::vec(any::<u8>(), 0..300),
            h in any::<bool>(), d in any::<bool>(),
            flip in proptest::option::of((any::<usize>(), 1u8..=255)),
            cut in proptest::option::of(any::<usize>()),
        ) {
            let mut p = Pdu::new(0);
            p.bhs.copy_from_slice(&bhs);
            p.ahs = vec![0x5a; ahs_words * 4];
            p.data = data;
            let dg = Digests { header: h, data: d };
            let mut wire = p.encode(dg);
            if let Some((at, x)) = flip {
                let at = at % wire.len();
                wire[at] ^= x;
            }
            if let Some(c) = cut {
                wire.truncate(c % wire.len());
            }
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let mut rest = &wire[..];
            let read = rt.block_on(read_pdu(&mut rest, dg, 256));
            match (decode(&wire, dg, 256), read) {
                // The same PDU, and exactly its bytes taken from the
                // stream (the next PDU starts where decode says).
                (Ok(Some((a, n))), Ok(b)) => {
                    prop_assert!(a == b);
                    prop_assert_eq!(wire.len() - rest.len(), n);
                }
                (Ok(None), Err(ReadError::Io(e))) => {
                    prop_assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof)
                }
                (Err(a), Err(ReadError::Pdu(b))) => prop_assert_eq!(a, b),
                (a, b) => prop_assert!(false, "decode {:?}, read {:?}", a.map(|o| o.map(|(p, n)| (p.data, n))), b.map(|p| p.data)),
            }
        }

        #[test]
        fn encoding_from_slices_is_encoding_their_concatenation(
            data in proptest::collection::vec(any::<u8>(), 0..3000),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
            h in any::<bool>(), d in any::<bool>(), ahs_words in 0usize..3,
        ) {
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
            at.push(0);
            at.push(data.len());
            at.sort_unstable();
            let slices: Vec<&[u8]> = at.windows(2).map(|w| &data[w[0]..w[1]]).collect();
            let mut p = Pdu::new(op::DATA_IN);
            p.set_itt(7);
            p.ahs = vec![0x5a; ahs_words * 4];
            let dg = Digests { header: h, data: d };
            // Appended after what the buffer holds already.
            let mut out = vec![1, 2, 3];
            p.encode_into(dg, &slices, &mut out);
            prop_assert_eq!(&out[..3], &[1u8, 2, 3][..]);
            // It decodes to the PDU with the whole data...
            let (q, n) = decode(&out[3..], dg, 1 << 16).unwrap().unwrap();
            prop_assert_eq!(n, out.len() - 3);
            prop_assert_eq!(q.itt(), 7);
            prop_assert_eq!(&q.ahs, &p.ahs);
            prop_assert_eq!(&q.data, &data);
            // ...and is the same bytes as the PDU encoded with it.
            p.data = data.clone();
            let whole = p.encode(dg);
            prop_assert_eq!(&out[3..], &whole[..]);
        }

        #[test]
        fn encode_then_decode_round_trips(bhs in proptest::collection::vec(any::<u8>(), 48),
                                          ahs_words in 0usize..4,
                                          data in proptest::collection::vec(any::<u8>(), 0..300),
                                          h in any::<bool>(), d in any::<bool>()) {
            let mut p = Pdu::new(0);
            p.bhs.copy_from_slice(&bhs);
            p.ahs = vec![0xa5; ahs_words * 4];
            p.data = data;
            let dg = Digests { header: h, data: d };
            let wire = p.encode(dg);
            let (q, n) = decode(&wire, dg, 1 << 16).unwrap().unwrap();
            prop_assert_eq!(n, wire.len());
            prop_assert_eq!(&q.bhs[..4], &p.bhs[..4]);
            prop_assert_eq!(&q.bhs[8..], &p.bhs[8..]);
            prop_assert_eq!(q.ahs, p.ahs);
            prop_assert_eq!(q.data, p.data);
            // Every truncation is "need more", never an error or a panic.
            for cut in [0, 1, 47, 48, wire.len().saturating_sub(1)] {
                if cut < wire.len() {
                    prop_assert_eq!(decode(&wire[..cut], dg, 1 << 16), Ok(None));
                }
            }
        }
    }
}

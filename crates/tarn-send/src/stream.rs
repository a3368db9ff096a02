//! The send stream format (docs/format.md, "Send streams"): records with a
//! fixed header, each closed by a checksum chained to the one before.
//!
//! # Theory
//!
//! A stream is `BEGIN`, entries in key order, `END`. Every record ends
//! with BLAKE3 of the previous record's checksum and of its own bytes (the
//! first chains from a constant), so a flipped bit, a dropped, repeated or
//! reordered record, or a stream cut anywhere, fails at the first record
//! that is not what the sender wrote; `END` counts the entries. Lengths are
//! checked against small bounds *before* anything is allocated, so a
//! damaged or hostile stream cannot ask for gigabytes. The reader
//! validates; the receiver decides what the entries mean.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use tarn_block::crypt::Seal;
use tarn_dataset::send::{BlockPayload, RawBlock, SendInfo, SendItem};

use crate::SendError;

/// The stream format this tarn writes and reads.
pub const VERSION: u32 = 1;

/// What `BEGIN`'s JSON says first, so anything else is refused at once.
pub const MAGIC: &str = "tarn-send";

const KIND_BEGIN: u8 = 1;
const KIND_PUT: u8 = 2;
const KIND_BLOCK: u8 = 3;
const KIND_RAW_BLOCK: u8 = 4;
const KIND_DELETE: u8 = 5;
const KIND_END: u8 = 6;

/// Bytes of a record's header: kind, flags, key length, value length.
const HEADER: usize = 8;
/// Bytes of the checksum closing a record.
const SUM: usize = 32;
/// What a raw block's value starts with: lsize, compression, flags,
/// salt, nonce, tag.
const RAW_META: usize = 4 + 1 + 1 + 8 + 12 + 16;
/// Largest key (the tree's limit).
const MAX_KEY: usize = tarn_dataset::send::MAX_KEY;
/// Largest plain value.
const MAX_PUT: usize = 8192;
/// Largest block in a stream (the largest record size).
const MAX_BLOCK: usize = 1 << 20;
/// Largest `BEGIN` header.
const MAX_BEGIN: usize = 256 << 10;

/// `BEGIN`'s JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`MAGIC`].
    pub magic: String,
    /// The format version ([`VERSION`]).
    pub version: u32,
    /// The snapshot carried.
    pub info: SendInfo,
    /// A resumed stream starts after this key (lowercase hex).
    #[serde(default)]
    pub resume_after: Option<String>,
    /// Streams of a replication package (`send -R`): the dataset's name
    /// below the package's top dataset (`""` for the top itself); the
    /// receiver puts it at the same place below its target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rel: Option<String>,
    /// When one send wrote several streams (`-I`, `-R`): this is stream
    /// `[i, n]`, counting from 1, so an input cut between two of them is
    /// refused instead of looking complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<[u32; 2]>,
}

/// One record as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The stream's header.
    Begin(Box<Header>),
    /// An entry.
    Item(SendItem),
    /// The end, with the number of entries.
    End(u64),
}

fn first_sum() -> [u8; SUM] {
    *blake3::hash(b"tarn-send stream v1").as_bytes()
}

/// Writes one stream.
pub struct StreamWriter<W: Write> {
    w: W,
    sum: [u8; SUM],
    items: u64,
    bytes: u64,
}

impl<W: Write> StreamWriter<W> {
    /// Starts a stream with its header.
    pub fn begin(w: W, header: &Header) -> Result<Self, SendError> {
        let mut s = StreamWriter {
            w,
            sum: first_sum(),
            items: 0,
            bytes: 0,
        };
        let json = serde_json::to_vec(header)
            .map_err(|e| SendError::Stream(format!("encoding the header: {e}")))?;
        s.record(KIND_BEGIN, &[], &[&json])?;
        Ok(s)
    }

    fn record(&mut self, kind: u8, key: &[u8], value: &[&[u8]]) -> Result<(), SendError> {
        let vlen: usize = value.iter().map(|v| v.len()).sum();
        let mut head = [0u8; HEADER];
        head[0] = kind;
        head[2..4].copy_from_slice(&(key.len() as u16).to_le_bytes());
        head[4..8].copy_from_slice(&(vlen as u32).to_le_bytes());
        let mut h = blake3::Hasher::new();
        h.update(&self.sum);
        h.update(&head);
        h.update(key);
        for v in value {
            h.update(v);
        }
        self.sum = *h.finalize().as_bytes();
        self.w.write_all(&head)?;
        self.w.write_all(key)?;
        for v in value {
            self.w.write_all(v)?;
        }
        self.w.write_all(&self.sum)?;
        self.bytes += (HEADER + key.len() + vlen + SUM) as u64;
        Ok(())
    }

    /// Writes one entry.
    pub fn item(&mut self, item: &SendItem) -> Result<(), SendError> {
        self.items += 1;
        match item {
            SendItem::Put(k, v) => self.record(KIND_PUT, k, &[v]),
            SendItem::Delete(k) => self.record(KIND_DELETE, k, &[]),
            SendItem::Block(k, BlockPayload::Logical(d)) => self.record(KIND_BLOCK, k, &[d]),
            SendItem::Block(k, BlockPayload::Raw(b)) => {
                let mut meta = [0u8; RAW_META];
                meta[0..4].copy_from_slice(&b.lsize.to_le_bytes());
                meta[4] = b.compress;
                if let Some(s) = &b.seal {
                    meta[5] = 1;
                    meta[6..14].copy_from_slice(&s.salt);
                    meta[14..26].copy_from_slice(&s.iv);
                    meta[26..42].copy_from_slice(&s.mac);
                }
                self.record(KIND_RAW_BLOCK, k, &[&meta, &b.stored])
            }
        }
    }

    /// Ends the stream; returns the writer and the bytes written.
    pub fn end(mut self) -> Result<(W, u64), SendError> {
        let n = self.items.to_le_bytes();
        self.record(KIND_END, &[], &[&n])?;
        self.w.flush()?;
        Ok((self.w, self.bytes))
    }
}

/// Reads streams, one after another.
pub struct StreamReader<R: Read> {
    r: R,
    sum: [u8; SUM],
    items: u64,
    /// Inside a stream (after `BEGIN`, before `END`).
    open: bool,
}

fn bad(what: impl Into<String>) -> SendError {
    SendError::Stream(what.into())
}

impl<R: Read> StreamReader<R> {
    /// A reader at the start of a stream.
    pub fn new(r: R) -> Self {
        StreamReader {
            r,
            sum: first_sum(),
            items: 0,
            open: false,
        }
    }

    /// Fills `buf`; false when the input ended before its first byte.
    fn fill(&mut self, buf: &mut [u8], at_start: bool) -> Result<bool, SendError> {
        let mut got = 0;
        while got < buf.len() {
            let n = match self.r.read(&mut buf[got..]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                if got == 0 && at_start {
                    return Ok(false);
                }
                return Err(bad("the stream ends in the middle of a record (cut short)"));
            }
            got += n;
        }
        Ok(true)
    }

    /// The next record; `None` at the end of the input between streams.
    pub fn next_record(&mut self) -> Result<Option<Record>, SendError> {
        let mut head = [0u8; HEADER];
        if !self.fill(&mut head, !self.open)? {
            return Ok(None);
        }
        let kind = head[0];
        if head[1] != 0 {
            return Err(bad(format!(
                "record flags {:#04x} this tarn does not know",
                head[1]
            )));
        }
        let klen = u16::from_le_bytes([head[2], head[3]]) as usize;
        let vlen = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let (max_key, max_value) = match kind {
            KIND_BEGIN => (0, MAX_BEGIN),
            KIND_PUT => (MAX_KEY, MAX_PUT),
            KIND_BLOCK => (MAX_KEY, MAX_BLOCK),
            KIND_RAW_BLOCK => (MAX_KEY, RAW_META + MAX_BLOCK),
            KIND_DELETE => (MAX_KEY, 0),
            KIND_END => (0, 8),
            k => return Err(bad(format!("unknown record kind {k}"))),
        };
        if klen > max_key || vlen > max_value {
            return Err(bad(format!(
                "a record of kind {kind} with a {klen}-byte key and a {vlen}-byte value (at most \
                 {max_key} and {max_value})"
            )));
        }
        if (kind == KIND_BEGIN) == self.open {
            return Err(bad(if self.open {
                "a second BEGIN inside a stream"
            } else {
                "the stream does not start with BEGIN"
            }));
        }
        let mut body = vec![0u8; klen + vlen + SUM];
        self.fill(&mut body, false)?;
        let (kv, sum) = body.split_at(klen + vlen);
        let mut h = blake3::Hasher::new();
        h.update(&self.sum);
        h.update(&head);
        h.update(kv);
        let want = *h.finalize().as_bytes();
        if sum != want {
            return Err(bad(
                "a record's checksum does not match: the stream is damaged, reordered or spliced",
            ));
        }
        self.sum = want;
        let (key, value) = kv.split_at(klen);
        match kind {
            KIND_BEGIN => {
                let h: Header = serde_json::from_slice(value)
                    .map_err(|e| bad(format!("the stream's header: {e}")))?;
                if h.magic != MAGIC {
                    return Err(bad("not a tarn send stream"));
                }
                if h.version != VERSION {
                    return Err(bad(format!(
                        "a stream of format version {}: this tarn reads version {VERSION}",
                        h.version
                    )));
                }
                self.open = true;
                self.items = 0;
                Ok(Some(Record::Begin(Box::new(h))))
            }
            KIND_END => {
                let n = u64::from_le_bytes(value.try_into().map_err(|_| bad("END's count"))?);
                if n != self.items {
                    return Err(bad(format!(
                        "the stream says it held {n} entries, {} arrived",
                        self.items
                    )));
                }
                self.open = false;
                // The next stream (if any) chains from the start again.
                self.sum = first_sum();
                Ok(Some(Record::End(n)))
            }
            _ => {
                if key.is_empty() {
                    return Err(bad("an entry with an empty key"));
                }
                self.items += 1;
                let key = key.to_vec();
                let item = match kind {
                    KIND_PUT => SendItem::Put(key, value.to_vec()),
                    KIND_DELETE => SendItem::Delete(key),
                    KIND_BLOCK => {
                        if value.is_empty() {
                            return Err(bad("an empty block"));
                        }
                        SendItem::Block(key, BlockPayload::Logical(value.to_vec()))
                    }
                    _ => SendItem::Block(key, BlockPayload::Raw(raw_block(value)?)),
                };
                Ok(Some(Record::Item(item)))
            }
        }
    }
}

fn raw_block(value: &[u8]) -> Result<RawBlock, SendError> {
    if value.len() <= RAW_META {
        return Err(bad("a raw block without bytes"));
    }
    let (meta, stored) = value.split_at(RAW_META);
    let lsize = u32::from_le_bytes([meta[0], meta[1], meta[2], meta[3]]);
    if lsize == 0 || lsize as usize > MAX_BLOCK || stored.len() > lsize as usize {
        return Err(bad(format!(
            "a raw block of {} stored bytes for {lsize} logical bytes",
            stored.len()
        )));
    }
    tarn_block::CompressAlg::from_u8(meta[4]).map_err(|e| bad(format!("a raw block: {e}")))?;
    let seal = match meta[5] {
        0 => None,
        1 => {
            let mut s = Seal {
                salt: [0; 8],
                iv: [0; 12],
                mac: [0; 16],
            };
            s.salt.copy_from_slice(&meta[6..14]);
            s.iv.copy_from_slice(&meta[14..26]);
            s.mac.copy_from_slice(&meta[26..42]);
            Some(s)
        }
        f => return Err(bad(format!("raw block flags {f:#04x}"))),
    };
    Ok(RawBlock {
        stored: stored.to_vec(),
        lsize,
        compress: meta[4],
        seal,
    })
}

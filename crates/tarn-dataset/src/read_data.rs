//! The bytes of a read as the pieces of the blocks that hold them, so a
//! front end can hand them to the socket without assembling a buffer.
//!
//! A read of a file or a volume covers records (blocks); each is a block
//! shared with the block cache (or with the open txg), a hole, or a block
//! shorter than its record (its tail reads as zeros). [`ReadData`] keeps, in file
//! order, a range of each block it needs (the block's bytes are shared,
//! not copied: holding a `ReadData` keeps those blocks alive even if the
//! cache evicts them) and a length for each run of zeros. [`ReadData::slices`]
//! yields them as byte slices for a vectored write, the zeros from one
//! static zero page; [`ReadData::into_parts`] hands them over as owned
//! [`Part`]s for a front end whose buffers can wrap them (an HTTP body);
//! [`ReadData::to_vec`] assembles them with one copy, for a caller that
//! wants one buffer.

/// A block's bytes as a read holds them: shared with the cache or the open
/// txg (a [`crate::BlockData`], or any owner of bytes), not copied.
pub type Bytes = Box<dyn AsRef<[u8]> + Send + Sync>;

/// Zeros for holes, shared by every read.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// One piece of a read.
enum Piece {
    /// Bytes `start..end` of a block.
    Block {
        data: Bytes,
        start: usize,
        end: usize,
    },
    /// A run of zeros (a hole, or past the end of a short block).
    Zeros(usize),
}

/// A read's bytes as ranges of shared blocks and runs of zeros (see the
/// module docs).
#[derive(Default)]
pub struct ReadData {
    pieces: Vec<Piece>,
    len: usize,
}

impl std::fmt::Debug for ReadData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadData")
            .field("len", &self.len)
            .field("pieces", &self.pieces.len())
            .finish()
    }
}

impl ReadData {
    /// Appends `n` zeros.
    pub fn push_zeros(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.len += n;
        if let Some(Piece::Zeros(z)) = self.pieces.last_mut() {
            *z += n;
        } else {
            self.pieces.push(Piece::Zeros(n));
        }
    }

    /// Appends bytes `start..end` of `data` (an empty range adds nothing).
    /// The range must lie inside the block.
    pub fn push_block(&mut self, data: Bytes, start: usize, end: usize) {
        let blen = (*data).as_ref().len();
        debug_assert!(start <= end && end <= blen, "range inside the block");
        let end = end.min(blen);
        if start >= end {
            return;
        }
        self.len += end - start;
        self.pieces.push(Piece::Block { data, start, end });
    }

    /// Bytes in the read.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a read of no bytes (at or past the end of the file).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole read as one slice when it is a single range of one block
    /// (a read of one record, or inside one), or empty; None when it has
    /// several pieces. Lets a front end whose reply takes one buffer send
    /// the cached block's bytes as they are instead of assembling a copy.
    pub fn contiguous(&self) -> Option<&[u8]> {
        match self.pieces.as_slice() {
            [] => Some(&[]),
            [Piece::Block { data, start, end }] => Some(&(**data).as_ref()[*start..*end]),
            _ => None,
        }
    }

    /// The bytes in order as slices of the blocks (and of a static zero
    /// page for zeros), for a vectored write.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.pieces.iter().flat_map(|p| {
            let (one, zeros) = match p {
                Piece::Block { data, start, end } => (Some(&(**data).as_ref()[*start..*end]), 0),
                Piece::Zeros(n) => (None, *n),
            };
            let full = zeros / ZEROS.len();
            let rest = zeros % ZEROS.len();
            one.into_iter()
                .chain(std::iter::repeat_n(&ZEROS[..], full))
                .chain((rest > 0).then(|| &ZEROS[..rest]))
        })
    }

    /// The pieces in order, owned: each keeps its block alive on its own.
    /// Runs of zeros come as parts of at most 64 KiB of a static page.
    pub fn into_parts(self) -> Vec<Part> {
        let mut out = Vec::with_capacity(self.pieces.len());
        for p in self.pieces {
            match p {
                Piece::Zeros(mut n) => {
                    while n > 0 {
                        let k = n.min(ZEROS.len());
                        out.push(Part(Piece::Zeros(k)));
                        n -= k;
                    }
                }
                block => out.push(Part(block)),
            }
        }
        out
    }

    /// The bytes in one buffer (one copy).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for s in self.slices() {
            v.extend_from_slice(s);
        }
        v
    }
}

impl From<Vec<u8>> for ReadData {
    /// The bytes of one buffer (a device that keeps no shared blocks).
    fn from(v: Vec<u8>) -> ReadData {
        let mut r = ReadData::default();
        let n = v.len();
        r.push_block(Box::new(v), 0, n);
        r
    }
}

impl PartialEq for ReadData {
    /// Two reads are equal when they hold the same bytes, however split.
    fn eq(&self, other: &ReadData) -> bool {
        self.len == other.len && self.to_vec() == other.to_vec()
    }
}

impl Eq for ReadData {}

/// One piece of a [`ReadData`], owned (see [`ReadData::into_parts`]): a
/// range of a shared block, or zeros. Its bytes are `as_ref()`.
pub struct Part(Piece);

impl AsRef<[u8]> for Part {
    fn as_ref(&self) -> &[u8] {
        match &self.0 {
            Piece::Block { data, start, end } => &(**data).as_ref()[*start..*end],
            Piece::Zeros(n) => &ZEROS[..*n],
        }
    }
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Part")
            .field("len", &self.as_ref().len())
            .finish()
    }
}

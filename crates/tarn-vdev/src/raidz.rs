//! raidz: variable-width Reed-Solomon stripes, one per block.
//!
//! # Theory
//!
//! **Address space.** With sector size S, width n and parity p, the vdev's
//! logical sector L lives on child `L % n` at leaf offset
//! `DATA_START + (L / n) * S`: logical sectors run across the children row
//! by row.
//!
//! **One block, one stripe.** A block of d data sectors at logical sector b is
//! cut into columns. Each row holds up to n - p data sectors plus p parity
//! sectors, so with `q = d / (n-p)` full rows and `r = d % (n-p)` sectors left
//! over, the first `bc = r + p` columns ("big", when r > 0) get q+1 sectors
//! and the others q. A block smaller than one row (q = 0) only has its bc
//! columns. Column c lives on child `(b + c) % n`, contiguous on that child
//! from row `(b + c) / n`, so each column is one I/O. Columns 0..p are parity
//! and the data buffer is laid out column after column in the rest. Because
//! b varies from block to block, parity lands on every child in turn.
//!
//! **Parity.** Each column is one shard of a systematic Reed-Solomon code over
//! GF(2^8) (`parity.rs`); short columns are zero-extended to the big column
//! length for the arithmetic, and the zeros are never stored.
//!
//! **Padding.** The allocation is rounded up to a multiple of p+1 sectors
//! (the trailing sectors are skipped, never written). The smallest block is
//! 1 data + p parity sectors, so a free gap smaller than p+1 sectors could
//! never be used; rounding every allocation keeps all free space usable.
//!
//! **No read-modify-write, no write hole.** Parity covers exactly one block,
//! and blocks are written once into freshly allocated space (copy on write).
//! Live data and its parity are therefore never updated in place, so a crash
//! mid-write can only damage a block that no committed uberblock references
//! yet. Repairs rewrite columns with the same bytes they should always have
//! held.
//!
//! **Reconstruction by combinations.** Reed-Solomon corrects up to p
//! *erasures*, i.e. it must be told which columns are bad. Unreadable columns
//! (I/O error, missing child) are known erasures and are tried first. Silent
//! corruption is not flagged by the device, so when the data still fails its
//! checksum we guess: every set of up to p - (known erasures) further columns,
//! data and parity alike, is treated as erased in turn, and the block checksum
//! confirms the right guess. A guess that marks no data column cannot change
//! the data and is skipped. The cost is C(columns, k) decodes for k guesses,
//! small for sensible widths; `MAX_COMBINATIONS` bounds it for very wide
//! raidz3. Rebuilt columns go to a small scratch area, so wrong guesses never
//! disturb the columns as read. Once data verifies, parity is recomputed from it
//! (with the sector padding past the block's end forced to zero, as written)
//! and every column that differs from what the child returned is rewritten.
//! Read only looks at parity when the data fails; scrub always does, and so
//! also catches damage confined to the padding, which no checksum covers.

use crate::label::DATA_START;
use crate::parity::Codec;
use crate::top::{Handle, ScrubOutcome, TopVdev, MAX_COMBINATIONS};
use crate::{sector, VdevError};

/// One column of a block: where it lives and how long it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Column {
    pub(crate) child: usize,
    pub(crate) leaf_off: u64,
    pub(crate) len: usize,
}

/// The column map of one block.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(crate) cols: Vec<Column>,
    pub(crate) parity: usize,
    /// Length of every shard for the parity arithmetic (the first column's length).
    pub(crate) shard_len: usize,
    /// Data sectors in bytes (psize rounded up to sectors).
    pub(crate) data_len: usize,
}

impl Layout {
    /// Maps a block of `psize` bytes at vdev `offset` onto columns. The caller
    /// has checked that the offset is sector-aligned and the block in range.
    pub(crate) fn new(offset: u64, psize: u64, width: usize, parity: usize, ashift: u8) -> Layout {
        debug_assert!(parity >= 1 && width >= parity + 2 && psize >= 1);
        let s = sector(ashift);
        let n = width as u64;
        let b = offset / s;
        let d = psize.div_ceil(s);
        let per_row = n - parity as u64;
        let (q, r) = (d / per_row, d % per_row);
        let big = if r == 0 { 0 } else { r + parity as u64 };
        let ncols = if q == 0 { big } else { n };
        let cols: Vec<Column> = (0..ncols)
            .map(|c| {
                let l = b + c;
                let sectors = if c < big { q + 1 } else { q };
                Column {
                    child: (l % n) as usize,
                    leaf_off: DATA_START + (l / n) * s,
                    len: (sectors * s) as usize,
                }
            })
            .collect();
        Layout {
            shard_len: cols.first().map_or(0, |c| c.len),
            cols,
            parity,
            data_len: (d * s) as usize,
        }
    }

    fn ncols(&self) -> usize {
        self.cols.len()
    }

    fn data_cols(&self) -> usize {
        self.cols.len() - self.parity
    }

    /// Byte range of column c's stored bytes inside a stripe buffer.
    pub(crate) fn stored(&self, c: usize) -> std::ops::Range<usize> {
        c * self.shard_len..c * self.shard_len + self.cols[c].len
    }

    /// Copies the data columns of a stripe buffer into `out` (data_len bytes).
    fn gather(&self, stripe: &[u8], out: &mut [u8]) {
        let mut pos = 0;
        for c in self.parity..self.ncols() {
            let len = self.cols[c].len;
            out[pos..pos + len].copy_from_slice(&stripe[self.stored(c)]);
            pos += len;
        }
    }
}

/// Bytes allocated for a block of `psize` bytes: data plus parity sectors,
/// rounded up to a multiple of parity+1 sectors.
pub(crate) fn alloc_size(psize: u64, width: usize, parity: usize, ashift: u8) -> u64 {
    let s = sector(ashift);
    let d = psize.div_ceil(s);
    let per_row = (width - parity) as u64;
    let rows = d.div_ceil(per_row);
    let total = d + parity as u64 * rows;
    let unit = parity as u64 + 1;
    total.div_ceil(unit).saturating_mul(unit).saturating_mul(s)
}

/// Where each column of a block comes from: a range of the caller's
/// bytes, then a range of the returned buffer.
pub(crate) type ColumnBytes = (std::ops::Range<usize>, std::ops::Range<usize>);

/// The parity of `data` laid out as `lay`, computed from `data` where it
/// lies (no stripe buffer holding a copy of it): returns a buffer with
/// the parity columns, then zeros, and for every column its bytes: a
/// data column is its share of `data` followed by zeros up to whole
/// sectors; a parity column is its shard of the buffer. The bytes are
/// exactly those of the stripe the read path rebuilds (short columns
/// zero-extended for the arithmetic, the zeros never stored); the tests
/// hold the two to that.
///
/// The parity is computed from the columns where they lie, each as
/// long as its share of `data` ([`Codec::encode_short`]).
pub(crate) fn parity_and_columns(
    codec: &Codec,
    lay: &Layout,
    data: &[u8],
) -> Result<(Vec<u8>, Vec<ColumnBytes>), VdevError> {
    let (p, sl) = (lay.parity, lay.shard_len);
    let mut spans = Vec::with_capacity(lay.data_cols());
    let mut pos = 0usize;
    for col in &lay.cols[p..] {
        let start = pos.min(data.len());
        let take = col.len.min(data.len() - start);
        spans.push(start..start + take);
        pos += col.len;
    }
    let pad = lay.cols[p..]
        .iter()
        .zip(&spans)
        .map(|(col, s)| col.len - s.len())
        .max()
        .unwrap_or(0);
    let mut own = vec![0u8; p * sl + pad];
    let shards: Vec<&[u8]> = spans.iter().map(|s| &data[s.clone()]).collect();
    let mut parity: Vec<&mut [u8]> = own[..p * sl].chunks_exact_mut(sl).collect();
    codec
        .encode_short(&shards, &mut parity)
        .map_err(VdevError::Geometry)?;
    let zeros = p * sl;
    let cols = (0..p)
        .map(|c| (0..0, c * sl..c * sl + lay.cols[c].len))
        .chain(
            lay.cols[p..]
                .iter()
                .zip(spans)
                .map(|(col, s)| (s.clone(), zeros..zeros + col.len - s.len())),
        )
        .collect();
    Ok((own, cols))
}

/// Rebuilds the data columns flagged in `missing` into `scratch` (the stripe
/// itself is only read), gathers the candidate block into `out` and checks it.
#[allow(clippy::too_many_arguments)]
fn try_stripe(
    codec: &Codec,
    lay: &Layout,
    stripe: &mut [u8],
    missing: &[bool],
    scratch: &mut [u8],
    out: &mut [u8],
    psize: usize,
    verify: &dyn Fn(&[u8]) -> bool,
) -> bool {
    let mut spare = scratch.chunks_exact_mut(lay.shard_len);
    let mut shards: Vec<(&mut [u8], bool)> = Vec::with_capacity(lay.ncols());
    for (shard, &gone) in stripe.chunks_exact_mut(lay.shard_len).zip(missing) {
        if gone {
            let Some(slot) = spare.next() else {
                return false;
            };
            shards.push((slot, false));
        } else {
            shards.push((shard, true));
        }
    }
    shards.rotate_left(lay.parity);
    if codec.reconstruct_data(&mut shards).is_err() {
        return false;
    }
    let mut pos = 0;
    for (col, (shard, _)) in lay.cols[lay.parity..].iter().zip(&shards) {
        out[pos..pos + col.len].copy_from_slice(&shard[..col.len]);
        pos += col.len;
    }
    verify(&out[..psize])
}

/// The k-subsets of 0..n in lexicographic order.
struct Combinations {
    idx: Vec<usize>,
    n: usize,
    started: bool,
}

impl Combinations {
    fn new(n: usize, k: usize) -> Combinations {
        Combinations {
            idx: (0..k).collect(),
            n,
            started: false,
        }
    }

    /// Moves to the next subset; false when there are none left.
    fn advance(&mut self) -> bool {
        let k = self.idx.len();
        if !self.started {
            self.started = true;
            return k >= 1 && k <= self.n;
        }
        let mut i = k;
        loop {
            if i == 0 {
                return false;
            }
            i -= 1;
            if self.idx[i] < self.n - k + i {
                break;
            }
        }
        self.idx[i] += 1;
        for j in i + 1..k {
            self.idx[j] = self.idx[j - 1] + 1;
        }
        true
    }
}

/// What one raidz read or scrub has in hand: the columns as read, which reads
/// worked, the pinned children, and working space.
struct Stripe<'a> {
    lay: &'a Layout,
    codec: &'a Codec,
    /// Every column as read, one shard each (zero beyond the stored length).
    bytes: Vec<u8>,
    /// `ok[c]`: column c was read without error.
    ok: Vec<bool>,
    handles: Vec<Option<Handle>>,
    /// Room for `parity` shards: rebuilt columns, then recomputed parity.
    scratch: Vec<u8>,
}

impl TopVdev {
    /// The parity code of blocks laid out as `lay`.
    pub(crate) fn codec_for(&self, lay: &Layout) -> Result<&Codec, VdevError> {
        self.codecs()?
            .get(lay.data_cols())
            .map_err(VdevError::Geometry)
    }

    fn pin_columns(&self, lay: &Layout) -> Vec<Option<Handle>> {
        lay.cols.iter().map(|c| self.handle(c.child)).collect()
    }

    fn new_stripe<'a>(
        &'a self,
        lay: &'a Layout,
        handles: Vec<Option<Handle>>,
        ok: Vec<bool>,
    ) -> Result<Stripe<'a>, VdevError> {
        Ok(Stripe {
            lay,
            codec: self.codec_for(lay)?,
            bytes: vec![0u8; lay.ncols() * lay.shard_len],
            ok,
            handles,
            scratch: vec![0u8; lay.parity * lay.shard_len],
        })
    }

    /// Reads columns `cols` of the stripe from their children.
    fn read_columns(&self, st: &mut Stripe<'_>, cols: std::ops::Range<usize>) {
        for c in cols {
            if let Some(h) = &st.handles[c] {
                let col = &st.lay.cols[c];
                st.ok[c] = self.child_read(h, &mut st.bytes[st.lay.stored(c)], col.leaf_off);
            }
        }
    }

    pub(crate) fn raidz_read(
        &self,
        offset: u64,
        psize: usize,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<u8>, VdevError> {
        let lay = self.layout(offset, psize as u64);
        let (p, ncols) = (lay.parity, lay.ncols());
        let mut out = vec![0u8; lay.data_len];
        let handles = self.pin_columns(&lay);
        let mut ok = vec![false; ncols];
        let fast = handles[p..].iter().all(Option::is_some);
        if fast {
            // Fast path: read the data columns straight into the result.
            let mut pos = 0;
            for c in p..ncols {
                let col = &lay.cols[c];
                if let Some(h) = &handles[c] {
                    ok[c] = self.child_read(h, &mut out[pos..pos + col.len], col.leaf_off);
                }
                pos += col.len;
            }
            if ok[p..].iter().all(|&x| x) && verify(&out[..psize]) {
                out.truncate(psize);
                return Ok(out);
            }
        }
        let mut st = self.new_stripe(&lay, handles, ok)?;
        if fast {
            // Keep what was read; bring in parity.
            let mut pos = 0;
            for c in p..ncols {
                let len = lay.cols[c].len;
                if st.ok[c] {
                    st.bytes[lay.stored(c)].copy_from_slice(&out[pos..pos + len]);
                }
                pos += len;
            }
            self.read_columns(&mut st, 0..p);
        } else {
            // A data column is known lost: read everything into the stripe.
            self.read_columns(&mut st, 0..ncols);
        }
        self.recover(&mut st, &mut out, offset, psize, verify)?;
        self.reconcile(&mut st, &mut out, psize)?;
        out.truncate(psize);
        Ok(out)
    }

    pub(crate) fn raidz_scrub(
        &self,
        offset: u64,
        psize: usize,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<ScrubOutcome, VdevError> {
        let lay = self.layout(offset, psize as u64);
        let mut st = self.new_stripe(&lay, self.pin_columns(&lay), vec![false; lay.ncols()])?;
        self.read_columns(&mut st, 0..lay.ncols());
        let mut data = vec![0u8; lay.data_len];
        let data_ok = st.ok[lay.parity..].iter().all(|&x| x) && {
            lay.gather(&st.bytes, &mut data);
            verify(&data[..psize])
        };
        if !data_ok {
            self.recover(&mut st, &mut data, offset, psize, verify)?;
        }
        let (repaired_bytes, mut bad_children) = self.reconcile(&mut st, &mut data, psize)?;
        bad_children.sort_unstable();
        Ok(ScrubOutcome {
            repaired_bytes,
            bad_children,
        })
    }

    /// Finds the block data that verifies, given the columns as read (see the
    /// module docs for the search order) and leaves it in `out`.
    fn recover(
        &self,
        st: &mut Stripe<'_>,
        out: &mut [u8],
        offset: u64,
        psize: usize,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(), VdevError> {
        let lay = st.lay;
        let (p, ncols) = (lay.parity, lay.ncols());
        let fail = |reason: String| VdevError::Unrecoverable {
            offset,
            psize,
            reason,
        };
        let erased: Vec<usize> = (0..ncols).filter(|&c| !st.ok[c]).collect();
        if erased.len() > p {
            return Err(fail(format!(
                "{} of {ncols} columns unreadable, parity covers {p}",
                erased.len()
            )));
        }
        let mut missing = st.ok.iter().map(|&ok| !ok).collect::<Vec<bool>>();
        let erased_data = erased.iter().any(|&c| c >= p);
        let mut attempt = |missing: &[bool], out: &mut [u8]| {
            try_stripe(
                st.codec,
                lay,
                &mut st.bytes,
                missing,
                &mut st.scratch,
                out,
                psize,
                verify,
            )
        };
        if erased_data && attempt(&missing, out) {
            return Ok(());
        }
        // Suspects, most likely first: resilvering children, then data, then parity.
        let mut suspects: Vec<usize> = (0..ncols).filter(|&c| st.ok[c]).collect();
        suspects.sort_by_key(|&c| {
            let resilvering = st.handles[c].as_ref().is_some_and(|h| h.resilvering);
            (!resilvering, c < p)
        });
        let mut tried = 0usize;
        for k in 1..=p - erased.len() {
            let mut combo = Combinations::new(suspects.len(), k);
            while combo.advance() {
                if !erased_data && combo.idx.iter().all(|&i| suspects[i] < p) {
                    continue; // only parity marked: the data would not change
                }
                tried += 1;
                if tried > MAX_COMBINATIONS {
                    return Err(fail(format!(
                        "gave up after {MAX_COMBINATIONS} column combinations"
                    )));
                }
                for &i in &combo.idx {
                    missing[suspects[i]] = true;
                }
                if attempt(&missing, out) {
                    return Ok(());
                }
                for &i in &combo.idx {
                    missing[suspects[i]] = false;
                }
            }
        }
        Err(fail(format!(
            "no combination of up to {p} bad columns out of {ncols} verifies \
             ({} unreadable, {tried} combinations tried)",
            erased.len()
        )))
    }

    /// Given verified block data in `data`, works out every column's correct
    /// bytes (parity recomputed), compares them with what was read, and
    /// rewrites each usable column that differs or could not be read.
    /// Returns the bytes repaired and the children found bad.
    fn reconcile(
        &self,
        st: &mut Stripe<'_>,
        data: &mut [u8],
        psize: usize,
    ) -> Result<(u64, Vec<usize>), VdevError> {
        let lay = st.lay;
        let (p, sl) = (lay.parity, lay.shard_len);
        // Padding is zero by definition, whatever a rebuilt column carried.
        data[psize..].fill(0);
        // Data columns: compare, then make the stripe hold the good bytes
        // (zero-extended) so parity can be computed from it.
        let mut wrong = st.ok.iter().map(|&ok| !ok).collect::<Vec<bool>>();
        let mut pos = 0;
        for (c, shard) in st.bytes.chunks_exact_mut(sl).enumerate().skip(p) {
            let len = lay.cols[c].len;
            let want = &data[pos..pos + len];
            if shard[..len] != *want {
                wrong[c] = true;
                shard[..len].copy_from_slice(want);
            }
            // Bytes past `len` were never written: the shard's zero extension holds.
            debug_assert!(shard[len..].iter().all(|&b| b == 0));
            pos += len;
        }
        // Parity columns: recompute into scratch and compare.
        let (parity_read, data_shards) = st.bytes.split_at(p * sl);
        let dshards: Vec<&[u8]> = data_shards.chunks_exact(sl).collect();
        let mut pshards: Vec<&mut [u8]> = st.scratch.chunks_exact_mut(sl).collect();
        st.codec
            .encode_short(&dshards, &mut pshards)
            .map_err(VdevError::Geometry)?;
        for (c, col) in lay.cols[..p].iter().enumerate() {
            let at = c * sl..c * sl + col.len;
            wrong[c] |= parity_read[at.clone()] != st.scratch[at];
        }
        let mut repaired = 0;
        let mut bad = Vec::new();
        for (c, col) in lay.cols.iter().enumerate() {
            // Unusable children are resilvered later, not repaired here.
            let (true, Some(h)) = (wrong[c], &st.handles[c]) else {
                continue;
            };
            if st.ok[c] {
                self.note_cksum(h);
            }
            let good = if c < p {
                &st.scratch[c * sl..c * sl + col.len]
            } else {
                &st.bytes[lay.stored(c)]
            };
            bad.push(col.child);
            repaired += self.heal(h, good, col.leaf_off);
        }
        Ok((repaired, bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The stripe the write path once built and the read path still
    /// works in: the data columns one after the other, each zero-extended
    /// to the shard length, parity first, computed over the whole buffer.
    fn reference_stripe(codec: &Codec, lay: &Layout, data: &[u8]) -> Vec<u8> {
        let mut stripe = vec![0u8; lay.ncols() * lay.shard_len];
        let mut pos = 0;
        for c in lay.parity..lay.ncols() {
            let take = lay.cols[c].len.min(data.len().saturating_sub(pos));
            let at = c * lay.shard_len;
            stripe[at..at + take].copy_from_slice(&data[pos..pos + take]);
            pos += lay.cols[c].len;
        }
        let mut shards: Vec<&mut [u8]> = stripe.chunks_exact_mut(lay.shard_len).collect();
        shards.rotate_left(lay.parity);
        codec.encode(&mut shards).expect("encode");
        stripe
    }

    proptest! {
        /// Every column the write path produces (data in place, parity
        /// from columns of unequal length) is byte for byte the stored
        /// part of the reference stripe, for any geometry, size and offset.
        #[test]
        fn columns_are_the_reference_stripes(
            width in 3usize..=9,
            parity in 1usize..=3,
            ashift in 9u8..=12,
            sectors in 0u64..200,
            psize_seed in any::<u64>(),
            seed in any::<u8>(),
        ) {
            prop_assume!(width >= parity + 2);
            let s = sector(ashift);
            // Any length: whole sectors, or a last sector partly used.
            let psize = (sectors * s + psize_seed % s).max(1);
            let data: Vec<u8> = (0..psize as usize)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
                .collect();
            let lay = Layout::new(sectors * 3 * s, psize, width, parity, ashift);
            let codecs = crate::parity::CodecCache::new(parity, width - parity);
            let codec = codecs.get(lay.data_cols()).expect("codec");
            let want = reference_stripe(codec, &lay, &data);
            let (own, cols) = parity_and_columns(codec, &lay, &data).expect("parity");
            prop_assert_eq!(cols.len(), lay.ncols());
            for (c, (d, o)) in cols.into_iter().enumerate() {
                let mut got = data[d].to_vec();
                got.extend_from_slice(&own[o]);
                prop_assert_eq!(&got[..], &want[lay.stored(c)], "column {}", c);
            }
        }
    }

    fn children(lay: &Layout) -> Vec<(usize, u64, usize)> {
        lay.cols
            .iter()
            .map(|c| (c.child, (c.leaf_off - DATA_START) / 512, c.len / 512))
            .collect()
    }

    #[test]
    fn layout_matches_the_documented_map() {
        // raidz1, width 5, 512-byte sectors, 10 data sectors at logical sector 7:
        // q = 2, r = 2, bc = 3; columns on children 2,3,4,0,1 (rows 1,1,1,2,2).
        let lay = Layout::new(7 * 512, 10 * 512, 5, 1, 9);
        assert_eq!(
            children(&lay),
            vec![(2, 1, 3), (3, 1, 3), (4, 1, 3), (0, 2, 2), (1, 2, 2)]
        );
        assert_eq!(lay.shard_len, 3 * 512);
        assert_eq!(lay.data_len, 10 * 512);
        // 10 data + 3 parity = 13 sectors, padded to 14.
        assert_eq!(alloc_size(10 * 512, 5, 1, 9), 14 * 512);

        // Small block: 1 sector on raidz2 of 6 -> 3 columns of 1 sector.
        let lay = Layout::new(0, 1, 6, 2, 12);
        assert_eq!(lay.cols.len(), 3);
        assert!(lay.cols.iter().all(|c| c.len == 4096));
        assert_eq!(alloc_size(1, 6, 2, 12), 3 * 4096);

        // Exact rows: 6 data sectors on raidz1 of 4 -> q = 2, r = 0, all columns 2.
        let lay = Layout::new(4 * 512, 6 * 512, 4, 1, 9);
        assert_eq!(
            children(&lay),
            vec![(0, 1, 2), (1, 1, 2), (2, 1, 2), (3, 1, 2)]
        );
        assert_eq!(alloc_size(6 * 512, 4, 1, 9), 8 * 512);
    }

    #[test]
    fn layout_stays_inside_its_allocation() {
        // Every sector of every column maps back into [b, b + alloc).
        for width in 3..=12usize {
            for parity in 1..=3usize.min(width - 2) {
                for d in 1..=40u64 {
                    let b = 13u64;
                    let lay = Layout::new(b * 512, d * 512, width, parity, 9);
                    let alloc = alloc_size(d * 512, width, parity, 9) / 512;
                    assert_eq!(alloc % (parity as u64 + 1), 0);
                    let mut seen = std::collections::BTreeSet::new();
                    for col in &lay.cols {
                        let row0 = (col.leaf_off - DATA_START) / 512;
                        for j in 0..(col.len / 512) as u64 {
                            let l = (row0 + j) * width as u64 + col.child as u64;
                            assert!(l >= b && l < b + alloc, "w{width} p{parity} d{d}");
                            assert!(seen.insert(l));
                        }
                    }
                    let stored = lay.cols.iter().map(|c| c.len as u64 / 512).sum::<u64>();
                    assert_eq!(
                        stored,
                        d + parity as u64 * d.div_ceil((width - parity) as u64)
                    );
                }
            }
        }
    }

    #[test]
    fn combinations_enumerate_all_subsets() {
        let mut c = Combinations::new(5, 3);
        let mut all = Vec::new();
        while c.advance() {
            all.push(c.idx.clone());
        }
        assert_eq!(all.len(), 10);
        assert_eq!(all[0], vec![0, 1, 2]);
        assert_eq!(all[9], vec![2, 3, 4]);
        let mut c = Combinations::new(2, 3);
        assert!(!c.advance());
    }
}

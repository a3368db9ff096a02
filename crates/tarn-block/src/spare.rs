//! Spare buffers for the stored bytes of blocks being written.
//!
//! A block that is compressed or sealed gets bytes of its own to store: a
//! buffer as large as the block (1 MiB for a file's record), filled, written
//! to the devices, then dropped. Fresh buffers that size are mapped pages
//! the kernel has never touched, so every one costs a page fault per 4 KiB
//! the first time it is filled: profiled on a sequential write into an
//! encrypted dataset, those faults were over a quarter of the daemon's CPU
//! (the allocator hands such buffers back to the kernel when they are
//! freed, because the threads that prepare blocks come and go). Here the
//! writer hands the buffer back once its block is on the devices, and the
//! next block takes it, already mapped.
//!
//! What a spare holds: sealed bytes, or the compressed bytes of a block of
//! an unencrypted dataset. A compressed form of an encrypted dataset's
//! block that is not kept is freed, not handed here, so no plaintext of an
//! encrypted dataset stays in the spares past its use (or its key's
//! unloading).
//!
//! Invariants: a buffer taken is always empty (length 0), so nothing of
//! the block it held before can be read through it, only overwritten; the
//! spares held never exceed [`SPARE_BYTES`] of capacity, so an idle daemon
//! keeps at most that much; buffers smaller than [`MIN_SPARE`] are left to
//! the allocator, which serves those from memory it keeps anyway.

use std::sync::Mutex;

/// The most capacity kept in spare buffers (enough for the blocks of one
/// write window of the pool, see `tarn-pool`, and the intent log's).
pub const SPARE_BYTES: usize = 64 << 20;

/// Buffers below this capacity are not kept: the allocator reuses small
/// allocations without faulting pages in again.
pub const MIN_SPARE: usize = 64 << 10;

/// A bounded list of spare buffers; the pipeline uses one for the whole
/// process ([`take`], [`give`]).
#[derive(Debug)]
pub struct Spares {
    list: Mutex<Vec<Vec<u8>>>,
    bound: usize,
}

static SPARES: Spares = Spares::new(SPARE_BYTES);

impl Spares {
    /// An empty list that keeps at most `bound` bytes of capacity.
    pub const fn new(bound: usize) -> Spares {
        Spares {
            list: Mutex::new(Vec::new()),
            bound,
        }
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        // A panic while the list was held leaves it valid: it only holds
        // buffers.
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An empty buffer with room for at least `len` bytes: a spare one when
    /// one fits without wasting more than its size again, else a new one
    /// (rounded up past the next multiple of [`MIN_SPARE`], so buffers for
    /// blocks of one size, with or without a few bytes of header, fit each
    /// other).
    pub fn take(&self, len: usize) -> Vec<u8> {
        if len < MIN_SPARE {
            return Vec::with_capacity(len);
        }
        {
            let mut s = self.list();
            let best = s
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= len && v.capacity() <= len.saturating_mul(2))
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                let mut v = s.swap_remove(i);
                v.clear();
                return v;
            }
        }
        Vec::with_capacity((len / MIN_SPARE + 1).saturating_mul(MIN_SPARE))
    }

    /// Hands a buffer back for a later [`Spares::take`]; kept only while
    /// the spares stay within their bound, otherwise freed.
    pub fn give(&self, mut v: Vec<u8>) {
        let cap = v.capacity();
        if cap < MIN_SPARE {
            return;
        }
        v.clear();
        let mut s = self.list();
        let held: usize = s.iter().map(Vec::capacity).sum();
        if held + cap <= self.bound {
            s.push(v);
        }
    }

    /// The capacity held now.
    pub fn held(&self) -> usize {
        self.list().iter().map(Vec::capacity).sum()
    }
}

/// [`Spares::take`] from the process's spares.
pub fn take(len: usize) -> Vec<u8> {
    SPARES.take(len)
}

/// [`Spares::give`] to the process's spares.
pub fn give(v: Vec<u8>) {
    SPARES.give(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn small_buffers_are_left_to_the_allocator() {
        let sp = Spares::new(8 * MIB);
        let small = sp.take(100);
        assert!(small.capacity() >= 100);
        sp.give(small);
        assert_eq!(sp.held(), 0);
    }

    #[test]
    fn a_spare_is_reused_empty_and_only_where_it_fits() {
        let sp = Spares::new(8 * MIB);
        let mut a = sp.take(MIB);
        assert!(a.capacity() >= MIB);
        a.extend_from_slice(&vec![0xAB; MIB]);
        let ptr = a.as_ptr();
        sp.give(a);
        // A smaller block does not take a buffer more than twice its size.
        let small = sp.take(MIN_SPARE);
        assert_ne!(small.as_ptr(), ptr);
        assert_eq!(sp.held(), MIB + MIN_SPARE);
        // The same block size with a few bytes of header fits it, empty.
        let b = sp.take(MIB + 16);
        assert_eq!(b.as_ptr(), ptr, "the spare that fits is the one taken");
        assert!(b.is_empty(), "a spare must not show what it held");
        assert_eq!(sp.held(), 0);
    }

    #[test]
    fn the_spares_stay_within_their_bound() {
        let sp = Spares::new(8 * MIB);
        let many: Vec<_> = (0..16).map(|_| sp.take(MIB)).collect();
        for v in many {
            sp.give(v);
        }
        assert!(sp.held() <= 8 * MIB, "spares hold {} bytes", sp.held());
        assert!(sp.held() >= 7 * MIB, "spares hold {} bytes", sp.held());
        // A buffer larger than the whole bound is never kept, even with
        // the list empty.
        let sp = Spares::new(8 * MIB);
        sp.give(Vec::with_capacity(9 * MIB));
        assert_eq!(sp.held(), 0);
    }
}
